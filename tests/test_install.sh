#!/usr/bin/env bash
# The library as a user gets it: install the build into a fresh prefix, then
# build examples/custom_model.c against that prefix only, twice,
#   1. with mpicc and `pkg-config --cflags --libs zeropp` (the shared library),
#   2. with CMake's find_package(zeropp) and zeropp::zeropp_static,
# and train it on 4 ranks as 2 nodes of 2 with ZeRO-3 and ZeRO++; the
# example fails unless each run's loss falls tenfold. Also checks what was
# installed: the header, both libraries (the shared one by its SONAME), the
# command, zeropp.pc and the CMake package files.
#
# Usage (ctest runs it, tests/install.cmake):
#   test_install.sh BUILD_DIR SOURCE_DIR CMAKE MPICC MPIEXEC "MPIEXEC_FLAGS" "EXTRA_CFLAGS"
set -euo pipefail
build=$1 src=$2 cmake=$3 mpicc=$4 mpiexec=$5
read -r -a mpiflags <<<"${6:-}"
read -r -a cflags <<<"${7:-}"
work=$build/test_install
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

fail() { echo "test_install: $*" >&2; exit 1; }

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
pc=$(find "$prefix" -name zeropp.pc)
[ -n "$pc" ] || fail "no zeropp.pc under $prefix"
libdir=$(realpath "$(dirname "$(dirname "$pc")")")
for f in "$prefix/include/zeropp.h" "$prefix/bin/zeropp" "$libdir/libzeropp.a" \
         "$libdir/libzeropp.so" "$libdir/cmake/zeropp/zeropp-config.cmake" \
         "$libdir/cmake/zeropp/zeropp-config-version.cmake"; do
  [ -e "$f" ] || fail "$f was not installed"
done
# The shared library is found by its SONAME, which must be installed too.
soname=$(objdump -p "$libdir/libzeropp.so" | awk '$1 == "SONAME" {print $2}')
[ -n "$soname" ] || fail "libzeropp.so has no SONAME"
[ -e "$libdir/$soname" ] || fail "the SONAME $soname is not installed in $libdir"
# The public header stands alone: nothing from src/ or the dependencies.
if grep -E '#include +"' "$prefix/include/zeropp.h"; then
  fail "the installed zeropp.h includes a private header"
fi

run4() {
  "$mpiexec" "${mpiflags[@]}" -np 4 "$@" --node-size 2 --steps 300
}

echo "== pkg-config: $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs zeropp)"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
# One version everywhere: the .pc file, the installed command (the first
# line of --version; the rest lists the backends), the header.
version=$(pkg-config --modversion zeropp)
[ "$("$prefix/bin/zeropp" --version | head -n 1)" = "zeropp $version" ] ||
  fail "zeropp.pc says $version, the installed command '$("$prefix/bin/zeropp" --version | head -n 1)'"
header_version=$(awk '/^#define ZPP_VERSION_(MAJOR|MINOR|PATCH) / {printf "%s%s", s, $3; s = "."}' \
                 "$prefix/include/zeropp.h")
[ "$header_version" = "$version" ] ||
  fail "zeropp.h says $header_version, zeropp.pc $version"
# shellcheck disable=SC2046 # pkg-config's output is a list of flags
"$mpicc" -std=c11 -O2 -Wall -Wextra -Werror "${cflags[@]}" "$src/examples/custom_model.c" \
  -o "$work/custom_model" $(pkg-config --cflags --libs zeropp) \
  -Wl,-rpath,"$(realpath "$(pkg-config --variable=libdir zeropp)")" -lm
# (ldd's output is read whole before grep: with pipefail, a `grep -q` that
# stops at the first match can kill ldd with SIGPIPE and fail the pipeline)
deps=$(ldd "$work/custom_model")
grep -qF "$libdir/$soname" <<<"$deps" ||
  fail "custom_model does not load the installed $soname"
run4 "$work/custom_model"

echo "== find_package(zeropp), zeropp::zeropp_static"
mkdir -p "$work/cmake-src"
cat >"$work/cmake-src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.22)
project(custom_model C)
find_package(zeropp 0.1 REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
add_executable(custom_model_static $src/examples/custom_model.c)
target_compile_options(custom_model_static PRIVATE -Wall -Wextra -Werror ${cflags[*]})
target_link_options(custom_model_static PRIVATE ${cflags[*]})
target_link_libraries(custom_model_static PRIVATE zeropp::zeropp_static MPI::MPI_C m)
EOF
"$cmake" -S "$work/cmake-src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/cmake-configure.log"
"$cmake" --build "$work/cmake-build" >"$work/cmake-build.log"
deps=$(ldd "$work/cmake-build/custom_model_static")
if grep -qF libzeropp <<<"$deps"; then
  fail "custom_model_static loads libzeropp.so; zeropp::zeropp_static should link it in"
fi
run4 "$work/cmake-build/custom_model_static"
echo "test_install: OK"

#!/usr/bin/env bash
# On a GPU machine: build zeropp for a given list of CUDA architectures, in
# a build folder of its own, and run the GPU tests there (ctest -L gpu), so
# that a build for other GPUs than the one at hand is seen to work on it
# (docs/gpus.md, "How it is verified").
#   bash bench/gpu/arch_check.sh SPEC...
# Each SPEC is one build, in build-arch-<SPEC>:
#   default     nothing given: what CMake picks here (the visible GPUs, as
#               90-real on an H200; cmake/cuda-archs.cmake)
#   portable    the list a machine without a GPU picks (75-real;80-real;90,
#               with 70-real where nvcc still builds Volta)
#   anything else, as -DCMAKE_CUDA_ARCHITECTURES takes it: 80-virtual (PTX
#               only: the driver compiles the sm_80 code for this GPU, the
#               way a GPU newer than the build runs it), "80-real;90", ...
# Without a SPEC: default. Logs go to $OUT/arch-<SPEC>/ (configure, build,
# `zeropp --version`, ctest) and one line per SPEC to $OUT/arch_check.txt;
# without $OUT, to gpu-out/ in the tree. Exit status: 0 when every build
# and every GPU test passed.
# cJSON and PCRE2 are not installed on those machines: carry their Debian
# packages in .deps/ (apt-get download libcjson1 libcjson-dev libpcre2-dev
# libpcre2-8-0), as for bench/gpu/run.sh.
#   TEST_LIMIT=s   the time limit of one ctest run (default 900)
#   TESTS=regex    only the GPU tests whose names match (ctest -R), e.g. to
#                  check a second architecture list on the kernels alone
#   JOBS=n         build jobs (default: every core)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
S="$OUT/arch_check.txt"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
say() { echo "$*" | tee -a "$S"; }

have_pcre2() { for f in /usr/include/pcre2.h /usr/include/*/pcre2.h; do [ -f "$f" ] && return 0; done; return 1; }
if ! [ -f /usr/include/cjson/cJSON.h ] || ! have_pcre2; then
  if ls .deps/*.deb > /dev/null 2>&1; then
    mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
    export CJSON_ROOT=/tmp/cjson/usr  # CMake looks for PCRE2 there too
  else
    say "cJSON or PCRE2 is not installed and .deps/ has no .deb files: apt-get download" \
        "libcjson1 libcjson-dev libpcre2-dev libpcre2-8-0 into .deps/ and carry it"
    exit 2
  fi
fi

[ $# -gt 0 ] || set -- default
GPU=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2> /dev/null | head -1)
say "$(date -u +%FT%TZ) arch_check on ${GPU:-no GPU visible}; $(nvcc --version 2> /dev/null | tail -1)"
rc=0
for spec in "$@"; do
  name=$(echo "$spec" | tr ';,' '__' | tr -cd 'A-Za-z0-9_.-')
  dir=build-arch-$name
  L="$OUT/arch-$name"; mkdir -p "$L"
  args=(-DCMAKE_BUILD_TYPE=Release -DZPP_FAULT_HOOKS=ON)
  case "$spec" in
    default) ;;
    portable) args+=("-DCMAKE_CUDA_ARCHITECTURES=$(
                cmake -DNVCC="$(command -v nvcc)" -P cmake/cuda-archs.cmake)") ;;
    *) args+=("-DCMAKE_CUDA_ARCHITECTURES=$spec") ;;
  esac
  t0=$SECONDS
  # a fresh folder: the cache keeps the architectures of the first configure
  rm -rf "$dir"
  if ! env -u CUDAARCHS cmake -S . -B "$dir" "${args[@]}" > "$L/configure.log" 2>&1; then
    say "$spec: configure failed ($L/configure.log)"; tail -20 "$L/configure.log"; rc=1; continue
  fi
  archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$dir/CMakeCache.txt")
  if ! cmake --build "$dir" -j"${JOBS:-$(nproc)}" > "$L/build.log" 2>&1; then
    say "$spec: build for $archs failed ($L/build.log)"; grep -E "error|Error" "$L/build.log" | head -20
    rc=1; continue
  fi
  built=$(( SECONDS - t0 ))
  "$dir/zeropp" --version > "$L/version.txt" 2>&1
  t1=$SECONDS
  (cd "$dir" && timeout "${TEST_LIMIT:-900}" ctest -L gpu ${TESTS:+-R "$TESTS"} \
                 --output-on-failure) > "$L/ctest.log" 2>&1
  trc=$?
  summary=$(grep -E "tests passed|tests failed" "$L/ctest.log" | tail -1)
  skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .*\(Skipped\)$' "$L/ctest.log")
  say "$spec: kernels for $archs ($(grep -o 'architectures .*' "$L/version.txt")); built in" \
      "${built}s; ctest -L gpu in $(( SECONDS - t1 ))s: ${summary:-no summary (rc $trc)}," \
      "$skipped skipped"
  [ "$trc" -eq 0 ] || { grep -E "\*\*\*Failed|Failed  |Timeout" "$L/ctest.log" | head -20; rc=1; }
done
exit $rc

#!/usr/bin/env bash
# Fuzzes the parsers of user input with libFuzzer: the JSON config
# (fuzz/fuzz_config.c), the data file header and contents
# (fuzz/fuzz_data.c), a checkpoint's manifest (fuzz/fuzz_manifest.c) and
# the BPE tokenizer's files and encoder (fuzz/fuzz_bpe.c), each for MINUTES
# minutes on one core.
#   scripts/fuzz.sh [MINUTES] [TARGET...]     (default: 10 minutes, all targets)
# Needs clang with libFuzzer (clang 14 works): apt-get install clang.
# Builds into build-fuzz/: the library (CPU only) by CMake with clang and
# -fsanitize=fuzzer-no-link,address,undefined, then each target linked to it
# with -fsanitize=fuzzer,address,undefined. Each target's corpus grows in
# build-fuzz/corpus/<target>/ (seeded from fuzz/corpus/<target>/); crashes
# are written to build-fuzz/crashes/<target>/. A crash, once fixed, goes
# into fuzz/corpus/<target>/ as a regression input: ctest's fuzz_replay_*
# replays that corpus on every CI run. Exit 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
shift || true
if ! [[ $minutes =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: MINUTES must be a whole number >= 1, not '$minutes'" >&2
  exit 2
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config data manifest bpe)
CC=${FUZZ_CC:-clang}
if ! command -v "$CC" >/dev/null; then
  echo "fuzz.sh: $CC not found; install clang (sudo apt-get install clang) or set FUZZ_CC" >&2
  exit 2
fi
out=build-fuzz
mkdir -p "$out"
sanitize=(-g -O1 -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
echo "fuzz.sh: building the library into $out/lib"
cmake -S . -B "$out/lib" -DCMAKE_C_COMPILER="$CC" -DZPP_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS="${sanitize[*]} -fsanitize=fuzzer-no-link,address,undefined" >"$out/cmake.log"
cmake --build "$out/lib" --target zeropp -j "$(nproc)" >>"$out/cmake.log"
deps=(-lcjson -lpcre2-8 -lopenblas -lm)
read -r -a mpi_link <<<"$(mpicc --showme:link)"
for t in "${targets[@]}"; do
  [ -f "fuzz/fuzz_$t.c" ] || { echo "fuzz.sh: no target fuzz/fuzz_$t.c" >&2; exit 2; }
  echo "fuzz.sh: building $out/fuzz_$t"
  "$CC" "${sanitize[@]}" -fsanitize=fuzzer,address,undefined -std=c11 \
    -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc "fuzz/fuzz_$t.c" "$out/lib/libzeropp.a" \
    "${mpi_link[@]}" "${deps[@]}" -o "$out/fuzz_$t"
done
status=0
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t" "$out/crashes/$t"
  echo "fuzz.sh: fuzzing $t for $minutes minute(s)"
  log="$out/fuzz_$t.log"
  if ! "$out/fuzz_$t" -max_total_time=$((minutes * 60)) -max_len=65536 -timeout=10 \
       -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/crashes/$t/" \
       "$out/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    status=1
    echo "fuzz.sh: $t CRASHED; see $log and $out/crashes/$t/" >&2
    grep -m5 -E "ERROR|SUMMARY|runtime error" "$log" >&2 || true
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | sed "s/^/fuzz.sh: $t: /"
  echo "fuzz.sh: $t: corpus $(find "$out/corpus/$t" -type f | wc -l) inputs," \
       "crashes $(find "$out/crashes/$t" -type f | wc -l)"
done
exit $status

#!/usr/bin/env bash
# The engine's prefetch and reduction depths, A/B over the emulated link (one device call):
#   bash bench/train/depth_ab.sh   (carry .deps/ with the cJSON packages)
# GPT 1.31B mb4, 2 ranks as 2 emulated nodes on one GPU, ZeRO++ and ZeRO-3 at depths 2/2 (default),
# 1/1 (the old schedule) and 3/3, 6 steps each with --profile; then `ctest -L gpu` with the time left.
# Writes summary.txt and gpu_tests.log to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S=$OUT/summary.txt; W=/tmp/work; mkdir -p $W
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
export CJSON_ROOT=/tmp/cjson/usr
echo "$(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) $(lscpu | grep 'Model name' | tr -s ' ')" | tee $S
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > $W/build.log 2>&1 &&
  cmake --build build-gpu -j16 --target zeropp_cli >> $W/build.log 2>&1 || { echo build failed | tee -a $S; tail -30 $W/build.log | tee -a $S; exit 1; }
echo "built at $(( $(date +%s) - T0 ))s" | tee -a $S
# the test binaries build while the A/B runs (they share the CPU, not the GPU)
(cmake --build build-gpu -j8 > $W/build2.log 2>&1; echo done > $W/build2.done) &
run() { # label mode depth(PR)
  local lim=$(( 330 - ($(date +%s) - T0) )); [ $lim -gt 15 ] || { echo "$1 skipped (time)" | tee -a $S; return; }
  sed -E "s/\"stage\": 3,/\"stage\": 3, \"zeropp_prefetch_depth\": ${3:0:1}, \"zeropp_reduce_depth\": ${3:1:1},/" \
    bench/train/gpt_1p3b_$2.json > $W/$1.json
  timeout $lim mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE \
    build-gpu/zeropp train --device gpu --config $W/$1.json --steps 6 --node-size 1 --emulate-nodes \
    --profile --metrics $W/$1.jsonl > $W/$1.log 2>&1; local rc=$?
  echo "$1 rc=$rc $(grep -A4 'mean of steps' $W/$1.log | tr -s ' ' | tr '\n' ' ' | cut -c1-330)" | tee -a $S
  grep -o '"step":[0-9]*\|"tokens_per_s":[0-9.]*' $W/$1.jsonl | paste - - | tr '\n' ' ' | sed 's/^/  /' | tee -a $S; echo | tee -a $S
  [ $rc = 0 ] || tail -5 $W/$1.log | tee -a $S
}
run zeropp_d22 zeropp 22
run zeropp_d11 zeropp 11
run zero3_d22 zero3 22
run zero3_d11 zero3 11
run zeropp_d33 zeropp 33
echo "A/B done at $(( $(date +%s) - T0 ))s" | tee -a $S
while [ ! -f $W/build2.done ]; do sleep 2; done
grep -E ' error|Error ' $W/build2.log | head -5 | tee -a $S
echo "tests built at $(( $(date +%s) - T0 ))s" | tee -a $S
lim=$(( 585 - ($(date +%s) - T0) ))
(cd build-gpu && timeout $lim ctest -L gpu --output-on-failure) > $W/t.log 2>&1
grep -E "tests passed|Failed|\*\*\*|Passed|Timeout|Skipped|Not Run" $W/t.log | tail -24 | tee -a $S
grep -E "FAIL|worst|bound" $W/t.log | head -12 | tee -a $S
cp $W/t.log $OUT/gpu_tests.log
echo "end at $(( $(date +%s) - T0 ))s" | tee -a $S

#!/usr/bin/env bash
# `zeropp train --device gpu` on GPT 1.31B (bench/train/gpt_1p3b_*.json):
# tokens/s and peak memory of this tree and, with OLD=DIR (the source of
# another commit, e.g. `git archive C | tar -x -C .old`, carried with the
# call), of that tree too, built beside it and run in the same call, so a
# change is measured against its parent on the same machine.
#   world 1, micro-batch 4 (compute alone);
#   2 ranks as 2 emulated nodes (sockets between them; sharing the GPU when
#   only one is lent), ZeRO-3 and ZeRO++ (qwZ + qgZ), micro-batch 4.
# Tokens/s is the median over steps 3..STEPS (steps 1-2 warm up). Peak
# memory: nvidia-smi's memory.used sampled every 100 ms (every process on
# the GPU together), and our own device_peak_bytes where the tree reports it.
# Prints one line per run; $OUT/train_compare.txt keeps them.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
S="$OUT/train_compare.txt"
STEPS=${STEPS:-6}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! [ -f /usr/include/cjson/cJSON.h ]; then
  mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
  export CJSON_ROOT=/tmp/cjson/usr
fi
build() { # src dir
  [ -x "$2/zeropp" ] && return 0
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release > "$OUT/build-$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j"$(nproc)" --target zeropp_cli >> "$OUT/build-$(basename "$2").log" 2>&1
}
build . build-gpu || { echo "build failed" | tee -a "$S"; exit 1; }
trees="new:build-gpu"
if [ -n "${OLD:-}" ]; then
  build "$OLD" build-old && trees="$trees old:build-old" || echo "old tree: build failed" | tee -a "$S"
fi
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2); else print "nan"}'; }
run() { # label build np config extra...
  local label=$1 bdir=$2 np=$3 cfg=$4; shift 4
  local m="$OUT/$label.jsonl"; rm -f "$m"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/$label.mem" &
  local smi=$!
  timeout 240 mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE \
    "$bdir/zeropp" train --device gpu --config "$cfg" --steps "$STEPS" --quiet --metrics "$m" "$@" \
    > "$OUT/$label.log" 2>&1
  local rc=$?
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  local tps mem own
  tps=$(sed -n 's/.*"step":\([0-9]*\),.*"tokens_per_s":\([0-9.]*\).*/\1 \2/p' "$m" 2>/dev/null |
        awk '$1 >= 3 {print $2}' | median)
  mem=$(sort -g "$OUT/$label.mem" | tail -1)
  own=$(sed -n 's/.*"device_peak_bytes":\([0-9]*\).*/\1/p' "$m" 2>/dev/null | tail -1)
  printf '%-22s rc=%d tokens/s %8s  nvidia-smi peak %6s MiB  device_peak %s\n' "$label" "$rc" \
    "${tps:-nan}" "${mem:-?}" "${own:+$(( own / 1048576 )) MiB}" | tee -a "$S"
  [ "$rc" -eq 0 ] || tail -5 "$OUT/$label.log" | tee -a "$S"
}
echo "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)" | tee -a "$S"
mb1() { sed 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 1/' "$1" > "$2"; }
mb1 bench/train/gpt_1p3b_zero3.json /tmp/zero3_mb1.json
mb1 bench/train/gpt_1p3b_zeropp.json /tmp/zeropp_mb1.json
for t in $trees; do
  name=${t%%:*} bdir=${t#*:}
  run "$name-w1-mb4" "$bdir" 1 bench/train/gpt_1p3b_zero3.json
  for mode in ${MODES:-zero3 zeropp}; do
    run "$name-2n-$mode-mb4" "$bdir" 2 "bench/train/gpt_1p3b_$mode.json" --node-size 1 --emulate-nodes
    [ -n "${MB1:-}" ] && run "$name-2n-$mode-mb1" "$bdir" 2 "/tmp/${mode}_mb1.json" --node-size 1 --emulate-nodes
  done
done

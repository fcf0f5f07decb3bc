#!/usr/bin/env bash
# One GPU, world 1: `zeropp train --device gpu` against llm.c (the C/CUDA
# GPT-2 trainer: bf16, cuDNN flash attention, fp32 master weights, AdamW) on
# the same shapes, T 1024, random tokens, in the same call:
#   gpt1p3b  GPT 1.31B (24 x 2048, 16 heads of 128), micro-batch 4; llm.c -e gpt3:c2048
#   gpt124m  GPT-2 124M (12 x 768, 12 heads of 64), micro-batch 8;  llm.c -e d12
# Each system runs ROUNDS times, the systems alternating within a round, so a
# drift of the machine falls on all of them. Tokens/s is each run's median
# over steps WARM+1..STEPS (llm.c's own step times, our --metrics lines);
# peak memory is nvidia-smi's memory.used sampled every 100 ms.
#   LLMC=DIR   llm.c's peer folder (../shared/bench/llmc copied into the
#              tree's ignored .peers/llmc and carried with the call)
#   AB=1       also ours with zeropp_resident_weights false (same binary)
# Prints one TSV line a run (shape, system, round, tokens/s, peak MiB) to
# $OUT/world1_race.tsv and a summary of ratios.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
LLMC=${LLMC:-.peers/llmc} ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-14} WARM=${WARM:-3}
SHAPES=${SHAPES:-"gpt1p3b gpt124m"}
TSV="$OUT/world1_race.tsv"
export NCCL_NVLS_ENABLE=0
if ! [ -f /usr/include/cjson/cJSON.h ]; then
  mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
  export CJSON_ROOT=/tmp/cjson/usr
fi
[ -x build-gpu/zeropp ] || { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" --target zeropp_cli >> "$OUT/build.log" 2>&1; } ||
  { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
# llm.c builds once (minutes: cuDNN's frontend), beside the runs
[ -x /tmp/llmc-build/train_gpt2cu ] || RUNS=" " bash "$LLMC/llmc_peer.sh" > "$OUT/llmc-build.log" 2>&1

cfg() { # shape resident -> config path
  local src=bench/train/gpt_1p3b_zero3.json f="/tmp/w1-$1-$2.json"
  [ "$1" = gpt124m ] && src=bench/train/gpt_124m_zero3.json
  sed -e 's/"n_head": 6,/"n_head": 12,/' \
      -e "s/\"stage\": 3}/\"stage\": 3, \"zeropp_resident_weights\": $2}/" "$src" > "$f"
  echo "$f"
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2); else print "nan"}'; }
watch_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$1" & echo $!; }
ours() { # shape round resident label
  local m="$OUT/ours-$1-$4-$2.jsonl" mem="$OUT/ours-$1-$4-$2.mem" smi
  smi=$(watch_mem "$mem")
  timeout 300 build-gpu/zeropp train --device gpu --config "$(cfg "$1" "$3")" --steps "$STEPS" \
    --quiet --metrics "$m" > "$OUT/ours-$1-$4-$2.log" 2>&1
  local rc=$?; kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  local tps; tps=$(sed -n 's/.*"step":\([0-9]*\),.*"tokens_per_s":\([0-9.]*\).*/\1 \2/p' "$m" |
                   awk -v w="$WARM" '$1 > w {print $2}' | median)
  [ "$rc" -eq 0 ] || tps=nan
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$4" "$2" "$tps" "$(sort -g "$mem" | tail -1)" | tee -a "$TSV"
}
llmc() { # shape round
  local model=gpt3:c2048 b=4 mem="$OUT/llmc-$1-$2.mem" smi line
  [ "$1" = gpt124m ] && model=d12 b=8
  smi=$(watch_mem "$mem")
  line=$(RUNS="$model:$b" STEPS="$STEPS" WARM="$WARM" bash "$LLMC/llmc_peer.sh" 2>&1 | tail -1)
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  local tps; tps=$(sed -n 's/.*tok_s=\([0-9.]*\).*/\1/p' <<< "$line")
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" llmc "$2" "${tps:-nan}" "$(sort -g "$mem" | tail -1)" | tee -a "$TSV"
  [ -n "$tps" ] || echo "llm.c: $line"
}
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) $(git rev-parse --short HEAD 2>/dev/null)" | tee -a "$TSV"
for r in $(seq 1 "$ROUNDS"); do
  for s in $SHAPES; do
    ours "$s" "$r" true ours
    llmc "$s" "$r"
    [ -n "${AB:-}" ] && ours "$s" "$r" false ours-noresident
  done
done
# ratios per round: ours / llm.c
awk -F'\t' '!/^#/ {t[$1" "$3" "$2]=$4} END {for (k in t) if (k ~ / ours$/) {split(k,a," ");
  l=t[a[1]" "a[2]" llmc"]; if (l > 0) printf "%s round %s ours/llm.c %.3f\n", a[1], a[2], t[k]/l}}' "$TSV" |
  sort | tee -a "$OUT/world1_race.txt"

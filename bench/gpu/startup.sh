#!/usr/bin/env bash
# Start-up of a large model on one GPU: `zeropp train --device gpu` on GPT
# 6.7B (bench/train/gpt_6p7b_zero3.json: 32 x 4096, 32 heads of 128,
# micro-batch 1, T 1024), world 1, STEPS steps. Every line of the run's
# output is stamped with the seconds since launch, so the log shows when
# setup ended (the "set up in" line and the header) and when step 1 was
# done; tokens/s is the run's own summary (steps 2..STEPS), peak memory
# nvidia-smi's memory.used sampled every 100 ms.
#   RESIDENT=false   zeropp_resident_weights off (the model's bf16 copy not
#                    kept: 2 bytes a parameter less)
#   CONFIG=path      another model
#   BUILD=dir, DEVICE=cpu   another build, the CPU (to try the script)
# Needs a build in build-gpu (bench/train/race.sh prep or train_compare.sh
# make one); prints a summary line to $OUT/startup.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
CONFIG=${CONFIG:-bench/train/gpt_6p7b_zero3.json} STEPS=${STEPS:-4} RESIDENT=${RESIDENT:-true}
BUILD=${BUILD:-build-gpu} DEVICE=${DEVICE:-gpu}
export NCCL_NVLS_ENABLE=0
cfg=/tmp/startup-$RESIDENT.json
sed "s/\"stage\": 3}/\"stage\": 3, \"zeropp_resident_weights\": $RESIDENT}/" "$CONFIG" > "$cfg"
log="$OUT/startup-$(basename "$CONFIG" .json)-$RESIDENT.log"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log.mem" &
smi=$!
t0=$(date +%s.%N)
stdbuf -oL "$BUILD/zeropp" train --device "$DEVICE" --config "$cfg" --steps "$STEPS" 2>&1 |
  while IFS= read -r line; do
    printf '%7.2f %s\n' "$(echo "$(date +%s.%N) $t0" | awk '{print $1 - $2}')" "$line"
  done > "$log"
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
setup=$(awk '$2 == "train:" {print $1; exit}' "$log")
step1=$(awk '$2 == "step" && $3 == "1" {print $1; exit}' "$log")
tps=$(awk '$2 == "tokens/s" {print $3; exit}' "$log")
printf '%s resident=%s: header at %s s, step 1 done at %s s, tokens/s %s, nvidia-smi peak %s MiB\n' \
  "$(basename "$CONFIG" .json)" "$RESIDENT" "${setup:-?}" "${step1:-?}" "${tps:-?}" \
  "$(sort -g "$log.mem" | tail -1)" | tee -a "$OUT/startup.txt"

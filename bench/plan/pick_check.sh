#!/usr/bin/env bash
# Does `zeropp plan --pick` pick the setting that measures fastest? (issue 15)
#
#   bash bench/plan/pick_check.sh            # CPU ranks: 4 ranks as 2 nodes of 2
#
# For every setting (mode x micro-batch; hpZ on/off is in the modes: hpz and
# zeropp keep the secondary copy, zero3, qwz, qgz do not) it trains a few
# steps with `zeropp train`, and once a round measures every mode's collectives
# with `zeropp bench comm`. Then:
#   1. the calibration file the planner reads (`zeropp plan --calibrate`): every
#      bench comm line, and the train lines of the CAL_MODES runs only (default
#      zero3), so the other modes' step times are predictions, not inputs;
#   2. `zeropp plan --pick` restricted to the same candidates (--modes,
#      --micro-batches, and with nodes of 2 or more --hpz-sizes = the node size, the only one the trainer
#      runs) and each candidate's predicted tokens/s (`zeropp plan --json`);
#   3. a table: measured and predicted tokens/s and rank of every setting, and
#      whether the pick is the measured fastest (if not, how much slower the
#      pick measured), and how far the two rankings are apart.
# Measured tokens/s of a setting: the median over its runs' steps after the
# first WARM (the warm-up step is slow; the calibration drops step 1 too).
#
# Environment (defaults for CPU ranks on this machine):
#   ZPP=build/zeropp       the zeropp binary
#   NP=4 NODE_SIZE=2       ranks, ranks per (emulated) node
#   LAUNCH="mpirun --oversubscribe -np 4"   the launcher (NP is appended if
#                          LAUNCH is left unset)
#   TRAIN_ARGS=""          more `zeropp train` flags, BENCH_ARGS="" more `bench comm` flags
#   PLAN_ARGS="--serial --latency-us 0"   the planner's schedule for this machine
#                          (DESIGN.md section 11, "Schedules": CPU ranks take turns)
#   MODEL=4,512,32,256 N_HEAD=4   GPT shape n_layer,n_embd,seq_len,vocab
#   MODES="zero3 qwz hpz qgz zeropp"  MBS="1 4"  STEPS=6 WARM=1 ROUNDS=1
#   CAL_MODES=zero3        modes whose train lines go into the calibration
#   DTYPE=bf16             the training dtype (bf16 or fp16)
#   OUT=pick-out           where the configs, logs and the calibration go
# On a GPU machine, ranks as emulated nodes (one rank a GPU, or ranks sharing
# one GPU; see bench/train/race.sh). The runs are profiled (--profile), so the
# calibration takes their compute from compute_ms: on GPU ranks the collectives
# overlap the compute, and a step can be shorter than its collectives.
#   ZPP=build-gpu/zeropp NP=2 NODE_SIZE=1 MODES="zero3 qwz qgz" MBS="1 4" \
#   LAUNCH="mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2" \
#   TRAIN_ARGS="--device gpu --emulate-nodes" BENCH_ARGS="--device gpu --emulate-nodes" \
#   PLAN_ARGS="--latency-us 0 --serial --link-per-comm" \
#   MODEL=24,2048,1024,50304 N_HEAD=16 bash bench/plan/pick_check.sh
# (hpz and zeropp need NODE_SIZE >= 2: with one rank a node there is no node to
# keep a copy in, and the script drops them.)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ZPP=${ZPP:-build/zeropp}
NP=${NP:-4} NODE_SIZE=${NODE_SIZE:-2}
LAUNCH=${LAUNCH:-mpirun --oversubscribe -np $NP}
TRAIN_ARGS=${TRAIN_ARGS:-} BENCH_ARGS=${BENCH_ARGS:-}
PLAN_ARGS=${PLAN_ARGS:---serial --latency-us 0}
MODEL=${MODEL:-4,512,32,256} N_HEAD=${N_HEAD:-4}
MODES=${MODES:-zero3 qwz hpz qgz zeropp} MBS=${MBS:-1 4}
STEPS=${STEPS:-6} WARM=${WARM:-1} ROUNDS=${ROUNDS:-1} CAL_MODES=${CAL_MODES:-zero3}
DTYPE=${DTYPE:-bf16}
OUT=${OUT:-pick-out}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

die() { echo "pick_check: $*" >&2; exit 2; }
[ -x "$ZPP" ] || die "no zeropp binary at $ZPP (build it, or set ZPP)"
[ "$STEPS" -gt "$WARM" ] || die "STEPS ($STEPS) must exceed WARM ($WARM)"
IFS=, read -r L C T V <<< "$MODEL"
[ -n "${V:-}" ] || die "MODEL '$MODEL': give n_layer,n_embd,seq_len,vocab"
if [ "$NODE_SIZE" -lt 2 ]; then # hpZ keeps a copy inside a node of >= 2 ranks
  kept=""; for m in $MODES; do case $m in hpz|zeropp) echo "pick_check: $m dropped (node size 1)";; *) kept="$kept $m";; esac; done
  MODES=${kept# }
fi
[ -n "$MODES" ] || die "no mode left to try"
mkdir -p "$OUT" || die "cannot create $OUT"
rm -f "$OUT"/train_*.jsonl "$OUT"/comm_*.jsonl

# The trainer's name of a mode in its metrics ("mode") and its config keys.
mode_keys() {
  case $1 in
    zero3) echo '' ;;
    qwz) echo ', "zero_quantized_weights": true' ;;
    hpz) echo ", \"zero_hpz_partition_size\": $NODE_SIZE" ;;
    qgz) echo ', "zero_quantized_gradients": true' ;;
    zeropp) echo ", \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": $NODE_SIZE, \"zero_quantized_gradients\": true" ;;
    *) die "unknown mode '$1' (zero3 qwz hpz qgz zeropp)" ;;
  esac
}
write_config() { # mode micro-batch file
  local dt='"bf16": {"enabled": true}'
  [ "$DTYPE" = fp16 ] && dt='"fp16": {"enabled": true}'
  [ "$DTYPE" = fp32 ] && dt='"bf16": {"enabled": false}'
  cat > "$3" << EOF
{
  "train_micro_batch_size_per_gpu": $2,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
  $dt,
  "zero_optimization": {"stage": 3$(mode_keys "$1")},
  "model": {"n_layer": $L, "n_head": $N_HEAD, "n_embd": $C, "seq_len": $T, "vocab_size": $V}
}
EOF
}

PARAMS=$("$ZPP" plan --model "$MODEL" --world "$NP" --node-size "$NODE_SIZE" --json |
         sed -n 's/.*"params":\([0-9.e+]*\).*/\1/p' | head -1)
[ -n "$PARAMS" ] || die "zeropp plan could not count the model's parameters"
UNITS=$((L + 1))
echo "pick_check: $NP ranks in nodes of $NODE_SIZE, GPT $MODEL ($PARAMS parameters, $UNITS units)," \
     "modes: $MODES; micro-batches: $MBS; $STEPS steps, $ROUNDS round(s); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  for mb in $MBS; do
    for m in $MODES; do
      cfg=$OUT/cfg_${m}_mb$mb.json met=$OUT/train_${m}_mb${mb}_r$r.jsonl
      write_config "$m" "$mb" "$cfg"
      # shellcheck disable=SC2086 # LAUNCH, TRAIN_ARGS are word lists
      $LAUNCH "$ZPP" train --config "$cfg" --node-size "$NODE_SIZE" --steps "$STEPS" --profile \
        --quiet --metrics "$met" $TRAIN_ARGS > "$OUT/train_${m}_mb${mb}_r$r.log" 2>&1 ||
        die "train $m mb $mb round $r failed: $OUT/train_${m}_mb${mb}_r$r.log"
    done
  done
  # shellcheck disable=SC2086
  $LAUNCH "$ZPP" bench comm --params "$PARAMS" --units "$UNITS" --node-size "$NODE_SIZE" --json \
    --iters 3 $BENCH_ARGS > "$OUT/comm_r$r.jsonl" 2> "$OUT/comm_r$r.log" ||
    die "bench comm round $r failed: $OUT/comm_r$r.log"
done

# 1. The calibration: every bench comm line, the CAL_MODES train lines.
CAL=$OUT/cal.jsonl
cat "$OUT"/comm_r*.jsonl > "$CAL"
for m in $CAL_MODES; do cat "$OUT"/train_"${m}"_mb*_r*.jsonl >> "$CAL" 2> /dev/null; done

median() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
# 2. Measured and predicted tokens/s of each setting.
TAB=$OUT/settings.tsv; : > "$TAB"
for mb in $MBS; do
  # shellcheck disable=SC2086
  "$ZPP" plan --model "$MODEL" --world "$NP" --node-size "$NODE_SIZE" --micro-batch "$mb" \
    --calibrate "$CAL" --json $PLAN_ARGS > "$OUT/plan_mb$mb.jsonl" 2> "$OUT/plan_mb$mb.err" ||
    die "zeropp plan failed: $(cat "$OUT/plan_mb$mb.err")"
  for m in $MODES; do
    meas=$(cat "$OUT"/train_"${m}"_mb"${mb}"_r*.jsonl |
           sed -n 's/.*"step":\([0-9]*\),.*"tokens_per_s":\([0-9.e+]*\).*/\1 \2/p' |
           awk -v w="$WARM" '$1 > w {print $2}' | median)
    pred=$(grep "\"mode\":\"$m\"" "$OUT/plan_mb$mb.jsonl" | sed -n 's/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p')
    if [ -z "$meas" ] || [ -z "$pred" ]; then die "no figure for $m mb $mb (measured '$meas', predicted '$pred')"; fi
    printf '%s\t%s\t%s\t%s\n' "$m" "$mb" "$meas" "$pred" >> "$TAB"
  done
done
# Ranks (1 = fastest), measured and predicted.
sort -t$'\t' -k3,3gr "$TAB" | awk -F'\t' '{print $1 "\t" $2 "\t" NR}' | sort > "$OUT/rank_meas"
sort -t$'\t' -k4,4gr "$TAB" | awk -F'\t' '{print $1 "\t" $2 "\t" NR}' | sort > "$OUT/rank_pred"

# 3. The pick among the same candidates.
mlist=$(echo "$MODES" | tr ' ' ','); blist=$(echo "$MBS" | tr ' ' ',')
HPZ_SIZES=""; [ "$NODE_SIZE" -ge 2 ] && HPZ_SIZES="--hpz-sizes $NODE_SIZE" # no node to copy in at 1
# shellcheck disable=SC2086
PICK=$("$ZPP" plan --model "$MODEL" --world "$NP" --node-size "$NODE_SIZE" --calibrate "$CAL" \
         --pick --modes "$mlist" --micro-batches "$blist" $HPZ_SIZES --mem-gb 1e6 \
         --json $PLAN_ARGS 2> "$OUT/pick.err") || die "zeropp plan --pick failed: $(cat "$OUT/pick.err")"
echo "$PICK" > "$OUT/pick.json"
pm=$(sed -n 's/.*"choice":{"mode":"\([a-z0-9]*\)".*/\1/p' <<< "$PICK")
pb=$(sed -n 's/.*"choice":{[^}]*"micro_batch":\([0-9]*\).*/\1/p' <<< "$PICK")

echo
printf '%-7s %4s | %12s %5s | %12s %5s\n' mode mb "measured/s" rank "predicted/s" rank
join -t$'\t' <(awk -F'\t' '{print $1 "_" $2 "\t" $3 "\t" $4}' "$TAB" | sort) \
     <(join -t$'\t' <(awk -F'\t' '{print $1 "_" $2 "\t" $3}' "$OUT/rank_meas") \
                    <(awk -F'\t' '{print $1 "_" $2 "\t" $3}' "$OUT/rank_pred")) |
  sort -t$'\t' -k4,4n | awk -F'\t' '{split($1, a, "_"); printf "%-7s %4s | %12.1f %5d | %12.1f %5d\n", a[1], a[2], $2, $4, $3, $5}'
best=$(sort -t$'\t' -k3,3gr "$TAB" | head -1)
bm=$(cut -f1 <<< "$best") bb=$(cut -f2 <<< "$best") bt=$(cut -f3 <<< "$best")
pt=$(awk -F'\t' -v m="$pm" -v b="$pb" '$1 == m && $2 == b {print $3}' "$TAB")
dist=$(join -t$'\t' <(awk -F'\t' '{print $1 "_" $2 "\t" $3}' "$OUT/rank_meas") \
                    <(awk -F'\t' '{print $1 "_" $2 "\t" $3}' "$OUT/rank_pred") |
       awk -F'\t' '{d = $2 - $3; if (d < 0) d = -d; s += d; if (d > mx) mx = d; n++}
                   END {printf "sum of |rank differences| %d over %d settings, largest %d", s, n, mx}')
echo
echo "pick: $pm at micro-batch $pb (measured $(printf '%.1f' "${pt:-0}") tokens/s)"
echo "measured fastest: $bm at micro-batch $bb ($(printf '%.1f' "$bt") tokens/s)"
if [ "$pm" = "$bm" ] && [ "$pb" = "$bb" ]; then
  echo "pick == measured fastest: yes"
else
  echo "pick == measured fastest: no; the pick measured $(awk -v a="$pt" -v b="$bt" 'BEGIN {printf "%.1f", 100 * (1 - a / b)}')% below the fastest"
fi
echo "rankings: $dist"
echo "files: $OUT (cal.jsonl, settings.tsv, pick.json, logs)"

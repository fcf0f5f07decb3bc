#!/usr/bin/env bash
# Preemption (issue 29; docs/checkpoints.md, "Preemption"), on 4 CPU ranks:
#   a. SIGTERM to every rank (as srun sends it): the run stops after the
#      step it is in, saves that step's checkpoint, says so, and every rank
#      exits 75; resumed from it, the run repeats an uninterrupted one's
#      losses bit for bit;
#   b. SIGTERM to Open MPI's launcher, which kills the ranks a second later
#      without letting them save: the checkpoint published before resumes;
#   c. SIGUSR1 to the launcher (forwarded as it is): the same, and mpirun
#      passes the ranks' 75 on;
#   d. without --save: the line says nothing was saved, exit 75;
#   e. a second signal ends the process at once, by that signal.
# The signal comes at a random moment after the first few steps.
# Usage (tests/house.cmake): test_preempt.sh ZEROPP SOURCE_DIR MPIEXEC WORK_DIR
set -euo pipefail
zeropp=$1 src=$2 mpiexec=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$work"
fail() {
  echo "test_preempt: FAILED: $*" >&2
  exit 1
}
mpirun4=("$mpiexec" --oversubscribe --bind-to none -np 4)
# A constant lr after the warm-up (WarmupLR), so a run's --steps does not
# move the schedule and runs of different lengths can be compared step by step.
cat > cfg.json <<'JSON'
{
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
  "zero_optimization": {"stage": 3, "zero_quantized_weights": true,
                        "zero_hpz_partition_size": 2, "zero_quantized_gradients": true},
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "seq_len": 32, "vocab_size": 256},
  "zeropp": {"seed": 7, "eval_every": 0}
}
JSON
data=$src/tests/data/tinyshakespeare.txt
train=(train --config cfg.json --data "$data")
# Starts a 100000-step run in the background (PID in $pid), waits until its
# metrics hold 3 + RANDOM % 5 steps.
start() {
  local log=$1 metrics=$2
  shift 2
  rm -f "$metrics"
  "$@" --steps 100000 --metrics "$metrics" >"$log" 2>&1 &
  pid=$!
  local want=$((3 + RANDOM % 5))
  for _ in $(seq 1 600); do
    [ -f "$metrics" ] && [ "$(wc -l <"$metrics")" -ge "$want" ] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "the run ended before its step $want"; }
    sleep 0.1
  done
  kill -KILL "$pid"
  fail "no step $want after 60 s: $(tail -3 "$log")"
}
# The ranks: mpirun's children.
ranks_of() { pgrep -P "$1" | tr '\n' ' '; }
# Waits for $pid; its exit status in $rc.
finish() {
  rc=0
  timeout 120 tail --pid="$pid" -f /dev/null || { kill -KILL "$pid"; fail "still running 120 s after the signal"; }
  wait "$pid" || rc=$?
}
# The step N of "interrupted at step N by SIG...", checked against the folder.
interrupted_at() {
  local log=$1 sig=$2
  local n
  n=$(sed -n "s/^interrupted at step \([0-9]*\) by $sig: .*/\1/p" "$log")
  [ -n "$n" ] || { cat "$log" >&2; fail "no 'interrupted at step N by $sig' line"; }
  echo "$n"
}
# "loss" of every step of a metrics file, as written: step loss.
losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss":\([^,]*\),.*/\1 \2/p' "$1"; }

echo "== a. SIGTERM to every rank"
start a.log a.jsonl "${mpirun4[@]}" "$zeropp" "${train[@]}" --save ck
kill -TERM $(ranks_of "$pid")
finish
[ "$rc" -eq 75 ] || { cat a.log >&2; fail "mpirun exited $rc, not the ranks' 75"; }
n=$(interrupted_at a.log SIGTERM)
step_dir=$(printf 'ck/step-%08d' "$n")
grep -q "^interrupted at step $n by SIGTERM: saved to $step_dir; continue with --resume ck$" a.log ||
  fail "the line does not name $step_dir: $(grep interrupted a.log)"
[ -f "$step_dir/manifest.json" ] || fail "no checkpoint $step_dir: $(ls ck)"
grep -q "\"folder\": *\"$(basename "$step_dir")\"" ck/checkpoint.json ||
  fail "ck/checkpoint.json does not publish $step_dir: $(cat ck/checkpoint.json)"
[ "$(wc -l <a.jsonl)" -eq "$n" ] || fail "metrics hold $(wc -l <a.jsonl) steps, the run stopped after $n"
echo "   stopped after step $n, saved"
# Resumed 4 steps further, against a run that never stopped.
m=$((n + 4))
# (--metrics a.jsonl again: a resume continues the file.)
timeout 300 "${mpirun4[@]}" "$zeropp" "${train[@]}" --resume ck --steps $m --metrics a.jsonl \
  >r.log 2>&1 || { cat r.log >&2; fail "the resume failed"; }
timeout 300 "${mpirun4[@]}" "$zeropp" "${train[@]}" --steps $m --metrics ref.jsonl \
  >ref.log 2>&1 || { cat ref.log >&2; fail "the uninterrupted run failed"; }
[ "$(losses a.jsonl | wc -l)" -eq "$m" ] ||
  fail "the metrics file holds $(losses a.jsonl | wc -l) steps after the resume, not $m"
[ "$(grep -c '"resumed_from"' a.jsonl)" -eq 1 ] &&
  grep -q "^{\"step\":$((n + 1)),.*\"resumed_from\":$n" a.jsonl ||
  fail "step $((n + 1)) is not the one line marked resumed_from $n"
diff <(losses a.jsonl) <(losses ref.jsonl) >/dev/null ||
  fail "the losses differ from the uninterrupted run's: $(diff <(losses a.jsonl) <(losses ref.jsonl))"
echo "   resumed to step $m: the losses of steps 1-$m are the uninterrupted run's, bit for bit"

echo "== b. SIGTERM to the launcher"
# Open MPI's mpirun (4.1) does not pass SIGTERM on to be handled: about a
# second later it sends the ranks SIGTERM and SIGKILL together, so nothing
# can be saved then (docs/checkpoints.md says to send SIGUSR1 to mpirun, or
# SIGTERM to the ranks as srun does). What must hold: the checkpoint
# published before the kill still resumes.
rm -rf ck
start b.log b.jsonl "${mpirun4[@]}" "$zeropp" "${train[@]}" --save ck --save-every 2
kill -TERM "$pid"
finish
[ "$rc" -ne 0 ] || fail "mpirun exited 0 after a SIGTERM"
[ -f ck/checkpoint.json ] || fail "no checkpoint published in ck: $(ls -a ck)"
n=$(sed -n 's/.*"step": *\([0-9]*\).*/\1/p' ck/checkpoint.json | head -1)
[ -n "$n" ] || fail "no step in ck/checkpoint.json: $(cat ck/checkpoint.json)"
timeout 300 "${mpirun4[@]}" "$zeropp" "${train[@]}" --resume ck --steps $((n + 1)) >rb.log 2>&1 ||
  { cat rb.log >&2; fail "the checkpoint of step $n published before the kill does not resume"; }
echo "   mpirun exit $rc; the checkpoint of step $n resumes"

echo "== c. SIGUSR1 to the launcher"
rm -rf ck
start c.log c.jsonl "${mpirun4[@]}" "$zeropp" "${train[@]}" --save ck
kill -USR1 "$pid"
finish
[ "$rc" -eq 75 ] || { cat c.log >&2; fail "mpirun exited $rc after SIGUSR1, not 75"; }
n=$(interrupted_at c.log SIGUSR1)
[ -f "$(printf 'ck/step-%08d' "$n")/manifest.json" ] || fail "no checkpoint of step $n: $(ls ck)"
echo "   stopped after step $n, exit 75"

echo "== d. without --save"
start d.log d.jsonl "${mpirun4[@]}" "$zeropp" "${train[@]}"
kill -INT $(ranks_of "$pid")
finish
[ "$rc" -eq 75 ] || { cat d.log >&2; fail "exit $rc, not 75"; }
n=$(interrupted_at d.log SIGINT)
grep -q "^interrupted at step $n by SIGINT: nothing saved (no --save)$" d.log ||
  fail "the line does not say nothing was saved: $(grep interrupted d.log)"
echo "   stopped after step $n, nothing saved"

echo "== e. a second signal"
start e.log e.jsonl "$zeropp" "${train[@]}" --set zero_optimization.zero_hpz_partition_size=1 --save ck-e
# Both arrive together: stopped, the process gets SIGUSR1 and SIGTERM
# (two signals, so neither merges into the other), then runs on; the first
# handled asks for a stop, the second ends the process by its own signal.
kill -STOP "$pid"
kill -USR1 "$pid"
kill -TERM "$pid"
kill -CONT "$pid"
finish
case $rc in
  138 | 143) ;; # 128 + SIGUSR1 (10) or SIGTERM (15)
  *) cat e.log >&2; fail "exit $rc after a second signal, not 138 or 143 (killed by it)" ;;
esac
grep -q "^interrupted" e.log && fail "the second signal let the run stop at a step: $(grep interrupted e.log)"
echo "   ended by the second signal at once (exit $rc)"
echo "ok"

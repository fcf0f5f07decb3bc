#!/usr/bin/env bash
# Issue 28's acceptance run: your own text, end to end, as the README's
# "Train on your own text" types it (the same commands, with the command's
# and the repository's paths spelled out):
#   a. `zeropp tokenize` Tiny Shakespeare with a small BPE tokenizer
#      (tests/data/shakespeare-bpe: the 256 bytes, 63 merges learned on the
#      text, <|endoftext|>; GPT-2's file format);
#   b. train a small GPT-2 300 steps on 4 CPU ranks, a checkpoint every 100;
#   c. resume it WITHOUT --config to step 400: the note names what changed,
#      the schedule's length and the lr of step 301 before and after;
#   d. `zeropp sample` the checkpoint as text in that tokenizer (the files
#      named, and found through the note `zeropp tokenize` left);
#   e. `zeropp eval` the checkpoint: loss and perplexity = exp(loss), the
#      loss below ln(vocabulary) (better than guessing), and the training
#      loss of step 400 below that of step 1.
# Each step says what failed, and the time each took.
#
# Usage (ctest runs it, tests/e2e.cmake): test_e2e.sh ZEROPP SOURCE_DIR MPIEXEC WORK_DIR
set -euo pipefail
zeropp=$1 src=$2 mpiexec=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$work"

stage="setup"
t_all=$SECONDS
t_stage=$SECONDS
fail() {
  echo "test_e2e: FAILED at $stage: $*" >&2
  exit 1
}
begin() {
  stage=$1
  t_stage=$SECONDS
  echo "== $stage"
}
done_stage() { echo "   ($((SECONDS - t_stage)) s)"; }
# Runs a command, its output to LOG (shown on failure); a hang guard.
run() {
  local log=$1
  shift
  echo "   \$ $*"
  if ! timeout 400 "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "this command failed (exit status above; output in $work/$log): $*"
  fi
}
mpirun4=("$mpiexec" --oversubscribe --bind-to none -np 4)
# The training loss of step N in a training log.
loss_at() { awk -v s="$2" '$1 == "step" && $2 == s && $4 == "loss" {print $5}' "$1"; }

vocab=$src/tests/data/shakespeare-bpe/vocab.json
merges=$src/tests/data/shakespeare-bpe/merges.txt
text=$src/tests/data/tinyshakespeare.txt
V=320

begin "a. zeropp tokenize"
run tokenize.log "$zeropp" tokenize --vocab "$vocab" --merges "$merges" "$text" shakespeare.bin
# "wrote shakespeare.bin: 750080 tokens from 1115394 bytes of ... (1.49 bytes a token), vocabulary 320"
read -r tokens bytes vocab_n < <(sed -n \
  's/^wrote shakespeare\.bin: \([0-9]*\) tokens from \([0-9]*\) bytes .*vocabulary \([0-9]*\),.*/\1 \2 \3/p' \
  tokenize.log) || fail "no 'wrote shakespeare.bin: N tokens' line: $(cat tokenize.log)"
[ "$vocab_n" = "$V" ] || fail "the tokenizer has $vocab_n tokens, not $V"
# BPE: fewer tokens than bytes (the merges are common English pairs), and
# the token file is their header and uint16s
[ $((tokens * 5)) -lt $((bytes * 4)) ] ||
  fail "$tokens tokens for $bytes bytes: the merges did not shorten the text"
[ "$(stat -c %s shakespeare.bin)" -eq $((1024 + 2 * tokens)) ] ||
  fail "shakespeare.bin is not a token file of $tokens tokens"
grep -qF "\"vocab\":\"$(realpath "$vocab")\"" shakespeare.bin.json ||
  fail "the note shakespeare.bin.json does not name the tokenizer: $(cat shakespeare.bin.json)"
done_stage

begin "b. train 300 steps on 4 ranks"
run train1.log "${mpirun4[@]}" "$zeropp" train --config "$src/examples/zeropp.json" --data shakespeare.bin \
  --set model.vocab_size=$V --steps 300 --save-every 100 --save ckpt
grep -q "^train: 4 ranks" train1.log || fail "not 4 ranks: $(head -3 train1.log)"
# every 100 steps, the newest two kept (zeropp.keep_checkpoints), step 300 published
[ "$(ls -d ckpt/step-* | xargs -n1 basename | tr '\n' ' ')" = "step-00000200 step-00000300 " ] ||
  fail "the checkpoints in ckpt are not those of steps 200 and 300: $(ls ckpt)"
[ "$(sed -n 's/.*"step": *\([0-9]*\).*/\1/p' ckpt/checkpoint.json)" = 300 ] ||
  fail "the published checkpoint is not step 300: $(cat ckpt/checkpoint.json)"
loss1=$(loss_at train1.log 1)
[ -n "$loss1" ] || fail "no loss printed for step 1"
done_stage

begin "c. resume without --config to step 400"
run train2.log "${mpirun4[@]}" "$zeropp" train --resume ckpt --steps 400 --save ckpt
grep -q "^resumed from ckpt after step 300" train2.log ||
  fail "did not resume after step 300: $(head -5 train2.log)"
grep -q "^  zeropp.train_steps: 300 -> 400$" train2.log ||
  fail "the note does not name the changed length: $(head -8 train2.log)"
# "lr at step 301, the first trained now: 0.0002 -> 0.000490447 (x2.45); the
#  WarmupCosineLR schedule's length: 300 -> 400 steps (zeropp.train_steps, --steps)"
lrline=$(grep "^  lr at step 301, the first trained now: " train2.log) ||
  fail "the note gives no lr for step 301: $(head -8 train2.log)"
read -r lr_before lr_after < <(sed -n 's/.*trained now: \([0-9.e+-]*\) -> \([0-9.e+-]*\) .*/\1 \2/p' \
  <<<"$lrline") || fail "cannot read the lr change in '$lrline'"
[[ $lrline == *"the WarmupCosineLR schedule's length: 300 -> 400 steps"* ]] ||
  fail "the note does not name the schedule's change: '$lrline'"
# the saved schedule ended at its floor, cos_min_ratio 0.1 of lr 0.002; the
# stretched one puts step 301 higher
awk -v b="$lr_before" -v a="$lr_after" 'BEGIN {exit !(b > 0.000199999 && b < 0.000200001 && a > b)}' ||
  fail "lr at step 301: $lr_before -> $lr_after; expected 0.0002 -> more"
loss400=$(loss_at train2.log 400)
[ -n "$loss400" ] || fail "no loss printed for step 400"
awk -v a="$loss400" -v b="$loss1" 'BEGIN {exit !(a < b)}' ||
  fail "the loss of step 400 ($loss400) is not below that of step 1 ($loss1)"
[ "$(sed -n 's/.*"step": *\([0-9]*\).*/\1/p' ckpt/checkpoint.json)" = 400 ] ||
  fail "the published checkpoint is not step 400: $(cat ckpt/checkpoint.json)"
done_stage

begin "d. zeropp sample"
sample_args=(--prompt "ROMEO:" --max-new-tokens 100 --temperature 0.8 --top-k 40 --seed 7)
run sample.txt "$zeropp" sample ckpt --vocab "$vocab" --merges "$merges" "${sample_args[@]}"
run sample-note.txt "$zeropp" sample ckpt "${sample_args[@]}"
run sample-ids.txt "$zeropp" sample ckpt "${sample_args[@]}" --ids
cmp -s sample.txt sample-note.txt ||
  fail "through the note: '$(cat sample-note.txt)'; with --vocab/--merges: '$(cat sample.txt)'"
[ "$(head -c 6 sample.txt)" = "ROMEO:" ] || fail "the sample does not start with the prompt"
[ "$(wc -c <sample.txt)" -gt 100 ] || fail "the sample is short: '$(cat sample.txt)'"
# the prompt and 100 new tokens, each an id of the tokenizer; the prompt in
# ids is the tokenizer's (ROMEO: has no merge: its 6 bytes, in GPT-2's order)
ids=$(tr ',' '\n' <sample-ids.txt | grep -c .)
[ "$ids" -eq 106 ] || fail "--ids printed $ids ids, not 6 + 100: $(cat sample-ids.txt)"
tr ',' '\n' <sample-ids.txt | awk -v V=$V '$1 !~ /^[0-9]+$/ || $1 >= V {bad = 1} END {exit bad}' ||
  fail "an id outside 0..$((V - 1)): $(cat sample-ids.txt)"
[[ $(cat sample-ids.txt) == 49,46,44,36,46,25,* ]] || fail "ROMEO: is not 49,46,44,36,46,25"
# text of Shakespeare's alphabet: the 40 likeliest tokens of a trained model
# are printable (no control bytes, nothing past ASCII)
if LC_ALL=C grep -q '[^[:print:]]' sample.txt; then
  fail "the sample holds bytes that are not printable text: $(od -c sample.txt | head)"
fi
grep -q '[a-z] [a-z]' sample.txt || fail "no words in the sample: '$(cat sample.txt)'"
echo "   sample: $(head -c 200 sample.txt | tr '\n' '|')"
done_stage

begin "e. zeropp eval"
run eval.txt "$zeropp" eval ckpt
grep -q "^eval: checkpoint ckpt (step 400)" eval.txt || fail "not step 400: $(cat eval.txt)"
# "loss 3.254964 | perplexity 25.9187"
read -r loss ppl < <(sed -n 's/^loss \([0-9.]*\) | perplexity \([0-9.]*\)$/\1 \2/p' eval.txt) ||
  fail "no 'loss L | perplexity P' line: $(cat eval.txt)"
# printed to 6 and 4 decimals: exp(loss) within their rounding
awk -v l="$loss" -v p="$ppl" 'BEGIN {d = exp(l) - p; if (d < 0) d = -d; exit !(d <= 0.00005 + p * 0.0000006)}' ||
  fail "perplexity $ppl is not exp($loss)"
awk -v l="$loss" -v V=$V 'BEGIN {exit !(l < log(V))}' ||
  fail "validation loss $loss is not below ln($V) = $(awk -v V=$V 'BEGIN {print log(V)}'): nothing learned"
done_stage

echo "test_e2e: passed in $((SECONDS - t_all)) s: tokens $tokens, training loss $loss1 at step 1," \
  "$loss400 at step 400, lr at step 301 $lr_before -> $lr_after, validation loss $loss" \
  "(perplexity $ppl, ln $V = $(awk -v V=$V 'BEGIN {printf "%.4f", log(V)}'))"

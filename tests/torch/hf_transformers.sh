#!/usr/bin/env bash
# What `zeropp export --format hf` writes is a folder Hugging Face
# transformers loads, model and tokenizer (issue 31), checked with
# transformers itself: a random Llama in Hugging Face's form
# (tests/llama_hf_helper.c: GQA 4:1, head dim 64, untied head) beside a
# byte-level BPE tokenizer.json trained here on Tiny Shakespeare by
# Hugging Face tokenizers, in four forms, and two GPT-2s, each with fresh
# random weights:
#   - a LlamaForCausalLM, rope_theta 500000, exported fp32 in one file;
#   - one with Llama 3's rope_scaling (type llama3, factor 8, original
#     context 8192: it rescales the low frequencies at any T), exported bf16
#     in shards of at most 1 MB with the index;
#   - a Qwen2ForCausalLM (q/k/v biases) and a MistralForCausalLM, fp32;
#   - a GPT-2 trained from scratch, exported as GPT2LMHeadModel (bf16
#     shards, GPT-2's vocab.json and merges.txt), scored against the llm.c
#     file of the same checkpoint;
#   - a GPT-2 the other way: written by transformers, read by zeropp.
# For each Llama form: `zeropp tokenize --tokenizer` of 20 kB of the text
# must give transformers' ids for it, token for token; the model is
# imported (`train --init-from`), trained 3 steps and exported; the
# exported config.json must be the imported one (torch_dtype apart: the
# export's). For every form: transformers loads the folder
# (AutoModelForCausalLM in fp32, AutoTokenizer); its tokenizer's ids on the
# text are ours; its mean loss over 3 batches of those tokens must be
# `zeropp eval --init-from`'s of the same values within 1e-5 relative (both
# fp32: the sums' order apart, the same arithmetic); and `zeropp sample` at
# temperature 0 must pick transformers' largest logit for each of
# 24 new tokens (or one within 1e-4 of it: a near-tie). Skips (77) where
# transformers or PyTorch is missing: they are not in CI (ctest -L torch
# runs it).
#
# Usage: hf_transformers.sh ZEROPP_CLI LLAMA_HF_HELPER TEXT
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: hf_transformers.sh ZEROPP_CLI LLAMA_HF_HELPER TEXT" >&2
  exit 2
fi
cli=$1 helper=$2 text_all=$3
if ! python3 -c 'import torch, transformers' 2>/dev/null; then
  echo "SKIP: transformers or PyTorch is not installed (pip install torch transformers to run)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/zpp_hf_transformers.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
head -c 20000 "$text_all" >"$work/text.txt"
B=4 T=64 K=3

# the tokenizer: 400 tokens (the helper's vocabulary is 512), two special ones
python3 - "$text_all" "$work/tokenizer.json" <<'PY'
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.train([sys.argv[1]], trainers.BpeTrainer(
    vocab_size=400, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
t.save(sys.argv[2])
PY

# GPT-2 (the fifth form): its own tokenizer files, trained from scratch
gpt2_bpe=$(dirname "$text_all")/shakespeare-bpe
gpt2_sets=(--set model.vocab_size=320 --set model.n_layer=2 --set model.n_embd=64
  --set model.n_head=4 --set model.seq_len=$T --set optimizer.params.lr=0.01)

# The llama forms, from the helper's Llama: $work/$form.out exported, the
# losses of `zeropp eval` on it in $ours, `zeropp sample`'s greedy ids in $greedy.
llama_form() {
  local form=$1 hf=$work/$1
  mkdir -p "$hf"
  "$helper" make "$hf" "$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
  cp "$work/tokenizer.json" "$hf/"
  echo '{"tokenizer_class": "PreTrainedTokenizerFast"}' >"$hf/tokenizer_config.json"
  # The form:
  #  - q and k 30 times its N(0, 0.02^2): attention sharp enough that the
  #    positions (rope, its scaling) move the loss by far more than 1e-5; at
  #    0.02 it is nearly uniform and a rope left out moves it by 1e-8;
  #  - llama3: Llama 3's rope_scaling;
  #  - qwen2: Qwen2ForCausalLM, q/k/v biases N(0, 0.5^2), no o bias,
  #    use_sliding_window false;
  #  - mistral: MistralForCausalLM, sliding_window null.
  python3 - "$hf" "$form" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file, save_file
hf, form = sys.argv[1], sys.argv[2]
t = load_file(f"{hf}/model.safetensors")
c = json.load(open(f"{hf}/config.json"))
rng = np.random.default_rng()
for name in list(t):
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        t[name] = t[name] * 30
    if form == "qwen2" and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        bias = rng.normal(0.0, 0.5, t[name].shape[0]).astype(t[name].dtype)
        t[name.replace(".weight", ".bias")] = bias
if form == "llama3":
    c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    c["max_position_embeddings"] = 131072
if form == "qwen2":
    # transformers builds a qwen2 folder's tokenizer as Qwen2's class, with
    # Qwen2's pre-tokenization (this regex, then bytes) and NFC, whatever
    # the file says: the file says the same, as Qwen2's own do
    tok = json.load(open(f"{hf}/tokenizer.json"))
    tok["normalizer"] = {"type": "NFC"}
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex":
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
            r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    json.dump(tok, open(f"{hf}/tokenizer.json", "w"))
if form in ("qwen2", "mistral"):
    for key in ("attention_bias", "mlp_bias", "head_dim"):
        c.pop(key, None)
    c["architectures"] = ["Qwen2ForCausalLM" if form == "qwen2" else "MistralForCausalLM"]
    c["model_type"] = form
    c["sliding_window"] = None
    if form == "qwen2":
        c["use_sliding_window"] = False
        c["max_window_layers"] = c["num_hidden_layers"]
save_file(t, f"{hf}/model.safetensors", metadata={"format": "pt"})
json.dump(c, open(f"{hf}/config.json", "w"), indent=2)
PY
  export_args=(--dtype fp32)
  [ $form = llama3 ] && export_args=(--dtype bf16 --max-shard-size 1M)
  "$cli" tokenize --tokenizer "$hf" "$work/text.txt" "$work/$form.bin" >/dev/null
  "$cli" train --quiet --init-from "$hf" --config "$hf/zeropp.json" --data "$work/$form.bin" \
    --steps 3 --save "$work/$form.ckpt" >"$work/$form.train.log" 2>&1 ||
    { echo "$form: training failed:"; tail -5 "$work/$form.train.log"; return 1; }
  "$cli" export --from "$work/$form.ckpt" --to "$work/$form.out" "${export_args[@]}" \
    >"$work/$form.export.log"
  ours=$("$cli" eval --init-from "$work/$form.out" --data "$work/$form.bin" --batch-size $B \
    --batches $K --seq-len $T --json)
  greedy=$("$cli" sample "$work/$form.out" --prompt "ROMEO:" --max-new-tokens 24 \
    --temperature 0 --ids)
}

# GPT-2 the same way: $work/gpt2.out, $ours and $greedy.
gpt2_form() {
  # 30 steps from scratch on tokens of GPT-2's byte-level BPE (the 320-token
  # tokenizer in tests/data); exported as GPT2LMHeadModel in bf16 shards
  # (with vocab.json and merges.txt) and as an llm.c file in bf16, which
  # `zeropp eval --init-from` scores: the same rounded values
  "$cli" tokenize --vocab "$gpt2_bpe/vocab.json" --merges "$gpt2_bpe/merges.txt" \
    "$work/text.txt" "$work/gpt2.bin" >/dev/null
  "$cli" train --quiet "${gpt2_sets[@]}" --data "$work/gpt2.bin" --steps 30 \
    --seed "$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')" \
    --save "$work/gpt2.ckpt" >"$work/gpt2.train.log" 2>&1 ||
    { echo "gpt2: training failed:"; tail -5 "$work/gpt2.train.log"; return 1; }
  "$cli" export --from "$work/gpt2.ckpt" --to "$work/gpt2.out" --format hf --dtype bf16 \
    --max-shard-size 100k >"$work/gpt2.export.log"
  "$cli" export --from "$work/gpt2.ckpt" --to "$work/gpt2.llmc" --dtype bf16 >/dev/null
  ours=$("$cli" eval --init-from "$work/gpt2.llmc" --data "$work/gpt2.bin" --batch-size $B \
    --batches $K --json)
  greedy=$("$cli" sample "$work/gpt2.llmc" --vocab "$gpt2_bpe/vocab.json" \
    --merges "$gpt2_bpe/merges.txt" --prompt "ROMEO:" --max-new-tokens 24 --temperature 0 \
    --ids --dtype fp32)
}

# A GPT-2 the other way (the sixth form): transformers writes the folder
# (GPT2LMHeadModel.save_pretrained, random weights, c_attn 30 times its
# init so that attention is sharp), zeropp reads it: `zeropp eval
# --init-from` and `zeropp sample` of the folder itself.
gpt2in_form() {
  local out=$work/gpt2in.out
  python3 - "$out" $T <<'PY'
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel
out, T = sys.argv[1], int(sys.argv[2])
m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=T,
                               vocab_size=320, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
                               bos_token_id=None, eos_token_id=None))
with torch.no_grad():
    for block in m.transformer.h:
        block.attn.c_attn.weight.mul_(30)
m.save_pretrained(out, safe_serialization=True)
PY
  cp "$gpt2_bpe/vocab.json" "$gpt2_bpe/merges.txt" "$out/"
  cp "$work/gpt2.bin" "$work/gpt2in.bin"
  ours=$("$cli" eval --init-from "$out" --data "$work/gpt2in.bin" --batch-size $B --batches $K \
    --json)
  greedy=$("$cli" sample "$out" --prompt "ROMEO:" --max-new-tokens 24 --temperature 0 --ids)
}

bad=0
for form in llama llama3 qwen2 mistral gpt2 gpt2in; do
  if [ $form = gpt2 ]; then gpt2_form || { bad=1; continue; }
  elif [ $form = gpt2in ]; then gpt2in_form || { bad=1; continue; }
  else llama_form $form || { bad=1; continue; }
  fi
  python3 - "$work" "$form" $B $T $K "$ours" "$greedy" <<'PY' || bad=1
import json, sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

work, form, B, T, K, ours = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
greedy = [int(t) for t in sys.argv[7].strip().split(",")]
out, src = f"{work}/{form}.out", None if form.startswith("gpt2") else f"{work}/{form}"
raw = open(f"{work}/{form}.bin", "rb").read()
head = np.frombuffer(raw[:1024], dtype=np.int32)
tokens = np.frombuffer(raw[1024:], dtype=np.uint16 if head[1] == 1 else np.uint32)[: head[2]]
text = open(f"{work}/text.txt", encoding="utf-8").read()
fails = []
# the tokenizer, before and after the export: transformers' ids are ours
for where in (src, out) if src else (out,):
    ids = AutoTokenizer.from_pretrained(where)(text, add_special_tokens=False)["input_ids"]
    if list(ids) != tokens.tolist():
        fails.append(f"{where}: transformers' tokenizer gives {len(ids)} ids, zeropp tokenize "
                     f"{len(tokens)}; first difference at "
                     f"{next((i for i, (a, b) in enumerate(zip(ids, tokens)) if a != b), '-')}")
# config.json: the imported one's, but for the dtype the weights are stored in
if src:
    given, wrote = (json.load(open(f"{d}/config.json")) for d in (src, out))
    want_dtype = "bfloat16" if form == "llama3" else "float32"
    if wrote.pop("torch_dtype") != want_dtype or given.pop("torch_dtype") is None or given != wrote:
        fails.append(f"the exported config.json is not the imported one, dtype {want_dtype}")
model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
x = torch.tensor(tokens.astype(np.int64))
with torch.no_grad():
    losses = []
    for k in range(K):
        seq = x[k * B * T: (k + 1) * B * T + 1]
        logits = model(seq[:-1].view(B, T)).logits
        losses.append(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), seq[1:].reshape(-1)).item())
theirs, mine = sum(losses) / K, json.loads(ours)["loss"]
rel = abs(theirs - mine) / abs(theirs)
print(f"{form}: transformers' loss {theirs:.9g}, zeropp eval {mine:.9g}: {rel:.3g} relative "
      f"(bound 1e-5); {len(tokens)} tokens equal")
if not rel <= 1e-5:
    fails.append(f"the losses differ by {rel:.3g} relative")
# `zeropp sample --temperature 0` on the folder: at each new token, the
# largest of transformers' logits for the tokens before it, or within 1e-4
# of it (a near-tie that the order of fp32 sums may break either way)
prompt = AutoTokenizer.from_pretrained(out)("ROMEO:", add_special_tokens=False)[
    "input_ids"]
if greedy[: len(prompt)] != list(prompt) or len(greedy) != len(prompt) + 24:
    fails.append(f"zeropp sample's ids {greedy} do not start with the prompt's {prompt}")
else:
    with torch.no_grad():
        logits = model(torch.tensor([greedy])).logits[0]
    for t in range(len(prompt), len(greedy)):
        row, pick = logits[t - 1], greedy[t]
        gap = (row.max() - row[pick]).item()
        if gap > 1e-4 * max(1.0, row.abs().max().item()):
            fails.append(f"new token {t - len(prompt)}: zeropp sample picked {pick}, "
                         f"{gap:.3g} below transformers' largest logit ({row.argmax().item()})")
            break
    else:
        print(f"{form}: zeropp sample's 24 greedy tokens are transformers' argmax")
for f in fails:
    print(f"{form}: {f}")
sys.exit(1 if fails else 0)
PY
done
exit $bad

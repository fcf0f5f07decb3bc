#!/usr/bin/env python3
"""tokenizer_ref.py - compare `zeropp tokenize --tokenizer` with Hugging Face.

Encodes a text file with Hugging Face's `tokenizers` library and with
`zeropp tokenize`, and compares the two token for token; also decodes the
tokens with both and compares the text. Not run in CI (it needs the
`tokenizers` package and a real tokenizer.json): run it by hand on a machine
that has them (the GPU machine, say), after building zeropp:

    pip install tokenizers
    python3 tests/hf/tokenizer_ref.py --zeropp build/zeropp \\
        --tokenizer /path/to/Llama-2-7b/tokenizer.json --text input.txt
    # exit 0: same tokens (and same decoded text); 1: the first difference
    # is printed with the text around it

Options:
  --allow-special  match added tokens (<s>, </s>, <|eot_id|>...) in the text,
                   as `zeropp tokenize --allow-special` does; without it the
                   comparison needs a text that names none of them, since
                   Hugging Face always matches them (the script says so)
  --lines          encode each line on its own (one call of each tool per
                   line; slow, but it checks the start-of-text rules, such as
                   Metaspace's prepend_scheme "first", on many texts)
  --buffer BYTES   zeropp's read buffer (default 4Mi), to check its streaming

What is compared: HF's encode(text, add_special_tokens=False) (the
post-processor's <s> or <|begin_of_text|> is not added, as zeropp does not
add it) against the ids of zeropp's token file (llm.c format: 256 int32 of
header, magic 20240520, version 1 (uint16 ids) or 2 (uint32), the count).
Decoding: HF's decode(ids, skip_special_tokens=False) against the text given,
for the tokenizers whose encoding loses nothing (byte-level; SentencePiece-
style with byte fallback on text not starting with a space). Where they
differ is reported, not asserted.

Known differences, by definition (docs/data.md): zeropp reads text as bytes,
so invalid UTF-8 (which HF cannot take) is encoded too; HF's merge order is
per occurrence, ours GPT-2's rank-at-a-time pass, which agree for merge
tables a trainer made.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile


def read_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack_from("<3i", data, 0)
    if magic != 20240520 or version not in (1, 2):
        sys.exit(f"{path}: not an llm.c token file (magic {magic}, version {version})")
    fmt = "<%d%s" % (count, "H" if version == 1 else "I")
    return list(struct.unpack_from(fmt, data, 256 * 4))


def zeropp_encode(zeropp, tokenizer, text_bytes, allow_special, buffer):
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "in.txt"), os.path.join(tmp, "out.bin")
        with open(src, "wb") as f:
            f.write(text_bytes)
        cmd = [zeropp, "tokenize", "--tokenizer", tokenizer, "--buffer", str(buffer)]
        if allow_special:
            cmd.append("--allow-special")
        run = subprocess.run(cmd + [src, out], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit("zeropp tokenize failed:\n" + run.stderr)
        return read_token_file(out)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(hf, args, text):
    """0 when both encode `text` alike, else 1 (the difference printed)."""
    want = hf.encode(text, add_special_tokens=False).ids
    got = zeropp_encode(args.zeropp, args.tokenizer, text.encode("utf-8"),
                        args.allow_special, args.buffer)
    i = first_difference(got, want)
    if i is not None:
        lo = max(0, i - 8)
        print(f"DIFFERENT at token {i} of {len(want)} (zeropp has {len(got)})")
        print("  hf    :", want[lo:i + 8], [hf.id_to_token(t) for t in want[lo:i + 8]])
        print("  zeropp:", got[lo:i + 8], [hf.id_to_token(t) for t in got[lo:i + 8]])
        return 1
    back = hf.decode(want, skip_special_tokens=False)
    if back != text:
        print(f"note: HF decodes the tokens to a different text ({len(back)} vs "
              f"{len(text)} characters); expected where the tokenizer loses "
              "something (a leading space, <unk>)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zeropp", default="build/zeropp")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--allow-special", action="store_true")
    p.add_argument("--lines", action="store_true")
    p.add_argument("--buffer", type=int, default=4 << 20)
    args = p.parse_args()
    from tokenizers import Tokenizer  # pip install tokenizers

    hf = Tokenizer.from_file(args.tokenizer)
    # A file may store a truncation or padding for its model (GPT-2's
    # Hugging Face file truncates to 50 tokens): the whole text is wanted.
    hf.no_truncation()
    hf.no_padding()
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    if not args.allow_special:
        named = [t.content for t in hf.get_added_tokens_decoder().values() if t.content in text]
        if named:
            sys.exit(f"the text names added tokens {named[:5]}: HF always matches them; "
                     "give --allow-special")
    texts = [line for line in text.split("\n") if line] if args.lines else [text]
    bad = sum(compare(hf, args, t) for t in texts)
    print(f"{len(texts) - bad} of {len(texts)} texts encode alike")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

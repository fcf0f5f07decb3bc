#!/usr/bin/env python3
"""Learns the small byte-level BPE tokenizer in this folder from Tiny
Shakespeare, and writes it as GPT-2's two files (vocab.json, merges.txt).

Not needed by the tests (they read the files as checked in); it says how
they were made. Usage, from the repository root:
    python3 tests/data/shakespeare-bpe/learn.py tests/data/tinyshakespeare.txt \
        tests/data/shakespeare-bpe 63

The algorithm is the textbook one (Sennrich et al.; GPT-2's own tokenizer
was trained so): cut the text into pieces with GPT-2's pre-tokenization
regex (its ASCII part: Tiny Shakespeare is ASCII), start from one symbol a
byte, and N times merge the adjacent pair that occurs most often over all
pieces (ties: the pair whose bytes sort first). The vocabulary is GPT-2's
layout: the 256 bytes first, in GPT-2's bytes_to_unicode order (so id 0 is
"!" as in GPT-2's vocab.json), then the merges' results in merge order, then
<|endoftext|>. With N = 63 that is 320 tokens."""
import collections
import json
import re
import sys

PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, {b: chr(c) for b, c in zip(bs, cs)}


def main():
    text_path, out_dir, n_merges = sys.argv[1], sys.argv[2], int(sys.argv[3])
    text = open(text_path, "rb").read().decode("ascii")
    words = collections.Counter(PATTERN.findall(text))
    pieces = {tuple(bytes([b]) for b in w.encode()): c for w, c in words.items()}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for syms, c in pieces.items():
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] += c
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for syms, c in pieces.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == best:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        pieces = merged
    order, printable = bytes_to_unicode()
    show = lambda bs: "".join(printable[b] for b in bs)
    vocab = {show(bytes([b])): i for i, b in enumerate(order)}
    for a, b in merges:
        vocab[show(a + b)] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    with open(f"{out_dir}/vocab.json", "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
        f.write("\n")
    with open(f"{out_dir}/merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{show(a)} {show(b)}\n")


if __name__ == "__main__":
    main()

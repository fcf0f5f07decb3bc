#!/usr/bin/env python3
"""gen-unicode-nfc.py - writes src/train/nfc_data.h, the Unicode tables that
src/train/nfc.c needs for Normalization Form C, from the Unicode Character
Database as Python's unicodedata module carries it.

A developer's tool, run when the tables should follow another Unicode
version; the product never runs it (the header is committed):

    python3 scripts/gen-unicode-nfc.py > src/train/nfc_data.h
    python3 scripts/gen-unicode-nfc.py --vectors > tests/data/nfc_vectors.txt

What it writes (Hangul syllables are left out: nfc.c composes and
decomposes them arithmetically):
  - the most code points one character's full decomposition has;
  - canonical combining classes, as ranges of equal non-zero class;
  - canonical decompositions, one step each (a code point -> one or two),
    applied again by nfc.c until nothing decomposes;
  - primary composites: the pairs (first, second) that compose, i.e. the
    two-code-point decompositions whose code point is not excluded from
    composition. Excluded (singletons, non-starter decompositions, the
    CompositionExclusions list) is told by NFC not giving the code point
    back: NFC(c) != c;
  - the code points that are the second of a pair (text before one of them
    may still change when it arrives: nfc.c's stable boundaries).

With --vectors it writes test_nfc's reference instead, lines of "INPUT;NFC"
(code points in hex): every code point that NFC or NFD changes or that has
a combining class, some Hangul jamo sequences, and random sequences of
letters, marks of many classes, composable pairs and jamo (seeded: the same
file each run).
"""
import sys
import unicodedata as ud

HANGUL = range(0xAC00, 0xAC00 + 11172)


def canonical(cp):
    d = ud.decomposition(chr(cp))
    if not d or d.startswith("<") or cp in HANGUL:
        return None
    return [int(x, 16) for x in d.split()]


def main():
    out = sys.stdout
    ranges = []
    for cp in range(0x110000):
        c = ud.combining(chr(cp))
        if c and ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == c:
            ranges[-1][1] = cp
        elif c:
            ranges.append([cp, cp, c])
    decomp, comp = [], []
    for cp in range(0x110000):
        d = canonical(cp)
        if d is None:
            continue
        decomp.append((cp, d[0], d[1] if len(d) > 1 else 0))
        if len(d) == 2 and ud.normalize("NFC", chr(cp)) == chr(cp):
            comp.append((d[0], d[1], cp))
    comp.sort()
    # nfc.c reserves this many code points a character for the decomposition
    widest = max(len(ud.normalize("NFD", chr(cp))) for cp in range(0x110000)
                 if not 0xD800 <= cp < 0xE000)
    seconds = sorted({b for _, b, _ in comp})
    w = out.write
    w("/* train/nfc_data.h - Unicode %s tables for nfc.c, written by\n" % ud.unidata_version)
    w(" * scripts/gen-unicode-nfc.py from Python %s's unicodedata (its\n"
      % sys.version.split()[0])
    w(" * header says what each table is). Do not edit by hand. */\n")
    w("#ifndef ZPP_TRAIN_NFC_DATA_H\n#define ZPP_TRAIN_NFC_DATA_H\n\n#include <stdint.h>\n\n")
    w("#define ZPP_NFC_UNICODE_VERSION \"%s\"\n" % ud.unidata_version)
    w("/* the most code points a character's full decomposition has */\n")
    w("#define ZPP_NFC_MAX_DECOMPOSED %d\n\n" % widest)

    def table(decl, rows, per_line):
        w(decl + " = {\n")
        for i in range(0, len(rows), per_line):
            w("    " + " ".join(rows[i:i + per_line]) + "\n")
        w("};\n\n")

    w("typedef struct nfc_class { uint32_t first, last; uint8_t ccc; } nfc_class;\n")
    w("typedef struct nfc_split { uint32_t cp, a, b; } nfc_split; /* b 0: one part */\n")
    w("typedef struct nfc_join { uint32_t a, b, cp; } nfc_join;\n\n")
    table("static const nfc_class nfc_ccc[%d]" % len(ranges),
          ["{0x%X, 0x%X, %d}," % tuple(r) for r in ranges], 3)
    table("static const nfc_split nfc_decomp[%d]" % len(decomp),
          ["{0x%X, 0x%X, 0x%X}," % d for d in decomp], 3)
    table("static const nfc_join nfc_comp[%d]" % len(comp),
          ["{0x%X, 0x%X, 0x%X}," % c for c in comp], 3)
    table("static const uint32_t nfc_seconds[%d]" % len(seconds),
          ["0x%X," % s for s in seconds], 8)
    w("#endif\n")


def vectors():
    import random
    rng = random.Random(20261204)
    out = sys.stdout
    hexes = lambda t: " ".join("%X" % ord(c) for c in t)
    line = lambda t: out.write("%s;%s\n" % (hexes(t), hexes(ud.normalize("NFC", t))))
    out.write("# test_nfc's reference, Unicode %s: INPUT;NFC in hex code points "
              "(scripts/gen-unicode-nfc.py --vectors)\n" % ud.unidata_version)
    marks, special = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or cp in HANGUL:
            continue
        c = chr(cp)
        if ud.combining(c):
            marks.append(c)
        if ud.combining(c) or ud.normalize("NFC", c) != c or ud.normalize("NFD", c) != c:
            special.append(c)
            line(c)
    jamo_l = [chr(0x1100 + i) for i in range(19)]
    jamo_v = [chr(0x1161 + i) for i in range(21)]
    jamo_t = [chr(0x11A8 + i) for i in range(27)]
    for _ in range(300):
        t = rng.choice(jamo_l) + rng.choice(jamo_v) + rng.choice(["", rng.choice(jamo_t)])
        after = ["", rng.choice(jamo_t), rng.choice(jamo_v), chr(0xAC00 + rng.randrange(11172))]
        line(t + rng.choice(after))
    # Latin, Greek, Cyrillic, Devanagari, Oriya and Tamil vowel signs, kana
    letters = [chr(c) for c in b"aeiouAEIOUnNcCsSzZ "] + [
        "\u03b1", "\u03c9", "\u0415", "\u0915", "\u0B47", "\u0BC6", "\u304B", "\u30CF"]
    for _ in range(2500):
        t = ""
        for _ in range(rng.randint(2, 8)):
            r = rng.random()
            t += (rng.choice(letters) if r < 0.35 else rng.choice(marks) if r < 0.7
                  else rng.choice(special) if r < 0.9 else rng.choice(jamo_l + jamo_v + jamo_t))
        line(t)


if __name__ == "__main__":
    vectors() if sys.argv[1:] == ["--vectors"] else main()

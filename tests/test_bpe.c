/* test_bpe.c — GPT-2's byte-level BPE (src/train/bpe.h, bpe_gpt2.c) and
 * `zeropp tokenize` (tools/tokenize.c, src/train/tokfile.c).
 *
 * The references are written here from the definitions, independent of the
 * library's data structures:
 *   - GPT-2's byte alphabet (bytes_to_unicode) from its rule;
 *   - a scanner for GPT-2's pre-tokenization regex over a known set of
 *     characters whose Unicode classes are listed here, following the
 *     alternatives in order as a backtracking matcher does;
 *   - GPT-2's bpe(): on byte strings, find the adjacent pair of lowest rank
 *     anywhere in the piece, merge all its occurrences left to right, repeat.
 * The tokenizer under test is a small hand-made vocabulary and merge table,
 * plus random merges in random order, written as GPT-2's two files into a
 * temporary folder and loaded as a user would. Texts are fresh each run
 * (ZPP_TEST_SEED replays one).
 *
 * ZPP_CLI (the zeropp command) comes from ctest. */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "testlib.h"
#include "train/bpe.h"
#include "train/data.h"
#include "train/tokfile.h"

#define EXPECT_MSG(sub)                                                        \
    EXPECT(strstr(zpp_last_error(), (sub)) != NULL, "message '%s' lacks '%s'", \
           zpp_last_error(), (sub))

static int irand(zpp_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(zpp_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* ---- a growable byte string ---- */
typedef struct buf {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *s, const void *p, size_t n) {
    if (n > ((size_t)1 << 40)) zpp_test_fail(__FILE__, __LINE__, NULL, "put: %zu bytes", n);
    if (s->n + n + 1 > s->cap) {
        s->cap = 2 * (s->n + n + 1);
        s->b = realloc(s->b, s->cap);
        EXPECT(s->b != NULL);
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
    s->b[s->n] = 0;
}
static void puts_(buf *s, const char *t) { put(s, t, strlen(t)); }

/* ---- GPT-2's byte alphabet, from its definition ----
 * Bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF print and stand for themselves;
 * the other 68, in increasing order, get 256, 257, ... */
static uint32_t ref_byte_char(int b) {
    int n = 0;
    for (int x = 0; x < 256; x++) {
        const int prints = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
        if (x == b) return prints ? (uint32_t)x : (uint32_t)(256 + n);
        if (!prints) n++;
    }
    return 0;
}

static void put_utf8(buf *s, uint32_t cp) {
    uint8_t u[4];
    size_t n;
    if (cp < 0x80) u[0] = (uint8_t)cp, n = 1;
    else if (cp < 0x800) u[0] = (uint8_t)(0xC0 | cp >> 6), u[1] = (uint8_t)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (uint8_t)(0xE0 | cp >> 12), u[1] = (uint8_t)(0x80 | ((cp >> 6) & 63)),
        u[2] = (uint8_t)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (uint8_t)(0xF0 | cp >> 18), u[1] = (uint8_t)(0x80 | ((cp >> 12) & 63)),
        u[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)), u[3] = (uint8_t)(0x80 | (cp & 63)), n = 4;
    put(s, u, n);
}

/* A token as GPT-2's merges.txt writes it (UTF-8 of the printable form). */
static void put_printable(buf *s, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) put_utf8(s, ref_byte_char(b[i]));
}
/* ... and as its vocab.json writes it: a JSON string, non-ASCII as \uXXXX
 * (Python's json.dumps). */
static void put_json_token(buf *s, const uint8_t *b, size_t n) {
    puts_(s, "\"");
    for (size_t i = 0; i < n; i++) {
        const uint32_t cp = ref_byte_char(b[i]);
        char e[16];
        if (cp == '"' || cp == '\\') snprintf(e, sizeof e, "\\%c", (char)cp);
        else if (cp < 0x80) snprintf(e, sizeof e, "%c", (char)cp);
        else snprintf(e, sizeof e, "\\u%04x", (unsigned)cp);
        puts_(s, e);
    }
    puts_(s, "\"");
}

/* ---- the test tokenizer: id -> bytes; merges as byte strings by rank ---- */
#define MAXTOK 2048
typedef struct tstr {
    uint8_t b[48];
    int len;
} tstr;
typedef struct tvocab {
    tstr tok[MAXTOK]; /* index = id */
    int n_tok;
    int ml[MAXTOK], mr[MAXTOK]; /* merge r: ids of its parts */
    int n_merges;
    int eot;                    /* id of <|endoftext|> */
} tvocab;

static int tv_find(const tvocab *v, const uint8_t *b, int len) {
    for (int i = 0; i < v->n_tok; i++)
        if (v->tok[i].len == len && !memcmp(v->tok[i].b, b, (size_t)len)) return i;
    return -1;
}

static int tv_add(tvocab *v, const uint8_t *b, int len) {
    EXPECT(v->n_tok < MAXTOK && len <= 48);
    memcpy(v->tok[v->n_tok].b, b, (size_t)len);
    v->tok[v->n_tok].len = len;
    return v->n_tok++;
}

/* A merge of two existing tokens, its result added to the vocabulary;
 * 0 when the result is there already or too long. */
static int tv_merge(tvocab *v, int l, int r) {
    uint8_t cat[96];
    const int len = v->tok[l].len + v->tok[r].len;
    if (len > 48) return 0;
    memcpy(cat, v->tok[l].b, (size_t)v->tok[l].len);
    memcpy(cat + v->tok[l].len, v->tok[r].b, (size_t)v->tok[r].len);
    if (tv_find(v, cat, len) >= 0) return 0;
    tv_add(v, cat, len);
    v->ml[v->n_merges] = l;
    v->mr[v->n_merges] = r;
    v->n_merges++;
    return 1;
}

static int tv_id_of(const tvocab *v, const char *s) {
    const int id = tv_find(v, (const uint8_t *)s, (int)strlen(s));
    EXPECT(id >= 0, "'%s' is not a test token", s);
    return id;
}

/* Hand-made merges, in the order a trainer on English might find them,
 * with a few on multi-byte letters (é = C3 A9, ж = D0 B6), newlines,
 * spaces and digits. Then `n_random` merges of random existing tokens,
 * shuffled among themselves so that some merge a token before the merge
 * making it (GPT-2's rule handles any order). */
static void tv_build(tvocab *v, zpp_rng *rng, int n_random) {
    memset(v, 0, sizeof *v);
    /* the 256 bytes under shuffled ids: nothing may assume id = byte */
    int order[256];
    for (int i = 0; i < 256; i++) order[i] = i;
    for (int i = 255; i > 0; i--) {
        const int j = irand(rng, 0, i), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int i = 0; i < 256; i++) {
        const uint8_t b = (uint8_t)order[i];
        tv_add(v, &b, 1);
    }
    static const char *const hand[][2] = {
        /* ranked before "a" + "b" makes "ab": merging one occurrence of "a b"
         * at a time would make "aba" of "abab", GPT-2 makes "ab ab" */
        {"ab", "a"},
        {" ", "t"},  {" ", "a"},   {"h", "e"},   {"i", "n"},   {"r", "e"},  {"o", "n"},
        {" t", "he"}, {"e", "r"},  {" ", "s"},   {"a", "t"},   {" ", "w"},  {" ", "o"},
        {"e", "n"},  {" ", "c"},   {"i", "t"},   {"i", "s"},   {"a", "n"},  {"o", "r"},
        {"e", "s"},  {" ", "b"},   {"e", "d"},   {" ", "f"},   {"in", "g"}, {" ", "p"},
        {"o", "u"},  {" a", "n"},  {"a", "l"},   {"a", "r"},   {" t", "o"}, {" ", "m"},
        {" o", "f"}, {" ", "in"},  {" ", "d"},   {" ", "h"},   {" an", "d"}, {"l", "l"},
        {"\n", "\n"}, {" ", " "},  {"  ", "  "}, {"'", "s"},   {"1", "2"},  {"\xC3", "\xA9"},
        {"\xD0", "\xB6"}, {"e", "\xC3\xA9"}, {"th", "e"}, {"t", "h"}, {"!", "!"}, {"<", "|"},
        {"\t", "\t"}, {"\r", "\n"}, {"\n", " "}, {"0", "0"}, {"00", "00"}, {"a", "b"},
    };
    /* The hand merges' results first, each once its parts are there ("th" +
     * "e" comes before "t" + "h" in the list), then the merges in list order. */
    const size_t n_hand = sizeof hand / sizeof hand[0];
    for (size_t pass = 0, done = 0; done < n_hand; pass++) {
        EXPECT(pass < n_hand, "hand merges whose parts are never made");
        done = 0;
        for (size_t k = 0; k < n_hand; k++) {
            const int l = tv_find(v, (const uint8_t *)hand[k][0], (int)strlen(hand[k][0]));
            const int r = tv_find(v, (const uint8_t *)hand[k][1], (int)strlen(hand[k][1]));
            if (l < 0 || r < 0) continue;
            uint8_t cat[96];
            const int ll = v->tok[l].len, rl = v->tok[r].len;
            memcpy(cat, v->tok[l].b, (size_t)ll);
            memcpy(cat + ll, v->tok[r].b, (size_t)rl);
            if (tv_find(v, cat, ll + rl) < 0) tv_add(v, cat, ll + rl);
            done++;
        }
    }
    for (size_t k = 0; k < n_hand; k++) {
        v->ml[v->n_merges] = tv_id_of(v, hand[k][0]);
        v->mr[v->n_merges] = tv_id_of(v, hand[k][1]);
        v->n_merges++;
    }
    /* random merges of letters, spaces and what merging made */
    const char pool[] = "aeinorst hl'\n";
    const int first = v->n_merges;
    for (int tries = 0; v->n_merges - first < n_random && tries < 100 * n_random; tries++) {
        int l, r;
        if (irand(rng, 0, 2) == 0) {
            l = tv_id_of(v, (char[]){pool[irand(rng, 0, (int)sizeof pool - 2)], 0});
            r = tv_id_of(v, (char[]){pool[irand(rng, 0, (int)sizeof pool - 2)], 0});
        } else {
            l = 256 + irand(rng, 0, v->n_tok - 257);
            r = irand(rng, 0, 2) ? 256 + irand(rng, 0, v->n_tok - 257)
                                 : tv_id_of(v, (char[]){pool[irand(rng, 0, (int)sizeof pool - 2)], 0});
        }
        tv_merge(v, l, r);
    }
    for (int i = v->n_merges - 1; i > first; i--) { /* shuffle the random merges' ranks */
        const int j = first + irand(rng, 0, i - first);
        int t = v->ml[i];
        v->ml[i] = v->ml[j], v->ml[j] = t;
        t = v->mr[i];
        v->mr[i] = v->mr[j], v->mr[j] = t;
    }
    v->eot = tv_add(v, (const uint8_t *)"<|endoftext|>", 13);
}

/* GPT-2's two files for v, in the temporary folder under `tag`. */
static void tv_write(const tvocab *v, const char *tag, char *vocab_path, char *merges_path) {
    char name[64];
    snprintf(name, sizeof name, "%s_vocab.json", tag);
    zpp_test_tmp_path(name, vocab_path);
    snprintf(name, sizeof name, "%s_merges.txt", tag);
    zpp_test_tmp_path(name, merges_path);
    buf j = {0}, m = {0};
    puts_(&j, "{");
    for (int i = 0; i < v->n_tok; i++) {
        if (i) puts_(&j, ", ");
        if (i == v->eot) puts_(&j, "\"<|endoftext|>\"");
        else put_json_token(&j, v->tok[i].b, (size_t)v->tok[i].len);
        char e[24];
        snprintf(e, sizeof e, ": %d", i);
        puts_(&j, e);
    }
    puts_(&j, "}");
    puts_(&m, "#version: 0.2\n");
    for (int r = 0; r < v->n_merges; r++) {
        put_printable(&m, v->tok[v->ml[r]].b, (size_t)v->tok[v->ml[r]].len);
        puts_(&m, " ");
        put_printable(&m, v->tok[v->mr[r]].b, (size_t)v->tok[v->mr[r]].len);
        puts_(&m, "\n");
    }
    zpp_test_write_file(vocab_path, j.b, j.n);
    zpp_test_write_file(merges_path, m.b, m.n);
    free(j.b), free(m.b);
}

/* ---- the reference pre-tokenizer ---- */

/* Characters random texts are made of, with their class under GPT-2's
 * regex: L letter, N number, S whitespace (\s), P anything else. */
typedef struct rchar {
    const char *s;
    char cls;
} rchar;
static const rchar MULTI[] = {
    {"\xC3\xA9", 'L'},         /* é U+00E9 Ll */
    {"\xC3\x9F", 'L'},         /* ß U+00DF Ll */
    {"\xD0\xB6", 'L'},         /* ж U+0436 Ll */
    {"\xE4\xB8\xAD", 'L'},     /* 中 U+4E2D Lo */
    {"\xF0\x9D\x94\x98", 'L'}, /* 𝔘 U+1D518 Lu */
    {"\xCA\xB0", 'L'},         /* ʰ U+02B0 Lm */
    {"\xC2\xBD", 'N'},         /* ½ U+00BD No */
    {"\xD9\xA3", 'N'},         /* ٣ U+0663 Nd */
    {"\xE2\x85\xAB", 'N'},     /* Ⅻ U+216B Nl */
    {"\xC2\xA0", 'S'},         /* no-break space U+00A0 Zs */
    {"\xE3\x80\x80", 'S'},     /* ideographic space U+3000 Zs */
    {"\xE2\x80\xA8", 'S'},     /* line separator U+2028 Zl */
    {"\xE2\x80\x94", 'P'},     /* em dash U+2014 Pd */
    {"\xE2\x82\xAC", 'P'},     /* euro U+20AC Sc */
    {"\xF0\x9F\x98\x80", 'P'}, /* 😀 U+1F600 So */
    {"\xCC\x81", 'P'},         /* combining acute U+0301 Mn: not a letter */
};

static char ascii_class(uint8_t c) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 'L';
    if (c >= '0' && c <= '9') return 'N';
    if (c == ' ' || (c >= 9 && c <= 13)) return 'S';
    return 'P';
}

/* The class of the character at t[i] (valid UTF-8 made of the characters
 * above and ASCII) and its length. */
static char char_class(const uint8_t *t, size_t n, size_t i, size_t *len) {
    if (t[i] < 0x80) {
        *len = 1;
        return ascii_class(t[i]);
    }
    for (size_t k = 0; k < sizeof MULTI / sizeof MULTI[0]; k++) {
        const size_t l = strlen(MULTI[k].s);
        if (l <= n - i && !memcmp(t + i, MULTI[k].s, l)) {
            *len = l;
            return MULTI[k].cls;
        }
    }
    zpp_test_fail(__FILE__, __LINE__, NULL, "unknown character at byte %zu", i);
}

/* GPT-2's regex on t[0, n), alternative by alternative; writes piece ends
 * (byte offsets) to ends[], returns their count. */
static size_t ref_split(const uint8_t *t, size_t n, size_t *ends) {
    /* characters: start offsets and classes */
    size_t *at = malloc((n + 1) * sizeof *at);
    char *cls = malloc(n + 1);
    size_t m = 0;
    for (size_t i = 0, l = 0; i < n; i += l) {
        cls[m] = char_class(t, n, i, &l);
        at[m++] = i;
    }
    at[m] = n;
    size_t np = 0;
    for (size_t i = 0; i < m;) {
        size_t e = i; /* the piece is characters [i, e) */
        /* 's|'t|'re|'ve|'m|'ll|'d */
        if (t[at[i]] == '\'' && i + 1 < m) {
            const uint8_t a = t[at[i + 1]], b = i + 2 < m ? t[at[i + 2]] : 0;
            if (a == 's' || a == 't' || a == 'm' || a == 'd') e = i + 2;
            else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
                e = i + 3;
        }
        /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ */
        if (e == i) {
            const size_t j = i + (t[at[i]] == ' ' && i + 1 < m);
            const char c = cls[j];
            if (c != 'S') {
                e = j;
                while (e < m && cls[e] == c) e++;
            }
        }
        /* \s+(?!\S) | \s+ */
        if (e == i) {
            EXPECT(cls[i] == 'S');
            size_t k = i;
            while (k < m && cls[k] == 'S') k++;
            e = k == m ? m : k - i >= 2 ? k - 1 : k;
        }
        ends[np++] = at[e];
        i = e;
    }
    free(at), free(cls);
    return np;
}

/* ---- random text ---- */
typedef struct textopt {
    int special;  /* "<|endoftext|>" now and then */
    int invalid;  /* bytes that are no UTF-8 */
    int long_runs;  /* runs of hundreds of letters, digits or spaces */
} textopt;

static void random_text(zpp_rng *r, buf *s, size_t target, textopt o) {
    static const char *const words[] = {"the", "and", "of", "to", "in", "is", "it", "that",
                                        "Hello", "world", "sing", "ring", "thee", "hath", "tis",
                                        "ear", "earth", "see", "inn", "aaaa", "ll", "abab",
                                        "cabababa"};
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
                                               "'S", "'LL", "'x", "''"};
    static const char *const spaces[] = {" ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "\r\n",
                                         "\n ", "\t\t", "    "};
    static const char punct[] = "!?.,;:-()\"'<|>[]_*";
    const char *letters = "aehinorst";
    while (s->n < target) {
        switch (irand(r, 0, 13)) {
        case 0: case 1: case 2: case 3: case 4: /* a word, mostly after a space */
            if (irand(r, 0, 4) < 3) puts_(s, " ");
            puts_(s, words[irand(r, 0, (int)(sizeof words / sizeof *words) - 1)]);
            break;
        case 5: { /* a random lower-case word */
            const int n = irand(r, 1, 9);
            for (int i = 0; i < n; i++) put(s, &letters[irand(r, 0, 8)], 1);
            break;
        }
        case 6: puts_(s, contractions[irand(r, 0, 10)]); break;
        case 7: puts_(s, spaces[irand(r, 0, 10)]); break;
        case 8: { /* digits, maybe after a space */
            if (irand(r, 0, 1)) puts_(s, " ");
            const int n = irand(r, 1, 6);
            for (int i = 0; i < n; i++) put(s, &"0123456789"[irand(r, 0, 9)], 1);
            break;
        }
        case 9: { /* punctuation, maybe after a space */
            if (irand(r, 0, 1)) puts_(s, " ");
            const int n = irand(r, 1, 4);
            for (int i = 0; i < n; i++) put(s, &punct[irand(r, 0, (int)sizeof punct - 2)], 1);
            break;
        }
        case 10: case 11: { /* multi-byte characters, alone or in a run */
            const int n = irand(r, 1, 3);
            for (int i = 0; i < n; i++)
                puts_(s, MULTI[irand(r, 0, (int)(sizeof MULTI / sizeof *MULTI) - 1)].s);
            break;
        }
        case 12:
            if (o.special) puts_(s, irand(r, 0, 3) ? "<|endoftext|>" : "<|endoftext");
            if (o.invalid) { /* a stray continuation, a cut sequence, a byte never valid */
                static const char *const bad[] = {"\x80", "\xC3", "\xE4\xB8", "\xFF", "\xC0\xAF",
                                                  "\xED\xA0\x80", "\xF0\x9F\x98", "\0"};
                const int k = irand(r, 0, 7);
                put(s, bad[k], k == 7 ? 1 : strlen(bad[k]));
            }
            break;
        default:
            if (o.long_runs) {
                const char *run = (const char *[]){"a", "ab", "e", " ", "0", "!", "\n"}[irand(r, 0, 6)];
                const int n = irand(r, 50, 300);
                for (int i = 0; i < n; i++) puts_(s, run);
            }
            break;
        }
    }
}

/* ---- GPT-2's bpe(), on strings ---- */
static void ref_bpe_piece(const tvocab *v, const uint8_t *p, size_t n, int *ids, size_t *n_ids) {
    /* symbols as (offset, length) into p */
    size_t *off = malloc(n * sizeof *off), *len = malloc(n * sizeof *len);
    size_t m = n;
    for (size_t i = 0; i < n; i++) off[i] = i, len[i] = 1;
    for (;;) {
        int best = -1;
        for (size_t i = 0; i + 1 < m; i++)
            for (int r = 0; r < v->n_merges && (best < 0 || r < best); r++) {
                const tstr *a = &v->tok[v->ml[r]], *b = &v->tok[v->mr[r]];
                if ((size_t)a->len == len[i] && (size_t)b->len == len[i + 1] &&
                    !memcmp(p + off[i], a->b, len[i]) && !memcmp(p + off[i + 1], b->b, len[i + 1]))
                    best = r;
            }
        if (best < 0) break;
        const tstr *a = &v->tok[v->ml[best]], *b = &v->tok[v->mr[best]];
        size_t w = 0;
        for (size_t i = 0; i < m;) {
            if (i + 1 < m && (size_t)a->len == len[i] && (size_t)b->len == len[i + 1] &&
                !memcmp(p + off[i], a->b, len[i]) && !memcmp(p + off[i + 1], b->b, len[i + 1])) {
                off[w] = off[i], len[w] = len[i] + len[i + 1];
                w++, i += 2;
            } else {
                off[w] = off[i], len[w] = len[i];
                w++, i++;
            }
        }
        m = w;
    }
    for (size_t i = 0; i < m; i++) {
        ids[(*n_ids)++] = tv_find(v, p + off[i], (int)len[i]);
        EXPECT(ids[*n_ids - 1] >= 0);
    }
    free(off), free(len);
}

/* The reference encoding of valid text: split, then bpe() each piece. With
 * `special`, "<|endoftext|>" is cut out first and the parts split alone. */
static size_t ref_encode(const tvocab *v, const uint8_t *t, size_t n, int special, int *ids) {
    size_t n_ids = 0, *ends = malloc((n + 1) * sizeof *ends);
    for (size_t a = 0; a < n;) {
        const uint8_t *q = special ? memmem(t + a, n - a, "<|endoftext|>", 13) : NULL;
        const size_t b = q ? (size_t)(q - t) : n;
        const size_t np = ref_split(t + a, b - a, ends);
        for (size_t k = 0, s = 0; k < np; s = ends[k++])
            ref_bpe_piece(v, t + a + s, ends[k] - s, ids, &n_ids);
        if (q) ids[n_ids++] = v->eot;
        a = q ? b + 13 : n;
    }
    free(ends);
    return n_ids;
}

/* ---- helpers on the library ---- */

static zpp_bpe *load(const tvocab *v, const char *tag) {
    char vp[512], mp[512];
    tv_write(v, tag, vp, mp);
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_load_gpt2(vp, mp, &bpe));
    return bpe;
}

/* The library's encoding of t, fed in random chunks through the streaming
 * interface (chunk 0: all at once). */
static zpp_bpe_ids encode_chunked(zpp_bpe *bpe, zpp_rng *r, const uint8_t *t, size_t n,
                                  unsigned flags, int max_chunk) {
    zpp_bpe_ids ids = {0};
    if (!max_chunk) {
        size_t used = 0;
        EXPECT_OK(zpp_bpe_encode(bpe, t, n, flags, &ids, &used));
        EXPECT(used == n);
        return ids;
    }
    buf pend = {0};
    size_t fed = 0;
    while (fed < n) {
        const size_t k = (size_t)irand(r, 1, max_chunk);
        const size_t take = k < n - fed ? k : n - fed;
        put(&pend, t + fed, take);
        fed += take;
        size_t used = 0;
        EXPECT_OK(zpp_bpe_encode(bpe, pend.b, pend.n, flags | ZPP_BPE_PARTIAL, &ids, &used));
        EXPECT(used <= pend.n);
        memmove(pend.b, pend.b + used, pend.n - used);
        pend.n -= used;
    }
    size_t used = 0;
    EXPECT_OK(zpp_bpe_encode(bpe, pend.b, pend.n, flags, &ids, &used));
    EXPECT(used == pend.n);
    free(pend.b);
    return ids;
}

static zpp_bpe *bytes_only(void) { /* 256 bytes, no merges, GPT-2's regex, + <|endoftext|> */
    static uint8_t b[256];
    zpp_bpe_token tok[257];
    for (int i = 0; i < 256; i++) {
        b[i] = (uint8_t)i;
        tok[i] = (zpp_bpe_token){&b[i], 1, i, 0, 0};
    }
    tok[256] = (zpp_bpe_token){(const uint8_t *)"<|endoftext|>", 13, 256, 1, 0};
    zpp_bpe_desc d = {.tokens = tok, .n_tokens = 257, .pattern = ZPP_BPE_GPT2_PATTERN};
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_create(&d, &bpe));
    return bpe;
}

/* ======================================================================== */

/* The byte alphabet is GPT-2's rule, both ways. */
static void test_byte_alphabet(void) {
    int seen[324] = {0};
    for (int b = 0; b < 256; b++) {
        const uint32_t c = zpp_bpe_gpt2_byte_char((uint8_t)b);
        EXPECT(c == ref_byte_char(b), "byte 0x%02X -> U+%04X, expected U+%04X", b, (unsigned)c,
               (unsigned)ref_byte_char(b));
        EXPECT(c < 324 && !seen[c]++, "U+%04X given twice", (unsigned)c);
        EXPECT(zpp_bpe_gpt2_char_byte(c) == b, "U+%04X does not map back to 0x%02X", (unsigned)c, b);
    }
    EXPECT(zpp_bpe_gpt2_byte_char(' ') == 0x120 && zpp_bpe_gpt2_byte_char('\n') == 0x10A);
    int unmapped = 0;
    for (uint32_t c = 0; c < 400; c++) unmapped += zpp_bpe_gpt2_char_byte(c) < 0;
    EXPECT(unmapped == 400 - 256, "%d code points below 400 map to no byte", unmapped);
}

/* Hand-checked splits of GPT-2's regex. */
static void test_pretokenize_known(void) {
    zpp_bpe *bpe = bytes_only();
    static const struct {
        const char *text;
        const char *pieces[12];
        unsigned flags;
    } cases[] = {
        {"Hello world's  123!!\n\n x",
         {"Hello", " world", "'s", " ", " 123", "!!", "\n\n", " x"}, 0},
        {"I'm we'll've 'S", {"I", "'m", " we", "'ll", "'ve", " '", "S"}, 0},
        {"  hi", {" ", " hi"}, 0},
        {"x  ", {"x", "  "}, 0},
        {"a\n", {"a", "\n"}, 0},
        {"\t\tfoo", {"\t", "\t", "foo"}, 0},
        {"3.14 ms", {"3", ".", "14", " ms"}, 0},
        {"h\xC3\xA9llo w\xC3\xB6rld", {"h\xC3\xA9llo", " w\xC3\xB6rld"}, 0},
        {"\xC2\xBD \xD9\xA3", {"\xC2\xBD", " \xD9\xA3"}, 0},          /* ½ ٣ */
        {"a\xC2\xA0\xC2\xA0" "b", {"a", "\xC2\xA0", "\xC2\xA0", "b"}, 0}, /* no-break spaces */
        {"!!!? !!", {"!!!?", " !!"}, 0},
        {"hi<|endoftext|>yo", {"hi", "<|", "endoftext", "|>", "yo"}, 0},
        {"hi <|endoftext|>yo", {"hi", " ", "<|endoftext|>", "yo"}, ZPP_BPE_SPECIAL},
        {"ab\xFF" "cd", {"ab", "\xFF", "cd"}, 0},                    /* invalid UTF-8 */
        {"a \xC3", {"a", " ", "\xC3"}, 0},
        {"don't", {"don", "'t"}, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        zpp_bpe_pieces p = {0};
        const char *t = cases[k].text;
        EXPECT_OK(zpp_bpe_split(bpe, t, strlen(t), cases[k].flags, &p, NULL));
        size_t want = 0;
        while (cases[k].pieces[want]) want++;
        EXPECT(p.n == want, "case %zu: %zu pieces, expected %zu", k, p.n, want);
        for (size_t i = 0; i < want; i++) {
            const char *w = cases[k].pieces[i];
            EXPECT(p.pieces[i].len == strlen(w) && !memcmp(t + p.pieces[i].start, w, strlen(w)),
                   "case %zu piece %zu: '%.*s', expected '%s'", k, i, (int)p.pieces[i].len,
                   t + p.pieces[i].start, w);
            EXPECT((p.pieces[i].special >= 0) == !strcmp(w, "<|endoftext|>") &&
                   (p.pieces[i].special < 0 || p.pieces[i].special == 256));
        }
        free(p.pieces);
    }
    zpp_bpe_destroy(bpe);
}

/* On random valid text, PCRE2's splits are the reference scanner's. */
static void test_pretokenize_matches_reference(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    zpp_bpe *bpe = bytes_only();
    for (int trial = 0; trial < 300; trial++) {
        buf t = {0};
        random_text(&r, &t, (size_t)irand(&r, 1, 400), (textopt){0, 0, trial % 3 == 0});
        size_t *ends = malloc((t.n + 1) * sizeof *ends);
        const size_t n_ref = ref_split(t.b, t.n, ends);
        zpp_bpe_pieces p = {0};
        EXPECT_OK(zpp_bpe_split(bpe, t.b, t.n, 0, &p, NULL));
        size_t start = 0;
        for (size_t i = 0; i < p.n && i < n_ref; i++) {
            EXPECT(p.pieces[i].start == start && p.pieces[i].start + p.pieces[i].len == ends[i],
                   "trial %d piece %zu: bytes [%zu, %zu), the reference [%zu, %zu) in '%s'", trial,
                   i, p.pieces[i].start, p.pieces[i].start + p.pieces[i].len, start, ends[i],
                   (char *)t.b);
            start = ends[i];
        }
        EXPECT(p.n == n_ref, "trial %d: %zu pieces, the reference %zu", trial, p.n, n_ref);
        free(p.pieces), free(ends), free(t.b);
    }
    zpp_bpe_destroy(bpe);
}

/* The fast encoder gives GPT-2's bpe() ids exactly: whole, streamed in
 * random chunks, with the cache and without, with special tokens cut out. */
static void test_encode_matches_naive_bpe(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    static tvocab v;
    tv_build(&v, &r, 120);
    zpp_bpe *bpe = load(&v, "naive");
    EXPECT(zpp_bpe_vocab_size(bpe) == v.n_tok && zpp_bpe_merge_count(bpe) == (size_t)v.n_merges);
    EXPECT(zpp_bpe_find(bpe, "<|endoftext|>", 13) == v.eot);
    size_t total_ids = 0, total_bytes = 0;
    for (int trial = 0; trial < 160; trial++) {
        const int special = trial % 2;
        buf t = {0};
        random_text(&r, &t, (size_t)irand(&r, 1, 600), (textopt){special, 0, trial % 4 == 0});
        int *want = malloc((t.n + 1) * sizeof *want);
        const size_t n_want = ref_encode(&v, t.b, t.n, special, want);
        if (trial % 8 == 7) EXPECT_OK(zpp_bpe_set_cache(bpe, trial % 16 == 7 ? 0 : 5));
        const int chunk = trial % 3 == 0 ? 0 : irand(&r, 1, 40);
        zpp_bpe_ids got = encode_chunked(bpe, &r, t.b, t.n, special ? ZPP_BPE_SPECIAL : 0, chunk);
        for (size_t i = 0; i < got.n && i < n_want; i++)
            EXPECT(got.ids[i] == want[i],
                   "trial %d (chunks of up to %d): token %zu is %d, GPT-2's bpe() gives %d, in "
                   "'%s'",
                   trial, chunk, i, got.ids[i], want[i], (char *)t.b);
        EXPECT(got.n == n_want, "trial %d: %zu tokens, GPT-2's bpe() gives %zu", trial, got.n,
               n_want);
        total_ids += got.n, total_bytes += t.n;
        free(got.ids), free(want), free(t.b);
    }
    /* the merges did something: far fewer tokens than bytes */
    EXPECT(total_ids < total_bytes * 3 / 4, "%zu tokens for %zu bytes", total_ids, total_bytes);
    zpp_bpe_destroy(bpe);
}

/* decode(encode(x)) == x for any bytes: invalid UTF-8, NULs, special
 * tokens' text with and without ZPP_BPE_SPECIAL; streamed or whole. */
static void test_roundtrip_any_bytes(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    static tvocab v;
    tv_build(&v, &r, 60);
    zpp_bpe *bpe = load(&v, "roundtrip");
    for (int trial = 0; trial < 200; trial++) {
        buf t = {0};
        if (trial % 4 == 3) { /* plain random bytes */
            const size_t n = (size_t)irand(&r, 0, 300);
            for (size_t i = 0; i < n; i++) {
                const uint8_t c = (uint8_t)zpp_rng_u64(&r);
                put(&t, &c, 1);
            }
        } else {
            random_text(&r, &t, (size_t)irand(&r, 1, 500), (textopt){1, 1, trial % 5 == 0});
        }
        const unsigned flags = trial % 2 ? ZPP_BPE_SPECIAL : 0;
        zpp_bpe_ids whole = encode_chunked(bpe, &r, t.b, t.n, flags, 0);
        zpp_bpe_ids streamed = encode_chunked(bpe, &r, t.b, t.n, flags, irand(&r, 1, 30));
        EXPECT(whole.n == streamed.n && (!whole.n || !memcmp(whole.ids, streamed.ids,
                                                             whole.n * sizeof *whole.ids)),
               "trial %d: streamed tokens differ from the whole text's", trial);
        char *back = NULL;
        size_t n_back = 0;
        EXPECT_OK(zpp_bpe_decode(bpe, whole.ids, whole.n, &back, &n_back));
        EXPECT(n_back == t.n && (!t.n || !memcmp(back, t.b, t.n)),
               "trial %d: %zu bytes decode to %zu different ones", trial, t.n, n_back);
        EXPECT(back[n_back] == 0);
        /* the special id appears exactly where asked for */
        size_t eots = 0, texts = 0;
        for (size_t i = 0; i < whole.n; i++) eots += whole.ids[i] == v.eot;
        for (const uint8_t *q = t.b; t.n && (q = memmem(q, t.n - (size_t)(q - t.b),
                                                        "<|endoftext|>", 13)); q += 13)
            texts++;
        EXPECT(eots == (flags ? texts : 0), "trial %d: %zu end-of-text ids for %zu in the text",
               trial, eots, texts);
        free(back), free(whole.ids), free(streamed.ids), free(t.b);
    }
    /* an id that is no token is named */
    char *back = NULL;
    size_t n_back = 0;
    const int32_t bad[] = {5, (int32_t)v.n_tok};
    EXPECT_STATUS(zpp_bpe_decode(bpe, bad, 2, &back, &n_back), ZPP_ERR_INVALID);
    EXPECT_MSG("position 1");
    size_t len = 0;
    EXPECT(zpp_bpe_token_bytes(bpe, v.eot, &len) && len == 13);
    EXPECT(zpp_bpe_token_bytes(bpe, -1, &len) == NULL);
    zpp_bpe_destroy(bpe);
}

/* Streaming holds back exactly what may change: a piece at the end, a cut
 * UTF-8 character, the start of a special token; and it makes progress. */
static void test_streaming_holds_back(void) {
    zpp_bpe *bpe = bytes_only();
    static const struct {
        const char *text;
        unsigned flags;
        size_t consumed;
    } cases[] = {
        {"Hello world", 0, 5},             /* " world" may go on */
        {"Hello world ", 0, 11},           /* " world" is final; " " may join what follows */
        {"it's", 0, 4},                    /* "'s" is final as soon as it is there */
        {"it'", 0, 2},                     /* "'" may become "'s" */
        {"caf\xC3", 0, 0},                 /* é cut in two: "caf" may go on */
        {"a <|endoftext", ZPP_BPE_SPECIAL, 1}, /* " " waits for what the special becomes */
        {"a <|endoftext|>b", ZPP_BPE_SPECIAL, 15},
        {"a <|endoftext", 0, 4},           /* not special: " <|" is final, "endoftext" not */
        {"   ", 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        zpp_bpe_pieces p = {0};
        size_t used = 99;
        const char *t = cases[k].text;
        EXPECT_OK(zpp_bpe_split(bpe, t, strlen(t), cases[k].flags | ZPP_BPE_PARTIAL, &p, &used));
        EXPECT(used == cases[k].consumed, "case %zu '%s': consumed %zu, expected %zu", k, t, used,
               cases[k].consumed);
        free(p.pieces);
    }
    zpp_bpe_ids ids = {0};
    EXPECT_STATUS(zpp_bpe_encode(bpe, "x", 1, ZPP_BPE_PARTIAL, &ids, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_bpe_encode(bpe, "x", 1, 8, &ids, NULL), ZPP_ERR_INVALID);
    /* a megabyte of spaces is one piece: PCRE2's JIT stack holds it */
    const size_t big = (size_t)1 << 20;
    char *sp = malloc(big + 1);
    memset(sp, ' ', big);
    sp[big] = 'x';
    zpp_bpe_pieces p = {0};
    EXPECT_OK(zpp_bpe_split(bpe, sp, big + 1, 0, &p, NULL));
    EXPECT(p.n == 2 && p.pieces[0].len == big - 1 && p.pieces[1].len == 2, "%zu pieces", p.n);
    free(p.pieces), free(sp), free(ids.ids);
    zpp_bpe_destroy(bpe);
}

/* Broken files: a clear error naming the file and the place, nothing made. */
static void test_malformed_files(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(4));
    static tvocab v;
    tv_build(&v, &r, 10);
    char vp[512], mp[512], bad[512];
    tv_write(&v, "good", vp, mp);
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_load_gpt2(vp, mp, &bpe));
    zpp_bpe_destroy(bpe);
    bpe = NULL;
    /* the good files' text, to damage */
    FILE *f = fopen(vp, "rb");
    buf vj = {0}, mt = {0};
    char tmp[4096];
    size_t k;
    while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) put(&vj, tmp, k);
    fclose(f);
    f = fopen(mp, "rb");
    while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) put(&mt, tmp, k);
    fclose(f);
    zpp_test_tmp_path("bad", bad);

#define BAD_VOCAB(text, n, want_status, sub)                                    \
    do {                                                                       \
        zpp_test_write_file(bad, (text), (n));                                 \
        EXPECT_STATUS(zpp_bpe_load_gpt2(bad, mp, &bpe), want_status);         \
        EXPECT_MSG(sub);                                                       \
        EXPECT_MSG(bad);                                                       \
        EXPECT(bpe == NULL);                                                   \
    } while (0)
#define BAD_MERGES(text, want_status, sub)                                      \
    do {                                                                       \
        zpp_test_write_file(bad, (text), strlen(text));                        \
        EXPECT_STATUS(zpp_bpe_load_gpt2(vp, bad, &bpe), want_status);         \
        EXPECT_MSG(sub);                                                       \
        EXPECT(bpe == NULL);                                                   \
    } while (0)

    BAD_VOCAB(vj.b, vj.n / 2, ZPP_ERR_FORMAT, "ends early (truncated?)");
    BAD_VOCAB("{\n\"a\": 1,\n, }", 13, ZPP_ERR_FORMAT, "stopped at line 3, column");
    BAD_VOCAB("[1, 2]", 6, ZPP_ERR_FORMAT, "not an object");
    BAD_VOCAB("{\"a\": 1.5}", 10, ZPP_ERR_FORMAT, "not a whole number");
    BAD_VOCAB("{\"a\": -1}", 9, ZPP_ERR_FORMAT, "not a whole number");
    BAD_VOCAB("{\"a\": \"1\"}", 10, ZPP_ERR_FORMAT, "not a whole number");
    BAD_VOCAB("{\"a b\": 1}", 10, ZPP_ERR_FORMAT, "U+0020, which is not in GPT-2's byte alphabet");
    BAD_VOCAB("{\"\\u0400\": 1}", 13, ZPP_ERR_FORMAT, "U+0400");
    BAD_VOCAB("{\"\": 1}", 7, ZPP_ERR_FORMAT, "empty token");
    {
        /* the space's token "Ġ" removed: byte 0x20 has none */
        buf c = {0};
        put(&c, vj.b, vj.n);
        char *g = strstr((char *)c.b, "\"\\u0120\": ");
        EXPECT(g != NULL);
        memcpy(g, "\"xyzzyq\": ", 10); /* same length; "xyzzyq" is no merge's result */
        BAD_VOCAB(c.b, c.n, ZPP_ERR_FORMAT, "byte 0x20 has no token");
        /* an id given twice */
        memcpy(c.b, vj.b, vj.n);
        char *first = strstr((char *)c.b, ": 0,"), *second = strstr((char *)c.b, ": 1,");
        EXPECT(first && second);
        second[2] = '0';
        BAD_VOCAB(c.b, c.n, ZPP_ERR_FORMAT, "id 0 is given to two tokens");
        free(c.b);
    }
    EXPECT_STATUS(zpp_bpe_load_gpt2("/nonexistent/vocab.json", mp, &bpe), ZPP_ERR_IO);
    EXPECT_MSG("cannot open vocab '/nonexistent/vocab.json'");
    EXPECT_STATUS(zpp_bpe_load_gpt2(vp, "/tmp", &bpe), ZPP_ERR_IO);
    EXPECT_MSG("is a directory");

    BAD_MERGES("#version: 0.2\nt\n", ZPP_ERR_FORMAT, "line 2 \"t\" is not two tokens");
    BAD_MERGES("#version: 0.2\nt h e\n", ZPP_ERR_FORMAT, "separated by one space");
    BAD_MERGES("#version: 0.2\nt  h\n", ZPP_ERR_FORMAT, "separated by one space");
    BAD_MERGES("#version: 0.2\nĠ t\n\nh e\n", ZPP_ERR_FORMAT, "line 3 is blank");
    BAD_MERGES("#version: 0.2\nxyz q\n", ZPP_ERR_FORMAT, "\"xyz\" is not in the vocabulary");
    BAD_MERGES("#version: 0.2\nz Ġ\n", ZPP_ERR_FORMAT, "into a token that is not in the vocabulary");
    BAD_MERGES("#version: 0.2\nt \xFF\n", ZPP_ERR_FORMAT, "not valid UTF-8");
    {
        /* truncated: the last merges gone, their tokens unreachable */
        buf c = {0};
        put(&c, mt.b, mt.n);
        c.n = (size_t)((char *)memchr(c.b + c.n / 2, '\n', c.n / 2) - (char *)c.b) + 1;
        c.b[c.n] = 0;
        BAD_MERGES((char *)c.b, ZPP_ERR_FORMAT, "is made by none of the");
        /* ... cut inside a line */
        c.n -= 3;
        c.b[c.n] = 0;
        zpp_test_write_file(bad, c.b, c.n);
        EXPECT(zpp_bpe_load_gpt2(vp, bad, &bpe) == ZPP_ERR_FORMAT && bpe == NULL, "%s",
               zpp_last_error());
        /* a merge listed twice */
        memcpy(c.b, mt.b, mt.n);
        c.n = mt.n;
        c.b[c.n] = 0;
        const char *line2 = strchr((char *)c.b, '\n') + 1;
        const size_t l2 = (size_t)(strchr(line2, '\n') + 1 - line2);
        put(&c, line2, l2);
        BAD_MERGES((char *)c.b, ZPP_ERR_FORMAT, "repeats merge 0");
        EXPECT_MSG("merge k is on line k + 2");
        free(c.b);
    }
    /* trailing blank lines, CRLF line ends and no header are all fine */
    {
        buf c = {0};
        for (size_t i = 0; i < mt.n; i++) {
            if (mt.b[i] == '\n') puts_(&c, "\r");
            put(&c, &mt.b[i], 1);
        }
        puts_(&c, "\n\n");
        zpp_test_write_file(bad, c.b, c.n);
        EXPECT_OK(zpp_bpe_load_gpt2(vp, bad, &bpe));
        zpp_bpe_destroy(bpe);
        bpe = NULL;
        const char *body = strchr((char *)mt.b, '\n') + 1;
        zpp_test_write_file(bad, body, strlen(body));
        EXPECT_OK(zpp_bpe_load_gpt2(vp, bad, &bpe));
        zpp_bpe_destroy(bpe);
        bpe = NULL;
        free(c.b);
    }
    free(vj.b), free(mt.b);
#undef BAD_VOCAB
#undef BAD_MERGES
}

/* The core's own checks, for loaders other than GPT-2's. */
static void test_core_checks(void) {
    static uint8_t b[256];
    zpp_bpe_token tok[260];
    for (int i = 0; i < 256; i++) {
        b[i] = (uint8_t)i;
        tok[i] = (zpp_bpe_token){&b[i], 1, 1000 - i, 0, 0}; /* sparse ids */
    }
    tok[256] = (zpp_bpe_token){(const uint8_t *)"ab", 2, 5, 0, 0};
    zpp_bpe_merge m[2] = {{1000 - 'a', 1000 - 'b'}, {1000 - 'a', 1000 - 'b'}};
    zpp_bpe_desc d = {.tokens = tok, .n_tokens = 257, .merges = m, .n_merges = 1,
                      .pattern = ZPP_BPE_GPT2_PATTERN};
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_create(&d, &bpe));
    EXPECT(zpp_bpe_vocab_size(bpe) == 1001);
    zpp_bpe_ids ids = {0};
    EXPECT_OK(zpp_bpe_encode(bpe, "abc", 3, 0, &ids, NULL));
    EXPECT(ids.n == 2 && ids.ids[0] == 5 && ids.ids[1] == 1000 - 'c');
    char *t = NULL;
    size_t n = 0;
    const int32_t gap[] = {7};
    EXPECT_STATUS(zpp_bpe_decode(bpe, gap, 1, &t, &n), ZPP_ERR_INVALID); /* no token has id 7 */
    zpp_bpe_destroy(bpe);
    bpe = NULL;
    free(ids.ids);
    ids = (zpp_bpe_ids){0};
    d.n_merges = 2;
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("repeats merge 0");
    d.n_merges = 1;
    m[0].right = 3; /* no such id */
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("names id 3");
    m[0].right = 1000 - 'c'; /* "ac" is no token */
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("not in the vocabulary");
    m[0].right = 1000 - 'b';
    d.pattern = "(unclosed";
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("does not compile");
    d.pattern = NULL; /* no pattern: the whole text is one piece */
    EXPECT_OK(zpp_bpe_create(&d, &bpe));
    EXPECT_OK(zpp_bpe_encode(bpe, "a b", 3, 0, &ids, NULL));
    EXPECT(ids.n == 3);
    zpp_bpe_destroy(bpe);
    bpe = NULL;
    free(ids.ids);
    const zpp_bpe_token a_tok = tok['A'];
    tok['A'] = tok[255], d.n_tokens = 255; /* byte 'A''s token missing */
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("byte 0x41 has no token");
    tok['A'] = a_tok, d.n_tokens = 257;
    tok[256].id = 1000; /* an id twice */
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("id 1000 is given to two tokens");
    tok[256].id = ZPP_BPE_MAX_ID + 1; /* an id past the tables */
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("ids are in [0, 16777215]");
    tok[256] = (zpp_bpe_token){&b['a'], 1, 5, 0, 0}; /* the same bytes twice */
    EXPECT_STATUS(zpp_bpe_create(&d, &bpe), ZPP_ERR_FORMAT);
    EXPECT_MSG("listed twice");
    EXPECT(bpe == NULL);
}

/* ---- the command ---- */

static int run_cli(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s tokenize %s 2>&1", getenv("ZPP_CLI"), args);
    FILE *p = popen(cmd, "r");
    EXPECT(p != NULL, "popen %s", cmd);
    const size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    const int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* `zeropp tokenize` writes what zpp_bpe_encode gives, in a file the data
 * loader reads back; bad input fails with a message and writes nothing. */
static void test_tool_writes_what_the_loader_reads(void) {
    EXPECT(getenv("ZPP_CLI") != NULL, "ZPP_CLI is not set (ctest sets it)");
    zpp_rng r = zpp_rng_make(zpp_test_seed(5));
    static tvocab v;
    tv_build(&v, &r, 80);
    char vp[512], mp[512], in[512], out[512], args[4096], msg[8192];
    tv_write(&v, "tool", vp, mp);
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_load_gpt2(vp, mp, &bpe));
    zpp_test_tmp_path("in.txt", in);
    zpp_test_tmp_path("out.bin", out);
    for (int trial = 0; trial < 4; trial++) {
        const int special = trial % 2;
        buf t = {0};
        random_text(&r, &t, (size_t)irand(&r, 3000, 20000), (textopt){1, trial >= 2, 1});
        zpp_test_write_file(in, t.b, t.n);
        /* a small buffer: the stream is cut many times, and some pieces
         * (runs of hundreds) are longer than it */
        snprintf(args, sizeof args, "--vocab %s --merges %s %s%s %s %s %s", vp, mp,
                 special ? "--allow-special " : "", trial == 3 ? "" : "--buffer 64",
                 trial == 1 ? "--cache 3" : trial == 2 ? "--cache 0" : "", in, out);
        EXPECT(run_cli(args, msg, sizeof msg) == 0, "zeropp tokenize %s: %s", args, msg);
        EXPECT(strstr(msg, "wrote ") != NULL, "%s", msg);
        zpp_bpe_ids want = {0};
        EXPECT_OK(zpp_bpe_encode(bpe, t.b, t.n, special ? ZPP_BPE_SPECIAL : 0, &want, NULL));
        /* read back by the trainer's loader */
        zpp_train_config cfg;
        EXPECT_OK(zpp_train_config_defaults(&cfg));
        cfg.model.seq_len = 8;
        cfg.model.vocab_size = v.n_tok;
        cfg.train_micro_batch_size_per_gpu = 1;
        EXPECT_OK(zpp_train_config_resolve(&cfg, 1));
        zpp_data *d = NULL;
        EXPECT_OK(zpp_data_open(out, &cfg, &d));
        const zpp_data_info info = zpp_data_info_get(d);
        EXPECT(info.kind == ZPP_DATA_LLMC && info.n_tokens == want.n, "%zu tokens, expected %zu",
               info.n_tokens, want.n);
        for (size_t i = 0; i < want.n; i++)
            EXPECT(zpp_data_token(d, i) == want.ids[i], "token %zu: %d, expected %d", i,
                   (int)zpp_data_token(d, i), (int)want.ids[i]);
        zpp_data_close(d);
        free(want.ids), free(t.b);
    }
    zpp_bpe_destroy(bpe);
    /* failures leave OUT untouched (here: absent) and say why */
    EXPECT(remove(out) == 0);
    snprintf(args, sizeof args, "--vocab %s --merges %s %s %s", vp, in, in, out);
    EXPECT(run_cli(args, msg, sizeof msg) == 1 && strstr(msg, "tokenize: merges '"), "%s", msg);
    EXPECT(!exists(out));
    char empty[512];
    zpp_test_tmp_path("empty.txt", empty);
    zpp_test_write_file(empty, "", 0);
    snprintf(args, sizeof args, "--vocab %s --merges %s %s %s", vp, mp, empty, out);
    EXPECT(run_cli(args, msg, sizeof msg) == 1 && strstr(msg, "holds no text"), "%s", msg);
    EXPECT(!exists(out));
    snprintf(args, sizeof args, "--vocab %s --merges %s %s %s", vp, mp, in, in);
    EXPECT(run_cli(args, msg, sizeof msg) == 2 && strstr(msg, "is the input file"), "%s", msg);
    snprintf(args, sizeof args, "--vocab %s %s %s", vp, in, out);
    EXPECT(run_cli(args, msg, sizeof msg) == 2 && strstr(msg, "needs --vocab"), "%s", msg);
    /* a vocabulary past uint16 is taken: its id 70000 makes OUT.bin a
     * version-2 token file (uint32 tokens, test_bpe_hf.c) */
    {
        buf j = {0};
        FILE *f = fopen(vp, "rb");
        char tmp[4096];
        size_t k;
        while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) put(&j, tmp, k);
        fclose(f);
        char *eot = strstr((char *)j.b, "\"<|endoftext|>\": ");
        EXPECT(eot != NULL);
        buf big = {0};
        put(&big, j.b, (size_t)(eot - (char *)j.b));
        puts_(&big, "\"<|endoftext|>\": 70000}");
        char bigv[512];
        zpp_test_tmp_path("big_vocab.json", bigv);
        zpp_test_write_file(bigv, big.b, big.n);
        zpp_test_write_file(in, "x<|endoftext|>y<|endoftext|>z", 29);
        snprintf(args, sizeof args, "--vocab %s --merges %s --allow-special %s %s", bigv, mp, in,
                 out);
        EXPECT(run_cli(args, msg, sizeof msg) == 0 && strstr(msg, "vocabulary 70001"), "%s",
               msg);
        zpp_train_config cfg;
        EXPECT_OK(zpp_train_config_defaults(&cfg));
        cfg.model.seq_len = 1;
        cfg.model.vocab_size = 70001;
        cfg.train_micro_batch_size_per_gpu = 1;
        EXPECT_OK(zpp_train_config_resolve(&cfg, 1));
        zpp_data *d = NULL;
        EXPECT_OK(zpp_data_open(out, &cfg, &d));
        EXPECT(zpp_data_info_get(d).n_tokens == 5 && zpp_data_token(d, 1) == 70000 &&
               zpp_data_token(d, 3) == 70000);
        zpp_data_close(d);
        free(j.b), free(big.b);
    }
}

/* The tokenizer note beside a token file: written and read back; none is
 * "not found", not an error; a malformed note, one of another kind, and one
 * whose token count is not the file's (stale) are refused, naming it. */
static void test_tokfile_note(void) {
    char bin[512], note[600];
    zpp_test_tmp_path("noted.bin", bin);
    EXPECT_OK(zpp_tokfile_note_path(bin, note, sizeof note));
    EXPECT(strlen(note) == strlen(bin) + 5 && !strcmp(note + strlen(bin), ".json"), "%s", note);
    zpp_tokfile *f = NULL;
    EXPECT_OK(zpp_tokfile_open(bin, &f));
    const int32_t ids[5] = {1, 2, 300, 4, 5};
    EXPECT_OK(zpp_tokfile_append(f, ids, 5));
    EXPECT_OK(zpp_tokfile_close(f, NULL));
    zpp_tokfile_note n;
    int found = 1;
    EXPECT_OK(zpp_tokfile_note_read(bin, &n, &found));
    EXPECT(!found && !n.vocab && !n.merges, "a note where none was written");
    char vocab[] = "/some/where/\"odd\" vocab.json", merges[] = "/else/merges.txt";
    zpp_tokfile_note w = {vocab, merges, 320, 5, NULL};
    EXPECT_OK(zpp_tokfile_note_write(bin, &w));
    EXPECT_OK(zpp_tokfile_note_read(bin, &n, &found));
    EXPECT(found && !strcmp(n.vocab, vocab) && !strcmp(n.merges, merges) && n.vocab_size == 320 &&
               n.tokens == 5,
           "read back %s %s %d %zu", n.vocab, n.merges, (int)n.vocab_size, n.tokens);
    zpp_tokfile_note_free(&n);
    EXPECT(!n.vocab && !n.merges);
    /* stale: the file holds 5 tokens */
    w.tokens = 6;
    EXPECT_OK(zpp_tokfile_note_write(bin, &w));
    EXPECT_STATUS(zpp_tokfile_note_read(bin, &n, &found), ZPP_ERR_FORMAT);
    EXPECT(!found && !n.vocab, "a stale note was taken");
    EXPECT_MSG("is stale");
    EXPECT_MSG(note);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"tokenizer\":\"gpt2-bpe\",\"vocab\":\"v\",\"merges\":\"m\""
         ",\"vocab_size\":3",
         "not a JSON object"},
        {"{\"tokenizer\":\"hf\",\"vocab\":\"v\",\"merges\":\"m\""
         ",\"vocab_size\":3,\"tokens\":5}",
         "\"tokenizer\" is not"},
        {"{\"tokenizer\":\"gpt2-bpe\",\"vocab\":\"\",\"merges\":\"m\""
         ",\"vocab_size\":3,\"tokens\":5}",
         "\"vocab\" is not a file"},
        {"{\"tokenizer\":\"gpt2-bpe\",\"vocab\":\"v\""
         ",\"vocab_size\":3,\"tokens\":5}",
         "\"merges\" is not a file"},
        {"{\"tokenizer\":\"gpt2-bpe\",\"vocab\":\"v\",\"merges\":\"m\""
         ",\"vocab_size\":3.5,\"tokens\":5}",
         "\"vocab_size\" is not a count"},
        {"{\"tokenizer\":\"gpt2-bpe\",\"vocab\":\"v\",\"merges\":\"m\""
         ",\"vocab_size\":16777217,\"tokens\":5}",
         "\"vocab_size\" is not a count"},
        {"{\"tokenizer\":\"gpt2-bpe\",\"vocab\":\"v\",\"merges\":\"m\""
         ",\"vocab_size\":3,\"tokens\":-5}",
         "\"tokens\" is not a count"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zpp_test_write_file(note, bad[i].text, strlen(bad[i].text));
        EXPECT_STATUS(zpp_tokfile_note_read(bin, &n, &found), ZPP_ERR_FORMAT);
        EXPECT(!found && !n.vocab && !n.merges, "case %zu was taken", i);
        EXPECT_MSG(bad[i].msg);
    }
    /* a note beside a file that is no token file */
    zpp_test_write_file(bin, "plain text", 10);
    w.tokens = 5;
    EXPECT_OK(zpp_tokfile_note_write(bin, &w));
    EXPECT_STATUS(zpp_tokfile_note_read(bin, &n, &found), ZPP_ERR_FORMAT);
    EXPECT_MSG("is no llm.c token file");
}

ZPP_TESTS(
    ZPP_TEST(test_byte_alphabet),
    ZPP_TEST(test_pretokenize_known),
    ZPP_TEST(test_pretokenize_matches_reference),
    ZPP_TEST(test_encode_matches_naive_bpe),
    ZPP_TEST(test_roundtrip_any_bytes),
    ZPP_TEST(test_streaming_holds_back),
    ZPP_TEST(test_malformed_files),
    ZPP_TEST(test_core_checks),
    ZPP_TEST(test_tool_writes_what_the_loader_reads),
    ZPP_TEST(test_tokfile_note),
)

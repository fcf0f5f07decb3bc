/* test_nfc.c — Unicode Normalization Form C (src/train/nfc.c).
 *
 * The reference is tests/data/nfc_vectors.txt, written by Python's
 * unicodedata (scripts/gen-unicode-nfc.py --vectors; an implementation that
 * shares nothing with ours but the Unicode Character Database): every code
 * point that NFC or NFD changes or that has a combining class, Hangul jamo
 * sequences, and random sequences of letters, marks and composable pairs.
 * On fresh random bytes (marks, jamo, composable pairs, invalid UTF-8) the
 * properties NFC promises: it is idempotent; it cuts at stable boundaries
 * (NFC(x y) = NFC(x) NFC(y) when y starts at one), which streaming relies
 * on; the offsets into the input never decrease and are exact at stable
 * boundaries. Bytes that are not UTF-8 pass through (by hand). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "train/nfc.h"

static size_t put_utf8(uint32_t c, uint8_t *o) {
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000)
        return o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (c & 63)), 3;
    return o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63)),
           o[2] = (uint8_t)(0x80 | (c >> 6 & 63)), o[3] = (uint8_t)(0x80 | (c & 63)), 4;
}

/* "HEX HEX ..." up to `end` -> UTF-8 in out; returns its length */
static size_t parse_cps(const char *s, const char *end, uint8_t *out) {
    size_t n = 0;
    while (s < end) {
        char *next = NULL;
        const unsigned long c = strtoul(s, &next, 16);
        if (next == s) break;
        n += put_utf8((uint32_t)c, out + n);
        s = next;
    }
    return n;
}

static void test_matches_unicodedata(void) {
    char path[1024];
    FILE *f = fopen(zpp_test_data("nfc_vectors.txt", path, sizeof path), "r");
    EXPECT(f != NULL, "cannot open %s", path);
    char line[4096];
    uint8_t in[1024], want[1024];
    zpp_nfc_buf out = {0};
    size_t lines = 0, changed = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        const char *semi = strchr(line, ';');
        EXPECT(semi != NULL, "line %zu has no ';'", lines + 2);
        const size_t n = parse_cps(line, semi, in);
        const size_t m = parse_cps(semi + 1, line + strlen(line), want);
        EXPECT_OK(zpp_nfc(in, n, &out));
        EXPECT(out.n == m && !memcmp(out.text, want, m), "line %zu: %s gives %zu bytes, want %zu",
               lines + 2, line, out.n, m);
        changed += n != m || memcmp(in, want, m);
        lines++;
    }
    fclose(f);
    EXPECT(lines > 5000 && changed > 2000, "%zu vectors, %zu changed", lines, changed);
    zpp_nfc_free(&out);
}

/* Random bytes of the kinds NFC treats specially. */
static size_t random_text(zpp_rng *r, uint8_t *t, size_t target) {
    static const uint32_t pool[] = {
        'a', 'e', 'o', 'A', ' ', 'z',                     /* starters */
        0x300, 0x301, 0x308, 0x323, 0x327, 0x31B, 0x345, /* marks, classes 230 220 202 216 240 */
        0x5B0, 0x5B8, 0x94D, 0x93C, 0x3099, 0x1D165,     /* Hebrew, Devanagari, kana, music */
        0xE9, 0x1E69, 0x212B, 0x2126, 0x344, 0xFB2C,     /* composites, singletons, non-starters */
        0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01,          /* Hangul */
        0xB47, 0xB3E, 0xB57, 0x1B35,                     /* starters that compose with starters */
        0x304B, 0x30CF, 0x4E2D, 0x1F642,
    };
    size_t n = 0;
    while (n < target) {
        const uint64_t x = zpp_rng_u64(r);
        if (x % 16 == 0) t[n++] = (uint8_t)(0x80 + (x >> 8) % 128); /* no UTF-8 */
        else n += put_utf8(pool[(x >> 8) % (sizeof pool / sizeof *pool)], t + n);
    }
    return n;
}

static void test_properties(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    zpp_nfc_buf a = {0}, b = {0}, c = {0};
    uint8_t x[700], joined[4096];
    for (int trial = 0; trial < 3000; trial++) {
        const size_t n = random_text(&r, x, 1 + zpp_rng_u64(&r) % 600);
        EXPECT_OK(zpp_nfc(x, n, &a));
        /* idempotent */
        EXPECT_OK(zpp_nfc(a.text, a.n, &b));
        EXPECT(b.n == a.n && !memcmp(b.text, a.text, a.n), "trial %d: NFC(NFC(x)) != NFC(x)",
               trial);
        /* offsets: non-decreasing, from 0 up to n */
        EXPECT(a.src[a.n] == n, "trial %d: src[n] = %u, want %zu", trial, a.src[a.n], n);
        for (size_t k = 0; k < a.n; k++)
            EXPECT(a.src[k] <= a.src[k + 1], "trial %d: src decreases at %zu", trial, k);
        /* cut at the last stable boundary and at a random one */
        size_t cuts[2] = {zpp_nfc_stable_end(x, n), zpp_rng_u64(&r) % (n + 1)};
        while (cuts[1] > 0 && ((x[cuts[1]] & 0xC0) == 0x80 || cuts[1] == n ||
                               !zpp_nfc_stable_at(x + cuts[1], n - cuts[1])))
            cuts[1]--;
        for (int k = 0; k < 2; k++) {
            const size_t cut = cuts[k];
            EXPECT(cut == 0 || zpp_nfc_stable_at(x + cut, n - cut), "trial %d: cut %zu", trial,
                   cut);
            EXPECT_OK(zpp_nfc(x, cut, &b));
            memcpy(joined, b.text, b.n);
            EXPECT_OK(zpp_nfc(x + cut, n - cut, &c));
            memcpy(joined + b.n, c.text, c.n);
            EXPECT(b.n + c.n == a.n && !memcmp(joined, a.text, a.n),
                   "trial %d: NFC(x) is not NFC(x[0, %zu)) NFC(the rest)", trial, cut);
            /* the offset is exact there: the first normalized byte from
             * the second part maps to the cut */
            if (cut > 0 && cut < n)
                EXPECT(a.src[b.n] == cut, "trial %d: src at the cut %u, want %zu", trial,
                       a.src[b.n], cut);
        }
    }
    zpp_nfc_free(&a), zpp_nfc_free(&b), zpp_nfc_free(&c);
}

/* A byte that is not UTF-8 stays, a character of class 0 that composes
 * with nothing: "e", 0xFF, U+0301 keeps the accent apart; 0xFF, "e",
 * U+0301 gives 0xFF, "é"; a cut-off sequence stays too. */
static void test_stray_bytes(void) {
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"e\xFF\xCC\x81", "e\xFF\xCC\x81"},
        {"\xFF" "e\xCC\x81", "\xFF\xC3\xA9"},
        {"e\xCC\x81\xE4\xB8", "\xC3\xA9\xE4\xB8"},
        {"\xCC", "\xCC"},
    };
    zpp_nfc_buf out = {0};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        EXPECT_OK(zpp_nfc((const uint8_t *)cases[k].in, strlen(cases[k].in), &out));
        EXPECT(out.n == strlen(cases[k].want) && !memcmp(out.text, cases[k].want, out.n),
               "case %zu: %zu bytes", k, out.n);
    }
    zpp_nfc_free(&out);
}

ZPP_TESTS(
    ZPP_TEST(test_matches_unicodedata),
    ZPP_TEST(test_properties),
    ZPP_TEST(test_stray_bytes),
)

/* train/nfc.c — Unicode Normalization Form C (nfc.h). */
#include "train/nfc.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/nfc_data.h"
#include "train/utf8.h"

/* Hangul syllables (UAX #15, "Hangul"): S = SBase + (L * VCount + V) *
 * TCount + T, with L, V, T indexes of the leading consonant, vowel and
 * optional trailing consonant (T 0: none). */
enum {
    S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
    L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT,
    S_COUNT = L_COUNT * N_COUNT,
};
/* An input byte that is not UTF-8: above every code point, class 0. */
#define RAW_BYTE 0x110000u

/* bsearch's comparisons: a code point (or a pair) against a table row. */
static int vs_class(const void *key, const void *row) {
    const uint32_t c = *(const uint32_t *)key;
    const nfc_class *r = row;
    return c < r->first ? -1 : c > r->last;
}
static int vs_split(const void *key, const void *row) {
    const uint32_t c = *(const uint32_t *)key, cp = ((const nfc_split *)row)->cp;
    return c < cp ? -1 : c > cp;
}
static int vs_join(const void *key, const void *row) {
    const uint32_t *ab = key;
    const nfc_join *r = row;
    return ab[0] != r->a ? (ab[0] < r->a ? -1 : 1) : ab[1] < r->b ? -1 : ab[1] > r->b;
}
static int vs_u32(const void *key, const void *row) {
    const uint32_t c = *(const uint32_t *)key, v = *(const uint32_t *)row;
    return c < v ? -1 : c > v;
}
#define FIND(key, table, cmp) bsearch(key, table, sizeof table / sizeof *table, sizeof *table, cmp)

static unsigned ccc(uint32_t c) {
    if (c < 0x300 || c >= RAW_BYTE) return 0;
    const nfc_class *r = FIND(&c, nfc_ccc, vs_class);
    return r ? r->ccc : 0;
}

/* One step of c's canonical decomposition into *a (and *b, 0 for none);
 * 0 when c does not decompose. */
static int decompose1(uint32_t c, uint32_t *a, uint32_t *b) {
    if (c - S_BASE < S_COUNT) {
        const uint32_t s = c - S_BASE, t = s % T_COUNT;
        if (t) *a = c - t, *b = T_BASE + t; /* LV then T */
        else *a = L_BASE + s / N_COUNT, *b = V_BASE + s % N_COUNT / T_COUNT;
        return 1;
    }
    if (c < 0xC0 || c >= RAW_BYTE) return 0;
    const nfc_split *r = FIND(&c, nfc_decomp, vs_split);
    if (r) *a = r->a, *b = r->b;
    return r != NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b - T_BASE - 1 < T_COUNT - 1)
        return a + (b - T_BASE);
    if (b < 0x300 || b >= RAW_BYTE) return 0;
    const uint32_t ab[2] = {a, b};
    const nfc_join *r = FIND(ab, nfc_comp, vs_join);
    return r ? r->cp : 0;
}

/* 1 when some pair composes with c second (so c may join what precedes). */
static int is_second(uint32_t c) {
    if (c - V_BASE < V_COUNT || c - T_BASE - 1 < T_COUNT - 1) return 1;
    if (c < 0x300 || c >= RAW_BYTE) return 0;
    return FIND(&c, nfc_seconds, vs_u32) != NULL;
}

/* The code point at p[0, n) (n >= 1) and its length in *len; a byte that
 * does not start a well-formed sequence is RAW_BYTE + the byte, length 1. */
static uint32_t utf8_next(const uint8_t *p, size_t n, size_t *len) {
    uint32_t cp;
    *len = zpp_utf8_decode(p, n, &cp);
    if (*len) return cp;
    *len = 1;
    return RAW_BYTE + p[0];
}

static size_t utf8_put(uint32_t c, uint8_t *o) {
    if (c >= RAW_BYTE) return o[0] = (uint8_t)(c - RAW_BYTE), 1;
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000)
        return o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (c & 63)), 3;
    return o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63)),
           o[2] = (uint8_t)(0x80 | (c >> 6 & 63)), o[3] = (uint8_t)(0x80 | (c & 63)), 4;
}

/* The first code point of c's full decomposition. */
static uint32_t first_of(uint32_t c) {
    uint32_t a, b;
    while (decompose1(c, &a, &b)) c = a;
    return c;
}

/* 1 when in[0, n) ends inside the UTF-8 sequence that in[0] starts. */
static int cut_off(const uint8_t *in, size_t n) {
    const size_t need = zpp_utf8_need(in[0]);
    if (need <= n) return 0;
    for (size_t i = 1; i < n; i++)
        if ((in[i] & 0xC0) != 0x80) return 0;
    return 1;
}

int zpp_nfc_stable_at(const uint8_t *in, size_t n) {
    if (cut_off(in, n)) return 0; /* what it becomes is not known yet */
    size_t len;
    const uint32_t f = first_of(utf8_next(in, n, &len));
    return ccc(f) == 0 && !is_second(f);
}

size_t zpp_nfc_stable_end(const uint8_t *in, size_t n) {
    for (size_t i = n; i-- > 0;)
        if ((in[i] & 0xC0) != 0x80 && zpp_nfc_stable_at(in + i, n - i)) return i;
    return 0;
}

/* Appends c's full canonical decomposition at cp[*m], each part from the
 * input offset `at`. */
static void push_decomposed(zpp_nfc_buf *b, uint32_t c, uint32_t at, size_t *m) {
    uint32_t x, y;
    if (!decompose1(c, &x, &y)) {
        b->cp[*m] = c, b->at[(*m)++] = at;
        return;
    }
    push_decomposed(b, x, at, m);
    if (y) push_decomposed(b, y, at, m);
}

static zpp_status reserve_chars(zpp_nfc_buf *b, size_t chars) {
    if (chars <= b->cp_cap) return ZPP_OK;
    uint32_t *cp = realloc(b->cp, chars * sizeof *cp);
    if (cp) b->cp = cp;
    uint32_t *at = cp ? realloc(b->at, chars * sizeof *at) : NULL;
    if (!at) return zpp_error(ZPP_ERR_NOMEM, "nfc: out of memory for %zu characters", chars);
    b->at = at, b->cp_cap = chars;
    return ZPP_OK;
}

static zpp_status reserve_bytes(zpp_nfc_buf *b, size_t bytes) {
    if (bytes <= b->cap && b->text) return ZPP_OK;
    uint8_t *t = realloc(b->text, bytes + 1);
    if (t) b->text = t;
    uint32_t *s = t ? realloc(b->src, (bytes + 1) * sizeof *s) : NULL;
    if (!s) return zpp_error(ZPP_ERR_NOMEM, "nfc: out of memory for %zu bytes", bytes);
    b->src = s, b->cap = bytes;
    return ZPP_OK;
}

zpp_status zpp_nfc(const uint8_t *in, size_t n, zpp_nfc_buf *out) {
    if (n >= UINT32_MAX)
        return zpp_error(ZPP_ERR_INVALID, "nfc: a text of %zu bytes; at most 4 GiB at once", n);
    /* a character decomposes into at most ZPP_NFC_MAX_DECOMPOSED code points */
    ZPP_CHECK(reserve_chars(out, ZPP_NFC_MAX_DECOMPOSED * n + 1));
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        const uint32_t c = utf8_next(in + i, n - i, &len);
        push_decomposed(out, c, (uint32_t)i, &m);
        i += len;
    }
    uint32_t *cp = out->cp, *at = out->at;
    /* order each run of marks by class (insertion sort: runs are short) */
    for (size_t i = 1; i < m; i++) {
        const unsigned k = ccc(cp[i]);
        if (!k) continue;
        size_t j = i;
        const uint32_t c = cp[i], a = at[i];
        for (; j > 0 && ccc(cp[j - 1]) > k; j--) cp[j] = cp[j - 1], at[j] = at[j - 1];
        cp[j] = c, at[j] = a;
    }
    /* compose: `last` is the class of the last character kept after the
     * starter (0: it is the starter itself; 256: no starter yet) */
    size_t kept = 0, starter = 0;
    unsigned last = 256;
    for (size_t i = 0; i < m; i++) {
        const uint32_t c = cp[i];
        const unsigned k = ccc(c);
        if (last != 256 && (last == 0 || last < k)) {
            const uint32_t made = compose(cp[starter], c);
            if (made) {
                cp[starter] = made;
                continue;
            }
        }
        if (k == 0) starter = kept, last = 0;
        else if (last != 256) last = k;
        cp[kept] = c, at[kept++] = at[i];
    }
    /* to UTF-8, each byte with its character's input offset; then the
     * offsets made non-decreasing (reordered marks take the least after) */
    size_t bytes = 0;
    uint8_t scratch[4];
    for (size_t i = 0; i < kept; i++) bytes += utf8_put(cp[i], scratch);
    ZPP_CHECK(reserve_bytes(out, bytes));
    size_t o = 0;
    for (size_t i = 0; i < kept; i++) {
        const size_t len = utf8_put(cp[i], out->text + o);
        for (size_t k = 0; k < len; k++) out->src[o + k] = at[i];
        o += len;
    }
    out->text[o] = 0;
    out->src[o] = (uint32_t)n;
    for (size_t k = o; k-- > 0;)
        if (out->src[k] > out->src[k + 1]) out->src[k] = out->src[k + 1];
    out->n = o;
    return ZPP_OK;
}

void zpp_nfc_free(zpp_nfc_buf *b) {
    if (!b) return;
    free(b->text), free(b->src), free(b->cp), free(b->at);
    memset(b, 0, sizeof *b);
}

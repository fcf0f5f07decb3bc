/* train/bpe.c — byte-level BPE: the tables, the pre-tokenizer, the merging
 * and the cache (bpe.h explains the algorithm). GPT-2's file formats are in
 * bpe_gpt2.c. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "train/bpe.h"

#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/nfc.h"
#include "train/utf8.h"

#define NO_RANK INT32_MAX
/* Longer pieces are encoded every time: they are rare, and each would take
 * a cache slot from a frequent word. */
#define CACHE_MAX_PIECE 64

/* ---- hashing ---------------------------------------------------------- */

/* A 64-bit hash of a byte string, eight bytes a step (a multiply and a
 * shift mix each word in; the pieces hashed are short, mostly words). */
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 32);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- the object --------------------------------------------------------- */

typedef struct pair_slot {
    uint64_t key; /* left << 32 | right; EMPTY_PAIR when free */
    int32_t rank;
} pair_slot;
#define EMPTY_PAIR UINT64_MAX

/* A cached piece: its bytes at keys[key_off], its ids at ids[ids_off]. */
typedef struct cache_slot {
    uint32_t hash; /* high bits of the piece's hash; key_len 0 = free slot */
    uint32_t key_off;
    uint32_t ids_off;
    uint16_t key_len;
    uint16_t n_ids;
} cache_slot;

/* The special tokens of one matching pass. Each has a form, the bytes it
 * matches: its content, or under Llama 2's normalizer "▁" then its content
 * with every space a "▁" (what the normalizer makes of it). Ordered longest
 * form first, so the first that matches at a place is the longest there. */
typedef struct special_set {
    int32_t *ids;
    uint8_t *forms;
    size_t *form_off;
    uint32_t *form_len;
    size_t n, max_len;  /* max_len: the longest form */
    uint8_t first[256]; /* 1 when a form starts with this byte */
} special_set;

struct zpp_bpe {
    /* vocabulary: token id -> bytes; bytes -> id through an open-addressing
     * table of ids (-1 free) */
    int32_t n_ids; /* largest id + 1 */
    size_t *tok_off;
    uint32_t *tok_len; /* 0: no token has this id */
    uint8_t *tok_special;
    uint8_t *tok_strip; /* zpp_bpe_token.strip */
    int any_lstrip;
    uint8_t *tok_bytes;
    int32_t *vocab_slots;
    size_t vocab_mask;
    int32_t byte_id[256]; /* -1: none (bytes_missing) */
    int bytes_missing;
    int whole_pieces; /* zpp_bpe_desc.whole_pieces */
    /* SentencePiece-style (zpp_bpe_desc.chars; bpe.h): is_chars 0 for
     * byte-level */
    int is_chars;
    zpp_bpe_chars chars;
    /* What each token decodes to: the tok_* tables themselves for
     * byte-level; for SentencePiece-style its text ("▁" a space, "<0x41>"
     * the byte 0x41), in tables of its own. */
    const size_t *text_off;
    const uint32_t *text_len;
    const uint8_t *text_bytes;
    /* Special tokens, in Hugging Face's two passes (bpe.h, SPECIAL TOKENS
     * IN TEXT): `raw` (zpp_bpe_token.special 1) cut out of the text first,
     * `normalized` (special 2) out of what lies between. norm_text: the
     * second pass compares with the normalized text (Llama 2's normalizer,
     * ZPP_BPE_PREPEND_EVERY), else with the text itself. */
    special_set raw, normalized;
    int norm_text;
    /* zpp_bpe_desc.nfc: stretches of text are put in NFC (nfc.h) first,
     * into nfc_buf; the pieces of a stretch wait in nfc_pieces */
    int nfc;
    zpp_nfc_buf nfc_buf;
    zpp_bpe_pieces nfc_pieces;
    /* merges: (left, right) -> rank in a hash table; rank -> merged id */
    size_t n_merges;
    int32_t *merge_result;
    pair_slot *pairs;
    size_t pair_mask;
    /* the pre-tokenizer */
    pcre2_code *re;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    /* the piece cache, grown up to 2 * cache_limit slots, cleared when full */
    size_t cache_limit, cache_count, cache_mask;
    cache_slot *cache;
    uint8_t *ckeys;
    size_t ckeys_n, ckeys_cap;
    int32_t *cids;
    size_t cids_n, cids_cap;
    /* scratch of the merging: a linked list of symbols and a heap */
    size_t scratch_cap;
    int32_t *sym, *prev, *next, *prank;
    uint64_t *heap;
    uint32_t *round;
};

static zpp_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return ZPP_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory (%zu bytes)", c * elem);
    *p = q;
    *cap = c;
    return ZPP_OK;
}

int32_t zpp_bpe_find(const zpp_bpe *bpe, const void *bytes, size_t len) {
    if (!bpe || !bytes || !len) return -1;
    for (size_t i = hash_bytes(bytes, len) & bpe->vocab_mask;; i = (i + 1) & bpe->vocab_mask) {
        const int32_t id = bpe->vocab_slots[i];
        if (id < 0) return -1;
        if (bpe->tok_len[id] == len && !memcmp(bpe->tok_bytes + bpe->tok_off[id], bytes, len))
            return id;
    }
}

/* The rank of merging (left, right), or NO_RANK. */
static inline int32_t pair_rank(const zpp_bpe *bpe, int32_t left, int32_t right) {
    const uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (size_t i = hash_pair(key) & bpe->pair_mask;; i = (i + 1) & bpe->pair_mask) {
        if (bpe->pairs[i].key == key) return bpe->pairs[i].rank;
        if (bpe->pairs[i].key == EMPTY_PAIR) return NO_RANK;
    }
}

/* A token for messages: printable ASCII as is, other bytes as \xHH. */
static const char *show(const uint8_t *b, size_t n, char *buf, size_t cap) {
    size_t o = 0, i = 0;
    for (; i < n && o + 8 < cap; i++) {
        if (b[i] >= 0x20 && b[i] < 0x7F && b[i] != '"' && b[i] != '\\')
            buf[o++] = (char)b[i];
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", b[i]);
    }
    if (i < n) o += (size_t)snprintf(buf + o, cap - o, "...");
    buf[o] = 0;
    return buf;
}

void zpp_bpe_destroy(zpp_bpe *bpe) {
    if (!bpe) return;
    if (bpe->md) pcre2_match_data_free(bpe->md);
    if (bpe->mctx) pcre2_match_context_free(bpe->mctx);
    if (bpe->jit_stack) pcre2_jit_stack_free(bpe->jit_stack);
    if (bpe->re) pcre2_code_free(bpe->re);
    if (bpe->is_chars) /* (else they alias the tok_* tables) */
        free((void *)bpe->text_off), free((void *)bpe->text_len), free((void *)bpe->text_bytes);
    free(bpe->tok_off), free(bpe->tok_len), free(bpe->tok_special), free(bpe->tok_bytes);
    free(bpe->tok_strip);
    free(bpe->vocab_slots);
    zpp_nfc_free(&bpe->nfc_buf);
    free(bpe->nfc_pieces.pieces);
    special_set *sets[2] = {&bpe->raw, &bpe->normalized};
    for (int k = 0; k < 2; k++)
        free(sets[k]->ids), free(sets[k]->forms), free(sets[k]->form_off), free(sets[k]->form_len);
    free(bpe->merge_result), free(bpe->pairs);
    free(bpe->cache), free(bpe->ckeys), free(bpe->cids);
    free(bpe->sym), free(bpe->prev), free(bpe->next), free(bpe->prank);
    free(bpe->heap), free(bpe->round);
    free(bpe);
}

static zpp_status build_vocab(zpp_bpe *bpe, const zpp_bpe_desc *d) {
    char s1[96];
    int64_t max_id = -1;
    size_t total = 0;
    for (size_t i = 0; i < d->n_tokens; i++) {
        const zpp_bpe_token *t = &d->tokens[i];
        if (t->id < 0 || t->id > ZPP_BPE_MAX_ID) /* (the tables are indexed by id) */
            return zpp_error(ZPP_ERR_FORMAT, "bpe: token %zu has id %d; ids are in [0, %d]", i,
                             (int)t->id, ZPP_BPE_MAX_ID);
        if (!t->bytes || !t->len)
            return zpp_error(ZPP_ERR_FORMAT, "bpe: token %zu (id %d) is empty", i, (int)t->id);
        if (t->len > UINT32_MAX)
            return zpp_error(ZPP_ERR_FORMAT, "bpe: token id %d is %zu bytes long", (int)t->id,
                             t->len);
        if (t->id > max_id) max_id = t->id;
        total += t->len;
    }
    bpe->n_ids = (int32_t)(max_id + 1);
    const size_t n = (size_t)bpe->n_ids;
    bpe->tok_off = calloc(n ? n : 1, sizeof *bpe->tok_off);
    bpe->tok_len = calloc(n ? n : 1, sizeof *bpe->tok_len);
    bpe->tok_special = calloc(n ? n : 1, 1);
    bpe->tok_strip = calloc(n ? n : 1, 1);
    bpe->tok_bytes = malloc(total ? total : 1);
    const size_t slots = pow2_at_least(2 * d->n_tokens);
    bpe->vocab_slots = malloc(slots * sizeof *bpe->vocab_slots);
    if (!bpe->tok_off || !bpe->tok_len || !bpe->tok_special || !bpe->tok_bytes ||
        !bpe->tok_strip || !bpe->vocab_slots)
        return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for %zu tokens", d->n_tokens);
    memset(bpe->vocab_slots, 0xFF, slots * sizeof *bpe->vocab_slots);
    bpe->vocab_mask = slots - 1;
    size_t off = 0;
    for (size_t i = 0; i < d->n_tokens; i++) {
        const zpp_bpe_token *t = &d->tokens[i];
        if (bpe->tok_len[t->id])
            return zpp_error(ZPP_ERR_FORMAT, "bpe: id %d is given to two tokens, \"%s\" and another",
                             (int)t->id, show(t->bytes, t->len, s1, sizeof s1));
        /* A special token may spell an ordinary one (GPT-NeoX adds runs of
         * spaces its vocabulary holds too): it stands for those bytes only
         * where special tokens are matched, and the look-up by bytes keeps
         * the ordinary token, which merges make. Two of a kind are one too
         * many. */
        const int32_t twin = zpp_bpe_find(bpe, t->bytes, t->len);
        if (twin >= 0 && !bpe->tok_special[twin] == !t->special)
            return zpp_error(ZPP_ERR_FORMAT, "bpe: token \"%s\" is listed twice, as ids %d and %d",
                             show(t->bytes, t->len, s1, sizeof s1), (int)twin, (int)t->id);
        memcpy(bpe->tok_bytes + off, t->bytes, t->len);
        bpe->tok_off[t->id] = off;
        bpe->tok_len[t->id] = (uint32_t)t->len;
        bpe->tok_special[t->id] = t->special == 2 ? 2 : t->special ? 1 : 0;
        if (t->strip & ~(ZPP_BPE_LSTRIP | ZPP_BPE_RSTRIP) || (t->strip && t->special != 1))
            return zpp_error(ZPP_ERR_FORMAT, "bpe: token \"%s\" has strip %d; ZPP_BPE_LSTRIP and "
                             "ZPP_BPE_RSTRIP are for special tokens of kind 1",
                             show(t->bytes, t->len, s1, sizeof s1), t->strip);
        bpe->tok_strip[t->id] = (uint8_t)t->strip;
        bpe->any_lstrip |= t->strip & ZPP_BPE_LSTRIP;
        off += t->len;
        if (twin >= 0 && t->special) continue;
        size_t j = hash_bytes(t->bytes, t->len) & bpe->vocab_mask;
        while (bpe->vocab_slots[j] >= 0 && bpe->vocab_slots[j] != twin)
            j = (j + 1) & bpe->vocab_mask;
        bpe->vocab_slots[j] = t->id; /* (over a special twin's slot) */
    }
    /* Byte-level: every byte must be a token, or some text has no encoding
     * (SentencePiece-style vocabularies have byte fallback instead). But
     * for the 13 that UTF-8 never uses (0xC0, 0xC1, 0xF5..0xFF), which
     * GPT-NeoX's vocabulary lacks: text holding one is refused instead. */
    for (int b = 0; b < 256 && !d->chars; b++) {
        const uint8_t byte = (uint8_t)b;
        const int32_t id = zpp_bpe_find(bpe, &byte, 1);
        const int never_utf8 = b == 0xC0 || b == 0xC1 || b >= 0xF5;
        if (id < 0 && never_utf8) {
            bpe->byte_id[b] = -1;
            bpe->bytes_missing = 1;
            continue;
        }
        if (id < 0 || bpe->tok_special[id])
            return zpp_error(ZPP_ERR_FORMAT,
                             "bpe: byte 0x%02X has no %stoken; a byte-level vocabulary holds all "
                             "256 single bytes (all but those UTF-8 never uses)",
                             b, id < 0 ? "" : "ordinary ");
        bpe->byte_id[b] = id;
    }
    return ZPP_OK;
}

static zpp_status build_merges(zpp_bpe *bpe, const zpp_bpe_desc *d) {
    char s1[96], s2[96];
    if (d->n_merges >= (size_t)INT32_MAX)
        return zpp_error(ZPP_ERR_FORMAT, "bpe: %zu merges; at most %d", d->n_merges, INT32_MAX - 1);
    bpe->n_merges = d->n_merges;
    const size_t slots = pow2_at_least(2 * d->n_merges);
    bpe->pairs = malloc(slots * sizeof *bpe->pairs);
    bpe->merge_result = malloc((d->n_merges ? d->n_merges : 1) * sizeof *bpe->merge_result);
    uint8_t *cat = NULL;
    size_t cat_cap = 0;
    if (!bpe->pairs || !bpe->merge_result)
        return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for %zu merges", d->n_merges);
    for (size_t i = 0; i < slots; i++) bpe->pairs[i].key = EMPTY_PAIR;
    bpe->pair_mask = slots - 1;
    zpp_status st = ZPP_OK;
    for (size_t r = 0; r < d->n_merges && st == ZPP_OK; r++) {
        const int32_t parts[2] = {d->merges[r].left, d->merges[r].right};
        for (int k = 0; k < 2 && st == ZPP_OK; k++) {
            const int32_t id = parts[k];
            if (id < 0 || id >= bpe->n_ids || !bpe->tok_len[id])
                st = zpp_error(ZPP_ERR_FORMAT, "bpe: merge %zu names id %d, which is no token", r,
                               (int)id);
            else if (bpe->tok_special[id])
                st = zpp_error(ZPP_ERR_FORMAT,
                               "bpe: merge %zu names the special token \"%s\"; merges never "
                               "touch special tokens",
                               r, show(bpe->tok_bytes + bpe->tok_off[id], bpe->tok_len[id], s1,
                                       sizeof s1));
        }
        if (st != ZPP_OK) break;
        const int32_t L = parts[0], R = parts[1];
        const uint8_t *lb = bpe->tok_bytes + bpe->tok_off[L], *rb = bpe->tok_bytes + bpe->tok_off[R];
        const size_t ll = bpe->tok_len[L], rl = bpe->tok_len[R];
        st = grow((void **)&cat, &cat_cap, ll + rl, 1);
        if (st != ZPP_OK) break;
        memcpy(cat, lb, ll);
        memcpy(cat + ll, rb, rl);
        const int32_t result = zpp_bpe_find(bpe, cat, ll + rl);
        if (result < 0 || bpe->tok_special[result]) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "bpe: merge %zu (\"%s\" + \"%s\") makes a token that is %s; every "
                           "merge's result must be an ordinary vocabulary entry",
                           r, show(lb, ll, s1, sizeof s1), show(rb, rl, s2, sizeof s2),
                           result < 0 ? "not in the vocabulary" : "a special token");
            break;
        }
        const uint64_t key = (uint64_t)(uint32_t)L << 32 | (uint32_t)R;
        size_t j = hash_pair(key) & bpe->pair_mask;
        for (; bpe->pairs[j].key != EMPTY_PAIR; j = (j + 1) & bpe->pair_mask)
            if (bpe->pairs[j].key == key) break;
        if (bpe->pairs[j].key == key) {
            st = zpp_error(ZPP_ERR_FORMAT, "bpe: merge %zu (\"%s\" + \"%s\") repeats merge %d", r,
                           show(lb, ll, s1, sizeof s1), show(rb, rl, s2, sizeof s2),
                           (int)bpe->pairs[j].rank);
            break;
        }
        bpe->pairs[j].key = key;
        bpe->pairs[j].rank = (int32_t)r;
        bpe->merge_result[r] = result;
    }
    free(cat);
    return st;
}

static zpp_status build_regex(zpp_bpe *bpe, const char *pattern) {
    int err = 0;
    PCRE2_SIZE at = 0;
    bpe->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!bpe->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return zpp_error(ZPP_ERR_FORMAT, "bpe: the pre-tokenization regex does not compile: %s "
                         "(at offset %zu of \"%s\")", (const char *)msg, (size_t)at, pattern);
    }
    /* JIT code when the platform has it (several times faster); the
     * interpreter otherwise. Both modes we match in are compiled. */
    (void)pcre2_jit_compile(bpe->re, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    bpe->md = pcre2_match_data_create_from_pattern(bpe->re, NULL);
    bpe->mctx = pcre2_match_context_create(NULL);
    /* A long run of whitespace backtracks over its length: give the JIT
     * room beyond its 32 KiB default. */
    bpe->jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
    if (!bpe->md || !bpe->mctx || !bpe->jit_stack)
        return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for the regex");
    pcre2_jit_stack_assign(bpe->mctx, NULL, bpe->jit_stack);
    return ZPP_OK;
}

/* 1 when `id` is a token and not a special one. */
static int is_ordinary(const zpp_bpe *bpe, int32_t id) {
    return id >= 0 && id < bpe->n_ids && bpe->tok_len[id] && !bpe->tok_special[id];
}

/* A token's text, SentencePiece-style: a byte token its byte, a special
 * token its content, any other its bytes with each "▁" a space. */
static size_t token_text(const zpp_bpe *bpe, int32_t id, const uint8_t *byte_of, uint8_t *out) {
    const uint8_t *b = bpe->tok_bytes + bpe->tok_off[id];
    const size_t n = bpe->tok_len[id];
    if (byte_of[id >> 3] & (1u << (id & 7))) { /* one of "<0x00>".."<0xFF>" */
        for (int k = 0; k < 256; k++)
            if (bpe->chars.byte_tokens[k] == id) out[0] = (uint8_t)k;
        return 1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (!bpe->tok_special[id] && i + 3 <= n && !memcmp(b + i, ZPP_BPE_SPACE, 3)) {
            out[o++] = ' ';
            i += 2;
        } else {
            out[o++] = b[i];
        }
    }
    return o;
}

/* desc->chars: checks it and builds the tables of what tokens decode to. */
static zpp_status build_chars(zpp_bpe *bpe, const zpp_bpe_desc *d) {
    const zpp_bpe_chars *c = d->chars;
    if (d->pattern || d->whole_pieces)
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_create: a SentencePiece-style tokenizer (chars) "
                         "has no pattern and no whole_pieces; it splits at spaces");
    if (c->prepend < ZPP_BPE_PREPEND_NEVER || c->prepend > ZPP_BPE_PREPEND_EVERY ||
        (c->prepend == ZPP_BPE_PREPEND_EVERY && c->split))
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_create: chars.prepend %d%s is not one of "
                         "zpp_bpe_prepend", (int)c->prepend,
                         c->split ? " with split (EVERY is for unsplit text)" : "");
    bpe->is_chars = 1;
    bpe->chars = *c;
    if (c->unk >= 0 && (c->unk >= bpe->n_ids || !bpe->tok_len[c->unk]))
        return zpp_error(ZPP_ERR_FORMAT, "bpe: the unknown token's id %d is no token", (int)c->unk);
    const size_t n = (size_t)bpe->n_ids;
    uint8_t *byte_of = calloc(n / 8 + 1, 1); /* a bit per id: a byte token */
    if (!byte_of) return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory");
    for (int k = 0; k < 256 && c->byte_fallback; k++) {
        const int32_t id = c->byte_tokens[k];
        if (!is_ordinary(bpe, id)) {
            free(byte_of);
            return zpp_error(ZPP_ERR_FORMAT, "bpe: the byte token <0x%02X> (id %d) is no ordinary "
                             "token; byte fallback needs all 256", k, (int)id);
        }
        byte_of[id >> 3] |= (uint8_t)(1u << (id & 7));
    }
    size_t total = 0; /* a text is never longer than the token ("▁" -> " ") */
    for (size_t id = 0; id < n; id++) total += bpe->tok_len[id];
    size_t *off = calloc(n ? n : 1, sizeof *off);
    uint32_t *len = calloc(n ? n : 1, sizeof *len);
    uint8_t *bytes = malloc(total ? total : 1);
    bpe->text_off = off, bpe->text_len = len, bpe->text_bytes = bytes;
    if (!off || !len || !bytes) {
        free(byte_of);
        return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for the tokens' text");
    }
    size_t o = 0;
    for (size_t id = 0; id < n; id++) {
        if (!bpe->tok_len[id]) continue;
        off[id] = o;
        len[id] = (uint32_t)token_text(bpe, (int32_t)id, byte_of, bytes + o);
        o += len[id];
    }
    free(byte_of);
    return ZPP_OK;
}

/* How a set's forms are made from the tokens' content. */
typedef enum form_kind {
    FORM_AS_IS,   /* the content */
    FORM_LLAMA2,  /* "▁" then the content with every space a "▁" (Llama 2's
                   * normalizer: Prepend, Replace) */
    FORM_NFC,     /* the content in NFC */
} form_kind;

/* The special tokens whose tok_special is `which` -> *set, each with its
 * form (special_set) of kind `kind`. */
static zpp_status build_special_set(zpp_bpe *bpe, special_set *set, int which, form_kind kind) {
    static const uint8_t mark[3] = {0xE2, 0x96, 0x81}; /* ZPP_BPE_SPACE */
    const int normalize = kind == FORM_LLAMA2;
    size_t n = 0, bytes = 0;
    for (int32_t id = 0; id < bpe->n_ids; id++)
        if (bpe->tok_special[id] == which) n++, bytes += 3 + 3 * (size_t)bpe->tok_len[id];
    set->ids = malloc((n ? n : 1) * sizeof *set->ids);
    set->forms = malloc(bytes ? bytes : 1);
    set->form_off = malloc((n ? n : 1) * sizeof *set->form_off);
    set->form_len = malloc((n ? n : 1) * sizeof *set->form_len);
    if (!set->ids || !set->forms || !set->form_off || !set->form_len)
        return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for %zu special tokens", n);
    size_t o = 0;
    for (int32_t id = 0; id < bpe->n_ids; id++) {
        if (bpe->tok_special[id] != which) continue;
        const uint8_t *c = bpe->tok_bytes + bpe->tok_off[id];
        size_t c_len = bpe->tok_len[id];
        if (kind == FORM_NFC) { /* (NFC makes no text more than 3 times longer) */
            ZPP_CHECK(zpp_nfc(c, c_len, &bpe->nfc_buf));
            c = bpe->nfc_buf.text, c_len = bpe->nfc_buf.n;
        }
        const size_t start = o;
        if (normalize) memcpy(set->forms + o, mark, 3), o += 3;
        for (size_t i = 0; i < c_len; i++) {
            if (normalize && c[i] == ' ') memcpy(set->forms + o, mark, 3), o += 3;
            else set->forms[o++] = c[i];
        }
        /* Longest first (insertion sort: special tokens are few). */
        const uint32_t len = (uint32_t)(o - start);
        size_t k = set->n++;
        for (; k > 0 && set->form_len[k - 1] < len; k--) {
            set->ids[k] = set->ids[k - 1];
            set->form_off[k] = set->form_off[k - 1];
            set->form_len[k] = set->form_len[k - 1];
        }
        set->ids[k] = id, set->form_off[k] = start, set->form_len[k] = len;
        set->first[set->forms[start]] = 1;
        if (len > set->max_len) set->max_len = len;
    }
    return ZPP_OK;
}

/* Both passes' sets; after build_chars, which says whether the text is
 * normalized. */
static zpp_status build_specials(zpp_bpe *bpe) {
    bpe->norm_text = bpe->is_chars && bpe->chars.prepend == ZPP_BPE_PREPEND_EVERY;
    ZPP_CHECK(build_special_set(bpe, &bpe->raw, 1, FORM_AS_IS));
    return build_special_set(bpe, &bpe->normalized, 2,
                             bpe->norm_text ? FORM_LLAMA2 : bpe->nfc ? FORM_NFC : FORM_AS_IS);
}

zpp_status zpp_bpe_create(const zpp_bpe_desc *desc, zpp_bpe **bpe_p) {
    if (!desc || !bpe_p || (desc->n_tokens && !desc->tokens) || (desc->n_merges && !desc->merges))
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_create: NULL argument");
    if (desc->cache_pieces > ZPP_BPE_CACHE_MAX)
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_create: cache of %zu pieces; at most %u",
                         desc->cache_pieces, ZPP_BPE_CACHE_MAX);
    zpp_bpe *bpe = calloc(1, sizeof *bpe);
    if (!bpe) return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory");
    bpe->cache_limit = desc->cache_pieces ? desc->cache_pieces : ZPP_BPE_CACHE_DEFAULT;
    bpe->whole_pieces = desc->whole_pieces ? 1 : 0;
    bpe->nfc = desc->nfc ? 1 : 0;
    zpp_status st = build_vocab(bpe, desc);
    if (st == ZPP_OK) st = build_merges(bpe, desc);
    if (st == ZPP_OK && desc->chars) st = build_chars(bpe, desc);
    if (st == ZPP_OK && desc->chars && desc->nfc)
        st = zpp_error(ZPP_ERR_INVALID, "zpp_bpe_create: nfc is for byte-level tokenizers (chars "
                       "is NULL)");
    if (st == ZPP_OK) st = build_specials(bpe);
    if (st == ZPP_OK && desc->pattern) st = build_regex(bpe, desc->pattern);
    if (st == ZPP_OK && !bpe->is_chars) /* byte-level tokens decode to their bytes */
        bpe->text_off = bpe->tok_off, bpe->text_len = bpe->tok_len, bpe->text_bytes = bpe->tok_bytes;
    if (st != ZPP_OK) {
        zpp_bpe_destroy(bpe);
        return st;
    }
    *bpe_p = bpe;
    return ZPP_OK;
}

int32_t zpp_bpe_vocab_size(const zpp_bpe *bpe) { return bpe ? bpe->n_ids : 0; }
size_t zpp_bpe_merge_count(const zpp_bpe *bpe) { return bpe ? bpe->n_merges : 0; }

const uint8_t *zpp_bpe_token_bytes(const zpp_bpe *bpe, int32_t id, size_t *len_p) {
    if (!bpe || id < 0 || id >= bpe->n_ids || !bpe->tok_len[id]) return NULL;
    if (len_p) *len_p = bpe->text_len[id];
    return bpe->text_bytes + bpe->text_off[id];
}

/* ---- the piece cache ---------------------------------------------------- */

static void cache_clear(zpp_bpe *bpe) {
    if (bpe->cache) memset(bpe->cache, 0, (bpe->cache_mask + 1) * sizeof *bpe->cache);
    bpe->cache_count = bpe->ckeys_n = bpe->cids_n = 0;
}

zpp_status zpp_bpe_set_cache(zpp_bpe *bpe, size_t pieces) {
    if (!bpe) return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_set_cache: NULL tokenizer");
    if (pieces > ZPP_BPE_CACHE_MAX)
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_set_cache: %zu pieces; at most %u", pieces,
                         ZPP_BPE_CACHE_MAX);
    free(bpe->cache);
    bpe->cache = NULL;
    bpe->cache_mask = 0;
    bpe->cache_limit = pieces;
    cache_clear(bpe);
    return ZPP_OK;
}

/* The cached ids of a piece (NULL if not cached). */
static const int32_t *cache_get(const zpp_bpe *bpe, const uint8_t *p, size_t n, uint64_t h,
                                size_t *n_ids_p) {
    if (!bpe->cache) return NULL;
    const uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & bpe->cache_mask;; i = (i + 1) & bpe->cache_mask) {
        const cache_slot *s = &bpe->cache[i];
        if (!s->key_len) return NULL;
        if (s->hash == tag && s->key_len == n && !memcmp(bpe->ckeys + s->key_off, p, n)) {
            *n_ids_p = s->n_ids;
            return bpe->cids + s->ids_off;
        }
    }
}

static void cache_insert(zpp_bpe *bpe, const uint8_t *p, size_t n, uint64_t h,
                         const int32_t *ids, size_t n_ids) {
    if (bpe->cache_count >= bpe->cache_limit) cache_clear(bpe); /* full: start again */
    /* The table doubles up to twice the limit, so probes stay short. */
    if (2 * (bpe->cache_count + 1) > (bpe->cache ? bpe->cache_mask + 1 : 0)) {
        const size_t cap = bpe->cache ? 2 * (bpe->cache_mask + 1) : 1024;
        cache_slot *t = calloc(cap, sizeof *t);
        if (!t) return; /* a cache that cannot grow just stops remembering */
        for (size_t i = 0; bpe->cache && i <= bpe->cache_mask; i++) {
            const cache_slot *s = &bpe->cache[i];
            if (!s->key_len) continue;
            const uint64_t hh = hash_bytes(bpe->ckeys + s->key_off, s->key_len);
            size_t j = hh & (cap - 1);
            while (t[j].key_len) j = (j + 1) & (cap - 1);
            t[j] = *s;
        }
        free(bpe->cache);
        bpe->cache = t;
        bpe->cache_mask = cap - 1;
    }
    if (grow((void **)&bpe->ckeys, &bpe->ckeys_cap, bpe->ckeys_n + n, 1) != ZPP_OK ||
        grow((void **)&bpe->cids, &bpe->cids_cap, bpe->cids_n + n_ids, sizeof *bpe->cids) != ZPP_OK) {
        zpp_error_clear(); /* not an error of the caller's: just do not remember */
        return;
    }
    size_t i = h & bpe->cache_mask;
    while (bpe->cache[i].key_len) i = (i + 1) & bpe->cache_mask;
    cache_slot *s = &bpe->cache[i];
    s->hash = (uint32_t)(h >> 32);
    s->key_off = (uint32_t)bpe->ckeys_n;
    s->ids_off = (uint32_t)bpe->cids_n;
    s->key_len = (uint16_t)n;
    s->n_ids = (uint16_t)n_ids;
    memcpy(bpe->ckeys + bpe->ckeys_n, p, n);
    memcpy(bpe->cids + bpe->cids_n, ids, n_ids * sizeof *ids);
    bpe->ckeys_n += n;
    bpe->cids_n += n_ids;
    bpe->cache_count++;
}

/* ---- merging one piece -------------------------------------------------- */

/* Binary min-heap of (rank << 32 | position): ties in rank pop left to right. */
static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (h[parent] <= v) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
    const uint64_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static zpp_status ensure_scratch(zpp_bpe *bpe, size_t n) {
    if (n <= bpe->scratch_cap) return ZPP_OK;
    size_t c = bpe->scratch_cap ? bpe->scratch_cap : 64;
    while (c < n) c *= 2;
    int32_t **lists[4] = {&bpe->sym, &bpe->prev, &bpe->next, &bpe->prank};
    for (int k = 0; k < 4; k++) {
        int32_t *q = realloc(*lists[k], c * sizeof *q);
        if (!q) return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes", n);
        *lists[k] = q;
    }
    /* a heap entry per pair at the start, two more per merge, at most */
    uint64_t *h = realloc(bpe->heap, 3 * c * sizeof *h);
    if (h) bpe->heap = h;
    uint32_t *r = h ? realloc(bpe->round, c * sizeof *r) : NULL;
    if (!r) return zpp_error(ZPP_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes", n);
    bpe->round = r;
    bpe->scratch_cap = c;
    return ZPP_OK;
}

/* Sets prank[i] to the rank of the pair starting at symbol i and queues it. */
static inline void queue_pair(zpp_bpe *bpe, int32_t i, size_t *hn) {
    const int32_t j = bpe->next[i];
    const int32_t r = j < 0 ? NO_RANK : pair_rank(bpe, bpe->sym[i], bpe->sym[j]);
    bpe->prank[i] = r;
    if (r != NO_RANK) heap_push(bpe->heap, hn, (uint64_t)(uint32_t)r << 32 | (uint32_t)i);
}

/* Merges the piece's n >= 1 symbols sym[0, n); appends the final ones to
 * out.
 *
 * Symbols form a linked list indexed by their first symbol's position
 * (a merge keeps the left symbol's index and unlinks the right one).
 * prank[i] is the rank of the pair (symbol i, its successor), NO_RANK for
 * none or for an unlinked symbol; the heap holds (rank, i) entries, some
 * stale: an entry is live when prank[i] still equals its rank, because a
 * rank names one pair and a symbol only ever grows, so a pair that has
 * gone never comes back at the same place.
 *
 * One round is GPT-2's one pass: take every entry of the lowest rank r
 * (they come out left to right), and merge those still live. A merge in the
 * round can only kill an entry to its right (its own right neighbour's, as
 * in "a a a"), and the pairs it creates contain the new symbol, so none of
 * them is r's pair (the new symbol is longer than either part): the round
 * merges exactly the occurrences GPT-2's left-to-right pass does. */
static zpp_status merge_symbols(zpp_bpe *bpe, size_t n, zpp_bpe_ids *out) {
    int32_t *sym = bpe->sym, *prev = bpe->prev, *next = bpe->next, *prank = bpe->prank;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i < n; i++) queue_pair(bpe, (int32_t)i, &hn);
    size_t n_sym = n;
    while (hn) {
        const uint32_t r = (uint32_t)(bpe->heap[0] >> 32);
        size_t m = 0;
        while (hn && (uint32_t)(bpe->heap[0] >> 32) == r)
            bpe->round[m++] = (uint32_t)heap_pop(bpe->heap, &hn);
        for (size_t k = 0; k < m; k++) {
            const int32_t i = (int32_t)bpe->round[k];
            if (prank[i] != (int32_t)r) continue; /* stale */
            const int32_t j = next[i], after = next[j];
            sym[i] = bpe->merge_result[r];
            next[i] = after;
            if (after >= 0) prev[after] = i;
            prank[j] = NO_RANK; /* unlinked */
            n_sym--;
            if (prev[i] >= 0) queue_pair(bpe, prev[i], &hn);
            queue_pair(bpe, i, &hn);
        }
    }
    ZPP_CHECK(grow((void **)&out->ids, &out->cap, out->n + n_sym, sizeof *out->ids));
    for (int32_t i = 0; i >= 0; i = next[i]) out->ids[out->n++] = sym[i];
    return ZPP_OK;
}

/* The cached ids of piece p[0, n) (hash h) appended to out, *hit 1; *hit 0
 * when the piece is not in the cache. */
static zpp_status cache_append(zpp_bpe *bpe, const uint8_t *p, size_t n, uint64_t h,
                               zpp_bpe_ids *out, int *hit) {
    size_t k = 0;
    const int32_t *ids = cache_get(bpe, p, n, h, &k);
    *hit = ids != NULL;
    if (!ids) return ZPP_OK;
    ZPP_CHECK(grow((void **)&out->ids, &out->cap, out->n + k, sizeof *out->ids));
    memcpy(out->ids + out->n, ids, k * sizeof *ids);
    out->n += k;
    return ZPP_OK;
}

/* With bytes_missing: ZPP_ERR_INVALID when p[0, n) holds a byte with no
 * token. */
static zpp_status check_bytes(const zpp_bpe *bpe, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n && bpe->bytes_missing; i++)
        if (bpe->byte_id[p[i]] < 0)
            return zpp_error(ZPP_ERR_INVALID,
                             "bpe: the text holds the byte 0x%02X, which UTF-8 never uses and "
                             "this tokenizer has no token for; give it UTF-8 text",
                             p[i]);
    return ZPP_OK;
}

/* Merges a byte-level piece of n >= 2 bytes: one symbol a byte. */
static zpp_status merge_piece(zpp_bpe *bpe, const uint8_t *p, size_t n, zpp_bpe_ids *out) {
    if (n >= (size_t)INT32_MAX)
        return zpp_error(ZPP_ERR_INVALID,
                         "bpe: a piece of %zu bytes (one run of letters, digits, symbols or "
                         "whitespace) is too long to merge; split the text",
                         n);
    ZPP_CHECK(check_bytes(bpe, p, n));
    ZPP_CHECK(ensure_scratch(bpe, n));
    for (size_t i = 0; i < n; i++) bpe->sym[i] = bpe->byte_id[p[i]];
    return merge_symbols(bpe, n, out);
}

static zpp_status encode_piece(zpp_bpe *bpe, const uint8_t *p, size_t n, zpp_bpe_ids *out) {
    if (n == 1) {
        ZPP_CHECK(check_bytes(bpe, p, 1));
        ZPP_CHECK(grow((void **)&out->ids, &out->cap, out->n + 1, sizeof *out->ids));
        out->ids[out->n++] = bpe->byte_id[p[0]];
        return ZPP_OK;
    }
    if (bpe->whole_pieces) { /* a piece that is a token is that token */
        const int32_t id = zpp_bpe_find(bpe, p, n);
        if (id >= 0 && !bpe->tok_special[id]) {
            ZPP_CHECK(grow((void **)&out->ids, &out->cap, out->n + 1, sizeof *out->ids));
            out->ids[out->n++] = id;
            return ZPP_OK;
        }
    }
    const int cacheable = bpe->cache_limit && n <= CACHE_MAX_PIECE;
    uint64_t h = 0;
    if (cacheable) {
        h = hash_bytes(p, n);
        int hit = 0;
        ZPP_CHECK(cache_append(bpe, p, n, h, out, &hit));
        if (hit) return ZPP_OK;
    }
    const size_t first = out->n;
    ZPP_CHECK(merge_piece(bpe, p, n, out));
    if (cacheable) cache_insert(bpe, p, n, h, out->ids + first, out->n - first);
    return ZPP_OK;
}

/* ---- SentencePiece-style pieces (bpe.h, zpp_bpe_chars) ------------------ */

/* The length of the UTF-8 character at p[0, n): 2 to 4 for a well-formed
 * sequence (no overlong form, surrogate or code point past U+10FFFF), else
 * 1 (ASCII, or a byte that is not UTF-8, which counts as a character). */
static size_t utf8_char_len(const uint8_t *p, size_t n) {
    uint32_t cp;
    const size_t len = zpp_utf8_decode(p, n, &cp);
    return len ? len : 1;
}

/* Appends the initial symbols of one character c[0, k) at sym[*m]: its
 * token; else its bytes' tokens (byte fallback); else the unknown token,
 * once for a run of them with fuse_unk (*unk_run: the last symbol was one). */
static zpp_status push_char(zpp_bpe *bpe, const uint8_t *c, size_t k, size_t *m, int *unk_run) {
    const int32_t id = zpp_bpe_find(bpe, c, k);
    if (id >= 0 && !bpe->tok_special[id]) {
        bpe->sym[(*m)++] = id;
        *unk_run = 0;
        return ZPP_OK;
    }
    if (bpe->chars.byte_fallback) {
        for (size_t i = 0; i < k; i++) bpe->sym[(*m)++] = bpe->chars.byte_tokens[c[i]];
        *unk_run = 0;
        return ZPP_OK;
    }
    if (bpe->chars.unk < 0) {
        char shown[32];
        return zpp_error(ZPP_ERR_INVALID,
                         "bpe: the character \"%s\" has no token, and the tokenizer has neither "
                         "byte fallback nor an unknown token to write it with",
                         show(c, k, shown, sizeof shown));
    }
    if (!(bpe->chars.fuse_unk && *unk_run)) bpe->sym[(*m)++] = bpe->chars.unk;
    *unk_run = 1;
    return ZPP_OK;
}

/* Encodes a piece p[0, n) of a segment, with a "▁" in front when
 * `prefixed`: one symbol a character (a space is "▁"), then the merges. */
static zpp_status encode_chars(zpp_bpe *bpe, const uint8_t *p, size_t n, int prefixed,
                               zpp_bpe_ids *out) {
    static const uint8_t space[3] = {0xE2, 0x96, 0x81}; /* ZPP_BPE_SPACE */
    if (n >= (size_t)INT32_MAX / 4)
        return zpp_error(ZPP_ERR_INVALID,
                         "bpe: a piece of %zu bytes is too long to merge; split the text (its "
                         "tokenizer does not split at spaces)",
                         n);
    /* (a prefixed piece is not cached: its key would be its bytes alone) */
    const int cacheable = bpe->cache_limit && n <= CACHE_MAX_PIECE && !prefixed;
    uint64_t h = 0;
    if (cacheable) {
        h = hash_bytes(p, n);
        int hit = 0;
        ZPP_CHECK(cache_append(bpe, p, n, h, out, &hit));
        if (hit) return ZPP_OK;
    }
    /* at most 3 symbols a byte (a space's "▁" in byte tokens), 3 more for
     * the prefix */
    ZPP_CHECK(ensure_scratch(bpe, 3 * n + 3));
    size_t m = 0;
    int unk_run = 0;
    if (prefixed) ZPP_CHECK(push_char(bpe, space, 3, &m, &unk_run));
    for (size_t i = 0; i < n;) {
        const size_t k = p[i] == ' ' ? 1 : utf8_char_len(p + i, n - i);
        ZPP_CHECK(p[i] == ' ' ? push_char(bpe, space, 3, &m, &unk_run)
                              : push_char(bpe, p + i, k, &m, &unk_run));
        i += k;
    }
    const size_t first = out->n;
    if (m) ZPP_CHECK(merge_symbols(bpe, m, out));
    if (cacheable) cache_insert(bpe, p, n, h, out->ids + first, out->n - first);
    return ZPP_OK;
}

/* ---- pre-tokenization --------------------------------------------------- */

/* A piece: `bytes`, n of them, what its tokens encode; [start, start +
 * len) where it lies in the caller's text (the same bytes, but for text
 * the tokenizer's normalizer changed); special: the special token's id, or
 * -1; prefixed: a SentencePiece-style piece that gets a "▁" in front. */
typedef zpp_status (*piece_fn)(void *ctx, const uint8_t *bytes, size_t n, size_t start,
                               size_t len, int32_t special, int prefixed);

/* A piece of text[start, start + len) as it stands. */
static inline zpp_status emit(piece_fn fn, void *ctx, const uint8_t *text, size_t start, size_t len,
                              int32_t special, int prefixed) {
    return fn(ctx, text + start, len, start, len, special, prefixed);
}

/* The end of the last complete UTF-8 character of t[0, n): a lead byte in
 * the last three whose sequence runs past n is held back (its character
 * may be completed by the text that follows). */
static size_t complete_utf8_end(const uint8_t *t, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const uint8_t c = t[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        return zpp_utf8_need(c) > k ? n - k : n;
    }
    return n;
}

/* Cuts text[a, b) (ordinary text: no special token inside) into pieces.
 * Final: all of it, *done_p = b. Partial: the pieces that more text after b
 * cannot change; *done_p = where they end. The regex sees [a, b) alone. */
static zpp_status split_text(zpp_bpe *bpe, const uint8_t *text, size_t a, size_t b, int partial,
                             piece_fn fn, void *ctx, size_t *done_p) {
    if (a == b) {
        *done_p = b;
        return ZPP_OK;
    }
    if (!bpe->re) { /* no pattern: the text is one piece, final only at its end */
        if (partial) {
            *done_p = a;
            return ZPP_OK;
        }
        *done_p = b;
        return emit(fn, ctx, text, a, b - a, -1, 0);
    }
    const uint8_t *subject = text + a;
    const size_t len = partial ? complete_utf8_end(subject, b - a) : b - a;
    const uint32_t opts = PCRE2_NOTEMPTY | (partial ? PCRE2_PARTIAL_HARD : 0);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(bpe->md);
    size_t s = 0;
    while (s < len) {
        const int rc = pcre2_match(bpe->re, subject, len, s, opts, bpe->md, bpe->mctx);
        if (rc >= 0) {
            const size_t ms = ov[0], me = ov[1];
            /* bytes no match covers (invalid UTF-8) are a piece of their own */
            if (ms > s) ZPP_CHECK(emit(fn, ctx, text, a + s, ms - s, -1, 0));
            ZPP_CHECK(emit(fn, ctx, text, a + ms, me - ms, -1, 0));
            s = me;
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            /* No match starts anywhere in [s, len): final, the rest is one
             * piece; partial, more text could still extend it. */
            if (partial) break;
            ZPP_CHECK(emit(fn, ctx, text, a + s, len - s, -1, 0));
            s = len;
            break;
        }
        if (rc == PCRE2_ERROR_PARTIAL) break; /* a piece reaching the end: not final */
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return zpp_error(ZPP_ERR_INVALID,
                         "bpe: the pre-tokenization regex failed at byte %zu of a %zu-byte "
                         "text: %s",
                         a + s, b - a, (const char *)msg);
    }
    if (!partial && s < b - a) ZPP_CHECK(emit(fn, ctx, text, a + s, b - a - s, -1, 0));
    *done_p = partial ? a + s : b;
    return ZPP_OK;
}

/* 1 when text[i, b) starts with a space, ' ' or "▁". */
static int space_at(const uint8_t *t, size_t i, size_t b) {
    return t[i] == ' ' || (b - i >= 3 && !memcmp(t + i, ZPP_BPE_SPACE, 3));
}

/* Cuts a SentencePiece-style segment text[a, b) (no special token inside)
 * into pieces: the whole, or with chars.split a piece starting at each
 * space (Metaspace's split, "MergedWithNext": the "▁" begins the piece).
 * The first piece is prefixed as chars.prepend says; at_start: the segment
 * begins the text. Partial: the last piece is held back (more text may
 * lengthen it). */
static zpp_status split_spaces(zpp_bpe *bpe, const uint8_t *text, size_t a, size_t b, int partial,
                               int at_start, piece_fn fn, void *ctx, size_t *done_p) {
    if (a == b) {
        *done_p = b;
        return ZPP_OK;
    }
    const zpp_bpe_prepend pp = bpe->chars.prepend;
    const int spaced = space_at(text, a, b);
    int prefixed = pp == ZPP_BPE_PREPEND_EVERY ||
                   (!spaced && (pp == ZPP_BPE_PREPEND_ALWAYS || (pp == ZPP_BPE_PREPEND_FIRST && at_start)));
    size_t start = a;
    for (size_t i = a + 1; bpe->chars.split && i < b; i++)
        if (space_at(text, i, b)) {
            ZPP_CHECK(emit(fn, ctx, text, start, i - start, -1, prefixed));
            prefixed = 0;
            start = i;
        }
    *done_p = partial ? start : b;
    return partial ? ZPP_OK : emit(fn, ctx, text, start, b - start, -1, prefixed);
}

/* One segment of ordinary text, as the tokenizer's kind cuts it. */
static zpp_status split_segment(zpp_bpe *bpe, const uint8_t *text, size_t a, size_t b, int partial,
                                int at_start, piece_fn fn, void *ctx, size_t *done_p) {
    if (bpe->is_chars) return split_spaces(bpe, text, a, b, partial, at_start, fn, ctx, done_p);
    return split_text(bpe, text, a, b, partial, fn, ctx, done_p);
}

/* ---- special tokens ----------------------------------------------------- */

/* What a scan of one text carries down its passes. */
typedef struct scan_ctx {
    zpp_bpe *bpe;
    const uint8_t *text;
    int continued; /* ZPP_BPE_CONTINUED: text[0] does not start the text */
    piece_fn fn;
    void *ctx;
} scan_ctx;

/* The index in `set` of the token whose form is at text[i, end) (the
 * longest that fits), or -1; forms compared byte for byte. */
static int32_t special_at(const special_set *set, const uint8_t *text, size_t i, size_t end) {
    for (size_t k = 0; k < set->n; k++) {
        const size_t n = set->form_len[k];
        if (n <= end - i && !memcmp(text + i, set->forms + set->form_off[k], n)) return (int32_t)k;
    }
    return -1;
}

/* The first i in [from, end) where text[i, end) could be the start of a
 * form longer than what is there (partial mode holds text back from
 * there), or end. */
static size_t special_prefix_at(const special_set *set, const uint8_t *text, size_t from,
                                size_t end) {
    const size_t lo = end > set->max_len ? end - set->max_len + 1 : 0;
    for (size_t i = from > lo ? from : lo; i < end; i++) {
        if (!set->first[text[i]]) continue;
        for (size_t k = 0; k < set->n; k++)
            if (set->form_len[k] > end - i &&
                !memcmp(text + i, set->forms + set->form_off[k], end - i))
                return i;
    }
    return end;
}

/* Unicode's White_Space characters (as Rust's char::is_whitespace, which
 * Hugging Face's lstrip and rstrip use): the byte length of the one at
 * p[0, n); 0 if there is none; -1 if p[0, n) is cut off where it could
 * still begin one (n may grow: partial text), or n is 0. */
static int white_at(const uint8_t *p, size_t n) {
    static const char *const wide[] = {
        "\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82",
        "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87",
        "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9",
        "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
    if (!n) return -1;
    if (p[0] == ' ' || (p[0] >= '\t' && p[0] <= '\r')) return 1;
    if (p[0] < 0xC2) return 0;
    int cut = 0;
    for (size_t k = 0; k < sizeof wide / sizeof *wide; k++) {
        const size_t len = strlen(wide[k]);
        if (n >= len && !memcmp(p, wide[k], len)) return (int)len;
        if (n < len && !memcmp(p, wide[k], n)) cut = 1;
    }
    return cut ? -1 : 0;
}

/* The byte length of the White_Space character that ends at text[i], not
 * starting before `lo`; or 0. */
static size_t white_before(const uint8_t *text, size_t lo, size_t i) {
    for (size_t len = 1; len <= 3 && len <= i - lo; len++)
        if (white_at(text + i - len, len) == (int)len) return len;
    return 0;
}

/* One pass: the tokens of `set` cut out of text[a, b), leftmost first,
 * longest at one place; `between` gets the text around them. Partial: what
 * could still become a token (or a longer one) once more text comes is
 * held back, and `between` is told the last stretch is partial. */
typedef zpp_status (*between_fn)(const scan_ctx *s, size_t a, size_t b, int partial,
                                 size_t *done_p);
static zpp_status cut_specials(const scan_ctx *s, const special_set *set, size_t a, size_t b,
                               int partial, between_fn between, size_t *done_p) {
    const uint8_t *text = s->text;
    const zpp_bpe *bpe = s->bpe;
    size_t pos = a;
    while (pos < b) {
        size_t q = b;
        int32_t k = -1; /* the token found at q: set->ids[k] */
        for (size_t i = pos; i < b; i++)
            if (set->first[text[i]] && (k = special_at(set, text, i, b)) >= 0) {
                q = i;
                break;
            }
        const int32_t id = k >= 0 ? set->ids[k] : -1;
        /* Partial: text from `hold` on may turn into a token (or a longer
         * one than found at q) once more text arrives; whitespace at the
         * end, into what an lstrip token takes. */
        size_t hold = partial ? special_prefix_at(set, text, pos, b) : b;
        if (partial && bpe->any_lstrip) {
            for (size_t cut = 1; hold == b && cut <= 2 && cut <= b - pos; cut++)
                if (white_at(text + b - cut, cut) < 0) hold = b - cut; /* a wide space cut off */
            for (size_t w; hold > pos && (w = white_before(text, pos, hold)) > 0;) hold -= w;
        }
        /* the token's span with the whitespace it takes (lstrip, rstrip) */
        size_t from = q, to = k >= 0 ? q + set->form_len[k] : b;
        const unsigned strip = id >= 0 ? bpe->tok_strip[id] : 0;
        size_t w;
        while ((strip & ZPP_BPE_LSTRIP) && from > pos && (w = white_before(text, pos, from)))
            from -= w;
        for (int ws; (strip & ZPP_BPE_RSTRIP) && to < b && (ws = white_at(text + to, b - to)) > 0;)
            to += (size_t)ws;
        /* (partial: more whitespace may follow what rstrip took) */
        const int open = partial && (strip & ZPP_BPE_RSTRIP) && white_at(text + to, b - to) < 0;
        if (id >= 0 && q < hold && !open) {
            size_t done = pos;
            ZPP_CHECK(between(s, pos, from, 0, &done));
            ZPP_CHECK(s->fn(s->ctx, text + from, to - from, from, to - from, id, 0));
            pos = to;
            continue;
        }
        size_t end = hold < q ? hold : q; /* (q = b when none was found) */
        if (id >= 0 && from < end) end = from; /* (what lstrip would take waits too) */
        size_t done = pos;
        ZPP_CHECK(between(s, pos, end, partial, &done));
        pos = done;
        break;
    }
    *done_p = pos;
    return ZPP_OK;
}

/* Text with no special token in it, cut as the tokenizer's kind cuts. */
static zpp_status plain_text(const scan_ctx *s, size_t a, size_t b, int partial, size_t *done_p) {
    return split_segment(s->bpe, s->text, a, b, partial, a == 0 && !s->continued, s->fn, s->ctx,
                         done_p);
}

/* The raw length of a match of the normalized form f[0, n) at text[i, b)
 * under Llama 2's normalizer, or SIZE_MAX. In the normalized text a space
 * is "▁" (so f's "▁" is matched by " " or "▁"), and `virt`: the "▁" the
 * normalizer prepends stands before text[i] and matches f's first one. */
static size_t normalized_match(const uint8_t *t, size_t i, size_t b, int virt, const uint8_t *f,
                               size_t n) {
    size_t j = virt ? 3 : 0, r = i;
    while (j < n) {
        if (n - j >= 3 && !memcmp(f + j, ZPP_BPE_SPACE, 3)) {
            if (r == b || !space_at(t, r, b)) return SIZE_MAX;
            r += t[r] == ' ' ? 1 : 3;
            j += 3;
        } else {
            if (r == b || t[r] != f[j]) return SIZE_MAX; /* (f holds no ' ') */
            r++, j++;
        }
    }
    return r - i;
}

/* The token of `set` (normalized forms) that matches at text[i, b), the
 * longest, with its raw length in *len_p; or -1. */
static int32_t normalized_at(const special_set *set, const uint8_t *t, size_t i, size_t b, int virt,
                             size_t *len_p) {
    for (size_t k = 0; k < set->n; k++) {
        *len_p = normalized_match(t, i, b, virt, set->forms + set->form_off[k], set->form_len[k]);
        if (*len_p != SIZE_MAX) return set->ids[k];
    }
    return -1;
}

/* The second pass under Llama 2's normalizer, over a stretch text[a, b)
 * between raw special tokens. Hugging Face matches the normalized tokens in
 * the normalized stretch N = "▁" + the stretch with spaces as "▁": each
 * form starts with "▁", so a match starts at the prepended "▁" (the
 * stretch then starts with the content) or at a space, which it takes
 * along. The text between matches is not normalized again: only the first
 * piece, if no match took the prepended "▁", is prefixed; a piece that is
 * that "▁" alone has no bytes of text. The stretch is one piece without
 * matches, so partial holds it all back (as split_spaces does). */
static zpp_status split_normalized(const scan_ctx *s, size_t a, size_t b, int partial,
                                   size_t *done_p) {
    const uint8_t *t = s->text;
    *done_p = partial ? a : b;
    if (a == b || partial) return ZPP_OK;
    size_t from = a, len = 0; /* from: the current piece's start */
    int prefixed = 1;
    int32_t id = normalized_at(&s->bpe->normalized, t, a, b, 1, &len); /* at the prepended "▁" */
    if (id >= 0) {
        ZPP_CHECK(emit(s->fn, s->ctx, t, a, len, id, 0));
        prefixed = 0;
        from = a + len;
    }
    for (size_t i = from; i < b;) {
        if (!space_at(t, i, b) || (id = normalized_at(&s->bpe->normalized, t, i, b, 0, &len)) < 0) {
            i++;
            continue;
        }
        if (i > from || prefixed) ZPP_CHECK(emit(s->fn, s->ctx, t, from, i - from, -1, prefixed));
        ZPP_CHECK(emit(s->fn, s->ctx, t, i, len, id, 0));
        prefixed = 0;
        from = i = i + len;
    }
    if (b > from || prefixed) ZPP_CHECK(emit(s->fn, s->ctx, t, from, b - from, -1, prefixed));
    return ZPP_OK;
}

/* Text after its normalizer: the normalized special tokens cut out of it
 * (the second pass), the rest cut as its kind cuts. */
static zpp_status after_normalizer(const scan_ctx *s, size_t a, size_t b, int partial,
                                   size_t *done_p) {
    if (!s->bpe->normalized.n) return plain_text(s, a, b, partial, done_p);
    if (s->bpe->norm_text) return split_normalized(s, a, b, partial, done_p);
    return cut_specials(s, &s->bpe->normalized, a, b, partial, plain_text, done_p);
}

/* Pieces of the normalized text, kept until nfc_text knows how many to
 * give on. */
static zpp_status keep_piece(void *c, const uint8_t *bytes, size_t n, size_t start, size_t len,
                             int32_t special, int prefixed) {
    (void)bytes, (void)n;
    zpp_bpe_pieces *kept = c;
    ZPP_CHECK(grow((void **)&kept->pieces, &kept->cap, kept->n + 1, sizeof *kept->pieces));
    kept->pieces[kept->n++] = (zpp_bpe_piece){start, len, special, prefixed};
    return ZPP_OK;
}

/* Hugging Face's normalizer NFC over text[a, b): the text is put in NFC
 * (nfc.h), `inner` cuts the normalized text, and each piece goes on with
 * its normalized bytes and the raw offsets it came from. Partial: only the
 * text before the last stable boundary is normalized (what follows may
 * still change), and the pieces go on up to the last that ends at a
 * stable boundary, where the next call starts again. */
static zpp_status nfc_text(const scan_ctx *s, size_t a, size_t b, int partial, between_fn inner,
                           size_t *done_p) {
    zpp_bpe *bpe = s->bpe;
    const uint8_t *t = s->text;
    const size_t end = partial ? a + zpp_nfc_stable_end(t + a, b - a) : b;
    size_t ascii = a;
    while (ascii < end && t[ascii] < 0x80) ascii++;
    if (ascii == end) return inner(s, a, end, partial, done_p); /* NFC changes no ASCII */
    zpp_nfc_buf *nb = &bpe->nfc_buf;
    zpp_bpe_pieces *kept = &bpe->nfc_pieces;
    ZPP_CHECK(zpp_nfc(t + a, end - a, nb));
    kept->n = 0;
    const scan_ctx normalized = {bpe, nb->text, 1, keep_piece, kept};
    size_t done = 0;
    ZPP_CHECK(inner(&normalized, 0, nb->n, partial, &done));
    size_t give = kept->n; /* final: all of them */
    while (partial && give > 0) {
        const zpp_bpe_piece *p = &kept->pieces[give - 1];
        const size_t e = p->start + p->len;
        if (e == nb->n || zpp_nfc_stable_at(nb->text + e, nb->n - e)) break;
        give--;
    }
    size_t to = 0; /* the normalized text given on: [0, to) */
    for (size_t k = 0; k < give; k++) {
        const zpp_bpe_piece *p = &kept->pieces[k];
        const uint32_t from = nb->src[p->start];
        to = p->start + p->len;
        ZPP_CHECK(s->fn(s->ctx, nb->text + p->start, p->len, a + from, nb->src[to] - from,
                        p->special, p->prefixed));
    }
    *done_p = partial ? a + nb->src[to] : b;
    return ZPP_OK;
}

/* The text between raw special tokens, normalized, then after_normalizer. */
static zpp_status between_raw(const scan_ctx *s, size_t a, size_t b, int partial, size_t *done_p) {
    if (s->bpe->nfc) return nfc_text(s, a, b, partial, after_normalizer, done_p);
    return after_normalizer(s, a, b, partial, done_p);
}

/* The whole pre-tokenization: special tokens (when asked), the normalizer,
 * the kind's cutting. */
static zpp_status scan(zpp_bpe *bpe, const uint8_t *text, size_t len, unsigned flags, piece_fn fn,
                       void *ctx, size_t *consumed_p) {
    const scan_ctx s = {bpe, text, (flags & ZPP_BPE_CONTINUED) != 0, fn, ctx};
    const int partial = (flags & ZPP_BPE_PARTIAL) != 0;
    size_t done = 0;
    if (flags & ZPP_BPE_SPECIAL)
        ZPP_CHECK(cut_specials(&s, &bpe->raw, 0, len, partial, between_raw, &done));
    else if (bpe->nfc)
        ZPP_CHECK(nfc_text(&s, 0, len, partial, plain_text, &done));
    else
        ZPP_CHECK(plain_text(&s, 0, len, partial, &done));
    if (consumed_p) *consumed_p = done;
    return ZPP_OK;
}

typedef struct encode_ctx {
    zpp_bpe *bpe;
    zpp_bpe_ids *out;
} encode_ctx;

static zpp_status encode_cb(void *c, const uint8_t *bytes, size_t n, size_t start, size_t len,
                            int32_t special, int prefixed) {
    (void)start, (void)len;
    encode_ctx *e = c;
    if (special >= 0) {
        ZPP_CHECK(grow((void **)&e->out->ids, &e->out->cap, e->out->n + 1, sizeof(int32_t)));
        e->out->ids[e->out->n++] = special;
        return ZPP_OK;
    }
    if (e->bpe->is_chars) return encode_chars(e->bpe, bytes, n, prefixed, e->out);
    return encode_piece(e->bpe, bytes, n, e->out);
}

static zpp_status check_call(const char *fn, const zpp_bpe *bpe, const void *text, size_t len,
                             unsigned flags, const void *out, const size_t *consumed_p) {
    if (!bpe || !out || (len && !text))
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL argument", fn);
    if (flags & ~(ZPP_BPE_SPECIAL | ZPP_BPE_PARTIAL | ZPP_BPE_CONTINUED))
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown flags 0x%x", fn, flags);
    if ((flags & ZPP_BPE_PARTIAL) && !consumed_p)
        return zpp_error(ZPP_ERR_INVALID, "%s: ZPP_BPE_PARTIAL needs consumed_p", fn);
    return ZPP_OK;
}

zpp_status zpp_bpe_encode(zpp_bpe *bpe, const void *text, size_t len, unsigned flags,
                          zpp_bpe_ids *out, size_t *consumed_p) {
    ZPP_CHECK(check_call("zpp_bpe_encode", bpe, text, len, flags, out, consumed_p));
    const size_t before = out->n;
    encode_ctx e = {bpe, out};
    size_t consumed = 0;
    zpp_status st = scan(bpe, text, len, flags, encode_cb, &e, &consumed);
    if (st != ZPP_OK) {
        out->n = before;
        return st;
    }
    if (consumed_p) *consumed_p = consumed;
    return ZPP_OK;
}

static zpp_status split_cb(void *c, const uint8_t *bytes, size_t n, size_t start, size_t len,
                           int32_t special, int prefixed) {
    (void)bytes, (void)n;
    zpp_bpe_pieces *out = c;
    ZPP_CHECK(grow((void **)&out->pieces, &out->cap, out->n + 1, sizeof *out->pieces));
    out->pieces[out->n++] = (zpp_bpe_piece){start, len, special, prefixed};
    return ZPP_OK;
}

zpp_status zpp_bpe_split(zpp_bpe *bpe, const void *text, size_t len, unsigned flags,
                         zpp_bpe_pieces *out, size_t *consumed_p) {
    ZPP_CHECK(check_call("zpp_bpe_split", bpe, text, len, flags, out, consumed_p));
    const size_t before = out->n;
    size_t consumed = 0;
    zpp_status st = scan(bpe, text, len, flags, split_cb, out, &consumed);
    if (st != ZPP_OK) {
        out->n = before;
        return st;
    }
    if (consumed_p) *consumed_p = consumed;
    return ZPP_OK;
}

/* ---- decoding ----------------------------------------------------------- */

zpp_status zpp_bpe_decode(const zpp_bpe *bpe, const int32_t *ids, size_t n, char **text_p,
                          size_t *len_p) {
    if (!bpe || (n && !ids) || !text_p || !len_p)
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= bpe->n_ids || !bpe->tok_len[ids[i]])
            return zpp_error(ZPP_ERR_INVALID,
                             "bpe decode: id %d at position %zu is no token of this vocabulary "
                             "(ids run to %d); was it made with another tokenizer?",
                             (int)ids[i], i, (int)bpe->n_ids - 1);
        total += bpe->text_len[ids[i]];
    }
    char *t = malloc(total + 1);
    if (!t) return zpp_error(ZPP_ERR_NOMEM, "bpe decode: out of memory for %zu bytes", total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(t + o, bpe->text_bytes + bpe->text_off[ids[i]], bpe->text_len[ids[i]]);
        o += bpe->text_len[ids[i]];
    }
    /* The "▁" that encoding put in front comes back a space: drop it
     * (Hugging Face's Strip of one leading space). */
    if (bpe->is_chars && bpe->chars.prepend != ZPP_BPE_PREPEND_NEVER && o && t[0] == ' ') {
        memmove(t, t + 1, o - 1);
        o--;
    }
    t[o] = 0;
    *text_p = t;
    *len_p = o;
    return ZPP_OK;
}

/* ---- GPT-2's byte alphabet ---------------------------------------------- */

/* bytes_to_unicode: the 188 bytes that print stand for themselves; the other
 * 68 take the code points from 256 on, in increasing byte order. So every
 * token prints, and a space is U+0120 "Ġ". */
static int byte_prints(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t zpp_bpe_gpt2_byte_char(uint8_t byte) {
    if (byte_prints(byte)) return byte;
    uint32_t k = 0; /* how many non-printing bytes come before this one */
    for (unsigned b = 0; b < byte; b++) k += !byte_prints(b);
    return 256 + k;
}

int zpp_bpe_gpt2_char_byte(uint32_t cp) {
    if (cp < 256) return byte_prints(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!byte_prints(b) && k-- == 0) return (int)b;
    return -1;
}

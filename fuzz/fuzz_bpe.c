/* fuzz/fuzz_bpe.c — libFuzzer target: the byte-level BPE tokenizer
 * (src/train/bpe.c, bpe_gpt2.c, nfc.c). The first byte picks what the rest
 * is:
 *   even: text, encoded with a fixed small tokenizer (GPT-2's regex, a few
 *         merges, <|endoftext|>; with the byte's bit 2 the normalizer NFC);
 *         the invariants are checked: decoding gives the text back byte for
 *         byte (its NFC with the normalizer), the pieces tile the text, and
 *         streaming it in chunks (sizes drawn from the input) gives the
 *         whole text's tokens;
 *   odd:  a vocab.json and a merges.txt, cut at the first NUL byte, loaded
 *         from temporary files; a tokenizer that loads must round-trip text.
 * Anything but a clean status is a bug. Built by scripts/fuzz.sh (clang);
 * replayed over fuzz/corpus/bpe by the ctest test fuzz_replay_bpe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/bpe.h"
#include "train/nfc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static zpp_bpe *fixed_tokenizer(int nfc) {
    static zpp_bpe *made[2];
    zpp_bpe **bpe = &made[nfc];
    if (*bpe) return *bpe;
    static uint8_t bytes[256];
    static const char *const merged[] = {" t", "he", " the", "in", "ing", "  ", "    ", "\n\n",
                                         "\xC3\xA9", "aa", "aaaa"};
    static const int parts[][2] = {{' ', 't'}, {'h', 'e'}, {256, 257}, {'i', 'n'}, {259, 'g'},
                                   {' ', ' '}, {261, 261}, {'\n', '\n'}, {0xC3, 0xA9},
                                   {'a', 'a'}, {265, 265}};
    enum { N_MERGED = sizeof merged / sizeof merged[0] };
    zpp_bpe_token tok[256 + N_MERGED + 1];
    zpp_bpe_merge m[N_MERGED];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        tok[i] = (zpp_bpe_token){&bytes[i], 1, i, 0, 0};
    }
    for (int k = 0; k < N_MERGED; k++) {
        tok[256 + k] =
            (zpp_bpe_token){(const uint8_t *)merged[k], strlen(merged[k]), 256 + k, 0, 0};
        m[k] = (zpp_bpe_merge){parts[k][0], parts[k][1]};
    }
    tok[256 + N_MERGED] =
        (zpp_bpe_token){(const uint8_t *)"<|endoftext|>", 13, 256 + N_MERGED, 1, 0};
    zpp_bpe_desc d = {.tokens = tok, .n_tokens = 256 + N_MERGED + 1, .merges = m,
                      .n_merges = N_MERGED, .pattern = ZPP_BPE_GPT2_PATTERN, .nfc = nfc};
    if (zpp_bpe_create(&d, bpe) != ZPP_OK) {
        fprintf(stderr, "fixed tokenizer: %s\n", zpp_last_error());
        abort();
    }
    return *bpe;
}

/* nfc: the tokenizer's normalizer is NFC: decoding gives the text's NFC
 * (checked without ZPP_BPE_SPECIAL, where the whole text is one stretch),
 * and a piece inside a run of reordered marks may cover no bytes */
static void roundtrip(zpp_bpe *bpe, const uint8_t *t, size_t n, unsigned flags, uint32_t seed,
                      int nfc) {
    zpp_bpe_ids whole = {0}, streamed = {0};
    size_t used = 0;
    if (zpp_bpe_encode(bpe, t, n, flags, &whole, &used) != ZPP_OK || used != n) abort();
    char *back = NULL;
    size_t n_back = 0;
    if (zpp_bpe_decode(bpe, whole.ids, whole.n, &back, &n_back) != ZPP_OK) abort();
    zpp_nfc_buf normal = {0};
    if (nfc && !(flags & ZPP_BPE_SPECIAL)) {
        if (zpp_nfc(t, n, &normal) != ZPP_OK) abort();
        if (n_back != normal.n || (normal.n && memcmp(back, normal.text, normal.n))) abort();
    } else if (!nfc && (n_back != n || (n && memcmp(back, t, n)))) {
        abort();
    }
    zpp_nfc_free(&normal);
    free(back);
    /* the pieces tile the text */
    zpp_bpe_pieces p = {0};
    if (zpp_bpe_split(bpe, t, n, flags, &p, NULL) != ZPP_OK) abort();
    size_t at = 0;
    for (size_t i = 0; i < p.n; i++) {
        if (p.pieces[i].start != at || (!p.pieces[i].len && !nfc)) abort();
        at += p.pieces[i].len;
    }
    if (at != n) abort();
    free(p.pieces);
    /* streamed in chunks of 1..64 bytes, the leftover carried over */
    uint8_t *pend = malloc(n + 1);
    size_t have = 0, fed = 0;
    while (fed < n) {
        seed = seed * 1103515245u + 12345u;
        size_t k = 1 + (seed >> 16) % 64;
        if (k > n - fed) k = n - fed;
        memcpy(pend + have, t + fed, k);
        have += k, fed += k;
        if (zpp_bpe_encode(bpe, pend, have, flags | ZPP_BPE_PARTIAL, &streamed, &used) != ZPP_OK ||
            used > have)
            abort();
        memmove(pend, pend + used, have - used);
        have -= used;
    }
    if (zpp_bpe_encode(bpe, pend, have, flags, &streamed, &used) != ZPP_OK || used != have) abort();
    if (streamed.n != whole.n || (whole.n && memcmp(streamed.ids, whole.ids, whole.n * 4))) abort();
    free(pend), free(whole.ids), free(streamed.ids);
}

static int write_tmp(char *path, const void *p, size_t n) {
    strcpy(path, "/tmp/zpp_fuzz_bpe_XXXXXX");
    const int fd = mkstemp(path);
    if (fd < 0) return -1;
    const int ok = n == 0 || write(fd, p, n) == (ssize_t)n;
    close(fd);
    return ok ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 16)) return 0;
    const uint8_t mode = data[0];
    data++, size--;
    if (!(mode & 1)) {
        const int nfc = (mode & 4) != 0;
        roundtrip(fixed_tokenizer(nfc), data, size, mode & 2 ? ZPP_BPE_SPECIAL : 0,
                  (uint32_t)mode * 2654435761u + (uint32_t)size, nfc);
        return 0;
    }
    const uint8_t *nul = memchr(data, 0, size);
    const size_t vn = nul ? (size_t)(nul - data) : size;
    char vp[64], mp[64];
    if (write_tmp(vp, data, vn)) return 0;
    if (write_tmp(mp, nul ? nul + 1 : data, nul ? size - vn - 1 : 0)) {
        unlink(vp);
        return 0;
    }
    zpp_bpe *bpe = NULL;
    if (zpp_bpe_load_gpt2(vp, mp, &bpe) == ZPP_OK) {
        static const char text[] = "Hello world's  123!!\n\n x <|endoftext|>caf\xC3\xA9\xFF";
        roundtrip(bpe, (const uint8_t *)text, sizeof text - 1, ZPP_BPE_SPECIAL, 7, 0);
        roundtrip(bpe, (const uint8_t *)text, sizeof text - 1, 0, 9, 0);
        zpp_bpe_destroy(bpe);
    } else if (!zpp_last_error()[0]) {
        abort(); /* a refusal names its reason */
    }
    unlink(vp);
    unlink(mp);
    return 0;
}

/* train/utf8.h — reading UTF-8, as the tokenizer (bpe.c, bpe_gpt2.c) and
 * its NFC normalizer (nfc.c) need it. Well-formed means: a lead byte, then
 * the continuation bytes it asks for, encoding a code point in its
 * shortest form, not a surrogate (U+D800..U+DFFF), at most U+10FFFF. */
#ifndef ZPP_TRAIN_UTF8_H
#define ZPP_TRAIN_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length of the sequence lead byte c starts: 1 (ASCII) to 4; 0 for a
 * byte that starts none (a continuation byte, 0xC0, 0xC1, 0xF5..0xFF). */
static inline size_t zpp_utf8_need(uint8_t c) {
    return c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
         : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* The well-formed character at s[0, n) (n >= 1): its length, 1 to 4, and
 * its code point in *cp; 0 when s[0, n) does not start with one (cut
 * short included). */
static inline size_t zpp_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    static const uint32_t shortest[5] = {0, 0, 0x80, 0x800, 0x10000};
    const size_t len = zpp_utf8_need(s[0]);
    if (len == 0 || len > n) return 0;
    uint32_t v = len == 1 ? s[0] : s[0] & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < shortest[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

#endif

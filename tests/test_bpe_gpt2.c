/* test_bpe_gpt2.c — the tokenizer on GPT-2's real files, when they are here
 * (optional): CMake registers it only when ZPP_GPT2_TOKENIZER_DIR names a
 * folder holding vocab.json and merges.txt from the GPT-2 release as it
 * runs (docs/data.md says where; tests/text.cmake).
 *
 * The expected ids are GPT-2's well-known ones (its tokenizer's output seen
 * in countless places): "Hello world" is 15496 995, " the" 262, "\n" 198,
 * "<|endoftext|>" 50256; and the byte tokens follow bytes_to_unicode's
 * order: ids 0..93 are '!'..'~', 188 + b for the bytes b below 33. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "train/bpe.h"

static void expect_ids(zpp_bpe *bpe, const char *text, unsigned flags, const int32_t *want,
                       size_t n_want) {
    zpp_bpe_ids got = {0};
    EXPECT_OK(zpp_bpe_encode(bpe, text, strlen(text), flags, &got, NULL));
    int same = got.n == n_want;
    for (size_t i = 0; same && i < n_want; i++) same = got.ids[i] == want[i];
    if (!same) {
        char line[512];
        size_t o = 0;
        for (size_t i = 0; i < got.n && o + 16 < sizeof line; i++)
            o += (size_t)snprintf(line + o, sizeof line - o, " %d", (int)got.ids[i]);
        line[o] = 0;
        EXPECT(same, "'%s' encodes to%s; GPT-2 gives %zu other ids starting %d", text, line,
               n_want, n_want ? (int)want[0] : -1);
    }
    char *back = NULL;
    size_t n_back = 0;
    EXPECT_OK(zpp_bpe_decode(bpe, got.ids, got.n, &back, &n_back));
    EXPECT(n_back == strlen(text) && !memcmp(back, text, n_back), "'%s' decodes to '%s'", text,
           back);
    free(back), free(got.ids);
}

static void test_gpt2_files(void) {
    const char *dir = getenv("ZPP_GPT2_TOKENIZER_DIR");
    if (!dir || !*dir) {
        zpp_test_skip("needs ZPP_GPT2_TOKENIZER_DIR, a folder with GPT-2's vocab.json and "
                      "merges.txt (docs/data.md)");
    }
    char vocab[1024], merges[1024];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", dir);
    snprintf(merges, sizeof merges, "%s/merges.txt", dir);
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_load_gpt2(vocab, merges, &bpe));
    EXPECT(zpp_bpe_vocab_size(bpe) == 50257, "vocabulary %d", (int)zpp_bpe_vocab_size(bpe));
    EXPECT(zpp_bpe_merge_count(bpe) == 50000, "%zu merges", zpp_bpe_merge_count(bpe));
    /* the byte tokens, in bytes_to_unicode's order */
    int32_t next = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            const int prints = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
            if (prints != (pass == 0)) continue;
            const uint8_t byte = (uint8_t)b;
            EXPECT(zpp_bpe_find(bpe, &byte, 1) == next, "byte 0x%02X has id %d, GPT-2's is %d", b,
                   (int)zpp_bpe_find(bpe, &byte, 1), (int)next);
            next++;
        }
    expect_ids(bpe, "Hello world", 0, (const int32_t[]){15496, 995}, 2);
    expect_ids(bpe, "Hello world, the", 0, (const int32_t[]){15496, 995, 11, 262}, 4);
    static const struct {
        const char *text;
        int32_t id;
    } one[] = {{" the", 262}, {",", 11},   {".", 13},    {"\n", 198}, {"\n\n", 628},
               {" ", 220},    {" and", 290}, {" of", 286}, {" to", 284}, {" a", 257},
               {"The", 464},  {" The", 383}, {"!", 0}};
    for (size_t k = 0; k < sizeof one / sizeof one[0]; k++)
        expect_ids(bpe, one[k].text, 0, &one[k].id, 1);
    expect_ids(bpe, "<|endoftext|>", ZPP_BPE_SPECIAL, (const int32_t[]){50256}, 1);
    /* without ZPP_BPE_SPECIAL it is text: several ordinary tokens */
    zpp_bpe_ids ids = {0};
    EXPECT_OK(zpp_bpe_encode(bpe, "<|endoftext|>", 13, 0, &ids, NULL));
    EXPECT(ids.n > 1, "%zu tokens", ids.n);
    for (size_t i = 0; i < ids.n; i++) EXPECT(ids.ids[i] != 50256);
    free(ids.ids);
    /* any text comes back */
    const char *mixed = "Caf\xC3\xA9 na\xC3\xAFve \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 "
                        "it's 3.14159\t\ttabs   and\r\nlines\xFF";
    zpp_bpe_ids m = {0};
    EXPECT_OK(zpp_bpe_encode(bpe, mixed, strlen(mixed), 0, &m, NULL));
    char *back = NULL;
    size_t n_back = 0;
    EXPECT_OK(zpp_bpe_decode(bpe, m.ids, m.n, &back, &n_back));
    EXPECT(n_back == strlen(mixed) && !memcmp(back, mixed, n_back));
    free(back), free(m.ids);
    zpp_bpe_destroy(bpe);
}

ZPP_TESTS(
    ZPP_TEST(test_gpt2_files),
)

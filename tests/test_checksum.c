/* test_checksum.c — core/checksum.h, the checksum of checkpoint files of
 * format 4, on fresh random bytes each run:
 *   - it equals the test library's reference, written from the definition
 *     (zpp_test_checksum_ref), for every length around the block sizes;
 *   - any split of the stream into zpp_checksum_add calls gives the same sum;
 *   - changing any one byte changes the sum (a promise of the construction:
 *     each step is a bijection of its lane), and so does appending a zero
 *     byte (the byte count is folded in). */
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "testlib.h"

static uint64_t sum_of(const unsigned char *b, size_t n) {
    zpp_checksum c = {0};
    zpp_checksum_add(&c, b, n);
    return zpp_checksum_value(&c);
}

static unsigned char *random_bytes(zpp_rng *r, size_t n) {
    unsigned char *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)zpp_rng_u64(r);
    return b;
}

static void test_matches_reference(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    for (size_t n = 0; n <= 200; n++) {
        unsigned char *b = random_bytes(&r, n);
        EXPECT(sum_of(b, n) == zpp_test_checksum_ref(b, n), "%zu bytes: %016llx, reference %016llx",
               n, (unsigned long long)sum_of(b, n),
               (unsigned long long)zpp_test_checksum_ref(b, n));
        free(b);
    }
    const size_t big = 1000003 + zpp_rng_u64(&r) % 4096;
    unsigned char *b = random_bytes(&r, big);
    EXPECT(sum_of(b, big) == zpp_test_checksum_ref(b, big), "%zu bytes differ", big);
    free(b);
}

static void test_any_split(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    for (int trial = 0; trial < 200; trial++) {
        const size_t n = zpp_rng_u64(&r) % 3000;
        unsigned char *b = random_bytes(&r, n);
        zpp_checksum c = {0};
        size_t at = 0;
        while (at < n) {
            size_t k = zpp_rng_u64(&r) % 70;
            if (k > n - at) k = n - at;
            zpp_checksum_add(&c, b + at, k);
            at += k;
            /* a value taken midway leaves the state as it was */
            if (zpp_rng_u64(&r) % 4 == 0) (void)zpp_checksum_value(&c);
        }
        EXPECT(zpp_checksum_value(&c) == sum_of(b, n), "trial %d: %zu bytes in pieces differ",
               trial, n);
        free(b);
    }
}

static void test_every_change_seen(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    for (int trial = 0; trial < 2000; trial++) {
        const size_t n = 1 + zpp_rng_u64(&r) % 600;
        unsigned char *b = random_bytes(&r, n + 1);
        const uint64_t s = sum_of(b, n);
        const size_t i = zpp_rng_u64(&r) % n;
        const unsigned char was = b[i];
        b[i] ^= (unsigned char)(1 + zpp_rng_u64(&r) % 255);
        EXPECT(sum_of(b, n) != s, "trial %d: byte %zu of %zu changed, the sum did not", trial,
               i, n);
        b[i] = was;
        b[n] = 0;
        EXPECT(sum_of(b, n + 1) != s, "trial %d: a zero byte appended to %zu, same sum", trial,
               n);
        free(b);
    }
}

ZPP_TESTS(ZPP_TEST(test_matches_reference), ZPP_TEST(test_any_split),
          ZPP_TEST(test_every_change_seen))

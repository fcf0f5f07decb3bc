/* bench/checkpoint/checksum_speed.c — the checkpoint files' checksum
 * (core/checksum.h, format 4) against FNV-1a (formats 2 and 3) and a memory
 * copy of the same bytes, one core, 1 GiB fed in 1 MiB pieces as a save
 * feeds it; three rounds, each figure of every round printed.
 *   gcc -O3 -std=c11 -D_POSIX_C_SOURCE=200809L -Isrc -Iinclude \
 *       bench/checkpoint/checksum_speed.c src/core/checksum.c -o /tmp/checksum_speed
 *   /tmp/checksum_speed */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/checksum.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* FNV-1a 64 as train/ckpt_manifest.c computes it. */
static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(void) {
    const size_t n = (size_t)1 << 30, piece = (size_t)1 << 20;
    unsigned char *a = malloc(n), *b = malloc(n);
    if (!a || !b) return 1;
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 131 + 7);
    memcpy(b, a, n); /* both touched before timing */
    for (int round = 1; round <= 3; round++) {
        double t0 = now();
        zpp_checksum c = {0};
        for (size_t o = 0; o < n; o += piece) zpp_checksum_add(&c, a + o, piece);
        const uint64_t s = zpp_checksum_value(&c);
        double t1 = now();
        const uint64_t h = fnv1a(a, n);
        double t2 = now();
        memcpy(b, a, n);
        double t3 = now();
        printf("round %d: checksum %.2f GB/s, FNV-1a %.2f GB/s, memcpy %.2f GB/s (%016llx %016llx)\n",
               round, n / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9, n / (t3 - t2) / 1e9,
               (unsigned long long)s, (unsigned long long)h);
    }
    free(a);
    free(b);
    return 0;
}

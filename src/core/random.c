/* core/random.c — normal samples for benchmarks and tests. */
#include "core/random.h"

#include <math.h>

#include "core/dtype.h"

void zpp_fill_normal(void *x, zpp_dtype dtype, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        /* u1 in (0, 1] keeps the log finite */
        double u1 = ((double)(zpp_splitmix64(&s) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(zpp_splitmix64(&s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        zpp_store_f32(x, dtype, i, (float)(r * cos(6.283185307179586 * u2)));
        if (i + 1 < n) zpp_store_f32(x, dtype, i + 1, (float)(r * sin(6.283185307179586 * u2)));
    }
}

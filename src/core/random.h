/* core/random.h — the one 64-bit mixer behind every deterministic stream in
 * zeropp (parameter init, data order, stochastic rounding, test and bench
 * data), usable from host C and from CUDA device code.
 *
 * zpp_mix64 is splitmix64's finaliser: a bijection on 64-bit words with full
 * avalanche (every output bit flips with probability ~1/2 when any input bit
 * does), so hashing a counter gives numbers that pass standard statistical
 * tests. zpp_splitmix64 walks the stream state += golden ratio, mix. */
#ifndef ZPP_CORE_RANDOM_H
#define ZPP_CORE_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define ZPP_HD __host__ __device__ __forceinline__
#else
#define ZPP_HD static inline
#endif

#define ZPP_GOLDEN64 0x9e3779b97f4a7c15ull

ZPP_HD uint64_t zpp_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next number of a splitmix64 stream. */
ZPP_HD uint64_t zpp_splitmix64(uint64_t *state) {
    *state += ZPP_GOLDEN64;
    return zpp_mix64(*state);
}

/* A hash of one word: the splitmix64 value after state z. */
ZPP_HD uint64_t zpp_hash64(uint64_t z) { return zpp_mix64(z + ZPP_GOLDEN64); }

#if !defined(__CUDACC__)
#include "zeropp.h"
/* n samples of N(0, 1) (Box-Muller on the splitmix64 stream from `seed`),
 * each rounded to `dtype`: benchmark and test data. */
void zpp_fill_normal(void *x, zpp_dtype dtype, size_t n, uint64_t seed);
#endif

#endif

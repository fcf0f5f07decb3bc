/* quant/quant_rng.h — the random stream of stochastic rounding, shared by
 * the CPU reference and the CUDA kernels so both draw identical numbers.
 *
 * Counter-based: the uniform for element i of a call with seed s is a pure
 * function hash(s, i), so results do not depend on how work is split over
 * threads or blocks. The hash is a 64-bit finaliser (splitmix64's mixer),
 * whose output bits pass standard statistical tests; the top 24 bits give a
 * uniform u in [0, 1) exactly representable in fp32. */
#ifndef ZPP_QUANT_RNG_H
#define ZPP_QUANT_RNG_H

#include <stdint.h>

#if defined(__CUDACC__)
#define ZPP_HD __host__ __device__ __forceinline__
#else
#define ZPP_HD static inline
#endif

ZPP_HD uint64_t zpp_quant_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1), multiples of 2^-24. */
ZPP_HD float zpp_quant_uniform(uint64_t seed, uint64_t index) {
    uint64_t h = zpp_quant_mix64(seed * 0x9e3779b97f4a7c15ull + index + 1);
    return (float)(uint32_t)(h >> 40) * (1.0f / 16777216.0f);
}

#endif

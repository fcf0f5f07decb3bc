/* quant/quant_rng.h — the random stream of stochastic rounding, shared by
 * the CPU reference and the CUDA kernels so both draw identical numbers.
 *
 * Counter-based: the uniform for element i of a call with seed s is a pure
 * function hash(s, i), so results do not depend on how work is split over
 * threads or blocks. The hash is core/random.h's zpp_mix64; the top 24 bits give a
 * uniform u in [0, 1) exactly representable in fp32. */
#ifndef ZPP_QUANT_RNG_H
#define ZPP_QUANT_RNG_H

#include <stdint.h>

#include "core/random.h"

/* Uniform in [0, 1), multiples of 2^-24. */
ZPP_HD float zpp_quant_uniform(uint64_t seed, uint64_t index) {
    uint64_t h = zpp_mix64(seed * ZPP_GOLDEN64 + index + 1);
    return (float)(uint32_t)(h >> 40) * (1.0f / 16777216.0f);
}

#endif

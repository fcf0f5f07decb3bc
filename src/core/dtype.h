/* core/dtype.h — bf16 / fp16 <-> fp32 conversions on the host.
 *
 * bf16 is the top 16 bits of an fp32; converting fp32 -> bf16 rounds to
 * nearest even by adding 0x7fff plus the lowest kept bit before truncating.
 * NaN stays NaN (a quiet bit is forced so the rounding add cannot turn a NaN
 * payload into Inf). fp16 conversions use the compiler's _Float16 where
 * available, which is IEEE round-to-nearest-even, else the same by integer
 * arithmetic. These match CUDA's __float2bfloat16_rn / __float2half_rn bit
 * for bit. */
#ifndef ZPP_CORE_DTYPE_H
#define ZPP_CORE_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "zeropp.h"

typedef uint16_t zpp_bf16;
typedef uint16_t zpp_fp16;

static inline float zpp_bf16_to_f32(zpp_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline zpp_bf16 zpp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (zpp_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (zpp_bf16)(u >> 16);
}

/* fp16 <-> fp32 by integer arithmetic, for compilers without _Float16
 * (clang before 15 on x86, which scripts/fuzz.sh may use); test_core
 * checks them against _Float16 bit for bit. fp16: 1 sign, 5 exponent bits
 * (bias 15), 10 mantissa bits; exponent 0 holds the subnormals m * 2^-24. */
static inline float zpp_fp16_to_f32_soft(zpp_fp16 h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = h >> 10 & 31u, m = h & 0x3ffu;
    uint32_t u;
    if (e == 31) { /* Inf, or NaN made quiet with its payload kept */
        u = sign | 0x7f800000u | (m ? 0x400000u | m << 13 : 0);
    } else if (e == 0) { /* zero or subnormal: exact in fp32 */
        const float f = (float)m * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | (e + 112) << 23 | m << 13; /* rebias 15 -> 127 */
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest, ties to even: keep the bits above the cut, add one
 * when what is cut off is more than half a unit, or exactly half and the
 * kept value is odd. */
static inline zpp_fp16 zpp_f32_to_fp16_soft(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = u >> 16 & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return (zpp_fp16)(sign | 0x7e00u | (u >> 13 & 0x3ffu)); /* NaN */
    if (u >= 0x477ff000u) return (zpp_fp16)(sign | 0x7c00u); /* >= 65520: Inf */
    const uint32_t e = u >> 23;
    uint32_t kept, cut, half;
    if (e >= 113) { /* normal in fp16: drop 13 bits, rebias 127 -> 15 */
        kept = (u >> 13) - (112u << 10), cut = u & 0x1fffu, half = 0x1000u;
    } else if (e >= 102) { /* subnormal in fp16: the mantissa in units of 2^-24 */
        const uint32_t m = (u & 0x7fffffu) | 0x800000u, shift = 126 - e;
        kept = m >> shift, cut = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    } else { /* below 2^-25: rounds to zero */
        return (zpp_fp16)sign;
    }
    if (cut > half || (cut == half && (kept & 1))) kept++; /* (a carry moves up a binade) */
    return (zpp_fp16)(sign | kept);
}

#if defined(__FLT16_MAX__) /* the compiler has _Float16 (IEEE, nearest even) */
static inline float zpp_fp16_to_f32(zpp_fp16 h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

static inline zpp_fp16 zpp_f32_to_fp16(float f) {
    _Float16 x = (_Float16)f;
    zpp_fp16 h;
    memcpy(&h, &x, 2);
    return h;
}
#else
static inline float zpp_fp16_to_f32(zpp_fp16 h) { return zpp_fp16_to_f32_soft(h); }
static inline zpp_fp16 zpp_f32_to_fp16(float f) { return zpp_f32_to_fp16_soft(f); }
#endif

/* Element i of an array of `dtype` as fp32. */
static inline float zpp_load_f32(const void *p, zpp_dtype dtype, size_t i) {
    switch (dtype) {
    case ZPP_BF16: return zpp_bf16_to_f32(((const zpp_bf16 *)p)[i]);
    case ZPP_FP16: return zpp_fp16_to_f32(((const zpp_fp16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Stores v (rounded to nearest even) as element i of an array of `dtype`. */
static inline void zpp_store_f32(void *p, zpp_dtype dtype, size_t i, float v) {
    switch (dtype) {
    case ZPP_BF16: ((zpp_bf16 *)p)[i] = zpp_f32_to_bf16(v); break;
    case ZPP_FP16: ((zpp_fp16 *)p)[i] = zpp_f32_to_fp16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

#endif

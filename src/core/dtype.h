/* core/dtype.h — bf16 / fp16 <-> fp32 conversions on the host.
 *
 * bf16 is the top 16 bits of an fp32; converting fp32 -> bf16 rounds to
 * nearest even by adding 0x7fff plus the lowest kept bit before truncating.
 * NaN stays NaN (a quiet bit is forced so the rounding add cannot turn a NaN
 * payload into Inf). fp16 conversions use the compiler's _Float16 where
 * available, which is IEEE round-to-nearest-even. These match CUDA's
 * __float2bfloat16_rn / __float2half_rn bit for bit. */
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

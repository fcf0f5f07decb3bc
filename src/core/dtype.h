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

/* An fp32's bits and back. */
static inline float zpp__f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t zpp__u32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float zpp_bf16_to_f32(zpp_bf16 h) { return zpp__f32((uint32_t)h << 16); }

static inline zpp_bf16 zpp_f32_to_bf16(float f) {
    uint32_t u = zpp__u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (zpp_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (zpp_bf16)(u >> 16);
}

/* A master weight split in two halves (the engine's masters at world 1 in
 * bf16, engine_internal.h). hi is x rounded to bf16 to nearest with ties
 * away from zero: x's bits plus half a bf16 unit (0x8000), truncated; the
 * sign bit is untouched, so it acts on the magnitude. lo is x's low 16
 * bits, unchanged, and x = bits(hi) << 16 plus lo read as a signed int16:
 * where the low half was 0x8000 or more, the add carried one unit into
 * hi, and lo read as signed is the low half minus 0x10000. That restores
 * every fp32 bit for bit (zeros' signs, subnormals and values that round
 * up to the next binade included), in 4 bytes where an fp32 master and
 * its bf16 working copy take 6. The price is the tie rule: round to
 * nearest even would need a 17th bit (a bf16 even value is the nearest one
 * of 2^16 + 1 fp32 values). Ties are 1 in 2^16 of random low halves, and
 * at a tie both neighbours are equally near. NaNs are restored by the
 * join; hi alone may read as another NaN or an infinity. */
static inline zpp_bf16 zpp_split_hi(float x) { return (zpp_bf16)((zpp__u32(x) + 0x8000u) >> 16); }
static inline uint16_t zpp_split_lo(float x) { return (uint16_t)(zpp__u32(x) & 0xffffu); }
static inline float zpp_split_join(zpp_bf16 hi, uint16_t lo) {
    return zpp__f32(((uint32_t)hi << 16) + (uint32_t)(int32_t)(int16_t)lo);
}

/* fp16 <-> fp32 by integer arithmetic, branch-free so that loops over them
 * vectorize (quant/quant_kernels.h); the conversions below use them where
 * the compiler has no _Float16 (clang before 15 on x86). test_quant checks
 * them against _Float16 on every fp16 value and on random fp32 patterns. */

/* c ? a : b on integers as a mask: the compiler if-converts this into
 * pcmpgtd/pand/pandn/por where a chain of ternaries with floating-point
 * operations behind them stays a branch (-ftrapping-math). */
static inline uint32_t zpp__sel(int c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

/* fp16 -> fp32 is exact. Normal numbers: move the 5-bit exponent and
 * 10-bit mantissa up by 13 bits and rebias the exponent by 127 - 15 = 112.
 * Inf/NaN (exponent 31): rebias to 255 and set the quiet bit of a NaN, as
 * the hardware conversion does. Subnormals (exponent 0): the value is
 * mantissa * 2^-24, computed exactly by an int -> float conversion. */
static inline float zpp__ld_fp16(uint16_t h) {
    uint32_t a = h & 0x7fffu;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t normal = (a << 13) + (112u << 23);
    uint32_t special = ((a << 13) + (224u << 23)) | zpp__sel(a > 0x7c00u, 0x400000u, 0u);
    uint32_t sub = zpp__u32((float)(int32_t)a * 0x1p-24f);
    uint32_t r = zpp__sel(a < 0x400u, sub, zpp__sel(a >= 0x7c00u, special, normal));
    return zpp__f32(r | sign);
}

/* fp32 -> fp16, round to nearest even, in four ranges of a = |f| bits:
 *   a > Inf            NaN: quiet, top 10 mantissa bits kept
 *   a >= 65536         Inf (also 65520 <= a < 65536 via the normal path,
 *                      which rounds 65520 up into the Inf pattern)
 *   a >= 2^-14         normal: rebias the exponent (-112), round the 13
 *                      dropped bits half-even as in bf16, shift
 *   a < 2^-14          subnormal or zero: adding 0.5 (whose ulp is 2^-24,
 *                      the fp16 subnormal step) makes the FPU round to a
 *                      multiple of 2^-24; that multiple is the low mantissa
 *                      bits of the sum */
static inline uint16_t zpp__st_fp16(float f) {
    uint32_t u = zpp__u32(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t a = (int32_t)(u & 0x7fffffffu);
    uint32_t nan = 0x7e00u | (((uint32_t)a >> 13) & 0x3ffu);
    uint32_t normal =
        ((uint32_t)a - (112u << 23) + 0xfffu + (((uint32_t)a >> 13) & 1u)) >> 13;
    uint32_t sub = zpp__u32(zpp__f32((uint32_t)a) + 0.5f) - 0x3f000000u;
    uint32_t r = zpp__sel(a > 0x7f800000, nan,
                          zpp__sel(a >= 0x47800000, 0x7c00u,
                                   zpp__sel(a >= 0x38800000, normal, sub)));
    return (uint16_t)(r | sign);
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
static inline float zpp_fp16_to_f32(zpp_fp16 h) { return zpp__ld_fp16(h); }
static inline zpp_fp16 zpp_f32_to_fp16(float f) { return zpp__st_fp16(f); }
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

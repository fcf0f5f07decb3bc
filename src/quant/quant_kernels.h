/* quant/quant_kernels.h — the loops of block quantization (the math and
 * the edge cases: quant.c), one source compiled once per CPU instruction
 * set: quant_isa_generic.c, quant_isa_avx2.c and quant_isa_avx512.c each
 * include this file once, under their `#pragma GCC target`, and name the
 * table at its end with ZPP_QUANT_KERNELS_TABLE (quant/quant_isa.h). All
 * functions are static, so each copy stays in its own translation unit;
 * the inline helpers are compiled for the including file's ISA too.
 *
 * Why every copy gives the same bytes: each fp32 operation below is its own
 * C expression with one IEEE rounding, which every SSE/AVX/AVX-512
 * instruction performs identically (mulps, addps, divss, cvtdq2ps are
 * correctly rounded; the integer tricks are exact), and nothing fuses a*b+c
 * into one FMA rounding: the build passes -ffp-contract=off, and the
 * AVX2/AVX-512 targets leave FMA out. The comparisons
 * used as min/max only see finite values (non-finite blocks are handled
 * before). One thing is left to the compiler: which NaN a sum of two NaNs
 * returns (x86 keeps the first operand's, and a + b may be emitted either
 * way round), so a NaN in dequantized or accumulated values may carry
 * another sign or payload from one copy to the next; docs/quantization.md
 * leaves those bits unspecified (CUDA differs too). The wire format is
 * exact: a non-finite block's scale is always 0x7fc00000.
 * tests/test_quant.c runs every path the CPU has on the same inputs and
 * compares the bytes (NaN matching any NaN in dequantized values).
 *
 * How the hot loops vectorize (gcc 12, -O3, x86-64 baseline = SSE2 only;
 * read with objdump -d on quant_isa_generic.c.o; cycles per element in
 * L1/L2 on the 2.6 GHz development VM):
 *   - absmax works on bit patterns: with the sign bit cleared, integer order
 *     is the order of |x|, and a value >= the Inf pattern means NaN/Inf, so
 *     non-finite detection is free. bf16/fp16: pand + pmaxsw, 8 lanes per
 *     instruction; fp32: pand + pcmpgtd/pand/pandn/por (no pmaxsd in SSE2).
 *   - rint: SSE2 has no roundps and gcc vectorizes rintf/lrintf only with
 *     -fno-math-errno, so 1.5 * 2^23 is added and the integer read out of
 *     the mantissa (zpp__rint_small). The bf16 -> int8 loop is, per 16
 *     elements: 2 movdqu, punpcklwd/punpckhwd with zero + pslld $16
 *     (bf16 -> fp32), 4 mulps, 4 addps (the rounding), the narrowing of the
 *     low bytes as punpcklwd/punpckhwd + pand + packuswb, 1 movups: 42
 *     instructions, 0.6 cycles/element with the absmax pass (int4: 0.75).
 *     Round-to-nearest needs no clamp (see zpp__q_rne); stochastic adds
 *     minps/maxps, cmpltps + paddd for the floor, and the uniform stream,
 *     whose 64-bit multiplies become pmuludq/psrlq/paddq sequences
 *     (about 4.5 cycles/element in all).
 *   - int4 pack: pairs read as one 16-bit lane, pand/psrlw/por + packuswb;
 *     unpack: pand/psllw/psubw/por in 16-bit lanes.
 *   - dequantize: pcmpgtb/pcmpgtw + punpcklbw/punpcklwd (sign extension),
 *     cvtdq2ps, mulps; fp32 out 0.3 cycles/element. bf16 out with a finite
 *     scale (zpp__st_bf16_num): paddd/psrld/pand/psrad + punpcklwd
 *     narrowing, 0.8 cycles/element; the NaN-aware variant adds a pcmpgtd
 *     select and runs only for NaN-scale blocks.
 *   - fp16 <-> fp32 are branch-free bit manipulations (zpp__ld_fp16 and
 *     zpp__st_fp16 in core/dtype.h, the _num variants here; the compiler's
 *     _Float16 calls libgcc per element without F16C), if-converted into
 *     pcmpgtd/pand/pandn/por selects by zpp__sel; they equal _Float16 bit
 *     for bit (tested on every fp16 value and on random fp32 patterns) but
 *     cost 2-4x the bf16 paths.
 *   AVX2 / AVX-512 (the same source under a target pragma): the same loops
 *     on 8 / 16 fp32 lanes, vpmaxsd for the fp32 absmax, narrowing by
 *     vpackssdw/vpackuswb + vpermq (AVX2) or vpermt2w + vpmovwb (AVX-512),
 *     masked remainders (AVX-512). Rates: bench/RESULTS.md.
 */
#ifndef ZPP_QUANT_KERNELS_TABLE
#error "include quant_kernels.h from a quant_isa_*.c file that names its table"
#endif

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "quant/quant_isa.h"
#include "quant/quant_layout.h"
#include "quant/quant_rng.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire layout stores little-endian fp32 scales; add byte swaps for this host"
#endif

/* Elements per inner tile: the stack buffers below are a few KiB, in L1. */
#define ZPP__TILE 512
/* The canonical quiet NaN stored as the scale of a non-finite block. */
#define ZPP__NAN_BITS 0x7fc00000u
#define ZPP__NONE ZPP_QUANT_NONE

/* ------------------------------------------------------------------------ */
/* Branch-free conversions (vectorizable; equal to core/dtype.h bit for bit) */
/* ------------------------------------------------------------------------ */
/* (zpp__f32, zpp__u32, zpp__sel, zpp__ld_fp16 and zpp__st_fp16 are in
 * core/dtype.h, which also converts with them where there is no _Float16) */

/* bf16 is the top half of an fp32. */
static inline float zpp__ld_bf16(uint16_t h) { return zpp__f32((uint32_t)h << 16); }

/* zpp__ld_fp16 for a finite h (pass 2 of quantize runs only on blocks
 * without NaN/Inf): subnormal or normal, one select. */
static inline float zpp__ld_fp16_num(uint16_t h) {
    uint32_t a = h & 0x7fffu;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t normal = (a << 13) + (112u << 23);
    uint32_t sub = zpp__u32((float)(int32_t)a * 0x1p-24f);
    return zpp__f32(zpp__sel(a < 0x400u, sub, normal) | sign);
}

/* fp32 -> bf16, round to nearest even: adding 0x7fff plus the lowest kept
 * bit carries into bit 16 exactly when the dropped half is above the
 * midpoint, or at it with an odd kept part. A NaN keeps its top bits and is
 * forced quiet, so the add cannot turn it into Inf. */
static inline uint16_t zpp__st_bf16(float f) {
    uint32_t u = zpp__u32(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)zpp__sel((int32_t)(u & 0x7fffffffu) > 0x7f800000, nan, rounded);
}

/* zpp__st_bf16 for a non-NaN f (a dequantized value with a finite scale):
 * without the NaN select the loop halves (1.7 -> 0.8 cycles/element). The
 * arithmetic shift would allow a packssdw narrowing; gcc 12 still narrows
 * with punpcklwd shuffles. */
static inline uint16_t zpp__st_bf16_num(float f) {
    uint32_t u = zpp__u32(f);
    int32_t r = (int32_t)(u + 0x7fffu + ((u >> 16) & 1u));
    return (uint16_t)(r >> 16);
}

/* zpp__st_fp16 for a non-NaN f (a dequantized value with a finite scale). */
static inline uint16_t zpp__st_fp16_num(float f) {
    uint32_t u = zpp__u32(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t a = (int32_t)(u & 0x7fffffffu);
    uint32_t normal =
        ((uint32_t)a - (112u << 23) + 0xfffu + (((uint32_t)a >> 13) & 1u)) >> 13;
    uint32_t sub = zpp__u32(zpp__f32((uint32_t)a) + 0.5f) - 0x3f000000u;
    uint32_t r = zpp__sel(a >= 0x47800000, 0x7c00u, zpp__sel(a >= 0x38800000, normal, sub));
    return (uint16_t)(r | sign);
}

/* ------------------------------------------------------------------------ */
/* Rounding                                                                  */
/* ------------------------------------------------------------------------ */

/* rint(v) for |v| < 2^22. v + 1.5 * 2^23 lies in [2^23, 2^24), where fp32
 * numbers are the integers: the add itself rounds v half-to-even (1.5 * 2^23
 * is even, so the parity of the result is that of rint(v)), and the integer
 * sits in the mantissa, 0x4b400000 being the bits of 1.5 * 2^23. */
static inline int32_t zpp__rint_small(float v) {
    return (int32_t)zpp__u32(v + 0x1.8p23f) - 0x4b400000;
}

/* q = clamp(rint(v), -qmax, qmax) for v = x * inv with |x| <= absmax: the
 * clamp never acts, so it is left out. inv = RN(qmax / absmax) <=
 * (qmax / absmax)(1 + 2^-24), so |v| <= qmax (1 + 2^-24)^2 < qmax + 1/2 and
 * rint(v) is already in [-qmax, qmax] (the tests compare with a clamping
 * reference byte for byte). */
static inline int8_t zpp__q_rne(float v) { return (int8_t)zpp__rint_small(v); }

/* q = clamp(floor(w), -qmax, qmax): rint, then one down where rint went up.
 * Here the clamp matters: w = v + u reaches qmax + 1 and -qmax - 2^-23.
 * Clamping first is the same (qmax is an integer and floor is monotone),
 * and `a < b ? a : b` is exactly minps. */
static inline int8_t zpp__q_floor(float w, float qmax) {
    w = w < qmax ? w : qmax;
    w = w > -qmax ? w : -qmax;
    int32_t r = zpp__rint_small(w);
    r -= (float)r > w;
    return (int8_t)r;
}

/* E2M1 in half units. x * (12 / absmax) puts the grid {0, 0.5, 1, 1.5, 2,
 * 3, 4, 6} * scale at the integers {0, 1, 2, 3, 4, 6, 8, 12}: steps of 1
 * below 4, of 2 below 8 and of 4 up to 12. Rounding to that grid is
 * rounding |v| / k to an integer, times k, with k the step where |v| lies;
 * rint's ties to even fall on the even mantissa (2.5 -> 2, 3.5 -> 4,
 * 5 -> 4, 7 -> 8, 10 -> 8). The divisions by k are exact (powers of two),
 * and so is every product below (small integers). k and 1/k are chosen on
 * a's bits (a >= 0: 4.0 is 0x40800000, 8.0 0x41000000) by integer selects,
 * which vectorize where float ternaries stay branches (zpp__sel). */
static inline float zpp__e2m1_step(float a) {
    uint32_t b = zpp__u32(a);
    return zpp__f32(zpp__sel(b < 0x40800000u, 0x3f800000u,                 /* 1 */
                             zpp__sel(b < 0x41000000u, 0x40000000u,         /* 2 */
                                      0x40800000u)));                       /* 4 */
}
static inline float zpp__e2m1_inv_step(float a) {
    uint32_t b = zpp__u32(a);
    return zpp__f32(zpp__sel(b < 0x40800000u, 0x3f800000u,                 /* 1 */
                             zpp__sel(b < 0x41000000u, 0x3f000000u,         /* 1/2 */
                                      0x3e800000u)));                       /* 1/4 */
}

/* The E2M1 nibble (zpp__e2m1_code below) of the nearest grid point of
 * v = x * inv, |v| <= 12 (1 + 2^-24)^2, found from v's bits. From 2 up the
 * grid {2, 3, 4, 6, 8, 12} is the fp32 numbers with one mantissa bit, so
 * rounding there is rounding the bit pattern to its top mantissa bit, ties
 * to even: add 2^21 - 1 plus that bit (the bf16 store's trick, 22 bits
 * instead of 16); 12 (1 + 2^-24)^2 is 12 in fp32, so nothing reaches 16.
 * The magnitude code is then the exponent and that bit, 2e + m, which is
 * (bits >> 22) - 254 for e = 1..3. Below 2 the step is 1 and the code is
 * rint(|v|). These are the nibbles of rint(|v| / k) k with k the step (the
 * stochastic path's form below), for every fp32 up to 12 (checked
 * exhaustively when written; test_quant compares with a grid search), in
 * integer operations and selects that vectorize on every ISA, and with no
 * coding pass after. */
static inline uint8_t zpp__e2m1_rne_code(float v) {
    uint32_t u = zpp__u32(v), b = u & 0x7fffffffu; /* |v|'s bits: 2.0 is 0x40000000 */
    uint32_t top = ((b + 0x1fffffu + ((b >> 22) & 1u)) >> 22) - 254u;
    uint32_t c = zpp__sel(b < 0x40000000u, (uint32_t)zpp__rint_small(zpp__f32(b)), top);
    return (uint8_t)(c | zpp__sel(c != 0, (u >> 28) & 8u, 0u)); /* no -0: code 0 */
}

/* Stochastic: |v| goes up to the next grid point with probability equal to
 * its fraction of the gap, floor(|v| / k + u) * k, so E[q] = v; the sign
 * is kept (rounding the magnitude is unbiased on either side). w can round
 * to 4 at the top step (|v| / 4 = 3, u near 1): the clamp keeps it at 12. */
static inline int8_t zpp__e2m1_floor(float v, float u) {
    float a = fabsf(v);
    float w = a * zpp__e2m1_inv_step(a) + u;
    float f = (float)(int32_t)w; /* floor: w >= 0, and truncation vectorizes */
    float m = f * zpp__e2m1_step(a);
    int32_t q = zpp__rint_small(m);
    q = (int32_t)zpp__sel(q > 12, 12u, (uint32_t)q); /* the top step's 16 is 12 */
    int32_t neg = -(int32_t)(zpp__u32(v) >> 31); /* all ones for v < 0 (and -0: q is 0) */
    return (int8_t)((q ^ neg) - neg);
}

/* ------------------------------------------------------------------------ */
/* Kernels over one dtype (the switch on dtype is outside the loops)         */
/* ------------------------------------------------------------------------ */

/* Largest |x| bit pattern with the sign cleared (see the top comment). */
static uint32_t zpp__amax_bits16(const uint16_t *restrict x, size_t len) {
    int16_t m = 0;
    for (size_t i = 0; i < len; i++) {
        int16_t a = (int16_t)(x[i] & 0x7fff);
        m = a > m ? a : m;
    }
    return (uint32_t)m;
}

static uint32_t zpp__amax_bits32(const float *restrict x, size_t len) {
    int32_t m = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t a = (int32_t)(zpp__u32(x[i]) & 0x7fffffffu);
        m = a > m ? a : m;
    }
    return (uint32_t)m;
}

static inline float zpp__ld_f32(float f) { return f; }

/* q[i] for len elements: round half even, or stochastic with uniforms u. */
#define ZPP__QUANT_KERNELS(NAME, T, LOAD)                                     \
    static void zpp__q_rne_##NAME(const T *restrict x, size_t len, float inv, \
                                  int8_t *restrict q) {                       \
        for (size_t i = 0; i < len; i++) {                                    \
            float v = LOAD(x[i]) * inv;                                       \
            q[i] = zpp__q_rne(v);                                             \
        }                                                                     \
    }                                                                         \
    static void zpp__q_sr_##NAME(const T *restrict x, const float *restrict u, \
                                 size_t len, float inv, float qmax,           \
                                 int8_t *restrict q) {                        \
        for (size_t i = 0; i < len; i++) {                                    \
            float v = LOAD(x[i]) * inv;                                       \
            float w = v + u[i];                                               \
            q[i] = zpp__q_floor(w, qmax);                                     \
        }                                                                     \
    }                                                                         \
    static void zpp__c_e2m1_rne_##NAME(const T *restrict x, size_t len,       \
                                       float inv, uint8_t *restrict c) {      \
        for (size_t i = 0; i < len; i++) {                                    \
            float v = LOAD(x[i]) * inv;                                       \
            c[i] = zpp__e2m1_rne_code(v);                                     \
        }                                                                     \
    }                                                                         \
    static void zpp__q_e2m1_sr_##NAME(const T *restrict x, const float *restrict u, \
                                      size_t len, float inv, int8_t *restrict q) { \
        for (size_t i = 0; i < len; i++) {                                    \
            float v = LOAD(x[i]) * inv;                                       \
            q[i] = zpp__e2m1_floor(v, u[i]);                                  \
        }                                                                     \
    }

ZPP__QUANT_KERNELS(f32, float, zpp__ld_f32)
ZPP__QUANT_KERNELS(bf16, uint16_t, zpp__ld_bf16)
ZPP__QUANT_KERNELS(fp16, uint16_t, zpp__ld_fp16_num)

/* y[i] = (float)q[i] * s, rounded to the output dtype. */
#define ZPP__DEQUANT_KERNEL(NAME, T, STORE)                                   \
    static void zpp__dq_##NAME(const int8_t *restrict q, size_t len, float s, \
                               T *restrict y) {                               \
        for (size_t i = 0; i < len; i++) {                                    \
            float v = (float)q[i] * s;                                        \
            y[i] = STORE(v);                                                  \
        }                                                                     \
    }

static inline float zpp__st_f32(float f) { return f; }
ZPP__DEQUANT_KERNEL(f32, float, zpp__st_f32)
ZPP__DEQUANT_KERNEL(bf16, uint16_t, zpp__st_bf16)
ZPP__DEQUANT_KERNEL(bf16_num, uint16_t, zpp__st_bf16_num)
ZPP__DEQUANT_KERNEL(fp16, uint16_t, zpp__st_fp16)
ZPP__DEQUANT_KERNEL(fp16_num, uint16_t, zpp__st_fp16_num)

/* acc[i] += (float)q[i] * s, one rounding for the product, one for the sum. */
static void zpp__dq_acc(const int8_t *restrict q, size_t len, float s, float *restrict acc) {
    for (size_t i = 0; i < len; i++) {
        float v = (float)q[i] * s;
        acc[i] = acc[i] + v;
    }
}

/* int4 pack: element 2j in the low nibble of byte j, 2j+1 in the high one.
 * A pair of int8 read as one little-endian 16-bit lane keeps element 2j in
 * bits 0..3 and 2j+1 in bits 8..11. */
static void zpp__pack4(const int8_t *restrict q, size_t len, uint8_t *restrict p) {
    size_t h = len / 2;
    for (size_t j = 0; j < h; j++) {
        uint16_t w;
        memcpy(&w, q + 2 * j, 2);
        p[j] = (uint8_t)((w & 0x0fu) | ((w >> 4) & 0xf0u));
    }
    if (len & 1) p[h] = (uint8_t)(q[len - 1] & 0x0f);
}

/* int4 unpack into int8 pairs, in 16-bit lanes: spread the nibbles to bytes
 * 0 and 1, then sign-extend each: a nibble with bit 3 set gets 0xf0
 * (8 * 0x1e = 0xf0, no carry between the bytes). */
static void zpp__unpack4(const uint8_t *restrict p, size_t len, int8_t *restrict q) {
    size_t h = len / 2;
    for (size_t j = 0; j < h; j++) {
        uint32_t b = p[j];
        uint16_t w = (uint16_t)((b & 0x0fu) | ((b & 0xf0u) << 4));
        w = (uint16_t)(w | ((w & 0x0808u) * 0x1eu));
        memcpy(q + 2 * j, &w, 2);
    }
    if (len & 1) {
        uint32_t n = p[h] & 0x0fu;
        q[len - 1] = (int8_t)((int32_t)(n ^ 8u) - 8);
    }
}

/* E2M1 nibbles <-> half units (the grid {0, 1, 2, 3, 4, 6, 8, 12}):
 * magnitude code c = index in the grid, bit 3 the sign. Going up, c = a up
 * to 4, then 5, 6, 7 for 6, 8, 12; going down, the grid is c below 4, else
 * 2c - 4, plus 2 at c = 7. Byte arithmetic and selects, one element per
 * byte lane (the pairs are packed and spread as int4's nibbles are), so
 * the loops vectorize. */
static inline uint8_t zpp__e2m1_code(int8_t q) {
    uint8_t a = (uint8_t)(q < 0 ? -q : q);
    uint8_t c = (uint8_t)(a <= 4 ? a : 5 + (a > 6) + (a > 8));
    return (uint8_t)(c | (q < 0 ? 8 : 0));
}

static inline int8_t zpp__e2m1_value(uint8_t nibble) {
    uint8_t c = nibble & 7u;
    uint8_t a = (uint8_t)(c < 4 ? c : 2 * c - 4 + (c == 7 ? 2 : 0));
    return (int8_t)(nibble & 8u ? -a : a);
}

static void zpp__pack_e2m1(const int8_t *restrict q, size_t len, uint8_t *restrict p) {
    uint8_t c[ZPP__TILE]; /* len <= ZPP__TILE */
    for (size_t i = 0; i < len; i++) c[i] = zpp__e2m1_code(q[i]);
    size_t h = len / 2;
    for (size_t j = 0; j < h; j++) {
        uint16_t w;
        memcpy(&w, c + 2 * j, 2);
        p[j] = (uint8_t)((w & 0x0fu) | ((w >> 4) & 0xf0u));
    }
    if (len & 1) p[h] = c[len - 1];
}

static void zpp__unpack_e2m1(const uint8_t *restrict p, size_t len, int8_t *restrict q) {
    uint8_t n[ZPP__TILE]; /* len <= ZPP__TILE */
    size_t h = len / 2;
    for (size_t j = 0; j < h; j++) {
        uint32_t b = p[j];
        uint16_t w = (uint16_t)((b & 0x0fu) | ((b & 0xf0u) << 4));
        memcpy(n + 2 * j, &w, 2);
    }
    if (len & 1) n[len - 1] = p[h] & 0x0fu;
    for (size_t i = 0; i < len; i++) q[i] = zpp__e2m1_value(n[i]);
}

/* ------------------------------------------------------------------------ */
/* One block                                                                 */
/* ------------------------------------------------------------------------ */

/* What multiplies a payload integer: the stored scale, or half of it for
 * E2M1's half units (exact unless the scale is subnormal). */
static inline float zpp__unit(int format, float s) {
    return format == ZPP_QUANT_E2M1 ? 0.5f * s : s;
}

/* payload bytes -> int8 values of len elements (int4 and E2M1). */
static void zpp__unpack(int format, const uint8_t *p, size_t len, int8_t *q) {
    if (format == ZPP_QUANT_E2M1) zpp__unpack_e2m1(p, len, q);
    else zpp__unpack4(p, len, q);
}

static int zpp__bad_bits(zpp_dtype dtype, uint32_t abs_bits) {
    switch (dtype) {
    case ZPP_BF16: return abs_bits >= 0x7f80u;
    case ZPP_FP16: return abs_bits >= 0x7c00u;
    default: return abs_bits >= 0x7f800000u;
    }
}

static uint32_t zpp__abs_bits_at(const void *x, zpp_dtype dtype, size_t i) {
    if (dtype == ZPP_FP32) return zpp__u32(((const float *)x)[i]) & 0x7fffffffu;
    return ((const uint16_t *)x)[i] & 0x7fffu;
}

static void zpp__q_rne_dt(zpp_dtype dtype, const void *x, size_t len, float inv, int8_t *q) {
    switch (dtype) {
    case ZPP_BF16: zpp__q_rne_bf16(x, len, inv, q); break;
    case ZPP_FP16: zpp__q_rne_fp16(x, len, inv, q); break;
    default: zpp__q_rne_f32(x, len, inv, q); break;
    }
}

static void zpp__q_sr_dt(zpp_dtype dtype, const void *x, const float *u, size_t len,
                         float inv, float qmax, int8_t *q) {
    switch (dtype) {
    case ZPP_BF16: zpp__q_sr_bf16(x, u, len, inv, qmax, q); break;
    case ZPP_FP16: zpp__q_sr_fp16(x, u, len, inv, qmax, q); break;
    default: zpp__q_sr_f32(x, u, len, inv, qmax, q); break;
    }
}

/* E2M1 rounded to nearest: the nibbles themselves. */
static void zpp__c_e2m1_dt(zpp_dtype dtype, const void *x, size_t len, float inv, uint8_t *c) {
    switch (dtype) {
    case ZPP_BF16: zpp__c_e2m1_rne_bf16(x, len, inv, c); break;
    case ZPP_FP16: zpp__c_e2m1_rne_fp16(x, len, inv, c); break;
    default: zpp__c_e2m1_rne_f32(x, len, inv, c); break;
    }
}

/* E2M1 rounded stochastically, in half units. */
static void zpp__q_e2m1_sr_dt(zpp_dtype dtype, const void *x, const float *u, size_t len,
                              float inv, int8_t *q) {
    switch (dtype) {
    case ZPP_BF16: zpp__q_e2m1_sr_bf16(x, u, len, inv, q); break;
    case ZPP_FP16: zpp__q_e2m1_sr_fp16(x, u, len, inv, q); break;
    default: zpp__q_e2m1_sr_f32(x, u, len, inv, q); break;
    }
}

/* A block whose absmax is so small (below qmax / FLT_MAX, about 3.7e-37
 * for int8) that inv = qmax / absmax overflows to +Inf. The formula is then
 * followed literally, as CUDA's __float2int_rn / _rd do it: x * inv is
 * +-Inf for x != 0 and saturates to +-qmax, and 0 * Inf = NaN becomes 0.
 * (The scale absmax / qmax is stored as usual.) Rare, so scalar. */
static void zpp__q_tiny(zpp_dtype dtype, const void *x, const float *u, size_t len, float inv,
                        float qmax, int8_t *q) {
    for (size_t i = 0; i < len; i++) {
        float v = zpp_load_f32(x, dtype, i) * inv;
        if (u) v = v + u[i];
        float t = u ? floorf(v) : rintf(v);
        q[i] = (int8_t)(isnan(t) ? 0 : t >= qmax ? qmax : t <= -qmax ? -qmax : t);
    }
}

/*
 * Quantizes len <= block elements at x (element index idx0 in the random
 * stream) into the payload bytes p (len for int8, ceil(len/2) for int4) and
 * *scale_p. Returns the position in the block of the first non-finite
 * element, or len if there is none.
 */
static size_t zpp__quant_block(const void *x, zpp_dtype dtype, size_t len,
                               const zpp_quant_spec *spec, uint64_t idx0, uint8_t *p,
                               float *scale_p) {
    const float qmax = zpp_ql_qmax(spec);
    const size_t es = zpp_dtype_size(dtype);
    const size_t pbytes = zpp_ql_payload_bytes(len, spec->bits);

    /* Pass 1: absmax on the bit patterns; also finds NaN/Inf. */
    uint32_t amax_bits = dtype == ZPP_FP32 ? zpp__amax_bits32(x, len)
                                           : zpp__amax_bits16(x, len);
    if (zpp__bad_bits(dtype, amax_bits)) {
        size_t first = 0;
        while (!zpp__bad_bits(dtype, zpp__abs_bits_at(x, dtype, first))) first++;
        memset(p, 0, pbytes);
        *scale_p = zpp__f32(ZPP__NAN_BITS);
        return first;
    }
    float amax = dtype == ZPP_FP32   ? zpp__f32(amax_bits)
                 : dtype == ZPP_BF16 ? zpp__ld_bf16((uint16_t)amax_bits)
                                     : zpp__ld_fp16((uint16_t)amax_bits);
    if (amax_bits == 0) { /* all zero: scale 0, payload 0 */
        memset(p, 0, pbytes);
        *scale_p = 0.0f;
        return len;
    }
    const int e2m1 = spec->format == ZPP_QUANT_E2M1;
    float inv = qmax / amax;
    *scale_p = amax / zpp_ql_scale_div(spec);
    const int tiny = !(inv <= FLT_MAX); /* see zpp__q_tiny */

    /* Pass 2: scale, round, store (the block is in L1 after pass 1). */
    if (spec->bits == 8 && !spec->stochastic && !tiny) {
        zpp__q_rne_dt(dtype, x, len, inv, (int8_t *)p);
        return len;
    }
    uint16_t qtile[ZPP__TILE / 2]; /* int8 values; uint16 so pack4 may read pairs */
    float utile[ZPP__TILE];
    for (size_t off = 0; off < len; off += ZPP__TILE) {
        size_t m = len - off < ZPP__TILE ? len - off : ZPP__TILE;
        const void *xs = (const char *)x + off * es;
        int8_t *q = spec->bits == 8 ? (int8_t *)p + off : (int8_t *)qtile;
        if (spec->stochastic)
            for (size_t i = 0; i < m; i++)
                utile[i] = zpp_quant_uniform(spec->seed, idx0 + off + i);
        /* E2M1 to nearest writes its nibbles, which pack as int4's do;
         * the other E2M1 paths write half units, coded as they pack. */
        const int nibbles = e2m1 && !tiny && !spec->stochastic;
        if (tiny) /* saturates to +-qmax or gives 0: grid points in every format */
            zpp__q_tiny(dtype, xs, spec->stochastic ? utile : NULL, m, inv, qmax, q);
        else if (nibbles)
            zpp__c_e2m1_dt(dtype, xs, m, inv, (uint8_t *)q);
        else if (e2m1)
            zpp__q_e2m1_sr_dt(dtype, xs, utile, m, inv, q);
        else if (spec->stochastic)
            zpp__q_sr_dt(dtype, xs, utile, m, inv, qmax, q);
        else
            zpp__q_rne_dt(dtype, xs, m, inv, q);
        if (e2m1 && !nibbles) zpp__pack_e2m1(q, m, p + off / 2); /* off is even */
        else if (spec->bits == 4) zpp__pack4(q, m, p + off / 2);
    }
    return len;
}

/* y (dtype) = dequantized payload p of len elements with stored scale s. */
static void zpp__dequant_block(const uint8_t *p, const zpp_quant_spec *spec, size_t len, float s,
                               zpp_dtype dtype, void *y) {
    const size_t es = zpp_dtype_size(dtype);
    uint16_t qtile[ZPP__TILE / 2];
    s = zpp__unit(spec->format, s);
    for (size_t off = 0; off < len; off += ZPP__TILE) {
        size_t m = len - off < ZPP__TILE ? len - off : ZPP__TILE;
        const int8_t *q = (const int8_t *)p + off;
        if (spec->bits == 4) {
            zpp__unpack(spec->format, p + off / 2, m, (int8_t *)qtile);
            q = (const int8_t *)qtile;
        }
        void *ys = (char *)y + off * es;
        switch (dtype) {
        case ZPP_BF16:
            /* q * s is a number unless the scale is not (a non-finite block) */
            if (isfinite(s)) zpp__dq_bf16_num(q, m, s, ys);
            else zpp__dq_bf16(q, m, s, ys);
            break;
        case ZPP_FP16:
            if (isfinite(s)) zpp__dq_fp16_num(q, m, s, ys);
            else zpp__dq_fp16(q, m, s, ys);
            break;
        default: zpp__dq_f32(q, m, s, ys); break;
        }
    }
}

static void zpp__acc_block(const uint8_t *p, const zpp_quant_spec *spec, size_t len, float s,
                           float *acc) {
    if (spec->bits == 8) {
        zpp__dq_acc((const int8_t *)p, len, s, acc);
        return;
    }
    uint16_t qtile[ZPP__TILE / 2];
    s = zpp__unit(spec->format, s);
    for (size_t off = 0; off < len; off += ZPP__TILE) {
        size_t m = len - off < ZPP__TILE ? len - off : ZPP__TILE;
        zpp__unpack(spec->format, p + off / 2, m, (int8_t *)qtile);
        zpp__dq_acc((const int8_t *)qtile, m, s, acc + off);
    }
}

static float zpp__scale_at(const uint8_t *q, size_t n, int bits, size_t b) {
    float s;
    memcpy(&s, q + zpp_ql_scales_offset(n, bits) + 4 * b, 4);
    return s;
}

/* acc[e - e0] += dequantized element e of the n-element tensor q, for e in
 * [e0, e1); e0 must be a multiple of 8 (a block boundary of any spec). */
static void zpp__acc_range(const uint8_t *q, size_t n, const zpp_quant_spec *spec, size_t e0,
                           size_t e1, float *acc) {
    size_t e = e0;
    while (e < e1) {
        size_t b = e / spec->block;
        size_t end = (b + 1) * spec->block;
        if (end > e1) end = e1;
        const uint8_t *p = q + (spec->bits == 8 ? e : e / 2);
        zpp__acc_block(p, spec, end - e, zpp__scale_at(q, n, spec->bits, b),
                       acc + (e - e0));
        e = end;
    }
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */
/* ------------------------------------------------------------------------ */

/* Software prefetch of bytes [from, from + len) of a buffer of `size`
 * bytes at base, clipped to the buffer. The blocks are streamed in order,
 * but between the loads of consecutive blocks the loop computes, and the
 * hardware prefetcher alone does not keep enough lines in flight: prefetching
 * ZPP__AHEAD bytes ahead brought a large bf16 -> int8 quantize to memcpy
 * speed on the development VM and made the dequantize faster too
 * (bench/RESULTS.md, "CPU, commit 9d34ca2"). */
#define ZPP__AHEAD 2048
#if defined(__GNUC__)
#define ZPP__PREFETCH(base, size, from, len, rw)                              \
    do {                                                                      \
        size_t zpp_pf_end_ = (from) + (len) < (size) ? (from) + (len) : (size); \
        for (size_t zpp_pf_ = (from); zpp_pf_ < zpp_pf_end_; zpp_pf_ += 64)    \
            __builtin_prefetch((const char *)(base) + zpp_pf_, rw, 3);        \
    } while (0)
#else
#define ZPP__PREFETCH(base, size, from, len, rw) ((void)0)
#endif

/* Zero bytes between payload and scales and after the scales. */
static void zpp__zero_padding(uint8_t *out, size_t n, const zpp_quant_spec *spec) {
    size_t pb = zpp_ql_payload_bytes(n, spec->bits);
    size_t so = zpp_ql_scales_offset(n, spec->bits);
    size_t se = so + 4 * zpp_ql_num_blocks(n, spec->block);
    memset(out + pb, 0, so - pb);
    memset(out + se, 0, zpp_ql_bytes(n, spec) - se);
}

/* Quantizes n elements as one tensor; idx0 is the stream index of x[0].
 * Returns the stream index of the first non-finite element, or ZPP__NONE. */
static uint64_t zpp__quant_tensor(const void *x, zpp_dtype dtype, size_t n,
                                  const zpp_quant_spec *spec, uint64_t idx0, void *out) {
    if (n == 0) return ZPP__NONE; /* zero bytes; out may be NULL */
    uint8_t *o = out;
    const size_t es = zpp_dtype_size(dtype);
    const size_t so = zpp_ql_scales_offset(n, spec->bits);
    uint64_t first_bad = ZPP__NONE;
    size_t nb = zpp_ql_num_blocks(n, spec->block);
    for (size_t b = 0; b < nb; b++) {
        size_t e = b * spec->block;
        size_t len = n - e < spec->block ? n - e : spec->block;
        float s;
        ZPP__PREFETCH(x, n * es, e * es + ZPP__AHEAD, len * es, 0);
        size_t bad = zpp__quant_block((const char *)x + e * es, dtype, len, spec, idx0 + e,
                                      o + (spec->bits == 8 ? e : e / 2), &s);
        memcpy(o + so + 4 * b, &s, 4);
        if (bad < len && first_bad == ZPP__NONE) first_bad = idx0 + e + bad;
    }
    zpp__zero_padding(o, n, spec);
    return first_bad;
}

static void zpp__dequant_tensor(const uint8_t *q, size_t n, const zpp_quant_spec *spec,
                                zpp_dtype dtype, void *y) {
    const size_t es = zpp_dtype_size(dtype);
    size_t nb = zpp_ql_num_blocks(n, spec->block);
    for (size_t b = 0; b < nb; b++) {
        size_t e = b * spec->block;
        size_t len = n - e < spec->block ? n - e : spec->block;
        ZPP__PREFETCH(q, zpp_ql_payload_bytes(n, spec->bits),
                      zpp_ql_payload_bytes(e, spec->bits) + ZPP__AHEAD,
                      zpp_ql_payload_bytes(len, spec->bits), 0);
        zpp__dequant_block(q + (spec->bits == 8 ? e : e / 2), spec, len,
                           zpp__scale_at(q, n, spec->bits, b), dtype, (char *)y + e * es);
    }
}

/* ------------------------------------------------------------------------ */
/* Dequantize-sum-requantize, qgZ's last step and dtype conversion           */
/* ------------------------------------------------------------------------ */

/* See zpp_quant_kernels.sum_requant. Element i of chunk c draws the
 * stochastic index c * idx_stride + idx_first + i. One output block of fp32
 * sums at a time: it stays in cache between the sum and the requantize. */
static uint64_t zpp__sum_requant(const void *const *ins, const uint8_t *base, size_t stride,
                                 int k, size_t n_chunks, size_t chunk_len, size_t idx_stride,
                                 size_t idx_first, const zpp_quant_spec *in_spec,
                                 const zpp_quant_spec *out_spec, float *sum, void *out) {
    const size_t qin = zpp_ql_bytes(chunk_len, in_spec);
    const size_t qout = zpp_ql_bytes(chunk_len, out_spec);
    const size_t so = zpp_ql_scales_offset(chunk_len, out_spec->bits);
    const size_t nb = zpp_ql_num_blocks(chunk_len, out_spec->block);
    uint64_t first_bad = ZPP__NONE;
    for (size_t c = 0; c < n_chunks; c++) {
        uint8_t *o = (uint8_t *)out + c * qout;
        for (size_t b = 0; b < nb; b++) {
            size_t e = b * out_spec->block;
            size_t len = chunk_len - e < out_spec->block ? chunk_len - e : out_spec->block;
            memset(sum, 0, len * sizeof *sum);
            for (int j = 0; j < k; j++) {
                const uint8_t *in = ins ? (const uint8_t *)ins[j] : base + (size_t)j * stride;
                zpp__acc_range(in + c * qin, chunk_len, in_spec, e, e + len, sum);
            }
            float s;
            uint64_t idx0 = (uint64_t)c * idx_stride + idx_first + e;
            size_t bad = zpp__quant_block(sum, ZPP_FP32, len, out_spec, idx0,
                                          o + (out_spec->bits == 8 ? e : e / 2), &s);
            memcpy(o + so + 4 * b, &s, 4);
            if (bad < len && first_bad == ZPP__NONE) first_bad = idx0 + bad;
        }
        zpp__zero_padding(o, chunk_len, out_spec);
    }
    return first_bad;
}

static void zpp__scale_f32(float *restrict y, size_t len, float scale) {
    for (size_t i = 0; i < len; i++) y[i] = scale * y[i];
}

/* out = scale * (exact + the chunks in order), exact = 0 when NULL. */
static void zpp__dequant_reduce(const uint8_t *q, size_t n_chunks, size_t stride,
                                size_t chunk_len, const zpp_quant_spec *spec, const float *exact,
                                float scale, float *out) {
    /* Column tiles (multiples of 8, so tile starts are block-aligned) keep
     * the fp32 partial sums in cache while the chunks stream past. */
    const size_t tile = 4096;
    for (size_t e0 = 0; e0 < chunk_len; e0 += tile) {
        size_t e1 = chunk_len - e0 < tile ? chunk_len : e0 + tile;
        if (!exact) memset(out + e0, 0, (e1 - e0) * sizeof *out);
        else if (exact != out) memcpy(out + e0, exact + e0, (e1 - e0) * sizeof *out);
        for (size_t c = 0; c < n_chunks; c++)
            zpp__acc_range(q + c * stride, chunk_len, spec, e0, e1, out + e0);
        zpp__scale_f32(out + e0, e1 - e0, scale);
    }
}

#define ZPP__LOAD_SCALED(NAME, T, LOAD)                                       \
    static void zpp__ls_##NAME(const T *restrict x, size_t len, float scale,  \
                               float *restrict y) {                           \
        for (size_t i = 0; i < len; i++) y[i] = scale * LOAD(x[i]);           \
    }
ZPP__LOAD_SCALED(f32, float, zpp__ld_f32)
ZPP__LOAD_SCALED(bf16, uint16_t, zpp__ld_bf16)
ZPP__LOAD_SCALED(fp16, uint16_t, zpp__ld_fp16)

#define ZPP__STORE(NAME, T, STORE)                                            \
    static void zpp__st_##NAME##_n(const float *restrict v, size_t len, T *restrict y) { \
        for (size_t i = 0; i < len; i++) y[i] = STORE(v[i]);                  \
    }
ZPP__STORE(f32, float, zpp__st_f32)
ZPP__STORE(bf16, uint16_t, zpp__st_bf16)
ZPP__STORE(fp16, uint16_t, zpp__st_fp16)

/* A whole tile is read before it is written, so in == out is safe (same
 * dtype; quant.c refuses in-place conversions between dtypes). */
static void zpp__convert(const void *in, zpp_dtype in_dtype, void *out, zpp_dtype out_dtype,
                         size_t n, float scale) {
    const size_t ies = zpp_dtype_size(in_dtype), oes = zpp_dtype_size(out_dtype);
    float v[ZPP__TILE];
    for (size_t off = 0; off < n; off += ZPP__TILE) {
        size_t m = n - off < ZPP__TILE ? n - off : ZPP__TILE;
        const void *xs = (const char *)in + off * ies;
        void *ys = (char *)out + off * oes;
        switch (in_dtype) {
        case ZPP_BF16: zpp__ls_bf16(xs, m, scale, v); break;
        case ZPP_FP16: zpp__ls_fp16(xs, m, scale, v); break;
        default: zpp__ls_f32(xs, m, scale, v); break;
        }
        switch (out_dtype) {
        case ZPP_BF16: zpp__st_bf16_n(v, m, ys); break;
        case ZPP_FP16: zpp__st_fp16_n(v, m, ys); break;
        default: zpp__st_f32_n(v, m, ys); break;
        }
    }
}

const zpp_quant_kernels ZPP_QUANT_KERNELS_TABLE = {
    .quantize = zpp__quant_tensor,
    .dequantize = zpp__dequant_tensor,
    .accumulate = zpp__acc_range,
    .sum_requant = zpp__sum_requant,
    .dequant_reduce = zpp__dequant_reduce,
    .convert = zpp__convert,
};

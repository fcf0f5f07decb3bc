/* quant/quant.c — block quantization, the CPU reference (wire layout and
 * rounding rules: zeropp.h, docs/quantization.md).
 *
 * The math, per block of at most `block` elements:
 *
 *     absmax = max |x|          (fp32; bf16/fp16 converted exactly)
 *     scale  = absmax / qmax    (fp32 IEEE division; this is what is stored)
 *     inv    = qmax / absmax    (fp32 IEEE division)
 *     q      = clamp(rint(x * inv), -qmax, qmax)              round half even
 *     q      = clamp(floor(x * inv + u), -qmax, qmax)         stochastic,
 *                  u = zpp_quant_uniform(seed, element index)
 *     y      = (float)q * scale, then rounded to the output dtype
 *
 * Every product and sum is its own statement and the build is ISO C
 * (-std=c11, where GCC does not contract a*b+c into an FMA), so each
 * operation is one IEEE fp32 rounding; CUDA must match this with
 * __fmul_rn / __fadd_rn (nvcc fuses by default).
 *
 * Edge cases, defined so CPU and GPU agree:
 *   - absmax == 0: scale 0, payload 0.
 *   - 0 < absmax < qmax / FLT_MAX (about 3.7e-37 for int8): inv overflows
 *     to +Inf; the formula is followed literally with NaN -> 0 and +-Inf
 *     saturating (zpp__q_tiny): q = sign(x) * qmax, or 0 where x == 0.
 *   - a NaN or Inf in the block: scale NaN (bits 0x7fc00000), payload 0.
 *
 * How the hot loops vectorize (gcc 12, -O3, x86-64 baseline = SSE2 only;
 * read with objdump -d on quant.c.o; cycles per element in L1/L2 on the
 * 2.6 GHz development VM):
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
 *     friends; the compiler's _Float16 calls libgcc per element without
 *     F16C), if-converted into pcmpgtd/pand/pandn/por selects by zpp__sel;
 *     they equal core/dtype.h bit for bit (tested on every fp16 value and
 *     on random fp32 patterns) but cost 2-4x the bf16 paths.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant_cpu.h"
#include "quant/quant_rng.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire layout stores little-endian fp32 scales; add byte swaps for this host"
#endif

#define ZPP__MAX_BLOCK ((size_t)1 << 20)
/* Elements per inner tile: the stack buffers below are a few KiB, in L1. */
#define ZPP__TILE 512
/* The canonical quiet NaN stored as the scale of a non-finite block. */
#define ZPP__NAN_BITS 0x7fc00000u

/* ------------------------------------------------------------------------ */
/* Spec and layout                                                           */
/* ------------------------------------------------------------------------ */

zpp_quant_spec zpp_quant_spec_default(int bits) {
    zpp_quant_spec s;
    s.bits = bits;
    s.block = bits == 4 ? ZPP_QUANT_DEFAULT_BLOCK_INT4 : ZPP_QUANT_DEFAULT_BLOCK_INT8;
    s.stochastic = 0;
    s.seed = 0;
    return s;
}

zpp_status zpp_quant_spec_check(const zpp_quant_spec *spec) {
    if (!spec) return zpp_error(ZPP_ERR_INVALID, "quantization spec is NULL");
    if (spec->bits != 8 && spec->bits != 4)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: %d bits is not supported; use 8 (int8) or 4 (int4)",
                         spec->bits);
    if (spec->block == 0 || spec->block % 8 != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: block size %zu is not a positive multiple of 8; use "
                         "32, 64, 128, 256, ... (defaults: %d for int8, %d for int4)",
                         spec->block, ZPP_QUANT_DEFAULT_BLOCK_INT8,
                         ZPP_QUANT_DEFAULT_BLOCK_INT4);
    if (spec->block > ZPP__MAX_BLOCK)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: block size %zu exceeds the maximum %zu; use a smaller "
                         "block",
                         spec->block, ZPP__MAX_BLOCK);
    if (spec->stochastic != 0 && spec->stochastic != 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: stochastic is %d; use 0 (round half to even) or 1",
                         spec->stochastic);
    return ZPP_OK;
}

static size_t zpp__round16(size_t b) {
    return (b + ZPP_QUANT_ALIGN - 1) / ZPP_QUANT_ALIGN * ZPP_QUANT_ALIGN;
}

size_t zpp_quant_payload_bytes(size_t n, int bits) {
    if (bits == 8) return n;
    if (bits == 4) return n / 2 + (n & 1);
    return 0;
}

size_t zpp_quant_scales_offset(size_t n, int bits) {
    return zpp__round16(zpp_quant_payload_bytes(n, bits));
}

size_t zpp_quant_num_blocks(size_t n, size_t block) {
    if (block == 0) return 0;
    return n / block + (n % block != 0);
}

size_t zpp_quant_bytes(size_t n, const zpp_quant_spec *spec) {
    if (!spec) return 0;
    return zpp__round16(zpp_quant_scales_offset(n, spec->bits) +
                        4 * zpp_quant_num_blocks(n, spec->block));
}

static zpp_status zpp__check_dtype(const char *what, zpp_dtype dtype) {
    if (zpp_dtype_size(dtype) == 0)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d; use ZPP_FP32, ZPP_BF16 or "
                                          "ZPP_FP16",
                         what, (int)dtype);
    return ZPP_OK;
}

static zpp_status zpp__check_ptr(const char *what, const void *p, const char *name, size_t n) {
    if (!p && n > 0) return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL", what, name);
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Branch-free conversions (vectorizable; equal to core/dtype.h bit for bit) */
/* ------------------------------------------------------------------------ */

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

/* c ? a : b on integers as a mask: the compiler if-converts this into
 * pcmpgtd/pand/pandn/por where a chain of ternaries with floating-point
 * operations behind them stays a branch (-ftrapping-math). */
static inline uint32_t zpp__sel(int c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

/* bf16 is the top half of an fp32. */
static inline float zpp__ld_bf16(uint16_t h) { return zpp__f32((uint32_t)h << 16); }

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

/* ------------------------------------------------------------------------ */
/* One block                                                                 */
/* ------------------------------------------------------------------------ */

static float zpp__qmax(int bits) { return bits == 8 ? 127.0f : 7.0f; }

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
    const float qmax = zpp__qmax(spec->bits);
    const size_t es = zpp_dtype_size(dtype);
    const size_t pbytes = zpp_quant_payload_bytes(len, spec->bits);

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
    float inv = qmax / amax;
    *scale_p = amax / qmax;
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
        if (tiny)
            zpp__q_tiny(dtype, xs, spec->stochastic ? utile : NULL, m, inv, qmax, q);
        else if (spec->stochastic)
            zpp__q_sr_dt(dtype, xs, utile, m, inv, qmax, q);
        else
            zpp__q_rne_dt(dtype, xs, m, inv, q);
        if (spec->bits == 4) zpp__pack4(q, m, p + off / 2); /* off is even */
    }
    return len;
}

/* y (dtype) = dequantized payload p of len elements with scale s. */
static void zpp__dequant_block(const uint8_t *p, int bits, size_t len, float s, zpp_dtype dtype,
                               void *y) {
    const size_t es = zpp_dtype_size(dtype);
    uint16_t qtile[ZPP__TILE / 2];
    for (size_t off = 0; off < len; off += ZPP__TILE) {
        size_t m = len - off < ZPP__TILE ? len - off : ZPP__TILE;
        const int8_t *q = (const int8_t *)p + off;
        if (bits == 4) {
            zpp__unpack4(p + off / 2, m, (int8_t *)qtile);
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

static void zpp__acc_block(const uint8_t *p, int bits, size_t len, float s, float *acc) {
    if (bits == 8) {
        zpp__dq_acc((const int8_t *)p, len, s, acc);
        return;
    }
    uint16_t qtile[ZPP__TILE / 2];
    for (size_t off = 0; off < len; off += ZPP__TILE) {
        size_t m = len - off < ZPP__TILE ? len - off : ZPP__TILE;
        zpp__unpack4(p + off / 2, m, (int8_t *)qtile);
        zpp__dq_acc((const int8_t *)qtile, m, s, acc + off);
    }
}

static float zpp__scale_at(const uint8_t *q, size_t n, int bits, size_t b) {
    float s;
    memcpy(&s, q + zpp_quant_scales_offset(n, bits) + 4 * b, 4);
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
        zpp__acc_block(p, spec->bits, end - e, zpp__scale_at(q, n, spec->bits, b),
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
    size_t pb = zpp_quant_payload_bytes(n, spec->bits);
    size_t so = zpp_quant_scales_offset(n, spec->bits);
    size_t se = so + 4 * zpp_quant_num_blocks(n, spec->block);
    memset(out + pb, 0, so - pb);
    memset(out + se, 0, zpp_quant_bytes(n, spec) - se);
}

#define ZPP__NONE ((uint64_t)-1)

/* Quantizes n elements as one tensor; idx0 is the stream index of x[0].
 * Returns the stream index of the first non-finite element, or ZPP__NONE. */
static uint64_t zpp__quant_tensor(const void *x, zpp_dtype dtype, size_t n,
                                  const zpp_quant_spec *spec, uint64_t idx0, void *out) {
    if (n == 0) return ZPP__NONE; /* zero bytes; out may be NULL */
    uint8_t *o = out;
    const size_t es = zpp_dtype_size(dtype);
    const size_t so = zpp_quant_scales_offset(n, spec->bits);
    uint64_t first_bad = ZPP__NONE;
    size_t nb = zpp_quant_num_blocks(n, spec->block);
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
    size_t nb = zpp_quant_num_blocks(n, spec->block);
    for (size_t b = 0; b < nb; b++) {
        size_t e = b * spec->block;
        size_t len = n - e < spec->block ? n - e : spec->block;
        ZPP__PREFETCH(q, zpp_quant_payload_bytes(n, spec->bits),
                      zpp_quant_payload_bytes(e, spec->bits) + ZPP__AHEAD,
                      zpp_quant_payload_bytes(len, spec->bits), 0);
        zpp__dequant_block(q + (spec->bits == 8 ? e : e / 2), spec->bits, len,
                           zpp__scale_at(q, n, spec->bits, b), dtype, (char *)y + e * es);
    }
}

static zpp_status zpp__nonfinite(const char *what, uint64_t index) {
    return zpp_error(ZPP_ERR_NONFINITE,
                     "%s: element %llu is NaN or Inf (the first one); its block is stored "
                     "with a NaN scale and dequantizes to NaN, the other blocks are "
                     "quantized normally; find where the non-finite value comes from "
                     "(e.g. a diverged loss or too high a learning rate)",
                     what, (unsigned long long)index);
}

zpp_status zpp_quantize(const void *x, zpp_dtype dtype, size_t n, const zpp_quant_spec *spec,
                        void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_dtype("quantize", dtype));
    ZPP_CHECK(zpp__check_ptr("quantize", x, "input", n));
    ZPP_CHECK(zpp__check_ptr("quantize", out, "output", n));
    uint64_t bad = zpp__quant_tensor(x, dtype, n, spec, 0, out);
    if (bad != ZPP__NONE) return zpp__nonfinite("quantize", bad);
    return ZPP_OK;
}

zpp_status zpp_dequantize(const void *q, size_t n, const zpp_quant_spec *spec, zpp_dtype dtype,
                          void *y) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_dtype("dequantize", dtype));
    ZPP_CHECK(zpp__check_ptr("dequantize", q, "input", n));
    ZPP_CHECK(zpp__check_ptr("dequantize", y, "output", n));
    zpp__dequant_tensor(q, n, spec, dtype, y);
    return ZPP_OK;
}

zpp_status zpp_dequantize_accumulate(const void *q, size_t n, const zpp_quant_spec *spec,
                                     float *acc) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_ptr("dequantize-accumulate", q, "input", n));
    ZPP_CHECK(zpp__check_ptr("dequantize-accumulate", acc, "accumulator", n));
    zpp__acc_range(q, n, spec, 0, n, acc);
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Chunks, qgZ reorder, dequantize-sum-requantize                            */
/* ------------------------------------------------------------------------ */

zpp_status zpp_quant_cpu_quantize_chunks(const void *in, zpp_dtype dtype, size_t n_chunks,
                                         size_t chunk_len, const zpp_quant_spec *spec,
                                         void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_dtype("quantize", dtype));
    ZPP_CHECK(zpp__check_ptr("quantize", in, "input", n_chunks * chunk_len));
    ZPP_CHECK(zpp__check_ptr("quantize", out, "output", n_chunks * chunk_len));
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(chunk_len, spec);
    uint64_t first_bad = ZPP__NONE;
    for (size_t c = 0; c < n_chunks; c++) {
        uint64_t bad = zpp__quant_tensor((const char *)in + c * chunk_len * es, dtype,
                                         chunk_len, spec, (uint64_t)c * chunk_len,
                                         (char *)out + c * qb);
        if (bad != ZPP__NONE && first_bad == ZPP__NONE) first_bad = bad;
    }
    if (first_bad != ZPP__NONE) return zpp__nonfinite("quantize", first_bad);
    return ZPP_OK;
}

zpp_status zpp_quant_cpu_dequantize_chunks(const void *q, size_t n_chunks, size_t chunk_len,
                                           const zpp_quant_spec *spec, zpp_dtype dtype,
                                           void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_dtype("dequantize", dtype));
    ZPP_CHECK(zpp__check_ptr("dequantize", q, "input", n_chunks * chunk_len));
    ZPP_CHECK(zpp__check_ptr("dequantize", out, "output", n_chunks * chunk_len));
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(chunk_len, spec);
    for (size_t c = 0; c < n_chunks; c++)
        zpp__dequant_tensor((const uint8_t *)q + c * qb, chunk_len, spec, dtype,
                            (char *)out + c * chunk_len * es);
    return ZPP_OK;
}

zpp_status zpp_quant_reorder_quantize(const void *x, zpp_dtype dtype, size_t chunk_len,
                                      int nodes, int local, const zpp_quant_spec *spec,
                                      void *out) {
    return zpp_quant_cpu_reorder_quantize(x, dtype, chunk_len, 0, chunk_len, nodes, local,
                                          spec, out);
}

static zpp_status zpp__check_slab(const char *what, size_t chunk_len, size_t first,
                                  size_t len) {
    if (first > chunk_len || len > chunk_len - first)
        return zpp_error(ZPP_ERR_INVALID, "%s: slab [%zu, %zu) runs past a chunk of %zu elements",
                         what, first, first + len, chunk_len);
    return ZPP_OK;
}

zpp_status zpp_quant_cpu_reorder_quantize(const void *x, zpp_dtype dtype, size_t chunk_len,
                                          size_t first, size_t len, int nodes, int local,
                                          const zpp_quant_spec *spec, void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_dtype("reorder-quantize", dtype));
    if (nodes < 1 || local < 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "reorder-quantize: nodes %d and local %d must both be >= 1", nodes,
                         local);
    ZPP_CHECK(zpp__check_slab("reorder-quantize", chunk_len, first, len));
    size_t n = (size_t)nodes * (size_t)local * len;
    ZPP_CHECK(zpp__check_ptr("reorder-quantize", x, "input", n));
    ZPP_CHECK(zpp__check_ptr("reorder-quantize", out, "output", n));
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(len, spec);
    uint64_t first_bad = ZPP__NONE;
    size_t slot = 0;
    for (int dl = 0; dl < local; dl++) {
        for (int node = 0; node < nodes; node++, slot++) {
            size_t r = (size_t)node * (size_t)local + (size_t)dl; /* destination rank */
            size_t at = r * chunk_len + first; /* index of the slab's first element */
            uint64_t bad = zpp__quant_tensor((const char *)x + at * es, dtype, len, spec,
                                             (uint64_t)at, (char *)out + slot * qb);
            if (bad != ZPP__NONE && (first_bad == ZPP__NONE || bad < first_bad))
                first_bad = bad;
        }
    }
    if (first_bad != ZPP__NONE) return zpp__nonfinite("reorder-quantize", first_bad);
    return ZPP_OK;
}

/* The shared body of both dequant-sum-requant entry points: input j is
 * ins[j], or base + j * stride when ins is NULL. Chunks of chunk_len
 * elements (the slab's own length); element i of chunk c draws the
 * stochastic index c * idx_stride + idx_first + i. */
static zpp_status zpp__dsr(const void *const *ins, const uint8_t *base, size_t stride, int k,
                           size_t n_chunks, size_t chunk_len, size_t idx_stride,
                           size_t idx_first, const zpp_quant_spec *in_spec,
                           const zpp_quant_spec *out_spec, void *out) {
    const char *what = "dequant-sum-requant";
    ZPP_CHECK(zpp_quant_spec_check(in_spec));
    ZPP_CHECK(zpp_quant_spec_check(out_spec));
    if (k < 1) return zpp_error(ZPP_ERR_INVALID, "%s: k = %d inputs; need at least 1", what, k);
    size_t n = n_chunks * chunk_len;
    ZPP_CHECK(zpp__check_ptr(what, out, "output", n));
    if (n == 0) return ZPP_OK;
    if (ins) {
        for (int j = 0; j < k; j++)
            if (!ins[j]) return zpp_error(ZPP_ERR_INVALID, "%s: input %d is NULL", what, j);
    } else {
        ZPP_CHECK(zpp__check_ptr(what, base, "input", n));
    }

    /* One output block of fp32 sums at a time: it stays in cache between
     * the sum and the requantize. */
    size_t cap = out_spec->block < chunk_len ? out_spec->block : chunk_len;
    float stack_sum[2048];
    float *sum = stack_sum;
    if (cap > sizeof stack_sum / sizeof stack_sum[0]) {
        sum = malloc(cap * sizeof *sum);
        if (!sum)
            return zpp_error(ZPP_ERR_NOMEM, "%s: could not allocate %zu bytes of scratch", what,
                             cap * sizeof *sum);
    }
    const size_t qin = zpp_quant_bytes(chunk_len, in_spec);
    const size_t qout = zpp_quant_bytes(chunk_len, out_spec);
    const size_t so = zpp_quant_scales_offset(chunk_len, out_spec->bits);
    const size_t nb = zpp_quant_num_blocks(chunk_len, out_spec->block);
    uint64_t first_bad = ZPP__NONE;
    for (size_t c = 0; c < n_chunks; c++) {
        uint8_t *o = (uint8_t *)out + c * qout;
        for (size_t b = 0; b < nb; b++) {
            size_t e = b * out_spec->block;
            size_t len = chunk_len - e < out_spec->block ? chunk_len - e : out_spec->block;
            memset(sum, 0, len * sizeof *sum);
            for (int j = 0; j < k; j++) {
                const uint8_t *in = ins ? ins[j] : base + (size_t)j * stride;
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
    if (sum != stack_sum) free(sum);
    if (first_bad != ZPP__NONE) return zpp__nonfinite(what, first_bad);
    return ZPP_OK;
}

zpp_status zpp_quant_dequant_sum_requant(const void *const *in, int k, size_t n_chunks,
                                         size_t chunk_len, const zpp_quant_spec *in_spec,
                                         const zpp_quant_spec *out_spec, void *out) {
    if (!in) return zpp_error(ZPP_ERR_INVALID, "dequant-sum-requant: input list is NULL");
    return zpp__dsr(in, NULL, 0, k, n_chunks, chunk_len, chunk_len, 0, in_spec, out_spec, out);
}

zpp_status zpp_quant_cpu_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                             size_t chunk_len, size_t first, size_t len,
                                             const zpp_quant_spec *in_spec,
                                             const zpp_quant_spec *out_spec, void *out) {
    ZPP_CHECK(zpp__check_slab("dequant-sum-requant", chunk_len, first, len));
    size_t stride = in_spec ? n_chunks * zpp_quant_bytes(len, in_spec) : 0;
    return zpp__dsr(NULL, in, stride, k, n_chunks, len, chunk_len, first, in_spec, out_spec,
                    out);
}

/* ------------------------------------------------------------------------ */
/* qgZ's last step and dtype conversion                                      */
/* ------------------------------------------------------------------------ */

static void zpp__scale_f32(float *restrict y, size_t len, float scale) {
    for (size_t i = 0; i < len; i++) y[i] = scale * y[i];
}

zpp_status zpp_quant_cpu_dequant_reduce(const void *q, size_t n_chunks, size_t chunk_len,
                                        const zpp_quant_spec *spec, float scale, float *out) {
    const char *what = "dequant-reduce";
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__check_ptr(what, out, "output", chunk_len));
    ZPP_CHECK(zpp__check_ptr(what, q, "input", n_chunks * chunk_len));
    const size_t qb = zpp_quant_bytes(chunk_len, spec);
    /* Column tiles (multiples of 8, so tile starts are block-aligned) keep
     * the fp32 partial sums in cache while the chunks stream past. */
    const size_t tile = 4096;
    for (size_t e0 = 0; e0 < chunk_len; e0 += tile) {
        size_t e1 = chunk_len - e0 < tile ? chunk_len : e0 + tile;
        memset(out + e0, 0, (e1 - e0) * sizeof *out);
        for (size_t c = 0; c < n_chunks; c++)
            zpp__acc_range((const uint8_t *)q + c * qb, chunk_len, spec, e0, e1, out + e0);
        zpp__scale_f32(out + e0, e1 - e0, scale);
    }
    return ZPP_OK;
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

zpp_status zpp_quant_cpu_convert(const void *in, zpp_dtype in_dtype, void *out,
                                 zpp_dtype out_dtype, size_t n, float scale) {
    ZPP_CHECK(zpp__check_dtype("convert", in_dtype));
    ZPP_CHECK(zpp__check_dtype("convert", out_dtype));
    ZPP_CHECK(zpp__check_ptr("convert", in, "input", n));
    ZPP_CHECK(zpp__check_ptr("convert", out, "output", n));
    if (in == out && in_dtype != out_dtype && n > 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "convert: in-place conversion from %s to %s; use separate buffers",
                         zpp_dtype_name(in_dtype), zpp_dtype_name(out_dtype));
    const size_t ies = zpp_dtype_size(in_dtype), oes = zpp_dtype_size(out_dtype);
    float v[ZPP__TILE];
    /* A whole tile is read before it is written, so in == out is safe. */
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
    return ZPP_OK;
}

/* One tensor whose element 0 draws stochastic index idx0: the building
 * block of the error-feedback variants (quant_ef.c), which quantize a
 * corrected copy of a slab one chunk at a time. */
zpp_status zpp_quant_cpu_quantize_at(const void *x, zpp_dtype dtype, size_t n,
                                     const zpp_quant_spec *spec, uint64_t idx0, void *out) {
    uint64_t bad = zpp__quant_tensor(x, dtype, n, spec, idx0, out);
    if (bad != ZPP__NONE) return zpp__nonfinite("quantize", bad);
    return ZPP_OK;
}

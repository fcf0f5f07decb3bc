/* quant/quant_cuda.cu — CUDA kernels for block quantization (quant_cuda.h).
 *
 * The device twins of the CPU reference in quant.c. Every kernel follows the
 * wire layout of zeropp.h and reproduces the CPU's arithmetic bit for bit:
 *
 *   absmax = max |x| over the block, in fp32 (bf16/fp16 widen exactly)
 *   scale  = absmax / qmax          IEEE division (__fdiv_rn)
 *   inv    = qmax / absmax          IEEE division, not a reciprocal estimate
 *   q      = rne(x * inv)           or floor(x * inv + u) when stochastic,
 *                                   clamped to [-qmax, qmax]
 *   y      = q * scale              one rounding, no FMA contraction
 *
 * and for E2M1 (4 bits) the same in half units: qmax 12, the stored scale
 * absmax / 6, q on the grid {0, 1, 2, 3, 4, 6, 8, 12} (e2m1_round), y = q *
 * (scale / 2) (payload_unit).
 *
 * Every product and sum that could be contracted into an FMA is written with
 * __fmul_rn / __fadd_rn, and the file must never be built with fast-math.
 * Stochastic rounding draws u = zpp_quant_uniform(seed, i) (quant_rng.h)
 * with i the element's index in the whole input (chunk * chunk_len + offset;
 * for the qgZ reorder, the source chunk; for a slab of the qgZ kernels,
 * chunk * chunk_len + first + offset), as the reference does. Edge cases
 * (absmax 0, tiny absmax, NaN/Inf) are the reference's, see block_scale.
 *
 * HOW THE KERNELS ARE SHAPED (memory bound: ~3 bytes moved per element)
 *
 *   - A "tile" is one quantization block (quantize) or a piece of at most
 *     2048 elements of one (dequantize). A group of T = 1..32 threads (T a
 *     power of two inside one warp) owns one tile; thread t of the group
 *     holds the 8-element vectors t, t+T, t+2T, ... (VPT of them) in
 *     registers, so a block is read from memory exactly once and each load
 *     instruction of a warp covers whole 128-byte lines. A warp owns 32/T
 *     tiles per round and U rounds per loop trip (U * VPT = 4 slots, 4
 *     independent 16-byte loads issued before any is used); the grid is
 *     persistent (SMs x occupancy) and strides over the tiles.
 *   - VPT is 4 for quantize (block 256: T = 8), so a block's two IEEE
 *     divisions and its log2(T) shuffle steps are shared by 32 elements of
 *     a thread; 2 (int8) / 4 (int4) for dequantize. Dequantize of int8 also
 *     fetches its next tiles before it processes the current ones
 *     (software pipelining); for quantize and int4 dequantize that was
 *     measured slower (more registers, fewer warps). The knobs are the
 *     ZPP_QCU_* macros below; the choices are the measured best on an H200
 *     (bench/RESULTS.md, third session, run J).
 *   - absmax is an unsigned max of the bit patterns with the sign bit
 *     cleared (for non-negative floats the bit order is the value order), so
 *     a NaN or Inf shows up as bits >= 0x7f800000 in the same reduction.
 *     bf16/fp16 do it on packed words (VIMNMX.U16x2, two elements an
 *     instruction) and widen the winner. The group reduces with
 *     __shfl_xor_sync.
 *   - Rounding uses the "magic number" trick: for |v| <= 2^22, the fp32 sum
 *     v + 1.5*2^23 lands where one ulp is 1, so the FPU's rounding of that
 *     sum IS the rounding of v to an integer (nearest-even with __fadd_rn,
 *     floor with __fadd_rd), and the low bits of the sum's bit pattern are
 *     the two's complement of the integer: one full-rate FADD instead of a
 *     quarter-rate F2I. Round-to-nearest needs no clamp (|x * inv| <= qmax
 *     (1 + 2^-24)^2 < qmax + 1/2); stochastic clamps first. Blocks whose
 *     absmax is below qmax / FLT_MAX (inv overflows to +Inf: "tiny") take a
 *     slow path with __float2int_rn/_rd that follows the reference
 *     literally (+-Inf saturates, 0 * Inf = NaN -> 0).
 *   - Dequantize inverts the trick: byte ^ 0x80 placed under exponent 0x4B
 *     is the float 2^23 + q + 128; one FADD recovers q exactly, one FMUL
 *     applies the scale (no I2F).
 *   - Vector (16-byte) loads/stores of the raw dtype are used only when the
 *     base pointer is 16-byte aligned and each chunk starts on a 16-byte
 *     boundary (chunk_len * dtype size % 16 == 0); otherwise, and for the
 *     ragged last vector of a chunk, the same kernel takes scalar accesses.
 *     Quantized buffers are always 16-byte aligned (wire layout), so payload
 *     words are loaded/stored whole; padding inside a payload word is zero.
 *     Vector accesses are written in PTX (st.global.v4 etc.): left to
 *     itself the compiler split a uint4 store into four 32-bit stores, and
 *     the cache-hint intrinsics compile to .STRONG accesses.
 *   - Every byte of a quantized chunk is written, padding included.
 *   - Blocks > 2048 elements: one warp per block, two passes (absmax, then
 *     quantize; the re-read mostly hits L2). Correct, not tuned: well
 *     below copy speed (bench/RESULTS.md, "2×H200, commit 9d34ca2").
 *
 * WHAT THE COMPILER MADE OF IT (nvcc 13.0, sm_90; -Xptxas -v and
 * cuobjdump --dump-sass; the register counts: bench/RESULTS.md):
 *   - no kernel spills or uses local memory ("0 bytes stack frame, 0 bytes
 *     spill stores, 0 bytes spill loads" for all); the pipelined and the
 *     VPT = 8 variants use the most registers.
 *   - quantize bf16/fp16: LDG.E.128.CONSTANT per input vector (fp32: 2),
 *     VIMNMX.U16x2 / VIMNMX3.U16x2 absmax, STG.E.64 (int8) / STG.E (int4)
 *     payload words; LDG.E.U16 only on the scalar path.
 *   - dequantize: LDG.E.64.CONSTANT (int8) / LDG.E.CONSTANT (int4) payload,
 *     STG.E.128 output (fp32: 2 per vector); no I2F on the hot path.
 *   - F2I only in the tiny-absmax path and the integer divisions of the
 *     multi-chunk tile index; the float divisions appear once per block.
 *
 * MEASURED: `zeropp bench quant --device gpu` against a device copy of the
 * same bytes, in bench/RESULTS.md. Quantize and dequantize run near copy
 * speed (issue 5's target, 0.85 of it, is met); dequant_sum_requant is
 * latency-bound on its 4-byte int4 loads and stochastic quantize ALU-bound
 * on the 64-bit hash per element, both well below.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdint.h>

#include "core/error.h"
#include "quant/quant_cuda.h"
#include "quant/quant_layout.h"
#include "quant/quant_rng.h"

namespace {

constexpr int kThreads = 256;         /* threads per CTA */
constexpr unsigned kMaxRegTile = 2048; /* elements a warp keeps in registers */
constexpr float kMagic = 12582912.0f;  /* 1.5 * 2^23: ulp 1 around it */
constexpr unsigned kNaNBits = 0x7fc00000u; /* the quiet NaN the C library's NAN has */

/* ---- element types --------------------------------------------------- */

struct F32 {
    typedef float raw;
    static constexpr int size = 4;
};
struct BF16 {
    typedef uint16_t raw;
    static constexpr int size = 2;
};
struct FP16 {
    typedef uint16_t raw;
    static constexpr int size = 2;
};

__device__ __forceinline__ float to_f32(BF16, uint16_t h) {
    return __uint_as_float((unsigned)h << 16);
}
__device__ __forceinline__ float to_f32(FP16, uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float from_f32(F32, float x) { return x; }
__device__ __forceinline__ uint16_t from_f32(BF16, float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint16_t from_f32(FP16, float x) {
    return __half_as_ushort(__float2half_rn(x));
}

/* Two 16-bit values of one 32-bit word, element order = little endian. */
__device__ __forceinline__ void unpack2(BF16, unsigned w, float &a, float &b) {
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack2(FP16, unsigned w, float &a, float &b) {
    float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w));
    a = f.x;
    b = f.y;
}
__device__ __forceinline__ unsigned pack2(BF16, float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b); /* .x = a = low half */
    return *reinterpret_cast<const unsigned *>(&h);
}
__device__ __forceinline__ unsigned pack2(FP16, float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned *>(&h);
}

/* Plain (weak, default-cached) vector global accesses. Written in PTX
 * because the compiler may split a uint4 assignment into four 32-bit stores,
 * and the cache-hint intrinsics compile to .STRONG accesses. No "memory"
 * clobber: ordering against other accesses to the same address follows from
 * data dependences (a load feeds the store). */
__device__ __forceinline__ uint4 ld_v4(const void *p) {
    uint4 v;
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
__device__ __forceinline__ void st_v4(void *p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void st_v2(void *p, uint2 v) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
}
__device__ __forceinline__ void st_u32(void *p, unsigned v) {
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v));
}

/* The raw bits of 8 consecutive elements: a = elements 0..3 (fp32) or 0..7
 * (16-bit, element 2i in the low half of word i), b = elements 4..7 (fp32
 * only). Fetching and unpacking are separate steps so that a thread issues
 * all its loads before it waits for any (several loads in flight). */
struct Raw8 {
    uint4 a, b;
};

/* Fetches p[0..cnt), zero bits beyond cnt. vec: p is 16-byte aligned, so a
 * full vector is one (fp32: two) 16-byte load. `ro`: the data is read-only
 * for the kernel's lifetime (non-coherent cache path allowed). */
template <class D, bool RO>
__device__ __forceinline__ Raw8 fetch8(const typename D::raw *p, unsigned cnt, bool vec) {
    Raw8 r;
    r.b = make_uint4(0u, 0u, 0u, 0u);
    if (vec && cnt == 8) {
        const uint4 *q = reinterpret_cast<const uint4 *>(p);
        r.a = RO ? __ldg(q) : ld_v4(q);
        if constexpr (D::size == 4) r.b = RO ? __ldg(q + 1) : ld_v4(q + 1);
    } else {
        unsigned w[8];
        if constexpr (D::size == 4) {
            const unsigned *u = reinterpret_cast<const unsigned *>(p);
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = (unsigned)i < cnt ? u[i] : 0u;
            r.a = make_uint4(w[0], w[1], w[2], w[3]);
            r.b = make_uint4(w[4], w[5], w[6], w[7]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = (unsigned)i < cnt ? (unsigned)p[i] : 0u;
            r.a = make_uint4(w[0] | (w[1] << 16), w[2] | (w[3] << 16), w[4] | (w[5] << 16),
                             w[6] | (w[7] << 16));
        }
    }
    return r;
}

template <class D>
__device__ __forceinline__ void unpack8(const Raw8 &r, float (&v)[8]) {
    if constexpr (D::size == 4) {
        v[0] = __uint_as_float(r.a.x), v[1] = __uint_as_float(r.a.y);
        v[2] = __uint_as_float(r.a.z), v[3] = __uint_as_float(r.a.w);
        v[4] = __uint_as_float(r.b.x), v[5] = __uint_as_float(r.b.y);
        v[6] = __uint_as_float(r.b.z), v[7] = __uint_as_float(r.b.w);
    } else {
        unpack2(D(), r.a.x, v[0], v[1]);
        unpack2(D(), r.a.y, v[2], v[3]);
        unpack2(D(), r.a.z, v[4], v[5]);
        unpack2(D(), r.a.w, v[6], v[7]);
    }
}

/* Stores v[0..cnt) as D at p; one (fp32: two) 16-byte store when vec. */
template <class D>
__device__ __forceinline__ void store8(typename D::raw *p, unsigned cnt, bool vec,
                                       const float (&v)[8]) {
    if (vec && cnt == 8) {
        uint4 *q = reinterpret_cast<uint4 *>(p);
        if constexpr (D::size == 4) {
            st_v4(q, make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]),
                                 __float_as_uint(v[2]), __float_as_uint(v[3])));
            st_v4(q + 1, make_uint4(__float_as_uint(v[4]), __float_as_uint(v[5]),
                                     __float_as_uint(v[6]), __float_as_uint(v[7])));
        } else {
            st_v4(q, make_uint4(pack2(D(), v[0], v[1]), pack2(D(), v[2], v[3]),
                                 pack2(D(), v[4], v[5]), pack2(D(), v[6], v[7])));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            if ((unsigned)i < cnt) p[i] = from_f32(D(), v[i]);
    }
}

/* ---- quantized side: geometry, payload words ------------------------ */

/* One quantized chunk's layout (wire layout of zeropp.h). */
struct QLayout {
    unsigned char *base;         /* chunk 0 (const-cast for inputs) */
    unsigned long long qbytes;   /* stride between chunks */
    unsigned long long scales;   /* offset of the scales in a chunk */
    unsigned block;              /* elements per scale */
    int bits;                    /* 8 or 4 */
    bool e2m1;                   /* 4-bit E2M1 elements, not int4 */
};

/* Payload word of the 8-element vector starting at element e (a multiple of
 * 8): 8 bytes for int8, 4 bytes for int4. Always inside the buffer, since the
 * payload is zero-padded to 16 bytes, and aligned, since e is a multiple of
 * 8 and every chunk starts on 16 bytes. */
__device__ __forceinline__ uint2 load_payload(const QLayout &L, unsigned c,
                                              unsigned long long e) {
    const unsigned char *p = L.base + (unsigned long long)c * L.qbytes;
    if (L.bits == 8) return __ldg(reinterpret_cast<const uint2 *>(p + e));
    return make_uint2(__ldg(reinterpret_cast<const unsigned *>(p + e / 2)), 0u);
}
__device__ __forceinline__ float load_scale(const QLayout &L, unsigned c, unsigned b) {
    return __ldg(reinterpret_cast<const float *>(L.base + (unsigned long long)c * L.qbytes +
                                                 L.scales + 4ull * b));
}
__device__ __forceinline__ void store_payload(const QLayout &L, unsigned c,
                                              unsigned long long e, uint2 w) {
    unsigned char *p = L.base + (unsigned long long)c * L.qbytes;
    if (L.bits == 8)
        st_v2(p + e, w);
    else
        st_u32(p + e / 2, w.x);
}

/* E2M1 in half units (quant_kernels.h): the grid {0, 1, 2, 3, 4, 6, 8, 12}
 * packed as nibbles, indexed by the magnitude code. */
constexpr unsigned kE2M1Grid = 0xC8643210u;

/* The signed half-unit value of an E2M1 nibble (code 8, -0, gives 0). */
__device__ __forceinline__ int e2m1_value(unsigned nibble) {
    const int a = (int)((kE2M1Grid >> (4u * (nibble & 7u))) & 0xfu);
    return (nibble & 8u) ? -a : a;
}

/* The E2M1 nibble of a signed half-unit grid value. */
__device__ __forceinline__ unsigned e2m1_code(int q) {
    const int a = abs(q);
    const int c = a <= 4 ? a : 5 + (a > 6) + (a > 8);
    return (unsigned)c | (q < 0 ? 8u : 0u);
}

/* What multiplies a payload integer: the stored scale, or half of it for
 * E2M1's half units (the CPU's zpp__unit, the same one rounding). */
__device__ __forceinline__ float payload_unit(bool e2m1, float scale) {
    return e2m1 ? __fmul_rn(0.5f, scale) : scale;
}

/* q_i * scale for the 8 elements of a payload word. int8: byte ^ 0x80 is
 * q + 128 in 0..255; placed under exponent byte 0x4B it reads as the float
 * 2^23 + q + 128 (exact), so one FADD gives q. int4 likewise with
 * nibble ^ 8 = q + 8. E2M1: each nibble through the grid. */
__device__ __forceinline__ void dequant8(uint2 w, int bits, bool e2m1, float scale,
                                         float (&d)[8]) {
    if (e2m1) {
        const float unit = payload_unit(true, scale);
#pragma unroll
        for (int i = 0; i < 8; i++)
            d[i] = __fmul_rn((float)e2m1_value((w.x >> (4 * i)) & 0xfu), unit);
        return;
    }
    if (bits == 8) {
        const unsigned lo = w.x ^ 0x80808080u, hi = w.y ^ 0x80808080u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned sel = (unsigned)i | 0x7440u;
            d[i] = __fadd_rn(__uint_as_float(__byte_perm(lo, 0x4B000000u, sel)), -8388736.0f);
            d[i + 4] =
                __fadd_rn(__uint_as_float(__byte_perm(hi, 0x4B000000u, sel)), -8388736.0f);
        }
    } else {
        const unsigned x = w.x ^ 0x88888888u;
#pragma unroll
        for (int i = 0; i < 8; i++)
            d[i] = __fadd_rn(__uint_as_float(((x >> (4 * i)) & 0xfu) | 0x4B000000u),
                             -8388616.0f);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) d[i] = __fmul_rn(d[i], scale);
}

/* ---- rounding --------------------------------------------------------- */

/* The integer for x, its low 8 (or 4) bits being the two's complement
 * payload. Fast path: the magic-number rounding (exact because |v| <=
 * qmax + 1 < 2^22), after a clamp in fp32 where one is needed; clamping
 * before rounding equals clamping after it, since +-qmax are integers and
 * rounding is monotone.
 * TINY (inv = +Inf, see block_scale) follows the formula literally as the
 * reference does: x * Inf = +-Inf saturates to +-qmax through
 * __float2int_rn / _rd, and 0 * Inf = NaN converts to 0. */
template <bool STOCH, bool TINY>
__device__ __forceinline__ unsigned qround(float x, float inv, float qmax,
                                           unsigned long long seed,
                                           unsigned long long idx) {
    float v = __fmul_rn(x, inv);
    if constexpr (STOCH) v = __fadd_rn(v, zpp_quant_uniform(seed, idx));
    if constexpr (!TINY) {
        /* Round to nearest needs no clamp: |x| <= absmax and inv =
         * RN(qmax / absmax) give |v| <= qmax (1 + 2^-24)^2 < qmax + 1/2, so
         * RN(v) is within [-qmax, qmax] already. Stochastic w = v + u can
         * reach qmax + 1 (or -qmax - 2^-23 before the floor): clamp. */
        if constexpr (STOCH) v = fminf(fmaxf(v, -qmax), qmax);
        return __float_as_uint(STOCH ? __fadd_rd(v, kMagic) : __fadd_rn(v, kMagic));
    } else {
        const int qi = (int)qmax;
        int q = STOCH ? __float2int_rd(v) : __float2int_rn(v);
        q = min(max(q, -qi), qi);
        return (unsigned)q;
    }
}

/* E2M1 in half units, the values of quant_kernels.h's zpp__e2m1_rne_code
 * and _floor: |v| over the grid's step k where it lies (1 below 4, 2 below
 * 8, else 4), rounded to an integer (to nearest even, or floor(|v| / k +
 * u)), times k; the sign kept. Every operation but v and the stochastic sum
 * is exact. The 8-wide path rounds to nearest on the bits instead
 * (e2m1_rne_nibble, as the CPU does): the same nibbles, fewer instructions;
 * this form serves stochastic rounding and error feedback's one element
 * at a time. */
template <bool STOCH>
__device__ __forceinline__ int e2m1_round(float x, float inv, unsigned long long seed,
                                          unsigned long long idx) {
    const float v = __fmul_rn(x, inv);
    const float a = fabsf(v);
    const float k = a < 4.0f ? 1.0f : a < 8.0f ? 2.0f : 4.0f;
    const float rk = a < 4.0f ? 1.0f : a < 8.0f ? 0.5f : 0.25f;
    float m;
    if constexpr (STOCH) {
        const float w = __fadd_rn(__fmul_rn(a, rk), zpp_quant_uniform(seed, idx));
        m = fminf(__fmul_rn(floorf(w), k), 12.0f);
    } else {
        m = __fmul_rn(rintf(__fmul_rn(a, rk)), k);
    }
    const int q = (int)m;
    return v < 0.0f ? -q : q;
}

/* The E2M1 nibble of one element rounded to nearest, from the bits of
 * v = x * inv (quant_kernels.h, zpp__e2m1_rne_code: from 2 half units up the
 * grid is the fp32 numbers with one mantissa bit; below 2, rint). */
__device__ __forceinline__ unsigned e2m1_rne_nibble(float x, float inv) {
    const unsigned u = __float_as_uint(__fmul_rn(x, inv)), b = u & 0x7fffffffu;
    const unsigned top = ((b + 0x1fffffu + ((b >> 22) & 1u)) >> 22) - 254u;
    const unsigned c = b < 0x40000000u ? (unsigned)__float2int_rn(__uint_as_float(b)) : top;
    return c | (c ? (u >> 28) & 8u : 0u);
}

/* The signed integer of one element (half units for E2M1; TINY saturates
 * to +-qmax, a grid point in every format). */
template <bool STOCH, bool TINY>
__device__ __forceinline__ int qround_int(float x, float inv, float qmax, bool e2m1,
                                          unsigned long long seed, unsigned long long idx) {
    if (!TINY && e2m1) return e2m1_round<STOCH>(x, inv, seed, idx);
    const unsigned r = qround<STOCH, TINY>(x, inv, qmax, seed, idx);
    return TINY ? (int)r : (int)(r - 0x4B400000u); /* magic sum's bits: 1.5 * 2^23 + q */
}

/* Quantizes and packs one vector; returns the payload word. */
template <bool STOCH, bool TINY>
__device__ __forceinline__ uint2 quant8(const float (&v)[8], float inv, float qmax, int bits,
                                        bool e2m1, unsigned long long seed,
                                        unsigned long long idx0) {
    if (e2m1) {
        unsigned w = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            w |= (STOCH || TINY ? e2m1_code(qround_int<STOCH, TINY>(v[i], inv, qmax, true, seed,
                                                                    idx0 + i))
                                : e2m1_rne_nibble(v[i], inv))
                 << (4 * i);
        return make_uint2(w, 0u);
    }
    unsigned q[8];
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = qround<STOCH, TINY>(v[i], inv, qmax, seed, idx0 + i);
    if (bits == 8) {
        /* low byte of each q, little-endian: element i at byte i */
        const unsigned lo = __byte_perm(__byte_perm(q[0], q[1], 0x0040u),
                                        __byte_perm(q[2], q[3], 0x0040u), 0x5410u);
        const unsigned hi = __byte_perm(__byte_perm(q[4], q[5], 0x0040u),
                                        __byte_perm(q[6], q[7], 0x0040u), 0x5410u);
        return make_uint2(lo, hi);
    }
    unsigned w = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) w |= (q[i] & 0xfu) << (4 * i); /* even: low nibble */
    return make_uint2(w, 0u);
}

/* The scale and reciprocal of a block from its absmax bit pattern, with the
 * reference's edge cases (quant.c): a NaN/Inf in the block gives scale NaN
 * (bits 0x7fc00000) and payload 0; absmax 0 gives scale 0 and payload 0
 * (inv = 0 does it: x * 0 = 0, floor(0 + u) = 0 for u in [0, 1)); and
 * 0 < absmax < qmax / FLT_MAX makes inv overflow to +Inf ("tiny": scale
 * stored as usual, rounding through the literal slow path). */
struct BlockScale {
    float scale, inv;
    bool bad;  /* NaN or Inf in the block */
    bool tiny; /* inv == +Inf */
};
/* sdiv: what absmax is divided by for the stored scale (qmax; E2M1: 6). */
__device__ __forceinline__ BlockScale block_scale(unsigned amax_bits, float qmax, float sdiv) {
    BlockScale s;
    s.bad = amax_bits >= 0x7f800000u;
    s.tiny = false;
    if (s.bad) {
        s.scale = __uint_as_float(kNaNBits);
        s.inv = 0.0f;
    } else if (amax_bits == 0) {
        s.scale = 0.0f;
        s.inv = 0.0f;
    } else {
        const float amax = __uint_as_float(amax_bits);
        s.scale = __fdiv_rn(amax, sdiv);
        s.inv = __fdiv_rn(qmax, amax);
        s.tiny = __float_as_uint(s.inv) == 0x7f800000u;
    }
    return s;
}

template <bool STOCH>
__device__ __forceinline__ uint2 quant8_block(const float (&v)[8], const BlockScale &s,
                                              float qmax, int bits, bool e2m1,
                                              unsigned long long seed, unsigned long long idx0) {
    if (s.bad) return make_uint2(0u, 0u);
    if (s.tiny) return quant8<STOCH, true>(v, s.inv, qmax, bits, e2m1, seed, idx0);
    return quant8<STOCH, false>(v, s.inv, qmax, bits, e2m1, seed, idx0);
}

__device__ __forceinline__ unsigned absmax_bits8(const float (&v)[8], unsigned m) {
#pragma unroll
    for (int i = 0; i < 8; i++) m = max(m, __float_as_uint(v[i]) & 0x7fffffffu);
    return m;
}

/* ---- tiles ------------------------------------------------------------ */

/* Compile-time knobs, kept as macros so that variants can be measured
 * against each other (see the file comment):
 *   ZPP_QCU_PIPELINE  1: a warp fetches its next tiles before it processes
 *                     the current ones, so its loads stay in flight while
 *                     it reduces, divides and stores.
 *   ZPP_QCU_VPT_MIN   vectors (8 elements) each thread holds of one tile
 *                     when the tile has that many; the rest of the tile
 *                     goes to more threads (up to a warp). */
#ifndef ZPP_QCU_PIPELINE
#define ZPP_QCU_PIPELINE 0
#endif
#ifndef ZPP_QCU_VPT_MIN
#define ZPP_QCU_VPT_MIN 4
#endif
/*   ZPP_QCU_SLOTS     vectors a thread holds per loop trip (U = SLOTS / VPT
 *                     tiles when VPT < SLOTS). */
#ifndef ZPP_QCU_SLOTS
#define ZPP_QCU_SLOTS 4
#endif
/*   ZPP_QCU_DQ{8,4}_VPT_MIN, ZPP_QCU_DQ{8,4}_PIPELINE: the same for the
 *                     dequantize kernels of int8 and int4 payloads, whose
 *                     best shapes differ (measured, see the file comment). */
#ifndef ZPP_QCU_DQ8_VPT_MIN
#define ZPP_QCU_DQ8_VPT_MIN 2
#endif
#ifndef ZPP_QCU_DQ8_PIPELINE
#define ZPP_QCU_DQ8_PIPELINE 1
#endif
#ifndef ZPP_QCU_DQ4_VPT_MIN
#define ZPP_QCU_DQ4_VPT_MIN 4
#endif
#ifndef ZPP_QCU_DQ4_PIPELINE
#define ZPP_QCU_DQ4_PIPELINE 0
#endif

/* One tile a thread group works on: chunk c, block b of the chunk, elements
 * [e0, e0 + len) of the chunk; len 0: no tile (past the end). */
struct Tile {
    unsigned c, b, len;
    unsigned long long e0;
};

/* Vector s of the calling thread in a tile: element offset in the tile and
 * number of valid elements (0: nothing to do). */
__device__ __forceinline__ unsigned vec_off(unsigned t, unsigned T, int s) {
    return (t + (unsigned)s * T) * 8u;
}
__device__ __forceinline__ unsigned vec_cnt(const Tile &x, unsigned e) {
    return e < x.len ? min(8u, x.len - e) : 0u;
}

/* Chunk and remainder of tile `tile` (< total). */
__device__ __forceinline__ void tile_chunk(unsigned tile, unsigned n_chunks, unsigned per_chunk,
                                           unsigned *c_p, unsigned *r_p) {
    unsigned c = 0, r = tile;
    if (n_chunks > 1) {
        c = tile / per_chunk;
        r = tile - c * per_chunk;
    }
    *c_p = c, *r_p = r;
}

/* ---- sources of fp32 values to quantize ------------------------------- */

/* Raw dtype input; chunk c of the output reads input chunk src(c): the
 * identity, or the qgZ reorder (output position dest_local*nodes + node holds
 * chunk node*local + dest_local). Input chunks lie `stride` elements apart
 * and `in` points at element `first` of chunk 0 (a slab: the output chunks
 * are shorter than the input's). The stochastic element index is the
 * element's index in the whole input. */
template <class D>
struct RawSrc {
    const typename D::raw *in;
    unsigned long long stride, first;
    unsigned nodes, local; /* reorder when local > 0 */
    bool vec;

    template <int N>
    struct Stage {
        Raw8 r[N];
    };

    /* offset from `in` of element 0 of output chunk c */
    __device__ __forceinline__ unsigned long long origin(unsigned c) const {
        if (local == 0) return (unsigned long long)c * stride;
        const unsigned dl = c / nodes, node = c - dl * nodes;
        return (unsigned long long)(node * local + dl) * stride;
    }
    /* stochastic index of element 0 of output chunk c */
    __device__ __forceinline__ unsigned long long index(unsigned c) const {
        return origin(c) + first;
    }
    template <int U, int VPT>
    __device__ __forceinline__ void fetch(const Tile (&tl)[U], unsigned t, unsigned T,
                                          Stage<U * VPT> &st) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const typename D::raw *p = in + origin(tl[u].c) + tl[u].e0;
#pragma unroll
            for (int s = 0; s < VPT; s++) {
                const unsigned e = vec_off(t, T, s);
                st.r[u * VPT + s] = fetch8<D, true>(p + e, vec_cnt(tl[u], e), vec);
            }
        }
    }
    template <int U, int VPT>
    __device__ __forceinline__ void finish(const Tile (&)[U], unsigned, unsigned,
                                           const Stage<U * VPT> &st,
                                           float (&v)[U * VPT][8]) const {
#pragma unroll
        for (int n = 0; n < U * VPT; n++) unpack8<D>(st.r[n], v[n]);
    }
    /* max(m, |x| bit pattern as fp32) over slot n. 16-bit types work on
     * the packed words (sign bits cleared, per-halfword unsigned max: the
     * bit order of a non-negative bf16/fp16 is its value order), then widen
     * the winner exactly; NaN/Inf stay >= 0x7f800000 after widening. */
    template <int N>
    __device__ __forceinline__ unsigned amax(const Stage<N> &st, const float (&v)[N][8], int n,
                                             unsigned m) const {
        if constexpr (D::size == 4) {
            return absmax_bits8(v[n], m);
        } else {
            const uint4 w = st.r[n].a;
            unsigned h = __vmaxu2(__vmaxu2(w.x & 0x7fff7fffu, w.y & 0x7fff7fffu),
                                  __vmaxu2(w.z & 0x7fff7fffu, w.w & 0x7fff7fffu));
            h = max(h & 0xffffu, h >> 16);
            return max(m, __float_as_uint(to_f32(D(), (uint16_t)h)));
        }
    }
};

/* k quantized inputs laid end to end; the value is their fp32 sum in input
 * order. Chunk c of the output is chunk c of every input. The first two
 * inputs are fetched ahead (Stage), the others when the sum is formed. */
struct DeqSumSrc {
    QLayout in;                   /* input 0 */
    unsigned long long in_stride; /* bytes between inputs */
    unsigned long long idx_stride, idx_first; /* stochastic index: c * stride + first */
    int k;
    bool same_block; /* in block == out block: block index carries over */

    template <int N>
    struct Stage {
        uint2 w[2][N];
        float sc[2][N];
    };

    __device__ __forceinline__ unsigned long long index(unsigned c) const {
        return (unsigned long long)c * idx_stride + idx_first;
    }
    template <int N>
    __device__ __forceinline__ unsigned amax(const Stage<N> &, const float (&v)[N][8], int n,
                                             unsigned m) const {
        return absmax_bits8(v[n], m);
    }
    __device__ __forceinline__ unsigned in_block(const Tile &x, unsigned long long e) const {
        /* e and the block are multiples of 8, and e / 8 < 2^32 (host check) */
        return same_block ? x.b : (unsigned)(e >> 3) / (in.block >> 3);
    }
    /* payload words and scales of input j for every slot */
    template <int U, int VPT>
    __device__ __forceinline__ void fetch_input(const Tile (&tl)[U], unsigned t, unsigned T,
                                                int j, uint2 (&w)[U * VPT],
                                                float (&sc)[U * VPT]) const {
        QLayout L = in;
        L.base += in_stride * (unsigned long long)j;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < VPT; s++) {
                const unsigned e = vec_off(t, T, s), n = u * VPT + s;
                w[n] = make_uint2(0u, 0u);
                sc[n] = 0.0f;
                if (j < k && vec_cnt(tl[u], e)) {
                    const unsigned long long ee = tl[u].e0 + e;
                    w[n] = load_payload(L, tl[u].c, ee);
                    /* one scale per tile when the blocks agree */
                    if (!same_block || s == 0)
                        sc[n] = load_scale(L, tl[u].c, in_block(tl[u], ee));
                    else
                        sc[n] = sc[u * VPT];
                }
            }
    }
    template <int U, int VPT>
    __device__ __forceinline__ void fetch(const Tile (&tl)[U], unsigned t, unsigned T,
                                          Stage<U * VPT> &st) const {
        fetch_input<U, VPT>(tl, t, T, 0, st.w[0], st.sc[0]);
        fetch_input<U, VPT>(tl, t, T, 1, st.w[1], st.sc[1]);
    }
    template <int N>
    __device__ __forceinline__ void add(const uint2 (&w)[N], const float (&sc)[N],
                                        float (&v)[N][8]) const {
#pragma unroll
        for (int n = 0; n < N; n++) {
            float d[8];
            dequant8(w[n], in.bits, in.e2m1, sc[n], d);
            /* 0 + d == d exactly (d is never -0), so starting the sum at 0
             * matches a reference that starts from input 0. */
#pragma unroll
            for (int i = 0; i < 8; i++) v[n][i] = __fadd_rn(v[n][i], d[i]);
        }
    }
    template <int U, int VPT>
    __device__ __forceinline__ void finish(const Tile (&tl)[U], unsigned t, unsigned T,
                                           const Stage<U * VPT> &st,
                                           float (&v)[U * VPT][8]) const {
        constexpr int N = U * VPT;
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int i = 0; i < 8; i++) v[n][i] = 0.0f;
        add<N>(st.w[0], st.sc[0], v);
        if (k > 1) add<N>(st.w[1], st.sc[1], v);
        for (int j = 2; j < k; j++) {
            uint2 w[N];
            float sc[N];
            fetch_input<U, VPT>(tl, t, T, j, w, sc);
            add<N>(w, sc, v);
        }
        /* elements past the chunk's end count as 0 (a NaN scale must not
         * leak into them through 0 * NaN) */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < VPT; s++) {
                const unsigned cnt = vec_cnt(tl[u], vec_off(t, T, s));
                if (cnt < 8) {
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        if ((unsigned)i >= cnt) v[u * VPT + s][i] = 0.0f;
                }
            }
    }
};

/* ---- quantize -------------------------------------------------------- */

struct QDst {
    QLayout out;
    unsigned long long chunk_len;
    unsigned long long pay_end; /* payload bytes written by whole vectors */
    unsigned nb;                /* blocks per chunk */
    unsigned n_chunks;
    unsigned total;             /* n_chunks * nb */
    int log2T;                  /* group size T = 1 << log2T */
    float qmax;
    float sdiv;                 /* absmax / sdiv is the stored scale */
    unsigned long long seed;
    int *nonfinite;
};

/* Per-block epilogue of the group's thread 0: the scale, the flag, and for
 * the last block of a chunk the zero padding after the payload and after the
 * scales. */
__device__ __forceinline__ void block_epilogue(const QDst &q, unsigned c, unsigned b,
                                               const BlockScale &s) {
    unsigned char *p = q.out.base + (unsigned long long)c * q.out.qbytes;
    *reinterpret_cast<float *>(p + q.out.scales + 4ull * b) = s.scale;
    if (s.bad && q.nonfinite) *q.nonfinite = 1;
    if (b == q.nb - 1) {
#pragma unroll 1
        for (unsigned long long x = q.pay_end; x < q.out.scales; x++) p[x] = 0;
#pragma unroll 1
        for (unsigned long long x = q.out.scales + 4ull * q.nb; x < q.out.qbytes; x++) p[x] = 0;
    }
}

__device__ __forceinline__ Tile quant_tile(const QDst &q, unsigned tile) {
    Tile x;
    x.c = 0, x.b = 0, x.len = 0, x.e0 = 0;
    if (tile < q.total) {
        tile_chunk(tile, q.n_chunks, q.nb, &x.c, &x.b);
        x.e0 = (unsigned long long)x.b * q.out.block;
        const unsigned long long rest = q.chunk_len - x.e0;
        x.len = rest < q.out.block ? (unsigned)rest : q.out.block;
    }
    return x;
}

/* Register path: block <= 2048 elements. See the file comment. A group of
 * T threads owns a block; a warp owns G = 32/T blocks per round and U
 * rounds per loop trip; slot n = u * VPT + s of a thread is vector
 * t + s*T of its group's u-th block. */
template <class Src, int VPT, int U, bool STOCH>
__global__ void __launch_bounds__(kThreads)
    k_quantize(const Src src, const QDst q) {
    constexpr int N = U * VPT;
    typedef typename Src::template Stage<N> Stage;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned T = 1u << q.log2T, G = 32u >> q.log2T;
    const unsigned grp = lane >> q.log2T, t = lane & (T - 1);
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned nwarp = (gridDim.x * blockDim.x) >> 5;
    const unsigned step = G * U;
    /* with 8 slots a thread has enough loads in flight without it */
    constexpr bool pipe = ZPP_QCU_PIPELINE && N <= 4;

    unsigned base = warp * step;
    if (base >= q.total) return; /* warp-uniform */
    Tile cur[U];
    Stage st;
#pragma unroll
    for (int u = 0; u < U; u++) cur[u] = quant_tile(q, base + (unsigned)u * G + grp);
    src.template fetch<U, VPT>(cur, t, T, st);
    for (;;) {
        const unsigned nbase = base + nwarp * step;
        Tile nxt[U];
        Stage nst;
        if (pipe) {
#pragma unroll
            for (int u = 0; u < U; u++) nxt[u] = quant_tile(q, nbase + (unsigned)u * G + grp);
            src.template fetch<U, VPT>(nxt, t, T, nst);
        }
        float v[N][8];
        src.template finish<U, VPT>(cur, t, T, st, v);
        /* absmax per tile: thread, then group */
        unsigned m[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            m[u] = 0;
#pragma unroll
            for (int s = 0; s < VPT; s++) m[u] = src.template amax<N>(st, v, u * VPT + s, m[u]);
        }
        for (unsigned off = T >> 1; off > 0; off >>= 1) {
#pragma unroll
            for (int u = 0; u < U; u++) m[u] = max(m[u], __shfl_xor_sync(0xffffffffu, m[u], off));
        }
        /* quantize and store */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const Tile &x = cur[u];
            if (x.len == 0) continue;
            const BlockScale bs = block_scale(m[u], q.qmax, q.sdiv);
            const unsigned long long idx = STOCH ? src.index(x.c) + x.e0 : 0ull;
#pragma unroll
            for (int s = 0; s < VPT; s++) {
                const unsigned e = vec_off(t, T, s);
                if (e < x.len) {
                    const uint2 w = quant8_block<STOCH>(v[u * VPT + s], bs, q.qmax, q.out.bits,
                                                        q.out.e2m1, q.seed, idx + e);
                    store_payload(q.out, x.c, x.e0 + e, w);
                }
            }
            if (t == 0) block_epilogue(q, x.c, x.b, bs);
        }
        if (nbase >= q.total) break;
        base = nbase;
        if (pipe) {
#pragma unroll
            for (int u = 0; u < U; u++) cur[u] = nxt[u];
            st = nst;
        } else {
#pragma unroll
            for (int u = 0; u < U; u++) cur[u] = quant_tile(q, base + (unsigned)u * G + grp);
            src.template fetch<U, VPT>(cur, t, T, st);
        }
    }
}

/* Large blocks (> 2048 elements): one warp per block, two passes (absmax,
 * then quantize); the second pass re-reads the block, mostly from L2. */
template <class Src, bool STOCH>
__global__ void __launch_bounds__(kThreads) k_quantize_big(const Src src, const QDst q) {
    constexpr int S = 4;
    typedef typename Src::template Stage<S> Stage;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned nwarp = (gridDim.x * blockDim.x) >> 5;
    for (unsigned tile = warp; tile < q.total; tile += nwarp) {
        const Tile x = quant_tile(q, tile);
        unsigned m = 0;
        for (int pass = 0; pass < 2; pass++) {
            BlockScale bs;
            if (pass == 1) {
#pragma unroll
                for (unsigned off = 16; off > 0; off >>= 1)
                    m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
                bs = block_scale(m, q.qmax, q.sdiv);
            }
            /* S consecutive 256-element pieces of the block as 1 x S tiles */
            for (unsigned e1 = 0; e1 < x.len; e1 += 32u * 8u * S) {
                Tile pc[1] = {x};
                pc[0].e0 = x.e0 + e1;
                pc[0].len = x.len - e1;
                Stage st;
                float v[S][8];
                src.template fetch<1, S>(pc, lane, 32u, st);
                src.template finish<1, S>(pc, lane, 32u, st, v);
#pragma unroll
                for (int s = 0; s < S; s++) {
                    const unsigned e = vec_off(lane, 32u, s);
                    if (pass == 0) {
                        m = src.template amax<S>(st, v, s, m);
                    } else if (e < pc[0].len) {
                        const unsigned long long idx = STOCH ? src.index(x.c) + pc[0].e0 : 0ull;
                        const uint2 w = quant8_block<STOCH>(v[s], bs, q.qmax, q.out.bits,
                                                            q.out.e2m1, q.seed, idx + e);
                        store_payload(q.out, x.c, pc[0].e0 + e, w);
                    }
                }
            }
            if (pass == 1 && lane == 0) block_epilogue(q, x.c, x.b, bs);
        }
    }
}

/* ---- dequantize ------------------------------------------------------ */

enum DqMode { DQ_STORE = 0, DQ_ACC = 1, DQ_REDUCE = 2 };

/* Tiles: pieces of at most 2048 elements of one block of one chunk. For
 * DQ_REDUCE the tiles cover one chunk's elements and every chunk is summed
 * into them. */
struct DqArgs {
    QLayout q;
    unsigned long long chunk_len;
    unsigned n_chunks;  /* chunks to dequantize, or to sum (DQ_REDUCE) */
    unsigned per_chunk; /* tiles per chunk = nb * tpb */
    unsigned tpb;       /* tiles per block */
    unsigned tile_len;
    unsigned total;     /* tiles in all */
    int log2T;
    void *out;
    bool vec;    /* out 16-byte aligned and each chunk's output too (and exact) */
    float scale; /* DQ_REDUCE */
    const float *exact; /* DQ_REDUCE: where the sum starts; NULL: at 0 */
};

template <int MODE>
__device__ __forceinline__ Tile dq_tile(const DqArgs &a, unsigned tile) {
    Tile x;
    x.c = 0, x.b = 0, x.len = 0, x.e0 = 0;
    if (tile < a.total) {
        unsigned r, p = 0;
        tile_chunk(tile, MODE == DQ_REDUCE ? 1u : a.n_chunks, a.per_chunk, &x.c, &r);
        x.b = r;
        if (a.tpb > 1) {
            x.b = r / a.tpb;
            p = r - x.b * a.tpb;
        }
        x.e0 = (unsigned long long)x.b * a.q.block + (unsigned long long)p * a.tile_len;
        if (x.e0 < a.chunk_len) {
            unsigned long long rest = a.chunk_len - x.e0;
            const unsigned in_block = a.q.block - p * a.tile_len;
            if (rest > in_block) rest = in_block;
            x.len = rest < a.tile_len ? (unsigned)rest : a.tile_len;
        }
    }
    return x;
}

/* What a thread fetches ahead for its tiles: payload words and scales of
 * chunk `c` (DQ_REDUCE: chunk ci of the sum), and the accumulator (DQ_ACC). */
template <int U, int VPT, int MODE>
struct DqStage {
    uint2 w[U * VPT];
    float sc[U];
    Raw8 acc[MODE == DQ_ACC ? U * VPT : 1];
};

template <int U, int VPT, int MODE>
__device__ __forceinline__ void dq_fetch(const DqArgs &a, const Tile (&tl)[U], unsigned t,
                                         unsigned T, unsigned ci, DqStage<U, VPT, MODE> &st) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const unsigned c = MODE == DQ_REDUCE ? ci : tl[u].c;
        st.sc[u] = tl[u].len ? load_scale(a.q, c, tl[u].b) : 0.0f;
#pragma unroll
        for (int s = 0; s < VPT; s++) {
            const unsigned e = vec_off(t, T, s), n = u * VPT + s;
            const unsigned cnt = vec_cnt(tl[u], e);
            st.w[n] = cnt ? load_payload(a.q, c, tl[u].e0 + e) : make_uint2(0u, 0u);
            if (MODE == DQ_ACC)
                st.acc[n] = fetch8<F32, false>(static_cast<const float *>(a.out) + tl[u].e0 + e,
                                               cnt, a.vec);
        }
    }
}

/* v = dequantized stage (DQ_STORE), acc + it (DQ_ACC), v + it (DQ_REDUCE). */
template <int U, int VPT, int MODE>
__device__ __forceinline__ void dq_add(const DqArgs &a, const DqStage<U, VPT, MODE> &st,
                                       float (&v)[U * VPT][8]) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int s = 0; s < VPT; s++) {
            const int n = u * VPT + s;
            float d[8];
            dequant8(st.w[n], a.q.bits, a.q.e2m1, st.sc[u], d);
            if (MODE == DQ_STORE) {
#pragma unroll
                for (int i = 0; i < 8; i++) v[n][i] = d[i];
            } else {
                if (MODE == DQ_ACC) unpack8<F32>(st.acc[n], v[n]);
                /* acc + d; for the reduce 0 + d0 + d1 + ... in chunk order
                 * (0 + d0 == d0 exactly: d0 is never -0) */
#pragma unroll
                for (int i = 0; i < 8; i++) v[n][i] = __fadd_rn(v[n][i], d[i]);
            }
        }
}

/* The occupancy hint (4 CTAs, <= 64 registers) only for the fp32-output
 * store without pipelining, where ptxas otherwise picks 48 registers and
 * spills 4 bytes. */
template <class D, int VPT, int U, int MODE, bool PIPE>
__global__ void __launch_bounds__(kThreads,
                                  D::size == 4 && MODE == DQ_STORE && !PIPE && VPT <= 4 ? 4 : 0)
    k_dequant(const DqArgs a) {
    typedef typename D::raw raw;
    typedef DqStage<U, VPT, MODE> Stage;
    constexpr int N = U * VPT;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned T = 1u << a.log2T, G = 32u >> a.log2T;
    const unsigned grp = lane >> a.log2T, t = lane & (T - 1);
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned nwarp = (gridDim.x * blockDim.x) >> 5;
    const unsigned step = G * U;
    raw *const out = static_cast<raw *>(a.out);
    /* with 8 slots a thread has enough loads in flight without it */
    constexpr bool pipe = PIPE && MODE != DQ_REDUCE && N <= 4;

    unsigned base = warp * step;
    if (base >= a.total) return;
    Tile cur[U];
    Stage st;
#pragma unroll
    for (int u = 0; u < U; u++) cur[u] = dq_tile<MODE>(a, base + (unsigned)u * G + grp);
    dq_fetch<U, VPT, MODE>(a, cur, t, T, 0, st);
    for (;;) {
        const unsigned nbase = base + nwarp * step;
        Tile nxt[U];
        Stage nst;
        if (pipe) {
#pragma unroll
            for (int u = 0; u < U; u++) nxt[u] = dq_tile<MODE>(a, nbase + (unsigned)u * G + grp);
            dq_fetch<U, VPT, MODE>(a, nxt, t, T, 0, nst);
        }
        float v[N][8];
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int i = 0; i < 8; i++) v[n][i] = 0.0f;
        if (MODE == DQ_REDUCE && a.exact) {
            /* the reduce's exact input first (the one chunk is chunk 0; the
             * coherent path, since exact may be the output) */
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int s = 0; s < VPT; s++) {
                    const unsigned e = vec_off(t, T, s);
                    unpack8<F32>(fetch8<F32, false>(a.exact + cur[u].e0 + e, vec_cnt(cur[u], e),
                                                    a.vec),
                                 v[u * VPT + s]);
                }
        }
        dq_add<U, VPT, MODE>(a, st, v);
        if (MODE == DQ_REDUCE) {
            /* the other chunks, summed in order */
            for (unsigned ci = 1; ci < a.n_chunks; ci++) {
                Stage s1;
                dq_fetch<U, VPT, MODE>(a, cur, t, T, ci, s1);
                dq_add<U, VPT, MODE>(a, s1, v);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const Tile &x = cur[u];
            if (x.len == 0) continue;
            raw *o = out + (unsigned long long)x.c * a.chunk_len + x.e0;
#pragma unroll
            for (int s = 0; s < VPT; s++) {
                const unsigned e = vec_off(t, T, s), n = u * VPT + s;
                if (e < x.len) {
                    if (MODE == DQ_REDUCE) {
#pragma unroll
                        for (int i = 0; i < 8; i++) v[n][i] = __fmul_rn(v[n][i], a.scale);
                    }
                    store8<D>(o + e, min(8u, x.len - e), a.vec, v[n]);
                }
            }
        }
        if (nbase >= a.total) break;
        base = nbase;
        if (pipe) {
#pragma unroll
            for (int u = 0; u < U; u++) cur[u] = nxt[u];
            st = nst;
        } else {
#pragma unroll
            for (int u = 0; u < U; u++) cur[u] = dq_tile<MODE>(a, base + (unsigned)u * G + grp);
            dq_fetch<U, VPT, MODE>(a, cur, t, T, 0, st);
        }
    }
}

/* ---- convert --------------------------------------------------------- */

/* out = (DO)(in * scale), 8 elements per vector, 2 vectors per thread in
 * flight. In place is allowed (DI == DO): each thread reads its elements
 * before it writes them, through the coherent (L2) path. */
template <class DI, class DO>
__global__ void __launch_bounds__(kThreads)
    k_convert(const typename DI::raw *in, typename DO::raw *out, unsigned long long n,
              float scale, bool vec) {
    const unsigned long long nvec = (n + 7) / 8;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < nvec; i += 2 * stride) {
        Raw8 r[2];
        unsigned cnt[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const unsigned long long j = i + u * stride;
            cnt[u] = j < nvec ? (unsigned)min(8ull, n - j * 8) : 0u;
            r[u] = fetch8<DI, false>(in + j * 8, cnt[u], vec);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (cnt[u] == 0) continue;
            float v[8];
            unpack8<DI>(r[u], v);
            if (scale != 1.0f) {
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = __fmul_rn(v[k], scale);
            }
            store8<DO>(out + (i + u * stride) * 8, cnt[u], vec, v);
        }
    }
}

} /* namespace */

namespace {

/* ==== host side ======================================================== */

zpp_status launch_status(const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA, "%s: kernel launch failed: %s (%s)", what,
                         cudaGetErrorString(e), cudaGetErrorName(e));
    return ZPP_OK;
}

/* A persistent grid: enough CTAs to fill every SM at the kernel's occupancy,
 * fewer when there is less work. */
template <class K>
zpp_status grid_for(K kernel, unsigned long long warps_needed, const char *what,
                    unsigned *grid_p) {
    int dev = 0, sms = 0, occ = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, 0);
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA, "%s: cannot size the launch: %s; is a CUDA device "
                         "visible?", what, cudaGetErrorString(e));
    if (occ < 1) occ = 1;
    const unsigned long long ctas = (warps_needed + kThreads / 32 - 1) / (kThreads / 32);
    unsigned long long grid = (unsigned long long)sms * (unsigned long long)occ;
    if (ctas < grid) grid = ctas;
    *grid_p = grid ? (unsigned)grid : 1u;
    return ZPP_OK;
}

unsigned long long round_up(unsigned long long x, unsigned long long m) {
    return (x + m - 1) / m * m;
}

int log2_ceil(unsigned x) {
    int l = 0;
    while ((1u << l) < x) l++;
    return l;
}

/* Threads per tile T and vectors per thread VPT for a tile of `len`
 * elements (<= 2048): each thread takes ZPP_QCU_VPT_MIN vectors when the
 * tile has them (so a block's two divisions and its shuffle steps are shared
 * by more elements), more when the tile would need more than a warp. */
void tile_shape(unsigned len, unsigned vpt_min, int *log2T_p, int *vpt_p) {
    unsigned nv = (len + 7) / 8;
    if (nv == 0) nv = 1;
    unsigned vpt = 1;
    while (vpt < vpt_min && vpt < nv) vpt *= 2;
    while ((nv + vpt - 1) / vpt > 32) vpt *= 2;
    *log2T_p = log2_ceil((nv + vpt - 1) / vpt);
    *vpt_p = (int)vpt;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

zpp_status check_dtype(zpp_dtype d, const char *what) {
    if (d != ZPP_FP32 && d != ZPP_BF16 && d != ZPP_FP16)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d; use ZPP_FP32, ZPP_BF16 or "
                         "ZPP_FP16", what, (int)d);
    return ZPP_OK;
}

zpp_status check_qptr(const void *p, const char *what, const char *name) {
    if (!p) return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL", what, name);
    if (!aligned16(p))
        return zpp_error(ZPP_ERR_INVALID, "%s: quantized buffer %s at %p is not 16-byte "
                         "aligned; the wire layout needs it (cudaMalloc memory is)", what,
                         name, p);
    return ZPP_OK;
}

/* Fills the quantized-side description of chunks of chunk_len elements. */
QLayout make_layout(const void *base, size_t chunk_len, const zpp_quant_spec *spec) {
    QLayout L;
    L.base = static_cast<unsigned char *>(const_cast<void *>(base));
    L.qbytes = zpp_quant_bytes(chunk_len, spec);
    L.scales = zpp_quant_scales_offset(chunk_len, spec->bits);
    L.block = (unsigned)spec->block;
    L.bits = spec->bits;
    L.e2m1 = spec->format == ZPP_QUANT_E2M1;
    return L;
}

/* Launch geometry of a quantize. */
zpp_status make_qdst(void *out, size_t n_chunks, size_t chunk_len, const zpp_quant_spec *spec,
                     int *nonfinite, const char *what, QDst *q_p, unsigned *tile_len_p) {
    QDst q;
    q.out = make_layout(out, chunk_len, spec);
    q.chunk_len = chunk_len;
    const unsigned long long r8 = round_up(chunk_len, 8);
    q.pay_end = spec->bits == 8 ? r8 : r8 / 2;
    const unsigned long long nb = zpp_quant_num_blocks(chunk_len, spec->block);
    const unsigned long long total = nb * n_chunks;
    if (n_chunks > 0x7fffffffull || total > 0x7fffffffull || chunk_len >= (1ull << 35))
        return zpp_error(ZPP_ERR_INVALID, "%s: %zu chunks of %zu elements (%llu blocks) are "
                         "beyond the kernels' limits (2^31 blocks, 2^35 elements a chunk); "
                         "split the call or use a larger block", what, n_chunks, chunk_len,
                         total);
    q.nb = (unsigned)nb;
    q.n_chunks = (unsigned)n_chunks;
    q.total = (unsigned)total;
    q.qmax = zpp_ql_qmax(spec);
    q.sdiv = zpp_ql_scale_div(spec);
    q.seed = spec->stochastic ? spec->seed : 0;
    q.nonfinite = nonfinite;
    const unsigned long long tl = r8 < spec->block ? r8 : spec->block;
    int vpt;
    tile_shape(tl <= kMaxRegTile ? (unsigned)tl : kMaxRegTile, ZPP_QCU_VPT_MIN, &q.log2T, &vpt);
    *tile_len_p = (unsigned)tl;
    *q_p = q;
    return ZPP_OK;
}

template <class Src, int VPT, bool STOCH>
zpp_status launch_quant_vpt(const Src &src, const QDst &q, cudaStream_t st, const char *what) {
    constexpr int U = VPT >= ZPP_QCU_SLOTS ? 1 : ZPP_QCU_SLOTS / VPT;
    auto kern = k_quantize<Src, VPT, U, STOCH>;
    const unsigned G = 32u >> q.log2T;
    unsigned grid;
    ZPP_CHECK(grid_for(kern, (q.total + G * U - 1) / (G * U), what, &grid));
    kern<<<grid, kThreads, 0, st>>>(src, q);
    return launch_status(what);
}

template <class Src, bool STOCH>
zpp_status launch_quant_st(const Src &src, const QDst &q, unsigned tile_len, cudaStream_t st,
                           const char *what) {
    if (tile_len > kMaxRegTile) {
        auto kern = k_quantize_big<Src, STOCH>;
        unsigned grid;
        ZPP_CHECK(grid_for(kern, q.total, what, &grid));
        kern<<<grid, kThreads, 0, st>>>(src, q);
        return launch_status(what);
    }
    int log2T, vpt;
    tile_shape(tile_len, ZPP_QCU_VPT_MIN, &log2T, &vpt);
    switch (vpt) {
    case 1: return launch_quant_vpt<Src, 1, STOCH>(src, q, st, what);
    case 2: return launch_quant_vpt<Src, 2, STOCH>(src, q, st, what);
    case 4: return launch_quant_vpt<Src, 4, STOCH>(src, q, st, what);
    default: return launch_quant_vpt<Src, 8, STOCH>(src, q, st, what);
    }
}

template <class Src>
zpp_status launch_quant(const Src &src, const QDst &q, unsigned tile_len, bool stoch,
                        cudaStream_t st, const char *what) {
    if (q.total == 0) return ZPP_OK;
    return stoch ? launch_quant_st<Src, true>(src, q, tile_len, st, what)
                 : launch_quant_st<Src, false>(src, q, tile_len, st, what);
}

/* Elements [first, first + len) of each of n_chunks input chunks of
 * chunk_len elements, each quantized as a tensor of len (the whole chunks:
 * first 0, len chunk_len). */
struct QuantIn {
    const void *in;
    zpp_dtype dtype;
    size_t n_chunks, chunk_len, first, len;
    int nodes, local; /* the qgZ reorder when local > 0 */
};

template <class D>
zpp_status quantize_raw(const QuantIn &a, const zpp_quant_spec *spec, void *out, int *nonfinite,
                        cudaStream_t st, const char *what) {
    QDst q;
    unsigned tile_len;
    ZPP_CHECK(make_qdst(out, a.n_chunks, a.len, spec, nonfinite, what, &q, &tile_len));
    RawSrc<D> src;
    src.in = static_cast<const typename D::raw *>(a.in) + a.first;
    src.stride = a.chunk_len;
    src.first = a.first;
    src.nodes = (unsigned)a.nodes;
    src.local = (unsigned)a.local;
    src.vec = aligned16(src.in) && ((unsigned long long)a.chunk_len * D::size) % 16 == 0;
    return launch_quant(src, q, tile_len, spec->stochastic != 0, st, what);
}

zpp_status quantize_dispatch(const QuantIn &a, const zpp_quant_spec *spec, void *out,
                             int *nonfinite, cudaStream_t st, const char *what) {
    ZPP_CHECK(check_dtype(a.dtype, what));
    ZPP_CHECK(zpp_quant_spec_check(spec));
    if (a.first > a.chunk_len || a.len > a.chunk_len - a.first)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: slab [%zu, %zu) runs past a chunk of %zu elements", what, a.first,
                         a.first + a.len, a.chunk_len);
    if (a.n_chunks == 0 || a.len == 0) return ZPP_OK;
    if (!a.in) return zpp_error(ZPP_ERR_INVALID, "%s: input is NULL", what);
    ZPP_CHECK(check_qptr(out, what, "out"));
    switch (a.dtype) {
    case ZPP_BF16: return quantize_raw<BF16>(a, spec, out, nonfinite, st, what);
    case ZPP_FP16: return quantize_raw<FP16>(a, spec, out, nonfinite, st, what);
    default: return quantize_raw<F32>(a, spec, out, nonfinite, st, what);
    }
}

/* Launch geometry of a dequantize over n_chunks chunks (or, for the reduce,
 * over one chunk's elements). */
zpp_status make_dq(const void *q, size_t n_tile_chunks, size_t n_chunks, size_t chunk_len,
                   const zpp_quant_spec *spec, void *out, bool vec, float scale,
                   const char *what, DqArgs *a_p, int *vpt_p) {
    DqArgs a;
    a.q = make_layout(q, chunk_len, spec);
    a.chunk_len = chunk_len;
    const unsigned long long r8 = round_up(chunk_len, 8);
    const unsigned long long eff = r8 < spec->block ? r8 : spec->block;
    const unsigned long long tl = eff < kMaxRegTile ? eff : kMaxRegTile;
    const unsigned long long tpb = (eff + tl - 1) / tl;
    const unsigned long long nb = zpp_quant_num_blocks(chunk_len, spec->block);
    const unsigned long long per_chunk = nb * tpb;
    const unsigned long long total = per_chunk * n_tile_chunks;
    if (n_chunks > 0x7fffffffull || total > 0x7fffffffull || chunk_len >= (1ull << 35))
        return zpp_error(ZPP_ERR_INVALID, "%s: %zu chunks of %zu elements are too many "
                         "pieces (%llu) for one launch; split the call", what, n_chunks,
                         chunk_len, total);
    a.n_chunks = (unsigned)n_chunks;
    a.per_chunk = (unsigned)per_chunk;
    a.tpb = (unsigned)tpb;
    a.tile_len = (unsigned)tl;
    a.total = (unsigned)total;
    tile_shape(a.tile_len, spec->bits == 8 ? ZPP_QCU_DQ8_VPT_MIN : ZPP_QCU_DQ4_VPT_MIN,
               &a.log2T, vpt_p);
    a.out = out;
    a.vec = vec;
    a.scale = scale;
    a.exact = nullptr;
    *a_p = a;
    return ZPP_OK;
}

template <class D, int MODE, int VPT>
zpp_status launch_dq_vpt(const DqArgs &a, cudaStream_t st, const char *what) {
    constexpr int U = VPT >= ZPP_QCU_SLOTS ? 1 : ZPP_QCU_SLOTS / VPT;
    constexpr bool p8 = MODE != DQ_REDUCE && ZPP_QCU_DQ8_PIPELINE;
    constexpr bool p4 = MODE != DQ_REDUCE && ZPP_QCU_DQ4_PIPELINE;
    auto kern = a.q.bits == 8 ? k_dequant<D, VPT, U, MODE, p8> : k_dequant<D, VPT, U, MODE, p4>;
    const unsigned G = 32u >> a.log2T;
    unsigned grid;
    ZPP_CHECK(grid_for(kern, (a.total + G * U - 1) / (G * U), what, &grid));
    kern<<<grid, kThreads, 0, st>>>(a);
    return launch_status(what);
}

template <class D, int MODE>
zpp_status launch_dq(const DqArgs &a, int vpt, cudaStream_t st, const char *what) {
    if (a.total == 0) return ZPP_OK;
    switch (vpt) {
    case 1: return launch_dq_vpt<D, MODE, 1>(a, st, what);
    case 2: return launch_dq_vpt<D, MODE, 2>(a, st, what);
    case 4: return launch_dq_vpt<D, MODE, 4>(a, st, what);
    default: return launch_dq_vpt<D, MODE, 8>(a, st, what);
    }
}

template <class DI>
zpp_status convert_from(const void *in, void *out, zpp_dtype out_dtype, size_t n, float scale,
                        bool vec, cudaStream_t st, const char *what) {
    const typename DI::raw *i = static_cast<const typename DI::raw *>(in);
    const unsigned long long nvec = (n + 7) / 8;
    unsigned grid;
    switch (out_dtype) {
    case ZPP_BF16: {
        auto kern = k_convert<DI, BF16>;
        ZPP_CHECK(grid_for(kern, (nvec + 63) / 64, what, &grid));
        kern<<<grid, kThreads, 0, st>>>(i, static_cast<uint16_t *>(out), n, scale, vec);
        break;
    }
    case ZPP_FP16: {
        auto kern = k_convert<DI, FP16>;
        ZPP_CHECK(grid_for(kern, (nvec + 63) / 64, what, &grid));
        kern<<<grid, kThreads, 0, st>>>(i, static_cast<uint16_t *>(out), n, scale, vec);
        break;
    }
    default: {
        auto kern = k_convert<DI, F32>;
        ZPP_CHECK(grid_for(kern, (nvec + 63) / 64, what, &grid));
        kern<<<grid, kThreads, 0, st>>>(i, static_cast<float *>(out), n, scale, vec);
        break;
    }
    }
    return launch_status(what);
}

} /* namespace */

/* ==== public entry points (quant_cuda.h) =============================== */

extern "C" zpp_status zpp_cuda_quantize_chunks(const void *in, zpp_dtype dtype, size_t n_chunks,
                                               size_t chunk_len, const zpp_quant_spec *spec,
                                               void *out, int *nonfinite_dev, void *stream) {
    const QuantIn a = {in, dtype, n_chunks, chunk_len, 0, chunk_len, 0, 0};
    return quantize_dispatch(a, spec, out, nonfinite_dev, static_cast<cudaStream_t>(stream),
                             "cuda quantize");
}

extern "C" zpp_status zpp_cuda_reorder_quantize(const void *in, zpp_dtype dtype,
                                                size_t chunk_len, size_t first, size_t len,
                                                int nodes, int local,
                                                const zpp_quant_spec *spec, void *out,
                                                int *nonfinite_dev, void *stream) {
    const char *what = "cuda reorder-quantize";
    if (nodes < 1 || local < 1)
        return zpp_error(ZPP_ERR_INVALID, "%s: nodes %d and local %d must both be >= 1", what,
                         nodes, local);
    const QuantIn a = {in, dtype, (size_t)nodes * (size_t)local, chunk_len, first, len,
                       nodes, local};
    return quantize_dispatch(a, spec, out, nonfinite_dev, static_cast<cudaStream_t>(stream),
                             what);
}

extern "C" zpp_status zpp_cuda_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                                   size_t chunk_len, size_t first, size_t len,
                                                   const zpp_quant_spec *in_spec,
                                                   const zpp_quant_spec *out_spec, void *out,
                                                   int *nonfinite_dev, void *stream) {
    const char *what = "cuda dequant-sum-requant";
    ZPP_CHECK(zpp_quant_spec_check(in_spec));
    ZPP_CHECK(zpp_quant_spec_check(out_spec));
    if (k < 1) return zpp_error(ZPP_ERR_INVALID, "%s: k = %d inputs; need at least 1", what, k);
    if (first > chunk_len || len > chunk_len - first)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: slab [%zu, %zu) runs past a chunk of %zu elements", what, first,
                         first + len, chunk_len);
    if (n_chunks == 0 || len == 0) return ZPP_OK;
    ZPP_CHECK(check_qptr(in, what, "in"));
    ZPP_CHECK(check_qptr(out, what, "out"));
    QDst q;
    unsigned tile_len;
    ZPP_CHECK(make_qdst(out, n_chunks, len, out_spec, nonfinite_dev, what, &q, &tile_len));
    DeqSumSrc src;
    src.in = make_layout(in, len, in_spec);
    src.in_stride = src.in.qbytes * n_chunks;
    src.idx_stride = chunk_len;
    src.idx_first = first;
    src.k = k;
    src.same_block = in_spec->block == out_spec->block;
    return launch_quant(src, q, tile_len, out_spec->stochastic != 0,
                        static_cast<cudaStream_t>(stream), what);
}

extern "C" zpp_status zpp_cuda_dequantize_chunks(const void *q, size_t n_chunks,
                                                 size_t chunk_len, const zpp_quant_spec *spec,
                                                 zpp_dtype dtype, void *out, void *stream) {
    const char *what = "cuda dequantize";
    ZPP_CHECK(check_dtype(dtype, what));
    ZPP_CHECK(zpp_quant_spec_check(spec));
    if (n_chunks == 0 || chunk_len == 0) return ZPP_OK;
    ZPP_CHECK(check_qptr(q, what, "q"));
    if (!out) return zpp_error(ZPP_ERR_INVALID, "%s: out is NULL", what);
    const bool vec = aligned16(out) && ((unsigned long long)chunk_len * zpp_dtype_size(dtype)) %
                                               16 == 0;
    DqArgs a;
    int vpt;
    ZPP_CHECK(make_dq(q, n_chunks, n_chunks, chunk_len, spec, out, vec, 1.0f, what, &a, &vpt));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (dtype) {
    case ZPP_BF16: return launch_dq<BF16, DQ_STORE>(a, vpt, st, what);
    case ZPP_FP16: return launch_dq<FP16, DQ_STORE>(a, vpt, st, what);
    default: return launch_dq<F32, DQ_STORE>(a, vpt, st, what);
    }
}

extern "C" zpp_status zpp_cuda_dequantize_accumulate(const void *q, size_t n,
                                                     const zpp_quant_spec *spec, float *acc,
                                                     void *stream) {
    const char *what = "cuda dequantize-accumulate";
    ZPP_CHECK(zpp_quant_spec_check(spec));
    if (n == 0) return ZPP_OK;
    ZPP_CHECK(check_qptr(q, what, "q"));
    if (!acc) return zpp_error(ZPP_ERR_INVALID, "%s: acc is NULL", what);
    DqArgs a;
    int vpt;
    ZPP_CHECK(make_dq(q, 1, 1, n, spec, acc, aligned16(acc), 1.0f, what, &a, &vpt));
    return launch_dq<F32, DQ_ACC>(a, vpt, static_cast<cudaStream_t>(stream), what);
}

extern "C" zpp_status zpp_cuda_dequant_reduce(const void *q, size_t n_chunks, size_t stride,
                                              size_t chunk_len, const zpp_quant_spec *spec,
                                              const float *exact, float scale, float *out,
                                              void *stream) {
    const char *what = "cuda dequant-reduce";
    ZPP_CHECK(zpp_quant_spec_check(spec));
    if (chunk_len == 0) return ZPP_OK;
    if (!out) return zpp_error(ZPP_ERR_INVALID, "%s: out is NULL", what);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (n_chunks == 0 && !exact) { /* an empty sum */
        const cudaError_t e = cudaMemsetAsync(out, 0, chunk_len * sizeof(float), st);
        if (e != cudaSuccess)
            return zpp_error(ZPP_ERR_CUDA, "%s: clearing the output failed: %s", what,
                             cudaGetErrorString(e));
        return ZPP_OK;
    }
    if (n_chunks == 0) return convert_from<F32>(exact, out, ZPP_FP32, chunk_len, scale,
                                                aligned16(exact) && aligned16(out), st, what);
    ZPP_CHECK(check_qptr(q, what, "q"));
    const unsigned long long qb = zpp_quant_bytes(chunk_len, spec);
    if (stride == 0) stride = qb;
    if (n_chunks > 1 && (stride < qb || stride % 16))
        return zpp_error(ZPP_ERR_INVALID, "%s: inputs %zu bytes apart (each is %llu)", what,
                         stride, qb);
    DqArgs a;
    int vpt;
    ZPP_CHECK(make_dq(q, 1, n_chunks, chunk_len, spec, out,
                      aligned16(out) && (!exact || aligned16(exact)), scale, what, &a, &vpt));
    a.q.qbytes = stride;
    a.exact = exact;
    return launch_dq<F32, DQ_REDUCE>(a, vpt, st, what);
}

extern "C" zpp_status zpp_cuda_convert(const void *in, zpp_dtype in_dtype, void *out,
                                       zpp_dtype out_dtype, size_t n, float scale,
                                       void *stream) {
    const char *what = "cuda convert";
    ZPP_CHECK(check_dtype(in_dtype, what));
    ZPP_CHECK(check_dtype(out_dtype, what));
    if (n == 0) return ZPP_OK;
    if (!in || !out) return zpp_error(ZPP_ERR_INVALID, "%s: NULL buffer", what);
    if (in == out && in_dtype != out_dtype)
        return zpp_error(ZPP_ERR_INVALID, "%s: in place only when the dtypes are equal (%s -> "
                         "%s)", what, zpp_dtype_name(in_dtype), zpp_dtype_name(out_dtype));
    const bool vec = aligned16(in) && aligned16(out);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (in_dtype) {
    case ZPP_BF16: return convert_from<BF16>(in, out, out_dtype, n, scale, vec, st, what);
    case ZPP_FP16: return convert_from<FP16>(in, out, out_dtype, n, scale, vec, st, what);
    default: return convert_from<F32>(in, out, out_dtype, n, scale, vec, st, what);
    }
}

/* ==== error feedback (LoCo) for qgZ ======================================
 *
 * The twins of quant_ef.c: quantize x = v + err instead of v, then
 * err = beta * err + (1 - beta) * (x - dequantize(q)) (0 where not finite).
 * Fused: one pass forms x and finds the block's absmax, a second forms x
 * again (the same IEEE operations, so the same value), rounds it with the
 * plain kernels' qround and block_scale (so the bytes are those of the
 * plain kernel applied to x), stores the payload, dequantizes in registers
 * and writes the new error. Simple shape, not tuned: one CTA of kEfThreads
 * threads per quantization block, each thread an element pair (one int4
 * byte); the error buffer is read twice and written once per element. */
namespace {

constexpr int kEfThreads = 128;

/* Where tensor t of an error-feedback call reads its input: the reorder
 * (raw elements, destination rank r = node * local + dl for slot t =
 * dl * nodes + node) or the dequant-sum of k quantized inputs (chunk t). */
struct EfArgs {
    const void *in;           /* raw elements, or quantized inputs */
    int dtype;                /* reorder: zpp_dtype of the raw input; -1: dequant-sum */
    int k;                    /* dequant-sum inputs */
    unsigned long long qin;   /* bytes per quantized input slab */
    unsigned long long in_scales;
    unsigned in_block;
    int in_bits;
    bool in_e2m1;
    unsigned long long n_tensors, chunk_len, first, len;
    int nodes, local;
    float *err;
    float beta, omb;
    unsigned char *out;
    unsigned long long qout, out_scales, pay_bytes, nb;
    unsigned block;
    int bits;
    bool e2m1;
    float qmax, sdiv;
    bool stoch;
    unsigned long long seed;
    int *nonfinite;
};

__device__ __forceinline__ unsigned long long ef_origin(const EfArgs &a, unsigned long long t) {
    if (a.dtype < 0) return t * a.chunk_len + a.first;
    const unsigned long long dl = t / (unsigned long long)a.nodes,
                             node = t % (unsigned long long)a.nodes;
    return (node * (unsigned long long)a.local + dl) * a.chunk_len + a.first;
}

/* Element e of tensor t (origin `at`) before the correction. */
__device__ __forceinline__ float ef_value(const EfArgs &a, unsigned long long t,
                                          unsigned long long at, unsigned long long e) {
    if (a.dtype == ZPP_BF16)
        return to_f32(BF16(), static_cast<const uint16_t *>(a.in)[at + e]);
    if (a.dtype == ZPP_FP16)
        return to_f32(FP16(), static_cast<const uint16_t *>(a.in)[at + e]);
    if (a.dtype == ZPP_FP32) return static_cast<const float *>(a.in)[at + e];
    /* dequant-sum: the k inputs in order, from +0, product then sum */
    float sum = 0.0f;
    const unsigned long long b = e / a.in_block;
    for (int j = 0; j < a.k; j++) {
        const unsigned char *q = static_cast<const unsigned char *>(a.in) +
                                 ((unsigned long long)j * a.n_tensors + t) * a.qin;
        int v;
        if (a.in_bits == 8) {
            v = (int)(signed char)q[e];
        } else {
            const unsigned byte = q[e / 2];
            v = (int)((e & 1) ? (byte >> 4) : (byte & 0xfu));
            v = a.in_e2m1 ? e2m1_value((unsigned)v) : v >= 8 ? v - 16 : v;
        }
        const float s = *reinterpret_cast<const float *>(q + a.in_scales + 4ull * b);
        sum = __fadd_rn(sum, __fmul_rn((float)v, payload_unit(a.in_e2m1, s)));
    }
    return sum;
}

__device__ __forceinline__ int ef_round(float x, const BlockScale &s, float qmax, bool e2m1,
                                        bool stoch, unsigned long long seed,
                                        unsigned long long idx) {
    if (s.bad) return 0;
    if (s.tiny)
        return stoch ? qround_int<true, true>(x, s.inv, qmax, e2m1, seed, idx)
                     : qround_int<false, true>(x, s.inv, qmax, e2m1, seed, idx);
    return stoch ? qround_int<true, false>(x, s.inv, qmax, e2m1, seed, idx)
                 : qround_int<false, false>(x, s.inv, qmax, e2m1, seed, idx);
}

__device__ __forceinline__ void ef_store_err(const EfArgs &a, unsigned long long i, float x,
                                             float y) {
    const float d = __fadd_rn(x, -y);
    const float e = __fadd_rn(__fmul_rn(a.beta, a.err[i]), __fmul_rn(a.omb, d));
    a.err[i] = isfinite(e) ? e : 0.0f;
}

__global__ void __launch_bounds__(kEfThreads) k_ef_quantize(const EfArgs a) {
    __shared__ unsigned smax;
    const unsigned long long total = a.n_tensors * a.nb;
    for (unsigned long long g = blockIdx.x; g < total; g += gridDim.x) {
        const unsigned long long t = g / a.nb, b = g % a.nb;
        const unsigned long long at = ef_origin(a, t);
        const unsigned long long e0 = b * a.block;
        const unsigned long long bl = a.len - e0 < a.block ? a.len - e0 : a.block;
        /* pass 1: absmax of x = v + err on the bit patterns (NaN/Inf too) */
        unsigned m = 0;
        for (unsigned long long i = threadIdx.x; i < bl; i += blockDim.x) {
            const float x = __fadd_rn(ef_value(a, t, at, e0 + i), a.err[at + e0 + i]);
            m = max(m, __float_as_uint(x) & 0x7fffffffu);
        }
        if (threadIdx.x == 0) smax = 0;
        __syncthreads();
        atomicMax(&smax, m);
        __syncthreads();
        const BlockScale s = block_scale(smax, a.qmax, a.sdiv);
        const float unit = payload_unit(a.e2m1, s.scale);
        unsigned char *o = a.out + t * a.qout;
        /* pass 2: pairs of elements, one int4 byte (two int8 bytes) each */
        for (unsigned long long p = threadIdx.x; 2 * p < bl; p += blockDim.x) {
            const unsigned long long e = e0 + 2 * p;
            const bool two = 2 * p + 1 < bl;
            const float x0 = __fadd_rn(ef_value(a, t, at, e), a.err[at + e]);
            const float x1 = two ? __fadd_rn(ef_value(a, t, at, e + 1), a.err[at + e + 1]) : 0.0f;
            const int q0 = ef_round(x0, s, a.qmax, a.e2m1, a.stoch, a.seed, at + e);
            const int q1 = two ? ef_round(x1, s, a.qmax, a.e2m1, a.stoch, a.seed, at + e + 1) : 0;
            if (a.bits == 8) {
                o[e] = (unsigned char)(q0 & 0xff);
                if (two) o[e + 1] = (unsigned char)(q1 & 0xff);
            } else if (a.e2m1) {
                o[e / 2] = (unsigned char)(e2m1_code(q0) | (e2m1_code(q1) << 4));
            } else {
                o[e / 2] = (unsigned char)((q0 & 0xf) | ((q1 & 0xf) << 4));
            }
            ef_store_err(a, at + e, x0, __fmul_rn((float)q0, unit));
            if (two) ef_store_err(a, at + e + 1, x1, __fmul_rn((float)q1, unit));
        }
        if (threadIdx.x == 0) {
            *reinterpret_cast<float *>(o + a.out_scales + 4ull * b) = s.scale;
            if (s.bad && a.nonfinite) *a.nonfinite = 1;
        }
        if (b == 0) { /* every byte is written: the two paddings of tensor t */
            for (unsigned long long i = a.pay_bytes + threadIdx.x; i < a.out_scales;
                 i += blockDim.x)
                o[i] = 0;
            for (unsigned long long i = a.out_scales + 4ull * a.nb + threadIdx.x; i < a.qout;
                 i += blockDim.x)
                o[i] = 0;
        }
        __syncthreads(); /* smax is reset by the next block */
    }
}

zpp_status ef_launch(EfArgs &a, const zpp_quant_spec *spec, const char *what, void *stream) {
    a.qout = zpp_quant_bytes(a.len, spec);
    a.out_scales = zpp_quant_scales_offset(a.len, spec->bits);
    a.pay_bytes = zpp_quant_payload_bytes(a.len, spec->bits);
    a.nb = zpp_quant_num_blocks(a.len, spec->block);
    a.block = (unsigned)spec->block;
    a.bits = spec->bits;
    a.e2m1 = spec->format == ZPP_QUANT_E2M1;
    a.qmax = zpp_ql_qmax(spec);
    a.sdiv = zpp_ql_scale_div(spec);
    a.stoch = spec->stochastic != 0;
    a.seed = spec->seed;
    a.omb = 1.0f - a.beta;
    const unsigned long long total = a.n_tensors * a.nb;
    if (total == 0) return ZPP_OK;
    const unsigned grid = total < (1ull << 20) ? (unsigned)total : (1u << 20);
    k_ef_quantize<<<grid, kEfThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_status(what);
}

} /* namespace */

extern "C" zpp_status zpp_cuda_ef_reorder_quantize(const void *in, zpp_dtype dtype, float *err,
                                                   float beta, size_t chunk_len, size_t first,
                                                   size_t len, int nodes, int local,
                                                   const zpp_quant_spec *spec, void *out,
                                                   int *nonfinite_dev, void *stream) {
    const char *what = "cuda error-feedback reorder-quantize";
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_dtype(dtype, what));
    if (len == 0 || nodes < 1 || local < 1) return ZPP_OK;
    ZPP_CHECK(check_qptr(out, what, "out"));
    if (!in || !err) return zpp_error(ZPP_ERR_INVALID, "%s: NULL input or error buffer", what);
    EfArgs a = {};
    a.in = in;
    a.dtype = (int)dtype;
    a.n_tensors = (unsigned long long)nodes * (unsigned long long)local;
    a.chunk_len = chunk_len;
    a.first = first;
    a.len = len;
    a.nodes = nodes;
    a.local = local;
    a.err = err;
    a.beta = beta;
    a.out = static_cast<unsigned char *>(out);
    a.nonfinite = nonfinite_dev;
    return ef_launch(a, spec, what, stream);
}

extern "C" zpp_status zpp_cuda_ef_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                                      size_t chunk_len, size_t first,
                                                      size_t len, const zpp_quant_spec *in_spec,
                                                      const zpp_quant_spec *out_spec,
                                                      float *err, float beta, void *out,
                                                      int *nonfinite_dev, void *stream) {
    const char *what = "cuda error-feedback dequant-sum-requant";
    ZPP_CHECK(zpp_quant_spec_check(in_spec));
    ZPP_CHECK(zpp_quant_spec_check(out_spec));
    if (len == 0 || n_chunks == 0 || k < 1) return ZPP_OK;
    ZPP_CHECK(check_qptr(in, what, "in"));
    ZPP_CHECK(check_qptr(out, what, "out"));
    if (!err) return zpp_error(ZPP_ERR_INVALID, "%s: the error buffer is NULL", what);
    EfArgs a = {};
    a.in = in;
    a.dtype = -1;
    a.k = k;
    a.qin = zpp_quant_bytes(len, in_spec);
    a.in_scales = zpp_quant_scales_offset(len, in_spec->bits);
    a.in_block = (unsigned)in_spec->block;
    a.in_bits = in_spec->bits;
    a.in_e2m1 = in_spec->format == ZPP_QUANT_E2M1;
    a.n_tensors = n_chunks;
    a.chunk_len = chunk_len;
    a.first = first;
    a.len = len;
    a.nodes = 1;
    a.local = 1;
    a.err = err;
    a.beta = beta;
    a.out = static_cast<unsigned char *>(out);
    a.nonfinite = nonfinite_dev;
    return ef_launch(a, out_spec, what, stream);
}

/* test_quant.c — block quantization (CPU reference): against a naive scalar
 * reference written from the header's formulas, error bounds derived from
 * fp32 rounding, exact round trips, unbiased stochastic rounding, the fused
 * qgZ operations against their unfused definitions, non-finite handling,
 * the wire layout, the host device's quantization (device.h), and the same
 * bytes from every CPU instruction set's copy of the loops (core/cpu.h).
 *
 * Error bound of round-to-nearest (every element, derived once here).
 * Let a = block absmax, Q = qmax, e = 2^-24 (fp32 unit roundoff), and each
 * fp32 operation exact up to a factor (1 + d), |d| <= e:
 *   inv = (Q/a)(1+d1), v = x*inv*(1+d2)   =>  |v - xQ/a| <= Q(2e + e^2)
 *   (|xQ/a| <= Q). Clamping to [-Q, Q] only moves v toward xQ/a, and
 *   rounding adds at most 1/2:  |q - xQ/a| <= 1/2 + Q(2e + e^2).
 *   s = (a/Q)(1+d3), y32 = q*s*(1+d4) = q(a/Q)(1+z), |z| <= 2e + e^2:
 *   |y32 - x| <= (a/Q)|q - xQ/a| + |q|(a/Q)|z|
 *            <= a/(2Q) + 2a(2e + e^2)              ("half a step + a*2^-22")
 *   plus (Q+2) * 2^-149 should s or y32 be subnormal (absolute errors).
 * Stochastic: w = v + u is one more rounding (|w| <= Q + 1 <= 128, half an
 * ulp <= 2^-17) and floor moves by < 1:  |q - xQ/a| < 1 + 2^-17 + Q(2e+e^2),
 * so "half a step" becomes "one step".
 * Output dtype: rounding y32 to bf16 / fp16 adds |y32| * u_d with
 * u_d = 2^-8 (bf16, 8 significant bits) or 2^-11 (fp16, 11 bits), and
 * |y32| <= a(1 + 2^-20); plus half the smallest subnormal (2^-25 for fp16).
 * For bf16 this extra term is as large as the half step itself: bf16 carries
 * 8 bits, int8 with a per-block scale about 8 too.
 * A block whose Q/a overflows fp32 (a < Q/FLT_MAX, "tiny") stores
 * q = sign(x) Q: error <= a there (docs/quantization.md). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "quant/quant_cpu.h"
#include "quant/quant_rng.h"
#include "testlib.h"

static const zpp_dtype all_dtypes[] = {ZPP_FP32, ZPP_BF16, ZPP_FP16};

/* The host device, made once: the quantization family through device.h. */
static zpp_device *host_device(void) {
    static zpp_device *d;
    if (!d) EXPECT_OK(zpp_device_create_host(&d));
    return d;
}
/* The payload kinds: int8, int4 and 4-bit E2M1 (KIND_E2M1 in all_bits). */
#define KIND_E2M1 (-4)
#define N_KINDS 3
static const int all_bits[N_KINDS] = {8, 4, KIND_E2M1};

static zpp_quant_spec spec_make(int kind, size_t block, int stochastic, uint64_t seed) {
    zpp_quant_spec s = zpp_quant_spec_default(kind == KIND_E2M1 ? 4 : kind);
    if (kind == KIND_E2M1) s.format = ZPP_QUANT_E2M1;
    if (block) s.block = block;
    s.stochastic = stochastic;
    s.seed = seed;
    return s;
}

static float qmax_of(int bits) { return bits == 8 ? 127.0f : 7.0f; }

static const char *kind_name(const zpp_quant_spec *sp) {
    return sp->format == ZPP_QUANT_E2M1 ? "e2m1" : sp->bits == 8 ? "int8" : "int4";
}

/* E2M1 in half units: the grid of |q| (0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2);
 * a magnitude's code is its index, bit 3 the sign. */
static const int e2m1_grid[8] = {0, 1, 2, 3, 4, 6, 8, 12};

static int e2m1_index(int a) {
    for (int c = 0; c < 8; c++)
        if (e2m1_grid[c] == a) return c;
    return -1;
}

/* The signed half-unit value of element i of a 4-bit payload. */
static int e2m1_at(const uint8_t *q, size_t i) {
    int nib = (q[i / 2] >> (i % 2 ? 4 : 0)) & 15;
    return nib & 8 ? -e2m1_grid[nib & 7] : e2m1_grid[nib & 7];
}

/* The reference's E2M1 rounding of v = x * (12 / absmax), by search: the
 * nearest grid point, ties to the even index (the even mantissa);
 * stochastic: the gap [lo, hi) holding |v| is cut in steps k = hi - lo and
 * |v| / k + u floored, as the header states it (the top: at most 12). */
static int e2m1_ref_round(float v, int stochastic, float u) {
    double a = fabs((double)v);
    if (stochastic) {
        int c = 0;
        while (c < 7 && e2m1_grid[c + 1] <= a) c++;
        float k = c < 7 ? (float)(e2m1_grid[c + 1] - e2m1_grid[c]) : 4.0f;
        float w = fabsf(v) / k + u;
        float m = floorf(w) * k;
        int q = (int)(m < 12.0f ? m : 12.0f);
        return v < 0 ? -q : q;
    }
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs(a - e2m1_grid[c]), db = fabs(a - e2m1_grid[best]);
        if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return v < 0 ? -e2m1_grid[best] : e2m1_grid[best];
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- inputs ---- */

enum { D_NORMAL, D_UNIFORM, D_CAUCHY, D_ZERO_BLOCK, D_CONST_BLOCK, D_OUTLIER, D_COUNT };
static const char *dist_name[] = {"normal",      "uniform",        "cauchy",
                                  "zero-block",  "constant-block", "outlier"};

/* Fills x (dtype) with n values of distribution `dist` and xf with the same
 * values as fp32 (exactly what the quantizer sees). fp16 saturates at 65504,
 * so its heavy tail and outlier stay below that. */
static void fill(zpp_rng *r, int dist, zpp_dtype dt, size_t n, size_t block, void *x,
                 float *xf) {
    double big = dt == ZPP_FP16 ? 6.0e4 : 1.0e30;
    for (size_t i = 0; i < n; i++) {
        double v;
        switch (dist) {
        case D_UNIFORM: v = 2.0 * zpp_rng_uniform(r) - 1.0; break;
        case D_CAUCHY:
            v = tan(3.141592653589793 * (zpp_rng_uniform(r) - 0.5));
            if (v > big) v = big;
            if (v < -big) v = -big;
            break;
        default: v = zpp_rng_normal(r); break;
        }
        xf[i] = (float)v;
    }
    size_t b = n > block ? 1 : 0; /* the block to edit: the second if there is one */
    size_t lo = b * block, hi = lo + block < n ? lo + block : n;
    if (dist == D_ZERO_BLOCK)
        for (size_t i = lo; i < hi; i++) xf[i] = 0.0f;
    if (dist == D_CONST_BLOCK) {
        float c = (float)zpp_rng_normal(r);
        for (size_t i = lo; i < hi; i++) xf[i] = c;
    }
    if (dist == D_OUTLIER && n > 0)
        xf[zpp_rng_u64(r) % n] = (float)((zpp_rng_u64(r) & 1) ? big : -big);
    for (size_t i = 0; i < n; i++) {
        zpp_store_f32(x, dt, i, xf[i]);
        xf[i] = zpp_load_f32(x, dt, i);
    }
}

/* ---- the reference: the header's formulas, one element at a time ---- */

static void ref_quantize(const float *xf, size_t n, const zpp_quant_spec *sp, uint64_t idx0,
                         uint8_t *out) {
    size_t bytes = zpp_quant_bytes(n, sp);
    memset(out, 0, bytes);
    const int e2m1 = sp->format == ZPP_QUANT_E2M1;
    const float Q = e2m1 ? 12.0f : qmax_of(sp->bits);
    size_t nb = (n + sp->block - 1) / sp->block;
    size_t soff = (sp->bits == 8 ? n : (n + 1) / 2);
    soff = (soff + 15) / 16 * 16;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * sp->block, hi = lo + sp->block < n ? lo + sp->block : n;
        float a = 0.0f;
        int finite = 1;
        for (size_t i = lo; i < hi; i++) {
            if (!isfinite(xf[i])) finite = 0;
            else if (fabsf(xf[i]) > a) a = fabsf(xf[i]);
        }
        float scale = 0.0f, inv = 0.0f;
        int zero = 1;
        if (!finite) {
            uint32_t nan = 0x7fc00000u;
            memcpy(&scale, &nan, 4);
        } else if (a > 0.0f) {
            inv = Q / a; /* +Inf for a < Q / FLT_MAX: handled below */
            scale = e2m1 ? a / 6.0f : a / Q;
            zero = 0;
        }
        memcpy(out + soff + 4 * b, &scale, 4);
        for (size_t i = lo; i < hi; i++) {
            int q = 0;
            if (!zero && e2m1 && isfinite(inv)) {
                float v = xf[i] * inv;
                q = e2m1_ref_round(v, sp->stochastic,
                                   sp->stochastic ? zpp_quant_uniform(sp->seed, idx0 + i) : 0.0f);
            } else if (!zero) {
                float v = xf[i] * inv, t;
                if (sp->stochastic) {
                    float u = zpp_quant_uniform(sp->seed, idx0 + i);
                    float w = v + u;
                    t = floorf(w);
                } else {
                    t = rintf(v);
                }
                if (isnan(t)) t = 0.0f; /* 0 * Inf with a tiny absmax */
                if (t > Q) t = Q;
                if (t < -Q) t = -Q;
                q = (int)t;
            }
            if (sp->bits == 8) out[i] = (uint8_t)(int8_t)q;
            else if (e2m1)
                out[i / 2] |= (uint8_t)((e2m1_index(abs(q)) | (q < 0 ? 8 : 0)) << (i % 2 ? 4 : 0));
            else out[i / 2] |= (uint8_t)((q & 15) << (i % 2 ? 4 : 0));
        }
    }
}

/* The block absmax of element i, as the bound needs it. */
static void block_absmax(const float *xf, size_t n, size_t block, float *amax) {
    for (size_t b = 0; b * block < n; b++) {
        float a = 0.0f;
        for (size_t i = b * block; i < n && i < (b + 1) * block; i++)
            if (fabsf(xf[i]) > a) a = fabsf(xf[i]);
        amax[b] = a;
    }
}

/* The bound of the header comment for one element; u_d, abs_d: dtype terms. */
static double elem_bound(double a, const zpp_quant_spec *sp, zpp_dtype out) {
    const int stochastic = sp->stochastic;
    const double e = 0x1p-24, Q = sp->format == ZPP_QUANT_E2M1 ? 12.0 : qmax_of(sp->bits);
    /* the widest gap in units of absmax: 1 / Q, E2M1's 4 half units 4 / 12 */
    const double gap = sp->format == ZPP_QUANT_E2M1 ? 4.0 / 12.0 : 1.0 / Q;
    double b = (stochastic ? (1.0 + 0x1p-17) : 0.5) * a * gap + 2.0 * a * (2 * e + e * e) +
               (Q + 2) * 0x1p-149;
    /* qmax / absmax overflowed: q = sign(x) qmax, y = sign(x) * about a */
    if (!((float)Q / (float)a <= FLT_MAX)) b = a + (Q + 2) * 0x1p-149;
    if (out == ZPP_BF16) b += a * (1.0 + 0x1p-20) * 0x1p-8 + 0x1p-134;
    if (out == ZPP_FP16) b += a * (1.0 + 0x1p-20) * 0x1p-11 + 0x1p-25;
    return b;
}

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return n;
}

/* ---- the main sweep ---- */

/* One (x, spec) case: quantize == reference byte for byte (every byte,
 * padding included, written: the output starts poisoned); dequantize to
 * each dtype within the bound; dtype outputs are the fp32 output rounded by
 * core/dtype.h. */
static void check_case(const void *x, const float *xf, zpp_dtype dt, size_t n,
                       const zpp_quant_spec *sp, const char *what) {
    size_t bytes = zpp_quant_bytes(n, sp);
    uint8_t *q = zpp_test_malloc(bytes), *r = zpp_test_malloc(bytes);
    memset(q, 0xab, bytes);
    EXPECT_OK(zpp_quantize(x, dt, n, sp, q));
    ref_quantize(xf, n, sp, 0, r);
    size_t d = first_diff(q, r, bytes);
    EXPECT(d == bytes, "%s: byte %zu of %zu differs from the reference: %02x vs %02x", what, d,
           bytes, d < bytes ? q[d] : 0, d < bytes ? r[d] : 0);

    float *amax = zpp_test_malloc(((n + sp->block - 1) / sp->block + 1) * sizeof *amax);
    block_absmax(xf, n, sp->block, amax);
    float *y32 = zpp_test_malloc(n * sizeof *y32);
    uint16_t *y16 = zpp_test_malloc(n * 2);
    EXPECT_OK(zpp_dequantize(q, n, sp, ZPP_FP32, y32));
    for (size_t i = 0; i < n; i++) {
        double bound = elem_bound(amax[i / sp->block], sp, ZPP_FP32);
        double err = fabs((double)y32[i] - xf[i]);
        EXPECT(err <= bound, "%s: element %zu x=%a y=%a err %g > bound %g", what, i, xf[i],
               y32[i], err, bound);
        /* E2M1 to nearest: half its local gap, max(absmax / 24, |x| / 5) (the
         * gap [4, 6] half units has its midpoint 5 at error 1), finer than
         * int4's absmax / 14 below absmax / 2.8 */
        double a = amax[i / sp->block];
        if (sp->format == ZPP_QUANT_E2M1 && !sp->stochastic &&
            12.0f / (float)a <= FLT_MAX) {
            double rel = fmax(a / 24, fabs((double)xf[i]) / 5) * (1 + 0x1p-20) + 14 * 0x1p-149;
            EXPECT(err <= rel, "%s: element %zu x=%a y=%a err %g > E2M1's %g", what, i, xf[i],
                   y32[i], err, rel);
        }
    }
    for (int k = 1; k < 3; k++) {
        zpp_dtype od = all_dtypes[k];
        EXPECT_OK(zpp_dequantize(q, n, sp, od, y16));
        for (size_t i = 0; i < n; i++) {
            uint16_t want = od == ZPP_BF16 ? zpp_f32_to_bf16(y32[i]) : zpp_f32_to_fp16(y32[i]);
            EXPECT(y16[i] == want, "%s: %s output %zu is %04x, rounding the fp32 output gives "
                                   "%04x", what, zpp_dtype_name(od), i, y16[i], want);
            /* fp16 cannot hold values past 65504: bound only inputs it holds */
            if (od == ZPP_FP16 && amax[i / sp->block] > 65504.0f) continue;
            double bound = elem_bound(amax[i / sp->block], sp, od);
            double err = fabs((double)zpp_load_f32(y16, od, i) - xf[i]);
            EXPECT(err <= bound, "%s: %s element %zu x=%a err %g > bound %g", what,
                   zpp_dtype_name(od), i, xf[i], err, bound);
        }
    }
    free(y16);
    free(y32);
    free(amax);
    free(r);
    free(q);
}

static void test_quantize_matches_reference(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(1));
    char what[160];
    for (size_t bi = 0; bi < N_KINDS; bi++) {
        int bits = all_bits[bi];
        size_t B = spec_make(bits, 0, 0, 0).block;
        const size_t sizes[] = {1, 7, B - 1, B, B + 1, 1005, ((size_t)1 << 20) + 3};
        for (size_t di = 0; di < 3; di++) {
            zpp_dtype dt = all_dtypes[di];
            for (int dist = 0; dist < D_COUNT; dist++) {
                for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                    size_t n = sizes[si];
                    void *x = zpp_test_malloc(n * 4);
                    float *xf = zpp_test_malloc(n * sizeof *xf);
                    fill(&rng, dist, dt, n, B, x, xf);
                    for (int sr = 0; sr < 2; sr++) {
                        /* the stochastic sweep skips the big size except on N(0,1) */
                        if (sr && n > 100000 && dist != D_NORMAL) continue;
                        zpp_quant_spec sp = spec_make(bits, 0, sr, zpp_rng_u64(&rng));
                        snprintf(what, sizeof what, "%s %s %s n=%zu %s", kind_name(&sp),
                                 zpp_dtype_name(dt), dist_name[dist], n, sr ? "SR" : "RNE");
                        check_case(x, xf, dt, n, &sp, what);
                    }
                    free(xf);
                    free(x);
                }
            }
        }
    }
}

/* Other block sizes, including blocks longer than the implementation's
 * inner tile and the largest allowed block. */
static void test_block_sizes(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(2));
    const size_t blocks[] = {8, 16, 24, 32, 64, 520, 1024, 4096, (size_t)1 << 20};
    char what[160];
    for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
        size_t B = blocks[k];
        size_t n = B < 4096 ? 3 * B + 5 : B + 13;
        for (int ki = 0; ki < N_KINDS; ki++) {
            int bits = all_bits[ki];
            zpp_dtype dt = all_dtypes[zpp_rng_u64(&rng) % 3];
            void *x = zpp_test_malloc(n * 4);
            float *xf = zpp_test_malloc(n * sizeof *xf);
            fill(&rng, D_NORMAL, dt, n, B, x, xf);
            for (int sr = 0; sr < 2; sr++) {
                zpp_quant_spec sp = spec_make(bits, B, sr, zpp_rng_u64(&rng));
                snprintf(what, sizeof what, "%s block %zu %s n=%zu %s", kind_name(&sp), B,
                         zpp_dtype_name(dt), n, sr ? "SR" : "RNE");
                check_case(x, xf, dt, n, &sp, what);
            }
            free(xf);
            free(x);
        }
    }
}

/* x = q * 2^e with one |q| = qmax per block: absmax / qmax = 2^e exactly,
 * qmax / absmax = 2^-e exactly, x * inv = q exactly, so the payload is q,
 * the scale 2^e, and dequantizing gives x back bit for bit in its dtype. */
static void test_representable_roundtrip(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(3));
    for (size_t di = 0; di < 3; di++) {
        for (size_t bi = 0; bi < N_KINDS; bi++) {
            zpp_dtype dt = all_dtypes[di];
            /* E2M1: q a grid point in half units, absmax 6 * 2^e, x = q 2^(e-1) */
            const int e2m1 = all_bits[bi] == KIND_E2M1;
            int bits = all_bits[bi], Q = e2m1 ? 12 : (int)qmax_of(bits);
            size_t block = (size_t)8 << (zpp_rng_u64(&rng) % 6);
            size_t n = 5 * block + 3 + (size_t)(zpp_rng_u64(&rng) % 2);
            size_t nb = zpp_quant_num_blocks(n, block);
            int *qv = zpp_test_malloc(n * sizeof *qv);
            int *ev = zpp_test_malloc(nb * sizeof *ev);
            void *x = zpp_test_malloc(n * 4), *y = zpp_test_malloc(n * 4);
            for (size_t b = 0; b < nb; b++) {
                ev[b] = (int)(zpp_rng_u64(&rng) % 23) - 14; /* 2^-14 .. 2^8: fp16-exact */
                size_t lo = b * block, hi = lo + block < n ? lo + block : n;
                for (size_t i = lo; i < hi; i++) {
                    qv[i] = (int)(zpp_rng_u64(&rng) % (uint64_t)(2 * Q + 1)) - Q;
                    if (e2m1) qv[i] = (qv[i] < 0 ? -1 : 1) * e2m1_grid[abs(qv[i]) % 8];
                }
                qv[lo + zpp_rng_u64(&rng) % (hi - lo)] = (zpp_rng_u64(&rng) & 1) ? Q : -Q;
                for (size_t i = lo; i < hi; i++)
                    zpp_store_f32(x, dt, i, ldexpf((float)qv[i], ev[b] - e2m1));
            }
            zpp_quant_spec sp = spec_make(bits, block, 0, 0);
            uint8_t *q = zpp_test_malloc(zpp_quant_bytes(n, &sp));
            EXPECT_OK(zpp_quantize(x, dt, n, &sp, q));
            size_t so = zpp_quant_scales_offset(n, sp.bits);
            for (size_t b = 0; b < nb; b++) {
                float s;
                memcpy(&s, q + so + 4 * b, 4);
                EXPECT(s == ldexpf(1.0f, ev[b]), "block %zu scale %a, want 2^%d", b, s, ev[b]);
            }
            for (size_t i = 0; i < n; i++) {
                int got = e2m1        ? e2m1_at(q, i)
                          : bits == 8 ? (int)(int8_t)q[i]
                                      : (int)(((q[i / 2] >> (i % 2 ? 4 : 0)) & 15) ^ 8) - 8;
                EXPECT(got == qv[i], "%s %s element %zu: payload %d, want %d",
                       zpp_dtype_name(dt), kind_name(&sp), i, got, qv[i]);
            }
            EXPECT_OK(zpp_dequantize(q, n, &sp, dt, y));
            EXPECT(memcmp(x, y, n * zpp_dtype_size(dt)) == 0, "%s %s: round trip not exact",
                   zpp_dtype_name(dt), kind_name(&sp));
            free(q);
            free(y);
            free(x);
            free(ev);
            free(qv);
        }
    }
}

/* E[q] = x*inv for stochastic rounding. q takes two neighbouring values,
 * so Var[q * s] <= s^2 / 4 and the mean of M independent draws has standard
 * deviation <= s / (2 sqrt(M)). Each element's mean must be within 6 of
 * those sigmas plus the deterministic bias of fp32 (v = x*inv carries
 * Q(2e + e^2) in q units, w = v + u rounds by <= 2^-17, u is discrete in
 * steps of 2^-24, and y = q*s adds 2e + e^2 relative). Round-to-nearest
 * would miss by up to s/2, far outside 6 sigma = 0.095 s. */
static void test_stochastic_unbiased(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(4));
    const int M = 1000;
    const size_t n = 2000;
    for (size_t bi = 0; bi < N_KINDS; bi++) {
        int bits = all_bits[bi];
        /* E2M1: Q half units to absmax, gaps up to 4 of them (the step s) */
        const double e = 0x1p-24, Q = bits == KIND_E2M1 ? 12.0 : qmax_of(bits);
        const double gap = bits == KIND_E2M1 ? 4.0 : 1.0;
        zpp_dtype dt = bi == 1 ? ZPP_BF16 : ZPP_FP32;
        void *x = zpp_test_malloc(n * 4);
        float *xf = zpp_test_malloc(n * sizeof *xf), *y = zpp_test_malloc(n * sizeof *y);
        double *mean = calloc(n, sizeof *mean);
        fill(&rng, D_NORMAL, dt, n, 256, x, xf);
        zpp_quant_spec sp = spec_make(bits, 0, 1, 0);
        uint8_t *q = zpp_test_malloc(zpp_quant_bytes(n, &sp));
        uint64_t seed0 = zpp_rng_u64(&rng);
        for (int m = 0; m < M; m++) {
            sp.seed = seed0 + (uint64_t)m * 0x9e3779b97f4a7c15ull;
            EXPECT_OK(zpp_quantize(x, dt, n, &sp, q));
            EXPECT_OK(zpp_dequantize(q, n, &sp, ZPP_FP32, y));
            for (size_t i = 0; i < n; i++) mean[i] += y[i];
        }
        float *amax = zpp_test_malloc(n * sizeof *amax);
        block_absmax(xf, n, sp.block, amax);
        double zsum = 0;
        for (size_t i = 0; i < n; i++) {
            double a = amax[i / sp.block], s = gap * a / Q;
            double sigma = s / (2.0 * sqrt((double)M));
            double bias = s * (Q * (2 * e + e * e) + 0x1p-17 + 0x1p-24) + a * (2 * e + e * e);
            double dev = mean[i] / M - xf[i];
            EXPECT(fabs(dev) <= 6 * sigma + bias, "%s element %zu: mean %.9g vs x %.9g (%.2f "
                   "sigma)", kind_name(&sp), i, mean[i] / M, xf[i], dev / sigma);
            zsum += dev / s;
        }
        /* and no systematic drift across all elements: sd <= 1/(2 sqrt(M n)) */
        double zsd = 1.0 / (2.0 * sqrt((double)M * (double)n));
        EXPECT(fabs(zsum / n) <= 6 * zsd + Q * 4.1 * e + 0x1p-16, "%s: mean deviation %g "
               "steps", kind_name(&sp), zsum / n);
        free(amax);
        free(q);
        free(mean);
        free(y);
        free(xf);
        free(x);
    }
}

/* ---- qgZ: reorder + quantize, dequant-sum-requant ---- */

static void test_reorder_quantize_equals_unfused(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(5));
    zpp_device *host = host_device();
    for (int iter = 0; iter < 24; iter++) {
        int nodes = 1 + (int)(zpp_rng_u64(&rng) % 3), local = 1 + (int)(zpp_rng_u64(&rng) % 4);
        size_t chunk_len = (size_t)(zpp_rng_u64(&rng) % 700) + (iter == 0 ? 0 : 1);
        zpp_dtype dt = all_dtypes[iter % 3];
        int bits = all_bits[(iter / 3) % N_KINDS], sr = (iter / 9) % 2;
        zpp_quant_spec sp = spec_make(bits, (size_t)8 << (zpp_rng_u64(&rng) % 6), sr,
                                      zpp_rng_u64(&rng));
        size_t R = (size_t)nodes * (size_t)local, n = R * chunk_len;
        size_t es = zpp_dtype_size(dt), qb = zpp_quant_bytes(chunk_len, &sp);
        void *x = zpp_test_malloc(n * 4);
        float *xf = zpp_test_malloc(n * sizeof *xf);
        fill(&rng, (int)(zpp_rng_u64(&rng) % D_COUNT), dt, n, sp.block, x, xf);
        uint8_t *fused = zpp_test_malloc(R * qb), *chunks = zpp_test_malloc(R * qb), *unfused = zpp_test_malloc(R * qb);
        memset(fused, 0xcd, R * qb);
        EXPECT_OK(zpp_quant_reorder_quantize(x, dt, chunk_len, nodes, local, &sp, fused));
        /* unfused: quantize chunk by chunk (stream index = index in x), then
         * move chunk (node, dest_local) to slot dest_local * nodes + node */
        EXPECT_OK(zpp_device_quantize_chunks(host, x, dt, R, chunk_len, &sp, chunks));
        for (int node = 0; node < nodes; node++)
            for (int dl = 0; dl < local; dl++)
                memcpy(unfused + ((size_t)dl * nodes + node) * qb,
                       chunks + ((size_t)node * local + dl) * qb, qb);
        EXPECT(memcmp(fused, unfused, R * qb) == 0, "nodes %d local %d chunk %zu int%d %s %s",
               nodes, local, chunk_len, bits, zpp_dtype_name(dt), sr ? "SR" : "RNE");
        /* and each chunk is what quantizing it on its own gives (RNE; for SR
         * the reference with the chunk's stream offset) */
        uint8_t *one = zpp_test_malloc(qb);
        for (size_t r = 0; r < R; r++) {
            if (sr) {
                ref_quantize(xf + r * chunk_len, chunk_len, &sp, r * chunk_len, one);
            } else {
                EXPECT_OK(zpp_quantize((const char *)x + r * chunk_len * es, dt, chunk_len, &sp,
                                       one));
            }
            EXPECT(memcmp(one, chunks + r * qb, qb) == 0, "chunk %zu differs", r);
        }
        /* a slab [first, first + len) of every chunk: each is the reference
         * quantization of those elements, at their place in the stream */
        size_t first = zpp_rng_u64(&rng) % (chunk_len + 1);
        size_t len = zpp_rng_u64(&rng) % (chunk_len - first + 1);
        size_t qs = zpp_quant_bytes(len, &sp);
        uint8_t *slabs = zpp_test_malloc(R * qs + 1), *want = zpp_test_malloc(qs + 1);
        EXPECT_OK(zpp_device_reorder_quantize(host, x, dt, chunk_len, first, len, nodes, local, &sp,
                                          slabs));
        for (int dl = 0; dl < local; dl++)
            for (int node = 0; node < nodes; node++) {
                size_t r = (size_t)node * local + dl, at = r * chunk_len + first;
                ref_quantize(xf + at, len, &sp, at, want);
                EXPECT(memcmp(want, slabs + ((size_t)dl * nodes + node) * qs, qs) == 0,
                       "slab [%zu, +%zu) of chunk %zu (of %zu) differs", first, len, r,
                       chunk_len);
            }
        EXPECT_STATUS(zpp_device_reorder_quantize(host, x, dt, chunk_len, first + 1, chunk_len,
                                              nodes, local, &sp, slabs),
                      ZPP_ERR_INVALID);
        free(want);
        free(slabs);
        free(one);
        free(unfused);
        free(chunks);
        free(fused);
        free(xf);
        free(x);
    }
}

/* dsr == quantize_chunks(sum_j dequantize(input j)), the sum in fp32 in
 * input order, byte for byte, also when in and out blocks differ. */
static void test_dequant_sum_requant_equals_unfused(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(6));
    zpp_device *host = host_device();
    for (int iter = 0; iter < 24; iter++) {
        int k = 1 + (int)(zpp_rng_u64(&rng) % 5);
        size_t n_chunks = 1 + zpp_rng_u64(&rng) % 3;
        size_t chunk_len = 1 + zpp_rng_u64(&rng) % (iter < 20 ? 900 : 5000);
        zpp_quant_spec in_sp = spec_make(all_bits[iter % N_KINDS],
                                         (size_t)8 << (zpp_rng_u64(&rng) % 7),
                                         (int)(zpp_rng_u64(&rng) & 1), zpp_rng_u64(&rng));
        zpp_quant_spec out_sp = spec_make(all_bits[(iter / 3) % N_KINDS],
                                          (size_t)8 << (zpp_rng_u64(&rng) % 10),
                                          (iter / 4) % 2, zpp_rng_u64(&rng));
        size_t n = n_chunks * chunk_len;
        size_t qin = zpp_quant_bytes(chunk_len, &in_sp), qout = zpp_quant_bytes(chunk_len, &out_sp);
        uint8_t *ins = zpp_test_malloc((size_t)k * n_chunks * qin);
        const void *ptrs[5];
        float *x = zpp_test_malloc(n * sizeof *x), *sum = zpp_test_malloc(n * sizeof *sum),
              *d = zpp_test_malloc(n * sizeof *d);
        for (size_t i = 0; i < n; i++) sum[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            fill(&rng, (int)(zpp_rng_u64(&rng) % D_COUNT), ZPP_FP32, n, in_sp.block, x, d);
            uint8_t *in_j = ins + (size_t)j * n_chunks * qin;
            EXPECT_OK(zpp_device_quantize_chunks(host, x, ZPP_FP32, n_chunks, chunk_len, &in_sp,
                                             in_j));
            ptrs[j] = in_j;
            for (size_t c = 0; c < n_chunks; c++)
                EXPECT_OK(zpp_dequantize(in_j + c * qin, chunk_len, &in_sp, ZPP_FP32,
                                         d + c * chunk_len));
            for (size_t i = 0; i < n; i++) sum[i] = sum[i] + d[i];
        }
        uint8_t *want = zpp_test_malloc(n_chunks * qout), *got = zpp_test_malloc(n_chunks * qout),
                *got2 = zpp_test_malloc(n_chunks * qout);
        EXPECT_OK(zpp_device_quantize_chunks(host, sum, ZPP_FP32, n_chunks, chunk_len, &out_sp,
                                         want));
        memset(got, 0xee, n_chunks * qout);
        EXPECT_OK(zpp_quant_dequant_sum_requant(ptrs, k, n_chunks, chunk_len, &in_sp, &out_sp,
                                                got));
        EXPECT_OK(zpp_device_dequant_sum_requant(host, ins, k, n_chunks, chunk_len, 0, chunk_len,
                                             &in_sp, &out_sp, got2));
        size_t bytes = n_chunks * qout;
        EXPECT(first_diff(want, got, bytes) == bytes,
               "k %d chunks %zu len %zu in int%d/%zu out int%d/%zu%s: byte %zu", k, n_chunks,
               chunk_len, in_sp.bits, in_sp.block, out_sp.bits, out_sp.block,
               out_sp.stochastic ? " SR" : "", first_diff(want, got, bytes));
        EXPECT(memcmp(got, got2, bytes) == 0, "exec path differs from the direct call");
        free(got2);
        free(got);
        free(want);
        free(d);
        free(sum);
        free(x);
        free(ins);
    }
}

static void test_dequantize_accumulate(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(7));
    for (int iter = 0; iter < 12; iter++) {
        size_t n = 1 + zpp_rng_u64(&rng) % 3000;
        zpp_quant_spec sp = spec_make(all_bits[iter % N_KINDS],
                                      (size_t)8 << (zpp_rng_u64(&rng) % 8),
                                      0, 0);
        float *x = zpp_test_malloc(n * 4), *xf = zpp_test_malloc(n * 4), *acc = zpp_test_malloc(n * 4),
              *want = zpp_test_malloc(n * 4), *y = zpp_test_malloc(n * 4);
        fill(&rng, D_NORMAL, ZPP_FP32, n, sp.block, x, xf);
        for (size_t i = 0; i < n; i++) acc[i] = (float)(100.0 * zpp_rng_normal(&rng));
        uint8_t *q = zpp_test_malloc(zpp_quant_bytes(n, &sp));
        EXPECT_OK(zpp_quantize(x, ZPP_FP32, n, &sp, q));
        EXPECT_OK(zpp_dequantize(q, n, &sp, ZPP_FP32, y));
        for (size_t i = 0; i < n; i++) want[i] = acc[i] + y[i];
        EXPECT_OK(zpp_dequantize_accumulate(q, n, &sp, acc));
        EXPECT(memcmp(acc, want, n * 4) == 0, "n %zu int%d block %zu", n, sp.bits, sp.block);
        free(q);
        free(y);
        free(want);
        free(acc);
        free(xf);
        free(x);
    }
}

/* qgZ's sums: out = scale * (exact + sum over chunks of dequantize(chunk)),
 * the sum in fp32 from exact (or 0) in chunk order, one multiply at the end;
 * the chunks end to end or `stride` bytes apart with garbage between (which
 * must not be read), exact apart from the output or the output itself. */
static void test_dequant_reduce(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(8));
    zpp_device *host = host_device();
    for (int iter = 0; iter < 24; iter++) {
        size_t n_chunks = 1 + zpp_rng_u64(&rng) % 6, chunk_len = 1 + zpp_rng_u64(&rng) % 9000;
        zpp_quant_spec sp = spec_make(all_bits[iter % N_KINDS], 0, 0, 0);
        size_t n = n_chunks * chunk_len, qb = zpp_quant_bytes(chunk_len, &sp);
        const size_t stride = iter % 3 == 0 ? 0 : qb + 16 * (zpp_rng_u64(&rng) % 4);
        const int how = iter / 3 % 3; /* exact: 0 none, 1 its own buffer, 2 the output */
        float *x = zpp_test_malloc(n * 4), *xf = zpp_test_malloc(n * 4), *d = zpp_test_malloc(n * 4),
              *want = zpp_test_malloc(chunk_len * 4), *got = zpp_test_malloc(chunk_len * 4),
              *exact = zpp_test_malloc(chunk_len * 4);
        fill(&rng, D_NORMAL, ZPP_FP32, n, sp.block, x, xf);
        for (size_t i = 0; i < chunk_len; i++) exact[i] = (float)zpp_rng_normal(&rng);
        uint8_t *q = zpp_test_malloc(n_chunks * qb), *spread = zpp_test_malloc(n_chunks * (qb + 48));
        EXPECT_OK(zpp_device_quantize_chunks(host, x, ZPP_FP32, n_chunks, chunk_len, &sp, q));
        EXPECT_OK(zpp_device_dequantize_chunks(host, q, n_chunks, chunk_len, &sp, ZPP_FP32, d));
        for (size_t b = 0; b < n_chunks * (qb + 48); b++) spread[b] = (uint8_t)zpp_rng_u64(&rng);
        for (size_t c = 0; c < n_chunks; c++)
            memcpy(spread + c * (stride ? stride : qb), q + c * qb, qb);
        float scale = 1.0f / (float)(1 + iter);
        for (size_t i = 0; i < chunk_len; i++) {
            float s = how ? exact[i] : 0.0f;
            for (size_t c = 0; c < n_chunks; c++) s = s + d[c * chunk_len + i];
            want[i] = scale * s;
        }
        if (how == 2) memcpy(got, exact, chunk_len * 4);
        EXPECT_OK(zpp_device_dequant_reduce(host, spread, n_chunks, stride, chunk_len, &sp,
                                            how == 0 ? NULL : how == 1 ? exact : got, scale, got));
        EXPECT(memcmp(want, got, chunk_len * 4) == 0, "chunks %zu len %zu stride %zu exact %d",
               n_chunks, chunk_len, stride, how);
        free(spread);
        free(q);
        free(exact);
        free(got);
        free(want);
        free(d);
        free(xf);
        free(x);
    }
    /* inputs that would overlap are refused */
    zpp_quant_spec sp = spec_make(4, 0, 0, 0);
    uint8_t q[4096];
    float out[64];
    EXPECT_STATUS(zpp_device_dequant_reduce(host, q, 2, zpp_quant_bytes(64, &sp) - 16, 64, &sp,
                                            NULL, 1.0f, out),
                  ZPP_ERR_INVALID);
}

/* ---- conversions (the branch-free fp16/bf16 code inside quant.c) ---- */

static void test_convert_bit_exact(void) {
    zpp_device *host = host_device();
    /* every fp16 and bf16 value -> fp32, scale 1: exact, NaNs included */
    uint16_t *h = zpp_test_malloc(65536 * 2);
    float *f = zpp_test_malloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    /* convert computes scale * x, and a multiply quiets a signalling NaN:
     * the expected value goes through the same multiply (volatile, so the
     * compiler cannot fold 1 * x away) */
    volatile float one = 1.0f;
    EXPECT_OK(zpp_device_convert(host, h, ZPP_FP16, f, ZPP_FP32, 65536, 1.0f));
    for (uint32_t i = 0; i < 65536; i++) {
        float w = one * zpp_fp16_to_f32((uint16_t)i);
        EXPECT(f2u(f[i]) == f2u(w), "fp16 %04x -> %08x, want %08x", i, f2u(f[i]), f2u(w));
    }
    EXPECT_OK(zpp_device_convert(host, h, ZPP_BF16, f, ZPP_FP32, 65536, 1.0f));
    for (uint32_t i = 0; i < 65536; i++) {
        float w = one * zpp_bf16_to_f32((uint16_t)i);
        EXPECT(f2u(f[i]) == f2u(w), "bf16 %04x -> %08x, want %08x", i, f2u(f[i]), f2u(w));
    }
    /* fp32 -> fp16 / bf16: edge values, then random bit patterns */
    const size_t n = 400000;
    float *src = zpp_test_malloc(n * 4);
    uint16_t *o = zpp_test_malloc(n * 2);
    const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65535.0f, 65536.0f,
                           0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x3p-26f, 0x1.ffcp-15f,
                           0x1.ffep-15f, INFINITY, -INFINITY, NAN, 1.0f, -2.5f, FLT_MAX};
    zpp_rng rng = zpp_rng_make(zpp_test_seed(9));
    for (size_t i = 0; i < n; i++) {
        if (i < sizeof edges / sizeof edges[0]) {
            src[i] = edges[i];
        } else if (i % 2) {
            uint32_t u = (uint32_t)zpp_rng_u64(&rng);
            memcpy(&src[i], &u, 4);
        } else { /* exponents near fp16's range, where the cases switch */
            uint32_t u = (uint32_t)zpp_rng_u64(&rng);
            u = (u & 0x807fffffu) | ((uint32_t)(96 + zpp_rng_u64(&rng) % 50) << 23);
            memcpy(&src[i], &u, 4);
        }
    }
    EXPECT_OK(zpp_device_convert(host, src, ZPP_FP32, o, ZPP_FP16, n, 1.0f));
    for (size_t i = 0; i < n; i++)
        EXPECT(o[i] == zpp_f32_to_fp16(src[i]), "fp32 %08x -> fp16 %04x, want %04x",
               f2u(src[i]), o[i], zpp_f32_to_fp16(src[i]));
    EXPECT_OK(zpp_device_convert(host, src, ZPP_FP32, o, ZPP_BF16, n, 1.0f));
    for (size_t i = 0; i < n; i++)
        EXPECT(o[i] == zpp_f32_to_bf16(src[i]), "fp32 %08x -> bf16 %04x, want %04x",
               f2u(src[i]), o[i], zpp_f32_to_bf16(src[i]));
    /* a scale, other dtype pairs, and in place for equal dtypes */
    for (size_t i = 0; i < n; i++) src[i] = (float)zpp_rng_normal(&rng);
    for (size_t a = 0; a < 3; a++) {
        for (size_t b = 0; b < 3; b++) {
            zpp_dtype di = all_dtypes[a], dout = all_dtypes[b];
            void *in = zpp_test_malloc(n * 4), *out = zpp_test_malloc(n * 4);
            for (size_t i = 0; i < n; i++) zpp_store_f32(in, di, i, src[i]);
            EXPECT_OK(zpp_device_convert(host, in, di, out, dout, n, 0.375f));
            for (size_t i = 0; i < n; i++) {
                float v = 0.375f * zpp_load_f32(in, di, i), g = zpp_load_f32(out, dout, i);
                uint32_t buf;
                zpp_store_f32(&buf, dout, 0, v);
                float w = zpp_load_f32(&buf, dout, 0);
                EXPECT(f2u(g) == f2u(w), "%s -> %s element %zu", zpp_dtype_name(di),
                       zpp_dtype_name(dout), i);
            }
            if (a == b) {
                EXPECT_OK(zpp_device_convert(host, in, di, in, di, n, 0.375f));
                EXPECT(memcmp(in, out, n * zpp_dtype_size(di)) == 0, "in place %s",
                       zpp_dtype_name(di));
            } else {
                EXPECT_STATUS(zpp_device_convert(host, in, di, in, dout, n, 1.0f), ZPP_ERR_INVALID);
            }
            free(out);
            free(in);
        }
    }
    free(o);
    free(src);
    free(f);
    free(h);
}

/* Dequantized values across fp16's whole range (subnormals below 2^-14,
 * Inf above 65504) and bf16's: the dtype outputs are the fp32 output
 * rounded by core/dtype.h, bit for bit. Block b has absmax near 10^(b-10). */
static void test_dequantize_dtype_ranges(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(14));
    for (size_t bi = 0; bi < N_KINDS; bi++) {
        zpp_quant_spec sp = spec_make(all_bits[bi], 64, 0, 0);
        const size_t nb = 17, n = nb * sp.block;
        float *x = zpp_test_malloc(n * 4), *y32 = zpp_test_malloc(n * 4);
        uint16_t *y16 = zpp_test_malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(zpp_rng_normal(&rng) * pow(10.0, (double)(i / sp.block) - 10.0));
        uint8_t *q = zpp_test_malloc(zpp_quant_bytes(n, &sp));
        EXPECT_OK(zpp_quantize(x, ZPP_FP32, n, &sp, q));
        EXPECT_OK(zpp_dequantize(q, n, &sp, ZPP_FP32, y32));
        for (int k = 1; k < 3; k++) {
            zpp_dtype od = all_dtypes[k];
            EXPECT_OK(zpp_dequantize(q, n, &sp, od, y16));
            for (size_t i = 0; i < n; i++) {
                uint16_t want = od == ZPP_BF16 ? zpp_f32_to_bf16(y32[i]) : zpp_f32_to_fp16(y32[i]);
                EXPECT(y16[i] == want, "int%d %s element %zu (%a): %04x, want %04x", sp.bits,
                       zpp_dtype_name(od), i, y32[i], y16[i], want);
            }
        }
        free(q);
        free(y16);
        free(y32);
        free(x);
    }
}

/* ---- non-finite input ---- */

static int is_nan_out(const void *y, zpp_dtype dt, size_t i) {
    return isnan(zpp_load_f32(y, dt, i));
}

static void test_nonfinite(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(10));
    zpp_device *host = host_device();
    for (size_t di = 0; di < 3; di++) {
        for (size_t bi = 0; bi < N_KINDS; bi++) {
            zpp_dtype dt = all_dtypes[di];
            zpp_quant_spec sp = spec_make(all_bits[bi], 64, (int)(bi ^ di) & 1, 7);
            size_t B = sp.block, n = 5 * B - 3; /* 5 blocks, the last one short */
            void *x = zpp_test_malloc(n * 4), *y = zpp_test_malloc(n * 4);
            float *xf = zpp_test_malloc(n * 4);
            fill(&rng, D_NORMAL, dt, n, B, x, xf);
            size_t p1 = B + zpp_rng_u64(&rng) % B;                  /* NaN in block 1 */
            size_t p2 = 3 * B + zpp_rng_u64(&rng) % (B / 2);        /* +Inf in block 3 */
            size_t p3 = 3 * B + B / 2 + zpp_rng_u64(&rng) % (B / 2); /* -Inf in block 3 */
            zpp_store_f32(x, dt, p1, NAN);
            zpp_store_f32(x, dt, p2, INFINITY);
            zpp_store_f32(x, dt, p3, -INFINITY);
            for (size_t i = 0; i < n; i++) xf[i] = zpp_load_f32(x, dt, i);
            size_t bytes = zpp_quant_bytes(n, &sp);
            uint8_t *q = zpp_test_malloc(bytes), *r = zpp_test_malloc(bytes);
            zpp_error_clear();
            EXPECT_STATUS(zpp_quantize(x, dt, n, &sp, q), ZPP_ERR_NONFINITE);
            char want[64];
            snprintf(want, sizeof want, "element %zu ", p1);
            EXPECT(strstr(zpp_last_error(), want) != NULL, "message '%s' should name %s",
                   zpp_last_error(), want);
            /* blocks 1 and 3: NaN scale (0x7fc00000), zero payload; the rest
             * as the reference quantizes them */
            ref_quantize(xf, n, &sp, 0, r);
            EXPECT(memcmp(q, r, bytes) == 0, "differs from the reference at byte %zu",
                   first_diff(q, r, bytes));
            size_t so = zpp_quant_scales_offset(n, sp.bits);
            for (size_t b = 0; b < 5; b++) {
                uint32_t s;
                memcpy(&s, q + so + 4 * b, 4);
                EXPECT((b == 1 || b == 3) ? s == 0x7fc00000u : s != 0x7fc00000u,
                       "block %zu scale %08x", b, s);
            }
            for (size_t k = 0; k < 3; k++) {
                zpp_dtype od = all_dtypes[k];
                EXPECT_OK(zpp_dequantize(q, n, &sp, od, y));
                for (size_t i = 0; i < n; i++) {
                    int bad_block = i / B == 1 || i / B == 3;
                    EXPECT(is_nan_out(y, od, i) == bad_block, "%s element %zu: %g",
                           zpp_dtype_name(od), i, zpp_load_f32(y, od, i));
                }
            }
            float *acc = zpp_test_malloc(n * 4);
            for (size_t i = 0; i < n; i++) acc[i] = 1.0f;
            EXPECT_OK(zpp_dequantize_accumulate(q, n, &sp, acc));
            for (size_t i = 0; i < n; i++)
                EXPECT(isnan(acc[i]) == (i / B == 1 || i / B == 3), "accumulate %zu", i);
            /* the NaN goes on through dequant-sum-requant and the reduce */
            uint8_t *o = zpp_test_malloc(bytes);
            const void *ptrs[2] = {q, r};
            EXPECT_STATUS(zpp_quant_dequant_sum_requant(ptrs, 2, 1, n, &sp, &sp, o),
                          ZPP_ERR_NONFINITE);
            EXPECT(strstr(zpp_last_error(), "element") != NULL, "%s", zpp_last_error());
            EXPECT_OK(zpp_dequantize(o, n, &sp, ZPP_FP32, acc));
            for (size_t i = 0; i < n; i++)
                EXPECT(isnan(acc[i]) == (i / B == 1 || i / B == 3), "dsr %zu", i);
            EXPECT_OK(zpp_device_dequant_reduce(host, q, 1, 0, n, &sp, NULL, 0.5f, acc));
            for (size_t i = 0; i < n; i++)
                EXPECT(isnan(acc[i]) == (i / B == 1 || i / B == 3), "reduce %zu", i);
            /* chunked and reordered entry points report too; the device
             * stores the same bytes, raises its flag and returns ZPP_OK */
            int raised = 0;
            EXPECT_OK(zpp_device_nonfinite_take(host, &raised));
            EXPECT(raised == 0, "flag raised before any non-finite input");
            EXPECT_OK(zpp_device_quantize_chunks(host, x, dt, 1, n, &sp, o));
            EXPECT(memcmp(o, q, bytes) == 0, "device quantize differs from zpp_quantize");
            EXPECT_OK(zpp_device_nonfinite_take(host, &raised));
            EXPECT(raised == 1, "the device's non-finite flag was not raised");
            EXPECT_OK(zpp_device_nonfinite_take(host, &raised));
            EXPECT(raised == 0, "the flag was not cleared by reading it");
            EXPECT_STATUS(zpp_quant_reorder_quantize(x, dt, n, 1, 1, &sp, o), ZPP_ERR_NONFINITE);
            EXPECT(strstr(zpp_last_error(), want) != NULL, "%s", zpp_last_error());
            free(o);
            free(acc);
            free(r);
            free(q);
            free(xf);
            free(y);
            free(x);
        }
    }
}

/* A block whose qmax / absmax overflows fp32 (absmax < qmax / FLT_MAX):
 * the formula is followed literally, x * Inf = +-Inf saturates to +-qmax
 * and 0 * Inf = NaN becomes 0, the scale absmax / qmax is stored as usual.
 * Just above that limit the block is quantized normally. */
static void test_tiny_absmax(void) {
    for (size_t bi = 0; bi < N_KINDS; bi++) {
        for (int sr = 0; sr < 2; sr++) {
            zpp_quant_spec sp = spec_make(all_bits[bi], 8, sr, 99);
            const int e2m1 = sp.format == ZPP_QUANT_E2M1;
            float Q = e2m1 ? 12.0f : qmax_of(sp.bits), D = e2m1 ? 6.0f : Q; /* scale a / D */
            float limit = Q / FLT_MAX; /* qmax / absmax overflows below about this */
            float x[24], y[24];
            for (int i = 0; i < 8; i++) {
                x[i] = (i % 2 ? -1.0f : 1.0f) * limit * 0.5f * (float)(i + 1) / 8.0f;
                x[8 + i] = (float)(i - 3) * 1e-40f;              /* subnormal, one zero */
                x[16 + i] = (float)(i - 4) * limit * 4.0f;       /* quantized normally */
            }
            uint8_t q[256], r[256];
            EXPECT_OK(zpp_quantize(x, ZPP_FP32, 24, &sp, q));
            ref_quantize(x, 24, &sp, 0, r);
            EXPECT(memcmp(q, r, zpp_quant_bytes(24, &sp)) == 0, "int%d %s: byte %zu", sp.bits,
                   sr ? "SR" : "RNE", first_diff(q, r, zpp_quant_bytes(24, &sp)));
            float s[3];
            memcpy(s, q + zpp_quant_scales_offset(24, sp.bits), sizeof s);
            float a0 = fabsf(x[7]), a1 = fabsf(x[15]), a2 = fabsf(x[16]); /* block absmax */
            EXPECT(s[0] == a0 / D && s[1] == a1 / D && s[2] == a2 / D, "scales %a %a %a", s[0],
                   s[1], s[2]);
            for (int i = 0; i < 16; i++) {
                int got = e2m1           ? e2m1_at(q, i)
                          : sp.bits == 8 ? (int8_t)q[i]
                                         : (int)(((q[i / 2] >> (i % 2 ? 4 : 0)) & 15) ^ 8) - 8;
                int want = x[i] > 0 ? (int)Q : x[i] < 0 ? -(int)Q : 0;
                EXPECT(got == want, "int%d element %d: q %d, want %d", sp.bits, i, got, want);
            }
            EXPECT_OK(zpp_dequantize(q, 24, &sp, ZPP_FP32, y));
            for (int i = 0; i < 24; i++) {
                double a = i < 8 ? a0 : i < 16 ? a1 : a2;
                EXPECT(fabs((double)y[i] - x[i]) <= elem_bound(a, &sp, ZPP_FP32),
                       "element %d: %a vs %a", i, y[i], x[i]);
            }
        }
    }
}

/* ---- layout ---- */

static int aligned16(uintptr_t v) { return v % 16 == 0; }

static void test_wire_layout(void) {
    /* worked examples: {n, bits, block, payload, scales offset, blocks, total} */
    static const size_t ex[][7] = {
        {0, 8, 256, 0, 0, 0, 0},          {7, 8, 256, 7, 16, 1, 32},
        {256, 8, 256, 256, 256, 1, 272},  {1000, 4, 128, 500, 512, 8, 544},
        {1025, 4, 128, 513, 528, 9, 576}, {1, 4, 8, 1, 16, 1, 32}};
    for (size_t k = 0; k < sizeof ex / sizeof ex[0]; k++) {
        zpp_quant_spec e = spec_make((int)ex[k][1], ex[k][2], 0, 0);
        size_t got[4] = {zpp_quant_payload_bytes(ex[k][0], e.bits),
                         zpp_quant_scales_offset(ex[k][0], e.bits),
                         zpp_quant_num_blocks(ex[k][0], e.block), zpp_quant_bytes(ex[k][0], &e)};
        for (int j = 0; j < 4; j++)
            EXPECT(got[j] == ex[k][3 + j], "n %zu int%zu block %zu: quantity %d is %zu, want %zu",
                   ex[k][0], ex[k][1], ex[k][2], j, got[j], ex[k][3 + j]);
    }
    /* the formulas on random sizes, and every padding byte written as 0 */
    zpp_rng rng = zpp_rng_make(zpp_test_seed(11));
    for (int iter = 0; iter < 200; iter++) {
        size_t n = zpp_rng_u64(&rng) % 5000;
        zpp_quant_spec sp = spec_make(all_bits[iter % N_KINDS],
                                      (size_t)8 << (zpp_rng_u64(&rng) % 8),
                                      0, 0);
        size_t pb = zpp_quant_payload_bytes(n, sp.bits);
        size_t so = zpp_quant_scales_offset(n, sp.bits);
        size_t nb = zpp_quant_num_blocks(n, sp.block);
        size_t tot = zpp_quant_bytes(n, &sp);
        EXPECT(pb == (sp.bits == 8 ? n : (n + 1) / 2), "n %zu: payload %zu", n, pb);
        EXPECT(aligned16(so) && so >= pb && so < pb + 16, "n %zu: scales at %zu", n, so);
        EXPECT(nb * sp.block >= n && (nb == 0 || (nb - 1) * sp.block < n), "n %zu: %zu blocks",
               n, nb);
        EXPECT(aligned16(tot) && tot >= so + 4 * nb && tot < so + 4 * nb + 16, "n %zu: %zu bytes",
               n, tot);
        if (iter % 10) continue;
        float *x = zpp_test_malloc(n * 4), *xf = zpp_test_malloc(n * 4);
        fill(&rng, D_NORMAL, ZPP_FP32, n, sp.block, x, xf);
        /* two tensors end to end in one 16-aligned buffer, poisoned first */
        uint8_t *raw = zpp_test_malloc(2 * tot + 16);
        uint8_t *buf = raw + (16 - (uintptr_t)raw % 16) % 16;
        memset(buf, 0x77, 2 * tot);
        EXPECT_OK(zpp_quantize(x, ZPP_FP32, n, &sp, buf));
        EXPECT_OK(zpp_quantize(x, ZPP_FP32, n, &sp, buf + tot));
        EXPECT(aligned16((uintptr_t)(buf + tot)) && aligned16((uintptr_t)(buf + so)),
               "second tensor or scales not 16-byte aligned");
        for (size_t i = pb; i < so; i++) EXPECT(buf[i] == 0, "payload padding byte %zu", i);
        for (size_t i = so + 4 * nb; i < tot; i++) EXPECT(buf[i] == 0, "tail byte %zu", i);
        if (sp.bits == 4 && n % 2)
            EXPECT((buf[pb - 1] & 0xf0) == 0, "odd n leaves the last high nibble 0");
        EXPECT(memcmp(buf, buf + tot, tot) == 0, "the two copies differ");
        free(raw);
        free(xf);
        free(x);
    }
}

static void test_invalid_specs(void) {
    float x[16] = {0};
    uint8_t q[256];
    zpp_quant_spec sp = spec_make(5, 256, 0, 0);
    EXPECT_STATUS(zpp_quant_spec_check(&sp), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "5 bits") != NULL, "%s", zpp_last_error());
    EXPECT_STATUS(zpp_quantize(x, ZPP_FP32, 16, &sp, q), ZPP_ERR_INVALID);
    sp = spec_make(8, 12, 0, 0);
    EXPECT_STATUS(zpp_quantize(x, ZPP_FP32, 16, &sp, q), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "block size 12") != NULL, "%s", zpp_last_error());
    sp.block = 0;
    EXPECT_STATUS(zpp_dequantize(q, 16, &sp, ZPP_FP32, x), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "block size 0") != NULL, "%s", zpp_last_error());
    sp.block = ((size_t)1 << 20) + 8;
    EXPECT_STATUS(zpp_quant_spec_check(&sp), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "maximum") != NULL, "%s", zpp_last_error());
    sp = spec_make(4, 128, 2, 0);
    EXPECT_STATUS(zpp_quant_spec_check(&sp), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_quant_spec_check(NULL), ZPP_ERR_INVALID);
    sp = spec_make(8, 0, 0, 0);
    EXPECT(sp.block == ZPP_QUANT_DEFAULT_BLOCK_INT8 && !sp.stochastic, "default int8 spec");
    EXPECT(zpp_quant_spec_default(4).block == ZPP_QUANT_DEFAULT_BLOCK_INT4, "default int4 spec");
    EXPECT_OK(zpp_quant_spec_check(&sp));
    EXPECT_STATUS(zpp_quantize(x, (zpp_dtype)7, 16, &sp, q), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_quantize(NULL, ZPP_FP32, 16, &sp, q), ZPP_ERR_INVALID);
    EXPECT_OK(zpp_quantize(NULL, ZPP_FP32, 0, &sp, NULL)); /* nothing to do */
    EXPECT_STATUS(zpp_quant_reorder_quantize(x, ZPP_FP32, 4, 0, 2, &sp, q), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "nodes 0") != NULL, "%s", zpp_last_error());
    const void *ptrs[1] = {q};
    EXPECT_STATUS(zpp_quant_dequant_sum_requant(ptrs, 0, 1, 16, &sp, &sp, q), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_device_quantize_chunks(NULL, x, ZPP_FP32, 1, 16, &sp, q), ZPP_ERR_INVALID);
    if (zpp_device_gpu_count() == 0) {
        zpp_device *gpu = NULL;
        zpp_status st = zpp_device_create_gpu(0, &gpu);
        EXPECT(st == ZPP_ERR_UNSUPPORTED || st == ZPP_ERR_CUDA, "GPU device without a GPU: %s",
               zpp_status_str(st));
        EXPECT(strstr(zpp_last_error(), "CUDA") != NULL, "%s", zpp_last_error());
    }
}

/* The host device's quantization is the direct calls. */
static void test_exec_host_equals_direct(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(12));
    zpp_device *host = host_device();
    for (int iter = 0; iter < 12; iter++) {
        zpp_dtype dt = all_dtypes[iter % 3];
        size_t n_chunks = 1 + zpp_rng_u64(&rng) % 5, chunk_len = 1 + zpp_rng_u64(&rng) % 2000;
        zpp_quant_spec sp = spec_make(all_bits[(iter / 3) % N_KINDS], 0, (iter / 9) % 2,
                                      zpp_rng_u64(&rng));
        size_t n = n_chunks * chunk_len, es = zpp_dtype_size(dt);
        size_t qb = zpp_quant_bytes(chunk_len, &sp);
        void *x = zpp_test_malloc(n * 4), *y = zpp_test_malloc(n * 4), *y1 = zpp_test_malloc(n * 4);
        float *xf = zpp_test_malloc(n * 4);
        fill(&rng, D_CAUCHY, dt, n, sp.block, x, xf);
        uint8_t *a = zpp_test_malloc(n_chunks * qb), *b = zpp_test_malloc(n_chunks * qb);
        EXPECT_OK(zpp_device_quantize_chunks(host, x, dt, n_chunks, chunk_len, &sp, a));
        /* stochastic chunks use the index in the whole input: equal to the
         * reorder with one node, and chunk 0 to a plain quantize */
        EXPECT_OK(zpp_device_reorder_quantize(host, x, dt, chunk_len, 0, chunk_len, 1,
                                          (int)n_chunks, &sp, b));
        EXPECT(memcmp(a, b, n_chunks * qb) == 0, "chunks vs reorder(1 node)");
        for (size_t c = 0; c < (sp.stochastic ? 1 : n_chunks); c++) {
            EXPECT_OK(zpp_quantize((const char *)x + c * chunk_len * es, dt, chunk_len, &sp, b));
            EXPECT(memcmp(a + c * qb, b, qb) == 0, "chunk %zu vs zpp_quantize", c);
        }
        EXPECT_OK(zpp_device_dequantize_chunks(host, a, n_chunks, chunk_len, &sp, dt, y));
        for (size_t c = 0; c < n_chunks; c++)
            EXPECT_OK(zpp_dequantize(a + c * qb, chunk_len, &sp, dt,
                                     (char *)y1 + c * chunk_len * es));
        EXPECT(memcmp(y, y1, n * es) == 0, "dequantize chunks");
        free(b);
        free(a);
        free(xf);
        free(y1);
        free(y);
        free(x);
    }
}

/* The acceptance figures for the default blocks on N(0,1):
 * ||deq - x|| / ||x|| <= 0.01 (int8) and <= 0.15 (int4). */
static void test_default_block_accuracy(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(13));
    const size_t n = (size_t)1 << 20;
    float *x = zpp_test_malloc(n * 4), *xf = zpp_test_malloc(n * 4), *y = zpp_test_malloc(n * 4);
    fill(&rng, D_NORMAL, ZPP_FP32, n, 256, x, xf);
    for (size_t bi = 0; bi < N_KINDS; bi++) {
        zpp_quant_spec sp = spec_make(all_bits[bi], 0, 0, 0);
        uint8_t *q = zpp_test_malloc(zpp_quant_bytes(n, &sp));
        EXPECT_OK(zpp_quantize(x, ZPP_FP32, n, &sp, q));
        EXPECT_OK(zpp_dequantize(q, n, &sp, ZPP_FP32, y));
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            den += (double)x[i] * x[i];
        }
        double rel = sqrt(num / den);
        EXPECT(rel <= (sp.bits == 8 ? 0.01 : 0.15), "%s block %zu: rel L2 %g", kind_name(&sp),
               sp.block, rel);
        free(q);
    }
    free(y);
    free(xf);
    free(x);
}

/* ---- every CPU instruction set gives the same bytes (core/cpu.h) ---- */

/* One value of `dt` with the edge cases the kernels branch on, as raw bits:
 * NaN (quiet and signalling patterns, either sign), +-Inf, +-0, subnormals
 * of the dtype, the largest finite value, and ordinary N(0,1) * 2^k. */
static uint32_t edge_bits(zpp_rng *r, zpp_dtype dt) {
    const int wide = dt == ZPP_FP32;
    const uint32_t sign = (zpp_rng_u64(r) & 1) ? (wide ? 0x80000000u : 0x8000u) : 0u;
    const uint32_t inf = wide ? 0x7f800000u : dt == ZPP_BF16 ? 0x7f80u : 0x7c00u;
    const uint32_t man = wide ? 0x7fffffu : dt == ZPP_BF16 ? 0x7fu : 0x3ffu;
    uint64_t k = zpp_rng_u64(r) % 64;
    uint32_t m = (uint32_t)zpp_rng_u64(r) & man;
    if (k == 0) return sign | inf | (m ? m : 1u);               /* NaN */
    if (k == 1) return sign | inf;                              /* +-Inf */
    if (k == 2) return sign;                                    /* +-0 */
    if (k == 3) return sign | (m ? m : 1u);                     /* subnormal */
    if (k == 4) return sign | (inf - man - 1u) | man;           /* largest finite */
    if (k == 5) return (uint32_t)zpp_rng_u64(r) & (wide ? 0xffffffffu : 0xffffu); /* any */
    float v = (float)(zpp_rng_normal(r) * ldexp(1.0, (int)(zpp_rng_u64(r) % 9) - 4));
    uint8_t buf[4];
    zpp_store_f32(buf, dt, 0, v);
    return wide ? f2u(v) : (uint32_t)(buf[0] | buf[1] << 8);
}

static void store_bits(void *x, zpp_dtype dt, size_t i, uint32_t b) {
    if (dt == ZPP_FP32) memcpy((char *)x + 4 * i, &b, 4);
    else {
        uint16_t h = (uint16_t)b;
        memcpy((char *)x + 2 * i, &h, 2);
    }
}

/* Fills n elements block by block, each block one kind: clean N(0,1)
 * values (most blocks, so that the vector loops run, not only the
 * non-finite path), edge values mixed in, all zeros, or tiny values whose
 * qmax / absmax overflows (fp32 and bf16 reach below 3.7e-37; fp16 not). */
static void fill_isa(zpp_rng *r, zpp_dtype dt, size_t n, size_t block, void *x) {
    for (size_t lo = 0; lo < n; lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        uint64_t kind = zpp_rng_u64(r) % 8;
        for (size_t i = lo; i < hi; i++) {
            if (kind == 0) store_bits(x, dt, i, edge_bits(r, dt));
            else if (kind == 1 && (zpp_rng_u64(r) % 16) == 0)
                store_bits(x, dt, i, edge_bits(r, dt));
            else if (kind == 2) zpp_store_f32(x, dt, i, (zpp_rng_u64(r) & 1) ? -0.0f : 0.0f);
            else if (kind == 3 && dt != ZPP_FP16)
                zpp_store_f32(x, dt, i, (float)(zpp_rng_normal(r) * 1e-38));
            else zpp_store_f32(x, dt, i, (float)zpp_rng_normal(r));
        }
    }
}

/* A quantized tensor of random payload bytes (int4 nibbles include -8,
 * which the quantizer never writes) and scales that are ordinary, zero,
 * subnormal, huge (q * s overflows bf16/fp16 or fp32), Inf or NaN. */
static void random_quantized(zpp_rng *r, size_t n, const zpp_quant_spec *sp, uint8_t *q) {
    size_t bytes = zpp_quant_bytes(n, sp), so = zpp_quant_scales_offset(n, sp->bits);
    for (size_t i = 0; i < bytes; i++) q[i] = (uint8_t)zpp_rng_u64(r);
    for (size_t b = 0; b < zpp_quant_num_blocks(n, sp->block); b++) {
        float s;
        switch (zpp_rng_u64(r) % 10) {
        case 0: s = 0.0f; break;
        case 1: s = 1e-40f; break;
        case 2: s = 3e36f; break;
        case 3: s = 1000.0f; break;
        case 4: s = INFINITY; break;
        case 5: s = NAN; break;
        default: s = (float)(zpp_rng_uniform(r) * 0.05); break;
        }
        memcpy(q + so + 4 * b, &s, 4);
    }
}

/* What one instruction set computes on one trial: every CPU quantization
 * entry point's output bytes and status, laid end to end, with the offset
 * where each operation's bytes start (to name the one that differs). */
typedef struct isa_log {
    uint8_t *p;
    size_t n, cap;
    const char *op[32];
    size_t at[32];
    int elem[32]; /* -1: wire bytes, compared exactly; else the dtype of values */
    int ops;
} isa_log;

static void log_bytes(isa_log *L, const void *p, size_t n) {
    if (L->n + n > L->cap) {
        L->cap = 2 * (L->n + n);
        L->p = realloc(L->p, L->cap);
        EXPECT(L->p != NULL, "out of memory");
    }
    memcpy(L->p + L->n, p, n);
    L->n += n;
}

/* elem: ZPP_FP32 / ZPP_BF16 / ZPP_FP16 for values, -1 for the wire format. */
static void log_op(isa_log *L, const char *name, int elem, zpp_status st, const void *p,
                   size_t n) {
    EXPECT(L->ops < 32, "too many operations");
    L->op[L->ops] = name;
    L->elem[L->ops] = elem;
    L->at[L->ops++] = L->n;
    int s = (int)st;
    log_bytes(L, &s, sizeof s);
    log_bytes(L, p, n);
}

typedef struct isa_trial {
    zpp_dtype dt;
    size_t n;        /* elements of x; chunks: n = 4 * chunk_len */
    zpp_quant_spec sp, sp2; /* sp2: the output spec of dequant-sum-requant */
    const void *x;   /* n elements of dt */
    const uint8_t *qr;  /* 4 random quantized chunks of chunk_len (spec sp) */
    const float *acc0; /* n fp32 */
} isa_trial;

static int is_nan_bits(const uint8_t *p, int elem) {
    if (elem == ZPP_FP32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return (u & 0x7fffffffu) > 0x7f800000u;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7fff) > (elem == ZPP_BF16 ? 0x7f80 : 0x7c00);
}

/* The first byte of operation o (from the status on) where got differs from
 * ref, or its length if none. Bits must be equal, except that any NaN
 * equals any NaN in dequantized values: which NaN an operation on two NaNs
 * returns depends on the operand order the compiler picked (x86 keeps the
 * first operand's), and docs/quantization.md leaves it unspecified. The
 * wire format's NaN scale is canonical and compared exactly. */
static size_t first_difference(const isa_log *ref, const isa_log *got, int o, size_t end) {
    const size_t at = ref->at[o];
    const uint8_t *a = ref->p + at, *b = got->p + at;
    if (memcmp(a, b, sizeof(int)) != 0) return 0; /* status */
    const int elem = ref->elem[o];
    size_t es = elem >= 0 ? zpp_dtype_size((zpp_dtype)elem) : 1;
    for (size_t i = sizeof(int); i < end - at; i += es) {
        if (memcmp(a + i, b + i, es) == 0) continue;
        if (elem >= 0 && is_nan_bits(a + i, elem) && is_nan_bits(b + i, elem)) continue;
        return i;
    }
    return end - at;
}

static void isa_run(const isa_trial *t, isa_log *L) {
    const size_t n = t->n, cl = n / 4;
    const size_t qn = zpp_quant_bytes(n, &t->sp), qc = zpp_quant_bytes(cl, &t->sp);
    const size_t first = cl / 3, len = cl - first, qs = zpp_quant_bytes(len, &t->sp);
    uint8_t *q = zpp_test_malloc(qn + 4 * qc + 4 * zpp_quant_bytes(cl, &t->sp2));
    float *y = zpp_test_malloc(n * 4);
    zpp_status st;
    L->n = 0;
    L->ops = 0;
    st = zpp_quantize(t->x, t->dt, n, &t->sp, q);
    log_op(L, "quantize", -1, st, q, qn);
    st = zpp_quant_cpu_quantize_chunks(t->x, t->dt, 4, cl, &t->sp, q);
    log_op(L, "quantize chunks", -1, st, q, 4 * qc);
    st = zpp_quant_cpu_reorder_quantize(t->x, t->dt, cl, first, len, 2, 2, &t->sp, q);
    log_op(L, "reorder-quantize (slab)", -1, st, q, 4 * qs);
    for (int d = 0; d < 3; d++) {
        st = zpp_quant_cpu_dequantize_chunks(t->qr, 4, cl, &t->sp, all_dtypes[d], y);
        log_op(L, "dequantize", all_dtypes[d], st, y, n * zpp_dtype_size(all_dtypes[d]));
    }
    memcpy(y, t->acc0, n * 4);
    st = zpp_dequantize_accumulate(t->qr, cl, &t->sp, y);
    log_op(L, "dequantize-accumulate", ZPP_FP32, st, y, cl * 4);
    /* the 4 random chunks as k = 2 inputs of 2 chunks each */
    st = zpp_quant_cpu_dequant_sum_requant(t->qr, 2, 2, cl, 0, cl, &t->sp, &t->sp2, q);
    log_op(L, "dequant-sum-requant", -1, st, q, 2 * zpp_quant_bytes(cl, &t->sp2));
    st = zpp_quant_cpu_dequant_reduce(t->qr, 4, 0, cl, &t->sp, NULL, 0.25f, y);
    log_op(L, "dequant-reduce", ZPP_FP32, st, y, cl * 4);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            float scale = (a + b) % 2 ? 1.0f : 0.37f;
            st = zpp_quant_cpu_convert(t->x, t->dt, y, all_dtypes[b], n, scale);
            log_op(L, "convert", all_dtypes[b], st, y, n * zpp_dtype_size(all_dtypes[b]));
        }
    free(y);
    free(q);
}

static void test_isa_paths_identical(void) {
    const zpp_cpu_isa before = zpp_cpu_isa_active();
    int tested = 0;
    for (int i = 0; i < ZPP_CPU_ISA_COUNT; i++) {
        if (zpp_cpu_isa_supported((zpp_cpu_isa)i)) {
            tested++;
            printf("  CPU path %s: compared\n", zpp_cpu_isa_name((zpp_cpu_isa)i));
        } else {
            EXPECT_STATUS(zpp_cpu_isa_set((zpp_cpu_isa)i), ZPP_ERR_UNSUPPORTED);
            EXPECT(strstr(zpp_last_error(), zpp_cpu_isa_name((zpp_cpu_isa)i)) != NULL, "%s",
                   zpp_last_error());
            printf("  CPU path %s: not on this CPU, refused (compared where a CPU has it)\n",
                   zpp_cpu_isa_name((zpp_cpu_isa)i));
        }
    }
    EXPECT(tested >= 1 && zpp_cpu_isa_supported(ZPP_CPU_GENERIC), "generic always runs");
    zpp_rng rng = zpp_rng_make(zpp_test_seed(14));
    /* Lengths around the vector widths (4, 8, 16 fp32 lanes; 16, 32, 64
     * bytes) and tiles (512), and random ones; each is 4 chunks. */
    static const size_t lens[] = {1, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 127, 129, 513};
    static const size_t blocks[] = {8, 16, 24, 40, 64, 128, 256, 1024};
    isa_log ref = {0}, got = {0};
    for (int iter = 0; iter < 240; iter++) {
        zpp_dtype dt = all_dtypes[iter % 3];
        size_t cl = iter < 48 ? lens[iter % 16] : 1 + zpp_rng_u64(&rng) % 1500;
        size_t n = 4 * cl;
        isa_trial t = {.dt = dt, .n = n};
        t.sp = spec_make(all_bits[(iter / 3) % N_KINDS], blocks[zpp_rng_u64(&rng) % 8],
                         (iter / 9) % 2, zpp_rng_u64(&rng));
        t.sp2 = spec_make(all_bits[zpp_rng_u64(&rng) % N_KINDS], blocks[zpp_rng_u64(&rng) % 8],
                          (int)(zpp_rng_u64(&rng) % 2), zpp_rng_u64(&rng));
        void *x = zpp_test_malloc(n * 4);
        uint8_t *qr = zpp_test_malloc(4 * zpp_quant_bytes(cl, &t.sp));
        float *acc0 = zpp_test_malloc(n * 4);
        fill_isa(&rng, dt, n, t.sp.block, x);
        for (int c = 0; c < 4; c++)
            random_quantized(&rng, cl, &t.sp, qr + c * zpp_quant_bytes(cl, &t.sp));
        for (size_t i = 0; i < n; i++) acc0[i] = (float)zpp_rng_normal(&rng);
        t.x = x;
        t.qr = qr;
        t.acc0 = acc0;
        EXPECT_OK(zpp_cpu_isa_set(ZPP_CPU_GENERIC));
        isa_run(&t, &ref);
        for (int i = 1; i < ZPP_CPU_ISA_COUNT; i++) {
            if (!zpp_cpu_isa_supported((zpp_cpu_isa)i)) continue;
            EXPECT_OK(zpp_cpu_isa_set((zpp_cpu_isa)i));
            EXPECT(zpp_cpu_isa_active() == (zpp_cpu_isa)i, "path not switched");
            isa_run(&t, &got);
            EXPECT(got.n == ref.n && got.ops == ref.ops, "different shapes of output");
            for (int o = 0; o < ref.ops; o++) {
                size_t end = o + 1 < ref.ops ? ref.at[o + 1] : ref.n;
                size_t bad = first_difference(&ref, &got, o, end);
                EXPECT(bad == end - ref.at[o],
                       "%s: %s differs from generic at byte %zu (%s, %zu elements, int%d block "
                       "%zu, %s)",
                       ref.op[o], zpp_cpu_isa_name((zpp_cpu_isa)i), bad, zpp_dtype_name(dt), n,
                       t.sp.bits, t.sp.block, t.sp.stochastic ? "stochastic" : "nearest");
            }
        }
        free(acc0);
        free(qr);
        free(x);
    }
    free(got.p);
    free(ref.p);
    EXPECT_OK(zpp_cpu_isa_set(before));
}

ZPP_TESTS(ZPP_TEST(test_quantize_matches_reference), ZPP_TEST(test_block_sizes),
          ZPP_TEST(test_representable_roundtrip), ZPP_TEST(test_stochastic_unbiased),
          ZPP_TEST(test_reorder_quantize_equals_unfused),
          ZPP_TEST(test_dequant_sum_requant_equals_unfused),
          ZPP_TEST(test_dequantize_accumulate), ZPP_TEST(test_dequant_reduce),
          ZPP_TEST(test_convert_bit_exact), ZPP_TEST(test_dequantize_dtype_ranges),
          ZPP_TEST(test_nonfinite), ZPP_TEST(test_tiny_absmax),
          ZPP_TEST(test_wire_layout), ZPP_TEST(test_invalid_specs),
          ZPP_TEST(test_exec_host_equals_direct), ZPP_TEST(test_default_block_accuracy),
          ZPP_TEST(test_isa_paths_identical))

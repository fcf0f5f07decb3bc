/* test_llama_kernels_cuda.c — the Llama family's CUDA kernels (src/model/
 * llama_kernels_cuda.cu: RMSNorm, RoPE, SwiGLU, forward and backward)
 * against float64 references computed here on the same inputs, in every
 * working dtype (fp32, bf16, fp16).
 *
 * Inputs are fresh each run (the seed is printed; ZPP_TEST_SEED replays
 * it). Values in the working dtype E are drawn in double, rounded to E on
 * the host, and the reference reads them back exactly. Every output buffer
 * is poisoned (0xFF bytes: NaN in each dtype) before the call and has a
 * poisoned guard zone after it, so an element left unwritten fails its
 * comparison and a write past the end fails the guard check.
 *
 * THE ERROR BOUNDS, element by element, from the roundings the kernels do.
 * w = 2^-24 is fp32's unit roundoff, u_E that of the output dtype (2^-24,
 * 2^-8 bf16, 2^-11 fp16), tiny_E half the spacing of E's subnormals (an
 * fp16 result below 2^-14 has an absolute, not a relative, rounding error).
 * Sums of k terms carry at most k w times the sum of the terms' magnitudes
 * in any order; a product or quotient is rounded once (w of its value);
 * CUDA's sqrtf and '/' are correctly rounded, expf is within 2 ulp (4 w
 * relative). Each bound sums first-order terms and is multiplied by
 * 1 + 2^-6 for the second-order ones. Nearly every element's error is a
 * small fraction of its bound (random-sign rounding errors add up like a
 * random walk); a real bug (a wrong index, eps, sign or sum) moves values
 * by about their own size.
 *
 *  RMSNorm forward: ss = sum x^2 (C squares and C-1 adds: C w), ss / C and
 *  + eps (2 w), the root halves the relative error and adds w, 1/. adds w:
 *      |r~ - r| <= ((C + 2) / 2 + 3) w r,
 *      |y~ - y| <= ((C + 2) / 2 + 5) w |y| + u_E |y| + tiny_E.
 *  RMSNorm backward, given the forward's r~ (the reference uses it, so the
 *  bound covers the backward's own arithmetic): with g = dy w, xh = x r,
 *  t_c = g_c xh_c (3 roundings), gm = sum t / C:
 *      e_gm  = ((C + 3) w sum |t|) / C + w |gm|,
 *      |dx~ - dx| <= r (4 w (|g| + |xh gm|) + |xh| e_gm) + w |dx|
 *  (dx includes the value it is added to: one more rounding), and for the
 *  gain, rows summed in chunks and the chunks in order (n adds at most):
 *      |dw~ - dw| <= (n + 3) w sum_rows |dy xh| + w |dw|.
 *  RoPE: the table's cos~ = fp32(cos(fl64(p f))) is off by
 *  w |cos| + e_t, e_t = 2^-52 (1 + p f) (sin alike); the output
 *  a cos~ - b sin~ (two products, a difference) then rounded to E:
 *      |o~ - o| <= (|a| + |b|) e_t + 2 w (|a cos| + |b sin|) + w |o|
 *                  + u_E |o| + tiny_E.
 *  SwiGLU: s = 1 / (1 + e^-g) has relative error 6 w (expf 4 w, the sum
 *  and the quotient w each); h = (g s) up adds 2 w:
 *      |h~ - h| <= 8 w |h| + u_E |h| + tiny_E;
 *  d up = (d g) s likewise 8 w; d gate = ((d up) s) q, q = 1 + g (1 - s):
 *  1 - s is off by 6 w s + w |1 - s|, so q by |g| (6 w s + 2 w |1 - s|) +
 *  w |q|, and the three products add 9 w:
 *      |dg~ - dg| <= |d up s| (10 w |q| + |g| (6 w s + 2 w |1 - s|))
 *                    + u_E |dg| + tiny_E.
 *
 * Also: RoPE in fp32 is the CPU model's, bit for bit (same table, same
 * expressions, each operation rounded once: the kernel's _rn intrinsics
 * and the C code's -ffp-contract=off); each backward run twice on the same
 * inputs gives the same bytes (RMSNorm's gain gradient is a sum over rows:
 * the one place an unordered reduction could creep in); RoPE leaves v bit
 * for bit; the refusals (bad dtype, shapes, NULL and misaligned pointers)
 * launch nothing.
 *
 * Needs an NVIDIA GPU (label "gpu"); without one it skips, saying so. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "model/llama.h"
#include "model/llama_kernels_cuda.h"
#include "cuda_testlib.h"
#include "testlib.h"

#define W_F32 0x1p-24 /* unit roundoff of fp32 */
#define SECOND_ORDER (1.0 + 0x1p-6)

static const zpp_dtype all_dtypes[] = {ZPP_FP32, ZPP_BF16, ZPP_FP16};

static double unit_roundoff(zpp_dtype dt) {
    return dt == ZPP_BF16 ? 0x1p-8 : dt == ZPP_FP16 ? 0x1p-11 : W_F32;
}

/* Half the spacing of the subnormals: the absolute rounding error there. */
static double tiny(zpp_dtype dt) {
    return dt == ZPP_BF16 ? 0x1p-134 : dt == ZPP_FP16 ? 0x1p-25 : 0x1p-150;
}

/* ---- device plumbing ---------------------------------------------------------------- */

static zpp_device *dev; /* GPU 0, for the running test */

static void dev_open(void) { dev = zpp_test_gpu_open("test_llama_kernels_cuda checks GPU kernels"); }

static void dev_close(void) {
    EXPECT_OK(zpp_device_sync(dev, NULL));
    zpp_device_destroy(dev);
    dev = NULL;
}

/* ---- host values ---------------------------------------------------------------------- */

/* n values amp * N(0, 1) + shift, rounded to dt (into a buffer of dt). */
static void *fill_e(zpp_rng *r, zpp_dtype dt, size_t n, double amp, double shift) {
    void *p = zpp_test_malloc(n * zpp_dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++)
        zpp_store_f32(p, dt, i, (float)(amp * zpp_rng_normal(r) + shift));
    return p;
}

static double ld_e(const void *p, zpp_dtype dt, size_t i) { return (double)zpp_load_f32(p, dt, i); }

/* The worst element of one output: observed error / bound. */
typedef struct worst {
    const char *name;
    double ratio;
    size_t at;
} worst;

/* Compares one element; fails at once (naming it) when it is out of bounds
 * or NaN. */
static void check_elem(worst *w, const char *ctx, size_t i, double got, double ref,
                       double bound) {
    const double err = fabs(got - ref);
    if (!(err <= bound))
        zpp_test_fail(__FILE__, __LINE__, NULL,
                      "%s: %s[%zu] = %.9g, reference %.9g: error %.3g > bound %.3g", ctx,
                      w->name, i, got, ref, err, bound);
    const double ratio = bound > 0 ? err / bound : 0.0;
    if (ratio >= w->ratio) w->ratio = ratio, w->at = i;
}

static void worst_print(const worst *w, const char *ctx) {
    printf("    %s %-6s max err/bound %.4f (at %zu)\n", ctx, w->name, w->ratio, w->at);
}

static void expect_same_bytes(const void *a, const void *b, size_t bytes, const char *what) {
    EXPECT(memcmp(a, b, bytes) == 0, "%s: two runs on the same inputs gave different bytes",
           what);
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

typedef struct rms_case {
    int n, C;
    float eps;
} rms_case;

/* The forward's out and rstd against the double reference. */
static void rms_check_forward(zpp_dtype dt, rms_case c, const float *x, const void *w,
                              const void *out, const float *rstd, const char *ctx) {
    const size_t C = (size_t)c.C;
    const double uE = unit_roundoff(dt), eps = (double)c.eps;
    worst wy = {"out", 0, 0}, wr = {"rstd", 0, 0};
    for (size_t r = 0; r < (size_t)c.n; r++) {
        double ss = 0;
        for (size_t k = 0; k < C; k++) ss += (double)x[r * C + k] * x[r * C + k];
        const double rr = 1.0 / sqrt(ss / (double)C + eps);
        check_elem(&wr, ctx, r, rstd[r], rr, SECOND_ORDER * ((C + 2) / 2.0 + 3) * W_F32 * rr);
        for (size_t k = 0; k < C; k++) {
            const double y = x[r * C + k] * rr * ld_e(w, dt, k);
            const double bound =
                SECOND_ORDER * (((C + 2) / 2.0 + 5) * W_F32 + uE) * fabs(y) + tiny(dt);
            check_elem(&wy, ctx, r * C + k, ld_e(out, dt, r * C + k), y, bound);
        }
    }
    worst_print(&wy, ctx), worst_print(&wr, ctx);
}

/* The backward's dinp and dw against the double reference, which uses the
 * forward's rstd (the header comment says why). */
static void rms_check_backward(zpp_dtype dt, rms_case c, const float *x, const void *w,
                               const float *dy, const float *rstd, const float *dx0,
                               const float *dw0, const float *dx, const float *dw,
                               const char *ctx) {
    const size_t n = (size_t)c.n, C = (size_t)c.C;
    const double W = W_F32;
    worst wx = {"dinp", 0, 0}, ww = {"dw", 0, 0};
    double *dwr = zpp_test_malloc(C * sizeof(double)), *dwa = zpp_test_malloc(C * sizeof(double));
    for (size_t k = 0; k < C; k++) dwr[k] = dw0[k], dwa[k] = 0;
    for (size_t r = 0; r < n; r++) {
        const double rg = rstd[r];
        double gm = 0, tabs = 0;
        for (size_t k = 0; k < C; k++) {
            const double t = dy[r * C + k] * ld_e(w, dt, k) * x[r * C + k] * rg;
            gm += t, tabs += fabs(t);
        }
        gm /= (double)C;
        const double e_gm = (C + 3) * W * tabs / (double)C + W * fabs(gm);
        for (size_t k = 0; k < C; k++) {
            const size_t i = r * C + k;
            const double g = dy[i] * ld_e(w, dt, k), xh = x[i] * rg;
            const double ref = dx0[i] + rg * (g - xh * gm);
            const double bound = SECOND_ORDER * (rg * (4 * W * (fabs(g) + fabs(xh * gm)) +
                                                       fabs(xh) * e_gm) +
                                                 W * fabs(ref));
            check_elem(&wx, ctx, i, dx[i], ref, bound);
            dwr[k] += dy[i] * xh;
            dwa[k] += fabs(dy[i] * xh);
        }
    }
    for (size_t k = 0; k < C; k++) {
        const double bound = SECOND_ORDER * ((n + 3) * W * dwa[k] + W * fabs(dwr[k]));
        check_elem(&ww, ctx, k, dw[k], dwr[k], bound);
    }
    worst_print(&wx, ctx), worst_print(&ww, ctx);
    free(dwr), free(dwa);
}

/* Device buffers of one RMSNorm case. */
typedef struct rms_bufs {
    zpp_test_dbuf x, w, out, rstd, dy, dx, dw, scratch;
} rms_bufs;

/* Runs the backward from the host's dx0 and dw0 (fresh poisoned scratch)
 * and copies dinp and dw back. */
static void rms_run_backward(zpp_dtype dt, rms_case c, rms_bufs *b, const float *dx0,
                             const float *dw0, float *dx, float *dw) {
    zpp_test_dbuf_put(&b->dx, dx0);
    zpp_test_dbuf_put(&b->dw, dw0);
    zpp_test_dbuf_poison(&b->scratch);
    EXPECT_OK(zpp_llama_rmsnorm_backward(b->dx.p, b->dw.p, b->scratch.p, b->dy.p, b->x.p, b->w.p,
                                         b->rstd.p, c.n, c.C, dt, dev->stream));
    zpp_test_dbuf_get(&b->dx, dx, "dinp");
    zpp_test_dbuf_get(&b->dw, dw, "dw");
}

static void rmsnorm_case(zpp_dtype dt, rms_case c, uint64_t seed) {
    const size_t n = (size_t)c.n, C = (size_t)c.C, nc = n * C, es = zpp_dtype_size(dt);
    char ctx[96];
    snprintf(ctx, sizeof ctx, "rmsnorm %s n=%d C=%d eps=%g", zpp_dtype_name(dt), c.n, c.C,
             (double)c.eps);
    zpp_rng r = zpp_rng_make(seed);
    /* rows of very different sizes: 2^-10 .. 2^10 times N(0, 1), so that
     * eps (inside the root, after the mean) matters for the small ones */
    float *x = zpp_test_malloc(nc * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const double amp = exp2(20.0 * zpp_rng_uniform(&r) - 10.0);
        for (size_t k = 0; k < C; k++) x[i * C + k] = (float)(amp * zpp_rng_normal(&r));
    }
    void *w = fill_e(&r, dt, C, 0.1, 1.0);
    float *dy = fill_e(&r, ZPP_FP32, nc, 1.0, 0.0), *dx0 = fill_e(&r, ZPP_FP32, nc, 1.0, 0.0);
    float *dw0 = fill_e(&r, ZPP_FP32, C, 1.0, 0.0);
    void *out = zpp_test_malloc(nc * es);
    float *rstd = zpp_test_malloc(n * sizeof(float)), *dx = zpp_test_malloc(nc * sizeof(float));
    float *dw = zpp_test_malloc(C * sizeof(float)), *dx2 = zpp_test_malloc(nc * sizeof(float));
    float *dw2 = zpp_test_malloc(C * sizeof(float));
    rms_bufs b = {zpp_test_dbuf_make(dev, nc * 4), zpp_test_dbuf_make(dev, C * es), zpp_test_dbuf_make(dev, nc * es), zpp_test_dbuf_make(dev, n * 4),
                  zpp_test_dbuf_make(dev, nc * 4), zpp_test_dbuf_make(dev, nc * 4), zpp_test_dbuf_make(dev, C * 4),
                  zpp_test_dbuf_make(dev, zpp_llama_rmsnorm_backward_scratch(c.n, c.C) * 4)};
    zpp_test_dbuf_put(&b.x, x), zpp_test_dbuf_put(&b.w, w), zpp_test_dbuf_put(&b.dy, dy);

    EXPECT_OK(zpp_llama_rmsnorm_forward(b.out.p, b.rstd.p, b.x.p, b.w.p, c.n, c.C, c.eps, dt,
                                        dev->stream));
    zpp_test_dbuf_get(&b.out, out, "out");
    zpp_test_dbuf_get(&b.rstd, rstd, "rstd");
    rms_check_forward(dt, c, x, w, out, rstd, ctx);

    rms_run_backward(dt, c, &b, dx0, dw0, dx, dw);
    rms_check_backward(dt, c, x, w, dy, rstd, dx0, dw0, dx, dw, ctx);
    rms_run_backward(dt, c, &b, dx0, dw0, dx2, dw2);
    expect_same_bytes(dx, dx2, nc * sizeof(float), "rmsnorm backward dinp");
    expect_same_bytes(dw, dw2, C * sizeof(float), "rmsnorm backward dw");

    zpp_test_dbuf_free(&b.x), zpp_test_dbuf_free(&b.w), zpp_test_dbuf_free(&b.out), zpp_test_dbuf_free(&b.rstd);
    zpp_test_dbuf_free(&b.dy), zpp_test_dbuf_free(&b.dx), zpp_test_dbuf_free(&b.dw), zpp_test_dbuf_free(&b.scratch);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(out), free(rstd);
    free(dx), free(dw), free(dx2), free(dw2);
}

/* Shapes: one element; C below, at and above a warp's 32 lanes; n across
 * several 64-row chunks of the gain gradient, ragged; a Llama-wide row. */
static void test_rmsnorm(void) {
    dev_open();
    static const rms_case cases[] = {
        {1, 1, 1e-5f}, {7, 33, 1e-5f}, {130, 256, 1e-6f}, {200, 1000, 1e-5f}, {65, 2048, 1e-5f},
    };
    uint64_t s = 100;
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            rmsnorm_case(all_dtypes[d], cases[i], zpp_test_seed(s++));
    dev_close();
}

/* ---- RoPE --------------------------------------------------------------------------------- */

typedef struct rope_case {
    int B, T, H, KV, hd;
    double theta, factor; /* factor 0: no llama3 scaling */
    int orig;             /* the scaling's original context */
} rope_case;

static zpp_llama_config rope_config(rope_case c) {
    zpp_llama_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_head = c.H, cfg.n_kv_head = c.KV, cfg.n_embd = c.H * c.hd, cfg.seq_len = c.T;
    cfg.rope_theta = c.theta, cfg.rope_factor = c.factor;
    cfg.rope_low_freq_factor = 1.0, cfg.rope_high_freq_factor = 4.0;
    cfg.rope_original_max_pos = c.orig;
    return cfg;
}

/* got (a whole qkv of E) against in turned by sign * the angles: q and k
 * heads within the bound of the header comment, v heads bit for bit; in
 * fp32 also bit for bit the CPU model's rope_apply (the same fp32 table,
 * the same expressions, each operation rounded once on both sides). */
static void rope_check(zpp_dtype dt, rope_case c, const double *inv_freq, const float *cos_t,
                       const float *sin_t, const void *in, const void *got, double sign,
                       const char *ctx) {
    const size_t half = (size_t)c.hd / 2, Wd = (size_t)(c.H + 2 * c.KV) * c.hd;
    const size_t rot = (size_t)(c.H + c.KV) * c.hd, es = zpp_dtype_size(dt);
    const double W = W_F32, uE = unit_roundoff(dt);
    worst wo = {sign > 0 ? "q,k" : "dq,dk", 0, 0};
    for (size_t r = 0; r < (size_t)c.B * c.T; r++) {
        const double p = (double)(r % (size_t)c.T);
        for (size_t h = 0; h < (size_t)(c.H + c.KV); h++)
            for (size_t i = 0; i < half; i++) {
                const double ang = p * inv_freq[i], cs = cos(ang), sn = sign * sin(ang);
                const double et = 0x1p-52 * (1 + fabs(ang));
                const size_t ia = r * Wd + h * c.hd + i, ib = ia + half;
                const double a = ld_e(in, dt, ia), b = ld_e(in, dt, ib);
                const double o[2] = {a * cs - b * sn, b * cs + a * sn};
                if (dt == ZPP_FP32) {
                    const float fc = cos_t[(size_t)p * half + i];
                    const float fs = (float)sign * sin_t[(size_t)p * half + i];
                    const float fa = (float)a, fb = (float)b;
                    const float cpu[2] = {fa * fc - fb * fs, fb * fc + fa * fs};
                    for (int k = 0; k < 2; k++) {
                        const float gf = zpp_load_f32(got, dt, k ? ib : ia);
                        EXPECT(memcmp(&gf, &cpu[k], 4) == 0,
                               "%s: element %zu = %.9g, the CPU's rope_apply gives %.9g", ctx,
                               k ? ib : ia, (double)gf, (double)cpu[k]);
                    }
                }
                /* the two products of each output, |x cos| + |y sin|: the
                 * table's rounding (w of cos, sin) and the products' own */
                const double prod[2] = {fabs(a * cs) + fabs(b * sn), fabs(b * cs) + fabs(a * sn)};
                for (int k = 0; k < 2; k++) {
                    const double bound = SECOND_ORDER * ((fabs(a) + fabs(b)) * et + 2 * W * prod[k] +
                                                         (W + uE) * fabs(o[k])) + tiny(dt);
                    check_elem(&wo, ctx, k ? ib : ia, ld_e(got, dt, k ? ib : ia), o[k], bound);
                }
            }
        EXPECT(memcmp((const char *)in + (r * Wd + rot) * es, (const char *)got + (r * Wd + rot) * es,
                      (Wd - rot) * es) == 0,
               "%s: row %zu: the v heads changed", ctx, r);
    }
    worst_print(&wo, ctx);
}

static void rope_case_run(zpp_dtype dt, rope_case c, uint64_t seed) {
    const size_t half = (size_t)c.hd / 2, n = (size_t)c.B * c.T;
    const size_t nq = n * (size_t)(c.H + 2 * c.KV) * c.hd, es = zpp_dtype_size(dt);
    char ctx[128];
    snprintf(ctx, sizeof ctx, "rope %s B=%d T=%d H=%d KV=%d hd=%d theta=%g factor=%g",
             zpp_dtype_name(dt), c.B, c.T, c.H, c.KV, c.hd, c.theta, c.factor);
    const zpp_llama_config cfg = rope_config(c);
    double *inv_freq = zpp_test_malloc(half * sizeof(double));
    zpp_llama_rope_inv_freq(&cfg, inv_freq);
    float *cos_t = zpp_test_malloc((size_t)c.T * half * 4), *sin_t = zpp_test_malloc((size_t)c.T * half * 4);
    EXPECT_OK(zpp_llama_rope_tables(&cfg, c.T, cos_t, sin_t));
    zpp_rng r = zpp_rng_make(seed);
    void *in = fill_e(&r, dt, nq, 1.0, 0.0);
    void *got = zpp_test_malloc(nq * es), *got2 = zpp_test_malloc(nq * es);
    zpp_test_dbuf d_cos = zpp_test_dbuf_make(dev, (size_t)c.T * half * 4), d_sin = zpp_test_dbuf_make(dev, (size_t)c.T * half * 4);
    zpp_test_dbuf d_q = zpp_test_dbuf_make(dev, nq * es);
    zpp_test_dbuf_put(&d_cos, cos_t), zpp_test_dbuf_put(&d_sin, sin_t);

    zpp_test_dbuf_put(&d_q, in);
    EXPECT_OK(zpp_llama_rope_forward(d_q.p, d_cos.p, d_sin.p, c.B, c.T, c.H, c.KV, c.hd, dt,
                                     dev->stream));
    zpp_test_dbuf_get(&d_q, got, "qkv");
    rope_check(dt, c, inv_freq, cos_t, sin_t, in, got, 1.0, ctx);

    for (int run = 0; run < 2; run++) { /* the backward, twice: the same bytes */
        zpp_test_dbuf_put(&d_q, in);
        EXPECT_OK(zpp_llama_rope_backward(d_q.p, d_cos.p, d_sin.p, c.B, c.T, c.H, c.KV, c.hd, dt,
                                          dev->stream));
        zpp_test_dbuf_get(&d_q, run ? got2 : got, "dqkv");
    }
    rope_check(dt, c, inv_freq, cos_t, sin_t, in, got, -1.0, ctx);
    expect_same_bytes(got, got2, nq * es, "rope backward");

    zpp_test_dbuf_free(&d_cos), zpp_test_dbuf_free(&d_sin), zpp_test_dbuf_free(&d_q);
    free(inv_freq), free(cos_t), free(sin_t), free(in), free(got), free(got2);
}

/* Shapes: GQA 4:1 and 2:1, multi-head (KV = H), multi-query (KV = 1); hd
 * 2 (one pair), 64, 128; Llama 3's theta 500000 with its llama3 scaling
 * (factor 8 over an original context of 64 positions, so all three bands
 * of the scaling are visited), Llama 2's 10000 without. */
static void test_rope(void) {
    dev_open();
    static const rope_case cases[] = {
        {2, 37, 8, 2, 64, 500000.0, 8.0, 64},  {1, 300, 4, 2, 128, 500000.0, 32.0, 64},
        {3, 5, 3, 3, 2, 10000.0, 0.0, 0},      {2, 64, 8, 1, 128, 10000.0, 0.0, 0},
    };
    uint64_t s = 200;
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            rope_case_run(all_dtypes[d], cases[i], zpp_test_seed(s++));
    dev_close();
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

/* act and dgu (E) against the double reference (header comment). */
static void swiglu_check(zpp_dtype dt, int n, int F, const void *gu, const void *dact,
                         const void *act, const void *dgu, const char *ctx) {
    const double W = W_F32, uE = unit_roundoff(dt), t = tiny(dt);
    worst wh = {"act", 0, 0}, wg = {"dgate", 0, 0}, wu = {"dup", 0, 0};
    for (size_t r = 0; r < (size_t)n; r++)
        for (size_t j = 0; j < (size_t)F; j++) {
            const size_t ig = r * 2 * F + j, iu = ig + F, ia = r * F + j;
            const double g = ld_e(gu, dt, ig), up = ld_e(gu, dt, iu), d = ld_e(dact, dt, ia);
            const double s = 1.0 / (1.0 + exp(-g)), q = 1.0 + g * (1.0 - s);
            const double h = g * s * up, du = d * g * s, dg = d * up * s * q;
            check_elem(&wh, ctx, ia, ld_e(act, dt, ia), h,
                       SECOND_ORDER * (8 * W + uE) * fabs(h) + t);
            check_elem(&wu, ctx, iu, ld_e(dgu, dt, iu), du,
                       SECOND_ORDER * (8 * W + uE) * fabs(du) + t);
            const double eg = fabs(d * up * s) *
                              (10 * W * fabs(q) + fabs(g) * (6 * W * s + 2 * W * fabs(1.0 - s)));
            check_elem(&wg, ctx, ig, ld_e(dgu, dt, ig), dg,
                       SECOND_ORDER * (eg + uE * fabs(dg)) + t);
        }
    worst_print(&wh, ctx), worst_print(&wg, ctx), worst_print(&wu, ctx);
}

static void swiglu_case(zpp_dtype dt, int n, int F, uint64_t seed) {
    const size_t es = zpp_dtype_size(dt), na = (size_t)n * F;
    char ctx[80];
    snprintf(ctx, sizeof ctx, "swiglu %s n=%d F=%d", zpp_dtype_name(dt), n, F);
    zpp_rng r = zpp_rng_make(seed);
    void *gu = zpp_test_malloc(2 * na * es);
    for (size_t i = 0; i < (size_t)n; i++)
        for (size_t j = 0; j < 2 * (size_t)F; j++) /* gates spread wide: every slope of silu */
            zpp_store_f32(gu, dt, i * 2 * F + j,
                          (float)((j < (size_t)F ? 3.0 : 1.0) * zpp_rng_normal(&r)));
    void *dact = fill_e(&r, dt, na, 1.0, 0.0);
    void *act = zpp_test_malloc(na * es), *dgu = zpp_test_malloc(2 * na * es);
    void *dgu2 = zpp_test_malloc(2 * na * es);
    zpp_test_dbuf d_gu = zpp_test_dbuf_make(dev, 2 * na * es), d_dact = zpp_test_dbuf_make(dev, na * es), d_act = zpp_test_dbuf_make(dev, na * es);
    zpp_test_dbuf d_dgu = zpp_test_dbuf_make(dev, 2 * na * es);
    zpp_test_dbuf_put(&d_gu, gu), zpp_test_dbuf_put(&d_dact, dact);

    EXPECT_OK(zpp_llama_swiglu_forward(d_act.p, d_gu.p, n, F, dt, dev->stream));
    zpp_test_dbuf_get(&d_act, act, "act");
    for (int run = 0; run < 2; run++) {
        zpp_test_dbuf_poison(&d_dgu);
        EXPECT_OK(zpp_llama_swiglu_backward(d_dgu.p, d_dact.p, d_gu.p, n, F, dt, dev->stream));
        zpp_test_dbuf_get(&d_dgu, run ? dgu2 : dgu, "dgu");
    }
    swiglu_check(dt, n, F, gu, dact, act, dgu, ctx);
    expect_same_bytes(dgu, dgu2, 2 * na * es, "swiglu backward");

    zpp_test_dbuf_free(&d_gu), zpp_test_dbuf_free(&d_dact), zpp_test_dbuf_free(&d_act), zpp_test_dbuf_free(&d_dgu);
    free(gu), free(dact), free(act), free(dgu), free(dgu2);
}

/* Shapes: F not a multiple of 8 (element by element) and a multiple (eight
 * at a time), one row and many. */
static void test_swiglu(void) {
    dev_open();
    static const int shapes[][2] = {{1, 1}, {3, 13}, {5, 43}, {64, 256}, {33, 1000}};
    uint64_t s = 300;
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            swiglu_case(all_dtypes[d], shapes[i][0], shapes[i][1], zpp_test_seed(s++));
    dev_close();
}

/* ---- refusals ------------------------------------------------------------------------------ */

/* Bad dtypes, shapes and pointers are refused before any launch, with a
 * message; the output buffer stays poison. */
static void test_refusals(void) {
    dev_open();
    void *st = dev->stream;
    zpp_test_dbuf a = zpp_test_dbuf_make(dev, 4096), b = zpp_test_dbuf_make(dev, 4096), c = zpp_test_dbuf_make(dev, 4096), o = zpp_test_dbuf_make(dev, 4096);
    char *pa = a.p, *pb = b.p, *pc = c.p, *po = o.p;
    const zpp_dtype bad = (zpp_dtype)7;
    EXPECT_STATUS(zpp_llama_rmsnorm_forward(po, (float *)pb, (float *)pa, pc, 4, 8, 1e-5f, bad, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rmsnorm_forward(po, (float *)pb, (float *)pa, pc, 0, 8, 1e-5f,
                                            ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rmsnorm_forward(po, (float *)pb, (float *)pa, pc, 4, 8, 0.0f,
                                            ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rmsnorm_forward(po, NULL, (float *)pa, pc, 4, 8, 1e-5f, ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rmsnorm_forward(po + 1, (float *)pb, (float *)pa, pc, 4, 8, 1e-5f,
                                            ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rmsnorm_backward((float *)po, (float *)pb, NULL, (float *)pa,
                                             (float *)pa, pc, (float *)pb, 4, 8, ZPP_FP32, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rmsnorm_backward((float *)(po + 2), (float *)pb, (float *)pc,
                                             (float *)pa, (float *)pa, pc, (float *)pb, 4, 8,
                                             ZPP_FP32, st),
                  ZPP_ERR_INVALID);
    EXPECT(zpp_llama_rmsnorm_backward_scratch(0, 8) == 0, "scratch of no rows");
    EXPECT(zpp_llama_rmsnorm_backward_scratch(65, 8) == 2 * 8, "scratch of 65 rows: 2 chunks");
    /* RoPE: odd hd, KV > H, KV 0, NULL table */
    EXPECT_STATUS(zpp_llama_rope_forward(po, (float *)pa, (float *)pb, 1, 4, 2, 1, 3, ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    zpp_error_clear();
    EXPECT_STATUS(zpp_llama_rope_forward(po, (float *)pa, (float *)pb, 1, 4, 2, 4, 8, ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "KV") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_llama_rope_backward(po, (float *)pa, (float *)pb, 1, 4, 2, 0, 8, ZPP_BF16,
                                          st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rope_forward(po, NULL, (float *)pb, 1, 4, 2, 1, 8, ZPP_BF16, st),
                  ZPP_ERR_INVALID);
    /* SwiGLU */
    EXPECT_STATUS(zpp_llama_swiglu_forward(po, pa, 4, 0, ZPP_FP16, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_swiglu_forward(po, NULL, 4, 8, ZPP_FP16, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_swiglu_backward(po, pa, pb + 1, 4, 8, ZPP_FP16, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_swiglu_backward(po, pa, pb, 4, 8, bad, st), ZPP_ERR_INVALID);
    unsigned char *h = zpp_test_malloc(o.bytes);
    zpp_test_dbuf_get(&o, h, "output");
    for (size_t i = 0; i < o.bytes; i++)
        EXPECT(h[i] == ZPP_TEST_POISON, "a refused call wrote its output (byte %zu)", i);
    free(h);
    zpp_test_dbuf_free(&a), zpp_test_dbuf_free(&b), zpp_test_dbuf_free(&c), zpp_test_dbuf_free(&o);
    dev_close();
}

ZPP_TESTS(ZPP_TEST_GPU(test_refusals), ZPP_TEST_GPU(test_rmsnorm), ZPP_TEST_GPU(test_rope),
          ZPP_TEST_GPU(test_swiglu))

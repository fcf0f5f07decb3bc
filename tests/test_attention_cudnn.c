/* test_attention_cudnn.c — the cuDNN attention (src/model/attention_cudnn.c)
 * against our fused kernels (attention_cuda.h) on every case and against a
 * double-precision CPU reference on the T = 256 cases; bitwise determinism;
 * refusals; timings of both (printed, never asserted).
 *
 * Cases: B = 2, T 256 and 1024, H 4 and 12, hs 64 and 128, multi-head
 * (KV = H: GPT-2, the shapes we need: a refusal there FAILS the test) and
 * grouped queries (KV = H / 4: a refusal is reported loudly and the case
 * is left, since the caller falls back to our kernels). Inputs are fresh
 * each run (ZPP_TEST_SEED replays): q, k, v, dy ~ N(0, 1) in bf16, q times
 * 1.5 for sharper rows. Outputs are poisoned (NaN) before each call, with
 * guard zones after them (cuda_testlib.h).
 *
 * THE BOUNDS (u = 2^-8, the unit roundoff of bf16: |bf16(x) - x| <= u|x|).
 * The reference is exact for practical purposes (double), from the same
 * bf16 inputs; its backward takes the y cuDNN produced (as the model hands
 * the backward its forward's y), so D = rowsum(dy * y) is the same sum.
 * A flash-attention kernel rounds to bf16 twice on the way to each output:
 * the operand of the second product (P for y and dV, dS for dQ and dK:
 * relative u per term) and the output itself (u of it); its fp32 sums and
 * exponentials add about 2^-16 relative per term at hs = 128 and this T,
 * far below u. So, with a the sum of the terms' magnitudes,
 *   |out~ - out| <= u a + u |out| + (fp32: << u a),
 * and the test allows 4u (a + |out|), twice that, for cuDNN's freedom in
 * where it rounds (e.g. P rounded before or after normalising). The
 * magnitudes: y_id: a = sum_j P_ij |v_jd|; dV_jd: sum_i P_ij |dy_id|;
 * dQ_id: c sum_j P_ij (|dP_ij| + |D_i|) |k_jd| (which bounds sum |dS_ij k_jd|
 * and covers the fp32 error of dP - D); dK_jd alike with q_id. Grouped
 * queries sum over the group's heads. lse: within 1e-3 absolute (it is
 * fp32 throughout; a wrong lse is off by O(1)).
 * Against our kernels (no reference at T = 1024): both are within the bound
 * of the truth, and a is at most max|v| for y (P sums to 1), so
 * |y_cudnn - y_ours| <= 8u (max|v| + |y|); for the gradients, whose
 * magnitudes need the reference, a normwise 2^-4 max|out| (16 ulps of the
 * largest element): a wrong mask, head, stride or scale moves elements by
 * their own size, far beyond either.
 *
 * ZPP_CUDNN_DEBUG=1 prints the library's trace (each failing cuDNN backend
 * call with attribute name and status, the engines tried and chosen) to
 * stderr; a refusal prints it always.
 *
 * Needs an NVIDIA GPU and a build with cuDNN (label gpu). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "model/attention_cuda.h"
#include "model/attention_cudnn.h"
#include "cuda_testlib.h"
#include "testlib.h"

#define U_BF16 0x1p-8

static zpp_device *dev;

static int debug_on(void) {
    const char *e = getenv("ZPP_CUDNN_DEBUG");
    return e && strcmp(e, "1") == 0;
}

static void print_trace(const char *title, const zpp_attn_cudnn *ctx) {
    const char *t = zpp_attn_cudnn_trace(ctx);
    fprintf(stderr, "  ---- cuDNN trace (%s) ----\n%s  ----\n", title, t[0] ? t : "  (empty)\n");
}

/* ---- one problem ---------------------------------------------------------- */

typedef struct problem {
    int B, T, H, KV, hs;
    size_t N, C, W; /* rows, H hs, the qkv row (H + 2 KV) hs */
    uint16_t *qkv, *dy;
    uint16_t *y_o, *y_c, *dqkv_o, *dqkv_c; /* ours, cuDNN's */
    float *lse_o, *lse_c;
    zpp_test_dbuf d_qkv, d_dy, d_y, d_lse, d_dqkv, d_dsum, d_y2, d_lse2;
} problem;

static problem problem_make(int B, int T, int H, int KV, int hs, uint64_t seed) {
    problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.T = T, p.H = H, p.KV = KV, p.hs = hs;
    p.N = (size_t)B * T, p.C = (size_t)H * hs, p.W = p.C + 2 * (size_t)KV * hs;
    size_t nqkv = p.N * p.W, ny = p.N * p.C, nl = (size_t)B * H * T;
    p.qkv = zpp_test_malloc(nqkv * 2), p.dy = zpp_test_malloc(ny * 2);
    p.y_o = zpp_test_malloc(ny * 2), p.y_c = zpp_test_malloc(ny * 2);
    p.dqkv_o = zpp_test_malloc(nqkv * 2), p.dqkv_c = zpp_test_malloc(nqkv * 2);
    p.lse_o = zpp_test_malloc(nl * 4), p.lse_c = zpp_test_malloc(nl * 4);
    zpp_rng r = zpp_rng_make(seed);
    for (size_t n = 0; n < p.N; n++)
        for (size_t col = 0; col < p.W; col++)
            p.qkv[n * p.W + col] =
                zpp_f32_to_bf16((float)((col < p.C ? 1.5 : 1.0) * zpp_rng_normal(&r)));
    for (size_t i = 0; i < ny; i++) p.dy[i] = zpp_f32_to_bf16((float)zpp_rng_normal(&r));
    p.d_qkv = zpp_test_dbuf_make(dev, nqkv * 2), p.d_dy = zpp_test_dbuf_make(dev, ny * 2);
    p.d_y = zpp_test_dbuf_make(dev, ny * 2), p.d_lse = zpp_test_dbuf_make(dev, nl * 4);
    p.d_y2 = zpp_test_dbuf_make(dev, ny * 2), p.d_lse2 = zpp_test_dbuf_make(dev, nl * 4);
    p.d_dqkv = zpp_test_dbuf_make(dev, nqkv * 2), p.d_dsum = zpp_test_dbuf_make(dev, nl * 4);
    zpp_test_dbuf_put(&p.d_qkv, p.qkv);
    zpp_test_dbuf_put(&p.d_dy, p.dy);
    return p;
}

static void problem_free(problem *p) {
    free(p->qkv), free(p->dy), free(p->y_o), free(p->y_c), free(p->dqkv_o), free(p->dqkv_c);
    free(p->lse_o), free(p->lse_c);
    zpp_test_dbuf *b[] = {&p->d_qkv, &p->d_dy,   &p->d_y,  &p->d_lse,
                          &p->d_dqkv, &p->d_dsum, &p->d_y2, &p->d_lse2};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) zpp_test_dbuf_free(b[i]);
}

static double bf(uint16_t x) { return (double)zpp_bf16_to_f32(x); }

/* ---- the double-precision reference -------------------------------------- */

typedef struct reference {
    double *y, *ay, *lse;   /* y, its magnitude a, lse */
    double *dqkv, *adqkv;   /* gradients in the qkv layout, their magnitudes */
} reference;

/* One (b, h): forward into r, and the backward's contributions (dK, dV of
 * the shared head accumulate over the group). y_in is the forward output
 * the backward is given (bf16, cuDNN's). */
static void reference_head(const problem *p, int b, int h, const uint16_t *y_in, reference *r,
                           double *P, double *dP) {
    const int T = p->T, hs = p->hs, g = h / (p->H / p->KV);
    const double c = 1.0 / sqrt((double)hs);
    const size_t qo = (size_t)h * hs, ko = p->C + (size_t)g * hs, vo = ko + (size_t)p->KV * hs;
#define AT(arr, t, col) (arr)[((size_t)b * T + (t)) * p->W + (col)]
    for (int i = 0; i < T; i++) {
        double m = -INFINITY, l = 0;
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int d = 0; d < hs; d++) s += bf(AT(p->qkv, i, qo + d)) * bf(AT(p->qkv, j, ko + d));
            P[(size_t)i * T + j] = s * c;
            if (s * c > m) m = s * c;
        }
        for (int j = 0; j <= i; j++) l += exp(P[(size_t)i * T + j] - m);
        r->lse[((size_t)b * p->H + h) * T + i] = m + log(l);
        for (int j = 0; j <= i; j++) P[(size_t)i * T + j] = exp(P[(size_t)i * T + j] - m) / l;
        const size_t yrow = ((size_t)b * T + i) * p->C + qo;
        double D = 0;
        for (int d = 0; d < hs; d++) {
            double acc = 0, mag = 0;
            for (int j = 0; j <= i; j++) {
                double v = bf(AT(p->qkv, j, vo + d));
                acc += P[(size_t)i * T + j] * v, mag += P[(size_t)i * T + j] * fabs(v);
            }
            r->y[yrow + d] = acc, r->ay[yrow + d] = mag;
            D += bf(p->dy[yrow + d]) * bf(y_in[yrow + d]);
        }
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int d = 0; d < hs; d++) s += bf(p->dy[yrow + d]) * bf(AT(p->qkv, j, vo + d));
            dP[(size_t)i * T + j] = s;
        }
        for (int j = 0; j <= i; j++) {
            const double pij = P[(size_t)i * T + j], dpij = dP[(size_t)i * T + j];
            const double ds = pij * (dpij - D), mg = pij * (fabs(dpij) + fabs(D));
            for (int d = 0; d < hs; d++) {
                const double dyv = bf(p->dy[yrow + d]);
                const double qv = bf(AT(p->qkv, i, qo + d)), kv = bf(AT(p->qkv, j, ko + d));
                AT(r->dqkv, i, qo + d) += c * ds * kv, AT(r->adqkv, i, qo + d) += c * mg * fabs(kv);
                AT(r->dqkv, j, ko + d) += c * ds * qv, AT(r->adqkv, j, ko + d) += c * mg * fabs(qv);
                AT(r->dqkv, j, vo + d) += pij * dyv, AT(r->adqkv, j, vo + d) += pij * fabs(dyv);
            }
        }
    }
#undef AT
}

static reference reference_make(const problem *p, const uint16_t *y_in) {
    reference r;
    size_t ny = p->N * p->C, nq = p->N * p->W;
    r.y = calloc(ny, sizeof(double)), r.ay = calloc(ny, sizeof(double));
    r.lse = calloc((size_t)p->B * p->H * p->T, sizeof(double));
    r.dqkv = calloc(nq, sizeof(double)), r.adqkv = calloc(nq, sizeof(double));
    double *P = calloc((size_t)p->T * p->T, sizeof(double));
    double *dP = calloc((size_t)p->T * p->T, sizeof(double));
    EXPECT(r.y && r.ay && r.lse && r.dqkv && r.adqkv && P && dP, "out of host memory");
    for (int b = 0; b < p->B; b++)
        for (int h = 0; h < p->H; h++) reference_head(p, b, h, y_in, &r, P, dP);
    free(P), free(dP);
    return r;
}

static void reference_free(reference *r) {
    free(r->y), free(r->ay), free(r->lse), free(r->dqkv), free(r->adqkv);
}

/* ---- comparisons ---------------------------------------------------------- */

/* Elementwise |got - ref| <= 4u (a + |ref|) over n values; prints the worst
 * ratio error / bound and max err / max|ref|. */
static void check_ref(const char *label, const char *name, const uint16_t *got,
                      const double *ref, const double *mag, size_t n, size_t stride,
                      size_t off, size_t width) {
    double worst = 0, err_max = 0, ref_max = 0;
    size_t at = 0;
    for (size_t e = 0; e < n; e++) {
        size_t i = (e / width) * stride + off + e % width;
        double err = fabs(bf(got[i]) - ref[i]), bound = 4 * U_BF16 * (mag[i] + fabs(ref[i]));
        if (!(err <= bound)) {
            zpp_test_fail(__FILE__, __LINE__, NULL,
                          "%s %s: element %zu is %.6g, reference %.6g (error %.3g > bound %.3g)",
                          label, name, i, bf(got[i]), ref[i], err, bound);
        }
        double ratio = bound > 0 ? err / bound : 0;
        if (ratio > worst) worst = ratio, at = i;
        if (err > err_max) err_max = err;
        if (fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
    }
    printf("    vs reference %-3s: worst err/bound %.3f (at %zu), max err / max|ref| %.2e\n", name,
           worst, at, ref_max > 0 ? err_max / ref_max : 0);
}

static void check_reference(const problem *p, const char *label) {
    reference r = reference_make(p, p->y_c);
    const size_t Ck = (size_t)p->KV * p->hs;
    check_ref(label, "y", p->y_c, r.y, r.ay, p->N * p->C, p->C, 0, p->C);
    check_ref(label, "dQ", p->dqkv_c, r.dqkv, r.adqkv, p->N * p->C, p->W, 0, p->C);
    check_ref(label, "dK", p->dqkv_c, r.dqkv, r.adqkv, p->N * Ck, p->W, p->C, Ck);
    check_ref(label, "dV", p->dqkv_c, r.dqkv, r.adqkv, p->N * Ck, p->W, p->C + Ck, Ck);
    double lmax = 0;
    for (size_t i = 0; i < (size_t)p->B * p->H * p->T; i++) {
        double e = fabs((double)p->lse_c[i] - r.lse[i]);
        EXPECT(e <= 1e-3, "%s lse[%zu] = %.7g, reference %.7g", label, i, p->lse_c[i], r.lse[i]);
        if (e > lmax) lmax = e;
    }
    printf("    vs reference lse: max |err| %.2e (bound 1e-3)\n", lmax);
    reference_free(&r);
}

/* cuDNN's outputs against ours (bounds in the header comment). */
static void check_ours(const problem *p, const char *label) {
    double vmax = 0, ymax = 0, ey = 0, lmax = 0;
    for (size_t n = 0; n < p->N; n++)
        for (size_t c = p->C + (size_t)p->KV * p->hs; c < p->W; c++)
            vmax = fmax(vmax, fabs(bf(p->qkv[n * p->W + c])));
    for (size_t i = 0; i < p->N * p->C; i++) {
        double a = bf(p->y_c[i]), b = bf(p->y_o[i]), bound = 8 * U_BF16 * (vmax + fabs(b));
        EXPECT(fabs(a - b) <= bound, "%s y[%zu]: cuDNN %.6g, ours %.6g (bound %.3g)", label, i, a,
               b, bound);
        ey = fmax(ey, fabs(a - b)), ymax = fmax(ymax, fabs(b));
    }
    for (size_t i = 0; i < (size_t)p->B * p->H * p->T; i++) {
        double e = fabs((double)p->lse_c[i] - p->lse_o[i]);
        EXPECT(e <= 1e-3, "%s lse[%zu]: cuDNN %.7g, ours %.7g", label, i, p->lse_c[i], p->lse_o[i]);
        lmax = fmax(lmax, e);
    }
    const char *names[3] = {"dQ", "dK", "dV"};
    const size_t Ck = (size_t)p->KV * p->hs, off[3] = {0, p->C, p->C + Ck}, w[3] = {p->C, Ck, Ck};
    printf("    vs ours: y max|diff| %.2e (max|y| %.2e), lse %.2e", ey, ymax, lmax);
    for (int k = 0; k < 3; k++) {
        double mx = 0, e = 0;
        for (size_t n = 0; n < p->N; n++)
            for (size_t c = off[k]; c < off[k] + w[k]; c++)
                mx = fmax(mx, fabs(bf(p->dqkv_o[n * p->W + c])));
        for (size_t n = 0; n < p->N; n++)
            for (size_t c = off[k]; c < off[k] + w[k]; c++) {
                double a = bf(p->dqkv_c[n * p->W + c]), b = bf(p->dqkv_o[n * p->W + c]);
                EXPECT(fabs(a - b) <= 0x1p-4 * mx, "%s %s row %zu col %zu: cuDNN %.6g, ours %.6g "
                       "(bound %.3g)", label, names[k], n, c, a, b, 0x1p-4 * mx);
                e = fmax(e, fabs(a - b));
            }
        printf(", %s %.2e (of max %.2e)", names[k], e, mx);
    }
    printf("\n");
}

/* ---- running both ------------------------------------------------------------ */

static void run_ours(problem *p) {
    zpp_test_dbuf_poison(&p->d_y2), zpp_test_dbuf_poison(&p->d_lse2);
    EXPECT_OK(zpp_attn_gqa_forward(p->d_y2.p, p->d_lse2.p, p->d_qkv.p, p->B, p->T, p->H, p->KV,
                                   p->hs, dev->stream));
    zpp_test_dbuf_get(&p->d_y2, p->y_o, "our y");
    zpp_test_dbuf_get(&p->d_lse2, p->lse_o, "our lse");
    zpp_test_dbuf_poison(&p->d_dqkv);
    EXPECT_OK(zpp_attn_gqa_backward(p->d_dqkv.p, p->d_dy.p, p->d_qkv.p, p->d_y2.p, p->d_lse2.p,
                                    p->d_dsum.p, p->B, p->T, p->H, p->KV, p->hs, dev->stream));
    zpp_test_dbuf_get(&p->d_dqkv, p->dqkv_o, "our dqkv");
}

/* cuDNN forward then backward (from its own y, lse), each twice: the same
 * bytes each time. */
static void run_cudnn(problem *p, zpp_attn_cudnn *ctx, void *ws, const char *label) {
    size_t ny = p->N * p->C * 2, nl = (size_t)p->B * p->H * p->T * 4, nq = p->N * p->W * 2;
    uint16_t *y1 = zpp_test_malloc(ny), *dq1 = zpp_test_malloc(nq);
    float *l1 = zpp_test_malloc(nl);
    for (int rep = 0; rep < 2; rep++) {
        zpp_test_dbuf_poison(&p->d_y), zpp_test_dbuf_poison(&p->d_lse);
        EXPECT_OK(zpp_attn_cudnn_forward(ctx, p->d_y.p, p->d_lse.p, p->d_qkv.p, p->B, ws));
        zpp_test_dbuf_get(&p->d_y, p->y_c, "cuDNN y");
        zpp_test_dbuf_get(&p->d_lse, p->lse_c, "cuDNN lse");
        zpp_test_dbuf_poison(&p->d_dqkv);
        EXPECT_OK(zpp_attn_cudnn_backward(ctx, p->d_dqkv.p, p->d_dy.p, p->d_qkv.p, p->d_y.p,
                                          p->d_lse.p, p->B, ws));
        zpp_test_dbuf_get(&p->d_dqkv, p->dqkv_c, "cuDNN dqkv");
        if (rep == 0) {
            memcpy(y1, p->y_c, ny), memcpy(l1, p->lse_c, nl), memcpy(dq1, p->dqkv_c, nq);
            continue;
        }
        EXPECT(memcmp(y1, p->y_c, ny) == 0, "%s: two cuDNN forwards gave different y", label);
        EXPECT(memcmp(l1, p->lse_c, nl) == 0, "%s: two cuDNN forwards gave different lse", label);
        EXPECT(memcmp(dq1, p->dqkv_c, nq) == 0,
               "%s: two cuDNN backwards gave different dqkv: the engine is not deterministic",
               label);
    }
    printf("    forward and backward bitwise repeatable\n");
    free(y1), free(dq1), free(l1);
}

/* ---- timing (printed, never asserted) ------------------------------------ */

enum { OURS_FWD, OURS_BWD, CUDNN_FWD, CUDNN_BWD };

static void launch(problem *p, zpp_attn_cudnn *ctx, void *ws, int which) {
    switch (which) {
    case OURS_FWD:
        EXPECT_OK(zpp_attn_gqa_forward(p->d_y2.p, p->d_lse2.p, p->d_qkv.p, p->B, p->T, p->H,
                                       p->KV, p->hs, dev->stream));
        break;
    case OURS_BWD:
        EXPECT_OK(zpp_attn_gqa_backward(p->d_dqkv.p, p->d_dy.p, p->d_qkv.p, p->d_y2.p,
                                        p->d_lse2.p, p->d_dsum.p, p->B, p->T, p->H, p->KV, p->hs,
                                        dev->stream));
        break;
    case CUDNN_FWD:
        EXPECT_OK(zpp_attn_cudnn_forward(ctx, p->d_y.p, p->d_lse.p, p->d_qkv.p, p->B, ws));
        break;
    default:
        EXPECT_OK(zpp_attn_cudnn_backward(ctx, p->d_dqkv.p, p->d_dy.p, p->d_qkv.p, p->d_y.p,
                                          p->d_lse.p, p->B, ws));
    }
}

static double time_ms(problem *p, zpp_attn_cudnn *ctx, void *ws, int which) {
    enum { WARM = 2, REPS = 10 };
    zpp_device_event *e0 = NULL, *e1 = NULL;
    EXPECT_OK(zpp_device_event_create(dev, 1, &e0));
    EXPECT_OK(zpp_device_event_create(dev, 1, &e1));
    for (int i = 0; i < WARM; i++) launch(p, ctx, ws, which);
    EXPECT_OK(zpp_device_event_record(dev, e0, dev->stream));
    for (int i = 0; i < REPS; i++) launch(p, ctx, ws, which);
    EXPECT_OK(zpp_device_event_record(dev, e1, dev->stream));
    EXPECT_OK(zpp_device_sync(dev, NULL));
    float ms = 0;
    EXPECT_OK(zpp_device_event_elapsed_ms(dev, e0, e1, &ms));
    zpp_device_event_destroy(dev, e0), zpp_device_event_destroy(dev, e1);
    return ms / REPS;
}

static void print_timing(problem *p, zpp_attn_cudnn *ctx, void *ws) {
    const double fwd = 4.0 * p->B * p->H * (double)p->T * p->T * p->hs / 2, bwd = 2.5 * fwd;
    double t[4];
    for (int w = 0; w < 4; w++) t[w] = time_ms(p, ctx, ws, w);
    printf("    timing: forward ours %.3f ms (%.0f TFLOP/s), cuDNN %.3f ms (%.0f TFLOP/s), "
           "x%.2f; backward ours %.3f ms (%.0f TFLOP/s), cuDNN %.3f ms (%.0f TFLOP/s), x%.2f\n",
           t[OURS_FWD], fwd / t[OURS_FWD] * 1e-9, t[CUDNN_FWD], fwd / t[CUDNN_FWD] * 1e-9,
           t[OURS_FWD] / t[CUDNN_FWD], t[OURS_BWD], bwd / t[OURS_BWD] * 1e-9, t[CUDNN_BWD],
           bwd / t[CUDNN_BWD] * 1e-9, t[OURS_BWD] / t[CUDNN_BWD]);
}

/* ---- the cases ------------------------------------------------------------- */

/* A batch below the context's: plans made on first use; its y within the
 * bound of the full batch's first sequence. */
static void check_smaller_batch(problem *p, zpp_attn_cudnn *ctx, void *ws) {
    zpp_test_dbuf_poison(&p->d_y2), zpp_test_dbuf_poison(&p->d_lse2);
    EXPECT_OK(zpp_attn_cudnn_forward(ctx, p->d_y2.p, p->d_lse2.p, p->d_qkv.p, 1, ws));
    uint16_t *y = zpp_test_malloc(p->N * p->C * 2);
    EXPECT_OK(zpp_device_sync(dev, NULL));
    EXPECT_OK(zpp_device_copy(dev, y, p->d_y2.p, (size_t)p->T * p->C * 2));
    double e = 0;
    for (size_t i = 0; i < (size_t)p->T * p->C; i++) {
        double a = bf(y[i]), b = bf(p->y_c[i]);
        EXPECT(fabs(a - b) <= 8 * U_BF16 * (4 + fabs(b)), "B=1 y[%zu] %.6g vs B=2 %.6g", i, a, b);
        e = fmax(e, fabs(a - b));
    }
    printf("    batch 1 through the same context: y max|diff| from batch 2's %.2e\n", e);
    free(y);
}

/* One shape; must: a refusal fails the test (else it is reported). */
static void run_case(int B, int T, int H, int KV, int hs, int must, uint64_t seed) {
    char label[96];
    snprintf(label, sizeof label, "B=%d T=%d H=%d KV=%d hs=%d", B, T, H, KV, hs);
    printf("  %s\n", label);
    fflush(stdout);
    zpp_attn_cudnn *ctx = NULL;
    size_t wsb = 0;
    zpp_error_clear();
    zpp_status st = zpp_attn_cudnn_create(&ctx, B, T, H, KV, hs, dev->stream, &wsb);
    if (st != ZPP_OK) {
        fprintf(stderr, "  !!!! cuDNN REFUSES %s: %s: %s\n", label, zpp_status_str(st),
                zpp_last_error());
        print_trace(label, NULL);
        EXPECT(!must, "cuDNN refused %s, a shape the models need (message above)", label);
        printf("    (refused: the caller keeps our kernels for this shape)\n");
        return;
    }
    if (debug_on()) print_trace(label, ctx);
    printf("    workspace %.2f MiB\n", (double)wsb / (1 << 20));
    problem p = problem_make(B, T, H, KV, hs, seed);
    void *ws = NULL;
    EXPECT_OK(zpp_device_alloc(dev, wsb, &ws));
    run_ours(&p);
    run_cudnn(&p, ctx, ws, label);
    if (T <= 256) check_reference(&p, label);
    check_ours(&p, label);
    if (T <= 256 && H == 4) check_smaller_batch(&p, ctx, ws);
    print_timing(&p, ctx, ws);
    zpp_device_free(dev, ws);
    zpp_attn_cudnn_free(ctx);
    problem_free(&p);
    fflush(stdout);
}

static void run_cases(int grouped) {
    dev = zpp_test_gpu_open("test_attention_cudnn checks cuDNN's attention on the GPU");
    static const int Ts[] = {256, 1024}, Hs[] = {4, 12}, hss[] = {64, 128};
    uint64_t k = grouped ? 1000 : 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++, k++)
                run_case(2, Ts[a], Hs[b], grouped ? Hs[b] / 4 : Hs[b], hss[c], !grouped,
                         zpp_test_seed(k));
    EXPECT_OK(zpp_device_sync(dev, NULL));
    zpp_device_destroy(dev);
    dev = NULL;
}

/* Multi-head (GPT-2): every shape must be accepted. */
static void test_cudnn_multihead(void) { run_cases(0); }

/* Grouped queries (Llama): refusals are reported, not failed. */
static void test_cudnn_grouped(void) { run_cases(1); }

static void test_cudnn_refusals(void) {
    dev = zpp_test_gpu_open("test_attention_cudnn checks cuDNN's attention on the GPU");
    zpp_attn_cudnn *ctx = NULL;
    size_t ws = 0;
    EXPECT_STATUS(zpp_attn_cudnn_create(&ctx, 1, 16, 4, 3, 64, dev->stream, &ws), ZPP_ERR_INVALID);
    EXPECT(ctx == NULL && ws == 0, "a refused create left a context");
    EXPECT_STATUS(zpp_attn_cudnn_create(&ctx, 1, 16, 4, 4, 36, dev->stream, &ws),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT_STATUS(zpp_attn_cudnn_create(&ctx, 0, 16, 4, 4, 64, dev->stream, &ws), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_cudnn_create(NULL, 1, 16, 4, 4, 64, dev->stream, &ws), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_cudnn_forward(NULL, NULL, NULL, NULL, 1, NULL), ZPP_ERR_INVALID);
    zpp_status st = zpp_attn_cudnn_create(&ctx, 1, 64, 2, 2, 64, dev->stream, &ws);
    if (st != ZPP_OK) print_trace("refusals", NULL);
    EXPECT(st == ZPP_OK, "create B=1 T=64 H=2 hs=64: %s", zpp_last_error());
    EXPECT(zpp_attn_cudnn_workspace(ctx) == ws, "workspace %zu vs %zu",
           zpp_attn_cudnn_workspace(ctx), ws);
    problem p = problem_make(1, 64, 2, 2, 64, zpp_test_seed(77));
    void *w = NULL;
    EXPECT_OK(zpp_device_alloc(dev, ws, &w));
    EXPECT_STATUS(zpp_attn_cudnn_forward(ctx, p.d_y.p, p.d_lse.p, p.d_qkv.p, 2, w),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_cudnn_forward(ctx, NULL, p.d_lse.p, p.d_qkv.p, 1, w), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_cudnn_forward(ctx, (char *)p.d_y.p + 2, p.d_lse.p, p.d_qkv.p, 1, w),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_cudnn_backward(ctx, p.d_dqkv.p, p.d_dy.p, p.d_qkv.p, p.d_y.p,
                                          p.d_lse.p, 1, NULL),
                  ZPP_ERR_INVALID);
    zpp_device_free(dev, w);
    problem_free(&p);
    zpp_attn_cudnn_free(ctx);
    zpp_attn_cudnn_free(NULL);
    EXPECT_OK(zpp_device_sync(dev, NULL));
    zpp_device_destroy(dev);
    dev = NULL;
}

ZPP_TESTS(ZPP_TEST_GPU(test_cudnn_refusals), ZPP_TEST_GPU(test_cudnn_multihead),
          ZPP_TEST_GPU(test_cudnn_grouped))

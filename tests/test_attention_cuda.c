/* test_attention_cuda.c — the fused causal attention (src/model/
 * attention_cuda.cu), forward and backward, against a double-precision CPU
 * reference on the same bf16 inputs.
 *
 * Inputs are fresh each run (the seed is printed; ZPP_TEST_SEED replays
 * it): q, k, v, dy ~ N(0, 1) rounded to bf16, q times an amplitude 1..4 so
 * that some cases have sharp softmax rows whose running max moves from key
 * tile to key tile. Shapes cover hs 64 and 128, B = 1 and B > 1, one and
 * several heads, T = 1, T a multiple of the 64-row tiles, ragged T (77, 129,
 * 200, 333) and a long T (1024: 16 tiles of running softmax). Every output
 * buffer is poisoned (0xFF bytes: bf16 and fp32 NaN) before the call and
 * has a poisoned guard zone after it, so an element left unwritten fails
 * the comparison and a write past the end fails the guard check; inputs
 * carry NaN guard zones too (an out-of-bounds read poisons a result).
 *
 * THE ERROR BOUND, element by element, from the roundings the kernels do
 * (u = 2^-8, the unit roundoff of bf16: 8 significant bits, so
 * |bf16(x) - x| <= 2^-8 |x|; w = 2^-24, that of fp32). The reference is
 * exact for practical purposes (double). Notation: c = 1/sqrt(hs), n the
 * number of summed terms, rows i (queries), keys j <= i, P_ij and S_ij the
 * exact probabilities and scaled scores, M_i = max_j |S_ij|.
 *
 *  Scores. The tensor cores multiply bf16 exactly and accumulate in fp32;
 *  allowing truncating adds (2w per add) and the scale multiply, the scaled
 *  score's error is at most
 *      E_ij = 4 (hs + 2) w c sum_d |q_id k_jd|.
 *  The exponentials (exp2f: 2 ulp) and the fp32 arguments x - m (which
 *  carry relative error w of |S| and of the row max) add
 *      e_ij = E_ij + 2^-20 (1 + |S_ij| + M_i)
 *  to the relative error of every unnormalised weight exp(S_ij - m).
 *
 *  y. The kernel computes y = sum_j bf16(p_j) v_j / l with p_j the fp32
 *  weights and l their fp32 sum (the online rescalings multiply O and l by
 *  the same computed factor, so they cancel in the ratio). Rounding p_j to
 *  bf16 moves y by at most u sum_j P_ij |v_jd| =: u A_id; the p_j errors by
 *  at most 2 max_j e_ij A_id (a relative error of every weight, and of
 *  their sum); the fp32 sums by (2n + 64) w A_id; the final bf16 rounding by
 *  u |y_id|. So, with second-order terms under the factor 1 + 2^-6,
 *      |y~ - y| <= (1 + 2^-6) [ (u + 2 e_i + (2n + 64) w) A_id + u |y_id| ].
 *  The P-rounding term dominates; a uniform 2^-9 (or 2^-8) of |y| would be
 *  wrong, since A_id can be much larger than |y_id| (cancelling sums).
 *
 *  lse = m + log l: perturbing every score by at most e_i moves it by at
 *  most e_i; the fp32 sum of n weights, log2f and the last operations add
 *  (2n + 64) w + 2^-20 (1 + |lse|); the bound is twice that (lse is not
 *  rounded to bf16, so its bound is fp32-sized: 1e-4 or less).
 *
 *  Backward (given the forward's y~ and lse~ as the model gives them):
 *   - D~_i = fl32(sum_d dy_id y~_id): off the exact D_i = dy_i . y_i by
 *     eD_i = |sum_d dy_id (y~_id - y_id)| + 2 (hs + 2) w sum_d |dy_id y~_id|
 *     (the first term computed from the observed y~ error: exact).
 *   - P~_ij = exp2(x_ij - lse~_i log2 e): relative error
 *     eP_ij = E_ij + |lse~_i - lse_i| + 2^-20 (1 + |S_ij| + |lse_i|).
 *   - dP~_ij = fl32(dy_i . v_j): off by edP_ij = 4 (hs + 2) w sum_d |dy_id v_jd|.
 *   - dS~ = P~ (dP~ - D~): off by
 *     eS_ij = eP_ij P_ij |dP_ij - D_i| + P_ij (edP_ij + eD_i) + 2 w |dS_ij|,
 *     then rounded to bf16 (u |dS_ij|) as the operand of dS K and dS^T Q.
 *   - dV_jd = sum_i bf16(P~_ij) dy_id:
 *     |dV~ - dV| <= (1 + 2^-6) [ sum_i P_ij |dy_id| (u + eP_ij + 2 (n + 2) w) + u |dV_jd| ]
 *   - dQ_id = c sum_j bf16(dS~_ij) k_jd (dK: c sum_i dS~_ij q_id alike):
 *     |dQ~ - dQ| <= (1 + 2^-6) [ c sum_j (u |dS_ij| + (1 + u) eS_ij
 *                                         + 2 (n + 2) w |dS_ij|) |k_jd|
 *                                 + (u + 2 w) |dQ_id| ]
 *  Every comparison is  |gpu - ref| <= bound  (NaN fails) and prints the
 *  largest observed/bound ratio per output. Each term above is a strict
 *  bound on its rounding, so the sum is never exceeded; it is reached
 *  nearly only where few terms add up: the first rows of a sequence (1-3
 *  keys) and their dQ, the last keys' dK, dV. There the largest ratio of a
 *  case is typically 0.5-0.95 (measured under a host emulation of the
 *  kernels, whose roundings are the GPU's bf16 ones; long rows stay far
 *  below, as random-sign errors add up like a random walk). The lse bound
 *  is loose (ratios ~1e-3: its fp32 worst case, ~1e-4 absolute, against
 *  observed ~1e-7) but a wrong lse is off by O(1). A real bug (a wrong
 *  fragment, mask, tile range, scale or D) moves elements by about their
 *  own size, 10-1000x the bound: each of 17 such bugs injected into the
 *  kernels failed this test under the emulation. The "max err / max|ref|"
 *  figure printed next to each ratio is the largest error over the largest
 *  reference magnitude of that output (expect a few 1e-3: bf16).
 *
 * Grouped queries (KV key/value heads shared by H / KV query heads each):
 * the same reference with query head h reading key/value head h / (H / KV),
 * and a shared head's dK, dV the sum over its group (the bound's sums run
 * over all G (T - j) terms, added in fp32 before one bf16 rounding); and
 * bitwise, y, lse and dQ equal those of the multi-head problem whose k / v
 * heads are copies for every query head (the same arithmetic per query
 * head). Multi-head (KV = H) is GPT-2's path: with a group of one, every
 * kernel walks, loads and sums as before grouped queries existed.
 *
 * Also checked: bitwise determinism (forward and backward each run twice
 * on the same inputs give the same bytes), the refusals (head size 48 and
 * other unsupported sizes, NULL and misaligned pointers, empty shapes), and
 * timings for B=4 T=1024 H=16 hs=128 and B=8 T=1024 H=12 hs=64, printed,
 * never asserted.
 *
 * Needs an NVIDIA GPU (label "gpu"); without one it fails saying so. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "device/device_caps.h"
#include "model/attention_cuda.h"
#include "cuda_testlib.h"
#include "testlib.h"

#define U_BF16 0x1p-8 /* unit roundoff of bf16 */
#define U_F32 0x1p-24 /* unit roundoff of fp32 */
#define SECOND_ORDER (1.0 + 0x1p-6)

/* ---- device plumbing ----------------------------------------------------------
 * Memory, copies and synchronisation go through a GPU device (device.h); the
 * attention calls run on that device's compute stream, ordered after its
 * copies and sets. */

static zpp_device *dev; /* GPU 0, for the running test */
static int dev_cc;      /* its compute capability, 10 * major + minor */

/* The kernels need compute capability 8.0: below, a case that runs them
 * skips (the model takes its GEMM path there, which test_gpt2_cuda checks),
 * and test_refusals checks that they refuse. */
static void dev_open_for(int runs_kernels) {
    dev = zpp_test_gpu_open("test_attention_cuda checks GPU kernels");
    int major = 0, minor = 0;
    EXPECT_OK(zpp_device_compute_capability(dev, &major, &minor));
    dev_cc = 10 * major + minor;
    if (runs_kernels && dev_cc < ZPP_CC_BF16)
        zpp_test_skip("the fused attention needs compute capability 8.0 or newer and GPU 0 is "
                      "%d.%d; the model uses its GEMM attention there "
                      "(test_gpt2_cuda.test_attention_gemm_matches_cpu)",
                      major, minor);
}

static void dev_open(void) { dev_open_for(1); }

static void dev_close(void) {
    EXPECT_OK(zpp_device_sync(dev, NULL));
    zpp_device_destroy(dev);
    dev = NULL;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) zpp_test_fail(__FILE__, __LINE__, NULL, "out of host memory (%zu x %zu)", n, size);
    return p;
}

/* ---- one problem: inputs, device buffers, outputs -------------------------------- */

typedef struct attn_case {
    int B, T, H, hs;
    double amp; /* q is amp * N(0, 1): larger means sharper softmax rows */
    int KV;     /* key/value heads (grouped queries); 0: H, multi-head */
} attn_case;

static int kv_heads(const attn_case *c) { return c->KV ? c->KV : c->H; }

typedef struct problem {
    attn_case c;
    size_t N, C, W;         /* rows B*T, channels H*hs, qkv row (H + 2 KV) hs */
    uint16_t *qkv, *dy;     /* host inputs (bf16) */
    uint16_t *y, *dqkv;     /* host copies of the outputs */
    float *lse;
    zpp_test_dbuf d_qkv, d_dy, d_y, d_lse, d_dqkv, d_dsum;
} problem;

static problem problem_make(attn_case c, uint64_t seed) {
    problem p;
    memset(&p, 0, sizeof p);
    p.c = c;
    p.N = (size_t)c.B * c.T;
    p.C = (size_t)c.H * c.hs;
    p.W = p.C + 2 * (size_t)kv_heads(&c) * c.hs;
    size_t nqkv = p.N * p.W, ny = p.N * p.C, nl = (size_t)c.B * c.H * c.T;
    p.qkv = zpp_test_malloc(nqkv * 2);
    p.dy = zpp_test_malloc(ny * 2);
    p.y = zpp_test_malloc(ny * 2);
    p.dqkv = zpp_test_malloc(nqkv * 2);
    p.lse = zpp_test_malloc(nl * sizeof(float));
    zpp_rng r = zpp_rng_make(seed);
    for (size_t n = 0; n < p.N; n++)
        for (size_t col = 0; col < p.W; col++) {
            double a = col < p.C ? c.amp : 1.0;
            p.qkv[n * p.W + col] = zpp_f32_to_bf16((float)(a * zpp_rng_normal(&r)));
        }
    for (size_t i = 0; i < ny; i++) p.dy[i] = zpp_f32_to_bf16((float)zpp_rng_normal(&r));
    p.d_qkv = zpp_test_dbuf_make(dev, nqkv * 2);
    p.d_dy = zpp_test_dbuf_make(dev, ny * 2);
    p.d_y = zpp_test_dbuf_make(dev, ny * 2);
    p.d_lse = zpp_test_dbuf_make(dev, nl * sizeof(float));
    p.d_dqkv = zpp_test_dbuf_make(dev, nqkv * 2);
    p.d_dsum = zpp_test_dbuf_make(dev, nl * sizeof(float));
    zpp_test_dbuf_put(&p.d_qkv, p.qkv);
    zpp_test_dbuf_put(&p.d_dy, p.dy);
    return p;
}

static void problem_free(problem *p) {
    free(p->qkv), free(p->dy), free(p->y), free(p->dqkv), free(p->lse);
    zpp_test_dbuf_free(&p->d_qkv), zpp_test_dbuf_free(&p->d_dy), zpp_test_dbuf_free(&p->d_y);
    zpp_test_dbuf_free(&p->d_lse), zpp_test_dbuf_free(&p->d_dqkv), zpp_test_dbuf_free(&p->d_dsum);
}

static void run_forward(problem *p) {
    zpp_test_dbuf_poison(&p->d_y);
    zpp_test_dbuf_poison(&p->d_lse);
    EXPECT_OK(zpp_attn_gqa_forward(p->d_y.p, p->d_lse.p, p->d_qkv.p, p->c.B, p->c.T, p->c.H,
                                   kv_heads(&p->c), p->c.hs, dev->stream));
    zpp_test_dbuf_get(&p->d_y, p->y, "y");
    zpp_test_dbuf_get(&p->d_lse, p->lse, "lse");
}

/* Uses the forward's y and lse as they are on the device (as the model does). */
static void run_backward(problem *p) {
    zpp_test_dbuf_poison(&p->d_dqkv);
    zpp_test_dbuf_poison(&p->d_dsum);
    EXPECT_OK(zpp_attn_gqa_backward(p->d_dqkv.p, p->d_dy.p, p->d_qkv.p, p->d_y.p, p->d_lse.p,
                                    p->d_dsum.p, p->c.B, p->c.T, p->c.H, kv_heads(&p->c),
                                    p->c.hs, dev->stream));
    zpp_test_dbuf_get(&p->d_dqkv, p->dqkv, "dqkv");
}

/* ---- the reference and the comparison ---------------------------------------------- */

/* The worst element of one output: observed error / bound, and the error
 * relative to the output's largest magnitude. */
typedef struct worst {
    const char *name;
    double ratio, err, ref_max;
    int b, h, row, col;
} worst;

static void worst_init(worst *w, const char *name) {
    memset(w, 0, sizeof *w);
    w->name = name;
    w->row = w->col = -1;
}

/* Compares one element; fails at once (with the element) when it is out of
 * bounds or NaN. */
static void check_elem(worst *w, const attn_case *c, int b, int h, int row, int col, double gpu,
                       double ref, double bound) {
    double err = fabs(gpu - ref);
    if (!(err <= bound))
        zpp_test_fail(__FILE__, __LINE__, NULL,
                      "B=%d T=%d H=%d KV=%d hs=%d amp=%g: %s[b=%d, h=%d, row %d, col %d] = "
                      "%.9g, reference %.9g: error %.3g > bound %.3g",
                      c->B, c->T, c->H, kv_heads(c), c->hs, c->amp, w->name, b, h, row, col, gpu, ref, err,
                      bound);
    double ratio = bound > 0 ? err / bound : 0.0;
    if (ratio > w->ratio) {
        w->ratio = ratio;
        w->b = b, w->h = h, w->row = row, w->col = col;
    }
    if (err > w->err) w->err = err;
    if (fabs(ref) > w->ref_max) w->ref_max = fabs(ref);
}

static void worst_print(const worst *w) {
    printf("    %-4s max err/bound %.4f (at b=%d h=%d row %d col %d), max err / max|ref| %.2e\n",
           w->name, w->ratio, w->b, w->h, w->row, w->col,
           w->ref_max > 0 ? w->err / w->ref_max : w->err);
}

static double bf(uint16_t x) { return (double)zpp_bf16_to_f32(x); }

/* Checks y and lse (fwd) and, when `bwd`, dqkv, for every (b, h) against the
 * double reference, with the bounds of the header comment. */
static void check_problem(const problem *p, int bwd, const char *label) {
    const attn_case *c = &p->c;
    const int T = c->T, hs = c->hs;
    /* query head h reads key/value head h / G; a shared head's dK, dV sum
     * its group's terms (ak*, av*: the sums and their bounds' sums, G query
     * heads of fp32 accumulation before one bf16 rounding) */
    const int G = c->H / kv_heads(c);
    const size_t C = p->C, C3 = p->W, Ck = (size_t)kv_heads(c) * hs;
    double *akr = xcalloc((size_t)T * hs, 8), *akb = xcalloc((size_t)T * hs, 8),
           *avr = xcalloc((size_t)T * hs, 8), *avb = xcalloc((size_t)T * hs, 8);
    const double sc = 1.0 / sqrt((double)hs), u = U_BF16, w = U_F32;
    double *q = zpp_test_malloc((size_t)T * hs * sizeof(double)), *k = zpp_test_malloc((size_t)T * hs * 8),
           *v = zpp_test_malloc((size_t)T * hs * 8), *g = zpp_test_malloc((size_t)T * hs * 8),
           *yt = zpp_test_malloc((size_t)T * hs * 8), *yg = zpp_test_malloc((size_t)T * hs * 8);
    size_t TT = (size_t)T * T;
    double *S = xcalloc(TT, 8), *P = xcalloc(TT, 8), *E = xcalloc(TT, 8), *dS = xcalloc(TT, 8),
           *eS = xcalloc(TT, 8), *eP = xcalloc(TT, 8);
    double *lse = zpp_test_malloc((size_t)T * 8);
    worst wy, wl, wq, wk, wv;
    worst_init(&wy, "y"), worst_init(&wl, "lse"), worst_init(&wq, "dq");
    worst_init(&wk, "dk"), worst_init(&wv, "dv");
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++) {
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t;
                for (int d = 0; d < hs; d++) {
                    q[(size_t)t * hs + d] = bf(p->qkv[n * C3 + (size_t)h * hs + d]);
                    k[(size_t)t * hs + d] = bf(p->qkv[n * C3 + C + (size_t)(h / G) * hs + d]);
                    v[(size_t)t * hs + d] = bf(p->qkv[n * C3 + C + Ck + (size_t)(h / G) * hs + d]);
                    g[(size_t)t * hs + d] = bf(p->dy[n * C + (size_t)h * hs + d]);
                    yg[(size_t)t * hs + d] = bf(p->y[n * C + (size_t)h * hs + d]);
                }
            }
            /* ---- forward ---- */
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY, am = 0;
                for (int j = 0; j <= i; j++) {
                    double s = 0, sa = 0;
                    for (int d = 0; d < hs; d++) {
                        double t = q[(size_t)i * hs + d] * k[(size_t)j * hs + d];
                        s += t, sa += fabs(t);
                    }
                    S[(size_t)i * T + j] = s * sc;
                    E[(size_t)i * T + j] = 4.0 * (hs + 2) * w * sc * sa;
                    if (s * sc > mx) mx = s * sc;
                    if (fabs(s * sc) > am) am = fabs(s * sc);
                }
                double sum = 0, e = 0;
                for (int j = 0; j <= i; j++) sum += exp(S[(size_t)i * T + j] - mx);
                for (int j = 0; j <= i; j++) {
                    P[(size_t)i * T + j] = exp(S[(size_t)i * T + j] - mx) / sum;
                    double eij = E[(size_t)i * T + j] +
                                 0x1p-20 * (1 + fabs(S[(size_t)i * T + j]) + am);
                    if (eij > e) e = eij;
                }
                lse[i] = mx + log(sum);
                double nterm = (2.0 * (i + 1) + 64) * w;
                for (int d = 0; d < hs; d++) {
                    double y = 0, A = 0;
                    for (int j = 0; j <= i; j++) {
                        y += P[(size_t)i * T + j] * v[(size_t)j * hs + d];
                        A += P[(size_t)i * T + j] * fabs(v[(size_t)j * hs + d]);
                    }
                    yt[(size_t)i * hs + d] = y;
                    double bound = SECOND_ORDER * ((u + 2 * e + nterm) * A + u * fabs(y));
                    check_elem(&wy, c, b, h, i, d, yg[(size_t)i * hs + d], y, bound);
                }
                double lg = p->lse[((size_t)b * c->H + h) * T + i];
                double lb = 2.0 * (e + nterm + 0x1p-20 * (1 + fabs(lse[i])));
                check_elem(&wl, c, b, h, i, 0, lg, lse[i], lb);
            }
            if (!bwd) continue;
            /* ---- backward ---- */
            for (int i = 0; i < T; i++) {
                double D = 0, dD = 0, dDa = 0;
                for (int d = 0; d < hs; d++) {
                    double gi = g[(size_t)i * hs + d];
                    D += gi * yt[(size_t)i * hs + d];
                    dD += gi * (yg[(size_t)i * hs + d] - yt[(size_t)i * hs + d]);
                    dDa += fabs(gi * yg[(size_t)i * hs + d]);
                }
                double eD = fabs(dD) + 2.0 * (hs + 2) * w * dDa;
                double dl = fabs((double)p->lse[((size_t)b * c->H + h) * T + i] - lse[i]);
                for (int j = 0; j <= i; j++) {
                    size_t ij = (size_t)i * T + j;
                    double dP = 0, dPa = 0;
                    for (int d = 0; d < hs; d++) {
                        double t = g[(size_t)i * hs + d] * v[(size_t)j * hs + d];
                        dP += t, dPa += fabs(t);
                    }
                    double edP = 4.0 * (hs + 2) * w * dPa;
                    eP[ij] = E[ij] + dl + 0x1p-20 * (1 + fabs(S[ij]) + fabs(lse[i]));
                    dS[ij] = P[ij] * (dP - D);
                    eS[ij] = eP[ij] * P[ij] * fabs(dP - D) + P[ij] * (edP + eD) +
                             2 * w * fabs(dS[ij]);
                }
            }
            const size_t base = (size_t)b * T;
            /* dQ_i = c sum_{j<=i} dS_ij k_j */
            for (int i = 0; i < T; i++) {
                double nterm = 2.0 * (i + 1 + 2) * w;
                for (int d = 0; d < hs; d++) {
                    double r = 0, bnd = 0;
                    for (int j = 0; j <= i; j++) {
                        size_t ij = (size_t)i * T + j;
                        double kj = k[(size_t)j * hs + d];
                        r += dS[ij] * kj;
                        bnd += ((u + nterm) * fabs(dS[ij]) + (1 + u) * eS[ij]) * fabs(kj);
                    }
                    r *= sc;
                    bnd = SECOND_ORDER * (sc * bnd + (u + 2 * w) * fabs(r));
                    double gv = bf(p->dqkv[(base + i) * C3 + (size_t)h * hs + d]);
                    check_elem(&wq, c, b, h, i, d, gv, r, bnd);
                }
            }
            /* dK_j = c sum_h sum_{i>=j} dS_ij q_i, dV_j = sum_h sum_{i>=j} P_ij dy_i
             * over the G query heads h of the group */
            if (h % G == 0) {
                memset(akr, 0, (size_t)T * hs * 8), memset(akb, 0, (size_t)T * hs * 8);
                memset(avr, 0, (size_t)T * hs * 8), memset(avb, 0, (size_t)T * hs * 8);
            }
            for (int j = 0; j < T; j++) {
                double nterm = 2.0 * ((double)G * (T - j) + 2) * w;
                for (int d = 0; d < hs; d++) {
                    double rk = 0, bk = 0, rv = 0, bv = 0;
                    for (int i = j; i < T; i++) {
                        size_t ij = (size_t)i * T + j;
                        double qi = q[(size_t)i * hs + d], gi = g[(size_t)i * hs + d];
                        rk += dS[ij] * qi;
                        bk += ((u + nterm) * fabs(dS[ij]) + (1 + u) * eS[ij]) * fabs(qi);
                        rv += P[ij] * gi;
                        bv += P[ij] * fabs(gi) * (u + eP[ij] + nterm);
                    }
                    const size_t jd = (size_t)j * hs + d;
                    akr[jd] += rk, akb[jd] += bk, avr[jd] += rv, avb[jd] += bv;
                }
            }
            if (h % G != G - 1) continue;
            for (int j = 0; j < T; j++)
                for (int d = 0; d < hs; d++) {
                    const size_t jd = (size_t)j * hs + d, kvh = (size_t)(h / G);
                    double rk = sc * akr[jd], rv = avr[jd];
                    double bk = SECOND_ORDER * (sc * akb[jd] + (u + 2 * w) * fabs(rk));
                    double bv = SECOND_ORDER * (avb[jd] + u * fabs(rv));
                    double gk = bf(p->dqkv[(base + j) * C3 + C + kvh * hs + d]);
                    double gvv = bf(p->dqkv[(base + j) * C3 + C + Ck + kvh * hs + d]);
                    check_elem(&wk, c, b, (int)kvh, j, d, gk, rk, bk);
                    check_elem(&wv, c, b, (int)kvh, j, d, gvv, rv, bv);
                }
        }
    printf("  %s B=%d T=%d H=%d KV=%d hs=%d amp=%g:\n", label, c->B, T, c->H, kv_heads(c), hs,
           c->amp);
    worst_print(&wy), worst_print(&wl);
    if (bwd) worst_print(&wq), worst_print(&wk), worst_print(&wv);
    free(q), free(k), free(v), free(g), free(yt), free(yg);
    free(S), free(P), free(E), free(dS), free(eS), free(eP), free(lse);
    free(akr), free(akb), free(avr), free(avb);
}

/* ---- the tests ------------------------------------------------------------------------- */

static const attn_case accuracy_cases[] = {
    {1, 77, 2, 64, 1.0, 0},   /* ragged: one and a bit tiles, B = 1 */
    {2, 200, 3, 128, 1.0, 0}, /* ragged, B > 1, several heads */
    {3, 64, 2, 64, 4.0, 0},   /* exactly one tile, sharp rows */
    {2, 1, 2, 128, 1.0, 0},   /* T = 1: one key per row */
    {1, 333, 2, 128, 3.0, 0}, /* ragged, sharp, 6 tiles */
    {2, 200, 2, 64, 2.0, 0},
    {1, 129, 1, 128, 1.0, 0}, /* one row past a tile */
    {1, 1024, 1, 64, 1.5, 0}, /* long: 16 tiles of online softmax */
};

static void test_matches_reference(void) {
    dev_open();
    for (size_t i = 0; i < sizeof accuracy_cases / sizeof accuracy_cases[0]; i++) {
        problem p = problem_make(accuracy_cases[i], zpp_test_seed(100 + i));
        run_forward(&p);
        run_backward(&p);
        check_problem(&p, 1, "fwd+bwd");
        problem_free(&p);
    }
    dev_close();
}

/* Grouped queries (Llama's GQA): groups of 4 and 2 query heads per key/value
 * head, multi-query (KV = 1), hs 64 and 128, ragged and whole tiles. */
static const attn_case gqa_cases[] = {
    {1, 200, 8, 64, 2.0, 2},  /* 4:1, ragged */
    {2, 77, 4, 128, 1.0, 2},  /* 2:1, B > 1 */
    {1, 130, 4, 64, 1.5, 1},  /* multi-query */
    {2, 64, 8, 128, 3.0, 2},  /* 4:1, one tile, sharp */
    {1, 333, 4, 128, 1.0, 1}, /* multi-query, 6 tiles */
};

static void test_gqa_matches_reference(void) {
    dev_open();
    for (size_t i = 0; i < sizeof gqa_cases / sizeof gqa_cases[0]; i++) {
        problem p = problem_make(gqa_cases[i], zpp_test_seed(400 + i));
        run_forward(&p);
        run_backward(&p);
        check_problem(&p, 1, "gqa fwd+bwd");
        problem_free(&p);
    }
    dev_close();
}

/* A grouped-query problem is the multi-head one whose key/value heads are
 * copied to every query head of their group: per query head the kernels do
 * the same arithmetic on the same numbers, so y, lse and dQ must be the
 * same bytes (dK, dV differ: the group's sum is rounded once, not per
 * head; test_gqa_matches_reference bounds them). The grouped backward is
 * also run twice: the same bytes. */
static void test_gqa_equals_copied_heads(void) {
    dev_open();
    static const attn_case cases[] = {{2, 150, 8, 64, 2.0, 2}, {1, 200, 4, 128, 1.5, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        attn_case cm = cases[ci];
        cm.KV = 0;
        problem g = problem_make(cases[ci], zpp_test_seed(500 + ci));
        problem m = problem_make(cm, zpp_test_seed(600 + ci));
        const int G = g.c.H / g.c.KV;
        const size_t Ck = (size_t)g.c.KV * g.c.hs, hs = (size_t)g.c.hs;
        for (size_t n = 0; n < g.N; n++) { /* m's row: g's q, each k / v head G times */
            memcpy(m.qkv + n * m.W, g.qkv + n * g.W, g.C * 2);
            for (size_t h = 0; h < (size_t)g.c.H; h++) {
                const size_t src = n * g.W + g.C + (h / G) * hs;
                memcpy(m.qkv + n * m.W + g.C + h * hs, g.qkv + src, hs * 2);
                memcpy(m.qkv + n * m.W + 2 * g.C + h * hs, g.qkv + src + Ck, hs * 2);
            }
        }
        memcpy(m.dy, g.dy, g.N * g.C * 2);
        zpp_test_dbuf_put(&m.d_qkv, m.qkv), zpp_test_dbuf_put(&m.d_dy, m.dy);
        run_forward(&g), run_forward(&m);
        run_backward(&g), run_backward(&m);
        const size_t nl = (size_t)g.c.B * g.c.H * g.c.T * sizeof(float);
        EXPECT(memcmp(g.y, m.y, g.N * g.C * 2) == 0, "case %zu: y differs from copied heads", ci);
        EXPECT(memcmp(g.lse, m.lse, nl) == 0, "case %zu: lse differs from copied heads", ci);
        for (size_t n = 0; n < g.N; n++)
            EXPECT(memcmp(g.dqkv + n * g.W, m.dqkv + n * m.W, g.C * 2) == 0,
                   "case %zu: row %zu: dQ differs from copied heads", ci, n);
        uint16_t *d1 = zpp_test_malloc(g.N * g.W * 2);
        memcpy(d1, g.dqkv, g.N * g.W * 2);
        run_backward(&g);
        EXPECT(memcmp(d1, g.dqkv, g.N * g.W * 2) == 0, "case %zu: two grouped backwards differ",
               ci);
        printf("  B=%d T=%d H=%d KV=%d hs=%d: y, lse, dQ as copied heads; backward repeatable\n",
               g.c.B, g.c.T, g.c.H, g.c.KV, g.c.hs);
        free(d1);
        problem_free(&g), problem_free(&m);
    }
    dev_close();
}

/* Forward twice, backward twice, same inputs: the same bytes. The second
 * runs start from poisoned outputs, so nothing is left over from the first. */
static void test_deterministic(void) {
    dev_open();
    static const attn_case cases[] = {{2, 300, 2, 128, 2.0, 0}, {3, 250, 2, 64, 2.0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        problem p = problem_make(cases[i], zpp_test_seed(200 + i));
        size_t ny = p.N * p.C * 2, nl = (size_t)p.c.B * p.c.H * p.c.T * sizeof(float),
               nqkv = p.N * p.W * 2;
        run_forward(&p);
        run_backward(&p);
        uint16_t *y1 = zpp_test_malloc(ny), *dqkv1 = zpp_test_malloc(nqkv);
        float *lse1 = zpp_test_malloc(nl);
        memcpy(y1, p.y, ny), memcpy(lse1, p.lse, nl), memcpy(dqkv1, p.dqkv, nqkv);
        run_forward(&p);
        run_backward(&p);
        EXPECT(memcmp(y1, p.y, ny) == 0, "hs %d: two forwards gave different y", p.c.hs);
        EXPECT(memcmp(lse1, p.lse, nl) == 0, "hs %d: two forwards gave different lse", p.c.hs);
        EXPECT(memcmp(dqkv1, p.dqkv, nqkv) == 0, "hs %d: two backwards gave different dqkv",
               p.c.hs);
        printf("  B=%d T=%d H=%d hs=%d: forward and backward bitwise repeatable\n", p.c.B,
               p.c.T, p.c.H, p.c.hs);
        check_problem(&p, 1, "(and accurate)");
        free(y1), free(lse1), free(dqkv1);
        problem_free(&p);
    }
    dev_close();
}

/* Unsupported head sizes and bad arguments are refused before any launch,
 * with a message. */
static void test_refusals(void) {
    dev_open_for(0);
    EXPECT_OK(zpp_attn_supported(64));
    EXPECT_OK(zpp_attn_supported(128));
    static const int bad_hs[] = {48, 0, -64, 32, 80, 96, 256};
    for (size_t i = 0; i < sizeof bad_hs / sizeof bad_hs[0]; i++) {
        zpp_error_clear();
        EXPECT_STATUS(zpp_attn_supported(bad_hs[i]), ZPP_ERR_UNSUPPORTED);
        EXPECT(strstr(zpp_last_error(), "head size") != NULL, "message: %s", zpp_last_error());
    }
    problem p = problem_make((attn_case){1, 16, 2, 64, 1.0, 0}, zpp_test_seed(300));
    void *st = dev->stream;
    char *y = p.d_y.p, *qkv = p.d_qkv.p;
    float *lse = p.d_lse.p, *ds = p.d_dsum.p;
    EXPECT_STATUS(zpp_attn_forward(y, lse, qkv, 1, 16, 3, 48, st), ZPP_ERR_UNSUPPORTED);
    EXPECT_STATUS(zpp_attn_backward(p.d_dqkv.p, p.d_dy.p, qkv, y, lse, ds, 1, 16, 3, 48, st),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT_STATUS(zpp_attn_forward(NULL, lse, qkv, 1, 16, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y, NULL, qkv, 1, 16, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y, lse, NULL, 1, 16, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y + 2, lse, qkv, 1, 16, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y, lse, qkv + 8, 1, 16, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y, lse, qkv, 0, 16, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y, lse, qkv, 1, 0, 2, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_forward(y, lse, qkv, 1, 16, 0, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_backward(NULL, p.d_dy.p, qkv, y, lse, ds, 1, 16, 2, 64, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_backward(p.d_dqkv.p, p.d_dy.p, qkv, y, lse, NULL, 1, 16, 2, 64, st),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_backward(p.d_dqkv.p, (char *)p.d_dy.p + 4, qkv, y, lse, ds, 1, 16, 2,
                                    64, st),
                  ZPP_ERR_INVALID);
    /* grouped queries: KV must divide H */
    zpp_error_clear();
    EXPECT_STATUS(zpp_attn_gqa_forward(y, lse, qkv, 1, 16, 2, 3, 64, st), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "divide") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_attn_gqa_forward(y, lse, qkv, 1, 16, 2, 0, 64, st), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_attn_gqa_backward(p.d_dqkv.p, p.d_dy.p, qkv, y, lse, ds, 1, 16, 4, 3, 64, st),
                  ZPP_ERR_INVALID);
    if (dev_cc < ZPP_CC_BF16) { /* a GPU below 8.0: good arguments, refused all the same */
        zpp_error_clear();
        EXPECT_STATUS(zpp_attn_forward(y, lse, qkv, 1, 16, 2, 64, st), ZPP_ERR_UNSUPPORTED);
        EXPECT(strstr(zpp_last_error(), "compute capability 8.0"), "%s", zpp_last_error());
        EXPECT_STATUS(zpp_attn_backward(p.d_dqkv.p, p.d_dy.p, qkv, y, lse, ds, 1, 16, 2, 64, st),
                      ZPP_ERR_UNSUPPORTED);
    }
    /* nothing was launched: the outputs are still poison */
    unsigned char *h = zpp_test_malloc(p.d_y.bytes);
    zpp_test_dbuf_get(&p.d_y, h, "y");
    for (size_t i = 0; i < p.d_y.bytes; i++)
        EXPECT(h[i] == ZPP_TEST_POISON, "a refused call wrote y (byte %zu)", i);
    free(h);
    problem_free(&p);
    dev_close();
}

ZPP_TESTS(ZPP_TEST_GPU(test_refusals), ZPP_TEST_GPU(test_matches_reference),
          ZPP_TEST_GPU(test_deterministic), ZPP_TEST_GPU(test_gqa_matches_reference),
          ZPP_TEST_GPU(test_gqa_equals_copied_heads))

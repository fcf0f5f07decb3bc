/* test_loco.c — error feedback (LoCo) for qgZ, on the MPI backend.
 *
 * Every rank builds the gradients of EVERY rank from the agreed seed and
 * runs an in-process reference of the whole world's error-feedback qgZ,
 * written here from the definition (docs/quantization.md, "Error
 * feedback"), on the plain quantizer (zpp_quantize / zpp_dequantize):
 *   x = g + e;  q = Q(x);  e <- beta e + (1 - beta)(x - deq(q))
 * at the first quantization (each rank, each destination chunk) and at the
 * requantization of the node partial sums (nodes > 1 and node size > 1),
 * the sums in the order the collective forms them. Every operation is one
 * IEEE fp32 operation on both sides, so the collective must match the
 * reference bit for bit: outputs and error buffers, step after step.
 *
 * The property of the issue: for a gradient stream repeated with period P,
 * the sum of what was received over T steps against the sum of the exact
 * world means. Without feedback each period repeats the same rounding, so
 * the accumulated error grows linearly (exactly T/P times one period's,
 * up to fp32 sums). With feedback it telescopes: per quantization stage
 *   sum_t deq_t = sum_t v_t + (e_0 - e_T) / (1 - beta)
 * (since x_t - deq_t = (e_t - beta e_{t-1}) / (1 - beta)), so the
 * accumulated error is (1/W) (sum of the final buffers) / (1 - beta): at
 * most 1 / (1 - beta) times the bound of ONE step's error
 * (zpp_qgz_error_bound), with the block absmax of x = v + e instead of v;
 * |e| <= max |x - deq| <= absmax(x) / 14 and absmax(x) <= absmax(v) + |e|
 * give absmax(x) <= absmax(v) * 14 / 13, covered by the factor 1.1 below,
 * plus fp32 accumulation of T sums (checked with a relative 1e-5 margin).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "collectives/qgz_bound.h"
#include "comm/comm.h"
#include "core/random.h"
#include "device/device.h"
#include "quant/quant_cpu.h"
#include "cuda_testlib.h"
#include "testlib.h"

static zpp_device *host_dev(void) {
    static zpp_device *d;
    if (!d) EXPECT_OK(zpp_device_create_host(&d));
    return d;
}

static zpp_topo *topo_make(int node_size) {
    zpp_topo_opts o;
    memset(&o, 0, sizeof o);
    o.backend = ZPP_BACKEND_MPI;
    o.node_size = node_size;
    zpp_topo *t;
    EXPECT_OK(zpp_topo_create_with_opts(&o, &t));
    return t;
}

static int world_size(void) {
    zpp_topo *t = topo_make(1);
    int w = t->world_size;
    zpp_topo_destroy(t);
    return w;
}

/* Gradient element i of rank r at pattern p: uniform in [-1, 1) times a
 * magnitude that changes every 50 elements (blocks of different scales). */
static float grad_value(uint64_t seed, int p, int r, size_t i) {
    uint64_t h = zpp_mix64(seed ^ zpp_mix64(((uint64_t)p << 48) ^ ((uint64_t)r << 32) ^ i));
    uint64_t m = zpp_mix64(seed ^ ((uint64_t)p << 40) ^ ((uint64_t)r << 20) ^ (i / 50));
    double u = (double)(h >> 11) * 0x1p-53 * 2.0 - 1.0;
    double mag = ldexp(1.0, (int)(m % 9) - 4);
    return (float)(u * mag);
}

/* ---- The reference: the whole world in one process -------------------------- */

typedef struct world_ref {
    int W, S, N;
    size_t n, padded;
    zpp_quant_spec spec;
    float beta;
    float **e1, **e2; /* per rank: padded, N * n */
    float *x, *y;     /* scratch rows of n */
    void *q;
    float ***d1;      /* d1[r][c]: rank r's dequantized chunk c */
    float ***d2;      /* d2[r][m]: rank r's dequantized requantized sum for node m */
} world_ref;

static void ref_init(world_ref *w, int W, int S, size_t n, float beta) {
    memset(w, 0, sizeof *w);
    w->W = W, w->S = S, w->N = W / S, w->n = n, w->padded = (size_t)W * n;
    w->spec = zpp_coll_opts_default().grad_spec; /* what zpp_coll_create(NULL) uses */
    w->beta = beta;
    w->e1 = zpp_test_malloc((size_t)W * sizeof *w->e1);
    w->e2 = zpp_test_malloc((size_t)W * sizeof *w->e2);
    w->d1 = zpp_test_malloc((size_t)W * sizeof *w->d1);
    w->d2 = zpp_test_malloc((size_t)W * sizeof *w->d2);
    for (int r = 0; r < W; r++) {
        w->e1[r] = zpp_test_malloc(w->padded * sizeof(float));
        w->e2[r] = zpp_test_malloc((size_t)w->N * n * sizeof(float));
        w->d1[r] = zpp_test_malloc((size_t)W * sizeof(float *));
        w->d2[r] = zpp_test_malloc((size_t)w->N * sizeof(float *));
        for (int c = 0; c < W; c++) w->d1[r][c] = zpp_test_malloc(n * sizeof(float));
        for (int m = 0; m < w->N; m++) w->d2[r][m] = zpp_test_malloc(n * sizeof(float));
    }
    w->x = zpp_test_malloc(n * sizeof(float));
    w->y = zpp_test_malloc(n * sizeof(float));
    w->q = zpp_test_malloc(zpp_quant_bytes(n, &w->spec));
}

static void ref_free(world_ref *w) {
    for (int r = 0; r < w->W; r++) {
        for (int c = 0; c < w->W; c++) free(w->d1[r][c]);
        for (int m = 0; m < w->N; m++) free(w->d2[r][m]);
        free(w->d1[r]), free(w->d2[r]), free(w->e1[r]), free(w->e2[r]);
    }
    free(w->d1), free(w->d2), free(w->e1), free(w->e2), free(w->x), free(w->y), free(w->q);
}

/* x (n) -> quantized, dequantized into out; e (n) updated (use_e: feedback). */
static void ref_quant(world_ref *w, const float *x, float *e, int use_e, float *out) {
    size_t n = w->n;
    EXPECT_OK(zpp_quantize(x, ZPP_FP32, n, &w->spec, w->q));
    EXPECT_OK(zpp_dequantize(w->q, n, &w->spec, ZPP_FP32, out));
    if (!use_e) return;
    const float omb = 1.0f - w->beta;
    for (size_t i = 0; i < n; i++) {
        float d = x[i] - out[i];
        float a = w->beta * e[i];
        float b = omb * d;
        e[i] = a + b;
    }
}

/* One reduction of every rank's gradient g[r] (padded); out[r] (n) is rank
 * r's averaged shard. */
static void ref_step(world_ref *w, float *const *g, int use_e, float **out) {
    const int W = w->W, S = w->S, N = w->N;
    const size_t n = w->n;
    const float inv = 1.0f / (float)W;
    for (int r = 0; r < W; r++)
        for (int c = 0; c < W; c++) {
            for (size_t i = 0; i < n; i++)
                w->x[i] = use_e ? g[r][c * n + i] + w->e1[r][c * n + i] : g[r][c * n + i];
            ref_quant(w, w->x, w->e1[r] + c * n, use_e, w->d1[r][c]);
        }
    /* Every sum a rank forms over inputs of which one is its own starts
     * from its own, exact, and adds +0 in its place (collectives.c). */
    if (S == 1 || N == 1) { /* one quantization: the world's W copies summed */
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < n; i++) {
                float acc = g[r][(size_t)r * n + i];
                for (int p = 0; p < W; p++) acc = acc + (p == r ? 0.0f : w->d1[p][r][i]);
                out[r][i] = inv * acc;
            }
        return;
    }
    for (int r = 0; r < W; r++) {
        const int a = r / S, s = r % S;
        for (int m = 0; m < N; m++) {
            for (size_t i = 0; i < n; i++) {
                float acc = 0.0f;
                for (int p = 0; p < S; p++) acc = acc + w->d1[a * S + p][m * S + s][i];
                w->x[i] = use_e ? acc + w->e2[r][m * n + i] : acc;
            }
            ref_quant(w, w->x, w->e2[r] + m * n, use_e, w->d2[r][m]);
        }
    }
    for (int r = 0; r < W; r++) {
        const int m = r / S, s = r % S;
        for (size_t i = 0; i < n; i++) {
            /* the node's own partial sum, in fp32 (not requantized) */
            float acc = g[r][(size_t)r * n + i];
            for (int p = 0; p < S; p++) acc = acc + (p == s ? 0.0f : w->d1[m * S + p][r][i]);
            for (int a = 0; a < N; a++) acc = acc + (a == m ? 0.0f : w->d2[a * S + s][m][i]);
            out[r][i] = inv * acc;
        }
    }
}

/* ---- The collective under test ------------------------------------------------ */

typedef struct rank_run {
    zpp_topo *t;
    zpp_coll *c;
    zpp_partition p;
    float *e1, *e2; /* this rank's buffers (host device memory) */
    size_t l1, l2;
    float *out;
} rank_run;

static void run_init(rank_run *k, int S, size_t numel) {
    k->t = topo_make(S);
    EXPECT_OK(zpp_coll_create(k->t, NULL, host_dev(), &k->c));
    k->p = zpp_partition_make(numel, k->t);
    zpp_qgz_feedback_lens(&k->p, k->t->nodes, k->t->node_size, &k->l1, &k->l2);
    EXPECT(k->l1 == k->p.padded && k->l2 == (k->t->nodes > 1 && S > 1
                                                 ? (size_t)k->t->nodes * k->p.shard_len
                                                 : 0));
    k->e1 = zpp_test_malloc(k->l1 * sizeof(float));
    k->e2 = zpp_test_malloc((k->l2 + 1) * sizeof(float));
    k->out = zpp_test_malloc(k->p.shard_len * sizeof(float));
}

static void run_free(rank_run *k) {
    free(k->e1), free(k->e2), free(k->out);
    zpp_coll_destroy(k->c);
    zpp_topo_destroy(k->t);
}

static void run_step(rank_run *k, const float *grad, float beta, int use_e) {
    zpp_qgz_feedback fb = {k->e1, k->l2 ? k->e2 : NULL, beta};
    zpp_coll_op *op;
    EXPECT_OK(zpp_coll_reduce_start_ef(k->c, &k->p, ZPP_REDUCE_QGZ, ZPP_FP32, grad, k->out,
                                       use_e ? &fb : NULL, &op));
    EXPECT_OK(zpp_coll_finish(k->c, op));
}

/* Fills g[r] (padded) for pattern p; the padding stays 0. */
static void make_grads(float **g, int W, size_t numel, size_t padded, uint64_t seed, int p) {
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < padded; i++) g[r][i] = i < numel ? grad_value(seed, p, r, i) : 0.0f;
}

/* (a) The collective against the reference, bit for bit, over 6 steps of
 * different gradients, for every node size dividing the world and shards
 * that are and are not whole blocks; err_beta 0.8, 0 and 1. */
static void test_qgz_ef_matches_reference(void) {
    const int W = world_size();
    const uint64_t seed = zpp_test_seed(0x10c0);
    const size_t sizes[] = {(size_t)W * 300 + 5, (size_t)W * 256, 37};
    const float betas[] = {0.8f, 0.0f, 1.0f};
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        for (size_t zi = 0; zi < sizeof sizes / sizeof sizes[0]; zi++) {
            for (size_t bi = 0; bi < sizeof betas / sizeof betas[0]; bi++) {
                rank_run k;
                run_init(&k, S, sizes[zi]);
                world_ref w;
                ref_init(&w, W, S, k.p.shard_len, betas[bi]);
                float **g = zpp_test_malloc((size_t)W * sizeof *g);
                float **out = zpp_test_malloc((size_t)W * sizeof *out);
                for (int r = 0; r < W; r++) {
                    g[r] = zpp_test_malloc(k.p.padded * sizeof(float));
                    out[r] = zpp_test_malloc(k.p.shard_len * sizeof(float));
                }
                const int me = k.t->world_rank;
                for (int step = 0; step < 6; step++) {
                    make_grads(g, W, sizes[zi], k.p.padded, seed, step);
                    ref_step(&w, g, 1, out);
                    run_step(&k, g[me], betas[bi], 1);
                    EXPECT(memcmp(k.out, out[me], k.p.shard_len * sizeof(float)) == 0,
                           "S=%d numel %zu beta %g step %d: output differs from the reference",
                           S, sizes[zi], (double)betas[bi], step);
                    EXPECT(memcmp(k.e1, w.e1[me], k.l1 * sizeof(float)) == 0,
                           "S=%d numel %zu step %d: intra-node error buffer differs", S,
                           sizes[zi], step);
                    if (k.l2)
                        EXPECT(memcmp(k.e2, w.e2[me], k.l2 * sizeof(float)) == 0,
                               "S=%d numel %zu step %d: inter-node error buffer differs", S,
                               sizes[zi], step);
                }
                /* beta 1 keeps the buffers at zero: the plain qgZ */
                if (betas[bi] == 1.0f)
                    for (size_t i = 0; i < k.l1; i++) EXPECT(k.e1[i] == 0.0f);
                for (int r = 0; r < W; r++) free(g[r]), free(out[r]);
                free(g), free(out);
                ref_free(&w);
                run_free(&k);
            }
        }
    }
}

/* (b) The accumulated error of a repeated gradient stream: bounded with
 * feedback, linear without (see the top of the file). */
static void test_qgz_ef_accumulated_error_bounded(void) {
    const int W = world_size();
    const uint64_t seed = zpp_test_seed(0x10c1);
    const int P = 3, T = 60;
    const float beta = 0.8f;
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        const size_t numel = (size_t)W * 400 + 3;
        rank_run k[2];
        run_init(&k[0], S, numel); /* without feedback */
        run_init(&k[1], S, numel); /* with */
        const size_t n = k[0].p.shard_len, padded = k[0].p.padded;
        const int me = k[0].t->world_rank;
        const int N = k[0].t->nodes;
        float **g = zpp_test_malloc((size_t)P * sizeof *g);
        double **exact = zpp_test_malloc((size_t)P * sizeof *exact);
        double *bound = zpp_test_malloc(n * sizeof(double)); /* one step's, largest pattern */
        double *gmax = zpp_test_malloc(n * sizeof(double));
        float **all = zpp_test_malloc((size_t)W * sizeof *all);
        for (int r = 0; r < W; r++) all[r] = zpp_test_malloc(padded * sizeof(float));
        const size_t B = ZPP_QUANT_DEFAULT_BLOCK_INT4;
        for (int p = 0; p < P; p++) {
            make_grads(all, W, numel, padded, seed, p);
            g[p] = zpp_test_malloc(padded * sizeof(float));
            memcpy(g[p], all[me], padded * sizeof(float));
            exact[p] = zpp_test_malloc(n * sizeof(double));
            for (size_t j = 0; j < n; j++) {
                double s = 0;
                for (int r = 0; r < W; r++) s += all[r][(size_t)me * n + j];
                exact[p][j] = s / W;
            }
            for (size_t b0 = 0; b0 < n; b0 += B) {
                size_t b1 = b0 + B < n ? b0 + B : n;
                double sumA = 0;
                for (int r = 0; r < W; r++) {
                    double A = 0;
                    for (size_t j = b0; j < b1; j++)
                        A = fmax(A, fabs(all[r][(size_t)me * n + j]));
                    sumA += A;
                    for (size_t j = b0; j < b1; j++) gmax[j] = fmax(gmax[j], A);
                }
                zpp_coll_opts dflt = zpp_coll_opts_default();
                double bd = zpp_qgz_error_bound(sumA, W, S, N, &dflt.grad_spec);
                for (size_t j = b0; j < b1; j++) bound[j] = fmax(bound[j], bd);
            }
        }
        double *acc[2], *sum_exact = zpp_test_malloc(n * sizeof(double));
        acc[0] = zpp_test_malloc(n * sizeof(double));
        acc[1] = zpp_test_malloc(n * sizeof(double));
        double l1_first_period = 0, l1_end[2] = {0, 0}, worst_ratio = 0;
        for (int t = 0; t < T; t++) {
            const int p = t % P;
            for (int v = 0; v < 2; v++) {
                run_step(&k[v], g[p], beta, v);
                for (size_t j = 0; j < n; j++) acc[v][j] += k[v].out[j];
            }
            for (size_t j = 0; j < n; j++) sum_exact[j] += exact[p][j];
            /* with feedback: every element within 1/(1 - beta) of one step's
             * bound (x's absmax: factor 1.1), plus fp32 sums' rounding */
            for (size_t j = 0; j < (size_t)numel / W && j < n; j++) {
                double err = fabs(acc[1][j] - sum_exact[j]);
                double lim = 1.1 * bound[j] / (1.0 - beta) + 1e-5 * (t + 1) * gmax[j];
                EXPECT(err <= lim, "S=%d step %d element %zu: accumulated error %.3g > %.3g", S,
                       t + 1, j, err, lim);
                if (lim > 0 && err / lim > worst_ratio) worst_ratio = err / lim;
            }
            if (t == P - 1)
                for (size_t j = 0; j < n; j++) l1_first_period += fabs(acc[0][j] - sum_exact[j]);
        }
        for (int v = 0; v < 2; v++)
            for (size_t j = 0; j < n; j++) l1_end[v] += fabs(acc[v][j] - sum_exact[j]);
        if (W == 1) { /* a world of one adds its own gradient unquantized */
            EXPECT(l1_end[0] <= 1e-6 * T && l1_end[1] <= 1e-6 * T,
                   "world 1: accumulated error %.3g and %.3g, not fp32 rounding", l1_end[0],
                   l1_end[1]);
        } else {
            /* without feedback every period adds the same error: linear growth */
            EXPECT(l1_end[0] >= 0.9 * (T / P) * l1_first_period,
                   "S=%d: without feedback the accumulated error %.4g after %d steps is not %d "
                   "times the first period's %.4g",
                   S, l1_end[0], T, T / P, l1_first_period);
            EXPECT(l1_end[1] * 5 < l1_end[0], "S=%d: with feedback %.4g, without %.4g", S,
                   l1_end[1], l1_end[0]);
            if (me == 0)
                printf("  S=%d: accumulated L1 error after %d steps: %.4g without feedback, %.4g "
                       "with (worst element at %.2f of its bound)\n",
                       S, T, l1_end[0], l1_end[1], worst_ratio);
        }
        for (int p = 0; p < P; p++) free(g[p]), free(exact[p]);
        for (int r = 0; r < W; r++) free(all[r]);
        free(g), free(exact), free(bound), free(gmax), free(all), free(acc[0]), free(acc[1]);
        free(sum_exact);
        run_free(&k[0]);
        run_free(&k[1]);
    }
}

/* Refusals with one clear line: err_beta outside [0, 1], a missing buffer,
 * feedback on the baseline reduce. */
static void test_ef_refusals(void) {
    rank_run k;
    run_init(&k, 1, 64);
    float *grad = zpp_test_malloc(k.p.padded * sizeof(float));
    zpp_coll_op *op = NULL;
    zpp_qgz_feedback fb = {k.e1, NULL, 1.5f};
    EXPECT_STATUS(zpp_coll_reduce_start_ef(k.c, &k.p, ZPP_REDUCE_QGZ, ZPP_FP32, grad, k.out,
                                           &fb, &op),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "err_beta"), "%s", zpp_last_error());
    fb.beta = 0.5f;
    fb.intra = NULL;
    EXPECT_STATUS(zpp_coll_reduce_start_ef(k.c, &k.p, ZPP_REDUCE_QGZ, ZPP_FP32, grad, k.out,
                                           &fb, &op),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "intra-node buffer"), "%s", zpp_last_error());
    fb.intra = k.e1;
    EXPECT_STATUS(zpp_coll_reduce_start_ef(k.c, &k.p, ZPP_REDUCE_BASELINE, ZPP_FP32, grad,
                                           k.out, &fb, &op),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "qgZ only"), "%s", zpp_last_error());
    free(grad);
    run_free(&k);
}

/* Random inputs for the kernel cases: values of mixed scales, a block of
 * zeros, and (nan_at < n) one NaN. */
static void kernel_inputs(uint64_t seed, float *x, size_t n, size_t nan_at) {
    for (size_t i = 0; i < n; i++) x[i] = grad_value(seed, 9, 0, i);
    for (size_t i = 128; i < 256 && i < n; i++) x[i] = 0.0f;
    if (nan_at < n) x[nan_at] = NAN;
}

/* The host device's kernels on a NaN: the block is stored as the plain
 * kernel stores it, the flag raised, and the error of that block reset to
 * 0 (every other element's error finite). */
static void test_ef_nonfinite_block(void) {
    zpp_device *d = host_dev();
    const int nodes = 2, local = 2;
    const size_t chunk = 300, n = (size_t)nodes * local * chunk;
    float *x = zpp_test_malloc(n * sizeof(float)), *e = zpp_test_malloc(n * sizeof(float));
    kernel_inputs(zpp_test_seed(0x10c2), x, n, 7);
    for (size_t i = 0; i < n; i++) e[i] = 0.01f;
    zpp_quant_spec spec = zpp_quant_spec_default(4);
    void *q = zpp_test_malloc((size_t)nodes * local * zpp_quant_bytes(chunk, &spec));
    EXPECT_OK(zpp_device_ef_reorder_quantize(d, x, ZPP_FP32, e, 0.8f, chunk, 0, chunk, nodes,
                                             local, &spec, q));
    int raised = 0;
    EXPECT_OK(zpp_device_nonfinite_take(d, &raised));
    EXPECT(raised, "the flag was not raised");
    for (size_t i = 0; i < n; i++) {
        EXPECT(isfinite(e[i]), "error %zu is %g", i, (double)e[i]);
        if (i < 128) EXPECT(e[i] == 0.0f, "error %zu of the NaN block is %g", i, (double)e[i]);
    }
    EXPECT_STATUS(zpp_device_ef_reorder_quantize(d, x, ZPP_FP32, e, -0.1f, chunk, 0, chunk,
                                                 nodes, local, &spec, q),
                  ZPP_ERR_INVALID);
    free(x), free(e), free(q);
}

/* GPU: the CUDA kernels against the CPU ones, bit for bit (payloads,
 * scales, padding and error buffers), over 8 steps of a repeated stream
 * (so the buffers' evolution and with it the accumulated-error property
 * carry over from the CPU cases), for int4 and int8, round-to-nearest and
 * stochastic, fp32/bf16/fp16 inputs, slabs, and a NaN block. */
static void test_ef_gpu_matches_cpu(void) {
    zpp_device *g = zpp_test_gpu_open("test_ef_gpu_matches_cpu");
    zpp_device *h = host_dev();
    const int nodes = 2, local = 3;
    const size_t chunk = 1000, n = (size_t)nodes * local * chunk;
    const uint64_t seed = zpp_test_seed(0x10c3);
    const zpp_dtype dts[] = {ZPP_FP32, ZPP_BF16, ZPP_FP16};
    for (int kind = 0; kind < 3; kind++) /* int8, int4, E2M1 */
        for (int stoch = 0; stoch < 2; stoch++)
            for (size_t di = 0; di < 3; di++) {
                zpp_quant_spec spec = zpp_quant_spec_default(kind ? 4 : 8);
                spec.format = kind == 2 ? ZPP_QUANT_E2M1 : ZPP_QUANT_INT;
                spec.block = 64;
                spec.stochastic = stoch;
                spec.seed = seed;
                const size_t es = zpp_dtype_size(dts[di]);
                const size_t first = 256, len = 600; /* a slab on block boundaries */
                const size_t qb = zpp_quant_bytes(len, &spec), qall = nodes * local * qb;
                float *x = zpp_test_malloc(n * sizeof(float));
                void *xin = zpp_test_malloc(n * es);
                float *eh = zpp_test_malloc(n * sizeof(float)), *eg = zpp_test_malloc(n * sizeof(float));
                void *qh = zpp_test_malloc(qall), *qg = zpp_test_malloc(qall);
                float *sum_eh = zpp_test_malloc(nodes * chunk * sizeof(float));
                float *sum_eg = zpp_test_malloc(nodes * chunk * sizeof(float));
                void *oh = zpp_test_malloc(nodes * qb), *og = zpp_test_malloc(nodes * qb);
                void *dx, *de, *dq, *dse, *dout;
                EXPECT_OK(zpp_device_alloc(g, n * es, &dx));
                EXPECT_OK(zpp_device_alloc(g, n * sizeof(float), &de));
                EXPECT_OK(zpp_device_alloc(g, qall, &dq));
                EXPECT_OK(zpp_device_alloc(g, nodes * chunk * sizeof(float), &dse));
                EXPECT_OK(zpp_device_alloc(g, nodes * qb, &dout));
                EXPECT_OK(zpp_device_set(g, de, 0, n * sizeof(float)));
                EXPECT_OK(zpp_device_set(g, dse, 0, nodes * chunk * sizeof(float)));
                for (int step = 0; step < 8; step++) {
                    kernel_inputs(seed + (uint64_t)(step % 3), x, n, step == 5 ? 300 : n);
                    EXPECT_OK(zpp_quant_cpu_convert(x, ZPP_FP32, xin, dts[di], n, 1.0f));
                    EXPECT_OK(zpp_device_copy(g, dx, xin, n * es));
                    (void)zpp_device_ef_reorder_quantize(h, xin, dts[di], eh, 0.8f, chunk, first,
                                                         len, nodes, local, &spec, qh);
                    EXPECT_OK(zpp_device_ef_reorder_quantize(g, dx, dts[di], de, 0.8f, chunk,
                                                             first, len, nodes, local, &spec,
                                                             dq));
                    EXPECT_OK(zpp_device_copy(g, qg, dq, qall));
                    EXPECT_OK(zpp_device_copy(g, eg, de, n * sizeof(float)));
                    EXPECT(memcmp(qh, qg, qall) == 0, "kind %d stoch %d %s step %d: wire bytes",
                           kind, stoch, zpp_dtype_name(dts[di]), step);
                    EXPECT(memcmp(eh, eg, n * sizeof(float)) == 0,
                           "kind %d stoch %d %s step %d: error buffers", kind, stoch,
                           zpp_dtype_name(dts[di]), step);
                    /* the requantization: the quantized slabs as `local` inputs
                     * of `nodes` chunks each */
                    (void)zpp_device_ef_dequant_sum_requant(h, qh, local, nodes, chunk, first, len,
                                                            &spec, &spec, sum_eh, 0.8f, oh);
                    EXPECT_OK(zpp_device_ef_dequant_sum_requant(g, dq, local, nodes, chunk, first,
                                                                len, &spec, &spec, dse, 0.8f,
                                                                dout));
                    EXPECT_OK(zpp_device_copy(g, og, dout, nodes * qb));
                    EXPECT_OK(zpp_device_copy(g, sum_eg, dse, nodes * chunk * sizeof(float)));
                    EXPECT(memcmp(oh, og, nodes * qb) == 0, "kind %d stoch %d step %d: sums",
                           kind, stoch, step);
                    EXPECT(memcmp(sum_eh, sum_eg, nodes * chunk * sizeof(float)) == 0,
                           "kind %d stoch %d step %d: inter-node error buffers", kind, stoch,
                           step);
                    int rh = 0, rg = 0;
                    EXPECT_OK(zpp_device_nonfinite_take(h, &rh));
                    EXPECT_OK(zpp_device_nonfinite_take(g, &rg));
                    EXPECT(rh == rg && rh == (step == 5), "step %d: flags %d %d", step, rh, rg);
                }
                zpp_device_free(g, dx), zpp_device_free(g, de), zpp_device_free(g, dq);
                zpp_device_free(g, dse), zpp_device_free(g, dout);
                free(x), free(xin), free(eh), free(eg), free(qh), free(qg), free(sum_eh);
                free(sum_eg), free(oh), free(og);
            }
    zpp_device_destroy(g);
}

ZPP_TESTS(ZPP_TEST(test_qgz_ef_matches_reference), ZPP_TEST(test_qgz_ef_accumulated_error_bounded),
          ZPP_TEST(test_ef_refusals), ZPP_TEST(test_ef_nonfinite_block),
          ZPP_TEST_GPU(test_ef_gpu_matches_cpu))

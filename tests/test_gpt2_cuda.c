/* test_gpt2_cuda.c — the CUDA GPT-2 (src/model/gpt2_cuda.cu) against the
 * CPU reference (src/model/gpt2_cpu.c, itself checked against finite
 * differences of a double-precision forward in test_gpt2.c).
 *
 * Both models get the same configuration, the same parameters (the init
 * of a fresh seed each run, then moved off it: see twin_perturb) and the
 * same batch; the tests compare the
 * loss and every element of every unit's gradient, for fp32, bf16 and fp16
 * parameters, on shapes chosen to hit the awkward cases: C = 48 (not a
 * multiple of 32: warp loops with a ragged end, unaligned cuBLASLt
 * operands), odd T and V, a batch smaller than max_batch (activation slabs
 * with a stride larger than the rows in use), B <= H and B > H (the two ways
 * attention batches its GEMMs), and batches with many repeated tokens (the
 * deterministic token-embedding scatter).
 *
 * THE TOLERANCE (fp32). Both models evaluate the same formulas in fp32 on
 * the same fp32 inputs. They
 * differ only in rounding: the order of summation inside matrix products
 * and row reductions (cuBLASLt tiles and splits vs OpenBLAS; warp trees vs
 * sequential loops), FMA contraction, and expf (CUDA within 2 ulp, glibc
 * within 1). A sum of K terms in two different orders differs by at most
 * 2 (K-1) u sum|terms| (u = 2^-24, Higham's gamma bound), and typically by
 * ~sqrt(K) u sum|terms| since rounding errors have random signs. Here
 * K <= max(4C, B*T, V) = 768 (largest config), so one product differs by
 * <= 1e-4 of its magnitude in the (unreachable) worst case and ~2e-6
 * typically. A gradient is the end of a chain of about 8 such products per
 * block plus the head; first-order error terms add, so the typical
 * difference is ~1e-5 of the gradient's magnitude at most. The comparison
 * is against the largest |g| of the unit (an element that is a cancelling
 * sum of large terms has an absolute, not relative, error), so
 *     max |g_gpu - g_cpu| <= 1e-4 * max |g_cpu| + 1e-9   (per unit)
 * leaves ~10x headroom over the typical estimate. Measured (2026-11-30,
 * no GPU at hand) under a throwaway host emulation of the CUDA runtime and
 * cuBLASLt, with the GEMMs summed in fp32 in reverse order, the correct code
 * stays below 0.07 of the bound, while
 * bugs injected on purpose (dK = dS Q instead of dS^T Q; 1.1/sqrt(hs) in
 * the attention backward; a LayerNorm backward without its weight; the
 * token scatter dropping repeated tokens; loss_scale ignored) move the
 * worst element by 9% to 100% of max |g|, about 1000x the bound. The loss
 * (a mean of log-sum-exps, each with error ~ C u |logits|) must agree to
 * 1e-4 relative. Each comparison prints its observed ratio to the bound.
 *
 * 16-BIT WORKING DTYPES. With bf16 or fp16 parameters the CPU still
 * computes in fp32 on the widened parameters, while the CUDA model stores
 * what feeds its products in the 16-bit dtype (gpt2_cuda.cu, PRECISION):
 * each such value is rounded once, a relative error of at most u (2^-8 for
 * bf16, 2^-11 for fp16), and the fp32 rounding above becomes negligible.
 * A gradient element is a sum over rows of products along a chain; to first
 * order its error is a sum of (rounding error x sensitivity) terms, one per
 * rounded value on the chain. A block's chain has about 16 roundings
 * (forward: ln1, qkv, P, attention output, ln2, fc, gelu; backward: the
 * rounded residual gradient twice, d fc before and after gelu', d attention
 * output, d S, d qkv; the head adds lnf and d logits), so the worst case is
 * ~16 u |g| and, the errors having random signs, the typical one
 * ~sqrt(16) u = 4 u of |g|. Measured against max |g| of the unit:
 *     max |g_gpu - g_cpu| <= 8 u * max |g_cpu| + 1e-9   (per unit)
 * i.e. 3.1% for bf16 and 0.39% for fp16: twice the typical estimate, and
 * still below the 9% that the smallest injected bug above produces. The
 * loss, a mean over rows whose rounding errors average out, must agree to
 * u relative.
 *
 * Also checked: accumulation (a second backward adds), loss_scale,
 * bitwise determinism of the CUDA model, that set_batch copies the host
 * buffers before it returns, that bad tokens/targets/pointers and calls out
 * of order are refused, and that SGD with the CUDA gradients trains.
 *
 * On a GPU below compute capability 8.0 (Volta, Turing) the CUDA model
 * refuses bf16 (device_caps.h): the bf16 configurations are left out there,
 * saying so, and the rest runs; the attention those GPUs take, the GEMM
 * path, is checked on any GPU by test_attention_gemm_matches_cpu
 * (ZPP_ATTENTION=gemm, model/attention_path.h).
 *
 * Needs an NVIDIA GPU (label "gpu"); without one it skips saying so. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "device/device_caps.h"
#include "model/gpt2.h"
#include "model/model.h"
#include "cuda_testlib.h"
#include "model_testlib.h"
#include "testlib.h"

#define GRAD_FLOOR 1e-9

/* The bounds of the top, by working dtype: fp32 as derived there; bf16 and
 * fp16 as derived in "16-BIT WORKING DTYPES" (u = 2^-8 for bf16, 2^-11 for
 * fp16). GRAD: relative to max |g| of the unit; LOSS: relative. */
static double grad_tol(zpp_dtype dt) {
    return dt == ZPP_BF16 ? 8.0 / 256.0 : dt == ZPP_FP16 ? 8.0 / 2048.0 : 1e-4;
}
static double loss_tol(zpp_dtype dt) {
    return dt == ZPP_BF16 ? 1.0 / 256.0 : dt == ZPP_FP16 ? 1.0 / 2048.0 : 1e-4;
}

/* ---- device plumbing -------------------------------------------------------- */

static zpp_device *gpu_open(void) {
    return zpp_test_gpu_open("test_gpt2_cuda checks the CUDA GPT-2");
}

/* GPU 0's compute capability, 10 * major + minor (asked once). */
static int gpu_cc(void) {
    static int cc = -1;
    if (cc < 0) {
        zpp_device *d = gpu_open();
        int major = 0, minor = 0;
        EXPECT_OK(zpp_device_compute_capability(d, &major, &minor));
        zpp_device_destroy(d);
        cc = 10 * major + minor;
    }
    return cc;
}

/* Whether the CUDA model computes in dt on GPU 0: not bf16 below 8.0
 * (device_caps.h), where the configuration `what` is left out, saying so. */
static int dtype_here(zpp_dtype dt, const char *what) {
    if (dt != ZPP_BF16 || gpu_cc() >= ZPP_CC_BF16) return 1;
    printf("  %s: left out, bf16 needs compute capability 8.0 and GPU 0 is %d.%d\n", what,
           gpu_cc() / 10, gpu_cc() % 10);
    return 0;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) zpp_test_fail(__FILE__, __LINE__, NULL, "out of host memory (%zu x %zu)", n, size);
    return p;
}

static void *dalloc(zpp_device *d, size_t bytes) {
    void *p = NULL;
    EXPECT_OK(zpp_device_alloc(d, bytes, &p));
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the CPU model and the CUDA model side by side -------------------------- */

typedef struct twin {
    zpp_gpt2_config cfg;
    zpp_gpt2_layout lay;
    zpp_dtype dtype;
    zpp_device *dev; /* GPU 0, whose compute stream the CUDA model uses */
    void *own;       /* dev's own stream, while dev->stream is lent NULL */
    zpp_model *cpu, *gpu;
    int nu;
    float **p;  /* fp32 parameters per unit (the source of truth) */
    void **pw;  /* host parameters in the working dtype (== p for fp32) */
    void **dp;  /* device parameters in the working dtype */
    float **gc; /* CPU gradients */
    float **dg; /* device gradients */
    float **gg; /* host copy of the device gradients */
} twin;

static twin twin_make(zpp_gpt2_config cfg, zpp_dtype dtype, int max_batch, int own_stream) {
    twin t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.dtype = dtype;
    zpp_gpt2_layout_make(&cfg, &t.lay);
    t.dev = gpu_open();
    /* Without its own stream the model runs on the legacy default stream:
     * the device's compute stream is the NULL handle (CUDA's legacy default
     * stream) from before the model is created (the model keeps the stream
     * it is given) until twin_free, so the test's copies, memsets and
     * synchronisations through the device run on the model's stream too;
     * twin_free gives the device its own stream back for
     * zpp_device_destroy. */
    t.own = t.dev->stream;
    if (!own_stream) t.dev->stream = NULL;
    EXPECT_OK(zpp_gpt2_cpu_create(&cfg, dtype, max_batch, &t.cpu));
    EXPECT_OK(zpp_gpt2_cuda_create(&cfg, dtype, max_batch, t.dev, &t.gpu));
    zpp_model *c = t.cpu, *g = t.gpu;
    /* the same units, stages and shape as the reference */
    EXPECT(g->mem == ZPP_MEM_DEVICE, "mem %d", (int)g->mem);
    EXPECT(g->param_dtype == dtype && g->n_units == c->n_units && g->n_stages == c->n_stages &&
               g->seq_len == c->seq_len && g->vocab_size == c->vocab_size &&
               g->real_vocab_size == c->real_vocab_size &&
               g->max_batch == c->max_batch,
           "units %d/%d stages %d/%d", g->n_units, c->n_units, g->n_stages, c->n_stages);
    for (int u = 0; u < c->n_units; u++)
        EXPECT(g->unit_numel[u] == c->unit_numel[u], "unit %d: %zu vs %zu elements", u,
               g->unit_numel[u], c->unit_numel[u]);
    for (int s = 0; s < c->n_stages; s++)
        EXPECT(g->stage_unit[s] == c->stage_unit[s], "stage %d: unit %d vs %d", s,
               g->stage_unit[s], c->stage_unit[s]);
    t.nu = c->n_units;
    t.p = xcalloc((size_t)t.nu, sizeof *t.p);
    t.pw = xcalloc((size_t)t.nu, sizeof *t.pw);
    t.dp = xcalloc((size_t)t.nu, sizeof *t.dp);
    t.gc = xcalloc((size_t)t.nu, sizeof *t.gc);
    t.dg = xcalloc((size_t)t.nu, sizeof *t.dg);
    t.gg = xcalloc((size_t)t.nu, sizeof *t.gg);
    size_t dsz = zpp_dtype_size(dtype);
    for (int u = 0; u < t.nu; u++) {
        size_t k = c->unit_numel[u];
        t.p[u] = xcalloc(k, sizeof(float));
        t.pw[u] = dtype == ZPP_FP32 ? (void *)t.p[u] : xcalloc(k, dsz);
        t.dp[u] = dalloc(t.dev, k * dsz);
        t.gc[u] = xcalloc(k, sizeof(float));
        t.dg[u] = dalloc(t.dev, k * sizeof(float));
        t.gg[u] = xcalloc(k, sizeof(float));
    }
    return t;
}

/* The synchronisations report any error of the work enqueued on the
 * model's stream. (The device API has no call for CUDA's pending last
 * error, which this once also checked with cudaGetLastError.) */
static void twin_free(twin *t) {
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
    for (int u = 0; u < t->nu; u++) {
        if (t->pw[u] != t->p[u]) free(t->pw[u]);
        free(t->p[u]);
        free(t->gc[u]);
        free(t->gg[u]);
        zpp_device_free(t->dev, t->dp[u]);
        zpp_device_free(t->dev, t->dg[u]);
    }
    free(t->p), free(t->pw), free(t->dp), free(t->gc), free(t->dg), free(t->gg);
    t->cpu->ops->destroy(t->cpu);
    t->gpu->ops->destroy(t->gpu);
    t->dev->stream = t->own; /* its own again, if it lent NULL */
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
    zpp_device_destroy(t->dev);
}

/* p -> working dtype (rounded) -> device. The copies run on the device's
 * compute stream, the model's, and return once the host data has been
 * read; the synchronisation fences the upload all the same. */
static void twin_upload(twin *t) {
    size_t dsz = zpp_dtype_size(t->dtype);
    for (int u = 0; u < t->nu; u++) {
        size_t k = t->cpu->unit_numel[u];
        if (t->dtype != ZPP_FP32)
            for (size_t i = 0; i < k; i++) zpp_store_f32(t->pw[u], t->dtype, i, t->p[u][i]);
        EXPECT_OK(zpp_device_copy(t->dev, t->dp[u], t->pw[u], k * dsz));
    }
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
}

/* Initial parameters from the CPU model's init_params; the CUDA model's
 * must give the same bits (it is the same pure function). */
static void twin_init(twin *t, uint64_t seed) {
    for (int u = 0; u < t->nu; u++) {
        size_t k = t->cpu->unit_numel[u];
        EXPECT_OK(t->cpu->ops->init_params(t->cpu, u, 0, k, t->p[u], seed));
        float *q = xcalloc(k, sizeof(float));
        EXPECT_OK(t->gpu->ops->init_params(t->gpu, u, 0, k, q, seed));
        EXPECT(memcmp(q, t->p[u], k * sizeof(float)) == 0, "unit %d: init differs from CPU", u);
        free(q);
    }
    twin_upload(t);
}

static void twin_zero_grads(twin *t) {
    for (int u = 0; u < t->nu; u++) {
        size_t k = t->cpu->unit_numel[u];
        memset(t->gc[u], 0, k * sizeof(float));
        EXPECT_OK(zpp_device_set(t->dev, t->dg[u], 0, k * sizeof(float)));
    }
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
}

static void twin_download(twin *t) {
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
    for (int u = 0; u < t->nu; u++)
        EXPECT_OK(zpp_device_copy(t->dev, t->gg[u], t->dg[u],
                                  t->cpu->unit_numel[u] * sizeof(float)));
}

static float model_forward(zpp_model *m, void *const *params, const int32_t *tok,
                           const int32_t *tgt, int B) {
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
    for (int s = 0; s < m->n_stages; s++)
        EXPECT_OK(m->ops->forward(m, s, params[m->stage_unit[s]]));
    return m->ops->loss(m);
}

/* Stage 0's backward gets NULL params: it must not read them. */
static void model_backward(zpp_model *m, void *const *params, float *const *grads, float scale) {
    for (int s = m->n_stages - 1; s >= 0; s--) {
        int u = m->stage_unit[s];
        EXPECT_OK(m->ops->backward(m, s, s == 0 ? NULL : params[u], grads[u], scale));
    }
}

static float gpu_step(twin *t, const int32_t *tok, const int32_t *tgt, int B, float scale) {
    float l = model_forward(t->gpu, t->dp, tok, tgt, B);
    model_backward(t->gpu, t->dp, t->dg, scale);
    twin_download(t);
    return l;
}

static void random_tokens(zpp_rng *r, int32_t *x, size_t n, int range) {
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)(zpp_rng_u64(r) % (uint64_t)range);
}

/* The tensor that holds element i of a unit, for messages. */
static const char *tensor_name(const twin *t, int unit, size_t i, size_t *local_p) {
    const zpp_gpt2_layout *l = &t->lay;
    static const char *const embed_names[] = {"wte", "wpe", "lnf_w", "lnf_b"};
    static const char *const block_names[] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b",
                                              "proj_w", "proj_b", "ln2_w", "ln2_b",
                                              "fc_w",  "fc_b",  "fc2_w", "fc2_b"};
    size_t eo[] = {l->wte, l->wpe, l->lnf_w, l->lnf_b};
    size_t bo[] = {l->ln1_w, l->ln1_b, l->qkv_w,  l->qkv_b, l->proj_w, l->proj_b,
                   l->ln2_w, l->ln2_b, l->fc_w,   l->fc_b,  l->fc2_w,  l->fc2_b};
    const size_t *o = unit == 0 ? eo : bo;
    int k = unit == 0 ? 4 : 12, j = 0;
    while (j + 1 < k && o[j + 1] <= i) j++;
    *local_p = i - o[j];
    return unit == 0 ? embed_names[j] : block_names[j];
}

/* Every unit's gradient, CUDA vs CPU, with the bound derived at the top. */
static void compare_grads(const twin *t, const char *what) {
    for (int u = 0; u < t->nu; u++) {
        size_t k = t->cpu->unit_numel[u], worst = 0;
        double gmax = 0, dmax = 0;
        for (size_t i = 0; i < k; i++) {
            double a = t->gc[u][i], b = t->gg[u][i], d = fabs(a - b);
            EXPECT(isfinite(b), "%s: unit %d element %zu: CUDA gradient %g", what, u, i, b);
            if (fabs(a) > gmax) gmax = fabs(a);
            if (d > dmax) dmax = d, worst = i;
        }
        double bound = grad_tol(t->dtype) * gmax + GRAD_FLOOR;
        size_t li;
        const char *name = tensor_name(t, u, worst, &li);
        printf("  %s unit %d: max|g| %.3e, max|diff| %.3e = %.3f of the bound (at %s[%zu])\n",
               what, u, gmax, dmax, dmax / bound, name, li);
        EXPECT(gmax > 0, "%s: unit %d has an all-zero CPU gradient: the test is vacuous", what, u);
        EXPECT(dmax <= bound,
               "%s: unit %d: |g_cuda - g_cpu| = %.3e at %s[%zu] (cuda %.9g, cpu %.9g) exceeds "
               "%.2e * max|g| (%.3e) + %.0e",
               what, u, dmax, name, li, t->gg[u][worst], t->gc[u][worst], grad_tol(t->dtype), gmax,
               GRAD_FLOOR);
    }
}

/* One micro-batch through both models from zero gradients; compares the
 * loss and every gradient. */
static void compare_step(twin *t, const int32_t *tok, const int32_t *tgt, int B, float scale,
                         const char *what) {
    twin_zero_grads(t);
    float lc = model_forward(t->cpu, t->pw, tok, tgt, B);
    float lg = model_forward(t->gpu, t->dp, tok, tgt, B);
    printf("  %s: loss cpu %.7f cuda %.7f (rel diff %.2e)\n", what, lc, lg,
           fabs((double)lc - lg) / fabs((double)lc));
    EXPECT(isfinite(lc) && isfinite(lg), "%s: loss cpu %g cuda %g", what, lc, lg);
    EXPECT(fabs((double)lc - lg) <= loss_tol(t->dtype) * fabs((double)lc),
           "%s: loss cuda %.9g vs cpu %.9g (rel %.2e > %.2e)", what, lg, lc,
           fabs((double)lc - lg) / fabs((double)lc), loss_tol(t->dtype));
    model_backward(t->cpu, t->pw, t->gc, scale);
    model_backward(t->gpu, t->dp, t->dg, scale);
    twin_download(t);
    compare_grads(t, what);
}

/* Moves the parameters away from the init, where LayerNorm weights are 1,
 * biases 0 and attention is nearly uniform (q.k ~ 0): there a kernel that
 * forgot a LayerNorm weight, used the wrong bias, or got the attention
 * backward wrong would hardly show. LayerNorm weights become 1 + 0.2 N(0,1),
 * every bias 0.05 N(0,1), and the qkv weights are scaled by k so that the
 * scores have std ~1 at any width and the softmax is far from uniform: a
 * score q.k / sqrt(hs) has std ~ sd(q) sd(k), each ~ k 0.02 sqrt(C), so
 * k = 8 sqrt(64 / C) keeps it where k = 8 puts it for C = 64. (A constant 8
 * made the C = 256 model's scores 4x sharper than intended, and sharper
 * softmaxes amplify every rounding of q and k.) */
static void twin_perturb(twin *t, zpp_rng *r) {
    const zpp_gpt2_layout *l = &t->lay;
    size_t C = (size_t)t->cfg.n_embd;
    for (int u = 0; u < t->nu; u++) {
        float *p = t->p[u];
        if (u == 0) {
            for (size_t i = 0; i < C; i++) {
                p[l->lnf_w + i] = (float)(1.0 + 0.2 * zpp_rng_normal(r));
                p[l->lnf_b + i] = (float)(0.05 * zpp_rng_normal(r));
            }
            continue;
        }
        size_t lnw[2] = {l->ln1_w, l->ln2_w};
        size_t bias[6][2] = {{l->ln1_b, C},  {l->qkv_b, 3 * C}, {l->proj_b, C},
                             {l->ln2_b, C},  {l->fc_b, 4 * C},  {l->fc2_b, C}};
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < C; i++) p[lnw[k] + i] = (float)(1.0 + 0.2 * zpp_rng_normal(r));
        for (int k = 0; k < 6; k++)
            for (size_t i = 0; i < bias[k][1]; i++)
                p[bias[k][0] + i] = (float)(0.05 * zpp_rng_normal(r));
        const float k = (float)(8.0 * sqrt(64.0 / (double)C));
        for (size_t i = 0; i < 3 * C * C; i++) p[l->qkv_w + i] *= k;
    }
    twin_upload(t);
}

/* With a padded vocabulary (real_vocab_size < vocab_size) the padded rows
 * of wte are outside the softmax and no token uses them: their gradient
 * must be exactly 0 on both models. */
static void expect_padded_rows_zero(const twin *t, const char *what) {
    const size_t C = (size_t)t->cfg.n_embd, lo = (size_t)zpp_gpt2_real_vocab(&t->cfg) * C,
                 hi = (size_t)t->cfg.vocab_size * C;
    for (size_t i = lo; i < hi; i++)
        EXPECT(t->gc[0][t->lay.wte + i] == 0.0f && t->gg[0][t->lay.wte + i] == 0.0f,
               "%s: padded wte element %zu has gradient cpu %g, cuda %g", what, i,
               t->gc[0][t->lay.wte + i], t->gg[0][t->lay.wte + i]);
}

/* A config, two batches: B = max_batch, then a smaller B (rows in use fewer
 * than the slabs' stride; activations of the first batch left behind).
 * Parameters: the init, moved by twin_perturb. */
static void check_config(zpp_gpt2_config cfg, zpp_dtype dt, int max_batch, int token_range,
                         uint64_t stream_id, int own_stream) {
    if (!dtype_here(dt, "check_config")) return;
    twin t = twin_make(cfg, dt, max_batch, own_stream);
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream_id));
    twin_init(&t, zpp_rng_u64(&r));
    twin_perturb(&t, &r);
    size_t nmax = (size_t)max_batch * cfg.seq_len;
    int32_t *tok = xcalloc(nmax, sizeof(int32_t)), *tgt = xcalloc(nmax, sizeof(int32_t));
    int Bs[2] = {max_batch, max_batch > 1 ? 1 + (int)(zpp_rng_u64(&r) % (max_batch - 1)) : 1};
    for (int k = 0; k < 2; k++) {
        int B = Bs[k];
        random_tokens(&r, tok, (size_t)B * cfg.seq_len, token_range);
        random_tokens(&r, tgt, (size_t)B * cfg.seq_len, zpp_gpt2_real_vocab(&cfg));
        float scale = (float)(0.5 + 7.5 * zpp_rng_uniform(&r));
        char what[160];
        snprintf(what, sizeof what, "L%d H%d C%d T%d V%d/%d %s B%d/%d scale %.3f", cfg.n_layer,
                 cfg.n_head, cfg.n_embd, cfg.seq_len, zpp_gpt2_real_vocab(&cfg), cfg.vocab_size,
                 zpp_dtype_name(dt), B, max_batch, scale);
        compare_step(&t, tok, tgt, B, scale, what);
        if (zpp_gpt2_real_vocab(&cfg) < cfg.vocab_size) expect_padded_rows_zero(&t, what);
    }
    free(tok);
    free(tgt);
    twin_free(&t);
}

/* ---- tests ------------------------------------------------------------------ */

/* fp32 parameters: the loss and every gradient match the CPU reference.
 *   A: C = 64, B = 3 <= H = 4 (attention batched over heads), V = 128 with
 *      B*T = 96 uniform tokens (some repeats), on the legacy stream.
 *   B: C = 48 (not a multiple of 32), H = 3, hs = 16, T = 19, V = 101,
 *      B = 5 > H (attention batched over sequences), tokens from 0..6 only
 *      (long runs of each token in the embedding scatter), own stream.
 *   C: C = 192, H = 6, hs = 32, T = 64, V = 512, B = 4: larger products
 *      (other cuBLASLt algorithms, split-K), own stream.
 *   D: C = 320, H = 5, hs = 64: rows wider than a warp's 256 columns, so the
 *      LayerNorm backward's row groups (a row across a CTA's threads, 8
 *      columns each) add the row's sums over two warps, the second partly
 *      idle. */
static void test_matches_cpu_fp32(void) {
    check_config((zpp_gpt2_config){2, 4, 64, 32, 128, 0, 0, 0}, ZPP_FP32, 3, 128, 1, 0);
    check_config((zpp_gpt2_config){2, 3, 48, 19, 101, 0, 0, 0}, ZPP_FP32, 5, 7, 2, 1);
    /* keeping the LayerNorm and GELU outputs (keep_acts) */
    check_config((zpp_gpt2_config){2, 3, 48, 19, 101, 0, 0, ZPP_KEEP_ALL}, ZPP_FP32, 5, 7, 19, 1);
    check_config((zpp_gpt2_config){2, 6, 192, 64, 512, 0, 0, 0}, ZPP_FP32, 4, 512, 3, 1);
    check_config((zpp_gpt2_config){1, 5, 320, 24, 96, 0, 0, 0}, ZPP_FP32, 2, 96, 16, 0);
    /* C = 36, not a multiple of 8: the elementwise kernels' one-at-a-time
     * path (8-wide accesses need rows of a multiple of 8) */
    check_config((zpp_gpt2_config){1, 3, 36, 13, 50, 0, 0, 0}, ZPP_FP32, 2, 50, 10, 1);
    /* V = 16 C: the backward's and the recompute's scratch in the d logits
     * (gpt2_cuda.cu, SCRATCH IN THE LOGITS), recomputing and keeping */
    check_config((zpp_gpt2_config){2, 2, 32, 16, 512, 0, 0, 0}, ZPP_FP32, 3, 512, 20, 1);
    check_config((zpp_gpt2_config){2, 2, 32, 16, 512, 0, 0, ZPP_KEEP_LAYERNORM}, ZPP_FP32, 3,
                 512, 21, 0);
}

/* bf16 and fp16 parameters: the CUDA model computes in the 16-bit dtype
 * (tensor-core products, activations stored in it), the CPU in fp32 on the
 * same widened parameters; the 16-bit bounds of the top apply. Head sizes
 * 16 take the GEMM attention, 64 and 128 (bf16) the fused one. */
static void test_matches_cpu_bf16_fp16(void) {
    check_config((zpp_gpt2_config){2, 4, 64, 32, 128, 0, 0, 0}, ZPP_BF16, 3, 128, 4, 1);
    check_config((zpp_gpt2_config){2, 3, 48, 19, 101, 0, 0, 0}, ZPP_BF16, 5, 7, 5, 0);
    /* keeping the LayerNorm and GELU outputs (keep_acts: fc2's weight
     * gradient reads the GELU epilogue's output, gpt2_cuda.cu RECOMPUTE) */
    check_config((zpp_gpt2_config){2, 4, 64, 32, 128, 0, 0, ZPP_KEEP_ALL}, ZPP_BF16, 3, 128, 18,
                 1);
    /* V = 16 C: the scratch in the d logits, with the fused attention;
     * keeping the LayerNorm outputs only */
    check_config((zpp_gpt2_config){2, 2, 128, 32, 2048, 0, 0, 0}, ZPP_BF16, 3, 2048, 22, 0);
    check_config((zpp_gpt2_config){2, 2, 128, 32, 2048, 0, 0, ZPP_KEEP_LAYERNORM}, ZPP_BF16, 3,
                 2048, 23, 1);
    check_config((zpp_gpt2_config){1, 3, 48, 19, 101, 0, 0, 0}, ZPP_FP16, 2, 101, 6, 1);
    check_config((zpp_gpt2_config){1, 3, 36, 13, 50, 0, 0, 0}, ZPP_BF16, 2, 50, 11, 0);
    check_config((zpp_gpt2_config){1, 5, 320, 24, 96, 0, 0, 0}, ZPP_BF16, 2, 96, 17, 1);
    /* head sizes 64 and 128: the fused attention (attention_cuda.cu), with
     * T = 80 and 40 not multiples of its tiles */
    check_config((zpp_gpt2_config){2, 2, 128, 80, 128, 0, 0, 0}, ZPP_BF16, 3, 128, 8, 1);
    check_config((zpp_gpt2_config){1, 2, 256, 40, 96, 0, 0, 0}, ZPP_BF16, 2, 96, 9, 0);
}

/* The padded vocabulary (model.h, real_vocab_size; llm.c's model files):
 * logits over all vocab_size columns, softmax and d logits over the first
 * real_vocab_size only. Loss and gradients match the CPU reference (whose
 * padded softmax test_llmc.c checks against the unpadded model) within the
 * bounds of the top, and the padded rows' gradients are exactly 0 on both.
 * Tokens and targets stay below real_vocab_size, as from llm.c's data. */
static void test_padded_vocab_matches_cpu(void) {
    check_config((zpp_gpt2_config){2, 4, 64, 32, 128, 101, 0, 0}, ZPP_FP32, 3, 101, 12, 1);
    check_config((zpp_gpt2_config){1, 3, 48, 19, 112, 101, 0, 0}, ZPP_BF16, 2, 101, 13, 0);
}

/* A batch of 1560 rows (B*T, 520 a sequence) through the classifier's one
 * product and in-place softmax (gpt2_cuda.cu, HEAD): more rows than the
 * other tests' batches. Loss and gradients match the CPU reference within
 * the bounds of the top, in fp32 (the GEMM attention) and bf16 (the fused
 * one, logits in bf16). */
static void test_head_many_rows_matches_cpu(void) {
    check_config((zpp_gpt2_config){1, 2, 32, 520, 64, 0, 0, 0}, ZPP_FP32, 3, 64, 14, 1);
    check_config((zpp_gpt2_config){1, 2, 128, 520, 96, 0, 0, 0}, ZPP_BF16, 3, 96, 15, 0);
}

/* Accumulation and loss_scale: with grads holding g1 (scale 1), a second
 * forward+backward of the same batch with scale 4 must leave g1 + 4 g1.
 * Scaling d logits by a power of two commutes with every rounding (no
 * overflow/underflow at these sizes), and the model is deterministic, so
 * the second pass adds exactly 4 g1 up to the rounding of the additions
 * into the buffer: a few ulp of the partial sums, far below
 * 2e-5 * max|5 g1|. Forgetting to accumulate (4 g1) or to scale (2 g1)
 * misses by >= 20% of max|g|. The two losses must be bit-identical. */
static void test_accumulation_and_scale(void) {
    zpp_gpt2_config cfg = {2, 3, 48, 19, 101, 0, 0, 0};
    int B = 3;
    twin t = twin_make(cfg, ZPP_FP32, B, 1);
    zpp_rng r = zpp_rng_make(zpp_test_seed(7));
    twin_init(&t, zpp_rng_u64(&r));
    size_t n = (size_t)B * cfg.seq_len;
    int32_t *tok = xcalloc(n, 4), *tgt = xcalloc(n, 4);
    random_tokens(&r, tok, n, 13);
    random_tokens(&r, tgt, n, cfg.vocab_size);
    twin_zero_grads(&t);
    float l1 = gpu_step(&t, tok, tgt, B, 1.0f);
    float **g1 = xcalloc((size_t)t.nu, sizeof *g1);
    for (int u = 0; u < t.nu; u++) {
        g1[u] = xcalloc(t.gpu->unit_numel[u], sizeof(float));
        memcpy(g1[u], t.gg[u], t.gpu->unit_numel[u] * sizeof(float));
    }
    float l2 = gpu_step(&t, tok, tgt, B, 4.0f); /* no zeroing: accumulates */
    EXPECT(memcmp(&l1, &l2, sizeof l1) == 0, "same batch, losses %.9g vs %.9g", l1, l2);
    for (int u = 0; u < t.nu; u++) {
        size_t k = t.gpu->unit_numel[u], worst = 0;
        double gmax = 0, dmax = 0;
        for (size_t i = 0; i < k; i++) {
            double want = 5.0 * g1[u][i], d = fabs(t.gg[u][i] - want);
            if (fabs(want) > gmax) gmax = fabs(want);
            if (d > dmax) dmax = d, worst = i;
        }
        size_t li;
        const char *name = tensor_name(&t, u, worst, &li);
        printf("  accumulate unit %d: max|5 g1| %.3e, max|g2 - 5 g1| %.3e\n", u, gmax, dmax);
        EXPECT(gmax > 0 && dmax <= 2e-5 * gmax,
               "unit %d: after a scale-1 and a scale-4 backward, %s[%zu] = %.9g, expected "
               "5 x %.9g (max|5 g1| %.3e)", u, name, li, t.gg[u][worst], g1[u][worst], gmax);
        free(g1[u]);
    }
    free(g1);
    free(tok);
    free(tgt);
    twin_free(&t);
}

/* ---- gradients in bf16 (set_grad_dtype; the engine's work_grads) ----------
 * The same backward into bf16 units, against fp32 units from the same
 * inputs. Each element of a unit is added to once a backward (the tied wte
 * twice: the head's product, then the embedding's rows), into zeros: each
 * add is done in fp32 and rounded once (u = 2^-8), and what is rounded may
 * differ from the fp32 unit's value by a reassociation (another cuBLASLt
 * algorithm for a bf16 output: fp32 error, the 1e-5 x max|g| term). So
 *   |g16 - g32| <= 2^-8 |g32| + 1e-5 max|g|                (one add)
 *   |g16 - g32| <= 2^-8 |g32| + 2^-8 max|g| + 1e-5 max|g|   (wte: the first
 * rounding is of the head's part, at most max|g| only without
 * cancellation, which random inputs do not give at this size).
 * A second backward adds into the bf16 sums (GEMMs at beta = 1): with the
 * scale 4 the units hold 5 g within two roundings of each add. A third,
 * after overwrite_grads, writes over those sums (OVERWRITE in
 * gpt2_cuda.cu): g again, within the first pass's bound. Setting fp32
 * back and overwriting garbage gives the fp32 gradient again. */
static void check_bf16_grads(zpp_gpt2_config cfg, int B, uint64_t seed_k) {
    twin t = twin_make(cfg, ZPP_BF16, B, 1);
    zpp_rng r = zpp_rng_make(zpp_test_seed(seed_k));
    twin_init(&t, zpp_rng_u64(&r));
    const size_t n = (size_t)B * cfg.seq_len;
    int32_t *tok = xcalloc(n, 4), *tgt = xcalloc(n, 4);
    random_tokens(&r, tok, n, cfg.vocab_size);
    random_tokens(&r, tgt, n, cfg.vocab_size);
    twin_zero_grads(&t);
    gpu_step(&t, tok, tgt, B, 1.0f);
    float **g32 = xcalloc((size_t)t.nu, sizeof *g32);
    void **d16 = xcalloc((size_t)t.nu, sizeof *d16);
    zpp_bf16 *h16 = NULL;
    size_t most = 0;
    for (int u = 0; u < t.nu; u++) {
        const size_t k = t.gpu->unit_numel[u];
        g32[u] = xcalloc(k, sizeof(float));
        memcpy(g32[u], t.gg[u], k * sizeof(float));
        d16[u] = dalloc(t.dev, k * 2);
        EXPECT_OK(zpp_device_set(t.dev, d16[u], 0, k * 2));
        if (k > most) most = k;
    }
    h16 = xcalloc(most, 2);
    EXPECT_STATUS(t.gpu->ops->set_grad_dtype(t.gpu, ZPP_FP16), ZPP_ERR_UNSUPPORTED);
    EXPECT_OK(t.gpu->ops->set_grad_dtype(t.gpu, ZPP_BF16));
    for (int pass = 1; pass <= 3; pass++) {
        const float scale = pass == 2 ? 4.0f : 1.0f, mult = pass == 2 ? 5.0f : 1.0f;
        if (pass == 3) EXPECT_OK(t.gpu->ops->overwrite_grads(t.gpu));
        model_forward(t.gpu, t.dp, tok, tgt, B);
        for (int s = t.gpu->n_stages - 1; s >= 0; s--) {
            const int u = t.gpu->stage_unit[s];
            EXPECT_OK(t.gpu->ops->backward(t.gpu, s, s == 0 ? NULL : t.dp[u], d16[u], scale));
        }
        EXPECT_OK(zpp_device_sync(t.dev, NULL));
        for (int u = 0; u < t.nu; u++) {
            const size_t k = t.gpu->unit_numel[u];
            EXPECT_OK(zpp_device_copy(t.dev, h16, d16[u], k * 2));
            double gmax = 0, worst_ratio = 0;
            size_t worst = 0;
            for (size_t i = 0; i < k; i++)
                if (fabs(mult * g32[u][i]) > gmax) gmax = fabs(mult * g32[u][i]);
            /* the roundings of the adds so far: one or two a backward */
            const int since = pass == 2 ? 2 : 1; /* backwards since the sum began */
            const double adds = (u == 0 ? 2.0 : 1.0) * since;
            for (size_t i = 0; i < k; i++) {
                const double want = mult * g32[u][i], got = zpp_bf16_to_f32(h16[i]);
                const double bound = adds * (fabs(want) + (u == 0 || since > 1 ? gmax : 0)) /
                                         256.0 + 1e-5 * gmax + GRAD_FLOOR;
                const double ratio = fabs(got - want) / bound;
                if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
            }
            size_t li;
            const char *name = tensor_name(&t, u, worst, &li);
            printf("  bf16 gradients, backward %d, unit %d: max|g| %.3e, worst %.3f of the bound "
                   "(at %s[%zu])\n", pass, u, gmax, worst_ratio, name, li);
            EXPECT(gmax > 0, "unit %d: all-zero gradient, the test is vacuous", u);
            EXPECT(worst_ratio <= 1.0,
                   "backward %d, unit %d: bf16 %s[%zu] = %.9g, fp32 x %g = %.9g: outside the "
                   "rounding bound", pass, u, name, li, (double)zpp_bf16_to_f32(h16[worst]),
                   (double)mult, mult * (double)g32[u][worst]);
        }
    }
    /* fp32 again: the first backward's bits, from zeros; and over garbage
     * (bytes 0x41: 12.1 in every float) after overwrite_grads, the same
     * values up to the products' algorithm for beta = 0 */
    EXPECT_OK(t.gpu->ops->set_grad_dtype(t.gpu, ZPP_FP32));
    twin_zero_grads(&t);
    gpu_step(&t, tok, tgt, B, 1.0f);
    for (int u = 0; u < t.nu; u++)
        EXPECT(!memcmp(g32[u], t.gg[u], t.gpu->unit_numel[u] * sizeof(float)),
               "unit %d: fp32 gradients after bf16 ones differ from before", u);
    for (int u = 0; u < t.nu; u++)
        EXPECT_OK(zpp_device_set(t.dev, t.dg[u], 0x41, t.gpu->unit_numel[u] * sizeof(float)));
    EXPECT_OK(t.gpu->ops->overwrite_grads(t.gpu));
    gpu_step(&t, tok, tgt, B, 1.0f);
    for (int u = 0; u < t.nu; u++) {
        const size_t k = t.gpu->unit_numel[u];
        double gmax = 0, dmax = 0;
        for (size_t i = 0; i < k; i++) {
            if (fabs(g32[u][i]) > gmax) gmax = fabs(g32[u][i]);
            if (fabs(t.gg[u][i] - g32[u][i]) > dmax) dmax = fabs(t.gg[u][i] - g32[u][i]);
        }
        EXPECT(dmax <= 1e-5 * gmax, "unit %d: fp32 gradients written over garbage differ by "
               "%.3e (max|g| %.3e)", u, dmax, gmax);
    }
    for (int u = 0; u < t.nu; u++) free(g32[u]), zpp_device_free(t.dev, d16[u]);
    free(g32), free(d16), free(h16), free(tok), free(tgt);
    twin_free(&t);
}

/* The row-group LayerNorm backward (C a multiple of 8) with its bias
 * sums, and the warp-per-row one with column sums (C = 36). */
static void test_bf16_gradients(void) {
    if (!dtype_here(ZPP_BF16, "bf16 gradients")) return;
    check_bf16_grads((zpp_gpt2_config){2, 4, 64, 32, 128, 0, 0, 0}, 3, 60);
    check_bf16_grads((zpp_gpt2_config){2, 3, 36, 19, 101, 0, 0, 0}, 2, 61);
}

/* Same inputs, same bits: no atomics, cached cuBLASLt algorithms. A
 * different, larger batch in between must not leak into the repeat. */
static void test_determinism(void) {
    zpp_gpt2_config cfg = {2, 4, 64, 32, 128, 0, 0, 0};
    int Bmax = 4, B = 3;
    twin t = twin_make(cfg, dtype_here(ZPP_BF16, "bf16") ? ZPP_BF16 : ZPP_FP16, Bmax, 1);
    zpp_rng r = zpp_rng_make(zpp_test_seed(8));
    twin_init(&t, zpp_rng_u64(&r));
    size_t n = (size_t)Bmax * cfg.seq_len;
    int32_t *tok = xcalloc(n, 4), *tgt = xcalloc(n, 4), *tok2 = xcalloc(n, 4),
            *tgt2 = xcalloc(n, 4);
    random_tokens(&r, tok, n, 9);
    random_tokens(&r, tgt, n, cfg.vocab_size);
    random_tokens(&r, tok2, n, cfg.vocab_size);
    random_tokens(&r, tgt2, n, cfg.vocab_size);
    twin_zero_grads(&t);
    float la = gpu_step(&t, tok, tgt, B, 1.0f);
    float **ga = xcalloc((size_t)t.nu, sizeof *ga);
    for (int u = 0; u < t.nu; u++) {
        ga[u] = xcalloc(t.gpu->unit_numel[u], sizeof(float));
        memcpy(ga[u], t.gg[u], t.gpu->unit_numel[u] * sizeof(float));
    }
    gpu_step(&t, tok2, tgt2, Bmax, 1.0f);
    twin_zero_grads(&t);
    float lb = gpu_step(&t, tok, tgt, B, 1.0f);
    EXPECT(memcmp(&la, &lb, sizeof la) == 0, "loss %.9g then %.9g", la, lb);
    for (int u = 0; u < t.nu; u++) {
        size_t k = t.gpu->unit_numel[u], diff = 0;
        for (size_t i = 0; i < k; i++) diff += memcmp(&ga[u][i], &t.gg[u][i], 4) != 0;
        EXPECT(diff == 0, "unit %d: %zu of %zu gradient elements differ between two identical "
               "runs (a non-deterministic kernel or cuBLASLt algorithm)", u, diff, k);
        free(ga[u]);
    }
    free(ga);
    free(tok), free(tgt), free(tok2), free(tgt2);
    twin_free(&t);
}

/* set_batch takes pageable host buffers: the caller may overwrite them as
 * soon as it returns. Overwriting them before the forward (which runs
 * asynchronously) must not change the loss. */
static void test_set_batch_copies(void) {
    zpp_gpt2_config cfg = {1, 4, 64, 32, 128, 0, 0, 0};
    int B = 4;
    twin t = twin_make(cfg, ZPP_FP32, B, 1);
    zpp_rng r = zpp_rng_make(zpp_test_seed(9));
    twin_init(&t, zpp_rng_u64(&r));
    size_t n = (size_t)B * cfg.seq_len;
    int32_t *tok = xcalloc(n, 4), *tgt = xcalloc(n, 4);
    random_tokens(&r, tok, n, cfg.vocab_size);
    random_tokens(&r, tgt, n, cfg.vocab_size);
    float clean = model_forward(t.gpu, t.dp, tok, tgt, B);
    zpp_model *m = t.gpu;
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
    for (size_t i = 0; i < n; i++) tok[i] = tgt[i] = (int32_t)((tok[i] + 1) % cfg.vocab_size);
    for (int s = 0; s < m->n_stages; s++) EXPECT_OK(m->ops->forward(m, s, t.dp[m->stage_unit[s]]));
    float l = m->ops->loss(m);
    EXPECT(memcmp(&l, &clean, sizeof l) == 0,
           "loss %.9g after overwriting the host batch, %.9g before: set_batch must copy the "
           "host buffers before it returns", l, clean);
    free(tok);
    free(tgt);
    twin_free(&t);
}

/* Invalid inputs are refused with a message naming the culprit; calls out
 * of order are state errors; host pointers are refused before any kernel
 * can fault on them. */
static void test_rejects_bad_input(void) {
    zpp_gpt2_config cfg = {1, 2, 8, 8, 16, 0, 0, 0};
    int B = 2, V = cfg.vocab_size;
    twin t = twin_make(cfg, ZPP_FP32, B, 0);
    zpp_model *m = t.gpu;
    zpp_rng r = zpp_rng_make(zpp_test_seed(10));
    twin_init(&t, zpp_rng_u64(&r));
    int32_t tok[16], tgt[16];
    random_tokens(&r, tok, 16, V);
    random_tokens(&r, tgt, 16, V);
    EXPECT_STATUS(m->ops->forward(m, 0, t.dp[0]), ZPP_ERR_STATE); /* no batch yet */

    zpp_test_set_batch_rejects(m, &r, tok, tgt, 16, B, V);

    /* host memory where device memory is due */
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
    EXPECT_STATUS(m->ops->forward(m, 0, t.p[0]), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "host memory") != NULL, "'%s'", zpp_last_error());

    /* order of stages */
    EXPECT_STATUS(m->ops->forward(m, 1, t.dp[1]), ZPP_ERR_STATE);
    EXPECT_STATUS(m->ops->forward(m, m->n_stages, t.dp[0]), ZPP_ERR_INVALID);
    EXPECT_OK(m->ops->forward(m, 0, t.dp[0]));
    EXPECT(isnan(m->ops->loss(m)), "loss before the last stage");
    EXPECT_STATUS(m->ops->backward(m, 0, t.dp[0], t.dg[0], 1.0f), ZPP_ERR_STATE);
    EXPECT_OK(m->ops->forward(m, 1, t.dp[1]));
    EXPECT_OK(m->ops->forward(m, 2, t.dp[0]));
    EXPECT(isfinite(m->ops->loss(m)), "loss after the last stage");
    EXPECT_STATUS(m->ops->backward(m, 1, t.dp[1], t.dg[1], 1.0f), ZPP_ERR_STATE);
    EXPECT_STATUS(m->ops->backward(m, 2, t.dp[0], t.gc[0], 1.0f), ZPP_ERR_INVALID); /* host */
    EXPECT_OK(m->ops->backward(m, 2, t.dp[0], t.dg[0], 1.0f));
    EXPECT_STATUS(m->ops->backward(m, 2, t.dp[0], t.dg[0], 1.0f), ZPP_ERR_STATE);
    EXPECT_STATUS(m->ops->backward(m, 1, NULL, t.dg[1], 1.0f), ZPP_ERR_INVALID);
    EXPECT_OK(m->ops->backward(m, 1, t.dp[1], t.dg[1], 1.0f));
    EXPECT_OK(m->ops->backward(m, 0, NULL, t.dg[0], 1.0f)); /* stage 0 reads no params */
    EXPECT_STATUS(m->ops->backward(m, 0, t.dp[0], t.dg[0], 1.0f), ZPP_ERR_STATE);

    /* without targets: forward works, loss is NaN, backward refuses */
    EXPECT_OK(m->ops->set_batch(m, tok, NULL, B));
    for (int s = 0; s < m->n_stages; s++) EXPECT_OK(m->ops->forward(m, s, t.dp[m->stage_unit[s]]));
    EXPECT(isnan(m->ops->loss(m)), "loss without targets");
    EXPECT_STATUS(m->ops->backward(m, 2, t.dp[0], t.dg[0], 1.0f), ZPP_ERR_STATE);

    /* create */
    zpp_model *bad_m = NULL;
    zpp_gpt2_config c2 = cfg;
    c2.n_head = 3; /* does not divide 8 */
    EXPECT_STATUS(zpp_gpt2_cuda_create(&c2, ZPP_FP32, 1, NULL, &bad_m), ZPP_ERR_CONFIG);
    EXPECT(strstr(zpp_last_error(), "n_head") != NULL, "'%s'", zpp_last_error());
    EXPECT_STATUS(zpp_gpt2_cuda_create(&cfg, (zpp_dtype)7, 1, NULL, &bad_m), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_gpt2_cuda_create(&cfg, ZPP_FP32, 0, NULL, &bad_m), ZPP_ERR_INVALID);
    zpp_device *host = NULL;
    EXPECT_OK(zpp_device_create_host(&host));
    EXPECT_STATUS(zpp_gpt2_cuda_create(&cfg, ZPP_FP32, 1, host, &bad_m), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_gpt2_cuda_create(&cfg, ZPP_FP32, 1, NULL, &bad_m), ZPP_ERR_INVALID);
    zpp_device_destroy(host);
    EXPECT(bad_m == NULL, "output set on failure");
    /* no CUDA error left behind by any of the refusals (what the device
     * API can see: an error of the work in flight) */
    EXPECT_OK(zpp_device_sync(t.dev, NULL));
    twin_free(&t);
}

/* Training signal with the CUDA gradients (the CPU test's recipe, same
 * numbers: see test_gpt2.c). (a) a step p -= lr g with lr set so that the
 * first-order predicted drop lr |g|^2 is 0.01 must realise 0.7..1.3 of it;
 * (b) 60 SGD steps (lr 0.3) on the fixed batch take the loss below 40% of
 * its initial ln 64 (a 2-layer model memorising 64 random targets). The
 * CPU model runs the same steps alongside; its losses are printed. */
static void test_sgd_reduces_loss(void) {
    zpp_gpt2_config cfg = {2, 4, 32, 16, 64, 0, 0, 0};
    int B = 4, V = cfg.vocab_size;
    twin t = twin_make(cfg, ZPP_FP32, B, 0);
    zpp_rng r = zpp_rng_make(zpp_test_seed(11));
    twin_init(&t, zpp_rng_u64(&r));
    int32_t tok[64], tgt[64];
    random_tokens(&r, tok, 64, V);
    random_tokens(&r, tgt, 64, V);
    twin_zero_grads(&t);
    float l0 = gpu_step(&t, tok, tgt, B, 1.0f);
    double g2 = 0;
    for (int u = 0; u < t.nu; u++)
        for (size_t i = 0; i < t.gpu->unit_numel[u]; i++) g2 += (double)t.gg[u][i] * t.gg[u][i];
    double lr = 0.01 / g2;
    for (int u = 0; u < t.nu; u++)
        for (size_t i = 0; i < t.gpu->unit_numel[u]; i++) t.p[u][i] -= (float)(lr * t.gg[u][i]);
    twin_upload(&t);
    float l1 = model_forward(t.gpu, t.dp, tok, tgt, B);
    double ratio = (l0 - l1) / (lr * g2);
    EXPECT(ratio > 0.7 && ratio < 1.3, "loss %g -> %g, predicted drop %g (ratio %g)", l0, l1,
           lr * g2, ratio);
    float **pc = xcalloc((size_t)t.nu, sizeof *pc); /* the CPU's own trajectory */
    for (int u = 0; u < t.nu; u++) {
        pc[u] = xcalloc(t.cpu->unit_numel[u], sizeof(float));
        memcpy(pc[u], t.p[u], t.cpu->unit_numel[u] * sizeof(float));
    }
    float lg = l1, lc = l1;
    for (int step = 0; step < 60; step++) {
        twin_zero_grads(&t);
        lg = gpu_step(&t, tok, tgt, B, 1.0f);
        lc = model_forward(t.cpu, (void *const *)pc, tok, tgt, B);
        model_backward(t.cpu, (void *const *)pc, t.gc, 1.0f);
        for (int u = 0; u < t.nu; u++)
            for (size_t i = 0; i < t.gpu->unit_numel[u]; i++) {
                t.p[u][i] -= 0.3f * t.gg[u][i];
                pc[u][i] -= 0.3f * t.gc[u][i];
            }
        twin_upload(&t);
    }
    lg = model_forward(t.gpu, t.dp, tok, tgt, B);
    lc = model_forward(t.cpu, (void *const *)pc, tok, tgt, B);
    printf("  SGD: loss %.4f -> cuda %.4f, cpu %.4f (first-order ratio %.3f)\n", l0, lg, lc,
           ratio);
    EXPECT(isfinite(lg) && lg < 0.4f * l0, "loss %g -> %g after 60 SGD steps", l0, lg);
    for (int u = 0; u < t.nu; u++) free(pc[u]);
    free(pc);
    twin_free(&t);
}

/* Loss at init and the time of a forward+backward on a mid-sized model
 * (printed for the record; no bound on time). The loss bound follows
 * test_gpt2.c's derivation with C = 256, V = 4096, N = B*T = 2048, s = 0.02:
 * other tokens' logits ~ N(0, C s^2 = 0.10) give E[logsumexp] ~ ln V + 0.05;
 * the input token's own logit (~ |wte_tok|^2 / 0.06 = 1.7, the residual's
 * std being ~0.06 after 4 blocks) adds ~ (e^1.7 - 1) / V = 0.001; the
 * target logits' mean over N rows fluctuates with std sqrt(C s^2 / N) =
 * 0.007. So loss - ln V ~ 0.05 +- 0.01 (the CPU model on this shape, 12
 * seeds: 0.036 .. 0.060); we accept -0.06 .. 0.12 as there. */
static void test_loss_at_init_and_speed(void) {
    zpp_gpt2_config cfg = {4, 8, 256, 256, 4096, 0, 0, 0};
    int B = 8, T = cfg.seq_len, V = cfg.vocab_size, L = cfg.n_layer;
    const zpp_dtype dt = dtype_here(ZPP_BF16, "bf16") ? ZPP_BF16 : ZPP_FP16;
    zpp_device *dev = gpu_open();
    zpp_model *m = NULL;
    EXPECT_OK(zpp_gpt2_cuda_create(&cfg, dt, B, dev, &m));
    zpp_rng r = zpp_rng_make(zpp_test_seed(12));
    uint64_t seed = zpp_rng_u64(&r);
    void **dp = xcalloc((size_t)m->n_units, sizeof *dp);
    float **dg = xcalloc((size_t)m->n_units, sizeof *dg);
    for (int u = 0; u < m->n_units; u++) {
        size_t k = m->unit_numel[u];
        float *h = xcalloc(k, sizeof(float));
        uint16_t *hb = xcalloc(k, sizeof(uint16_t));
        EXPECT_OK(m->ops->init_params(m, u, 0, k, h, seed));
        for (size_t i = 0; i < k; i++) zpp_store_f32(hb, dt, i, h[i]);
        dp[u] = dalloc(dev, k * 2);
        dg[u] = dalloc(dev, k * 4);
        EXPECT_OK(zpp_device_copy(dev, dp[u], hb, k * 2));
        EXPECT_OK(zpp_device_set(dev, dg[u], 0, k * 4));
        free(h);
        free(hb);
    }
    EXPECT_OK(zpp_device_sync(dev, NULL));
    size_t n = (size_t)B * T;
    int32_t *tok = xcalloc(n, 4), *tgt = xcalloc(n, 4);
    random_tokens(&r, tok, n, V);
    random_tokens(&r, tgt, n, V);
    float loss = model_forward(m, dp, tok, tgt, B);
    model_backward(m, dp, dg, 1.0f);
    double lnv = log((double)V);
    EXPECT(loss - lnv >= -0.06 && loss - lnv <= 0.12, "loss at init %.5f, ln V %.5f", loss, lnv);
    double best = 1e9;
    for (int it = 0; it < 5; it++) {
        EXPECT_OK(zpp_device_sync(dev, NULL));
        double t0 = now_s();
        model_forward(m, dp, tok, tgt, B); /* loss() synchronises */
        model_backward(m, dp, dg, 1.0f);
        EXPECT_OK(zpp_device_sync(dev, NULL));
        best = fmin(best, now_s() - t0);
    }
    /* matmul flops: 6 (params in blocks + tied head) per token, plus
     * attention 6 * 2 T C per token per layer (QK^T and PV, fwd + bwd), all
     * T x T computed */
    double C = cfg.n_embd;
    double flops = 6.0 * n * (L * 12.0 * C * C + V * C) + 12.0 * n * L * T * C;
    printf("  loss at init %.5f (ln V %.5f); forward+backward L=%d C=%d H=%d T=%d V=%d B=%d "
           "%s params: %.2f ms (best of 5), %.1f TFLOP/s\n",
           loss, lnv, L, cfg.n_embd, cfg.n_head, T, V, B, zpp_dtype_name(dt), best * 1e3,
           flops / best * 1e-12);
    for (int u = 0; u < m->n_units; u++) {
        zpp_device_free(dev, dp[u]);
        zpp_device_free(dev, dg[u]);
    }
    free(dp), free(dg), free(tok), free(tgt);
    m->ops->destroy(m);
    zpp_device_destroy(dev);
}

/* keep_logits / logits (model.h), what sampling reads: the CUDA model's
 * logits of a row against the CPU reference's (test_gpt2.c checks those
 * against a double forward and against its loss). The logits are the end
 * of the forward's chain, with the roundings of the forward half of the
 * gradients' (the top): within grad_tol(dtype) of the row's largest logit,
 * 8u for bf16. Rows at the start, around row 1024, at random and at the
 * end (the CUDA model widens the row out of the head's buffer), with fewer
 * sequences than max_batch, in fp32 and in bf16 (the fused attention);
 * then bitwise the same on a second run and on a training forward (with
 * targets, whose softmax overwrites the logits with their gradient in
 * place: the row must be copied out before), and the protocol's refusals. */
static void check_logits_rows(zpp_gpt2_config cfg, zpp_dtype dt, int max_batch, int B,
                              uint64_t stream_id) {
    if (!dtype_here(dt, "check_logits_rows")) return;
    twin t = twin_make(cfg, dt, max_batch, 1);
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream_id));
    twin_init(&t, zpp_rng_u64(&r));
    twin_perturb(&t, &r);
    const int T = cfg.seq_len, V = cfg.vocab_size, n = B * T;
    int32_t *tok = xcalloc((size_t)n, sizeof(int32_t)), *tgt = xcalloc((size_t)n, sizeof(int32_t));
    float *lc = xcalloc((size_t)V, sizeof(float)), *lg = xcalloc((size_t)V, sizeof(float)),
          *lg2 = xcalloc((size_t)V, sizeof(float));
    random_tokens(&r, tok, (size_t)n, zpp_gpt2_real_vocab(&cfg));
    random_tokens(&r, tgt, (size_t)n, zpp_gpt2_real_vocab(&cfg));
    const int rows[] = {0, 1023 < n - 1 ? 1023 : n / 2, 1024 < n ? 1024 : n - 2,
                        (int)(zpp_rng_u64(&r) % (uint64_t)n), n - 1};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        const int row = rows[k];
        EXPECT_OK(t.cpu->ops->keep_logits(t.cpu, row));
        EXPECT_OK(t.gpu->ops->keep_logits(t.gpu, row));
        model_forward(t.cpu, t.pw, tok, NULL, B);
        model_forward(t.gpu, t.dp, tok, NULL, B);
        EXPECT_OK(t.cpu->ops->logits(t.cpu, lc));
        EXPECT_OK(t.gpu->ops->logits(t.gpu, lg));
        double lmax = 0, dmax = 0;
        for (int v = 0; v < V; v++) {
            EXPECT(isfinite(lg[v]), "row %d: CUDA logit %d is %g", row, v, lg[v]);
            lmax = fmax(lmax, fabs(lc[v]));
            dmax = fmax(dmax, fabs((double)lg[v] - lc[v]));
        }
        const double bound = grad_tol(dt) * lmax + GRAD_FLOOR;
        printf("  %s T%d B%d/%d row %d: max|l| %.3e, max|diff| %.3e = %.3f of the bound\n",
               zpp_dtype_name(dt), T, B, max_batch, row, lmax, dmax, dmax / bound);
        EXPECT(lmax > 0.1, "row %d: logits near 0: the check would be vacuous", row);
        EXPECT(dmax <= bound, "row %d: CUDA logits differ from the CPU's by %.3e > %.3e", row,
               dmax, bound);
        model_forward(t.gpu, t.dp, tok, NULL, B);
        EXPECT_OK(t.gpu->ops->logits(t.gpu, lg2));
        EXPECT(memcmp(lg, lg2, (size_t)V * sizeof(float)) == 0, "row %d: not deterministic", row);
        memset(lg2, 0, (size_t)V * sizeof(float));
        model_forward(t.gpu, t.dp, tok, tgt, B);
        EXPECT_OK(t.gpu->ops->logits(t.gpu, lg2));
        EXPECT(memcmp(lg, lg2, (size_t)V * sizeof(float)) == 0,
               "row %d: a forward with targets kept other logits than one without", row);
    }
    zpp_model *g = t.gpu;
    EXPECT_STATUS(g->ops->keep_logits(g, max_batch * T), ZPP_ERR_INVALID);
    EXPECT_OK(g->ops->keep_logits(g, T)); /* sequence 1 (max_batch >= 2) ... */
    model_forward(g, t.dp, tok, NULL, 1);  /* ... of a batch of one */
    EXPECT_STATUS(g->ops->logits(g, lg), ZPP_ERR_STATE);
    EXPECT_OK(g->ops->keep_logits(g, -1));
    model_forward(g, t.dp, tok, NULL, 1);
    EXPECT_STATUS(g->ops->logits(g, lg), ZPP_ERR_STATE);
    free(tok), free(tgt), free(lc), free(lg), free(lg2);
    twin_free(&t);
}

static void test_logits_row_matches_cpu(void) {
    check_logits_rows((zpp_gpt2_config){1, 2, 32, 520, 64, 0, 0, 0}, ZPP_FP32, 3, 2, 24);
    check_logits_rows((zpp_gpt2_config){1, 2, 128, 520, 96, 89, 0, 0}, ZPP_BF16, 4, 3, 25);
    check_logits_rows((zpp_gpt2_config){2, 3, 48, 19, 101, 0, 0, 0}, ZPP_BF16, 2, 1, 26);
}

/* GPU memory a CUDA model of cfg takes (its arena and cuBLASLt workspace,
 * allocated through the device at create): made, measured, destroyed. */
static size_t cuda_model_bytes(zpp_device *d, zpp_gpt2_config cfg, zpp_dtype dt, int max_batch) {
    size_t before = 0, after = 0, peak = 0;
    zpp_device_mem_stats(d, &before, &peak);
    zpp_model *m = NULL;
    EXPECT_OK(zpp_gpt2_cuda_create(&cfg, dt, max_batch, d, &m));
    zpp_device_mem_stats(d, &after, &peak);
    m->ops->destroy(m);
    return after - before;
}

/* ZPP_ATTENTION=gemm (model/attention_path.h): the models with head sizes
 * 64 and 128 in bf16, which take the fused attention on a GPU of compute
 * capability 8.0 or newer, take the GEMM path instead (the one GPUs below
 * 8.0 take, with fp16 there) and match the CPU reference within the same
 * bounds as test_matches_cpu_bf16_fp16; then fp16 on the same shape.
 * That the variable took effect shows in memory: the GEMM path keeps the
 * probabilities, L x B x H x T x T values in bf16, where the fused one keeps
 * a log-sum-exp per row. An unknown value is refused when the model is made.
 * The variable is set here (ctest sets it too), so the case means the same
 * when the whole program runs. */
static void test_attention_gemm_matches_cpu(void) {
    char saved[64] = "";
    const char *env = getenv("ZPP_ATTENTION");
    const int had = env != NULL;
    if (had) snprintf(saved, sizeof saved, "%s", env);
    EXPECT(setenv("ZPP_ATTENTION", "gemm", 1) == 0, "setenv");
    /* the shapes of test_matches_cpu_bf16_fp16 that are fused there */
    check_config((zpp_gpt2_config){2, 2, 128, 80, 128, 0, 0, 0}, ZPP_BF16, 3, 128, 8, 1);
    check_config((zpp_gpt2_config){1, 2, 256, 40, 96, 0, 0, 0}, ZPP_BF16, 2, 96, 9, 0);
    check_config((zpp_gpt2_config){2, 2, 128, 80, 128, 0, 0, 0}, ZPP_FP16, 3, 128, 14, 0);

    zpp_device *d = gpu_open();
    const zpp_gpt2_config cfg = {2, 2, 128, 80, 128, 0, 0, 0};
    const int L = 2, Bm = 3, H = 2, T = 80;
    if (gpu_cc() >= ZPP_CC_BF16) {
        const size_t gemm = cuda_model_bytes(d, cfg, ZPP_BF16, Bm);
        /* fused: unset would add cuDNN's workspace, where it runs */
        EXPECT(setenv("ZPP_ATTENTION", "fused", 1) == 0, "setenv");
        const size_t fused = cuda_model_bytes(d, cfg, ZPP_BF16, Bm);
        const size_t probs = (size_t)L * Bm * H * T * T * 2;
        printf("  model memory: %zu bytes with ZPP_ATTENTION=gemm, %zu fused; the "
               "probabilities alone are %zu\n",
               gemm, fused, probs);
        EXPECT(gemm >= fused + probs,
               "ZPP_ATTENTION=gemm did not take the GEMM path: the model takes %zu bytes, %zu "
               "without it; the GEMM path keeps %zu bytes of probabilities more",
               gemm, fused, probs);
        /* cuDNN's path (the default where it runs) holds its workspace too;
         * a build without cuDNN refuses ZPP_ATTENTION=cudnn saying so */
        EXPECT(setenv("ZPP_ATTENTION", "cudnn", 1) == 0, "setenv");
        zpp_model *mc = NULL;
        zpp_error_clear();
        zpp_status cs = zpp_gpt2_cuda_create(&cfg, ZPP_BF16, Bm, d, &mc);
        if (cs == ZPP_OK) {
            mc->ops->destroy(mc);
            const size_t cudnn = cuda_model_bytes(d, cfg, ZPP_BF16, Bm);
            printf("  with ZPP_ATTENTION=cudnn: %zu bytes (cuDNN's workspace %zu)\n", cudnn,
                   cudnn - fused);
            EXPECT(cudnn > fused, "ZPP_ATTENTION=cudnn took %zu bytes, fused %zu: no workspace",
                   cudnn, fused);
        } else {
            EXPECT(cs == ZPP_ERR_UNSUPPORTED && strstr(zpp_last_error(), "cuDNN"), "%s: %s",
                   zpp_status_str(cs), zpp_last_error());
            printf("  ZPP_ATTENTION=cudnn refused: %s\n", zpp_last_error());
        }
    } else {
        /* below 8.0 the model refuses bf16, saying what to use */
        zpp_model *m = NULL;
        zpp_error_clear();
        EXPECT_STATUS(zpp_gpt2_cuda_create(&cfg, ZPP_BF16, Bm, d, &m), ZPP_ERR_UNSUPPORTED);
        EXPECT(strstr(zpp_last_error(), "bf16 needs compute capability 8.0") &&
                   strstr(zpp_last_error(), "fp16"),
               "%s", zpp_last_error());
    }
    EXPECT(setenv("ZPP_ATTENTION", "flash", 1) == 0, "setenv");
    zpp_model *m = NULL;
    zpp_error_clear();
    EXPECT_STATUS(zpp_gpt2_cuda_create(&cfg, ZPP_FP16, Bm, d, &m), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "ZPP_ATTENTION=flash"), "%s", zpp_last_error());
    zpp_device_destroy(d);
    if (had) EXPECT(setenv("ZPP_ATTENTION", saved, 1) == 0, "setenv");
    else EXPECT(unsetenv("ZPP_ATTENTION") == 0, "unsetenv");
}

ZPP_TESTS(ZPP_TEST(test_matches_cpu_fp32), ZPP_TEST(test_matches_cpu_bf16_fp16),
          ZPP_TEST(test_padded_vocab_matches_cpu), ZPP_TEST(test_head_many_rows_matches_cpu),
          ZPP_TEST(test_accumulation_and_scale), ZPP_TEST(test_bf16_gradients),
          ZPP_TEST(test_determinism),
          ZPP_TEST(test_set_batch_copies), ZPP_TEST(test_rejects_bad_input),
          ZPP_TEST(test_sgd_reduces_loss), ZPP_TEST(test_loss_at_init_and_speed),
          ZPP_TEST_GPU(test_logits_row_matches_cpu), ZPP_TEST_GPU(test_attention_gemm_matches_cpu))

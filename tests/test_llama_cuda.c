/* test_llama_cuda.c — the CUDA Llama (src/model/llama_cuda.cu) against the
 * CPU reference (src/model/llama_cpu.c, itself checked against a float64
 * reference and its finite differences in test_llama.c).
 *
 * Both models are made by the family's factory from the same shape and
 * working dtype, get the same parameters (a fresh seed's init, then moved
 * off it so unit gains and zero biases hide nothing, stored in the dtype)
 * and the same batch; the tests compare the loss and every element of every
 * unit's gradient. The shapes hit grouped-query attention 4:1, 2:1 and 1:1,
 * head dims 64, 128 and 48, q/k/v and o biases, a tied and an untied head,
 * llama3 rope scaling, a vocabulary that is not a multiple of 8 with padded
 * columns, and a batch smaller than max_batch. The attention runs both
 * ways (attention_path.h): fused for bf16 with head dim 64 or 128, the
 * GEMM path (attention_gemm_cuda.cu) for fp32, fp16, head dim 48, and bf16
 * under ZPP_ATTENTION=gemm; batch sizes drive the GEMM path's two batching
 * schemes (per sequence and group member over the key/value heads when
 * B * H/KV <= H, else per query head over the sequences).
 *
 * THE TOLERANCE, 16-BIT. The CPU computes in fp32 on the widened
 * parameters; the CUDA model stores what feeds its products in E
 * (llama_cuda.cu, PRECISION), each such value rounded once (relative error
 * <= u = 2^-8 for bf16, 2^-11 for fp16). As test_gpt2_cuda.c derives for
 * GPT-2, a gradient's error is a sum of (rounding x sensitivity) terms, one
 * per rounded value on its chain; a Llama block's chain has about as many
 * roundings as GPT-2's (forward: RMS1, qkv, RoPE's q and k, the attention
 * output, RMS2, gate/up, SwiGLU; backward: the rounded residual gradient
 * twice, d act, d gate/up, d attention output, d qkv; the head adds the
 * final RMSNorm and d logits), about 16, so the typical error is
 * ~sqrt(16) u = 4u of |g|. The GEMM path adds P and d S (as GPT-2's) and,
 * for a head shared by g query heads, g - 1 roundings of dK and dV's
 * partial sums: ~20 in all, ~4.5u typical. The bound
 *     max |g_gpu - g_cpu| <= 8 u max |g_cpu| + 1e-9   (per unit)
 * is about twice that; the loss, a mean whose rounding errors average out,
 * must agree to u relative. fp16 runs with a loss scale of 256 (the CPU
 * model gets the same), as fp16 training does: unscaled, the attention's
 * d S (~1e-5) sits among fp16's subnormals, whose spacing 2^-24 is a
 * relative error far above u; scaled, every value is a normal number.
 *
 * THE TOLERANCE, FP32. Both models evaluate the same formulas in fp32 on
 * the same inputs (cuBLASLt in plain fp32, no TF32); they differ only in
 * the order of summation, FMA contraction and expf (test_gpt2_cuda.c, THE
 * TOLERANCE (fp32), derives ~1e-5 of |g| typical from sums of up to
 * K = max(2F, B*T, V) terms along a chain of ~8 products a block):
 *     max |g_gpu - g_cpu| <= 1e-4 max |g_cpu| + 1e-9,  loss within 1e-5
 * relative (a mean of log-sum-exps over C-term dot products: ~sqrt(C) 2^-24
 * of |lse|, about 1e-6, typical) — 300x tighter than bf16's.
 *
 * Each comparison prints the dtype, the attention path, what is compared,
 * the bound and the worst element's ratio to it.
 *
 * Also: the backward gives the same bits twice (determinism) and with
 * activation checkpointing (the same kernels on the same inputs), on both
 * attention paths; the initial weights drawn on the GPU equal the host's
 * bit for bit; ZPP_ATTENTION=gemm takes the GEMM path (its T x T
 * probabilities show in the model's memory), ZPP_ATTENTION=fused where it
 * cannot run and an unknown value are refused, saying why.
 *
 * Needs an NVIDIA GPU of compute capability 8.0 or newer (label gpu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "device/device_caps.h"
#include "model/family.h"
#include "model/llama.h"
#include "model/model.h"
#include "plan/cost.h"
#include "cuda_testlib.h"
#include "testlib.h"

#define U_BF16 (1.0 / 256.0)
#define U_FP16 (1.0 / 2048.0)
#define FP16_LOSS_SCALE 256.0f

/* The bounds of the top, by working dtype: GRAD relative to the unit's
 * largest |g|, LOSS relative. */
static double grad_tol(zpp_dtype dt) {
    return dt == ZPP_BF16 ? 8.0 * U_BF16 : dt == ZPP_FP16 ? 8.0 * U_FP16 : 1e-4;
}
static double loss_tol(zpp_dtype dt) {
    return dt == ZPP_BF16 ? U_BF16 : dt == ZPP_FP16 ? U_FP16 : 1e-5;
}

/* ZPP_ATTENTION for the cases below; NULL unsets it. The value ctest or the
 * caller's shell gave is put back by env_restore. */
static char env_saved[64];
static int env_had = -1;

static void env_attention(const char *v) {
    if (env_had < 0) {
        const char *e = getenv("ZPP_ATTENTION");
        env_had = e != NULL;
        if (e) snprintf(env_saved, sizeof env_saved, "%s", e);
    }
    if (v) EXPECT(setenv("ZPP_ATTENTION", v, 1) == 0, "setenv");
    else EXPECT(unsetenv("ZPP_ATTENTION") == 0, "unsetenv");
}

static void env_restore(void) {
    if (env_had < 0) return;
    env_attention(env_had ? env_saved : NULL);
}

/* The path the model picks for this dtype and head dim, in words. */
static const char *path_name(zpp_dtype dt, int hd) {
    const char *e = getenv("ZPP_ATTENTION");
    if (e && strcmp(e, "gemm") == 0) return "gemm attention (ZPP_ATTENTION=gemm)";
    return dt == ZPP_BF16 && (hd == 64 || hd == 128) ? "fused attention" : "gemm attention";
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) zpp_test_fail(__FILE__, __LINE__, NULL, "out of host memory (%zu x %zu)", n, size);
    return p;
}

/* GQA 4:1, head dim 64, untied head, q/k/v and o biases, llama3 scaling, V not a
 * multiple of 8 with padding. */
static zpp_decoder_shape shape_gqa(void) {
    return (zpp_decoder_shape){.n_layer = 2, .n_head = 4, .n_kv_head = 1, .n_embd = 256,
                               .n_ffn = 512, .seq_len = 64, .vocab_size = 300,
                               .real_vocab_size = 290, .rope_theta = 500000.0,
                               .untied_head = 1, .qkv_bias = 1, .o_bias = 1, .rope_factor = 8.0,
                               .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
                               .rope_original_max_pos = 32};
}

/* Head dim 128, every head its own k/v, tied head, no biases, F not a
 * multiple of 8 (SwiGLU's element-wise path). */
static zpp_decoder_shape shape_mha(void) {
    return (zpp_decoder_shape){.n_layer = 2, .n_head = 2, .n_kv_head = 2, .n_embd = 256,
                               .n_ffn = 300, .seq_len = 32, .vocab_size = 512};
}

/* Head dim 48 (none of the fused kernel's), GQA 2:1, T = 40 not a multiple
 * of 32, q/k/v biases, tied head. */
static zpp_decoder_shape shape_hd48(void) {
    return (zpp_decoder_shape){.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 192,
                               .n_ffn = 320, .seq_len = 40, .vocab_size = 256,
                               .rope_theta = 10000.0, .qkv_bias = 1};
}

/* Head dim 64, GQA 2:1, a vocabulary of 32 n_embd: the d logits hold the
 * one-layer and backward scratch (llama_cuda.cu, SCRATCH IN THE LOGITS). */
static zpp_decoder_shape shape_vocab(void) {
    return (zpp_decoder_shape){.n_layer = 2, .n_head = 2, .n_kv_head = 1, .n_embd = 128,
                               .n_ffn = 256, .seq_len = 32, .vocab_size = 4096};
}

typedef struct pair {
    zpp_device *dev;
    zpp_model *cpu, *gpu;
    zpp_dtype dt; /* the working dtype of both */
    int nu;
    float **p;  /* fp32 parameters per unit, values of dt */
    void **pw;  /* the same in dt (host) */
    void **dp;  /* device, dt */
    float **gc; /* CPU gradients */
    float **dg; /* device gradients */
    float **gg; /* host copy of the device gradients */
} pair;

static zpp_model *make_model(const zpp_decoder_shape *s, zpp_dtype dt, zpp_device *dev,
                             int max_batch) {
    zpp_model *m = NULL;
    EXPECT_OK(zpp_model_family_create("llama", s, dt, max_batch, dev, &m));
    return m;
}

/* Both models and their buffers; parameters from seed, perturbed. */
static pair pair_make(const zpp_decoder_shape *s, zpp_dtype dt, int max_batch, zpp_rng *r) {
    pair t;
    memset(&t, 0, sizeof t);
    t.dt = dt;
    const size_t es = zpp_dtype_size(dt);
    t.dev = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    zpp_device *host = NULL;
    EXPECT_OK(zpp_device_create_host(&host));
    t.cpu = make_model(s, dt, host, max_batch);
    t.gpu = make_model(s, dt, t.dev, max_batch);
    zpp_device_destroy(host); /* the CPU model keeps nothing of it */
    EXPECT(t.gpu->mem == ZPP_MEM_DEVICE && t.gpu->n_units == t.cpu->n_units,
           "mem %d units %d/%d", (int)t.gpu->mem, t.gpu->n_units, t.cpu->n_units);
    t.nu = t.cpu->n_units;
    t.p = xcalloc((size_t)t.nu, sizeof *t.p);
    t.pw = xcalloc((size_t)t.nu, sizeof *t.pw);
    t.dp = xcalloc((size_t)t.nu, sizeof *t.dp);
    t.gc = xcalloc((size_t)t.nu, sizeof *t.gc);
    t.dg = xcalloc((size_t)t.nu, sizeof *t.dg);
    t.gg = xcalloc((size_t)t.nu, sizeof *t.gg);
    const uint64_t seed = zpp_rng_u64(r);
    for (int u = 0; u < t.nu; u++) {
        const size_t k = t.cpu->unit_numel[u];
        EXPECT(t.gpu->unit_numel[u] == k, "unit %d: %zu vs %zu", u, t.gpu->unit_numel[u], k);
        t.p[u] = xcalloc(k, sizeof(float));
        t.pw[u] = xcalloc(k, es);
        t.gc[u] = xcalloc(k, sizeof(float));
        t.gg[u] = xcalloc(k, sizeof(float));
        EXPECT_OK(zpp_device_alloc(t.dev, k * es, &t.dp[u]));
        void *g = NULL;
        EXPECT_OK(zpp_device_alloc(t.dev, k * sizeof(float), &g));
        t.dg[u] = g;
        EXPECT_OK(t.cpu->ops->init_params(t.cpu, u, 0, k, t.p[u], seed));
        for (size_t i = 0; i < k; i++) {
            zpp_store_f32(t.pw[u], dt, i, t.p[u][i] + 0.02f * (float)zpp_rng_normal(r));
            t.p[u][i] = zpp_load_f32(t.pw[u], dt, i);
        }
        EXPECT_OK(zpp_device_copy(t.dev, t.dp[u], t.pw[u], k * es));
    }
    EXPECT_OK(zpp_device_sync(t.dev, NULL));
    return t;
}

static void pair_free(pair *t) {
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
    for (int u = 0; u < t->nu; u++) {
        free(t->p[u]), free(t->pw[u]), free(t->gc[u]), free(t->gg[u]);
        zpp_device_free(t->dev, t->dp[u]);
        zpp_device_free(t->dev, t->dg[u]);
    }
    free(t->p), free(t->pw), free(t->dp), free(t->gc), free(t->dg), free(t->gg);
    t->cpu->ops->destroy(t->cpu);
    t->gpu->ops->destroy(t->gpu);
    zpp_device_destroy(t->dev);
}

/* Forward and backward of one model over every stage; grads zeroed first;
 * the backward scaled by the dtype's loss scale (fp16: FP16_LOSS_SCALE). */
static float run_model(zpp_model *m, zpp_device *d, void *const *params, float *const *grads,
                       const int32_t *tok, const int32_t *tgt, int B) {
    const float scale = m->param_dtype == ZPP_FP16 ? FP16_LOSS_SCALE : 1.0f;
    for (int u = 0; u < m->n_units; u++) {
        if (d) EXPECT_OK(zpp_device_set(d, grads[u], 0, m->unit_numel[u] * sizeof(float)));
        else memset(grads[u], 0, m->unit_numel[u] * sizeof(float));
    }
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
    for (int s = 0; s < m->n_stages; s++)
        EXPECT_OK(m->ops->forward(m, s, params[m->stage_unit[s]]));
    const float loss = m->ops->loss(m);
    for (int s = m->n_stages - 1; s >= 0; s--) {
        const int u = m->stage_unit[s];
        EXPECT_OK(m->ops->backward(m, s, s == 0 ? NULL : params[u], grads[u], scale));
    }
    if (d) EXPECT_OK(zpp_device_sync(d, NULL));
    return loss;
}

static void download(pair *t, float **into) {
    for (int u = 0; u < t->nu; u++)
        EXPECT_OK(zpp_device_copy(t->dev, into[u], t->dg[u],
                                  t->cpu->unit_numel[u] * sizeof(float)));
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
}

static void random_batch(zpp_rng *r, int32_t *tok, int32_t *tgt, size_t n, int V, int Vr) {
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(zpp_rng_u64(r) % (uint64_t)V);
        tgt[i] = (int32_t)(zpp_rng_u64(r) % (uint64_t)Vr);
    }
}

static void compare(const pair *t, float lc, float lg, const char *what) {
    const double lr = fabs((double)lg - lc) / fabs((double)lc), lb = loss_tol(t->dt);
    const double gt = grad_tol(t->dt);
    printf("  %s: loss cpu %.7f gpu %.7f, relative %.3g, bound %.3g (%.2f of it)\n", what, lc,
           lg, lr, lb, lr / lb);
    EXPECT(lr <= lb, "%s: loss %.7g vs CPU %.7g (relative %.3g > bound %.3g)", what, lg, lc, lr,
           lb);
    for (int u = 0; u < t->nu; u++) {
        const size_t k = t->cpu->unit_numel[u];
        double gmax = 0.0, dmax = 0.0;
        size_t at = 0;
        for (size_t i = 0; i < k; i++) {
            gmax = fmax(gmax, fabs((double)t->gc[u][i]));
            const double d = fabs((double)t->gg[u][i] - t->gc[u][i]);
            if (d > dmax) dmax = d, at = i;
        }
        const double bound = gt * gmax + 1e-9;
        printf("  %s: unit %d gradient: max |g| %.3g, worst |gpu - cpu| %.3g at %zu, bound "
               "%.3g (%.2f of it)\n",
               what, u, gmax, dmax, at, bound, dmax / bound);
        EXPECT(dmax <= bound,
               "%s: unit %d gradient element %zu: gpu %.7g cpu %.7g (|d| %.3g > bound %.3g = "
               "%.3g x max |g| %.3g)",
               what, u, at, t->gg[u][at], t->gc[u][at], dmax, bound, gt, gmax);
    }
}

/* One shape in one dtype, batch B of max_batch, against the CPU. */
static void check_shape(const zpp_decoder_shape *s, zpp_dtype dt, int max_batch, int B,
                        const char *what) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(11));
    pair t = pair_make(s, dt, max_batch, &r);
    const size_t n = (size_t)B * s->seq_len;
    int32_t *tok = xcalloc(n, sizeof *tok), *tgt = xcalloc(n, sizeof *tgt);
    const int Vr = s->real_vocab_size ? s->real_vocab_size : s->vocab_size;
    random_batch(&r, tok, tgt, n, s->vocab_size, Vr);
    const float lc = run_model(t.cpu, NULL, t.pw, t.gc, tok, tgt, B);
    const float lg = run_model(t.gpu, t.dev, t.dp, t.dg, tok, tgt, B);
    download(&t, t.gg);
    char label[256];
    snprintf(label, sizeof label, "%s, %s, %s, B %d of %d", zpp_dtype_name(dt),
             path_name(dt, s->n_embd / s->n_head), what, B, max_batch);
    compare(&t, lc, lg, label);
    free(tok), free(tgt);
    pair_free(&t);
}

/* bf16 with ZPP_ATTENTION unset: the fused attention. */
static void test_matches_cpu(void) {
    const zpp_decoder_shape a = shape_gqa(), b = shape_mha();
    env_attention(NULL);
    check_shape(&a, ZPP_BF16, 3, 2, "GQA 4:1, hd 64, untied, biases, llama3");
    check_shape(&b, ZPP_BF16, 2, 2, "MHA, hd 128, tied, F 300");
    const zpp_decoder_shape v = shape_vocab();
    check_shape(&v, ZPP_BF16, 3, 3, "GQA 2:1, hd 64, V 32 C: the scratch in the d logits");
    env_restore();
}

/* fp32: the GEMM path, in plain fp32 arithmetic, to 1e-4 of max |g|. B 1
 * of the 4:1 shape batches over the key/value heads (B g <= H), B 2 over
 * the sequences; the 2:1 shape's B 2 adds two query heads into each dK,
 * dV batched over the key/value heads, B 3 per query head. */
static void test_matches_cpu_fp32(void) {
    const zpp_decoder_shape a = shape_gqa(), b = shape_hd48(), c = shape_mha();
    env_attention(NULL);
    check_shape(&a, ZPP_FP32, 3, 1, "GQA 4:1, hd 64, untied, biases, llama3");
    check_shape(&a, ZPP_FP32, 3, 2, "GQA 4:1, hd 64, untied, biases, llama3");
    check_shape(&b, ZPP_FP32, 3, 2, "GQA 2:1, hd 48, biases");
    check_shape(&b, ZPP_FP32, 3, 3, "GQA 2:1, hd 48, biases");
    check_shape(&c, ZPP_FP32, 2, 2, "MHA, hd 128, tied, F 300");
    const zpp_decoder_shape v = shape_vocab();
    check_shape(&v, ZPP_FP32, 3, 2, "GQA 2:1, hd 64, V 32 C: the scratch in the d logits");
    env_restore();
}

/* fp16 (loss-scaled) and bf16 with a head dim the fused kernel lacks: the
 * GEMM path, to 8u of max |g|. */
static void test_matches_cpu_fp16_hd48(void) {
    const zpp_decoder_shape a = shape_gqa(), b = shape_hd48();
    env_attention(NULL);
    check_shape(&a, ZPP_FP16, 3, 2, "GQA 4:1, hd 64, untied, biases, llama3");
    check_shape(&b, ZPP_FP16, 3, 2, "GQA 2:1, hd 48, biases");
    check_shape(&b, ZPP_BF16, 3, 2, "GQA 2:1, hd 48, biases");
    env_restore();
}

/* ZPP_ATTENTION=gemm: the bf16 shapes that are fused above take the GEMM
 * path (the one GPUs below 8.0 take, with fp16 there), within the same
 * bf16 bound. */
static void test_attention_gemm_matches_cpu(void) {
    const zpp_decoder_shape a = shape_gqa(), b = shape_mha();
    env_attention("gemm");
    check_shape(&a, ZPP_BF16, 3, 1, "GQA 4:1, hd 64, untied, biases, llama3");
    check_shape(&a, ZPP_BF16, 3, 2, "GQA 4:1, hd 64, untied, biases, llama3");
    check_shape(&b, ZPP_BF16, 2, 2, "MHA, hd 128, tied, F 300");
    env_restore();
}

/* The same batch twice gives the same bits; so does a model with
 * activation checkpointing (it reruns the same kernels on the same inputs). */
static void same_bits(zpp_dtype dt, const char *attention, const char *what) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(12));
    zpp_decoder_shape s = shape_gqa();
    env_attention(attention);
    printf("  %s, %s\n", what, path_name(dt, s.n_embd / s.n_head));
    pair t = pair_make(&s, dt, 2, &r);
    s.recompute = 1;
    zpp_model *ck = make_model(&s, dt, t.dev, 2);
    const size_t n = 2 * (size_t)s.seq_len;
    int32_t *tok = xcalloc(n, sizeof *tok), *tgt = xcalloc(n, sizeof *tgt);
    random_batch(&r, tok, tgt, n, s.vocab_size, s.real_vocab_size);
    float **again = xcalloc((size_t)t.nu, sizeof *again);
    for (int u = 0; u < t.nu; u++) again[u] = xcalloc(t.cpu->unit_numel[u], sizeof(float));
    const float l1 = run_model(t.gpu, t.dev, t.dp, t.dg, tok, tgt, 2);
    download(&t, t.gg);
    const float l2 = run_model(t.gpu, t.dev, t.dp, t.dg, tok, tgt, 2);
    download(&t, again);
    EXPECT(l1 == l2, "%s: loss %.9g then %.9g", what, l1, l2);
    for (int u = 0; u < t.nu; u++)
        EXPECT(memcmp(again[u], t.gg[u], t.cpu->unit_numel[u] * sizeof(float)) == 0,
               "%s: unit %d: a second backward gave other bits", what, u);
    const float l3 = run_model(ck, t.dev, t.dp, t.dg, tok, tgt, 2);
    download(&t, again);
    EXPECT(l3 == l1, "%s: checkpointing: loss %.9g vs %.9g", what, l3, l1);
    for (int u = 0; u < t.nu; u++)
        EXPECT(memcmp(again[u], t.gg[u], t.cpu->unit_numel[u] * sizeof(float)) == 0,
               "%s: unit %d: checkpointing gave other bits", what, u);
    for (int u = 0; u < t.nu; u++) free(again[u]);
    free(again), free(tok), free(tgt);
    ck->ops->destroy(ck);
    pair_free(&t);
    env_restore();
}

static void test_same_bits(void) {
    same_bits(ZPP_BF16, NULL, "bf16");
    same_bits(ZPP_FP32, NULL, "fp32");
    same_bits(ZPP_FP16, NULL, "fp16");
    same_bits(ZPP_BF16, "gemm", "bf16");
}

/* init_params_device writes init_params's values, bit for bit. */
static void test_init_device_matches_host(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(13));
    const zpp_decoder_shape s = shape_gqa();
    zpp_device *d = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    zpp_model *m = make_model(&s, ZPP_BF16, d, 1);
    EXPECT(m->ops->init_params_device != NULL, "the CUDA Llama draws its weights on the GPU");
    const uint64_t seed = zpp_rng_u64(&r);
    for (int u = 0; u < m->n_units; u++) {
        const size_t k = m->unit_numel[u], off = zpp_rng_u64(&r) % (k / 2), cnt = k - off;
        float *want = xcalloc(cnt, sizeof(float)), *got = xcalloc(cnt, sizeof(float));
        void *dev_out = NULL;
        EXPECT_OK(zpp_device_alloc(d, cnt * sizeof(float), &dev_out));
        EXPECT_OK(m->ops->init_params(m, u, off, cnt, want, seed));
        EXPECT_OK(m->ops->init_params_device(m, u, off, cnt, (float *)dev_out, seed));
        EXPECT_OK(zpp_device_sync(d, NULL));
        EXPECT_OK(zpp_device_copy(d, got, dev_out, cnt * sizeof(float)));
        EXPECT_OK(zpp_device_sync(d, NULL));
        EXPECT(memcmp(want, got, cnt * sizeof(float)) == 0, "unit %d [%zu, +%zu): differs", u,
               off, cnt);
        zpp_device_free(d, dev_out);
        free(want), free(got);
    }
    EXPECT_STATUS(m->ops->init_params_device(m, m->n_units, 0, 1, NULL, seed), ZPP_ERR_INVALID);
    m->ops->destroy(m);
    zpp_device_destroy(d);
}

/* The device memory a model of this shape takes. */
static size_t model_bytes(zpp_device *d, const zpp_decoder_shape *s, zpp_dtype dt, int Bm) {
    size_t before = 0, after = 0, peak = 0;
    zpp_device_mem_stats(d, &before, &peak);
    zpp_model *m = make_model(s, dt, d, Bm);
    zpp_device_mem_stats(d, &after, &peak);
    m->ops->destroy(m);
    return after - before;
}

/* bytes rounded up to the arena's 256. */
static size_t arena_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The scratch in the d logits (llama_cuda.cu, SCRATCH IN THE LOGITS): with
 * a vocabulary of 32 C the model takes the larger d logits and kept row
 * less its scratch (h, act, dres_e, datty, dqkv, dgu, dact in E; dres and
 * the RMSNorm backward's sums in fp32) against the same shape with V 256,
 * whose d logits cannot hold it; the planner counts as much, to the
 * arena's alignment. */
static void test_scratch_in_logits(void) {
    zpp_device *d = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    const zpp_dtype dts[2] = {ZPP_FP32, ZPP_BF16};
    for (int k = 0; k < 2; k++) {
        zpp_decoder_shape big = shape_vocab(), small = big;
        small.vocab_size = 256;
        const int Bm = 3;
        const size_t nb = model_bytes(d, &big, dts[k], Bm);
        const size_t ns = model_bytes(d, &small, dts[k], Bm);
        const size_t e = zpp_dtype_size(dts[k]), N = (size_t)Bm * big.seq_len;
        const size_t C = (size_t)big.n_embd, F = (size_t)big.n_ffn;
        const size_t Wq = C + 2 * (size_t)big.n_kv_head * (C / (size_t)big.n_head);
        const size_t Vb = (size_t)big.vocab_size, Vs = (size_t)small.vocab_size;
        const size_t known = 3 * arena_bytes(N * C * e) + arena_bytes(4 * N * C) +
                             2 * arena_bytes(N * F * e) + arena_bytes(2 * N * F * e) +
                             arena_bytes(N * Wq * e);
        const size_t grown = arena_bytes(N * Vb * e) - arena_bytes(N * Vs * e) +
                             arena_bytes(4 * Vb) - arena_bytes(4 * Vs);
        EXPECT(nb - ns < grown - known,
               "%s: V %zu takes %zu bytes more than V %zu; with its scratch in the d logits "
               "it should take under %zu",
               zpp_dtype_name(dts[k]), Vb, nb - ns, Vs, grown - known);
        zpp_cost_in in = zpp_cost_in_default();
        in.family = ZPP_COST_LLAMA, in.dtype = dts[k];
        in.n_layer = big.n_layer, in.n_embd = big.n_embd, in.n_head = big.n_head;
        in.n_kv_head = big.n_kv_head, in.n_ffn = big.n_ffn, in.seq_len = big.seq_len;
        in.vocab = big.vocab_size;
        const double plan_big = zpp_cost_llama_act_bytes(&in, (double)N);
        in.vocab = small.vocab_size;
        const double plan_small = zpp_cost_llama_act_bytes(&in, (double)N);
        EXPECT(fabs(plan_big - plan_small - ((double)nb - (double)ns)) <= 16 * 256.0,
               "%s: the planner counts %.0f bytes more for V %zu, the model takes %zu",
               zpp_dtype_name(dts[k]), plan_big - plan_small, Vb, nb - ns);
    }
    zpp_device_destroy(d);
}

/* ZPP_ATTENTION=gemm takes the GEMM path: the model keeps the
 * probabilities, L x max_batch x H x T x T values in bf16, where the fused
 * one keeps a log-sum-exp per row. ZPP_ATTENTION=fused where the fused
 * kernel cannot run (fp32; head dim 48) and an unknown value are refused
 * at create, saying why and what to do. */
static void test_attention_paths(void) {
    zpp_device *d = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    const zpp_decoder_shape s = shape_gqa(), h48 = shape_hd48();
    const int Bm = 3;
    env_attention("gemm");
    const size_t gemm = model_bytes(d, &s, ZPP_BF16, Bm);
    env_attention("fused"); /* unset would add cuDNN's workspace, where it runs */
    const size_t fused = model_bytes(d, &s, ZPP_BF16, Bm);
    const size_t probs = (size_t)s.n_layer * Bm * s.n_head * s.seq_len * s.seq_len * 2;
    env_attention(NULL);
    printf("  model memory: %zu bytes with ZPP_ATTENTION=gemm, %zu fused; the "
           "probabilities alone are %zu\n", gemm, fused, probs);
    EXPECT(gemm >= fused + probs,
           "ZPP_ATTENTION=gemm did not take the GEMM path: the model takes %zu bytes, %zu "
           "without it; the GEMM path keeps %zu bytes of probabilities more", gemm, fused, probs);
    zpp_model *m = NULL;
    env_attention("fused");
    zpp_error_clear();
    EXPECT_STATUS(zpp_model_family_create("llama", &s, ZPP_FP32, 1, d, &m), ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(zpp_last_error(), "ZPP_ATTENTION=fused") && strstr(zpp_last_error(), "fp32"),
           "message: %s", zpp_last_error());
    zpp_error_clear();
    EXPECT_STATUS(zpp_model_family_create("llama", &h48, ZPP_BF16, 1, d, &m),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(zpp_last_error(), "is 48") != NULL, "message: %s", zpp_last_error());
    env_attention("flash");
    zpp_error_clear();
    EXPECT_STATUS(zpp_model_family_create("llama", &s, ZPP_FP16, 1, d, &m), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "ZPP_ATTENTION=flash"), "message: %s", zpp_last_error());
    EXPECT(m == NULL, "a refused create set the model");
    env_restore();
    zpp_device_destroy(d);
}

ZPP_TESTS(ZPP_TEST_GPU(test_matches_cpu), ZPP_TEST_GPU(test_matches_cpu_fp32),
          ZPP_TEST_GPU(test_matches_cpu_fp16_hd48), ZPP_TEST_GPU(test_attention_gemm_matches_cpu),
          ZPP_TEST_GPU(test_same_bits), ZPP_TEST_GPU(test_init_device_matches_host),
          ZPP_TEST_GPU(test_attention_paths), ZPP_TEST_GPU(test_scratch_in_logits))

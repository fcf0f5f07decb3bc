/* test_llama_cuda.c — the CUDA Llama (src/model/llama_cuda.cu) against the
 * CPU reference (src/model/llama_cpu.c, itself checked against a float64
 * reference and its finite differences in test_llama.c).
 *
 * Both models are made by the family's factory from the same shape, get
 * the same bf16 parameters (a fresh seed's init, then moved off it so unit
 * gains and zero biases hide nothing) and the same batch; the tests compare
 * the loss and every element of every unit's gradient. The shapes hit
 * grouped-query attention 4:1 and 1:1, head dims 64 and 128, q/k/v and o biases,
 * a tied and an untied head, llama3 rope scaling, a vocabulary that is not
 * a multiple of 8 with padded columns, and a batch smaller than max_batch.
 *
 * THE TOLERANCE. The CPU computes in fp32 on the widened bf16 parameters;
 * the CUDA model stores what feeds its products in bf16 (llama_cuda.cu,
 * PRECISION), each such value rounded once (relative error <= u = 2^-8).
 * As test_gpt2_cuda.c derives for GPT-2, a gradient's error is a sum of
 * (rounding x sensitivity) terms, one per rounded value on its chain; a
 * Llama block's chain has about as many roundings as GPT-2's (forward:
 * RMS1, qkv, RoPE's q and k, the attention output, RMS2, gate/up, SwiGLU;
 * backward: the rounded residual gradient twice, d act, d gate/up, d
 * attention output, d qkv; the head adds the final RMSNorm and d logits),
 * about 16, so the typical error is ~sqrt(16) u = 4u of |g| and the bound
 *     max |g_gpu - g_cpu| <= 8 u max |g_cpu| + 1e-9   (per unit)
 * twice that; the loss, a mean whose rounding errors average out, must
 * agree to u relative. Each comparison prints its ratio to the bound.
 *
 * Also: the backward gives the same bits twice (determinism) and with
 * activation checkpointing (the same kernels on the same inputs); the
 * initial weights drawn on the GPU equal the host's bit for bit; fp32 and
 * a head dim the fused attention lacks are refused, naming the CPU model.
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
#include "cuda_testlib.h"
#include "testlib.h"

#define U_BF16 (1.0 / 256.0)

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

typedef struct pair {
    zpp_device *dev;
    zpp_model *cpu, *gpu;
    int nu;
    float **p;  /* fp32 parameters per unit, bf16 values */
    void **pw;  /* the same in bf16 (host) */
    void **dp;  /* device bf16 */
    float **gc; /* CPU gradients */
    float **dg; /* device gradients */
    float **gg; /* host copy of the device gradients */
} pair;

static zpp_model *make_model(const zpp_decoder_shape *s, zpp_device *dev, int max_batch) {
    zpp_model *m = NULL;
    EXPECT_OK(zpp_model_family_create("llama", s, ZPP_BF16, max_batch, dev, &m));
    return m;
}

/* Both models and their buffers; parameters from seed, perturbed. */
static pair pair_make(const zpp_decoder_shape *s, int max_batch, zpp_rng *r) {
    pair t;
    memset(&t, 0, sizeof t);
    t.dev = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    zpp_device *host = NULL;
    EXPECT_OK(zpp_device_create_host(&host));
    t.cpu = make_model(s, host, max_batch);
    t.gpu = make_model(s, t.dev, max_batch);
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
        t.pw[u] = xcalloc(k, 2);
        t.gc[u] = xcalloc(k, sizeof(float));
        t.gg[u] = xcalloc(k, sizeof(float));
        EXPECT_OK(zpp_device_alloc(t.dev, k * 2, &t.dp[u]));
        void *g = NULL;
        EXPECT_OK(zpp_device_alloc(t.dev, k * sizeof(float), &g));
        t.dg[u] = g;
        EXPECT_OK(t.cpu->ops->init_params(t.cpu, u, 0, k, t.p[u], seed));
        for (size_t i = 0; i < k; i++) {
            zpp_store_f32(t.pw[u], ZPP_BF16, i, t.p[u][i] + 0.02f * (float)zpp_rng_normal(r));
            t.p[u][i] = zpp_load_f32(t.pw[u], ZPP_BF16, i);
        }
        EXPECT_OK(zpp_device_copy(t.dev, t.dp[u], t.pw[u], k * 2));
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

/* Forward and backward of one model over every stage; grads zeroed first. */
static float run_model(zpp_model *m, zpp_device *d, void *const *params, float *const *grads,
                       const int32_t *tok, const int32_t *tgt, int B) {
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
        EXPECT_OK(m->ops->backward(m, s, s == 0 ? NULL : params[u], grads[u], 1.0f));
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
    const double lr = fabs((double)lg - lc) / fabs((double)lc);
    printf("  %s: loss cpu %.6f gpu %.6f (%.2f of the bound)\n", what, lc, lg, lr / U_BF16);
    EXPECT(lr <= U_BF16, "%s: loss %.7g vs CPU %.7g (relative %.3g > %.3g)", what, lg, lc, lr,
           U_BF16);
    for (int u = 0; u < t->nu; u++) {
        const size_t k = t->cpu->unit_numel[u];
        double gmax = 0.0, dmax = 0.0;
        size_t at = 0;
        for (size_t i = 0; i < k; i++) {
            gmax = fmax(gmax, fabs((double)t->gc[u][i]));
            const double d = fabs((double)t->gg[u][i] - t->gc[u][i]);
            if (d > dmax) dmax = d, at = i;
        }
        const double bound = 8.0 * U_BF16 * gmax + 1e-9;
        printf("  %s: unit %d max |g| %.3g, worst %.3g (%.2f of the bound)\n", what, u, gmax,
               dmax, dmax / bound);
        EXPECT(dmax <= bound, "%s: unit %d element %zu: gpu %.7g cpu %.7g (|d| %.3g > %.3g)",
               what, u, at, t->gg[u][at], t->gc[u][at], dmax, bound);
    }
}

static void check_shape(const zpp_decoder_shape *s, int max_batch, int B, const char *what) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(11));
    pair t = pair_make(s, max_batch, &r);
    const size_t n = (size_t)B * s->seq_len;
    int32_t *tok = xcalloc(n, sizeof *tok), *tgt = xcalloc(n, sizeof *tgt);
    const int Vr = s->real_vocab_size ? s->real_vocab_size : s->vocab_size;
    random_batch(&r, tok, tgt, n, s->vocab_size, Vr);
    const float lc = run_model(t.cpu, NULL, t.pw, t.gc, tok, tgt, B);
    const float lg = run_model(t.gpu, t.dev, t.dp, t.dg, tok, tgt, B);
    download(&t, t.gg);
    compare(&t, lc, lg, what);
    free(tok), free(tgt);
    pair_free(&t);
}

static void test_matches_cpu(void) {
    const zpp_decoder_shape a = shape_gqa(), b = shape_mha();
    check_shape(&a, 3, 2, "GQA 4:1, hd 64, untied, biases, llama3, B 2 of 3");
    check_shape(&b, 2, 2, "MHA, hd 128, tied, F 300");
}

/* The same batch twice gives the same bits; so does a model with
 * activation checkpointing (it reruns the same kernels on the same inputs). */
static void test_same_bits(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(12));
    zpp_decoder_shape s = shape_gqa();
    pair t = pair_make(&s, 2, &r);
    s.recompute = 1;
    zpp_model *ck = make_model(&s, t.dev, 2);
    const size_t n = 2 * (size_t)s.seq_len;
    int32_t *tok = xcalloc(n, sizeof *tok), *tgt = xcalloc(n, sizeof *tgt);
    random_batch(&r, tok, tgt, n, s.vocab_size, s.real_vocab_size);
    float **again = xcalloc((size_t)t.nu, sizeof *again);
    for (int u = 0; u < t.nu; u++) again[u] = xcalloc(t.cpu->unit_numel[u], sizeof(float));
    const float l1 = run_model(t.gpu, t.dev, t.dp, t.dg, tok, tgt, 2);
    download(&t, t.gg);
    const float l2 = run_model(t.gpu, t.dev, t.dp, t.dg, tok, tgt, 2);
    download(&t, again);
    EXPECT(l1 == l2, "loss %.9g then %.9g", l1, l2);
    for (int u = 0; u < t.nu; u++)
        EXPECT(memcmp(again[u], t.gg[u], t.cpu->unit_numel[u] * sizeof(float)) == 0,
               "unit %d: a second backward gave other bits", u);
    const float l3 = run_model(ck, t.dev, t.dp, t.dg, tok, tgt, 2);
    download(&t, again);
    EXPECT(l3 == l1, "checkpointing: loss %.9g vs %.9g", l3, l1);
    for (int u = 0; u < t.nu; u++)
        EXPECT(memcmp(again[u], t.gg[u], t.cpu->unit_numel[u] * sizeof(float)) == 0,
               "unit %d: checkpointing gave other bits", u);
    for (int u = 0; u < t.nu; u++) free(again[u]);
    free(again), free(tok), free(tgt);
    ck->ops->destroy(ck);
    pair_free(&t);
}

/* init_params_device writes init_params's values, bit for bit. */
static void test_init_device_matches_host(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(13));
    const zpp_decoder_shape s = shape_gqa();
    zpp_device *d = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    zpp_model *m = make_model(&s, d, 1);
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

/* What the fused attention cannot run is refused, saying what to use. */
static void test_refuses(void) {
    zpp_device *d = zpp_test_gpu_open("test_llama_cuda checks the CUDA Llama");
    const zpp_decoder_shape s = shape_gqa();
    zpp_decoder_shape hd32 = s;
    hd32.n_head = 8, hd32.n_kv_head = 2; /* head dim 32 */
    zpp_model *m = NULL;
    EXPECT_STATUS(zpp_model_family_create("llama", &s, ZPP_FP32, 1, d, &m), ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(zpp_last_error(), "CPU model") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_model_family_create("llama", &hd32, ZPP_BF16, 1, d, &m),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(zpp_last_error(), "head dim 32") != NULL, "message: %s", zpp_last_error());
    EXPECT(m == NULL, "a refused create set the model");
    zpp_device_destroy(d);
}

ZPP_TESTS(ZPP_TEST_GPU(test_matches_cpu), ZPP_TEST_GPU(test_same_bits),
          ZPP_TEST_GPU(test_init_device_matches_host), ZPP_TEST_GPU(test_refuses))

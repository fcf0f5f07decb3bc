/* test_llama_engine.c — the Llama CPU model trained through the engine
 * (ZeRO-3, fp32): on every world size the test runs under (1 and 2 ranks,
 * tests/llama.cmake), three AdamW steps give the losses of the same steps
 * taken without the engine, the whole model on one rank (the model driven
 * stage by stage, the device's AdamW on each full unit). Every rank trains
 * on the same batch, so the gradient averaged over ranks is the one-rank
 * gradient and the losses agree within 1e-6 relative (the sum over 2
 * ranks of equal values halved is exact; what may differ is the order of
 * the engine's per-shard arithmetic, a few ulp). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine.h"
#include "model/family.h"
#include "testlib.h"

enum { B = 2, T = 6, STEPS = 3 };

/* GQA 2:1, untied head, q/k/v biases, llama3 scaling: every knob on. */
static const zpp_decoder_shape kShape = {.n_layer = 2,
                                         .n_head = 4,
                                         .n_kv_head = 2,
                                         .n_embd = 32,
                                         .n_ffn = 40,
                                         .seq_len = T,
                                         .vocab_size = 37,
                                         .real_vocab_size = 35,
                                         .untied_head = 1,
                                         .qkv_bias = 1,
                                         .o_bias = 1,
                                         .rope_factor = 8.0,
                                         .rope_low_freq_factor = 1.0,
                                         .rope_high_freq_factor = 4.0,
                                         .rope_original_max_pos = 16};

static const float kLr = 1e-2f;

/* Without the engine: the full units in fp32, AdamW by the device. */
static void train_alone(zpp_device *dev, const zpp_engine_opts *eo, const int32_t *tok,
                        const int32_t *tgt, float *losses) {
    zpp_model *m;
    EXPECT_OK(zpp_model_family_create("llama", &kShape, ZPP_FP32, B, dev, &m));
    const int U = m->n_units;
    float *p[8], *g[8], *mo[8], *v[8], *work[8];
    EXPECT(U <= 8, "too many units");
    for (int u = 0; u < U; u++) {
        const size_t n = m->unit_numel[u];
        p[u] = zpp_test_malloc(n * sizeof(float));
        work[u] = zpp_test_malloc(n * sizeof(float));
        g[u] = calloc(n, sizeof(float));
        mo[u] = calloc(n, sizeof(float));
        v[u] = calloc(n, sizeof(float));
        EXPECT(g[u] && mo[u] && v[u], "out of memory");
        EXPECT_OK(m->ops->init_params(m, u, 0, n, p[u], eo->seed));
    }
    for (int s = 0; s < STEPS; s++) {
        EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
        for (int k = 0; k < m->n_stages; k++) EXPECT_OK(m->ops->forward(m, k, p[m->stage_unit[k]]));
        losses[s] = m->ops->loss(m);
        for (int k = m->n_stages - 1; k >= 0; k--)
            EXPECT_OK(m->ops->backward(m, k, p[m->stage_unit[k]], g[m->stage_unit[k]], 1.0f));
        const zpp_adamw_args aw = {.lr = kLr, .beta1 = eo->beta1, .beta2 = eo->beta2,
                                   .eps = eo->eps, .grad_scale = 1.0f, .step = s + 1,
                                   .clear_grad = 1};
        for (int u = 0; u < U; u++)
            EXPECT_OK(dev->ops->adamw(dev, p[u], mo[u], v[u], g[u], m->unit_numel[u], &aw,
                                      work[u], ZPP_FP32));
    }
    for (int u = 0; u < U; u++) {
        free(p[u]);
        free(g[u]);
        free(mo[u]);
        free(v[u]);
        free(work[u]);
    }
    m->ops->destroy(m);
}

static void test_engine_trains_as_one_rank(void) {
    zpp_device *dev;
    zpp_topo *topo;
    zpp_topo_opts to = {0};
    to.backend = ZPP_BACKEND_MPI;
    to.node_size = 1;
    EXPECT_OK(zpp_device_create_host(&dev));
    EXPECT_OK(zpp_topo_create_with_opts(&to, &topo));
    zpp_engine_opts eo = zpp_engine_opts_default();
    eo.work_dtype = ZPP_FP32;
    eo.grad_clip = 0.0f;    /* AdamW then sees the gradient itself */
    eo.weight_decay = 0.0f; /* as train_alone's AdamW */
    zpp_rng r = zpp_rng_make(zpp_test_seed(1)); /* the same on every rank */
    eo.seed = zpp_rng_u64(&r);
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(zpp_rng_u64(&r) % 37);
        tgt[i] = (int32_t)(zpp_rng_u64(&r) % 35);
    }
    float want[STEPS];
    train_alone(dev, &eo, tok, tgt, want);

    zpp_model *m;
    zpp_engine *e;
    EXPECT_OK(zpp_model_family_create("llama", &kShape, ZPP_FP32, B, dev, &m));
    EXPECT_OK(zpp_engine_create_with_opts(topo, m, &eo, dev, &e));
    for (int s = 0; s < STEPS; s++) {
        float loss;
        EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
        EXPECT_OK(zpp_engine_forward(e, &loss));
        EXPECT_OK(zpp_engine_backward(e, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(e, kLr, loss, NULL));
        EXPECT(isfinite(loss) && fabsf(loss - want[s]) <= 1e-6f * fabsf(want[s]),
               "world %d, step %d: loss %.9g through the engine, %.9g alone", topo->world_size,
               s, (double)loss, (double)want[s]);
    }
    EXPECT(want[STEPS - 1] < want[0], "the loss did not fall: %.6g -> %.6g", (double)want[0],
           (double)want[STEPS - 1]);
    zpp_engine_destroy(e);
    m->ops->destroy(m);
    zpp_topo_destroy(topo);
    zpp_device_destroy(dev);
}

ZPP_TESTS(ZPP_TEST(test_engine_trains_as_one_rank))

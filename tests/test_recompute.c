/* test_recompute.c — activation checkpointing (zpp_gpt2_config.recompute):
 * a GPT-2 whose blocks keep only their input and recompute the rest in the
 * backward trains to the same bits as one that keeps everything.
 *
 *   - the models side by side (the CPU reference here; the CUDA model in
 *     fp32 and bf16 under label gpu): the same parameters and batches, a
 *     few SGD steps of two micro-batches each (the second one smaller than
 *     max_batch), and every loss and every gradient compared with memcmp;
 *   - through the engine on this job's ranks (1, and 2 in ZeRO-3 and in
 *     ZeRO++ with qwZ, hpZ and qgZ, whose backward gathers reach the model
 *     from the secondary copy): a few optimizer steps each way, the losses
 *     and every rank's fp32 master shard compared with memcmp;
 *   - the memory: the CPU model's activations are (L-1) block slabs fewer,
 *     the size of a slab written out from the kernels' needs; the CUDA
 *     model's device allocation shrinks by (L-1) of its slabs, and the
 *     planner's activation count (zpp_cost_gpt_act_bytes) by as much, and
 *     the "gpt2" family's factory passes the flag on;
 *   - the CUDA model keeping its LayerNorm outputs, or those and its GELU
 *     output (keep_acts), against recomputing them; and its scratch lying in
 *     the d logits where they are large enough (SCRATCH IN THE LOGITS).
 *
 * Batches are fresh random tokens each run (zpp_test_seed). */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "device/device.h"
#include "device/device_caps.h"
#include "engine/engine.h"
#include "model/family.h"
#include "model/gpt2.h"
#include "plan/cost.h"
#include "cuda_testlib.h"
#include "testlib.h"

enum { kSteps = 3, kMaxBatch = 2 };

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) zpp_test_fail(__FILE__, __LINE__, NULL, "out of host memory (%zu x %zu)", n, size);
    return p;
}

static void random_tokens(zpp_rng *r, int32_t *x, size_t n, int range) {
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)(zpp_rng_u64(r) % (uint64_t)range);
}

/* ---- the two models side by side --------------------------------------------- */

/* The plain model and the checkpointed one on one device, reading the same
 * parameters (one buffer per unit in the working dtype, in the device's
 * memory), each with its own fp32 gradients. */
typedef struct pair {
    zpp_gpt2_config cfg;
    zpp_dtype dtype;
    zpp_device *dev;
    zpp_model *m[2]; /* [0] plain, [1] recompute */
    int nu;
    float **p;       /* host fp32 parameters, the source of truth */
    void **pw;       /* host, in the working dtype */
    void **dp;       /* device, in the working dtype */
    float **dg[2];   /* device gradients of each model */
    float **hg[2];   /* host copies */
} pair;

static void *dalloc(zpp_device *d, size_t bytes) {
    void *p = NULL;
    EXPECT_OK(zpp_device_alloc(d, bytes, &p));
    return p;
}

/* Models of cfg with recompute 0 and 1 (or, keep not 0, with keep_acts 0
 * and keep) on dev, parameters from a fresh seed. bytes_p (may be NULL):
 * the device memory each model's create took. */
static pair pair_make_of(zpp_gpt2_config cfg, int keep, zpp_dtype dtype, zpp_device *dev,
                         size_t bytes_p[2]) {
    pair t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.dtype = dtype;
    t.dev = dev;
    for (int k = 0; k < 2; k++) {
        zpp_gpt2_config c = cfg;
        if (keep) c.keep_acts = k ? keep : 0;
        else c.recompute = k;
        size_t before = 0, after = 0;
        zpp_device_mem_stats(dev, &before, NULL);
        EXPECT_OK(zpp_gpt2_create(&c, dtype, kMaxBatch, dev, &t.m[k]));
        zpp_device_mem_stats(dev, &after, NULL);
        if (bytes_p) bytes_p[k] = after - before;
    }
    t.nu = t.m[0]->n_units;
    t.p = xcalloc((size_t)t.nu, sizeof *t.p);
    t.pw = xcalloc((size_t)t.nu, sizeof *t.pw);
    t.dp = xcalloc((size_t)t.nu, sizeof *t.dp);
    for (int k = 0; k < 2; k++) {
        t.dg[k] = xcalloc((size_t)t.nu, sizeof **t.dg);
        t.hg[k] = xcalloc((size_t)t.nu, sizeof **t.hg);
    }
    zpp_rng r = zpp_rng_make(zpp_test_seed(11));
    const uint64_t seed = zpp_rng_u64(&r);
    const size_t es = zpp_dtype_size(dtype);
    for (int u = 0; u < t.nu; u++) {
        const size_t n = t.m[0]->unit_numel[u];
        t.p[u] = xcalloc(n, sizeof(float));
        EXPECT_OK(t.m[0]->ops->init_params(t.m[0], u, 0, n, t.p[u], seed));
        t.pw[u] = xcalloc(n, es);
        t.dp[u] = dalloc(dev, n * es);
        for (int k = 0; k < 2; k++) {
            t.dg[k][u] = dalloc(dev, n * sizeof(float));
            t.hg[k][u] = xcalloc(n, sizeof(float));
        }
    }
    return t;
}

static pair pair_make(zpp_gpt2_config cfg, zpp_dtype dtype, zpp_device *dev, size_t bytes_p[2]) {
    return pair_make_of(cfg, 0, dtype, dev, bytes_p);
}

static void pair_free(pair *t) {
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
    for (int u = 0; u < t->nu; u++) {
        free(t->p[u]);
        free(t->pw[u]);
        zpp_device_free(t->dev, t->dp[u]);
        for (int k = 0; k < 2; k++) {
            zpp_device_free(t->dev, t->dg[k][u]);
            free(t->hg[k][u]);
        }
    }
    free(t->p), free(t->pw), free(t->dp);
    for (int k = 0; k < 2; k++) {
        free(t->dg[k]), free(t->hg[k]);
        t->m[k]->ops->destroy(t->m[k]);
    }
}

/* p rounded to the working dtype, onto the device; both gradients zeroed. */
static void pair_upload(pair *t) {
    const size_t es = zpp_dtype_size(t->dtype);
    for (int u = 0; u < t->nu; u++) {
        const size_t n = t->m[0]->unit_numel[u];
        for (size_t i = 0; i < n; i++) zpp_store_f32(t->pw[u], t->dtype, i, t->p[u][i]);
        EXPECT_OK(zpp_device_copy(t->dev, t->dp[u], t->pw[u], n * es));
        for (int k = 0; k < 2; k++)
            EXPECT_OK(zpp_device_set(t->dev, t->dg[k][u], 0, n * sizeof(float)));
    }
    EXPECT_OK(zpp_device_sync(t->dev, NULL));
}

/* One micro-batch through model k: every forward stage, then every backward
 * stage in reverse, adding into its gradients (stage 0 reads no params). */
static float pair_micro(pair *t, int k, const int32_t *tok, const int32_t *tgt, int B) {
    zpp_model *m = t->m[k];
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
    for (int s = 0; s < m->n_stages; s++)
        EXPECT_OK(m->ops->forward(m, s, t->dp[m->stage_unit[s]]));
    const float loss = m->ops->loss(m);
    for (int s = m->n_stages - 1; s >= 0; s--) {
        const int u = m->stage_unit[s];
        EXPECT_OK(m->ops->backward(m, s, s == 0 ? NULL : t->dp[u], t->dg[k][u], 1.0f));
    }
    return loss;
}

/* Whether element i of unit u is one of fc2's weights (a block's). */
static int is_fc2_weight(const zpp_gpt2_config *cfg, int u, size_t i) {
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(cfg, &l);
    const size_t C = (size_t)cfg->n_embd;
    return u > 0 && i >= l.fc2_w && i < l.fc2_w + 4 * C * C;
}

/* kSteps steps of two micro-batches (B = kMaxBatch, then 1) on both models:
 * the same loss bits each micro-batch, the same gradient bits each step;
 * then SGD on the host fp32 parameters. With fc2_near, fc2's weight
 * gradients need only agree within fc2_near relative to their unit's
 * largest (kept GELU outputs: one rounding apart, gpt2_cuda.cu). */
static void pair_train_near(pair *t, const char *what, double fc2_near) {
    const int T = t->cfg.seq_len, Vr = zpp_gpt2_real_vocab(&t->cfg);
    int32_t *tok = xcalloc((size_t)kMaxBatch * T, sizeof *tok);
    int32_t *tgt = xcalloc((size_t)kMaxBatch * T, sizeof *tgt);
    zpp_rng r = zpp_rng_make(zpp_test_seed(12));
    for (int step = 0; step < kSteps; step++) {
        pair_upload(t);
        for (int micro = 0; micro < 2; micro++) {
            const int B = micro == 0 ? kMaxBatch : 1;
            random_tokens(&r, tok, (size_t)B * T, t->cfg.vocab_size);
            random_tokens(&r, tgt, (size_t)B * T, Vr);
            const float plain = pair_micro(t, 0, tok, tgt, B);
            const float ckpt = pair_micro(t, 1, tok, tgt, B);
            EXPECT(isfinite(plain) && !memcmp(&plain, &ckpt, sizeof plain),
                   "%s, step %d micro-batch %d: loss %.9g in the second model, %.9g in the first",
                   what, step, micro, (double)ckpt, (double)plain);
        }
        EXPECT_OK(zpp_device_sync(t->dev, NULL));
        for (int u = 0; u < t->nu; u++) {
            const size_t n = t->m[0]->unit_numel[u];
            for (int k = 0; k < 2; k++)
                EXPECT_OK(zpp_device_copy(t->dev, t->hg[k][u], t->dg[k][u], n * sizeof(float)));
            double big = 0.0;
            for (size_t j = 0; fc2_near > 0 && j < n; j++)
                if (is_fc2_weight(&t->cfg, u, j)) big = fmax(big, fabs(t->hg[0][u][j]));
            size_t i = 0;
            while (i < n && (!memcmp(&t->hg[0][u][i], &t->hg[1][u][i], sizeof(float)) ||
                             (fc2_near > 0 && is_fc2_weight(&t->cfg, u, i) &&
                              fabs(t->hg[0][u][i] - t->hg[1][u][i]) <= fc2_near * big)))
                i++;
            EXPECT(i == n, "%s, step %d: unit %d gradient [%zu] %.9g in the second model, %.9g "
                           "in the first",
                   what, step, u, i, (double)t->hg[1][u][i], (double)t->hg[0][u][i]);
            for (size_t j = 0; j < n; j++) t->p[u][j] -= 0.1f * t->hg[0][u][j];
        }
    }
    free(tok);
    free(tgt);
}

static void pair_train_same_bits(pair *t, const char *what) { pair_train_near(t, what, 0.0); }

/* The CPU reference, fp32 and bf16, on a shape with ragged sizes (C = 24,
 * odd T and V, padded vocabulary) and three blocks: the backward of blocks
 * 1 and 2 recompute, block 3's finds its activations in place. */
static void test_cpu_model_same_bits(void) {
    const zpp_gpt2_config cfg = {3, 2, 24, 11, 37, 31, 0, 0};
    const zpp_dtype dts[2] = {ZPP_FP32, ZPP_BF16};
    zpp_device *dev = NULL;
    EXPECT_OK(zpp_device_create_host(&dev));
    for (int d = 0; d < 2; d++) {
        pair t = pair_make(cfg, dts[d], dev, NULL);
        pair_train_same_bits(&t, zpp_dtype_name(dts[d]));
        pair_free(&t);
    }
    zpp_device_destroy(dev);
}

/* ---- memory ------------------------------------------------------------------- */

/* The floats zpp_gpt2_acts_plan takes (no alignment). */
static size_t acts_floats(const zpp_gpt2_config *cfg, int max_batch) {
    zpp_arena a = {NULL, 0, 1, 0};
    zpp_gpt2_acts x;
    zpp_gpt2_acts_plan(cfg, max_batch, &a, &x);
    EXPECT(!a.overflow, "activation plan overflowed");
    return a.used;
}

/* A block's activations in the CPU model besides its output on the
 * residual stream, per row: ln1, atty, mid, ln2 (C each), qkv 3C, fc and
 * gelu 4C each, two LayerNorms' mean and rstd; per sequence and head the
 * T x T attention probabilities. Checkpointing keeps one such slab. */
static void test_cpu_model_memory(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(13));
    for (int trial = 0; trial < 4; trial++) {
        zpp_gpt2_config cfg = {0};
        cfg.n_layer = 1 + (int)(zpp_rng_u64(&r) % 6);
        cfg.n_head = 1 + (int)(zpp_rng_u64(&r) % 4);
        cfg.n_embd = cfg.n_head * (1 + (int)(zpp_rng_u64(&r) % 16));
        cfg.seq_len = 1 + (int)(zpp_rng_u64(&r) % 40);
        cfg.vocab_size = 1 + (int)(zpp_rng_u64(&r) % 300);
        const int Bm = 1 + (int)(zpp_rng_u64(&r) % 4);
        const size_t L = (size_t)cfg.n_layer, C = (size_t)cfg.n_embd, T = (size_t)cfg.seq_len;
        const size_t N = (size_t)Bm * T, H = (size_t)cfg.n_head;
        const size_t slab = 15 * N * C + 4 * N + (size_t)Bm * H * T * T;
        const size_t plain = acts_floats(&cfg, Bm);
        cfg.recompute = 1;
        const size_t ckpt = acts_floats(&cfg, Bm);
        EXPECT(plain - ckpt == (L - 1) * slab,
               "L %zu C %zu T %zu H %zu B %d: checkpointing saves %zu floats, want (L-1) x "
               "%zu = %zu",
               L, C, T, H, Bm, plain - ckpt, slab, (L - 1) * slab);
    }
}

/* ---- through the engine, on this job's ranks ------------------------------------ */

typedef struct mode {
    const char *name;
    int qwz, hpz, qgz, node_size; /* node_size 0: the world, one node */
} mode;

/* kSteps optimizer steps of two micro-batches (B = 2, then 1) of fresh
 * tokens (the same for both runs: stream from the rank) in `dtype`; the
 * losses into loss[kSteps * 2], this rank's fp32 master of every unit into
 * a new buffer (*master_p, *n_p floats). */
static void engine_run(const zpp_gpt2_config *cfg, zpp_dtype dtype, const mode *md, float *loss,
                       float **master_p, size_t *n_p) {
    zpp_topo_opts to = {0};
    to.backend = ZPP_BACKEND_MPI;
    to.node_size = md->node_size;
    zpp_device *dev = NULL;
    zpp_topo *topo = NULL;
    zpp_model *model = NULL;
    zpp_engine *eng = NULL;
    if (!to.node_size) MPI_Comm_size(MPI_COMM_WORLD, &to.node_size);
    EXPECT_OK(zpp_device_create_host(&dev));
    EXPECT_OK(zpp_topo_create_with_opts(&to, &topo));
    zpp_engine_opts eo = zpp_engine_opts_default();
    eo.gather = md->qwz ? ZPP_GATHER_QWZ : ZPP_GATHER_BASELINE;
    eo.hpz = md->hpz;
    eo.reduce = md->qgz ? ZPP_REDUCE_QGZ : ZPP_REDUCE_BASELINE;
    eo.work_dtype = dtype;
    eo.max_reuse_distance = 0; /* every backward gathers its unit again */
    zpp_rng sr = zpp_rng_make(zpp_test_seed(21));
    eo.seed = zpp_rng_u64(&sr);
    EXPECT_OK(zpp_gpt2_create(cfg, dtype, kMaxBatch, dev, &model));
    EXPECT_OK(zpp_engine_create_with_opts(topo, model, &eo, dev, &eng));
    const int T = cfg->seq_len;
    int32_t *tok = xcalloc((size_t)kMaxBatch * T, sizeof *tok);
    int32_t *tgt = xcalloc((size_t)kMaxBatch * T, sizeof *tgt);
    zpp_rng r = zpp_rng_make(zpp_test_seed(22 + (uint64_t)topo->world_rank));
    for (int step = 0; step < kSteps; step++) {
        float sum = 0;
        for (int micro = 0; micro < 2; micro++) {
            const int B = micro == 0 ? kMaxBatch : 1;
            random_tokens(&r, tok, (size_t)B * T, cfg->vocab_size);
            random_tokens(&r, tgt, (size_t)B * T, cfg->vocab_size);
            EXPECT_OK(model->ops->set_batch(model, tok, tgt, B));
            EXPECT_OK(zpp_engine_forward(eng, &loss[2 * step + micro]));
            EXPECT_OK(zpp_engine_backward(eng, 0.5f));
            sum += loss[2 * step + micro];
        }
        EXPECT_OK(zpp_engine_update_with_stats(eng, 1e-2f, sum / 2, NULL));
    }
    size_t total = 0;
    float *master = NULL;
    for (int u = 0; u < zpp_engine_unit_count(eng); u++) {
        size_t numel, begin, count;
        EXPECT_OK(zpp_engine_shard_range(eng, u, &numel, &begin, &count));
        float *st = xcalloc(3 * (count + 1), sizeof(float));
        EXPECT_OK(zpp_engine_state_get(eng, u, st, st + count + 1, st + 2 * (count + 1)));
        master = realloc(master, (total + count + 1) * sizeof(float));
        EXPECT(master != NULL, "out of host memory");
        memcpy(master + total, st, count * sizeof(float));
        total += count;
        free(st);
    }
    free(tok);
    free(tgt);
    zpp_engine_destroy(eng);
    model->ops->destroy(model);
    zpp_topo_destroy(topo);
    zpp_device_destroy(dev);
    *master_p = master;
    *n_p = total;
}

/* ZeRO-3 and ZeRO++ (on 2+ ranks; ZeRO-3 alone on 1), fp32 and bf16: the
 * checkpointed model's losses and masters are the plain model's bits. */
static void test_engine_same_bits(void) {
    const zpp_gpt2_config plain = {3, 2, 16, 16, 64, 0, 0, 0};
    zpp_gpt2_config ckpt = plain;
    ckpt.recompute = 1;
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    /* One rank a node: every collective crosses nodes. One node of all the
     * ranks: hpZ's secondary copy serves the backward's gathers. */
    const mode modes[] = {{"ZeRO-3", 0, 0, 0, 1},
                          {"ZeRO++ (qwZ, qgZ) across nodes", 1, 0, 1, 1},
                          {"ZeRO++ (qwZ, hpZ, qgZ) in a node", 1, 1, 1, 0}};
    const int n_modes = world > 1 ? 3 : 1;
    const zpp_dtype dts[2] = {ZPP_FP32, ZPP_BF16};
    for (int md = 0; md < n_modes; md++)
        for (int d = 0; d < 2; d++) {
            float l0[2 * kSteps], l1[2 * kSteps], *m0 = NULL, *m1 = NULL;
            size_t n0 = 0, n1 = 0;
            engine_run(&plain, dts[d], &modes[md], l0, &m0, &n0);
            engine_run(&ckpt, dts[d], &modes[md], l1, &m1, &n1);
            for (int k = 0; k < 2 * kSteps; k++)
                EXPECT(isfinite(l0[k]) && !memcmp(&l0[k], &l1[k], sizeof *l0),
                       "%s %s, %d ranks, micro-step %d: loss %.9g with checkpointing, %.9g "
                       "without",
                       modes[md].name, zpp_dtype_name(dts[d]), world, k, (double)l1[k],
                       (double)l0[k]);
            EXPECT(n0 == n1 && !memcmp(m0, m1, n0 * sizeof *m0),
                   "%s %s, %d ranks: the fp32 masters differ with checkpointing", modes[md].name,
                   zpp_dtype_name(dts[d]), world);
            free(m0);
            free(m1);
        }
}

/* ---- the CUDA model (label gpu) ------------------------------------------------- */

/* The bytes the CUDA model's per-layer activations take beyond one slab
 * of them, buffer by buffer as gpt2_cuda.cu's plan() takes them, each
 * rounded up to 256 bytes: ln1 and ln2 mean and rstd (fp32, N each), qkv
 * (3NC e), the attention's lse (fp32, B H T) or P (B H T T e), atty (NC e),
 * mid (fp32 NC), fch (4NC e); L slabs of each without checkpointing. */
static size_t cuda_saved_bytes(const zpp_gpt2_config *c, int Bm, size_t e, int fused) {
    const size_t C = (size_t)c->n_embd, T = (size_t)c->seq_len, H = (size_t)c->n_head;
    const size_t N = (size_t)Bm * T, bh = (size_t)Bm * H, L = (size_t)c->n_layer;
    const size_t att = fused ? 4 * bh * T : bh * T * T * e;
    const size_t bufs[9] = {4 * N,     4 * N,     3 * N * C * e, att,          N * C * e,
                            4 * N * C, 4 * N,     4 * N,         4 * N * C * e};
    size_t sum = 0;
    for (int i = 0; i < 9; i++) {
        const size_t all = (L * bufs[i] + 255) / 256 * 256, one = (bufs[i] + 255) / 256 * 256;
        sum += all - one;
    }
    return sum;
}

/* The CUDA model in fp32 (the GEMM attention) and bf16 (fused attention,
 * head size 64, from compute capability 8.0): the same bits with and
 * without checkpointing, (L-1) slabs less device memory, and the planner's
 * activation bytes (bf16, fused) lower by the same amount up to the
 * 256-byte alignment of the nine buffers of a slab. N C is a multiple of
 * 128, so slabs of the plain model start 256-byte aligned like the shared
 * one (gpt2_cuda.cu, CHECKPOINTING). */
/* The CUDA tests' shape and dtypes: fp32, and bf16 where GPU 0 runs it. */
static const zpp_gpt2_config kCudaCfg = {3, 2, 128, 32, 160, 150, 0, 0};
static const zpp_dtype kCudaDtypes[2] = {ZPP_FP32, ZPP_BF16};

static int cuda_dtype_runs(zpp_device *dev, zpp_dtype dt) {
    int major = 0, minor = 0;
    EXPECT_OK(zpp_device_compute_capability(dev, &major, &minor));
    if (dt != ZPP_BF16 || 10 * major + minor >= ZPP_CC_BF16) return 1;
    printf("  bf16 left out: GPU 0 is %d.%d, bf16 needs 8.0\n", major, minor);
    return 0;
}

static void test_cuda_model_same_bits(void) {
    const zpp_gpt2_config cfg = kCudaCfg;
    zpp_device *dev = zpp_test_gpu_open("test_recompute checks the CUDA GPT-2");
    const zpp_dtype *dts = kCudaDtypes;
    for (int d = 0; d < 2; d++) {
        if (!cuda_dtype_runs(dev, dts[d])) continue;
        size_t bytes[2];
        pair t = pair_make(cfg, dts[d], dev, bytes);
        /* the "gpt2" family's factory passes the flag on: its model takes
         * the checkpointed model's memory */
        const zpp_decoder_shape shape = {.n_layer = cfg.n_layer, .n_head = cfg.n_head,
                                         .n_embd = cfg.n_embd, .seq_len = cfg.seq_len,
                                         .vocab_size = cfg.vocab_size,
                                         .real_vocab_size = cfg.real_vocab_size, .recompute = 1};
        size_t before = 0, after = 0;
        zpp_model *named = NULL;
        zpp_device_mem_stats(dev, &before, NULL);
        EXPECT_OK(zpp_model_family_create("gpt2", &shape, dts[d], kMaxBatch, dev, &named));
        zpp_device_mem_stats(dev, &after, NULL);
        named->ops->destroy(named);
        EXPECT(after - before == bytes[1], "%s: the family's checkpointed model takes %zu bytes, "
                                           "zpp_gpt2_create's %zu",
               zpp_dtype_name(dts[d]), after - before, bytes[1]);
        const size_t e = zpp_dtype_size(dts[d]), L = (size_t)cfg.n_layer;
        const size_t want = cuda_saved_bytes(&cfg, kMaxBatch, e, dts[d] == ZPP_BF16);
        EXPECT(bytes[0] - bytes[1] == want, "%s: checkpointing saves %zu device bytes, want %zu",
               zpp_dtype_name(dts[d]), bytes[0] - bytes[1], want);
        if (dts[d] == ZPP_BF16) {
            zpp_cost_in in = {0};
            in.n_layer = cfg.n_layer, in.n_embd = cfg.n_embd, in.n_head = cfg.n_head;
            in.vocab = cfg.vocab_size, in.dtype = ZPP_BF16;
            const double tokens = (double)kMaxBatch * cfg.seq_len;
            const double plan0 = zpp_cost_gpt_act_bytes(&in, tokens);
            in.recompute = 1;
            const double saved = plan0 - zpp_cost_gpt_act_bytes(&in, tokens);
            EXPECT(fabs(saved - (double)(bytes[0] - bytes[1])) <= (L - 1) * 9 * 256.0,
                   "the planner saves %.0f bytes with recompute, the model %zu", saved,
                   bytes[0] - bytes[1]);
        }
        pair_train_same_bits(&t, zpp_dtype_name(dts[d]));
        pair_free(&t);
    }
    zpp_device_destroy(dev);
}

/* The CUDA model keeping its LayerNorm outputs, or those and its GELU
 * output (keep_acts), against recomputing them: the same bits, but that in
 * bf16 fc2's weight gradient reads the forward's GELU output (cuBLASLt's
 * epilogue) instead of the kernel's recomputed one when it is kept: one
 * bf16 rounding of some inputs apart, so within 2^-6 of the unit's largest.
 * The memory: ln1 and ln2 kept are 2 C values a token and layer in place of
 * one layer's scratch of C, (2 L - 1) N C values more; the GELU output kept
 * is 4 C in place of a scratch of 4 C, (4 L - 4) N C more. */
static void test_cuda_model_keeps_acts(void) {
    const zpp_gpt2_config cfg = kCudaCfg;
    zpp_device *dev = zpp_test_gpu_open("test_recompute checks the CUDA GPT-2");
    const zpp_dtype *dts = kCudaDtypes;
    const int keeps[2] = {ZPP_KEEP_LAYERNORM, ZPP_KEEP_ALL};
    for (int d = 0; d < 2; d++) {
        if (!cuda_dtype_runs(dev, dts[d])) continue;
        for (int k = 0; k < 2; k++) {
            size_t bytes[2];
            pair t = pair_make_of(cfg, keeps[k], dts[d], dev, bytes);
            const size_t e = zpp_dtype_size(dts[d]), N = (size_t)kMaxBatch * cfg.seq_len;
            const size_t C = (size_t)cfg.n_embd, L = (size_t)cfg.n_layer;
            const int gelu = keeps[k] & ZPP_KEEP_GELU;
            const size_t more = ((2 * L - 1) + (gelu ? 4 * L - 4 : 0)) * N * C * e;
            char what[64];
            snprintf(what, sizeof what, "%s, keep_acts %d", zpp_dtype_name(dts[d]), keeps[k]);
            EXPECT(bytes[1] - bytes[0] >= more && bytes[1] - bytes[0] <= more + 4 * 256,
                   "%s: keeping takes %zu device bytes more, want %zu", what,
                   bytes[1] - bytes[0], more);
            if (dts[d] == ZPP_BF16) { /* the planner counts as much */
                zpp_cost_in in = {0};
                in.n_layer = cfg.n_layer, in.n_embd = cfg.n_embd, in.n_head = cfg.n_head;
                in.vocab = cfg.vocab_size, in.dtype = ZPP_BF16;
                const double plan0 = zpp_cost_gpt_act_bytes(&in, (double)N);
                in.keep_acts = keeps[k];
                const double plan1 = zpp_cost_gpt_act_bytes(&in, (double)N);
                EXPECT(fabs(plan1 - plan0 - (double)(bytes[1] - bytes[0])) <= 4 * 256.0,
                       "%s: the planner counts %.0f bytes more, the model takes %zu", what,
                       plan1 - plan0, bytes[1] - bytes[0]);
            }
            pair_train_near(&t, what, gelu && dts[d] == ZPP_BF16 ? 1.0 / 64 : 0.0);
            pair_free(&t);
        }
    }
    zpp_device_destroy(dev);
}

/* bytes rounded up to the arena's 256. */
static size_t arena_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The scratch in the d logits (gpt2_cuda.cu, SCRATCH IN THE LOGITS): with a
 * vocabulary of 24 C the d logits (N V values in E) hold the backward's
 * scratch (dres fp32, dres_e and dfc in E) and one layer's LayerNorm and
 * GELU outputs; with kCudaCfg's 160 they cannot. Against that model the
 * larger one takes the larger d logits and kept row, less the scratch's
 * buffers, byte for byte, and the planner counts as much. Trained with
 * checkpointing (whose backward writes the scratch again in every block)
 * and without, the same bits; test_gpt2_cuda checks such a model against
 * the CPU. */
static void test_cuda_scratch_in_logits(void) {
    zpp_device *dev = zpp_test_gpu_open("test_recompute checks the CUDA GPT-2");
    const zpp_dtype *dts = kCudaDtypes;
    for (int d = 0; d < 2; d++) {
        if (!cuda_dtype_runs(dev, dts[d])) continue;
        zpp_gpt2_config small = kCudaCfg, big = kCudaCfg;
        big.vocab_size = 24 * big.n_embd;
        const size_t e = zpp_dtype_size(dts[d]), N = (size_t)kMaxBatch * small.seq_len;
        const size_t C = (size_t)small.n_embd;
        size_t bytes[2][2];
        pair t = pair_make(big, dts[d], dev, bytes[1]);
        pair_free(&t);
        t = pair_make(small, dts[d], dev, bytes[0]);
        pair_free(&t);
        const size_t Vs = (size_t)small.vocab_size, Vb = (size_t)big.vocab_size;
        const size_t scratch = arena_bytes(4 * N * C) + (e == 4 ? 0 : arena_bytes(N * C * e)) +
                               2 * arena_bytes(4 * N * C * e) + arena_bytes(N * C * e);
        const size_t want = arena_bytes(N * Vb * e) - arena_bytes(N * Vs * e) +
                            arena_bytes(4 * Vb) - arena_bytes(4 * Vs) - scratch;
        EXPECT(bytes[1][0] - bytes[0][0] == want,
               "%s: V %zu takes %zu device bytes more than V %zu, want %zu (the scratch in "
               "the d logits)",
               zpp_dtype_name(dts[d]), Vb, bytes[1][0] - bytes[0][0], Vs, want);
        zpp_cost_in in = {0};
        in.n_layer = small.n_layer, in.n_embd = small.n_embd, in.n_head = small.n_head;
        in.vocab = small.vocab_size, in.dtype = dts[d];
        const double plan_small = zpp_cost_gpt_act_bytes(&in, (double)N);
        in.vocab = big.vocab_size;
        const double plan_big = zpp_cost_gpt_act_bytes(&in, (double)N);
        EXPECT(fabs(plan_big - plan_small - (double)want) <= 8 * 256.0,
               "%s: the planner counts %.0f bytes more for V %zu, the model %zu",
               zpp_dtype_name(dts[d]), plan_big - plan_small, Vb, want);
        t = pair_make(big, dts[d], dev, NULL);
        pair_train_same_bits(&t, zpp_dtype_name(dts[d]));
        pair_free(&t);
    }
    zpp_device_destroy(dev);
}

ZPP_TESTS(ZPP_TEST(test_cpu_model_same_bits), ZPP_TEST(test_cpu_model_memory),
          ZPP_TEST(test_engine_same_bits), ZPP_TEST_GPU(test_cuda_model_same_bits),
          ZPP_TEST_GPU(test_cuda_model_keeps_acts), ZPP_TEST_GPU(test_cuda_scratch_in_logits))

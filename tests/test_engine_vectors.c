/* test_engine_vectors.c — the model's vectors (biases, LayerNorm
 * parameters: what lies outside its matrix ranges) travel at full precision
 * under qwZ and qgZ, and their neighbours are quantized as if they were not
 * there; on 4 MPI ranks as 2 emulated nodes, with the CPU GPT-2.
 *
 * The masters are set to what makes the difference visible: matrices
 * N(0, 0.02), as GPT-2 initialises them, and vectors near 1, as LayerNorm
 * gains are. An int8 block holding one of those would round its matrix
 * neighbours about 16 times coarser than their own largest value asks
 * (1 against about 0.06 in a block of 256). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "engine_testlib.h"

/* GPT-2 with 2 layers, 2 heads, 16 wide, T = 16, vocabulary 64. */
static const zpp_gpt2_config kModel = {2, 2, 16, 16, 64, 0, 0, 0};
enum { kB = 2, kN = 2 * 16, kMaxStages = 8 };

typedef zpp_test_run run;

static void open_run(run *r, zpp_topo *topo, zpp_device *dev, zpp_dtype dtype,
                     const zpp_engine_opts *eo) {
    zpp_test_open_run(r, &kModel, dtype, kB, topo, dev, eo);
}

/* Is element i of unit u a matrix's (model.h)? */
static int in_matrix(const zpp_model *m, int u, size_t i) {
    for (int k = 0; k < m->n_matrix_ranges[u]; k++)
        if (i >= m->matrix_ranges[u][k].begin && i < m->matrix_ranges[u][k].end) return 1;
    return 0;
}

/* Unit u's masters, the same fresh values on every rank: matrices
 * N(0, 0.02), vectors 1 + N(0, 0.1). */
static float *draw_masters(const zpp_model *m, int u, uint64_t stream) {
    const size_t n = m->unit_numel[u];
    float *all = zpp_test_malloc(n * sizeof(float));
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream + (uint64_t)u));
    for (size_t i = 0; i < n; i++)
        all[i] = (float)(in_matrix(m, u, i) ? 0.02 * zpp_rng_normal(&r)
                                            : 1.0 + 0.1 * zpp_rng_normal(&r));
    return all;
}

static void set_masters(run *runs, int n, uint64_t stream) {
    const zpp_model *m = runs[0].model;
    for (int u = 0; u < m->n_units; u++) {
        size_t numel, begin, count;
        EXPECT_OK(zpp_engine_shard_range(runs[0].engine, u, &numel, &begin, &count));
        float *all = draw_masters(m, u, stream);
        float *zero = zpp_test_malloc((count + 1) * sizeof(float));
        for (int k = 0; k < n; k++)
            EXPECT_OK(zpp_engine_state_set(runs[k].engine, u, all + begin, zero, zero));
        free(zero);
        free(all);
    }
}

static void set_random_batch(zpp_model *m, uint64_t stream, int rank) {
    int32_t tok[kN], tgt[kN];
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream + (uint64_t)rank));
    for (int i = 0; i < kN; i++) {
        tok[i] = (int32_t)(zpp_rng_u64(&r) % 64);
        tgt[i] = (int32_t)(zpp_rng_u64(&r) % 64);
    }
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, kB));
}

/* ---- What the model is handed: a probe around its forward and backward --- */
static const zpp_model_ops *g_real;
static zpp_model_ops g_probe;
static zpp_bf16 *g_seen[2][kMaxStages]; /* [backward?][stage]: bf16 params, NULL if none */

static void seen(int bwd, const zpp_model *m, int stage, const void *params) {
    if (!params) return;
    const size_t n = m->unit_numel[m->stage_unit[stage]];
    free(g_seen[bwd][stage]);
    g_seen[bwd][stage] = zpp_test_malloc(n * sizeof(zpp_bf16));
    memcpy(g_seen[bwd][stage], params, n * sizeof(zpp_bf16));
}

static zpp_status probe_forward(zpp_model *m, int stage, const void *params) {
    seen(0, m, stage, params);
    return g_real->forward(m, stage, params);
}

static zpp_status probe_backward(zpp_model *m, int stage, const void *params, void *grads,
                                 float loss_scale) {
    seen(1, m, stage, params);
    return g_real->backward(m, stage, params, grads, loss_scale);
}

static void probe_attach(zpp_model *m) {
    g_real = m->ops;
    g_probe = *m->ops;
    g_probe.forward = probe_forward;
    g_probe.backward = probe_backward;
    m->ops = &g_probe;
}

static void probe_detach(zpp_model *m) {
    m->ops = g_real;
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < kMaxStages; s++) {
            free(g_seen[b][s]);
            g_seen[b][s] = NULL;
        }
}

/* qwZ (with hpZ, and the reuse distance 0 so the backward gathers every
 * block again from the secondary shards): every unit the forward and the
 * backward hand the model holds its vectors as the masters rounded to bf16,
 * bit for bit; and every matrix element lies within one int8 step of its
 * bf16 master, the step being that of its block's largest MATRIX element
 * (block = opts.weight_spec.block elements from its rank's shard start):
 * a vector in the block did not set it. With quantize_vectors the vectors
 * come out rounded (the property is the option's doing). */
static void test_qwz_vectors_exact_neighbours_fine(void) {
    zpp_device *dev = NULL;
    zpp_topo *topo = NULL;
    zpp_test_open_world(2, &dev, &topo);
    for (int quantized = 0; quantized <= 1; quantized++) {
        zpp_engine_opts eo = zpp_engine_opts_default();
        eo.gather = ZPP_GATHER_QWZ;
        eo.hpz = 1;
        eo.max_reuse_distance = 0;
        eo.quantize_vectors = quantized;
        run r;
        open_run(&r, topo, dev, ZPP_BF16, &eo);
        const zpp_model *m = r.model;
        EXPECT(m->n_stages <= kMaxStages);
        set_masters(&r, 1, 700);
        set_random_batch(r.model, 800, topo->world_rank);
        probe_attach(r.model);
        float loss;
        EXPECT_OK(zpp_engine_forward(r.engine, &loss));
        EXPECT_OK(zpp_engine_backward(r.engine, 1.0f));
        const size_t B = eo.coll.weight_spec.block;
        size_t vec_wrong = 0, vec_total = 0, mat_over = 0;
        double worst = 0.0;
        for (int bwd = 0; bwd < 2; bwd++)
            for (int s = 0; s < m->n_stages; s++) {
                const zpp_bf16 *got = g_seen[bwd][s];
                if (!got) continue;
                const int u = m->stage_unit[s];
                const size_t n = m->unit_numel[u];
                const size_t sl = zpp_partition_make(n, topo).shard_len;
                float *want = draw_masters(m, u, 700);
                for (size_t i = 0; i < n; i++) {
                    const zpp_bf16 exact = zpp_split_hi(want[i]); /* the engine's rounding */
                    if (!in_matrix(m, u, i)) {
                        vec_total++;
                        vec_wrong += got[i] != exact;
                        continue;
                    }
                    const size_t shard0 = i / sl * sl, b0 = shard0 + (i - shard0) / B * B;
                    const size_t b1 = b0 + B < shard0 + sl ? b0 + B : shard0 + sl;
                    double amax = 0.0;
                    for (size_t j = b0; j < b1 && j < n; j++)
                        if (in_matrix(m, u, j))
                            amax = fmax(amax, fabs(zpp_bf16_to_f32(zpp_split_hi(want[j]))));
                    /* one int8 step, and the bf16 rounding of what comes out */
                    const double err = fabs(zpp_bf16_to_f32(got[i]) - zpp_bf16_to_f32(exact));
                    const double bound = amax / 127.0 + amax / 256.0;
                    if (err > bound) mat_over++;
                    if (amax > 0) worst = fmax(worst, err / amax);
                }
                free(want);
            }
        EXPECT(vec_total > 0);
        if (!quantized) {
            EXPECT(vec_wrong == 0, "%zu of %zu vector elements were not their bf16 masters",
                   vec_wrong, vec_total);
            EXPECT(mat_over == 0,
                   "%zu matrix elements off by more than their own block's int8 step (worst "
                   "%.4g of the block's max)",
                   mat_over, worst);
        } else {
            EXPECT(vec_wrong > 0, "quantize_vectors: all %zu vector elements came out exact",
                   vec_total);
            EXPECT(mat_over > 0, "quantize_vectors: no matrix element rounded coarser");
        }
        EXPECT_OK(zpp_engine_update_with_stats(r.engine, 0.0f, loss, NULL));
        probe_detach(r.model);
        zpp_test_close_run(&r);
    }
    zpp_test_close_world(dev, topo);
}

/* qgZ: the vectors' gradients are the exact fp32 mean over the world.
 * ZeRO-3 in fp32 (a reduce-scatter of fp32 gradients) and qgZ in fp32 run
 * one step from the same masters and batches, with no clipping, so AdamW's
 * first moment is (1 - beta1) times each one's reduced gradient. On the
 * vectors the two agree to fp32 summation order (a few ulps of the sum of
 * |g|); on the matrices qgZ's int4 shows. Two micro-batches, to check the
 * vectors' sums carry across them. With quantize_vectors the vectors
 * differ as the matrices do. */
static void test_qgz_vector_gradients_exact(void) {
    zpp_device *dev = NULL;
    zpp_topo *topo = NULL;
    zpp_test_open_world(2, &dev, &topo);
    for (int quantized = 0; quantized <= 1; quantized++) {
        run runs[2];
        for (int k = 0; k < 2; k++) {
            zpp_engine_opts eo = zpp_engine_opts_default();
            eo.work_dtype = ZPP_FP32;
            eo.grad_clip = 0.0f;
            eo.reduce = k ? ZPP_REDUCE_QGZ : ZPP_REDUCE_BASELINE;
            eo.quantize_vectors = quantized;
            open_run(&runs[k], topo, dev, ZPP_FP32, &eo);
        }
        set_masters(runs, 2, 900);
        float loss[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            for (int micro = 0; micro < 2; micro++) {
                float l;
                set_random_batch(runs[k].model, 1000 + 10 * (uint64_t)micro, topo->world_rank);
                EXPECT_OK(zpp_engine_forward(runs[k].engine, &l));
                EXPECT_OK(zpp_engine_backward(runs[k].engine, 0.5f));
                loss[k] += 0.5f * l;
            }
            EXPECT_OK(zpp_engine_update_with_stats(runs[k].engine, 1e-3f, loss[k], NULL));
        }
        const zpp_model *m = runs[0].model;
        size_t vec_over = 0, vec_total = 0, mat_far = 0;
        for (int u = 0; u < m->n_units; u++) {
            size_t numel, begin, count;
            EXPECT_OK(zpp_engine_shard_range(runs[0].engine, u, &numel, &begin, &count));
            float *st[2];
            for (int k = 0; k < 2; k++) {
                st[k] = zpp_test_malloc(3 * (count + 1) * sizeof(float));
                EXPECT_OK(zpp_engine_state_get(runs[k].engine, u, st[k], st[k] + count + 1,
                                               st[k] + 2 * (count + 1)));
            }
            const float *m3 = st[0] + count + 1, *mq = st[1] + count + 1;
            double vmax = 0.0, mmax = 0.0;
            for (size_t i = 0; i < count; i++) {
                if (in_matrix(m, u, begin + i)) mmax = fmax(mmax, fabs(m3[i]));
                else vmax = fmax(vmax, fabs(m3[i]));
            }
            for (size_t i = 0; i < count; i++) {
                const double d = fabs((double)mq[i] - m3[i]);
                if (in_matrix(m, u, begin + i)) {
                    mat_far += d > 1e-3 * mmax;
                } else {
                    vec_total++;
                    vec_over += d > 1e-5 * vmax;
                }
            }
            free(st[0]);
            free(st[1]);
        }
        /* every rank checks its own shards (each holds some vectors of a
         * block at this width) */
        EXPECT(vec_total > 0, "rank %d holds no vectors", topo->world_rank);
        EXPECT(mat_far > 0, "qgZ's int4 did not show on the matrices");
        if (!quantized)
            EXPECT(vec_over == 0, "%zu of %zu vector gradients differ from ZeRO-3's fp32 mean",
                   vec_over, vec_total);
        else
            EXPECT(vec_over > 0, "quantize_vectors: the %zu vector gradients came out exact",
                   vec_total);
        zpp_test_close_run(&runs[0]);
        zpp_test_close_run(&runs[1]);
    }
    zpp_test_close_world(dev, topo);
}

ZPP_TESTS(ZPP_TEST(test_qwz_vectors_exact_neighbours_fine),
          ZPP_TEST(test_qgz_vector_gradients_exact))

/* test_engine.c — the engine's step protocol and per-phase volumes, on 4
 * MPI ranks as 2 emulated nodes, with the CPU GPT-2. (Numerical equality
 * with 1-rank training is tested end to end in test_train.c.) */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "engine/engine.h"
#include "model/gpt2.h"
#include "testlib.h"

/* GPT-2 with 2 layers, 2 heads, 16 wide, T = 16, vocabulary 64. */
static const zpp_gpt2_config kModel = {2, 2, 16, 16, 64, 0, 0, 0};

typedef struct fixture {
    zpp_device *dev;
    zpp_topo *topo;
    zpp_model *model;
    zpp_engine *engine;
    int32_t tokens[2 * 16], targets[2 * 16];
} fixture;

/* reuse: the engine's max_reuse_distance (SIZE_MAX: the default); profile:
 * the engine's option; depth: prefetch_depth * 10 + reduce_depth (0: the
 * defaults) */
/* The fixture: kModel in `dtype` on 4 ranks as 2 nodes of 2, an engine with
 * `eo`, and a random batch from seed stream `stream` + the rank. */
static void setup_engine(fixture *f, zpp_dtype dtype, const zpp_engine_opts *eo,
                         uint64_t stream) {
    memset(f, 0, sizeof *f);
    zpp_topo_opts to = {0};
    to.backend = ZPP_BACKEND_MPI;
    to.node_size = 2;
    EXPECT_OK(zpp_device_create_host(&f->dev));
    EXPECT_OK(zpp_topo_create_with_opts(&to, &f->topo));
    EXPECT_OK(zpp_gpt2_create(&kModel, dtype, 2, f->dev, &f->model));
    EXPECT_OK(zpp_engine_create_with_opts(f->topo, f->model, eo, f->dev, &f->engine));
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream + (uint64_t)f->topo->world_rank));
    for (int i = 0; i < 32; i++) {
        f->tokens[i] = (int32_t)(zpp_rng_u64(&r) % 64);
        f->targets[i] = (int32_t)(zpp_rng_u64(&r) % 64);
    }
    EXPECT_OK(f->model->ops->set_batch(f->model, f->tokens, f->targets, 2));
}

static void setup_depth(fixture *f, int qwz, int hpz, int qgz, size_t reuse, int profile,
                        int depth) {
    zpp_engine_opts eo = zpp_engine_opts_default();
    eo.gather = qwz ? ZPP_GATHER_QWZ : ZPP_GATHER_BASELINE;
    eo.hpz = hpz;
    eo.reduce = qgz ? ZPP_REDUCE_QGZ : ZPP_REDUCE_BASELINE;
    if (reuse != SIZE_MAX) eo.max_reuse_distance = reuse;
    eo.profile = profile;
    if (depth) eo.prefetch_depth = depth / 10, eo.reduce_depth = depth % 10;
    setup_engine(f, ZPP_BF16, &eo, 100);
}

static void setup_opts(fixture *f, int qwz, int hpz, int qgz, size_t reuse, int profile) {
    setup_depth(f, qwz, hpz, qgz, reuse, profile, 0);
}

static void setup(fixture *f, int qwz, int hpz, int qgz) {
    setup_opts(f, qwz, hpz, qgz, SIZE_MAX, 0);
}

static void teardown(fixture *f) {
    zpp_engine_destroy(f->engine);
    f->model->ops->destroy(f->model);
    zpp_topo_destroy(f->topo);
    zpp_device_destroy(f->dev);
}

/* A backward needs a forward under the current weights: without one, or
 * after an optimizer step replaced the weights (which, with hpZ, also makes
 * the secondary shards stale), it is refused — never computed from stale
 * data — and the engine stays usable. */
static void test_backward_needs_current_forward(void) {
    for (int hpz = 0; hpz <= 1; hpz++) {
        fixture f;
        setup(&f, 0, hpz, 0);
        float loss = 0;
        EXPECT_STATUS(zpp_engine_backward(f.engine, 1.0f), ZPP_ERR_STATE);
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT(isfinite(loss) && loss > 0, "loss %g", (double)loss);
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, NULL));
        EXPECT_STATUS(zpp_engine_backward(f.engine, 1.0f), ZPP_ERR_STATE);
        EXPECT(strstr(zpp_last_error(), "forward") != NULL, "message: %s", zpp_last_error());
        /* the proper order works afterwards */
        zpp_engine_update_stats st;
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, &st));
        EXPECT(st.grad_norm > 0 && isfinite(st.grad_norm));
        teardown(&f);
    }
}

/* Per-phase bytes of a real step: hpZ's backward gathers never leave the
 * node; qwZ halves the forward gather (plus scales); qgZ cuts the gradient
 * reduce to about a quarter (int4 plus scales). Reuse distance 0, so that
 * the backward gathers every block again (with the default this small
 * model's blocks all stay from the forward). The ratios are those of the
 * quantized collectives alone (quantize_vectors); by default qwZ and qgZ
 * each add exactly one all-reduce of the model's vectors a step, bf16 for
 * the weights and fp32 for the gradients (engine.h). */
static void test_step_volumes_by_mode(void) {
    zpp_volume v[6];
    const int modes[6][4] = {{0, 0, 0, 1}, {1, 0, 0, 1}, {0, 1, 0, 1},
                             {0, 0, 1, 1}, {1, 0, 0, 0}, {0, 0, 1, 0}};
    for (int m = 0; m < 6; m++) {
        fixture f;
        zpp_engine_opts eo = zpp_engine_opts_default();
        eo.gather = modes[m][0] ? ZPP_GATHER_QWZ : ZPP_GATHER_BASELINE;
        eo.hpz = modes[m][1];
        eo.reduce = modes[m][2] ? ZPP_REDUCE_QGZ : ZPP_REDUCE_BASELINE;
        eo.quantize_vectors = modes[m][3];
        eo.max_reuse_distance = 0;
        setup_engine(&f, ZPP_BF16, &eo, 100);
        float loss;
        zpp_engine_update_stats st;
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, &st));
        v[m] = st.volume;
        teardown(&f);
    }
    const double fwd0 = v[0].cross_node_bytes[ZPP_PHASE_FWD_GATHER];
    const double bwd0 = v[0].cross_node_bytes[ZPP_PHASE_BWD_GATHER];
    const double red0 = v[0].cross_node_bytes[ZPP_PHASE_GRAD_REDUCE];
    EXPECT(fwd0 > 0 && bwd0 > 0 && red0 > 0);
    double r = v[1].cross_node_bytes[ZPP_PHASE_FWD_GATHER] / fwd0;
    EXPECT(r > 0.5 && r < 0.56, "qwZ forward ratio %g", r);
    EXPECT(v[2].cross_node_bytes[ZPP_PHASE_BWD_GATHER] == 0.0, "hpZ backward left the node");
    EXPECT(v[2].intra_node_bytes[ZPP_PHASE_BWD_GATHER] > 0.0);
    EXPECT(v[2].cross_node_bytes[ZPP_PHASE_FWD_GATHER] == fwd0);
    r = v[3].cross_node_bytes[ZPP_PHASE_GRAD_REDUCE] / red0;
    EXPECT(r > 0.25 && r < 0.3, "qgZ reduce ratio %g", r);
    /* the vectors: 13 C a block and the final LayerNorm's 2 C */
    const size_t V = (size_t)kModel.n_layer * 13 * kModel.n_embd + 2 * (size_t)kModel.n_embd;
    const zpp_group_shape world = zpp_group_world(2, 2);
    const zpp_phase ph[2] = {ZPP_PHASE_FWD_GATHER, ZPP_PHASE_GRAD_REDUCE};
    const size_t bytes[2] = {V * 2, V * 4};
    for (int k = 0; k < 2; k++) {
        zpp_volume want = v[1 + 2 * k];
        zpp_volume_add_call(&want, ph[k], ZPP_CALL_ALLREDUCE, &world, bytes[k]);
        const zpp_volume *got = &v[4 + k];
        EXPECT(got->cross_node_bytes[ph[k]] == want.cross_node_bytes[ph[k]] &&
                   got->intra_node_bytes[ph[k]] == want.intra_node_bytes[ph[k]] &&
                   got->calls[ph[k]] == want.calls[ph[k]],
               "%s with full-precision vectors: %.0f + %.0f bytes in %llu calls, expected "
               "%.0f + %.0f in %llu",
               zpp_phase_name(ph[k]), got->cross_node_bytes[ph[k]],
               got->intra_node_bytes[ph[k]], (unsigned long long)got->calls[ph[k]],
               want.cross_node_bytes[ph[k]], want.intra_node_bytes[ph[k]],
               (unsigned long long)want.calls[ph[k]]);
    }
}

/* Which units a step gathers, by their bytes (ZeRO-3, bf16; GPT-2 stages:
 * embedding = unit 0, blocks = units 1..L, head = unit 0 again; the
 * embedding stage's backward reads no parameters). The reference walks the
 * order in which the step uses parameters, the forward's stages and then
 * the backward's that read, and gathers a unit at a use unless it stayed:
 * a unit stays after a use when its next use comes before more than the
 * reuse distance of other units' parameters has been used in between, and
 * after the forward's last stage always. So, with 1 + L units:
 * - the default distance (1e9): every unit is gathered once, in the
 *   forward; the backward gathers nothing, all blocks stay from the forward;
 * - 0: unit 0 twice in the forward (embedding, head), every block in both
 *   passes; the head's unit still stays for the backward's head;
 * - two unit-0's and one block: only the last block stays into the
 *   backward (the one before it is two blocks and two unit-0's away);
 * - just below the blocks between embedding and head: unit 0 twice. */
static void test_gathers_follow_reuse_across_the_step(void) {
    const zpp_phase ph[2] = {ZPP_PHASE_FWD_GATHER, ZPP_PHASE_BWD_GATHER};
    const int L = kModel.n_layer, S = L + 2;
    const size_t u0 = zpp_gpt2_unit_numel(&kModel, 0), blk = zpp_gpt2_unit_numel(&kModel, 1);
    const size_t reuse[4] = {SIZE_MAX, 0, 2 * u0 + blk, (size_t)L * blk - 1};
    const int bwd_gathers_want[4] = {0, L, L - 1, -1}; /* -1: not checked by count */
    for (int variant = 0; variant < 4; variant++) {
        fixture f;
        setup_opts(&f, 0, 0, 0, reuse[variant], 0);
        const zpp_model *m = f.model;
        EXPECT(m->bwd_reads_params && m->bwd_reads_params[0] == 0, "GPT-2 stage 0 reads params?");
        for (int s = 1; s < S; s++) EXPECT(m->bwd_reads_params[s] == 1, "stage %d", s);
        float loss;
        zpp_engine_update_stats st;
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, &st));
        /* the use order: forward 0..S-1, backward S-1..1 */
        int use[2 * 8], n_use = 0;
        for (int s = 0; s < S; s++) use[n_use++] = s;
        for (int s = S - 1; s >= 1; s--) use[n_use++] = s;
        int resident[8] = {0}, bwd_gathers = 0;
        zpp_volume want;
        memset(&want, 0, sizeof want);
        const zpp_coll_opts co = zpp_coll_opts_default();
        const zpp_topo *t = f.topo;
        for (int i = 0; i < n_use; i++) {
            const int ui = m->stage_unit[use[i]];
            const zpp_phase phase = i < S ? ZPP_PHASE_FWD_GATHER : ZPP_PHASE_BWD_GATHER;
            if (!resident[ui]) {
                zpp_partition p = zpp_partition_make(m->unit_numel[ui], t);
                zpp_plan_gather(&want, &p, t->nodes, t->node_size, ZPP_GATHER_BASELINE,
                                ZPP_BF16, &co, phase);
                bwd_gathers += i >= S;
            }
            size_t between = 0;
            int next = -1;
            for (int j = i + 1; j < n_use && next < 0; j++) {
                const int uj = m->stage_unit[use[j]];
                if (uj == ui) next = j;
                else between += m->unit_numel[uj];
            }
            resident[ui] = next >= 0 && (i == S - 1 || between <= reuse[variant]);
        }
        if (bwd_gathers_want[variant] >= 0)
            EXPECT(bwd_gathers == bwd_gathers_want[variant],
                   "reference: %d backward gathers, the comment says %d", bwd_gathers,
                   bwd_gathers_want[variant]);
        for (int k = 0; k < 2; k++)
            EXPECT(st.volume.cross_node_bytes[ph[k]] == want.cross_node_bytes[ph[k]] &&
                       st.volume.intra_node_bytes[ph[k]] == want.intra_node_bytes[ph[k]],
                   "reuse variant %d, %s: %.0f + %.0f bytes, expected %.0f + %.0f", variant,
                   zpp_phase_name(ph[k]), st.volume.cross_node_bytes[ph[k]],
                   st.volume.intra_node_bytes[ph[k]], want.cross_node_bytes[ph[k]],
                   want.intra_node_bytes[ph[k]]);
        teardown(&f);
    }
}

/* A gathered unit takes the bytes of its working dtype: with bf16, padded * 2
 * per unit, not padded * 4 (the peak memory of a gathered bf16 unit is its
 * bf16 size). A forward with plain gathers leases scratch for gathered
 * units only, so after it every scratch buffer is some unit's bf16 size,
 * the largest that of the largest unit, and the device's memory grew by
 * exactly the scratch. A whole step then adds fp32 gradients (padded * 4)
 * and bf16 reduction inputs; its peak stays below two fp32 gradients (unit
 * 0's, embedding and head, lives through the whole backward next to a
 * block's), one bf16 reduction input, one fp32 output shard and the
 * gathered units the forward held, each at its own size. */
static void test_bf16_units_take_bf16_bytes(void) {
    fixture f;
    setup(&f, 0, 0, 0);
    const zpp_model *m = f.model;
    size_t biggest = 0;
    size_t *unit_bytes = calloc((size_t)m->n_units, sizeof *unit_bytes);
    for (int u = 0; u < m->n_units; u++) {
        unit_bytes[u] = zpp_partition_make(m->unit_numel[u], f.topo).padded * 2;
        if (unit_bytes[u] > biggest) biggest = unit_bytes[u];
    }
    size_t nb = 0, bytes = 0, now0 = 0, peak0 = 0, now = 0, peak = 0;
    zpp_device_scratch_stats(f.dev, &nb, &bytes);
    EXPECT(nb == 0 && bytes == 0, "scratch before the first step: %zu buffers", nb);
    zpp_device_mem_stats(f.dev, &now0, &peak0);
    float loss;
    EXPECT_OK(zpp_engine_forward(f.engine, &loss));
    zpp_device_scratch_stats(f.dev, &nb, &bytes);
    zpp_device_mem_stats(f.dev, &now, &peak);
    EXPECT(nb >= 1, "no scratch after a forward");
    size_t largest = 0;
    for (size_t i = 0; i < f.dev->pool_len; i++) {
        size_t cap = f.dev->pool[i].cap;
        int is_unit = 0;
        for (int u = 0; u < m->n_units; u++) is_unit |= cap == unit_bytes[u];
        EXPECT(is_unit, "scratch buffer %zu holds %zu bytes, no unit's bf16 size", i, cap);
        if (cap > largest) largest = cap;
    }
    EXPECT(largest == biggest, "largest gathered unit takes %zu bytes, its bf16 size is %zu",
           largest, biggest);
    EXPECT(now - now0 == bytes && peak == now, "memory grew by %zu for %zu bytes of scratch",
           now - now0, bytes);
    EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
    EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, NULL));
    zpp_device_mem_stats(f.dev, &now, &peak);
    size_t shard = 0;
    for (int u = 0; u < m->n_units; u++) {
        size_t s = zpp_partition_make(m->unit_numel[u], f.topo).shard_len * 4;
        if (s > shard) shard = s;
    }
    /* each reduction in flight holds its bf16 input and fp32 output shard */
    const size_t in_flight = (size_t)zpp_engine_opts_default().reduce_depth;
    size_t bound = bytes + 2 * 2 * biggest /* fp32 gradients */ +
                   in_flight * (biggest /* bf16 input */ + shard) +
                   64 /* the all-reduce's staging */;
    EXPECT(peak - now0 <= bound, "step peak %zu bytes above the shards, bound %zu",
           peak - now0, bound);
    /* Steps ask for the same sizes in the same order: once the pool has
     * grown to them it allocates nothing more. */
    size_t nb2 = 0, bytes2 = 0, peak2 = 0;
    for (int step = 0; step < 3; step++) {
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, NULL));
        zpp_device_scratch_stats(f.dev, &nb, &bytes);
        zpp_device_mem_stats(f.dev, &now, &peak);
        if (step > 0)
            EXPECT(nb == nb2 && bytes == bytes2 && peak == peak2,
                   "step %d grew the pool: %zu/%zu buffers, %zu/%zu bytes, peak %zu/%zu", step,
                   nb2, nb, bytes2, bytes, peak2, peak);
        nb2 = nb, bytes2 = bytes, peak2 = peak;
    }
    free(unit_bytes);
    teardown(&f);
}

/* The engine owns the device's non-finite flag: raised on one rank (here by
 * quantizing a NaN on rank 0's device, as a qwZ gather of a NaN weight
 * would), the optimizer step is skipped on every rank before any weight
 * changes (the same batch gives the same loss after it); the flag is
 * cleared and the next step updates the weights. */
static void test_nonfinite_skips_the_step_everywhere(void) {
    fixture f;
    setup(&f, 1, 0, 1);
    float loss, loss2;
    EXPECT_OK(zpp_engine_forward(f.engine, &loss));
    EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
    if (f.topo->world_rank == 0) {
        zpp_quant_spec sp = zpp_quant_spec_default(8);
        float x[8] = {1, 2, NAN, 4, 5, 6, 7, 8};
        unsigned char q[64];
        EXPECT_OK(zpp_device_quantize_chunks(f.dev, x, ZPP_FP32, 1, 8, &sp, q));
    }
    zpp_engine_update_stats st;
    EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, &st));
    EXPECT(st.skipped == 1 && st.skipped_total == 1 && !isfinite(st.grad_norm),
           "skipped %d (total %d), norm %g", st.skipped, st.skipped_total, (double)st.grad_norm);
    EXPECT(zpp_engine_steps_taken(f.engine) == 1, "the skipped step did not count");
    EXPECT_OK(zpp_engine_forward(f.engine, &loss2));
    EXPECT(loss2 == loss, "the weights changed at a skipped step: loss %.9g -> %.9g",
           (double)loss, (double)loss2);
    EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
    EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss2, &st));
    EXPECT(st.skipped == 0 && st.skipped_total == 1 && isfinite(st.grad_norm), "failed");
    EXPECT_OK(zpp_engine_forward(f.engine, &loss2));
    EXPECT(loss2 != loss, "no update after the skipped step");
    teardown(&f);
}

/* With qwZ, hpZ and qgZ too, the collectives' scratch comes from the same
 * pool, and after a first step the pool allocates nothing more. */
static void test_scratch_settles_with_zeropp(void) {
    fixture f;
    setup(&f, 1, 1, 1);
    size_t nb0 = 0, bytes0 = 0, peak0 = 0, nb, bytes, peak;
    for (int step = 0; step < 4; step++) {
        float loss;
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, NULL));
        zpp_device_scratch_stats(f.dev, &nb, &bytes);
        zpp_device_mem_stats(f.dev, NULL, &peak);
        if (step > 1)
            EXPECT(nb == nb0 && bytes == bytes0 && peak == peak0,
                   "step %d grew the pool: %zu/%zu buffers, %zu/%zu bytes", step, nb0, nb,
                   bytes0, bytes);
        nb0 = nb, bytes0 = bytes, peak0 = peak;
    }
    teardown(&f);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* One profiled step by pieces; rank `slow` sleeps `delay_ms` between its
 * forward and backward, as a straggler computing longer would. */
static zpp_engine_profile profiled_step(fixture *f, int slow, long delay_ms, double *wall_ms) {
    float loss;
    zpp_engine_update_stats st;
    double t0 = now_ms();
    EXPECT_OK(zpp_engine_forward(f->engine, &loss));
    if (f->topo->world_rank == slow) sleep_ms(delay_ms);
    EXPECT_OK(zpp_engine_backward(f->engine, 1.0f));
    EXPECT_OK(zpp_engine_update_with_stats(f->engine, 1e-3f, loss, &st));
    if (wall_ms) *wall_ms = now_ms() - t0;
    return st.profile;
}

/* With the option a step's time adds up, in every mode: the compute stream
 * (here the calling thread) ran stream_ms = compute_ms + exposed_comm_ms,
 * none negative, within the wall time the caller saw; and every collective
 * completed is one timed wait: 3 forward gathers (unit 0 stays from the
 * embedding to the head), no backward gather (with the default reuse
 * distance both blocks stay from the forward), 3 reductions and the
 * norm's all-reduce; with qwZ, and with qgZ, one all-reduce of the vectors
 * more each (engine.h). Without it the fields are 0. */
static void test_profile_adds_up(void) {
    const int modes[4][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 1}};
    for (int m = 0; m < 4; m++) {
        fixture f;
        setup_opts(&f, modes[m][0], modes[m][1], modes[m][2], SIZE_MAX, 1);
        for (int step = 0; step < 2; step++) {
            double wall = 0.0;
            zpp_engine_profile p = profiled_step(&f, -1, 0, &wall);
            EXPECT(p.valid == 1, "mode %d: no profile", m);
            EXPECT(p.stream_ms > 0.0 && p.compute_ms >= 0.0 && p.exposed_comm_ms >= 0.0,
                   "mode %d: stream %g, compute %g, exposed %g ms", m, p.stream_ms, p.compute_ms,
                   p.exposed_comm_ms);
            EXPECT(fabs(p.compute_ms + p.exposed_comm_ms - p.stream_ms) <= 1e-6 * p.stream_ms,
                   "mode %d: compute %g + exposed %g != stream %g ms", m, p.compute_ms,
                   p.exposed_comm_ms, p.stream_ms);
            EXPECT(p.stream_ms <= wall + 1e-3, "mode %d: stream %g ms, wall %g ms", m,
                   p.stream_ms, wall);
            const int want = 7 + modes[m][0] + modes[m][2];
            EXPECT(p.waits == want, "mode %d: %d waits timed, expected %d", m, p.waits, want);
        }
        teardown(&f);
    }
    fixture f;
    setup(&f, 0, 0, 0);
    zpp_engine_profile p = profiled_step(&f, -1, 0, NULL);
    EXPECT(!p.valid && p.stream_ms == 0.0 && p.exposed_comm_ms == 0.0 && p.waits == 0,
           "profiled without the option");
    teardown(&f);
}

/* Exposed communication is the time a rank stands waiting for its peers:
 * when rank 1 computes 200 ms longer (a straggler), every other rank waits
 * for it in its next collective and reports it as exposed, while rank 1
 * reports it as compute. */
static void test_profile_sees_a_straggler(void) {
    const long delay = 200;
    fixture f;
    setup_opts(&f, 1, 1, 1, SIZE_MAX, 1);
    (void)profiled_step(&f, -1, 0, NULL); /* first-step costs */
    zpp_engine_profile p = profiled_step(&f, 1, delay, NULL);
    const int r = f.topo->world_rank;
    if (r == 1) {
        EXPECT(p.compute_ms >= (double)delay && p.exposed_comm_ms < 0.5 * (double)delay,
               "the straggler: compute %g ms, exposed %g ms", p.compute_ms, p.exposed_comm_ms);
    } else {
        EXPECT(p.exposed_comm_ms >= 0.75 * (double)delay,
               "rank %d waited for a straggler 200 ms late but reports %g ms exposed", r,
               p.exposed_comm_ms);
    }
    teardown(&f);
}

/* How far the engine gathers ahead and how many reductions it keeps in
 * flight changes when the link is busy, never the result: three steps give
 * the same losses and the same fp32 masters, bit for bit, at every depth, in
 * ZeRO-3 and in ZeRO++. Depths outside [1, ZPP_ENGINE_MAX_DEPTH] are
 * refused. */
static void test_depths_give_the_same_bits(void) {
    const int depths[] = {11, 22, 31, 13, 88};
    for (int mode = 0; mode < 2; mode++) {
        float loss0[3] = {0};
        float *master0 = NULL;
        size_t total = 0;
        for (size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
            fixture f;
            setup_depth(&f, mode, mode, mode, SIZE_MAX, 0, depths[d]);
            for (int step = 0; step < 3; step++) {
                float loss;
                EXPECT_OK(zpp_engine_forward(f.engine, &loss));
                EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
                EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-2f, loss, NULL));
                if (d == 0) loss0[step] = loss;
                EXPECT(!memcmp(&loss, &loss0[step], sizeof loss),
                       "%s, depth %d: step %d loss %.9g, depth 11 gave %.9g",
                       mode ? "ZeRO++" : "ZeRO-3", depths[d], step, (double)loss,
                       (double)loss0[step]);
            }
            size_t off = 0;
            for (int u = 0; u < zpp_engine_unit_count(f.engine); u++) {
                size_t numel, begin, count;
                EXPECT_OK(zpp_engine_shard_range(f.engine, u, &numel, &begin, &count));
                float *mm = zpp_test_malloc(3 * (count + 1) * sizeof(float));
                EXPECT_OK(zpp_engine_state_get(f.engine, u, mm, mm + count + 1,
                                               mm + 2 * (count + 1)));
                if (d == 0) {
                    master0 = realloc(master0, (off + count + 1) * sizeof(float));
                    memcpy(master0 + off, mm, count * sizeof(float));
                }
                EXPECT(!memcmp(master0 + off, mm, count * sizeof(float)),
                       "%s, depth %d: unit %d's master differs from depth 11's",
                       mode ? "ZeRO++" : "ZeRO-3", depths[d], u);
                off += count;
                free(mm);
            }
            if (d == 0) total = off;
            EXPECT(off == total, "shard sizes changed with the depth");
            teardown(&f);
        }
        free(master0);
    }
    fixture f;
    setup(&f, 0, 0, 0);
    const int bad[][2] = {{0, 2}, {2, 0}, {ZPP_ENGINE_MAX_DEPTH + 1, 2}};
    for (int b = 0; b < 3; b++) {
        zpp_engine_opts eo = zpp_engine_opts_default();
        eo.prefetch_depth = bad[b][0];
        eo.reduce_depth = bad[b][1];
        zpp_engine *e = NULL;
        EXPECT(
            zpp_engine_create_with_opts(f.topo, f.model, &eo, f.dev, &e) == ZPP_ERR_INVALID && !e,
            "depths %d/%d accepted", bad[b][0], bad[b][1]);
    }
    teardown(&f);
}

/* ---- AdamW: the decay mask and clipping ------------------------------------ */

/* An fp32 GPT-2 of kModel and an engine on it (4 ranks, so every unit's
 * shards cut through tensors), the fixture's random batch set. */
static void setup_fp32(fixture *f, const zpp_engine_opts *eo) {
    setup_engine(f, ZPP_FP32, eo, 300);
}

/* Is element i of `unit` a matrix (GPT-2, gpt2.h's names)? Written from the
 * tensor list, not from the model's matrix ranges. */
static int is_matrix(const zpp_gpt2_layout *l, int unit, size_t i) {
    if (unit == 0) return i < l->lnf_w; /* wte, wpe; not lnf_w, lnf_b */
    return (i >= l->qkv_w && i < l->qkv_b) || (i >= l->proj_w && i < l->proj_b) ||
           (i >= l->fc_w && i < l->fc_b) || (i >= l->fc2_w && i < l->fc2_b);
}

/* One AdamW step against the update written out (device.h's formula, the
 * same float expressions): with the moments m, v after the step,
 *   p1 = p0 - lr * ((m / c1) / (sqrtf(v / c2) + eps) + wd' * p0),
 * wd' = weight_decay for a matrix (or every element with decay_all), 0 for
 * a bias or LayerNorm parameter: equal to the bit on every element of every
 * rank's shard. Both kinds must occur where the two formulas give different
 * bits, or the check could not tell them apart. */
static void test_weight_decay_mask(void) {
    zpp_gpt2_layout lay;
    zpp_gpt2_layout_make(&kModel, &lay);
    for (int all = 0; all <= 1; all++) {
        zpp_engine_opts eo = zpp_engine_opts_default();
        eo.work_dtype = ZPP_FP32;
        eo.weight_decay = 0.25f;
        eo.grad_clip = 0.0f;
        eo.decay_all = all;
        const float lr = 1e-2f;
        fixture f;
        setup_fp32(&f, &eo);
        const int U = zpp_engine_unit_count(f.engine);
        float *p0[8], *p1[8], *m[8], *v[8];
        size_t count[8], begin[8], numel;
        for (int u = 0; u < U; u++) {
            EXPECT_OK(zpp_engine_shard_range(f.engine, u, &numel, &begin[u], &count[u]));
            size_t n = count[u] ? count[u] : 1;
            p0[u] = zpp_test_malloc(n * 4), p1[u] = zpp_test_malloc(n * 4);
            m[u] = zpp_test_malloc(n * 4), v[u] = zpp_test_malloc(n * 4);
            EXPECT_OK(zpp_engine_state_get(f.engine, u, p0[u], m[u], v[u]));
        }
        float loss;
        zpp_engine_update_stats st;
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, lr, loss, &st));
        const float c1 = 1.0f - powf(eo.beta1, 1.0f), c2 = 1.0f - powf(eo.beta2, 1.0f);
        long seen[2] = {0, 0}, bad = 0; /* [decayed?]: elements where wd' mattered */
        for (int u = 0; u < U; u++) {
            EXPECT_OK(zpp_engine_state_get(f.engine, u, p1[u], m[u], v[u]));
            for (size_t k = 0; k < count[u]; k++) {
                const int decays = all || is_matrix(&lay, u, begin[u] + k);
                const float p = p0[u][k];
                const float adam = (m[u][k] / c1) / (sqrtf(v[u][k] / c2) + eo.eps);
                const float with = p - lr * (adam + eo.weight_decay * p);
                const float without = p - lr * (adam + 0.0f * p);
                const float want = decays ? with : without;
                if (p1[u][k] != want && bad++ < 5)
                    fprintf(stderr, "rank %d unit %d element %zu (%s): %.9g, expected %.9g\n",
                            f.topo->world_rank, u, begin[u] + k,
                            decays ? "decays" : "no decay", p1[u][k], want);
                seen[decays] += with != without;
            }
            free(p0[u]), free(p1[u]), free(m[u]), free(v[u]);
        }
        long tot[3] = {seen[0], seen[1], bad};
        MPI_Allreduce(MPI_IN_PLACE, tot, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        EXPECT(tot[2] == 0, "decay_all %d: %ld elements off the AdamW reference", all, tot[2]);
        /* at init the biases are 0 (decay moves nothing) and the LayerNorm
         * weights 1: those 5 x 16 tell */
        EXPECT(tot[1] > 1000 && (all || tot[0] >= 5 * 16),
               "decay_all %d: too few telling elements (%ld decayed, %ld not)", all, tot[1],
               tot[0]);
        EXPECT(!all || tot[0] == 0);
        teardown(&f);
    }
}

/* Clipping as torch.nn.utils.clip_grad_norm_: the gradients are multiplied
 * by c = max_norm / (norm + 1e-6) when c < 1. With beta1 = 0 the first
 * moment after step 1 is the scaled gradient itself, exactly, so against an
 * engine without clipping (same init, same batch, the same bits of g):
 *   max_norm = norm: c = norm / (norm + 1e-6) < 1, so m = c * g (the old
 *     rule, clip only when norm > max_norm, left g alone here);
 *   max_norm = 2 norm: c > 1, m = g. */
static void test_clipping_coefficient(void) {
    zpp_engine_opts eo = zpp_engine_opts_default();
    eo.work_dtype = ZPP_FP32;
    eo.beta1 = 0.0f;
    eo.grad_clip = 0.0f;
    float ref_norm = 0.0f;
    float *g[8];
    size_t count[8], begin, numel;
    for (int run = 0; run < 3; run++) {
        fixture f;
        if (run == 1) eo.grad_clip = ref_norm;
        if (run == 2) eo.grad_clip = 2.0f * ref_norm;
        setup_fp32(&f, &eo);
        float loss;
        zpp_engine_update_stats st;
        EXPECT_OK(zpp_engine_forward(f.engine, &loss));
        EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, &st));
        const int U = zpp_engine_unit_count(f.engine);
        if (run == 0) ref_norm = st.grad_norm;
        EXPECT(st.grad_norm == ref_norm, "the norm before clipping changed: %.9g vs %.9g",
               (double)st.grad_norm, (double)ref_norm);
        const float c = run == 1 ? ref_norm / (ref_norm + 1e-6f) : 1.0f;
        if (run == 1) EXPECT(c < 1.0f, "coefficient %.9g", (double)c);
        long bad = 0;
        for (int u = 0; u < U; u++) {
            EXPECT_OK(zpp_engine_shard_range(f.engine, u, &numel, &begin, &count[u]));
            size_t n = count[u] ? count[u] : 1;
            float *p = zpp_test_malloc(n * 4), *m = zpp_test_malloc(n * 4),
                  *v = zpp_test_malloc(n * 4);
            EXPECT_OK(zpp_engine_state_get(f.engine, u, p, m, v));
            if (run == 0) {
                g[u] = m;
                m = NULL;
            } else {
                for (size_t k = 0; k < count[u]; k++) bad += m[k] != c * g[u][k];
            }
            free(p), free(m), free(v);
        }
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        EXPECT(bad == 0, "run %d (max_norm %.9g, norm %.9g): %ld moments are not %.9g g", run,
               (double)eo.grad_clip, (double)ref_norm, bad, (double)c);
        teardown(&f);
        if (run == 2)
            for (int u = 0; u < U; u++) free(g[u]);
    }
}

ZPP_TESTS(ZPP_TEST(test_weight_decay_mask), ZPP_TEST(test_clipping_coefficient),
          ZPP_TEST(test_backward_needs_current_forward), ZPP_TEST(test_depths_give_the_same_bits), ZPP_TEST(test_step_volumes_by_mode),
          ZPP_TEST(test_scratch_settles_with_zeropp),
          ZPP_TEST(test_nonfinite_skips_the_step_everywhere),
          ZPP_TEST(test_gathers_follow_reuse_across_the_step),
          ZPP_TEST(test_bf16_units_take_bf16_bytes), ZPP_TEST(test_profile_adds_up),
          ZPP_TEST(test_profile_sees_a_straggler))

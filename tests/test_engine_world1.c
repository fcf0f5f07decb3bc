/* test_engine_world1.c — the engine on a world of one rank, where nothing
 * is reduced: the model's backward adds straight into the fp32 gradient
 * accumulators (engine.c, alone()). Two properties, with the CPU GPT-2:
 *   - the gradient AdamW sees is the model's own fp32 gradient, bit for bit
 *     (not rounded to the working dtype as for a wire), for one micro-batch
 *     and for the sum of two;
 *   - a step leases scratch for gathered units only: no full gradient, no
 *     reduction input or output;
 * and, with a model that can write them, bf16 accumulators (work_grads)
 * hold what fp32 ones holding the same rounded sums would; a model too
 * large for the rank's memory is refused with a message that says what to
 * do. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/gpt2.h"
#include "testlib.h"

/* GPT-2 with 2 layers, 2 heads, 16 wide, T = 16, vocabulary 64. */
static const zpp_gpt2_config kModel = {2, 2, 16, 16, 64, 0, 0, 0};
enum { kB = 2, kN = 2 * 16 };

typedef struct fixture {
    zpp_device *dev;
    zpp_topo *topo;
    zpp_model *model, *ref; /* the engine's, and the reference's own */
    zpp_engine *engine;
    zpp_engine_opts eo;
} fixture;

/* The host device and a world of one rank. */
static void fixture_open(fixture *f) {
    memset(f, 0, sizeof *f);
    zpp_topo_opts to = {0};
    to.backend = ZPP_BACKEND_MPI;
    to.node_size = 1;
    EXPECT_OK(zpp_device_create_host(&f->dev));
    EXPECT_OK(zpp_topo_create_with_opts(&to, &f->topo));
    EXPECT(f->topo->world_size == 1, "needs one rank, has %d", f->topo->world_size);
}

static void setup_with(fixture *f, int resident) {
    fixture_open(f);
    EXPECT_OK(zpp_gpt2_create(&kModel, ZPP_BF16, kB, f->dev, &f->model));
    EXPECT_OK(zpp_gpt2_create(&kModel, ZPP_BF16, kB, f->dev, &f->ref));
    f->eo = zpp_engine_opts_default();
    f->eo.grad_clip = 0.0f; /* AdamW then sees the gradient itself (grad_scale 1) */
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    f->eo.seed = zpp_rng_u64(&r);
    f->eo.resident_weights = resident;
    EXPECT_OK(zpp_engine_create_with_opts(f->topo, f->model, &f->eo, f->dev, &f->engine));
}

static void setup(fixture *f) { setup_with(f, 1); }

static void teardown(fixture *f) {
    zpp_engine_destroy(f->engine);
    f->model->ops->destroy(f->model);
    f->ref->ops->destroy(f->ref);
    zpp_topo_destroy(f->topo);
    zpp_device_destroy(f->dev);
}

static void random_batch(zpp_rng *r, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < kN; i++) {
        tok[i] = (int32_t)(zpp_rng_u64(r) % 64);
        tgt[i] = (int32_t)(zpp_rng_u64(r) % 64);
    }
}

/* The engine's weights, as its gather hands them to the model: the
 * initial fp32 values of each unit rounded to bf16 as the engine rounds
 * masters (core/dtype.h, zpp_split_hi). */
static zpp_bf16 **ref_weights(const fixture *f) {
    const zpp_model *m = f->ref;
    zpp_bf16 **w = calloc((size_t)m->n_units, sizeof *w);
    for (int u = 0; u < m->n_units; u++) {
        size_t n = m->unit_numel[u];
        float *h = calloc(n, sizeof *h);
        w[u] = calloc(n, sizeof **w);
        EXPECT_OK(m->ops->init_params(f->ref, u, 0, n, h, f->eo.seed));
        for (size_t i = 0; i < n; i++) w[u][i] = zpp_split_hi(h[i]);
        free(h);
    }
    return w;
}

/* One micro-batch through the reference model, its gradients added into g
 * stage by stage in the engine's order (the backward's stages in reverse). */
static void ref_micro_batch(fixture *f, zpp_bf16 **w, float **g, const int32_t *tok,
                            const int32_t *tgt) {
    zpp_model *m = f->ref;
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, kB));
    for (int s = 0; s < m->n_stages; s++) EXPECT_OK(m->ops->forward(m, s, w[m->stage_unit[s]]));
    (void)m->ops->loss(m);
    for (int s = m->n_stages - 1; s >= 0; s--)
        EXPECT_OK(m->ops->backward(m, s, w[m->stage_unit[s]], g[m->stage_unit[s]], 1.0f));
}

/* With grad_scale 1 and zero moments, AdamW's first update stores
 * m = b1 * 0 + (1 - b1) g: the gradient it saw, scaled by one rounding
 * that the reference repeats. Micro-batches 1 and 2: the accumulator holds
 * their exact fp32 sum, in the order the model adds it. */
static void test_gradient_is_the_models(void) {
    for (int micro = 1; micro <= 2; micro++) {
        fixture f;
        setup(&f);
        const zpp_model *m = f.ref;
        zpp_rng r = zpp_rng_make(zpp_test_seed(10 + (uint64_t)micro));
        zpp_bf16 **w = ref_weights(&f);
        float **g = calloc((size_t)m->n_units, sizeof *g);
        for (int u = 0; u < m->n_units; u++) g[u] = calloc(m->unit_numel[u], sizeof **g);
        float loss = 0.0f;
        for (int k = 0; k < micro; k++) {
            int32_t tok[kN], tgt[kN];
            random_batch(&r, tok, tgt);
            EXPECT_OK(f.model->ops->set_batch(f.model, tok, tgt, kB));
            EXPECT_OK(zpp_engine_forward(f.engine, &loss));
            EXPECT_OK(zpp_engine_backward(f.engine, 1.0f));
            ref_micro_batch(&f, w, g, tok, tgt);
        }
        EXPECT_OK(zpp_engine_update_with_stats(f.engine, 1e-3f, loss, NULL));
        const float c = 1.0f - f.eo.beta1;
        size_t bad = 0, total = 0;
        for (int u = 0; u < m->n_units; u++) {
            size_t numel = 0, begin = 0, count = 0;
            EXPECT_OK(zpp_engine_shard_range(f.engine, u, &numel, &begin, &count));
            EXPECT(begin == 0 && count == numel, "unit %d: shard %zu+%zu of %zu at world 1", u,
                   begin, count, numel);
            float *master = calloc(count, 4), *mo = calloc(count, 4), *v = calloc(count, 4);
            EXPECT_OK(zpp_engine_state_get(f.engine, u, master, mo, v));
            for (size_t i = 0; i < count; i++) {
                float want = c * g[u][i];
                if (memcmp(&mo[i], &want, sizeof want) != 0) {
                    if (bad < 3)
                        zpp_test_fail(__FILE__, __LINE__, NULL,
                                      "%d micro-batch(es), unit %d element %zu: AdamW's m %.9g, "
                                      "(1 - b1) x the model's gradient %.9g",
                                      micro, u, i, (double)mo[i], (double)want);
                    bad++;
                }
                total++;
            }
            free(master), free(mo), free(v);
        }
        EXPECT(bad == 0, "%zu of %zu moments differ from the model's gradient", bad, total);
        EXPECT(total > 1000, "only %zu elements compared", total);
        for (int u = 0; u < m->n_units; u++) free(w[u]), free(g[u]);
        free(w), free(g);
        teardown(&f);
    }
}

/* One training step of the fixture's engine on a random batch. */
static float train_step(fixture *f, zpp_rng *r) {
    int32_t tok[kN], tgt[kN];
    random_batch(r, tok, tgt);
    float loss = 0.0f;
    EXPECT_OK(f->model->ops->set_batch(f->model, tok, tgt, kB));
    EXPECT_OK(zpp_engine_forward(f->engine, &loss));
    EXPECT_OK(zpp_engine_backward(f->engine, 1.0f));
    EXPECT_OK(zpp_engine_update_with_stats(f->engine, 1e-3f, loss, NULL));
    return loss;
}

/* The same new masters and moments (m; v zero) for both engines, as a
 * checkpoint hands them. */
static void set_same_masters(fixture *a, fixture *b, zpp_rng *rs) {
    for (int u = 0; u < a->model->n_units; u++) {
        size_t numel = 0, begin = 0, count = 0;
        EXPECT_OK(zpp_engine_shard_range(a->engine, u, &numel, &begin, &count));
        float *w = calloc(count ? count : 1, 3 * sizeof *w);
        for (size_t i = 0; i < 3 * count; i++)
            w[i] = (float)(0.02 * zpp_rng_normal(rs)) * (i < 2 * count ? 1 : 0);
        EXPECT_OK(zpp_engine_state_set(a->engine, u, w, w + count, w + 2 * count));
        EXPECT_OK(zpp_engine_state_set(b->engine, u, w, w + count, w + 2 * count));
        free(w);
    }
}

/* The two engines' masters and moments are the same bits. */
static void expect_same_state(fixture *a, fixture *b, const char *what) {
    for (int u = 0; u < a->model->n_units; u++) {
        size_t numel = 0, begin = 0, count = 0;
        EXPECT_OK(zpp_engine_shard_range(a->engine, u, &numel, &begin, &count));
        float *wa = calloc(count ? count : 1, 3 * sizeof *wa);
        float *wb = calloc(count ? count : 1, 3 * sizeof *wb);
        EXPECT_OK(zpp_engine_state_get(a->engine, u, wa, wa + count, wa + 2 * count));
        EXPECT_OK(zpp_engine_state_get(b->engine, u, wb, wb + count, wb + 2 * count));
        EXPECT(!memcmp(wa, wb, 3 * count * sizeof *wa), "unit %d: masters or moments differ %s",
               u, what);
        free(wa), free(wb);
    }
}

/* Every scratch buffer after whole steps is some unit's bf16 size (padded
 * * 2) without resident weights: the gathered units, and nothing of the
 * gradients'; with them (the default), no unit's at all: the model reads
 * the resident copies. The steps' peak above the shards (and resident
 * copies) is the pool itself, plus the all-reduce's few bytes. */
static void test_step_leases_gathers_only(void) {
    for (int resident = 0; resident < 2; resident++) {
        fixture f;
        setup_with(&f, resident);
        const zpp_model *m = f.model;
        zpp_rng r = zpp_rng_make(zpp_test_seed(20));
        size_t now0 = 0, peak0 = 0, now = 0, peak = 0, nb = 0, bytes = 0;
        zpp_device_mem_stats(f.dev, &now0, &peak0);
        for (int step = 0; step < 2; step++) train_step(&f, &r);
        zpp_device_scratch_stats(f.dev, &nb, &bytes);
        zpp_device_mem_stats(f.dev, &now, &peak);
        EXPECT(nb >= 1, "no scratch after two steps");
        size_t smallest = SIZE_MAX;
        for (int u = 0; u < m->n_units; u++) {
            const size_t b = zpp_partition_make(m->unit_numel[u], f.topo).padded * 2;
            if (b < smallest) smallest = b;
        }
        for (size_t i = 0; i < f.dev->pool_len; i++) {
            size_t cap = f.dev->pool[i].cap;
            int is_unit = 0;
            for (int u = 0; u < m->n_units; u++)
                is_unit |= cap == zpp_partition_make(m->unit_numel[u], f.topo).padded * 2;
            if (resident)
                EXPECT(cap < smallest, "resident weights, yet scratch buffer %zu holds %zu bytes",
                       i, cap);
            else
                EXPECT(is_unit, "scratch buffer %zu holds %zu bytes, no unit's bf16 size", i,
                       cap);
        }
        /* Before the steps the peak may hold the split masters' staging
         * buffer of their initial values (units.c): one unit's fp32 shard
         * at most. The steps stay under it or under the pool. */
        size_t largest = 0;
        for (int u = 0; u < m->n_units; u++) {
            const size_t b = zpp_partition_make(m->unit_numel[u], f.topo).shard_len * 4;
            if (b > largest) largest = b;
        }
        EXPECT(peak0 - now0 <= largest, "create's peak %zu bytes above the shards, more than "
               "a unit's fp32 shard (%zu)", peak0 - now0, largest);
        const size_t step_cap = now0 + bytes + 64 > peak0 ? now0 + bytes + 64 : peak0;
        EXPECT(peak <= step_cap,
               "step peak %zu bytes above the shards, the pool holds %zu (resident %d)",
               peak - now0, bytes, resident);
        teardown(&f);
    }
}

/* Resident weights change no bit: two engines, with and without, trained on
 * the same batches give the same losses and masters, also after both are
 * handed the same new masters (as a checkpoint does), which must make the
 * resident copy stale (state.c) rather than leave the old weights in use. */
static void test_resident_weights_same_bits(void) {
    fixture a, b;
    setup_with(&a, 1);
    setup_with(&b, 0);
    zpp_rng ra = zpp_rng_make(zpp_test_seed(30)), rb = ra;
    zpp_rng rs = zpp_rng_make(zpp_test_seed(31));
    for (int step = 0; step < 5; step++) {
        if (step == 3) set_same_masters(&a, &b, &rs);
        const float la = train_step(&a, &ra), lb = train_step(&b, &rb);
        EXPECT(!memcmp(&la, &lb, sizeof la), "step %d: loss %.9g with resident weights, %.9g "
               "without", step, (double)la, (double)lb);
    }
    expect_same_state(&a, &b, "with resident weights");
    teardown(&a);
    teardown(&b);
}

/* Split masters through their staging buffer (units.c, 16 MiB of fp32 a
 * piece): a unit of more than 2^22 elements (wte, 16400 x 256) is drawn,
 * read and set in two pieces. Its initial masters equal an fp32-master
 * engine's bit for bit; masters set from random bit patterns of every
 * finite kind (subnormals, -0, ties) read back as set, the padding zero. */
static void test_split_masters_in_pieces(void) {
    const zpp_gpt2_config big = {1, 2, 256, 4, 16400, 0, 0, 0};
    fixture f[2];
    for (int k = 0; k < 2; k++) {
        fixture_open(&f[k]);
        EXPECT_OK(zpp_gpt2_create(&big, ZPP_BF16, 1, f[k].dev, &f[k].model));
        EXPECT_OK(zpp_gpt2_create(&big, ZPP_BF16, 1, f[k].dev, &f[k].ref));
        f[k].eo = zpp_engine_opts_default();
        f[k].eo.seed = 77;
        f[k].eo.resident_weights = k == 0; /* split, fp32 masters */
        EXPECT_OK(zpp_engine_create_with_opts(f[k].topo, f[k].model, &f[k].eo, f[k].dev,
                                              &f[k].engine));
    }
    EXPECT(f[0].model->unit_numel[0] > ((size_t)1 << 22), "unit 0 holds %zu elements",
           f[0].model->unit_numel[0]);
    expect_same_state(&f[0], &f[1], "at initialisation");
    zpp_rng r = zpp_rng_make(zpp_test_seed(40));
    for (int u = 0; u < f[0].model->n_units; u++) {
        size_t numel = 0, begin = 0, count = 0;
        EXPECT_OK(zpp_engine_shard_range(f[0].engine, u, &numel, &begin, &count));
        uint32_t *w = calloc(3 * count, sizeof *w), *back = calloc(3 * count, sizeof *back);
        for (size_t i = 0; i < count; i++) {
            uint32_t x = (uint32_t)zpp_rng_u64(&r);
            if (i % 3 == 1) x = (x & 0xffff0000u) | 0x8000u; /* a tie */
            if (i % 7 == 2) x &= 0x807fffffu;                 /* subnormal or -0 */
            if (((x >> 23) & 0xffu) == 0xffu) x &= 0xbfffffffu; /* finite */
            w[i] = x;
        }
        EXPECT_OK(zpp_engine_state_set(f[0].engine, u, (float *)w, (float *)w + count,
                                       (float *)w + 2 * count));
        EXPECT_OK(zpp_engine_state_get(f[0].engine, u, (float *)back, (float *)back + count,
                                       (float *)back + 2 * count));
        size_t i = 0;
        while (i < count && back[i] == w[i]) i++;
        EXPECT(i == count, "unit %d: master %zu set to %08x, read back %08x", u, i,
               i < count ? w[i] : 0u, i < count ? back[i] : 0u);
        free(w), free(back);
    }
    for (int k = 0; k < 2; k++) teardown(&f[k]);
}

/* ---- bf16 gradient accumulators (opts.work_grads) ------------------------
 * The CPU GPT-2 writes fp32 gradients only, so a wrapper gives it
 * set_grad_dtype: its backward runs the real one into zeroed fp32 scratch
 * and adds that into the engine's bf16 accumulator, each element rounded
 * once, as the CUDA models do (cuda_elem.cuh, grad_add). The reference is
 * the same wrapper told to keep fp32 accumulators but round each add to a
 * bf16 value: the same numbers in 4 bytes. Two engines on the same batches
 * must then agree bit for bit, which checks the engine's plumbing of a
 * 2-byte accumulator: its size, AdamW's and the norm's reads, the clearing,
 * and the zeroing when a checkpoint sets the masters. */
typedef struct grad_wrap {
    zpp_model base;         /* first: a zpp_model* is a grad_wrap* */
    zpp_model *real;
    zpp_dtype gd;           /* what set_grad_dtype chose */
    int round_fp32;         /* the reference: fp32 sums of bf16 values */
    float **scratch;        /* a unit's fresh gradient */
    int overwrite;          /* overwrite_grads was called for this pass */
    int *written;           /* per unit: written in this pass */
} grad_wrap;

static zpp_model *real_of(zpp_model *m) { return ((grad_wrap *)m)->real; }
static zpp_status gw_init(zpp_model *m, int u, size_t off, size_t n, float *out, uint64_t seed) {
    return real_of(m)->ops->init_params(real_of(m), u, off, n, out, seed);
}
static zpp_status gw_batch(zpp_model *m, const int32_t *tok, const int32_t *tgt, int B) {
    return real_of(m)->ops->set_batch(real_of(m), tok, tgt, B);
}
static zpp_status gw_forward(zpp_model *m, int s, const void *p) {
    return real_of(m)->ops->forward(real_of(m), s, p);
}
static float gw_loss(zpp_model *m) { return real_of(m)->ops->loss(real_of(m)); }
static zpp_status gw_set_grad_dtype(zpp_model *m, zpp_dtype dt) {
    if (dt != ZPP_FP32 && dt != ZPP_BF16) return ZPP_ERR_UNSUPPORTED;
    ((grad_wrap *)m)->gd = dt;
    return ZPP_OK;
}
/* After overwrite_grads, a unit's first write of the pass ignores what the
 * buffer holds (model.h): the tied embedding's second stage adds. */
static zpp_status gw_overwrite(zpp_model *m) {
    grad_wrap *w = (grad_wrap *)m;
    w->overwrite = 1;
    memset(w->written, 0, (size_t)m->n_units * sizeof *w->written);
    return ZPP_OK;
}
static zpp_status gw_backward(zpp_model *m, int s, const void *p, void *grads, float scale) {
    grad_wrap *w = (grad_wrap *)m;
    const int u = m->stage_unit[s];
    const size_t n = m->unit_numel[u];
    memset(w->scratch[u], 0, n * sizeof(float));
    zpp_status st = w->real->ops->backward(w->real, s, p, w->scratch[u], scale);
    if (st != ZPP_OK) return st;
    const int over = w->overwrite && !w->written[u];
    for (size_t i = 0; i < n; i++) {
        const float sum = (over ? 0.0f : zpp_load_f32(grads, w->gd, i)) + w->scratch[u][i];
        zpp_store_f32(grads, w->gd, i, w->round_fp32 ? zpp_bf16_to_f32(zpp_f32_to_bf16(sum)) : sum);
    }
    w->written[u] = 1;
    if (s == 0) w->overwrite = 0;
    return ZPP_OK;
}
static void gw_destroy(zpp_model *m) {
    grad_wrap *w = (grad_wrap *)m;
    for (int u = 0; u < m->n_units; u++) free(w->scratch[u]);
    free(w->scratch);
    free(w->written);
    w->real->ops->destroy(w->real);
    free(w);
}
static const zpp_model_ops kGradWrapOps = {
    .init_params = gw_init, .set_batch = gw_batch, .forward = gw_forward, .loss = gw_loss,
    .backward = gw_backward, .destroy = gw_destroy, .set_grad_dtype = gw_set_grad_dtype};
/* The same with overwrite_grads: the engine no longer clears. */
static const zpp_model_ops kGradWrapOverwriteOps = {
    .init_params = gw_init, .set_batch = gw_batch, .forward = gw_forward, .loss = gw_loss,
    .backward = gw_backward, .destroy = gw_destroy, .set_grad_dtype = gw_set_grad_dtype,
    .overwrite_grads = gw_overwrite};

/* The fixture with the wrapped model: bf16 accumulators (work_grads), or
 * the fp32 reference that rounds each add; the bf16 one also overwrites
 * its stale gradients instead of having AdamW clear them (overwrite). */
/* The wrapper over a CPU GPT-2 of dtype dt as the fixture's model, with a
 * plain one of its own as the reference. */
static grad_wrap *wrap_model(fixture *f, zpp_dtype dt, const zpp_model_ops *ops) {
    grad_wrap *w = calloc(1, sizeof *w);
    EXPECT_OK(zpp_gpt2_create(&kModel, dt, kB, f->dev, &w->real));
    w->base = *w->real;
    w->base.ops = ops;
    w->gd = ZPP_FP32;
    w->written = calloc((size_t)w->base.n_units, sizeof *w->written);
    w->scratch = calloc((size_t)w->base.n_units, sizeof *w->scratch);
    for (int u = 0; u < w->base.n_units; u++)
        w->scratch[u] = calloc(w->base.unit_numel[u], sizeof(float));
    f->model = &w->base;
    EXPECT_OK(zpp_gpt2_create(&kModel, dt, kB, f->dev, &f->ref));
    return w;
}

static void setup_wrapped(fixture *f, int work_grads, int overwrite) {
    fixture_open(f);
    grad_wrap *w = wrap_model(f, ZPP_BF16, overwrite ? &kGradWrapOverwriteOps : &kGradWrapOps);
    w->round_fp32 = !work_grads;
    f->eo = zpp_engine_opts_default();
    zpp_rng r = zpp_rng_make(zpp_test_seed(40));
    f->eo.seed = zpp_rng_u64(&r);
    f->eo.work_grads = work_grads;
    EXPECT_OK(zpp_engine_create_with_opts(f->topo, f->model, &f->eo, f->dev, &f->engine));
    EXPECT(w->gd == (work_grads ? ZPP_BF16 : ZPP_FP32), "work_grads %d: the engine asked for %s",
           work_grads, zpp_dtype_name(w->gd));
}

/* One step of two micro-batches: the first overwrites (after an update),
 * the second adds. */
static float train_step2(fixture *f, zpp_rng *r) {
    float loss = 0.0f;
    for (int k = 0; k < 2; k++) {
        int32_t tok[kN], tgt[kN];
        random_batch(r, tok, tgt);
        EXPECT_OK(f->model->ops->set_batch(f->model, tok, tgt, kB));
        EXPECT_OK(zpp_engine_forward(f->engine, &loss));
        EXPECT_OK(zpp_engine_backward(f->engine, 1.0f));
    }
    EXPECT_OK(zpp_engine_update_with_stats(f->engine, 1e-3f, loss, NULL));
    return loss;
}

static void check_work_grads(int overwrite) {
    fixture a, b;
    setup_wrapped(&a, 1, overwrite);
    setup_wrapped(&b, 0, 0);
    const zpp_model *m = a.model;
    /* The accumulators alone differ: 2 bytes an element less, each unit's
     * on a 256-byte boundary of the engine's one allocation (units.c). */
    size_t now_a = 0, now_b = 0, peak = 0, saved = 0;
    zpp_device_mem_stats(a.dev, &now_a, &peak);
    zpp_device_mem_stats(b.dev, &now_b, &peak);
    for (int u = 0; u < m->n_units; u++) {
        const size_t n = zpp_partition_make(m->unit_numel[u], a.topo).shard_len;
        saved += (4 * n + 255) / 256 * 256 - (2 * n + 255) / 256 * 256;
    }
    EXPECT(now_b - now_a == saved, "bf16 accumulators save %zu bytes, not %zu (2 a shard "
           "element, each unit's on a 256-byte boundary)", now_b - now_a, saved);
    zpp_rng ra = zpp_rng_make(zpp_test_seed(41)), rb = ra;
    zpp_rng rs = zpp_rng_make(zpp_test_seed(42));
    for (int step = 0; step < 6; step++) {
        if (step == 3) set_same_masters(&a, &b, &rs); /* the accumulators are zeroed */
        /* steps 1 and 4 accumulate two micro-batches */
        const int two = step == 1 || step == 4;
        const float la = two ? train_step2(&a, &ra) : train_step(&a, &ra);
        const float lb = two ? train_step2(&b, &rb) : train_step(&b, &rb);
        EXPECT(!memcmp(&la, &lb, sizeof la), "step %d: loss %.9g with bf16 accumulators "
               "(overwrite %d), %.9g with fp32 ones holding the same values", step, (double)la,
               overwrite, (double)lb);
    }
    expect_same_state(&a, &b, overwrite ? "with bf16 accumulators written over"
                                        : "with bf16 accumulators");
    teardown(&a);
    teardown(&b);
}

static void test_work_grads_bf16_accumulators(void) { check_work_grads(0); }

/* With overwrite_grads the accumulators are never cleared: the pass after
 * an update must overwrite them, and only that pass (the second
 * micro-batch of a step adds). */
static void test_work_grads_overwrite(void) { check_work_grads(1); }

/* work_grads applies only where it is no coarser than a wire: bf16 at
 * world 1. An fp32 engine keeps fp32 accumulators (and never asks the
 * model for another dtype). */
static void test_work_grads_only_bf16(void) {
    fixture f;
    fixture_open(&f);
    grad_wrap *w = wrap_model(&f, ZPP_FP32, &kGradWrapOps);
    w->gd = ZPP_BF16; /* must be set back to fp32 */
    f.eo = zpp_engine_opts_default();
    f.eo.work_dtype = ZPP_FP32;
    EXPECT_OK(zpp_engine_create_with_opts(f.topo, f.model, &f.eo, f.dev, &f.engine));
    EXPECT(w->gd == ZPP_FP32, "an fp32 engine left the model writing %s gradients",
           zpp_dtype_name(w->gd));
    zpp_rng r = zpp_rng_make(zpp_test_seed(43));
    const float loss = train_step(&f, &r);
    EXPECT(isfinite(loss), "loss %g", (double)loss);
    teardown(&f);
}

/* A model whose state cannot be allocated: one unit of the small GPT-2
 * claims 2^44 parameters, at least 14 bytes each on the rank (master,
 * moments, a bf16 gradient) = 224 TiB, more than x86-64's 128 TiB of address
 * space, so the engine's one allocation fails whatever the machine's
 * overcommit policy (ASan returns NULL too: allocator_may_return_null in
 * tests/CMakeLists.txt); it fails before any unit is initialised, so the
 * model never sees the claim. Creation fails with ZPP_ERR_NOMEM, hands
 * back no engine, and the message says what to do: more ranks, and at
 * world 1 without the resident copy where dropping it saves memory (in
 * fp32; in bf16 it is the split master's high half, units.c). */
static void test_too_large_says_what_to_do(void) {
    for (int c = 0; c < 3; c++) {
        const int resident = c > 0, hint = c == 2;
        const zpp_dtype dt = c == 2 ? ZPP_FP32 : ZPP_BF16;
        fixture f;
        fixture_open(&f);
        EXPECT_OK(zpp_gpt2_create(&kModel, dt, kB, f.dev, &f.model));
        const size_t *own = f.model->unit_numel;
        size_t *claim = malloc((size_t)f.model->n_units * sizeof *claim);
        EXPECT(claim != NULL, "out of host memory");
        memcpy(claim, own, (size_t)f.model->n_units * sizeof *claim);
        claim[1] = (size_t)1 << 44;
        f.model->unit_numel = claim;
        f.eo = zpp_engine_opts_default();
        f.eo.resident_weights = resident;
        f.eo.work_dtype = dt;
        zpp_engine *e = NULL;
        const zpp_status st = zpp_engine_create_with_opts(f.topo, f.model, &f.eo, f.dev, &e);
        const char *msg = zpp_last_error();
        EXPECT(st == ZPP_ERR_NOMEM && e == NULL, "status %d, engine %p: %s", (int)st, (void *)e,
               msg);
        EXPECT(strstr(msg, "more ranks") && strstr(msg, "zeropp plan --pick"),
               "the message does not say what to do: %s", msg);
        EXPECT(!strstr(msg, "zeropp_resident_weights") == !hint,
               "resident weights %s in %s, yet the message %s them: %s", resident ? "on" : "off",
               zpp_dtype_name(dt), hint ? "does not name" : "names", msg);
        f.model->unit_numel = own;
        free(claim);
        f.model->ops->destroy(f.model);
        zpp_topo_destroy(f.topo);
        zpp_device_destroy(f.dev);
    }
}

ZPP_TESTS(ZPP_TEST(test_gradient_is_the_models), ZPP_TEST(test_step_leases_gathers_only),
          ZPP_TEST(test_resident_weights_same_bits), ZPP_TEST(test_split_masters_in_pieces),
          ZPP_TEST(test_work_grads_bf16_accumulators),
          ZPP_TEST(test_work_grads_overwrite), ZPP_TEST(test_work_grads_only_bf16),
          ZPP_TEST(test_too_large_says_what_to_do))

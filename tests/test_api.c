/* test_api.c — the public training API (include/zeropp.h), used as a user
 * would: this file includes no private header.
 *
 * A least-squares linear model  pred_b = w . x_b,  loss = mean_b (pred_b -
 * t_b)^2 / 2  drives the engine. Its weights are cut into two units (stage 0
 * takes the dot product with the first, stage 1 adds the second and the
 * loss), and stage 0's backward reads no parameters, so both the gather
 * path and the "no parameters" path of the model interface run. Each rank
 * can regenerate every rank's batch from the agreed seed, so the test
 * computes the world's gradient itself, in double.
 *
 * Launched on 4 ranks, all on this host. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "zeropp.h"

enum { BATCH = 8 };

typedef struct linear {
    int n, n0;          /* weights, of which unit 0 holds the first n0 */
    int world, rank;
    uint64_t data_seed;
    int step;           /* the batch: (step, rank) */
    double *x, *t;      /* BATCH x n inputs, BATCH targets of the current batch */
    float *w;           /* fp32 copy of a gathered unit */
    double *partial;    /* per sample: the dot product so far */
    double *resid;      /* per sample: pred - t */
    float loss;
    zpp_dtype dtype;
    int forwards, backwards_stage0_with_params;
} linear;

/* Sample b of rank r's batch at `step`: x ~ N(0,1)^n, t = x . w* + noise
 * with w*_i = sin(i). */
static void make_batch(const linear *L, int step, int r, double *x, double *t) {
    zpp_rng g = zpp_rng_make(L->data_seed ^ ((uint64_t)step * 1000003u + (uint64_t)r * 7919u));
    for (int b = 0; b < BATCH; b++) {
        double s = 0.0;
        for (int i = 0; i < L->n; i++) {
            x[b * L->n + i] = zpp_rng_normal(&g);
            s += x[b * L->n + i] * sin((double)i);
        }
        t[b] = s + 0.01 * zpp_rng_normal(&g);
    }
}

static void set_step(linear *L, int step) {
    L->step = step;
    make_batch(L, step, L->rank, L->x, L->t);
}

/* Initial weights: a pure function of (seed, unit, index). */
static double init_value(uint64_t seed, int unit, size_t i) {
    zpp_rng g = zpp_rng_make(seed * 31u + (uint64_t)unit * 1000u + i);
    return 0.5 * (2.0 * zpp_rng_uniform(&g) - 1.0);
}

static zpp_status lin_init(void *user, int unit, size_t offset, size_t count, float *out,
                           uint64_t seed) {
    for (size_t i = 0; i < count; i++) out[i] = (float)init_value(seed, unit, offset + i);
    return ZPP_OK;
}

static const float *as_f32(linear *L, const void *p, int n) {
    if (L->dtype == ZPP_FP32) return p;
    const uint16_t *h = p;
    for (int i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        memcpy(&L->w[i], &bits, sizeof bits);
    }
    return L->w;
}

static zpp_status lin_forward(void *user, int stage, const void *params) {
    linear *L = user;
    int first = stage == 0 ? 0 : L->n0, len = stage == 0 ? L->n0 : L->n - L->n0;
    const float *w = as_f32(L, params, len);
    for (int b = 0; b < BATCH; b++) {
        double s = stage == 0 ? 0.0 : L->partial[b];
        for (int i = 0; i < len; i++) s += (double)w[i] * L->x[b * L->n + first + i];
        L->partial[b] = s;
    }
    if (stage == 1) {
        double loss = 0.0;
        for (int b = 0; b < BATCH; b++) {
            L->resid[b] = L->partial[b] - L->t[b];
            loss += 0.5 * L->resid[b] * L->resid[b];
        }
        L->loss = (float)(loss / BATCH);
        L->forwards++;
    }
    return ZPP_OK;
}

static float lin_loss(void *user) { return ((linear *)user)->loss; }

/* d loss / d w_i = mean_b resid_b x_bi. */
static zpp_status lin_backward(void *user, int stage, const void *params, float *grads,
                               float scale) {
    linear *L = user;
    if (stage == 0 && params) L->backwards_stage0_with_params++; /* d/dw needs resid, x */
    int first = stage == 0 ? 0 : L->n0, len = stage == 0 ? L->n0 : L->n - L->n0;
    for (int i = 0; i < len; i++) {
        double g = 0.0;
        for (int b = 0; b < BATCH; b++) g += L->resid[b] * L->x[b * L->n + first + i];
        grads[i] += (float)(scale * g / BATCH);
    }
    return ZPP_OK;
}

static int g_destroyed;
static void lin_destroy(void *user) { g_destroyed++; }

typedef struct fixture {
    linear L;
    size_t unit_numel[2];
    int stage_unit[2];
    unsigned char bwd_reads[2];
    zpp_model_desc desc;
    zpp_device *dev;
    zpp_topo *topo;
    zpp_model *model;
} fixture;

/* stage0_reads: whether stage 0's backward asks for its parameters (the
 * linear model's never needs them; asking makes the backward gather). */
static void fixture_open(fixture *f, int n, zpp_dtype dtype, int node_size, int stage0_reads) {
    memset(f, 0, sizeof *f);
    linear *L = &f->L;
    L->n = n;
    L->n0 = n / 3 + 1;
    L->dtype = dtype;
    MPI_Comm_size(MPI_COMM_WORLD, &L->world);
    MPI_Comm_rank(MPI_COMM_WORLD, &L->rank);
    L->data_seed = zpp_test_seed(1);
    L->x = zpp_test_malloc((size_t)BATCH * (size_t)n * sizeof *L->x);
    L->t = zpp_test_malloc(BATCH * sizeof *L->t);
    L->w = zpp_test_malloc((size_t)n * sizeof *L->w);
    L->partial = zpp_test_malloc(BATCH * sizeof *L->partial);
    L->resid = zpp_test_malloc(BATCH * sizeof *L->resid);
    f->unit_numel[0] = (size_t)L->n0;
    f->unit_numel[1] = (size_t)(n - L->n0);
    f->stage_unit[0] = 0;
    f->stage_unit[1] = 1;
    f->bwd_reads[0] = (unsigned char)stage0_reads;
    f->bwd_reads[1] = 1;
    zpp_model_desc d = {.n_units = 2, .unit_numel = f->unit_numel, .n_stages = 2,
                        .stage_unit = f->stage_unit, .bwd_reads_params = f->bwd_reads,
                        .param_dtype = dtype, .user = L, .init_params = lin_init,
                        .forward = lin_forward, .loss = lin_loss, .backward = lin_backward,
                        .destroy = lin_destroy};
    f->desc = d;
    EXPECT_OK(zpp_device_create_host(&f->dev));
    EXPECT_OK(zpp_topo_create(f->dev, node_size, 60.0, &f->topo));
    EXPECT_OK(zpp_model_create(&f->desc, f->dev, &f->model));
}

static void fixture_close(fixture *f) {
    int before = g_destroyed;
    zpp_model_destroy(f->model);
    EXPECT(g_destroyed == before + 1, "zpp_model_destroy did not call desc.destroy once");
    zpp_topo_destroy(f->topo);
    zpp_device_destroy(f->dev);
    free(f->L.x);
    free(f->L.t);
    free(f->L.w);
    free(f->L.partial);
    free(f->L.resid);
}

/* The world's gradient at weights w (double): the mean over ranks of each
 * rank's mean_b resid_b x_b. */
static void world_gradient(const linear *L, int step, const double *w, double *g) {
    double *x = zpp_test_malloc((size_t)BATCH * (size_t)L->n * sizeof *x), t[BATCH];
    memset(g, 0, (size_t)L->n * sizeof *g);
    for (int r = 0; r < L->world; r++) {
        make_batch(L, step, r, x, t);
        for (int b = 0; b < BATCH; b++) {
            double p = 0.0;
            for (int i = 0; i < L->n; i++) p += w[i] * x[b * L->n + i];
            for (int i = 0; i < L->n; i++)
                g[i] += (p - t[b]) * x[b * L->n + i] / (BATCH * (double)L->world);
        }
    }
    free(x);
}

/* This rank's shard of unit u against want[] (the unit's full values). */
static void expect_shard(zpp_engine *e, int u, const double *want, double tol, const char *what) {
    size_t numel = 0, begin = 0, count = 0;
    EXPECT_OK(zpp_engine_shard_range(e, u, &numel, &begin, &count));
    float *master = zpp_test_malloc(count * sizeof *master + 1);
    float *m = zpp_test_malloc(count * sizeof *m + 1), *v = zpp_test_malloc(count * sizeof *v + 1);
    EXPECT_OK(zpp_engine_state_get(e, u, master, m, v));
    for (size_t i = 0; i < count; i++)
        EXPECT(fabs(master[i] - want[begin + i]) <= tol, "%s: unit %d element %zu: %.9g, want %.9g",
               what, u, begin + i, (double)master[i], want[begin + i]);
    free(master);
    free(m);
    free(v);
}

/* ---- Cases ------------------------------------------------------------------ */

/* One ZeRO-3 step in fp32 against AdamW's first step in closed form: with
 * bias correction m_hat = g and v_hat = g^2, so
 *     w1 = w0 - lr (g / (|g| + eps) + wd w0),
 * g the world's mean gradient computed here in double from every rank's
 * batch. The forward's loss, averaged over the world, is checked too. */
static void test_first_step_closed_form(void) {
    fixture f;
    fixture_open(&f, 37, ZPP_FP32, 0, 0);
    linear *L = &f.L;
    zpp_engine_config cfg = zpp_engine_config_default();
    cfg.work_dtype = ZPP_FP32;
    cfg.grad_clip = 0.0f;
    cfg.weight_decay = 0.1f;
    cfg.seed = zpp_test_seed(2);
    zpp_engine *e = NULL;
    EXPECT_OK(zpp_engine_create(f.topo, f.model, f.dev, &cfg, &e));

    double *w0 = zpp_test_malloc((size_t)L->n * sizeof *w0);
    double *g = zpp_test_malloc((size_t)L->n * sizeof *g);
    double *w1 = zpp_test_malloc((size_t)L->n * sizeof *w1);
    for (int i = 0; i < L->n; i++)
        w0[i] = (float)init_value(cfg.seed, i < L->n0 ? 0 : 1, (size_t)(i < L->n0 ? i : i - L->n0));
    expect_shard(e, 0, w0, 0.0, "initial");
    expect_shard(e, 1, w0 + L->n0, 0.0, "initial");

    set_step(L, 0);
    float loss = 0.0f;
    EXPECT_OK(zpp_engine_forward(e, &loss));
    EXPECT_OK(zpp_engine_backward(e, zpp_engine_loss_scale(e)));
    EXPECT(L->backwards_stage0_with_params == 0, "stage 0's backward got parameters");
    float world_loss = 0.0f;
    MPI_Allreduce(&loss, &world_loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    world_loss /= (float)L->world;
    const float lr = 0.01f;
    zpp_update_stats st;
    EXPECT_OK(zpp_engine_update(e, lr, loss, &st));
    EXPECT(fabsf(st.loss - world_loss) <= 1e-6f * fabsf(world_loss), "loss %g, world mean %g",
           (double)st.loss, (double)world_loss);
    EXPECT(!st.skipped && zpp_engine_steps_taken(e) == 1, "step not taken");

    world_gradient(L, 0, w0, g);
    double norm = 0.0;
    for (int i = 0; i < L->n; i++) {
        norm += g[i] * g[i];
        w1[i] = w0[i] - lr * (g[i] / (fabs(g[i]) + cfg.eps) + cfg.weight_decay * w0[i]);
    }
    EXPECT(fabs(st.grad_norm - sqrt(norm)) <= 1e-4 * sqrt(norm), "grad norm %g, want %g",
           (double)st.grad_norm, sqrt(norm));
    /* g / |g| is 1 to within fp32 sums unless |g| nears eps: the update is
     * lr to ~1e-6 relative; the master itself rounds to fp32. */
    expect_shard(e, 0, w1, 2e-6, "after one step");
    expect_shard(e, 1, w1 + L->n0, 2e-6, "after one step");
    zpp_engine_destroy(e);
    free(w0);
    free(g);
    free(w1);
    fixture_close(&f);
}

/* Every mode, bf16, 2 nodes of 2: training drives the loss down tenfold, and
 * each ZeRO++ option moves fewer cross-node bytes than ZeRO-3 (stage 0's
 * backward asks for its weights here, and the reuse distance is 0 so that
 * the backward gathers them again: hpZ then has a gather to keep inside
 * the node). */
static void test_every_mode_trains(void) {
    double zero3_bytes = 0.0;
    for (int mode = 0; mode <= ZPP_MODE_ZEROPP; mode++) {
        fixture f;
        fixture_open(&f, 300, ZPP_BF16, 2, 1);
        zpp_engine_config cfg = zpp_engine_config_default();
        cfg.mode = mode;
        cfg.seed = 7;
        cfg.max_reuse_distance = 0;
        zpp_engine *e = NULL;
        EXPECT_OK(zpp_engine_create(f.topo, f.model, f.dev, &cfg, &e));
        double first = 0.0, last = 0.0, bytes = 0.0;
        const int steps = 60;
        for (int s = 0; s < steps; s++) {
            set_step(&f.L, s);
            float loss = 0.0f;
            zpp_update_stats st;
            EXPECT_OK(zpp_engine_forward(e, &loss));
            EXPECT_OK(zpp_engine_backward(e, zpp_engine_loss_scale(e)));
            EXPECT_OK(zpp_engine_update(e, 0.05f, loss, &st));
            if (s < 5) first += st.loss / 5;
            if (s >= steps - 5) last += st.loss / 5;
            bytes = st.cross_node_bytes;
        }
        set_step(&f.L, 10000);
        float eval = 0.0f;
        EXPECT_OK(zpp_engine_evaluate(e, &eval));
        EXPECT(last < 0.1 * first && eval < 0.1 * first,
               "%s: loss %g -> %g (held out %g), not tenfold lower", zpp_mode_name(mode), first,
               last, (double)eval);
        if (f.L.rank == 0)
            printf("%-8s loss %.4g -> %.4g, held out %.4g, %.0f cross-node bytes a step\n",
                   zpp_mode_name(mode), first, last, (double)eval, bytes);
        if (mode == 0) zero3_bytes = bytes;
        else
            EXPECT(bytes < zero3_bytes, "%s: %g cross-node bytes, zero3 %g", zpp_mode_name(mode),
                   bytes, zero3_bytes);
        zpp_engine_destroy(e);
        fixture_close(&f);
    }
}

static void test_mode_names(void) {
    for (int mode = 0; mode <= ZPP_MODE_ZEROPP; mode++) {
        int back = -1;
        EXPECT_OK(zpp_mode_parse(zpp_mode_name(mode), &back));
        EXPECT(back == mode, "%s parsed as %d, not %d", zpp_mode_name(mode), back, mode);
    }
    int m = -1;
    EXPECT_OK(zpp_mode_parse("qgz+qwz", &m));
    EXPECT(m == (ZPP_MODE_QWZ | ZPP_MODE_QGZ), "qgz+qwz is %d", m);
    EXPECT_OK(zpp_mode_parse("qwz+hpz+qgz", &m));
    EXPECT(m == ZPP_MODE_ZEROPP, "qwz+hpz+qgz is %d", m);
    const char *bad[] = {"", "zero", "qwz+", "+qwz", "qwz+qwz", "QWZ", "qwz hpz", "zero3+qwz"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        m = 99;
        EXPECT_STATUS(zpp_mode_parse(bad[i], &m), ZPP_ERR_INVALID);
        EXPECT(m == 99 && strstr(zpp_last_error(), "is not a mode"), "'%s': %d, '%s'", bad[i], m,
               zpp_last_error());
    }
    EXPECT(!strcmp(zpp_mode_name(8), "?") && !strcmp(zpp_mode_name(-1), "?"), "bad mode names");
}

/* Each mistake in a model description is refused, naming it. */
static void test_model_desc_refused(void) {
    fixture f;
    fixture_open(&f, 20, ZPP_FP32, 0, 0);
    zpp_model *m = NULL;
    zpp_model_desc d;
    size_t numel[2];
    int stages[2];
#define REFUSED(edit, want)                                                              \
    do {                                                                                 \
        d = f.desc;                                                                      \
        memcpy(numel, f.unit_numel, sizeof numel);                                       \
        memcpy(stages, f.stage_unit, sizeof stages);                                     \
        d.unit_numel = numel;                                                            \
        d.stage_unit = stages;                                                           \
        edit;                                                                            \
        m = NULL;                                                                        \
        EXPECT_STATUS(zpp_model_create(&d, f.dev, &m), ZPP_ERR_INVALID);                 \
        EXPECT(m == NULL && strstr(zpp_last_error(), want), "%s: '%s' lacks '%s'", #edit, \
               zpp_last_error(), want);                                                  \
    } while (0)
    REFUSED(d.forward = NULL, "forward is NULL");
    REFUSED(d.backward = NULL, "backward is NULL");
    REFUSED(d.n_units = 0, "n_units is 0");
    REFUSED(d.n_stages = 0, "n_stages is 0");
    REFUSED(numel[1] = 0, "unit 1 has no elements");
    REFUSED(stages[1] = 2, "stage_unit[1] is 2");
    REFUSED(stages[1] = -1, "stage_unit[1] is -1");
    REFUSED(stages[1] = 0, "no stage uses unit 1");
    REFUSED(d.param_dtype = (zpp_dtype)7, "param_dtype 7");
#undef REFUSED
    EXPECT_STATUS(zpp_model_create(NULL, f.dev, &m), ZPP_ERR_INVALID);
    fixture_close(&f);
}

/* A mistake on one rank fails every rank, with that rank's message, rather
 * than leaving the others in a collective. */
static void test_fail_together(void) {
    fixture f;
    fixture_open(&f, 20, ZPP_FP32, 0, 0);
    int rank = f.L.rank;
    zpp_engine_config cfg = zpp_engine_config_default();
    cfg.work_dtype = ZPP_FP32;
    if (rank == 2) cfg.beta1 = 1.5f;
    zpp_engine *e = NULL;
    EXPECT_STATUS(zpp_engine_create(f.topo, f.model, f.dev, &cfg, &e), ZPP_ERR_INVALID);
    EXPECT(e == NULL && strstr(zpp_last_error(), "beta1 1.5"), "'%s'", zpp_last_error());
    cfg.beta1 = 0.9f;
    if (rank == 1) cfg.mode = 8;
    EXPECT_STATUS(zpp_engine_create(f.topo, f.model, f.dev, &cfg, &e), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "mode 8"), "'%s'", zpp_last_error());
    cfg.mode = ZPP_MODE_ZERO3;
    cfg.work_dtype = ZPP_BF16; /* the model takes fp32 */
    EXPECT_STATUS(zpp_engine_create(f.topo, f.model, f.dev, &cfg, &e), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "fp32") && strstr(zpp_last_error(), "bf16"), "'%s'",
           zpp_last_error());
    cfg.work_dtype = ZPP_FP32;
    EXPECT_OK(zpp_engine_create(f.topo, f.model, f.dev, &cfg, &e));
    set_step(&f.L, 0);
    float loss = 0.0f;
    EXPECT_STATUS(zpp_engine_backward(e, 1.0f), ZPP_ERR_STATE); /* no forward yet */
    EXPECT_OK(zpp_engine_forward(e, &loss));
    EXPECT_OK(zpp_engine_backward(e, 1.0f));
    EXPECT_STATUS(zpp_engine_update(e, rank == 3 ? NAN : 0.01f, loss, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "learning rate nan"), "'%s'", zpp_last_error());
    EXPECT(zpp_engine_steps_taken(e) == 0, "a refused update counted");
    EXPECT_OK(zpp_engine_update(e, 0.01f, loss, NULL));
    zpp_engine_destroy(e);
    /* a bad deadline */
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create(f.dev, 0, rank == 0 ? -1.0 : 1.0, &t), ZPP_ERR_INVALID);
    EXPECT(t == NULL && strstr(zpp_last_error(), "timeout_s -1"), "'%s'", zpp_last_error());
    fixture_close(&f);
}

/* Every engine option is reachable from the public config, with the
 * defaults and ranges of the engine's one table: each refusal names the
 * field; the scaler's ranges apply only to the dynamic scaler; LoCo's
 * buffers and the counters come back through the public calls. */
static void test_every_option_reachable(void) {
    fixture f;
    fixture_open(&f, 20, ZPP_FP32, 0, 0);
    zpp_engine_config cfg = zpp_engine_config_default();
    EXPECT(cfg.prefetch_depth == 2 && cfg.reduce_depth == 2 && cfg.loco == 0 &&
               cfg.loco_err_beta == 0.8f && cfg.loco_reset_T == 1024 &&
               cfg.initial_scale_power == 16 && cfg.loss_scale_window == 1000 &&
               cfg.hysteresis == 2 && cfg.min_loss_scale == 1.0f && cfg.decay_all == 0 &&
               cfg.quantize_vectors == 0 && cfg.profile == 0,
           "defaults: depths %d/%d, err_beta %g, reset_T %d", cfg.prefetch_depth,
           cfg.reduce_depth, (double)cfg.loco_err_beta, cfg.loco_reset_T);
    cfg.work_dtype = ZPP_FP32;
    zpp_engine *e = NULL;
#define REFUSED(edit, want)                                                                \
    do {                                                                                   \
        zpp_engine_config c = cfg;                                                         \
        edit;                                                                              \
        EXPECT_STATUS(zpp_engine_create(f.topo, f.model, f.dev, &c, &e), ZPP_ERR_INVALID); \
        EXPECT(e == NULL && strstr(zpp_last_error(), want), "%s: '%s' lacks '%s'", #edit,  \
               zpp_last_error(), want);                                                    \
    } while (0)
    REFUSED(c.prefetch_depth = 0, "prefetch_depth 0");
    REFUSED(c.reduce_depth = ZPP_ENGINE_MAX_DEPTH + 1, "reduce_depth 9");
    REFUSED(c.loco = 1, "error feedback");
    REFUSED((c.mode = ZPP_MODE_QGZ, c.loco = 1, c.loco_err_beta = 1.5f), "loco_err_beta 1.5");
    REFUSED((c.mode = ZPP_MODE_QGZ, c.loco = 1, c.loco_reset_T = 0), "loco_reset_T 0");
    REFUSED((c.loss_scale = 0.0f, c.hysteresis = 0), "hysteresis 0");
    REFUSED(c.max_consecutive_skips = 0, "max_consecutive_skips 0");
    REFUSED(c.eps = 0.0f, "eps 0");
#undef REFUSED
    /* a static scale leaves the dynamic scaler's fields alone */
    zpp_engine_config c = cfg;
    c.hysteresis = 0;
    EXPECT_OK(zpp_engine_create(f.topo, f.model, f.dev, &c, &e));
    zpp_engine_destroy(e);
    /* LoCo on, one step: its buffers and the counters, through zeropp.h */
    c = cfg;
    c.mode = ZPP_MODE_QGZ;
    c.loco = 1;
    c.prefetch_depth = 1;
    c.reduce_depth = 3;
    EXPECT_OK(zpp_engine_create(f.topo, f.model, f.dev, &c, &e));
    size_t intra = 0, inter = 0;
    EXPECT_OK(zpp_engine_loco_lens(e, 0, &intra, &inter));
    EXPECT(intra > 0 && zpp_engine_unit_count(e) >= 1, "loco buffers of %zu", intra);
    set_step(&f.L, 0);
    float loss = 0.0f;
    EXPECT_OK(zpp_engine_forward(e, &loss));
    EXPECT_OK(zpp_engine_backward(e, zpp_engine_loss_scale(e)));
    EXPECT_OK(zpp_engine_update(e, 0.01f, loss, NULL));
    zpp_engine_counters ctr = zpp_engine_counters_get(e);
    EXPECT(ctr.step == 1 && ctr.updates == 1 && ctr.skipped_total == 0, "counters %d/%d/%d",
           ctr.step, ctr.updates, ctr.skipped_total);
    zpp_engine_destroy(e);
    fixture_close(&f);
}

/* Where a rank is comes from MPI's shared-memory split of the world, not
 * from a launcher's environment, so srun places ranks as mpirun does. Here
 * every rank runs on this host: the launcher's variables are faked with
 * wrong values (Slurm's, and Open MPI's own), and the placement still
 * follows the split. */
static void test_placement_from_mpi(void) {
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm shm;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm);
    int shm_rank = 0, shm_size = 0;
    MPI_Comm_rank(shm, &shm_rank);
    MPI_Comm_size(shm, &shm_size);
    MPI_Comm_free(&shm);
    /* the fakes, each replacing (and later restoring) what is there */
    const char *names[5] = {"SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
    char fake[5][16], *saved[5];
    snprintf(fake[0], sizeof fake[0], "%d", (rank + 1) % world);
    snprintf(fake[1], sizeof fake[1], "%d", rank);
    snprintf(fake[2], sizeof fake[2], "1");
    snprintf(fake[3], sizeof fake[3], "%d", (rank + 1) % world);
    snprintf(fake[4], sizeof fake[4], "1");
    for (int i = 0; i < 5; i++) {
        const char *old = getenv(names[i]);
        saved[i] = old ? strdup(old) : NULL;
        setenv(names[i], fake[i], 1);
    }

    int local = -1, local_size = -1;
    EXPECT_OK(zpp_comm_launch_local(&local, &local_size));
    EXPECT(local == shm_rank && local_size == shm_size, "launch local %d of %d, split %d of %d",
           local, local_size, shm_rank, shm_size);
    zpp_device *dev = NULL;
    EXPECT_OK(zpp_device_create_host(&dev));
    EXPECT(zpp_device_ordinal(dev) == -1 && zpp_device_stream(dev) == NULL, "host device");
    zpp_topo *t = NULL;
    EXPECT_OK(zpp_topo_create(dev, 0, 60.0, &t));
    zpp_topo_info ti = zpp_topo_info_get(t);
    EXPECT(ti.world_size == world && ti.world_rank == rank && ti.node_size == shm_size &&
               ti.nodes == world / shm_size && ti.local_rank == shm_rank &&
               ti.node == rank / shm_size,
           "as launched: world %d rank %d, nodes %d of %d, node %d local %d", ti.world_size,
           ti.world_rank, ti.nodes, ti.node_size, ti.node, ti.local_rank);
    zpp_topo_destroy(t);
    EXPECT_OK(zpp_topo_create(dev, 2, 60.0, &t));
    ti = zpp_topo_info_get(t);
    EXPECT(ti.node_size == 2 && ti.nodes == world / 2 && ti.node == rank / 2 &&
               ti.local_rank == rank % 2,
           "node size 2: nodes %d of %d, node %d local %d", ti.nodes, ti.node_size, ti.node,
           ti.local_rank);
    zpp_topo_destroy(t);
    /* a rank's GPU: none in a build without CUDA (or on a host without one) */
    if (zpp_device_gpu_count() == 0) {
        zpp_device *gpu = NULL;
        EXPECT_STATUS(zpp_device_create_for_rank(1, &gpu), ZPP_ERR_CUDA);
        EXPECT(gpu == NULL && strstr(zpp_last_error(), "no GPU"), "'%s'", zpp_last_error());
    }
    zpp_device *host = NULL;
    EXPECT_OK(zpp_device_create_for_rank(0, &host));
    EXPECT(zpp_device_ordinal(host) == -1, "gpu 0 is the host");
    zpp_device_destroy(host);
    zpp_device_destroy(dev);
    for (int i = 0; i < 5; i++) {
        if (saved[i]) setenv(names[i], saved[i], 1);
        else unsetenv(names[i]);
        free(saved[i]);
    }
}

/* ---- A built-in decoder picked by config -----------------------------------
 * zpp_model_create_decoder with a random Llama's "model" section (grouped-
 * query heads, its own MLP width, tied or untied head, q/k/v biases or not)
 * and with a GPT-2's: the engine's units are the family's, element for
 * element, as the Hugging Face tensors (Llama) and GPT-2's formula count
 * them here; the first loss on random tokens is ln V within the spread the
 * initialisation allows (every logit is h . w with h of RMS 1 after the
 * final norm and w ~ N(0, 0.02^2): logits of standard deviation s = 0.02
 * sqrt(C), so the loss is ln V + s^2 / 2 less the mean target logit, whose
 * deviation is s / sqrt(tokens); 6 of those); ZeRO++ on 2 nodes of 2 trains
 * it (a fixed batch, memorised: the loss halves), every rank agreeing; and
 * bad configs are refused naming the key. */
#define DEC_T 16
#define DEC_B 2

/* Sum of the units' sizes the engine holds, and their count. */
static double engine_params(zpp_engine *e, int *units_p) {
    double total = 0;
    *units_p = zpp_engine_unit_count(e);
    for (int u = 0; u < *units_p; u++) {
        size_t numel = 0, begin = 0, count = 0;
        EXPECT_OK(zpp_engine_shard_range(e, u, &numel, &begin, &count));
        total += (double)numel;
    }
    return total;
}

static void decoder_trains(const char *json, double want_params, int L, int C, int V) {
    zpp_device *dev = NULL;
    zpp_topo *topo = NULL;
    zpp_model *model = NULL;
    zpp_engine *e = NULL;
    EXPECT_OK(zpp_device_create_host(&dev));
    EXPECT_OK(zpp_topo_create(dev, 2, 0.0, &topo));
    EXPECT_OK(zpp_model_create_decoder(json, ZPP_FP32, DEC_B, dev, &model));
    zpp_engine_config cfg = zpp_engine_config_default();
    cfg.mode = ZPP_MODE_ZEROPP;
    cfg.work_dtype = ZPP_FP32;
    cfg.seed = zpp_test_seed(41);
    EXPECT_OK(zpp_engine_create(topo, model, dev, &cfg, &e));
    int units = 0;
    const double P = engine_params(e, &units);
    EXPECT(P == want_params && units == L + 1, "%s: %.0f parameters in %d units, want %.0f in %d",
           json, P, units, want_params, L + 1);
    /* one batch, the same on every rank: the engine's mean is each rank's */
    int32_t tok[DEC_B * DEC_T], tgt[DEC_B * DEC_T];
    zpp_rng g = zpp_rng_make(zpp_test_seed(42));
    for (int i = 0; i < DEC_B * DEC_T; i++) {
        tok[i] = (int32_t)(zpp_rng_u64(&g) % (uint64_t)V);
        tgt[i] = (int32_t)(zpp_rng_u64(&g) % (uint64_t)V);
    }
    float first = 0, loss = 0;
    for (int step = 0; step < 40; step++) {
        EXPECT_OK(zpp_model_set_batch(model, tok, tgt, DEC_B));
        EXPECT_OK(zpp_engine_forward(e, &loss));
        float lo = loss, hi = loss;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        EXPECT(lo == hi, "step %d: the ranks' losses %g and %g differ on one batch", step,
               (double)lo, (double)hi);
        if (step == 0) first = loss;
        EXPECT_OK(zpp_engine_backward(e, zpp_engine_loss_scale(e)));
        zpp_update_stats st;
        EXPECT_OK(zpp_engine_update(e, 1e-2f, loss, &st));
    }
    const double s = 0.02 * sqrt((double)C);
    const double bound = s * s / 2 + 6 * s / sqrt((double)(DEC_B * DEC_T)) + 1e-4;
    EXPECT(fabs(first - log((double)V)) <= bound, "%s: first loss %g, ln V %g (bound %g)", json,
           (double)first, log((double)V), bound);
    EXPECT(loss < 0.5f * first, "%s: 40 steps on one batch: loss %g from %g", json,
           (double)loss, (double)first);
    zpp_engine_destroy(e);
    zpp_model_destroy(model);
    zpp_topo_destroy(topo);
    zpp_device_destroy(dev);
}

static void expect_decoder_refused(const char *json, const char *needle) {
    zpp_device *dev = NULL;
    zpp_model *model = NULL;
    EXPECT_OK(zpp_device_create_host(&dev));
    zpp_status st = zpp_model_create_decoder(json, ZPP_FP32, 1, dev, &model);
    EXPECT(st == ZPP_ERR_CONFIG && model == NULL && strstr(zpp_last_error(), needle),
           "%s: %s (%s), want a refusal naming '%s'", json, zpp_status_str(st), zpp_last_error(),
           needle);
    zpp_device_destroy(dev);
}

static void test_decoder_by_config(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(40));
    for (int it = 0; it < 3; it++) {
        const int kv = 1 + (int)(zpp_rng_u64(&r) % 2), H = kv * (1 << (zpp_rng_u64(&r) % 3));
        const int hd = 8 << (zpp_rng_u64(&r) % 2), C = H * hd, L = 1 + (int)(zpp_rng_u64(&r) % 2);
        const int F = 16 + (int)(zpp_rng_u64(&r) % 64), V = 64 + (int)(zpp_rng_u64(&r) % 64);
        const int untied = (int)(zpp_rng_u64(&r) % 2), bias = (int)(zpp_rng_u64(&r) % 2);
        char json[512];
        snprintf(json, sizeof json,
                 "{\"family\": \"llama\", \"n_layer\": %d, \"n_head\": %d, \"n_kv_head\": %d, "
                 "\"n_embd\": %d, \"n_ffn\": %d, \"seq_len\": %d, \"vocab_size\": %d, "
                 "\"untied_head\": %s, \"qkv_bias\": %s, \"rope_theta\": 500000}",
                 L, H, kv, C, F, DEC_T, V, untied ? "true" : "false", bias ? "true" : "false");
        /* HF's tensors: embed_tokens, per layer input_layernorm, q/k/v/o_proj
         * (+ q/k/v biases), post_attention_layernorm, gate/up/down_proj;
         * norm; lm_head when untied */
        const double q = (double)C * C, k = (double)kv * hd * C, o = (double)C * C;
        const double b = bias ? C + 2.0 * kv * hd : 0;
        const double layer = C + q + 2 * k + b + o + C + 3.0 * F * C;
        const double P = (double)V * C + L * layer + C + (untied ? (double)V * C : 0);
        decoder_trains(json, P, L, C, V);
    }
    { /* GPT-2: V C + T C + 2 C + L (12 C^2 + 13 C) */
        const double C = 32, L = 2, V = 96;
        char json[256];
        snprintf(json, sizeof json,
                 "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"seq_len\": %d, "
                 "\"vocab_size\": 96}", DEC_T);
        decoder_trains(json, V * C + DEC_T * C + 2 * C + L * (12 * C * C + 13 * C), 2, 32, 96);
    }
    expect_decoder_refused("{\"family\": \"mistral\"}", "mistral");
    expect_decoder_refused("{\"family\": \"llama\", \"n_head\": 4, \"n_kv_head\": 3}",
                           "n_kv_head");
    expect_decoder_refused("{\"rope_theta\": 500000}", "model.rope_theta");
    expect_decoder_refused("{\"n_layers\": 2}", "model.n_layers");
    expect_decoder_refused("[1, 2]", "not a JSON object");
    zpp_device *dev = NULL;
    zpp_model *model = NULL;
    EXPECT_OK(zpp_device_create_host(&dev));
    EXPECT(zpp_model_create_decoder("{}", ZPP_FP32, 0, dev, &model) == ZPP_ERR_INVALID);
    EXPECT_OK(zpp_model_create_decoder("{\"family\": \"llama\"}", ZPP_FP32, 1, dev, &model));
    int32_t bad[64] = {0};
    bad[3] = 1 << 20; /* past the vocabulary */
    EXPECT(zpp_model_set_batch(model, bad, NULL, 1) != ZPP_OK, "a token past the vocabulary");
    zpp_model_destroy(model);
    zpp_device_destroy(dev);
}

ZPP_TESTS(ZPP_TEST(test_first_step_closed_form), ZPP_TEST(test_every_mode_trains),
          ZPP_TEST(test_mode_names), ZPP_TEST(test_model_desc_refused),
          ZPP_TEST(test_fail_together), ZPP_TEST(test_every_option_reachable),
          ZPP_TEST(test_placement_from_mpi), ZPP_TEST(test_decoder_by_config))

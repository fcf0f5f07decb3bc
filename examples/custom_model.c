/* custom_model.c — training a model of your own with libzeropp.
 *
 * A two-layer perceptron learns a fixed random "teacher" function on
 * synthetic data, with its forward and backward written here in plain C;
 * zeropp shards its parameters, gradients and AdamW state over the ranks
 * and moves them with ZeRO-3, then again with ZeRO++ (qwZ + hpZ + qgZ).
 *
 *     y = W2 tanh(W1 x + b1) + b2        x in R^16, hidden 64, y in R^4
 *     loss = mean over the batch and outputs of (y - target)^2
 *
 * The parameters form two units (the engine gathers one unit at a time):
 * unit 0 = W1, b1 and unit 1 = W2, b2; the forward runs stage 0 (layer 1,
 * unit 0) then stage 1 (layer 2 and the loss, unit 1). The backward of
 * layer 1 needs the hidden gradient and the input but not W1 itself, so
 * the model tells the engine not to gather unit 0 for it.
 *
 * Build against an installed zeropp and run on 4 ranks as 2 nodes of 2:
 *     mpicc -O2 custom_model.c $(pkg-config --cflags --libs zeropp) -lm -o custom_model
 *     mpirun -np 4 ./custom_model --node-size 2
 * It prints the loss of both runs and exits non-zero unless each run's loss
 * fell below a tenth of where it started. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zeropp.h>

enum { IN = 16, HID = 64, OUT = 4, BATCH = 32 };
#define W1_N (HID * IN) /* unit 0: W1 (row-major, HID x IN), then b1 */
#define U0_N (W1_N + HID)
#define W2_N (OUT * HID) /* unit 1: W2 (OUT x HID), then b2 */
#define U1_N (W2_N + OUT)

/* ---- Random numbers: a pure function of (seed, stream, index) --------------- */

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
/* Uniform in (0, 1). */
static double uniform(uint64_t seed, uint64_t stream, uint64_t i) {
    uint64_t h = mix64(seed ^ mix64(stream * 0x9e3779b97f4a7c15ULL + i));
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
/* Standard normal (Box-Muller on two uniforms). */
static double normal(uint64_t seed, uint64_t stream, uint64_t i) {
    double u1 = uniform(seed, stream, 2 * i), u2 = uniform(seed, stream, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- The data: x ~ N(0, I), target = a fixed random network of x ------------- */

#define DATA_SEED 20261201u
static float teacher_w1[HID][IN], teacher_w2[OUT][HID];

static void teacher_init(void) {
    for (int j = 0; j < HID; j++)
        for (int k = 0; k < IN; k++) teacher_w1[j][k] = (float)(normal(DATA_SEED, 1, (uint64_t)(j * IN + k)) / sqrt(IN));
    for (int o = 0; o < OUT; o++)
        for (int j = 0; j < HID; j++) teacher_w2[o][j] = (float)(normal(DATA_SEED, 2, (uint64_t)(o * HID + j)) * 2.0 / sqrt(HID));
}

/* Sample `index` of the data set (the same on every rank). */
static void sample(uint64_t index, float *x, float *target) {
    for (int k = 0; k < IN; k++) x[k] = (float)normal(DATA_SEED, 3, index * IN + (uint64_t)k);
    for (int o = 0; o < OUT; o++) {
        double y = 0.0;
        for (int j = 0; j < HID; j++) {
            double h = 0.0;
            for (int k = 0; k < IN; k++) h += (double)teacher_w1[j][k] * x[k];
            y += (double)teacher_w2[o][j] * tanh(h);
        }
        target[o] = (float)y;
    }
}

/* ---- The model: state, and the four callbacks --------------------------------- */

typedef struct mlp {
    zpp_dtype dtype;                   /* the dtype parameters arrive in */
    float x[BATCH][IN], target[BATCH][OUT];
    float h[BATCH][HID];               /* tanh(W1 x + b1) */
    float dy[BATCH][OUT];              /* d loss / d y */
    float dpre[BATCH][HID];            /* d loss / d (W1 x + b1), from stage 1's backward */
    float w[U0_N > U1_N ? U0_N : U1_N]; /* the gathered unit, as fp32 */
    float loss;
} mlp;

/* The gathered unit in fp32: bf16 is the top half of an fp32. */
static const float *params_f32(mlp *m, const void *params, size_t n) {
    if (m->dtype == ZPP_FP32) return params;
    const uint16_t *p = params;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)p[i] << 16;
        memcpy(&m->w[i], &bits, sizeof bits);
    }
    return m->w;
}

/* Weights uniform in +-1/sqrt(fan_in) (PyTorch's nn.Linear), biases 0; a
 * pure function of (seed, unit, index), so each rank can make its shard. */
static zpp_status mlp_init_params(void *user, int unit, size_t offset, size_t count, float *out,
                                  uint64_t seed) {
    (void)user;
    size_t n_w = unit == 0 ? W1_N : W2_N;
    double a = 1.0 / sqrt(unit == 0 ? IN : HID);
    for (size_t i = 0; i < count; i++) {
        size_t e = offset + i;
        out[i] = e < n_w ? (float)(a * (2.0 * uniform(seed, 10 + (uint64_t)unit, e) - 1.0)) : 0.0f;
    }
    return ZPP_OK;
}

static zpp_status mlp_forward(void *user, int stage, const void *params) {
    mlp *m = user;
    if (stage == 0) {
        const float *p = params_f32(m, params, U0_N), *w1 = p, *b1 = p + W1_N;
        for (int b = 0; b < BATCH; b++)
            for (int j = 0; j < HID; j++) {
                float s = b1[j];
                for (int k = 0; k < IN; k++) s += w1[j * IN + k] * m->x[b][k];
                m->h[b][j] = tanhf(s);
            }
        return ZPP_OK;
    }
    const float *p = params_f32(m, params, U1_N), *w2 = p, *b2 = p + W2_N;
    double loss = 0.0;
    for (int b = 0; b < BATCH; b++)
        for (int o = 0; o < OUT; o++) {
            float y = b2[o];
            for (int j = 0; j < HID; j++) y += w2[o * HID + j] * m->h[b][j];
            float d = y - m->target[b][o];
            loss += (double)d * d;
            m->dy[b][o] = 2.0f * d / (BATCH * OUT);
        }
    m->loss = (float)(loss / (BATCH * OUT));
    return ZPP_OK;
}

static float mlp_loss(void *user) { return ((mlp *)user)->loss; }

/* grads += d(loss * scale)/d(params). */
static zpp_status mlp_backward(void *user, int stage, const void *params, float *grads,
                               float scale) {
    mlp *m = user;
    if (stage == 1) {
        const float *w2 = params_f32(m, params, U1_N);
        float *dw2 = grads, *db2 = grads + W2_N;
        for (int b = 0; b < BATCH; b++) {
            for (int o = 0; o < OUT; o++) {
                float g = scale * m->dy[b][o];
                db2[o] += g;
                for (int j = 0; j < HID; j++) dw2[o * HID + j] += g * m->h[b][j];
            }
            for (int j = 0; j < HID; j++) { /* through W2, then tanh' = 1 - tanh^2 */
                float dh = 0.0f;
                for (int o = 0; o < OUT; o++) dh += w2[o * HID + j] * scale * m->dy[b][o];
                m->dpre[b][j] = dh * (1.0f - m->h[b][j] * m->h[b][j]);
            }
        }
        return ZPP_OK;
    }
    if (params != NULL) /* we said stage 0's backward reads no parameters */
        return zpp_error(ZPP_ERR_STATE, "mlp: stage 0's backward got parameters");
    float *dw1 = grads, *db1 = grads + W1_N;
    for (int b = 0; b < BATCH; b++)
        for (int j = 0; j < HID; j++) {
            db1[j] += m->dpre[b][j];
            for (int k = 0; k < IN; k++) dw1[j * IN + k] += m->dpre[b][j] * m->x[b][k];
        }
    return ZPP_OK;
}

/* This rank's micro-batch of step `step`: samples drawn for (step, rank). */
static void load_batch(mlp *m, int step, int rank, int world) {
    for (int b = 0; b < BATCH; b++)
        sample(((uint64_t)step * (uint64_t)world + (uint64_t)rank) * BATCH + (uint64_t)b, m->x[b],
               m->target[b]);
}

/* ---- Training ----------------------------------------------------------------- */

static int g_rank;

#define CHECK(call)                                                                      \
    do {                                                                                 \
        zpp_status st_ = (call);                                                         \
        if (st_ != ZPP_OK) {                                                             \
            fprintf(stderr, "rank %d: %s: %s (%s)\n", g_rank, #call, zpp_last_error(),   \
                    zpp_status_str(st_));                                                \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                \
        }                                                                                \
    } while (0)

typedef struct run_result {
    float first_loss, last_loss, eval_loss;
    double cross_node_bytes; /* per step */
} run_result;

static run_result train(zpp_device *dev, zpp_topo *topo, int mode, int steps, float lr) {
    static mlp m; /* ~30 KB: keep it off the stack */
    memset(&m, 0, sizeof m);
    m.dtype = ZPP_BF16;
    const size_t unit_numel[2] = {U0_N, U1_N};
    const int stage_unit[2] = {0, 1};
    const unsigned char bwd_reads[2] = {0, 1}; /* dW1 needs x and dpre, not W1 */
    zpp_model_desc desc = {
        .n_units = 2,
        .unit_numel = unit_numel,
        .n_stages = 2,
        .stage_unit = stage_unit,
        .bwd_reads_params = bwd_reads,
        .param_dtype = m.dtype,
        .user = &m,
        .init_params = mlp_init_params,
        .forward = mlp_forward,
        .loss = mlp_loss,
        .backward = mlp_backward,
    };
    zpp_model *model = NULL;
    CHECK(zpp_model_create(&desc, dev, &model));

    zpp_engine_config cfg = zpp_engine_config_default();
    cfg.mode = mode;
    cfg.work_dtype = m.dtype;
    cfg.weight_decay = 0.0f;
    zpp_engine *eng = NULL;
    CHECK(zpp_engine_create(topo, model, dev, &cfg, &eng));

    zpp_topo_info ti = zpp_topo_info_get(topo);
    run_result r = {0};
    double first = 0.0, last = 0.0, bytes = 0.0;
    const int avg = 10; /* steps averaged at each end */
    for (int step = 0; step < steps; step++) {
        load_batch(&m, step, ti.world_rank, ti.world_size);
        float loss = 0.0f;
        zpp_update_stats st;
        CHECK(zpp_engine_forward(eng, &loss));
        CHECK(zpp_engine_backward(eng, zpp_engine_loss_scale(eng)));
        /* a cosine decay from lr to lr / 10 */
        float lr_t = lr * (0.55f + 0.45f * cosf(3.14159265f * (float)step / (float)steps));
        CHECK(zpp_engine_update(eng, lr_t, loss, &st));
        if (step < avg) first += st.loss / avg;
        if (step >= steps - avg) last += st.loss / avg;
        bytes += st.cross_node_bytes / steps;
        if (ti.world_rank == 0 && (step % 50 == 0 || step == steps - 1))
            printf("  %-6s step %4d  loss %.5f  grad norm %.4f\n", zpp_mode_name(mode), step + 1,
                   (double)st.loss, (double)st.grad_norm);
    }
    /* held-out data: a step index no training step used */
    load_batch(&m, steps + 1000, ti.world_rank, ti.world_size);
    CHECK(zpp_engine_evaluate(eng, &r.eval_loss));
    r.first_loss = (float)first;
    r.last_loss = (float)last;
    r.cross_node_bytes = bytes;
    zpp_engine_destroy(eng);
    zpp_model_destroy(model);
    return r;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    int node_size = 0, steps = 300;
    float lr = 3e-3f;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--node-size") && i + 1 < argc) node_size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lr") && i + 1 < argc) lr = (float)atof(argv[++i]);
        else {
            if (g_rank == 0)
                fprintf(stderr, "usage: %s [--node-size S] [--steps N] [--lr LR]\n", argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (steps < 20) steps = 20;
    teacher_init();

    zpp_device *dev = NULL;
    zpp_topo *topo = NULL;
    CHECK(zpp_device_create_host(&dev));
    CHECK(zpp_topo_create(dev, node_size, 120.0, &topo));
    zpp_topo_info ti = zpp_topo_info_get(topo);
    if (g_rank == 0)
        printf("zeropp %s: a 2-layer MLP (%d parameters) on %d ranks, %d nodes of %d\n",
               zpp_version(), U0_N + U1_N, ti.world_size, ti.nodes, ti.node_size);

    const int modes[2] = {ZPP_MODE_ZERO3, ZPP_MODE_ZEROPP};
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        run_result r = train(dev, topo, modes[k], steps, lr);
        int dropped = r.last_loss < 0.1f * r.first_loss;
        ok = ok && dropped;
        if (g_rank == 0)
            printf("%s: loss %.5f -> %.5f (%.1fx lower), held-out %.5f, %.0f cross-node "
                   "bytes per step per node%s\n",
                   zpp_mode_name(modes[k]), (double)r.first_loss, (double)r.last_loss,
                   (double)(r.first_loss / r.last_loss), (double)r.eval_loss,
                   r.cross_node_bytes, dropped ? "" : "  <- did not fall 10x");
    }
    zpp_topo_destroy(topo);
    zpp_device_destroy(dev);
    MPI_Finalize();
    return ok ? 0 : 1;
}

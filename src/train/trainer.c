/* train/trainer.c — wires config, topology, model, engine and data. */
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/error.h"
#include "core/file.h"
#include "device/device.h"

struct zpp_trainer {
    zpp_train_config cfg;
    zpp_topo *topo;
    zpp_model *model;
    zpp_engine *engine;
    zpp_data *data;
    zpp_device *dev; /* the rank's compute backend: host, or its GPU */
    int32_t *tokens, *targets; /* one micro-batch, host */
    zpp_trainer_info info;
    char mode[32];
    /* batch callback state */
    int step;
    uint64_t val_index;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *mode_name(const zpp_train_config *c, char *buf, size_t cap) {
    buf[0] = '\0';
    if (c->zero.quantized_weights) strcat(buf, "qwz+");
    if (c->zero.hpz_partition_size > 1) strcat(buf, "hpz+");
    if (c->zero.quantized_gradients) strcat(buf, "qgz+");
    size_t k = strlen(buf);
    if (k == 0) snprintf(buf, cap, "zero3");
    else buf[k - 1] = '\0';
    return buf;
}

static zpp_status build(zpp_trainer *t, const zpp_trainer_opts *o) {
    zpp_train_config *c = &t->cfg;
    int node_size = o->node_size;
    int world = zpp_comm_world_size();
    ZPP_CHECK(zpp_train_config_resolve(c, world));

    /* The node size: the flag, else hpZ's partition size, else the launcher.
     * hpZ partitions inside a node, so both must agree. */
    int hpz = c->zero.hpz_partition_size > 1;
    if (node_size == 0 && hpz) node_size = c->zero.hpz_partition_size;
    if (hpz && node_size != c->zero.hpz_partition_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "zero_optimization.zero_hpz_partition_size %d differs from the "
                         "node size %d; hpZ partitions inside a node, so set them equal",
                         c->zero.hpz_partition_size, node_size);
    zpp_topo_opts to;
    memset(&to, 0, sizeof to);
    to.backend = ZPP_BACKEND_MPI;
    to.node_size = node_size;
    if (o->gpu) {
        /* The rank's GPU, with its compute stream, exists before NCCL
         * starts: the launcher's local rank modulo the GPUs it sees,
         * whatever node size is emulated. */
        int local = 0, local_size = 0;
        ZPP_CHECK(zpp_comm_launch_local(&local, &local_size));
        int gpus = zpp_device_gpu_count();
        if (gpus <= 0)
            return zpp_error(ZPP_ERR_CUDA,
                             "--device gpu, but no GPU is visible (or this build has no "
                             "CUDA); run with --device cpu or on a machine with NVIDIA GPUs");
        ZPP_CHECK(zpp_device_create_gpu(local % gpus, &t->dev));
        to.backend = ZPP_BACKEND_NCCL;
        to.device = t->dev;
        to.emulate_nodes = o->emulate_nodes;
    } else {
        ZPP_CHECK(zpp_device_create_host(&t->dev));
    }
    ZPP_CHECK(zpp_topo_create(&to, &t->topo));

    ZPP_CHECK(zpp_data_open(o->data_path, c, &t->data));
    zpp_data_info di = zpp_data_get_info(t->data);
    if (di.vocab > c->model.vocab_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "the data has tokens up to %d but model.vocab_size is %d; set "
                         "model.vocab_size to at least %d",
                         di.vocab - 1, c->model.vocab_size, di.vocab);

    zpp_dtype wd = c->bf16 ? ZPP_BF16 : ZPP_FP32;
    ZPP_CHECK(zpp_gpt2_create(&c->model, wd, c->train_micro_batch_size_per_gpu, t->dev,
                              &t->model));
    zpp_engine_opts eo = zpp_engine_opts_default();
    eo.gather = c->zero.quantized_weights ? ZPP_GATHER_QWZ : ZPP_GATHER_BASELINE;
    eo.hpz = hpz;
    eo.reduce = c->zero.quantized_gradients ? ZPP_REDUCE_QGZ : ZPP_REDUCE_BASELINE;
    eo.work_dtype = wd;
    eo.beta1 = (float)c->optimizer.beta1;
    eo.beta2 = (float)c->optimizer.beta2;
    eo.eps = (float)c->optimizer.eps;
    eo.weight_decay = (float)c->optimizer.weight_decay;
    eo.grad_clip = (float)c->gradient_clipping;
    eo.max_reuse_distance = (size_t)c->zero.max_reuse_distance;
    eo.seed = c->seed;
    ZPP_CHECK(zpp_engine_create(t->topo, t->model, &eo, t->dev, &t->engine));

    size_t bt = (size_t)c->train_micro_batch_size_per_gpu * (size_t)c->model.seq_len;
    t->tokens = malloc(bt * sizeof *t->tokens);
    t->targets = malloc(bt * sizeof *t->targets);
    if (!t->tokens || !t->targets) return zpp_error(ZPP_ERR_NOMEM, "trainer: out of memory");

    zpp_trainer_info *in = &t->info;
    in->world_size = t->topo->world_size;
    in->world_rank = t->topo->world_rank;
    in->node_size = t->topo->node_size;
    in->nodes = t->topo->nodes;
    in->micro_batch = c->train_micro_batch_size_per_gpu;
    in->accum = c->gradient_accumulation_steps;
    in->global_batch = c->train_batch_size;
    in->seq_len = c->model.seq_len;
    in->n_params = 0;
    for (int u = 0; u < t->model->n_units; u++) in->n_params += t->model->unit_numel[u];
    in->data = di;
    in->mode = mode_name(c, t->mode, sizeof t->mode);
    return ZPP_OK;
}

zpp_status zpp_trainer_create(const zpp_train_config *cfg, const zpp_trainer_opts *opts,
                              zpp_trainer **trainer_p) {
    zpp_trainer *t = calloc(1, sizeof *t);
    if (!t) return zpp_comm_agree_world(zpp_error(ZPP_ERR_NOMEM, "trainer: out of memory"));
    t->cfg = *cfg;
    zpp_status st = zpp_comm_agree_world(build(t, opts));
    if (st != ZPP_OK) {
        zpp_trainer_destroy(t);
        return st;
    }
    *trainer_p = t;
    return ZPP_OK;
}

void zpp_trainer_destroy(zpp_trainer *t) {
    if (!t) return;
    zpp_engine_destroy(t->engine);
    if (t->model) t->model->ops->destroy(t->model);
    zpp_data_close(t->data);
    zpp_topo_destroy(t->topo);
    zpp_device_destroy(t->dev); /* last: everything above used it */
    free(t->tokens);
    free(t->targets);
    free(t);
}

const zpp_trainer_info *zpp_trainer_get_info(const zpp_trainer *t) { return &t->info; }

static zpp_status train_batch(void *ctx, int micro, zpp_model *m) {
    zpp_trainer *t = ctx;
    /* Every rank reads its batch here, at the same micro-step: agree, so a
     * read that fails on one rank (a data file shrinking under the run)
     * fails every rank here rather than leaving the others in a collective. */
    ZPP_CHECK(zpp_comm_agree_world(zpp_data_batch(t->data, (uint64_t)t->step, micro,
                                                  t->info.world_rank, t->info.world_size,
                                                  t->tokens, t->targets)));
    return m->ops->set_batch(m, t->tokens, t->targets, t->info.micro_batch);
}

/* Validation micro-batch v of rank r is held-out batch v * world + r, so
 * the ranks together cover eval_batches * world distinct batches. */
static zpp_status val_batch(void *ctx, int micro, zpp_model *m) {
    zpp_trainer *t = ctx;
    (void)micro;
    ZPP_CHECK(zpp_comm_agree_world(zpp_data_val_batch(t->data, t->val_index,
                                                      t->info.micro_batch, t->tokens,
                                                      t->targets)));
    return m->ops->set_batch(m, t->tokens, t->targets, t->info.micro_batch);
}

zpp_status zpp_trainer_step(zpp_trainer *t, int step, zpp_trainer_step_result *r) {
    t->step = step;
    float lr = (float)zpp_train_lr(&t->cfg, step);
    double t0 = now_s();
    zpp_status st = zpp_engine_step(t->engine, t->info.accum, lr, train_batch, t, &r->stats);
    st = zpp_comm_agree_world(st);
    ZPP_CHECK(st);
    double dt = now_s() - t0;
    ZPP_CHECK(zpp_comm_max_world(&dt));
    r->seconds = dt;
    r->tokens_per_s = (double)t->info.global_batch * t->info.seq_len / (dt > 0 ? dt : 1e-9);
    size_t now = 0, peak = 0;
    zpp_device_mem_stats(t->dev, &now, &peak);
    r->device_peak_bytes = (double)peak;
    return zpp_comm_max_world(&r->device_peak_bytes);
}

zpp_status zpp_trainer_eval(zpp_trainer *t, float *val_loss_p) {
    int n = t->cfg.eval_batches > 0 ? t->cfg.eval_batches : 1;
    double sum = 0.0;
    for (int v = 0; v < n; v++) {
        float loss = 0.0f;
        t->val_index = (uint64_t)v * (uint64_t)t->info.world_size + (uint64_t)t->info.world_rank;
        ZPP_CHECK(zpp_comm_agree_world(zpp_engine_eval(t->engine, val_batch, t, &loss)));
        sum += loss;
    }
    *val_loss_p = (float)(sum / n);
    return ZPP_OK;
}

/* ---- Checkpoints ----------------------------------------------------------- */

static void rank_file(const char *dir, int rank, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/rank-%05d.ckpt", dir, rank);
}

zpp_status zpp_trainer_save(zpp_trainer *t, const char *dir, int steps_done) {
    char path[4096];
    zpp_status st = ZPP_OK;
    if (t->info.world_rank == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        st = zpp_error(ZPP_ERR_IO, "checkpoint: cannot create directory %s: %s", dir,
                       strerror(errno));
    ZPP_CHECK(zpp_comm_agree_world(st));
    /* An older manifest goes first: until the new one is written, the
     * directory is not a checkpoint. */
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    if (t->info.world_rank == 0) remove(path);
    ZPP_CHECK(zpp_comm_agree_world(ZPP_OK));
    rank_file(dir, t->info.world_rank, path, sizeof path);
    ZPP_CHECK(zpp_comm_agree_world(zpp_engine_save(t->engine, path)));
    if (t->info.world_rank == 0) {
        char tmp[4200], man[4096];
        snprintf(man, sizeof man, "%s/checkpoint.json", dir);
        snprintf(tmp, sizeof tmp, "%s.tmp", man);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "{\"step\": %d, \"world_size\": %d, \"mode\": \"%s\"}\n", steps_done,
                          t->info.world_size, t->info.mode) < 0 ||
            fclose(f) != 0 || rename(tmp, man) != 0)
            st = zpp_error(ZPP_ERR_IO, "checkpoint: cannot write %s: %s", man, strerror(errno));
    }
    return zpp_comm_agree_world(st);
}

/* Reads the manifest's step and world size. */
static zpp_status read_manifest(const char *dir, int *step_p, int *world_p) {
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zpp_error(ZPP_ERR_IO, "%s is not a checkpoint (no %s: %s)", dir, path,
                         strerror(errno));
    FILE *f = NULL;
    ZPP_CHECK(zpp_fopen_regular(path, "checkpoint manifest", &f));
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
    const cJSON *world = cJSON_GetObjectItemCaseSensitive(j, "world_size");
    zpp_status st = ZPP_OK;
    if (!cJSON_IsNumber(step) || !cJSON_IsNumber(world) || step->valueint < 0)
        st = zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s is malformed", path);
    else {
        *step_p = step->valueint;
        *world_p = world->valueint;
    }
    cJSON_Delete(j);
    return st;
}

zpp_status zpp_trainer_load(zpp_trainer *t, const char *dir, int *steps_done_p) {
    int step = 0, world = 0;
    zpp_status st = read_manifest(dir, &step, &world);
    if (st == ZPP_OK && world != t->info.world_size)
        st = zpp_error(ZPP_ERR_CONFIG,
                       "checkpoint %s was saved by %d ranks; resume it with %d ranks, not %d",
                       dir, world, world, t->info.world_size);
    ZPP_CHECK(zpp_comm_agree_world(st));
    char path[4096];
    rank_file(dir, t->info.world_rank, path, sizeof path);
    st = zpp_engine_load(t->engine, path);
    if (st == ZPP_OK && zpp_engine_steps_taken(t->engine) != step)
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint %s: rank file says step %d, manifest step %d; the files "
                       "are from different saves",
                       dir, zpp_engine_steps_taken(t->engine), step);
    ZPP_CHECK(zpp_comm_agree_world(st));
    *steps_done_p = step;
    return ZPP_OK;
}

/* train/trainer.c — wires config, topology, model, engine and data. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"
#include "core/fault.h"
#include "device/device.h"
#include "train/checkpoint.h"
#include "train/hf_gpt2.h"
#include "train/hf_model.h"
#include "train/llmc.h"

struct zpp_trainer {
    zpp_train_config cfg;
    zpp_train_config cfg_given; /* before resolving: what a checkpoint keeps */
    char *data_path;            /* absolute (realpath), NULL: synthetic */
    char *init_from;            /* the lineage's --init-from, absolute; NULL: none */
    zpp_topo *topo;
    zpp_topo_info topo_info;
    zpp_model *model;
    zpp_engine *engine;
    zpp_data *data;
    zpp_device *dev; /* the rank's compute backend: host, or its GPU */
    int32_t *tokens, *targets; /* one micro-batch, host */
    zpp_trainer_info info;
    char mode[48];
    /* batch callback state */
    int step;
    uint64_t val_index;
    int eval_train;               /* the evaluation reads the training split */
    /* checkpoints: the save test hooks (trainer.h), the last resume's note */
    zpp_fault fault;
    char resume_note[4096];
    /* the run id (trainer.h) and the --save folder's lock */
    uint64_t run_id;
    int run_continued;
    zpp_ckpt_lock *lock;
    char lock_note[1024];
    int eval_batches;       /* cfg.eval_batches, capped at what the held-out split holds */
    char eval_note[512];
};

/* A fresh run id on rank 0 (the kernel's randomness, mixed with the time and
 * the pid should /dev/urandom be unreadable), shared with every rank: two
 * halves through the world's max (the others offer -1). Collective. */
static zpp_status make_run_id(uint64_t *id_p) {
    uint64_t id = 0;
    if (zpp_comm_world_rank() == 0) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&id, sizeof id, 1, f) != 1) id = 0;
        if (f) fclose(f);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t z = id ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^
                     ((uint64_t)getpid() << 40);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finalizer */
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        id = z ^ (z >> 31);
        if (!id) id = 1;
    }
    uint64_t out = 0;
    for (int half = 0; half < 2; half++) {
        double d = zpp_comm_world_rank() == 0 ? (double)((id >> (32 * half)) & 0xffffffffu) : -1.0;
        ZPP_CHECK(zpp_comm_max_world(&d));
        out |= (uint64_t)d << (32 * half);
    }
    *id_p = out;
    return ZPP_OK;
}

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
    if (c->zero.loco) strcat(buf, "loco+");
    if (c->zero.grad_stochastic) strcat(buf, "sr+");
    if (c->zero.quantized_gradients && !c->zero.grad_e2m1) strcat(buf, "int4+");
    if (c->zero.quantize_vectors && (c->zero.quantized_weights || c->zero.quantized_gradients))
        strcat(buf, "qvec+");
    size_t k = strlen(buf);
    if (k == 0) snprintf(buf, cap, "zero3");
    else buf[k - 1] = '\0';
    return buf;
}

/* ---- --init-from: this rank's shard of every unit from a file ------------------- */

/* Elements [begin, begin + count) of unit u from the file behind ctx. */
typedef zpp_status (*unit_reader)(void *ctx, int u, size_t begin, size_t count, float *out);

/* Every unit's shard of this rank read by `read` and set as the masters,
 * the moments at zero, as in a fresh run. */
static zpp_status load_shards(zpp_trainer *t, unit_reader read, void *ctx) {
    float *x = NULL, *zero = NULL;
    zpp_status st = ZPP_OK;
    size_t most = 1; /* the largest shard: one buffer serves every unit */
    for (int u = 0; st == ZPP_OK && u < zpp_engine_unit_count(t->engine); u++) {
        size_t numel = 0, begin = 0, count = 0;
        st = zpp_engine_shard_range(t->engine, u, &numel, &begin, &count);
        if (count > most) most = count;
    }
    if (st == ZPP_OK && (!(x = malloc(most * sizeof *x)) || !(zero = calloc(most, sizeof *zero))))
        st = zpp_error(ZPP_ERR_NOMEM, "trainer: out of memory");
    for (int u = 0; st == ZPP_OK && u < zpp_engine_unit_count(t->engine); u++) {
        size_t numel = 0, begin = 0, count = 0;
        st = zpp_engine_shard_range(t->engine, u, &numel, &begin, &count);
        if (st == ZPP_OK) st = read(ctx, u, begin, count, x);
        if (st == ZPP_OK) st = zpp_engine_state_set(t->engine, u, x, zero, zero);
    }
    free(x);
    free(zero);
    return st;
}

static zpp_status read_llmc_unit(void *f, int u, size_t begin, size_t count, float *out) {
    return zpp_llmc_read_unit(f, u, begin, count, out);
}

/* An llm.c model file (only this rank's bytes are read). */
static zpp_status init_from_llmc(zpp_trainer *t, const char *path) {
    if (t->cfg.model_family != ZPP_FAMILY_GPT2)
        return zpp_error(ZPP_ERR_CONFIG,
                         "--init-from: an llm.c file holds a GPT-2, but 'model.family' is "
                         "\"%s\"; drop --init-from or train a gpt2",
                         zpp_model_family_name(t->cfg.model_family));
    zpp_llmc_file *f = NULL;
    ZPP_CHECK(zpp_llmc_open(path, &f));
    zpp_status st = zpp_llmc_check_model(f, &t->cfg.model);
    if (st == ZPP_OK) st = load_shards(t, read_llmc_unit, f);
    zpp_llmc_close(f);
    return st;
}

typedef struct hf_llama_src {
    zpp_hf_model *m;
    zpp_llama_config lc; /* the run's */
} hf_llama_src;

static zpp_status read_hf_llama_unit(void *c, int u, size_t begin, size_t count, float *out) {
    hf_llama_src *s = c;
    return zpp_hf_model_read_unit(s->m, &s->lc, u, begin, count, out);
}

typedef struct hf_gpt2_src {
    zpp_hf_gpt2 *m;
    const zpp_gpt2_config *run;
} hf_gpt2_src;

static zpp_status read_hf_gpt2_unit(void *c, int u, size_t begin, size_t count, float *out) {
    hf_gpt2_src *s = c;
    return zpp_hf_gpt2_read_unit(s->m, s->run, u, begin, count, out);
}

/* A Hugging Face folder: a Llama (train/hf_model.h) or a GPT-2
 * (train/hf_gpt2.h); each HF tensor that overlaps this rank's shards read
 * from its file (those bytes only; a GPT-2's transposed weights whole),
 * widened to fp32. The run's shape was set from config.json and checked
 * (tools/train.c), so a mismatch here is a caller's mistake, still
 * refused. */
static zpp_status init_from_hf(zpp_trainer *t, const char *dir) {
    if (zpp_hf_gpt2_is_dir(dir)) {
        if (t->cfg.model_family != ZPP_FAMILY_GPT2)
            return zpp_error(ZPP_ERR_CONFIG,
                             "--init-from %s holds a GPT-2, but 'model.family' is \"%s\"; drop "
                             "the key or set it to \"gpt2\"",
                             dir, zpp_model_family_name(t->cfg.model_family));
        hf_gpt2_src s = {NULL, &t->cfg.model};
        ZPP_CHECK(zpp_hf_gpt2_open(dir, &s.m));
        zpp_status st = zpp_hf_gpt2_check_model(s.m, &t->cfg.model);
        if (st == ZPP_OK) st = load_shards(t, read_hf_gpt2_unit, &s);
        zpp_hf_gpt2_close(s.m);
        return st;
    }
    hf_llama_src s = {NULL, {0}};
    const zpp_decoder_shape shape = zpp_train_config_shape(&t->cfg);
    ZPP_CHECK(zpp_llama_config_of_shape(&shape, &s.lc));
    ZPP_CHECK(zpp_hf_model_open(dir, &s.m));
    zpp_status st = zpp_hf_check_shape(zpp_hf_model_config(s.m), &t->cfg, dir);
    if (st == ZPP_OK) st = load_shards(t, read_hf_llama_unit, &s);
    zpp_hf_model_close(s.m);
    return st;
}

/* The engine's options from the config, as the public API takes them: the
 * trainer opens its engine as any program would (zpp_engine_create), so the
 * config file, the public config and their checks cannot drift apart. */
static zpp_engine_config engine_config(const zpp_train_config *c, int hpz, zpp_dtype wd,
                                       int profile) {
    zpp_engine_config ec = zpp_engine_config_default();
    ec.mode = (c->zero.quantized_weights ? ZPP_MODE_QWZ : 0) | (hpz ? ZPP_MODE_HPZ : 0) |
              (c->zero.quantized_gradients ? ZPP_MODE_QGZ : 0);
    ec.work_dtype = wd;
    ec.beta1 = (float)c->optimizer.beta1;
    ec.beta2 = (float)c->optimizer.beta2;
    ec.eps = (float)c->optimizer.eps;
    ec.weight_decay = (float)c->optimizer.weight_decay;
    ec.decay_all = c->weight_decay_all;
    ec.grad_clip = (float)c->gradient_clipping;
    ec.max_reuse_distance = (size_t)c->zero.max_reuse_distance;
    ec.prefetch_depth = c->zero.prefetch_depth;
    ec.reduce_depth = c->zero.reduce_depth;
    ec.loco = c->zero.loco;
    ec.loco_err_beta = (float)c->zero.loco_err_beta;
    ec.loco_reset_T = c->zero.loco_reset_T;
    ec.quantize_vectors = c->zero.quantize_vectors;
    ec.resident_weights = c->zero.resident_weights;
    /* several backwards a step would each round into a bf16 sum */
    ec.work_grads = c->zero.work_grads && c->gradient_accumulation_steps == 1;
    ec.grad_quant.stochastic = c->zero.grad_stochastic;
    ec.grad_quant.format = c->zero.grad_e2m1 ? ZPP_QUANT_E2M1 : ZPP_QUANT_INT;
    ec.seed = c->seed;
    ec.max_consecutive_skips = c->max_consecutive_skips;
    ec.profile = profile;
    if (c->fp16.enabled) { /* loss scaling: DeepSpeed's fp16 keys */
        ec.loss_scale = (float)c->fp16.loss_scale;
        ec.initial_scale_power = c->fp16.initial_scale_power;
        ec.loss_scale_window = c->fp16.loss_scale_window;
        ec.hysteresis = c->fp16.hysteresis;
        ec.consecutive_hysteresis = c->fp16.consecutive_hysteresis;
        ec.min_loss_scale = (float)c->fp16.min_loss_scale;
    }
    return ec;
}

/* The rank's device and the topology over it. The node size: the flag,
 * else hpZ's partition size, else the launcher. hpZ partitions inside a
 * node, so both must agree; a partition size of 0 is the node, whatever it
 * turns out to be (resolved here). Sets *hpz_p: hpZ on. */
static zpp_status build_topology(zpp_trainer *t, const zpp_trainer_opts *o, int *hpz_p) {
    zpp_train_config *c = &t->cfg;
    int node_size = o->node_size;
    const int hpz_node = c->zero.hpz_partition_size == 0;
    int hpz = c->zero.hpz_partition_size > 1;
    if (node_size == 0 && hpz) node_size = c->zero.hpz_partition_size;
    if (hpz && node_size != c->zero.hpz_partition_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "zero_optimization.zero_hpz_partition_size %d differs from the "
                         "node size %d; hpZ partitions inside a node, so set them equal",
                         c->zero.hpz_partition_size, node_size);
    /* The rank's GPU, with its compute stream, exists before NCCL starts:
     * zpp_device_create_for_rank picks it, whatever node size is emulated
     * (its refusal of a GPU-less machine said in the command line's words). */
    zpp_status st = zpp_device_create_for_rank(o->gpu != 0, &t->dev);
    if (st == ZPP_ERR_CUDA && zpp_device_gpu_count() <= 0)
        st = zpp_error(ZPP_ERR_CUDA,
                       "--device gpu, but no GPU is visible (or this build has no "
                       "CUDA); run with --device cpu or on a machine with NVIDIA GPUs");
    /* agreed before the topology's collectives, which a rank without its
     * device would leave the others waiting in */
    ZPP_CHECK(zpp_comm_agree_world(st));
    ZPP_CHECK(zpp_topo_create_emulated(t->dev, node_size, c->collective_timeout_s, o->emulate_nodes,
                                       &t->topo));
    t->topo_info = zpp_topo_info_get(t->topo);
    if (hpz_node) {
        c->zero.hpz_partition_size = t->topo_info.node_size;
        hpz = t->topo_info.node_size > 1;
    }
    *hpz_p = hpz;
    return ZPP_OK;
}

/* The data (its vocabulary checked against the model's) and the model. */
static zpp_status build_data_model(zpp_trainer *t, const zpp_trainer_opts *o, zpp_dtype wd) {
    zpp_train_config *c = &t->cfg;
    ZPP_CHECK(zpp_data_open(o->data_path, c, &t->data));
    /* where the data is, for a checkpoint: a resume from elsewhere finds it */
    if (o->data_path && !(t->data_path = realpath(o->data_path, NULL)))
        return zpp_error(ZPP_ERR_IO, "cannot resolve the path of data file %s: %s", o->data_path,
                         strerror(errno));
    zpp_data_info di = zpp_data_info_get(t->data);
    if (di.vocab > c->model.vocab_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "the data has tokens up to %d but model.vocab_size is %d; set "
                         "model.vocab_size to at least %d",
                         di.vocab - 1, c->model.vocab_size, di.vocab);
    /* every token is also a target: it must be inside the softmax */
    if (di.vocab > zpp_gpt2_real_vocab(&c->model))
        return zpp_error(ZPP_ERR_CONFIG,
                         "the data has tokens up to %d but model.real_vocab_size is %d (the "
                         "rows past it are padding); use data of that vocabulary",
                         di.vocab - 1, zpp_gpt2_real_vocab(&c->model));
    /* Every family through its factory (family.h). */
    const zpp_decoder_shape shape = zpp_train_config_shape(c);
    zpp_status st = zpp_model_family_create(zpp_model_family_name(c->model_family), &shape, wd,
                                            c->train_micro_batch_size_per_gpu, t->dev,
                                            &t->model);
    /* The model speaks of max_batch; the user set the micro-batch. */
    if (st == ZPP_ERR_NOMEM)
        return zpp_error_append(
            st, "(the activations grow with train_micro_batch_size_per_gpu, %d, times "
                "model.seq_len, %d: make either smaller%s%s)",
            c->train_micro_batch_size_per_gpu, c->model.seq_len,
            c->keep_activations && !c->activation_checkpointing
                ? ", set zeropp.keep_activations false (on a GPU it keeps up to 12 x n_embd "
                  "bytes a token and layer more)"
                : "",
            c->activation_checkpointing ? "" : ", or set zeropp.activation_checkpointing "
                                               "true, --recompute: a block keeps only its input");
    return st;
}

/* What the log's header shows (trainer.h). */
static zpp_status fill_info(zpp_trainer *t, const zpp_trainer_opts *o, int hpz, zpp_dtype wd) {
    const zpp_train_config *c = &t->cfg;
    zpp_trainer_info *in = &t->info;
    in->world_size = t->topo_info.world_size;
    in->world_rank = t->topo_info.world_rank;
    in->node_size = t->topo_info.node_size;
    in->nodes = t->topo_info.nodes;
    in->micro_batch = c->train_micro_batch_size_per_gpu;
    in->accum = c->gradient_accumulation_steps;
    in->global_batch = c->train_batch_size;
    in->seq_len = c->model.seq_len;
    in->n_params = 0;
    for (int u = 0; u < t->model->n_units; u++) in->n_params += t->model->unit_numel[u];
    in->data = zpp_data_info_get(t->data);
    in->mode = mode_name(c, t->mode, sizeof t->mode);
    in->qwz = c->zero.quantized_weights != 0;
    in->hpz_partition = hpz ? c->zero.hpz_partition_size : 0;
    in->qgz = c->zero.quantized_gradients != 0;
    in->dtype = wd;
    in->gpu = o->gpu != 0;
    return zpp_device_name(t->dev, in->device, sizeof in->device);
}

/* An evaluation's batches a rank, at most as many as cover the held-out
 * split once over all ranks: batch v of rank r holds windows
 * ((v W + r) B + b) mod K_val, so more batches only score the same
 * windows again (zeropp.eval_batches of 1e9 would take hours over a split
 * of a few batches). The cap is said in a note. */
static void cap_eval_batches(zpp_trainer *t) {
    const size_t K = t->info.data.val_windows;
    const size_t per = (size_t)t->info.world_size * (size_t)t->info.micro_batch;
    const size_t cap = K / per + (K % per != 0);
    t->eval_batches = t->cfg.eval_batches;
    if (cap >= 1 && (size_t)t->eval_batches > cap) {
        snprintf(t->eval_note, sizeof t->eval_note,
                 "zeropp.eval_batches %d is more than the held-out split holds: its %zu "
                 "sequences fill %zu micro-batches of %d on each of %d rank%s, so each "
                 "evaluation scores %zu a rank",
                 t->cfg.eval_batches, K, cap, t->info.micro_batch, t->info.world_size,
                 t->info.world_size == 1 ? "" : "s", cap);
        t->eval_batches = (int)cap;
    }
}

const char *zpp_trainer_eval_note(const zpp_trainer *t) { return t ? t->eval_note : ""; }

/* Device, topology, data and model; then, once every rank has them (a
 * failure on one is agreed, so that no rank waits in the engine's
 * collectives for it), the engine, through the public API. */
static zpp_status build(zpp_trainer *t, const zpp_trainer_opts *o) {
    zpp_train_config *c = &t->cfg;
    ZPP_CHECK(zpp_train_config_resolve(c, zpp_comm_world_size()));
    int hpz = 0;
    const zpp_dtype wd = c->bf16 ? ZPP_BF16 : c->fp16.enabled ? ZPP_FP16 : ZPP_FP32;
    double t0 = now_s();
    zpp_status st = build_topology(t, o, &hpz);
    double t1 = now_s();
    if (st == ZPP_OK) st = build_data_model(t, o, wd);
    ZPP_CHECK(zpp_comm_agree_world(st));
    double t2 = now_s();
    const zpp_engine_config ec = engine_config(c, hpz, wd, o->profile);
    ZPP_CHECK(zpp_engine_create(t->topo, t->model, t->dev, &ec, &t->engine)); /* agrees */
    double t3 = now_s();
    if (o->init_from) /* a Hugging Face folder, or an llm.c file */
        ZPP_CHECK(zpp_hf_is_model_dir(o->init_from) ? init_from_hf(t, o->init_from)
                                                    : init_from_llmc(t, o->init_from));
    double t4 = now_s();
    /* where the weights came from, for a checkpoint: the export's config.json
     * and tokenizer files are there */
    const char *origin = o->init_from ? o->init_from : o->origin;
    if (origin && !(t->init_from = o->init_from ? realpath(origin, NULL) : strdup(origin)))
        return zpp_error(ZPP_ERR_IO, "cannot resolve the path of %s: %s", origin,
                         strerror(errno));

    size_t bt = (size_t)c->train_micro_batch_size_per_gpu * (size_t)c->model.seq_len;
    t->tokens = malloc(bt * sizeof *t->tokens);
    t->targets = malloc(bt * sizeof *t->targets);
    if (!t->tokens || !t->targets) return zpp_error(ZPP_ERR_NOMEM, "trainer: out of memory");
    ZPP_CHECK(fill_info(t, o, hpz, wd));
    t->info.setup_ranks_s = t1 - t0;
    t->info.setup_model_s = t2 - t1;
    t->info.setup_engine_s = t3 - t2;
    t->info.setup_init_from_s = t4 - t3;
    t->info.init_on_device = t->model->ops->init_params_device != NULL;
    cap_eval_batches(t);
    /* the save hooks (trainer.h), read once; the engine's kind is ignored */
    return zpp_fault_from_env(&t->fault);
}

zpp_status zpp_trainer_create(const zpp_train_config *cfg, const zpp_trainer_opts *opts,
                              zpp_trainer **trainer_p) {
    zpp_trainer *t = calloc(1, sizeof *t);
    if (!t) return zpp_comm_agree_world(zpp_error(ZPP_ERR_NOMEM, "trainer: out of memory"));
    t->cfg = *cfg;
    t->cfg_given = *cfg;
    /* The one deadline: the world's agreements and the topology's waits. */
    zpp_comm_world_set_timeout(cfg->collective_timeout_s);
    zpp_status st = zpp_comm_agree_world(build(t, opts));
    if (st == ZPP_OK) st = make_run_id(&t->run_id);
    if (st != ZPP_OK) {
        zpp_trainer_destroy(t);
        return st;
    }
    *trainer_p = t;
    return ZPP_OK;
}

void zpp_trainer_destroy(zpp_trainer *t) {
    if (!t) return;
    zpp_error_hold(); /* teardown after a failure keeps its message */
    zpp_checkpoint_unlock(t->lock);
    zpp_engine_destroy(t->engine);
    if (t->model) t->model->ops->destroy(t->model);
    zpp_data_close(t->data);
    zpp_topo_destroy(t->topo);
    zpp_device_destroy(t->dev); /* last: everything above used it */
    free(t->tokens);
    free(t->targets);
    free(t->data_path);
    free(t->init_from);
    free(t);
    zpp_error_release();
}

const zpp_trainer_info *zpp_trainer_info_get(const zpp_trainer *t) { return &t->info; }

const char *zpp_trainer_comm_note(const zpp_trainer *t) {
    return t ? zpp_topo_note(t->topo) : "";
}

/* Micro-batch `micro` of the step into the model. Every rank reads its batch
 * here, at the same micro-step: agree, so a read that fails on one rank (a
 * data file shrinking under the run) fails every rank here rather than
 * leaving the others in a collective. */
static zpp_status train_batch(zpp_trainer *t, int micro) {
    ZPP_CHECK(zpp_comm_agree_world(zpp_data_batch(t->data, (uint64_t)t->step, micro,
                                                  t->info.world_rank, t->info.world_size,
                                                  t->tokens, t->targets)));
    return t->model->ops->set_batch(t->model, t->tokens, t->targets, t->info.micro_batch);
}

/* Validation micro-batch v of rank r is held-out batch v * world + r, so
 * the ranks together cover eval_batches * world distinct batches. */
static zpp_status val_batch(zpp_trainer *t) {
    ZPP_CHECK(zpp_comm_agree_world(
        t->eval_train ? zpp_data_train_eval_batch(t->data, t->val_index, t->info.micro_batch,
                                                  t->tokens, t->targets)
                      : zpp_data_val_batch(t->data, t->val_index, t->info.micro_batch,
                                           t->tokens, t->targets)));
    return t->model->ops->set_batch(t->model, t->tokens, t->targets, t->info.micro_batch);
}

/* One optimizer step through the public pieces: forward and backward of
 * each micro-batch, its mean loss scaled by 1/accum so that the summed
 * gradient is that of the mean over the rank's micro-batches (the
 * reduction then averages over ranks: the gradient of the global batch's
 * mean loss), then the update. */
static zpp_status engine_step(zpp_trainer *t, float lr, zpp_update_stats *stats_p) {
    const int accum = t->info.accum;
    float loss_sum = 0.0f;
    for (int a = 0; a < accum; a++) {
        float loss = 0.0f;
        ZPP_CHECK(train_batch(t, a));
        ZPP_CHECK(zpp_engine_forward(t->engine, &loss));
        ZPP_CHECK(zpp_engine_backward(t->engine, zpp_engine_loss_scale(t->engine) / (float)accum));
        loss_sum += loss;
    }
    return zpp_engine_update(t->engine, lr, loss_sum / (float)accum, stats_p);
}

zpp_status zpp_trainer_step(zpp_trainer *t, int step, zpp_trainer_step_result *r) {
    t->step = step;
    float lr = (float)zpp_train_lr(&t->cfg, step);
    double t0 = now_s();
    r->lr = lr;
    zpp_status st = engine_step(t, lr, &r->stats);
    st = zpp_comm_agree_world(st);
    double dt = now_s() - t0;
    if (st == ZPP_OK) st = zpp_comm_max_world(&dt);
    if (st == ZPP_OK) {
        r->seconds = dt;
        r->tokens_per_s = (double)t->info.global_batch * t->info.seq_len / (dt > 0 ? dt : 1e-9);
        size_t now = 0, peak = 0;
        zpp_device_mem_stats(t->dev, &now, &peak);
        r->device_peak_bytes = (double)peak;
        st = zpp_comm_max_world(&r->device_peak_bytes);
        size_t used = 0;
        if (st == ZPP_OK) st = zpp_device_driver_used(t->dev, &used);
        r->device_used_bytes = (double)used;
        r->device_live_bytes = (double)now;
        if (st == ZPP_OK) st = zpp_comm_max_world(&r->device_used_bytes);
        if (st == ZPP_OK) st = zpp_comm_max_world(&r->device_live_bytes);
    }
    /* every rank profiles or none (trainer.h) */
    r->exposed_comm_ms_max = r->stats.exposed_comm_ms;
    if (st == ZPP_OK && r->stats.profiled) st = zpp_comm_max_world(&r->exposed_comm_ms_max);
    /* a timeout is not agreed (the stalled peer cannot answer), in any of
     * the step's collectives: this rank names the step itself */
    if (st == ZPP_ERR_TIMEOUT) return zpp_error_context(st, "step %d", step + 1);
    return st;
}

zpp_status zpp_trainer_eval(zpp_trainer *t, float *val_loss_p, zpp_volume *volume_p) {
    return zpp_trainer_evaluate(t, 0, t->eval_batches, val_loss_p, volume_p);
}

zpp_status zpp_trainer_evaluate(zpp_trainer *t, int train_split, int batches, float *loss_p,
                                zpp_volume *volume_p) {
    int n = batches > 0 ? batches : 1;
    t->eval_train = train_split != 0;
    double sum = 0.0;
    zpp_volume vol;
    memset(&vol, 0, sizeof vol);
    for (int v = 0; v < n; v++) {
        float loss = 0.0f;
        t->val_index = (uint64_t)v * (uint64_t)t->info.world_size + (uint64_t)t->info.world_rank;
        zpp_status st = val_batch(t);
        if (st == ZPP_OK) st = zpp_engine_evaluate(t->engine, &loss);
        ZPP_CHECK(zpp_comm_agree_world(st));
        sum += loss;
        double cross[ZPP_STEP_PHASES], intra[ZPP_STEP_PHASES];
        zpp_engine_eval_bytes(t->engine, cross, intra);
        for (int ph = 0; ph < ZPP_STEP_PHASES; ph++) {
            vol.cross_node_bytes[ph] += cross[ph];
            vol.intra_node_bytes[ph] += intra[ph];
        }
    }
    *loss_p = (float)(sum / n);
    if (volume_p) *volume_p = vol;
    return ZPP_OK;
}

/* ---- Checkpoints (train/checkpoint.h) ----------------------------------------- */

static zpp_ckpt_meta ckpt_meta(const zpp_trainer *t, int step) {
    zpp_ckpt_meta m;
    memset(&m, 0, sizeof m);
    m.step = step;
    m.world_size = t->info.world_size;
    m.world_rank = t->info.world_rank;
    m.node_size = t->info.node_size;
    m.mode = t->info.mode;
    m.dtype = t->cfg.bf16 ? ZPP_BF16 : t->cfg.fp16.enabled ? ZPP_FP16 : ZPP_FP32;
    m.model = t->cfg.model;
    m.family = zpp_model_family_name(t->cfg.model_family);
    zpp_llama_config lc;
    const zpp_decoder_shape shape = zpp_train_config_shape(&t->cfg);
    if (t->cfg.model_family == ZPP_FAMILY_LLAMA &&
        zpp_llama_config_of_shape(&shape, &lc) == ZPP_OK) {
        /* resolved: a default and its value written out compare equal */
        m.ext.n_kv_head = lc.n_kv_head, m.ext.n_ffn = lc.n_ffn;
        m.ext.rope_theta = lc.rope_theta, m.ext.norm_eps = lc.norm_eps;
        m.ext.untied_head = lc.untied_head, m.ext.qkv_bias = lc.qkv_bias;
        m.ext.o_bias = lc.o_bias;
        m.ext.rope_factor = lc.rope_factor, m.ext.rope_low_freq_factor = lc.rope_low_freq_factor;
        m.ext.rope_high_freq_factor = lc.rope_high_freq_factor;
        m.ext.rope_original_max_pos = lc.rope_original_max_pos;
    }
    m.train_batch_size = t->cfg.train_batch_size;
    m.seed = t->cfg.seed;
    m.config = &t->cfg_given;
    m.data_path = t->data_path;
    m.data_kind = zpp_data_kind_name(t->info.data.kind);
    m.data_tokens = t->info.data.n_tokens;
    m.init_from = t->init_from;
    m.run_id = t->run_id;
    return m;
}

zpp_status zpp_trainer_check_save_dir(zpp_trainer *t, const char *dir) {
    zpp_checkpoint_unlock(t->lock);
    t->lock = NULL;
    return zpp_checkpoint_lock(dir, t->info.world_rank, t->run_id, &t->lock, t->lock_note,
                               sizeof t->lock_note);
}

const char *zpp_trainer_save_dir_note(const zpp_trainer *t) { return t->lock_note; }

uint64_t zpp_trainer_run_id(const zpp_trainer *t, int *continued_p) {
    if (continued_p) *continued_p = t->run_continued;
    return t->run_id;
}

zpp_status zpp_trainer_save(zpp_trainer *t, const char *dir, int steps_done,
                            zpp_ckpt_saved *saved) {
    zpp_ckpt_meta m = ckpt_meta(t, steps_done);
    return zpp_checkpoint_save(t->engine, &m, dir, t->cfg.keep_checkpoints, &t->fault, saved);
}

zpp_status zpp_trainer_load(zpp_trainer *t, const char *dir, int *steps_done_p) {
    zpp_ckpt_meta m = ckpt_meta(t, 0);
    uint64_t run = 0;
    zpp_status st = zpp_checkpoint_load(t->engine, &m, dir, steps_done_p, &run, t->resume_note,
                                        sizeof t->resume_note);
    if (st == ZPP_OK && run) { /* its lineage, in the lock too */
        t->run_id = run, t->run_continued = 1;
        st = zpp_comm_agree_world(zpp_checkpoint_lock_set_run(t->lock, run));
    }
    return st;
}

const char *zpp_trainer_resume_note(const zpp_trainer *t) { return t->resume_note; }

/* ---- Samples (trainer.h, train/sample.h) --------------------------------------- */

void zpp_trainer_sample_prompt(const zpp_trainer *t, int32_t *prompt, int *n_p) {
    const zpp_data_info di = zpp_data_info_get(t->data);
    int n = t->info.seq_len - 1 < ZPP_TRAINER_SAMPLE_PROMPT ? t->info.seq_len - 1
                                                            : ZPP_TRAINER_SAMPLE_PROMPT;
    if (n < 1) n = 1;
    for (int i = 0; i < n; i++) {
        prompt[i] = zpp_data_token(t->data, di.n_train + (size_t)i);
        if (prompt[i] < 0 || prompt[i] >= zpp_gpt2_real_vocab(&t->cfg.model)) {
            prompt[0] = '\n' < zpp_gpt2_real_vocab(&t->cfg.model) ? '\n' : 0;
            n = 1;
            break;
        }
    }
    *n_p = n;
}

/* zpp_sample_source's logits: one sequence through the engine. */
static zpp_status sample_logits(void *ctx, const int32_t *window, int n, float *out) {
    zpp_trainer *t = ctx;
    zpp_model *m = t->model;
    float loss = 0.0f; /* NaN: the sequence has no targets */
    zpp_status st = ZPP_OK;
    ZPP_CHECK_GOTO(m->ops->keep_logits(m, n - 1), st, agree);
    ZPP_CHECK_GOTO(m->ops->set_batch(m, window, NULL, 1), st, agree);
    ZPP_CHECK_GOTO(zpp_engine_evaluate(t->engine, &loss), st, agree);
    ZPP_CHECK_GOTO(m->ops->logits(m, out), st, agree);
    /* the draw's one failure, found here where the ranks agree on it, so no
     * rank leaves the loop while the others start the next forward */
    for (int v = 0; v < m->real_vocab_size; v++)
        if (!isfinite(out[v])) {
            st = zpp_error(ZPP_ERR_NONFINITE,
                           "sample: the logit of token %d is %g; the weights are not finite", v,
                           (double)out[v]);
            break;
        }
agree:
    return zpp_comm_agree_world(st);
}

zpp_status zpp_trainer_sample(zpp_trainer *t, const zpp_sample_opts *o, const int32_t *prompt,
                              int n_prompt, int max_new, int32_t *out) {
    zpp_model *m = t->model;
    if (!m->ops->keep_logits || !m->ops->logits)
        return zpp_comm_agree_world(
            zpp_error(ZPP_ERR_UNSUPPORTED, "sample: the model gives no logits"));
    zpp_sample_source src = {m->seq_len, m->vocab_size, m->real_vocab_size, sample_logits, t};
    zpp_status st = zpp_sample_generate(&src, o, prompt, n_prompt, max_new, NULL, NULL, out);
    (void)m->ops->keep_logits(m, -1); /* the training forwards keep nothing */
    return zpp_comm_agree_world(st);
}

zpp_status zpp_trainer_config_from_checkpoint(const char *dir, zpp_train_config *cfg,
                                              zpp_trainer_saved_run *run) {
    zpp_ckpt_manifest m;
    memset(run, 0, sizeof *run);
    ZPP_CHECK(zpp_checkpoint_read_manifest(dir, &m));
    zpp_train_config c;
    zpp_status st = ZPP_OK;
    ZPP_CHECK_GOTO(zpp_train_config_defaults(&c), st, out);
    if (m.config) {
        st = zpp_train_config_load_string(m.config, &c);
        if (st != ZPP_OK) {
            st = zpp_error_context(st, "the config saved in checkpoint %s cannot be read; "
                                       "give --config",
                                   dir);
            goto out;
        }
    } else {
        /* saved before checkpoints kept their config: what the manifest has */
        c.model = m.model;
        c.bf16 = !strcmp(m.dtype, "bf16");
        c.fp16.enabled = !strcmp(m.dtype, "fp16");
        c.train_batch_size = m.train_batch_size;
        c.seed = m.seed;
        ZPP_CHECK_GOTO(zpp_train_config_validate(&c), st, out);
    }
    if ((m.data_path && !(run->data_path = strdup(m.data_path))) ||
        (m.init_from && !(run->init_from = strdup(m.init_from)))) {
        free(run->data_path);
        run->data_path = NULL;
        st = zpp_error(ZPP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    run->step = m.step;
    run->world_size = m.world_size;
    run->has_config = m.config != NULL;
    run->has_data = m.has_data;
    *cfg = c;
out:
    zpp_ckpt_manifest_free(&m);
    return st;
}

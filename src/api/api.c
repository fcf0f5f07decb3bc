/* api/api.c — the public training API of include/zeropp.h, over the layers
 * below it.
 *
 * Thin on purpose: the public header re-declares the internal functions
 * whose signatures need nothing private (zpp_engine_forward, ...; the
 * compiler checks both declarations agree, since every internal header
 * includes zeropp.h), and this file adds only what turns public types into
 * internal ones: the device's backend picks the communication backend, a
 * zpp_model_desc becomes the engine's zpp_model (its callbacks behind the
 * model ops table), a zpp_engine_config becomes zpp_engine_opts (by the
 * option table, engine/options.h), and zpp_engine_update_stats shrinks to
 * zpp_update_stats. Every function that creates something collectively
 * agrees on its status over the world, so a bad argument on one rank fails
 * every rank instead of hanging the others. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/error.h"
#include "device/device.h"
#include "engine/engine.h"
#include "model/family.h"
#include "model/model.h"
#include "train/config.h"
#include "zeropp.h"

/* ---- Devices ------------------------------------------------------------- */

zpp_status zpp_device_create_for_rank(int gpu, zpp_device **d_p) {
    if (!d_p) return zpp_error(ZPP_ERR_INVALID, "device: d_p is required");
    if (gpu == 0) return zpp_device_create_host(d_p);
    if (gpu != 1)
        return zpp_error(ZPP_ERR_INVALID, "device: gpu must be 0 (the host) or 1, not %d", gpu);
    /* As `zeropp train --device gpu`: the launcher's local rank modulo the
     * GPUs this process sees (one when the launcher binds a GPU per rank,
     * as srun --gpus-per-task=1 does; all of the host's otherwise). */
    int local = 0, local_size = 0;
    ZPP_CHECK(zpp_comm_launch_local(&local, &local_size));
    int gpus = zpp_device_gpu_count();
    if (gpus <= 0)
        return zpp_error(ZPP_ERR_CUDA,
                         "device: no GPU is visible (or this build has no CUDA); use the "
                         "host (gpu 0) or run on a machine with NVIDIA GPUs");
    return zpp_device_create_gpu(local % gpus, d_p);
}

int zpp_device_ordinal(const zpp_device *d) { return d ? d->ordinal : -1; }

void *zpp_device_stream(const zpp_device *d) { return d ? d->stream : NULL; }

/* ---- Topology ------------------------------------------------------------- */

zpp_status zpp_topo_create(zpp_device *dev, int node_size, double timeout_s, zpp_topo **topo_p) {
    return zpp_topo_create_emulated(dev, node_size, timeout_s, 0, topo_p);
}

zpp_status zpp_topo_create_emulated(zpp_device *dev, int node_size, double timeout_s,
                                    int emulate_nodes, zpp_topo **topo_p) {
    zpp_status st = ZPP_OK;
    if (!dev || !topo_p)
        st = zpp_error(ZPP_ERR_INVALID, "topology: dev and topo_p are required");
    else if (!(timeout_s >= 0.0) || isinf(timeout_s))
        st = zpp_error(ZPP_ERR_INVALID,
                       "topology: timeout_s %g is not a finite number >= 0 (0 waits forever)",
                       timeout_s);
    zpp_comm_world_set_timeout(st == ZPP_OK ? timeout_s : 0.0);
    ZPP_CHECK(zpp_comm_agree_world(st));
    zpp_topo_opts o;
    memset(&o, 0, sizeof o);
    const int gpu = dev->mem != ZPP_MEM_HOST;
    o.backend = gpu ? ZPP_BACKEND_NCCL : ZPP_BACKEND_MPI;
    o.node_size = node_size;
    o.device = gpu ? dev : NULL;
    o.timeout_s = timeout_s;
    o.emulate_nodes = gpu && emulate_nodes;
    return zpp_topo_create_with_opts(&o, topo_p); /* agrees itself */
}

zpp_topo_info zpp_topo_info_get(const zpp_topo *t) {
    zpp_topo_info info = {0};
    if (!t) return info;
    info.world_size = t->world_size;
    info.world_rank = t->world_rank;
    info.nodes = t->nodes;
    info.node_size = t->node_size;
    info.node = t->node;
    info.local_rank = t->local_rank;
    return info;
}

const char *zpp_topo_note(const zpp_topo *t) { return t ? t->note : ""; }

/* ---- A model of the user's own ---------------------------------------------- */

/* The model ops over a zpp_model_desc: m->impl is the user_model. */
typedef struct user_model {
    zpp_model m;
    zpp_model_desc desc; /* the callbacks and `user`; its arrays point below */
    size_t *unit_numel;
    int *stage_unit;
    unsigned char *bwd_reads;
} user_model;

static user_model *um_of(zpp_model *m) { return (user_model *)m->impl; }

static zpp_status um_init_params(zpp_model *m, int unit, size_t offset, size_t count,
                                 float *out, uint64_t seed) {
    user_model *u = um_of(m);
    return u->desc.init_params(u->desc.user, unit, offset, count, out, seed);
}

/* The engine never calls set_batch (only its batch-callback helpers, which
 * the public API leaves out): a user model takes its batch in `user`. */
static zpp_status um_set_batch(zpp_model *m, const int32_t *tokens, const int32_t *targets,
                               int B) {
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "model: a model made with zpp_model_create takes its batch through its "
                     "own state, not set_batch");
}

static zpp_status um_forward(zpp_model *m, int stage, const void *params) {
    user_model *u = um_of(m);
    return u->desc.forward(u->desc.user, stage, params);
}

static float um_loss(zpp_model *m) {
    user_model *u = um_of(m);
    return u->desc.loss(u->desc.user);
}

static zpp_status um_backward(zpp_model *m, int stage, const void *params, void *grads,
                              float loss_scale) {
    user_model *u = um_of(m);
    return u->desc.backward(u->desc.user, stage, params, grads, loss_scale);
}

static void um_destroy(zpp_model *m) {
    user_model *u = um_of(m);
    if (u->desc.destroy) u->desc.destroy(u->desc.user);
    free(u->unit_numel);
    free(u->stage_unit);
    free(u->bwd_reads);
    free(u);
}

static const zpp_model_ops kUserModelOps = {
    .init_params = um_init_params,
    .set_batch = um_set_batch,
    .forward = um_forward,
    .loss = um_loss,
    .backward = um_backward,
    .destroy = um_destroy,
};

/* One message per mistake, naming the field. */
static zpp_status check_desc(const zpp_model_desc *d) {
    if (!d->init_params || !d->forward || !d->loss || !d->backward)
        return zpp_error(ZPP_ERR_INVALID,
                         "model: the callbacks init_params, forward, loss and backward are "
                         "required (%s is NULL)",
                         !d->init_params ? "init_params"
                         : !d->forward   ? "forward"
                         : !d->loss      ? "loss"
                                         : "backward");
    if (d->n_units < 1 || !d->unit_numel)
        return zpp_error(ZPP_ERR_INVALID,
                         "model: n_units is %d; a model needs at least one unit and its "
                         "unit_numel array",
                         d->n_units);
    if (d->n_stages < 1 || !d->stage_unit)
        return zpp_error(ZPP_ERR_INVALID,
                         "model: n_stages is %d; a model needs at least one stage and its "
                         "stage_unit array",
                         d->n_stages);
    if (d->param_dtype != ZPP_FP32 && d->param_dtype != ZPP_BF16 && d->param_dtype != ZPP_FP16)
        return zpp_error(ZPP_ERR_INVALID,
                         "model: param_dtype %d is not ZPP_FP32, ZPP_BF16 or ZPP_FP16",
                         (int)d->param_dtype);
    for (int u = 0; u < d->n_units; u++)
        if (d->unit_numel[u] == 0)
            return zpp_error(ZPP_ERR_INVALID,
                             "model: unit %d has no elements; every unit needs at least one",
                             u);
    for (int s = 0; s < d->n_stages; s++)
        if (d->stage_unit[s] < 0 || d->stage_unit[s] >= d->n_units)
            return zpp_error(ZPP_ERR_INVALID,
                             "model: stage_unit[%d] is %d, outside the %d units [0, %d)", s,
                             d->stage_unit[s], d->n_units, d->n_units);
    for (int u = 0; u < d->n_units; u++) {
        int used = 0;
        for (int s = 0; s < d->n_stages && !used; s++) used = d->stage_unit[s] == u;
        if (!used)
            return zpp_error(ZPP_ERR_INVALID,
                             "model: no stage uses unit %d, so it would never be trained; "
                             "drop it or name it in stage_unit",
                             u);
    }
    return ZPP_OK;
}

zpp_status zpp_model_create(const zpp_model_desc *desc, zpp_device *dev, zpp_model **model_p) {
    if (!desc || !dev || !model_p)
        return zpp_error(ZPP_ERR_INVALID, "model: desc, dev and model_p are required");
    ZPP_CHECK(check_desc(desc));
    user_model *u = calloc(1, sizeof *u);
    if (!u) return zpp_error(ZPP_ERR_NOMEM, "model: out of memory");
    u->desc = *desc;
    u->unit_numel = malloc((size_t)desc->n_units * sizeof *u->unit_numel);
    u->stage_unit = malloc((size_t)desc->n_stages * sizeof *u->stage_unit);
    u->bwd_reads = malloc((size_t)desc->n_stages);
    if (!u->unit_numel || !u->stage_unit || !u->bwd_reads) {
        u->desc.destroy = NULL; /* the user's state is not ours to free yet */
        um_destroy(&u->m);
        return zpp_error(ZPP_ERR_NOMEM, "model: out of memory");
    }
    memcpy(u->unit_numel, desc->unit_numel, (size_t)desc->n_units * sizeof *u->unit_numel);
    memcpy(u->stage_unit, desc->stage_unit, (size_t)desc->n_stages * sizeof *u->stage_unit);
    for (int s = 0; s < desc->n_stages; s++)
        u->bwd_reads[s] = desc->bwd_reads_params ? (desc->bwd_reads_params[s] != 0) : 1;
    u->m.ops = &kUserModelOps;
    u->m.mem = dev->mem;
    u->m.param_dtype = desc->param_dtype;
    u->m.n_units = desc->n_units;
    u->m.unit_numel = u->unit_numel;
    u->m.n_stages = desc->n_stages;
    u->m.stage_unit = u->stage_unit;
    u->m.bwd_reads_params = u->bwd_reads;
    u->m.impl = u;
    *model_p = &u->m;
    return ZPP_OK;
}

void zpp_model_destroy(zpp_model *model) {
    if (model) model->ops->destroy(model);
}

/* ---- Built-in decoders --------------------------------------------------------- */

/* The JSON object `model_json` as a whole config, {"model": ...}, read by
 * the config's one key table (train/config.h): its defaults, names, ranges
 * and family checks, so the API takes exactly the keys a config file does. */
static zpp_status model_config_of(const char *model_json, zpp_train_config *cfg) {
    cJSON *model = cJSON_Parse(model_json);
    if (!cJSON_IsObject(model)) {
        cJSON_Delete(model);
        return zpp_error(ZPP_ERR_CONFIG,
                         "model config: not a JSON object; give the \"model\" section of a "
                         "config, e.g. {\"family\": \"llama\", \"n_layer\": 2}");
    }
    cJSON *root = cJSON_CreateObject();
    char *text = NULL;
    if (root && cJSON_AddItemToObject(root, "model", model)) {
        model = NULL; /* root owns it */
        text = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(model);
    cJSON_Delete(root);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "model config: out of memory");
    zpp_status st = zpp_train_config_defaults(cfg);
    if (st == ZPP_OK) st = zpp_train_config_load_string(text, cfg);
    cJSON_free(text);
    return st;
}

zpp_status zpp_model_create_decoder(const char *model_json, zpp_dtype param_dtype,
                                    int max_batch, zpp_device *dev, zpp_model **model_p) {
    if (!model_json || !dev || !model_p)
        return zpp_error(ZPP_ERR_INVALID, "model: model_json, dev and model_p are required");
    if (max_batch < 1)
        return zpp_error(ZPP_ERR_INVALID, "model: max_batch %d; give 1 or more sequences",
                         max_batch);
    zpp_train_config cfg;
    ZPP_CHECK(model_config_of(model_json, &cfg));
    const zpp_decoder_shape shape = zpp_train_config_shape(&cfg);
    return zpp_model_family_create(zpp_model_family_name(cfg.model_family), &shape,
                                   param_dtype, max_batch, dev, model_p);
}

zpp_status zpp_model_set_batch(zpp_model *model, const int32_t *tokens, const int32_t *targets,
                               int B) {
    if (!model || !tokens)
        return zpp_error(ZPP_ERR_INVALID, "model: set_batch needs the model and its tokens");
    return model->ops->set_batch(model, tokens, targets, B);
}

/* ---- The engine ---------------------------------------------------------------- */

/* The names of the eight combinations, indexed by the mode bits. */
static const char *const kModeNames[8] = {"zero3",   "qwz",     "hpz",     "qwz+hpz",
                                          "qgz",     "qwz+qgz", "hpz+qgz", "zeropp"};

const char *zpp_mode_name(int mode) {
    return mode >= 0 && mode <= ZPP_MODE_ZEROPP ? kModeNames[mode] : "?";
}

zpp_status zpp_mode_parse(const char *name, int *mode_p) {
    if (!name || !mode_p) return zpp_error(ZPP_ERR_INVALID, "mode: name and mode_p are required");
    if (!strcmp(name, "zero3") || !strcmp(name, "zeropp")) {
        *mode_p = name[4] == '3' ? ZPP_MODE_ZERO3 : ZPP_MODE_ZEROPP;
        return ZPP_OK;
    }
    int mode = 0;
    const char *p = name;
    for (;;) {
        size_t len = strcspn(p, "+");
        int bit = len == 3 && !strncmp(p, "qwz", 3)   ? ZPP_MODE_QWZ
                  : len == 3 && !strncmp(p, "hpz", 3) ? ZPP_MODE_HPZ
                  : len == 3 && !strncmp(p, "qgz", 3) ? ZPP_MODE_QGZ
                                                      : 0;
        if (!bit || (mode & bit))
            return zpp_error(ZPP_ERR_INVALID,
                             "mode: '%s' is not a mode; use zero3, zeropp, or a '+'-joined "
                             "list of qwz, hpz and qgz, each once (qwz+hpz)",
                             name);
        mode |= bit;
        if (!p[len]) break;
        p += len + 1;
    }
    *mode_p = mode;
    return ZPP_OK;
}

zpp_engine_config zpp_engine_config_default(void) {
    zpp_engine_config c;
    memset(&c, 0, sizeof c);
    c.mode = ZPP_MODE_ZERO3;
    zpp_coll_opts coll = zpp_coll_opts_default();
    c.weight_quant = coll.weight_spec;
    c.grad_quant = coll.grad_spec;
#define ZPP_EOPT_SET_(name, type, def, check, lo, hi, when, range) c.name = (type)(def);
    ZPP_ENGINE_OPTIONS(ZPP_EOPT_SET_)
#undef ZPP_EOPT_SET_
    return c;
}

static int finite_in(float x, float lo, float hi) { return isfinite(x) && x >= lo && x <= hi; }

/* The public config as the engine's options: the mode bits, the specs, and
 * every option of the table by its one name; then the one range check
 * (zpp_engine_create_with_opts makes it again, after the ranks agree on this one). */
static zpp_status engine_opts_from(const zpp_engine_config *c, zpp_engine_opts *o) {
    if (c->mode < 0 || c->mode > ZPP_MODE_ZEROPP)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: mode %d has bits other than ZPP_MODE_QWZ, ZPP_MODE_HPZ and "
                         "ZPP_MODE_QGZ",
                         c->mode);
    *o = zpp_engine_opts_default();
    o->gather = (c->mode & ZPP_MODE_QWZ) ? ZPP_GATHER_QWZ : ZPP_GATHER_BASELINE;
    o->hpz = (c->mode & ZPP_MODE_HPZ) != 0;
    o->reduce = (c->mode & ZPP_MODE_QGZ) ? ZPP_REDUCE_QGZ : ZPP_REDUCE_BASELINE;
    o->coll.weight_spec = c->weight_quant;
    o->coll.grad_spec = c->grad_quant;
#define ZPP_EOPT_COPY_(name, type, def, check, lo, hi, when, range) o->name = c->name;
    ZPP_ENGINE_OPTIONS(ZPP_EOPT_COPY_)
#undef ZPP_EOPT_COPY_
    return zpp_engine_opts_check(o);
}

zpp_status zpp_engine_create(zpp_topo *topo, zpp_model *model, zpp_device *dev,
                             const zpp_engine_config *cfg, zpp_engine **engine_p) {
    zpp_engine_opts o = zpp_engine_opts_default();
    zpp_status st = ZPP_OK;
    if (!topo || !model || !dev || !cfg || !engine_p)
        st = zpp_error(ZPP_ERR_INVALID,
                       "engine: topology, model, device, config and engine_p are required");
    else
        st = engine_opts_from(cfg, &o);
    ZPP_CHECK(zpp_comm_agree_world(st));
    zpp_engine *e = NULL;
    st = zpp_engine_create_with_opts(topo, model, &o, dev, &e);
    st = zpp_comm_agree_world(st);
    if (st != ZPP_OK) {
        zpp_engine_destroy(e);
        return st;
    }
    *engine_p = e;
    return ZPP_OK;
}

/* The public phases are the internal ones, in their order. */
_Static_assert(ZPP_STEP_PHASES == ZPP_PHASE_COUNT && ZPP_PHASE_FWD_GATHER == 0 &&
                   ZPP_PHASE_BWD_GATHER == 1 && ZPP_PHASE_GRAD_REDUCE == 2 &&
                   ZPP_PHASE_OTHER == 3,
               "zeropp.h's ZPP_STEP_PHASES order is collectives.h's zpp_phase");

static void volume_by_phase(const zpp_volume *v, double *cross, double *intra) {
    for (int ph = 0; ph < ZPP_STEP_PHASES; ph++) {
        cross[ph] = v->cross_node_bytes[ph];
        intra[ph] = v->intra_node_bytes[ph];
    }
}

zpp_status zpp_engine_update(zpp_engine *e, float lr, float loss, zpp_update_stats *stats_p) {
    zpp_status st = ZPP_OK;
    if (!e) st = zpp_error(ZPP_ERR_INVALID, "engine: update without an engine");
    else if (!finite_in(lr, 0.0f, INFINITY))
        st = zpp_error(ZPP_ERR_INVALID, "engine: learning rate %g must be finite and >= 0",
                       (double)lr);
    ZPP_CHECK(zpp_comm_agree_world(st));
    zpp_engine_update_stats s;
    memset(&s, 0, sizeof s);
    ZPP_CHECK(zpp_engine_update_with_stats(e, lr, loss, &s));
    if (stats_p) {
        memset(stats_p, 0, sizeof *stats_p);
        stats_p->loss = s.loss;
        stats_p->grad_norm = s.grad_norm;
        stats_p->skipped = s.skipped;
        stats_p->skipped_total = s.skipped_total;
        stats_p->loss_scale = s.loss_scale;
        stats_p->cross_node_bytes = zpp_volume_cross_total(&s.volume);
        stats_p->intra_node_bytes = zpp_volume_intra_total(&s.volume);
        volume_by_phase(&s.volume, stats_p->cross_node_phase_bytes,
                        stats_p->intra_node_phase_bytes);
        stats_p->profiled = s.profile.valid;
        stats_p->stream_ms = s.profile.stream_ms;
        stats_p->compute_ms = s.profile.compute_ms;
        stats_p->exposed_comm_ms = s.profile.exposed_comm_ms;
        stats_p->profile_waits = s.profile.waits;
        stats_p->param_sumsq = s.param_sumsq;
    }
    return ZPP_OK;
}

/* The batch is already in the model's state. */
static zpp_status batch_in_place(void *ctx, int micro, zpp_model *model) { return ZPP_OK; }

zpp_status zpp_engine_evaluate(zpp_engine *e, float *loss_p) {
    if (!e || !loss_p) return zpp_error(ZPP_ERR_INVALID, "engine: engine and loss_p are required");
    return zpp_engine_evaluate_with_batch(e, batch_in_place, NULL, loss_p);
}

void zpp_engine_eval_bytes(const zpp_engine *e, double cross_node[ZPP_STEP_PHASES],
                           double intra_node[ZPP_STEP_PHASES]) {
    if (!e || !cross_node || !intra_node) return;
    volume_by_phase(zpp_engine_eval_volume(e), cross_node, intra_node);
}

/* engine/units.c — each unit's memory on this rank: its fp32 master and
 * moments, its gradient accumulator (and that accumulator's dtype), the
 * hpZ secondary shard, the LoCo buffers, their initial values, and the
 * resident working-dtype copy of world 1 (engine_internal.h). */
#include <stdlib.h>

#include "core/arena.h"
#include "core/error.h"
#include "device/device.h"
#include "engine/engine_internal.h"

/* Initial values of this rank's slice [r * shard_len, ...) of the unit,
 * clipped to the real elements, into its fp32 master shard; the padding
 * stays zero forever (its gradients are zero and AdamW maps 0 to 0). A
 * model that draws them on its device (init_params_device) writes them in
 * place; otherwise they are drawn into host memory and copied. Either way
 * each value is a pure function of (seed, unit, index): the same bits. */
static zpp_status init_master(zpp_engine *e, unit_state *u, int index) {
    const zpp_partition *p = &u->part;
    size_t fbytes = p->shard_len * sizeof(float);
    size_t begin = (size_t)e->topo->world_rank * p->shard_len;
    size_t count = begin < p->numel ? p->numel - begin : 0;
    if (count > p->shard_len) count = p->shard_len;
    const zpp_model_ops *ops = e->model->ops;
    if (ops->init_params_device) {
        if (count < p->shard_len)
            ZPP_CHECK(zpp_device_set(e->dev, u->master + count, 0, fbytes - count * sizeof(float)));
        if (!count) return ZPP_OK;
        return ops->init_params_device(e->model, index, begin, count, u->master, e->opts.seed);
    }
    float *host = calloc(p->shard_len ? p->shard_len : 1, sizeof(float));
    if (!host) return zpp_error(ZPP_ERR_NOMEM, "engine: no memory to initialise unit %d", index);
    zpp_status st = ZPP_OK;
    if (count) st = ops->init_params(e->model, index, begin, count, host, e->opts.seed);
    /* The copy must land before `host` is freed: a copy from host memory
     * has read its source when it returns. */
    if (st == ZPP_OK) st = zpp_device_copy(e->dev, u->master, host, fbytes);
    free(host);
    return st;
}

zpp_status engine_grad_mode(zpp_engine *e) {
    zpp_model *m = e->model;
    e->grad_dtype = ZPP_FP32;
    e->overwrites = engine_alone(e) && m->ops->overwrite_grads != NULL;
    const int work = e->opts.work_grads && engine_alone(e) && e->opts.work_dtype == ZPP_BF16;
    if (!m->ops->set_grad_dtype) return ZPP_OK;
    zpp_status st = m->ops->set_grad_dtype(m, work ? ZPP_BF16 : ZPP_FP32);
    if (st == ZPP_OK && work) e->grad_dtype = ZPP_BF16;
    if (st == ZPP_ERR_UNSUPPORTED && work) /* the model writes fp32 only */
        return m->ops->set_grad_dtype(m, ZPP_FP32);
    return st;
}

/* ---- The persistent buffers: one allocation -------------------------------
 * Every unit's master, moments, accumulator, hpZ secondary shard, LoCo
 * buffers and resident copy are carved from one device allocation by an
 * arena (core/arena.h), each on a 256-byte boundary (what the vector
 * kernels and cuBLASLt like), rather than allocated one by one. The CUDA
 * driver hands out memory in 2 MiB pages, so a buffer of its own holds its
 * last page whole: with GPT 1.31B's 25 units of five buffers each, each
 * about 2 MiB short of a page boundary (a layer's 50,358,272 fp32 elements
 * are 96.05 pages), that was about 230 MiB that nvidia-smi counted and
 * nothing used (245 MiB less with one allocation, measured: RESULTS). One
 * allocation wastes at most one page. */

/* Whether the resident copies apply (world 1, plain gather, no hpZ:
 * engine_resident_use). */
static int resident_wanted(const zpp_engine *e) {
    const zpp_engine_opts *o = &e->opts;
    return o->resident_weights && engine_alone(e) && o->gather == ZPP_GATHER_BASELINE && !o->hpz;
}

/* Points every unit's buffers into the arena (core/arena.h: pass 1 with
 * base NULL counts, pass 2 hands out). */
static void carve_units(zpp_engine *e, zpp_arena *a) {
    const int resident = resident_wanted(e);
    const size_t ws = zpp_dtype_size(e->opts.work_dtype);
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        const zpp_partition *p = &u->part;
        u->master = zpp_arena_take(a, p->shard_len, 1);
        u->m = zpp_arena_take(a, p->shard_len, 1);
        u->v = zpp_arena_take(a, p->shard_len, 1);
        u->grad_acc = zpp_arena_take_bytes(a, p->shard_len, 1, zpp_dtype_size(e->grad_dtype));
        if (e->opts.hpz) u->secondary = zpp_arena_take_bytes(a, p->sec_len, 1, ws);
        if (e->opts.loco) {
            zpp_qgz_feedback_lens(p, e->topo->nodes, e->topo->node_size, &u->ef_intra_len,
                                  &u->ef_inter_len);
            u->ef_intra = zpp_arena_take(a, u->ef_intra_len, 1);
            if (u->ef_inter_len) u->ef_inter = zpp_arena_take(a, u->ef_inter_len, 1);
        }
        if (resident) {
            u->resident = zpp_arena_take_bytes(a, u->part.padded, 1, ws);
            u->resident_valid = 0; /* rounded from the master at its first use */
        }
    }
}

/* What to do when the one allocation does not fit: it holds this rank's
 * share of the master weights, moments and gradients (and at world 1 the
 * resident copy), so more ranks shrink it, and so does dropping the copy. */
static zpp_status units_nomem_hint(const zpp_engine *e, zpp_status st) {
    return zpp_error_append(
        st, "(the engine's one buffer: this rank's share of the parameters, gradients and "
            "optimizer state). Spread the model over more ranks%s; `zeropp plan --pick "
            "--mem-gb G` says what fits a GPU of G GB",
        resident_wanted(e) ? ", or set zero_optimization.zeropp_resident_weights to false "
                             "(2 bytes a parameter less)"
                           : "");
}

zpp_status engine_units_alloc(zpp_engine *e) {
    zpp_arena a = {NULL, 0, 64, 0}; /* 64 floats: 256-byte boundaries */
    carve_units(e, &a);
    if (a.overflow)
        return zpp_error(ZPP_ERR_NOMEM, "engine: the units' buffers on this rank overflow "
                         "size_t; use more ranks or a smaller model");
    void *slab = NULL;
    zpp_status st = zpp_device_alloc(e->dev, a.used ? a.used * sizeof(float) : 256, &slab);
    if (st == ZPP_ERR_NOMEM)
        return units_nomem_hint(e, st);
    ZPP_CHECK(st);
    e->unit_slab = slab;
    a = (zpp_arena){slab, 0, 64, 0};
    carve_units(e, &a);
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        const size_t fbytes = u->part.shard_len * sizeof(float);
        ZPP_CHECK(init_master(e, u, i));
        ZPP_CHECK(zpp_device_set(e->dev, u->m, 0, fbytes));
        ZPP_CHECK(zpp_device_set(e->dev, u->v, 0, fbytes));
        if (u->ef_intra)
            ZPP_CHECK(zpp_device_set(e->dev, u->ef_intra, 0, u->ef_intra_len * sizeof(float)));
        if (u->ef_inter)
            ZPP_CHECK(zpp_device_set(e->dev, u->ef_inter, 0, u->ef_inter_len * sizeof(float)));
        ZPP_CHECK(zpp_device_set(e->dev, u->grad_acc, 0,
                                 engine_grad_bytes(e, u->part.shard_len)));
    }
    return ZPP_OK;
}

void engine_units_free(zpp_engine *e) {
    zpp_device_free(e->dev, e->unit_slab);
    e->unit_slab = NULL;
}

/* ---- Resident weights (opts.resident_weights) -------------------------------
 * At world 1 a "gather" is a rounding of the fp32 master into the working
 * dtype, done for the forward and again for the backward: 6 bytes an
 * element each time (4 read, 2 written), 12 a step, where AdamW could write
 * the rounded copy as it writes the master (2 bytes, in the pass it makes
 * anyway). Keeping that copy costs its 2 bytes an element of memory; the
 * weights the model reads are the same bits (the same rounding of the same
 * master). Only at world 1 with the plain gather: qwZ's int8 rendering and
 * hpZ's secondary shards are made at gather time from the master. The copy
 * is carved with the unit's other buffers (carve_units). */

/* Makes the resident copy of unit ui the gathered unit, rounding the master
 * into it first when it is stale (after init or a checkpoint's masters). At
 * world 1 the shard is the whole padded unit, its padding zero. */
zpp_status engine_resident_use(zpp_engine *e, int ui) {
    unit_state *u = &e->units[ui];
    if (!u->resident_valid) {
        ZPP_CHECK(zpp_device_convert(e->dev, u->master, ZPP_FP32, u->resident,
                                     e->opts.work_dtype, u->part.shard_len, 1.0f));
        u->resident_valid = 1;
    }
    u->full = u->resident;
    return ZPP_OK;
}

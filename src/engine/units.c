/* engine/units.c — each unit's memory on this rank: its fp32 master and
 * moments, its gradient accumulator (and that accumulator's dtype), the
 * hpZ secondary shard, the LoCo buffers, their initial values, and the
 * resident working-dtype copy of world 1 (engine_internal.h). */
#include <stdlib.h>

#include "core/arena.h"
#include "core/error.h"
#include "device/device.h"
#include "engine/engine_internal.h"

/* ---- Split masters ---------------------------------------------------------
 * At world 1 in bf16 with the resident copy (resident_wanted), the fp32
 * master is not an array of its own: the resident bf16 copy is its high
 * half, rounded, and master_lo its low 16 bits (core/dtype.h, zpp_split_*).
 * The value is the same bit for bit, and so is every step: AdamW joins the
 * halves, updates in fp32 and splits the result (device.h, master_lo), and
 * the working copy is the rounding it always was (zpp_split_hi, which every
 * bf16 rounding of a master in the engine uses, engine_round_masters). A
 * master and its working copy take 4 bytes an element instead of 6, and
 * AdamW moves 26 bytes an element instead of 28. Reading or setting the
 * masters (checkpoints, initial values) goes through a bounded fp32
 * staging buffer, allocated for the call. */
enum { kStageFloats = 1 << 22 }; /* 16 MiB */

/* Whether the resident copies apply (world 1, plain gather, no hpZ:
 * engine_resident_use). */
static int resident_wanted(const zpp_engine *e) {
    const zpp_engine_opts *o = &e->opts;
    return o->resident_weights && engine_alone(e) && o->gather == ZPP_GATHER_BASELINE && !o->hpz;
}

static int split_wanted(const zpp_engine *e) {
    return resident_wanted(e) && e->opts.work_dtype == ZPP_BF16;
}

zpp_status engine_round_masters(zpp_engine *e, const float *master, void *out, size_t n) {
    if (e->opts.work_dtype == ZPP_BF16)
        return zpp_device_master_split(e->dev, master, out, NULL, n);
    return zpp_device_convert(e->dev, master, ZPP_FP32, out, e->opts.work_dtype, n, 1.0f);
}

/* The high halves of unit u's split master, as bf16 elements. */
static uint16_t *split_hi_of(unit_state *u) { return (uint16_t *)u->resident; }

/* n initial values of unit `index` from its element `begin` into device
 * memory dst: drawn there by a model that draws on its device
 * (init_params_device), else into host memory and copied. Either way each
 * value is a pure function of (seed, unit, index): the same bits. */
static zpp_status draw_init(zpp_engine *e, int index, size_t begin, size_t n, float *dst) {
    const zpp_model_ops *ops = e->model->ops;
    if (ops->init_params_device)
        return ops->init_params_device(e->model, index, begin, n, dst, e->opts.seed);
    float *host = malloc(n * sizeof(float));
    if (!host) return zpp_error(ZPP_ERR_NOMEM, "engine: no memory to initialise unit %d", index);
    zpp_status st = ops->init_params(e->model, index, begin, n, host, e->opts.seed);
    /* The copy must land before `host` is freed: a copy from host memory
     * has read its source when it returns. */
    if (st == ZPP_OK) st = zpp_device_copy(e->dev, dst, host, n * sizeof(float));
    free(host);
    return st;
}

/* What split_pass does with each piece of a split master. */
typedef enum split_op {
    SPLIT_GET,   /* joined into io (fp32, host or device memory) */
    SPLIT_SET,   /* split from io */
    SPLIT_INIT,  /* split from the initial values of elements `begin` on */
    SPLIT_SUMSQ  /* joined, its squares summed into *sq_p */
} split_op;

/* Elements [from, from + n) of unit ui's split master, a piece at a time
 * through an fp32 staging buffer of device memory (at most kStageFloats,
 * allocated for the call): the masters' fp32 form exists only there. */
static zpp_status split_pass(zpp_engine *e, int ui, split_op op, size_t from, size_t n,
                             float *io, size_t begin, double *sq_p) {
    unit_state *u = &e->units[ui];
    const size_t cap = n < kStageFloats ? n : kStageFloats;
    float *stage = NULL;
    ZPP_CHECK(zpp_device_alloc(e->dev, (cap ? cap : 1) * sizeof(float), (void **)&stage));
    zpp_status st = ZPP_OK;
    double sq = 0.0, part = 0.0;
    for (size_t off = 0; off < n && st == ZPP_OK; off += cap) {
        const size_t c = n - off < cap ? n - off : cap;
        uint16_t *hi = split_hi_of(u) + from + off, *lo = u->master_lo + from + off;
        if (op == SPLIT_GET || op == SPLIT_SUMSQ) {
            st = zpp_device_master_join(e->dev, hi, lo, stage, c);
            if (st == ZPP_OK && op == SPLIT_GET)
                st = zpp_device_copy(e->dev, io + off, stage, c * sizeof(float));
            if (st == ZPP_OK && op == SPLIT_SUMSQ) {
                st = zpp_device_sumsq(e->dev, stage, c, &part);
                sq += part;
            }
            continue;
        }
        st = op == SPLIT_SET ? zpp_device_copy(e->dev, stage, io + off, c * sizeof(float))
                             : draw_init(e, ui, begin + off, c, stage);
        if (st == ZPP_OK) st = zpp_device_master_split(e->dev, stage, hi, lo, c);
    }
    zpp_device_free(e->dev, stage);
    if (sq_p) *sq_p = sq;
    return st;
}

zpp_status engine_master_get(zpp_engine *e, int ui, size_t from, size_t n, float *out) {
    unit_state *u = &e->units[ui];
    if (!u->master_lo) return zpp_device_copy(e->dev, out, u->master + from, n * sizeof(float));
    return split_pass(e, ui, SPLIT_GET, from, n, out, 0, NULL);
}

zpp_status engine_master_set(zpp_engine *e, int ui, size_t from, size_t n, const float *in) {
    unit_state *u = &e->units[ui];
    if (!u->master_lo) {
        u->resident_valid = 0; /* rounded again at its next use */
        return zpp_device_copy(e->dev, u->master + from, in, n * sizeof(float));
    }
    return split_pass(e, ui, SPLIT_SET, from, n, (float *)in, 0, NULL); /* read only */
}

zpp_status engine_master_zero(zpp_engine *e, int ui, size_t from, size_t n) {
    unit_state *u = &e->units[ui];
    if (!u->master_lo) {
        u->resident_valid = 0;
        return zpp_device_set(e->dev, u->master + from, 0, n * sizeof(float));
    }
    /* bf16 +0 and low halves 0: the fp32 +0 */
    ZPP_CHECK(zpp_device_set(e->dev, split_hi_of(u) + from, 0, n * sizeof(uint16_t)));
    return zpp_device_set(e->dev, u->master_lo + from, 0, n * sizeof(uint16_t));
}

zpp_status engine_master_sumsq(zpp_engine *e, int ui, double *sq_p) {
    unit_state *u = &e->units[ui];
    const size_t n = u->part.shard_len;
    if (!u->master_lo) return zpp_device_sumsq(e->dev, u->master, n, sq_p);
    return split_pass(e, ui, SPLIT_SUMSQ, 0, n, NULL, 0, sq_p);
}

/* Initial values of this rank's slice [r * shard_len, ...) of the unit,
 * clipped to the real elements, into its master shard (fp32, or split
 * through a staging buffer); the padding stays zero forever (its gradients
 * are zero and AdamW maps 0 to 0). */
static zpp_status init_master(zpp_engine *e, unit_state *u, int index) {
    const zpp_partition *p = &u->part;
    size_t begin = (size_t)e->topo->world_rank * p->shard_len;
    size_t count = begin < p->numel ? p->numel - begin : 0;
    if (count > p->shard_len) count = p->shard_len;
    if (count < p->shard_len) ZPP_CHECK(engine_master_zero(e, index, count, p->shard_len - count));
    if (!count) return ZPP_OK;
    if (!u->master_lo) return draw_init(e, index, begin, count, u->master);
    u->resident_valid = 1; /* the high halves are written with the low ones */
    return split_pass(e, index, SPLIT_INIT, 0, count, NULL, begin, NULL);
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

/* Points every unit's buffers into the arena (core/arena.h: pass 1 with
 * base NULL counts, pass 2 hands out). */
static void carve_units(zpp_engine *e, zpp_arena *a) {
    const int resident = resident_wanted(e), split = split_wanted(e);
    const size_t ws = zpp_dtype_size(e->opts.work_dtype);
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        const zpp_partition *p = &u->part;
        if (split)
            u->master_lo = zpp_arena_take_bytes(a, p->shard_len, 1, sizeof(uint16_t));
        else
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
 * resident copy), so more ranks shrink it, and so does dropping a copy
 * that is not the master's own high half. */
static zpp_status units_nomem_hint(const zpp_engine *e, zpp_status st) {
    return zpp_error_append(
        st, "(the engine's one buffer: this rank's share of the parameters, gradients and "
            "optimizer state). Spread the model over more ranks%s; `zeropp plan --pick "
            "--mem-gb G` says what fits a GPU of G GB",
        resident_wanted(e) && !split_wanted(e)
            ? ", or set zero_optimization.zeropp_resident_weights to false (2 or 4 bytes a "
              "parameter less)"
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
 * anyway). In bf16 that copy is the split master's high half (above) and
 * costs no memory; in fp16 and fp32 it costs its 2 or 4 bytes an element.
 * The weights the model reads are the same bits (the same rounding of the
 * same master). Only at world 1 with the plain gather: qwZ's int8
 * rendering and hpZ's secondary shards are made at gather time from the
 * master. The copy is carved with the unit's other buffers (carve_units). */

/* Makes the resident copy of unit ui the gathered unit, rounding the master
 * into it first when it is stale (after init or a checkpoint's masters). At
 * world 1 the shard is the whole padded unit, its padding zero. */
zpp_status engine_resident_use(zpp_engine *e, int ui) {
    unit_state *u = &e->units[ui];
    if (!u->resident_valid) { /* never so for a split master: it is its high half */
        ZPP_CHECK(engine_round_masters(e, u->master, u->resident, u->part.shard_len));
        u->resident_valid = 1;
    }
    u->full = u->resident;
    return ZPP_OK;
}

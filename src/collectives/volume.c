/* collectives/volume.c — the volume formulas of DESIGN.md §5, and the plan of
 * a training step built from them.
 *
 * The live collectives (collectives.c) record every backend call through
 * zpp_volume_add_call; `zeropp plan` and `zeropp bench comm` replay the same
 * calls through the zpp_plan_* functions below without running them, so
 * there is one definition of what a call costs. The formulas and the intra
 * rule are documented in collectives.h. */
#include <string.h>

#include "collectives/collectives.h"
#include "core/error.h"

const char *zpp_phase_name(zpp_phase phase) {
    switch (phase) {
    case ZPP_PHASE_FWD_GATHER: return "fwd_gather";
    case ZPP_PHASE_BWD_GATHER: return "bwd_gather";
    case ZPP_PHASE_GRAD_REDUCE: return "grad_reduce";
    case ZPP_PHASE_OTHER: return "other";
    default: return "unknown";
    }
}

double zpp_volume_cross_total(const zpp_volume *v) {
    double t = 0;
    for (int i = 0; i < ZPP_PHASE_COUNT; i++) t += v->cross_node_bytes[i];
    return t;
}

double zpp_volume_intra_total(const zpp_volume *v) {
    double t = 0;
    for (int i = 0; i < ZPP_PHASE_COUNT; i++) t += v->intra_node_bytes[i];
    return t;
}

zpp_group_shape zpp_group_world(int nodes, int node_size) {
    zpp_group_shape g = {nodes, node_size, 1};
    return g;
}

zpp_group_shape zpp_group_intra(int node_size) {
    zpp_group_shape g = {1, node_size, 1};
    return g;
}

zpp_group_shape zpp_group_inter(int nodes, int node_size) {
    zpp_group_shape g = {nodes, 1, node_size};
    return g;
}

void zpp_volume_add_call(zpp_volume *v, zpp_phase phase, zpp_call_kind kind,
                         const zpp_group_shape *g, size_t bytes) {
    if ((unsigned)phase >= ZPP_PHASE_COUNT) phase = ZPP_PHASE_OTHER;
    /* Doubles hold byte counts exactly up to 2^53 (8 PiB); the products below
     * stay integers except the all-reduce and broadcast (N-1)/N factors. */
    double N = g->nodes, R = g->ranks_per_node, I = g->groups_per_node;
    double b = (double)bytes, cross = 0, intra = 0, payload = 0;
    switch (kind) {
    case ZPP_CALL_ALLGATHER:
    case ZPP_CALL_REDUCE_SCATTER: {
        double P = N * R * b; /* full output (all-gather) / input (reduce-scatter) */
        cross = I * (N - 1) * R * b; /* = (N-1)/N * P, kept integral */
        intra = I * (R - 1) * P;
        payload = kind == ZPP_CALL_ALLGATHER ? b : P;
        break;
    }
    case ZPP_CALL_ALLTOALL:
        cross = I * R * ((N - 1) * R) * b;
        intra = I * R * (R - 1) * b;
        payload = N * R * b;
        break;
    case ZPP_CALL_ALLREDUCE:
        cross = I * 2.0 * (N - 1) / N * b;
        intra = I * 2.0 * (R - 1) * b;
        payload = b;
        break;
    case ZPP_CALL_BROADCAST:
        cross = I * (N - 1) / N * b;
        intra = I * (R - 1) * b;
        payload = b;
        break;
    }
    v->cross_node_bytes[phase] += cross;
    v->intra_node_bytes[phase] += intra;
    v->payload_bytes[phase] += payload;
    v->calls[phase] += 1;
}

zpp_partition zpp_partition_make_shape(size_t numel, int world_size, int nodes) {
    zpp_partition p;
    size_t w = world_size > 0 ? (size_t)world_size : 1;
    p.numel = numel;
    p.shard_len = (numel + w - 1) / w; /* tiny units: 1 element per rank, padded */
    p.padded = w * p.shard_len;
    p.sec_len = (size_t)(nodes > 0 ? nodes : 1) * p.shard_len;
    return p;
}

zpp_partition zpp_partition_make(size_t numel, const zpp_topo *topo) {
    return zpp_partition_make_shape(numel, topo->world_size, topo->nodes);
}

zpp_coll_opts zpp_coll_opts_default(void) {
    zpp_coll_opts o;
    o.weight_spec = zpp_quant_spec_default(8);
    o.grad_spec = zpp_quant_spec_default(4);
    o.grad_spec.format = ZPP_QUANT_E2M1; /* docs/quantization.md, "qgZ's 4-bit format" */
    o.grad_slab = 0;
    return o;
}

static size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0); }

int zpp_qgz_slabs(size_t shard_len, int nodes, const zpp_coll_opts *opts, size_t *slab_p) {
    size_t n = shard_len, align = 4 * opts->grad_spec.block;
    size_t want = opts->grad_slab, cap = ZPP_QGZ_MAX_SLABS;
    if (want == 0 && nodes > 1) want = SIZE_MAX;
    if (want == 0) {
        want = ceil_div(n, ZPP_QGZ_AUTO_SLABS);
        if (want < ZPP_QGZ_AUTO_MIN) want = ZPP_QGZ_AUTO_MIN;
    }
    if (n == 0 || want >= n) {
        *slab_p = n;
        return 1;
    }
    size_t least = ceil_div(n, cap);
    if (want < least) want = least;
    size_t slab = ceil_div(want, align) * align;
    if (slab >= n) {
        *slab_p = n;
        return 1;
    }
    *slab_p = slab;
    return (int)ceil_div(n, slab);
}

/* ---- Plans: the same calls the live operations make --------------------
 * Keep these in step with collectives.c (a unit of zero elements makes no
 * call at all; see the *_start functions there). test_collectives checks
 * live volumes against these plans. */

void zpp_plan_gather(zpp_volume *v, const zpp_partition *p, int nodes, int node_size,
                     zpp_gather_mode mode, zpp_dtype dtype, const zpp_coll_opts *opts,
                     zpp_phase phase) {
    if (p->numel == 0) return;
    zpp_group_shape world = zpp_group_world(nodes, node_size);
    zpp_coll_opts d = opts ? *opts : zpp_coll_opts_default();
    size_t bytes = mode == ZPP_GATHER_QWZ ? zpp_quant_bytes(p->shard_len, &d.weight_spec)
                                          : p->shard_len * zpp_dtype_size(dtype);
    zpp_volume_add_call(v, phase, ZPP_CALL_ALLGATHER, &world, bytes);
}

void zpp_plan_gather_secondary(zpp_volume *v, const zpp_partition *p, int nodes,
                               int node_size, zpp_dtype dtype, zpp_phase phase) {
    (void)nodes;
    if (p->numel == 0) return;
    zpp_group_shape intra = zpp_group_intra(node_size);
    zpp_volume_add_call(v, phase, ZPP_CALL_ALLGATHER, &intra,
                        p->sec_len * zpp_dtype_size(dtype));
}

void zpp_plan_reduce(zpp_volume *v, const zpp_partition *p, int nodes, int node_size,
                     zpp_reduce_mode mode, zpp_dtype dtype, const zpp_coll_opts *opts) {
    if (p->numel == 0) return;
    if (mode == ZPP_REDUCE_BASELINE) {
        zpp_group_shape world = zpp_group_world(nodes, node_size);
        zpp_volume_add_call(v, ZPP_PHASE_GRAD_REDUCE, ZPP_CALL_REDUCE_SCATTER, &world,
                            p->shard_len * zpp_dtype_size(dtype));
        return;
    }
    zpp_coll_opts d = opts ? *opts : zpp_coll_opts_default();
    size_t n = p->shard_len, slab;
    int slabs = zpp_qgz_slabs(n, nodes, &d, &slab);
    zpp_group_shape intra = zpp_group_intra(node_size);
    zpp_group_shape inter = zpp_group_inter(nodes, node_size);
    for (int k = 0; k < slabs; k++) {
        size_t first = (size_t)k * slab, len = n - first < slab ? n - first : slab;
        size_t qg = zpp_quant_bytes(len, &d.grad_spec);
        if (node_size > 1)
            zpp_volume_add_call(v, ZPP_PHASE_GRAD_REDUCE, ZPP_CALL_ALLTOALL, &intra,
                                (size_t)nodes * qg);
        /* between two nodes the exchange runs as an all-gather of the one
         * block for the other node (collectives.c, exchange_start): the
         * same wire bytes */
        if (nodes > 1)
            zpp_volume_add_call(v, ZPP_PHASE_GRAD_REDUCE,
                                nodes == 2 ? ZPP_CALL_ALLGATHER : ZPP_CALL_ALLTOALL, &inter, qg);
    }
}

static const zpp_coll_mode kModes[ZPP_COLL_MODE_COUNT] = {
    {"zero3", ZPP_GATHER_BASELINE, 0, ZPP_REDUCE_BASELINE},
    {"qwz", ZPP_GATHER_QWZ, 0, ZPP_REDUCE_BASELINE},
    {"hpz", ZPP_GATHER_BASELINE, 1, ZPP_REDUCE_BASELINE},
    {"qgz", ZPP_GATHER_BASELINE, 0, ZPP_REDUCE_QGZ},
    {"zeropp", ZPP_GATHER_QWZ, 1, ZPP_REDUCE_QGZ},
};

const zpp_coll_mode *zpp_coll_mode_get(int i) {
    return i >= 0 && i < ZPP_COLL_MODE_COUNT ? &kModes[i] : NULL;
}

zpp_status zpp_coll_mode_parse(const char *name, const zpp_coll_mode **mode_p) {
    for (int i = 0; name && i < ZPP_COLL_MODE_COUNT; i++) {
        if (strcmp(name, kModes[i].name) == 0) {
            *mode_p = &kModes[i];
            return ZPP_OK;
        }
    }
    return zpp_error(ZPP_ERR_INVALID,
                     "unknown mode '%s'; use zero3, qwz, hpz, qgz or zeropp",
                     name ? name : "(null)");
}

size_t zpp_plan_unit_numel(size_t params, int units, int i) {
    if (units <= 0 || i < 0 || i >= units) return 0;
    size_t u = (size_t)units;
    return params / u + ((size_t)i < params % u ? 1 : 0);
}

zpp_status zpp_plan_step(size_t params, int units, int world, int node_size,
                         const zpp_coll_mode *mode, zpp_dtype dtype,
                         const zpp_coll_opts *opts, zpp_volume *v_p) {
    if (world <= 0 || node_size <= 0 || world % node_size != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "plan: node size %d does not divide the world of %d ranks; pick a "
                         "divisor",
                         node_size, world);
    if (units <= 0)
        return zpp_error(ZPP_ERR_INVALID, "plan: %d units; a model needs at least one", units);
    if (!mode || zpp_dtype_size(dtype) == 0)
        return zpp_error(ZPP_ERR_INVALID, "plan: no mode or an unknown dtype");
    zpp_coll_opts d = opts ? *opts : zpp_coll_opts_default();
    ZPP_CHECK(zpp_quant_spec_check(&d.weight_spec));
    ZPP_CHECK(zpp_quant_spec_check(&d.grad_spec));
    int nodes = world / node_size;
    zpp_volume v;
    memset(&v, 0, sizeof v);
    for (int i = 0; i < units; i++) {
        zpp_partition p = zpp_partition_make_shape(zpp_plan_unit_numel(params, units, i), world,
                                                   nodes);
        zpp_plan_gather(&v, &p, nodes, node_size, mode->gather, dtype, &d,
                        ZPP_PHASE_FWD_GATHER);
        if (mode->hpz)
            zpp_plan_gather_secondary(&v, &p, nodes, node_size, dtype, ZPP_PHASE_BWD_GATHER);
        else
            zpp_plan_gather(&v, &p, nodes, node_size, mode->gather, dtype, &d,
                            ZPP_PHASE_BWD_GATHER);
        zpp_plan_reduce(&v, &p, nodes, node_size, mode->reduce, dtype, &d);
    }
    *v_p = v;
    return ZPP_OK;
}

/* collectives/collectives.c — ZeRO-3 and ZeRO++ unit collectives.
 *
 * The code is written once for every backend: scratch comes from the
 * device's pool, every quantization, dtype conversion and copy is a
 * zpp_device_* call (the CPU reference on the host backend, CUDA kernels on
 * a GPU's compute stream), and every communication backend call goes
 * through group_call, which records its volume (volume.c) as it starts it.
 *
 * Ordering on a GPU: kernels run on the device's compute stream, the one
 * the NCCL backend orders its collectives against (zpp_topo_opts.device):
 * a collective runs after the work already enqueued there, and what is
 * enqueued after its completion runs after it (comm.h). Gathers and
 * reductions run on two communication streams (the reductions on the
 * topology's red_* communicators, group_comm), concurrently with each other.
 *
 * Scratch across the streams. A scratch buffer goes back to the pool
 * (op_free, and the engine's puts) only after every exchange that
 * reads or writes it has been completed, i.e. after the compute stream was
 * made to wait on that exchange's end (zpp_comm_wait: op->req at
 * zpp_coll_finish, each slab's request at slab_wait, or
 * op_drain on an error path). Kernels that use it are on the compute
 * stream itself. So when the pool hands it to a new user, every earlier
 * user is ordered before the compute stream's current end: a kernel of
 * the new user is enqueued behind it, and an exchange of the new user, on
 * either communication stream, starts by waiting on an event recorded
 * there (comm_nccl.c, STREAMS AND ORDERING). No buffer is ever handed on
 * while an exchange on the other stream may still touch it, and reuse
 * needs no host synchronisation. Nothing here relies on two exchanges
 * sharing a stream: within an operation each exchange's input is produced
 * by a kernel (compute stream) that follows the previous exchange's wait.
 *
 * Asynchrony: *_start does the local pre-processing (quantization) and
 * starts the first exchange; zpp_coll_finish waits for it and runs the rest
 * (dequantization; for qgZ the intra-node sum and the inter-node exchange).
 * Each operation in flight holds its own scratch buffers, leased from the
 * device's pool (the engine keeps about three in flight: the gather in use,
 * a prefetch, a reduce).
 *
 * qgZ runs in slabs (collectives.h, zpp_qgz_slabs): start enqueues every
 * slab's quantization and first exchange, finish every slab's sums and
 * second exchange. On a GPU the exchanges run on the reductions' stream
 * and the kernels on the compute stream, each exchange after its slab's
 * kernel and each kernel after its slab's exchange, so while slab k is on
 * the wire slab k + 1 is quantized and slab k - 1 summed. */
#include "collectives/collectives.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/random.h"
#include "device/device.h"

/* The three communicators of a topology. */
typedef enum zpp__group { ZPP__WORLD = 0, ZPP__INTRA = 1, ZPP__INTER = 2 } zpp__group;

struct zpp_coll {
    zpp_topo *topo;
    zpp_coll_opts opts;
    zpp_device *dev;    /* kernels, scratch, the non-finite flag; not owned */
    zpp_volume vol;
    uint64_t seq;       /* operations started this round: varies stochastic-rounding seeds */
    uint64_t round;     /* zpp_coll_set_round: the engine's step */
};

typedef enum zpp__op_kind {
    ZPP__OP_EMPTY = 0,      /* a unit of zero elements: nothing to move */
    ZPP__OP_GATHER,
    ZPP__OP_GATHER_SECONDARY,
    ZPP__OP_REDUCE
} zpp__op_kind;

/* Where a qgZ reduction stands when zpp_coll_finish picks it up. */
typedef enum zpp__qgz_stage {
    ZPP__QGZ_LOCAL = 0,   /* world of one rank: nothing was sent */
    ZPP__QGZ_INTRA,       /* intra-node all-to-all in flight */
    ZPP__QGZ_INTER        /* inter-node all-to-all in flight (node_size == 1) */
} zpp__qgz_stage;

#define ZPP__OP_BUFS 4

struct zpp_coll_op {
    zpp__op_kind kind;
    zpp_partition part;
    zpp_gather_mode gather;
    zpp_reduce_mode reduce;
    zpp_dtype dtype;
    void *full;
    void *secondary;
    const void *full_grad; /* a reduction's input (qgZ adds the own chunk at finish) */
    float *shard_out;
    zpp_phase phase;
    zpp__group group;       /* communicator of the request in flight */
    zpp_comm_req *req;
    zpp__qgz_stage stage;
    zpp_quant_spec spec;    /* quantization spec of this call (seeded) */
    void *bp[ZPP__OP_BUFS]; /* scratch from the device's pool, NULL = none */
    /* qgZ: the slabs, and the exchange of each in flight on `group` */
    int slabs;
    size_t slab_len;
    zpp_comm_req *slab_req[ZPP_QGZ_MAX_SLABS];
    /* qgZ error feedback (collectives.h); fb_on 0: none */
    int fb_on;
    zpp_qgz_feedback fb;
};

/* Slab k of a qgZ reduction: elements [first, first + len) of every chunk,
 * q bytes a chunk once quantized. In a buffer of c quantized chunks it
 * starts at byte c * at: each slab before it holds slab_len elements a
 * chunk. */
typedef struct zpp__slab {
    size_t first, len, q, at;
} zpp__slab;

static zpp__slab slab_get(const zpp_coll_op *op, int k) {
    zpp__slab s;
    size_t n = op->part.shard_len;
    s.first = (size_t)k * op->slab_len;
    s.len = n - s.first < op->slab_len ? n - s.first : op->slab_len;
    s.q = zpp_quant_bytes(s.len, &op->spec);
    s.at = (size_t)k * zpp_quant_bytes(op->slab_len, &op->spec);
    return s;
}

/* ---- Helpers ------------------------------------------------------------ */

/* The communicator of a group for a call of `phase`. Gradient reductions
 * use the topology's red_* communicators, which on NCCL run on a stream of
 * their own, concurrently with the gathers (comm_nccl.c, STREAMS AND
 * ORDERING; on MPI they are the same communicators). A group that is the
 * whole world (the inter-node group with one rank per node, the node when
 * there is one node) runs on the world communicator (of its phase): the
 * same ranks in the same order. Each NCCL communicator has its own
 * connections, and over a socket link the first large operation on one
 * that sat idle while another moved data runs measurably slower
 * (bench/RESULTS.md, fourth session, "Figures the collectives' comments
 * carried"). */
static zpp_comm *group_comm(const zpp_coll *c, zpp__group g, zpp_phase phase) {
    const zpp_topo *t = c->topo;
    const int red = phase == ZPP_PHASE_GRAD_REDUCE;
    if (g == ZPP__WORLD || (g == ZPP__INTER && t->node_size == 1) ||
        (g == ZPP__INTRA && t->nodes == 1))
        return red ? t->red_world : t->world;
    if (g == ZPP__INTRA) return red ? t->red_intra : t->intra;
    return red ? t->red_inter : t->inter;
}

static zpp_group_shape group_shape(const zpp_coll *c, zpp__group g) {
    const zpp_topo *t = c->topo;
    return g == ZPP__WORLD   ? zpp_group_world(t->nodes, t->node_size)
           : g == ZPP__INTRA ? zpp_group_intra(t->node_size)
                             : zpp_group_inter(t->nodes, t->node_size);
}

/* The one door to the backend: records the call's volume (DESIGN.md §5)
 * under `phase`, then makes it. `n` is bytes for all-gather (per rank) and
 * all-to-all (per peer), elements of dtype for reduce-scatter (per rank) and
 * all-reduce. */
static zpp_status group_call(zpp_coll *c, zpp__group g, zpp_phase phase, zpp_call_kind kind,
                             const void *send, void *recv, size_t n, zpp_dtype dtype,
                             zpp_comm_req **req_p) {
    zpp_comm *m = group_comm(c, g, phase);
    zpp_group_shape shape = group_shape(c, g);
    zpp_status st;
    size_t bytes = n;
    switch (kind) {
    case ZPP_CALL_ALLGATHER: st = zpp_comm_allgather(m, send, recv, n, req_p); break;
    case ZPP_CALL_REDUCE_SCATTER:
        bytes = n * zpp_dtype_size(dtype);
        st = zpp_comm_reduce_scatter(m, send, recv, n, dtype, req_p);
        break;
    case ZPP_CALL_ALLTOALL: st = zpp_comm_alltoall(m, send, recv, n, req_p); break;
    case ZPP_CALL_ALLREDUCE:
        bytes = n * zpp_dtype_size(dtype);
        st = zpp_comm_allreduce(m, send, recv, n, dtype, req_p);
        break;
    default:
        return zpp_error(ZPP_ERR_INVALID, "collectives: backend call kind %d not used here",
                         (int)kind);
    }
    if (st != ZPP_OK) return zpp_error_context(st, "collectives: %s backend", m->ops->name);
    zpp_volume_add_call(&c->vol, phase, kind, &shape, bytes);
    return ZPP_OK;
}

/* Leases op buffer slot k from the device's scratch pool. */
static zpp_status op_lease(zpp_coll *c, zpp_coll_op *op, int k, size_t bytes) {
    return zpp_device_scratch_get(c->dev, bytes, &op->bp[k]);
}

/* Completes every slab exchange still in flight (after an error: their
 * buffers go back to the pool only after that). */
static void op_drain(zpp_coll *c, zpp_coll_op *op) {
    zpp_comm *m = group_comm(c, op->group, op->phase);
    for (int k = 0; k < op->slabs; k++) {
        if (op->slab_req[k]) (void)zpp_comm_wait(m, op->slab_req[k]);
        op->slab_req[k] = NULL;
    }
}

static void op_free(zpp_coll *c, zpp_coll_op *op) {
    zpp_error_hold(); /* cleanup: a failure's message stays the failure's */
    op_drain(c, op);
    for (int k = 0; k < ZPP__OP_BUFS; k++) zpp_device_scratch_put(c->dev, op->bp[k]);
    free(op);
    zpp_error_release();
}

static zpp_status op_new(zpp_coll *c, zpp__op_kind kind, const zpp_partition *p, zpp_dtype dtype,
                         zpp_phase phase, zpp_coll_op **op_p) {
    zpp_coll_op *op = calloc(1, sizeof *op);
    if (!op) return zpp_error(ZPP_ERR_NOMEM, "collectives: out of memory for an operation");
    op->kind = p->numel ? kind : ZPP__OP_EMPTY;
    op->part = *p;
    op->dtype = dtype;
    op->phase = phase;
    *op_p = op;
    return ZPP_OK;
}

/* A stream-ordered copy inside the device's memory. */
static zpp_status coll_copy(zpp_coll *c, void *dst, const void *src, size_t bytes) {
    return zpp_device_copy(c->dev, dst, src, bytes);
}

/* ---- The exchanges of qgZ -------------------------------------------------------
 * Every member of a group (the node's ranks, or the ranks with this local
 * index) holds one block of q bytes for each member, in member order, and
 * must end with the blocks addressed to it: an all-to-all. Between two
 * members it is also an all-gather: each contributes the one block
 * addressed to the other, and slot m of the result is what member m sent;
 * the member's own slot then holds what it sent away, which the sum after
 * clears anyway (its own input is added exact: sum_over_own). The bytes on
 * the wire are the same. Done for two nodes and not inside a node:
 *   - over a socket link NCCL's all-gather, on its ring path, keeps more
 *     connections busy than grouped send/recv, and is faster;
 *   - over NVLink it went the other way: the all-gather and copy made qgZ
 *     slower than the all-to-all (bench/RESULTS.md, fourth session). */
static int as_allgather(const zpp_coll *c, zpp__group g) {
    return g == ZPP__INTER && group_comm(c, g, ZPP_PHASE_GRAD_REDUCE)->size == 2;
}

static zpp_status exchange_start(zpp_coll *c, zpp__group g, const void *send, void *recv, size_t q,
                                 zpp_dtype dtype, zpp_comm_req **req_p) {
    const zpp_comm *m = group_comm(c, g, ZPP_PHASE_GRAD_REDUCE);
    if (!as_allgather(c, g))
        return group_call(c, g, ZPP_PHASE_GRAD_REDUCE, ZPP_CALL_ALLTOALL, send, recv, q, dtype,
                          req_p);
    const char *to_other = (const char *)send + (size_t)(1 - m->rank) * q;
    return group_call(c, g, ZPP_PHASE_GRAD_REDUCE, ZPP_CALL_ALLGATHER, to_other, recv, q, dtype,
                      req_p);
}

/* A spec for one quantizing call: with stochastic rounding, a fresh stream
 * per call and per rank (the streams are indexed by element position, so
 * ranks sharing a seed would round their errors the same way and the
 * errors would not average out). Deterministic: same calls, same seeds. */
static zpp_quant_spec seeded_spec(const zpp_coll *c, const zpp_quant_spec *s, uint64_t salt) {
    zpp_quant_spec q = *s;
    if (q.stochastic) {
        q.seed = zpp_mix64(zpp_mix64(s->seed ^ c->round) ^ (c->seq * ZPP_GOLDEN64) ^
                           ((uint64_t)c->topo->world_rank << 40) ^ (salt << 60));
    }
    return q;
}

static zpp_status check_part(const zpp_coll *c, const zpp_partition *p, const char *what) {
    zpp_partition want = zpp_partition_make(p->numel, c->topo);
    if (p->shard_len != want.shard_len || p->padded != want.padded || p->sec_len != want.sec_len)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: the partition of %zu elements was not made for this topology "
                         "(%d ranks, %d nodes); use zpp_partition_make",
                         what, p->numel, c->topo->world_size, c->topo->nodes);
    return ZPP_OK;
}

/* ---- Create / destroy ------------------------------------------------------ */

zpp_status zpp_coll_create(zpp_topo *topo, const zpp_coll_opts *opts, zpp_device *dev,
                           zpp_coll **coll_p) {
    if (!topo || !topo->world || !topo->intra || !topo->inter || !coll_p)
        return zpp_error(ZPP_ERR_INVALID, "collectives: a topology and an output are needed");
    if (!dev)
        return zpp_error(ZPP_ERR_INVALID,
                         "collectives: no device; create one with zpp_device_create_host (MPI) "
                         "or zpp_device_create_gpu (NCCL)");
    if (dev->mem != topo->world->mem)
        return zpp_error(ZPP_ERR_INVALID,
                         "collectives: the device keeps tensors in %s memory but the %s backend "
                         "moves %s memory; use the host device with MPI, a GPU with NCCL",
                         dev->mem == ZPP_MEM_HOST ? "host" : "GPU", topo->world->ops->name,
                         topo->world->mem == ZPP_MEM_HOST ? "host" : "GPU");
    zpp_coll_opts o = opts ? *opts : zpp_coll_opts_default();
    zpp_status st = zpp_quant_spec_check(&o.weight_spec);
    if (st != ZPP_OK) return zpp_error_context(st, "collectives: weight (qwZ) spec");
    st = zpp_quant_spec_check(&o.grad_spec);
    if (st != ZPP_OK) return zpp_error_context(st, "collectives: gradient (qgZ) spec");
    zpp_coll *c = calloc(1, sizeof *c);
    if (!c) return zpp_error(ZPP_ERR_NOMEM, "collectives: out of memory");
    c->topo = topo;
    c->opts = o;
    c->dev = dev;
    *coll_p = c;
    return ZPP_OK;
}

/* The scratch stays with the device, for the next user. */
void zpp_coll_destroy(zpp_coll *c) { free(c); }

/* ---- Gathers ----------------------------------------------------------------- */

zpp_status zpp_coll_gather_start(zpp_coll *c, const zpp_partition *p, zpp_gather_mode mode,
                                 zpp_dtype dtype, const void *shard, void *full,
                                 void *secondary, zpp_phase phase, zpp_coll_op **op_p) {
    if (!c || !p || !op_p || (p->numel && (!shard || !full)))
        return zpp_error(ZPP_ERR_INVALID, "gather: shard, full buffer and op_p are required");
    if (mode != ZPP_GATHER_BASELINE && mode != ZPP_GATHER_QWZ)
        return zpp_error(ZPP_ERR_INVALID, "gather: unknown mode %d", (int)mode);
    size_t ds = zpp_dtype_size(dtype);
    if (!ds) return zpp_error(ZPP_ERR_INVALID, "gather: unknown dtype %d", (int)dtype);
    ZPP_CHECK(check_part(c, p, "gather"));

    zpp_coll_op *op = NULL;
    ZPP_CHECK(op_new(c, ZPP__OP_GATHER, p, dtype, phase, &op));
    op->gather = mode;
    op->full = full;
    op->secondary = secondary;
    op->group = ZPP__WORLD;
    c->seq++;
    zpp_status st = ZPP_OK;
    if (op->kind == ZPP__OP_EMPTY) goto done;
    size_t n = p->shard_len;
    if (mode == ZPP_GATHER_BASELINE) {
        ZPP_CHECK_GOTO(group_call(c, ZPP__WORLD, phase, ZPP_CALL_ALLGATHER, shard, full, n * ds,
                                  dtype, &op->req),
                       st, fail);
        goto done;
    }
    /* qwZ: own shard -> one int8 chunk of qb bytes (payload, scales,
     * padding: the wire layout), all-gathered; dequantized at finish. */
    op->spec = seeded_spec(c, &c->opts.weight_spec, 1);
    size_t qb = zpp_quant_bytes(n, &op->spec);
    size_t W = (size_t)c->topo->world_size;
    ZPP_CHECK_GOTO(op_lease(c, op, 0, qb), st, fail);
    ZPP_CHECK_GOTO(op_lease(c, op, 1, W * qb), st, fail);
    ZPP_CHECK_GOTO(zpp_device_quantize_chunks(c->dev, shard, dtype, 1, n, &op->spec, op->bp[0]),
                   st, fail);
    ZPP_CHECK_GOTO(group_call(c, ZPP__WORLD, phase, ZPP_CALL_ALLGATHER, op->bp[0], op->bp[1], qb,
                              dtype, &op->req),
                   st, fail);
done:
    *op_p = op;
    return ZPP_OK;
fail:
    op_free(c, op);
    return zpp_error_context(st, "gather (%s) of %zu elements",
                             mode == ZPP_GATHER_QWZ ? "qwZ" : "baseline", p->numel);
}

zpp_status zpp_coll_gather_secondary_start(zpp_coll *c, const zpp_partition *p,
                                           zpp_dtype dtype, const void *secondary,
                                           void *full, zpp_phase phase, zpp_coll_op **op_p) {
    if (!c || !p || !op_p || (p->numel && (!secondary || !full)))
        return zpp_error(ZPP_ERR_INVALID,
                         "secondary gather: secondary, full buffer and op_p are required");
    size_t ds = zpp_dtype_size(dtype);
    if (!ds) return zpp_error(ZPP_ERR_INVALID, "secondary gather: unknown dtype %d", (int)dtype);
    ZPP_CHECK(check_part(c, p, "secondary gather"));
    zpp_coll_op *op = NULL;
    ZPP_CHECK(op_new(c, ZPP__OP_GATHER_SECONDARY, p, dtype, phase, &op));
    op->full = full;
    op->group = ZPP__INTRA;
    c->seq++;
    if (op->kind != ZPP__OP_EMPTY) {
        /* Secondary shard s is the slice [s * sec_len, (s+1) * sec_len) of the
         * padded unit, so the node's S secondaries in local order are the whole
         * unit: one all-gather inside the node, nothing crosses it. */
        zpp_status st = group_call(c, ZPP__INTRA, phase, ZPP_CALL_ALLGATHER, secondary, full,
                                   p->sec_len * ds, dtype, &op->req);
        if (st != ZPP_OK) {
            op_free(c, op);
            return zpp_error_context(st, "secondary gather of %zu elements", p->numel);
        }
    }
    *op_p = op;
    return ZPP_OK;
}

/* ---- Reductions ------------------------------------------------------------- */

void zpp_qgz_feedback_lens(const zpp_partition *p, int nodes, int node_size, size_t *intra_p,
                           size_t *inter_p) {
    *intra_p = p->padded;
    *inter_p = nodes > 1 && node_size > 1 ? (size_t)nodes * p->shard_len : 0;
}

zpp_status zpp_coll_reduce_start(zpp_coll *c, const zpp_partition *p, zpp_reduce_mode mode,
                                 zpp_dtype dtype, const void *full_grad, float *shard_out,
                                 zpp_coll_op **op_p) {
    return zpp_coll_reduce_start_ef(c, p, mode, dtype, full_grad, shard_out, NULL, op_p);
}

zpp_status zpp_coll_reduce_start_ef(zpp_coll *c, const zpp_partition *p, zpp_reduce_mode mode,
                                    zpp_dtype dtype, const void *full_grad, float *shard_out,
                                    const zpp_qgz_feedback *fb, zpp_coll_op **op_p) {
    if (!c || !p || !op_p || (p->numel && (!full_grad || !shard_out)))
        return zpp_error(ZPP_ERR_INVALID,
                         "reduce: gradient, output shard and op_p are required");
    if (mode != ZPP_REDUCE_BASELINE && mode != ZPP_REDUCE_QGZ)
        return zpp_error(ZPP_ERR_INVALID, "reduce: unknown mode %d", (int)mode);
    size_t ds = zpp_dtype_size(dtype);
    if (!ds) return zpp_error(ZPP_ERR_INVALID, "reduce: unknown dtype %d", (int)dtype);
    ZPP_CHECK(check_part(c, p, "reduce"));
    if (fb) {
        size_t li = 0, le = 0;
        zpp_qgz_feedback_lens(p, c->topo->nodes, c->topo->node_size, &li, &le);
        if (mode != ZPP_REDUCE_QGZ)
            return zpp_error(ZPP_ERR_INVALID,
                             "reduce: error feedback applies to qgZ only (zeropp_loco_param "
                             "needs zero_quantized_gradients)");
        if (!(fb->beta >= 0.0f && fb->beta <= 1.0f))
            return zpp_error(ZPP_ERR_INVALID, "reduce: err_beta %g is outside [0, 1]",
                             (double)fb->beta);
        if ((li && !fb->intra) || (le && !fb->inter))
            return zpp_error(ZPP_ERR_INVALID,
                             "reduce: error feedback needs an intra-node buffer of %zu and an "
                             "inter-node buffer of %zu elements (zpp_qgz_feedback_lens)",
                             li, le);
    }

    zpp_coll_op *op = NULL;
    ZPP_CHECK(op_new(c, ZPP__OP_REDUCE, p, dtype, ZPP_PHASE_GRAD_REDUCE, &op));
    op->reduce = mode;
    if (fb) op->fb_on = 1, op->fb = *fb;
    op->shard_out = shard_out;
    op->full_grad = full_grad;
    c->seq++;
    zpp_status st = ZPP_OK;
    if (op->kind == ZPP__OP_EMPTY) goto done;
    size_t n = p->shard_len;
    const zpp_topo *t = c->topo;
    if (mode == ZPP_REDUCE_BASELINE) {
        /* Sum in the gradient's dtype (as NCCL would), average into fp32 at
         * finish. An fp32 gradient lands in shard_out directly. */
        void *recv = shard_out;
        if (dtype != ZPP_FP32) {
            ZPP_CHECK_GOTO(op_lease(c, op, 0, n * ds), st, fail);
            recv = op->bp[0];
        }
        op->group = ZPP__WORLD;
        ZPP_CHECK_GOTO(group_call(c, ZPP__WORLD, ZPP_PHASE_GRAD_REDUCE, ZPP_CALL_REDUCE_SCATTER,
                                  full_grad, recv, n, dtype, &op->req),
                       st, fail);
        goto done;
    }
    /* qgZ step 1: the W chunks of shard_len (chunk r for global rank r),
     * each quantized to 4 bits on its own, reordered so that local rank s
     * receives, from each node peer, the chunks of all ranks with local
     * index s in node order (zpp_quant_reorder_quantize); slab by slab. */
    op->spec = seeded_spec(c, &c->opts.grad_spec, 2);
    op->slabs = zpp_qgz_slabs(n, t->nodes, &c->opts, &op->slab_len);
    size_t qg = zpp_quant_bytes(n, &op->spec);
    size_t W = (size_t)t->world_size, N = (size_t)t->nodes;
    ZPP_CHECK_GOTO(op_lease(c, op, 0, W * qg), st, fail);
    if (t->node_size > 1) {
        /* Step 2: all-to-all inside the node, nodes * q bytes to each peer. */
        ZPP_CHECK_GOTO(op_lease(c, op, 1, W * qg), st, fail);
        op->stage = ZPP__QGZ_INTRA;
        op->group = ZPP__INTRA;
    } else if (t->nodes > 1) {
        /* One rank per node: the intra-node exchange is a self-copy, and a
         * dequantize-sum of one input followed by a requantization would only
         * add error; the node-ordered chunks go straight to step 4. */
        ZPP_CHECK_GOTO(op_lease(c, op, 2, N * qg), st, fail);
        op->stage = ZPP__QGZ_INTER;
        op->group = ZPP__INTER;
    } else {
        op->stage = ZPP__QGZ_LOCAL;
    }
    for (int k = 0; k < op->slabs; k++) {
        zpp__slab s = slab_get(op, k);
        char *q = (char *)op->bp[0] + W * s.at;
        if (op->fb_on)
            st = zpp_device_ef_reorder_quantize(c->dev, full_grad, dtype, op->fb.intra,
                                                op->fb.beta, n, s.first, s.len, t->nodes,
                                                t->node_size, &op->spec, q);
        else
            st = zpp_device_reorder_quantize(c->dev, full_grad, dtype, n, s.first, s.len,
                                             t->nodes, t->node_size, &op->spec, q);
        if (st != ZPP_OK) goto fail;
        if (op->stage == ZPP__QGZ_INTRA)
            st = exchange_start(c, ZPP__INTRA, q, (char *)op->bp[1] + W * s.at, N * s.q, dtype,
                                &op->slab_req[k]);
        else if (op->stage == ZPP__QGZ_INTER)
            st = exchange_start(c, ZPP__INTER, q, (char *)op->bp[2] + N * s.at, s.q, dtype,
                                &op->slab_req[k]);
        if (st != ZPP_OK) goto fail;
    }
done:
    *op_p = op;
    return ZPP_OK;
fail:
    op_free(c, op);
    return zpp_error_context(st, "reduce (%s) of %zu elements",
                             mode == ZPP_REDUCE_QGZ ? "qgZ" : "baseline", p->numel);
}

/* Waits for slab k's exchange (intra- or inter-node). */
static zpp_status slab_wait(zpp_coll *c, zpp_coll_op *op, int k) {
    zpp_status st = zpp_comm_wait(group_comm(c, op->group, op->phase), op->slab_req[k]);
    op->slab_req[k] = NULL;
    return st;
}

/* A rank's own contribution never crosses a wire, so qgZ need not
 * quantize it: every sum this rank forms over inputs of which one is its
 * own (the last step's over nodes, or over the node when there is one
 * node or one rank a node; the hierarchical path's own-node partial sum)
 * starts from the own input, exact, and skips that input's quantized copy,
 * zeroed in place (zero bytes dequantize to +0). Of a sum of k inputs one
 * then carries no quantization error: 1/k of the error's variance gone at
 * no byte on the wire (docs/quantization.md, "qgZ reorder order"). */

/* out = this rank's own chunk's slab, in fp32: the start of its sums. */
static zpp_status own_slab(zpp_coll *c, const zpp_coll_op *op, const zpp__slab *s, float *out) {
    const size_t ds = zpp_dtype_size(op->dtype);
    const size_t at = (size_t)c->topo->world_rank * op->part.shard_len + s->first;
    return zpp_device_convert(c->dev, (const char *)op->full_grad + at * ds, op->dtype, out,
                              ZPP_FP32, s->len, 1.0f);
}

/* out = scale * (out + the k quantized inputs at q, `stride` bytes apart,
 * but input `own`, which is cleared first: out holds it exactly). */
static zpp_status sum_over_own(zpp_coll *c, char *q, size_t k, size_t stride, size_t own,
                               const zpp__slab *s, const zpp_quant_spec *spec, float scale,
                               float *out) {
    const size_t qs = zpp_quant_bytes(s->len, spec);
    ZPP_CHECK(zpp_device_set(c->dev, q + own * (stride ? stride : qs), 0, qs));
    return zpp_device_dequant_reduce(c->dev, q, k, stride, s->len, spec, out, scale, out);
}

/* The rest of a qgZ reduction, slab by slab as each exchange arrives. */
static zpp_status qgz_finish(zpp_coll *c, zpp_coll_op *op) {
    const zpp_topo *t = c->topo;
    size_t n = op->part.shard_len, N = (size_t)t->nodes, S = (size_t)t->node_size;
    size_t W = N * S;
    float inv_w = 1.0f / (float)t->world_size;
    const zpp_quant_spec *gs = &op->spec;
    if (op->stage != ZPP__QGZ_INTRA || N == 1) {
        for (int k = 0; k < op->slabs; k++) {
            zpp__slab s = slab_get(op, k);
            float *out = op->shard_out + s.first;
            ZPP_CHECK(own_slab(c, op, &s, out));
            if (op->stage == ZPP__QGZ_LOCAL) continue; /* a world of one: its own gradient */
            char *q;
            size_t inputs, own;
            if (op->stage == ZPP__QGZ_INTER) {
                /* Step 5: the N node partial sums (here each from one rank). */
                ZPP_CHECK(slab_wait(c, op, k));
                q = (char *)op->bp[2] + N * s.at;
                inputs = N, own = (size_t)t->node;
            } else {
                /* One node: the node sum is the world sum; dequantize, sum in
                 * fp32 and average in one pass (no requantization). bp[1]
                 * holds S inputs, one per node peer. */
                ZPP_CHECK(slab_wait(c, op, k));
                q = (char *)op->bp[1] + W * s.at;
                inputs = S, own = (size_t)t->local_rank;
            }
            ZPP_CHECK(sum_over_own(c, q, inputs, 0, own, &s, gs, inv_w, out));
        }
        return ZPP_OK;
    }
    /* bp[1] holds node_size inputs, one per node peer, each N chunks: the
     * peer's quantized contribution to every rank with my local index.
     * Step 3: per destination node, the node's partial sum in fp32,
     * requantized to 4 bits (a second rounding, bounded by half a step of the
     * sum's block). */
    zpp_quant_spec rs = seeded_spec(c, &c->opts.grad_spec, 3);
    size_t qg = zpp_quant_bytes(n, gs);
    ZPP_CHECK(op_lease(c, op, 2, N * qg));
    ZPP_CHECK(op_lease(c, op, 3, N * qg));
    for (int k = 0; k < op->slabs; k++) {
        zpp__slab s = slab_get(op, k);
        ZPP_CHECK(slab_wait(c, op, k));
        char *sum = (char *)op->bp[2] + N * s.at;
        char *in = (char *)op->bp[1] + W * s.at;
        if (op->fb_on)
            ZPP_CHECK(zpp_device_ef_dequant_sum_requant(c->dev, in, (int)S, N, n, s.first, s.len,
                                                        gs, &rs, op->fb.inter, op->fb.beta,
                                                        sum));
        else
            ZPP_CHECK(zpp_device_dequant_sum_requant(c->dev, in, (int)S, N, n, s.first, s.len,
                                                     gs, &rs, sum));
        /* Step 4: chunk m goes to the rank with my local index on node m. */
        ZPP_CHECK(exchange_start(c, ZPP__INTER, sum, (char *)op->bp[3] + N * s.at, s.q, op->dtype,
                                 &op->slab_req[k]));
        /* This node's partial sum stays here: formed again in fp32 in the
         * output while the others travel, from the own input exact (chunk
         * `node` of each of the S inputs, N slabs apart), and never
         * requantized. Its requantized copy (made with the rest, its error
         * feedback updated as ever) comes back to this rank only and is
         * cleared at step 5. */
        float *out = op->shard_out + s.first;
        ZPP_CHECK(own_slab(c, op, &s, out));
        ZPP_CHECK(sum_over_own(c, in + (size_t)t->node * s.q, S, N * s.q, (size_t)t->local_rank,
                               &s, gs, 1.0f, out));
    }
    for (int k = 0; k < op->slabs; k++) {
        zpp__slab s = slab_get(op, k);
        ZPP_CHECK(slab_wait(c, op, k));
        char *sums = (char *)op->bp[3] + N * s.at;
        /* Step 5: sum the N node partial sums and average over the WORLD,
         * once: each element is the sum of W contributions, so 1/W (not 1/N,
         * not 1/node_size) makes it the data-parallel mean. This node's is
         * the fp32 one already in the output. */
        ZPP_CHECK(sum_over_own(c, sums, N, 0, (size_t)t->node, &s, &rs, inv_w,
                               op->shard_out + s.first));
    }
    return ZPP_OK;
}

/* ---- Completion ------------------------------------------------------------ */

zpp_status zpp_coll_finish(zpp_coll *c, zpp_coll_op *op) {
    if (!c || !op) return zpp_error(ZPP_ERR_INVALID, "finish: no operation");
    zpp_status st = zpp_comm_wait(group_comm(c, op->group, op->phase), op->req);
    op->req = NULL;
    if (st != ZPP_OK) goto out;
    const zpp_partition *p = &op->part;
    size_t ds = zpp_dtype_size(op->dtype);
    switch (op->kind) {
    case ZPP__OP_EMPTY:
    case ZPP__OP_GATHER_SECONDARY: break;
    case ZPP__OP_GATHER:
        if (op->gather == ZPP_GATHER_QWZ) {
            /* The W received chunks, rank order, are the padded unit; the
             * padding quantizes to 0 and dequantizes to exactly 0. */
            st = zpp_device_dequantize_chunks(c->dev, op->bp[1], (size_t)c->topo->world_size,
                                              p->shard_len, &op->spec, op->dtype, op->full);
            if (st != ZPP_OK) goto out;
        }
        if (op->secondary) {
            /* hpZ: keep this rank's 1/S slice of the unit for the backward. */
            size_t off = (size_t)c->topo->local_rank * p->sec_len * ds;
            st = coll_copy(c, op->secondary, (const char *)op->full + off, p->sec_len * ds);
        }
        break;
    case ZPP__OP_REDUCE:
        if (op->reduce == ZPP_REDUCE_BASELINE) {
            const void *sum = op->dtype == ZPP_FP32 ? (const void *)op->shard_out : op->bp[0];
            st = zpp_device_convert(c->dev, sum, op->dtype, op->shard_out, ZPP_FP32,
                                    p->shard_len, 1.0f / (float)c->topo->world_size);
        } else {
            st = qgz_finish(c, op);
        }
        break;
    }
out:
    if (st != ZPP_OK)
        st = zpp_error_context(st, "finishing a collective of %zu elements", op->part.numel);
    op_free(c, op);
    return st;
}

/* ---- Small all-reduce and the accounting ------------------------------------ */

zpp_status zpp_coll_allreduce_sum(zpp_coll *c, float *host_values, size_t n) {
    if (!c || (n && !host_values))
        return zpp_error(ZPP_ERR_INVALID, "allreduce: values are required");
    if (n == 0) return ZPP_OK;
    /* The backend reduces the device's memory: stage the values through a
     * scratch buffer (on the host backend, host memory as well). The copy
     * back waits for the compute stream, behind which the backend ordered
     * the all-reduce. */
    void *buf = NULL;
    ZPP_CHECK(zpp_device_scratch_get(c->dev, n * sizeof(float), &buf));
    zpp_status st;
    ZPP_CHECK_GOTO(zpp_device_copy(c->dev, buf, host_values, n * sizeof(float)), st, out);
    ZPP_CHECK_GOTO(zpp_coll_allreduce_device(c, buf, n, ZPP_FP32, ZPP_PHASE_OTHER), st, out);
    ZPP_CHECK_GOTO(zpp_device_copy(c->dev, host_values, buf, n * sizeof(float)), st, out);
out:
    zpp_device_scratch_put(c->dev, buf);
    return st;
}

zpp_status zpp_coll_allreduce_device(zpp_coll *c, void *values, size_t n, zpp_dtype dtype,
                                     zpp_phase phase) {
    if (!c || (n && !values) || phase < 0 || phase >= ZPP_PHASE_COUNT)
        return zpp_error(ZPP_ERR_INVALID, "allreduce: values and a phase are required");
    if (n == 0) return ZPP_OK;
    return group_call(c, ZPP__WORLD, phase, ZPP_CALL_ALLREDUCE, values, values, n, dtype, NULL);
}

void zpp_coll_set_round(zpp_coll *c, uint64_t round) {
    c->round = round;
    c->seq = 0;
}

const zpp_volume *zpp_coll_volume(const zpp_coll *c) { return &c->vol; }

void zpp_coll_volume_reset(zpp_coll *c) { memset(&c->vol, 0, sizeof c->vol); }

void zpp_coll_volume_set(zpp_coll *c, const zpp_volume *v) { c->vol = *v; }

/* tools/bench_comm.c — `zeropp bench comm`: one training step's collectives
 * for each of ZeRO-3, qwZ, hpZ, qgZ and ZeRO++, with the bytes they move per
 * node (DESIGN.md §5), their time, and a correctness check, under mpirun.
 *
 * A model of P parameters is cut into U units (zpp_plan_unit_numel). A step
 * is what the engine does: forward gathers of every unit (keeping the hpZ
 * secondary shards when hpZ is on), backward gathers in reverse order (from
 * the secondaries with hpZ), each followed by the unit's gradient reduction.
 * Data are bf16 (--dtype to change), from collectives/coll_data.h (the
 * tests' generator): a pure function of (seed, unit, rank, element), so
 * every rank can compute the single-process reference of its results:
 *   baseline gathers are bit-exact; qwZ within half an int8 step of each
 *   block (+ bf16 rounding); hpZ's backward gather equals the forward
 *   gather's output byte for byte; the baseline reduce within bf16
 *   summation rounding; qgZ within its two-level int4 bound
 *   (collectives/qgz_bound.h; the others: tests/test_collectives.c).
 * The first step of each mode checks (untimed); then --iters rounds are
 * timed, each a step of every mode beside the plain collectives (below):
 * each operation is timed from a barrier, and its time is the median over
 * rounds of the slowest rank (a step's is the sum of its operations'). The
 * volume of one step is compared with `zeropp plan`'s (zpp_plan_step).
 *
 * It also times the backend's plain collective on the same tensors (a bf16
 * all-gather of each unit's shards and a bf16 reduce-scatter of each unit's
 * gradient: ZeRO-3's calls without the library around them) and prints each
 * path's speed against it. And it times a plain all-gather of each unit's
 * quantized bytes (int8 for qwZ, int4 for qgZ: zpp_quant_bytes of a shard
 * per rank). That moves the same cross-node bytes per node as qwZ's gather
 * and as qgZ's inter-node exchange ((N-1) S qbytes, DESIGN.md section 5), so
 * "vs wire" = wire time / our time says how close a quantized path comes to
 * what the link gives for its bytes: 1 = no cost beyond the bytes.
 *
 * --device gpu runs the same code on the NCCL backend with device buffers
 * (device = launcher-local rank % device count; --emulate-nodes gives each
 * node its own NCCL_HOSTID so nodes talk over NCCL's network transport;
 * launch with `mpirun --bind-to none`, DESIGN.md §6). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "collectives/coll_data.h"
#include "collectives/collectives.h"
#include "collectives/qgz_bound.h"
#include "comm/comm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "device/device.h"
#include "zeropp.h"

typedef struct bench_opts {
    size_t params;
    int units, node_size, json, gpu, iters, emulate_nodes;
    int weight_block, grad_block; /* 0: the defaults of zeropp.h */
    size_t grad_slab;             /* zpp_coll_opts.grad_slab */
    uint64_t seed;
    zpp_dtype dtype;
    int mode_on[ZPP_COLL_MODE_COUNT];
} bench_opts;

typedef struct bench_unit {
    zpp_partition p;
    void *shard;     /* shard_len elements, backend memory */
    void *grad;      /* padded elements, this rank's gradient */
    void *secondary; /* sec_len elements (hpZ) */
    float *out;      /* shard_len fp32 */
    uint64_t fwd_hash;
    /* Host references, computed once at setup and shared by every mode: */
    float *ref;      /* padded: the unit's weights (values of the dtype) */
    float *amax;     /* per int8 block of each rank's shard: its absmax */
    double *mean;    /* shard_len: exact world mean of this rank's gradient shard */
    double *abssum;  /* shard_len: sum over ranks of |g_r| */
    double *sum_a;   /* per int4 block of this shard: sum over ranks of its absmax */
} bench_unit;

typedef struct bench_ctx {
    bench_opts o;
    zpp_topo *topo;
    zpp_coll *coll;
    zpp_coll_opts copts;
    zpp_device *dev; /* the host, or this rank's GPU */
    bench_unit *u;
    void *full;        /* the largest padded unit, backend memory */
    void *scratch;     /* plain reduce-scatter output */
    void *wire_send;   /* the largest quantized shard (zeros), backend memory */
    void *wire_recv;   /* W of them */
    void *host_full;   /* host copies for checks */
    float *host_out;
    size_t ds;
    int rank, W;
} bench_ctx;

/* One mode's figures. */
typedef struct bench_result {
    zpp_volume vol;
    double ms[4]; /* step, fwd, bwd, reduce: median over rounds of the slowest rank */
    double paired[3]; /* fwd, bwd, reduce speed-up: median over rounds of plain / this */
    double wire_paired[2]; /* fwd (qwZ) and reduce (qgZ) against the wire all-gather */
    int correct, plan_match;
    double worst; /* largest error / bound seen */
} bench_result;

/* The plain collectives timed beside the modes, per round. */
enum {
    PLAIN_AG,      /* bf16 all-gather of every unit's shards */
    PLAIN_RS,      /* bf16 reduce-scatter of every unit's gradient */
    PLAIN_WIRE8,   /* all-gather of every unit's int8 quantized shard (qwZ's bytes) */
    PLAIN_WIRE4,   /* all-gather of every unit's int4 quantized shard (qgZ's bytes) */
    PLAIN_COUNT
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np W zeropp bench comm --params P [--units U] [--node-size S]\n"
            "           [--iters K] [--json] [--device cpu|gpu] [--emulate-nodes]\n"
            "           [--modes zero3,qwz,hpz,qgz,zeropp] [--dtype bf16] [--seed N]\n"
            "           [--weight-block B] [--grad-block B] [--grad-slab E|auto|off]\n"
            "\n"
            "One training step's collectives for a model of P parameters (125M, 1.5B, 64Mi) in\n"
            "U units (default 8) under each mode; prints the cross-node and intra-node bytes\n"
            "per node by phase, the time (K rounds, default 5, each timing every mode beside\n"
            "the backend's plain bf16 all-gather and reduce-scatter, and a plain all-gather\n"
            "of the quantized bytes; median, slowest rank) and a correctness check.\n"
            "--weight-block / --grad-block set the int8 / int4 block sizes (defaults\n"
            "%d / %d). --grad-slab sets the elements of each rank's chunk that one step\n"
            "of qgZ's pipeline moves (default auto; off: the whole unit in one step).\n"
            "--node-size groups consecutive ranks into nodes (default: as the\n"
            "launcher placed them). --device gpu uses NCCL and device memory; with\n"
            "--emulate-nodes each node gets its own NCCL_HOSTID (launch with\n"
            "--bind-to none).\n",
            ZPP_QUANT_DEFAULT_BLOCK_INT8, ZPP_QUANT_DEFAULT_BLOCK_INT4);
}




/* The host-side data and checks are O(params) per rank and dominate a run at
 * 1 GiB; with OpenMP (found by CMake) they use every core. */
#ifdef _OPENMP
#define ZPP_OMP(x) _Pragma(#x)
#else
#define ZPP_OMP(x)
#endif

/* FNV-1a of each 1 MiB piece, the pieces' hashes combined in order: an
 * equality check of two buffers that parallelises. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *c = p;
    const size_t piece = (size_t)1 << 20, pieces = (n + piece - 1) / piece;
    uint64_t h = 1469598103934665603ull;
    uint64_t *ph = malloc((pieces ? pieces : 1) * sizeof *ph);
    if (!ph) return 0;
    ZPP_OMP(omp parallel for schedule(static))
    for (size_t k = 0; k < pieces; k++) {
        uint64_t x = 1469598103934665603ull;
        size_t end = (k + 1) * piece < n ? (k + 1) * piece : n;
        for (size_t i = k * piece; i < end; i++) x = (x ^ c[i]) * 1099511628211ull;
        ph[k] = x;
    }
    for (size_t k = 0; k < pieces; k++) h = zpp_hash64(h ^ ph[k]);
    free(ph);
    return h;
}

/* ---- Setup --------------------------------------------------------------------- */

static int sync_stream(bench_ctx *b) { return zpp_device_sync(b->dev, NULL) != ZPP_OK ? -1 : 0; }

/* Fills host staging with values, copies to backend memory. */
static zpp_status upload(bench_ctx *b, void *dst, size_t n, int unit, int rank, size_t first,
                         int is_grad) {
    void *h = malloc(n * b->ds + 1);
    if (!h) return ZPP_ERR_NOMEM;
    ZPP_OMP(omp parallel for schedule(static))
    for (size_t j = 0; j < n; j++)
        zpp_store_f32(h, b->o.dtype, j,
                      is_grad ? zpp_coll_data_grad(b->o.seed, (uint64_t)unit, rank, first + j,
                                                   b->u[unit].p.numel, b->o.dtype, 0)
                              : zpp_coll_data_weight(b->o.seed, (uint64_t)unit, first + j,
                                                     b->u[unit].p.numel, b->o.dtype));
    zpp_status st = zpp_device_copy(b->dev, dst, h, n * b->ds);
    free(h);
    return st;
}

/* The single-process references of one unit (see check_gather and
 * check_reduce): every rank's data is a pure function of its indices. */
static zpp_status make_refs(bench_ctx *b, int unit) {
    bench_unit *u = &b->u[unit];
    size_t n = u->p.shard_len, W = (size_t)b->W, base = (size_t)b->rank * n;
    size_t wb = b->copts.weight_spec.block, gb = b->copts.grad_spec.block;
    size_t nwb = n ? (n + wb - 1) / wb : 0, ngb = n ? (n + gb - 1) / gb : 0;
    u->ref = malloc((u->p.padded + 1) * sizeof(float));
    u->amax = calloc(W * nwb + 1, sizeof(float));
    u->mean = calloc(n + 1, sizeof(double));
    u->abssum = calloc(n + 1, sizeof(double));
    u->sum_a = calloc(ngb + 1, sizeof(double));
    if (!u->ref || !u->amax || !u->mean || !u->abssum || !u->sum_a) return ZPP_ERR_NOMEM;
    /* One int8 block of one rank's shard per iteration: its elements and
     * their absmax belong to it alone. */
    ZPP_OMP(omp parallel for schedule(static))
    for (size_t blk = 0; blk < W * nwb; blk++) {
        size_t first = (blk / nwb) * n + (blk % nwb) * wb;
        size_t last = (blk / nwb) * n + ((blk % nwb) * wb + wb < n ? (blk % nwb) * wb + wb : n);
        for (size_t i = first; i < last; i++) {
            u->ref[i] =
                zpp_coll_data_weight(b->o.seed, (uint64_t)unit, i, u->p.numel, b->o.dtype);
            u->amax[blk] = fmaxf(u->amax[blk], fabsf(u->ref[i]));
        }
    }
    /* One int4 block of this shard per iteration; the ranks' gradients are
     * summed in rank order. */
    ZPP_OMP(omp parallel for schedule(static))
    for (size_t k0 = 0; k0 < n; k0 += gb) {
        for (int r = 0; r < b->W; r++) {
            double A = 0;
            for (size_t k = k0; k < n && k < k0 + gb; k++) {
                double g = zpp_coll_data_grad(b->o.seed, (uint64_t)unit, r, base + k,
                                              u->p.numel, b->o.dtype, 0);
                u->mean[k] += g;
                u->abssum[k] += fabs(g);
                A = fmax(A, fabs(g));
            }
            u->sum_a[k0 / gb] += A;
        }
    }
    for (size_t k = 0; k < n; k++) u->mean[k] /= b->W;
    return ZPP_OK;
}

static zpp_status setup(bench_ctx *b) {
    zpp_topo_opts to;
    memset(&to, 0, sizeof to);
    to.backend = b->o.gpu ? ZPP_BACKEND_NCCL : ZPP_BACKEND_MPI;
    to.node_size = b->o.node_size;
    to.emulate_nodes = b->o.emulate_nodes;
    zpp_status st;
    if (b->o.gpu) {
        /* the launcher's local rank picks the device, whatever --node-size
         * says about emulated nodes */
        int local = 0, local_size = 0, gpus = zpp_device_gpu_count();
        if ((st = zpp_comm_launch_local(&local, &local_size)) != ZPP_OK) return st;
        if (gpus <= 0)
            return zpp_error(ZPP_ERR_CUDA, "--device gpu, but no GPU is visible (or this build "
                                           "has no CUDA); use --device cpu");
        if ((st = zpp_device_create_gpu(local % gpus, &b->dev)) != ZPP_OK) return st;
        to.device = b->dev;
    } else if ((st = zpp_device_create_host(&b->dev)) != ZPP_OK) {
        return st;
    }
    st = zpp_topo_create_with_opts(&to, &b->topo);
    if (st != ZPP_OK) return st;
    b->rank = b->topo->world_rank;
    b->W = b->topo->world_size;
    b->copts = zpp_coll_opts_default();
    if (b->o.weight_block) b->copts.weight_spec.block = (size_t)b->o.weight_block;
    if (b->o.grad_block) b->copts.grad_spec.block = (size_t)b->o.grad_block;
    b->copts.grad_slab = b->o.grad_slab;
    st = zpp_coll_create(b->topo, &b->copts, b->dev, &b->coll);
    if (st != ZPP_OK) return st;
    b->ds = zpp_dtype_size(b->o.dtype);
    b->u = calloc((size_t)b->o.units, sizeof *b->u);
    if (!b->u) return ZPP_ERR_NOMEM;
    size_t max_padded = 1, max_shard = 1, max_wire = 16;
    for (int i = 0; i < b->o.units; i++) {
        bench_unit *u = &b->u[i];
        u->p = zpp_partition_make(zpp_plan_unit_numel(b->o.params, b->o.units, i), b->topo);
        if (u->p.padded > max_padded) max_padded = u->p.padded;
        if (u->p.shard_len > max_shard) max_shard = u->p.shard_len;
        size_t w8 = zpp_quant_bytes(u->p.shard_len, &b->copts.weight_spec);
        size_t w4 = zpp_quant_bytes(u->p.shard_len, &b->copts.grad_spec);
        if (w8 > max_wire) max_wire = w8;
        if (w4 > max_wire) max_wire = w4;
        if ((st = zpp_device_alloc(b->dev, u->p.shard_len * b->ds, &u->shard)) ||
            (st = zpp_device_alloc(b->dev, u->p.padded * b->ds, &u->grad)) ||
            (st = zpp_device_alloc(b->dev, u->p.sec_len * b->ds, &u->secondary)) ||
            (st = zpp_device_alloc(b->dev, u->p.shard_len * sizeof(float), (void **)&u->out)))
            return st;
        if ((st = upload(b, u->shard, u->p.shard_len, i, b->rank,
                         (size_t)b->rank * u->p.shard_len, 0)) ||
            (st = upload(b, u->grad, u->p.padded, i, b->rank, 0, 1)) ||
            (st = make_refs(b, i)))
            return st;
    }
    if ((st = zpp_device_alloc(b->dev, max_padded * b->ds, &b->full)) ||
        (st = zpp_device_alloc(b->dev, max_shard * b->ds, &b->scratch)) ||
        (st = zpp_device_alloc(b->dev, max_wire, &b->wire_send)) ||
        (st = zpp_device_alloc(b->dev, max_wire * (size_t)b->W, &b->wire_recv)) ||
        (st = zpp_device_set(b->dev, b->wire_send, 0, max_wire)))
        return st;
    b->host_full = malloc(max_padded * b->ds);
    b->host_out = malloc(max_shard * sizeof(float));
    if (!b->host_full || !b->host_out) return ZPP_ERR_NOMEM;
    return ZPP_OK;
}

static void teardown(bench_ctx *b) {
    if (b->u) {
        for (int i = 0; i < b->o.units; i++) {
            zpp_device_free(b->dev, b->u[i].shard);
            zpp_device_free(b->dev, b->u[i].grad);
            zpp_device_free(b->dev, b->u[i].secondary);
            zpp_device_free(b->dev, b->u[i].out);
            free(b->u[i].ref);
            free(b->u[i].amax);
            free(b->u[i].mean);
            free(b->u[i].abssum);
            free(b->u[i].sum_a);
        }
        free(b->u);
    }
    zpp_device_free(b->dev, b->full);
    zpp_device_free(b->dev, b->scratch);
    zpp_device_free(b->dev, b->wire_send);
    zpp_device_free(b->dev, b->wire_recv);
    free(b->host_full);
    free(b->host_out);
    zpp_coll_destroy(b->coll);
    if (b->topo) zpp_topo_destroy(b->topo);
    zpp_device_destroy(b->dev);
}

/* ---- Checks (single-process references) ------------------------------------ */

/* The gathered unit in b->host_full against the reference weights: exact for
 * the baseline; for qwZ within half a step (absmax / 127) of the element's
 * block in its owner's shard, plus the output dtype's rounding (half an ulp:
 * 2^-8 of the value for bf16, 2^-11 for fp16). Returns max error / bound
 * (> 1: wrong; 2 for an inexact baseline). */
static double check_gather(bench_ctx *b, int unit, zpp_gather_mode mode) {
    const bench_unit *u = &b->u[unit];
    size_t n = u->p.shard_len, wb = b->copts.weight_spec.block;
    size_t nwb = n ? (n + wb - 1) / wb : 0;
    double worst = 0, rel = b->o.dtype == ZPP_BF16   ? 0x1p-8
                            : b->o.dtype == ZPP_FP16 ? 0x1p-11
                                                     : 0x1p-24;
    ZPP_OMP(omp parallel for schedule(static) reduction(max : worst))
    for (size_t i = 0; i < u->p.padded; i++) {
        double want = u->ref[i], got = zpp_load_f32(b->host_full, b->o.dtype, i);
        if (mode == ZPP_GATHER_BASELINE) {
            if (got != want) worst = fmax(worst, 2.0);
            continue;
        }
        double amax = u->amax[(i / n) * nwb + (i % n) / wb];
        double bound = amax / 127.0 * 0.5 * (1 + 1e-3) * (1 + rel) + rel * fabs(want);
        double err = fabs(got - want);
        if (!(err <= bound)) worst = fmax(worst, fmax(2.0, bound > 0 ? err / bound : 2.0));
        else if (bound > 0 && err / bound > worst) worst = err / bound;
    }
    return worst;
}

/* This rank's reduced shard in b->host_out against the exact world mean.
 * Baseline: the backend sums W values in the dtype, each of W-1
 * combinations rounding by half an ulp (<= rel * sum|g_r|); the 1/W
 * product adds 3 fp32 ulps. qgZ: zpp_qgz_error_bound of the block's
 * sum over ranks of its absmax (derivation: collectives/qgz_bound.h). */
static double check_reduce(bench_ctx *b, int unit, zpp_reduce_mode mode) {
    const bench_unit *u = &b->u[unit];
    const zpp_topo *t = b->topo;
    size_t gb = b->copts.grad_spec.block;
    double rel = b->o.dtype == ZPP_BF16 ? 0x1p-8 : b->o.dtype == ZPP_FP16 ? 0x1p-11 : 0x1p-24;
    double worst = 0;
    ZPP_OMP(omp parallel for schedule(static) reduction(max : worst))
    for (size_t k = 0; k < u->p.shard_len; k++) {
        double want = u->mean[k], got = b->host_out[k];
        double bound =
            mode == ZPP_REDUCE_QGZ
                ? zpp_qgz_error_bound(u->sum_a[k / gb], b->W, t->node_size, t->nodes,
                                      &b->copts.grad_spec)
                : (b->W - 1) * rel * 1.01 * u->abssum[k] / b->W;
        bound += 3 * 0x1p-24 * fabs(want) + 1e-37;
        double err = fabs(got - want);
        if (!(err <= bound)) worst = fmax(worst, fmax(2.0, err / bound));
        else if (err / bound > worst) worst = err / bound;
    }
    return worst;
}

static zpp_status fetch_full(bench_ctx *b, int unit) {
    if (sync_stream(b)) return ZPP_ERR_CUDA;
    return zpp_device_copy(b->dev, b->host_full, b->full, b->u[unit].p.padded * b->ds);
}

/* ---- One step -------------------------------------------------------------------- */

#define BENCH_FAIL(what, st)                                                  \
    do {                                                                      \
        zpp_cli_fail(what, st);                                               \
        exit(1); /* the launcher ends the other ranks */                     \
    } while (0)

/* The start of a timed operation: every rank leaves a barrier first, so a
 * rank that finished the previous operation late is not charged to this
 * one (each rank's clock would otherwise run while it waits for the others
 * to join). Used alike for our paths and the plain references. */
static double timed_start(bench_ctx *b) {
    zpp_comm *w = b->topo->world;
    zpp_status st = zpp_comm_barrier(w);
    if (st != ZPP_OK) BENCH_FAIL("bench comm: barrier", st);
    return zpp_cli_now_ms();
}

/* Runs one step of `m`; with `check`, verifies every result (worst error /
 * bound into *worst_p, > 1 = wrong). ms: step (the sum of the three
 * phases), fwd, bwd, reduce. */
static void run_step(bench_ctx *b, const zpp_coll_mode *m, int check, double ms[4],
                     double *worst_p) {
    zpp_coll *c = b->coll;
    zpp_status st;
    zpp_coll_op *op;
    double worst = 0, t;
    memset(ms, 0, 4 * sizeof(double));
    for (int i = 0; i < b->o.units; i++) {
        bench_unit *u = &b->u[i];
        t = timed_start(b);
        st = zpp_coll_gather_start(c, &u->p, m->gather, b->o.dtype, u->shard, b->full,
                                   m->hpz ? u->secondary : NULL, ZPP_PHASE_FWD_GATHER, &op);
        if (st == ZPP_OK) st = zpp_coll_finish(c, op);
        if (st != ZPP_OK) BENCH_FAIL("bench comm: forward gather", st);
        if (sync_stream(b)) BENCH_FAIL("bench comm: stream", ZPP_ERR_CUDA);
        ms[1] += zpp_cli_now_ms() - t;
        if (check) {
            if ((st = fetch_full(b, i))) BENCH_FAIL("bench comm: copy", st);
            worst = fmax(worst, check_gather(b, i, m->gather));
            u->fwd_hash = hash_bytes(b->host_full, u->p.padded * b->ds);
        }
    }
    for (int i = b->o.units - 1; i >= 0; i--) {
        bench_unit *u = &b->u[i];
        t = timed_start(b);
        if (m->hpz)
            st = zpp_coll_gather_secondary_start(c, &u->p, b->o.dtype, u->secondary, b->full,
                                                 ZPP_PHASE_BWD_GATHER, &op);
        else
            st = zpp_coll_gather_start(c, &u->p, m->gather, b->o.dtype, u->shard, b->full, NULL,
                                       ZPP_PHASE_BWD_GATHER, &op);
        if (st == ZPP_OK) st = zpp_coll_finish(c, op);
        if (st != ZPP_OK) BENCH_FAIL("bench comm: backward gather", st);
        if (sync_stream(b)) BENCH_FAIL("bench comm: stream", ZPP_ERR_CUDA);
        ms[2] += zpp_cli_now_ms() - t;
        if (check) {
            if ((st = fetch_full(b, i))) BENCH_FAIL("bench comm: copy", st);
            worst = fmax(worst, check_gather(b, i, m->gather));
            /* hpZ must hand back exactly what the forward gather produced */
            if (hash_bytes(b->host_full, u->p.padded * b->ds) != u->fwd_hash)
                worst = fmax(worst, 2.0);
        }
        t = timed_start(b);
        st = zpp_coll_reduce_start(c, &u->p, m->reduce, b->o.dtype, u->grad, u->out, &op);
        if (st == ZPP_OK) st = zpp_coll_finish(c, op);
        if (st != ZPP_OK) BENCH_FAIL("bench comm: gradient reduce", st);
        if (sync_stream(b)) BENCH_FAIL("bench comm: stream", ZPP_ERR_CUDA);
        ms[3] += zpp_cli_now_ms() - t;
        if (check) {
            st = zpp_device_copy(b->dev, b->host_out, u->out, u->p.shard_len * sizeof(float));
            if (st) BENCH_FAIL("bench comm: copy", st);
            worst = fmax(worst, check_reduce(b, i, m->reduce));
        }
    }
    ms[0] = ms[1] + ms[2] + ms[3];
    if (worst_p) *worst_p = worst;
}

/* The backend's own bf16 all-gather and reduce-scatter of the same tensors,
 * and its all-gather of their quantized sizes, straight through the
 * communicator (not through the accounting). ms: PLAIN_COUNT sums over units. */
static void run_plain(bench_ctx *b, double ms[PLAIN_COUNT]) {
    zpp_comm *w = b->topo->world;
    for (int k = 0; k < PLAIN_COUNT; k++) ms[k] = 0;
    for (int i = 0; i < b->o.units; i++) {
        bench_unit *u = &b->u[i];
        double t = timed_start(b);
        zpp_status st = zpp_comm_allgather(w, u->shard, b->full, u->p.shard_len * b->ds, NULL);
        if (st != ZPP_OK || sync_stream(b)) BENCH_FAIL("bench comm: plain all-gather", st);
        ms[PLAIN_AG] += zpp_cli_now_ms() - t;
        t = timed_start(b);
        st = zpp_comm_reduce_scatter(w, u->grad, b->scratch, u->p.shard_len, b->o.dtype, NULL);
        if (st != ZPP_OK || sync_stream(b)) BENCH_FAIL("bench comm: plain reduce-scatter", st);
        ms[PLAIN_RS] += zpp_cli_now_ms() - t;
        for (int k = PLAIN_WIRE8; k <= PLAIN_WIRE4; k++) {
            const zpp_quant_spec *sp =
                k == PLAIN_WIRE8 ? &b->copts.weight_spec : &b->copts.grad_spec;
            t = timed_start(b);
            st = zpp_comm_allgather(w, b->wire_send, b->wire_recv,
                                   zpp_quant_bytes(u->p.shard_len, sp), NULL);
            if (st != ZPP_OK || sync_stream(b)) BENCH_FAIL("bench comm: wire all-gather", st);
            ms[k] += zpp_cli_now_ms() - t;
        }
    }
}


/* Median over rounds of the per-round maximum over ranks, for k series. */
static void reduce_times(double *samples, int iters, int k, double *out) {
    /* the maxima stay in samples (time_modes pairs them round by round) */
    for (int i = 0; i < iters * k; i++) {
        zpp_status st = zpp_comm_max_world(&samples[i]);
        if (st != ZPP_OK) BENCH_FAIL("bench comm: max over ranks", st);
    }
    double *col = malloc((size_t)iters * sizeof(double));
    if (!col) BENCH_FAIL("bench comm", ZPP_ERR_NOMEM);
    for (int j = 0; j < k; j++) {
        for (int s = 0; s < iters; s++) col[s] = samples[s * k + j];
        out[j] = zpp_cli_median(col, iters);
    }
    free(col);
}

/* The untimed first step of a mode: warm-up, the check of every result, and
 * its volume against zeropp plan's. */
static void check_mode(bench_ctx *b, const zpp_coll_mode *m, bench_result *r) {
    double ms[4], worst = 0;
    zpp_coll_volume_reset(b->coll);
    run_step(b, m, 1, ms, &worst);
    r->vol = *zpp_coll_volume(b->coll);
    zpp_status mst = zpp_comm_max_world(&worst);
    if (mst != ZPP_OK) BENCH_FAIL("bench comm: max over ranks", mst);
    r->worst = worst;
    r->correct = worst <= 1.0;
    zpp_volume plan;
    zpp_status st = zpp_plan_step(b->o.params, b->o.units, b->W, b->topo->node_size, m,
                                  b->o.dtype, &b->copts, &plan);
    if (st != ZPP_OK) BENCH_FAIL("bench comm: plan", st);
    r->plan_match = 1;
    for (int ph = 0; ph < ZPP_PHASE_COUNT; ph++)
        if (plan.cross_node_bytes[ph] != r->vol.cross_node_bytes[ph] ||
            plan.intra_node_bytes[ph] != r->vol.intra_node_bytes[ph] ||
            plan.payload_bytes[ph] != r->vol.payload_bytes[ph] ||
            plan.calls[ph] != r->vol.calls[ph])
            r->plan_match = 0;
}

/* The timed steps. A link's speed drifts over seconds (a socket link between
 * emulated nodes varied by 25% between runs), so each round times the plain
 * collectives and then one step of every mode, back to back: a ratio
 * compares times taken moments apart, not minutes apart. */
static void time_modes(bench_ctx *b, bench_result *res, double plain[PLAIN_COUNT]) {
    int iters = b->o.iters;
    double *ps = calloc((size_t)iters * PLAIN_COUNT, sizeof(double));
    double *ms = calloc((size_t)iters * 4 * ZPP_COLL_MODE_COUNT, sizeof(double));
    if (!ps || !ms) BENCH_FAIL("bench comm", ZPP_ERR_NOMEM);
    run_plain(b, ps); /* warm-up */
    for (int s = 0; s < iters; s++) {
        run_plain(b, &ps[PLAIN_COUNT * s]);
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
            if (b->o.mode_on[m])
                run_step(b, zpp_coll_mode_get(m), 0, &ms[((size_t)m * iters + s) * 4], NULL);
    }
    reduce_times(ps, iters, PLAIN_COUNT, plain);
    double *col = malloc((size_t)iters * sizeof(double));
    if (!col) BENCH_FAIL("bench comm", ZPP_ERR_NOMEM);
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        if (!b->o.mode_on[m]) continue;
        double *mm = &ms[(size_t)m * iters * 4];
        reduce_times(mm, iters, 4, res[m].ms); /* leaves each round's slowest rank in mm */
        /* fwd and bwd gathers against the all-gather, the reduce against the
         * reduce-scatter, round by round */
        for (int k = 0; k < 3; k++) {
            for (int r = 0; r < iters; r++) {
                double ours = mm[r * 4 + 1 + k];
                double ref = ps[PLAIN_COUNT * r + (k == 2 ? PLAIN_RS : PLAIN_AG)];
                col[r] = ours > 0 ? ref / ours : 0.0;
            }
            res[m].paired[k] = zpp_cli_median(col, iters);
        }
        /* the forward gather against the int8 wire, the reduce against the int4 */
        for (int k = 0; k < 2; k++) {
            for (int r = 0; r < iters; r++) {
                double ours = mm[r * 4 + (k ? 3 : 1)];
                double ref = ps[PLAIN_COUNT * r + (k ? PLAIN_WIRE4 : PLAIN_WIRE8)];
                col[r] = ours > 0 ? ref / ours : 0.0;
            }
            res[m].wire_paired[k] = zpp_cli_median(col, iters);
        }
    }
    free(col);
    free(ps);
    free(ms);
}

/* ---- Output --------------------------------------------------------------------- */


static const zpp_phase kPhases[3] = {ZPP_PHASE_FWD_GATHER, ZPP_PHASE_BWD_GATHER,
                                     ZPP_PHASE_GRAD_REDUCE};

static void print_json(const bench_ctx *b, const zpp_coll_mode *m, const bench_result *r,
                       double z3_cross, const double plain[PLAIN_COUNT], const char *backend) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddStringToObject(o, "bench", "comm");
    cJSON_AddStringToObject(o, "mode", m->name);
    cJSON_AddStringToObject(o, "backend", backend);
    cJSON_AddStringToObject(o, "device", b->o.gpu ? "gpu" : "cpu");
    cJSON_AddNumberToObject(o, "world", b->W);
    cJSON_AddNumberToObject(o, "node_size", b->topo->node_size);
    cJSON_AddNumberToObject(o, "nodes", b->topo->nodes);
    cJSON_AddNumberToObject(o, "params", (double)b->o.params);
    cJSON_AddNumberToObject(o, "units", b->o.units);
    cJSON_AddStringToObject(o, "dtype", zpp_dtype_name(b->o.dtype));
    cJSON_AddNumberToObject(o, "iters", b->o.iters);
    cJSON_AddNumberToObject(o, "weight_block", (double)b->copts.weight_spec.block);
    cJSON_AddNumberToObject(o, "grad_block", (double)b->copts.grad_spec.block);
    {
        /* qgZ's pipeline on the largest unit (units differ by one element) */
        size_t slab;
        int slabs = zpp_qgz_slabs(b->u[0].p.shard_len, b->topo->nodes, &b->copts, &slab);
        cJSON_AddNumberToObject(o, "grad_slabs", slabs);
        cJSON_AddNumberToObject(o, "grad_slab", (double)slab);
    }
    cJSON_AddNumberToObject(o, "cross_node_bytes", zpp_volume_cross_total(&r->vol));
    cJSON_AddNumberToObject(o, "intra_node_bytes", zpp_volume_intra_total(&r->vol));
    cJSON_AddNumberToObject(o, "cross_vs_zero3",
                            z3_cross > 0 ? zpp_volume_cross_total(&r->vol) / z3_cross : 0.0);
    cJSON_AddNumberToObject(o, "time_ms", r->ms[0]);
    for (int k = 0; k < 3; k++) {
        char key[64];
        const char *pn = zpp_phase_name(kPhases[k]);
        snprintf(key, sizeof key, "%s_cross_bytes", pn);
        cJSON_AddNumberToObject(o, key, r->vol.cross_node_bytes[kPhases[k]]);
        snprintf(key, sizeof key, "%s_intra_bytes", pn);
        cJSON_AddNumberToObject(o, key, r->vol.intra_node_bytes[kPhases[k]]);
        snprintf(key, sizeof key, "%s_payload_bytes", pn);
        cJSON_AddNumberToObject(o, key, r->vol.payload_bytes[kPhases[k]]);
        snprintf(key, sizeof key, "%s_ms", pn);
        cJSON_AddNumberToObject(o, key, r->ms[k + 1]);
    }
    char key[64];
    snprintf(key, sizeof key, "%s_bf16_allgather_ms", backend);
    cJSON_AddNumberToObject(o, key, plain[PLAIN_AG]);
    snprintf(key, sizeof key, "%s_bf16_reduce_scatter_ms", backend);
    cJSON_AddNumberToObject(o, key, plain[PLAIN_RS]);
    snprintf(key, sizeof key, "%s_int8_wire_allgather_ms", backend);
    cJSON_AddNumberToObject(o, key, plain[PLAIN_WIRE8]);
    snprintf(key, sizeof key, "%s_int4_wire_allgather_ms", backend);
    cJSON_AddNumberToObject(o, key, plain[PLAIN_WIRE4]);
    /* > 1: this path is faster than the backend's plain collective */
    cJSON_AddNumberToObject(o, "fwd_gather_speedup",
                            r->ms[1] > 0 ? plain[PLAIN_AG] / r->ms[1] : 0.0);
    cJSON_AddNumberToObject(o, "bwd_gather_speedup",
                            r->ms[2] > 0 ? plain[PLAIN_AG] / r->ms[2] : 0.0);
    cJSON_AddNumberToObject(o, "grad_reduce_speedup",
                            r->ms[3] > 0 ? plain[PLAIN_RS] / r->ms[3] : 0.0);
    /* the same, as the median over rounds of each round's own ratio: the
     * estimate to quote when the link drifts between rounds */
    cJSON_AddNumberToObject(o, "fwd_gather_speedup_paired", r->paired[0]);
    cJSON_AddNumberToObject(o, "bwd_gather_speedup_paired", r->paired[1]);
    cJSON_AddNumberToObject(o, "grad_reduce_speedup_paired", r->paired[2]);
    /* <= 1 up to noise: the plain all-gather of the same quantized bytes over
     * this path, for the paths that quantize */
    if (m->gather == ZPP_GATHER_QWZ) {
        cJSON_AddNumberToObject(o, "fwd_gather_vs_wire",
                                r->ms[1] > 0 ? plain[PLAIN_WIRE8] / r->ms[1] : 0.0);
        cJSON_AddNumberToObject(o, "fwd_gather_vs_wire_paired", r->wire_paired[0]);
    }
    if (m->reduce == ZPP_REDUCE_QGZ) {
        cJSON_AddNumberToObject(o, "grad_reduce_vs_wire",
                                r->ms[3] > 0 ? plain[PLAIN_WIRE4] / r->ms[3] : 0.0);
        cJSON_AddNumberToObject(o, "grad_reduce_vs_wire_paired", r->wire_paired[1]);
    }
    cJSON_AddBoolToObject(o, "correct", r->correct);
    cJSON_AddNumberToObject(o, "max_err_over_bound", r->worst);
    cJSON_AddBoolToObject(o, "plan_match", r->plan_match);
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

static void print_table(const bench_ctx *b, const bench_result *r,
                        const double plain[PLAIN_COUNT], const char *backend) {
    int z3 = b->o.mode_on[0] ? 0 : -1; /* the ratio column needs zero3's run */
    printf("zeropp bench comm: %zu parameters (%s) in %d units, world %d = %d node%s x %d, "
           "backend %s, %d timed step%s\n",
           b->o.params, zpp_dtype_name(b->o.dtype), b->o.units, b->W, b->topo->nodes,
           b->topo->nodes == 1 ? "" : "s", b->topo->node_size, backend, b->o.iters,
           b->o.iters == 1 ? "" : "s");
    printf("bytes per node per step (DESIGN.md section 5); time: median step, slowest rank\n\n");
    printf("%-7s | %10s %10s %10s %10s %7s | %10s %10s %10s %10s | %8s %8s %8s %8s | %s\n",
           "mode", "fwd cross", "bwd cross", "red cross", "cross", "/zero3", "fwd intra",
           "bwd intra", "red intra", "intra", "fwd ms", "bwd ms", "red ms", "step ms", "check");
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        if (!b->o.mode_on[m]) continue;
        const bench_result *x = &r[m];
        char s[8][32];
        double ct = zpp_volume_cross_total(&x->vol);
        char ratio[16] = "-";
        if (z3 == 0 && zpp_volume_cross_total(&r[0].vol) > 0)
            snprintf(ratio, sizeof ratio, "%.4f", ct / zpp_volume_cross_total(&r[0].vol));
        printf("%-7s | %10s %10s %10s %10s %7s | %10s %10s %10s %10s | %8.2f %8.2f %8.2f %8.2f "
               "| %s%s\n",
               zpp_coll_mode_get(m)->name, zpp_cli_bytes(x->vol.cross_node_bytes[kPhases[0]], s[0], 32),
               zpp_cli_bytes(x->vol.cross_node_bytes[kPhases[1]], s[1], 32),
               zpp_cli_bytes(x->vol.cross_node_bytes[kPhases[2]], s[2], 32), zpp_cli_bytes(ct, s[3], 32), ratio,
               zpp_cli_bytes(x->vol.intra_node_bytes[kPhases[0]], s[4], 32),
               zpp_cli_bytes(x->vol.intra_node_bytes[kPhases[1]], s[5], 32),
               zpp_cli_bytes(x->vol.intra_node_bytes[kPhases[2]], s[6], 32),
               zpp_cli_bytes(zpp_volume_intra_total(&x->vol), s[7], 32), x->ms[1], x->ms[2], x->ms[3],
               x->ms[0], x->correct ? "ok" : "WRONG",
               x->plan_match ? "" : " (volume differs from zeropp plan)");
    }
    printf("\n%s bf16 all-gather of every unit: %.2f ms; reduce-scatter: %.2f ms "
           "(the backend's own calls on the same tensors)\n",
           backend, plain[PLAIN_AG], plain[PLAIN_RS]);
    printf("%s all-gather of the quantized shards (the same cross-node bytes as qwZ's gather "
           "and qgZ's exchange): int8 %.2f ms, int4 %.2f ms\n",
           backend, plain[PLAIN_WIRE8], plain[PLAIN_WIRE4]);
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        if (!b->o.mode_on[m]) continue;
        const zpp_coll_mode *md = zpp_coll_mode_get(m);
        const bench_result *x = &r[m];
        printf("%-7s fwd gather vs %s bf16 allgather: %.2fx (%.2fx)   bwd gather: %.2fx (%.2fx)   "
               "grad reduce vs reduce-scatter: %.2fx (%.2fx)\n",
               md->name, backend, x->ms[1] > 0 ? plain[PLAIN_AG] / x->ms[1] : 0.0, x->paired[0],
               x->ms[2] > 0 ? plain[PLAIN_AG] / x->ms[2] : 0.0, x->paired[1],
               x->ms[3] > 0 ? plain[PLAIN_RS] / x->ms[3] : 0.0, x->paired[2]);
        if (md->gather == ZPP_GATHER_QWZ)
            printf("%-7s fwd gather vs the int8 wire all-gather: %.2fx (%.2fx)\n", md->name,
                   x->ms[1] > 0 ? plain[PLAIN_WIRE8] / x->ms[1] : 0.0, x->wire_paired[0]);
        if (md->reduce == ZPP_REDUCE_QGZ)
            printf("%-7s grad reduce vs the int4 wire all-gather: %.2fx (%.2fx)\n", md->name,
                   x->ms[3] > 0 ? plain[PLAIN_WIRE4] / x->ms[3] : 0.0, x->wire_paired[1]);
    }
    printf("(x > 1: faster than the plain collective; ratio of the medians, and in brackets "
           "the median of each round's ratio)\n");
}

/* ---- Entry ------------------------------------------------------------------------ */

static int parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->units = 8;
    o->iters = 5;
    o->seed = 1;
    o->dtype = ZPP_BF16;
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) o->mode_on[m] = 1;
    /* every rank parses the same line: rank 0 alone prints the verdict */
    const int print = zpp_comm_world_rank() == 0;
    const char *slab = NULL, *dtype = NULL, *device = NULL, *modes = NULL;
    const zpp_cli_opt opts[] = {
        {"--json", ZPP_CLI_FLAG, &o->json, 0, 0},
        {"--emulate-nodes", ZPP_CLI_FLAG, &o->emulate_nodes, 0, 0},
        {"--weight-block", ZPP_CLI_INT, &o->weight_block, 1, 1 << 24},
        {"--grad-block", ZPP_CLI_INT, &o->grad_block, 1, 1 << 24},
        {"--grad-slab", ZPP_CLI_STR, &slab, 0, 0},
        {"--params", ZPP_CLI_SIZE, &o->params, 1, 1ll << 53},
        {"--units", ZPP_CLI_INT, &o->units, 1, 1 << 24},
        {"--node-size", ZPP_CLI_INT, &o->node_size, 1, 1 << 24},
        {"--iters", ZPP_CLI_INT, &o->iters, 1, 1 << 24},
        {"--seed", ZPP_CLI_U64, &o->seed, 0, 1ll << 53},
        {"--dtype", ZPP_CLI_STR, &dtype, 0, 0},
        {"--device", ZPP_CLI_STR, &device, 0, 0},
        {"--modes", ZPP_CLI_STR, &modes, 0, 0},
    };
    int pr = zpp_cli_parse_opts("bench comm", argc, argv, opts,
                                (int)(sizeof opts / sizeof opts[0]), print);
    if (pr > 0) {
        if (print) usage(stdout);
        return 1;
    }
    if (pr < 0) return 2;
    const char *a = NULL, *v = NULL;
    if (slab) {
        a = "--grad-slab", v = slab;
        if (!strcmp(v, "auto")) o->grad_slab = 0;
        else if (!strcmp(v, "off")) o->grad_slab = SIZE_MAX;
        else if (zpp_cli_parse_count(v, &o->grad_slab) || !o->grad_slab) goto bad_value;
    }
    if (dtype) {
        a = "--dtype", v = dtype;
        if (zpp_dtype_parse(v, &o->dtype) != ZPP_OK) goto bad_value;
    }
    if (device) {
        a = "--device", v = device;
        if (!strcmp(v, "gpu")) o->gpu = 1;
        else if (strcmp(v, "cpu")) goto bad_value;
    }
    if (modes) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", modes);
        memset(o->mode_on, 0, sizeof o->mode_on);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            const zpp_coll_mode *md;
            if (zpp_coll_mode_parse(tok, &md) != ZPP_OK) {
                if (print) zpp_cli_fail("bench comm: --modes", ZPP_ERR_INVALID);
                return 2;
            }
            o->mode_on[md - zpp_coll_mode_get(0)] = 1;
        }
    }
    if (0) {
    bad_value:
        if (print) fprintf(stderr, "zeropp bench comm: bad value '%s' for %s\n", v, a);
        return 2;
    }
    if (!o->params) {
        if (print) {
            fprintf(stderr, "zeropp bench comm: --params is required\n\n");
            usage(stderr);
        }
        return 2;
    }
    return 0;
}

int zpp_cli_bench_comm(int argc, char **argv) {
    bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    /* MPI is initialised by main.c. */
    bench_ctx b;
    memset(&b, 0, sizeof b);
    b.o = o;
    /* Setup fails alike on every rank (each step agrees): every rank holds
     * the lowest failing rank's message, and rank 0 prints it once. */
    zpp_status st = zpp_comm_agree_world(setup(&b));
    if (st != ZPP_OK) {
        if (zpp_comm_world_rank() == 0) zpp_cli_fail("bench comm: setup", st);
        teardown(&b);
        return 1;
    }
    const char *backend = b.topo->world->ops->name;

    bench_result res[ZPP_COLL_MODE_COUNT];
    memset(res, 0, sizeof res);
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        if (o.mode_on[m]) check_mode(&b, zpp_coll_mode_get(m), &res[m]);
    double plain[PLAIN_COUNT];
    time_modes(&b, res, plain);

    int all_ok = 1;
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        if (o.mode_on[m] && (!res[m].correct || !res[m].plan_match)) all_ok = 0;
    if (b.rank == 0) {
        if (o.json) {
            double z3 = 0;
            if (o.mode_on[0]) z3 = zpp_volume_cross_total(&res[0].vol);
            else {
                zpp_volume v;
                if (zpp_plan_step(o.params, o.units, b.W, b.topo->node_size, zpp_coll_mode_get(0),
                                  o.dtype, &b.copts, &v) == ZPP_OK)
                    z3 = zpp_volume_cross_total(&v);
            }
            for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
                if (o.mode_on[m]) print_json(&b, zpp_coll_mode_get(m), &res[m], z3, plain, backend);
        } else {
            print_table(&b, res, plain, backend);
            if (b.topo->note[0]) printf("note: %s\n", b.topo->note);
        }
        fflush(stdout);
        if (!all_ok)
            fprintf(stderr, "zeropp bench comm: a result was outside its error bound or the "
                            "volume differed from the plan (see \"correct\" / \"plan_match\")\n");
    }
    teardown(&b);
    return all_ok ? 0 : 1;
}

/* test_comm_nccl.c — the NCCL backend on real GPUs, against references.
 *
 * Run with 2 ranks: one GPU each (a rank uses GPU local rank % GPU count),
 * or both on one GPU. NCCL refuses two ranks on one GPU of one host, so when
 * a host has fewer GPUs than ranks every rank gets its own NCCL_HOSTID (its
 * own emulated host; sockets between them, DESIGN.md §6) and the tests run
 * all the same, except the one that is about the same-host path
 * (test_nccl_one_node), which skips (zpp_test_skip: "SKIP: ..." and exit
 * 77, which ctest reports as skipped). With no GPU at all every case skips.
 *
 * GPU memory, streams and copies go through the device API
 * (device/device.h); this file makes no CUDA runtime call.
 * Every topology is checked on all six of its communicators (world, intra,
 * inter and the reductions' copies, zpp_topo.red_*, which run on a second
 * stream; check_two_streams has both streams busy at once) with fresh
 * random data generated per rank from the agreed seed;
 * each rank regenerates every peer's data, so each can compute the exact
 * expected output on its own.
 *
 * Compute-stream ordering is part of what is tested: inputs are produced on
 * the compute stream behind a large device copy (so they land late), the
 * collective is started, more work is queued on the compute stream, then the
 * request is waited on and the output copied back on the compute stream. If
 * the backend did not order its stream after the compute stream (or the
 * compute stream after the collective), the collective would read unfinished
 * inputs or the copy would read the sentinel the output was filled with.
 *
 * NCCL_HOSTID is read once per process by NCCL, so emulated nodes (distinct
 * NCCL_HOSTID per node) cannot follow an ordinary topology in one process.
 * ctest therefore runs each test function as its own process (CASE lines in
 * comm_nccl.cmake); test_nccl_emulated_nodes (2 emulated nodes of 1 rank,
 * which talk over NCCL's socket transport) needs that, and so does
 * test_nccl_emulated_nodes_of_two (also run at 4 ranks: 2 nodes of 2, whose
 * ranks share the GPU on a host with one, each then its own NCCL host; it
 * also checks qwZ, hpZ and qgZ against the MPI backend byte for byte).
 *
 * Not tested: an error code returned by NCCL itself (the NCCLCHECK path with
 * NCCL's message). NCCL's own argument checks are all preceded by the
 * backend's, so NCCL never sees a bad argument, and the failures left — a
 * bad device pointer, an internal or network error — either poison the CUDA
 * context for the rest of the program or cannot be caused on demand. What
 * is tested: argument errors come back as ZPP_ERR_INVALID with a message on
 * every rank and leave the communicators usable; a topology that would need
 * a second NCCL_HOSTID is refused with ZPP_ERR_STATE naming it; and a peer
 * that does not arrive makes a host-side wait time out, abort the
 * communicator and report, instead of hanging. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "collectives/coll_data.h"
#include "collectives/collectives.h"
#include "comm/comm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "testlib.h"

/* The six communicators of a topology: world, intra, inter and the
 * reductions' copies of them (zpp_topo.red_*, on a stream of their own). */
enum { WHICH_WORLD = 0, WHICH_INTRA = 1, WHICH_INTER = 2, WHICH_RED_WORLD = 3, WHICH_COUNT = 6 };
static const char *const which_name[WHICH_COUNT] = {
    "world", "intra", "inter", "world (reduce)", "intra (reduce)", "inter (reduce)"};

enum { OP_ALLGATHER = 1, OP_RS_F32, OP_RS_BF16, OP_ALLTOALL, OP_AR_F32, OP_AR_BF16, OP_AR_F16,
       OP_BCAST, OP_AGREE, OP_MANY, OP_TWO_STREAMS };

typedef struct ctx {
    zpp_topo *topo;
    zpp_device *dev; /* the rank's GPU; its compute stream orders everything */
    int iter;        /* distinguishes repeated calls in the data seeds */
    void *busy_a, *busy_b;
} ctx;

#define BUSY_BYTES ((size_t)128 << 20)

/* ---- Set-up --------------------------------------------------------------- */

static int world_size(void) {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

/* Ranks the launcher put on this host. */
static int ranks_here(void) {
    int local = 0, size = 0;
    EXPECT_OK(zpp_comm_launch_local(&local, &size));
    return size;
}

/* GPUs this host shows each rank. */
static int gpus_here(void) {
    int ndev = zpp_device_gpu_count();
    EXPECT(ndev > 0,
           "no GPU visible to rank %d: this test needs an NVIDIA GPU; run it on a GPU machine "
           "(ctest -L gpu) with the driver loaded",
           zpp_test_rank);
    return ndev;
}

/* 1 when the ranks of this host share GPUs (fewer GPUs than ranks). */
static int sharing_gpus(void) { return gpus_here() < ranks_here(); }

/* The GPU of this rank: its local rank modulo the GPUs it sees. When ranks
 * share a GPU, each gets its own NCCL_HOSTID before NCCL first runs (a
 * topology with emulate_nodes sets its own, per emulated node). */
static int pick_device(void) {
    int local = 0, size = 0;
    EXPECT_OK(zpp_comm_launch_local(&local, &size));
    if (sharing_gpus() && !getenv("NCCL_HOSTID")) {
        char host[64] = "host", id[128];
        gethostname(host, sizeof host);
        host[sizeof host - 1] = '\0';
        snprintf(id, sizeof id, "%s-zpptest-rank%d", host, zpp_test_rank);
        EXPECT(setenv("NCCL_HOSTID", id, 1) == 0);
    }
    return local % gpus_here();
}

/* A test about what only several GPUs of one host have (NVLink, peer
 * access): skips (zpp_test_skip, on every rank) when the ranks share GPUs. */
static void skip_without_gpus(const char *test) {
    /* ranks_here() is collective (an MPI split): every rank asks, and all
     * reach the same decision, so all skip together. */
    const int gpus = gpus_here(), ranks = ranks_here();
    if (gpus < ranks)
        zpp_test_skip("%s needs one GPU per rank (NVLink between them): it runs the ranks of "
                      "one node on distinct GPUs, and this host shows %d GPU(s) for %d ranks; "
                      "run it on a host with 2 GPUs",
                      test, gpus, ranks);
}

/* The device of the open ctx (one at a time), for the allocation helpers. */
static zpp_device *cur_dev;

/* Set once a topology was built: NCCL has then fixed its NCCL_HOSTID. */
static int nccl_used;

static void ctx_open(ctx *cx, int node_size, int emulate) {
    memset(cx, 0, sizeof *cx);
    nccl_used = 1;
    EXPECT_OK(zpp_device_create_gpu(pick_device(), &cx->dev));
    EXPECT_OK(zpp_device_alloc(cx->dev, BUSY_BYTES, &cx->busy_a));
    EXPECT_OK(zpp_device_alloc(cx->dev, BUSY_BYTES, &cx->busy_b));
    EXPECT_OK(zpp_device_set(cx->dev, cx->busy_a, 1, BUSY_BYTES));
    cur_dev = cx->dev;
    zpp_topo_opts o = {ZPP_BACKEND_NCCL, node_size, cx->dev, emulate, 0.0};
    EXPECT_OK(zpp_topo_create_with_opts(&o, &cx->topo));
    const zpp_topo *t = cx->topo;
    /* (no '%' inside EXPECT's condition: it becomes part of the format) */
    int w = world_size(), want_node = zpp_test_rank / node_size;
    int want_local = zpp_test_rank - want_node * node_size;
    EXPECT(t->world_size == w && t->world_rank == zpp_test_rank && t->node_size == node_size &&
               t->nodes == w / node_size && t->node == want_node && t->local_rank == want_local,
           "topology %d/%d nodes %d node %d local %d", t->world_rank, t->world_size, t->nodes,
           t->node, t->local_rank);
    const zpp_comm *cs[WHICH_COUNT] = {t->world,     t->intra,     t->inter,
                                       t->red_world, t->red_intra, t->red_inter};
    const int want_rank[3] = {t->world_rank, t->local_rank, t->node};
    const int want_size[3] = {t->world_size, t->node_size, t->nodes};
    for (int k = 0; k < WHICH_COUNT; k++) {
        EXPECT(cs[k] && cs[k]->ops && strcmp(cs[k]->ops->name, "nccl") == 0,
               "%s communicator is not an NCCL one", which_name[k]);
        EXPECT(cs[k]->mem == ZPP_MEM_DEVICE, "%s: mem %d", which_name[k], (int)cs[k]->mem);
        EXPECT(cs[k]->rank == want_rank[k % 3] && cs[k]->size == want_size[k % 3],
               "%s: rank %d of %d, expected %d of %d", which_name[k], cs[k]->rank, cs[k]->size,
               want_rank[k % 3], want_size[k % 3]);
        /* the reductions' are communicators of their own */
        if (k >= 3) EXPECT(cs[k] != cs[k - 3], "%s is %s itself", which_name[k],
                           which_name[k - 3]);
    }
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    EXPECT(nvls && strcmp(nvls, "0") == 0, "NCCL_NVLS_ENABLE is '%s', must be 0",
           nvls ? nvls : "(unset)");
}

static void ctx_close(ctx *cx) {
    zpp_topo_destroy(cx->topo);
    EXPECT_OK(zpp_device_sync(cx->dev, NULL));
    zpp_device_free(cx->dev, cx->busy_a);
    zpp_device_free(cx->dev, cx->busy_b);
    zpp_device_destroy(cx->dev);
    cx->topo = NULL;
    cx->dev = NULL;
    cur_dev = NULL;
}

static zpp_comm *comm_of(const ctx *cx, int which) {
    const zpp_topo *t = cx->topo;
    zpp_comm *const cs[WHICH_COUNT] = {t->world,     t->intra,     t->inter,
                                       t->red_world, t->red_intra, t->red_inter};
    return cs[which];
}

/* World rank of member i of a communicator (see comm.h). */
static int member_world(const zpp_topo *t, int which, int i) {
    which %= 3; /* a reduction's communicator has the ranks of its twin */
    if (which == WHICH_WORLD) return i;
    if (which == WHICH_INTRA) return t->node * t->node_size + i;
    return i * t->node_size + t->local_rank;
}

/* Keeps the compute stream busy for a while (a device copy of BUSY_BYTES),
 * so that what is queued after it completes late. */
static void busy(const ctx *cx) {
    EXPECT_OK(zpp_device_copy(cx->dev, cx->busy_b, cx->busy_a, BUSY_BYTES));
}

/* ---- Data ------------------------------------------------------------------ */

/* Seed of the data that world rank `src` contributes (to `dst`, for
 * all-to-all) in call `iter` of `op` on communicator `which`. */
static uint64_t data_seed(int op, int which, int iter, int src, int dst) {
    uint64_t k = (uint64_t)op;
    k = k * 8 + (uint64_t)which;
    k = k * 4096 + (uint64_t)iter;
    k = k * 65536 + (uint64_t)src;
    k = k * 65536 + (uint64_t)(dst + 1);
    return zpp_test_seed(k);
}

static void gen_bytes(uint64_t seed, unsigned char *p, size_t n) {
    zpp_rng r = zpp_rng_make(seed);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(zpp_rng_u64(&r) >> 56);
}

/* Dyadic fp32 values k / 256 with |k| <= 1024: every partial sum of up to
 * 2^13 of them is a multiple of 2^-8 below 2^15, i.e. needs at most 23
 * significant bits, so fp32 addition is exact in any order and a
 * reduction must match the reference bit for bit. */
static void gen_dyadic(uint64_t seed, float *p, size_t n) {
    zpp_rng r = zpp_rng_make(seed);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((int)(zpp_rng_u64(&r) % 2049) - 1024) / 256.0f;
}

/* N(0,1) values rounded to `dtype` (so the inputs are exact in it). */
static void gen_normal(uint64_t seed, zpp_dtype dtype, void *p, size_t n) {
    zpp_rng r = zpp_rng_make(seed);
    for (size_t i = 0; i < n; i++) zpp_store_f32(p, dtype, i, (float)zpp_rng_normal(&r));
}

/* A size from the agreed seed: 1..max, sometimes tiny or odd. */
static size_t pick_size(int op, int which, int iter, size_t max) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(0x51e0000u + (uint64_t)(op * 8 + which) * 4096 +
                                           (uint64_t)iter));
    switch (iter % 3) {
    case 0: return 1 + zpp_rng_u64(&r) % 17;
    case 1: return 1 + zpp_rng_u64(&r) % 4099;
    default: return 1 + zpp_rng_u64(&r) % max;
    }
}

static void *host_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    EXPECT(p != NULL);
    return p;
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    EXPECT(cur_dev != NULL, "no GPU open");
    EXPECT_OK(zpp_device_alloc(cur_dev, bytes ? bytes : 1, &p));
    return p;
}

static void dev_free(void *p) { zpp_device_free(cur_dev, p); }

/* Upload behind the busy copy, so the data lands late on the compute stream. */
static void produce(const ctx *cx, void *dev, const void *host, size_t bytes) {
    busy(cx);
    EXPECT_OK(zpp_device_copy(cx->dev, dev, host, bytes));
}

/* Fills the output with a sentinel, ordered on the compute stream. */
static void poison(const ctx *cx, void *dev, size_t bytes) {
    EXPECT_OK(zpp_device_set(cx->dev, dev, 0xA5, bytes));
}

/* Waits (async form) after queueing more work, then copies back and syncs. */
static void finish(const ctx *cx, zpp_comm *c, zpp_comm_req *req, void *host, const void *dev,
                   size_t bytes) {
    if (req) {
        busy(cx); /* other work, queued while the collective runs */
        EXPECT_OK(zpp_comm_wait(c, req));
    }
    EXPECT_OK(zpp_device_copy(cx->dev, host, dev, bytes)); /* returns with the data */
}

/* ---- One check per operation ------------------------------------------------ */

/* In place: the input is this rank's block of the output (comm.h). */
static void check_allgather(ctx *cx, int which, int async, int in_place) {
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    size_t b = pick_size(OP_ALLGATHER, which, it, 1 << 20), n = (size_t)c->size;
    unsigned char *hs = host_alloc(b), *hr = host_alloc(n * b), *want = malloc(b);
    char *dr = dev_alloc(n * b);
    char *ds = in_place ? dr + (size_t)c->rank * b : dev_alloc(b);
    gen_bytes(data_seed(OP_ALLGATHER, which, it, t->world_rank, -1), hs, b);
    poison(cx, dr, n * b);
    produce(cx, ds, hs, b);
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_allgather(c, ds, dr, b, async ? &req : NULL));
    finish(cx, c, req, hr, dr, n * b);
    for (size_t i = 0; i < n; i++) {
        gen_bytes(data_seed(OP_ALLGATHER, which, it, member_world(t, which, (int)i), -1), want,
                  b);
        for (size_t k = 0; k < b; k++)
            EXPECT(hr[i * b + k] == want[k],
                   "%s allgather (%s%s, %zu B/rank): block %zu byte %zu is %u, expected %u",
                   which_name[which], async ? "async" : "blocking", in_place ? ", in place" : "",
                   b, i, k, hr[i * b + k], want[k]);
    }
    free(want);
    free(hs);
    free(hr);
    if (!in_place) dev_free(ds);
    dev_free(dr);
}

/* fp32 on dyadic values: exact. bf16 on N(0,1) values: NCCL combines the n
 * contributions with n-1 additions in some tree (ring, tree, ...), each
 * computed in fp32 and rounded to bf16. One rounded addition returns
 * (a + b)(1 + d) with |d| <= u = 2^-8 + 2^-24 + 2^-32 (fp32 then bf16 rounding,
 * unit roundoff 2^-24 and 2^-8). For any summation tree of n terms the
 * classic bound is |got - sum| <= gamma(n-1) * sum|x_i| with
 * gamma(k) = k u / (1 - k u). With one rank the result is the input itself. */
static void check_reduce_scatter(ctx *cx, int which, zpp_dtype dtype, int async) {
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    int op = dtype == ZPP_FP32 ? OP_RS_F32 : OP_RS_BF16;
    size_t cnt = pick_size(op, which, it, 1 << 18), n = (size_t)c->size;
    size_t es = zpp_dtype_size(dtype);
    void *hs = host_alloc(n * cnt * es), *hr = host_alloc(cnt * es), *other = malloc(n * cnt * es);
    void *ds = dev_alloc(n * cnt * es), *dr = dev_alloc(cnt * es);
    if (dtype == ZPP_FP32)
        gen_dyadic(data_seed(op, which, it, t->world_rank, -1), hs, n * cnt);
    else
        gen_normal(data_seed(op, which, it, t->world_rank, -1), dtype, hs, n * cnt);
    poison(cx, dr, cnt * es);
    produce(cx, ds, hs, n * cnt * es);
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_reduce_scatter(c, ds, dr, cnt, dtype, async ? &req : NULL));
    finish(cx, c, req, hr, dr, cnt * es);

    double *sum = calloc(cnt, sizeof *sum), *abs_sum = calloc(cnt, sizeof *abs_sum);
    size_t base = (size_t)c->rank * cnt;
    for (size_t i = 0; i < n; i++) {
        uint64_t sd = data_seed(op, which, it, member_world(t, which, (int)i), -1);
        if (dtype == ZPP_FP32)
            gen_dyadic(sd, other, n * cnt);
        else
            gen_normal(sd, dtype, other, n * cnt);
        for (size_t k = 0; k < cnt; k++) {
            double x = zpp_load_f32(other, dtype, base + k);
            sum[k] += x;
            abs_sum[k] += fabs(x);
        }
    }
    const double u = 0x1p-8 + 0x1p-24 + 0x1p-32, km = (double)(n - 1);
    const double gamma = km * u / (1.0 - km * u);
    for (size_t k = 0; k < cnt; k++) {
        double got = zpp_load_f32(hr, dtype, k);
        if (dtype == ZPP_FP32)
            EXPECT(got == sum[k], "%s reduce_scatter fp32 (%zu/rank): [%zu] = %.9g, exact %.9g",
                   which_name[which], cnt, k, got, sum[k]);
        else
            EXPECT(fabs(got - sum[k]) <= gamma * abs_sum[k],
                   "%s reduce_scatter bf16 (%zu/rank): [%zu] = %.6g, sum %.6g, error %.3g > "
                   "bound %.3g",
                   which_name[which], cnt, k, got, sum[k], fabs(got - sum[k]),
                   gamma * abs_sum[k]);
    }
    free(sum);
    free(abs_sum);
    free(other);
    free(hs);
    free(hr);
    dev_free(ds);
    dev_free(dr);
}

static void check_alltoall(ctx *cx, int which, int async) {
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    size_t b = pick_size(OP_ALLTOALL, which, it, 1 << 19), n = (size_t)c->size;
    unsigned char *hs = host_alloc(n * b), *hr = host_alloc(n * b), *want = malloc(b);
    void *ds = dev_alloc(n * b), *dr = dev_alloc(n * b);
    for (size_t j = 0; j < n; j++) /* block j goes to member j */
        gen_bytes(data_seed(OP_ALLTOALL, which, it, t->world_rank, member_world(t, which, (int)j)),
                  hs + j * b, b);
    poison(cx, dr, n * b);
    produce(cx, ds, hs, n * b);
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_alltoall(c, ds, dr, b, async ? &req : NULL));
    finish(cx, c, req, hr, dr, n * b);
    for (size_t i = 0; i < n; i++) { /* block i came from member i */
        gen_bytes(data_seed(OP_ALLTOALL, which, it, member_world(t, which, (int)i), t->world_rank),
                  want, b);
        for (size_t k = 0; k < b; k++)
            EXPECT(hr[i * b + k] == want[k],
                   "%s alltoall (%zu B/peer): block from member %zu byte %zu is %u, expected %u",
                   which_name[which], b, i, k, hr[i * b + k], want[k]);
    }
    free(want);
    free(hs);
    free(hr);
    dev_free(ds);
    dev_free(dr);
}

/* fp32 dyadic: exact (out of place). bf16 / fp16 N(0,1), in place: the bound
 * of check_reduce_scatter with u = 2^-8 (bf16) or 2^-11 (fp16), plus the
 * fp32 rounding 2^-24 on the way. */
static void check_allreduce(ctx *cx, int which, zpp_dtype dtype, int async) {
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    int op = dtype == ZPP_FP32 ? OP_AR_F32 : dtype == ZPP_BF16 ? OP_AR_BF16 : OP_AR_F16;
    int in_place = dtype != ZPP_FP32;
    size_t cnt = pick_size(op, which, it, 1 << 19), n = (size_t)c->size;
    size_t es = zpp_dtype_size(dtype);
    void *hs = host_alloc(cnt * es), *hr = host_alloc(cnt * es), *other = malloc(cnt * es);
    void *ds = dev_alloc(cnt * es), *dr = in_place ? ds : dev_alloc(cnt * es);
    if (dtype == ZPP_FP32)
        gen_dyadic(data_seed(op, which, it, t->world_rank, -1), hs, cnt);
    else
        gen_normal(data_seed(op, which, it, t->world_rank, -1), dtype, hs, cnt);
    if (!in_place) poison(cx, dr, cnt * es);
    produce(cx, ds, hs, cnt * es);
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_allreduce(c, ds, dr, cnt, dtype, async ? &req : NULL));
    finish(cx, c, req, hr, dr, cnt * es);

    double *sum = calloc(cnt, sizeof *sum), *abs_sum = calloc(cnt, sizeof *abs_sum);
    for (size_t i = 0; i < n; i++) {
        uint64_t sd = data_seed(op, which, it, member_world(t, which, (int)i), -1);
        if (dtype == ZPP_FP32)
            gen_dyadic(sd, other, cnt);
        else
            gen_normal(sd, dtype, other, cnt);
        for (size_t k = 0; k < cnt; k++) {
            double x = zpp_load_f32(other, dtype, k);
            sum[k] += x;
            abs_sum[k] += fabs(x);
        }
    }
    const double u = (dtype == ZPP_BF16 ? 0x1p-8 : 0x1p-11) + 0x1p-24 + 0x1p-32;
    const double km = (double)(n - 1), gamma = km * u / (1.0 - km * u);
    for (size_t k = 0; k < cnt; k++) {
        double got = zpp_load_f32(hr, dtype, k);
        if (dtype == ZPP_FP32)
            EXPECT(got == sum[k], "%s allreduce fp32 (%zu): [%zu] = %.9g, exact %.9g",
                   which_name[which], cnt, k, got, sum[k]);
        else
            EXPECT(fabs(got - sum[k]) <= gamma * abs_sum[k],
                   "%s allreduce %s in place (%zu): [%zu] = %.6g, sum %.6g, error %.3g > "
                   "bound %.3g",
                   which_name[which], zpp_dtype_name(dtype), cnt, k, got, sum[k],
                   fabs(got - sum[k]), gamma * abs_sum[k]);
    }
    free(sum);
    free(abs_sum);
    free(other);
    free(hs);
    free(hr);
    dev_free(ds);
    if (!in_place) dev_free(dr);
}

static void check_broadcast(ctx *cx, int which, int async) {
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    size_t b = pick_size(OP_BCAST, which, it, 1 << 20);
    zpp_rng r = zpp_rng_make(zpp_test_seed(0xb0000u + (uint64_t)it));
    int root = (int)(zpp_rng_u64(&r) % (uint64_t)c->size);
    unsigned char *h = host_alloc(b), *hr = host_alloc(b), *want = malloc(b);
    void *d = dev_alloc(b);
    gen_bytes(data_seed(OP_BCAST, which, it, member_world(t, which, root), -1), want, b);
    if (c->rank == root)
        memcpy(h, want, b);
    else
        memset(h, 0x5A, b);
    produce(cx, d, h, b);
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_broadcast(c, d, b, root, async ? &req : NULL));
    finish(cx, c, req, hr, d, b);
    for (size_t k = 0; k < b; k++)
        EXPECT(hr[k] == want[k], "%s broadcast (%zu B, root %d): byte %zu is %u, expected %u",
               which_name[which], b, root, k, hr[k], want[k]);
    free(want);
    free(h);
    free(hr);
    dev_free(d);
}

/* Failing together: one member (chosen from the agreed seed) fails with a
 * message of its own, a second one fails later in rank order with another;
 * every member must come back with the first one's status and exact
 * message. Then nobody fails: ZPP_OK. Host-side (MPI), so it works on any
 * NCCL communicator, even a broken one. */
static void check_agree(ctx *cx, int which) {
    zpp_comm *c = comm_of(cx, which);
    int it = cx->iter++;
    zpp_rng r = zpp_rng_make(data_seed(OP_AGREE, which, it, -1, -1));
    int first = (int)(zpp_rng_u64(&r) % (uint64_t)c->size);
    unsigned long long token = (unsigned long long)zpp_rng_u64(&r);
    char want[160];
    snprintf(want, sizeof want, "%s member %d: problem %llx; fix it", which_name[which], first,
             token);
    zpp_status st = ZPP_OK;
    zpp_error_clear();
    if (c->rank == first) st = zpp_error(ZPP_ERR_IO, "%s", want);
    else if (c->rank == c->size - 1) st = zpp_error(ZPP_ERR_CONFIG, "a later failure");
    zpp_status got = zpp_comm_agree(c, st);
    EXPECT(got == ZPP_ERR_IO && strcmp(zpp_last_error(), want) == 0,
           "%s agree: %s '%s', expected %s '%s'", which_name[which], zpp_status_str(got),
           zpp_last_error(), zpp_status_str(ZPP_ERR_IO), want);
    EXPECT_OK(zpp_comm_agree(c, ZPP_OK));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Member 0 arrives 0.3 s late; every other member must be held until then
 * (allowing 0.1 s of slack for how far apart the ranks left MPI_Barrier). */
static void check_barrier(ctx *cx, int which) {
    zpp_comm *c = comm_of(cx, which);
    EXPECT_OK(zpp_comm_barrier(c)); /* warm */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    if (c->rank == 0) {
        struct timespec d = {0, 300000000L};
        nanosleep(&d, NULL);
    }
    EXPECT_OK(zpp_comm_barrier(c));
    double dt = now_s() - t0;
    if (c->size > 1 && c->rank != 0)
        EXPECT(dt > 0.2, "%s barrier returned after %.3f s, before the late member arrived",
               which_name[which], dt);
}

/* Many requests in flight at once (more than the initial pool), waited in
 * reverse order: each must still order the compute stream after its own
 * collective. */
static void check_many_in_flight(ctx *cx, int which) {
    enum { K = 40 };
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    size_t cnt = 1000 + (size_t)it % 97, n = (size_t)c->size;
    float *hs = host_alloc(K * cnt * 4), *hr = host_alloc(K * cnt * 4), *other = malloc(cnt * 4);
    float *ds = dev_alloc(K * cnt * 4), *dr = dev_alloc(K * cnt * 4);
    for (int j = 0; j < K; j++)
        gen_dyadic(data_seed(OP_MANY, which, it * K + j, t->world_rank, -1), hs + j * cnt, cnt);
    poison(cx, dr, K * cnt * 4);
    zpp_comm_req *req[K];
    for (int j = 0; j < K; j++) {
        produce(cx, ds + j * cnt, hs + j * cnt, cnt * 4);
        EXPECT_OK(zpp_comm_allreduce(c, ds + j * cnt, dr + j * cnt, cnt, ZPP_FP32, &req[j]));
    }
    for (int j = K - 1; j >= 0; j--) {
        EXPECT_OK(zpp_comm_wait(c, req[j]));
        EXPECT_OK(zpp_device_copy(cx->dev, hr + j * cnt, dr + j * cnt, cnt * 4));
    }
    for (int j = 0; j < K; j++) {
        double *sum = calloc(cnt, sizeof *sum);
        for (size_t i = 0; i < n; i++) {
            gen_dyadic(data_seed(OP_MANY, which, it * K + j, member_world(t, which, (int)i), -1),
                       other, cnt);
            for (size_t k = 0; k < cnt; k++) sum[k] += other[k];
        }
        for (size_t k = 0; k < cnt; k++)
            EXPECT(hr[j * cnt + k] == sum[k], "%s request %d of %d: [%zu] = %.9g, exact %.9g",
                   which_name[which], j, K, k, hr[j * cnt + k], sum[k]);
        free(sum);
    }
    free(other);
    free(hs);
    free(hr);
    dev_free(ds);
    dev_free(dr);
}

/* Zero-sized operations are valid (tiny units leave some ranks nothing). */
static void check_zero_sizes(ctx *cx, int which) {
    zpp_comm *c = comm_of(cx, which);
    void *d = dev_alloc(16);
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_allgather(c, d, (char *)d + 8, 0, &req));
    EXPECT_OK(zpp_comm_wait(c, req));
    EXPECT_OK(zpp_comm_reduce_scatter(c, d, d, 0, ZPP_BF16, NULL));
    EXPECT_OK(zpp_comm_alltoall(c, d, d, 0, &req));
    EXPECT_OK(zpp_comm_wait(c, req));
    EXPECT_OK(zpp_comm_allreduce(c, d, d, 0, ZPP_FP16, NULL));
    EXPECT_OK(zpp_comm_broadcast(c, d, 0, 0, NULL));
    EXPECT_OK(zpp_device_sync(cx->dev, NULL));
    dev_free(d);
}

/* A gather-side and a reduction-side collective in flight at once, on the
 * world communicator and the reductions' copy of it (two streams), waited
 * in either order: each runs after the compute stream's work before it,
 * and the compute stream after each. Buffers change hands across the
 * streams the way the scratch pool hands them on: the all-gather of round
 * j + 1 sends from the buffer the reduce-scatter of round j wrote (new data
 * uploaded into it on the compute stream first), and that reduce-scatter
 * writes into the buffer the all-gather of round j sent from. A missing
 * order anywhere shows as a wrong block or a stale sum. */
static void check_two_streams(ctx *cx) {
    enum { K = 24 };
    zpp_comm *g = cx->topo->world, *r = cx->topo->red_world;
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    size_t cnt = 4096 + (size_t)it % 61, n = (size_t)g->size;
    float *ha = host_alloc(cnt * 4), *hb = host_alloc(n * cnt * 4);
    float *other = host_alloc(n * cnt * 4);
    float *hg = host_alloc(K * n * cnt * 4), *hr = host_alloc(K * cnt * 4);
    float *dbuf[2] = {dev_alloc(cnt * 4), dev_alloc(cnt * 4)}; /* swap roles each round */
    float *db = dev_alloc(n * cnt * 4), *dg = dev_alloc(K * n * cnt * 4),
          *dkeep = dev_alloc(K * cnt * 4);
    poison(cx, dg, K * n * cnt * 4);
    for (int j = 0; j < K; j++) {
        float *send = dbuf[j & 1], *recv = dbuf[(j + 1) & 1];
        gen_dyadic(data_seed(OP_TWO_STREAMS, WHICH_WORLD, it * K + j, t->world_rank, -1), ha,
                   cnt);
        gen_dyadic(data_seed(OP_TWO_STREAMS, WHICH_RED_WORLD, it * K + j, t->world_rank, -1), hb,
                   n * cnt);
        zpp_comm_req *qg = NULL, *qr = NULL;
        produce(cx, send, ha, cnt * 4);
        EXPECT_OK(zpp_comm_allgather(g, send, dg + (size_t)j * n * cnt, cnt * 4, &qg));
        produce(cx, db, hb, n * cnt * 4);
        poison(cx, recv, cnt * 4);
        EXPECT_OK(zpp_comm_reduce_scatter(r, db, recv, cnt, ZPP_FP32, &qr));
        busy(cx);
        if (j & 1) {
            EXPECT_OK(zpp_comm_wait(r, qr));
            EXPECT_OK(zpp_comm_wait(g, qg));
        } else {
            EXPECT_OK(zpp_comm_wait(g, qg));
            EXPECT_OK(zpp_comm_wait(r, qr));
        }
        EXPECT_OK(zpp_device_copy(cx->dev, dkeep + (size_t)j * cnt, recv, cnt * 4));
    }
    EXPECT_OK(zpp_device_copy(cx->dev, hg, dg, K * n * cnt * 4));
    EXPECT_OK(zpp_device_copy(cx->dev, hr, dkeep, K * cnt * 4));
    for (int j = 0; j < K; j++) {
        for (size_t i = 0; i < n; i++) {
            gen_dyadic(data_seed(OP_TWO_STREAMS, WHICH_WORLD, it * K + j, (int)i, -1), ha, cnt);
            EXPECT(memcmp(hg + ((size_t)j * n + i) * cnt, ha, cnt * 4) == 0,
                   "two streams, round %d: all-gather block %zu is not member %zu's data", j, i,
                   i);
        }
        double *sum = calloc(cnt, sizeof *sum);
        for (size_t i = 0; i < n; i++) {
            gen_dyadic(data_seed(OP_TWO_STREAMS, WHICH_RED_WORLD, it * K + j, (int)i, -1), other,
                       n * cnt);
            for (size_t k = 0; k < cnt; k++) sum[k] += other[(size_t)r->rank * cnt + k];
        }
        for (size_t k = 0; k < cnt; k++)
            EXPECT(hr[(size_t)j * cnt + k] == sum[k],
                   "two streams, round %d: reduce_scatter [%zu] = %.9g, exact %.9g", j, k,
                   hr[(size_t)j * cnt + k], sum[k]);
        free(sum);
    }
    free(ha);
    free(hb);
    free(other);
    free(hg);
    free(hr);
    dev_free(dbuf[0]);
    dev_free(dbuf[1]);
    dev_free(db);
    dev_free(dg);
    dev_free(dkeep);
}

static void check_all_ops(ctx *cx) {
    for (int which = 0; which < WHICH_COUNT; which++) {
        for (int rep = 0; rep < 3; rep++) {
            int async = rep != 1;
            check_allgather(cx, which, async, rep == 2);
            check_reduce_scatter(cx, which, ZPP_FP32, async);
            check_reduce_scatter(cx, which, ZPP_BF16, async);
            check_alltoall(cx, which, async);
            check_allreduce(cx, which, ZPP_FP32, async);
            check_allreduce(cx, which, ZPP_BF16, async);
            check_allreduce(cx, which, ZPP_FP16, async);
            check_broadcast(cx, which, async);
            check_agree(cx, which);
        }
        check_many_in_flight(cx, which);
        check_zero_sizes(cx, which);
        check_barrier(cx, which);
    }
    check_two_streams(cx);
}

/* ---- Gathers beside reductions: the engine's backward, in small ----------------
 * The engine's pattern of collectives and scratch (engine.c, backward):
 * unit u is gathered (the prefetched gather completed), unit u - 1's gather
 * starts, u's gradient is produced on the compute stream, u's gathered
 * buffer goes back to the pool, the previous reduction completes and its
 * buffers go back, and u's reduction starts. Gathers and reductions then
 * run on their two streams at once while buffers pass between them through
 * the device's scratch pool. Every gathered unit and every reduced shard is
 * copied aside on the compute stream as it completes, and checked at the
 * end. */

enum { BR_UNITS = 5, BR_STEPS = 3 };
static const size_t br_numel[BR_UNITS] = {(size_t)1 << 20, 300001, 7, 150000, 65539};

/* Seeds of rank r's shard (what = 0) and gradient (1) of unit u at step k. */
static uint64_t br_seed(int what, int k, int u, int r) {
    return zpp_test_seed(0xb5000000u +
                         (uint64_t)(((what * BR_STEPS + k) * BR_UNITS + u) * 64 + r));
}

/* Bytes of the record: each step's gathered units, then reduced shards. */
static size_t br_bytes(const zpp_topo *t, zpp_dtype dt) {
    size_t b = 0;
    for (int u = 0; u < BR_UNITS; u++) {
        zpp_partition p = zpp_partition_make(br_numel[u], t);
        b += p.padded * zpp_dtype_size(dt) + p.shard_len * 4;
    }
    return BR_STEPS * b;
}

/* Rank r's fp32 gradient of unit u at step k: dyadic, zero padding. */
static void br_grad(int k, int u, int r, const zpp_partition *p, float *g) {
    gen_dyadic(br_seed(1, k, u, r), g, p->numel);
    memset(g + p->numel, 0, (p->padded - p->numel) * 4);
}

/* Runs the backward passes; rec (device, br_bytes) receives the record. */
static void br_run(ctx *cx, zpp_gather_mode gm, zpp_reduce_mode rm, zpp_dtype dt, char *rec) {
    const zpp_topo *t = cx->topo;
    zpp_device *d = cx->dev;
    const size_t ds = zpp_dtype_size(dt);
    zpp_coll_opts o = zpp_coll_opts_default();
    o.grad_slab = 50000; /* qgZ in several slabs, each its own request */
    zpp_coll *c = NULL;
    EXPECT_OK(zpp_coll_create(cx->topo, &o, d, &c));
    zpp_partition part[BR_UNITS];
    void *shard[BR_UNITS];
    for (int u = 0; u < BR_UNITS; u++) {
        part[u] = zpp_partition_make(br_numel[u], t);
        shard[u] = dev_alloc(part[u].shard_len * ds);
    }
    float *hs = host_alloc(((size_t)1 << 20) * 4), *hg = host_alloc(((size_t)1 << 21) * 4);
    char *hsd = host_alloc(((size_t)1 << 20) * 4);
    size_t at = 0;
    for (int k = 0; k < BR_STEPS; k++) {
        /* the step's shards (as the optimizer would write them) */
        for (int u = 0; u < BR_UNITS; u++) {
            gen_dyadic(br_seed(0, k, u, t->world_rank), hs, part[u].shard_len);
            for (size_t i = 0; i < part[u].shard_len; i++) zpp_store_f32(hsd, dt, i, hs[i]);
            produce(cx, shard[u], hsd, part[u].shard_len * ds);
        }
        void *full[BR_UNITS] = {NULL};
        zpp_coll_op *gop[BR_UNITS] = {NULL}, *rop = NULL;
        void *r_in = NULL;
        float *r_out = NULL;
        for (int u = BR_UNITS - 1; u >= 0; u--) {
            if (!full[u]) {
                EXPECT_OK(zpp_device_scratch_get(d, part[u].padded * ds, &full[u]));
                EXPECT_OK(zpp_coll_gather_start(c, &part[u], gm, dt, shard[u], full[u], NULL,
                                                ZPP_PHASE_BWD_GATHER, &gop[u]));
            }
            EXPECT_OK(zpp_coll_finish(c, gop[u]));
            gop[u] = NULL;
            if (u > 0) {
                EXPECT_OK(zpp_device_scratch_get(d, part[u - 1].padded * ds, &full[u - 1]));
                EXPECT_OK(zpp_coll_gather_start(c, &part[u - 1], gm, dt, shard[u - 1],
                                                full[u - 1], NULL, ZPP_PHASE_BWD_GATHER,
                                                &gop[u - 1]));
            }
            /* "backward": the gradient, late on the compute stream */
            float *grad = NULL;
            EXPECT_OK(zpp_device_scratch_get(d, part[u].padded * 4, (void **)&grad));
            br_grad(k, u, t->world_rank, &part[u], hg);
            produce(cx, grad, hg, part[u].padded * 4);
            EXPECT_OK(zpp_device_copy(d, rec + at, full[u], part[u].padded * ds));
            at += part[u].padded * ds;
            zpp_device_scratch_put(d, full[u]);
            full[u] = NULL;
            if (rop) {
                EXPECT_OK(zpp_coll_finish(c, rop));
                EXPECT_OK(zpp_device_copy(d, rec + at, r_out, part[u + 1].shard_len * 4));
                at += part[u + 1].shard_len * 4;
                zpp_device_scratch_put(d, r_in);
                zpp_device_scratch_put(d, r_out);
            }
            EXPECT_OK(zpp_device_scratch_get(d, part[u].shard_len * 4, (void **)&r_out));
            r_in = grad;
            if (dt != ZPP_FP32) {
                EXPECT_OK(zpp_device_scratch_get(d, part[u].padded * ds, &r_in));
                EXPECT_OK(zpp_device_convert(d, grad, ZPP_FP32, r_in, dt, part[u].padded, 1.0f));
                zpp_device_scratch_put(d, grad);
            }
            EXPECT_OK(zpp_coll_reduce_start(c, &part[u], rm, dt, r_in, r_out, &rop));
        }
        EXPECT_OK(zpp_coll_finish(c, rop));
        EXPECT_OK(zpp_device_copy(d, rec + at, r_out, part[0].shard_len * 4));
        at += part[0].shard_len * 4;
        zpp_device_scratch_put(d, r_in);
        zpp_device_scratch_put(d, r_out);
    }
    EXPECT(at == br_bytes(t, dt), "recorded %zu bytes of %zu", at, br_bytes(t, dt));
    EXPECT_OK(zpp_device_sync(d, NULL));
    for (int u = 0; u < BR_UNITS; u++) dev_free(shard[u]);
    free(hs);
    free(hg);
    free(hsd);
    zpp_coll_destroy(c);
}

/* The exact reduced shard of unit u at step k (fp32): the mean of the
 * ranks' dyadic gradients, exact. Returns the bytes it covered. */
static size_t br_check_reduced(const zpp_topo *t, int k, int u, const float *got, float *hg) {
    const int W = t->world_size;
    zpp_partition p = zpp_partition_make(br_numel[u], t);
    double *sum = calloc(p.shard_len, sizeof *sum);
    for (int r = 0; r < W; r++) {
        br_grad(k, u, r, &p, hg);
        for (size_t i = 0; i < p.shard_len; i++)
            sum[i] += hg[(size_t)t->world_rank * p.shard_len + i];
    }
    for (size_t i = 0; i < p.shard_len; i++) {
        const float want = (float)sum[i] * (1.0f / (float)W);
        EXPECT(got[i] == want, "step %d unit %d: reduced [%zu] = %.9g, exact %.9g", k, u, i,
               got[i], want);
    }
    free(sum);
    return p.shard_len * 4;
}

/* The exact record of the fp32 ZeRO-3 run: gathers are the ranks' shards
 * in rank order, reductions the means (in br_run's order: gather u, then
 * the reduction of u + 1; unit 0's reduction last). */
static void br_check_exact(const zpp_topo *t, const char *rec) {
    float *hs = host_alloc(((size_t)1 << 20) * 4), *hg = host_alloc(((size_t)1 << 21) * 4);
    size_t at = 0;
    for (int k = 0; k < BR_STEPS; k++) {
        for (int u = BR_UNITS - 1; u >= 0; u--) {
            zpp_partition p = zpp_partition_make(br_numel[u], t);
            for (int r = 0; r < t->world_size; r++) {
                gen_dyadic(br_seed(0, k, u, r), hs, p.shard_len);
                EXPECT(memcmp(rec + at + (size_t)r * p.shard_len * 4, hs, p.shard_len * 4) == 0,
                       "step %d unit %d: gathered block %d is not rank %d's shard", k, u, r, r);
            }
            at += p.padded * 4;
            if (u + 1 < BR_UNITS)
                at += br_check_reduced(t, k, u + 1, (const float *)(rec + at), hg);
        }
        at += br_check_reduced(t, k, 0, (const float *)(rec + at), hg);
    }
    free(hs);
    free(hg);
}

/* ZeRO-3 (fp32, checked exactly) and ZeRO++ (qwZ + qgZ, bf16), with the
 * reductions on their own stream and, for reference, on the gathers'
 * (ZPP_NCCL_REDUCE_STREAM=0): the two records must be equal bit for bit
 * (the sums are of 2 terms or exact, everything else is deterministic), so
 * a reduction or gather that read or wrote a buffer at the wrong time shows
 * as a difference. Nodes of one rank (qgZ across nodes) and one node of
 * every rank (qgZ inside the node). */
static void test_nccl_reduce_beside_gathers(void) {
    static const struct {
        zpp_gather_mode g;
        zpp_reduce_mode r;
        zpp_dtype dt;
    } modes[2] = {{ZPP_GATHER_BASELINE, ZPP_REDUCE_BASELINE, ZPP_FP32},
                  {ZPP_GATHER_QWZ, ZPP_REDUCE_QGZ, ZPP_BF16}};
    const int node_sizes[2] = {1, world_size()};
    for (int ns = 0; ns < 2; ns++) {
        for (int m = 0; m < 2; m++) {
            char *host[2] = {NULL, NULL};
            size_t bytes = 0;
            for (int two = 0; two < 2; two++) {
                EXPECT(setenv("ZPP_NCCL_REDUCE_STREAM", two ? "1" : "0", 1) == 0);
                ctx cx;
                ctx_open(&cx, node_sizes[ns], 0);
                EXPECT(unsetenv("ZPP_NCCL_REDUCE_STREAM") == 0);
                bytes = br_bytes(cx.topo, modes[m].dt);
                char *rec = dev_alloc(bytes);
                br_run(&cx, modes[m].g, modes[m].r, modes[m].dt, rec);
                host[two] = host_alloc(bytes);
                EXPECT_OK(zpp_device_copy(cx.dev, host[two], rec, bytes));
                if (m == 0) br_check_exact(cx.topo, host[two]);
                dev_free(rec);
                ctx_close(&cx);
            }
            size_t first = bytes;
            for (size_t i = 0; i < bytes && first == bytes; i++)
                if (host[0][i] != host[1][i]) first = i;
            EXPECT(first == bytes,
                   "node size %d, %s: the run with a reduction stream differs from the one "
                   "stream run at byte %zu of %zu",
                   node_sizes[ns], m ? "qwZ + qgZ" : "ZeRO-3", first, bytes);
            free(host[0]);
            free(host[1]);
        }
    }
}

/* ---- Hierarchical collectives against the MPI backend -------------------------
 * qwZ's gather keeping hpZ's secondary shard, hpZ's gather of secondary
 * shards inside the node, and qgZ's two-hop reduction (stochastic int4), on
 * the NCCL topology and on an MPI topology of the same nodes with host
 * buffers and the host device. Every output must be the same bytes on both:
 * the quantization kernels equal the CPU's bit for bit (test_quant_cuda),
 * every sum is one of our kernels, in the same order on both, and the
 * exchanges only move bytes. The collectives' byte counts must be equal too. */

enum { HIER_UNITS = 4 };
static const size_t hier_numel[HIER_UNITS] = {((size_t)1 << 18) + 7, 40001, 1000, 3};

/* The record of one unit: gathered (bf16, padded), gathered again from the
 * secondary shards (bf16, padded), reduced shard (fp32). */
static size_t hier_unit_bytes(const zpp_partition *p) { return 4 * p->padded + 4 * p->shard_len; }

static size_t hier_bytes(const zpp_topo *t) {
    size_t b = 0;
    for (int u = 0; u < HIER_UNITS; u++) {
        zpp_partition p = zpp_partition_make(hier_numel[u], t);
        b += hier_unit_bytes(&p);
    }
    return b;
}

/* Runs the three collectives on every unit; rec (host, hier_bytes) gets the
 * record, *vol the collectives' volume. */
static void hier_run(zpp_topo *t, zpp_device *d, unsigned char *rec, zpp_volume *vol) {
    zpp_coll_opts o = zpp_coll_opts_default();
    o.grad_spec.stochastic = 1;
    zpp_coll *c = NULL;
    EXPECT_OK(zpp_coll_create(t, &o, d, &c));
    zpp_coll_set_round(c, 3);
    const uint64_t seed = zpp_test_seed(0x41e2);
    size_t at = 0;
    for (int u = 0; u < HIER_UNITS; u++) {
        const zpp_partition p = zpp_partition_make(hier_numel[u], t);
        uint16_t *hs = host_alloc(p.shard_len * 2), *hg = host_alloc(p.padded * 2);
        for (size_t i = 0; i < p.shard_len; i++)
            zpp_store_f32(hs, ZPP_BF16, i,
                          zpp_coll_data_weight(seed, (uint64_t)u,
                                               (size_t)t->world_rank * p.shard_len + i, p.numel,
                                               ZPP_BF16));
        for (size_t i = 0; i < p.padded; i++)
            zpp_store_f32(hg, ZPP_BF16, i,
                          zpp_coll_data_grad(seed, (uint64_t)u, t->world_rank, i, p.numel,
                                             ZPP_BF16, 0));
        void *shard, *full, *sec, *full2, *grad, *red;
        EXPECT_OK(zpp_device_alloc(d, p.shard_len * 2, &shard));
        EXPECT_OK(zpp_device_alloc(d, p.padded * 2, &full));
        EXPECT_OK(zpp_device_alloc(d, p.sec_len * 2, &sec));
        EXPECT_OK(zpp_device_alloc(d, p.padded * 2, &full2));
        EXPECT_OK(zpp_device_alloc(d, p.padded * 2, &grad));
        EXPECT_OK(zpp_device_alloc(d, p.shard_len * 4, &red));
        EXPECT_OK(zpp_device_copy(d, shard, hs, p.shard_len * 2));
        EXPECT_OK(zpp_device_copy(d, grad, hg, p.padded * 2));
        zpp_coll_op *op = NULL;
        EXPECT_OK(zpp_coll_gather_start(c, &p, ZPP_GATHER_QWZ, ZPP_BF16, shard, full, sec,
                                        ZPP_PHASE_FWD_GATHER, &op));
        EXPECT_OK(zpp_coll_finish(c, op));
        EXPECT_OK(zpp_coll_gather_secondary_start(c, &p, ZPP_BF16, sec, full2,
                                                  ZPP_PHASE_BWD_GATHER, &op));
        EXPECT_OK(zpp_coll_finish(c, op));
        EXPECT_OK(zpp_coll_reduce_start(c, &p, ZPP_REDUCE_QGZ, ZPP_BF16, grad, red, &op));
        EXPECT_OK(zpp_coll_finish(c, op));
        EXPECT_OK(zpp_device_copy(d, rec + at, full, p.padded * 2));
        EXPECT_OK(zpp_device_copy(d, rec + at + p.padded * 2, full2, p.padded * 2));
        EXPECT_OK(zpp_device_copy(d, rec + at + p.padded * 4, red, p.shard_len * 4));
        at += hier_unit_bytes(&p);
        void *bufs[6] = {shard, full, sec, full2, grad, red};
        for (int k = 0; k < 6; k++) zpp_device_free(d, bufs[k]);
        free(hs);
        free(hg);
    }
    EXPECT_OK(zpp_device_sync(d, NULL));
    *vol = *zpp_coll_volume(c);
    zpp_coll_destroy(c);
}

/* The NCCL topology of cx against an MPI one of the same node size. */
static void check_hierarchical_matches_mpi(ctx *cx) {
    zpp_topo *t = cx->topo;
    const size_t bytes = hier_bytes(t);
    unsigned char *got = host_alloc(bytes), *want = host_alloc(bytes);
    zpp_volume vg, vw;
    hier_run(t, cx->dev, got, &vg);
    zpp_device *host = NULL;
    EXPECT_OK(zpp_device_create_host(&host));
    zpp_topo_opts o = {ZPP_BACKEND_MPI, t->node_size, NULL, 0, 0.0};
    zpp_topo *mt = NULL;
    EXPECT_OK(zpp_topo_create_with_opts(&o, &mt));
    EXPECT(mt->node == t->node && mt->local_rank == t->local_rank && mt->nodes == t->nodes,
           "MPI topology: node %d local %d of %d nodes; NCCL: node %d local %d of %d", mt->node,
           mt->local_rank, mt->nodes, t->node, t->local_rank, t->nodes);
    hier_run(mt, host, want, &vw);
    zpp_topo_destroy(mt);
    zpp_device_destroy(host);
    static const char *const part_name[3] = {"the qwZ gather", "the hpZ gather of secondary "
                                             "shards", "the qgZ reduction"};
    size_t at = 0;
    for (int u = 0; u < HIER_UNITS; u++) {
        const zpp_partition p = zpp_partition_make(hier_numel[u], t);
        const size_t len[3] = {p.padded * 2, p.padded * 2, p.shard_len * 4};
        for (int k = 0; k < 3; k++) {
            size_t first = len[k];
            for (size_t i = 0; i < len[k] && first == len[k]; i++)
                if (got[at + i] != want[at + i]) first = i;
            /* the element holding the first differing byte, as a number */
            size_t es = k == 2 ? 4 : 2, el = first / es;
            float gv = 0, wv = 0;
            if (first < len[k]) {
                gv = k == 2 ? ((const float *)(got + at))[el]
                            : zpp_load_f32(got + at, ZPP_BF16, el);
                wv = k == 2 ? ((const float *)(want + at))[el]
                            : zpp_load_f32(want + at, ZPP_BF16, el);
            }
            EXPECT(first == len[k],
                   "rank %d (node %d of %d), unit %d (%zu elements): %s differs from the MPI "
                   "backend's at byte %zu of %zu (0x%02x, MPI 0x%02x): element %zu is %.9g, "
                   "MPI %.9g",
                   t->world_rank, t->node, t->nodes, u, p.numel, part_name[k], first, len[k],
                   got[at + first], want[at + first], el, (double)gv, (double)wv);
            at += len[k];
        }
    }
    for (int ph = 0; ph < ZPP_PHASE_COUNT; ph++)
        EXPECT(vg.cross_node_bytes[ph] == vw.cross_node_bytes[ph] &&
                   vg.intra_node_bytes[ph] == vw.intra_node_bytes[ph] &&
                   vg.calls[ph] == vw.calls[ph],
               "%s: NCCL %.0f cross + %.0f intra bytes in %llu calls, MPI %.0f + %.0f in %llu",
               zpp_phase_name((zpp_phase)ph), vg.cross_node_bytes[ph],
               vg.intra_node_bytes[ph], (unsigned long long)vg.calls[ph],
               vw.cross_node_bytes[ph], vw.intra_node_bytes[ph],
               (unsigned long long)vw.calls[ph]);
    free(got);
    free(want);
}

/* ---- Tests ------------------------------------------------------------------- */

/* One node of every rank (NVLink between the GPUs). */
static void test_nccl_one_node(void) {
    skip_without_gpus("test_nccl_one_node");
    ctx cx;
    ctx_open(&cx, world_size(), 0);
    check_all_ops(&cx);
    ctx_close(&cx);
}

/* Nodes of one rank without emulation (intra has size 1, inter spans the
 * world). */
static void test_nccl_nodes_of_one(void) {
    ctx cx;
    ctx_open(&cx, 1, 0);
    check_all_ops(&cx);
    ctx_close(&cx);
}

/* Argument errors come back as ZPP_ERR_INVALID with a message, identically
 * on every rank (so nobody hangs), and leave the communicators usable. */
static void test_nccl_invalid_arguments(void) {
    ctx cx;
    ctx_open(&cx, world_size(), 0);
    zpp_comm *c = cx.topo->world;
    size_t n = (size_t)c->size;
    char *d = dev_alloc(4096 * (n + 1));
    zpp_comm_req *req = (zpp_comm_req *)&cx; /* must stay untouched on error */
    zpp_comm_req *const untouched = req;

    EXPECT_STATUS(zpp_comm_reduce_scatter(c, d, d + 4096 * n, 16, (zpp_dtype)7, &req),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "dtype 7") != NULL, "message: %s", zpp_last_error());
    EXPECT(req == untouched, "req_p was written on error");
    EXPECT_STATUS(zpp_comm_allreduce(c, d, d, 16, (zpp_dtype)-1, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "dtype") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_comm_broadcast(c, d, 16, c->size, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "root") != NULL, "message: %s", zpp_last_error());
    /* recv overlaps send: block 0 of the output is the input itself. */
    EXPECT_STATUS(zpp_comm_allgather(c, d + 8, d, 64, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "overlap") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_comm_allreduce(c, d, d + 4, 16, ZPP_FP32, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_comm_alltoall(c, NULL, d, 8, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_comm_reduce_scatter(c, d, d + 8, SIZE_MAX / 2, ZPP_BF16, NULL),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "overflows") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_comm_barrier(NULL), ZPP_ERR_INVALID);

    /* Still in step and usable. */
    check_agree(&cx, WHICH_WORLD);
    check_allreduce(&cx, WHICH_WORLD, ZPP_FP32, 1);
    dev_free(d);
    ctx_close(&cx);
}

/* NCCL reads NCCL_HOSTID once per process: after an ordinary topology, one
 * with emulated nodes must be refused (on every rank alike), with a message
 * that says why, and the process must stay able to build ordinary ones. */
static void test_nccl_hostid_fixed_per_process(void) {
    ctx cx;
    ctx_open(&cx, world_size(), 0); /* fixes "as launched" if first */
    ctx_close(&cx);
    zpp_device *dev = NULL;
    EXPECT_OK(zpp_device_create_gpu(pick_device(), &dev));
    zpp_topo_opts o = {ZPP_BACKEND_NCCL, 1, dev, 1, 0.0};
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_STATE);
    EXPECT(t == NULL, "topology returned on failure");
    EXPECT(strstr(zpp_last_error(), "NCCL_HOSTID") != NULL, "message: %s", zpp_last_error());
    zpp_device_destroy(dev);
    ctx_open(&cx, 1, 0);
    check_allgather(&cx, WHICH_INTER, 1, 0);
    ctx_close(&cx);
}

/* A peer that does not arrive must not hang a host-side wait: with
 * ZPP_NCCL_TIMEOUT_S = 2, rank 0 enters a world barrier that rank 1 joins
 * only 4 s later. Rank 0 must give up with ZPP_ERR_TIMEOUT naming the deadline,
 * abort the world communicator (later calls on it: ZPP_ERR_STATE), and keep
 * the topology's other communicators working; teardown must not hang.
 * Rank 1's late barrier may still complete (rank 0's contribution had
 * already been delivered before the abort), but its next world call has no
 * partner and must time out too, or find the communicator already failed.
 * Agreeing still works on the broken world communicator (it runs on the
 * host): every rank learns rank 0's timeout, message and all. */
static void test_nccl_timeout_reports_instead_of_hanging(void) {
    EXPECT(setenv("ZPP_NCCL_TIMEOUT_S", "2", 1) == 0);
    ctx cx;
    ctx_open(&cx, world_size(), 0); /* knobs are read here */
    EXPECT(unsetenv("ZPP_NCCL_TIMEOUT_S") == 0);
    zpp_comm *w = cx.topo->world;
    EXPECT_OK(zpp_comm_barrier(w)); /* connected and in step */
    if (zpp_test_rank == 1) {
        struct timespec d = {4, 0};
        nanosleep(&d, NULL);
    }
    double t0 = now_s();
    zpp_status st = zpp_comm_barrier(w);
    double dt = now_s() - t0;
    if (zpp_test_rank == 0) {
        EXPECT(st == ZPP_ERR_TIMEOUT, "late peer: barrier -> %s after %.2f s (%s)",
               zpp_status_str(st), dt, zpp_last_error());
        EXPECT(strstr(zpp_last_error(), "ZPP_NCCL_TIMEOUT_S") != NULL, "message: %s",
               zpp_last_error());
        EXPECT(dt > 1.5 && dt < 3.9, "gave up after %.2f s, expected about 2 s", dt);
    } else {
        EXPECT(st == ZPP_OK || st == ZPP_ERR_COMM || st == ZPP_ERR_TIMEOUT,
               "late barrier -> %s (%s)",
               zpp_status_str(st), zpp_last_error());
    }
    char why[1024];
    snprintf(why, sizeof why, "%s", zpp_last_error());
    MPI_Bcast(why, (int)sizeof why, MPI_CHAR, 0, MPI_COMM_WORLD);
    st = zpp_comm_agree(w, zpp_test_rank == 0 ? zpp_error(ZPP_ERR_COMM, "%s", why) : ZPP_OK);
    EXPECT(st == ZPP_ERR_COMM && strcmp(zpp_last_error(), why) == 0,
           "agreeing after the timeout -> %s '%s', expected rank 0's '%s'", zpp_status_str(st),
           zpp_last_error(), why);
    if (zpp_test_rank == 0) {
        zpp_error_clear(); /* the timeout latched its message (core/error.h) */
        st = zpp_comm_barrier(w);
        EXPECT(st == ZPP_ERR_STATE && strstr(zpp_last_error(), "failed earlier"),
               "after an abort -> %s (%s)", zpp_status_str(st), zpp_last_error());
    } else {
        st = zpp_comm_barrier(w);
        EXPECT(st == ZPP_ERR_TIMEOUT || st == ZPP_ERR_COMM || st == ZPP_ERR_STATE,
               "lonely barrier -> %s (%s)",
               zpp_status_str(st), zpp_last_error());
    }
    void *d = dev_alloc(64);
    EXPECT_STATUS(zpp_comm_allgather(w, d, (char *)d + 32, 16, NULL), ZPP_ERR_STATE);
    dev_free(d);
    /* The other communicators share the comm stream and still work. */
    MPI_Barrier(MPI_COMM_WORLD);
    check_agree(&cx, WHICH_INTRA);
    check_allreduce(&cx, WHICH_INTRA, ZPP_FP32, 1);
    t0 = now_s();
    ctx_close(&cx);
    EXPECT(now_s() - t0 < 30.0, "teardown took %.1f s", now_s() - t0);
}

/* The watchdog (issue 14): a host wait that is not the backend's own (the
 * engine's stream synchronisation behind a collective) must end too. With
 * a 2 s deadline, rank 1 arrives at a world all-gather 5 s late; rank 0
 * enqueues it and blocks in zpp_device_sync on its compute stream, which
 * waits for the collective. The watchdog sees it run past 2 s, aborts the
 * topology's NCCL communicators (their kernels return, so the sync
 * returns), and the next call reports ZPP_ERR_TIMEOUT naming the
 * all-gather, the communicator and the watchdog. Rank 1, late, may find
 * rank 0's half already delivered and complete, or be stopped by its own
 * watchdog; either way its sync returns. */
static void test_nccl_watchdog_ends_a_stalled_sync(void) {
    EXPECT(setenv("ZPP_NCCL_TIMEOUT_S", "2", 1) == 0);
    ctx cx;
    ctx_open(&cx, world_size(), 0);
    EXPECT(unsetenv("ZPP_NCCL_TIMEOUT_S") == 0);
    zpp_comm *w = cx.topo->world;
    EXPECT_OK(zpp_comm_barrier(w)); /* connected and in step */
    const size_t per_rank = 1 << 20;
    void *buf = dev_alloc(per_rank * (size_t)w->size);
    if (zpp_test_rank == 1) {
        struct timespec d = {5, 0};
        nanosleep(&d, NULL);
    }
    double t0 = now_s();
    zpp_status st = zpp_comm_allgather(w, (char *)buf + (size_t)w->rank * per_rank, buf,
                                       per_rank, NULL);
    EXPECT(st == ZPP_OK || (zpp_test_rank != 0 && st == ZPP_ERR_TIMEOUT),
           "enqueueing the all-gather -> %s (%s)", zpp_status_str(st), zpp_last_error());
    (void)zpp_device_sync(cx.dev, NULL); /* the host waits behind the collective */
    double dt = now_s() - t0;
    if (zpp_test_rank == 0) {
        EXPECT(dt > 1.5 && dt < 4.5, "the sync ended after %.2f s, expected about 2 s", dt);
        st = zpp_comm_allgather(w, (char *)buf + (size_t)w->rank * per_rank, buf, per_rank, NULL);
        EXPECT(st == ZPP_ERR_TIMEOUT, "after the watchdog fired -> %s (%s)", zpp_status_str(st),
               zpp_last_error());
        const char *msg = zpp_last_error();
        EXPECT(strstr(msg, "nccl allgather on the world communicator") &&
                   strstr(msg, "no peer answered for 2 s") && strstr(msg, "watchdog"),
               "message: %s", msg);
    } else {
        EXPECT(dt < 10.0, "rank %d's sync took %.2f s", zpp_test_rank, dt);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dev_free(buf);
    t0 = now_s();
    ctx_close(&cx);
    EXPECT(now_s() - t0 < 30.0, "teardown took %.1f s", now_s() - t0);
}

/* Nodes of one rank with a distinct NCCL_HOSTID each: NCCL sees separate
 * hosts and uses its network (socket) transport between them. NCCL reads
 * NCCL_HOSTID once per process, so this needs a process in which NCCL has
 * not run yet: ctest runs every test of this file as its own process (CASE);
 * a run of the whole program reaches this test last and says so. */
static void test_nccl_emulated_nodes(void) {
    if (nccl_used)
        zpp_test_skip("test_nccl_emulated_nodes: NCCL already ran in this process; run it "
                      "alone: mpirun -np 2 <this program> test_nccl_emulated_nodes");
    ctx cx;
    ctx_open(&cx, 1, 1);
    const char *hid = getenv("NCCL_HOSTID");
    char want[64];
    snprintf(want, sizeof want, "-zppnode%d", cx.topo->node);
    EXPECT(hid && strstr(hid, want) != NULL, "NCCL_HOSTID is '%s', expected it to end in '%s'",
           hid ? hid : "(unset)", want);
    check_all_ops(&cx);
    ctx_close(&cx);
    /* A second topology of the same emulation is fine ... */
    ctx_open(&cx, 1, 1);
    check_allgather(&cx, WHICH_WORLD, 1, 1);
    ctx_close(&cx);
    /* ... one without it is refused: NCCL would keep the emulated ids. */
    zpp_device *dev = NULL;
    EXPECT_OK(zpp_device_create_gpu(pick_device(), &dev));
    zpp_topo_opts o = {ZPP_BACKEND_NCCL, world_size(), dev, 0, 0.0};
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_STATE);
    EXPECT(strstr(zpp_last_error(), "NCCL_HOSTID") != NULL, "message: %s", zpp_last_error());
    zpp_device_destroy(dev);
}

/* Emulated nodes of 2 ranks: 4 ranks as 2 nodes (at 2 ranks, one node of 2;
 * comm_nccl.cmake runs it at both). With one GPU the two ranks of a node
 * share it, which NCCL refuses within one host ("Duplicate GPU detected"),
 * so each is an NCCL host of its own, "<prefix>-zppnode<n>-r<local>"
 * (sockets between all of them), and the topology's note says so; with more
 * GPUs a node's ranks have their own and the node keeps one id. Either way
 * the topology stays nodes of 2: intra has the node's 2 ranks (hpZ's
 * gather, qgZ's first all-to-all), inter one rank per node. Every operation
 * on the six communicators against the host reference, then the
 * hierarchical collectives against the MPI backend's bytes. Needs a process
 * of its own, as test_nccl_emulated_nodes. */
static void test_nccl_emulated_nodes_of_two(void) {
    if (nccl_used)
        zpp_test_skip("test_nccl_emulated_nodes_of_two: NCCL already ran in this process; run "
                      "it alone: mpirun -np 4 <this program> test_nccl_emulated_nodes_of_two");
    const int W = world_size();
    EXPECT(W % 2 == 0, "test_nccl_emulated_nodes_of_two needs an even number of ranks, not %d",
           W);
    /* a node's two ranks are consecutive on the host: GPUs local % gpus */
    const int shared = gpus_here() < 2;
    ctx cx;
    ctx_open(&cx, 2, 1);
    const zpp_topo *t = cx.topo;
    const char *hid = getenv("NCCL_HOSTID");
    char want[64];
    if (shared)
        snprintf(want, sizeof want, "-zppnode%d-r%d", t->node, t->local_rank);
    else
        snprintf(want, sizeof want, "-zppnode%d", t->node);
    const size_t hl = hid ? strlen(hid) : 0, wl = strlen(want);
    EXPECT(hid && hl > wl && strcmp(hid + hl - wl, want) == 0,
           "rank %d: NCCL_HOSTID is '%s', expected it to end in '%s' (%d GPU(s) here)",
           zpp_test_rank, hid ? hid : "(unset)", want, gpus_here());
    if (shared) {
        char stays[96];
        snprintf(stays, sizeof stays, "as a separate host; the topology stays %d node%s of 2",
                 t->nodes, t->nodes == 1 ? "" : "s");
        EXPECT(strncmp(t->note, "ranks of node 0 share GPU ", 26) == 0 &&
                   strstr(t->note, stays) != NULL,
               "rank %d: note '%s'", zpp_test_rank, t->note);
    } else {
        EXPECT(t->note[0] == '\0', "rank %d: note '%s' with a GPU per rank", zpp_test_rank,
               t->note);
    }
    check_all_ops(&cx);
    check_hierarchical_matches_mpi(&cx);
    ctx_close(&cx);
    /* A second topology of the same emulation takes the same ids. */
    ctx_open(&cx, 2, 1);
    check_allgather(&cx, WHICH_INTRA, 1, 1);
    check_alltoall(&cx, WHICH_INTER, 1);
    ctx_close(&cx);
}

/* The emulated-nodes tests come last: see their comments. */
ZPP_TESTS(ZPP_TEST_GPU(test_nccl_one_node), ZPP_TEST_GPU(test_nccl_nodes_of_one),
          ZPP_TEST_GPU(test_nccl_invalid_arguments), ZPP_TEST_GPU(test_nccl_hostid_fixed_per_process),
          ZPP_TEST_GPU(test_nccl_timeout_reports_instead_of_hanging),
          ZPP_TEST_GPU(test_nccl_watchdog_ends_a_stalled_sync),
          ZPP_TEST_GPU(test_nccl_reduce_beside_gathers),
          ZPP_TEST_GPU(test_nccl_emulated_nodes), ZPP_TEST_GPU(test_nccl_emulated_nodes_of_two), )

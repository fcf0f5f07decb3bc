/* test_comm_nccl.c — the NCCL backend on real GPUs, against references.
 *
 * Run with 2 ranks (one GPU each: rank r uses device r % device count).
 * Every topology is checked on all three of its communicators (world, intra,
 * inter) with fresh random data generated per rank from the agreed seed;
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
 * which talk over NCCL's socket transport) needs that.
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

#include <cuda_runtime_api.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "testlib.h"

#define CU(call)                                                              \
    do {                                                                      \
        cudaError_t cu_e_ = (call);                                           \
        EXPECT(cu_e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cu_e_)); \
    } while (0)

enum { WHICH_WORLD = 0, WHICH_INTRA = 1, WHICH_INTER = 2 };
static const char *const which_name[3] = {"world", "intra", "inter"};

enum { OP_ALLGATHER = 1, OP_RS_F32, OP_RS_BF16, OP_ALLTOALL, OP_AR_F32, OP_AR_BF16, OP_AR_F16,
       OP_BCAST, OP_MAXINT, OP_MANY };

typedef struct ctx {
    zpp_topo *topo;
    cudaStream_t compute; /* NULL: the legacy default stream */
    int iter;             /* distinguishes repeated calls in the data seeds */
    void *busy_a, *busy_b;
} ctx;

#define BUSY_BYTES ((size_t)128 << 20)

/* ---- Set-up --------------------------------------------------------------- */

static int world_size(void) {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

/* The device of this rank, failing clearly when there is none. */
static int pick_device(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    EXPECT(e == cudaSuccess && ndev > 0,
           "no CUDA device visible to rank %d (%s): this test needs one NVIDIA GPU per rank; "
           "run it on a GPU machine (ctest -L gpu) with the driver loaded",
           zpp_test_rank, e == cudaSuccess ? "device count 0" : cudaGetErrorString(e));
    EXPECT(ndev >= world_size(),
           "%d ranks but %d visible GPU(s): NCCL needs a distinct GPU per rank on a host; "
           "check CUDA_VISIBLE_DEVICES",
           world_size(), ndev);
    return zpp_test_rank % ndev;
}

/* Set once a topology was built: NCCL has then fixed its NCCL_HOSTID. */
static int nccl_used;

static void ctx_open(ctx *cx, int node_size, int emulate, int own_stream) {
    memset(cx, 0, sizeof *cx);
    nccl_used = 1;
    int dev = pick_device();
    CU(cudaSetDevice(dev));
    if (own_stream) CU(cudaStreamCreateWithFlags(&cx->compute, cudaStreamNonBlocking));
    CU(cudaMalloc(&cx->busy_a, BUSY_BYTES));
    CU(cudaMalloc(&cx->busy_b, BUSY_BYTES));
    CU(cudaMemset(cx->busy_a, 1, BUSY_BYTES));
    zpp_topo_opts o = {ZPP_BACKEND_NCCL, node_size, dev, cx->compute, emulate};
    EXPECT_OK(zpp_topo_create(&o, &cx->topo));
    const zpp_topo *t = cx->topo;
    /* (no '%' inside EXPECT's condition: it becomes part of the format) */
    int w = world_size(), want_node = zpp_test_rank / node_size;
    int want_local = zpp_test_rank - want_node * node_size;
    EXPECT(t->world_size == w && t->world_rank == zpp_test_rank && t->node_size == node_size &&
               t->nodes == w / node_size && t->node == want_node && t->local_rank == want_local,
           "topology %d/%d nodes %d node %d local %d", t->world_rank, t->world_size, t->nodes,
           t->node, t->local_rank);
    const zpp_comm *cs[3] = {t->world, t->intra, t->inter};
    const int want_rank[3] = {t->world_rank, t->local_rank, t->node};
    const int want_size[3] = {t->world_size, t->node_size, t->nodes};
    for (int k = 0; k < 3; k++) {
        EXPECT(cs[k] && cs[k]->ops && strcmp(cs[k]->ops->name, "nccl") == 0,
               "%s communicator is not an NCCL one", which_name[k]);
        EXPECT(cs[k]->mem == ZPP_MEM_DEVICE, "%s: mem %d", which_name[k], (int)cs[k]->mem);
        EXPECT(cs[k]->rank == want_rank[k] && cs[k]->size == want_size[k],
               "%s: rank %d of %d, expected %d of %d", which_name[k], cs[k]->rank, cs[k]->size,
               want_rank[k], want_size[k]);
    }
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    EXPECT(nvls && strcmp(nvls, "0") == 0, "NCCL_NVLS_ENABLE is '%s', must be 0",
           nvls ? nvls : "(unset)");
}

static void ctx_close(ctx *cx) {
    zpp_topo_destroy(cx->topo);
    CU(cudaDeviceSynchronize());
    cudaFree(cx->busy_a);
    cudaFree(cx->busy_b);
    if (cx->compute) CU(cudaStreamDestroy(cx->compute));
    cx->topo = NULL;
}

static zpp_comm *comm_of(const ctx *cx, int which) {
    return which == WHICH_WORLD ? cx->topo->world
           : which == WHICH_INTRA ? cx->topo->intra
                                  : cx->topo->inter;
}

/* World rank of member i of a communicator (see comm.h). */
static int member_world(const zpp_topo *t, int which, int i) {
    if (which == WHICH_WORLD) return i;
    if (which == WHICH_INTRA) return t->node * t->node_size + i;
    return i * t->node_size + t->local_rank;
}

/* Keeps the compute stream busy for a while (a device copy of BUSY_BYTES),
 * so that what is queued after it completes late. */
static void busy(const ctx *cx) {
    CU(cudaMemcpyAsync(cx->busy_b, cx->busy_a, BUSY_BYTES, cudaMemcpyDeviceToDevice,
                       cx->compute));
}

/* ---- Data ------------------------------------------------------------------ */

/* Seed of the data that world rank `src` contributes (to `dst`, for
 * all-to-all) in call `iter` of `op` on communicator `which`. */
static uint64_t data_seed(int op, int which, int iter, int src, int dst) {
    uint64_t k = (uint64_t)op;
    k = k * 4 + (uint64_t)which;
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
    zpp_rng r = zpp_rng_make(zpp_test_seed(0x51e0000u + (uint64_t)(op * 4 + which) * 4096 +
                                           (uint64_t)iter));
    switch (iter % 3) {
    case 0: return 1 + zpp_rng_u64(&r) % 17;
    case 1: return 1 + zpp_rng_u64(&r) % 4099;
    default: return 1 + zpp_rng_u64(&r) % max;
    }
}

static void *host_alloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMallocHost(&p, bytes ? bytes : 1));
    return p;
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

/* Upload behind the busy copy, so the data lands late on the compute stream. */
static void produce(const ctx *cx, void *dev, const void *host, size_t bytes) {
    busy(cx);
    CU(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cx->compute));
}

/* Fills the output with a sentinel, ordered on the compute stream. */
static void poison(const ctx *cx, void *dev, size_t bytes) {
    CU(cudaMemsetAsync(dev, 0xA5, bytes, cx->compute));
}

/* Waits (async form) after queueing more work, then copies back and syncs. */
static void finish(const ctx *cx, zpp_comm *c, zpp_comm_req *req, void *host, const void *dev,
                   size_t bytes) {
    if (req) {
        busy(cx); /* other work, queued while the collective runs */
        EXPECT_OK(zpp_comm_wait(c, req));
    }
    CU(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, cx->compute));
    CU(cudaStreamSynchronize(cx->compute));
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
    EXPECT_OK(c->ops->allgather(c, ds, dr, b, async ? &req : NULL));
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
    cudaFreeHost(hs);
    cudaFreeHost(hr);
    if (!in_place) cudaFree(ds);
    cudaFree(dr);
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
    EXPECT_OK(c->ops->reduce_scatter(c, ds, dr, cnt, dtype, async ? &req : NULL));
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
    cudaFreeHost(hs);
    cudaFreeHost(hr);
    cudaFree(ds);
    cudaFree(dr);
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
    EXPECT_OK(c->ops->alltoall(c, ds, dr, b, async ? &req : NULL));
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
    cudaFreeHost(hs);
    cudaFreeHost(hr);
    cudaFree(ds);
    cudaFree(dr);
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
    EXPECT_OK(c->ops->allreduce(c, ds, dr, cnt, dtype, async ? &req : NULL));
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
    cudaFreeHost(hs);
    cudaFreeHost(hr);
    cudaFree(ds);
    if (!in_place) cudaFree(dr);
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
    EXPECT_OK(c->ops->broadcast(c, d, b, root, async ? &req : NULL));
    finish(cx, c, req, hr, d, b);
    for (size_t k = 0; k < b; k++)
        EXPECT(hr[k] == want[k], "%s broadcast (%zu B, root %d): byte %zu is %u, expected %u",
               which_name[which], b, root, k, hr[k], want[k]);
    free(want);
    cudaFreeHost(h);
    cudaFreeHost(hr);
    cudaFree(d);
}

static void check_max_int(ctx *cx, int which) {
    zpp_comm *c = comm_of(cx, which);
    const zpp_topo *t = cx->topo;
    int it = cx->iter++;
    int want = INT32_MIN, mine = 0;
    for (int i = 0; i < c->size; i++) {
        zpp_rng r = zpp_rng_make(data_seed(OP_MAXINT, which, it, member_world(t, which, i), -1));
        int v = (int)(uint32_t)zpp_rng_u64(&r); /* either sign */
        if (v > want) want = v;
        if (i == c->rank) mine = v;
    }
    int v = mine;
    EXPECT_OK(c->ops->allreduce_max_int(c, &v));
    EXPECT(v == want, "%s allreduce_max_int: %d, expected %d (mine %d)", which_name[which], v,
           want, mine);
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
    EXPECT_OK(c->ops->barrier(c)); /* warm */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    if (c->rank == 0) {
        struct timespec d = {0, 300000000L};
        nanosleep(&d, NULL);
    }
    EXPECT_OK(c->ops->barrier(c));
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
        EXPECT_OK(c->ops->allreduce(c, ds + j * cnt, dr + j * cnt, cnt, ZPP_FP32, &req[j]));
    }
    for (int j = K - 1; j >= 0; j--) {
        EXPECT_OK(zpp_comm_wait(c, req[j]));
        CU(cudaMemcpyAsync(hr + j * cnt, dr + j * cnt, cnt * 4, cudaMemcpyDeviceToHost,
                           cx->compute));
    }
    CU(cudaStreamSynchronize(cx->compute));
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
    cudaFreeHost(hs);
    cudaFreeHost(hr);
    cudaFree(ds);
    cudaFree(dr);
}

/* Zero-sized operations are valid (tiny units leave some ranks nothing). */
static void check_zero_sizes(ctx *cx, int which) {
    zpp_comm *c = comm_of(cx, which);
    void *d = dev_alloc(16);
    zpp_comm_req *req = NULL;
    EXPECT_OK(c->ops->allgather(c, d, (char *)d + 8, 0, &req));
    EXPECT_OK(zpp_comm_wait(c, req));
    EXPECT_OK(c->ops->reduce_scatter(c, d, d, 0, ZPP_BF16, NULL));
    EXPECT_OK(c->ops->alltoall(c, d, d, 0, &req));
    EXPECT_OK(zpp_comm_wait(c, req));
    EXPECT_OK(c->ops->allreduce(c, d, d, 0, ZPP_FP16, NULL));
    EXPECT_OK(c->ops->broadcast(c, d, 0, 0, NULL));
    CU(cudaStreamSynchronize(cx->compute));
    cudaFree(d);
}

static void check_all_ops(ctx *cx) {
    for (int which = 0; which < 3; which++) {
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
            check_max_int(cx, which);
        }
        check_many_in_flight(cx, which);
        check_zero_sizes(cx, which);
        check_barrier(cx, which);
    }
}

/* ---- Tests ------------------------------------------------------------------- */

/* One node of every rank (NVLink between the GPUs), own compute stream. */
static void test_nccl_one_node(void) {
    ctx cx;
    ctx_open(&cx, world_size(), 0, 1);
    check_all_ops(&cx);
    ctx_close(&cx);
}

/* Nodes of one rank without emulation (intra has size 1, inter spans the
 * world), on the legacy default stream (compute_stream = NULL). */
static void test_nccl_nodes_of_one_default_stream(void) {
    ctx cx;
    ctx_open(&cx, 1, 0, 0);
    check_all_ops(&cx);
    ctx_close(&cx);
}

/* Argument errors come back as ZPP_ERR_INVALID with a message, identically
 * on every rank (so nobody hangs), and leave the communicators usable. */
static void test_nccl_invalid_arguments(void) {
    ctx cx;
    ctx_open(&cx, world_size(), 0, 1);
    zpp_comm *c = cx.topo->world;
    size_t n = (size_t)c->size;
    char *d = dev_alloc(4096 * (n + 1));
    zpp_comm_req *req = (zpp_comm_req *)&cx; /* must stay untouched on error */
    zpp_comm_req *const untouched = req;

    EXPECT_STATUS(c->ops->reduce_scatter(c, d, d + 4096 * n, 16, (zpp_dtype)7, &req),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "dtype 7") != NULL, "message: %s", zpp_last_error());
    EXPECT(req == untouched, "req_p was written on error");
    EXPECT_STATUS(c->ops->allreduce(c, d, d, 16, (zpp_dtype)-1, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "dtype") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(c->ops->broadcast(c, d, 16, c->size, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "root") != NULL, "message: %s", zpp_last_error());
    /* recv overlaps send: block 0 of the output is the input itself. */
    EXPECT_STATUS(c->ops->allgather(c, d + 8, d, 64, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "overlap") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(c->ops->allreduce(c, d, d + 4, 16, ZPP_FP32, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(c->ops->alltoall(c, NULL, d, 8, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(c->ops->allreduce_max_int(c, NULL), ZPP_ERR_INVALID);

    /* Still in step and usable. */
    check_max_int(&cx, WHICH_WORLD);
    check_allreduce(&cx, WHICH_WORLD, ZPP_FP32, 1);
    cudaFree(d);
    ctx_close(&cx);
}

/* NCCL reads NCCL_HOSTID once per process: after an ordinary topology, one
 * with emulated nodes must be refused (on every rank alike), with a message
 * that says why, and the process must stay able to build ordinary ones. */
static void test_nccl_hostid_fixed_per_process(void) {
    ctx cx;
    ctx_open(&cx, world_size(), 0, 1); /* fixes "as launched" if first */
    ctx_close(&cx);
    int dev = pick_device();
    zpp_topo_opts o = {ZPP_BACKEND_NCCL, 1, dev, NULL, 1};
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create(&o, &t), ZPP_ERR_STATE);
    EXPECT(t == NULL, "topology returned on failure");
    EXPECT(strstr(zpp_last_error(), "NCCL_HOSTID") != NULL, "message: %s", zpp_last_error());
    ctx_open(&cx, 1, 0, 0);
    check_allgather(&cx, WHICH_INTER, 1, 0);
    ctx_close(&cx);
}

/* A peer that does not arrive must not hang a host-side wait: with
 * ZPP_NCCL_TIMEOUT_S = 2, rank 0 enters a world barrier that rank 1 joins
 * only 4 s later. Rank 0 must give up with ZPP_ERR_COMM naming the timeout,
 * abort the world communicator (later calls on it: ZPP_ERR_STATE), and keep
 * the topology's other communicators working; teardown must not hang.
 * Rank 1's late barrier may still complete (rank 0's contribution had
 * already been delivered before the abort), but its next world call has no
 * partner and must time out too, or find the communicator already failed. */
static void test_nccl_timeout_reports_instead_of_hanging(void) {
    EXPECT(setenv("ZPP_NCCL_TIMEOUT_S", "2", 1) == 0);
    ctx cx;
    ctx_open(&cx, world_size(), 0, 1); /* knobs are read here */
    EXPECT(unsetenv("ZPP_NCCL_TIMEOUT_S") == 0);
    zpp_comm *w = cx.topo->world;
    EXPECT_OK(w->ops->barrier(w)); /* connected and in step */
    if (zpp_test_rank == 1) {
        struct timespec d = {4, 0};
        nanosleep(&d, NULL);
    }
    double t0 = now_s();
    zpp_status st = w->ops->barrier(w);
    double dt = now_s() - t0;
    if (zpp_test_rank == 0) {
        EXPECT(st == ZPP_ERR_COMM, "late peer: barrier -> %s after %.2f s (%s)",
               zpp_status_str(st), dt, zpp_last_error());
        EXPECT(strstr(zpp_last_error(), "ZPP_NCCL_TIMEOUT_S") != NULL, "message: %s",
               zpp_last_error());
        EXPECT(dt > 1.5 && dt < 3.9, "gave up after %.2f s, expected about 2 s", dt);
    } else {
        EXPECT(st == ZPP_OK || st == ZPP_ERR_COMM, "late barrier -> %s (%s)",
               zpp_status_str(st), zpp_last_error());
    }
    int v = 1;
    st = w->ops->allreduce_max_int(w, &v);
    if (zpp_test_rank == 0)
        EXPECT(st == ZPP_ERR_STATE && strstr(zpp_last_error(), "failed earlier"),
               "after an abort -> %s (%s)", zpp_status_str(st), zpp_last_error());
    else
        EXPECT(st == ZPP_ERR_COMM || st == ZPP_ERR_STATE, "lonely max_int -> %s (%s)",
               zpp_status_str(st), zpp_last_error());
    void *d = dev_alloc(64);
    EXPECT_STATUS(w->ops->allgather(w, d, (char *)d + 32, 16, NULL), ZPP_ERR_STATE);
    cudaFree(d);
    /* The other communicators share the comm stream and still work. */
    MPI_Barrier(MPI_COMM_WORLD);
    check_max_int(&cx, WHICH_INTRA);
    check_allreduce(&cx, WHICH_INTRA, ZPP_FP32, 1);
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
    if (nccl_used) {
        if (zpp_test_rank == 0)
            printf("[ SKIP ] test_nccl_emulated_nodes: NCCL already ran in this process; run "
                   "it alone: mpirun -np 2 <this program> test_nccl_emulated_nodes\n");
        return;
    }
    ctx cx;
    ctx_open(&cx, 1, 1, 1);
    const char *hid = getenv("NCCL_HOSTID");
    char want[64];
    snprintf(want, sizeof want, "-zppnode%d", cx.topo->node);
    EXPECT(hid && strstr(hid, want) != NULL, "NCCL_HOSTID is '%s', expected it to end in '%s'",
           hid ? hid : "(unset)", want);
    check_all_ops(&cx);
    ctx_close(&cx);
    /* A second topology of the same emulation is fine ... */
    ctx_open(&cx, 1, 1, 0);
    check_allgather(&cx, WHICH_WORLD, 1, 1);
    ctx_close(&cx);
    /* ... one without it is refused: NCCL would keep the emulated ids. */
    zpp_topo_opts o = {ZPP_BACKEND_NCCL, world_size(), pick_device(), NULL, 0};
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create(&o, &t), ZPP_ERR_STATE);
    EXPECT(strstr(zpp_last_error(), "NCCL_HOSTID") != NULL, "message: %s", zpp_last_error());
}

/* The emulated-nodes test comes last: see its comment. */
ZPP_TESTS(ZPP_TEST_GPU(test_nccl_one_node), ZPP_TEST_GPU(test_nccl_nodes_of_one_default_stream),
          ZPP_TEST_GPU(test_nccl_invalid_arguments), ZPP_TEST_GPU(test_nccl_hostid_fixed_per_process),
          ZPP_TEST_GPU(test_nccl_timeout_reports_instead_of_hanging),
          ZPP_TEST_GPU(test_nccl_emulated_nodes), )

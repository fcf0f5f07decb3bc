/* test_comm.c — topology and the MPI backend, at whatever world size mpirun
 * gives (declared in comm.cmake for 1, 2, 3, 4, 6 and 8 ranks).
 *
 * Every rank generates every other rank's inputs itself: data comes from
 * the agreed run seed mixed with (test tag, world rank of the owner, block),
 * so each rank can compute the exact expected result of a collective
 * locally and compare. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fault.h"
#include "testlib.h"

/* ---- Live MPI handles, counted through the profiling interface ----------
 * These definitions take the place of libmpi's for every call made from
 * this program and from libzeropp (linked in statically); each forwards to
 * the PMPI_ entry point. A communicator or datatype the library forgets to
 * free shows up as a count that does not return to its baseline (LeakSanitizer
 * cannot see them: they live inside libmpi, whose leaks are suppressed). */
static int live_comms, live_types, blobs_made;

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm) {
    int rc = PMPI_Comm_dup(comm, newcomm);
    if (rc == MPI_SUCCESS) live_comms++;
    return rc;
}
int MPI_Comm_idup(MPI_Comm comm, MPI_Comm *newcomm, MPI_Request *req) {
    int rc = PMPI_Comm_idup(comm, newcomm, req);
    if (rc == MPI_SUCCESS) live_comms++;
    return rc;
}
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm) {
    int rc = PMPI_Comm_split(comm, color, key, newcomm);
    if (rc == MPI_SUCCESS && *newcomm != MPI_COMM_NULL) live_comms++;
    return rc;
}
int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm *newcomm) {
    int rc = PMPI_Comm_split_type(comm, type, key, info, newcomm);
    if (rc == MPI_SUCCESS && *newcomm != MPI_COMM_NULL) live_comms++;
    return rc;
}
int MPI_Comm_free(MPI_Comm *comm) {
    int rc = PMPI_Comm_free(comm);
    if (rc == MPI_SUCCESS) live_comms--;
    return rc;
}
int MPI_Type_contiguous(int count, MPI_Datatype old, MPI_Datatype *newtype) {
    int rc = PMPI_Type_contiguous(count, old, newtype);
    if (rc == MPI_SUCCESS) live_types++;
    return rc;
}
int MPI_Type_create_struct(int count, const int lens[], const MPI_Aint disps[],
                           const MPI_Datatype types[], MPI_Datatype *newtype) {
    int rc = PMPI_Type_create_struct(count, lens, disps, types, newtype);
    if (rc == MPI_SUCCESS) live_types++;
    return rc;
}
int MPI_Type_create_resized(MPI_Datatype old, MPI_Aint lb, MPI_Aint extent,
                            MPI_Datatype *newtype) {
    int rc = PMPI_Type_create_resized(old, lb, extent, newtype);
    if (rc == MPI_SUCCESS) live_types++, blobs_made++;
    return rc;
}
int MPI_Type_free(MPI_Datatype *type) {
    int rc = PMPI_Type_free(type);
    if (rc == MPI_SUCCESS) live_types--;
    return rc;
}

/* ---- Deterministic per-rank data --------------------------------------- */

static int world_size(void) {
    int w;
    MPI_Comm_size(MPI_COMM_WORLD, &w);
    return w;
}

/* A seed for (tag, owner, block), identical on every rank. */
static uint64_t seed_of(uint64_t tag, int owner, int block) {
    return zpp_test_seed((tag * 1000003ull + (uint64_t)owner) * 1000033ull + (uint64_t)block + 1);
}

static void gen_bytes(void *p, size_t n, uint64_t seed) {
    zpp_rng r = zpp_rng_make(seed);
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)zpp_rng_u64(&r);
}

/* fp32 inputs on which every summation order is exact: k * 2^-8 with
 * |k| <= 4096. A sum of at most 8 such values (the largest world tested; up
 * to 4096 ranks in fact) is a multiple of 2^-8 below 2^12 * 8 in magnitude,
 * i.e. at most 2^23 units of 2^-8: it and every partial sum fit fp32's 24-bit
 * significand, so MPI's result is exact whatever tree it uses. */
static void gen_values(void *p, size_t n, zpp_dtype dt, uint64_t seed) {
    zpp_rng r = zpp_rng_make(seed);
    for (size_t i = 0; i < n; i++) {
        if (dt == ZPP_FP32) {
            int k = (int)(zpp_rng_u64(&r) % 8193) - 4096;
            ((float *)p)[i] = (float)k * 0x1p-8f;
        } else {
            /* magnitudes over a few binades, so sums round and cancel */
            zpp_store_f32(p, dt, i, (float)(zpp_rng_normal(&r) * ldexp(1.0, (int)(i % 7) - 3)));
        }
    }
}

/* A group under test: the comm and the world rank of each of its members. */
typedef struct group {
    const char *name;
    zpp_comm *c;
    int *member; /* member[i] = world rank of comm rank i */
} group;

static group group_make(const char *name, zpp_comm *c, const zpp_topo *t, int which) {
    group g = {name, c, malloc(sizeof(int) * (size_t)c->size)};
    EXPECT(g.member != NULL);
    for (int i = 0; i < c->size; i++) {
        if (which == 0) g.member[i] = i;                                /* world */
        else if (which == 1) g.member[i] = t->node * t->node_size + i;  /* intra */
        else g.member[i] = i * t->node_size + t->local_rank;            /* inter */
    }
    return g;
}

/* The comm really consists of the documented ranks, in the documented
 * order: gather each member's world rank through the comm itself. */
static void check_membership(const group *g, int world_rank) {
    int *got = malloc(sizeof(int) * (size_t)g->c->size);
    EXPECT(got != NULL);
    EXPECT_OK(zpp_comm_allgather(g->c, &world_rank, got, sizeof(int), NULL));
    for (int i = 0; i < g->c->size; i++)
        EXPECT(got[i] == g->member[i], "%s: comm rank %d is world rank %d, expected %d", g->name, i,
               got[i], g->member[i]);
    free(got);
}

/* ---- Reference sums and their error bound ------------------------------
 * fp32 inputs are exact (gen_values). For bf16 / fp16 the backend, like
 * NCCL, combines two partial results at a time: converts both to fp32, adds
 * (exact or rounded to fp32: relative error <= 2^-24), rounds to the 16-bit
 * format (relative error <= u = 2^-8 bf16, 2^-11 fp16, or an absolute
 * error <= eta = half the smallest subnormal: 2^-134 bf16, 2^-25 fp16).
 * So one combination has relative error <= u' = u + 2^-23 plus eta.
 * k inputs take k-1 combinations in some tree; each input passes through at
 * most k-1 of them, each rounding error through at most k-2 more, hence
 *     |got - exact| <= ((1+u')^(k-1) - 1) * sum |x_i| + (k-1) * eta * (1+u')^(k-2).
 * With k <= 2 there is at most one combination and addition commutes, so
 * the result is exactly round(x_0 + x_1): checked bit for bit. */
static void check_sum(const void *got, size_t n, zpp_dtype dt, const void *const *terms,
                      size_t offset, int k, const char *what, const char *gname) {
    double u = dt == ZPP_BF16 ? 0x1p-8 + 0x1p-23 : 0x1p-11 + 0x1p-23;
    double eta = dt == ZPP_BF16 ? 0x1p-134 : 0x1p-25;
    for (size_t j = 0; j < n; j++) {
        float g = zpp_load_f32(got, dt, j);
        double exact = 0, abs_sum = 0;
        for (int i = 0; i < k; i++) {
            double x = zpp_load_f32(terms[i], dt, offset + j);
            exact += x;
            abs_sum += fabs(x);
        }
        if (dt == ZPP_FP32) {
            EXPECT(g == (float)exact, "%s %s fp32: element %zu is %.9g, expected %.9g", gname,
                   what, j, g, exact);
        } else if (k <= 2) {
            float want = zpp_load_f32(terms[0], dt, offset + j);
            if (k == 2) {
                float s = want + zpp_load_f32(terms[1], dt, offset + j);
                char tmp[4];
                zpp_store_f32(tmp, dt, 0, s);
                want = zpp_load_f32(tmp, dt, 0);
            }
            EXPECT(g == want, "%s %s %s: element %zu is %a, expected %a", gname, what,
                   zpp_dtype_name(dt), j, g, want);
        } else {
            double bound = (pow(1 + u, k - 1) - 1) * abs_sum + (k - 1) * eta * pow(1 + u, k - 2);
            EXPECT(fabs(g - exact) <= bound, "%s %s %s (k=%d): element %zu is %.9g, exact %.9g, "
                   "bound %.3g", gname, what, zpp_dtype_name(dt), k, j, g, exact, bound);
        }
    }
}

/* ---- One check per operation --------------------------------------------
 * `n` is elements (or bytes) per rank, the same on every rank of the group
 * (all ranks derive it from the same tag). `async` uses the request form. */

static zpp_comm_req **maybe(int async, zpp_comm_req **r) { return async ? r : NULL; }

static void check_allgather(const group *g, uint64_t tag, size_t n, int async, int in_place) {
    zpp_comm *c = g->c;
    unsigned char *recv = malloc(n * (size_t)c->size + 1), *send = malloc(n + 1);
    EXPECT(recv && send);
    memset(recv, 0xa5, n * (size_t)c->size);
    unsigned char *mine = in_place ? recv + n * (size_t)c->rank : send;
    gen_bytes(mine, n, seed_of(tag, g->member[c->rank], 0));
    zpp_comm_req *r = NULL;
    EXPECT_OK(zpp_comm_allgather(c, mine, recv, n, maybe(async, &r)));
    EXPECT_OK(zpp_comm_wait(c, r));
    unsigned char *want = malloc(n + 1);
    EXPECT(want != NULL);
    for (int i = 0; i < c->size; i++) {
        gen_bytes(want, n, seed_of(tag, g->member[i], 0));
        EXPECT(memcmp(recv + n * (size_t)i, want, n) == 0, "%s allgather (n=%zu, async %d, in "
               "place %d): block %d differs", g->name, n, async, in_place, i);
    }
    free(want);
    free(send);
    free(recv);
}

/* Inputs of every member (k blocks of `len` elements each). */
static void **gen_all(const group *g, uint64_t tag, size_t len, zpp_dtype dt) {
    void **in = malloc(sizeof(void *) * (size_t)g->c->size);
    EXPECT(in != NULL);
    for (int i = 0; i < g->c->size; i++) {
        in[i] = malloc(len * zpp_dtype_size(dt) + 1);
        EXPECT(in[i] != NULL);
        gen_values(in[i], len, dt, seed_of(tag, g->member[i], 0));
    }
    return in;
}

static void free_all(void **in, int k) {
    for (int i = 0; i < k; i++) free(in[i]);
    free(in);
}

static void check_reduce_scatter(const group *g, uint64_t tag, size_t n, zpp_dtype dt, int async) {
    zpp_comm *c = g->c;
    int k = c->size;
    size_t es = zpp_dtype_size(dt);
    void **in = gen_all(g, tag, n * (size_t)k, dt);
    void *recv = malloc(n * es + 1);
    EXPECT(recv != NULL);
    zpp_comm_req *r = NULL;
    EXPECT_OK(zpp_comm_reduce_scatter(c, in[c->rank], recv, n, dt, maybe(async, &r)));
    EXPECT_OK(zpp_comm_wait(c, r));
    check_sum(recv, n, dt, (const void *const *)in, n * (size_t)c->rank, k, "reduce_scatter",
              g->name);
    free(recv);
    free_all(in, k);
}

static void check_allreduce(const group *g, uint64_t tag, size_t n, zpp_dtype dt, int async,
                            int in_place) {
    zpp_comm *c = g->c;
    size_t es = zpp_dtype_size(dt);
    void **in = gen_all(g, tag, n, dt);
    void *buf = malloc(n * es + 1);
    EXPECT(buf != NULL);
    if (in_place) memcpy(buf, in[c->rank], n * es);
    zpp_comm_req *r = NULL;
    EXPECT_OK(zpp_comm_allreduce(c, in_place ? buf : in[c->rank], buf, n, dt, maybe(async, &r)));
    EXPECT_OK(zpp_comm_wait(c, r));
    check_sum(buf, n, dt, (const void *const *)in, 0, c->size,
              in_place ? "allreduce in place" : "allreduce", g->name);
    free(buf);
    free_all(in, c->size);
}

static void check_alltoall(const group *g, uint64_t tag, size_t n, int async) {
    zpp_comm *c = g->c;
    size_t k = (size_t)c->size;
    unsigned char *send = malloc(n * k + 1), *recv = malloc(n * k + 1), *want = malloc(n + 1);
    EXPECT(send && recv && want);
    /* block j of my input, for peer j: seeded by (me, j) */
    for (size_t j = 0; j < k; j++)
        gen_bytes(send + n * j, n, seed_of(tag, g->member[c->rank], (int)j));
    zpp_comm_req *r = NULL;
    EXPECT_OK(zpp_comm_alltoall(c, send, recv, n, maybe(async, &r)));
    EXPECT_OK(zpp_comm_wait(c, r));
    for (size_t i = 0; i < k; i++) {
        gen_bytes(want, n, seed_of(tag, g->member[i], c->rank));
        EXPECT(memcmp(recv + n * i, want, n) == 0, "%s alltoall (n=%zu): block from rank %zu "
               "differs", g->name, n, i);
    }
    free(want);
    free(recv);
    free(send);
}

static void check_broadcast(const group *g, uint64_t tag, size_t n, int async) {
    zpp_comm *c = g->c;
    zpp_rng rr = zpp_rng_make(seed_of(tag, -1, 0));
    int root = (int)(zpp_rng_u64(&rr) % (uint64_t)c->size);
    unsigned char *buf = malloc(n + 1), *want = malloc(n + 1);
    EXPECT(buf && want);
    gen_bytes(want, n, seed_of(tag, g->member[root], 0));
    if (c->rank == root) memcpy(buf, want, n);
    else memset(buf, 0x5a, n);
    zpp_comm_req *r = NULL;
    EXPECT_OK(zpp_comm_broadcast(c, buf, n, root, maybe(async, &r)));
    EXPECT_OK(zpp_comm_wait(c, r));
    EXPECT(memcmp(buf, want, n) == 0, "%s broadcast from %d (n=%zu) differs", g->name, root, n);
    free(want);
    free(buf);
}

/* ---- Failing together ------------------------------------------------------ */

static const zpp_status agree_statuses[] = {ZPP_ERR_INVALID, ZPP_ERR_IO, ZPP_ERR_CONFIG,
                                            ZPP_ERR_NOMEM, ZPP_ERR_COMM, ZPP_ERR_FORMAT};

/* What member i of a group does in agreement round `tag`: fail or not, with
 * which status and message — computable by every rank for every member. */
static zpp_status agree_plan(uint64_t tag, int member, int fail_pct, char *msg, size_t cap) {
    zpp_rng r = zpp_rng_make(seed_of(tag, member, 99));
    int fails = (int)(zpp_rng_u64(&r) % 100) < fail_pct;
    zpp_status st = agree_statuses[zpp_rng_u64(&r) % 6];
    snprintf(msg, cap, "rank %d: problem %llx in round %llu; fix it", member,
             (unsigned long long)zpp_rng_u64(&r), (unsigned long long)tag);
    return fails ? st : ZPP_OK;
}

/* One round: every member fails with probability fail_pct% (or exactly
 * the member `only` when only >= 0); every rank must come back with the
 * lowest failing member's status and exact message, or ZPP_OK with its own
 * message untouched. */
static void check_agree_round(const group *g, uint64_t tag, int fail_pct, int only) {
    zpp_comm *c = g->c;
    char msg[256], want_msg[256] = "";
    zpp_status want = ZPP_OK, mine = ZPP_OK;
    for (int i = c->size - 1; i >= 0; i--) {
        zpp_status st = agree_plan(tag, g->member[i], only >= 0 ? 100 : fail_pct, msg,
                                   sizeof msg);
        if (only >= 0 && i != only) st = ZPP_OK;
        if (i == c->rank) mine = st;
        if (st != ZPP_OK) { /* the lowest one is seen last */
            want = st;
            snprintf(want_msg, sizeof want_msg, "%s", msg);
        }
    }
    if (mine != ZPP_OK) {
        agree_plan(tag, g->member[c->rank], 100, msg, sizeof msg);
        zpp_error(mine, "%s", msg);
    } else {
        zpp_error(ZPP_OK, "untouched %d", c->rank);
    }
    zpp_status got = zpp_comm_agree(c, mine);
    EXPECT(got == want, "%s agree (round %llu): %s, expected %s ('%s')", g->name,
           (unsigned long long)tag, zpp_status_str(got), zpp_status_str(want), zpp_last_error());
    if (want != ZPP_OK) {
        EXPECT(strcmp(zpp_last_error(), want_msg) == 0, "%s agree: message '%s', expected '%s'",
               g->name, zpp_last_error(), want_msg);
    } else {
        char own[64];
        snprintf(own, sizeof own, "untouched %d", c->rank);
        EXPECT(strcmp(zpp_last_error(), own) == 0, "%s agree changed the message to '%s'",
               g->name, zpp_last_error());
    }
}

static void check_agree(const group *g, uint64_t tag) {
    zpp_comm *c = g->c;
    check_agree_round(g, tag * 8 + 0, 0, -1); /* all OK */
    /* one random member */
    zpp_rng r = zpp_rng_make(seed_of(tag, -3, 0));
    check_agree_round(g, tag * 8 + 1, 0, (int)(zpp_rng_u64(&r) % (uint64_t)c->size));
    check_agree_round(g, tag * 8 + 2, 0, c->size - 1); /* the last one */
    check_agree_round(g, tag * 8 + 3, 50, -1);         /* several: the lowest wins */
    check_agree_round(g, tag * 8 + 4, 100, -1);        /* all */
}

/* Every operation, blocking and asynchronous, with sizes in [lo, hi]. */
static void check_group(const group *g, uint64_t tag, size_t lo, size_t hi) {
    zpp_rng r = zpp_rng_make(seed_of(tag, -2, 0));
#define SIZE() (lo + (size_t)(zpp_rng_u64(&r) % (hi - lo + 1)))
    static const zpp_dtype dts[] = {ZPP_FP32, ZPP_BF16, ZPP_FP16};
    for (int async = 0; async <= 1; async++) {
        uint64_t t = tag * 64 + (uint64_t)async * 32;
        check_allgather(g, t + 0, SIZE(), async, 0);
        check_allgather(g, t + 1, SIZE(), async, 1);
        for (int d = 0; d < 3; d++) {
            check_reduce_scatter(g, t + 2 + (uint64_t)d, SIZE(), dts[d], async);
            check_allreduce(g, t + 5 + (uint64_t)d, SIZE(), dts[d], async, 0);
            check_allreduce(g, t + 8 + (uint64_t)d, SIZE(), dts[d], async, 1);
        }
        check_alltoall(g, t + 11, SIZE(), async);
        check_broadcast(g, t + 12, SIZE(), async);
    }
#undef SIZE
    check_agree(g, tag * 64 + 13);
    EXPECT_OK(zpp_comm_barrier(g->c));
}

/* Two operations in flight at once, waited in the opposite order, then
 * three more waited in mixed order; results checked as for the blocking
 * forms. */
static void check_overlap(const group *g, uint64_t tag, size_t n) {
    zpp_comm *c = g->c;
    size_t k = (size_t)c->size;
    unsigned char *ag_in = malloc(n + 1), *ag_out = malloc(n * k + 1), *want = malloc(n * k + 1);
    void **rs_in = gen_all(g, tag * 8 + 1, n * k, ZPP_BF16);
    void **ar_in = gen_all(g, tag * 8 + 2, n, ZPP_FP32);
    uint16_t *rs_out = malloc(n * 2 + 1);
    float *ar_buf = malloc(n * 4 + 1);
    unsigned char *a2a_in = malloc(n * k + 1), *a2a_out = malloc(n * k + 1);
    EXPECT(ag_in && ag_out && want && rs_out && ar_buf && a2a_in && a2a_out);
    gen_bytes(ag_in, n, seed_of(tag * 8, g->member[c->rank], 0));
    memcpy(ar_buf, ar_in[c->rank], n * 4);
    for (size_t j = 0; j < k; j++)
        gen_bytes(a2a_in + n * j, n, seed_of(tag * 8 + 3, g->member[c->rank], (int)j));

    zpp_comm_req *r1 = NULL, *r2 = NULL, *r3 = NULL;
    EXPECT_OK(zpp_comm_allgather(c, ag_in, ag_out, n, &r1));
    EXPECT_OK(zpp_comm_reduce_scatter(c, rs_in[c->rank], rs_out, n, ZPP_BF16, &r2));
    EXPECT(r1 && r2 && r1 != r2);
    EXPECT_OK(zpp_comm_wait(c, r2));
    EXPECT_OK(zpp_comm_wait(c, r1));
    for (size_t i = 0; i < k; i++) {
        gen_bytes(want, n, seed_of(tag * 8, g->member[i], 0));
        EXPECT(memcmp(ag_out + n * i, want, n) == 0, "%s overlapped allgather block %zu", g->name,
               i);
    }
    check_sum(rs_out, n, ZPP_BF16, (const void *const *)rs_in, n * (size_t)c->rank, c->size,
              "overlapped reduce_scatter", g->name);

    EXPECT_OK(zpp_comm_allreduce(c, ar_buf, ar_buf, n, ZPP_FP32, &r1));
    EXPECT_OK(zpp_comm_alltoall(c, a2a_in, a2a_out, n, &r2));
    EXPECT_OK(zpp_comm_allgather(c, ag_in, ag_out, n, &r3));
    EXPECT_OK(zpp_comm_wait(c, r2));
    EXPECT_OK(zpp_comm_wait(c, r3));
    EXPECT_OK(zpp_comm_wait(c, r1));
    check_sum(ar_buf, n, ZPP_FP32, (const void *const *)ar_in, 0, c->size,
              "overlapped allreduce", g->name);
    for (size_t i = 0; i < k; i++) {
        gen_bytes(want, n, seed_of(tag * 8 + 3, g->member[i], c->rank));
        EXPECT(memcmp(a2a_out + n * i, want, n) == 0, "%s overlapped alltoall block %zu", g->name,
               i);
        gen_bytes(want, n, seed_of(tag * 8, g->member[i], 0));
        EXPECT(memcmp(ag_out + n * i, want, n) == 0, "%s overlapped allgather block %zu", g->name,
               i);
    }
    free(a2a_out);
    free(a2a_in);
    free(ar_buf);
    free(rs_out);
    free_all(ar_in, c->size);
    free_all(rs_in, c->size);
    free(want);
    free(ag_out);
    free(ag_in);
}

/* ---- Topology ------------------------------------------------------------ */

static zpp_topo *topo_make(int node_size) {
    zpp_topo_opts o = {.backend = ZPP_BACKEND_MPI, .node_size = node_size};
    zpp_topo *t = NULL;
    EXPECT_OK(zpp_topo_create_with_opts(&o, &t));
    EXPECT(t && t->world && t->intra && t->inter);
    return t;
}

static void check_topo_shape(const zpp_topo *t, int W, int rank, int S) {
    /* (no '%' inside EXPECT conditions: they become part of the format) */
    int node = rank / S, local = rank - node * S, nodes = W / S;
    EXPECT(t->world_size == W && t->world_rank == rank, "world %d/%d", t->world_rank,
           t->world_size);
    EXPECT(t->node_size == S && t->nodes == nodes, "node_size %d nodes %d (S=%d W=%d)",
           t->node_size, t->nodes, S, W);
    EXPECT(t->node == node && t->local_rank == local, "node %d local %d", t->node,
           t->local_rank);
    EXPECT(t->world->size == W && t->world->rank == rank);
    EXPECT(t->intra->size == S && t->intra->rank == local, "intra %d/%d", t->intra->rank,
           t->intra->size);
    EXPECT(t->inter->size == nodes && t->inter->rank == node, "inter %d/%d", t->inter->rank,
           t->inter->size);
    EXPECT(t->world->mem == ZPP_MEM_HOST && strcmp(t->world->ops->name, "mpi") == 0);
    /* On MPI the gradient reductions share the three (comm.h) */
    EXPECT(t->red_world == t->world && t->red_intra == t->intra && t->red_inter == t->inter);
}

/* For every node size S dividing the world: shape, membership, every
 * operation on world / intra / inter, overlapped requests; destroy frees
 * every communicator and datatype. */
static void test_every_node_size(void) {
    int W = world_size(), rank = zpp_test_rank;
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        int comms0 = live_comms, types0 = live_types;
        zpp_topo *t = topo_make(S);
        check_topo_shape(t, W, rank, S);
        zpp_comm *cs[3] = {t->world, t->intra, t->inter};
        const char *names[3] = {"world", "intra", "inter"};
        for (int w = 0; w < 3; w++) {
            group g = group_make(names[w], cs[w], t, w);
            check_membership(&g, rank);
            uint64_t tag = (uint64_t)S * 16 + (uint64_t)w;
            check_group(&g, tag, 1, 300);
            check_overlap(&g, tag, 1 + (size_t)(zpp_test_seed(tag) % 200));
            free(g.member);
        }
        zpp_topo_destroy(t);
        EXPECT(live_comms == comms0, "S=%d: %d MPI communicators left after destroy", S,
               live_comms - comms0);
        EXPECT(live_types == types0, "S=%d: %d MPI datatypes left", S, live_types - types0);
    }
}

/* Zero-size operations are valid and move nothing. */
static void test_zero_sizes(void) {
    zpp_topo *t = topo_make(1);
    zpp_comm *c = t->world;
    char sentinel = 'x';
    zpp_comm_req *r = NULL;
    EXPECT_OK(zpp_comm_allgather(c, NULL, NULL, 0, NULL));
    EXPECT_OK(zpp_comm_reduce_scatter(c, NULL, NULL, 0, ZPP_BF16, &r));
    EXPECT(r != NULL);
    EXPECT_OK(zpp_comm_wait(c, r));
    EXPECT_OK(zpp_comm_alltoall(c, &sentinel, &sentinel + 0, 0, NULL));
    EXPECT_OK(zpp_comm_allreduce(c, NULL, NULL, 0, ZPP_FP32, NULL));
    EXPECT_OK(zpp_comm_broadcast(c, &sentinel, 0, c->size - 1, &r));
    EXPECT_OK(zpp_comm_wait(c, r));
    EXPECT(sentinel == 'x');
    EXPECT_OK(zpp_comm_wait(c, NULL));
    zpp_topo_destroy(t);
}

/* The large-count path: with the max count lowered to 31 (a test hook,
 * core/fault.h: only in a library built with them), every buffer of
 * 32..240 elements travels as one element of a blob datatype (and fp32
 * reductions use the backend's own sum op instead of MPI_SUM). Same checks
 * as above; the blob types are all freed. 240 fp32 = 960 bytes stays within
 * 31 * 31 = 961, the most a count of 31 can describe. */
static void test_large_count_path(void) {
    int W = world_size();
    EXPECT_OK(zpp_fault_set_mpi_max_count(31));
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        int types0 = live_types, blobs0 = blobs_made;
        zpp_topo *t = topo_make(S);
        zpp_comm *cs[3] = {t->world, t->intra, t->inter};
        const char *names[3] = {"world(blob)", "intra(blob)", "inter(blob)"};
        for (int w = 0; w < 3; w++) {
            group g = group_make(names[w], cs[w], t, w);
            check_group(&g, 7000 + (uint64_t)S * 16 + (uint64_t)w, 32, 240);
            check_overlap(&g, 7000 + (uint64_t)S * 16 + (uint64_t)w, 32 + (size_t)w * 50);
            free(g.member);
        }
        EXPECT(blobs_made - blobs0 >= 3 * 2 * 14, "only %d blob datatypes made",
               blobs_made - blobs0);
        EXPECT(live_types == types0, "S=%d: %d blob datatypes left", S, live_types - types0);
        /* Too large for counts of 31 (961 bytes at most): refused locally,
         * identically on every rank, before any MPI call. */
        char big[1000] = {0};
        EXPECT_STATUS(zpp_comm_broadcast(t->world, big, sizeof big, 0, NULL),
                      ZPP_ERR_INVALID);
        EXPECT(strstr(zpp_last_error(), "1000 bytes") != NULL, "%s", zpp_last_error());
        zpp_topo_destroy(t);
    }
    EXPECT_OK(zpp_fault_set_mpi_max_count(0));
}

/* A node size that does not divide the world fails with ZPP_ERR_INVALID on
 * every rank (a hang would time the test out), with both numbers and the
 * valid choices in the message, and leaves nothing behind. */
static void expect_not_dividing(int S, int W) {
    int comms0 = live_comms;
    zpp_topo_opts o = {.backend = ZPP_BACKEND_MPI, .node_size = S};
    zpp_topo *t = (zpp_topo *)&o; /* must stay untouched */
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_INVALID);
    EXPECT(t == (zpp_topo *)&o, "topo_p was written on failure");
    char want[128];
    snprintf(want, sizeof want, "node size %d does not divide the world size %d", S, W);
    EXPECT(strstr(zpp_last_error(), want) != NULL, "message '%s'", zpp_last_error());
    snprintf(want, sizeof want, "%d", W);
    const char *eg = strstr(zpp_last_error(), "e.g. 1");
    EXPECT(eg && strstr(eg, want), "divisors missing: '%s'", zpp_last_error());
    EXPECT(live_comms == comms0, "%d communicators leaked", live_comms - comms0);
}

static void test_bad_node_size(void) {
    int W = world_size();
    expect_not_dividing(W + 1, W);
    for (int S = 2; S < W; S++) {
        if (W % S) {
            expect_not_dividing(S, W); /* e.g. 3 with 4 ranks, 4 with 6 */
            break;
        }
    }
    if (W == 8) {
        expect_not_dividing(3, 8);
        EXPECT(strstr(zpp_last_error(), "e.g. 1, 2, 4 or 8") != NULL, "'%s'", zpp_last_error());
    }
    zpp_topo_opts o = {.backend = ZPP_BACKEND_MPI, .node_size = -2};
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "-2") != NULL, "'%s'", zpp_last_error());
    o.node_size = 1;
    o.backend = (zpp_backend_kind)5;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_INVALID);
    EXPECT(t == NULL);
#ifndef ZPP_HAVE_CUDA
    o.backend = ZPP_BACKEND_NCCL;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(zpp_last_error(), "NCCL") != NULL, "'%s'", zpp_last_error());
#endif
}

/* Options that differ between ranks are caught by the agreement step, on
 * every rank — including those whose own options were fine. */
static void test_options_disagree(void) {
    int W = world_size();
    if (W < 2) return; /* nothing can disagree */
    int comms0 = live_comms;
    zpp_topo_opts o = {.backend = ZPP_BACKEND_MPI, .node_size = zpp_test_rank == 0 ? 1 : W};
    zpp_topo *t = NULL;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "node_size differs") != NULL, "'%s'", zpp_last_error());
    /* node_size 0 on one rank only: must not leave the others in the
     * launcher's shared-memory split */
    o.node_size = zpp_test_rank == W - 1 ? 0 : 1;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_INVALID);
    o.node_size = 1;
    o.backend = zpp_test_rank == 0 ? ZPP_BACKEND_NCCL : ZPP_BACKEND_MPI;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, &t), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "backend differs") != NULL, "'%s'", zpp_last_error());
    /* a NULL output on one rank */
    o.backend = ZPP_BACKEND_MPI;
    EXPECT_STATUS(zpp_topo_create_with_opts(&o, zpp_test_rank == W - 1 ? NULL : &t),
                  ZPP_ERR_INVALID);
    EXPECT(t == NULL);
    EXPECT(live_comms == comms0);
}

/* node_size 0: the launcher's placement. ctest starts every rank on this
 * one host, so the shared-memory group is the whole world: one node. */
static void test_launcher_node_size(void) {
    int W = world_size(), rank = zpp_test_rank;
    MPI_Comm shm;
    int shm_size = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shm);
    MPI_Comm_size(shm, &shm_size);
    MPI_Comm_free(&shm);
    zpp_topo *t = topo_make(0);
    EXPECT(t->node_size == shm_size, "node_size %d, shared-memory group %d", t->node_size,
           shm_size);
    EXPECT(t->node_size == W && t->nodes == 1, "node_size %d nodes %d", t->node_size, t->nodes);
    check_topo_shape(t, W, rank, W);
    group g = group_make("intra(launcher)", t->intra, t, 1);
    check_membership(&g, rank);
    check_group(&g, 9000, 1, 64);
    free(g.member);
    zpp_topo_destroy(t);
}

/* Expects `call` to fail with ZPP_ERR_INVALID and a message containing
 * `what`, leaving the request NULL. */
#define EXPECT_REFUSED(call, what)                                                       \
    do {                                                                                 \
        zpp_error_clear();                                                               \
        EXPECT_STATUS(call, ZPP_ERR_INVALID);                                            \
        EXPECT(strstr(zpp_last_error(), what) != NULL, "%s: message '%s' lacks '%s'", #call, \
               zpp_last_error(), what);                                                  \
    } while (0)

/* The fronts' argument checks: each mistake is ZPP_ERR_INVALID with its
 * own message, identical on every rank and raised before any MPI call, so
 * nobody hangs. MPI's own errors come back as ZPP_ERR_COMM with MPI's
 * message. */
static void test_invalid_arguments(void) {
    zpp_topo *t = topo_make(1);
    zpp_comm *c = t->world;
    float buf[64] = {0};
    zpp_comm_req *const untouched = (zpp_comm_req *)buf, *r = untouched;
    size_t huge = SIZE_MAX / 2 + 1;
    /* NULL communicator */
    EXPECT_REFUSED(zpp_comm_allgather(NULL, buf, buf + 32, 4, NULL), "communicator is NULL");
    EXPECT_REFUSED(zpp_comm_barrier(NULL), "communicator is NULL");
    /* root range */
    EXPECT_REFUSED(zpp_comm_broadcast(c, buf, 4, c->size, NULL), "root");
    EXPECT_REFUSED(zpp_comm_broadcast(c, buf, 4, -1, &r), "root -1");
    EXPECT(r == untouched, "req_p written on failure");
    /* NULL buffers with nonzero sizes */
    EXPECT_REFUSED(zpp_comm_broadcast(c, NULL, 4, 0, NULL), "buffer is NULL for 4 bytes");
    EXPECT_REFUSED(zpp_comm_alltoall(c, NULL, buf, 4, NULL), "send buffer is NULL");
    EXPECT_REFUSED(zpp_comm_allgather(c, buf, NULL, 4, NULL), "receive buffer is NULL");
    EXPECT_REFUSED(zpp_comm_reduce_scatter(c, NULL, buf, 4, ZPP_FP32, NULL),
                   "send buffer is NULL for 4 elements");
    EXPECT_REFUSED(zpp_comm_allreduce(c, buf, NULL, 4, ZPP_BF16, NULL), "receive buffer");
    /* dtype */
    EXPECT_REFUSED(zpp_comm_allreduce(c, buf, buf + 32, 8, (zpp_dtype)9, NULL),
                   "unknown dtype 9");
    EXPECT_REFUSED(zpp_comm_reduce_scatter(c, buf, buf + 32, 1, (zpp_dtype)-1, &r),
                   "unknown dtype -1");
    EXPECT(r == untouched);
    /* size_t overflow of size * bytes */
    EXPECT_REFUSED(zpp_comm_allreduce(c, buf, buf + 32, huge, ZPP_FP32, NULL),
                   "overflows size_t");
    if (c->size > 1) {
        EXPECT_REFUSED(zpp_comm_allgather(c, buf, buf + 32, huge, NULL), "overflows size_t");
        EXPECT_REFUSED(zpp_comm_alltoall(c, buf, buf + 32, huge, NULL), "overflows size_t");
    }
    EXPECT_REFUSED(zpp_comm_reduce_scatter(c, buf, buf + 32, huge, ZPP_BF16, NULL),
                   "overflows size_t");
    /* overlap rules */
    EXPECT_REFUSED(zpp_comm_allreduce(c, buf, buf + 1, 8, ZPP_FP32, NULL), "partly overlap");
    EXPECT_REFUSED(zpp_comm_reduce_scatter(c, buf, buf, 4, ZPP_FP32, NULL), "overlap");
    EXPECT_REFUSED(zpp_comm_alltoall(c, buf, (char *)buf + 1, 4, NULL), "overlap");
    /* overlapping but not this rank's block */
    if (c->size * 8 <= (int)sizeof buf) {
        EXPECT_REFUSED(zpp_comm_allgather(c, (char *)buf + 1, buf, 8, NULL),
                       "send = recv + rank * bytes_per_rank");
    }
    /* the documented in-place forms pass */
    EXPECT_OK(zpp_comm_allreduce(c, buf, buf, 8, ZPP_FP32, NULL));
    if (c->size * 8 <= (int)sizeof buf)
        EXPECT_OK(zpp_comm_allgather(c, (char *)buf + (size_t)c->rank * 8, buf, 8, NULL));
    /* agreeing on a NULL communicator: the caller's own status, or INVALID */
    EXPECT_STATUS(zpp_comm_agree(NULL, ZPP_ERR_IO), ZPP_ERR_IO);
    EXPECT_REFUSED(zpp_comm_agree(NULL, ZPP_OK), "communicator is NULL");
    EXPECT_REFUSED(zpp_comm_max_world(NULL), "NULL");
    zpp_topo_destroy(t);

    /* MPI_Comm_dup of MPI_COMM_NULL: MPI reports MPI_ERR_COMM through the
     * world's error handler, set to return for this check. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm null_comm = MPI_COMM_NULL;
    zpp_comm *bad = NULL;
    EXPECT_STATUS(zpp_comm_mpi_create(&null_comm, &bad), ZPP_ERR_COMM);
    EXPECT(bad == NULL);
    EXPECT(strstr(zpp_last_error(), "MPI_ERR_COMM") != NULL, "'%s'", zpp_last_error());
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

/* The world forms, before any topology: one random rank fails (every rank
 * gets its status and exact message), several fail (the lowest wins), none
 * fail; and the maximum of a double. */
static void test_agree_world(void) {
    int W = world_size(), rank = zpp_test_rank;
    for (int round = 0; round < 4; round++) {
        zpp_rng r = zpp_rng_make(seed_of(9000 + (uint64_t)round, -1, 0));
        int first = round == 3 ? W : (int)(zpp_rng_u64(&r) % (uint64_t)W);
        /* round 2: everyone from `first` on fails */
        int fails = round == 2 ? rank >= first : rank == first;
        char msg[128];
        snprintf(msg, sizeof msg, "world round %d: rank %d saw problem %llx", round,
                 round == 2 ? first : rank, (unsigned long long)zpp_rng_u64(&r));
        zpp_status st = ZPP_OK;
        if (fails) {
            /* a later failing rank has another message and status */
            if (rank == first) st = zpp_error(ZPP_ERR_IO, "%s", msg);
            else st = zpp_error(ZPP_ERR_CONFIG, "rank %d: something else", rank);
        } else {
            zpp_error_clear();
        }
        zpp_status got = zpp_comm_agree_world(st);
        if (first == W) {
            EXPECT(got == ZPP_OK, "all OK agreed to %s", zpp_status_str(got));
        } else {
            EXPECT(got == ZPP_ERR_IO, "round %d: %s, expected the first failing rank's IO",
                   round, zpp_status_str(got));
            EXPECT(strcmp(zpp_last_error(), msg) == 0 || rank != first,
                   "round %d: '%s' on the failing rank", round, zpp_last_error());
            /* every rank has the same message: compare through a gather */
            char all[8][128];
            char mine[128];
            snprintf(mine, sizeof mine, "%s", zpp_last_error());
            if (W <= 8) {
                MPI_Allgather(mine, 128, MPI_CHAR, all, 128, MPI_CHAR, MPI_COMM_WORLD);
                for (int i = 0; i < W; i++)
                    EXPECT(strcmp(all[i], all[first]) == 0, "rank %d got '%s', rank %d '%s'",
                           i, all[i], first, all[first]);
                EXPECT(strstr(all[first], "saw problem") != NULL, "'%s'", all[first]);
            }
        }
    }
    double v = (double)rank * 1.5 - 2.0;
    EXPECT_OK(zpp_comm_max_world(&v));
    EXPECT(v == (double)(W - 1) * 1.5 - 2.0, "max_world %g", v);
    EXPECT(zpp_comm_world_rank() == rank && zpp_comm_world_size() == W);
    int lr = -1, ls = -1;
    EXPECT_OK(zpp_comm_launch_local(&lr, &ls));
    EXPECT(ls >= 1 && lr >= 0 && lr < ls, "launch local %d of %d", lr, ls);
    EXPECT_REFUSED(zpp_comm_launch_local(NULL, &ls), "required");
}

/* Deadlines (issue 14): with a 1 s deadline, rank 0 enters an all-gather
 * 4 s after the others. They return ZPP_ERR_TIMEOUT with a message naming
 * the operation, the communicator, its bytes and the deadline, well before
 * rank 0 arrives, without keeping a core busy meanwhile; the communicator
 * then refuses work, and an agreement on a local timeout returns it at once
 * (the stalled peer cannot answer). Rank 0, late, finds its peers'
 * abandoned operations still inside MPI and completes, or times out
 * itself. The buffers are static: MPI may still write into an abandoned
 * operation's. */
static void test_collective_timeout(void) {
    int W = world_size(), rank = zpp_test_rank;
    if (W < 2 || W > 16) return;
    static char send[32], recv[32 * 16];
    zpp_topo_opts o = {.backend = ZPP_BACKEND_MPI, .node_size = 1, .timeout_s = 1.0};
    zpp_topo *t = NULL;
    EXPECT_OK(zpp_topo_create_with_opts(&o, &t));
    memset(send, rank + 1, sizeof send);
    EXPECT_OK(zpp_comm_allgather(t->world, send, recv, sizeof send, NULL)); /* in time */
    EXPECT(recv[(W - 1) * 32] == W);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        struct timespec late = {4, 0};
        nanosleep(&late, NULL);
    }
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double t0 = MPI_Wtime();
    zpp_error_clear();
    zpp_status st = zpp_comm_allgather(t->world, send, recv, sizeof send, NULL);
    double took = MPI_Wtime() - t0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    if (rank != 0) {
        char bytes[64];
        snprintf(bytes, sizeof bytes, "(%d bytes)", 32 * W);
        EXPECT(st == ZPP_ERR_TIMEOUT, "rank 0 came 4 s late with a 1 s deadline: %s '%s'",
               zpp_status_str(st), zpp_last_error());
        const char *msg = zpp_last_error();
        EXPECT(strstr(msg, "allgather on the world communicator") && strstr(msg, bytes) &&
                   strstr(msg, "no peer answered for 1 s (a rank stalled or died); every rank "
                               "stops"),
               "message '%s'", msg);
        EXPECT(took >= 0.95 && took < 3.8, "timed out after %.2f s", took);
        /* waiting sleeps between tests: no core kept busy (MPI_Wait spun) */
        EXPECT(cpu < 0.5 * took, "%.2f s of CPU in a %.2f s wait", cpu, took);
        /* who did not arrive: rank 0, sleeping (in no collective) */
        EXPECT(strstr(msg, "; rank 0 did not arrive (pid ") &&
                   strstr(msg, "is in no collective") && !strstr(msg, "rank 1 did not"),
               "message '%s'", msg);
        char first[1024];
        snprintf(first, sizeof first, "%s", msg);
        /* the refusal names what timed out; the message stays the first
         * failure's (a timeout latches until cleared) */
        EXPECT_STATUS(zpp_comm_barrier(t->world), ZPP_ERR_STATE);
        EXPECT(strcmp(zpp_last_error(), first) == 0, "'%s'", zpp_last_error());
        zpp_error_clear();
        EXPECT_STATUS(zpp_comm_barrier(t->world), ZPP_ERR_STATE);
        EXPECT(strstr(zpp_last_error(), "refused, since mpi allgather #2") &&
                   strstr(zpp_last_error(), "timed out on it earlier"),
               "'%s'", zpp_last_error());
        zpp_error_clear();
        zpp_error(ZPP_ERR_TIMEOUT, "own timeout");
        double a0 = MPI_Wtime();
        EXPECT_STATUS(zpp_comm_agree(t->world, ZPP_ERR_TIMEOUT), ZPP_ERR_TIMEOUT);
        EXPECT(MPI_Wtime() - a0 < 0.5 && strcmp(zpp_last_error(), "own timeout") == 0,
               "agreeing on a timeout waited or changed the message: '%s'", zpp_last_error());
    } else {
        EXPECT(st == ZPP_OK || st == ZPP_ERR_TIMEOUT, "late rank 0: %s '%s'",
               zpp_status_str(st), zpp_last_error());
    }
    /* The intra communicators (one rank each) were not involved: they
     * still work, and the asynchronous form takes the deadline too. */
    zpp_comm_req *req = NULL;
    EXPECT_OK(zpp_comm_allgather(t->intra, send, recv, sizeof send, &req));
    EXPECT_OK(zpp_comm_wait(t->intra, req));
    MPI_Barrier(MPI_COMM_WORLD);
    zpp_topo_destroy(t);
    zpp_error_clear(); /* the timeout latched its message */
}

/* Setup has the deadline too (issue 29): with a 1 s deadline, rank 0
 * calls zpp_topo_create_with_opts 3 s after the others. They return ZPP_ERR_TIMEOUT
 * naming the setup step, well before rank 0 arrives, instead of hanging
 * in a blocking split; rank 0, late, times out at a later step of its own
 * (its peers have left). */
static void test_topology_setup_timeout(void) {
    int W = world_size(), rank = zpp_test_rank;
    if (W < 2 || W > 16) return;
    zpp_topo_opts o = {.backend = ZPP_BACKEND_MPI, .node_size = 1, .timeout_s = 1.0};
    zpp_topo *t = NULL;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        struct timespec late = {3, 0};
        nanosleep(&late, NULL);
    }
    zpp_error_clear();
    double t0 = MPI_Wtime();
    zpp_status st = zpp_topo_create_with_opts(&o, &t);
    double took = MPI_Wtime() - t0;
    const char *msg = zpp_last_error();
    EXPECT(st == ZPP_ERR_TIMEOUT && t == NULL, "rank %d: %s '%s'", rank, zpp_status_str(st),
           msg);
    EXPECT(strstr(msg, "topology setup (") && strstr(msg, "no peer answered for 1 s"),
           "rank %d: '%s'", rank, msg);
    if (rank != 0) EXPECT(took >= 0.95 && took < 2.8, "timed out after %.2f s", took);
    if (rank <= 1) printf("  rank %d after %.1f s: %s\n", rank, took, msg);
    MPI_Barrier(MPI_COMM_WORLD);
    zpp_error_clear();
}

ZPP_TESTS(ZPP_TEST(test_every_node_size), ZPP_TEST(test_zero_sizes),
          ZPP_TEST_HOOKS(test_large_count_path), ZPP_TEST(test_bad_node_size),
          ZPP_TEST(test_options_disagree), ZPP_TEST(test_launcher_node_size),
          ZPP_TEST(test_invalid_arguments), ZPP_TEST(test_agree_world),
          ZPP_TEST(test_collective_timeout), ZPP_TEST(test_topology_setup_timeout))

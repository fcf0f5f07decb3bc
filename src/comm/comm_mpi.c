/* comm/comm_mpi.c — the MPI backend: collectives on host memory.
 *
 * Each zpp_comm owns a duplicate of the MPI communicator it was made from,
 * with MPI_ERRORS_RETURN set, so MPI hands errors back (as ZPP_ERR_COMM with
 * MPI's own message) instead of aborting the job. Operations map one to one
 * onto MPI's nonblocking collectives (MPI_Iallgather, ...): with req_p the
 * request object (the MPI_Request and any datatype that must outlive the
 * operation) goes to the caller, without it the call completes it at once.
 * The arguments were checked by the fronts (comm.c).
 *
 * Deadlines. Nothing here blocks inside MPI: every completion (blocking
 * form, wait, barrier, agreement, the world forms) polls MPI_Test with
 * short sleeps until the communicator's deadline (zpp_topo_opts.timeout_s;
 * 0 = forever). Past it the call returns ZPP_ERR_TIMEOUT naming the
 * operation, the communicator and its size, and the communicator refuses
 * further work: a started collective cannot be cancelled in MPI, so its
 * request is abandoned inside MPI (which may still complete it, and write
 * its receive buffer, should the stalled peer come back). Every operation
 * is counted on the topology's progress board (comm/progress.h) when it
 * starts, and a waiting rank marks where it waits, so the timeout's
 * message can name the ranks that did not arrive. Polling rather
 * than MPI_Wait also keeps a waiting rank off the CPU: the first 2 ms
 * yield between tests (latency), later tests are 50 us, then 1 ms, apart.
 *
 * Reductions. fp32 sums use MPI_FLOAT / MPI_SUM. bf16 and fp16 have no MPI
 * type, so they travel as 16-bit words (MPI_UINT16_T) and are summed by our
 * own commutative MPI_Op: each combination of two partial results converts
 * both to fp32, adds, and rounds the sum back to nearest even — the same
 * arithmetic as NCCL's bf16/fp16 sum. The ops are created once, on first
 * use, and freed when MPI finalizes (an attribute on MPI_COMM_SELF, whose
 * delete callback MPI_Finalize runs first).
 *
 * Large counts. MPI-3 counts are ints. A buffer of more than INT_MAX
 * elements is described as ONE element of a "blob" datatype covering all of
 * its bytes: q contiguous chunks of `chunk` bytes followed by r remaining
 * bytes, resized to extent q*chunk + r. Collectives that only move bytes
 * don't care; reductions on a blob cannot use MPI_SUM (predefined ops take
 * predefined types only), so they use our own sum op for the dtype, which
 * asks the datatype for its size and treats the blob as a flat array. */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "core/fault.h"

typedef struct zpp__mpi {
    MPI_Comm comm;
    double timeout_s; /* 0: wait forever */
    char name[16];    /* "world", "intra", "inter" (topo.c), or "" */
    int broken;       /* a wait timed out: refuse further work */
    char why[160];    /* which operation timed out, for the refusals after it */
    zpp_progress *prog; /* the topology's progress board, or NULL */
    int kind;           /* this communicator on it (ZPP_PROG_*) */
} zpp__mpi;

struct zpp_comm_req {
    MPI_Request req;
    MPI_Datatype type; /* a blob datatype to free on completion, or NULL */
    zpp__mpi *owner;   /* its communicator's deadline and name */
    const char *op;
    size_t bytes;      /* per rank, for the timeout's message */
    zpp_prog_at at;    /* where it stands on the progress board */
};

/* The world forms' deadline (zpp_comm_world_set_timeout). */
static double world_timeout_s = 0.0;

/* ---- Errors ----------------------------------------------------------- */

static zpp_status mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return zpp_error(ZPP_ERR_COMM,
                     "mpi %s failed: %s; check that every rank of the communicator calls the "
                     "same collectives in the same order with matching sizes",
                     what, msg);
}

#define ZPP__MPI_CHECK(call, what)                                  \
    do {                                                            \
        int zpp_rc_ = (call);                                       \
        if (zpp_rc_ != MPI_SUCCESS) return mpi_fail(zpp_rc_, what); \
    } while (0)

/* ---- Completing a request before a deadline ---------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void poll_pause(double waited_s) {
    if (waited_s < 2e-3) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited_s < 0.1 ? 50000L : 1000000L};
    nanosleep(&ts, NULL);
}

zpp_status zpp__comm_mpi_poll(void *req, double timeout_s, const char *op, const char *name,
                              size_t bytes) {
    return zpp__comm_mpi_poll_at(req, timeout_s, op, name, bytes, NULL);
}

zpp_status zpp__comm_mpi_poll_at(void *reqv, double timeout_s, const char *op, const char *name,
                                 size_t bytes, const zpp_prog_at *at) {
    MPI_Request *req = reqv;
    double t0 = now_s();
    zpp__progress_wait_begin(at, op);
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            zpp__progress_wait_end(at);
            return mpi_fail(rc, op);
        }
        if (done) {
            zpp__progress_wait_end(at);
            return ZPP_OK;
        }
        double waited = now_s() - t0;
        if (timeout_s > 0.0 && waited >= timeout_s) {
            /* A started collective cannot be cancelled or freed (MPI-3.1
             * 5.12): it stays inside MPI, which completes it if the peers
             * ever arrive. The slot still says where this rank waits: it
             * never leaves (the job stops). */
            *req = MPI_REQUEST_NULL;
            char who[512];
            zpp__progress_explain(at, who, sizeof who);
            return zpp_error(ZPP_ERR_TIMEOUT,
                             "mpi %s on the %s communicator (%zu bytes): no peer "
                             "answered for %g s (a rank stalled or died); every rank stops%s",
                             op, name && name[0] ? name : "unnamed", bytes, timeout_s, who);
        }
        poll_pause(waited);
    }
}

zpp_status zpp__comm_mpi_gate(const void *mpi_comm, double timeout_s, const char *stage,
                              zpp_progress *p) {
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(*(const MPI_Comm *)mpi_comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "setup gate");
    zpp_prog_at at = zpp__progress_enter(p, ZPP_PROG_SETUP);
    char op[160];
    snprintf(op, sizeof op, "topology setup (every rank arriving for %s)", stage);
    return zpp__comm_mpi_poll_at(&req, timeout_s, op, "world", 0, &at);
}

/* ---- bf16 / fp16 / blob sum ops --------------------------------------- */

static MPI_Op op_sum_f32 = MPI_OP_NULL; /* for fp32 blobs */
static MPI_Op op_sum_bf16 = MPI_OP_NULL;
static MPI_Op op_sum_fp16 = MPI_OP_NULL;
static int ops_ready = 0;

/* Number of `elem`-byte values in *len elements of *dt. */
static size_t op_count(const int *len, MPI_Datatype *dt, size_t elem) {
    if (*dt == MPI_UINT16_T || *dt == MPI_FLOAT) return (size_t)*len;
    MPI_Count sz = 0;
    MPI_Type_size_x(*dt, &sz); /* a blob: its whole size in bytes */
    return (size_t)*len * (size_t)sz / elem;
}

static void sum_f32(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const float *a = in;
    float *b = inout;
    size_t n = op_count(len, dt, 4);
    for (size_t i = 0; i < n; i++) b[i] += a[i];
}

/* One combination: fp32 sum of the two 16-bit values, rounded once. */
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const zpp_bf16 *a = in;
    zpp_bf16 *b = inout;
    size_t n = op_count(len, dt, 2);
    for (size_t i = 0; i < n; i++)
        b[i] = zpp_f32_to_bf16(zpp_bf16_to_f32(a[i]) + zpp_bf16_to_f32(b[i]));
}

static void sum_fp16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const zpp_fp16 *a = in;
    zpp_fp16 *b = inout;
    size_t n = op_count(len, dt, 2);
    for (size_t i = 0; i < n; i++)
        b[i] = zpp_f32_to_fp16(zpp_fp16_to_f32(a[i]) + zpp_fp16_to_f32(b[i]));
}

static void ops_free(void) {
    MPI_Op *ops[] = {&op_sum_f32, &op_sum_bf16, &op_sum_fp16};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (*ops[i] != MPI_OP_NULL) MPI_Op_free(ops[i]);
    ops_ready = 0;
}

static int ops_delete_cb(MPI_Comm comm, int keyval, void *attr, void *extra) {
    ops_free();
    return MPI_SUCCESS;
}

/* Creates the sum ops once per MPI lifetime (zpp_comm_mpi_create runs
 * collectively from one thread, so no lock). */
static zpp_status ops_init(void) {
    if (ops_ready) return ZPP_OK;
    int rc = MPI_Op_create(sum_f32, 1, &op_sum_f32);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_bf16, 1, &op_sum_bf16);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_fp16, 1, &op_sum_fp16);
    int key = MPI_KEYVAL_INVALID;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, ops_delete_cb, &key, NULL);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);
        MPI_Comm_free_keyval(&key); /* the attribute keeps it alive */
    }
    if (rc != MPI_SUCCESS) {
        ops_free();
        return mpi_fail(rc, "sum op setup");
    }
    ops_ready = 1;
    return ZPP_OK;
}

/* ---- Buffers as (count, datatype) ------------------------------------- */

typedef struct zpp__mpi_buf {
    int count;
    MPI_Datatype type;
    int blob; /* type is ours: free it after the operation */
} zpp__mpi_buf;

/* Describes n elements of `elem` (elem_size bytes each) for MPI. */
static zpp_status mpi_buf_make(size_t n, MPI_Datatype elem, size_t elem_size, zpp__mpi_buf *b) {
    /* INT_MAX, or less when a test lowered it (core/fault.h: only with hooks) */
    size_t max = (size_t)zpp_fault_mpi_max_count();
    if (n <= max) {
        b->count = (int)n;
        b->type = elem;
        b->blob = 0;
        return ZPP_OK;
    }
    if (n > (size_t)PTRDIFF_MAX / elem_size)
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi: %zu elements of %zu bytes overflow the address space", n,
                         elem_size);
    /* bytes = q * chunk + r with chunk <= max, q <= max and r < chunk:
     * chunk >= ceil(bytes / max) keeps q in range; 64 KiB (or max) as a
     * floor keeps the chunks large so MPI's datatype engine stays fast. */
    size_t bytes = n * elem_size;
    size_t floor_chunk = max < 65536 ? max : 65536;
    size_t chunk = (bytes + max - 1) / max;
    if (chunk < floor_chunk) chunk = floor_chunk;
    if (chunk > max)
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi: %zu bytes cannot be described with counts of at most %zu; "
                         "raise the max count", bytes, max);
    size_t q = bytes / chunk, r = bytes - q * chunk;
    MPI_Datatype piece = MPI_DATATYPE_NULL, body = MPI_DATATYPE_NULL,
                 whole = MPI_DATATYPE_NULL, blob = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous((int)chunk, MPI_BYTE, &piece);
    if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous((int)q, piece, &body);
    if (rc == MPI_SUCCESS) {
        int lens[2] = {1, (int)r};
        MPI_Aint disps[2] = {0, (MPI_Aint)(q * chunk)};
        MPI_Datatype types[2] = {body, MPI_BYTE};
        rc = MPI_Type_create_struct(r ? 2 : 1, lens, disps, types, &whole);
    }
    /* Byte types have no alignment padding, but state the extent anyway:
     * consecutive blobs in a rank-ordered buffer must be exactly `bytes`
     * apart. */
    if (rc == MPI_SUCCESS) rc = MPI_Type_create_resized(whole, 0, (MPI_Aint)bytes, &blob);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&blob);
    if (whole != MPI_DATATYPE_NULL) MPI_Type_free(&whole);
    if (body != MPI_DATATYPE_NULL) MPI_Type_free(&body);
    if (piece != MPI_DATATYPE_NULL) MPI_Type_free(&piece);
    if (rc != MPI_SUCCESS) {
        if (blob != MPI_DATATYPE_NULL) MPI_Type_free(&blob);
        return mpi_fail(rc, "large-count datatype");
    }
    b->count = 1;
    b->type = blob;
    b->blob = 1;
    return ZPP_OK;
}

static void mpi_buf_free(zpp__mpi_buf *b) {
    if (b->blob) MPI_Type_free(&b->type);
    b->blob = 0;
}

/* The MPI element type of a dtype (checked by the front). */
static void mpi_dtype(zpp_dtype dtype, MPI_Datatype *type_p, size_t *size_p) {
    if (dtype == ZPP_FP32) {
        *type_p = MPI_FLOAT;
        *size_p = 4;
    } else { /* bf16, fp16: 16-bit words summed by our own ops */
        *type_p = MPI_UINT16_T;
        *size_p = 2;
    }
}

static MPI_Op mpi_sum_op(zpp_dtype dtype, int blob) {
    switch (dtype) {
    case ZPP_BF16: return op_sum_bf16;
    case ZPP_FP16: return op_sum_fp16;
    default: return blob ? op_sum_f32 : MPI_SUM;
    }
}

/* ---- Starting and finishing operations -------------------------------- */

static zpp__mpi *mpi_of(zpp_comm *c) { return c->impl; }
static MPI_Comm comm_of(zpp_comm *c) { return mpi_of(c)->comm; }

/* A communicator whose wait timed out holds an abandoned collective: any
 * later operation on it would be matched against that one. */
static zpp_status mpi_refuse(zpp__mpi *m, const char *op) {
    return zpp_error(ZPP_ERR_STATE,
                     "mpi %s on the %s communicator: refused, since %s timed out on it earlier "
                     "and is still unfinished (a rank stalled or died); every rank stops",
                     op, m->name[0] ? m->name : "unnamed", m->why);
}

static zpp_status mpi_usable(zpp_comm *c, const char *op) {
    zpp__mpi *m = mpi_of(c);
    return m->broken ? mpi_refuse(m, op) : ZPP_OK;
}

/* Polls `req` until done or the communicator's deadline. On a
 * communicator that already timed out, one test: an operation started
 * before the stall may be done; any other cannot finish, and waiting a
 * second deadline for it would only delay the stop. */
static zpp_status mpi_complete(zpp__mpi *m, MPI_Request *req, const char *op, size_t bytes,
                               const zpp_prog_at *at) {
    if (m->broken) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return ZPP_OK;
        *req = MPI_REQUEST_NULL; /* abandoned, as the first one */
        return mpi_refuse(m, op);
    }
    zpp_status st = zpp__comm_mpi_poll_at(req, m->timeout_s, op, m->name, bytes, at);
    if (st == ZPP_ERR_TIMEOUT) {
        m->broken = 1;
        snprintf(m->why, sizeof m->why, "mpi %s #%llu (%zu bytes)", op,
                 (unsigned long long)(at ? at->seq : 0), bytes);
    }
    return st;
}

/* Allocates the request of an asynchronous call (NULL when blocking). */
static zpp_status req_new(zpp_comm_req **req_p, zpp_comm_req **out) {
    *out = NULL;
    if (!req_p) return ZPP_OK;
    zpp_comm_req *r = malloc(sizeof *r);
    if (!r) return zpp_error(ZPP_ERR_NOMEM, "mpi: out of memory for a request");
    r->req = MPI_REQUEST_NULL;
    r->type = MPI_DATATYPE_NULL;
    r->owner = NULL;
    r->op = "";
    r->bytes = 0;
    r->at = (zpp_prog_at){NULL, 0, 0};
    *out = r;
    return ZPP_OK;
}

/* Starts an operation: checks the communicator, describes `n` elements of
 * `elem` and takes a request when the caller wants one. */
static zpp_status mpi_start(zpp_comm *c, const char *op, size_t n, MPI_Datatype elem,
                            size_t elem_size, zpp__mpi_buf *b, zpp_comm_req **req_p,
                            zpp_comm_req **r_p) {
    ZPP_CHECK(mpi_usable(c, op));
    ZPP_CHECK(mpi_buf_make(n, elem, elem_size, b));
    zpp_status st = req_new(req_p, r_p);
    if (st != ZPP_OK) mpi_buf_free(b);
    return st;
}

/* Counts the operation on the progress board (after its checks passed:
 * every member counts the same calls). */
static zpp_prog_at mpi_enter(zpp_comm *c) {
    zpp__mpi *m = mpi_of(c);
    return zpp__progress_enter(m->prog, m->kind);
}

/* After the MPI_I* call `rc` that filled `mreq`: hands the request (and
 * blob type) to the caller for an asynchronous call; for a blocking one
 * completes it (before the deadline) and frees everything. */
static zpp_status mpi_finish(zpp_comm *c, int rc, const char *what, size_t bytes, zpp__mpi_buf *b,
                             MPI_Request *mreq, zpp_comm_req *r, zpp_comm_req **req_p) {
    if (rc != MPI_SUCCESS) {
        mpi_buf_free(b);
        free(r);
        return mpi_fail(rc, what);
    }
    zpp_prog_at at = mpi_enter(c);
    if (r) {
        if (b->blob) r->type = b->type;
        r->owner = mpi_of(c);
        r->op = what;
        r->bytes = bytes;
        r->at = at;
        *req_p = r;
        return ZPP_OK;
    }
    zpp_status st = mpi_complete(mpi_of(c), mreq, what, bytes, &at);
    mpi_buf_free(b); /* MPI keeps a type an abandoned operation still uses */
    return st;
}

/* ---- Operations -------------------------------------------------------- */

static zpp_status mpi_allgather(zpp_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                                zpp_comm_req **req_p) {
    static const char op[] = "allgather";
    /* In place: this rank's input already sits at its block of the output. */
    int in_place = bytes_per_rank &&
                   send == (const char *)recv + (size_t)c->rank * bytes_per_rank;
    zpp__mpi_buf b;
    zpp_comm_req *r;
    MPI_Request mr = MPI_REQUEST_NULL;
    ZPP_CHECK(mpi_start(c, op, bytes_per_rank, MPI_BYTE, 1, &b, req_p, &r));
    const void *s = in_place ? MPI_IN_PLACE : send;
    int rc =
        MPI_Iallgather(s, b.count, b.type, recv, b.count, b.type, comm_of(c), r ? &r->req : &mr);
    return mpi_finish(c, rc, op, bytes_per_rank * (size_t)c->size, &b, &mr, r, req_p);
}

static zpp_status mpi_reduce_scatter(zpp_comm *c, const void *send, void *recv,
                                     size_t count_per_rank, zpp_dtype dtype, zpp_comm_req **req_p) {
    static const char op[] = "reduce_scatter";
    MPI_Datatype et = MPI_DATATYPE_NULL;
    size_t es = 0;
    mpi_dtype(dtype, &et, &es);
    zpp__mpi_buf b;
    zpp_comm_req *r;
    MPI_Request mr = MPI_REQUEST_NULL;
    ZPP_CHECK(mpi_start(c, op, count_per_rank, et, es, &b, req_p, &r));
    MPI_Op mop = mpi_sum_op(dtype, b.blob);
    int rc =
        MPI_Ireduce_scatter_block(send, recv, b.count, b.type, mop, comm_of(c), r ? &r->req : &mr);
    return mpi_finish(c, rc, op, count_per_rank * es * (size_t)c->size, &b, &mr, r, req_p);
}

static zpp_status mpi_alltoall(zpp_comm *c, const void *send, void *recv, size_t bytes_per_peer,
                               zpp_comm_req **req_p) {
    static const char op[] = "alltoall";
    zpp__mpi_buf b;
    zpp_comm_req *r;
    MPI_Request mr = MPI_REQUEST_NULL;
    ZPP_CHECK(mpi_start(c, op, bytes_per_peer, MPI_BYTE, 1, &b, req_p, &r));
    int rc =
        MPI_Ialltoall(send, b.count, b.type, recv, b.count, b.type, comm_of(c), r ? &r->req : &mr);
    return mpi_finish(c, rc, op, bytes_per_peer * (size_t)c->size, &b, &mr, r, req_p);
}

static zpp_status mpi_allreduce(zpp_comm *c, const void *send, void *recv, size_t count,
                                zpp_dtype dtype, zpp_comm_req **req_p) {
    static const char op[] = "allreduce";
    MPI_Datatype et = MPI_DATATYPE_NULL;
    size_t es = 0;
    mpi_dtype(dtype, &et, &es);
    int in_place = send == recv;
    zpp__mpi_buf b;
    zpp_comm_req *r;
    MPI_Request mr = MPI_REQUEST_NULL;
    ZPP_CHECK(mpi_start(c, op, count, et, es, &b, req_p, &r));
    const void *s = in_place ? MPI_IN_PLACE : send;
    MPI_Op mop = mpi_sum_op(dtype, b.blob);
    int rc = MPI_Iallreduce(s, recv, b.count, b.type, mop, comm_of(c), r ? &r->req : &mr);
    return mpi_finish(c, rc, op, count * es, &b, &mr, r, req_p);
}

static zpp_status mpi_agree(zpp_comm *c, zpp_status st) {
    zpp__mpi *m = mpi_of(c);
    /* Its abandoned collective would be matched against the agreement's:
     * this rank's own answer is all it can give. */
    if (m->broken) return st != ZPP_OK ? st : mpi_usable(c, "agree");
    zpp_status got = zpp__comm_mpi_agree_at(&m->comm, st, m->timeout_s, m->name, m->prog, m->kind);
    /* the agreement's own timeout leaves an abandoned collective too */
    if (got == ZPP_ERR_TIMEOUT && st != ZPP_ERR_TIMEOUT) m->broken = 1;
    return got;
}

static zpp_status mpi_broadcast(zpp_comm *c, void *buf, size_t bytes, int root,
                                zpp_comm_req **req_p) {
    static const char op[] = "broadcast";
    zpp__mpi_buf b;
    zpp_comm_req *r;
    MPI_Request mr = MPI_REQUEST_NULL;
    ZPP_CHECK(mpi_start(c, op, bytes, MPI_BYTE, 1, &b, req_p, &r));
    int rc = MPI_Ibcast(buf, b.count, b.type, root, comm_of(c), r ? &r->req : &mr);
    return mpi_finish(c, rc, op, bytes, &b, &mr, r, req_p);
}

static zpp_status mpi_barrier(zpp_comm *c) {
    static const char op[] = "barrier";
    ZPP_CHECK(mpi_usable(c, op));
    MPI_Request mr = MPI_REQUEST_NULL;
    ZPP__MPI_CHECK(MPI_Ibarrier(comm_of(c), &mr), op);
    zpp_prog_at at = mpi_enter(c);
    return mpi_complete(mpi_of(c), &mr, op, 0, &at);
}

static zpp_status mpi_wait(zpp_comm_req *r) {
    if (!r) return ZPP_OK;
    zpp_status st = mpi_complete(r->owner, &r->req, r->op, r->bytes, &r->at);
    if (r->type != MPI_DATATYPE_NULL) MPI_Type_free(&r->type);
    free(r);
    return st;
}

static void mpi_destroy(zpp_comm *c) {
    if (!c) return;
    zpp__mpi *m = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* After MPI_Finalize the communicator is gone with MPI; only our memory
     * is left to free. (An abandoned collective keeps MPI's own reference.) */
    if (m && !finalized && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m);
    free(c);
}

static const zpp_comm_ops kMpiOps = {
    .name = "mpi",
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .alltoall = mpi_alltoall,
    .allreduce = mpi_allreduce,
    .agree = mpi_agree,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .wait = mpi_wait,
    .destroy = mpi_destroy,
};

zpp_status zpp_comm_mpi_create(const void *mpi_comm, zpp_comm **comm_p) {
    if (!mpi_comm || !comm_p)
        return zpp_error(ZPP_ERR_INVALID, "comm_mpi_create: mpi_comm and comm_p must not be NULL");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zpp_error(ZPP_ERR_STATE, "comm_mpi_create: MPI is not initialised; call MPI_Init "
                         "first (and create communicators before MPI_Finalize)");
    ZPP_CHECK(ops_init());
    /* The duplicate is ours: its own matching space, and errors returned. */
    MPI_Comm dup = MPI_COMM_NULL;
    ZPP__MPI_CHECK(MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &dup), "comm dup");
    int rank = 0, size = 0;
    int rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(dup, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(dup, &size);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&dup);
        return mpi_fail(rc, "comm setup");
    }
    zpp_comm *c = malloc(sizeof *c);
    zpp__mpi *m = malloc(sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        MPI_Comm_free(&dup);
        return zpp_error(ZPP_ERR_NOMEM, "comm_mpi_create: out of memory");
    }
    m->comm = dup;
    m->timeout_s = 0.0;
    m->name[0] = '\0';
    m->broken = 0;
    m->why[0] = '\0';
    m->prog = NULL;
    m->kind = -1;
    c->ops = &kMpiOps;
    c->mem = ZPP_MEM_HOST;
    c->rank = rank;
    c->size = size;
    c->impl = m;
    *comm_p = c;
    return ZPP_OK;
}

void zpp__comm_mpi_configure(zpp_comm *c, const char *name, double timeout_s) {
    zpp__mpi *m = c->impl;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "");
    m->timeout_s = timeout_s > 0.0 ? timeout_s : 0.0;
}

void zpp__comm_mpi_set_progress(zpp_comm *c, zpp_progress *p, int comm) {
    zpp__mpi *m = c->impl;
    m->prog = p;
    m->kind = comm;
}

/* ---- Failing together ------------------------------------------------------ */

/* The message of the lowest failing rank travels whole: zpp_last_error()
 * holds at most this many bytes (core/error.c). */
#define ZPP__AGREE_MSG 1024

/* The agreement failed (an MPI error, or its own deadline, already
 * recorded): keep this rank's own reason. */
static zpp_status agree_fail(zpp_status failed, zpp_status local, const char *own) {
    if (local == ZPP_OK) return failed;
    return zpp_error_append(failed, "(this rank had failed before: %s)",
                            own[0] ? own : zpp_status_str(local));
}

/* What one agreement moves. On the heap: after a timeout MPI keeps the
 * abandoned request and could still write here, so it is then left
 * allocated (the job stops anyway). */
typedef struct zpp__agree_buf {
    int mine, first;
    struct {
        int status;
        char msg[ZPP__AGREE_MSG];
    } why;
} zpp__agree_buf;

zpp_status zpp__comm_mpi_agree(const void *mpi_comm, zpp_status st, double timeout_s,
                               const char *name) {
    return zpp__comm_mpi_agree_at(mpi_comm, st, timeout_s, name, NULL, -1);
}

zpp_status zpp__comm_mpi_agree_at(const void *mpi_comm, zpp_status st, double timeout_s,
                                  const char *name, zpp_progress *p, int kind) {
    /* A rank that timed out stops at once: the peer it waited for cannot
     * answer an agreement either. */
    if (st == ZPP_ERR_TIMEOUT) return st;
    zpp_prog_at at = zpp__progress_enter(p, kind);
    MPI_Comm comm = *(const MPI_Comm *)mpi_comm;
    char own[ZPP__AGREE_MSG] = "";
    if (st != ZPP_OK) snprintf(own, sizeof own, "%s", zpp_last_error());
    int rank = 0, size = 1;
    int rc = MPI_Comm_rank(comm, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS) return agree_fail(mpi_fail(rc, "error agreement"), st, own);
    zpp__agree_buf *a = calloc(1, sizeof *a);
    if (!a) return agree_fail(zpp_error(ZPP_ERR_NOMEM, "agree: out of memory"), st, own);
    /* 1. The lowest failing rank, or `size` when none failed. */
    a->mine = st != ZPP_OK ? rank : size;
    a->first = size;
    MPI_Request req = MPI_REQUEST_NULL;
    rc = MPI_Iallreduce(&a->mine, &a->first, 1, MPI_INT, MPI_MIN, comm, &req);
    if (rc != MPI_SUCCESS) {
        free(a);
        return agree_fail(mpi_fail(rc, "error agreement"), st, own);
    }
    zpp_status pst = zpp__comm_mpi_poll_at(&req, timeout_s, "agree (the lowest failing rank)",
                                           name, sizeof a->mine, &at);
    if (pst != ZPP_OK) {
        if (pst != ZPP_ERR_TIMEOUT) free(a);
        return agree_fail(pst, st, own);
    }
    if (a->first == size) {
        free(a);
        return ZPP_OK;
    }
    /* 2. Its status and message, to everyone. */
    if (rank == a->first) {
        a->why.status = (int)st;
        snprintf(a->why.msg, sizeof a->why.msg, "%s", own[0] ? own : zpp_status_str(st));
    }
    rc = MPI_Ibcast(&a->why, (int)sizeof a->why, MPI_BYTE, a->first, comm, &req);
    if (rc == MPI_SUCCESS)
        pst = zpp__comm_mpi_poll_at(&req, timeout_s, "agree (its message)", name,
                                    sizeof a->why, &at);
    else
        pst = mpi_fail(rc, "error agreement");
    if (pst != ZPP_OK) {
        if (pst != ZPP_ERR_TIMEOUT) free(a);
        return agree_fail(pst, st, own);
    }
    a->why.msg[sizeof a->why.msg - 1] = '\0';
    /* 3. The same status and message on every rank. */
    zpp_status agreed = zpp_error((zpp_status)a->why.status, "%s", a->why.msg);
    free(a);
    return agreed;
}

/* The launcher's world. Used as it is, not duplicated: these calls are
 * blocking and made by every rank in the same order, so they cannot be
 * confused with other traffic, and MPI_COMM_WORLD's error handler stays the
 * application's. Return codes are still checked (they come back when the
 * application asked MPI to return errors). */
static zpp_status world_ready(const char *op) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zpp_error(ZPP_ERR_STATE, "%s: MPI is not initialised; call MPI_Init first (and "
                         "nothing after MPI_Finalize)", op);
    return ZPP_OK;
}

zpp_status zpp_comm_agree_world(zpp_status st) {
    zpp_status ready = world_ready("comm agree_world");
    if (ready != ZPP_OK) return st != ZPP_OK ? st : ready;
    MPI_Comm world = MPI_COMM_WORLD;
    return zpp__comm_mpi_agree_at(&world, st, world_timeout_s, "world (MPI_COMM_WORLD)",
                                  zpp__progress_current(), ZPP_PROG_LAUNCH);
}

zpp_status zpp_comm_agree_world_within(zpp_status st, double timeout_s) {
    zpp_status ready = world_ready("comm agree_world");
    if (ready != ZPP_OK) return st != ZPP_OK ? st : ready;
    MPI_Comm world = MPI_COMM_WORLD;
    return zpp__comm_mpi_agree_at(&world, st, timeout_s > 0.0 ? timeout_s : 0.0,
                                  "world (MPI_COMM_WORLD)", zpp__progress_current(),
                                  ZPP_PROG_LAUNCH);
}

void zpp_comm_world_set_timeout(double timeout_s) {
    world_timeout_s = timeout_s > 0.0 ? timeout_s : 0.0; /* NaN: 0 */
}

double zpp_comm_world_timeout(void) { return world_timeout_s; }

zpp_status zpp_comm_max_world(double *value) {
    if (!value) return zpp_error(ZPP_ERR_INVALID, "comm max_world: value is NULL");
    ZPP_CHECK(world_ready("comm max_world"));
    /* On the heap: an abandoned request may still write it (see agree). */
    double *v = malloc(sizeof *v);
    if (!v) return zpp_error(ZPP_ERR_NOMEM, "comm max_world: out of memory");
    *v = *value;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) {
        free(v);
        return mpi_fail(rc, "max over the world");
    }
    zpp_prog_at at = zpp__progress_enter(zpp__progress_current(), ZPP_PROG_LAUNCH);
    zpp_status st = zpp__comm_mpi_poll_at(&req, world_timeout_s, "max over the world",
                                          "world (MPI_COMM_WORLD)", sizeof *v, &at);
    if (st == ZPP_ERR_TIMEOUT) return st; /* v stays with MPI */
    if (st == ZPP_OK) *value = *v;
    free(v);
    return st;
}

/* Quietly: these must not touch zpp_last_error (tools ask for the rank to
 * decide who prints it). */
static int world_up(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    return inited && !finalized;
}

int zpp_comm_world_rank(void) {
    int rank = 0;
    if (world_up()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int zpp_comm_world_size(void) {
    int size = 1;
    if (world_up()) MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

int zpp_comm_launched(void) {
    /* Open MPI's launcher, and MPICH's (hydra) */
    return zpp_env_get(ZPP_ENV_OMPI_COMM_WORLD_SIZE) != NULL ||
           zpp_env_get(ZPP_ENV_PMI_SIZE) != NULL;
}

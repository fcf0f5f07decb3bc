/* comm/comm_mpi.c — the MPI backend: collectives on host memory.
 *
 * Each zpp_comm owns a duplicate of the MPI communicator it was made from,
 * with MPI_ERRORS_RETURN set, so MPI hands errors back (as ZPP_ERR_COMM with
 * MPI's own message) instead of aborting the job. Operations map one to one
 * onto MPI collectives: the blocking form when req_p is NULL, the
 * nonblocking MPI_I* form otherwise (the request object holds the
 * MPI_Request and any datatype that must outlive the operation).
 *
 * Reductions. fp32 sums use MPI_FLOAT / MPI_SUM. bf16 and fp16 have no MPI
 * type, so they travel as 16-bit words (MPI_UINT16_T) and are summed by our
 * own commutative MPI_Op: each combination of two partial results converts
 * both to fp32, adds, and rounds the sum back to nearest even — the same
 * arithmetic as NCCL's bf16/fp16 sum. The ops are created once, on first
 * use, and freed when MPI finalizes (an attribute on MPI_COMM_SELF, whose
 * delete callback MPI_Finalize runs first).
 *
 * Large counts. MPI-3 counts are ints. A buffer of more than max_count
 * elements is described as ONE element of a "blob" datatype covering all of
 * its bytes: q contiguous chunks of `chunk` bytes followed by r remaining
 * bytes, resized to extent q*chunk + r. Collectives that only move bytes
 * don't care; reductions on a blob cannot use MPI_SUM (predefined ops take
 * predefined types only), so they use our own sum op for the dtype, which
 * asks the datatype for its size and treats the blob as a flat array. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/error.h"

struct zpp_comm_req {
    MPI_Request req;
    MPI_Datatype type; /* a blob datatype to free on completion, or NULL */
};

typedef struct zpp__mpi {
    MPI_Comm comm;
} zpp__mpi;

static int zpp__mpi_max_count = INT_MAX;

void zpp_comm_mpi_set_max_count(int max_count) {
    zpp__mpi_max_count = max_count > 0 ? max_count : INT_MAX;
}

/* ---- Errors ----------------------------------------------------------- */

static zpp_status zpp__mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return zpp_error(ZPP_ERR_COMM,
                     "mpi %s failed: %s; check that every rank of the communicator calls the "
                     "same collectives in the same order with matching sizes",
                     what, msg);
}

#define ZPP__MPI_CHECK(call, what)                                            \
    do {                                                                      \
        int zpp_rc_ = (call);                                                 \
        if (zpp_rc_ != MPI_SUCCESS) return zpp__mpi_fail(zpp_rc_, what);      \
    } while (0)

/* ---- bf16 / fp16 / blob sum ops --------------------------------------- */

static MPI_Op zpp__op_sum_f32 = MPI_OP_NULL; /* for fp32 blobs */
static MPI_Op zpp__op_sum_bf16 = MPI_OP_NULL;
static MPI_Op zpp__op_sum_fp16 = MPI_OP_NULL;
static int zpp__ops_ready = 0;

/* Number of `elem`-byte values in *len elements of *dt. */
static size_t zpp__op_count(const int *len, MPI_Datatype *dt, size_t elem) {
    if (*dt == MPI_UINT16_T || *dt == MPI_FLOAT) return (size_t)*len;
    MPI_Count sz = 0;
    MPI_Type_size_x(*dt, &sz); /* a blob: its whole size in bytes */
    return (size_t)*len * (size_t)sz / elem;
}

static void zpp__sum_f32(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const float *a = in;
    float *b = inout;
    size_t n = zpp__op_count(len, dt, 4);
    for (size_t i = 0; i < n; i++) b[i] += a[i];
}

/* One combination: fp32 sum of the two 16-bit values, rounded once. */
static void zpp__sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const zpp_bf16 *a = in;
    zpp_bf16 *b = inout;
    size_t n = zpp__op_count(len, dt, 2);
    for (size_t i = 0; i < n; i++)
        b[i] = zpp_f32_to_bf16(zpp_bf16_to_f32(a[i]) + zpp_bf16_to_f32(b[i]));
}

static void zpp__sum_fp16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const zpp_fp16 *a = in;
    zpp_fp16 *b = inout;
    size_t n = zpp__op_count(len, dt, 2);
    for (size_t i = 0; i < n; i++)
        b[i] = zpp_f32_to_fp16(zpp_fp16_to_f32(a[i]) + zpp_fp16_to_f32(b[i]));
}

static void zpp__ops_free(void) {
    MPI_Op *ops[] = {&zpp__op_sum_f32, &zpp__op_sum_bf16, &zpp__op_sum_fp16};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (*ops[i] != MPI_OP_NULL) MPI_Op_free(ops[i]);
    zpp__ops_ready = 0;
}

static int zpp__ops_delete_cb(MPI_Comm comm, int keyval, void *attr, void *extra) {
    zpp__ops_free();
    return MPI_SUCCESS;
}

/* Creates the sum ops once per MPI lifetime (zpp_comm_mpi_create runs
 * collectively from one thread, so no lock). */
static zpp_status zpp__ops_init(void) {
    if (zpp__ops_ready) return ZPP_OK;
    int rc = MPI_Op_create(zpp__sum_f32, 1, &zpp__op_sum_f32);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(zpp__sum_bf16, 1, &zpp__op_sum_bf16);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(zpp__sum_fp16, 1, &zpp__op_sum_fp16);
    int key = MPI_KEYVAL_INVALID;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, zpp__ops_delete_cb, &key, NULL);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);
        MPI_Comm_free_keyval(&key); /* the attribute keeps it alive */
    }
    if (rc != MPI_SUCCESS) {
        zpp__ops_free();
        return zpp__mpi_fail(rc, "sum op setup");
    }
    zpp__ops_ready = 1;
    return ZPP_OK;
}

/* ---- Buffers as (count, datatype) ------------------------------------- */

typedef struct zpp__mpi_buf {
    int count;
    MPI_Datatype type;
    int blob; /* type is ours: free it after the operation */
} zpp__mpi_buf;

/* Describes n elements of `elem` (elem_size bytes each) for MPI. */
static zpp_status zpp__mpi_buf_make(size_t n, MPI_Datatype elem, size_t elem_size,
                                    zpp__mpi_buf *b) {
    size_t max = (size_t)zpp__mpi_max_count;
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
        return zpp__mpi_fail(rc, "large-count datatype");
    }
    b->count = 1;
    b->type = blob;
    b->blob = 1;
    return ZPP_OK;
}

static void zpp__mpi_buf_free(zpp__mpi_buf *b) {
    if (b->blob) MPI_Type_free(&b->type);
    b->blob = 0;
}

/* The MPI element type and sum op of a dtype (blob: our own sum op). */
static zpp_status zpp__mpi_dtype(zpp_dtype dtype, MPI_Datatype *type_p, size_t *size_p) {
    switch (dtype) {
    case ZPP_FP32: *type_p = MPI_FLOAT; *size_p = 4; return ZPP_OK;
    case ZPP_BF16:
    case ZPP_FP16: *type_p = MPI_UINT16_T; *size_p = 2; return ZPP_OK;
    }
    return zpp_error(ZPP_ERR_INVALID, "mpi: unknown dtype %d; use fp32, bf16 or fp16", (int)dtype);
}

static MPI_Op zpp__mpi_sum_op(zpp_dtype dtype, int blob) {
    switch (dtype) {
    case ZPP_BF16: return zpp__op_sum_bf16;
    case ZPP_FP16: return zpp__op_sum_fp16;
    default: return blob ? zpp__op_sum_f32 : MPI_SUM;
    }
}

/* ---- Starting and finishing operations -------------------------------- */

/* Allocates the request of an asynchronous call (NULL when blocking). */
static zpp_status zpp__req_new(zpp_comm_req **req_p, zpp_comm_req **out) {
    *out = NULL;
    if (!req_p) return ZPP_OK;
    zpp_comm_req *r = malloc(sizeof *r);
    if (!r) return zpp_error(ZPP_ERR_NOMEM, "mpi: out of memory for a request");
    r->req = MPI_REQUEST_NULL;
    r->type = MPI_DATATYPE_NULL;
    *out = r;
    return ZPP_OK;
}

/* After the MPI call `rc`: hands the request (and blob type) to the caller
 * for an asynchronous call, frees them otherwise. */
static zpp_status zpp__finish(int rc, const char *what, zpp__mpi_buf *b, zpp_comm_req *r,
                              zpp_comm_req **req_p) {
    if (rc != MPI_SUCCESS || !r) {
        zpp__mpi_buf_free(b);
        free(r);
        return rc == MPI_SUCCESS ? ZPP_OK : zpp__mpi_fail(rc, what);
    }
    if (b->blob) r->type = b->type;
    *req_p = r;
    return ZPP_OK;
}

static MPI_Comm zpp__comm_of(zpp_comm *c) { return ((zpp__mpi *)c->impl)->comm; }

static int zpp__overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* n * k without overflow, or an error naming the operation. */
static zpp_status zpp__mul(size_t n, size_t k, const char *what, size_t *out) {
    if (k && n > SIZE_MAX / k)
        return zpp_error(ZPP_ERR_INVALID, "mpi %s: %zu x %zu bytes overflows size_t", what, n, k);
    *out = n * k;
    return ZPP_OK;
}

/* ---- Operations -------------------------------------------------------- */

static zpp_status zpp__allgather(zpp_comm *c, const void *send, void *recv,
                                 size_t bytes_per_rank, zpp_comm_req **req_p) {
    size_t total = 0;
    ZPP_CHECK(zpp__mul(bytes_per_rank, (size_t)c->size, "allgather", &total));
    if (bytes_per_rank && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "mpi allgather: NULL buffer for %zu bytes per rank",
                         bytes_per_rank);
    /* In place: this rank's input already sits at its block of the output. */
    int in_place = bytes_per_rank &&
                   send == (const char *)recv + (size_t)c->rank * bytes_per_rank;
    if (!in_place && zpp__overlap(send, bytes_per_rank, recv, total))
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi allgather: send and recv overlap; use separate buffers, or send "
                         "= recv + rank * bytes_per_rank for in place");
    zpp__mpi_buf b;
    zpp_comm_req *r;
    ZPP_CHECK(zpp__mpi_buf_make(bytes_per_rank, MPI_BYTE, 1, &b));
    zpp_status st = zpp__req_new(req_p, &r);
    if (st != ZPP_OK) {
        zpp__mpi_buf_free(&b);
        return st;
    }
    const void *s = in_place ? MPI_IN_PLACE : send;
    int rc = r ? MPI_Iallgather(s, b.count, b.type, recv, b.count, b.type, zpp__comm_of(c), &r->req)
               : MPI_Allgather(s, b.count, b.type, recv, b.count, b.type, zpp__comm_of(c));
    return zpp__finish(rc, "allgather", &b, r, req_p);
}

static zpp_status zpp__reduce_scatter(zpp_comm *c, const void *send, void *recv,
                                      size_t count_per_rank, zpp_dtype dtype,
                                      zpp_comm_req **req_p) {
    MPI_Datatype et = MPI_DATATYPE_NULL;
    size_t es = 0, out_bytes = 0, in_bytes = 0;
    ZPP_CHECK(zpp__mpi_dtype(dtype, &et, &es));
    ZPP_CHECK(zpp__mul(count_per_rank, es, "reduce_scatter", &out_bytes));
    ZPP_CHECK(zpp__mul(out_bytes, (size_t)c->size, "reduce_scatter", &in_bytes));
    if (count_per_rank && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi reduce_scatter: NULL buffer for %zu elements per rank",
                         count_per_rank);
    if (zpp__overlap(send, in_bytes, recv, out_bytes))
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi reduce_scatter: send and recv overlap; use separate buffers");
    zpp__mpi_buf b;
    zpp_comm_req *r;
    ZPP_CHECK(zpp__mpi_buf_make(count_per_rank, et, es, &b));
    zpp_status st = zpp__req_new(req_p, &r);
    if (st != ZPP_OK) {
        zpp__mpi_buf_free(&b);
        return st;
    }
    MPI_Op op = zpp__mpi_sum_op(dtype, b.blob);
    int rc = r ? MPI_Ireduce_scatter_block(send, recv, b.count, b.type, op, zpp__comm_of(c),
                                           &r->req)
               : MPI_Reduce_scatter_block(send, recv, b.count, b.type, op, zpp__comm_of(c));
    return zpp__finish(rc, "reduce_scatter", &b, r, req_p);
}

static zpp_status zpp__alltoall(zpp_comm *c, const void *send, void *recv,
                                size_t bytes_per_peer, zpp_comm_req **req_p) {
    size_t total = 0;
    ZPP_CHECK(zpp__mul(bytes_per_peer, (size_t)c->size, "alltoall", &total));
    if (bytes_per_peer && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "mpi alltoall: NULL buffer for %zu bytes per peer",
                         bytes_per_peer);
    if (zpp__overlap(send, total, recv, total))
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi alltoall: send and recv overlap; use separate buffers");
    zpp__mpi_buf b;
    zpp_comm_req *r;
    ZPP_CHECK(zpp__mpi_buf_make(bytes_per_peer, MPI_BYTE, 1, &b));
    zpp_status st = zpp__req_new(req_p, &r);
    if (st != ZPP_OK) {
        zpp__mpi_buf_free(&b);
        return st;
    }
    int rc = r ? MPI_Ialltoall(send, b.count, b.type, recv, b.count, b.type, zpp__comm_of(c),
                               &r->req)
               : MPI_Alltoall(send, b.count, b.type, recv, b.count, b.type, zpp__comm_of(c));
    return zpp__finish(rc, "alltoall", &b, r, req_p);
}

static zpp_status zpp__allreduce(zpp_comm *c, const void *send, void *recv, size_t count,
                                 zpp_dtype dtype, zpp_comm_req **req_p) {
    MPI_Datatype et = MPI_DATATYPE_NULL;
    size_t es = 0, bytes = 0;
    ZPP_CHECK(zpp__mpi_dtype(dtype, &et, &es));
    ZPP_CHECK(zpp__mul(count, es, "allreduce", &bytes));
    if (count && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "mpi allreduce: NULL buffer for %zu elements", count);
    int in_place = send == recv;
    if (!in_place && zpp__overlap(send, bytes, recv, bytes))
        return zpp_error(ZPP_ERR_INVALID,
                         "mpi allreduce: send and recv partly overlap; pass the same pointer "
                         "for in place, or separate buffers");
    zpp__mpi_buf b;
    zpp_comm_req *r;
    ZPP_CHECK(zpp__mpi_buf_make(count, et, es, &b));
    zpp_status st = zpp__req_new(req_p, &r);
    if (st != ZPP_OK) {
        zpp__mpi_buf_free(&b);
        return st;
    }
    const void *s = in_place ? MPI_IN_PLACE : send;
    MPI_Op op = zpp__mpi_sum_op(dtype, b.blob);
    int rc = r ? MPI_Iallreduce(s, recv, b.count, b.type, op, zpp__comm_of(c), &r->req)
               : MPI_Allreduce(s, recv, b.count, b.type, op, zpp__comm_of(c));
    return zpp__finish(rc, "allreduce", &b, r, req_p);
}

static zpp_status zpp__allreduce_max_int(zpp_comm *c, int *value) {
    if (!value) return zpp_error(ZPP_ERR_INVALID, "mpi allreduce_max_int: value is NULL");
    ZPP__MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_INT, MPI_MAX, zpp__comm_of(c)),
                   "allreduce_max_int");
    return ZPP_OK;
}

static zpp_status zpp__broadcast(zpp_comm *c, void *buf, size_t bytes, int root,
                                 zpp_comm_req **req_p) {
    if (root < 0 || root >= c->size)
        return zpp_error(ZPP_ERR_INVALID, "mpi broadcast: root %d is not a rank of a communicator "
                         "of size %d", root, c->size);
    if (bytes && !buf)
        return zpp_error(ZPP_ERR_INVALID, "mpi broadcast: NULL buffer for %zu bytes", bytes);
    zpp__mpi_buf b;
    zpp_comm_req *r;
    ZPP_CHECK(zpp__mpi_buf_make(bytes, MPI_BYTE, 1, &b));
    zpp_status st = zpp__req_new(req_p, &r);
    if (st != ZPP_OK) {
        zpp__mpi_buf_free(&b);
        return st;
    }
    int rc = r ? MPI_Ibcast(buf, b.count, b.type, root, zpp__comm_of(c), &r->req)
               : MPI_Bcast(buf, b.count, b.type, root, zpp__comm_of(c));
    return zpp__finish(rc, "broadcast", &b, r, req_p);
}

static zpp_status zpp__barrier(zpp_comm *c) {
    ZPP__MPI_CHECK(MPI_Barrier(zpp__comm_of(c)), "barrier");
    return ZPP_OK;
}

static zpp_status zpp__wait(zpp_comm_req *r) {
    if (!r) return ZPP_OK;
    int rc = MPI_Wait(&r->req, MPI_STATUS_IGNORE);
    if (r->type != MPI_DATATYPE_NULL) MPI_Type_free(&r->type);
    free(r);
    ZPP__MPI_CHECK(rc, "wait");
    return ZPP_OK;
}

static void zpp__destroy(zpp_comm *c) {
    if (!c) return;
    zpp__mpi *m = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* After MPI_Finalize the communicator is gone with MPI; only our memory
     * is left to free. */
    if (m && !finalized && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m);
    free(c);
}

static const zpp_comm_ops zpp__mpi_ops = {
    .name = "mpi",
    .allgather = zpp__allgather,
    .reduce_scatter = zpp__reduce_scatter,
    .alltoall = zpp__alltoall,
    .allreduce = zpp__allreduce,
    .allreduce_max_int = zpp__allreduce_max_int,
    .broadcast = zpp__broadcast,
    .barrier = zpp__barrier,
    .wait = zpp__wait,
    .destroy = zpp__destroy,
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
    ZPP_CHECK(zpp__ops_init());
    /* The duplicate is ours: its own matching space, and errors returned. */
    MPI_Comm dup = MPI_COMM_NULL;
    ZPP__MPI_CHECK(MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &dup), "comm dup");
    int rank = 0, size = 0;
    int rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(dup, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(dup, &size);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&dup);
        return zpp__mpi_fail(rc, "comm setup");
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
    c->ops = &zpp__mpi_ops;
    c->mem = ZPP_MEM_HOST;
    c->rank = rank;
    c->size = size;
    c->impl = m;
    *comm_p = c;
    return ZPP_OK;
}

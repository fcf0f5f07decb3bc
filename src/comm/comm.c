/* comm/comm.c — the fronts of the backend table: every argument check of
 * the collectives lives here, once, with one message per mistake; the
 * backends (comm_mpi.c, comm_nccl.c) assume checked arguments.
 *
 * The checks depend only on the arguments and on the communicator's size
 * and rank, never on the data, so ranks that pass the same (valid or
 * invalid) sizes get the same answer and none is left waiting in a
 * collective that the others refused. */
#include <stdint.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/error.h"

static int buffers_overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* n * k bytes, or ZPP_ERR_INVALID naming the operation. */
static zpp_status checked_mul(const char *op, size_t n, size_t k, size_t *out) {
    if (k && n > SIZE_MAX / k)
        return zpp_error(ZPP_ERR_INVALID,
                         "comm %s: %zu x %zu bytes overflows size_t; pass a per-rank size whose "
                         "total fits in memory",
                         op, n, k);
    *out = n * k;
    return ZPP_OK;
}

/* (req_p is not written on failure: outputs are set only on success.) */
static zpp_status comm_ok(const zpp_comm *c, const char *op) {
    if (!c || !c->ops)
        return zpp_error(ZPP_ERR_INVALID, "comm %s: the communicator is NULL; pass one of the "
                         "topology's (topo->world, intra or inter)", op);
    return ZPP_OK;
}

static zpp_status null_buffers(const char *op, const void *send, const void *recv, size_t n,
                               const char *unit) {
    if (n && !send)
        return zpp_error(ZPP_ERR_INVALID, "comm %s: the send buffer is NULL for %zu %s", op, n,
                         unit);
    if (n && !recv)
        return zpp_error(ZPP_ERR_INVALID, "comm %s: the receive buffer is NULL for %zu %s", op,
                         n, unit);
    return ZPP_OK;
}

/* Element size of a reduction dtype. */
static zpp_status check_dtype(const char *op, zpp_dtype dtype, size_t *size_p) {
    switch (dtype) {
    case ZPP_FP32: *size_p = 4; return ZPP_OK;
    case ZPP_BF16:
    case ZPP_FP16: *size_p = 2; return ZPP_OK;
    }
    return zpp_error(ZPP_ERR_INVALID, "comm %s: unknown dtype %d; use ZPP_FP32, ZPP_BF16 or "
                     "ZPP_FP16", op, (int)dtype);
}

zpp_status zpp_comm_allgather(zpp_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                              zpp_comm_req **req_p) {
    static const char op[] = "allgather";
    size_t total = 0;
    ZPP_CHECK(comm_ok(c, op));
    ZPP_CHECK(checked_mul(op, bytes_per_rank, (size_t)c->size, &total));
    ZPP_CHECK(null_buffers(op, send, recv, bytes_per_rank, "bytes per rank"));
    /* In place: this rank's input already sits at its block of the output. */
    int in_place = bytes_per_rank &&
                   (uintptr_t)send == (uintptr_t)recv + (size_t)c->rank * bytes_per_rank;
    if (!in_place && buffers_overlap(send, bytes_per_rank, recv, total))
        return zpp_error(ZPP_ERR_INVALID,
                         "comm allgather: send and receive buffers overlap; use separate "
                         "buffers, or send = recv + rank * bytes_per_rank for in place");
    return c->ops->allgather(c, send, recv, bytes_per_rank, req_p);
}

zpp_status zpp_comm_reduce_scatter(zpp_comm *c, const void *send, void *recv,
                                   size_t count_per_rank, zpp_dtype dtype,
                                   zpp_comm_req **req_p) {
    static const char op[] = "reduce_scatter";
    size_t es = 0, out_bytes = 0, in_bytes = 0;
    ZPP_CHECK(comm_ok(c, op));
    ZPP_CHECK(check_dtype(op, dtype, &es));
    ZPP_CHECK(checked_mul(op, count_per_rank, es, &out_bytes));
    ZPP_CHECK(checked_mul(op, out_bytes, (size_t)c->size, &in_bytes));
    ZPP_CHECK(null_buffers(op, send, recv, count_per_rank, "elements per rank"));
    if (buffers_overlap(send, in_bytes, recv, out_bytes))
        return zpp_error(ZPP_ERR_INVALID, "comm reduce_scatter: send and receive buffers "
                         "overlap; use separate buffers (there is no in-place form)");
    return c->ops->reduce_scatter(c, send, recv, count_per_rank, dtype, req_p);
}

zpp_status zpp_comm_alltoall(zpp_comm *c, const void *send, void *recv, size_t bytes_per_peer,
                             zpp_comm_req **req_p) {
    static const char op[] = "alltoall";
    size_t total = 0;
    ZPP_CHECK(comm_ok(c, op));
    ZPP_CHECK(checked_mul(op, bytes_per_peer, (size_t)c->size, &total));
    ZPP_CHECK(null_buffers(op, send, recv, bytes_per_peer, "bytes per peer"));
    if (buffers_overlap(send, total, recv, total))
        return zpp_error(ZPP_ERR_INVALID, "comm alltoall: send and receive buffers overlap; "
                         "use separate buffers (there is no in-place form)");
    return c->ops->alltoall(c, send, recv, bytes_per_peer, req_p);
}

zpp_status zpp_comm_allreduce(zpp_comm *c, const void *send, void *recv, size_t count,
                              zpp_dtype dtype, zpp_comm_req **req_p) {
    static const char op[] = "allreduce";
    size_t es = 0, bytes = 0;
    ZPP_CHECK(comm_ok(c, op));
    ZPP_CHECK(check_dtype(op, dtype, &es));
    ZPP_CHECK(checked_mul(op, count, es, &bytes));
    ZPP_CHECK(null_buffers(op, send, recv, count, "elements"));
    if (send != recv && buffers_overlap(send, bytes, recv, bytes))
        return zpp_error(ZPP_ERR_INVALID,
                         "comm allreduce: send and receive buffers partly overlap; pass the "
                         "same pointer for in place, or separate buffers");
    return c->ops->allreduce(c, send, recv, count, dtype, req_p);
}

zpp_status zpp_comm_broadcast(zpp_comm *c, void *buf, size_t bytes, int root,
                              zpp_comm_req **req_p) {
    static const char op[] = "broadcast";
    ZPP_CHECK(comm_ok(c, op));
    if (root < 0 || root >= c->size)
        return zpp_error(ZPP_ERR_INVALID, "comm broadcast: root %d is not a rank of this "
                         "%d-rank communicator; pass a root in [0, %d)", root, c->size, c->size);
    if (bytes && !buf)
        return zpp_error(ZPP_ERR_INVALID, "comm broadcast: the buffer is NULL for %zu bytes",
                         bytes);
    return c->ops->broadcast(c, buf, bytes, root, req_p);
}

zpp_status zpp_comm_barrier(zpp_comm *c) {
    ZPP_CHECK(comm_ok(c, "barrier"));
    return c->ops->barrier(c);
}

zpp_status zpp_comm_agree(zpp_comm *c, zpp_status st) {
    /* A NULL comm cannot agree with anyone: this rank's own status is the
     * best answer, with the caller's mistake named when there was none. */
    if (!c || !c->ops)
        return st != ZPP_OK ? st
                            : zpp_error(ZPP_ERR_INVALID, "comm agree: the communicator is "
                                        "NULL; pass one of the topology's");
    return c->ops->agree(c, st);
}

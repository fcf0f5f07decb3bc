/* comm/comm_nccl.c — the NCCL backend: collectives on device memory,
 * ordered against the caller's compute stream.
 *
 * SETUP (zpp_comm_nccl_create_topo, collective over MPI_COMM_WORLD)
 *   1. Local: pick the CUDA device, pin NCCL_NVLS_ENABLE=0, and for emulated
 *      nodes set NCCL_HOSTID to one value per emulated node. NCCL reads
 *      NCCL_HOSTID once per process (its host hash is computed under a
 *      once-flag at the first init), so the first topology of a process fixes
 *      it: a later topology that needs another value is refused with
 *      ZPP_ERR_STATE instead of silently running on the wrong transport.
 *      Then the backend's own stream, events and small buffers.
 *   2. Rank 0 makes the ncclUniqueId; MPI_Bcast hands it out;
 *      ncclCommInitRank builds the world communicator.
 *   3. ncclCommSplit carves `intra` (color = node, key = local rank) and
 *      `inter` (color = local rank, key = node) out of the world, so their
 *      NCCL ranks are the local rank and the node index.
 *   After every step that can fail on one rank only, the ranks agree with
 *   MPI_Allreduce, so a failure anywhere makes every rank return an error
 *   rather than leaving the others blocked in the next collective step. A
 *   rank that fails *inside* ncclCommInitRank/ncclCommSplit can still leave
 *   its peers waiting in NCCL's bootstrap: NCCL gives no way around that
 *   short of non-blocking init with timeouts.
 *
 * STREAMS AND ORDERING
 *   All three communicators of a topology share one communication stream
 *   (non-blocking, so it never synchronises implicitly with the legacy
 *   default stream). One stream gives every rank the same total order of
 *   NCCL kernels — the order of the calls, identical on every rank — which
 *   is what NCCL requires of several communicators used by one process:
 *   NCCL kernels wait for their peers, and two communicators whose kernels
 *   run concurrently in different orders on different ranks can deadlock.
 *   The ZeRO++ paths chain their intra/inter steps anyway, so little overlap
 *   is lost; overlap with compute is what matters and is kept.
 *
 *   An operation:  record `ready` on the compute stream; the comm stream
 *   waits on it (inputs produced by compute are complete); enqueue the NCCL
 *   call on the comm stream; record a `done` event on the comm stream.
 *   wait(req) makes the compute stream wait on `done`: the compute stream is
 *   ordered after the collective and the host does not block. The
 *   "blocking" form (req_p == NULL) does that wait at once, so for NCCL
 *   "blocking" means stream-ordered, not host-synchronous. Between start and
 *   wait the caller must not write the inputs nor read the outputs on the
 *   compute stream. Requests (each owning one `done` event) come from a
 *   free list that grows on demand, so the hot path creates no CUDA events.
 *
 *   compute_stream == NULL means the legacy default stream (cudaStreamLegacy),
 *   which is what stream 0 means to code built the usual way. Code built with
 *   per-thread default streams must pass cudaStreamPerThread explicitly.
 *
 *   The host-blocking operations (barrier, allreduce_max_int) run only on
 *   the comm stream (they do not wait for the compute stream) and then wait
 *   on the host by polling, checking NCCL's asynchronous error state as they
 *   go: if a peer died NCCL reports it there, the communicator is aborted
 *   (which releases its stuck kernels), and the call returns ZPP_ERR_COMM
 *   instead of hanging. ZPP_NCCL_TIMEOUT_S bounds that wait.
 *
 * BUFFERS: device memory of the topology's device. In place: allreduce with
 * send == recv, allgather with send == recv + rank * bytes_per_rank (both as
 * NCCL allows); any other overlap is ZPP_ERR_INVALID. Zero-sized operations
 * are valid and enqueue nothing but the ordering.
 *
 * ERRORS: argument errors are found before anything is enqueued and return
 * ZPP_ERR_INVALID identically on every rank. An NCCL failure returns
 * ZPP_ERR_COMM with NCCL's own message (ncclGetLastError); after a fatal one
 * (or an asynchronous error, or a timeout) the communicator refuses further
 * work with ZPP_ERR_STATE and is aborted, not destroyed, at teardown.
 * ops->destroy frees the zpp_comm itself too.
 *
 * THREADS: one thread drives a topology's communicators, with the topology's
 * device current (the request pool is not locked; NCCL wants the same).
 *
 * KNOBS (environment, read in zpp__nccl_env_read only):
 *   ZPP_NCCL_HOSTID_PREFIX  prefix of the emulated NCCL_HOSTID values
 *                           (default: this host's name, so ranks on
 *                           different real hosts never share an id)
 *   ZPP_NCCL_TIMEOUT_S      host-side waits give up after this many seconds
 *                           (default 0: wait forever)
 *   ZPP_NCCL_REQ_POOL       requests made up front (default 16)
 *   NCCL_NVLS_ENABLE        forced to "0" (NVLink multicast can take shared
 *                           GPUs out of service; DESIGN.md §6)
 */
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "comm/comm.h"
#include "core/error.h"

/* ncclCommSplit appeared in NCCL 2.18. */
#define ZPP__NCCL_MIN_VERSION 21800

/* ---- Knobs ------------------------------------------------------------- */

typedef struct zpp__nccl_env {
    char hostid_prefix[128];
    double timeout_s; /* 0: none */
    int req_pool;
} zpp__nccl_env;

/* Reads every environment knob of this backend, and pins NCCL_NVLS_ENABLE
 * to "0" before NCCL can read it. */
static void zpp__nccl_env_read(zpp__nccl_env *env) {
    const char *s = getenv("ZPP_NCCL_HOSTID_PREFIX");
    if (s && s[0]) {
        snprintf(env->hostid_prefix, sizeof env->hostid_prefix, "%s", s);
    } else if (gethostname(env->hostid_prefix, sizeof env->hostid_prefix) != 0) {
        snprintf(env->hostid_prefix, sizeof env->hostid_prefix, "zpp-host");
    }
    env->hostid_prefix[sizeof env->hostid_prefix - 1] = '\0';

    env->timeout_s = 0.0;
    s = getenv("ZPP_NCCL_TIMEOUT_S");
    if (s && s[0]) {
        double t = strtod(s, NULL);
        if (t > 0.0) env->timeout_s = t;
    }

    env->req_pool = 16;
    s = getenv("ZPP_NCCL_REQ_POOL");
    if (s && s[0]) {
        long n = strtol(s, NULL, 10);
        if (n >= 0 && n <= 4096) env->req_pool = (int)n;
    }

    /* Never let NVLink SHARP (multicast) switch on: a program using it can
     * put the host's GPUs, which others share, out of service. */
    s = getenv("NCCL_NVLS_ENABLE");
    if (!s || strcmp(s, "0") != 0) setenv("NCCL_NVLS_ENABLE", "0", 1);
}

/* ---- State --------------------------------------------------------------- */

typedef struct zpp__nccl_shared zpp__nccl_shared;
typedef struct zpp__nccl_comm zpp__nccl_comm;

/* An in-flight operation: the event recorded on the comm stream after it. */
struct zpp_comm_req {
    zpp_comm_req *next_free; /* free list */
    zpp_comm_req *next_all;  /* every request ever made, for teardown */
    zpp__nccl_comm *owner;   /* while in flight */
    cudaEvent_t done;
};

/* What the world, intra and inter communicators of one topology share. */
struct zpp__nccl_shared {
    int refs;
    int device;
    cudaStream_t compute;  /* the caller's; never destroyed here */
    cudaStream_t stream;   /* ours: every NCCL call of the topology */
    cudaEvent_t ready;     /* compute -> stream, re-recorded per op */
    cudaEvent_t done_now;  /* stream -> compute for the blocking form */
    cudaEvent_t host_done; /* stream -> host for barrier / max_int */
    int *dev_int;          /* staging for barrier / allreduce_max_int */
    int *host_int;         /* pinned */
    zpp_comm_req *free_reqs, *all_reqs;
    zpp__nccl_env env;
};

struct zpp__nccl_comm {
    ncclComm_t nccl; /* NULL once aborted */
    zpp__nccl_shared *sh;
    int broken;      /* a fatal NCCL error was seen: abort at destroy */
    const char *name;
};

/* NCCL_HOSTID of this process, fixed by its first topology (see top). */
static int zpp__nccl_process_started;
static char zpp__nccl_process_hostid[192];

/* ---- Errors -------------------------------------------------------------- */

/* Errors after which a communicator cannot be trusted again. Argument and
 * usage errors are reported before anything is enqueued and leave it usable. */
static int zpp__nccl_fatal(ncclResult_t r) {
    return r == ncclUnhandledCudaError || r == ncclSystemError || r == ncclInternalError ||
           r == ncclRemoteError;
}

/* Records "<op>: NCCL error <name> (<NCCL's own message>)". */
static zpp_status zpp__nccl_fail(zpp__nccl_comm *nc, ncclResult_t r, const char *op,
                                 const char *call) {
    const char *last = ncclGetLastError(nc ? nc->nccl : NULL);
    if (nc && zpp__nccl_fatal(r)) nc->broken = 1;
    return zpp_error(ZPP_ERR_COMM,
                     "%s: NCCL error %s (%s) in %s%s", op, ncclGetErrorString(r),
                     last && last[0] ? last : "no further detail from NCCL", call,
                     zpp__nccl_fatal(r) ? "; rerun with NCCL_DEBUG=WARN for NCCL's log" : "");
}

#define NCCLCHECK(nc, call, op)                                               \
    do {                                                                      \
        ncclResult_t nccl_r_ = (call);                                        \
        if (nccl_r_ != ncclSuccess) return zpp__nccl_fail((nc), nccl_r_, (op), #call); \
    } while (0)

static zpp_status zpp__cuda_fail(cudaError_t e, const char *op, const char *call) {
    return zpp_error(ZPP_ERR_CUDA, "%s: CUDA error %s (%s) in %s", op, cudaGetErrorName(e),
                     cudaGetErrorString(e), call);
}

#define CUDACHECK(call, op)                                                   \
    do {                                                                      \
        cudaError_t cuda_e_ = (call);                                         \
        if (cuda_e_ != cudaSuccess) return zpp__cuda_fail(cuda_e_, (op), #call); \
    } while (0)

static ncclDataType_t zpp__nccl_dtype(zpp_dtype dtype, int *ok) {
    *ok = 1;
    switch (dtype) {
    case ZPP_FP32: return ncclFloat32;
    case ZPP_BF16: return ncclBfloat16;
    case ZPP_FP16: return ncclFloat16;
    }
    *ok = 0;
    return ncclFloat32;
}

/* 1 if [a, a+na) and [b, b+nb) share a byte. */
static int zpp__overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (na == 0 || nb == 0) return 0;
    return x < y + nb && y < x + na;
}

static double zpp__now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- Requests ------------------------------------------------------------ */

static zpp_status zpp__nccl_req_make(zpp__nccl_shared *sh, const char *op) {
    zpp_comm_req *q = calloc(1, sizeof *q);
    if (!q) return zpp_error(ZPP_ERR_NOMEM, "%s: out of host memory for a request", op);
    cudaError_t e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(q);
        return zpp__cuda_fail(e, op, "cudaEventCreateWithFlags");
    }
    q->next_all = sh->all_reqs;
    sh->all_reqs = q;
    q->next_free = sh->free_reqs;
    sh->free_reqs = q;
    return ZPP_OK;
}

static zpp_status zpp__nccl_req_get(zpp__nccl_shared *sh, const char *op, zpp_comm_req **q_p) {
    if (!sh->free_reqs) ZPP_CHECK(zpp__nccl_req_make(sh, op)); /* slow path only */
    zpp_comm_req *q = sh->free_reqs;
    sh->free_reqs = q->next_free;
    q->next_free = NULL;
    *q_p = q;
    return ZPP_OK;
}

static void zpp__nccl_req_put(zpp__nccl_shared *sh, zpp_comm_req *q) {
    q->owner = NULL;
    q->next_free = sh->free_reqs;
    sh->free_reqs = q;
}

/* ---- Starting and finishing an operation ---------------------------------- */

static zpp_status zpp__nccl_usable(zpp__nccl_comm *nc, const char *op) {
    if (nc->broken || !nc->nccl)
        return zpp_error(ZPP_ERR_STATE,
                         "%s: the NCCL %s communicator failed earlier; destroy the topology "
                         "and create a new one",
                         op, nc->name);
    return ZPP_OK;
}

/* Orders the comm stream after the work already on the compute stream, and
 * takes a request if the caller wants one. */
static zpp_status zpp__nccl_begin(zpp__nccl_comm *nc, const char *op, zpp_comm_req **req_p,
                                  zpp_comm_req **q_p) {
    zpp__nccl_shared *sh = nc->sh;
    ZPP_CHECK(zpp__nccl_usable(nc, op));
    *q_p = NULL;
    if (req_p) ZPP_CHECK(zpp__nccl_req_get(sh, op, q_p));
    cudaError_t e = cudaEventRecord(sh->ready, sh->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(sh->stream, sh->ready, 0);
    if (e != cudaSuccess) {
        if (*q_p) zpp__nccl_req_put(sh, *q_p);
        return zpp__cuda_fail(e, op, "ordering the comm stream after the compute stream");
    }
    return ZPP_OK;
}

/* Marks the end of the enqueued work: hands out the request, or (blocking
 * form) orders the compute stream after it right away. */
static zpp_status zpp__nccl_end(zpp__nccl_comm *nc, const char *op, zpp_comm_req *q,
                                zpp_comm_req **req_p) {
    zpp__nccl_shared *sh = nc->sh;
    cudaError_t e;
    if (q) {
        e = cudaEventRecord(q->done, sh->stream);
        if (e != cudaSuccess) {
            zpp__nccl_req_put(sh, q);
            return zpp__cuda_fail(e, op, "cudaEventRecord(done)");
        }
        q->owner = nc;
        *req_p = q;
        return ZPP_OK;
    }
    e = cudaEventRecord(sh->done_now, sh->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(sh->compute, sh->done_now, 0);
    if (e != cudaSuccess)
        return zpp__cuda_fail(e, op, "ordering the compute stream after the comm stream");
    return ZPP_OK;
}

/* Gives a request back after a failed enqueue. */
static zpp_status zpp__nccl_abandon(zpp__nccl_comm *nc, zpp_comm_req *q, zpp_status st) {
    if (q) zpp__nccl_req_put(nc->sh, q);
    return st;
}

/* Reports an asynchronous NCCL failure (a peer or the network died). */
static zpp_status zpp__nccl_check_async(zpp__nccl_comm *nc, const char *op) {
    ncclResult_t ar = ncclSuccess;
    if (!nc->nccl) return zpp__nccl_usable(nc, op);
    NCCLCHECK(nc, ncclCommGetAsyncError(nc->nccl, &ar), op);
    if (ar != ncclSuccess && ar != ncclInProgress) {
        nc->broken = 1;
        return zpp__nccl_fail(nc, ar, op, "an asynchronous operation");
    }
    return ZPP_OK;
}

/* Blocks the host until `ev` completes, watching NCCL's asynchronous error
 * state: on a failure (or the timeout) the communicator is aborted, which
 * makes its spinning kernels return, and the call reports instead of hanging. */
static zpp_status zpp__nccl_host_wait(zpp__nccl_comm *nc, cudaEvent_t ev, const char *op) {
    zpp__nccl_shared *sh = nc->sh;
    double t0 = zpp__now_s();
    for (unsigned long spin = 0;; spin++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return ZPP_OK;
        if (e != cudaErrorNotReady) return zpp__cuda_fail(e, op, "cudaEventQuery");
        zpp_status st = zpp__nccl_check_async(nc, op);
        if (st == ZPP_OK && sh->env.timeout_s > 0.0 && (spin & 255) == 0 &&
            zpp__now_s() - t0 > sh->env.timeout_s) {
            st = zpp_error(ZPP_ERR_COMM,
                           "%s: no completion after %.0f s (ZPP_NCCL_TIMEOUT_S) on the %s "
                           "communicator; a peer rank is probably gone or stuck",
                           op, sh->env.timeout_s, nc->name);
            nc->broken = 1;
        }
        if (st != ZPP_OK) {
            if (nc->nccl) ncclCommAbort(nc->nccl);
            nc->nccl = NULL;
            nc->broken = 1;
            return st;
        }
        sched_yield();
    }
}

/* ---- Operations ---------------------------------------------------------- */

static zpp_status zpp__nccl_allgather(zpp_comm *c, const void *send, void *recv,
                                      size_t bytes_per_rank, zpp_comm_req **req_p) {
    static const char op[] = "nccl allgather";
    zpp__nccl_comm *nc = c->impl;
    size_t n = (size_t)c->size;
    if (bytes_per_rank > SIZE_MAX / n)
        return zpp_error(ZPP_ERR_INVALID, "%s: %zu bytes per rank times %d ranks overflows",
                         op, bytes_per_rank, c->size);
    if (bytes_per_rank && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL buffer for %zu bytes per rank", op,
                         bytes_per_rank);
    /* In place (comm.h): the input is this rank's block of the output. */
    int in_place = (uintptr_t)send == (uintptr_t)recv + (size_t)c->rank * bytes_per_rank;
    if (!in_place && zpp__overlap(send, bytes_per_rank, recv, bytes_per_rank * n))
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: send and receive buffers overlap (in place needs send == recv + "
                         "rank * bytes_per_rank)",
                         op);
    zpp_comm_req *q;
    ZPP_CHECK(zpp__nccl_begin(nc, op, req_p, &q));
    if (bytes_per_rank) {
        /* Bytes as ncclUint8: `count` is then the byte count per rank. */
        ncclResult_t r = ncclAllGather(send, recv, bytes_per_rank, ncclUint8, nc->nccl,
                                       nc->sh->stream);
        if (r != ncclSuccess)
            return zpp__nccl_abandon(nc, q, zpp__nccl_fail(nc, r, op, "ncclAllGather"));
    }
    return zpp__nccl_end(nc, op, q, req_p);
}

static zpp_status zpp__nccl_reduce_scatter(zpp_comm *c, const void *send, void *recv,
                                           size_t count_per_rank, zpp_dtype dtype,
                                           zpp_comm_req **req_p) {
    static const char op[] = "nccl reduce_scatter";
    zpp__nccl_comm *nc = c->impl;
    int ok;
    ncclDataType_t t = zpp__nccl_dtype(dtype, &ok);
    if (!ok)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d; use fp32, bf16 or fp16", op,
                         (int)dtype);
    size_t esz = zpp_dtype_size(dtype), n = (size_t)c->size;
    if (count_per_rank > SIZE_MAX / esz / n)
        return zpp_error(ZPP_ERR_INVALID, "%s: %zu elements per rank overflows", op,
                         count_per_rank);
    if (count_per_rank && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL buffer for %zu elements per rank", op,
                         count_per_rank);
    if (zpp__overlap(send, count_per_rank * esz * n, recv, count_per_rank * esz))
        return zpp_error(ZPP_ERR_INVALID, "%s: send and receive buffers overlap", op);
    zpp_comm_req *q;
    ZPP_CHECK(zpp__nccl_begin(nc, op, req_p, &q));
    if (count_per_rank) {
        ncclResult_t r = ncclReduceScatter(send, recv, count_per_rank, t, ncclSum, nc->nccl,
                                           nc->sh->stream);
        if (r != ncclSuccess)
            return zpp__nccl_abandon(nc, q, zpp__nccl_fail(nc, r, op, "ncclReduceScatter"));
    }
    return zpp__nccl_end(nc, op, q, req_p);
}

static zpp_status zpp__nccl_alltoall(zpp_comm *c, const void *send, void *recv,
                                     size_t bytes_per_peer, zpp_comm_req **req_p) {
    static const char op[] = "nccl alltoall";
    zpp__nccl_comm *nc = c->impl;
    size_t n = (size_t)c->size;
    if (bytes_per_peer > SIZE_MAX / n)
        return zpp_error(ZPP_ERR_INVALID, "%s: %zu bytes per peer times %d ranks overflows", op,
                         bytes_per_peer, c->size);
    if (bytes_per_peer && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL buffer for %zu bytes per peer", op,
                         bytes_per_peer);
    if (zpp__overlap(send, bytes_per_peer * n, recv, bytes_per_peer * n))
        return zpp_error(ZPP_ERR_INVALID, "%s: send and receive buffers overlap", op);
    zpp_comm_req *q;
    ZPP_CHECK(zpp__nccl_begin(nc, op, req_p, &q));
    if (bytes_per_peer) {
        /* One group of point-to-point pairs; NCCL schedules them together,
         * so the order of the pairs cannot deadlock. The pair with oneself is
         * a local copy inside NCCL. */
        const char *s = send;
        char *d = recv;
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess)
            return zpp__nccl_abandon(nc, q, zpp__nccl_fail(nc, r, op, "ncclGroupStart"));
        const char *call = NULL;
        for (int p = 0; p < c->size; p++) {
            r = ncclSend(s + (size_t)p * bytes_per_peer, bytes_per_peer, ncclUint8, p, nc->nccl,
                         nc->sh->stream);
            if (r != ncclSuccess) {
                call = "ncclSend";
                break;
            }
            r = ncclRecv(d + (size_t)p * bytes_per_peer, bytes_per_peer, ncclUint8, p, nc->nccl,
                         nc->sh->stream);
            if (r != ncclSuccess) {
                call = "ncclRecv";
                break;
            }
        }
        /* The group is closed also after an error, or NCCL stays in it. */
        ncclResult_t r_end = ncclGroupEnd();
        if (!call && r_end != ncclSuccess) {
            r = r_end;
            call = "ncclGroupEnd";
        }
        if (call) return zpp__nccl_abandon(nc, q, zpp__nccl_fail(nc, r, op, call));
    }
    return zpp__nccl_end(nc, op, q, req_p);
}

static zpp_status zpp__nccl_allreduce(zpp_comm *c, const void *send, void *recv, size_t count,
                                      zpp_dtype dtype, zpp_comm_req **req_p) {
    static const char op[] = "nccl allreduce";
    zpp__nccl_comm *nc = c->impl;
    int ok;
    ncclDataType_t t = zpp__nccl_dtype(dtype, &ok);
    if (!ok)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d; use fp32, bf16 or fp16", op,
                         (int)dtype);
    size_t esz = zpp_dtype_size(dtype);
    if (count > SIZE_MAX / esz)
        return zpp_error(ZPP_ERR_INVALID, "%s: %zu elements overflows", op, count);
    if (count && (!send || !recv))
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL buffer for %zu elements", op, count);
    if (send != recv && zpp__overlap(send, count * esz, recv, count * esz))
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: send and receive buffers overlap without being equal (in place "
                         "needs send == recv)",
                         op);
    zpp_comm_req *q;
    ZPP_CHECK(zpp__nccl_begin(nc, op, req_p, &q));
    if (count) {
        ncclResult_t r = ncclAllReduce(send, recv, count, t, ncclSum, nc->nccl, nc->sh->stream);
        if (r != ncclSuccess)
            return zpp__nccl_abandon(nc, q, zpp__nccl_fail(nc, r, op, "ncclAllReduce"));
    }
    return zpp__nccl_end(nc, op, q, req_p);
}

static zpp_status zpp__nccl_broadcast(zpp_comm *c, void *buf, size_t bytes, int root,
                                      zpp_comm_req **req_p) {
    static const char op[] = "nccl broadcast";
    zpp__nccl_comm *nc = c->impl;
    if (root < 0 || root >= c->size)
        return zpp_error(ZPP_ERR_INVALID, "%s: root %d is not a rank of this %d-rank group", op,
                         root, c->size);
    if (bytes && !buf)
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL buffer for %zu bytes", op, bytes);
    zpp_comm_req *q;
    ZPP_CHECK(zpp__nccl_begin(nc, op, req_p, &q));
    if (bytes) {
        ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, nc->nccl,
                                       nc->sh->stream);
        if (r != ncclSuccess)
            return zpp__nccl_abandon(nc, q, zpp__nccl_fail(nc, r, op, "ncclBroadcast"));
    }
    return zpp__nccl_end(nc, op, q, req_p);
}

/* Max over the group of one host int, blocking on the host. It runs on the
 * comm stream only: the value lives on the host, so nothing on the compute
 * stream needs to finish first. */
static zpp_status zpp__nccl_allreduce_max_int(zpp_comm *c, int *value) {
    static const char op[] = "nccl allreduce_max_int";
    zpp__nccl_comm *nc = c->impl;
    zpp__nccl_shared *sh = nc->sh;
    if (!value) return zpp_error(ZPP_ERR_INVALID, "%s: NULL value", op);
    ZPP_CHECK(zpp__nccl_usable(nc, op));
    *sh->host_int = *value;
    CUDACHECK(cudaMemcpyAsync(sh->dev_int, sh->host_int, sizeof(int), cudaMemcpyHostToDevice,
                              sh->stream),
              op);
    NCCLCHECK(nc, ncclAllReduce(sh->dev_int, sh->dev_int, 1, ncclInt32, ncclMax, nc->nccl,
                                sh->stream),
              op);
    CUDACHECK(cudaMemcpyAsync(sh->host_int, sh->dev_int, sizeof(int), cudaMemcpyDeviceToHost,
                              sh->stream),
              op);
    CUDACHECK(cudaEventRecord(sh->host_done, sh->stream), op);
    ZPP_CHECK(zpp__nccl_host_wait(nc, sh->host_done, op));
    *value = *sh->host_int;
    return ZPP_OK;
}

/* Every rank has entered the barrier once a one-element all-reduce over the
 * group has completed: no rank's contribution is missing. */
static zpp_status zpp__nccl_barrier(zpp_comm *c) {
    static const char op[] = "nccl barrier";
    zpp__nccl_comm *nc = c->impl;
    zpp__nccl_shared *sh = nc->sh;
    ZPP_CHECK(zpp__nccl_usable(nc, op));
    /* Max rather than sum: whatever the staging int holds cannot overflow. */
    NCCLCHECK(nc, ncclAllReduce(sh->dev_int, sh->dev_int, 1, ncclInt32, ncclMax, nc->nccl,
                                sh->stream),
              op);
    CUDACHECK(cudaEventRecord(sh->host_done, sh->stream), op);
    return zpp__nccl_host_wait(nc, sh->host_done, op);
}

static zpp_status zpp__nccl_wait(zpp_comm_req *req) {
    static const char op[] = "nccl wait";
    if (!req) return ZPP_OK;
    zpp__nccl_comm *nc = req->owner;
    if (!nc)
        return zpp_error(ZPP_ERR_STATE, "%s: request is not in flight (waited twice?)", op);
    zpp__nccl_shared *sh = nc->sh;
    cudaError_t e = cudaStreamWaitEvent(sh->compute, req->done, 0);
    zpp__nccl_req_put(sh, req); /* completed and freed, whatever happens next */
    if (e != cudaSuccess)
        return zpp__cuda_fail(e, op, "ordering the compute stream after the collective");
    /* Cheap (an atomic read): surfaces a dead peer at the next wait. */
    return zpp__nccl_check_async(nc, op);
}

/* ---- Teardown ------------------------------------------------------------- */

static void zpp__nccl_shared_release(zpp__nccl_shared *sh) {
    if (!sh || --sh->refs > 0) return;
    if (sh->stream) cudaStreamSynchronize(sh->stream);
    for (zpp_comm_req *q = sh->all_reqs, *next; q; q = next) {
        next = q->next_all;
        cudaEventDestroy(q->done);
        free(q);
    }
    if (sh->ready) cudaEventDestroy(sh->ready);
    if (sh->done_now) cudaEventDestroy(sh->done_now);
    if (sh->host_done) cudaEventDestroy(sh->host_done);
    if (sh->dev_int) cudaFree(sh->dev_int);
    if (sh->host_int) cudaFreeHost(sh->host_int);
    if (sh->stream) cudaStreamDestroy(sh->stream);
    free(sh);
}

/* Aborting never waits for peers; destroying flushes outstanding work. */
static void zpp__nccl_comm_close(ncclComm_t comm, int broken) {
    if (!comm) return;
    ncclResult_t ar = ncclSuccess;
    if (!broken && ncclCommGetAsyncError(comm, &ar) != ncclSuccess) broken = 1;
    if (broken || (ar != ncclSuccess && ar != ncclInProgress))
        ncclCommAbort(comm);
    else if (ncclCommDestroy(comm) != ncclSuccess)
        ncclCommAbort(comm);
}

static void zpp__nccl_destroy(zpp_comm *c) {
    if (!c) return;
    zpp__nccl_comm *nc = c->impl;
    if (nc) {
        int prev = -1;
        if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
        cudaSetDevice(nc->sh->device);
        zpp__nccl_comm_close(nc->nccl, nc->broken);
        zpp__nccl_shared_release(nc->sh);
        free(nc);
        if (prev >= 0) cudaSetDevice(prev);
    }
    free(c);
}

static const zpp_comm_ops zpp__nccl_ops = {
    .name = "nccl",
    .allgather = zpp__nccl_allgather,
    .reduce_scatter = zpp__nccl_reduce_scatter,
    .alltoall = zpp__nccl_alltoall,
    .allreduce = zpp__nccl_allreduce,
    .allreduce_max_int = zpp__nccl_allreduce_max_int,
    .broadcast = zpp__nccl_broadcast,
    .barrier = zpp__nccl_barrier,
    .wait = zpp__nccl_wait,
    .destroy = zpp__nccl_destroy,
};

/* ---- Setup ---------------------------------------------------------------- */

/* Every rank learns whether any rank failed a step. Returns ZPP_OK if none
 * did; this rank's own status (its message intact) if it failed; otherwise
 * ZPP_ERR_COMM naming the lowest failed rank. */
static zpp_status zpp__nccl_agree(MPI_Comm mc, zpp_status local, int world_rank,
                                  const char *stage) {
    int mine = local != ZPP_OK ? world_rank : INT_MAX, first = INT_MAX;
    int mr = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, mc);
    if (local != ZPP_OK) return local;
    if (mr != MPI_SUCCESS)
        return zpp_error(ZPP_ERR_COMM,
                         "nccl setup: MPI_Allreduce failed (MPI error %d) while agreeing on %s",
                         mr, stage);
    if (first != INT_MAX)
        return zpp_error(ZPP_ERR_COMM,
                         "nccl setup: rank %d failed while %s (its own error says why); this "
                         "rank stops too so that no rank waits forever",
                         first, stage);
    return ZPP_OK;
}

/* Chooses this process's NCCL_HOSTID before NCCL first reads it. */
static zpp_status zpp__nccl_hostid(const zpp_topo *topo, const zpp_topo_opts *opts,
                                   const zpp__nccl_env *env) {
    char want[sizeof zpp__nccl_process_hostid] = "";
    if (opts->emulate_nodes)
        snprintf(want, sizeof want, "%s-zppnode%d", env->hostid_prefix, topo->node);
    if (zpp__nccl_process_started) {
        if (strcmp(want, zpp__nccl_process_hostid) != 0)
            return zpp_error(ZPP_ERR_STATE,
                             "nccl setup: this topology needs NCCL_HOSTID '%s' but NCCL already "
                             "runs in this process with '%s' (NCCL reads it once per process); "
                             "build topologies with a different emulate_nodes/node_size in a "
                             "new process",
                             want[0] ? want : "(as launched)",
                             zpp__nccl_process_hostid[0] ? zpp__nccl_process_hostid
                                                         : "(as launched)");
        return ZPP_OK;
    }
    if (want[0] && setenv("NCCL_HOSTID", want, 1) != 0)
        return zpp_error(ZPP_ERR_CONFIG, "nccl setup: could not set NCCL_HOSTID=%s", want);
    memcpy(zpp__nccl_process_hostid, want, sizeof want);
    zpp__nccl_process_started = 1;
    return ZPP_OK;
}

/* Everything this rank can set up without its peers. */
static zpp_status zpp__nccl_setup_local(const zpp_topo *topo, const zpp_topo_opts *opts,
                                        const zpp__nccl_env *env, zpp__nccl_shared **sh_p) {
    static const char op[] = "nccl setup";
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0)
        return zpp_error(ZPP_ERR_CUDA,
                         "%s: rank %d sees no CUDA device (%s); the NCCL backend needs one GPU "
                         "per rank — check the driver and CUDA_VISIBLE_DEVICES, or use the MPI "
                         "backend",
                         op, topo->world_rank,
                         e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    if (opts->device < 0 || opts->device >= ndev)
        return zpp_error(ZPP_ERR_CONFIG,
                         "%s: rank %d asked for CUDA device %d but sees %d (0..%d); pick e.g. "
                         "local rank %% device count",
                         op, topo->world_rank, opts->device, ndev, ndev - 1);
    CUDACHECK(cudaSetDevice(opts->device), op);

    ZPP_CHECK(zpp__nccl_hostid(topo, opts, env));
    int version = 0;
    NCCLCHECK(NULL, ncclGetVersion(&version), op);
    if (version < ZPP__NCCL_MIN_VERSION)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "%s: NCCL %d found at run time; ncclCommSplit needs NCCL 2.18 or newer "
                         "(built against %d.%d.%d)",
                         op, version, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

    zpp__nccl_shared *sh = calloc(1, sizeof *sh);
    if (!sh) return zpp_error(ZPP_ERR_NOMEM, "%s: out of host memory", op);
    sh->refs = 1;
    sh->device = opts->device;
    sh->env = *env;
    sh->compute = opts->compute_stream ? (cudaStream_t)opts->compute_stream : cudaStreamLegacy;
    zpp_status st = ZPP_OK;
    const char *call = NULL;
    if ((e = cudaStreamCreateWithFlags(&sh->stream, cudaStreamNonBlocking)) != cudaSuccess)
        call = "cudaStreamCreateWithFlags";
    else if ((e = cudaEventCreateWithFlags(&sh->ready, cudaEventDisableTiming)) != cudaSuccess ||
             (e = cudaEventCreateWithFlags(&sh->done_now, cudaEventDisableTiming)) !=
                 cudaSuccess ||
             (e = cudaEventCreateWithFlags(&sh->host_done, cudaEventDisableTiming)) !=
                 cudaSuccess)
        call = "cudaEventCreateWithFlags";
    else if ((e = cudaMalloc((void **)&sh->dev_int, sizeof(int))) != cudaSuccess)
        call = "cudaMalloc";
    else if ((e = cudaMallocHost((void **)&sh->host_int, sizeof(int))) != cudaSuccess)
        call = "cudaMallocHost";
    else if ((e = cudaMemset(sh->dev_int, 0, sizeof(int))) != cudaSuccess)
        call = "cudaMemset";
    if (call) {
        st = zpp__cuda_fail(e, op, call);
        goto fail;
    }
    /* Try the ordering once now: a compute stream of another device or a
     * destroyed one fails here, with a clear message, not at the first op. */
    e = cudaEventRecord(sh->ready, sh->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(sh->stream, sh->ready, 0);
    if (e != cudaSuccess) {
        st = zpp_error(ZPP_ERR_CONFIG,
                       "%s: the compute stream %p cannot be used on device %d: %s; pass a "
                       "stream created on that device, or NULL for the default stream",
                       op, opts->compute_stream, opts->device, cudaGetErrorString(e));
        goto fail;
    }
    for (int i = 0; i < env->req_pool; i++) ZPP_CHECK_GOTO(zpp__nccl_req_make(sh, op), st, fail);
    *sh_p = sh;
    return ZPP_OK;
fail:
    zpp__nccl_shared_release(sh);
    return st;
}

/* Wraps an NCCL communicator as a zpp_comm (takes a reference on sh). */
static zpp_status zpp__nccl_wrap(ncclComm_t comm, zpp__nccl_shared *sh, const char *name,
                                 int rank, int size, zpp_comm **c_p) {
    zpp_comm *c = calloc(1, sizeof *c);
    zpp__nccl_comm *nc = calloc(1, sizeof *nc);
    if (!c || !nc) {
        free(c);
        free(nc);
        return zpp_error(ZPP_ERR_NOMEM, "nccl setup: out of host memory");
    }
    nc->nccl = comm;
    nc->sh = sh;
    nc->name = name;
    sh->refs++;
    c->ops = &zpp__nccl_ops;
    c->mem = ZPP_MEM_DEVICE;
    c->rank = rank;
    c->size = size;
    c->impl = nc;
    *c_p = c;
    return ZPP_OK;
}

/* Checks that NCCL numbered a split the way the topology says. */
static zpp_status zpp__nccl_check_split(ncclComm_t comm, const char *name, int want_rank,
                                        int want_size) {
    static const char op[] = "nccl setup";
    int rank = -1, size = -1;
    NCCLCHECK(NULL, ncclCommUserRank(comm, &rank), op);
    NCCLCHECK(NULL, ncclCommCount(comm, &size), op);
    if (rank != want_rank || size != want_size)
        return zpp_error(ZPP_ERR_COMM,
                         "%s: the %s split came out as rank %d of %d, expected %d of %d", op,
                         name, rank, size, want_rank, want_size);
    return ZPP_OK;
}

/* Undoes a half-built communicator on the failure path: the wrapper if it
 * was made (it owns the NCCL handle then), else the bare handle. */
static void zpp__nccl_discard(zpp_comm *c, ncclComm_t comm) {
    if (c) {
        ((zpp__nccl_comm *)c->impl)->broken = 1;
        zpp__nccl_destroy(c);
    } else if (comm) {
        ncclCommAbort(comm);
    }
}

zpp_status zpp_comm_nccl_create_topo(zpp_topo *topo, const zpp_topo_opts *opts) {
    static const char op[] = "nccl setup";
    if (!topo || !opts)
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL topology or options", op);
    zpp__nccl_env env;
    zpp__nccl_env_read(&env);
    const int rank = topo->world_rank;
    zpp__nccl_shared *sh = NULL;
    ncclComm_t world = NULL, intra = NULL, inter = NULL;
    zpp_comm *cw = NULL, *ca = NULL, *ce = NULL;
    ncclResult_t r;
    zpp_status st;

    /* A private duplicate of the world whose errors return instead of
     * aborting the job, for the agreements and the id broadcast. */
    MPI_Comm mc = MPI_COMM_NULL;
    int mr = MPI_Comm_dup(MPI_COMM_WORLD, &mc);
    if (mr == MPI_SUCCESS) mr = MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    if (mr != MPI_SUCCESS) {
        if (mc != MPI_COMM_NULL) MPI_Comm_free(&mc);
        return zpp_error(ZPP_ERR_COMM, "%s: MPI_Comm_dup of the world failed (MPI error %d)",
                         op, mr);
    }

    /* 1. Device, NCCL_HOSTID, stream and buffers. */
    st = zpp__nccl_setup_local(topo, opts, &env, &sh);
    ZPP_CHECK_GOTO(zpp__nccl_agree(mc, st, rank, "setting up its CUDA device and NCCL environment"),
                   st, fail);

    /* 2. The world communicator. The id travels with a flag, so that a
     * failure on rank 0 stops everyone at the broadcast. */
    struct {
        ncclUniqueId id;
        int ok;
    } boot;
    memset(&boot, 0, sizeof boot);
    st = ZPP_OK;
    if (rank == 0) {
        r = ncclGetUniqueId(&boot.id);
        if (r == ncclSuccess)
            boot.ok = 1;
        else
            st = zpp__nccl_fail(NULL, r, op, "ncclGetUniqueId");
    }
    mr = MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, mc);
    if (st == ZPP_OK && mr != MPI_SUCCESS)
        st = zpp_error(ZPP_ERR_COMM, "%s: MPI_Bcast of the NCCL unique id failed (MPI error %d)",
                       op, mr);
    if (st == ZPP_OK && !boot.ok)
        st = zpp_error(ZPP_ERR_COMM,
                       "%s: rank 0 could not create the NCCL unique id (its own error says why)",
                       op);
    if (st != ZPP_OK) goto fail;

    r = ncclCommInitRank(&world, topo->world_size, boot.id, rank);
    if (r != ncclSuccess) {
        st = zpp__nccl_fail(NULL, r, op, "ncclCommInitRank");
        world = NULL; /* NCCL cleans up after a failed blocking init */
    }
    ZPP_CHECK_GOTO(zpp__nccl_agree(mc, st, rank, "creating the world NCCL communicator"), st, fail);

    /* 3. Splits: consecutive ranks share a node, so color = node with key =
     * local rank numbers the node's ranks by local index, and color = local
     * rank with key = node numbers each "rail" by node. */
    st = ZPP_OK;
    r = ncclCommSplit(world, topo->node, topo->local_rank, &intra, NULL);
    if (r != ncclSuccess) {
        st = zpp__nccl_fail(NULL, r, op, "ncclCommSplit(intra)");
        intra = NULL;
    }
    ZPP_CHECK_GOTO(zpp__nccl_agree(mc, st, rank, "splitting the intra-node NCCL communicator"), st,
                   fail);
    r = ncclCommSplit(world, topo->local_rank, topo->node, &inter, NULL);
    if (r != ncclSuccess) {
        st = zpp__nccl_fail(NULL, r, op, "ncclCommSplit(inter)");
        inter = NULL;
    }
    ZPP_CHECK_GOTO(zpp__nccl_agree(mc, st, rank, "splitting the inter-node NCCL communicator"), st,
                   fail);

    /* 4. Check the numbering and wrap the three communicators. */
    st = zpp__nccl_check_split(world, "world", rank, topo->world_size);
    if (st == ZPP_OK)
        st = zpp__nccl_check_split(intra, "intra", topo->local_rank, topo->node_size);
    if (st == ZPP_OK) st = zpp__nccl_check_split(inter, "inter", topo->node, topo->nodes);
    if (st == ZPP_OK) st = zpp__nccl_wrap(world, sh, "world", rank, topo->world_size, &cw);
    if (st == ZPP_OK)
        st = zpp__nccl_wrap(intra, sh, "intra", topo->local_rank, topo->node_size, &ca);
    if (st == ZPP_OK) st = zpp__nccl_wrap(inter, sh, "inter", topo->node, topo->nodes, &ce);
    ZPP_CHECK_GOTO(zpp__nccl_agree(mc, st, rank, "checking the NCCL communicators"), st, fail);

    zpp__nccl_shared_release(sh); /* the three comms hold their own references */
    MPI_Comm_free(&mc);
    topo->world = cw;
    topo->intra = ca;
    topo->inter = ce;
    return ZPP_OK;

fail:
    /* Abort, not destroy: destroying may wait for peers that gave up. */
    zpp__nccl_discard(ce, inter);
    zpp__nccl_discard(ca, intra);
    zpp__nccl_discard(cw, world);
    zpp__nccl_shared_release(sh);
    MPI_Comm_free(&mc);
    return st;
}

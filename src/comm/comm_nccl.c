/* comm/comm_nccl.c — the NCCL backend: collectives on device memory,
 * ordered against the caller's compute stream.
 *
 * SETUP (zpp_comm_nccl_create_topo, collective over MPI_COMM_WORLD)
 *   1. Check the rank's GPU (opts->device, a zpp_device) and exchange, over
 *      MPI, every rank's host prefix and GPU PCI bus id (comm/hostid.h).
 *      Then, locally: pin NCCL_NVLS_ENABLE=0, and for emulated nodes set
 *      NCCL_HOSTID to one value per emulated node, or one per rank for a
 *      node whose ranks share a GPU (NCCL refuses two ranks of one host on
 *      one GPU; as hosts of their own they talk over sockets, and
 *      zpp_topo.note says so; the topology itself is unchanged). NCCL reads
 *      NCCL_HOSTID once per process (its host hash is computed under a
 *      once-flag at the first init), so the first topology of a process fixes
 *      it: a later topology that needs another value is refused with
 *      ZPP_ERR_STATE instead of silently running on the wrong transport.
 *      Then the backend's own two streams, events and small buffer, all through
 *      the device API (device/device.h): this file makes no CUDA runtime
 *      call; the NCCL calls take the device's native stream handles.
 *   2. Rank 0 makes the ncclUniqueId; MPI_Bcast hands it out;
 *      ncclCommInitRank builds the world communicator.
 *   3. ncclCommSplit carves `intra` (color = node, key = local rank) and
 *      `inter` (color = local rank, key = node) out of the world, so their
 *      NCCL ranks are the local rank and the node index; then the same
 *      three again for the gradient reductions (zpp_topo.red_world, a
 *      duplicate of the world: color 0, key = rank; red_intra, red_inter).
 *   After every step that can fail on one rank only, the ranks agree (the
 *   one fail-together protocol, zpp__comm_mpi_agree), so a failure anywhere
 *   makes every rank return the first failing rank's error rather than
 *   leaving the others blocked in the next collective step. A
 *   rank that fails *inside* ncclCommInitRank/ncclCommSplit can still leave
 *   its peers waiting in NCCL's bootstrap: NCCL gives no way around that
 *   short of non-blocking init with timeouts.
 *
 * ONE RANK. A communicator of one rank (the whole world at world 1; intra
 *   on nodes of one GPU; inter on one node) gets no NCCL communicator: its
 *   operations are the identity (a reduction over one rank is its input),
 *   so each is at most one device copy from the input to the output on the
 *   communicator's stream, ordered and waited for as below. NCCL (2.28)
 *   holds about 0.5 GB of GPU memory for each communicator even of one
 *   rank (measured 2026-12-02: six at world 1 took 2.5 GiB of an H200), a
 *   tenth of a GPT 1.31B run's memory for nothing. The choice is the same
 *   on every rank (a split has the same size everywhere), so the ranks
 *   still make the same NCCL calls in the same order.
 *
 * STREAMS AND ORDERING
 *   A topology has six communicators on two communication streams (both
 *   non-blocking, so they never synchronise implicitly with the legacy
 *   default stream): world, intra and inter on the first (the gathers, the
 *   norm's all-reduce, broadcasts), the reductions' three on the second. So
 *   a gradient reduction (reduce-scatter, or qgZ's all-to-alls) runs
 *   concurrently with the parameter gathers, each on connections of its
 *   own. Every communicator is used from exactly one stream, so the order
 *   of its operations on the GPU is the order of the calls, which is the
 *   same on every rank (NCCL's requirement: the operations of one
 *   communicator must run in the same order on all its ranks). Across the
 *   two streams the kernels run in whatever order the GPU picks, and may be
 *   resident together; that cannot deadlock, because the only dependencies
 *   between the streams are the events below, through the compute stream,
 *   recorded at the same points of the (identical) program on every rank,
 *   and an NCCL kernel waits only for its own communicator's peers. (NCCL
 *   kernels are few blocks each; the two streams add at most one more
 *   resident kernel per rank.)
 *
 *   An operation:  record `ready` on the compute stream; the comm stream
 *   of the communicator waits on it (inputs produced by compute are
 *   complete, and buffers it writes are no longer read by kernels enqueued
 *   before); enqueue the NCCL call on that stream; record a `done` event
 *   on it.
 *   wait(req) makes the compute stream wait on `done`: the compute stream is
 *   ordered after the collective and the host does not block. The
 *   "blocking" form (req_p == NULL) does that wait at once, so for NCCL
 *   "blocking" means stream-ordered, not host-synchronous. Between start and
 *   wait the caller must not write the inputs nor read the outputs on the
 *   compute stream. Requests (each owning one `done` event) come from a
 *   free list that grows on demand, so the hot path creates no CUDA events.
 *
 *   The compute stream is the device's (opts->device->stream).
 *
 *   Hence, whichever stream an operation ran on: once the compute stream
 *   has waited on its `done`, everything enqueued after that, on the
 *   compute stream or (through `ready`) on either comm stream, runs after
 *   the operation. A buffer the operation read or wrote may then be handed
 *   to a new user (the scratch pool, device.h) as soon as the operation
 *   has been waited for; collectives.c says why every scratch buffer is.
 *
 * AGREEING ON ERRORS (ops->agree) runs on the host over MPI, not through
 *   NCCL: each NCCL communicator keeps an MPI communicator of the same ranks
 *   in the same order (a duplicate of the world, or the same split of it),
 *   made at setup from the MPI world NCCL bootstraps from. A device round
 *   trip would need the NCCL communicator to work, and agreeing is most
 *   needed exactly when it does not (after a timeout or an aborted
 *   communicator a rank must still tell its peers why it stops); it would
 *   also cost a kernel, two copies and a host wait for four bytes. The host
 *   path needs neither the GPU nor NCCL, and it is the same code as the MPI
 *   backend's, so both backends give every rank the same status and message.
 *
 * THE BARRIER blocks the host: it runs only on its communicator's stream (it does not
 *   wait for the compute stream) and then waits on the host by polling,
 *   checking NCCL's asynchronous error state as it goes: if a peer died
 *   NCCL reports it there, the communicator is aborted
 *   (which releases its stuck kernels), and the call returns ZPP_ERR_COMM
 *   instead of hanging. The topology's deadline bounds that wait
 *   (ZPP_ERR_TIMEOUT).
 *
 * THE WATCHDOG (one thread per topology) covers the host waits this file
 *   does not make: the engine's stream synchronisations and copies to the
 *   host wait behind the collectives on the compute stream, and a collective
 *   whose peer stalled never ends. Every operation records a `start` event
 *   on its stream before its NCCL call and an `end` event after it, and
 *   joins one FIFO in call order. Every 10 ms the thread looks at the oldest
 *   unfinished operation: its clock starts when its `start` event has
 *   passed (the collective itself is running, so time spent waiting for
 *   compute is not counted), and when it has run longer than the deadline,
 *   the thread aborts all the NCCL communicators (ncclCommAbort makes their
 *   kernels return, so every host wait behind them ends) and records why:
 *   from then on every call of the topology returns ZPP_ERR_TIMEOUT with
 *   that message, naming the operation, the communicator and its bytes,
 *   and the ranks that never enqueued it (each operation is counted on the
 *   topology's progress board, comm/progress.h, at its enqueue).
 *   With two streams the FIFO is not the order in which the operations
 *   end, but its oldest unfinished one always gets to start: everything it
 *   waits for (earlier operations on its stream, and those the compute
 *   stream waited on before its `ready`) came before it in the FIFO and has
 *   ended, so a later operation that stalls is looked at once the older
 *   ones have ended (or timed out). A communicator that reports
 *   an asynchronous error (a peer or the network died) is aborted alone;
 *   its later calls return ZPP_ERR_COMM saying so.
 *   A mutex orders the thread's abort against the calling thread's use of
 *   the NCCL handles; the thread only try-locks, so an NCCL call that
 *   blocks on the host inside NCCL itself (connection setup with a dead
 *   peer) is not covered. Not exercised in CI (no GPU there).
 *
 * BUFFERS: device memory of the topology's device. In place: allreduce with
 * send == recv, allgather with send == recv + rank * bytes_per_rank (both as
 * NCCL allows). Zero-sized operations are valid and enqueue nothing but the
 * ordering.
 *
 * ERRORS: argument errors are found by the fronts (comm.c) before anything
 * is enqueued and return ZPP_ERR_INVALID identically on every rank; this
 * file assumes checked arguments. An NCCL failure returns
 * ZPP_ERR_COMM with NCCL's own message (ncclGetLastError); after a fatal one
 * (or an asynchronous error, or a timeout) the communicator refuses further
 * work with ZPP_ERR_STATE and is aborted, not destroyed, at teardown.
 * ops->destroy frees the zpp_comm itself too.
 *
 * THREADS: one thread drives a topology's communicators, with the topology's
 * device current, as zpp_device_create_gpu left it (the request pool is not
 * locked; NCCL wants the same). The watchdog is the only other thread; see
 * above for what it shares.
 *
 * KNOBS (environment, read through core/env.h in nccl_env_read only):
 *   ZPP_NCCL_HOSTID_PREFIX  prefix of the emulated NCCL_HOSTID values,
 *                           <prefix>-zppnode<n>[-r<local>] (default: this
 *                           host's name, so ranks on different real hosts
 *                           never share an id; comm/hostid.h)
 *   ZPP_NCCL_TIMEOUT_S      when set, overrides the topology's deadline
 *                           (zpp_topo_opts.timeout_s, the trainer's
 *                           zeropp.collective_timeout_s) for the NCCL
 *                           communicators: seconds, 0 = wait forever
 *   ZPP_NCCL_REQ_POOL       requests made up front (default 16)
 *   ZPP_NCCL_REDUCE_STREAM  0 puts the reductions' communicators on the
 *                           gathers' stream (one stream for all six, as
 *                           before 2026-12: for measuring what the second
 *                           stream gains, and for tests); default 1
 *   NCCL_NVLS_ENABLE        set to "0" when unset (NVLink multicast can take
 *                           shared GPUs out of service; DESIGN.md §6); a
 *                           value the user set is kept
 * (core/env.h has the table of every variable zeropp reads.)
 */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>
#include <nccl.h>

#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "comm/hostid.h"
#include "core/env.h"
#include "core/error.h"
#include "device/device.h"

/* ncclCommSplit appeared in NCCL 2.18. */
#define ZPP__NCCL_MIN_VERSION 21800

/* ---- Knobs ------------------------------------------------------------- */

typedef struct zpp__nccl_env {
    char hostid_prefix[ZPP_HOSTID_PREFIX_CAP];
    double timeout_s; /* ZPP_NCCL_TIMEOUT_S; < 0: not set (the topology's) */
    int req_pool;
    int reduce_stream; /* ZPP_NCCL_REDUCE_STREAM: 0 = one stream for all */
} zpp__nccl_env;

/* Reads every environment knob of this backend, and sets NCCL_NVLS_ENABLE
 * to "0" before NCCL can read it, unless the user set it. */
static void nccl_env_read(zpp__nccl_env *env) {
    const char *s = zpp_env_get(ZPP_ENV_NCCL_HOSTID_PREFIX);
    if (s) {
        snprintf(env->hostid_prefix, sizeof env->hostid_prefix, "%s", s);
    } else if (gethostname(env->hostid_prefix, sizeof env->hostid_prefix) != 0) {
        snprintf(env->hostid_prefix, sizeof env->hostid_prefix, "zpp-host");
    }
    env->hostid_prefix[sizeof env->hostid_prefix - 1] = '\0';

    env->timeout_s = -1.0;
    s = zpp_env_get(ZPP_ENV_NCCL_TIMEOUT_S);
    if (s) {
        double t = strtod(s, NULL);
        if (t >= 0.0) env->timeout_s = t; /* (NaN is not) */
    }

    env->req_pool = 16;
    s = zpp_env_get(ZPP_ENV_NCCL_REQ_POOL);
    if (s) {
        long n = strtol(s, NULL, 10);
        if (n >= 0 && n <= 4096) env->req_pool = (int)n;
    }

    s = zpp_env_get(ZPP_ENV_NCCL_REDUCE_STREAM);
    env->reduce_stream = !(s && strcmp(s, "0") == 0);

    /* NVLink SHARP (multicast) stays off unless the user asks for it: a
     * program using it can put the host's GPUs, which others share, out of
     * service. A value the user set is theirs to keep. */
    (void)zpp_env_default(ZPP_ENV_NCCL_NVLS_ENABLE, "0");
}

/* ---- State --------------------------------------------------------------- */

typedef struct zpp__nccl_shared zpp__nccl_shared;
typedef struct zpp__nccl_comm zpp__nccl_comm;

/* One operation as the watchdog follows it (see THE WATCHDOG). */
typedef struct zpp__nccl_track {
    struct zpp__nccl_track *next;     /* FIFO, or free list */
    struct zpp__nccl_track *next_all; /* every one ever made, for teardown */
    zpp_device_event *start, *end;
    const char *op, *comm;
    size_t bytes;
    double t_started; /* when the watchdog first saw `start` passed; 0: not yet */
    zpp_prog_at at;   /* where it stands on the progress board (comm/progress.h) */
} zpp__nccl_track;

/* An in-flight operation: the event recorded on the comm stream after it. */
struct zpp_comm_req {
    zpp_comm_req *next_free; /* free list */
    zpp_comm_req *next_all;  /* every request ever made, for teardown */
    zpp__nccl_comm *owner;   /* while in flight */
    zpp_device_event *done;
};

/* The six communicators of a topology (world, intra, inter and the
 * reductions' three), and their two streams. */
#define ZPP__NCCL_COMMS 6
enum { ZPP__NCCL_GATHER = 0, ZPP__NCCL_REDUCE = 1 };

/* What the communicators of one topology share. */
struct zpp__nccl_shared {
    int refs;
    zpp_device *dev;            /* the rank's GPU; not owned */
    void *compute;              /* its compute stream; never destroyed here */
    /* ours: [ZPP__NCCL_GATHER] for the world/intra/inter communicators,
     * [ZPP__NCCL_REDUCE] for the reductions' (STREAMS AND ORDERING) */
    void *streams[2];
    zpp_device_event *ready;    /* compute -> stream, re-recorded per op */
    zpp_device_event *done_now; /* stream -> compute for the blocking form */
    zpp_device_event *host_done; /* stream -> host for the barrier */
    int *dev_int;               /* the barrier's one-element all-reduce */
    zpp_comm_req *free_reqs, *all_reqs;
    zpp__nccl_env env;
    double timeout_s;         /* the deadline in force; 0: none */
    /* The watchdog. `lock` guards everything below and every use of the
     * NCCL handles of comms[] (their abort included). */
    pthread_mutex_t lock;
    int lock_ready;
    pthread_t watchdog;
    int watchdog_running, watchdog_stop;
    zpp__nccl_comm *comms[ZPP__NCCL_COMMS]; /* the topology's, while they live */
    zpp__nccl_track *fifo_head, *fifo_tail, *track_free, *track_all;
    zpp__nccl_track *cur;     /* the operation being enqueued */
    zpp_status fired;         /* ZPP_ERR_TIMEOUT once the watchdog aborted all */
    char why[768];
    zpp_progress *prog;       /* the topology's progress board, or NULL */
};

struct zpp__nccl_comm {
    ncclComm_t nccl; /* NULL once aborted, and for one rank */
    int one;         /* one rank: no NCCL communicator (ONE RANK above) */
    MPI_Comm mpi;    /* the same ranks in the same order, for ops->agree */
    zpp__nccl_shared *sh;
    void *stream;    /* one of sh->streams: every NCCL call of this one */
    int broken;      /* a fatal NCCL error was seen: abort at destroy */
    const char *name;
    char why[384];   /* the watchdog's reason when it aborted this one alone */
    int kind;        /* ZPP_PROG_WORLD ... ZPP_PROG_RED_INTER: its progress counter */
};

/* NCCL_HOSTID of this process, fixed by its first topology (see top). */
static int nccl_process_started;
static char nccl_process_hostid[ZPP_HOSTID_CAP];

/* ---- Errors -------------------------------------------------------------- */

/* Errors after which a communicator cannot be trusted again. Argument and
 * usage errors are reported before anything is enqueued and leave it usable. */
static int nccl_fatal(ncclResult_t r) {
    return r == ncclUnhandledCudaError || r == ncclSystemError || r == ncclInternalError ||
           r == ncclRemoteError;
}

/* Records "<op>: NCCL error <name> (<NCCL's own message>)". */
static zpp_status nccl_fail(zpp__nccl_comm *nc, ncclResult_t r, const char *op, const char *call) {
    const char *last = ncclGetLastError(nc ? nc->nccl : NULL);
    if (nc && nccl_fatal(r)) nc->broken = 1;
    return zpp_error(ZPP_ERR_COMM, "%s: NCCL error %s (%s) in %s%s", op, ncclGetErrorString(r),
                     last && last[0] ? last : "no further detail from NCCL", call,
                     nccl_fatal(r) ? "; rerun with NCCL_DEBUG=WARN for NCCL's log" : "");
}

#define NCCLCHECK(nc, call, op)                                                   \
    do {                                                                          \
        ncclResult_t nccl_r_ = (call);                                            \
        if (nccl_r_ != ncclSuccess) return nccl_fail((nc), nccl_r_, (op), #call); \
    } while (0)

/* A failed device call (its front recorded why): add which operation. */
static zpp_status dev_fail(zpp_status st, const char *op, const char *what) {
    return zpp_error_context(st, "%s: %s", op, what);
}

#define DEVCHECK(call, op)                                            \
    do {                                                              \
        zpp_status dev_st_ = (call);                                  \
        if (dev_st_ != ZPP_OK) return dev_fail(dev_st_, (op), #call); \
    } while (0)

/* The native stream handle NCCL takes: the communicator's. */
static cudaStream_t nccl_stream(const zpp__nccl_comm *nc) { return (cudaStream_t)nc->stream; }

/* The NCCL type of a reduction dtype (checked by the front). */
static ncclDataType_t nccl_dtype(zpp_dtype dtype) {
    switch (dtype) {
    case ZPP_BF16: return ncclBfloat16;
    case ZPP_FP16: return ncclFloat16;
    default: return ncclFloat32;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- Requests ------------------------------------------------------------ */

static zpp_status nccl_req_make(zpp__nccl_shared *sh, const char *op) {
    zpp_comm_req *q = calloc(1, sizeof *q);
    if (!q) return zpp_error(ZPP_ERR_NOMEM, "%s: out of host memory for a request", op);
    zpp_status st = zpp_device_event_create(sh->dev, 0, &q->done);
    if (st != ZPP_OK) {
        free(q);
        return dev_fail(st, op, "creating a request's event");
    }
    q->next_all = sh->all_reqs;
    sh->all_reqs = q;
    q->next_free = sh->free_reqs;
    sh->free_reqs = q;
    return ZPP_OK;
}

static zpp_status nccl_req_get(zpp__nccl_shared *sh, const char *op, zpp_comm_req **q_p) {
    if (!sh->free_reqs) ZPP_CHECK(nccl_req_make(sh, op)); /* slow path only */
    zpp_comm_req *q = sh->free_reqs;
    sh->free_reqs = q->next_free;
    q->next_free = NULL;
    *q_p = q;
    return ZPP_OK;
}

static void nccl_req_put(zpp__nccl_shared *sh, zpp_comm_req *q) {
    q->owner = NULL;
    q->next_free = sh->free_reqs;
    sh->free_reqs = q;
}

/* ---- Starting and finishing an operation ---------------------------------- */

/* (with sh->lock held) */
static zpp_status nccl_usable(zpp__nccl_comm *nc, const char *op) {
    if (nc->sh->fired != ZPP_OK) return zpp_error(nc->sh->fired, "%s", nc->sh->why);
    if (nc->why[0]) return zpp_error(ZPP_ERR_COMM, "%s: %s", op, nc->why);
    if (nc->broken || (!nc->nccl && !nc->one))
        return zpp_error(ZPP_ERR_STATE,
                         "%s: the NCCL %s communicator failed earlier; destroy the topology "
                         "and create a new one",
                         op, nc->name);
    return ZPP_OK;
}

/* ---- The watchdog's FIFO (sh->lock held) ---------------------------------- */

static zpp_status nccl_track_get(zpp__nccl_shared *sh, const char *op, zpp__nccl_track **t_p) {
    zpp__nccl_track *t = sh->track_free;
    if (t) {
        sh->track_free = t->next;
    } else {
        t = calloc(1, sizeof *t);
        if (!t) return zpp_error(ZPP_ERR_NOMEM, "%s: out of host memory for the watchdog", op);
        zpp_status st = zpp_device_event_create(sh->dev, 0, &t->start);
        if (st == ZPP_OK) st = zpp_device_event_create(sh->dev, 0, &t->end);
        if (st != ZPP_OK) {
            if (t->start) zpp_device_event_destroy(sh->dev, t->start);
            free(t);
            return dev_fail(st, op, "creating the watchdog's events");
        }
        t->next_all = sh->track_all;
        sh->track_all = t;
    }
    t->next = NULL;
    t->t_started = 0.0;
    *t_p = t;
    return ZPP_OK;
}

static void nccl_track_put(zpp__nccl_shared *sh, zpp__nccl_track *t) {
    t->next = sh->track_free;
    sh->track_free = t;
}

/* Orders the comm stream after the work already on the compute stream,
 * takes a request if the caller wants one, and marks the start of the
 * operation for the watchdog. On success sh->lock stays held until
 * nccl_end or nccl_abandon. */
static zpp_status nccl_begin(zpp__nccl_comm *nc, const char *op, size_t bytes, zpp_comm_req **req_p,
                             zpp_comm_req **q_p) {
    zpp__nccl_shared *sh = nc->sh;
    *q_p = NULL;
    pthread_mutex_lock(&sh->lock);
    zpp_status st = nccl_usable(nc, op);
    if (st == ZPP_OK && req_p) st = nccl_req_get(sh, op, q_p);
    if (st == ZPP_OK) st = nccl_track_get(sh, op, &sh->cur);
    if (st != ZPP_OK) {
        if (*q_p) nccl_req_put(sh, *q_p);
        pthread_mutex_unlock(&sh->lock);
        return st;
    }
    sh->cur->op = op;
    sh->cur->comm = nc->name;
    sh->cur->bytes = bytes;
    /* counted at the enqueue: a stalled peer never gets here */
    sh->cur->at = zpp__progress_enter(sh->prog, nc->kind);
    st = zpp_device_event_record(sh->dev, sh->ready, sh->compute);
    if (st == ZPP_OK) st = zpp_device_event_wait(sh->dev, nc->stream, sh->ready);
    if (st == ZPP_OK) st = zpp_device_event_record(sh->dev, sh->cur->start, nc->stream);
    if (st != ZPP_OK) {
        if (*q_p) nccl_req_put(sh, *q_p);
        nccl_track_put(sh, sh->cur);
        sh->cur = NULL;
        pthread_mutex_unlock(&sh->lock);
        return dev_fail(st, op, "ordering the comm stream after the compute stream");
    }
    return ZPP_OK;
}

/* Marks the end of the enqueued work: hands the operation to the
 * watchdog, hands out the request, or (blocking form) orders the compute
 * stream after it right away. Releases sh->lock. */
static zpp_status nccl_end(zpp__nccl_comm *nc, const char *op, zpp_comm_req *q,
                           zpp_comm_req **req_p) {
    zpp__nccl_shared *sh = nc->sh;
    zpp__nccl_track *t = sh->cur;
    sh->cur = NULL;
    zpp_status st = zpp_device_event_record(sh->dev, t->end, nc->stream);
    if (st == ZPP_OK) {
        if (sh->fifo_tail) sh->fifo_tail->next = t;
        else sh->fifo_head = t;
        sh->fifo_tail = t;
    } else {
        nccl_track_put(sh, t); /* not followed; the op itself went on */
    }
    if (q) {
        st = zpp_device_event_record(sh->dev, q->done, nc->stream);
        if (st != ZPP_OK) {
            nccl_req_put(sh, q);
            pthread_mutex_unlock(&sh->lock);
            return dev_fail(st, op, "recording the end of the collective");
        }
        q->owner = nc;
        *req_p = q;
        pthread_mutex_unlock(&sh->lock);
        return ZPP_OK;
    }
    st = zpp_device_event_record(sh->dev, sh->done_now, nc->stream);
    if (st == ZPP_OK) st = zpp_device_event_wait(sh->dev, sh->compute, sh->done_now);
    pthread_mutex_unlock(&sh->lock);
    if (st != ZPP_OK) return dev_fail(st, op, "ordering the compute stream after the comm stream");
    return ZPP_OK;
}

/* Gives a request back after a failed enqueue. Releases sh->lock. */
static zpp_status nccl_abandon(zpp__nccl_comm *nc, zpp_comm_req *q, zpp_status st) {
    zpp__nccl_shared *sh = nc->sh;
    if (q) nccl_req_put(sh, q);
    if (sh->cur) nccl_track_put(sh, sh->cur);
    sh->cur = NULL;
    pthread_mutex_unlock(&sh->lock);
    return st;
}

/* The timeout's message, the same from every path, with the ranks that
 * did not enqueue the collective (comm/progress.h). */
static zpp_status nccl_timeout(const zpp__nccl_shared *sh, const char *op, const char *comm,
                               size_t bytes, const char *how, const zpp_prog_at *at) {
    char who[512];
    zpp__progress_explain(at, who, sizeof who);
    return zpp_error(ZPP_ERR_TIMEOUT,
                     "%s on the %s communicator (%zu bytes): no peer answered for %g s (a rank "
                     "stalled or died); every rank stops%s%s%s",
                     op, comm, bytes, sh->timeout_s, how,
                     sh->env.timeout_s >= 0.0 ? " (deadline from ZPP_NCCL_TIMEOUT_S)" : "", who);
}

/* Aborts every NCCL communicator of the topology (sh->lock held): their
 * kernels return, so nothing waits behind them any more. */
static void nccl_abort_all(zpp__nccl_shared *sh) {
    for (int i = 0; i < ZPP__NCCL_COMMS; i++) {
        zpp__nccl_comm *c = sh->comms[i];
        if (!c) continue;
        if (c->nccl) ncclCommAbort(c->nccl);
        c->nccl = NULL;
        c->broken = 1;
    }
}

/* One look (sh->lock held): the oldest unfinished operation and the
 * asynchronous errors. */
static void nccl_watch(zpp__nccl_shared *sh) {
    if (sh->fired != ZPP_OK) return;
    for (int i = 0; i < ZPP__NCCL_COMMS; i++) {
        zpp__nccl_comm *c = sh->comms[i];
        ncclResult_t ar = ncclSuccess;
        if (!c || !c->nccl || ncclCommGetAsyncError(c->nccl, &ar) != ncclSuccess) continue;
        if (ar != ncclSuccess && ar != ncclInProgress) {
            /* This communicator alone: its kernels return, the others may
             * still work (a timeout, below, stops them all). */
            snprintf(c->why, sizeof c->why,
                     "the NCCL %s communicator reported %s asynchronously (a peer or the "
                     "network failed) and the watchdog aborted it",
                     c->name, ncclGetErrorString(ar));
            ncclCommAbort(c->nccl);
            c->nccl = NULL;
            c->broken = 1;
        }
    }
    double now = now_s();
    while (sh->fifo_head) {
        zpp__nccl_track *t = sh->fifo_head;
        int done = 0;
        if (zpp_device_event_query(sh->dev, t->end, &done) != ZPP_OK) return;
        if (done) {
            sh->fifo_head = t->next;
            if (!sh->fifo_head) sh->fifo_tail = NULL;
            nccl_track_put(sh, t);
            continue;
        }
        /* what this rank's peers see it waiting in (comm/progress.h) */
        zpp__progress_wait_begin(&t->at, t->op);
        if (t->t_started == 0.0) {
            int started = 0;
            if (zpp_device_event_query(sh->dev, t->start, &started) == ZPP_OK && started)
                t->t_started = now;
        }
        if (sh->timeout_s > 0.0 && t->t_started > 0.0 && now - t->t_started > sh->timeout_s) {
            nccl_timeout(sh, t->op, t->comm, t->bytes,
                         "; the watchdog aborted the topology's NCCL communicators", &t->at);
            snprintf(sh->why, sizeof sh->why, "%s", zpp_last_error());
            sh->fired = ZPP_ERR_TIMEOUT;
            nccl_abort_all(sh);
        }
        return;
    }
    const zpp_prog_at none = {sh->prog, 0, 0};
    zpp__progress_wait_end(&none); /* nothing unfinished */
}

static void *nccl_watchdog_main(void *arg) {
    zpp__nccl_shared *sh = arg;
    (void)zpp_device_bind_thread(sh->dev); /* its events live on the rank's GPU */
    for (;;) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        /* try-lock: the calling thread may sit inside an NCCL call */
        if (pthread_mutex_trylock(&sh->lock) != 0) continue;
        int stop = sh->watchdog_stop;
        if (!stop) nccl_watch(sh);
        pthread_mutex_unlock(&sh->lock);
        if (stop) return NULL;
    }
}

/* Reports an asynchronous NCCL failure (a peer or the network died);
 * sh->lock held. */
static zpp_status nccl_check_async(zpp__nccl_comm *nc, const char *op) {
    ncclResult_t ar = ncclSuccess;
    if (!nc->nccl) return nccl_usable(nc, op);
    NCCLCHECK(nc, ncclCommGetAsyncError(nc->nccl, &ar), op);
    if (ar != ncclSuccess && ar != ncclInProgress) {
        nc->broken = 1;
        return nccl_fail(nc, ar, op, "an asynchronous operation");
    }
    return ZPP_OK;
}

/* Blocks the host until `ev` completes, watching NCCL's asynchronous error
 * state: on a failure (or the deadline) the communicator is aborted, which
 * makes its spinning kernels return, and the call reports instead of hanging. */
static zpp_status nccl_host_wait(zpp__nccl_comm *nc, zpp_device_event *ev, const char *op,
                                 size_t bytes, const zpp_prog_at *at) {
    zpp__nccl_shared *sh = nc->sh;
    double t0 = now_s();
    for (unsigned long spin = 0;; spin++) {
        int done = 0;
        zpp_status st = zpp_device_event_query(sh->dev, ev, &done);
        if (st != ZPP_OK) return dev_fail(st, op, "waiting for the comm stream");
        if (done) return ZPP_OK;
        pthread_mutex_lock(&sh->lock);
        st = nccl_check_async(nc, op);
        if (st == ZPP_OK && sh->timeout_s > 0.0 && (spin & 255) == 0 &&
            now_s() - t0 > sh->timeout_s)
            st = nccl_timeout(sh, op, nc->name, bytes, "", at);
        if (st != ZPP_OK) {
            if (nc->nccl) ncclCommAbort(nc->nccl);
            nc->nccl = NULL;
            nc->broken = 1;
        }
        pthread_mutex_unlock(&sh->lock);
        if (st != ZPP_OK) return st;
        sched_yield();
    }
}

/* ---- Operations ---------------------------------------------------------- */

/* An operation over one rank (ONE RANK above): its output is its input,
 * copied on the communicator's stream unless in place. Ends what
 * nccl_begin started. */
static zpp_status nccl_one_copy(zpp__nccl_comm *nc, const char *op, void *recv, const void *send,
                                size_t bytes, zpp_comm_req *q, zpp_comm_req **req_p) {
    zpp_status st = zpp_device_copy_on(nc->sh->dev, recv, send, bytes, nc->stream);
    if (st != ZPP_OK) return nccl_abandon(nc, q, dev_fail(st, op, "the local copy"));
    return nccl_end(nc, op, q, req_p);
}

static zpp_status nccl_allgather(zpp_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                                 zpp_comm_req **req_p) {
    static const char op[] = "nccl allgather";
    zpp__nccl_comm *nc = c->impl;
    zpp_comm_req *q;
    ZPP_CHECK(nccl_begin(nc, op, bytes_per_rank * (size_t)c->size, req_p, &q));
    if (nc->one) return nccl_one_copy(nc, op, recv, send, bytes_per_rank, q, req_p);
    if (bytes_per_rank) {
        /* Bytes as ncclUint8: `count` is then the byte count per rank. */
        ncclResult_t r =
            ncclAllGather(send, recv, bytes_per_rank, ncclUint8, nc->nccl, nccl_stream(nc));
        if (r != ncclSuccess) return nccl_abandon(nc, q, nccl_fail(nc, r, op, "ncclAllGather"));
    }
    return nccl_end(nc, op, q, req_p);
}

static zpp_status nccl_reduce_scatter(zpp_comm *c, const void *send, void *recv,
                                      size_t count_per_rank, zpp_dtype dtype,
                                      zpp_comm_req **req_p) {
    static const char op[] = "nccl reduce_scatter";
    zpp__nccl_comm *nc = c->impl;
    ncclDataType_t t = nccl_dtype(dtype);
    zpp_comm_req *q;
    ZPP_CHECK(
        nccl_begin(nc, op, count_per_rank * zpp_dtype_size(dtype) * (size_t)c->size, req_p, &q));
    if (nc->one)
        return nccl_one_copy(nc, op, recv, send, count_per_rank * zpp_dtype_size(dtype), q, req_p);
    if (count_per_rank) {
        ncclResult_t r =
            ncclReduceScatter(send, recv, count_per_rank, t, ncclSum, nc->nccl, nccl_stream(nc));
        if (r != ncclSuccess) return nccl_abandon(nc, q, nccl_fail(nc, r, op, "ncclReduceScatter"));
    }
    return nccl_end(nc, op, q, req_p);
}

static zpp_status nccl_alltoall(zpp_comm *c, const void *send, void *recv, size_t bytes_per_peer,
                                zpp_comm_req **req_p) {
    static const char op[] = "nccl alltoall";
    zpp__nccl_comm *nc = c->impl;
    zpp_comm_req *q;
    ZPP_CHECK(nccl_begin(nc, op, bytes_per_peer * (size_t)c->size, req_p, &q));
    if (nc->one) return nccl_one_copy(nc, op, recv, send, bytes_per_peer, q, req_p);
    if (bytes_per_peer) {
        /* One group of point-to-point pairs; NCCL schedules them together,
         * so the order of the pairs cannot deadlock. The pair with oneself is
         * a local copy inside NCCL. */
        const char *s = send;
        char *d = recv;
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return nccl_abandon(nc, q, nccl_fail(nc, r, op, "ncclGroupStart"));
        const char *call = NULL;
        for (int p = 0; p < c->size; p++) {
            r = ncclSend(s + (size_t)p * bytes_per_peer, bytes_per_peer, ncclUint8, p, nc->nccl,
                         nccl_stream(nc));
            if (r != ncclSuccess) {
                call = "ncclSend";
                break;
            }
            r = ncclRecv(d + (size_t)p * bytes_per_peer, bytes_per_peer, ncclUint8, p, nc->nccl,
                         nccl_stream(nc));
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
        if (call) return nccl_abandon(nc, q, nccl_fail(nc, r, op, call));
    }
    return nccl_end(nc, op, q, req_p);
}

static zpp_status nccl_allreduce(zpp_comm *c, const void *send, void *recv, size_t count,
                                 zpp_dtype dtype, zpp_comm_req **req_p) {
    static const char op[] = "nccl allreduce";
    zpp__nccl_comm *nc = c->impl;
    ncclDataType_t t = nccl_dtype(dtype);
    zpp_comm_req *q;
    ZPP_CHECK(nccl_begin(nc, op, count * zpp_dtype_size(dtype), req_p, &q));
    if (nc->one) return nccl_one_copy(nc, op, recv, send, count * zpp_dtype_size(dtype), q, req_p);
    if (count) {
        ncclResult_t r = ncclAllReduce(send, recv, count, t, ncclSum, nc->nccl, nccl_stream(nc));
        if (r != ncclSuccess) return nccl_abandon(nc, q, nccl_fail(nc, r, op, "ncclAllReduce"));
    }
    return nccl_end(nc, op, q, req_p);
}

static zpp_status nccl_broadcast(zpp_comm *c, void *buf, size_t bytes, int root,
                                 zpp_comm_req **req_p) {
    static const char op[] = "nccl broadcast";
    zpp__nccl_comm *nc = c->impl;
    zpp_comm_req *q;
    ZPP_CHECK(nccl_begin(nc, op, bytes, req_p, &q));
    if (bytes && !nc->one) { /* one rank: the root's buffer is the result */
        ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, nc->nccl, nccl_stream(nc));
        if (r != ncclSuccess) return nccl_abandon(nc, q, nccl_fail(nc, r, op, "ncclBroadcast"));
    }
    return nccl_end(nc, op, q, req_p);
}

/* Host-side, over the MPI communicator of the same ranks (see the top). */
static zpp_status nccl_agree_op(zpp_comm *c, zpp_status st) {
    zpp__nccl_comm *nc = c->impl;
    return zpp__comm_mpi_agree_at(&nc->mpi, st, nc->sh->timeout_s, nc->name, nc->sh->prog,
                                  nc->kind);
}

/* Every rank has entered the barrier once a one-element all-reduce over the
 * group has completed: no rank's contribution is missing. */
static zpp_status nccl_barrier(zpp_comm *c) {
    static const char op[] = "nccl barrier";
    zpp__nccl_comm *nc = c->impl;
    zpp__nccl_shared *sh = nc->sh;
    pthread_mutex_lock(&sh->lock);
    zpp_status st = nccl_usable(nc, op);
    zpp_prog_at at = {NULL, 0, 0};
    if (st == ZPP_OK) at = zpp__progress_enter(sh->prog, nc->kind);
    if (st == ZPP_OK && !nc->one) {
        /* Max rather than sum: whatever the staging int holds cannot overflow. */
        ncclResult_t r = ncclAllReduce(sh->dev_int, sh->dev_int, 1, ncclInt32, ncclMax, nc->nccl,
                                       nccl_stream(nc));
        if (r != ncclSuccess) st = nccl_fail(nc, r, op, "ncclAllReduce");
    }
    if (st == ZPP_OK) {
        st = zpp_device_event_record(sh->dev, sh->host_done, nc->stream);
        if (st != ZPP_OK) st = dev_fail(st, op, "recording the barrier's end");
    }
    pthread_mutex_unlock(&sh->lock);
    ZPP_CHECK(st);
    return nccl_host_wait(nc, sh->host_done, op, sizeof(int), &at);
}

static zpp_status nccl_wait(zpp_comm_req *req) {
    static const char op[] = "nccl wait";
    if (!req) return ZPP_OK;
    zpp__nccl_comm *nc = req->owner;
    if (!nc)
        return zpp_error(ZPP_ERR_STATE, "%s: request is not in flight (waited twice?)", op);
    zpp__nccl_shared *sh = nc->sh;
    zpp_status st = zpp_device_event_wait(sh->dev, sh->compute, req->done);
    nccl_req_put(sh, req); /* completed and freed, whatever happens next */
    if (st != ZPP_OK) return dev_fail(st, op, "ordering the compute stream after the collective");
    /* Cheap (an atomic read): surfaces a dead peer, or the watchdog's
     * abort, at the next wait. */
    pthread_mutex_lock(&sh->lock);
    st = sh->fired != ZPP_OK ? zpp_error(sh->fired, "%s", sh->why) : nccl_check_async(nc, op);
    pthread_mutex_unlock(&sh->lock);
    return st;
}

/* ---- Teardown ------------------------------------------------------------- */

static void nccl_shared_release(zpp__nccl_shared *sh) {
    if (!sh || --sh->refs > 0) return;
    zpp_device *d = sh->dev;
    if (sh->watchdog_running) {
        pthread_mutex_lock(&sh->lock);
        sh->watchdog_stop = 1;
        pthread_mutex_unlock(&sh->lock);
        pthread_join(sh->watchdog, NULL);
    }
    for (int k = 0; k < 2; k++)
        if (sh->streams[k]) zpp_device_sync(d, sh->streams[k]);
    for (zpp__nccl_track *t = sh->track_all, *next; t; t = next) {
        next = t->next_all;
        zpp_device_event_destroy(d, t->start);
        zpp_device_event_destroy(d, t->end);
        free(t);
    }
    if (sh->lock_ready) pthread_mutex_destroy(&sh->lock);
    for (zpp_comm_req *q = sh->all_reqs, *next; q; q = next) {
        next = q->next_all;
        zpp_device_event_destroy(d, q->done);
        free(q);
    }
    if (sh->ready) zpp_device_event_destroy(d, sh->ready);
    if (sh->done_now) zpp_device_event_destroy(d, sh->done_now);
    if (sh->host_done) zpp_device_event_destroy(d, sh->host_done);
    if (sh->dev_int) zpp_device_free(d, sh->dev_int);
    for (int k = 0; k < 2; k++)
        if (sh->streams[k]) zpp_device_stream_destroy(d, sh->streams[k]);
    free(sh);
}

/* Aborting never waits for peers; destroying flushes outstanding work. */
static void nccl_comm_close(ncclComm_t comm, int broken) {
    if (!comm) return;
    ncclResult_t ar = ncclSuccess;
    if (!broken && ncclCommGetAsyncError(comm, &ar) != ncclSuccess) broken = 1;
    if (broken || (ar != ncclSuccess && ar != ncclInProgress))
        ncclCommAbort(comm);
    else if (ncclCommDestroy(comm) != ncclSuccess)
        ncclCommAbort(comm);
}

static void nccl_destroy(zpp_comm *c) {
    if (!c) return;
    zpp__nccl_comm *nc = c->impl;
    if (nc) {
        /* The watchdog lets go of it first. */
        zpp__nccl_shared *sh = nc->sh;
        if (sh && sh->lock_ready) {
            pthread_mutex_lock(&sh->lock);
            for (int i = 0; i < ZPP__NCCL_COMMS; i++)
                if (sh->comms[i] == nc) sh->comms[i] = NULL;
            pthread_mutex_unlock(&sh->lock);
        }
        /* NCCL tears a communicator down on its own device; the device
         * backend's calls below name theirs. */
        nccl_comm_close(nc->nccl, nc->broken);
        nccl_shared_release(nc->sh);
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && nc->mpi != MPI_COMM_NULL) MPI_Comm_free(&nc->mpi);
        free(nc);
    }
    free(c);
}

static const zpp_comm_ops kNcclOps = {
    .name = "nccl",
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .alltoall = nccl_alltoall,
    .allreduce = nccl_allreduce,
    .agree = nccl_agree_op,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .wait = nccl_wait,
    .destroy = nccl_destroy,
};

/* ---- Setup ---------------------------------------------------------------- */

/* Every rank learns whether any rank failed a step, and if so the first
 * failing rank's status and message (the one protocol, comm_internal.h),
 * with the step named in front. */
static zpp_status nccl_agree(MPI_Comm mc, zpp_progress *p, zpp_status local, const char *stage,
                             double timeout_s) {
    zpp_status st =
        zpp__comm_mpi_agree_at(&mc, local, timeout_s, "world (NCCL setup)", p, ZPP_PROG_SETUP);
    if (st == ZPP_OK) return ZPP_OK;
    return zpp_error_context(st, "nccl setup (%s)", stage);
}

/* The rank's GPU, checked, and what the others need to know of it to tell
 * whether it shares that GPU with a rank of its node (comm/hostid.h). */
static zpp_status nccl_identify(const zpp_topo *topo, const zpp_topo_opts *opts,
                                const zpp__nccl_env *env, zpp_hostid_rank *me) {
    static const char op[] = "nccl setup";
    zpp_device *d = opts->device;
    if (!d || d->mem != ZPP_MEM_DEVICE || d->ordinal < 0)
        return zpp_error(ZPP_ERR_CONFIG,
                         "%s: rank %d has no GPU in the topology options (device %s); the NCCL "
                         "backend needs the rank's GPU: create it with zpp_device_create_gpu "
                         "and pass it as opts->device, or use the MPI backend",
                         op, topo->world_rank, !d ? "NULL" : d->ops ? d->ops->name : "?");
    memset(me, 0, sizeof *me);
    snprintf(me->prefix, sizeof me->prefix, "%s", env->hostid_prefix);
    zpp_status st = zpp_device_gpu_bus_id(d->ordinal, me->bus_id, sizeof me->bus_id);
    if (st != ZPP_OK) return zpp_error_context(st, "%s: rank %d", op, topo->world_rank);
    return ZPP_OK;
}

/* Chooses this process's NCCL_HOSTID before NCCL first reads it: with
 * emulated nodes, the node's or (ranks sharing a GPU) the rank's own, from
 * every rank's identity `ids` (comm/hostid.h). */
static zpp_status nccl_hostid(const zpp_topo *topo, const zpp_topo_opts *opts,
                              const zpp_hostid_rank *ids) {
    char want[sizeof nccl_process_hostid] = "";
    if (opts->emulate_nodes) {
        zpp_status st = zpp_hostid_emulated(ids, topo->world_size, topo->node_size,
                                            topo->world_rank, want, sizeof want, NULL);
        if (st != ZPP_OK) return zpp_error_context(st, "nccl setup");
    }
    if (nccl_process_started) {
        if (strcmp(want, nccl_process_hostid) != 0)
            return zpp_error(ZPP_ERR_STATE,
                             "nccl setup: this topology needs NCCL_HOSTID '%s' but NCCL already "
                             "runs in this process with '%s' (NCCL reads it once per process); "
                             "build topologies with a different emulate_nodes/node_size in a "
                             "new process",
                             want[0] ? want : "(as launched)",
                             nccl_process_hostid[0] ? nccl_process_hostid : "(as launched)");
        return ZPP_OK;
    }
    if (want[0] && zpp_env_set(ZPP_ENV_NCCL_HOSTID, want) != 0)
        return zpp_error(ZPP_ERR_CONFIG, "nccl setup: could not set NCCL_HOSTID=%s", want);
    memcpy(nccl_process_hostid, want, sizeof want);
    nccl_process_started = 1;
    return ZPP_OK;
}

/* Everything this rank can set up without its peers, once every rank's
 * identity `ids` is known (the device was checked by nccl_identify). */
static zpp_status nccl_setup_local(const zpp_topo *topo, const zpp_topo_opts *opts,
                                   const zpp__nccl_env *env, const zpp_hostid_rank *ids,
                                   zpp__nccl_shared **sh_p) {
    static const char op[] = "nccl setup";
    zpp_device *d = opts->device;
    ZPP_CHECK(nccl_hostid(topo, opts, ids));
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
    sh->dev = d;
    sh->env = *env;
    sh->compute = d->stream;
    sh->fired = ZPP_OK;
    /* One knob: the topology's deadline, unless ZPP_NCCL_TIMEOUT_S is set. */
    sh->timeout_s = env->timeout_s >= 0.0 ? env->timeout_s
                    : opts->timeout_s > 0.0 ? opts->timeout_s : 0.0;
    if (pthread_mutex_init(&sh->lock, NULL) != 0) {
        free(sh);
        return zpp_error(ZPP_ERR_STATE, "%s: cannot create the watchdog's mutex", op);
    }
    sh->lock_ready = 1;
    zpp_status st = ZPP_OK;
    const char *what = NULL;
    /* The device backend's streams never synchronise implicitly with the
     * legacy default stream (comm.h's ordering is by events only). */
    if ((st = zpp_device_stream_create(d, &sh->streams[0])) != ZPP_OK ||
        (st = zpp_device_stream_create(d, &sh->streams[1])) != ZPP_OK)
        what = "creating the comm streams";
    else if ((st = zpp_device_event_create(d, 0, &sh->ready)) != ZPP_OK ||
             (st = zpp_device_event_create(d, 0, &sh->done_now)) != ZPP_OK ||
             (st = zpp_device_event_create(d, 0, &sh->host_done)) != ZPP_OK)
        what = "creating events";
    else if ((st = zpp_device_alloc(d, sizeof(int), (void **)&sh->dev_int)) != ZPP_OK)
        what = "allocating the barrier's word";
    else if ((st = zpp_device_set(d, sh->dev_int, 0, sizeof(int))) != ZPP_OK)
        what = "clearing the barrier's word";
    if (what) {
        st = dev_fail(st, op, what);
        goto fail;
    }
    /* Order the comm streams after the compute stream once now (the word
     * was cleared there): a broken compute stream fails here, with a clear
     * message, not at the first op. */
    st = zpp_device_event_record(d, sh->ready, sh->compute);
    if (st == ZPP_OK) st = zpp_device_event_wait(d, sh->streams[0], sh->ready);
    if (st == ZPP_OK) st = zpp_device_event_wait(d, sh->streams[1], sh->ready);
    if (st != ZPP_OK) {
        st = zpp_error_context(ZPP_ERR_CONFIG,
                               "%s: the compute stream of GPU %d cannot be ordered against the "
                               "comm stream; pass the device made by zpp_device_create_gpu on "
                               "this rank",
                               op, d->ordinal);
        goto fail;
    }
    for (int i = 0; i < env->req_pool; i++) ZPP_CHECK_GOTO(nccl_req_make(sh, op), st, fail);
    if (pthread_create(&sh->watchdog, NULL, nccl_watchdog_main, sh) != 0) {
        st = zpp_error(ZPP_ERR_STATE, "%s: cannot start the watchdog thread", op);
        goto fail;
    }
    sh->watchdog_running = 1;
    *sh_p = sh;
    return ZPP_OK;
fail:
    nccl_shared_release(sh);
    return st;
}

/* Wraps an NCCL communicator as a zpp_comm (takes a reference on sh). */
static zpp_status nccl_wrap(ncclComm_t comm, MPI_Comm mpi, zpp__nccl_shared *sh, const char *name,
                            int rank, int size, int stream, zpp_comm **c_p) {
    zpp_comm *c = calloc(1, sizeof *c);
    zpp__nccl_comm *nc = calloc(1, sizeof *nc);
    if (!c || !nc) {
        free(c);
        free(nc);
        return zpp_error(ZPP_ERR_NOMEM, "nccl setup: out of host memory");
    }
    nc->nccl = comm;
    nc->one = size == 1;
    nc->mpi = mpi;
    nc->sh = sh;
    nc->stream = sh->streams[sh->env.reduce_stream ? stream : ZPP__NCCL_GATHER];
    nc->name = name;
    sh->refs++;
    pthread_mutex_lock(&sh->lock);
    for (int i = 0; i < ZPP__NCCL_COMMS; i++)
        if (!sh->comms[i]) {
            sh->comms[i] = nc;
            break;
        }
    pthread_mutex_unlock(&sh->lock);
    c->ops = &kNcclOps;
    c->mem = ZPP_MEM_DEVICE;
    c->rank = rank;
    c->size = size;
    c->impl = nc;
    *c_p = c;
    return ZPP_OK;
}

/* Checks that NCCL numbered a split the way the topology says. */
static zpp_status nccl_check_split(ncclComm_t comm, const char *name, int want_rank,
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
static void nccl_discard(zpp_comm *c, ncclComm_t comm) {
    if (c) {
        ((zpp__nccl_comm *)c->impl)->broken = 1;
        nccl_destroy(c);
    } else if (comm) {
        ncclCommAbort(comm);
    }
}

/* Frees an MPI communicator that no zpp_comm took over. */
static void nccl_mpi_free(MPI_Comm *mc) {
    if (*mc != MPI_COMM_NULL) MPI_Comm_free(mc);
}

/* One communicator of a topology: the split of the world that makes it
 * (color, key; the same for its MPI twin), what NCCL must number it as, and
 * the stream its operations run on. */
typedef struct zpp__nccl_part {
    const char *name;
    int color, key;
    int rank, size;
    int stream; /* ZPP__NCCL_GATHER or ZPP__NCCL_REDUCE */
    zpp_comm **out;
} zpp__nccl_part;

/* Everything zpp_comm_nccl_create_topo builds, in the order its steps build
 * it; nccl_setup_undo takes down whatever of it is still held. */
typedef struct zpp__nccl_setup {
    zpp_topo *topo;
    const zpp_topo_opts *opts;
    zpp__nccl_env env;
    double timeout_s; /* the setup's agreements wait as long as the operations will */
    zpp__nccl_part part[ZPP__NCCL_COMMS];
    /* A private duplicate of the world whose errors return instead of
     * aborting the job, for the agreements and the id broadcast; and the
     * MPI twins of the NCCL communicators (same ranks, same order), which
     * their ops->agree runs on (errors return on these too: they inherit
     * mc's handler). */
    MPI_Comm mc, mpi[ZPP__NCCL_COMMS];
    zpp__nccl_shared *sh; /* the setup's own reference */
    ncclComm_t nccl[ZPP__NCCL_COMMS];
    zpp_comm *made[ZPP__NCCL_COMMS]; /* each owns its nccl[i] and its MPI twin */
} zpp__nccl_setup;

/* The six communicators. Consecutive ranks share a node, so color = node
 * with key = local rank numbers the node's ranks by local index, and
 * color = local rank with key = node numbers each "rail" by node; color 0
 * with key = rank duplicates the world. [0] is the world itself
 * (ncclCommInitRank); the others are split from it. The last three are the
 * reductions' (zpp_topo.red_*): the same ranks in the same order on their
 * own stream. */
static void nccl_plan(zpp_topo *topo, zpp__nccl_part part[ZPP__NCCL_COMMS]) {
    const int rank = topo->world_rank, node = topo->node, local = topo->local_rank;
    const zpp__nccl_part plan[ZPP__NCCL_COMMS] = {
        {"world", 0, rank, rank, topo->world_size, ZPP__NCCL_GATHER, &topo->world},
        {"intra", node, local, local, topo->node_size, ZPP__NCCL_GATHER, &topo->intra},
        {"inter", local, node, node, topo->nodes, ZPP__NCCL_GATHER, &topo->inter},
        {"world (reduce)", 0, rank, rank, topo->world_size, ZPP__NCCL_REDUCE, &topo->red_world},
        {"intra (reduce)", node, local, local, topo->node_size, ZPP__NCCL_REDUCE,
         &topo->red_intra},
        {"inter (reduce)", local, node, node, topo->nodes, ZPP__NCCL_REDUCE, &topo->red_inter},
    };
    memcpy(part, plan, sizeof plan);
}

/* Step 0: the private MPI world and the MPI twins of the six communicators
 * (MPI collectives, the same on every rank). */
static zpp_status nccl_mpi_groups(zpp__nccl_setup *s) {
    static const char op[] = "nccl setup";
    int mr = MPI_Comm_dup(MPI_COMM_WORLD, &s->mc);
    if (mr == MPI_SUCCESS) mr = MPI_Comm_set_errhandler(s->mc, MPI_ERRORS_RETURN);
    for (int i = 0; i < ZPP__NCCL_COMMS && mr == MPI_SUCCESS; i++)
        mr = MPI_Comm_split(s->mc, s->part[i].color, s->part[i].key, &s->mpi[i]);
    if (mr != MPI_SUCCESS)
        return zpp_error(ZPP_ERR_COMM,
                         "%s: duplicating and splitting the MPI world failed (MPI error %d)", op,
                         mr);
    return ZPP_OK;
}

/* Step 1: the rank's GPU and every rank's identity (host prefix, GPU bus
 * id: comm/hostid.h), then NCCL_HOSTID, streams and buffers (s->sh). The
 * exchange runs whatever the options, so that every rank makes the same
 * MPI calls even if they disagree on emulate_nodes. Three agreements. */
static zpp_status nccl_identify_hosts(zpp__nccl_setup *s) {
    static const char op[] = "nccl setup";
    zpp_topo *topo = s->topo;
    zpp_hostid_rank *ids = calloc((size_t)topo->world_size, sizeof *ids);
    zpp_status st = ids ? nccl_identify(topo, s->opts, &s->env, &ids[topo->world_rank])
                        : zpp_error(ZPP_ERR_NOMEM, "%s: out of host memory", op);
    ZPP_CHECK_GOTO(nccl_agree(s->mc, topo->progress, st, "checking the GPU", s->timeout_s), st,
                   out);
    int mr =
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ids, (int)sizeof *ids, MPI_BYTE, s->mc);
    st = mr == MPI_SUCCESS
             ? ZPP_OK
             : zpp_error(ZPP_ERR_COMM,
                         "%s: MPI_Allgather of the ranks' GPU bus ids failed (MPI error %d)", op,
                         mr);
    ZPP_CHECK_GOTO(
        nccl_agree(s->mc, topo->progress, st, "exchanging the GPU bus ids", s->timeout_s), st, out);
    topo->note[0] = '\0';
    st = ZPP_OK;
    if (s->opts->emulate_nodes)
        st = zpp_hostid_note(ids, topo->world_size, topo->node_size, topo->note,
                             sizeof topo->note);
    if (st == ZPP_OK) st = nccl_setup_local(topo, s->opts, &s->env, ids, &s->sh);
    if (st == ZPP_OK) s->sh->prog = topo->progress;
    free(ids);
    ids = NULL;
    st = nccl_agree(s->mc, topo->progress, st, "setting up the GPU and the NCCL environment",
                    s->timeout_s);
out:
    free(ids);
    return st;
}

/* Step 2: the world communicator (none at world 1: ONE RANK). Rank 0 makes
 * the ncclUniqueId and MPI hands it out; the id travels with a flag, so
 * that a failure on rank 0 stops everyone at the broadcast. Two
 * agreements, unless the broadcast times out (then every rank's poll does,
 * and no agreement could complete either). */
static zpp_status nccl_create_world(zpp__nccl_setup *s) {
    static const char op[] = "nccl setup";
    zpp_topo *topo = s->topo;
    const int rank = topo->world_rank, world_one = topo->world_size == 1;
    /* static: after a timeout MPI may still write it */
    static struct {
        ncclUniqueId id;
        int ok;
    } boot;
    memset(&boot, 0, sizeof boot);
    zpp_status st = ZPP_OK;
    ncclResult_t r;
    if (rank == 0 && !world_one) {
        r = ncclGetUniqueId(&boot.id);
        if (r == ncclSuccess)
            boot.ok = 1;
        else
            st = nccl_fail(NULL, r, op, "ncclGetUniqueId");
    }
    /* Polled until the deadline, like every setup step before an NCCL
     * init (each agreement below gates the blocking NCCL call after it). */
    MPI_Request breq = MPI_REQUEST_NULL;
    int mr = MPI_Ibcast(&boot, (int)sizeof boot, MPI_BYTE, 0, s->mc, &breq);
    if (mr == MPI_SUCCESS) {
        zpp_prog_at at = zpp__progress_enter(topo->progress, ZPP_PROG_SETUP);
        zpp_status bst = zpp__comm_mpi_poll_at(&breq, s->timeout_s,
                                               "nccl setup (broadcasting the NCCL unique id)",
                                               "world", sizeof boot, &at);
        if (bst == ZPP_ERR_TIMEOUT) /* boot stays with MPI (static): abandoned */
            return bst;
        if (bst != ZPP_OK) mr = MPI_ERR_OTHER;
    }
    if (st == ZPP_OK && mr != MPI_SUCCESS)
        st = zpp_error(ZPP_ERR_COMM, "%s: MPI_Bcast of the NCCL unique id failed (MPI error %d)",
                       op, mr);
    /* rank 0's own failure reaches everyone through the agreement */
    if (st == ZPP_OK && rank != 0 && !boot.ok && !world_one) st = ZPP_ERR_COMM;
    ZPP_CHECK(nccl_agree(s->mc, topo->progress, st, "creating the NCCL unique id", s->timeout_s));

    r = world_one ? ncclSuccess : ncclCommInitRank(&s->nccl[0], topo->world_size, boot.id, rank);
    if (r != ncclSuccess) {
        st = nccl_fail(NULL, r, op, "ncclCommInitRank");
        s->nccl[0] = NULL; /* NCCL cleans up after a failed blocking init */
    }
    return nccl_agree(s->mc, topo->progress, st, "creating the world NCCL communicator",
                      s->timeout_s);
}

/* Step 3: the node (intra) and rail (inter) groups and the reductions'
 * three, split from the world in the same order on every rank (each split
 * is collective over the world), one agreement after each. */
static zpp_status nccl_split_groups(zpp__nccl_setup *s) {
    static const char op[] = "nccl setup";
    char stage[96];
    for (int i = 1; i < ZPP__NCCL_COMMS; i++) {
        const zpp__nccl_part *p = &s->part[i];
        zpp_status st = ZPP_OK;
        if (p->size == 1) continue; /* the same on every rank: ONE RANK */
        ncclResult_t r = ncclCommSplit(s->nccl[0], p->color, p->key, &s->nccl[i], NULL);
        if (r != ncclSuccess) {
            st = nccl_fail(NULL, r, op, "ncclCommSplit");
            s->nccl[i] = NULL;
        }
        snprintf(stage, sizeof stage, "splitting the NCCL %s communicator", p->name);
        ZPP_CHECK(nccl_agree(s->mc, s->topo->progress, st, stage, s->timeout_s));
    }
    return ZPP_OK;
}

/* Step 4: check the numbering and wrap the communicators (each takes over
 * its NCCL handle and its MPI twin, and is counted on the topology's
 * progress board as its kind); one agreement. */
static zpp_status nccl_wrap_groups(zpp__nccl_setup *s) {
    zpp_status st = ZPP_OK;
    for (int i = 0; i < ZPP__NCCL_COMMS && st == ZPP_OK; i++) {
        const zpp__nccl_part *p = &s->part[i];
        if (p->size > 1) st = nccl_check_split(s->nccl[i], p->name, p->rank, p->size);
        if (st == ZPP_OK)
            st = nccl_wrap(s->nccl[i], s->mpi[i], s->sh, p->name, p->rank, p->size, p->stream,
                           &s->made[i]);
        if (st == ZPP_OK) s->mpi[i] = MPI_COMM_NULL;
        /* part[] is in ZPP_PROG_WORLD ... ZPP_PROG_RED_INTER order */
        if (st == ZPP_OK) ((zpp__nccl_comm *)s->made[i]->impl)->kind = ZPP_PROG_WORLD + i;
    }
    return nccl_agree(s->mc, s->topo->progress, st, "checking the NCCL communicators",
                      s->timeout_s);
}

/* The one cleanup, for success and failure alike: whatever the steps built
 * and no output took over. Abort, not destroy: destroying may wait for
 * peers that gave up. The splits go first, the world they came from last;
 * then the setup's reference to the shared state (the comms hold their
 * own) and the private world. */
static void nccl_setup_undo(zpp__nccl_setup *s) {
    for (int i = ZPP__NCCL_COMMS - 1; i >= 0; i--) {
        nccl_discard(s->made[i], s->nccl[i]);
        nccl_mpi_free(&s->mpi[i]);
    }
    nccl_shared_release(s->sh);
    nccl_mpi_free(&s->mc);
}

zpp_status zpp_comm_nccl_create_topo(zpp_topo *topo, const zpp_topo_opts *opts) {
    static const char op[] = "nccl setup";
    if (!topo || !opts)
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL topology or options", op);
    zpp__nccl_setup s = {.topo = topo, .opts = opts, .mc = MPI_COMM_NULL};
    for (int i = 0; i < ZPP__NCCL_COMMS; i++) s.mpi[i] = MPI_COMM_NULL;
    nccl_env_read(&s.env);
    s.timeout_s = s.env.timeout_s >= 0.0 ? s.env.timeout_s
                  : opts->timeout_s > 0.0 ? opts->timeout_s : 0.0;
    nccl_plan(topo, s.part);

    /* After every step that can fail on one rank only, the ranks agree, in
     * the same order everywhere (SETUP above). */
    zpp_status st;
    ZPP_CHECK_GOTO(nccl_mpi_groups(&s), st, out);
    ZPP_CHECK_GOTO(nccl_identify_hosts(&s), st, out);
    ZPP_CHECK_GOTO(nccl_create_world(&s), st, out);
    ZPP_CHECK_GOTO(nccl_split_groups(&s), st, out);
    ZPP_CHECK_GOTO(nccl_wrap_groups(&s), st, out);
    for (int i = 0; i < ZPP__NCCL_COMMS; i++) {
        *s.part[i].out = s.made[i];
        s.made[i] = NULL;
        s.nccl[i] = NULL; /* owned by the output now */
    }
out:
    nccl_setup_undo(&s);
    if (st != ZPP_OK) topo->note[0] = '\0';
    return st;
}

const char *zpp_comm_nccl_build(void) {
    static char text[64];
    snprintf(text, sizeof text, "NCCL %d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return text;
}

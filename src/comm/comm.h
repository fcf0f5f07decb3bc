/* comm/comm.h — one backend interface, a table of functions, and topology.
 *
 * A zpp_comm is a group of ranks on one backend (MPI for host memory, NCCL
 * for device memory). The collectives and engine layers call the fronts
 * below (zpp_comm_allgather, ...), which check the arguments once, with one
 * message per mistake, and then dispatch to comm->ops; so the same ZeRO++
 * code runs on either backend, and a backend may assume checked arguments.
 *
 * Every operation has an asynchronous form: pass a req_p and the call only
 * starts the operation; zpp_comm_wait(req) completes it. Pass req_p = NULL
 * for the blocking form. Completion means "the result may be used by what
 * runs next": on MPI the host has the data; on NCCL the compute stream is
 * ordered after the collective (the host does not block). On failure *req_p
 * is not written.
 *
 * Sizes are per rank: an all-gather of `bytes` per rank reads `bytes` from
 * each rank and writes size * bytes, rank-ordered; a reduce-scatter of
 * `count` per rank reads size * count elements and writes count; an
 * all-to-all of `bytes` per peer sends block j of the input to rank j and
 * receives block i from rank i into block i of the output.
 * Buffers must not overlap unless an op says otherwise.
 *
 * Deadlines. Every wait of a topology's communicators (a blocking call,
 * zpp_comm_wait, the barrier, the agreement) gives up after
 * zpp_topo_opts.timeout_s seconds without completion (0 = wait forever)
 * and returns ZPP_ERR_TIMEOUT naming the operation, the communicator
 * (world, intra or inter), its size in bytes, the deadline and the ranks
 * that did not arrive (comm/progress.h: as far as this host can see, with
 * why: stopped, exited, or waiting elsewhere for whom). A timeout
 * is fatal for the job: a peer rank stalled or died, the operation is left
 * unfinished inside the backend (MPI may still write the receive buffer
 * later, so keep it alive; NCCL's communicators are aborted), the
 * communicator refuses further work (ZPP_ERR_STATE, naming the operation
 * that timed out; a wait on it tests once and does not wait again), and
 * the thread's message stays the timeout's (core/error.h), and the caller should
 * stop the job (tools/ aborts it) rather than agree: zpp_comm_agree with a
 * local ZPP_ERR_TIMEOUT returns it at once, since a stalled peer cannot
 * answer. Waiting ranks poll with short sleeps, so they do not keep a core
 * busy.
 *
 * In place: allreduce accepts send == recv; allgather accepts
 * send == (char *)recv + rank * bytes_per_rank (this rank's block of the
 * output, as NCCL allows). Any other overlap is ZPP_ERR_INVALID (checked
 * by the fronts, on every backend). */
#ifndef ZPP_COMM_COMM_H
#define ZPP_COMM_COMM_H

#include <stddef.h>

#include "device/device.h"
#include "zeropp.h"

typedef struct zpp_comm zpp_comm;
typedef struct zpp_comm_req zpp_comm_req;

typedef struct zpp_comm_ops {
    const char *name;  /* "mpi" or "nccl" */
    zpp_status (*allgather)(zpp_comm *c, const void *send, void *recv,
                            size_t bytes_per_rank, zpp_comm_req **req_p);
    /* Sum; dtype fp32, bf16 or fp16 (bf16/fp16 summed in fp32 per
     * combination and rounded back, as NCCL does). */
    zpp_status (*reduce_scatter)(zpp_comm *c, const void *send, void *recv,
                                 size_t count_per_rank, zpp_dtype dtype,
                                 zpp_comm_req **req_p);
    zpp_status (*alltoall)(zpp_comm *c, const void *send, void *recv,
                           size_t bytes_per_peer, zpp_comm_req **req_p);
    /* Sum; send may equal recv (in place). */
    zpp_status (*allreduce)(zpp_comm *c, const void *send, void *recv, size_t count,
                            zpp_dtype dtype, zpp_comm_req **req_p);
    /* Failing together (zpp_comm_agree): every rank returns the status of
     * the lowest failing rank with its message. Blocking, on the host. */
    zpp_status (*agree)(zpp_comm *c, zpp_status st);
    zpp_status (*broadcast)(zpp_comm *c, void *buf, size_t bytes, int root,
                            zpp_comm_req **req_p);
    zpp_status (*barrier)(zpp_comm *c);
    zpp_status (*wait)(zpp_comm_req *req); /* completes and frees req */
    void (*destroy)(zpp_comm *c);
} zpp_comm_ops;

struct zpp_comm {
    const zpp_comm_ops *ops;
    zpp_mem_kind mem; /* where this backend's buffers live */
    int rank;
    int size;
    void *impl;       /* backend state */
};

/* ---- The fronts: argument checks, then c->ops --------------------------
 * ZPP_ERR_INVALID, before anything is enqueued and identically on every
 * rank that passed the same arguments, for: a NULL comm; a NULL buffer with
 * a nonzero size; a size whose total bytes overflow size_t; a dtype other
 * than fp32, bf16 or fp16; a root outside [0, size); overlapping buffers
 * other than the in-place forms above. */
zpp_status zpp_comm_allgather(zpp_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                              zpp_comm_req **req_p);
zpp_status zpp_comm_reduce_scatter(zpp_comm *c, const void *send, void *recv,
                                   size_t count_per_rank, zpp_dtype dtype,
                                   zpp_comm_req **req_p);
zpp_status zpp_comm_alltoall(zpp_comm *c, const void *send, void *recv, size_t bytes_per_peer,
                             zpp_comm_req **req_p);
zpp_status zpp_comm_allreduce(zpp_comm *c, const void *send, void *recv, size_t count,
                              zpp_dtype dtype, zpp_comm_req **req_p);
zpp_status zpp_comm_broadcast(zpp_comm *c, void *buf, size_t bytes, int root,
                              zpp_comm_req **req_p);
zpp_status zpp_comm_barrier(zpp_comm *c);

/* Completes an asynchronous operation; NULL is a no-op. */
static inline zpp_status zpp_comm_wait(zpp_comm *c, zpp_comm_req *req) {
    return req ? c->ops->wait(req) : ZPP_OK;
}

/* ---- Topology --------------------------------------------------------- */
/*
 * world_size = nodes * node_size. Rank r is on node r / node_size with local
 * index r % node_size (consecutive ranks share a node, as launchers place
 * them). `intra` spans the ranks of this node (size node_size, rank =
 * local_rank); `inter` spans the ranks with this local index, one per node
 * (size nodes, rank = node).
 */
typedef struct zpp_topo {
    int world_size, world_rank;
    int node_size, nodes;
    int node, local_rank;
    zpp_comm *world, *intra, *inter;
    /* The gradient reductions' own communicators: the same ranks, in the
     * same order, as world, intra and inter. On NCCL they are separate
     * communicators whose operations run on a second stream, so a
     * reduction runs concurrently with the parameter gathers (comm_nccl.c,
     * STREAMS AND ORDERING). On MPI they are world, intra and inter
     * themselves (the host blocks in each wait; nothing would overlap). */
    zpp_comm *red_world, *red_intra, *red_inter;
    /* What the backend changed about how the ranks talk, for people (the
     * trainer prints it); "" when nothing. NCCL with emulated nodes whose
     * ranks share a GPU: "ranks of node 0 share GPU 0000:1b:00.0: each talks
     * over sockets, as a separate host; the topology stays 2 nodes of 2"
     * (comm/hostid.h). The same on every rank. */
    char note[320];
    /* This host's progress board (comm/progress.h): who arrived, for the
     * timeouts' messages. NULL when shared memory could not be had. */
    struct zpp_progress *progress;
} zpp_topo;

typedef enum zpp_backend_kind { ZPP_BACKEND_MPI = 0, ZPP_BACKEND_NCCL = 1 } zpp_backend_kind;

typedef struct zpp_topo_opts {
    zpp_backend_kind backend;
    /* Ranks per node; 0 = as the launcher placed them
     * (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). Must divide the world. */
    int node_size;
    /* NCCL only: the rank's GPU (zpp_device_create_gpu); collectives are
     * ordered against its compute stream and use its events. Not owned. */
    zpp_device *device;
    /* NCCL only: 1 sets a distinct NCCL_HOSTID per emulated node before NCCL
     * initialises, so emulated nodes talk over NCCL's network transport.
     * Where ranks of one node share a GPU (NCCL refuses two ranks of one
     * host on one GPU), each rank of that node gets an NCCL_HOSTID of its
     * own instead, and talks to the others over sockets too; the topology
     * (node, local_rank, intra, inter) stays as node_size says, and
     * zpp_topo.note says so (comm/hostid.h). */
    int emulate_nodes;
    /* Seconds any wait on these communicators may last before it returns
     * ZPP_ERR_TIMEOUT (see "Deadlines" above); 0 = wait forever. The
     * trainer passes zeropp.collective_timeout_s (default 600). NCCL: the
     * environment variable ZPP_NCCL_TIMEOUT_S, when set, overrides it. */
    double timeout_s;
} zpp_topo_opts;

/* Builds the topology over MPI_COMM_WORLD (MPI must be initialised).
 * Collective over all ranks, and every rank returns the same status: the
 * options are first agreed with an all-reduce (node_size and backend must
 * be equal everywhere), every check is computed identically on all ranks,
 * and each step that can fail locally is followed by an agreement, so a
 * bad input fails everywhere instead of hanging some ranks.
 *
 * Setup has the same deadline as the operations (opts->timeout_s; 0 =
 * forever): every blocking MPI step (duplicating and splitting the world)
 * is preceded by a non-blocking barrier polled until the deadline, and
 * the agreements are polled too, so a rank that never arrives makes the
 * others return ZPP_ERR_TIMEOUT "topology setup (<what was being set
 * up>): ..." naming the ranks that did not arrive (as far as this host can
 * see), instead of hanging. The NCCL backend gates its NCCL inits the same
 * way (a rank that stalls inside ncclCommInitRank itself is not covered).
 *
 * Errors (ZPP_ERR_INVALID): node_size < 0; node_size not dividing the world
 * (the message names both numbers and lists node sizes that divide it);
 * options differing across ranks; with node_size 0, a launcher placement
 * whose shared-memory nodes are unequal or not consecutive ranks.
 * ZPP_ERR_UNSUPPORTED: ZPP_BACKEND_NCCL in a build without NCCL. */
zpp_status zpp_topo_create_with_opts(const zpp_topo_opts *opts, zpp_topo **topo_p);
void zpp_topo_destroy(zpp_topo *topo);

/* Where the launcher put this rank: its index among the ranks it started on
 * this host, and their number (MPI's shared-memory split of the world),
 * whatever node size is emulated. A rank's GPU is local_rank modulo the
 * GPUs it sees. Local: no other rank takes part beyond that split. */
zpp_status zpp_comm_launch_local(int *local_rank_p, int *local_size_p);

/* ---- Failing together ----------------------------------------------------
 * Every rank of `c` returns the same status: ZPP_OK when all passed `st` ==
 * ZPP_OK, else the status of the lowest-numbered failing rank, whose
 * message (zpp_last_error) is handed to every rank, so a problem seen by
 * one rank is reported by all instead of leaving the others to hang in the
 * next collective. Collective over `c`, blocking, on the host. */
zpp_status zpp_comm_agree(zpp_comm *c, zpp_status st);
/* The same over every rank the launcher started (MPI_COMM_WORLD), for the
 * steps before a topology exists (reading a config, opening a file). */
zpp_status zpp_comm_agree_world(zpp_status st);
/* The same with its own deadline (seconds; 0 = forever) instead of the
 * world's: for waits that are not a peer's collective, such as the other
 * ranks' disk writes of a checkpoint. */
zpp_status zpp_comm_agree_world_within(zpp_status st, double timeout_s);
/* The maximum of a double over every rank the launcher started (the
 * slowest rank's time, say). Blocking, on the host. */
zpp_status zpp_comm_max_world(double *value);
/* The deadline of the two world forms above (seconds; 0 = wait forever,
 * the default; negative or NaN is taken as 0). Process-wide: set it once,
 * from one thread, before the ranks start agreeing (the trainer sets
 * zeropp.collective_timeout_s). */
void zpp_comm_world_set_timeout(double timeout_s);
double zpp_comm_world_timeout(void);
/* This rank's index among, and the number of, the ranks the launcher
 * started (MPI_COMM_WORLD): 0 and 1 before MPI is initialised. Local. */
int zpp_comm_world_rank(void);
int zpp_comm_world_size(void);
/* 1 when a launcher (mpirun, mpiexec) started this process, 0 for a
 * process started alone (an MPI singleton). Local; reads the environment. */
int zpp_comm_launched(void);
/* The NCCL the NCCL backend was built against ("NCCL 2.28.3"), for
 * `zeropp --version`; NULL in a build without it. */
const char *zpp_comm_nccl_build(void);

/* Backends (called by zpp_topo_create_with_opts). `mpi_comm` is an MPI_Comm passed as
 * a pointer to keep mpi.h out of this header. */
/* Collective over `mpi_comm`: duplicates it (the zpp_comm owns the
 * duplicate, with MPI_ERRORS_RETURN, so every MPI error comes back as
 * ZPP_ERR_COMM with MPI's message) and frees it in ops->destroy.
 *
 * Counts above INT_MAX: MPI-3 takes int counts. A buffer of more than
 * INT_MAX elements (fewer when a test lowers the limit: core/fault.h, in
 * hooks builds only) travels as ONE element of a derived "blob" datatype
 * of the same bytes (contiguous chunks plus a remainder), and reductions
 * on a blob use this backend's own sum ops, which see the whole blob as a
 * flat array. So every size works; nothing is split into several messages. */
zpp_status zpp_comm_mpi_create(const void *mpi_comm, zpp_comm **comm_p);
/* Creates the world NCCL communicator, its intra/inter splits and the
 * reductions' three (red_*) in one go. Called by zpp_topo_create_with_opts with every
 * size/rank field of `topo` already set and the six comms NULL; on failure
 * it must leave each of them NULL or a valid comm (zpp_topo_create_with_opts destroys
 * the non-NULL ones). In a build without NCCL (comm_nccl_none.c) it returns
 * ZPP_ERR_UNSUPPORTED. */
zpp_status zpp_comm_nccl_create_topo(zpp_topo *topo, const zpp_topo_opts *opts);

#endif

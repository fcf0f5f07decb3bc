/* comm/progress.h — who did not arrive: per-host progress counters.
 *
 * When a collective times out, the rank that waited can only say "no peer
 * answered" unless it can see how far its peers got. Each topology
 * therefore keeps a small shared-memory segment per host (one slot per
 * rank of the host, made at setup over MPI's shared-memory split of the
 * world): for every communicator of the topology, each rank publishes how
 * many collectives it has entered on it, and which one it is waiting in
 * right now. A rank whose wait for collective #k of communicator C times
 * out reads its peers' slots: the members of C whose count is below k did
 * not arrive. For each of them it says why, as far as this host can tell:
 * its process is stopped (SIGSTOP, a debugger) or gone (from /proc), or it
 * waits itself in another collective (followed, a few hops, to the rank
 * that holds everyone up), or it is in no collective at all (computing, or
 * stuck outside the communication layer).
 *
 * Plain memory, no MPI call: the reader needs nothing from the stalled
 * rank, which may be stopped, so it works exactly when it is needed.
 * Ranks on other hosts are not visible; they are named as such. The
 * segment is unlinked as soon as every rank of the host has mapped it, so
 * nothing is left in /dev/shm whatever happens to the job; if it cannot be
 * made, timeouts simply name no ranks.
 *
 * Counting is host-side, at the call (enqueue for NCCL): the same sequence
 * on every member of a communicator, because every member makes the same
 * calls in the same order. */
#ifndef ZPP_COMM_PROGRESS_H
#define ZPP_COMM_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

typedef struct zpp_progress zpp_progress;

/* The communicators counted. */
enum {
    ZPP_PROG_WORLD = 0,
    ZPP_PROG_INTRA,
    ZPP_PROG_INTER,
    ZPP_PROG_RED_WORLD, /* NCCL only: the reductions' own communicators */
    ZPP_PROG_RED_INTRA,
    ZPP_PROG_RED_INTER,
    ZPP_PROG_LAUNCH, /* MPI_COMM_WORLD: zpp_comm_agree_world, zpp_comm_max_world */
    ZPP_PROG_SETUP,  /* the topology's setup steps, over its world */
    ZPP_PROG_COMMS
};

/* Where one rank is: collective `seq` (1-based) of communicator `comm`. */
typedef struct zpp_prog_at {
    zpp_progress *p; /* NULL: nothing to say */
    int comm;
    uint64_t seq;
} zpp_prog_at;

/* Collective over `base_comm` (an MPI_Comm of the whole world, errors
 * returned): maps this host's segment. Only a timeout of its own MPI steps
 * (bounded by timeout_s, 0 = forever) fails it; when shared memory cannot
 * be had, *p_p is NULL and it returns ZPP_OK. */
zpp_status zpp__progress_create(const void *base_comm, double timeout_s, zpp_progress **p_p);
/* Ranks per node, once known: who belongs to intra and inter. */
void zpp__progress_set_geometry(zpp_progress *p, int node_size);
/* Local: unmaps. */
void zpp__progress_destroy(zpp_progress *p);

/* The most recent live board of this process (for the launcher world's
 * operations, which have no topology), or NULL. */
zpp_progress *zpp__progress_current(void);

/* Enters the next collective of `comm` and returns where: seq counts per
 * board (per process for ZPP_PROG_LAUNCH, with or without a board). */
zpp_prog_at zpp__progress_enter(zpp_progress *p, int comm);
/* While this rank waits at `at` in operation `op` ("allgather", ...). */
void zpp__progress_wait_begin(const zpp_prog_at *at, const char *op);
void zpp__progress_wait_end(const zpp_prog_at *at);

/* Writes "; rank 2 did not arrive (pid 4242 is stopped: SIGSTOP or a
 * debugger)" (or what else can be seen) for a timeout at `at`; "" when
 * there is no board. */
void zpp__progress_explain(const zpp_prog_at *at, char *out, size_t cap);

/* "world", "intra", ... */
const char *zpp__progress_comm_name(int comm);

#endif

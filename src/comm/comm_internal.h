/* comm/comm_internal.h — what the backends of comm/ share; not for the
 * layers above. */
#ifndef ZPP_COMM_COMM_INTERNAL_H
#define ZPP_COMM_COMM_INTERNAL_H

#include "comm/comm.h"
#include "comm/progress.h"

/* The one fail-together protocol, on the host over an MPI communicator
 * (`mpi_comm` points at an MPI_Comm whose error handler returns):
 *   1. MPI_Allreduce(MIN) of (st != ZPP_OK ? rank : size) finds the lowest
 *      failing rank, or none;
 *   2. that rank broadcasts its status and its zpp_last_error() message;
 *   3. every rank records that message with zpp_error and returns that
 *      status.
 * Both backends use it: the MPI backend over its own communicator, the
 * NCCL backend over the MPI communicator it keeps beside each NCCL one
 * (comm_nccl.c says why). An MPI failure during the agreement itself is
 * ZPP_ERR_COMM, with this rank's own message appended when it had failed.
 *
 * Deadline: both steps are non-blocking MPI calls polled until `timeout_s`
 * (0 = forever); past it, ZPP_ERR_TIMEOUT naming "agree" and the
 * communicator `name`. A local ZPP_ERR_TIMEOUT is returned at once, without
 * agreeing: the peer that stalled cannot answer, and waiting for it again
 * would only add another timeout. */
zpp_status zpp__comm_mpi_agree(const void *mpi_comm, zpp_status st, double timeout_s,
                               const char *name);
/* The same, counted as the next collective of communicator `comm` on the
 * progress board `p` (comm/progress.h; NULL: none), so that a timeout names
 * the ranks that did not arrive. */
zpp_status zpp__comm_mpi_agree_at(const void *mpi_comm, zpp_status st, double timeout_s,
                                  const char *name, zpp_progress *p, int comm);

/* Completes one MPI request (`req` points at an MPI_Request) by polling
 * MPI_Test with short sleeps until `timeout_s` (0 = forever); past it, the
 * request is abandoned inside MPI (a started collective cannot be
 * cancelled) and ZPP_ERR_TIMEOUT says "<op> on the <name> communicator
 * (<bytes> bytes): no peer answered for S s (a rank stalled or died);
 * every rank stops". An MPI error is ZPP_ERR_COMM. */
zpp_status zpp__comm_mpi_poll(void *req, double timeout_s, const char *op, const char *name,
                              size_t bytes);
/* The same for the collective at `at` (comm/progress.h): while it waits
 * the rank's slot says so, and a timeout's message ends with the ranks
 * that did not arrive ("; rank 2 did not arrive (pid 4242 is stopped:
 * ...)"). */
zpp_status zpp__comm_mpi_poll_at(void *req, double timeout_s, const char *op, const char *name,
                                 size_t bytes, const zpp_prog_at *at);

/* Every rank of `mpi_comm` arrives here before `timeout_s` (0 = forever),
 * or ZPP_ERR_TIMEOUT "topology setup (<stage>): ...": a non-blocking
 * barrier in front of a blocking MPI or NCCL setup call (a split, an NCCL
 * init), which has no deadline of its own. Counted on `p` as a setup
 * step. */
zpp_status zpp__comm_mpi_gate(const void *mpi_comm, double timeout_s, const char *stage,
                              zpp_progress *p);

/* The MPI backend's communicator name ("world", "intra", "inter"; "" until
 * set) and deadline, set by zpp_topo_create_with_opts right after
 * zpp_comm_mpi_create. */
void zpp__comm_mpi_configure(zpp_comm *c, const char *name, double timeout_s);
/* Counts the communicator's collectives as `comm` on the progress board
 * `p` (may be NULL). Set by zpp_topo_create_with_opts. */
void zpp__comm_mpi_set_progress(zpp_comm *c, zpp_progress *p, int comm);

#endif

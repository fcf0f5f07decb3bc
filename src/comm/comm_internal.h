/* comm/comm_internal.h — what the backends of comm/ share; not for the
 * layers above. */
#ifndef ZPP_COMM_COMM_INTERNAL_H
#define ZPP_COMM_COMM_INTERNAL_H

#include "comm/comm.h"

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
 * ZPP_ERR_COMM, with this rank's own message appended when it had failed. */
zpp_status zpp__comm_mpi_agree(const void *mpi_comm, zpp_status st);

#endif

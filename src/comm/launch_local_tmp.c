/* comm/launch_local_tmp.c — TEMPORARY: zpp_comm_launch_local until the comm
 * branch brings it in topo.c (drop this file at that merge). */
#include <mpi.h>

#include "comm/comm.h"
#include "core/error.h"

zpp_status zpp_comm_launch_local(int *local_rank_p, int *local_size_p) {
    if (!local_rank_p || !local_size_p)
        return zpp_error(ZPP_ERR_INVALID, "launch local: local_rank_p and local_size_p are required");
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return zpp_error(ZPP_ERR_STATE, "launch local: MPI is not initialised; call MPI_Init first");
    /* The ranks the launcher started on this host share memory. */
    MPI_Comm host;
    int local = 0, size = 0;
    int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
    if (rc != MPI_SUCCESS)
        return zpp_error(ZPP_ERR_COMM, "launch local: MPI shared-memory split failed (%d)", rc);
    rc = MPI_Comm_rank(host, &local);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(host, &size);
    MPI_Comm_free(&host);
    if (rc != MPI_SUCCESS)
        return zpp_error(ZPP_ERR_COMM, "launch local: MPI shared-memory rank failed (%d)", rc);
    *local_rank_p = local;
    *local_size_p = size;
    return ZPP_OK;
}

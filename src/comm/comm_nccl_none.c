/* comm/comm_nccl_none.c — the NCCL backend in a build without CUDA/NCCL:
 * CMake compiles this file instead of comm_nccl.c, so the choice of backend
 * is made by the files built, not by #ifdef. */
#include "comm/comm.h"
#include "core/error.h"

zpp_status zpp_comm_nccl_create_topo(zpp_topo *topo, const zpp_topo_opts *opts) {
    (void)topo;
    (void)opts;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "nccl setup: this build has no NCCL; rebuild with nvcc and NCCL installed, "
                     "or use the MPI backend (--device cpu)");
}

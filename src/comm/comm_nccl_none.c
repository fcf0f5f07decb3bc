/* comm/comm_nccl_none.c — the NCCL backend in a build without CUDA and NCCL
 * (CMake compiles this file instead of comm_nccl.c). */
#include "comm/comm.h"
#include "core/error.h"

zpp_status zpp_comm_nccl_create_topo(zpp_topo *topo, const zpp_topo_opts *opts) {
    (void)topo;
    (void)opts;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "topology: the NCCL backend needs a build with CUDA and NCCL; rebuild "
                     "with nvcc and NCCL available, or use the MPI backend");
}

const char *zpp_comm_nccl_build(void) { return NULL; }

# NCCL backend tests: 2 ranks, on 2 GPUs or sharing 1 (label gpu: `ctest -L gpu`).
# Each test function (a ZPP_TEST_GPU case of test_comm_nccl.c) runs as its
# own process: NCCL reads NCCL_HOSTID once per process, so the emulated-nodes
# case needs a fresh one. With fewer GPUs than ranks each rank is its own
# emulated host (test_comm_nccl.c); the same-host case then skips (exit 77).
# test_nccl_emulated_nodes_of_two runs at 4 ranks too: 2 emulated nodes of 2,
# on one GPU each node's ranks sharing it (comm/hostid.h).
if(ZPP_HAVE_CUDA)
  zpp_test(test_comm_nccl
           SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_comm_nccl.c
                   ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c
           NP 2 CASES_FROM_SOURCE TIMEOUT 300)
  zpp_test(test_comm_nccl
           SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_comm_nccl.c
                   ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c
           NP 4 CASE test_nccl_emulated_nodes_of_two LABELS gpu TIMEOUT 600)
endif()

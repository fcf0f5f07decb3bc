# NCCL backend tests: 2 ranks, one NVIDIA GPU each (label gpu: `ctest -L gpu`).
# Each test function (a ZPP_TEST_GPU case of test_comm_nccl.c) runs as its
# own process: NCCL reads NCCL_HOSTID once per process, so the emulated-nodes
# case needs a fresh one.
if(ZPP_HAVE_CUDA)
  zpp_test(test_comm_nccl
           SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_comm_nccl.c
                   ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c
           NP 2 CASES_FROM_SOURCE TIMEOUT 300)
endif()

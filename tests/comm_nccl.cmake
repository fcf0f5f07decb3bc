# NCCL backend tests: 2 ranks, one NVIDIA GPU each (label gpu: `ctest -L gpu`).
# Each test function runs as its own process (CASE): NCCL reads NCCL_HOSTID
# once per process, so the emulated-nodes case needs a fresh one.
if(ZPP_HAVE_CUDA)
  foreach(case test_nccl_one_node test_nccl_nodes_of_one_default_stream
               test_nccl_invalid_arguments test_nccl_hostid_fixed_per_process
               test_nccl_timeout_reports_instead_of_hanging test_nccl_emulated_nodes)
    zpp_test(test_comm_nccl
             SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_comm_nccl.c
                     ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c
             NP 2 CASE ${case} LABELS gpu TIMEOUT 300)
  endforeach()
endif()

# NCCL backend tests: 2 ranks, on 2 GPUs or sharing 1 (label gpu: `ctest -L gpu`).
# Each test function runs as its own process (CASE): NCCL reads NCCL_HOSTID
# once per process, so the emulated-nodes case needs a fresh one. With fewer
# GPUs than ranks each rank is its own emulated host (test_comm_nccl.c); the
# same-host case then prints "SKIP: needs 2 GPUs" and ctest counts it skipped.
if(ZPP_HAVE_CUDA)
  foreach(case test_nccl_one_node test_nccl_nodes_of_one
               test_nccl_invalid_arguments test_nccl_hostid_fixed_per_process
               test_nccl_timeout_reports_instead_of_hanging test_nccl_emulated_nodes)
    zpp_test(test_comm_nccl
             SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_comm_nccl.c
                     ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c
             NP 2 CASE ${case} LABELS gpu TIMEOUT 300)
    set_tests_properties(test_comm_nccl.${case}_np2 PROPERTIES
                         SKIP_REGULAR_EXPRESSION "SKIP: needs 2 GPUs")
  endforeach()
endif()

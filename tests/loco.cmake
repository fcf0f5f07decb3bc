# qgZ error feedback (LoCo): the collective against an in-process reference
# of the whole world, bit for bit, and the accumulated error of a repeated
# gradient stream (bounded with feedback, linear without), for every node
# size of 1, 2 and 4 ranks; the CUDA kernels against the CPU (gpu label,
# one rank).
set(zpp_loco_src ${CMAKE_CURRENT_SOURCE_DIR}/test_loco.c ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c)
zpp_test(test_loco SOURCES ${zpp_loco_src} NP 1 CASES_FROM_SOURCE LABELS collectives
         TIMEOUT 600)
foreach(np 2 4)
  foreach(case test_qgz_ef_matches_reference test_qgz_ef_accumulated_error_bounded)
    zpp_test(test_loco SOURCES ${zpp_loco_src} NP ${np} CASE ${case} LABELS collectives
             TIMEOUT 600)
  endforeach()
endforeach()

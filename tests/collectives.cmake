# Collectives: ZeRO-3 baseline, qwZ, hpZ, qgZ and their volume accounting,
# on the MPI backend, for every node size that divides each world size.
foreach(np 1 2 3 4 6 8)
  zpp_test(test_collectives
           SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_collectives.c
                   ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c
           NP ${np} TIMEOUT 300 LABELS collectives)
endforeach()

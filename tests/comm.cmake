# comm/: topology and the MPI backend. The same program at several world
# sizes; at each it tests every node size that divides the world.
set(ZPP_COMM_TEST_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_comm.c
                          ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c)
zpp_test(test_comm SOURCES ${ZPP_COMM_TEST_SOURCES} NP 1 TIMEOUT 120)
zpp_test(test_comm SOURCES ${ZPP_COMM_TEST_SOURCES} NP 2 TIMEOUT 120)
zpp_test(test_comm SOURCES ${ZPP_COMM_TEST_SOURCES} NP 3 TIMEOUT 120)
zpp_test(test_comm SOURCES ${ZPP_COMM_TEST_SOURCES} NP 4 TIMEOUT 180)
zpp_test(test_comm SOURCES ${ZPP_COMM_TEST_SOURCES} NP 6 TIMEOUT 180)
zpp_test(test_comm SOURCES ${ZPP_COMM_TEST_SOURCES} NP 8 TIMEOUT 240)
# The NCCL host identities of emulated nodes (comm/hostid.h): pure, no MPI.
zpp_test(test_hostid SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hostid.c CASES_FROM_SOURCE)

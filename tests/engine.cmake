zpp_test(test_engine SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 4)
zpp_test(test_engine_eval SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_eval.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 4)

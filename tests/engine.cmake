zpp_test(test_engine SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 4)
# The engine on one rank (nothing reduced: gradients added in place).
zpp_test(test_engine_world1 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_world1.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 1)
# Evaluation gathers the exact weights, whatever the training gathers.
zpp_test(test_engine_eval SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_eval.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 4)
# Biases and LayerNorm parameters travel at full precision under qwZ and qgZ.
zpp_test(test_engine_vectors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_vectors.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 4)

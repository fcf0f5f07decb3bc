# Activation checkpointing (zpp_gpt2_config.recompute): the same bits with
# and without it, the CPU model alone and through the engine on 1 and 2
# ranks (ZeRO-3, ZeRO++), and the memory it saves; the CUDA model's case is
# labelled gpu (ctest -L gpu).
zpp_test(test_recompute SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_recompute.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 1 CASES_FROM_SOURCE TIMEOUT 120)
zpp_test(test_recompute SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_recompute.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 2 CASE test_engine_same_bits TIMEOUT 120)

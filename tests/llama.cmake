# The Llama family's CPU model (src/model/llama*.c) against a float64
# reference written in the test, and its factory's refusals.
zpp_test(test_llama SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llama.c TIMEOUT 120)
set_property(TEST test_llama APPEND PROPERTY ENVIRONMENT OPENBLAS_NUM_THREADS=1)
# Through the engine (ZeRO-3, fp32) on 1 and on 2 ranks: the losses of
# training the whole model on one rank without it.
foreach(np 1 2)
  zpp_test(test_llama_engine SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llama_engine.c
           ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP ${np} TIMEOUT 120)
  set_property(TEST test_llama_engine_np${np} APPEND PROPERTY ENVIRONMENT OPENBLAS_NUM_THREADS=1)
endforeach()

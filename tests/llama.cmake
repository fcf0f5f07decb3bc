# The Llama family's CPU model (src/model/llama*.c) against a float64
# reference written in the test, and its factory's refusals.
zpp_test(test_llama SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llama.c TIMEOUT 120)
set_property(TEST test_llama APPEND PROPERTY ENVIRONMENT OPENBLAS_NUM_THREADS=1)

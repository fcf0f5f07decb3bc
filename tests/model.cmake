# Model layer: the CPU reference GPT-2.
zpp_test(test_gpt2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt2.c TIMEOUT 120)
# sgemm results are bit-reproducible for a fixed OpenBLAS thread count; the
# tests (like the trainer) run OpenBLAS on one thread.
set_property(TEST test_gpt2 APPEND PROPERTY ENVIRONMENT OPENBLAS_NUM_THREADS=1)

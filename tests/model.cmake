# Model layer: the CPU reference GPT-2, and the model families by name.
zpp_test(test_gpt2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt2.c TIMEOUT 120)
# sgemm results are bit-reproducible for a fixed OpenBLAS thread count; the
# tests (like the trainer) run OpenBLAS on one thread.
set_property(TEST test_gpt2 APPEND PROPERTY ENVIRONMENT OPENBLAS_NUM_THREADS=1)
# Model families by name (src/model/family.c), on the CPU model.
zpp_test(test_model_family SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_model_family.c TIMEOUT 60)
set_property(TEST test_model_family APPEND PROPERTY ENVIRONMENT OPENBLAS_NUM_THREADS=1)

# Sampling (src/train/sample.c): the draw against its definition, the
# generation loop on a toy model, and `zeropp sample` / `zeropp train
# --sample-every` end to end from a 2-rank CPU run (the command cases launch
# mpirun; one at a time on CI's 2 cores). The ZPP_TEST_GPU case samples on a
# GPU: label gpu.
zpp_test(test_sample SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_sample.c CASES_FROM_SOURCE
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE}
         LABELS train TIMEOUT 300 GPU_TIMEOUT 120 PROCESSORS 2)

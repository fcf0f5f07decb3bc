# What `zeropp train` prints for a person (docs/logs.md): the header, TFLOP/s
# and MFU, the save lines, the summary, the progress bar (on a pty the test
# opens), and the FLOP count they rest on. One ctest test per case; the runs
# take up to 4 ranks on CI's 2 cores.
zpp_test(test_train_logs SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_train_logs.c CASES_FROM_SOURCE
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE}
         LABELS train tools TIMEOUT 600 PROCESSORS 2)

# `zeropp train` end to end under mpirun (the test program launches it).
# One ctest test per case of test_train.c's ZPP_TESTS list; the
# ZPP_TEST_GPU case (the same trainer on 2 GPUs against the CPU) is labelled
# gpu: `ctest -L gpu`.
set(zpp_train_env ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE})
# each case launches up to 4 ranks on CI's 2 cores: run them one at a time
zpp_test(test_train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_train.c CASES_FROM_SOURCE
         ENV ${zpp_train_env} LABELS train TIMEOUT 900 GPU_TIMEOUT 300 PROCESSORS 2)

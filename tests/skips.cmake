# Tests cannot pass by skipping (tests/test_skip_check.sh): the training
# text is in the repository, and scripts/check-skips.sh, run by
# scripts/test.sh after the CPU suite, fails a run in which a CPU test
# skipped and passes one in which only gpu-labelled tests did.
add_test(NAME test_skip_check
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_skip_check.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CTEST_COMMAND})
set_tests_properties(test_skip_check PROPERTIES LABELS tools TIMEOUT 60)

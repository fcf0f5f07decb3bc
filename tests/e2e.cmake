# Issue 28's acceptance run (tests/test_e2e.sh): Tiny Shakespeare through
# `zeropp tokenize` with a small BPE tokenizer, 300 steps on 4 CPU ranks with
# checkpoints, a resume to 400 without --config, `zeropp sample` as text and
# `zeropp eval`: the README's "Train on your own text", command for command.
# 4 ranks on CI's 2 cores: about a minute, it runs alone (PROCESSORS 2).
add_test(NAME test_e2e
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_e2e.sh $<TARGET_FILE:zeropp_cli>
                 ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/test_e2e)
set_tests_properties(test_e2e PROPERTIES LABELS "e2e;mpi" TIMEOUT 900 PROCESSORS 2
                     ENVIRONMENT "${ZPP_TEST_ENV};OMP_NUM_THREADS=1")

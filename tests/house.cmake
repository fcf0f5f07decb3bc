# The tree's shape (issue 32): no function in src/ or tools/ over 120 lines
# (scripts/check-function-length.sh), and the counter itself catches one
# that is over and passes one that is not (tests/test_function_length.sh).
add_test(NAME test_function_length
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_function_length.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_function_length PROPERTIES LABELS tools TIMEOUT 60)

# Every environment variable is read through core/env.h's table and
# nowhere else, and `zeropp help env` lists each of them
# (tests/test_env_table.sh).
add_test(NAME test_env_table
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_env_table.sh ${CMAKE_SOURCE_DIR}
                 $<TARGET_FILE:zeropp_cli>)
set_tests_properties(test_env_table PROPERTIES LABELS tools TIMEOUT 60)

# Preemption (issue 29): SIGTERM, SIGINT and SIGUSR1 stop a 4-rank run after
# its step, with a checkpoint that resumes bit for bit (tests/test_preempt.sh).
add_test(NAME test_preempt
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_preempt.sh $<TARGET_FILE:zeropp_cli>
                 ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/test_preempt)
set_tests_properties(test_preempt PROPERTIES LABELS "train;mpi" TIMEOUT 600 PROCESSORS 2
                     ENVIRONMENT "${ZPP_TEST_ENV};OMP_NUM_THREADS=1")

# The trainer and the tools are clients of the public API (issue 32): no
# include of engine/engine.h in src/train/ or tools/, and no call of a
# zpp_engine_* function that include/zeropp.h (or the option table,
# src/engine/options.h) does not declare (tests/test_engine_api_only.sh).
add_test(NAME test_engine_api_only
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_api_only.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_engine_api_only PROPERTIES LABELS tools TIMEOUT 60)

# The benchmark scripts parse, and bench/train/report.sh computes the race's
# ratios and their targets from a made-up race.tsv (tests/test_bench_scripts.sh).
add_test(NAME test_bench_scripts
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_scripts.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_bench_scripts PROPERTIES LABELS tools TIMEOUT 60)

# bench/gpu/trace/timeline.c, which splits a traced step into busy time and
# the gaps where the device waited for the host or for itself, gives the
# totals a made-up trace was built with (tests/test_timeline.sh).
add_test(NAME test_timeline
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_timeline.sh $<TARGET_FILE:zpp_timeline>)
set_tests_properties(test_timeline PROPERTIES LABELS tools TIMEOUT 60)

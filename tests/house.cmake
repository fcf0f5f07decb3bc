# The tree's shape (issue 32): no function in src/ or tools/ over 120 lines
# (scripts/check-function-length.sh), and the counter itself catches one
# that is over and passes one that is not (tests/test_function_length.sh).
add_test(NAME test_function_length
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_function_length.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_function_length PROPERTIES LABELS tools TIMEOUT 60)

# The trainer and the tools are clients of the public API (issue 32): no
# include of engine/engine.h in src/train/ or tools/, and no call of a
# zpp_engine_* function that include/zeropp.h (or the option table,
# src/engine/options.h) does not declare (tests/test_engine_api_only.sh).
add_test(NAME test_engine_api_only
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_engine_api_only.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_engine_api_only PROPERTIES LABELS tools TIMEOUT 60)

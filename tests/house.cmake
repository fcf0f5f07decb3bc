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

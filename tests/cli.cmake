# The zeropp command's helpers (tools/cli_util.c), unit-tested without the
# command: the count parser every subcommand uses.
zpp_test(test_cli_util SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cli_util.c
                               ${CMAKE_SOURCE_DIR}/tools/cli_util.c
         LABELS tools TIMEOUT 60)

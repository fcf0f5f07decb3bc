# The zeropp command's bench and plan subcommands, end to end.
zpp_test(test_tools SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_tools.c
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE} OMP_NUM_THREADS=1
         LABELS tools)
set_tests_properties(test_tools PROPERTIES PROCESSORS 2)
# `zeropp plot`: a PNG of the asked size from generated metrics; bad input fails
# cleanly. Exit 77 (no gnuplot here) counts as skipped.
zpp_test(test_plot SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plot.c
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> LABELS tools)
set_tests_properties(test_plot PROPERTIES SKIP_RETURN_CODE 77)

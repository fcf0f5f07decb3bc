# The zeropp command's bench and plan subcommands, end to end. Each case is
# its own ctest test, so the --chart case (gnuplot) can skip alone.
zpp_test(test_tools SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_tools.c CASES_FROM_SOURCE
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE} OMP_NUM_THREADS=1
         LABELS tools PROCESSORS 2)
# `zeropp plot`: a PNG of the asked size from generated metrics; bad input fails
# cleanly. The drawing case skips (exit 77) where gnuplot is not installed.
zpp_test(test_plot SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plot.c CASES_FROM_SOURCE
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> LABELS tools)

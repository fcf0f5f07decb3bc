zpp_test(test_core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_core.c)
# The normal sample that is the same bits on host and device (core/random.h):
# log and cos(2 pi u) against long-double libm, Box-Muller's moments.
zpp_test(test_normal SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_normal.c CASES_FROM_SOURCE
         TIMEOUT 120)

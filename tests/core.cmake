zpp_test(test_core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_core.c)
# The normal sample that is the same bits on host and device (core/random.h):
# log and cos(2 pi u) against long-double libm, Box-Muller's moments.
zpp_test(test_normal SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_normal.c CASES_FROM_SOURCE
         TIMEOUT 120)
# The checkpoint files' checksum (core/checksum.h) against a reference from
# its definition; any split of the stream; every one-byte change seen.
zpp_test(test_checksum SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_checksum.c CASES_FROM_SOURCE)

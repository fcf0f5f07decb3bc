zpp_test(test_core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_core.c)

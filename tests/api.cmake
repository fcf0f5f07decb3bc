# The public training API (include/zeropp.h) as a user calls it: a linear
# model of the test's own against AdamW's first step in closed form, every
# mode training, bad descriptions and configs refused on every rank, every
# engine option reachable from the public config (its table's defaults and
# ranges, LoCo's buffers, the counters), the ranks' placement coming
# from MPI rather than a launcher's variables, and a built-in decoder (Llama,
# GPT-2) picked by its config's "model" section and trained.
zpp_test(test_api SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_api.c
         ${CMAKE_CURRENT_SOURCE_DIR}/mpi_main.c NP 4 CASES_FROM_SOURCE LABELS api)

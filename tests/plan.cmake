# The step cost model (src/plan/cost.c, DESIGN.md §11): pure arithmetic, no
# MPI, no device; consistency properties and the published ZeRO++ points.
zpp_test(test_plan SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plan.c CASES_FROM_SOURCE
         LABELS plan TIMEOUT 60)

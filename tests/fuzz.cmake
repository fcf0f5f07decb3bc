# The fuzz targets' corpora, replayed on every CI run (gcc, no libFuzzer):
# fuzz/fuzz_<t>.c's LLVMFuzzerTestOneInput over each file of
# fuzz/corpus/<t>/ through fuzz/replay_main.c. An input that once crashed is
# kept in the corpus, so this catches its return. The fuzzing itself (clang,
# libFuzzer): scripts/fuzz.sh MINUTES.
foreach(t config data manifest bpe)
  add_executable(fuzz_replay_${t} ${CMAKE_SOURCE_DIR}/fuzz/fuzz_${t}.c
                                  ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
  target_include_directories(fuzz_replay_${t} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(fuzz_replay_${t} PRIVATE zeropp)
  add_test(NAME fuzz_replay_${t} COMMAND fuzz_replay_${t} ${CMAKE_SOURCE_DIR}/fuzz/corpus/${t})
  set_tests_properties(fuzz_replay_${t} PROPERTIES ENVIRONMENT "${ZPP_TEST_ENV}" TIMEOUT 120
                       LABELS fuzz)
endforeach()

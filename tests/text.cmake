# Text to tokens: GPT-2's byte-level BPE (src/train/bpe.c, bpe_gpt2.c), the
# llm.c token file writer (tokfile.c) and `zeropp tokenize`.
zpp_test(test_bpe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bpe.c CASES_FROM_SOURCE TIMEOUT 120
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> LABELS text)
# GPT-2's real tokenizer files, when ZPP_GPT2_TOKENIZER_DIR names a folder
# holding them (docs/data.md); otherwise it exits 77 and ctest reports it
# skipped. Labelled optional: CI has no such files.
zpp_test(test_bpe_gpt2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bpe_gpt2.c TIMEOUT 60
         LABELS optional)
set_tests_properties(test_bpe_gpt2 PROPERTIES SKIP_RETURN_CODE 77)

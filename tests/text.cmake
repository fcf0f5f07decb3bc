# Text to tokens: GPT-2's byte-level BPE (src/train/bpe.c, bpe_gpt2.c), the
# llm.c token file writer (tokfile.c) and `zeropp tokenize`.
zpp_test(test_bpe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bpe.c CASES_FROM_SOURCE TIMEOUT 120
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> LABELS text)

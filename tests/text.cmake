# Text to tokens: GPT-2's byte-level BPE (src/train/bpe.c, bpe_gpt2.c), the
# llm.c token file writer (tokfile.c) and `zeropp tokenize`.
zpp_test(test_bpe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bpe.c CASES_FROM_SOURCE TIMEOUT 120
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> LABELS text)
# GPT-2's real tokenizer files (docs/data.md): registered only when
# ZPP_GPT2_TOKENIZER_DIR names a folder holding vocab.json and merges.txt as
# CMake runs, so the suite never counts a run without them as a pass or a
# skip (CI has no such files; the test above checks the same code on
# hand-made ones).
if(DEFINED ENV{ZPP_GPT2_TOKENIZER_DIR})
  zpp_test(test_bpe_gpt2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bpe_gpt2.c TIMEOUT 60
           LABELS text ENV ZPP_GPT2_TOKENIZER_DIR=$ENV{ZPP_GPT2_TOKENIZER_DIR})
endif()
# Hugging Face tokenizer.json, uint32 token files (version 2) and
# `zeropp tokenize --tokenizer`.
zpp_test(test_bpe_hf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bpe_hf.c CASES_FROM_SOURCE
         TIMEOUT 120 ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> LABELS text)
# Unicode NFC (src/train/nfc.c), the normalizer of Qwen2's tokenizer.json.
zpp_test(test_nfc SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_nfc.c CASES_FROM_SOURCE TIMEOUT 60
         LABELS text)

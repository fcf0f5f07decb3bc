# Hugging Face checkpoints (issue 31): safetensors files, single and sharded
# with their index (src/train/safetensors.c), and Llama-family config.json
# (src/train/hf_config.c).
zpp_test(test_safetensors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_safetensors.c
         CASES_FROM_SOURCE TIMEOUT 60 LABELS train_io)
zpp_test(test_hf_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_config.c CASES_FROM_SOURCE
         TIMEOUT 60 LABELS train_io)
# `zeropp train --init-from DIR` and `zeropp export --format hf` (src/train/hf_model.c):
# byte-exact round trips (bf16, fp32, single, sharded), 1 and 4 ranks alike, another
# tensor order, the exported headers against the format's rules, a llama checkpoint
# on other rank counts, the refusals, and what an export copies besides the weights
# (config.json and the tokenizer files of the folder imported from, or of the data's
# tokenizer). Cases launch up to 4 ranks on CI's 2 cores.
zpp_test(test_hf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf.c CASES_FROM_SOURCE
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE}
         LABELS train_io TIMEOUT 300 PROCESSORS 2)

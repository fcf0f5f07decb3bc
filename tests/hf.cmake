# Hugging Face checkpoints (issue 31): safetensors files, single and sharded
# with their index (src/train/safetensors.c), and Llama-family config.json
# (src/train/hf_config.c).
zpp_test(test_safetensors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_safetensors.c
         CASES_FROM_SOURCE TIMEOUT 60 LABELS train_io)
zpp_test(test_hf_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_config.c CASES_FROM_SOURCE
         TIMEOUT 60 LABELS train_io)

# The Llama against a float64 PyTorch reference (tests/torch/): fp32 ZeRO-3
# on 1 and 4 CPU ranks, from a random Hugging Face folder that
# llama_hf_helper writes, within 1e-5 of the reference for 10 steps.
# PyTorch is not in CI: the test is labelled torch (scripts/test.sh leaves
# the label out, as it leaves gpu) and skips (77) where `import torch` fails;
# run it with `ctest -L torch`.
add_executable(llama_hf_helper ${CMAKE_CURRENT_SOURCE_DIR}/llama_hf_helper.c)
target_include_directories(llama_hf_helper PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(llama_hf_helper PRIVATE zeropp MPI::MPI_C)
add_test(NAME test_llama_torch_parity
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/torch/llama_parity.sh
                 $<TARGET_FILE:zeropp_cli> $<TARGET_FILE:llama_hf_helper> ${MPIEXEC_EXECUTABLE})
set_tests_properties(test_llama_torch_parity PROPERTIES LABELS torch TIMEOUT 600 PROCESSORS 2
                     ENVIRONMENT "${ZPP_TEST_ENV}")

# The same reference against the CUDA Llama (`--device gpu`): fp32 ZeRO-3 on
# 1 rank and on 2 ranks sharing the GPU as 2 emulated nodes within 1e-5,
# bf16 on 1 rank within 1e-3, ZeRO++ (qwZ + qgZ, 2 emulated nodes, fp32)
# step 1 within 1e-3 and every step within 2^-8 (llama_parity.sh says why).
# Labelled gpu and torch; skips (77) without PyTorch or a GPU.
if(ZPP_HAVE_CUDA)
  add_test(NAME test_llama_torch_parity_gpu
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/torch/llama_parity.sh
                   $<TARGET_FILE:zeropp_cli> $<TARGET_FILE:llama_hf_helper>
                   ${MPIEXEC_EXECUTABLE} gpu)
  set_tests_properties(test_llama_torch_parity_gpu PROPERTIES LABELS "gpu;torch" TIMEOUT 600
                       PROCESSORS 2 ENVIRONMENT "${ZPP_TEST_ENV}")
endif()

# What `zeropp export --format hf` writes, loaded by Hugging Face transformers
# itself: model and tokenizer, a plain Llama (fp32, one file), one with Llama
# 3's rope_scaling (bf16, sharded), a Qwen2, a Mistral, and a GPT-2 trained from
# scratch (GPT2LMHeadModel, bf16 shards, its vocab.json and merges.txt); transformers' loss
# on each export within 1e-5 of `zeropp eval --init-from` on it, its
# tokenizer's ids those of `zeropp tokenize`, `zeropp sample --temperature 0`
# on it transformers' argmax. Labelled torch; skips (77) without transformers
# and PyTorch.
add_test(NAME test_hf_transformers
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/torch/hf_transformers.sh
                 $<TARGET_FILE:zeropp_cli> $<TARGET_FILE:llama_hf_helper>
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/tinyshakespeare.txt)
set_tests_properties(test_hf_transformers PROPERTIES LABELS torch TIMEOUT 600 PROCESSORS 2
                     ENVIRONMENT "${ZPP_TEST_ENV}")

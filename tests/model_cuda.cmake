# Model layer, CUDA: the CUDA GPT-2 (src/model/gpt2_cuda.cu) against the CPU
# reference (same units, init, batch; losses and every gradient compared).
# Needs an NVIDIA GPU: label gpu (ctest -L gpu).
if(ZPP_HAVE_CUDA)
  zpp_test(test_gpt2_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt2_cuda.c
           LABELS gpu TIMEOUT 300 ENV OPENBLAS_NUM_THREADS=1)
  # The attention of GPUs below compute capability 8.0 (the GEMM path), on
  # whatever GPU runs the tests (docs/gpus.md, "Attention"); also a case of
  # the whole program above.
  zpp_test(test_gpt2_cuda CASE test_attention_gemm_matches_cpu LABELS gpu TIMEOUT 300
           ENV OPENBLAS_NUM_THREADS=1 ZPP_ATTENTION=gemm)
endif()

# The fused causal attention (src/model/attention_cuda.cu), forward and
# backward, against a double-precision reference with derived error bounds;
# determinism, refusals, and timings (printed). Each ZPP_TEST_GPU case of
# the source is its own ctest test, labelled gpu.
if(ZPP_HAVE_CUDA)
  zpp_test(test_attention_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_attention_cuda.c
           CASES_FROM_SOURCE TIMEOUT 600)
endif()

# The cuDNN attention (src/model/attention_cudnn.c, cuDNN's fused engines
# through its backend API) against our fused kernels and a double-precision
# reference, bitwise determinism, refusals, and both timed (printed). Only
# in a build with cuDNN; ZPP_CUDNN_DEBUG=1 prints cuDNN's trace.
if(ZPP_HAVE_CUDNN)
  zpp_test(test_attention_cudnn SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_attention_cudnn.c
           CASES_FROM_SOURCE TIMEOUT 900)
endif()

# Initial weights drawn on the GPU (init_params_device of gpt2_cuda.cu)
# against the host's init_params, bit for bit: every unit, every rank's
# shard, random slices; and the doubles of the normal sample under them
# (core/random.h, evaluated by normal_cuda.cu's kernel). Each ZPP_TEST_GPU
# case is its own test, labelled gpu.
if(ZPP_HAVE_CUDA)
  zpp_test(test_gpt2_init_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt2_init_cuda.c
           ${CMAKE_CURRENT_SOURCE_DIR}/normal_cuda.cu CASES_FROM_SOURCE TIMEOUT 300)
endif()

# The Llama family's own kernels (src/model/llama_kernels_cuda.cu: RMSNorm,
# RoPE, SwiGLU, forward and backward) in fp32, bf16 and fp16 against float64
# references with derived error bounds; backward bit-identical on repeat;
# refusals. Each ZPP_TEST_GPU case is its own test, labelled gpu.
if(ZPP_HAVE_CUDA)
  zpp_test(test_llama_kernels_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llama_kernels_cuda.c
           CASES_FROM_SOURCE TIMEOUT 300)
endif()

# The CUDA Llama (src/model/llama_cuda.cu) against the CPU reference: loss
# and every gradient within bounds derived from each dtype's rounding (bf16
# fused and GEMM attention, fp16 and fp32 on the GEMM path; GQA 4:1, 2:1 and
# 1:1, head dims 64, 128 and 48, biases, tied and untied heads); same bits
# on repeat and with checkpointing on both paths; the initial weights drawn
# on the GPU; ZPP_ATTENTION's paths and refusals. Each ZPP_TEST_GPU case is
# its own test, labelled gpu.
if(ZPP_HAVE_CUDA)
  zpp_test(test_llama_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llama_cuda.c
           CASES_FROM_SOURCE TIMEOUT 300 ENV OPENBLAS_NUM_THREADS=1)
endif()

# The products with GPT-2's GELU in cuBLASLt's epilogue (model/cuda_ops.h),
# forward and backward, against a double-precision reference with derived
# bounds; that the epilogue computes the tanh form, not erf. Label gpu.
if(ZPP_HAVE_CUDA)
  zpp_test(test_cuda_ops SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cuda_ops.c CASES_FROM_SOURCE
           TIMEOUT 300)
endif()

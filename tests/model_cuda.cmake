# Model layer, CUDA: the CUDA GPT-2 (src/model/gpt2_cuda.cu) against the CPU
# reference (same units, init, batch; losses and every gradient compared).
# Needs an NVIDIA GPU: label gpu (ctest -L gpu).
if(ZPP_HAVE_CUDA)
  zpp_test(test_gpt2_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt2_cuda.c
           LABELS gpu TIMEOUT 300 ENV OPENBLAS_NUM_THREADS=1)
endif()

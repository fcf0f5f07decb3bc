# Block quantization, CUDA kernels (src/quant/quant_cuda.cu) against the CPU
# reference, byte for byte. Needs an NVIDIA GPU: label gpu (ctest -L gpu).
if(ZPP_HAVE_CUDA)
  zpp_test(test_quant_cuda SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_quant_cuda.c
           LABELS gpu TIMEOUT 900)
endif()

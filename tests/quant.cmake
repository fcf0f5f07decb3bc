# Block quantization, CPU reference (src/quant/quant.c and quant_kernels.h on every CPU
# instruction set this machine has, and through the host device).
zpp_test(test_quant SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_quant.c TIMEOUT 300)

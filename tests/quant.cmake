# Block quantization, CPU reference (src/quant/quant.c, quant_exec.c host path).
zpp_test(test_quant SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_quant.c TIMEOUT 300)

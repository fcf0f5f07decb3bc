/* quant/quant_isa_generic.c — the quantization loops for the build's
 * baseline CPU (SSE2 on x86-64; -march=native with ZPP_NATIVE). */
#define ZPP_QUANT_KERNELS_TABLE zpp_quant_kernels_generic
#include "quant/quant_kernels.h"

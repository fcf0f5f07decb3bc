/* quant/quant_isa_avx512.c — the quantization loops for x86-64-v4 CPUs
 * (AVX-512 F/BW/VL/DQ/CD; chosen at run time, core/cpu.h). */
#include "core/cpu.h"

#if ZPP_CPU_X86_PATHS
/* FMA is left out on purpose: a fused a*b+c rounds once where the generic
 * copy rounds twice. -ffp-contract=off forbids the fusion already; without
 * FMA a build that contracts (-std=gnu11, -ffp-contract=fast) cannot
 * either. */
#pragma GCC target("avx,avx2,bmi,bmi2,f16c,lzcnt,movbe,popcnt,sse4.1,sse4.2,ssse3", \
                   "avx512f,avx512bw,avx512vl,avx512dq,avx512cd")
#define ZPP_QUANT_KERNELS_TABLE zpp_quant_kernels_avx512
#include "quant/quant_kernels.h"
#else
typedef int zpp_quant_isa_avx512_unused; /* ISO C: no empty translation unit */
#endif

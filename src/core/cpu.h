/* core/cpu.h — which instruction set the CPU kernels run with.
 *
 * The hot CPU loops (quant/quant_kernels.h: quantization, the qgZ sums and
 * reductions, dtype conversion) are one C source compiled several times,
 * once per instruction set, each copy under `#pragma GCC target(...)`: the
 * baseline of the build ("generic": SSE2 on x86-64, or whatever -march
 * says), AVX2 (x86-64-v3 less FMA: AVX2, BMI1/2, F16C, ...) and AVX-512
 * (x86-64-v4: F, BW, VL, DQ, CD). At run time the best one the CPU and the
 * OS support is chosen, once. Every copy computes the same bits: no
 * operation's rounding depends on the ISA (each fp32 operation is one IEEE
 * rounding; the build passes -ffp-contract=off, so the compiler never fuses
 * a*b+c into an FMA, which would round once instead of twice). Only the
 * payload of a NaN made from two NaNs may differ (quant_kernels.h says why).
 *
 * ZPP_CPU_ISA=generic|avx2|avx512|auto in the environment, read once, caps
 * the choice (a request the CPU cannot run falls back to the best below
 * it; an unknown word means auto). `zeropp bench quant` prints the ISA in
 * use. Tests switch paths with zpp_cpu_isa_set. */
#ifndef ZPP_CORE_CPU_H
#define ZPP_CORE_CPU_H

#include "zeropp.h"

/* The ISA-specific copies are compiled where GCC's target pragma and
 * __builtin_cpu_supports exist (x86-64 with GCC); elsewhere only generic. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZPP_CPU_X86_PATHS 1
#else
#define ZPP_CPU_X86_PATHS 0
#endif

typedef enum zpp_cpu_isa {
    ZPP_CPU_GENERIC = 0,
    ZPP_CPU_AVX2 = 1,
    ZPP_CPU_AVX512 = 2,
} zpp_cpu_isa;
#define ZPP_CPU_ISA_COUNT 3

/* "generic", "avx2", "avx512". */
const char *zpp_cpu_isa_name(zpp_cpu_isa isa);
/* 1 if this CPU (and OS: the register state is enabled) can run the path
 * and this build compiled it. Generic always. */
int zpp_cpu_isa_supported(zpp_cpu_isa isa);
/* The path the kernels use now: on first use, the best supported one,
 * capped by ZPP_CPU_ISA. Cheap (one relaxed atomic load after the first). */
zpp_cpu_isa zpp_cpu_isa_active(void);
/* Switches every dispatched kernel to `isa` (tests, benchmarks). Fails
 * with ZPP_ERR_UNSUPPORTED where zpp_cpu_isa_supported says no. Not meant
 * to race with running kernels (each call reads the choice once). */
zpp_status zpp_cpu_isa_set(zpp_cpu_isa isa);

#endif

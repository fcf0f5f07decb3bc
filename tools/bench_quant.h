/* tools/bench_quant.h — the arguments of `zeropp bench quant`, shared by the
 * CPU bench (bench_quant.c) and the GPU bench (bench_quant_gpu.c, on the device
 * API). */
#ifndef ZPP_TOOLS_BENCH_QUANT_H
#define ZPP_TOOLS_BENCH_QUANT_H

#include <stddef.h>

#include "zeropp.h"

typedef struct zpp_bench_quant_args {
    zpp_dtype dtype; /* --dtype, default bf16 */
    int bits;        /* --bits 8 | 4, default 8 */
    size_t block;    /* --block, default ZPP_QUANT_DEFAULT_BLOCK_INT8 / _INT4 */
    size_t n;        /* --n elements, default 1 << 24 */
    int json;        /* --json: one JSON object per line per op */
    int stochastic;  /* --stochastic: stochastic rounding (default 0) */
    int e2m1;        /* --e2m1: 4-bit E2M1, not int4 (the --bits 4 spec and qgZ's) */
} zpp_bench_quant_args;

/* Runs the bench on the GPU and prints like the CPU bench ("device":"gpu");
 * returns the process exit code. Defined in bench_quant_gpu.c. */
int zpp_bench_quant_gpu(const zpp_bench_quant_args *a);

#endif

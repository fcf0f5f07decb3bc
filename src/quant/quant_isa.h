/* quant/quant_isa.h — the CPU quantization loops, one table per
 * instruction set (core/cpu.h).
 *
 * quant_kernels.h is the one source of these loops; quant_isa_generic.c,
 * quant_isa_avx2.c and quant_isa_avx512.c compile it under different
 * `#pragma GCC target` lines, each into its own table. quant.c checks the
 * arguments, then calls the table of zpp_cpu_isa_active(). All tables give
 * the same bytes (tests/test_quant.c, test_isa_paths_identical). */
#ifndef ZPP_QUANT_ISA_H
#define ZPP_QUANT_ISA_H

#include <stddef.h>
#include <stdint.h>

#include "core/cpu.h"
#include "zeropp.h"

/* "No non-finite element": what the quantizers return when all were finite. */
#define ZPP_QUANT_NONE ((uint64_t)-1)

typedef struct zpp_quant_kernels {
    /* Quantizes n elements as one tensor (zpp_quantize's layout); idx0 is
     * the stochastic stream index of x[0]. Returns the stream index of the
     * first non-finite element, or ZPP_QUANT_NONE. */
    uint64_t (*quantize)(const void *x, zpp_dtype dtype, size_t n, const zpp_quant_spec *spec,
                         uint64_t idx0, void *out);
    void (*dequantize)(const uint8_t *q, size_t n, const zpp_quant_spec *spec, zpp_dtype dtype,
                       void *y);
    /* acc[e - e0] += element e of the n-element quantized tensor q, e in
     * [e0, e1); e0 a multiple of 8. */
    void (*accumulate)(const uint8_t *q, size_t n, const zpp_quant_spec *spec, size_t e0, size_t e1,
                       float *acc);
    /* The body of dequant-sum-requant (quant.c, dsr): input j is
     * ins[j], or base + j * stride when ins is NULL; `sum` holds
     * min(out_spec->block, chunk_len) floats. Returns as quantize. */
    uint64_t (*sum_requant)(const void *const *ins, const uint8_t *base, size_t stride, int k,
                            size_t n_chunks, size_t chunk_len, size_t idx_stride, size_t idx_first,
                            const zpp_quant_spec *in_spec, const zpp_quant_spec *out_spec,
                            float *sum, void *out);
    /* Input c at q + c * stride; exact NULL or chunk_len floats (may be out). */
    void (*dequant_reduce)(const uint8_t *q, size_t n_chunks, size_t stride, size_t chunk_len,
                           const zpp_quant_spec *spec, const float *exact, float scale,
                           float *out);
    void (*convert)(const void *in, zpp_dtype in_dtype, void *out, zpp_dtype out_dtype, size_t n,
                    float scale);
} zpp_quant_kernels;

extern const zpp_quant_kernels zpp_quant_kernels_generic;
#if ZPP_CPU_X86_PATHS
extern const zpp_quant_kernels zpp_quant_kernels_avx2;
extern const zpp_quant_kernels zpp_quant_kernels_avx512;
#endif

#endif

/* quant/quant_cpu.h — the CPU reference behind the host device (device/).
 *
 * Called by the host device (device_host.c) and the tests. Arguments mean what they mean in
 * device/device.h; "chunks" are consecutive pieces of chunk_len elements, each
 * quantized as its own tensor (zpp_quant_bytes(chunk_len) bytes, end to end).
 *
 * Stochastic rounding: the element index fed to the random stream is the
 * element's index in the whole input (chunk * chunk_len + i; in a slab,
 * chunk * chunk_len + first + i), the same convention as
 * zpp_quant_reorder_quantize and zpp_quant_dequant_sum_requant, so every
 * path draws the same numbers for the same element. */
#ifndef ZPP_QUANT_CPU_H
#define ZPP_QUANT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

zpp_status zpp_quant_cpu_quantize_chunks(const void *in, zpp_dtype dtype, size_t n_chunks,
                                         size_t chunk_len, const zpp_quant_spec *spec,
                                         void *out);
zpp_status zpp_quant_cpu_dequantize_chunks(const void *q, size_t n_chunks, size_t chunk_len,
                                           const zpp_quant_spec *spec, zpp_dtype dtype,
                                           void *out);
/* zpp_quant_reorder_quantize of the slab [first, first + len) of every chunk. */
zpp_status zpp_quant_cpu_reorder_quantize(const void *x, zpp_dtype dtype, size_t chunk_len,
                                          size_t first, size_t len, int nodes, int local,
                                          const zpp_quant_spec *spec, void *out);
/* The k inputs laid end to end, each n_chunks quantized slabs of len
 * elements: input j at j * n_chunks * zpp_quant_bytes(len). */
zpp_status zpp_quant_cpu_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                             size_t chunk_len, size_t first, size_t len,
                                             const zpp_quant_spec *in_spec,
                                             const zpp_quant_spec *out_spec, void *out);
zpp_status zpp_quant_cpu_dequant_reduce(const void *q, size_t n_chunks, size_t stride,
                                        size_t chunk_len, const zpp_quant_spec *spec,
                                        const float *exact, float scale, float *out);
/* quant.c: one tensor of n elements, element 0 at stochastic index idx0. */
zpp_status zpp_quant_cpu_quantize_at(const void *x, zpp_dtype dtype, size_t n,
                                     const zpp_quant_spec *spec, uint64_t idx0, void *out);

/* Error feedback (quant_ef.c; the math in docs/quantization.md, "Error
 * feedback"). `err` holds one fp32 error per element, in the layout of the
 * input chunks (element i of chunk c at c * chunk_len + i), and is updated
 * in place for the slab's elements:
 *   x  = v + err                 (v: the input element, or the fp32 sum)
 *   q  = quantize(x)             exactly as the plain kernel quantizes x
 *   err = beta * err + (1 - beta) * (x - dequantize(q)),  0 if not finite
 * each step one IEEE fp32 operation, (1 - beta) rounded once. */
zpp_status zpp_quant_cpu_ef_reorder_quantize(const void *x, zpp_dtype dtype, float *err,
                                             float beta, size_t chunk_len, size_t first,
                                             size_t len, int nodes, int local,
                                             const zpp_quant_spec *spec, void *out);
zpp_status zpp_quant_cpu_ef_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                                size_t chunk_len, size_t first, size_t len,
                                                const zpp_quant_spec *in_spec,
                                                const zpp_quant_spec *out_spec, float *err,
                                                float beta, void *out);
zpp_status zpp_quant_cpu_convert(const void *in, zpp_dtype in_dtype, void *out,
                                 zpp_dtype out_dtype, size_t n, float scale);

#ifdef __cplusplus
}
#endif

#endif

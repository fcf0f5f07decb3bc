/* quant/quant_cuda.h — CUDA kernels for block quantization.
 *
 * Device-memory twins of the CPU reference in quant.c, following the same
 * wire layout (zeropp.h) and the same rounding: round-half-to-even of
 * x * (qmax / absmax) with the reciprocal computed by IEEE division, and the
 * shared random stream of quant_rng.h for stochastic rounding, so payloads
 * and scales are bit-identical to the CPU's. Every function enqueues on
 * `stream` (a cudaStream_t) and returns without synchronising; launch errors
 * are returned as ZPP_ERR_CUDA. Arguments mean what they mean in
 * device/device.h (the CUDA backend, device_cuda.c, calls these). */
#ifndef ZPP_QUANT_CUDA_H
#define ZPP_QUANT_CUDA_H

#include <stddef.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

zpp_status zpp_cuda_quantize_chunks(const void *in, zpp_dtype dtype, size_t n_chunks,
                                    size_t chunk_len, const zpp_quant_spec *spec, void *out,
                                    int *nonfinite_dev, void *stream);
zpp_status zpp_cuda_dequantize_chunks(const void *q, size_t n_chunks, size_t chunk_len,
                                      const zpp_quant_spec *spec, zpp_dtype dtype, void *out,
                                      void *stream);
zpp_status zpp_cuda_reorder_quantize(const void *in, zpp_dtype dtype, size_t chunk_len,
                                     size_t first, size_t len, int nodes, int local,
                                     const zpp_quant_spec *spec, void *out,
                                     int *nonfinite_dev, void *stream);
zpp_status zpp_cuda_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                        size_t chunk_len, size_t first, size_t len,
                                        const zpp_quant_spec *in_spec,
                                        const zpp_quant_spec *out_spec, void *out,
                                        int *nonfinite_dev, void *stream);
zpp_status zpp_cuda_dequant_reduce(const void *q, size_t n_chunks, size_t stride,
                                   size_t chunk_len, const zpp_quant_spec *spec,
                                   const float *exact, float scale, float *out, void *stream);
/* Error feedback (quant_cpu.h has the formula; bit-identical to
 * zpp_quant_cpu_ef_*): `err` in device memory, updated in place. */
zpp_status zpp_cuda_ef_reorder_quantize(const void *in, zpp_dtype dtype, float *err, float beta,
                                        size_t chunk_len, size_t first, size_t len, int nodes,
                                        int local, const zpp_quant_spec *spec, void *out,
                                        int *nonfinite_dev, void *stream);
zpp_status zpp_cuda_ef_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                           size_t chunk_len, size_t first, size_t len,
                                           const zpp_quant_spec *in_spec,
                                           const zpp_quant_spec *out_spec, float *err,
                                           float beta, void *out, int *nonfinite_dev,
                                           void *stream);
/* acc[i] += dequantize(q)[i] for one quantized tensor of n elements. */
zpp_status zpp_cuda_dequantize_accumulate(const void *q, size_t n, const zpp_quant_spec *spec,
                                          float *acc, void *stream);
zpp_status zpp_cuda_convert(const void *in, zpp_dtype in_dtype, void *out,
                            zpp_dtype out_dtype, size_t n, float scale, void *stream);

#ifdef __cplusplus
}
#endif

#endif

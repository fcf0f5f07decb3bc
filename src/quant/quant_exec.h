/* quant/quant_exec.h — quantization where the data lives.
 *
 * The collectives call these; each runs the CPU reference for host memory
 * and the CUDA kernels (quant_cuda.h) for device memory, enqueued on
 * `stream`. Both follow the wire layout of zeropp.h, so a buffer quantized on
 * one side dequantizes identically on the other.
 *
 * "Chunks" are consecutive pieces of chunk_len elements, each quantized as
 * its own tensor (zpp_quant_bytes(chunk_len) bytes, laid end to end): the
 * unit of exchange of the sharded collectives, one chunk per rank.
 *
 * A "slab" is the range [first, first + len) of every chunk: the piece of a
 * collective that one step of a pipeline moves. Each chunk's slab is
 * quantized as its own tensor of len elements, and stochastic rounding
 * still indexes an element by its place in the whole input (chunk *
 * chunk_len + first + i). So a collective cut into slabs at block
 * boundaries computes the same bits as one that is not; with len a multiple
 * of 4 * block, every slab but the last is a whole number of 16-byte words
 * and the slabs' bytes add up to the whole chunk's.
 *
 * Non-finite input: on the host, ZPP_ERR_NONFINITE is returned at once. On
 * the device, kernels set *nonfinite_dev (an int in device memory, if not
 * NULL) to 1 and the NaN scale carries the NaN through; the caller checks the
 * flag at its next synchronisation. */
#ifndef ZPP_QUANT_EXEC_H
#define ZPP_QUANT_EXEC_H

#include <stddef.h>

#include "core/mem.h"
#include "zeropp.h"

typedef struct zpp_quant_exec {
    zpp_mem_kind mem;
    void *stream;         /* cudaStream_t for device memory */
    int *nonfinite_dev;   /* device flag, may be NULL */
} zpp_quant_exec;

#ifdef __cplusplus
extern "C" {
#endif

/* Quantizes n_chunks chunks of `in` into n_chunks quantized chunks. */
zpp_status zpp_qx_quantize_chunks(const zpp_quant_exec *x, const void *in, zpp_dtype dtype,
                                  size_t n_chunks, size_t chunk_len,
                                  const zpp_quant_spec *spec, void *out);
/* Dequantizes n_chunks quantized chunks into n_chunks * chunk_len elements. */
zpp_status zpp_qx_dequantize_chunks(const zpp_quant_exec *x, const void *q, size_t n_chunks,
                                    size_t chunk_len, const zpp_quant_spec *spec,
                                    zpp_dtype dtype, void *out);
/* zpp_quant_reorder_quantize of a slab, where the data lives: `in` holds
 * the whole chunks; `out` receives nodes * local quantized slabs of len
 * elements. first 0 and len chunk_len: the whole chunks. */
zpp_status zpp_qx_reorder_quantize(const zpp_quant_exec *x, const void *in, zpp_dtype dtype,
                                   size_t chunk_len, size_t first, size_t len, int nodes,
                                   int local, const zpp_quant_spec *spec, void *out);
/* zpp_quant_dequant_sum_requant of a slab, with the k inputs laid end to end
 * in `in`, each n_chunks quantized slabs of len elements (input j at
 * j * n_chunks * zpp_quant_bytes(len, in_spec)); chunk_len and first only
 * place the elements in the random stream. */
zpp_status zpp_qx_dequant_sum_requant(const zpp_quant_exec *x, const void *in, int k,
                                      size_t n_chunks, size_t chunk_len, size_t first,
                                      size_t len, const zpp_quant_spec *in_spec,
                                      const zpp_quant_spec *out_spec, void *out);
/* out[i] = scale * sum over c < n_chunks of dequantize(chunk c)[i], i < chunk_len,
 * summed in fp32 in chunk order: the last step of qgZ. */
zpp_status zpp_qx_dequant_reduce(const zpp_quant_exec *x, const void *q, size_t n_chunks,
                                 size_t chunk_len, const zpp_quant_spec *spec, float scale,
                                 float *out);
/* out[i] = (out_dtype)(scale * in[i]). in and out may be the same buffer only
 * when the dtypes are equal. */
zpp_status zpp_qx_convert(const zpp_quant_exec *x, const void *in, zpp_dtype in_dtype,
                          void *out, zpp_dtype out_dtype, size_t n, float scale);

#ifdef __cplusplus
}
#endif

#endif

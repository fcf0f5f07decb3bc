/* quant/quant_exec.c — quantization where the data lives: host memory goes
 * to the CPU reference (quant.c), device memory to the CUDA kernels
 * (quant_cuda.h). Arguments are checked here once for both sides. */
#include "quant/quant_exec.h"

#include "core/error.h"
#include "quant/quant_cpu.h"

#ifdef ZPP_HAVE_CUDA
#include "quant/quant_cuda.h"
#endif

/* ZPP_OK for host memory, ZPP_ERR_UNSUPPORTED (with a message) for device
 * memory in a build without CUDA, ZPP_ERR_INVALID otherwise. *device_p says
 * which side runs. */
static zpp_status zpp__qx_where(const zpp_quant_exec *x, const char *what, int *device_p) {
    if (!x) return zpp_error(ZPP_ERR_INVALID, "%s: exec context is NULL", what);
    if (x->mem == ZPP_MEM_HOST) {
        *device_p = 0;
        return ZPP_OK;
    }
    if (x->mem != ZPP_MEM_DEVICE)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown memory kind %d", what, (int)x->mem);
#ifdef ZPP_HAVE_CUDA
    *device_p = 1;
    return ZPP_OK;
#else
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "%s: data in device memory, but this build has no CUDA; rebuild with "
                     "nvcc on the PATH or keep tensors in host memory",
                     what);
#endif
}

static zpp_status zpp__qx_dtype(const char *what, zpp_dtype dtype) {
    if (zpp_dtype_size(dtype) == 0)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d", what, (int)dtype);
    return ZPP_OK;
}

zpp_status zpp_qx_quantize_chunks(const zpp_quant_exec *x, const void *in, zpp_dtype dtype,
                                  size_t n_chunks, size_t chunk_len,
                                  const zpp_quant_spec *spec, void *out) {
    int dev = 0;
    ZPP_CHECK(zpp__qx_where(x, "quantize", &dev));
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__qx_dtype("quantize", dtype));
    if (!dev) return zpp_quant_cpu_quantize_chunks(in, dtype, n_chunks, chunk_len, spec, out);
#ifdef ZPP_HAVE_CUDA
    return zpp_cuda_quantize_chunks(in, dtype, n_chunks, chunk_len, spec, out,
                                    x->nonfinite_dev, x->stream);
#else
    return ZPP_ERR_UNSUPPORTED; /* not reached: zpp__qx_where refused */
#endif
}

zpp_status zpp_qx_dequantize_chunks(const zpp_quant_exec *x, const void *q, size_t n_chunks,
                                    size_t chunk_len, const zpp_quant_spec *spec,
                                    zpp_dtype dtype, void *out) {
    int dev = 0;
    ZPP_CHECK(zpp__qx_where(x, "dequantize", &dev));
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__qx_dtype("dequantize", dtype));
    if (!dev) return zpp_quant_cpu_dequantize_chunks(q, n_chunks, chunk_len, spec, dtype, out);
#ifdef ZPP_HAVE_CUDA
    return zpp_cuda_dequantize_chunks(q, n_chunks, chunk_len, spec, dtype, out, x->stream);
#else
    return ZPP_ERR_UNSUPPORTED;
#endif
}

zpp_status zpp_qx_reorder_quantize(const zpp_quant_exec *x, const void *in, zpp_dtype dtype,
                                   size_t chunk_len, size_t first, size_t len, int nodes,
                                   int local, const zpp_quant_spec *spec, void *out) {
    int dev = 0;
    ZPP_CHECK(zpp__qx_where(x, "reorder-quantize", &dev));
    if (!dev)
        return zpp_quant_cpu_reorder_quantize(in, dtype, chunk_len, first, len, nodes, local,
                                              spec, out);
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(zpp__qx_dtype("reorder-quantize", dtype));
    if (nodes < 1 || local < 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "reorder-quantize: nodes %d and local %d must both be >= 1", nodes,
                         local);
#ifdef ZPP_HAVE_CUDA
    return zpp_cuda_reorder_quantize(in, dtype, chunk_len, first, len, nodes, local, spec, out,
                                     x->nonfinite_dev, x->stream);
#else
    return ZPP_ERR_UNSUPPORTED;
#endif
}

zpp_status zpp_qx_dequant_sum_requant(const zpp_quant_exec *x, const void *in, int k,
                                      size_t n_chunks, size_t chunk_len, size_t first,
                                      size_t len, const zpp_quant_spec *in_spec,
                                      const zpp_quant_spec *out_spec, void *out) {
    int dev = 0;
    ZPP_CHECK(zpp__qx_where(x, "dequant-sum-requant", &dev));
    ZPP_CHECK(zpp_quant_spec_check(in_spec));
    ZPP_CHECK(zpp_quant_spec_check(out_spec));
    if (k < 1)
        return zpp_error(ZPP_ERR_INVALID, "dequant-sum-requant: k = %d inputs; need at least 1",
                         k);
    if (!dev)
        return zpp_quant_cpu_dequant_sum_requant(in, k, n_chunks, chunk_len, first, len,
                                                 in_spec, out_spec, out);
#ifdef ZPP_HAVE_CUDA
    return zpp_cuda_dequant_sum_requant(in, k, n_chunks, chunk_len, first, len, in_spec,
                                        out_spec, out, x->nonfinite_dev, x->stream);
#else
    return ZPP_ERR_UNSUPPORTED;
#endif
}

zpp_status zpp_qx_dequant_reduce(const zpp_quant_exec *x, const void *q, size_t n_chunks,
                                 size_t chunk_len, const zpp_quant_spec *spec, float scale,
                                 float *out) {
    int dev = 0;
    ZPP_CHECK(zpp__qx_where(x, "dequant-reduce", &dev));
    ZPP_CHECK(zpp_quant_spec_check(spec));
    if (!dev)
        return zpp_quant_cpu_dequant_reduce(q, n_chunks, chunk_len, spec, scale, out);
#ifdef ZPP_HAVE_CUDA
    return zpp_cuda_dequant_reduce(q, n_chunks, chunk_len, spec, scale, out, x->stream);
#else
    return ZPP_ERR_UNSUPPORTED;
#endif
}

zpp_status zpp_qx_convert(const zpp_quant_exec *x, const void *in, zpp_dtype in_dtype,
                          void *out, zpp_dtype out_dtype, size_t n, float scale) {
    int dev = 0;
    ZPP_CHECK(zpp__qx_where(x, "convert", &dev));
    ZPP_CHECK(zpp__qx_dtype("convert", in_dtype));
    ZPP_CHECK(zpp__qx_dtype("convert", out_dtype));
    if (in == out && in_dtype != out_dtype && n > 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "convert: in-place conversion from %s to %s; use separate buffers",
                         zpp_dtype_name(in_dtype), zpp_dtype_name(out_dtype));
    if (!dev) return zpp_quant_cpu_convert(in, in_dtype, out, out_dtype, n, scale);
#ifdef ZPP_HAVE_CUDA
    return zpp_cuda_convert(in, in_dtype, out, out_dtype, n, scale, x->stream);
#else
    return ZPP_ERR_UNSUPPORTED;
#endif
}

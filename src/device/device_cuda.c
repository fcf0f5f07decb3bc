/* device/device_cuda.c — the CUDA backend: tensors in one GPU's memory,
 * work enqueued on the device's non-blocking compute stream.
 *
 * Quantization goes to quant/quant_cuda.cu, shard arithmetic to
 * device_cuda_kernels.cu. A non-blocking stream does not wait for the legacy
 * default stream, so nothing here may use it: every copy and memset is
 * the Async form on a stream of ours, and the synchronous points are the
 * ones device.h promises (copies touching host memory, sync, sumsq). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "device/device_cuda_kernels.h"
#include "device/device_impl.h"
#include "quant/quant_cuda.h"

typedef struct cuda_impl {
    double *sumsq;  /* sumsq_cap doubles in device memory, for zpp_dcu_sumsq */
    int sumsq_cap;
} cuda_impl;

static zpp_status cu_fail(cudaError_t e, const char *what) {
    return zpp_error(e == cudaErrorMemoryAllocation ? ZPP_ERR_NOMEM : ZPP_ERR_CUDA, "%s: %s (%s)",
                     what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static cudaStream_t cu_stream(const zpp_device *d, void *stream) {
    return (cudaStream_t)(stream ? stream : d->stream);
}

static zpp_status cu_alloc(zpp_device *d, size_t bytes, void **p_p) {
    (void)d;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        const double gib = 1024.0 * 1024.0 * 1024.0;
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            (void)cudaGetLastError();
            free_b = total_b = 0;
        }
        return zpp_error(e == cudaErrorMemoryAllocation ? ZPP_ERR_NOMEM : ZPP_ERR_CUDA,
                         "could not allocate %.2f GiB (%zu bytes) of GPU memory, with %.2f GiB "
                         "free of %.2f: %s",
                         (double)bytes / gib, bytes, (double)free_b / gib, (double)total_b / gib,
                         cudaGetErrorString(e));
    }
    *p_p = p;
    return ZPP_OK;
}

/* cudaFree waits for the device, so a buffer still read by a kernel in
 * flight is not pulled from under it. */
static void cu_free(zpp_device *d, void *p) {
    (void)d;
    (void)cudaFree(p);
}

/* Host memory in the CUDA sense: pageable, or pinned with cudaMallocHost. */
static int cu_is_host(const void *p) {
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged;
}

/* cudaMemcpyDefault lets the driver tell the directions apart. A copy that
 * touches host memory waits for the stream: into host memory because the
 * caller reads the data next, out of host memory because the caller may
 * free or overwrite the source next (a pinned source is read by the DMA
 * engine later). */
static zpp_status cu_copy(zpp_device *d, void *dst, const void *src, size_t bytes) {
    cudaStream_t s = cu_stream(d, NULL);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
    if (e != cudaSuccess) return cu_fail(e, "copy");
    if (cu_is_host(dst) || cu_is_host(src)) {
        e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) return cu_fail(e, "copy: waiting for the stream");
    }
    return ZPP_OK;
}

static zpp_status cu_copy_on(zpp_device *d, void *dst, const void *src, size_t bytes,
                             void *stream) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                    cu_stream(d, stream));
    if (e != cudaSuccess) return cu_fail(e, "copy on a stream");
    return ZPP_OK;
}

static zpp_status cu_set(zpp_device *d, void *p, int value, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(p, value, bytes, cu_stream(d, NULL));
    if (e != cudaSuccess) return cu_fail(e, "memset");
    return ZPP_OK;
}

static zpp_status cu_sync(zpp_device *d, void *stream) {
    cudaError_t e = cudaStreamSynchronize(cu_stream(d, stream));
    if (e != cudaSuccess) return cu_fail(e, "stream synchronisation");
    return ZPP_OK;
}

static zpp_status cu_device_name(const zpp_device *d, char *buf, size_t cap) {
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, d->ordinal);
    if (e != cudaSuccess) return cu_fail(e, "device name");
    snprintf(buf, cap, "%s", prop.name);
    return ZPP_OK;
}

static zpp_status cu_driver_used(const zpp_device *d, size_t *used_p) {
    (void)d; /* the current GPU is d's (device.h) */
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) return cu_fail(e, "memory in use (cudaMemGetInfo)");
    *used_p = total_b - free_b;
    return ZPP_OK;
}

static zpp_status cu_stream_create(zpp_device *d, void **stream_p) {
    (void)d;
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cu_fail(e, "stream create");
    *stream_p = (void *)s;
    return ZPP_OK;
}

static void cu_stream_destroy(zpp_device *d, void *stream) {
    (void)d;
    (void)cudaStreamDestroy((cudaStream_t)stream);
}

/* A zpp_device_event is a cudaEvent_t. */
static zpp_status cu_event_create(zpp_device *d, int timing, zpp_device_event **ev_p) {
    (void)d;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming);
    if (e != cudaSuccess) return cu_fail(e, "event create");
    *ev_p = (zpp_device_event *)ev;
    return ZPP_OK;
}

static void cu_event_destroy(zpp_device *d, zpp_device_event *ev) {
    (void)d;
    (void)cudaEventDestroy((cudaEvent_t)ev);
}

static zpp_status cu_event_record(zpp_device *d, zpp_device_event *ev, void *stream) {
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, cu_stream(d, stream));
    if (e != cudaSuccess) return cu_fail(e, "event record");
    return ZPP_OK;
}

static zpp_status cu_event_wait(zpp_device *d, void *stream, zpp_device_event *ev) {
    cudaError_t e = cudaStreamWaitEvent(cu_stream(d, stream), (cudaEvent_t)ev, 0);
    if (e != cudaSuccess) return cu_fail(e, "event wait");
    return ZPP_OK;
}

static zpp_status cu_bind_thread(zpp_device *d) {
    cudaError_t e = cudaSetDevice(d->ordinal);
    if (e != cudaSuccess) return cu_fail(e, "binding a thread to the GPU");
    return ZPP_OK;
}

static zpp_status cu_event_query(zpp_device *d, zpp_device_event *ev, int *done_p) {
    (void)d;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* "not ready" is an answer, not an error */
        *done_p = 0;
        return ZPP_OK;
    }
    if (e != cudaSuccess) return cu_fail(e, "event query");
    *done_p = 1;
    return ZPP_OK;
}

static zpp_status cu_event_elapsed_ms(zpp_device *d, zpp_device_event *start,
                                      zpp_device_event *end, float *ms_p) {
    (void)d;
    cudaError_t e = cudaEventElapsedTime(ms_p, (cudaEvent_t)start, (cudaEvent_t)end);
    if (e != cudaSuccess) return cu_fail(e, "event elapsed time");
    return ZPP_OK;
}

static zpp_status cu_quantize_chunks(zpp_device *d, const void *in, zpp_dtype dtype,
                                     size_t n_chunks, size_t chunk_len,
                                     const zpp_quant_spec *spec, void *out) {
    return zpp_cuda_quantize_chunks(in, dtype, n_chunks, chunk_len, spec, out, d->nonfinite,
                                    d->stream);
}

static zpp_status cu_dequantize_chunks(zpp_device *d, const void *q, size_t n_chunks,
                                       size_t chunk_len, const zpp_quant_spec *spec,
                                       zpp_dtype dtype, void *out) {
    return zpp_cuda_dequantize_chunks(q, n_chunks, chunk_len, spec, dtype, out, d->stream);
}

static zpp_status cu_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                      size_t chunk_len, size_t first, size_t len, int nodes,
                                      int local, const zpp_quant_spec *spec, void *out) {
    return zpp_cuda_reorder_quantize(in, dtype, chunk_len, first, len, nodes, local, spec, out,
                                     d->nonfinite, d->stream);
}

static zpp_status cu_ef_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                         float *err, float beta, size_t chunk_len, size_t first,
                                         size_t len, int nodes, int local,
                                         const zpp_quant_spec *spec, void *out) {
    return zpp_cuda_ef_reorder_quantize(in, dtype, err, beta, chunk_len, first, len, nodes,
                                        local, spec, out, d->nonfinite, d->stream);
}

static zpp_status cu_ef_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                            size_t n_chunks, size_t chunk_len, size_t first,
                                            size_t len, const zpp_quant_spec *in_spec,
                                            const zpp_quant_spec *out_spec, float *err,
                                            float beta, void *out) {
    return zpp_cuda_ef_dequant_sum_requant(in, k, n_chunks, chunk_len, first, len, in_spec,
                                           out_spec, err, beta, out, d->nonfinite, d->stream);
}

static zpp_status cu_dequant_sum_requant(zpp_device *d, const void *in, int k, size_t n_chunks,
                                         size_t chunk_len, size_t first, size_t len,
                                         const zpp_quant_spec *in_spec,
                                         const zpp_quant_spec *out_spec, void *out) {
    return zpp_cuda_dequant_sum_requant(in, k, n_chunks, chunk_len, first, len, in_spec,
                                        out_spec, out, d->nonfinite, d->stream);
}

static zpp_status cu_dequant_reduce(zpp_device *d, const void *q, size_t n_chunks,
                                    size_t stride, size_t chunk_len, const zpp_quant_spec *spec,
                                    const float *exact, float scale, float *out) {
    return zpp_cuda_dequant_reduce(q, n_chunks, stride, chunk_len, spec, exact, scale, out,
                                   d->stream);
}

static zpp_status cu_convert(zpp_device *d, const void *in, zpp_dtype in_dtype, void *out,
                             zpp_dtype out_dtype, size_t n, float scale) {
    return zpp_cuda_convert(in, in_dtype, out, out_dtype, n, scale, d->stream);
}

static zpp_status cu_add(zpp_device *d, float *acc, const float *x, size_t n) {
    return zpp_dcu_add(d->stream, acc, x, n);
}

static zpp_status cu_sumsq(zpp_device *d, const void *const *x, const size_t *n, int k,
                          zpp_dtype dt, double *sums) {
    cuda_impl *im = d->impl;
    if (k > im->sumsq_cap) { /* once per engine: it asks for every unit at once */
        double *grown = NULL;
        cudaError_t e = cudaMalloc((void **)&grown, (size_t)k * sizeof(double));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return cu_fail(e, "sum of squares: its accumulators");
        }
        (void)cudaFree(im->sumsq); /* waits for the work that used it */
        im->sumsq = grown;
        im->sumsq_cap = k;
    }
    return zpp_dcu_sumsq(d->stream, x, n, k, dt, im->sumsq, sums);
}

static zpp_status cu_adamw(zpp_device *d, float *param, float *m, float *v, void *grad,
                           size_t n, const zpp_adamw_args *a, void *work, zpp_dtype work_dtype) {
    return zpp_dcu_adamw(d->stream, param, m, v, grad, n, a, work, work_dtype);
}

static zpp_status cu_master_split(zpp_device *d, const float *x, uint16_t *hi, uint16_t *lo,
                                  size_t n) {
    return zpp_dcu_master_split(d->stream, x, hi, lo, n);
}

static zpp_status cu_master_join(zpp_device *d, const uint16_t *hi, const uint16_t *lo, float *x,
                                 size_t n) {
    return zpp_dcu_master_join(d->stream, hi, lo, x, n);
}

static void cu_destroy(zpp_device *d) {
    cuda_impl *im = d->impl;
    if (im) {
        if (im->sumsq) (void)cudaFree(im->sumsq);
        free(im);
    }
    if (d->stream) (void)cudaStreamDestroy((cudaStream_t)d->stream);
}

static const zpp_device_ops kCudaOps = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .set = cu_set,
    .sync = cu_sync,
    .device_name = cu_device_name,
    .copy_on = cu_copy_on,
    .driver_used = cu_driver_used,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .event_wait = cu_event_wait,
    .event_query = cu_event_query,
    .bind_thread = cu_bind_thread,
    .event_elapsed_ms = cu_event_elapsed_ms,
    .quantize_chunks = cu_quantize_chunks,
    .dequantize_chunks = cu_dequantize_chunks,
    .reorder_quantize = cu_reorder_quantize,
    .dequant_sum_requant = cu_dequant_sum_requant,
    .ef_reorder_quantize = cu_ef_reorder_quantize,
    .ef_dequant_sum_requant = cu_ef_dequant_sum_requant,
    .dequant_reduce = cu_dequant_reduce,
    .convert = cu_convert,
    .add = cu_add,
    .sumsq = cu_sumsq,
    .adamw = cu_adamw,
    .master_split = cu_master_split,
    .master_join = cu_master_join,
    .destroy = cu_destroy,
};

/* CMake passes the architectures it compiled for (CMAKE_CUDA_ARCHITECTURES,
 * commas for semicolons). */
#ifndef ZPP_CUDA_ARCHS
#define ZPP_CUDA_ARCHS "unknown"
#endif

const char *zpp_device_cuda_build(void) {
    static char text[160];
    snprintf(text, sizeof text, "CUDA %d.%d runtime, kernels for architectures %s",
             CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, ZPP_CUDA_ARCHS);
    return text;
}

int zpp_device_gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no GPU: the caller may go on without */
        return 0;
    }
    return n;
}

/* The PCI bus id of a GPU, lower case ("0000:1b:00.0"), as lspci shows it. */
zpp_status zpp_device_gpu_bus_id(int ordinal, char *buf, size_t cap) {
    if (!buf || cap == 0)
        return zpp_error(ZPP_ERR_INVALID, "device: bus id of GPU %d: no buffer", ordinal);
    buf[0] = '\0';
    char id[64];
    cudaError_t e = cudaDeviceGetPCIBusId(id, (int)sizeof id, ordinal);
    if (e != cudaSuccess) return cu_fail(e, "device: the GPU's PCI bus id");
    id[sizeof id - 1] = '\0';
    int n = snprintf(buf, cap, "%s", id);
    if (n < 0 || (size_t)n >= cap) {
        buf[0] = '\0';
        return zpp_error(ZPP_ERR_INVALID,
                         "device: bus id %s of GPU %d needs %d bytes, the buffer holds %zu", id,
                         ordinal, n + 1, cap);
    }
    for (char *c = buf; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    return ZPP_OK;
}

zpp_status zpp_device_create_gpu(int ordinal, zpp_device **d_p) {
    if (!d_p) return zpp_error(ZPP_ERR_INVALID, "device: d_p is NULL; pass where to store it");
    int n = zpp_device_gpu_count();
    if (n == 0)
        return zpp_error(ZPP_ERR_CUDA,
                         "device: GPU %d requested, but no CUDA device is visible; run on a "
                         "machine with NVIDIA GPUs, or use the host backend (--device cpu)",
                         ordinal);
    if (ordinal < 0 || ordinal >= n)
        return zpp_error(ZPP_ERR_INVALID,
                         "device: GPU %d requested, but this process sees GPUs 0..%d (check "
                         "CUDA_VISIBLE_DEVICES)",
                         ordinal, n - 1);
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) return cu_fail(e, "device: selecting the GPU");
    /* A build without code for this GPU would fail at its first kernel:
     * say so here, with what it was built for (docs/gpus.md). */
    e = (cudaError_t)zpp_dcu_image_check();
    if (e != cudaSuccess) {
        int major = 0, minor = 0;
        (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
        (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
        (void)cudaGetLastError();
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "device: GPU %d (compute capability %d.%d) cannot run this build's "
                         "kernels (%s), built for CUDA architectures %s; rebuild with "
                         "-DCMAKE_CUDA_ARCHITECTURES=%d%d or see docs/gpus.md",
                         ordinal, major, minor, cudaGetErrorString(e), ZPP_CUDA_ARCHS, major,
                         minor);
    }
    zpp_device *d = calloc(1, sizeof *d);
    cuda_impl *im = calloc(1, sizeof *im);
    if (!d || !im) {
        free(d);
        free(im);
        return zpp_error(ZPP_ERR_NOMEM, "device: out of host memory");
    }
    d->ops = &kCudaOps;
    d->mem = ZPP_MEM_DEVICE;
    d->ordinal = ordinal;
    d->impl = im;
    /* Non-blocking: the compute stream must not serialise with the legacy
     * default stream that libraries may use behind our back. */
    cudaStream_t s;
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess) {
        d->stream = (void *)s;
        e = cudaMalloc((void **)&im->sumsq, sizeof(double));
        im->sumsq_cap = 1;
    }
    if (e != cudaSuccess) {
        zpp_status st = cu_fail(e, "device: the compute stream");
        zpp_device_destroy(d);
        return st;
    }
    return zpp__device_publish(d, d_p);
}

/* device/device_host.c — the host backend: tensors in host memory, work on
 * the calling thread, so every operation has finished when it returns.
 *
 * Quantization is the CPU reference (quant/quant_cpu.h), the definition the
 * CUDA kernels are tested against. The loops for add, sum of squares and
 * AdamW are written exactly as before they moved here (engine/shard_ops.c),
 * same expressions in the same order: CPU training must keep its losses to
 * the bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device_impl.h"
#include "quant/quant_cpu.h"

#define ZPP_HOST_ALIGN 64

/* A host "event" is the time it was recorded: the work before it has run. */
struct zpp_device_event {
    double ms;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static zpp_status host_alloc(zpp_device *d, size_t bytes, void **p_p) {
    (void)d;
    size_t rounded = (bytes + ZPP_HOST_ALIGN - 1) / ZPP_HOST_ALIGN * ZPP_HOST_ALIGN;
    if (rounded < bytes)
        return zpp_error(ZPP_ERR_NOMEM, "could not allocate %zu bytes of host memory", bytes);
    if (rounded == 0) rounded = ZPP_HOST_ALIGN;
    void *p = aligned_alloc(ZPP_HOST_ALIGN, rounded);
    if (!p) return zpp_error(ZPP_ERR_NOMEM, "could not allocate %zu bytes of host memory", bytes);
    *p_p = p;
    return ZPP_OK;
}

static void host_free(zpp_device *d, void *p) {
    (void)d;
    free(p);
}

static zpp_status host_copy(zpp_device *d, void *dst, const void *src, size_t bytes) {
    (void)d;
    memmove(dst, src, bytes);
    return ZPP_OK;
}

static zpp_status host_copy_on(zpp_device *d, void *dst, const void *src, size_t bytes,
                               void *stream) {
    (void)stream; /* the host runs work as it is called */
    return host_copy(d, dst, src, bytes);
}

static zpp_status host_set(zpp_device *d, void *p, int value, size_t bytes) {
    (void)d;
    memset(p, value, bytes);
    return ZPP_OK;
}

static zpp_status host_sync(zpp_device *d, void *stream) {
    (void)d;
    (void)stream;
    return ZPP_OK;
}

/* A stream is a token: distinct, non-NULL, nothing behind it. */
static zpp_status host_stream_create(zpp_device *d, void **stream_p) {
    (void)d;
    void *s = malloc(1);
    if (!s) return zpp_error(ZPP_ERR_NOMEM, "stream create: out of host memory");
    *stream_p = s;
    return ZPP_OK;
}

static void host_stream_destroy(zpp_device *d, void *stream) {
    (void)d;
    free(stream);
}

static zpp_status host_event_create(zpp_device *d, int timing, zpp_device_event **ev_p) {
    (void)d;
    (void)timing;
    zpp_device_event *ev = calloc(1, sizeof *ev);
    if (!ev) return zpp_error(ZPP_ERR_NOMEM, "event create: out of host memory");
    *ev_p = ev;
    return ZPP_OK;
}

static void host_event_destroy(zpp_device *d, zpp_device_event *ev) {
    (void)d;
    free(ev);
}

static zpp_status host_event_record(zpp_device *d, zpp_device_event *ev, void *stream) {
    (void)d;
    (void)stream;
    ev->ms = now_ms();
    return ZPP_OK;
}

static zpp_status host_event_wait(zpp_device *d, void *stream, zpp_device_event *ev) {
    (void)d;
    (void)stream;
    (void)ev;
    return ZPP_OK;
}

static zpp_status host_event_query(zpp_device *d, zpp_device_event *ev, int *done_p) {
    (void)d;
    (void)ev;
    *done_p = 1;
    return ZPP_OK;
}

static zpp_status host_bind_thread(zpp_device *d) {
    (void)d;
    return ZPP_OK;
}

static zpp_status host_event_elapsed_ms(zpp_device *d, zpp_device_event *start,
                                        zpp_device_event *end, float *ms_p) {
    (void)d;
    *ms_p = (float)(end->ms - start->ms);
    return ZPP_OK;
}

/* The CPU reference writes the whole output even when it meets NaN or Inf
 * (a NaN scale and a zero payload for that block) and then reports
 * ZPP_ERR_NONFINITE; the device contract is the flag and ZPP_OK, so that a
 * collective completes on every rank and the engine decides once a step. */
static zpp_status host_soft(zpp_device *d, zpp_status st) {
    if (st != ZPP_ERR_NONFINITE) return st;
    *d->nonfinite = 1;
    zpp_error_clear();
    return ZPP_OK;
}

static zpp_status host_quantize_chunks(zpp_device *d, const void *in, zpp_dtype dtype,
                                       size_t n_chunks, size_t chunk_len,
                                       const zpp_quant_spec *spec, void *out) {
    return host_soft(d,
                     zpp_quant_cpu_quantize_chunks(in, dtype, n_chunks, chunk_len, spec, out));
}

static zpp_status host_dequantize_chunks(zpp_device *d, const void *q, size_t n_chunks,
                                         size_t chunk_len, const zpp_quant_spec *spec,
                                         zpp_dtype dtype, void *out) {
    (void)d;
    return zpp_quant_cpu_dequantize_chunks(q, n_chunks, chunk_len, spec, dtype, out);
}

static zpp_status host_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                        size_t chunk_len, size_t first, size_t len, int nodes,
                                        int local, const zpp_quant_spec *spec, void *out) {
    return host_soft(d, zpp_quant_cpu_reorder_quantize(in, dtype, chunk_len, first, len, nodes,
                                                       local, spec, out));
}

static zpp_status host_ef_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                           float *err, float beta, size_t chunk_len,
                                           size_t first, size_t len, int nodes, int local,
                                           const zpp_quant_spec *spec, void *out) {
    return host_soft(d, zpp_quant_cpu_ef_reorder_quantize(in, dtype, err, beta, chunk_len, first,
                                                          len, nodes, local, spec, out));
}

static zpp_status host_ef_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                              size_t n_chunks, size_t chunk_len, size_t first,
                                              size_t len, const zpp_quant_spec *in_spec,
                                              const zpp_quant_spec *out_spec, float *err,
                                              float beta, void *out) {
    return host_soft(d, zpp_quant_cpu_ef_dequant_sum_requant(in, k, n_chunks, chunk_len, first,
                                                             len, in_spec, out_spec, err, beta,
                                                             out));
}

static zpp_status host_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                           size_t n_chunks, size_t chunk_len, size_t first,
                                           size_t len, const zpp_quant_spec *in_spec,
                                           const zpp_quant_spec *out_spec, void *out) {
    return host_soft(d, zpp_quant_cpu_dequant_sum_requant(in, k, n_chunks, chunk_len, first,
                                                          len, in_spec, out_spec, out));
}

static zpp_status host_dequant_reduce(zpp_device *d, const void *q, size_t n_chunks,
                                      size_t stride, size_t chunk_len, const zpp_quant_spec *spec,
                                      const float *exact, float scale, float *out) {
    (void)d;
    return zpp_quant_cpu_dequant_reduce(q, n_chunks, stride, chunk_len, spec, exact, scale, out);
}

static zpp_status host_convert(zpp_device *d, const void *in, zpp_dtype in_dtype, void *out,
                               zpp_dtype out_dtype, size_t n, float scale) {
    (void)d;
    return zpp_quant_cpu_convert(in, in_dtype, out, out_dtype, n, scale);
}

static zpp_status host_add(zpp_device *d, float *acc, const float *x, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
    return ZPP_OK;
}

/* In double, in index order: the engine's gradient norm, and through it
 * the clipping coefficient, depends on the order. A 2-byte element widens
 * to fp32 exactly, so its square is that fp32's; fp32 keeps its own loop,
 * free of the per-element dtype switch. */
static zpp_status host_sumsq(zpp_device *d, const void *const *x, const size_t *n, int k,
                             zpp_dtype dt, double *sums) {
    (void)d;
    for (int j = 0; j < k; j++) {
        double s = 0.0;
        if (dt == ZPP_FP32) {
            const float *xj = x[j];
            for (size_t i = 0; i < n[j]; i++) s += (double)xj[i] * xj[i];
        } else {
            for (size_t i = 0; i < n[j]; i++) {
                const float f = zpp_load_f32(x[j], dt, i);
                s += (double)f * f;
            }
        }
        sums[j] = s;
    }
    return ZPP_OK;
}

/* grad holds a->grad_dtype elements, each widened to fp32 (exact) before
 * the fp32 arithmetic, and cleared to that dtype's zero. */
static zpp_status host_adamw(zpp_device *d, float *param, float *m, float *v, void *grad,
                             size_t n, const zpp_adamw_args *a, void *work,
                             zpp_dtype work_dtype) {
    (void)d;
    const float b1 = a->beta1, b2 = a->beta2;
    const float c1 = 1.0f - powf(b1, (float)a->step);
    const float c2 = 1.0f - powf(b2, (float)a->step);
    const zpp_dtype gdt = a->grad_dtype;
    uint16_t *lo = a->master_lo, *hi = work; /* hi: a bf16 working copy */
    for (size_t i = 0; i < n; i++) {
        const float wd = zpp_adamw_decay_at(*a, i);
        float g = a->grad_scale * zpp_load_f32(grad, gdt, i);
        if (a->clear_grad) zpp_store_f32(grad, gdt, i, 0.0f);
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = lo ? zpp_split_join(hi[i], lo[i]) : param[i];
        p -= a->lr * ((mi / c1) / (sqrtf(vi / c2) + a->eps) + wd * p);
        if (lo) {
            hi[i] = zpp_split_hi(p);
            lo[i] = zpp_split_lo(p);
            continue;
        }
        param[i] = p;
        if (work && work_dtype == ZPP_BF16) hi[i] = zpp_split_hi(p);
        else if (work) zpp_store_f32(work, work_dtype, i, p);
    }
    return ZPP_OK;
}

static zpp_status host_master_split(zpp_device *d, const float *x, uint16_t *hi, uint16_t *lo,
                                    size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) hi[i] = zpp_split_hi(x[i]);
    if (lo)
        for (size_t i = 0; i < n; i++) lo[i] = zpp_split_lo(x[i]);
    return ZPP_OK;
}

static zpp_status host_master_join(zpp_device *d, const uint16_t *hi, const uint16_t *lo,
                                   float *x, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) x[i] = zpp_split_join(hi[i], lo[i]);
    return ZPP_OK;
}

static zpp_status host_device_name(const zpp_device *d, char *buf, size_t cap) {
    (void)d;
    snprintf(buf, cap, "host");
    return ZPP_OK;
}

/* Host memory is the process's, not a device's: nothing to report. */
static zpp_status host_driver_used(const zpp_device *d, size_t *used_p) {
    (void)d;
    *used_p = 0;
    return ZPP_OK;
}

static void host_destroy(zpp_device *d) { (void)d; }

static const zpp_device_ops kHostOps = {
    .name = "host",
    .alloc = host_alloc,
    .free = host_free,
    .copy = host_copy,
    .set = host_set,
    .sync = host_sync,
    .device_name = host_device_name,
    .copy_on = host_copy_on,
    .driver_used = host_driver_used,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_wait = host_event_wait,
    .event_query = host_event_query,
    .bind_thread = host_bind_thread,
    .event_elapsed_ms = host_event_elapsed_ms,
    .quantize_chunks = host_quantize_chunks,
    .dequantize_chunks = host_dequantize_chunks,
    .reorder_quantize = host_reorder_quantize,
    .dequant_sum_requant = host_dequant_sum_requant,
    .ef_reorder_quantize = host_ef_reorder_quantize,
    .ef_dequant_sum_requant = host_ef_dequant_sum_requant,
    .dequant_reduce = host_dequant_reduce,
    .convert = host_convert,
    .add = host_add,
    .sumsq = host_sumsq,
    .adamw = host_adamw,
    .master_split = host_master_split,
    .master_join = host_master_join,
    .destroy = host_destroy,
};

zpp_status zpp_device_create_host(zpp_device **d_p) {
    if (!d_p) return zpp_error(ZPP_ERR_INVALID, "device: d_p is NULL; pass where to store it");
    zpp_device *d = calloc(1, sizeof *d);
    if (!d) return zpp_error(ZPP_ERR_NOMEM, "device: out of host memory");
    d->ops = &kHostOps;
    d->mem = ZPP_MEM_HOST;
    d->ordinal = -1;
    return zpp__device_publish(d, d_p);
}

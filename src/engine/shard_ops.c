/* engine/shard_ops.c — host implementations; device memory goes to the
 * CUDA twins in shard_ops_cuda.cu. */
#include "engine/shard_ops.h"

#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"

#ifdef ZPP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define ZPP_NO_DEVICE_                                                        \
    zpp_error(ZPP_ERR_UNSUPPORTED, "device shards need a CUDA build")

zpp_status zpp_sops_zero(zpp_mem_kind mem, void *stream, void *p, size_t bytes) {
    if (mem == ZPP_MEM_HOST) {
        memset(p, 0, bytes);
        return ZPP_OK;
    }
#ifdef ZPP_HAVE_CUDA
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, (cudaStream_t)stream);
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "memset: %s", cudaGetErrorString(e));
    return ZPP_OK;
#else
    return ZPP_NO_DEVICE_;
#endif
}

zpp_status zpp_sops_add(zpp_mem_kind mem, void *stream, float *acc, const float *x, size_t n) {
    if (mem == ZPP_MEM_HOST) {
        for (size_t i = 0; i < n; i++) acc[i] += x[i];
        return ZPP_OK;
    }
#ifdef ZPP_HAVE_CUDA
    return zpp_sops_add_cuda(stream, acc, x, n);
#else
    return ZPP_NO_DEVICE_;
#endif
}

zpp_status zpp_sops_sumsq(zpp_mem_kind mem, void *stream, const float *x, size_t n,
                          double *sum_p) {
    if (mem == ZPP_MEM_HOST) {
        double s = 0.0;
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        *sum_p = s;
        return ZPP_OK;
    }
#ifdef ZPP_HAVE_CUDA
    return zpp_sops_sumsq_cuda(stream, x, n, sum_p);
#else
    return ZPP_NO_DEVICE_;
#endif
}

zpp_status zpp_sops_adamw(zpp_mem_kind mem, void *stream, float *param, float *m, float *v,
                          const float *grad, size_t n, const zpp_adamw_args *a, void *work,
                          zpp_dtype work_dtype) {
    if (mem != ZPP_MEM_HOST) {
#ifdef ZPP_HAVE_CUDA
        return zpp_sops_adamw_cuda(stream, param, m, v, grad, n, a, work, work_dtype);
#else
        return ZPP_NO_DEVICE_;
#endif
    }
    const float b1 = a->beta1, b2 = a->beta2;
    const float c1 = 1.0f - powf(b1, (float)a->step);
    const float c2 = 1.0f - powf(b2, (float)a->step);
    for (size_t i = 0; i < n; i++) {
        float g = a->grad_scale * grad[i];
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        p -= a->lr * ((mi / c1) / (sqrtf(vi / c2) + a->eps) + a->weight_decay * p);
        param[i] = p;
        zpp_store_f32(work, work_dtype, i, p);
    }
    return ZPP_OK;
}

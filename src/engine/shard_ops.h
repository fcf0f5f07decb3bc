/* engine/shard_ops.h — the engine's vector arithmetic on shards, where the
 * shards live (host loops, or CUDA kernels on the compute stream). */
#ifndef ZPP_ENGINE_SHARD_OPS_H
#define ZPP_ENGINE_SHARD_OPS_H

#include <stddef.h>

#include "core/mem.h"
#include "zeropp.h"

typedef struct zpp_adamw_args {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;      /* clipping coefficient, applied to g first */
    int step;              /* 1-based, for bias correction */
} zpp_adamw_args;

#ifdef __cplusplus
extern "C" {
#endif

/* p[0..n) = 0 (stream-ordered on the device). */
zpp_status zpp_sops_zero(zpp_mem_kind mem, void *stream, void *p, size_t bytes);
/* acc[i] += x[i]. */
zpp_status zpp_sops_add(zpp_mem_kind mem, void *stream, float *acc, const float *x, size_t n);
/* sum of x[i]^2 in double, returned to the host (synchronises the stream). */
zpp_status zpp_sops_sumsq(zpp_mem_kind mem, void *stream, const float *x, size_t n,
                          double *sum_p);
/*
 * AdamW with decoupled weight decay (Loshchilov & Hutter), per element:
 *   g = grad_scale * grad
 *   m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
 *   p = p - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
 * then work[i] = (work_dtype) p[i], the next working copy of the shard.
 */
zpp_status zpp_sops_adamw(zpp_mem_kind mem, void *stream, float *param, float *m, float *v,
                          const float *grad, size_t n, const zpp_adamw_args *a, void *work,
                          zpp_dtype work_dtype);

#ifdef ZPP_HAVE_CUDA
zpp_status zpp_sops_add_cuda(void *stream, float *acc, const float *x, size_t n);
zpp_status zpp_sops_sumsq_cuda(void *stream, const float *x, size_t n, double *sum_p);
zpp_status zpp_sops_adamw_cuda(void *stream, float *param, float *m, float *v,
                               const float *grad, size_t n, const zpp_adamw_args *a,
                               void *work, zpp_dtype work_dtype);
#endif

#ifdef __cplusplus
}
#endif

#endif

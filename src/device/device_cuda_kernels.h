/* device/device_cuda_kernels.h — the CUDA backend's own kernels (device_cuda_kernels.cu),
 * called by device_cuda.c. Internal to device/. Each enqueues on `stream`
 * (a cudaStream_t) and returns launch errors as ZPP_ERR_CUDA; the front
 * (device.c) has checked the arguments. */
#ifndef ZPP_DEVICE_DEVICE_CUDA_KERNELS_H
#define ZPP_DEVICE_DEVICE_CUDA_KERNELS_H

#include <stddef.h>

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

zpp_status zpp_dcu_add(void *stream, float *acc, const float *x, size_t n);
/* Whether the current GPU can run this build's kernels: cudaSuccess (0), or
 * the cudaError_t of asking for one kernel's attributes (no image in the
 * build for the GPU's architecture, docs/gpus.md). Clears the error. */
int zpp_dcu_image_check(void);
/* Enqueues array j's sum (its elements of dtype dt) into tmp_dev[j] (k
 * doubles in device memory) for every j, copies the k sums to sums[] and
 * waits for the stream once. */
zpp_status zpp_dcu_sumsq(void *stream, const void *const *x, const size_t *n, int k,
                         zpp_dtype dt, double *tmp_dev, double *sums);
/* grad holds a->grad_dtype elements. */
zpp_status zpp_dcu_adamw(void *stream, float *param, float *m, float *v, void *grad,
                         size_t n, const zpp_adamw_args *a, void *work, zpp_dtype work_dtype);
/* zpp_device_master_split / zpp_device_master_join (lo may be NULL in the split). */
zpp_status zpp_dcu_master_split(void *stream, const float *x, uint16_t *hi, uint16_t *lo,
                                size_t n);
zpp_status zpp_dcu_master_join(void *stream, const uint16_t *hi, const uint16_t *lo, float *x,
                               size_t n);

#ifdef __cplusplus
}
#endif

#endif

/* device/device_caps.h — what a GPU can compute, by its compute capability
 * (docs/gpus.md, "Precision per generation").
 *
 * zeropp runs on NVIDIA GPUs of compute capability 7.0 (Volta) and newer:
 *   fp32  everywhere (CUDA cores; cuBLASLt in plain fp32, no TF32)
 *   fp16  everywhere (tensor cores from 7.0), trained with loss scaling
 *   bf16  from 8.0 (Ampere): cuBLASLt's bf16 products and the fused
 *         attention's bf16 tensor-core instructions need it
 * The rules are pure functions of the numbers, so a CPU test checks them
 * (tests/test_gpu_arch.c); what asks a real GPU is
 * zpp_device_compute_capability. */
#ifndef ZPP_DEVICE_DEVICE_CAPS_H
#define ZPP_DEVICE_DEVICE_CAPS_H

#include <stddef.h>

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The oldest compute capability zeropp supports, and the one bf16 needs,
 * as 10 * major + minor. */
#define ZPP_CC_MIN 70
#define ZPP_CC_BF16 80

/* Whether a GPU of compute capability cc_major.cc_minor can compute in
 * `dtype`: ZPP_OK (msg gets ""), or ZPP_ERR_UNSUPPORTED with the reason and
 * what to use instead in msg ("bf16 needs compute capability 8.0 or newer
 * (this GPU is 7.5); use fp16 ..."); ZPP_ERR_INVALID for an unknown dtype
 * or a negative capability. msg is NUL-terminated, cut to n - 1 bytes (NULL
 * with n 0 asks for no text). Pure: it records no error (zpp_last_error is
 * untouched); the caller raises one with the text. */
zpp_status zpp_device_dtype_check(int cc_major, int cc_minor, zpp_dtype dtype, char *msg,
                                  size_t n);

/* The compute capability of d's GPU (9.0 for an H200). ZPP_ERR_INVALID for
 * the host device, which has none; ZPP_ERR_CUDA when the driver cannot say. */
zpp_status zpp_device_compute_capability(const zpp_device *d, int *major_p, int *minor_p);

/* Internal: the backend's query of GPU `ordinal` (device_caps_cuda.c;
 * ZPP_ERR_UNSUPPORTED in a build without CUDA, device_caps_none.c). */
zpp_status zpp__device_gpu_cc(int ordinal, int *major_p, int *minor_p);

#ifdef __cplusplus
}
#endif

#endif

/* device/device_caps_cuda.c — the compute capability of a GPU, from the
 * CUDA runtime (device_caps.h; device_caps_none.c in a build without CUDA). */
#include <cuda_runtime_api.h>

#include "core/error.h"
#include "device/device_caps.h"

zpp_status zpp__device_gpu_cc(int ordinal, int *major_p, int *minor_p) {
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zpp_error(ZPP_ERR_CUDA, "compute capability of GPU %d: %s (%s)", ordinal,
                         cudaGetErrorString(e), cudaGetErrorName(e));
    }
    *major_p = major;
    *minor_p = minor;
    return ZPP_OK;
}

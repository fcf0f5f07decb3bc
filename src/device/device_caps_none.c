/* device/device_caps_none.c — device_caps_cuda.c in a build without CUDA
 * (there is no GPU device to ask about). */
#include "core/error.h"
#include "device/device_caps.h"

zpp_status zpp__device_gpu_cc(int ordinal, int *major_p, int *minor_p) {
    (void)major_p;
    (void)minor_p;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "compute capability of GPU %d: this build has no CUDA", ordinal);
}

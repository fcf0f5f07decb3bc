/* device/device_cuda_none.c — the GPU backend in a build without CUDA
 * (CMake compiles this file instead of device_cuda.c and device_cuda_kernels.cu),
 * so that callers need no #ifdef: asking for a GPU fails with a message. */
#include "core/error.h"
#include "device/device.h"

zpp_status zpp_device_create_gpu(int ordinal, zpp_device **d_p) {
    (void)ordinal;
    (void)d_p;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "device: GPU %d requested, but this build has no CUDA; rebuild with nvcc "
                     "on the PATH, or use the host backend (--device cpu)",
                     ordinal);
}

int zpp_device_gpu_count(void) { return 0; }

const char *zpp_device_cuda_build(void) { return NULL; }

zpp_status zpp_device_gpu_bus_id(int ordinal, char *buf, size_t cap) {
    if (buf && cap) buf[0] = '\0';
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "device: the bus id of GPU %d was asked for, but this build has no CUDA",
                     ordinal);
}

/* cuda_testlib.h — shared plumbing of the GPU tests (label gpu). */
#ifndef ZPP_CUDA_TESTLIB_H
#define ZPP_CUDA_TESTLIB_H

#include <cuda_runtime_api.h>
#include <stdio.h>

#include "testlib.h"

/* Fails the test with CUDA's error name and message. */
#define CUDA_OK(call)                                                         \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess)                                                \
            zpp_test_fail(__FILE__, __LINE__, #call, " -> %s: %s",            \
                          cudaGetErrorName(e_), cudaGetErrorString(e_));       \
    } while (0)

/* Fails with a clear message when no GPU is visible (the test must run on a
 * machine with one: ctest -L gpu); prints the device once. */
static inline void zpp_test_require_device(const char *what) {
    static int checked = 0;
    if (checked) return;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        zpp_test_fail(__FILE__, __LINE__, NULL,
                      "no CUDA device is visible (%s): %s and must run on a machine with an "
                      "NVIDIA GPU (ctest -L gpu)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "device count 0", what);
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("  device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    checked = 1;
}

#endif

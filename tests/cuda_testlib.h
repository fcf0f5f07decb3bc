/* cuda_testlib.h — shared plumbing of the GPU tests (label gpu).
 *
 * Plain C on the device API (device/device.h): no CUDA runtime call here,
 * so the tests' memory, copies and synchronisation go through the same
 * backend the library uses. */
#ifndef ZPP_CUDA_TESTLIB_H
#define ZPP_CUDA_TESTLIB_H

#include <stdio.h>

#include "device/device.h"
#include "testlib.h"

/* Skips the test (zpp_test_skip) when no GPU is visible: it must run on a
 * machine with one (ctest -L gpu). Otherwise opens GPU 0 and prints its
 * name the first time. The caller owns the device (zpp_device_destroy). */
static inline zpp_device *zpp_test_gpu_open(const char *what) {
    static int printed = 0;
    if (zpp_device_gpu_count() == 0)
        zpp_test_skip("no CUDA device is visible (device count 0): %s and must run on a "
                      "machine with an NVIDIA GPU (ctest -L gpu)",
                      what);
    zpp_device *d = NULL;
    EXPECT_OK(zpp_device_create_gpu(0, &d));
    if (!printed) {
        char name[256];
        EXPECT_OK(zpp_device_name(d, name, sizeof name));
        printf("  device: %s\n", name);
        printed = 1;
    }
    return d;
}

#endif

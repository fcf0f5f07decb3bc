/* cuda_testlib.h — shared plumbing of the GPU tests (label gpu).
 *
 * Plain C on the device API (device/device.h): no CUDA runtime call here,
 * so the tests' memory, copies and synchronisation go through the same
 * backend the library uses. */
#ifndef ZPP_CUDA_TESTLIB_H
#define ZPP_CUDA_TESTLIB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A device buffer of `bytes` followed by ZPP_TEST_GUARD bytes of
 * ZPP_TEST_POISON (0xFF: NaN in fp32, bf16 and fp16), so a kernel that
 * writes past its output, or leaves part of it unwritten, is seen. */
#define ZPP_TEST_GUARD 256
#define ZPP_TEST_POISON 0xFF
typedef struct zpp_test_dbuf {
    zpp_device *dev;
    void *p;
    size_t bytes;
} zpp_test_dbuf;

static inline zpp_test_dbuf zpp_test_dbuf_make(zpp_device *d, size_t bytes) {
    zpp_test_dbuf b = {d, NULL, bytes};
    EXPECT_OK(zpp_device_alloc(d, bytes + ZPP_TEST_GUARD, &b.p));
    EXPECT_OK(zpp_device_set(d, b.p, ZPP_TEST_POISON, bytes + ZPP_TEST_GUARD));
    return b;
}

static inline void zpp_test_dbuf_free(zpp_test_dbuf *b) {
    if (b->p) zpp_device_free(b->dev, b->p);
    b->p = NULL;
}

static inline void zpp_test_dbuf_poison(const zpp_test_dbuf *b) {
    EXPECT_OK(zpp_device_set(b->dev, b->p, ZPP_TEST_POISON, b->bytes + ZPP_TEST_GUARD));
}

static inline void zpp_test_dbuf_put(const zpp_test_dbuf *b, const void *h) {
    EXPECT_OK(zpp_device_copy(b->dev, b->p, h, b->bytes));
}

/* Waits for the kernels, copies the buffer back, checks its guard zone. */
static inline void zpp_test_dbuf_get(const zpp_test_dbuf *b, void *h, const char *ctx) {
    EXPECT_OK(zpp_device_sync(b->dev, NULL));
    unsigned char *tmp = (unsigned char *)zpp_test_malloc(b->bytes + ZPP_TEST_GUARD);
    EXPECT_OK(zpp_device_copy(b->dev, tmp, b->p, b->bytes + ZPP_TEST_GUARD));
    for (size_t i = 0; i < ZPP_TEST_GUARD; i++)
        EXPECT(tmp[b->bytes + i] == ZPP_TEST_POISON,
               "%s: byte %zu past the end of the %zu-byte buffer was written (0x%02x)", ctx, i,
               b->bytes, tmp[b->bytes + i]);
    memcpy(h, tmp, b->bytes);
    free(tmp);
}

#endif

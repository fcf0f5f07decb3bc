/* test_core.c — status codes, error messages, dtype conversions, host memory
 * (through the host device; the device itself is tested in test_device.c). */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "testlib.h"

static zpp_status fails_with_context(void) {
    zpp_status s = zpp_error(ZPP_ERR_INVALID, "block %d is odd", 7);
    return zpp_error_context(s, "quantize");
}

static void test_status_and_messages(void) {
    EXPECT(strcmp(zpp_status_str(ZPP_OK), "success") == 0);
    EXPECT(strcmp(zpp_status_str(ZPP_ERR_NONFINITE), "non-finite value (NaN or Inf)") == 0);
    EXPECT(strcmp(zpp_status_str((zpp_status)-999), "unknown status") == 0);
    EXPECT_STATUS(fails_with_context(), ZPP_ERR_INVALID);
    EXPECT(strcmp(zpp_last_error(), "quantize: block 7 is odd") == 0, "got '%s'",
           zpp_last_error());
    zpp_dtype d;
    EXPECT_OK(zpp_dtype_parse("bf16", &d));
    EXPECT(d == ZPP_BF16);
    EXPECT_STATUS(zpp_dtype_parse("int3", &d), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "int3") != NULL);
}

/* bf16 rounding: compare against a double-precision round-half-even of the
 * 8-bit-mantissa value on fresh random fp32 bit patterns. */
static void test_bf16_round_to_nearest_even(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)zpp_rng_u64(&r);
        float f;
        memcpy(&f, &u, 4);
        zpp_bf16 h = zpp_f32_to_bf16(f);
        float g = zpp_bf16_to_f32(h);
        if (isnan(f)) {
            EXPECT(isnan(g), "NaN became %g", g);
            continue;
        }
        if (isinf(f)) {
            EXPECT(g == f);
            continue;
        }
        /* the two bf16 neighbours of f */
        uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
        float lo, hi;
        memcpy(&lo, &lo_bits, 4);
        memcpy(&hi, &hi_bits, 4);
        /* Past the largest bf16 the upper neighbour is 2^128 (IEEE rounds
         * to Inf from the midpoint up). */
        double dhi_val = isfinite(hi) ? (double)hi : copysign(ldexp(1.0, 128), f);
        double dlo = fabs((double)f - lo), dhi = fabs((double)f - dhi_val);
        if (dlo < dhi) EXPECT(g == lo, "f=%a got %a", f, g);
        else if (dhi < dlo) EXPECT(g == hi, "f=%a got %a", f, g);
        else EXPECT(((u >> 16) & 1) ? g == hi : g == lo, "tie f=%a got %a", f, g);
    }
}

static void test_host_memory(void) {
    zpp_device *d = NULL;
    EXPECT_OK(zpp_device_create_host(&d));
    void *p = NULL, *q = NULL;
    EXPECT_OK(zpp_device_alloc(d, 1000, &p));
    EXPECT(((uintptr_t)p & 63) == 0, "not 64-byte aligned");
    EXPECT_OK(zpp_device_alloc(d, 1000, &q));
    EXPECT_OK(zpp_device_set(d, p, 0x5a, 1000));
    EXPECT_OK(zpp_device_copy(d, q, p, 1000));
    EXPECT(((unsigned char *)q)[999] == 0x5a);
    zpp_device_free(d, p);
    zpp_device_free(d, q);
    zpp_device_destroy(d);
}

ZPP_TESTS(ZPP_TEST(test_status_and_messages), ZPP_TEST(test_bf16_round_to_nearest_even),
          ZPP_TEST(test_host_memory))

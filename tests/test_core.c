/* test_core.c — status codes, error messages, dtype conversions, host memory
 * (through the host device; the device itself is tested in test_device.c),
 * the environment table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "core/suggest.h"
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

/* The first failure's message is the one kept (issue 29): cleanup runs
 * held, and a timeout latches until cleared. */
static void test_first_failure_kept(void) {
    zpp_error_clear();
    zpp_error(ZPP_ERR_COMM, "first");
    zpp_error_hold();
    zpp_error_hold(); /* nests */
    EXPECT_STATUS(zpp_error(ZPP_ERR_STATE, "cleanup"), ZPP_ERR_STATE);
    EXPECT_STATUS(zpp_error_context(ZPP_ERR_STATE, "ctx"), ZPP_ERR_STATE);
    EXPECT_STATUS(zpp_error_append(ZPP_ERR_STATE, "more"), ZPP_ERR_STATE);
    zpp_error_release();
    zpp_error(ZPP_ERR_STATE, "still held");
    zpp_error_release();
    EXPECT(strcmp(zpp_last_error(), "first") == 0, "got '%s'", zpp_last_error());
    zpp_error_release(); /* unbalanced: harmless */
    zpp_error(ZPP_ERR_COMM, "second"); /* not held: replaces */
    EXPECT(strcmp(zpp_last_error(), "second") == 0, "got '%s'", zpp_last_error());
    /* a timeout latches: later errors return their status, the message stays */
    zpp_error(ZPP_ERR_TIMEOUT, "allgather timed out");
    EXPECT_STATUS(zpp_error(ZPP_ERR_STATE, "refused"), ZPP_ERR_STATE);
    EXPECT_STATUS(zpp_error(ZPP_ERR_TIMEOUT, "another timeout"), ZPP_ERR_TIMEOUT);
    zpp_error_context(ZPP_ERR_TIMEOUT, "step %d", 3); /* context still goes in front */
    zpp_error_append(ZPP_ERR_TIMEOUT, "(detail)");
    EXPECT(strcmp(zpp_last_error(), "step 3: allgather timed out (detail)") == 0, "got '%s'",
           zpp_last_error());
    zpp_error_clear();
    zpp_error(ZPP_ERR_STATE, "after clear");
    EXPECT(strcmp(zpp_last_error(), "after clear") == 0, "got '%s'", zpp_last_error());
    zpp_error_clear();
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

/* The edit distance (core/suggest.h) against the textbook full-table
 * recurrence (optimal string alignment), on random strings of a small
 * alphabet (so that matches and transpositions occur); then the suggestion
 * rule on names one typo away from a list's entries. */
static size_t osa_reference(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    static size_t d[40][40];
    for (size_t i = 0; i <= n; i++) d[i][0] = i;
    for (size_t j = 0; j <= m; j++) d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + (a[i - 1] != b[j - 1]) < best)
                best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

static void test_edit_distance_and_suggest(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    char a[40], b[40];
    for (int trial = 0; trial < 2000; trial++) {
        size_t n = zpp_rng_u64(&r) % 12, m = zpp_rng_u64(&r) % 12;
        for (size_t i = 0; i < n; i++) a[i] = (char)('a' + zpp_rng_u64(&r) % 3);
        for (size_t j = 0; j < m; j++) b[j] = (char)('a' + zpp_rng_u64(&r) % 3);
        a[n] = b[m] = '\0';
        size_t got = zpp_edit_distance(a, b), want = osa_reference(a, b);
        EXPECT(got == want, "'%s' vs '%s': %zu, reference %zu", a, b, got, want);
        EXPECT(zpp_edit_distance(b, a) == got, "not symmetric: '%s' '%s'", a, b);
    }
    /* a name with one random typo (a letter changed, dropped, added or two
     * swapped) suggests itself among unrelated names; nothing close, nothing */
    const char *names[] = {"--steps", "--seed", "--config", "--resume", "--metrics"};
    for (int trial = 0; trial < 200; trial++) {
        const char *w = names[zpp_rng_u64(&r) % 5];
        size_t n = strlen(w), at = 2 + zpp_rng_u64(&r) % (n - 3);
        char t[40];
        memcpy(t, w, n + 1);
        switch (zpp_rng_u64(&r) % 4) {
        case 0: t[at] = t[at] == 'x' ? 'y' : 'x'; break;
        case 1: memmove(t + at, t + at + 1, n - at); break;
        case 2: memmove(t + at + 1, t + at, n - at + 1), t[at] = 'q'; break;
        default: {
            char c = t[at];
            t[at] = t[at + 1];
            t[at + 1] = c;
        }
        }
        const char *s = zpp_suggest(t, names, 5);
        EXPECT(s && zpp_edit_distance(t, s) <= 1, "'%s' (from %s) suggests %s", t, w,
               s ? s : "nothing");
    }
    EXPECT(zpp_suggest("--bogus", names, 5) == NULL, "--bogus suggests something");
    EXPECT(zpp_suggest("x", names, 5) == NULL);
}

/* core/env.h: names unique, a value read when asked for (empty = unset),
 * and a default that never replaces what the user set. */
static void test_environment_table(void) {
    for (int a = 0; a < ZPP_ENV_COUNT; a++) {
        EXPECT(zpp_env_doc((zpp_env_var)a)[0] != '\0', "%s has no doc", zpp_env_name((zpp_env_var)a));
        for (int b = a + 1; b < ZPP_ENV_COUNT; b++)
            EXPECT(strcmp(zpp_env_name((zpp_env_var)a), zpp_env_name((zpp_env_var)b)) != 0,
                   "%s twice in the table", zpp_env_name((zpp_env_var)a));
    }
    /* A fresh random value each run, so no stale environment can pass. */
    zpp_rng r = zpp_rng_make(zpp_test_seed(5));
    char mine[32];
    snprintf(mine, sizeof mine, "%llu", (unsigned long long)(zpp_rng_u64(&r) % 1000000 + 2));
    const char *nvls = zpp_env_name(ZPP_ENV_NCCL_NVLS_ENABLE);
    setenv(nvls, mine, 1);
    EXPECT(zpp_env_default(ZPP_ENV_NCCL_NVLS_ENABLE, "0") == 0);
    EXPECT(strcmp(getenv(nvls), mine) == 0, "the user's %s=%s became %s", nvls, mine,
           getenv(nvls));
    EXPECT(strcmp(zpp_env_get(ZPP_ENV_NCCL_NVLS_ENABLE), mine) == 0);
    setenv(nvls, "", 1);
    EXPECT(zpp_env_get(ZPP_ENV_NCCL_NVLS_ENABLE) == NULL, "an empty value counts as set");
    unsetenv(nvls);
    EXPECT(zpp_env_get(ZPP_ENV_NCCL_NVLS_ENABLE) == NULL);
    EXPECT(zpp_env_default(ZPP_ENV_NCCL_NVLS_ENABLE, "0") == 0);
    EXPECT(getenv(nvls) && strcmp(getenv(nvls), "0") == 0, "unset %s was not defaulted", nvls);
    EXPECT(zpp_env_get(ZPP_ENV_COUNT) == NULL && zpp_env_get((zpp_env_var)-1) == NULL);
}

ZPP_TESTS(ZPP_TEST(test_status_and_messages), ZPP_TEST(test_first_failure_kept),
          ZPP_TEST(test_bf16_round_to_nearest_even),
          ZPP_TEST(test_host_memory), ZPP_TEST(test_edit_distance_and_suggest),
          ZPP_TEST(test_environment_table))

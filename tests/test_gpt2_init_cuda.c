/* test_gpt2_init_cuda.c — the CUDA GPT-2's init_params_device (initial
 * weights drawn on the GPU, straight into device memory) against its
 * init_params (drawn on the host): the same bits, element for element.
 *
 * Both evaluate zpp_gpt2_init_value (gpt2.h), whose normal sample uses
 * only correctly rounded double operations that neither compiler fuses
 * (core/random.h), so nothing short of equality is right: a last-ulp
 * difference in a log or a cos would change the fp32 rounding of a few
 * values in a billion, and an fma contracted on one side only would show
 * as single-ulp differences here.
 *
 * Checked on odd shapes (C = 21, T = 13, V = 37 with a padded vocabulary)
 * and on a unit of 13 million elements (V = 50257), for fresh seeds each
 * run: every element of every unit in one call; every rank's shard of a
 * unit split over 2, 3, 4 and 7 ranks (ceil(numel / W) each, the last one
 * short), as the engine asks for them; random (offset, count) slices; and
 * that nothing past count is written. Also the refusals: a unit or a range
 * out of bounds, a host pointer.
 *
 * Needs an NVIDIA GPU (label "gpu"); without one it skips saying so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/random.h"
#include "device/device.h"
#include "model/gpt2.h"
#include "model/model.h"
#include "cuda_testlib.h"
#include "testlib.h"

/* Elements past `count` that must keep their sentinel. */
#define GUARD 64

typedef struct init_fixture {
    zpp_device *dev;
    zpp_model *m;
    float *dbuf;   /* device, the largest unit + GUARD */
    float *host;   /* host init_params of a range */
    float *back;   /* the device's values copied back */
} init_fixture;

static void fixture_open(init_fixture *f, const zpp_gpt2_config *cfg) {
    f->dev = zpp_test_gpu_open("test_gpt2_init_cuda checks the CUDA GPT-2's device init");
    EXPECT_OK(zpp_gpt2_cuda_create(cfg, ZPP_FP32, 1, f->dev, &f->m));
    EXPECT(f->m->ops->init_params_device != NULL, "the CUDA GPT-2 has no init_params_device");
    size_t most = 0;
    for (int u = 0; u < f->m->n_units; u++)
        if (f->m->unit_numel[u] > most) most = f->m->unit_numel[u];
    EXPECT_OK(zpp_device_alloc(f->dev, (most + GUARD) * sizeof(float), (void **)&f->dbuf));
    f->host = zpp_test_malloc((most + GUARD) * sizeof(float));
    f->back = zpp_test_malloc((most + GUARD) * sizeof(float));
}

static void fixture_close(init_fixture *f) {
    zpp_device_free(f->dev, f->dbuf);
    f->m->ops->destroy(f->m);
    zpp_device_destroy(f->dev);
    free(f->host);
    free(f->back);
}

/* Elements [offset, offset + count) of `unit` from both paths: the device's
 * written at the start of a buffer of NaN sentinels (all bits set), the
 * host's into host memory; equal bits, and the GUARD sentinels after the
 * range untouched. */
static void check_range(init_fixture *f, int unit, size_t offset, size_t count,
                        uint64_t seed) {
    size_t bytes = (count + GUARD) * sizeof(float);
    EXPECT_OK(zpp_device_set(f->dev, f->dbuf, 0xff, bytes));
    EXPECT_OK(f->m->ops->init_params_device(f->m, unit, offset, count, f->dbuf, seed));
    EXPECT_OK(zpp_device_sync(f->dev, NULL));
    EXPECT_OK(zpp_device_copy(f->dev, f->back, f->dbuf, bytes));
    EXPECT_OK(f->m->ops->init_params(f->m, unit, offset, count, f->host, seed));
    for (size_t k = 0; k < count; k++) {
        uint32_t a, b;
        memcpy(&a, &f->back[k], 4);
        memcpy(&b, &f->host[k], 4);
        EXPECT(a == b, "unit %d element %zu (slice at %zu, %zu long, seed %llu): device %a, "
               "host %a", unit, offset + k, offset, count, (unsigned long long)seed,
               (double)f->back[k], (double)f->host[k]);
    }
    for (size_t k = count; k < count + GUARD; k++) {
        uint32_t a;
        memcpy(&a, &f->back[k], 4);
        EXPECT(a == 0xffffffffu, "unit %d: element %zu past the %zu asked for was written",
               unit, k, count);
    }
}

/* Every unit whole, every rank's shard for several world sizes, and random
 * slices. */
static void check_model(const zpp_gpt2_config *cfg, zpp_rng *r) {
    init_fixture f;
    fixture_open(&f, cfg);
    uint64_t seed = zpp_rng_u64(r);
    const int worlds[] = {2, 3, 4, 7};
    for (int u = 0; u < f.m->n_units; u++) {
        size_t numel = f.m->unit_numel[u];
        check_range(&f, u, 0, numel, seed);
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
            size_t shard = (numel + (size_t)worlds[w] - 1) / (size_t)worlds[w];
            for (size_t begin = 0; begin < numel; begin += shard)
                check_range(&f, u, begin, numel - begin < shard ? numel - begin : shard, seed);
        }
        for (int k = 0; k < 8; k++) {
            size_t offset = zpp_rng_u64(r) % numel;
            size_t count = 1 + zpp_rng_u64(r) % (numel - offset);
            check_range(&f, u, offset, count, zpp_rng_u64(r));
        }
    }
    printf("  L=%d C=%d T=%d V=%d: %d units, device init equals host init\n", cfg->n_layer,
           cfg->n_embd, cfg->seq_len, cfg->vocab_size, f.m->n_units);
    fixture_close(&f);
}

static void test_device_init_matches_host(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    const zpp_gpt2_config odd = {3, 3, 21, 13, 37, 31, 0, 0};
    const zpp_gpt2_config wide = {2, 4, 256, 64, 50257, 0, 0, 0};
    check_model(&odd, &r);
    check_model(&wide, &r);
}

/* normal_cuda.cu */
int zpp_test_normal_parts_device(const double *u1, const double *u2, double *log_u1,
                                 double *cos_u2, double *z, size_t n);

/* The doubles under the weights: log u1, cos 2 pi u2 and the Box-Muller
 * sample, on the device and on the host, equal bit for bit, for random
 * (u1, u2) on Box-Muller's grid and the ends of its range. */
static void test_normal_parts_match_host(void) {
    zpp_device *dev = zpp_test_gpu_open("test_gpt2_init_cuda checks the device's normal sample");
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    const size_t n = (size_t)1 << 22;
    double *h[5], *d[5]; /* u1, u2, log u1, cos 2 pi u2, z */
    for (int k = 0; k < 5; k++) {
        h[k] = zpp_test_malloc(n * sizeof(double));
        EXPECT_OK(zpp_device_alloc(dev, n * sizeof(double), (void **)&d[k]));
    }
    for (size_t i = 0; i < n; i++) {
        h[0][i] = (double)((zpp_rng_u64(&r) >> 11) + 1) * 0x1.0p-53;
        h[1][i] = (double)(zpp_rng_u64(&r) >> 11) * 0x1.0p-53;
    }
    const double ends[][2] = {{1.0, 0.0}, {0x1.0p-53, 0.25}, {0.5, 0.5}, {1.0 - 0x1.0p-53, 0.75},
                              {0x1.6a09e667f3bcdp-1, 1.0 - 0x1.0p-53}, {0.125, 0.125}};
    for (size_t e = 0; e < sizeof ends / sizeof ends[0]; e++) {
        h[0][e] = ends[e][0];
        h[1][e] = ends[e][1];
    }
    EXPECT_OK(zpp_device_copy(dev, d[0], h[0], n * sizeof(double)));
    EXPECT_OK(zpp_device_copy(dev, d[1], h[1], n * sizeof(double)));
    EXPECT_OK(zpp_device_sync(dev, NULL));
    int e = zpp_test_normal_parts_device(d[0], d[1], d[2], d[3], d[4], n);
    EXPECT(e == 0, "normal kernel: CUDA error %d", e);
    const char *what[5] = {"", "", "log u1", "cos 2 pi u2", "Box-Muller z"};
    double *back = zpp_test_malloc(n * sizeof(double));
    for (int k = 2; k < 5; k++) {
        EXPECT_OK(zpp_device_copy(dev, back, d[k], n * sizeof(double)));
        for (size_t i = 0; i < n; i++) {
            double want = k == 2 ? zpp_log_positive(h[0][i])
                          : k == 3 ? zpp_cos_2pi(h[1][i])
                                   : zpp_box_muller(h[0][i], h[1][i]);
            EXPECT(memcmp(&back[i], &want, sizeof want) == 0,
                   "%s at u1 = %a, u2 = %a: device %a, host %a", what[k], h[0][i], h[1][i],
                   back[i], want);
        }
    }
    printf("  %zu samples: log, cos and Box-Muller equal on device and host\n", n);
    free(back);
    for (int k = 0; k < 5; k++) {
        free(h[k]);
        zpp_device_free(dev, d[k]);
    }
    zpp_device_destroy(dev);
}

static void test_device_init_refuses(void) {
    const zpp_gpt2_config cfg = {2, 3, 21, 13, 37, 0, 0, 0};
    init_fixture f;
    fixture_open(&f, &cfg);
    zpp_status (*dev_init)(zpp_model *, int, size_t, size_t, float *, uint64_t) =
        f.m->ops->init_params_device;
    size_t n0 = f.m->unit_numel[0];
    EXPECT_STATUS(dev_init(f.m, -1, 0, 1, f.dbuf, 1), ZPP_ERR_INVALID);
    EXPECT_STATUS(dev_init(f.m, f.m->n_units, 0, 1, f.dbuf, 1), ZPP_ERR_INVALID);
    EXPECT_STATUS(dev_init(f.m, 0, n0, 1, f.dbuf, 1), ZPP_ERR_INVALID);
    EXPECT_STATUS(dev_init(f.m, 0, 1, n0, f.dbuf, 1), ZPP_ERR_INVALID);
    EXPECT_STATUS(dev_init(f.m, 0, 0, 1, f.host, 1), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "host memory") != NULL, "%s", zpp_last_error());
    EXPECT_OK(dev_init(f.m, 0, n0, 0, f.dbuf, 1)); /* nothing to write */
    EXPECT_OK(zpp_device_sync(f.dev, NULL));
    fixture_close(&f);
}

ZPP_TESTS(ZPP_TEST_GPU(test_normal_parts_match_host), ZPP_TEST_GPU(test_device_init_matches_host),
          ZPP_TEST_GPU(test_device_init_refuses))

/* test_gpu_arch.c — what runs on which NVIDIA GPU, decided on the CPU (no
 * GPU needed; docs/gpus.md):
 *   - zpp_device_dtype_check (device/device_caps.h): fp32 and fp16 from
 *     compute capability 7.0, bf16 from 8.0, nothing below 7.0, and
 *     messages that name the GPU's capability and the way out;
 *   - zpp_attn_path_pick (model/attention_path.h): the fused attention
 *     only for bf16, head size 64 or 128, on 8.0 or newer, and what
 *     ZPP_ATTENTION (auto: cuDNN there, gemm, fused, cudnn, anything else)
 *     does to that;
 *   - zpp_attn_cudnn_open hands "auto" back to the fused kernels where cuDNN
 *     cannot build its plans, and fails "cudnn" naming cuDNN;
 *   - zpp_device_compute_capability refuses the host device.
 * The GPU side of the same rules (the CUDA model refusing bf16 below 8.0,
 * ZPP_ATTENTION=gemm taking the GEMM path) is in test_gpt2_cuda.c. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "device/device.h"
#include "device/device_caps.h"
#include "model/attention_cudnn.h"
#include "model/attention_path.h"
#include "testlib.h"

/* The GPUs the rules must get right, by compute capability. */
static const struct {
    int major, minor;
    const char *name;
} kGpus[] = {{6, 1, "Pascal (P40)"}, {7, 0, "Volta (V100)"},   {7, 5, "Turing (T4)"},
             {8, 0, "Ampere (A100)"}, {8, 6, "Ampere (A10)"},  {8, 9, "Ada (L4)"},
             {9, 0, "Hopper (H200)"}, {10, 0, "Blackwell (B200)"}, {12, 0, "Blackwell (RTX)"}};
#define N_GPUS (sizeof kGpus / sizeof kGpus[0])

static void test_dtype_by_capability(void) {
    const zpp_dtype dts[] = {ZPP_FP32, ZPP_FP16, ZPP_BF16};
    for (size_t i = 0; i < N_GPUS; i++) {
        const int cc = 10 * kGpus[i].major + kGpus[i].minor;
        for (size_t k = 0; k < 3; k++) {
            char msg[320];
            memset(msg, 'x', sizeof msg);
            zpp_error_clear();
            zpp_status st = zpp_device_dtype_check(kGpus[i].major, kGpus[i].minor, dts[k], msg,
                                                   sizeof msg);
            const int want_ok = cc >= 70 && (dts[k] != ZPP_BF16 || cc >= 80);
            EXPECT(st == (want_ok ? ZPP_OK : ZPP_ERR_UNSUPPORTED), "%s %d.%d %s: %s (%s)",
                   kGpus[i].name, kGpus[i].major, kGpus[i].minor, zpp_dtype_name(dts[k]),
                   zpp_status_str(st), msg);
            EXPECT(strlen(msg) < sizeof msg, "message not terminated");
            EXPECT(zpp_last_error()[0] == '\0', "a pure check recorded an error: %s",
                   zpp_last_error());
            if (want_ok) {
                EXPECT(msg[0] == '\0', "%s: ok, but a message: %s", kGpus[i].name, msg);
                continue;
            }
            /* the message names this GPU's capability */
            char cap[32]; /* room for any two ints */
            snprintf(cap, sizeof cap, "is %d.%d", kGpus[i].major, kGpus[i].minor);
            EXPECT(strstr(msg, cap), "%s: message does not say '%s': %s", kGpus[i].name, cap,
                   msg);
            printf("  %s, %s: %s\n", kGpus[i].name, zpp_dtype_name(dts[k]), msg);
        }
    }
}

/* The message of the issue, word for word where it matters: what bf16
 * needs, what this GPU is, and both ways out (fp16 with loss scaling,
 * fp32). */
static void test_bf16_message_offers_fp16_and_fp32(void) {
    char msg[320];
    EXPECT_STATUS(zpp_device_dtype_check(7, 5, ZPP_BF16, msg, sizeof msg), ZPP_ERR_UNSUPPORTED);
    EXPECT(strncmp(msg, "bf16 needs compute capability 8.0 or newer (this GPU is 7.5)", 60) == 0,
           "%s", msg);
    EXPECT(strstr(msg, "fp16 with loss scaling") && strstr(msg, "\"fp16\": {\"enabled\": true}"),
           "no fp16 way out: %s", msg);
    EXPECT(strstr(msg, "fp32"), "no fp32 way out: %s", msg);
    /* Volta: the same, with its own number */
    EXPECT_STATUS(zpp_device_dtype_check(7, 0, ZPP_BF16, msg, sizeof msg), ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(msg, "(this GPU is 7.0)"), "%s", msg);
    /* below Volta: nothing runs, whatever the dtype */
    EXPECT_STATUS(zpp_device_dtype_check(6, 1, ZPP_FP32, msg, sizeof msg), ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(msg, "7.0 (Volta) or newer") && strstr(msg, "6.1"), "%s", msg);
}

static void test_dtype_check_arguments(void) {
    char msg[64];
    EXPECT_STATUS(zpp_device_dtype_check(8, 0, (zpp_dtype)7, msg, sizeof msg), ZPP_ERR_INVALID);
    EXPECT(strstr(msg, "unknown dtype 7"), "%s", msg);
    EXPECT_STATUS(zpp_device_dtype_check(-1, 0, ZPP_FP32, msg, sizeof msg), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_device_dtype_check(8, 10, ZPP_FP32, msg, sizeof msg), ZPP_ERR_INVALID);
    /* no room for a message: the status alone */
    EXPECT_STATUS(zpp_device_dtype_check(7, 5, ZPP_BF16, NULL, 0), ZPP_ERR_UNSUPPORTED);
    EXPECT_OK(zpp_device_dtype_check(9, 0, ZPP_BF16, NULL, 0));
    /* a short buffer is cut, still terminated */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    EXPECT_STATUS(zpp_device_dtype_check(7, 5, ZPP_BF16, tiny, sizeof tiny), ZPP_ERR_UNSUPPORTED);
    EXPECT(strcmp(tiny, "bf16 ne") == 0, "'%.8s'", tiny);
}

/* auto: fused exactly where it can run; gemm: never; fused: where it can,
 * else ZPP_ERR_UNSUPPORTED saying why. */
static void test_attention_path_rule(void) {
    const zpp_dtype dts[] = {ZPP_FP32, ZPP_FP16, ZPP_BF16};
    const int hss[] = {16, 32, 64, 96, 128, 256};
    const char *modes[] = {NULL, "", "auto", "gemm", "fused", "cudnn"};
    for (size_t i = 0; i < N_GPUS; i++)
        for (size_t k = 0; k < 3; k++)
            for (size_t h = 0; h < sizeof hss / sizeof hss[0]; h++)
                for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
                    const int cc = 10 * kGpus[i].major + kGpus[i].minor;
                    const int can = dts[k] == ZPP_BF16 && (hss[h] == 64 || hss[h] == 128) &&
                                    cc >= 80;
                    const char *mode = modes[m];
                    const int gemm = mode && strcmp(mode, "gemm") == 0;
                    const int fused = mode && strcmp(mode, "fused") == 0;
                    const int cudnn = mode && strcmp(mode, "cudnn") == 0;
                    zpp_attn_path path = (zpp_attn_path)-1;
                    char msg[256];
                    zpp_status st = zpp_attn_path_pick(mode, dts[k], hss[h], kGpus[i].major,
                                                       kGpus[i].minor, &path, msg, sizeof msg);
                    const char *what = mode ? mode : "(unset)";
                    if ((fused || cudnn) && !can) {
                        EXPECT(st == ZPP_ERR_UNSUPPORTED, "%s %s hs %d %s: %s", kGpus[i].name,
                               zpp_dtype_name(dts[k]), hss[h], what, zpp_status_str(st));
                        EXPECT(path == (zpp_attn_path)-1, "path set on failure");
                        EXPECT(strstr(msg, fused ? "ZPP_ATTENTION=fused" : "ZPP_ATTENTION=cudnn") &&
                                   strstr(msg, "gemm"),
                               "%s", msg);
                        continue;
                    }
                    EXPECT(st == ZPP_OK, "%s %s hs %d %s: %s (%s)", kGpus[i].name,
                           zpp_dtype_name(dts[k]), hss[h], what, zpp_status_str(st), msg);
                    /* auto prefers cuDNN where the fused kernels could run */
                    const zpp_attn_path want = gemm ? ZPP_ATTN_GEMM
                                               : !can ? ZPP_ATTN_GEMM
                                               : fused ? ZPP_ATTN_FUSED
                                                       : ZPP_ATTN_CUDNN;
                    EXPECT(path == want, "%s %s hs %d %s: path %d, want %d", kGpus[i].name,
                           zpp_dtype_name(dts[k]), hss[h], what, (int)path, (int)want);
                    EXPECT(msg[0] == '\0', "ok with a message: %s", msg);
                }
}

static void test_attention_path_reasons(void) {
    zpp_attn_path path;
    char msg[256];
    EXPECT_STATUS(zpp_attn_path_pick("fused", ZPP_BF16, 64, 7, 5, &path, msg, sizeof msg),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(msg, "compute capability 8.0 or newer, and this GPU is 7.5"), "%s", msg);
    EXPECT_STATUS(zpp_attn_path_pick("fused", ZPP_FP16, 64, 9, 0, &path, msg, sizeof msg),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(msg, "bf16, and this model is fp16"), "%s", msg);
    EXPECT_STATUS(zpp_attn_path_pick("fused", ZPP_BF16, 48, 9, 0, &path, msg, sizeof msg),
                  ZPP_ERR_UNSUPPORTED);
    EXPECT(strstr(msg, "head size is 64 or 128, and this model's is 48"), "%s", msg);
    /* anything else is a mistake, not a silent auto */
    const char *bad[] = {"GEMM", "flash", "gemm ", "0", "cuDNN"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_STATUS(zpp_attn_path_pick(bad[i], ZPP_BF16, 64, 9, 0, &path, msg, sizeof msg),
                      ZPP_ERR_INVALID);
        EXPECT(strstr(msg, "not one of auto, gemm, fused, cudnn"), "%s: %s", bad[i], msg);
    }
}

static void test_host_has_no_capability(void) {
    zpp_device *d = NULL;
    EXPECT_OK(zpp_device_create_host(&d));
    int major = -1, minor = -1;
    EXPECT_STATUS(zpp_device_compute_capability(d, &major, &minor), ZPP_ERR_INVALID);
    EXPECT(major == -1 && minor == -1, "outputs set on failure: %d.%d", major, minor);
    EXPECT_STATUS(zpp_device_compute_capability(NULL, &major, &minor), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_device_compute_capability(d, NULL, &minor), ZPP_ERR_INVALID);
    zpp_device_destroy(d);
}

/* The model's half of the cuDNN choice (zpp_attn_cudnn_open): where
 * cuDNN cannot build its plans (here: a build without cuDNN, or no GPU to
 * build them on) "auto" hands back to the fused kernels, no error left
 * behind, and "cudnn" fails naming cuDNN. On a machine where cuDNN does
 * build them the context opens and closes. */
static void test_cudnn_open_falls_back(void) {
    zpp_device *d = NULL;
    EXPECT_OK(zpp_device_create_host(&d));
    const char *modes[] = {NULL, "auto", "cudnn"};
    for (int k = 0; k < 3; k++) {
        zpp_attn_cudnn_use u;
        memset(&u, 0xA5, sizeof u); /* open sets every field */
        zpp_error_clear();
        zpp_status st = zpp_attn_cudnn_open(&u, modes[k], d, 2, 64, 4, 4, 64, NULL);
        if (u.ctx) { /* cuDNN built its plans (a GPU and cuDNN here) */
            EXPECT_OK(st);
            EXPECT(u.workspace != NULL, "a context without its workspace");
        } else if (k < 2) {
            EXPECT(st == ZPP_OK && u.workspace == NULL, "%s: %s, workspace %p",
                   modes[k] ? modes[k] : "(unset)", zpp_status_str(st), u.workspace);
            EXPECT(zpp_last_error()[0] == '\0', "auto left an error behind: %s",
                   zpp_last_error());
        } else {
            EXPECT(st != ZPP_OK && strstr(zpp_last_error(), "cuDNN"), "cudnn: %s: %s",
                   zpp_status_str(st), zpp_last_error());
        }
        zpp_attn_cudnn_close(&u);
        zpp_attn_cudnn_close(&u); /* twice is fine */
        EXPECT(u.ctx == NULL && u.workspace == NULL, "close left the context");
    }
    zpp_device_destroy(d);
}

ZPP_TESTS(ZPP_TEST(test_dtype_by_capability), ZPP_TEST(test_bf16_message_offers_fp16_and_fp32),
          ZPP_TEST(test_dtype_check_arguments), ZPP_TEST(test_attention_path_rule),
          ZPP_TEST(test_attention_path_reasons), ZPP_TEST(test_host_has_no_capability),
          ZPP_TEST(test_cudnn_open_falls_back))

/* model/attention_path.c — which attention the CUDA models run
 * (attention_path.h). In every build: a rule on numbers and a string, and
 * the model's half of the cuDNN choice (zpp_attn_cudnn_open), which builds
 * cuDNN's plans or, where it cannot, hands back to the fused kernels. */
#include "model/attention_path.h"

#include "core/error.h"
#include "model/attention_cudnn.h"

#include <stdio.h>
#include <string.h>

#include "device/device_caps.h"

zpp_status zpp_attn_path_pick(const char *mode, zpp_dtype dtype, int hs, int cc_major,
                              int cc_minor, zpp_attn_path *path_p, char *msg, size_t n) {
    char why[160] = "";
    if (dtype != ZPP_BF16)
        snprintf(why, sizeof why, "it computes in bf16, and this model is %s",
                 zpp_dtype_name(dtype));
    else if (!zpp_attn_head_size_fused(hs))
        snprintf(why, sizeof why, "its head size is 64 or 128, and this model's is %d", hs);
    else if (10 * cc_major + cc_minor < ZPP_CC_BF16)
        snprintf(why, sizeof why,
                 "it needs compute capability %d.%d or newer, and this GPU is %d.%d",
                 ZPP_CC_BF16 / 10, ZPP_CC_BF16 % 10, cc_major, cc_minor);
    const int fused_ok = why[0] == '\0';
    zpp_attn_path path;
    if (!mode || !mode[0] || strcmp(mode, "auto") == 0) {
        path = fused_ok ? ZPP_ATTN_CUDNN : ZPP_ATTN_GEMM;
    } else if (strcmp(mode, "gemm") == 0) {
        path = ZPP_ATTN_GEMM;
    } else if (strcmp(mode, "fused") == 0 || strcmp(mode, "cudnn") == 0) {
        if (!fused_ok) {
            if (msg && n)
                snprintf(msg, n,
                         "ZPP_ATTENTION=%s, but the %s attention cannot run here: %s; "
                         "unset ZPP_ATTENTION (or set it to auto or gemm) for the GEMM path",
                         mode, mode, why);
            return ZPP_ERR_UNSUPPORTED;
        }
        path = mode[0] == 'f' ? ZPP_ATTN_FUSED : ZPP_ATTN_CUDNN;
    } else {
        if (msg && n)
            snprintf(msg, n, "ZPP_ATTENTION=%.40s is not one of auto, gemm, fused, cudnn", mode);
        return ZPP_ERR_INVALID;
    }
    if (msg && n) msg[0] = '\0';
    *path_p = path;
    return ZPP_OK;
}

zpp_status zpp_attn_cudnn_open(zpp_attn_cudnn_use *u, const char *mode, zpp_device *dev,
                               int B_max, int T, int H, int KV, int hs, void *stream) {
    memset(u, 0, sizeof *u);
    size_t bytes = 0;
    zpp_status st = zpp_attn_cudnn_create(&u->ctx, B_max, T, H, KV, hs, stream, &bytes);
    if (st == ZPP_OK) {
        u->dev = dev;
        st = zpp_device_alloc(dev, bytes ? bytes : 256, &u->workspace);
        if (st == ZPP_OK) return ZPP_OK;
        zpp_attn_cudnn_close(u);
        return st; /* out of device memory: not cuDNN's refusal */
    }
    if (mode && strcmp(mode, "cudnn") == 0) return st; /* its message says why */
    zpp_error_clear(); /* "auto": the fused kernels, as before cuDNN */
    return ZPP_OK;
}

void zpp_attn_cudnn_close(zpp_attn_cudnn_use *u) {
    if (u->workspace) zpp_device_free(u->dev, u->workspace);
    zpp_attn_cudnn_free(u->ctx);
    memset(u, 0, sizeof *u);
}

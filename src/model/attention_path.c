/* model/attention_path.c — which attention the CUDA models run
 * (attention_path.h). In every build: a rule on numbers and a string. */
#include "model/attention_path.h"

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
        path = fused_ok ? ZPP_ATTN_FUSED : ZPP_ATTN_GEMM;
    } else if (strcmp(mode, "gemm") == 0) {
        path = ZPP_ATTN_GEMM;
    } else if (strcmp(mode, "fused") == 0) {
        if (!fused_ok) {
            if (msg && n)
                snprintf(msg, n,
                         "ZPP_ATTENTION=fused, but the fused attention cannot run here: %s; "
                         "unset ZPP_ATTENTION (or set it to auto or gemm) for the GEMM path",
                         why);
            return ZPP_ERR_UNSUPPORTED;
        }
        path = ZPP_ATTN_FUSED;
    } else {
        if (msg && n)
            snprintf(msg, n, "ZPP_ATTENTION=%.40s is not one of auto, gemm, fused", mode);
        return ZPP_ERR_INVALID;
    }
    if (msg && n) msg[0] = '\0';
    *path_p = path;
    return ZPP_OK;
}

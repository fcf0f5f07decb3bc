/* model/attention_cudnn_none.c — attention_cudnn.h in a build without cuDNN
 * (CMake compiles this file instead of attention_cudnn.c when cudnn.h or
 * libcudnn is not found, or without CUDA): every call is refused, and the
 * models keep their own attention kernels. */
#include "core/error.h"
#include "model/attention_cudnn.h"

static zpp_status refuse(void) {
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "attention (cuDNN): built without cuDNN; install cuDNN 9 next to the CUDA "
                     "toolkit (cudnn.h, libcudnn.so) and rebuild, or use our kernels");
}

zpp_status zpp_attn_cudnn_create(zpp_attn_cudnn **ctx_p, int B_max, int T, int H, int KV,
                                 int hs, void *stream, size_t *workspace_bytes) {
    (void)B_max, (void)T, (void)H, (void)KV, (void)hs, (void)stream;
    if (ctx_p) *ctx_p = NULL;
    if (workspace_bytes) *workspace_bytes = 0;
    return refuse();
}

zpp_status zpp_attn_cudnn_forward(zpp_attn_cudnn *ctx, void *y, float *lse, const void *qkv,
                                  int B, void *workspace) {
    (void)ctx, (void)y, (void)lse, (void)qkv, (void)B, (void)workspace;
    return refuse();
}

zpp_status zpp_attn_cudnn_backward(zpp_attn_cudnn *ctx, void *dqkv, const void *dy,
                                   const void *qkv, const void *y, const float *lse, int B,
                                   void *workspace) {
    (void)ctx, (void)dqkv, (void)dy, (void)qkv, (void)y, (void)lse, (void)B, (void)workspace;
    return refuse();
}

size_t zpp_attn_cudnn_workspace(const zpp_attn_cudnn *ctx) {
    (void)ctx;
    return 0;
}

const char *zpp_attn_cudnn_trace(const zpp_attn_cudnn *ctx) {
    (void)ctx;
    return "";
}

void zpp_attn_cudnn_free(zpp_attn_cudnn *ctx) { (void)ctx; }

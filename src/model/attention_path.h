/* model/attention_path.h — which attention the CUDA models (GPT-2 and
 * Llama) run (docs/gpus.md, "Attention").
 *
 * Three implementations compute the same causal self-attention, all with
 * grouped-query heads (KV key/value heads shared by H query heads):
 *   cudnn  attention_cudnn.c: cuDNN's fused flash-attention engines, where
 *          the build has cuDNN, on the fused kernels' domain below; the
 *          same activations (an lse a row), plus a workspace;
 *   fused  attention_cuda.cu, FlashAttention-2 style: bf16 only, head size
 *          64 or 128, compute capability 8.0 or newer (cp.async and bf16
 *          mma.sync); no T x T matrix in memory;
 *   gemm   attention_gemm_cuda.cu: strided-batched cuBLASLt products and a
 *          causal softmax kernel, any dtype, head size and GPU, keeping the
 *          T x T probabilities per (sequence, head, layer).
 * The choice is made once, when a model is created, from the ZPP_ATTENTION
 * environment variable (read there, passed here):
 *   unset, "" or "auto"  cudnn where fused can run, else gemm; the model
 *                        takes fused when cuDNN cannot (a build without
 *                        it, a shape its engines refuse: zpp_attn_cudnn_open);
 *   "gemm"               gemm (on any GPU: how the fallback of GPUs below
 *                        8.0 is tested on a newer one);
 *   "fused"              fused, or an error saying why it cannot run;
 *   "cudnn"              cudnn, or an error saying why it cannot run.
 * The planner (plan/cost.c) applies the same rule, unset, to count a
 * Llama's activations. A pure function, so the rule is tested on the CPU
 * (tests/test_gpu_arch.c). */
#ifndef ZPP_MODEL_ATTENTION_PATH_H
#define ZPP_MODEL_ATTENTION_PATH_H

#include <stddef.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zpp_attn_path {
    ZPP_ATTN_GEMM = 0,
    ZPP_ATTN_FUSED = 1,
    ZPP_ATTN_CUDNN = 2, /* with "auto": fused where cuDNN cannot */
} zpp_attn_path;

/* The head sizes the fused kernels are compiled for. */
static inline int zpp_attn_head_size_fused(int hs) { return hs == 64 || hs == 128; }

/* The path for `mode` (ZPP_ATTENTION's value, NULL when unset), a model in
 * `dtype` with head size hs, on a GPU of compute capability
 * cc_major.cc_minor: *path_p and ZPP_OK; ZPP_ERR_UNSUPPORTED when "fused"
 * is asked for where it cannot run, ZPP_ERR_INVALID for another mode, with
 * the reason in msg (NUL-terminated, cut to n - 1 bytes; "" on success).
 * Pure: records no error, touches no GPU. */
zpp_status zpp_attn_path_pick(const char *mode, zpp_dtype dtype, int hs, int cc_major,
                              int cc_minor, zpp_attn_path *path_p, char *msg, size_t n);

#ifdef __cplusplus
}
#endif

#endif

/* model/attention_gemm_cuda.h — causal self-attention by matrix products,
 * the "gemm" path of every CUDA decoder (attention_path.h says when it
 * runs): strided-batched cuBLASLt products (cuda_ops.h) around a causal
 * softmax kernel, for any working dtype E (fp32, bf16, fp16), any head size
 * and any GPU, multi-head (GPT-2) or grouped-query (Llama: KV key/value
 * heads, H % KV == 0, query head h reading key/value head h / (H / KV)).
 *
 * Layouts: attention_cuda.h's (rows n = b*T + t, C = H*hs, Ck = KV*hs,
 * qkv and dqkv N x (C + 2Ck) as [q | k | v], y and dy N x C), plus the
 * T x T matrices this path keeps, per (sequence b, query head h) at element
 * (b*H + h)*T*T, row t = query, column j = key:
 *   prob    E     the probabilities P, upper triangle (j > t) zero:
 *                 written by the forward, read by the backward, so the
 *                 caller keeps one per layer (B*H*T*T elements);
 *   score   fp32  scratch: the scaled scores in the forward, d P in the
 *                 backward;
 *   dscore  E     scratch of the backward: d S.
 *
 * The math, per (b, h), c = 1/sqrt(hs), Q = q head h, K and V = k and v
 * head h / g (g = H / KV):
 *   forward   S = c Q K^T (fp32),  P = softmax(S + causal mask) (E),  Y = P V;
 *   backward  dP = dY V^T (fp32),  dS = P * (dP - rowsum(P * dP)) (E),
 *             dQ = c dS K,  dK = c sum_h dS^T Q,  dV = sum_h P^T dY,
 * the last two summed over the g query heads h sharing the key/value head.
 * Every product reads E and accumulates in fp32 (CUBLAS_COMPUTE_32F: true
 * fp32 FMA for E = fp32, no TF32). The backward overwrites dqkv. A shared
 * head's dK, dV are added head by head in a fixed order (the group's first
 * query head writes, the others add: beta 0, then 1), each partial sum
 * stored in E: the same inputs give the same bits, and with KV = H (a
 * group of one) this is exactly the multi-head computation GPT-2 always
 * ran. With a 16-bit E the g - 1 additions round g - 1 more times than the
 * fused kernel, which sums a group in fp32 before one rounding.
 *
 * Every call enqueues on cu's stream, returns without waiting, allocates
 * nothing; every pointer is device memory. A bad shape is ZPP_ERR_INVALID
 * before anything is launched; launch errors come back as ZPP_ERR_CUDA.
 *
 * zpp_attn_run_forward / _backward (last below) are what a decoder calls:
 * they run whichever of the three paths it picked at create. */
#ifndef ZPP_MODEL_ATTENTION_GEMM_CUDA_H
#define ZPP_MODEL_ATTENTION_GEMM_CUDA_H

#include "model/attention_cudnn.h"
#include "model/cuda_ops.h"

/* The shape of one call: B sequences of T tokens, H query heads, KV
 * key/value heads, head size hs. */
typedef struct zpp_attn_gemm_shape {
    int B, T, H, KV, hs;
} zpp_attn_gemm_shape;

/* y (E, N x C) and prob from qkv; score is scratch. */
zpp_status zpp_attn_gemm_forward(zpp_cu *cu, const zpp_attn_gemm_shape *s, void *y, void *prob,
                                 float *score, const void *qkv);

/* dqkv (E, N x (C + 2Ck)), overwritten, from dy and the forward's prob and
 * qkv; score and dscore are scratch. */
zpp_status zpp_attn_gemm_backward(zpp_cu *cu, const zpp_attn_gemm_shape *s, void *dqkv,
                                  float *score, void *dscore, const void *dy, const void *prob,
                                  const void *qkv);

/* A decoder's attention by the path it picked (attention_path.h): cuDNN's
 * engines where cudnn->ctx is set, else our fused kernels (attention_cuda.h,
 * grouped-query form; KV = H gives the multi-head bits) when fused, else the
 * products above. att is the layer's fp32 lse on the fused paths, its P in E
 * on the products'; dsum is the fused backward's scratch, score and dscore
 * the products'. */
zpp_status zpp_attn_run_forward(zpp_cu *cu, const zpp_attn_cudnn_use *cudnn, int fused,
                                const zpp_attn_gemm_shape *s, void *y, void *att, float *score,
                                const void *qkv);
zpp_status zpp_attn_run_backward(zpp_cu *cu, const zpp_attn_cudnn_use *cudnn, int fused,
                                 const zpp_attn_gemm_shape *s, void *dqkv, const void *dy,
                                 const void *qkv, const void *y, const void *att, float *dsum,
                                 float *score, void *dscore);

#endif

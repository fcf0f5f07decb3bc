/* model/attention_cuda.h — fused causal self-attention for the CUDA models
 * (FlashAttention-2 style, bf16 tensor cores; attention_cuda.cu says how):
 * multi-head (GPT-2) and grouped-query (Llama: KV key/value heads shared by
 * H query heads, H % KV == 0, query head h reading key/value head
 * h / (H / KV); KV = H is multi-head, KV = 1 multi-query).
 *
 * Layouts (the models', rows n = b*T + t for B sequences of T tokens,
 * C = H*hs, Ck = KV*hs, all row-major bf16):
 *   qkv   N x (C + 2Ck)  columns [0,C) q, [C,C+Ck) k, [C+Ck,C+2Ck) v; head
 *                  h at columns h*hs .. h*hs+hs-1 inside each part (llama.h's
 *                  [q | k | v] row; with KV = H GPT-2's N x 3C)
 *   y     N x C    head h at columns h*hs
 *   dy    N x C    as y
 *   dqkv  N x (C + 2Ck)  as qkv; d k and d v of a shared head are the sums
 *                  over its H / KV query heads, in a fixed order
 *   lse   B*H*T    fp32, entry (b*H + h)*T + t: the natural log of
 *                  sum_{j<=t} exp(q_t . k_j / sqrt(hs)), written by the
 *                  forward, read by the backward
 *   dsum  B*H*T    fp32 scratch of the backward (same indexing)
 *
 * Per (b, h): S = Q K^T / sqrt(hs), causal (key j > query i excluded),
 * P = softmax(S) by rows, Y = P V. The backward writes (overwrites, does not
 * accumulate) dQ, dK, dV into dqkv from dY, the forward's y and lse, and q,
 * k, v. It is deterministic: the same inputs give the same bits.
 *
 * Every pointer is device memory, 16-byte aligned (lse and dsum: 4-byte);
 * every call enqueues on `stream` (a cudaStream_t; NULL is the legacy
 * default stream), returns without synchronising, and allocates nothing.
 * Launch errors come back as ZPP_ERR_CUDA; a fault while running shows up
 * at the stream's next synchronisation. Head sizes (hd, Llama's head dim)
 * 64 and 128 only:
 * anything else is ZPP_ERR_UNSUPPORTED (the model then takes the GEMM
 * path, attention_gemm_cuda.h); zpp_attn_supported asks without doing anything. The current GPU
 * must have compute capability 8.0 or newer: below, forward and backward
 * return ZPP_ERR_UNSUPPORTED (attention_path.h says which path runs where). */
#ifndef ZPP_MODEL_ATTENTION_CUDA_H
#define ZPP_MODEL_ATTENTION_CUDA_H

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ZPP_OK for hs 64 and 128; ZPP_ERR_UNSUPPORTED (with a message) otherwise. */
zpp_status zpp_attn_supported(int hs);

/* y = softmax(Q K^T / sqrt(hs) + causal mask) V per (b, h); lse as above. */
zpp_status zpp_attn_forward(void *y, float *lse, const void *qkv, int B, int T, int H, int hs,
                            void *stream);

/* dqkv = the gradient of sum(dy * y) with respect to qkv, from the forward's
 * y and lse; dsum is B*H*T floats of scratch (rowsum(dy * y)). */
zpp_status zpp_attn_backward(void *dqkv, const void *dy, const void *qkv, const void *y,
                             const float *lse, float *dsum, int B, int T, int H, int hs,
                             void *stream);

/* The same with KV key/value heads (1 <= KV, H % KV == 0, else
 * ZPP_ERR_INVALID): zpp_attn_forward / _backward are these with KV = H,
 * and give the same bits as before grouped queries existed. */
zpp_status zpp_attn_gqa_forward(void *y, float *lse, const void *qkv, int B, int T, int H,
                                int KV, int hs, void *stream);
zpp_status zpp_attn_gqa_backward(void *dqkv, const void *dy, const void *qkv, const void *y,
                                 const float *lse, float *dsum, int B, int T, int H, int KV,
                                 int hs, void *stream);

#ifdef __cplusplus
}
#endif

#endif

/* model/cpu_kernels.h — the CPU reference's arithmetic that is no one
 * family's (cpu_kernels.c, where each formula is written out): the pieces
 * a decoder's CPU model composes its blocks and its head from. fp32, on
 * the first n rows of row-major buffers, never allocating; GPT-2's CPU
 * model (gpt2_cpu.c) is built from them, and keeps only what is GPT-2's
 * own (the learned position embedding, the tanh GELU, the tied head), and
 * so is Llama's (llama_cpu.c: its own are RoPE and SwiGLU).
 * The CUDA model's counterparts are still inside gpt2_cuda.cu (decoder.h
 * lists them). */
#ifndef ZPP_MODEL_CPU_KERNELS_H
#define ZPP_MODEL_CPU_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LayerNorm's epsilon, PyTorch's default and GPT-2's. */
#define ZPP_CPU_LN_EPS 1e-5f

/* out[n x OC] = (or += when accumulate) inp[n x IC] W^T + bias, W [OC][IC];
 * bias may be NULL (none). */
void zpp_cpu_linear_forward(float *out, const float *inp, const float *W, const float *bias, int n,
                            int IC, int OC, int accumulate);
/* Its backward: dinp = dout W (overwritten), dW += dout^T inp, db += the
 * column sums of dout (db NULL: no bias). */
void zpp_cpu_linear_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp,
                             const float *W, int n, int IC, int OC);

/* LayerNorm of each row of C, gain w and bias b; keeps each row's mean and
 * 1/std for the backward, which accumulates (+=) into dinp, dw and db. */
void zpp_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int n, int C);
void zpp_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int n, int C);

/* Causal self-attention of B sequences of T rows, H heads of C / H, from
 * rows [q | k | v] of 3C (every head its own keys and values); keeps the
 * probabilities att (B x H x T x T) for the backward, which writes dqkv
 * and uses a T x T scratch. */
void zpp_cpu_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H);
void zpp_cpu_attention_backward(float *dqkv, float *scratch, const float *dy, const float *att,
                                const float *qkv, int B, int T, int C, int H);

/* The same for grouped-query attention: rows [q | k | v] of (H + 2 KV) hs,
 * H query heads of hs sharing KV key/value heads (query head h reads
 * head h / (H / KV)); y is H hs wide. The two above are these with KV = H. */
void zpp_cpu_gqa_attention_forward(float *y, float *att, const float *qkv, int B, int T, int H,
                                   int KV, int hs);
void zpp_cpu_gqa_attention_backward(float *dqkv, float *scratch, const float *dy,
                                    const float *att, const float *qkv, int B, int T, int H,
                                    int KV, int hs);

/* RMSNorm of each row of C, gain w (no bias), epsilon eps; keeps each
 * row's 1 / rms for the backward, which accumulates (+=) into dinp and dw. */
void zpp_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int n,
                             int C, float eps);
void zpp_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                              const float *w, const float *rstd, int n, int C);

/* Softmax over the first Vr of V columns of n rows of logits, in place
 * (the padded columns get 0), and each row's cross-entropy in losses
 * against targets (NULL for a batch without: the losses then mean
 * nothing); returns the sum of the losses. The backward turns the probabilities into
 * d loss / d logits times `scale`, in place. */
double zpp_cpu_cross_entropy_forward(float *probs, float *losses, const int32_t *targets, int n,
                                     int V, int Vr);
void zpp_cpu_cross_entropy_backward(float *probs, const int32_t *targets, int n, int V,
                                    float scale);

#ifdef __cplusplus
}
#endif

#endif

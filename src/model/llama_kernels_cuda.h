/* model/llama_kernels_cuda.h — the Llama family's own CUDA kernels, the
 * pieces the CUDA Llama model composes beside the shared GEMMs and the
 * fused attention (attention_cuda.h): RMSNorm, rotary position embedding
 * and SwiGLU, forward and backward. Each mirrors a function of the CPU
 * reference (llama_cpu.c, cpu_kernels.c) with the same formula and the same
 * placement of eps; llama_kernels_cuda.cu says how each runs.
 *
 * Layouts are the CPU model's (llama.h): rows n = b*T + t for B sequences
 * of T tokens, row-major, C = n_embd, hd = C / H the head dim, a qkv row
 * [q | k | v] of (H + 2 KV) hd (H query heads, then KV key heads, then KV
 * value heads), a gate/up row [gate | up] of 2F.
 *
 * dtype is the working dtype E of the buffers marked E below (ZPP_FP32,
 * ZPP_BF16 or ZPP_FP16); everything marked fp32 is float. Values are read
 * into fp32, computed in fp32, and rounded to E once when stored.
 *
 * Every pointer is device memory, aligned to its element; every call
 * enqueues on `stream` (a cudaStream_t; NULL is the legacy default stream),
 * returns without synchronising, and allocates nothing. A bad argument is
 * ZPP_ERR_INVALID before anything is launched; a launch error is
 * ZPP_ERR_CUDA; a fault while running shows up at the stream's next
 * synchronisation. Every kernel is deterministic (no atomics, every sum in
 * a fixed order): the same inputs give the same bits. */
#ifndef ZPP_MODEL_LLAMA_KERNELS_CUDA_H
#define ZPP_MODEL_LLAMA_KERNELS_CUDA_H

#include <stddef.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RMSNorm (zpp_cpu_rmsnorm_forward / _backward) ----
 * out (E, n x C) = x * r * w, r = 1 / sqrt(mean(x^2) + eps) per row of the
 * fp32 residual inp (n x C); w (E, C) the gain; rstd (fp32, n) keeps r for
 * the backward. */
zpp_status zpp_llama_rmsnorm_forward(void *out, float *rstd, const float *inp, const void *w,
                                     int n, int C, float eps, zpp_dtype dtype, void *stream);

/* Floats of scratch zpp_llama_rmsnorm_backward needs for n rows of C: one
 * partial column sum per chunk of rows (0 when n or C < 1). */
size_t zpp_llama_rmsnorm_backward_scratch(int n, int C);

/* With xh = x r and g = dout w (dout fp32, n x C):
 *   dinp += r (g - xh mean(g xh))     (fp32, n x C: the residual gradient)
 *   dw   += sum over rows of dout xh  (fp32, C: the gain's gradient)
 * from the forward's inp, w (E) and rstd; scratch as above. dw is summed
 * rows-in-chunks, then chunks in order: no atomics. */
zpp_status zpp_llama_rmsnorm_backward(float *dinp, float *dw, float *scratch, const float *dout,
                                      const float *inp, const void *w, const float *rstd, int n,
                                      int C, zpp_dtype dtype, void *stream);

/* ---- rotary position embedding (llama_cpu.c's rope_apply) ----
 * In place on the q and k heads of qkv (E, B*T rows of (H + 2 KV) hd; the
 * v heads are not touched): pair (i, i + hd/2) of every head of row
 * n = b*T + t turns by the angle of position t, HF's rotate-half
 *   (a, b) -> (a cos - b sin, b cos + a sin),
 * with cos_t, sin_t (fp32, T x hd/2 each, row t = position t) the host's
 * zpp_llama_rope_tables (llama.h: rope_theta and the llama3 scaling)
 * copied to the device once. hd must be even, 1 <= KV <= H. */
zpp_status zpp_llama_rope_forward(void *qkv, const float *cos_t, const float *sin_t, int B,
                                  int T, int H, int KV, int hd, zpp_dtype dtype, void *stream);

/* The backward, in place on d qkv (the same layout): a rotation's inverse
 * is its transpose, the turn by minus the angle, (a, b) -> (a cos + b sin,
 * b cos - a sin); d v passes through untouched. */
zpp_status zpp_llama_rope_backward(void *dqkv, const float *cos_t, const float *sin_t, int B,
                                   int T, int H, int KV, int hd, zpp_dtype dtype, void *stream);

/* ---- SwiGLU (llama_cpu.c's swiglu_forward / _backward) ----
 * act (E, n x F) = silu(gate) * up from gu (E, n rows [gate | up] of 2F,
 * the one product with the concatenated [Wgate | Wup]), silu(u) =
 * u sigmoid(u). */
zpp_status zpp_llama_swiglu_forward(void *act, const void *gu, int n, int F, zpp_dtype dtype,
                                    void *stream);

/* dgu (E, n rows [d gate | d up] of 2F, written, not accumulated) from
 * dact (E, n x F) and the forward's gu: with s = sigmoid(gate),
 *   d up = dact silu(gate),  d gate = dact up s (1 + gate (1 - s)). */
zpp_status zpp_llama_swiglu_backward(void *dgu, const void *dact, const void *gu, int n, int F,
                                     zpp_dtype dtype, void *stream);

#ifdef __cplusplus
}
#endif

#endif

/* model/attention_cudnn.h — the causal self-attention of attention_cuda.h
 * (same problem, layouts, lse and grouped-query rule; read that header
 * first), computed by cuDNN's fused flash-attention engines instead of our
 * kernels.
 *
 * How. cuDNN has no "attention" call in its C API for Hopper at this
 * version: its backend (cudnn_graph.h) takes a graph of elementary
 * operations (batched matmuls, pointwise ops, reductions, reshapes) over
 * tensors described by dims and strides, and its heuristics find an engine
 * that runs the whole graph as one fused kernel. attention_cudnn.c builds
 * the graph the fused engines recognise:
 *   forward   S = Q K^T, S *= 1/sqrt(hs), S = (row >= col) ? S : -inf,
 *             m = rowmax S, E = exp(S - m), l = rowsum E,
 *             lse = m + log l (fp32, written), P = E / l (bf16), Y = P V
 *   backward  D = rowsum(dY * Y) (fp32, in the workspace),
 *             P = exp(mask(Q K^T / sqrt(hs)) - lse), dV = P^T dY,
 *             dS = P (dY V^T - D) / sqrt(hs), dK = dS^T Q, dQ = dS K
 * Q, K and V are read in place from the qkv rows through strides (no copy),
 * y and dy likewise, and dQ, dK, dV written in place into dqkv
 * (overwritten). With grouped queries (KV < H) K and V have KV heads and
 * dK, dV sum over each group (cuDNN's own reduction over the heads).
 *
 * Building a plan (finding an engine, compiling it) takes from milliseconds
 * to a second, so it happens once: zpp_attn_cudnn_create builds the forward
 * and backward plans for one shape and keeps them in a context. Calls with
 * a smaller batch B build that batch's plans on their first use (kept too,
 * a few at most). Only deterministic engines are taken (an engine cuDNN
 * marks CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC is skipped): the backward
 * gives the same bits for the same inputs, as our kernels do; when cuDNN
 * offers no deterministic engine the call is ZPP_ERR_UNSUPPORTED, and the
 * caller keeps our kernels.
 *
 * Memory. The forward and backward allocate nothing: they use a workspace
 * of *workspace_bytes (given by create; the larger of the two plans' needs
 * plus the backward's D) that the caller allocates once, device memory,
 * 256-byte aligned (cudaMalloc's), and passes to every call; one call at a
 * time may use it. Pointers as in attention_cuda.h (16-byte aligned, lse
 * 4-byte). Calls enqueue on the stream given to create and return without
 * synchronising; the context is not thread-safe.
 *
 * Errors: ZPP_ERR_UNSUPPORTED for a build without cuDNN, a shape or GPU
 * cuDNN's engines refuse, or no deterministic engine (the message says
 * which, with cuDNN's own status text); ZPP_ERR_INVALID for bad arguments;
 * ZPP_ERR_CUDA when cuDNN fails to run. zpp_attn_cudnn_trace gives the list
 * of backend calls that failed while building (attribute names, statuses,
 * engines tried), for debugging; nothing is printed. */
#ifndef ZPP_MODEL_ATTENTION_CUDNN_H
#define ZPP_MODEL_ATTENTION_CUDNN_H

#include <stddef.h>

#include "device/device.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_attn_cudnn zpp_attn_cudnn;

/* Builds the plans for batches of B_max sequences of T tokens, H query
 * heads, KV key/value heads (H % KV == 0) of size hs, on the current GPU
 * and `stream` (a cudaStream_t); *workspace_bytes gets the workspace every
 * call needs. On failure *ctx_p is NULL (zpp_attn_cudnn_trace(NULL) then
 * gives this thread's trace of that attempt). */
zpp_status zpp_attn_cudnn_create(zpp_attn_cudnn **ctx_p, int B_max, int T, int H, int KV,
                                 int hs, void *stream, size_t *workspace_bytes);

/* y, lse from qkv for B <= B_max sequences (layouts of attention_cuda.h). */
zpp_status zpp_attn_cudnn_forward(zpp_attn_cudnn *ctx, void *y, float *lse, const void *qkv,
                                  int B, void *workspace);

/* dqkv (overwritten) from dy, qkv and the forward's y and lse. */
zpp_status zpp_attn_cudnn_backward(zpp_attn_cudnn *ctx, void *dqkv, const void *dy,
                                   const void *qkv, const void *y, const float *lse, int B,
                                   void *workspace);

/* The workspace size create reported. */
size_t zpp_attn_cudnn_workspace(const zpp_attn_cudnn *ctx);

/* What happened while building the plans: each failing backend call
 * (descriptor, attribute, status, cuDNN's message) and each engine tried or
 * skipped, one per line; "" when none. ctx NULL: the calling thread's last
 * failed create. Valid until the next call on the context (or create). */
const char *zpp_attn_cudnn_trace(const zpp_attn_cudnn *ctx);

/* NULL is a no-op. */
void zpp_attn_cudnn_free(zpp_attn_cudnn *ctx);

/* A model's cuDNN attention (path ZPP_ATTN_CUDNN, attention_path.h): the
 * context for its largest batch and the workspace, from dev (counted in
 * its peak). */
typedef struct zpp_attn_cudnn_use {
    zpp_attn_cudnn *ctx; /* NULL: the model runs attention_cuda.h's kernels */
    void *workspace;
    zpp_device *dev;
} zpp_attn_cudnn_use;

/* Opens it for the model at create. When cuDNN cannot (a build without it,
 * a shape or GPU its engines refuse, no deterministic engine): with mode
 * "cudnn" (ZPP_ATTENTION's value) that error; otherwise ZPP_OK and
 * u->ctx NULL, the fused kernels taking over (same buffers). */
zpp_status zpp_attn_cudnn_open(zpp_attn_cudnn_use *u, const char *mode, zpp_device *dev,
                               int B_max, int T, int H, int KV, int hs, void *stream);
void zpp_attn_cudnn_close(zpp_attn_cudnn_use *u); /* zeroed after; twice is fine */

#ifdef __cplusplus
}
#endif

#endif

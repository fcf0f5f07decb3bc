/* model/gpt2_cuda.cu — the CUDA GPT-2: the same model as the CPU reference
 * (gpt2_cpu.c, whose header comment writes out the math), with parameters,
 * gradients and activations in device memory.
 *
 * Units, stages, parameter layout and initialisation come from gpt2.h, so
 * a checkpoint or an engine shard means the same thing on either model.
 *
 * PRECISION. The model computes in its working dtype E, the dtype of the
 * parameters the engine hands it (fp32, bf16 or fp16):
 *   - every matrix product reads its two operands in E (weights straight
 *     from the gathered unit, no copy) and accumulates in fp32
 *     (CUBLAS_COMPUTE_32F); with bf16 / fp16 that runs on tensor cores;
 *   - what only feeds matrix products is stored in E: the LayerNorm
 *     outputs, qkv, the attention probabilities and output, the MLP's
 *     hidden layer, the logits (HEAD), and in the backward the gradients
 *     flowing into products (d logits, d hidden, d qkv, the attention's d
 *     scores);
 *   - what carries the signal across layers or through a reduction stays
 *     fp32: the residual stream and its gradient, LayerNorm statistics,
 *     the attention scores before the softmax, the loss, and every
 *     parameter gradient (accumulated by the GEMMs, beta = 1,
 *     into the engine's fp32 unit; or, where the engine asks for it,
 *     set_grad_dtype, into a unit in E, each add done in fp32 and rounded
 *     once: the precision its wire has at world > 1).
 * With E = fp32 this is the CPU reference's arithmetic: plain fp32 FMA
 * (no TF32), so results differ only by the order of summation, FMA
 * contraction and expf (CUDA within 2 ulp, glibc within 1). With bf16 each
 * value stored in E is rounded to 8 significant bits (relative error
 * <= 2^-8), which is what test_gpt2_cuda.c's bf16 bound is derived from.
 *
 * GEMMs. Everything here is row-major, cuBLASLt is column-major. A row-major
 * R x S matrix with leading dimension ld is, read column-major, its own
 * transpose (S x R, same ld). So the row-major product C = op(A) op(B)
 * (M x N) is computed as the column-major C^T = op(B)^T op(A)^T: cuBLASLt's
 * first operand is our B, its second our A, and its m, n are our N, M.
 * zpp_cu_gemm (cuda_ops.h) takes the row-major description (exactly the
 * arguments of the CPU's cblas_sgemm calls) and does that translation in
 * one place.
 * Algorithms come from cublasLtMatmulAlgoGetHeuristic with the pointers'
 * real alignments (offsets inside a unit need not be 256-byte aligned) and
 * are cached per shape, so a steady state does no heuristic queries. A
 * linear layer's bias (and, on the residual stream, the residual itself
 * as the C that beta = 1 scales) joins its forward product in cuBLASLt's
 * epilogue, so each output is written once. Bias gradients and LayerNorm
 * weight gradients are column sums, by a kernel of their own in a fixed
 * order, added into the caller's gradient. The code of all this is shared
 * with every CUDA model: cuda_ops.h.
 *
 * GELU. With bf16 or fp16 the MLP's GELU runs in cuBLASLt's epilogues
 * (cuda_ops.h, zpp_cu_act): the fc product writes fch (its pre-activation,
 * kept) and fcg = gelu(fch) in one pass, and the fc2 backward's d fcg
 * product writes d fch = d fcg gelu'(fch) (two roundings, as the product
 * and then a separate kernel gave: two passes over N x 4C fewer). The epilogue
 * takes gelu of the unrounded pre-activation, so the forward's fcg and the
 * backward's recomputed one (gelu_forward_kernel of the stored fch) may
 * differ by one rounding. fp32 keeps the kernels: the CPU's arithmetic.
 *
 * ATTENTION. With bf16 and a head size of 64 or 128 (GPT-2 124M and the
 * 1.31B model), on a GPU of compute capability 8.0 or newer, attention is
 * fused: cuDNN's flash-attention engines (attention_cudnn.h) where the
 * build has cuDNN and its engines take the shape, else our kernels
 * (attention_cuda.cu, FlashAttention-2 style). Either way no T x T matrix is
 * stored, only a log-sum-exp per row and head, and the backward recomputes
 * the probabilities. Otherwise (fp32, fp16, other head sizes, older GPUs,
 * or ZPP_ATTENTION=gemm: attention_path.h decides, once, at create), it is
 * the GEMM path every CUDA decoder shares (attention_gemm_cuda.h):
 * strided-batched products per (sequence, head) that read the heads in
 * place from the qkv rows, Q K^T whole into an fp32 scratch, and a causal
 * softmax that writes the probabilities (upper triangle zero) in E, kept
 * per layer for the backward.
 *
 * DETERMINISM. No atomics anywhere: every reduction has a fixed order, and
 * cuBLASLt returns the same bits for the same algorithm (cached per shape)
 * on the same GPU model (its split-K reduction schemes are all sequential:
 * "in place" with counters, or a separate reduction step; see
 * cublasLtReductionScheme_t). So the same inputs give the same bits run to
 * run, on a GPU of the same model.
 * The token-embedding gradient, a scatter-add of B*T rows into V rows with
 * repeated tokens, is made deterministic by grouping positions by token on
 * the host at set_batch (a counting sort, O(V + B*T), stable so positions
 * stay ascending): one CUDA block per distinct token adds that token's rows
 * in position order, the same order as the CPU's loop, into its wte row.
 *
 * BIAS SUMS. A bias gradient is the column sum of its layer's output
 * gradient. On the residual stream that gradient is what a LayerNorm
 * backward has just written (d mid after ln2's: the projection's bias; d x
 * after ln1's, d out of the block below: its fc2 bias; after the final
 * LayerNorm's, the last block's fc2 bias), so the row-group LayerNorm
 * backward sums its output's columns as it writes them, and those two
 * biases need no pass of their own over n x C fp32 values (the fc2 sums
 * wait in act.dres_sum for the block below). Where the warp-per-row
 * kernel runs instead (C not a multiple of 8, or above 4,096),
 * zpp_cu_colsum sums them.
 *
 * RECOMPUTE. A block's two LayerNorm outputs and its gelu output are not
 * kept for the backward: they are cheap elementwise functions of what is
 * kept (the residual stream and the LayerNorm statistics; fch), so the
 * backward evaluates them again, with the same expressions and so the
 * same bits (gelu: within one rounding with the epilogue, GELU above),
 * into one layer's scratch. That saves 6C of the 2-byte values
 * per token and layer (2.4 GB for GPT 1.31B at micro-batch 4) for three
 * elementwise passes. cfg.keep_acts (gpt2.h) keeps the LayerNorm outputs,
 * the gelu output or both per layer instead, and the backward reads them:
 * no recompute pass for what is kept, for that memory. The LayerNorm
 * outputs are the same bits either way; fc2's weight gradient reads the
 * forward's fcg when it is kept, which with the GELU epilogue may differ
 * from the recomputed one by one rounding (GELU above).
 *
 * SCRATCH IN THE LOGITS. The d logits (HEAD) are written by the head's
 * forward and read last by its backward, before any block's backward runs;
 * the backward's scratch (dres, dres_e, dfc) and the one layer's recompute
 * scratch (ln, fcg: written and read within one block's forward, or its
 * backward) are dead while the d logits are live. So when they fit in the
 * d logits' bytes (a vocabulary of at least about 12 n_embd: GPT-2's are
 * 16 to 65) they lie there: 24 C bytes a token less in bf16, 144 MiB at
 * GPT-2 124M micro-batch 8. A block's forward after the head's spoils the
 * d logits, but no backward can follow it before the head's forward runs
 * again (op_forward: the head's alone lets the backward start).
 *
 * CHECKPOINTING. With cfg.recompute (gpt2.h) a block keeps only its input,
 * the fp32 residual stream entering it (res, kept whole as without it):
 * the rest of its activations (LayerNorm statistics, qkv, the attention's
 * lse or P, atty, mid, fch) are one slab shared by every block, and a
 * block's backward first runs block_activations again into it, the very
 * kernels and GEMMs of its forward on the same input, weights and buffers,
 * hence the same bits; the last block's is skipped, its activations still
 * being there. Against a run without checkpointing (block l in slab l-1)
 * the GEMMs have the same shapes, and the same operand alignments (what
 * picks the cached cuBLASLt algorithm, ptr_align: up to 256 bytes) when
 * the slabs' byte strides are multiples of 256: N C a multiple of 128 (and
 * on the GEMM attention path max_batch H T T too), as in every GPT shape
 * run here; otherwise slab 0's better alignment may pick an algorithm that
 * rounds differently. Per token and layer that keeps 4C bytes of the 8C +
 * 8C e + 16 + (4H fused | H T e GEMM path) held without it (res, mid; qkv,
 * atty, fch; LayerNorm statistics; lse or P), plus one slab of the rest.
 *
 * HEAD. The classifier's logits (N x V) are one product over all N rows,
 * written in E (rounded once, as llm.c does) into the buffer that then
 * holds d logits: one kernel reads each row for its log-sum-exp and loss
 * (fp32 arithmetic) and, with targets, writes d logits = softmax - onehot
 * over it, so the backward's two products run over all N rows at once, with
 * the factor loss_scale / n as their alpha, and nothing is computed twice.
 * (Scaling in the product rather than before rounding keeps d logits in
 * [-1, 1], inside fp16's range too.) With bf16 the product writes and the
 * kernel reads half the bytes fp32 logits take (what that saves a step is
 * in bench/RESULTS.md), and each logit is off by at most 2^-8 of itself,
 * an error the mean loss averages over the rows and test_gpt2_cuda.c's
 * bf16 bounds take in.
 *
 * OVERWRITE. After the engine's update the gradient buffers hold the
 * step's sums, which AdamW has read: rather than clear them (a pass over
 * 2 or 4 bytes a parameter) and read them back in every beta = 1 product,
 * the engine says so (overwrite_grads) and the next backward pass stores
 * each element's first contribution: the weight-gradient products run at
 * beta = 0, the column sums and the embeddings' kernels store
 * (cuda_elem.cuh, grad_code). Every element of a unit is written once by
 * its stage, but wte, which the head's product writes first and the token
 * embedding's rows then add to. The values are those of adding to zeros.
 *
 * GPUS. bf16 needs compute capability 8.0 (cuBLASLt's bf16 products, the
 * fused attention): create refuses it on an older GPU, saying to use fp16
 * (with loss scaling) or fp32 (device_caps.h; docs/gpus.md).
 *
 * MEMORY. All device memory is allocated at create, in one arena (the
 * activations of gpt2_acts below, each buffer in its own dtype), plus a
 * 32 MiB cuBLASLt workspace and pinned host staging for the batch and the
 * per-row losses. forward and backward allocate nothing.
 *
 * STREAMS. Every kernel, copy and GEMM is enqueued on the compute stream of
 * the zpp_device given at create; its GPU must be current at every call.
 * set_batch copies the host tokens into pinned staging before it returns,
 * so the caller may reuse its buffers at once; loss() synchronises the
 * stream (one small device-to-host copy per micro-batch), and so does
 * logits() (the V logits of the row keep_logits named, which the head
 * copied aside before the softmax wrote over them). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"
#include "device/device.h"
#include "zeropp.h"
#include "model/model.h"
#include "model/gpt2.h"
#include "model/attention_cudnn.h"
#include "model/attention_gemm_cuda.h"
#include "model/cuda_elem.cuh"
#include "model/cuda_ops.h"
#include "model/attention_path.h"
#include "device/device_caps.h"

namespace {

constexpr float kLnEps = 1e-5f;                 /* as gpt2_cpu.c */
constexpr float kGeluK = 0.7978845608028654f;   /* sqrt(2/pi) */
constexpr float kGeluA = 0.044715f;

/* ------------------------------------------------------------------------ */
/* Kernels. Each has the CPU function it mirrors named in its comment. E is  */
/* the working dtype (float, __nv_bfloat16 or __half); values are loaded     */
/* into fp32, computed in fp32, and rounded once when stored.                */
/* ------------------------------------------------------------------------ */

/* gpt2_embed_backward, position part: d wpe[t] += sum over sequences b of
 * dres[b*T + t], b ascending (the CPU's order), d wpe in G (cuda_ops.h).
 * One thread per (t, c). */
__global__ void embed_backward_wpe_kernel(void *dwpe, int gd, const float *dres, int B, int T,
                                          int C) {
    size_t TC = (size_t)T * C;
    for (size_t i = global_tid(); i < TC; i += grid_threads()) {
        float acc = grad_ld(dwpe, gd, i);
        for (int b = 0; b < B; b++) acc += dres[(size_t)b * TC + i];
        grad_st(dwpe, gd, i, acc);
    }
}

/* xhat * w + b, the one expression both the forward and the backward's
 * recomputation evaluate, so they give the same bits. */
__device__ __forceinline__ float ln_apply(float x, float m, float r, float w, float b) {
    return (x - m) * r * w + b;
}

/* layernorm_forward, one warp per row of the fp32 residual stream: mean,
 * then the mean of squared deviations (two passes, so a large mean does not
 * cancel the variance); the normalised row is stored in E. */
template <typename E>
__global__ void layernorm_forward_kernel(E *out, float *mean, float *rstd, const float *inp,
                                         const E *w, const E *b, size_t n, int C, bool vec) {
    size_t row = global_tid() >> 5;
    int lane = threadIdx.x & 31;
    if (row >= n) return; /* the whole warp leaves together */
    const float *x = inp + row * C;
    E *o = out + row * C;
    float s = 0.0f, v = 0.0f, m, r;
    if (vec) { /* C % 8 == 0, 16-byte aligned: lane reads 8 columns at a time */
        float f[8], fw[8], fb[8];
        for (int c = 8 * lane; c < C; c += 256) {
            load8(x + c, f);
#pragma unroll
            for (int k = 0; k < 8; k++) s += f[k];
        }
        m = warp_sum(s) / (float)C;
        for (int c = 8 * lane; c < C; c += 256) {
            load8(x + c, f);
#pragma unroll
            for (int k = 0; k < 8; k++) v += (f[k] - m) * (f[k] - m);
        }
        v = warp_sum(v) / (float)C;
        r = 1.0f / sqrtf(v + kLnEps);
        for (int c = 8 * lane; c < C; c += 256) {
            load8(x + c, f);
            load8(w + c, fw);
            load8(b + c, fb);
#pragma unroll
            for (int k = 0; k < 8; k++) f[k] = ln_apply(f[k], m, r, fw[k], fb[k]);
            store8(o + c, f);
        }
    } else {
        for (int c = lane; c < C; c += 32) s += x[c];
        m = warp_sum(s) / (float)C;
        for (int c = lane; c < C; c += 32) {
            float d = x[c] - m;
            v += d * d;
        }
        v = warp_sum(v) / (float)C;
        r = 1.0f / sqrtf(v + kLnEps);
        for (int c = lane; c < C; c += 32) st(o, c, ln_apply(x[c], m, r, ld(w, c), ld(b, c)));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* The backward's recomputation of a LayerNorm output from its input and
 * the statistics the forward kept (cheaper than keeping L of them). */
template <typename E>
__global__ void layernorm_recompute_kernel(E *out, const float *inp, const float *mean,
                                           const float *rstd, const E *w, const E *b, size_t n,
                                           int C, bool vec) {
    size_t total = n * (size_t)C;
    if (vec) { /* C % 8 == 0: a group of 8 lies inside one row */
        for (size_t i = global_tid(); i < total / 8; i += grid_threads()) {
            size_t e = 8 * i, r = e / (size_t)C, c = e % (size_t)C;
            float x[8], wv[8], bv[8], m = mean[r], s = rstd[r];
            load8(inp + e, x);
            load8(w + c, wv);
            load8(b + c, bv);
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = ln_apply(x[k], m, s, wv[k], bv[k]);
            store8(out + e, x);
        }
        return;
    }
    for (size_t i = global_tid(); i < total; i += grid_threads()) {
        size_t r = i / (size_t)C, c = i % (size_t)C;
        st(out, i, ln_apply(inp[i], mean[r], rstd[r], ld(w, c), ld(b, c)));
    }
}

/* layernorm_backward, one warp per row. With xh = (x - mean) rstd and
 * g = dy * w:  dx += rstd (g - mean(g) - xh mean(g xh)). The weight and bias
 * gradients are column sums of dy*xh and dy over the rows
 * (colsum_kernel). All fp32 but the weight. dx is the residual gradient,
 * which the next products read in E: with dx_e the kernel also stores it
 * rounded there (the rounding round_kernel would do, without reading dx
 * again in a pass of its own). */
template <typename E>
__global__ void layernorm_backward_kernel(float *dinp, E *dinp_e, const float *dout,
                                          const float *inp, const E *w, const float *mean,
                                          const float *rstd, size_t n, int C, bool vec) {
    size_t row = global_tid() >> 5;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *x = inp + row * C, *dy = dout + row * C;
    float *dx = dinp + row * C;
    E *dx_e = dinp_e ? dinp_e + row * C : NULL;
    float m = mean[row], s = rstd[row];
    float gm = 0.0f, gxm = 0.0f;
    if (vec) { /* C % 8 == 0, 16-byte aligned: lane reads 8 columns at a time */
        float fx[8], fd[8], fw[8], fo[8];
        for (int c = 8 * lane; c < C; c += 256) {
            load8(x + c, fx);
            load8(dy + c, fd);
            load8(w + c, fw);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float xh = (fx[k] - m) * s, g = fd[k] * fw[k];
                gm += g;
                gxm += g * xh;
            }
        }
        gm = warp_sum(gm) / (float)C;
        gxm = warp_sum(gxm) / (float)C;
        for (int c = 8 * lane; c < C; c += 256) {
            load8(x + c, fx);
            load8(dy + c, fd);
            load8(w + c, fw);
            load8(dx + c, fo);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float xh = (fx[k] - m) * s, g = fd[k] * fw[k];
                fo[k] += s * (g - gm - xh * gxm);
            }
            store8(dx + c, fo);
            if (dx_e) store8(dx_e + c, fo);
        }
        return;
    }
    for (int c = lane; c < C; c += 32) {
        float xh = (x[c] - m) * s, g = dy[c] * ld(w, c);
        gm += g;
        gxm += g * xh;
    }
    gm = warp_sum(gm) / (float)C;
    gxm = warp_sum(gxm) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[c] - m) * s, g = dy[c] * ld(w, c);
        dx[c] += s * (g - gm - xh * gxm);
        if (dx_e) st(dx_e, c, dx[c]);
    }
}

/* layernorm_backward_kernel with the weight and bias gradients in the same
 * pass: dw += sum dy xh, db += sum dy over the rows. A CTA is a row group
 * (zpp_cu_rowgroups): its threads span one row, 8 columns each (C % 8 ==
 * 0, C <= 8 kRowgroupThreads), and it walks its rows in order, so dy and
 * xh are in registers when the sums need them: the rows are read from
 * memory once, where the warp-per-row kernel and zpp_cu_colsum read dy and
 * x twice more. The next row's loads are issued before this row's barrier.
 * The row's two sums (gm, gxm) meet across warps in shared memory, added
 * in warp order (two slots by row parity: one barrier a row); the group's
 * column sums go to the row-group partials and zpp_cu_rowgroup_finish adds
 * them. With sum_dx the column sums of the updated dx too: the residual
 * gradient there is the d out of the layer before (BIAS SUMS in the
 * header). A fixed order throughout: the same shape and G give the same
 * bits. */
constexpr int kRowgroupThreads = 512; /* C <= 8 x 512: 128 registers a thread (no spills) */
template <typename E>
__global__ void __launch_bounds__(kRowgroupThreads)
layernorm_backward_rowgroup_kernel(float *dinp, E *dinp_e, float *part, bool sum_dx,
                                   const float *dout, const float *inp, const E *w,
                                   const float *mean, const float *rstd, int n, int C, int R) {
    __shared__ float red[2][2][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int c0 = 8 * threadIdx.x;
    const bool on = c0 < C;
    float fw[8] = {0}, sw[8] = {0}, sb[8] = {0}, sd[8] = {0};
    if (on) load8(w + c0, fw);
    const int r0 = blockIdx.x * R, r1 = min(n, r0 + R);
    float nx[8], ndy[8]; /* the next row's, loaded before this row's barrier */
    if (on && r0 < r1) {
        load8(inp + (size_t)r0 * C + c0, nx);
        load8(dout + (size_t)r0 * C + c0, ndy);
    }
    int parity = 0;
    for (int r = r0; r < r1; r++, parity ^= 1) {
        const size_t at = (size_t)r * C + c0;
        const float m = mean[r], s = rstd[r];
        float xh[8], dy[8], dx[8], gm = 0.0f, gxm = 0.0f;
        if (on) {
#pragma unroll
            for (int k = 0; k < 8; k++) xh[k] = nx[k], dy[k] = ndy[k];
            load8(dinp + at, dx);
            if (r + 1 < r1) load8(inp + at + C, nx), load8(dout + at + C, ndy);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                xh[k] = (xh[k] - m) * s;
                float g = dy[k] * fw[k];
                gm += g;
                gxm += g * xh[k];
            }
        }
        gm = warp_sum(gm);
        gxm = warp_sum(gxm);
        if (lane == 0) red[parity][0][warp] = gm, red[parity][1][warp] = gxm;
        __syncthreads();
        gm = 0.0f, gxm = 0.0f;
        for (int k = 0; k < warps; k++) gm += red[parity][0][k], gxm += red[parity][1][k];
        gm /= (float)C;
        gxm /= (float)C;
        if (!on) continue;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            dx[k] += s * (dy[k] * fw[k] - gm - xh[k] * gxm);
            sw[k] += dy[k] * xh[k];
            sb[k] += dy[k];
            sd[k] += dx[k];
        }
        store8(dinp + at, dx);
        if (dinp_e) store8(dinp_e + at, dx);
    }
    if (!on) return;
    store8(part + (size_t)blockIdx.x * C + c0, sw);
    store8(part + (size_t)(gridDim.x + blockIdx.x) * C + c0, sb);
    if (sum_dx) store8(part + (size_t)(2 * gridDim.x + blockIdx.x) * C + c0, sd);
}

/* gelu_sigmoid: (1 + tanh z)/2 = 1/(1 + e^{-2z}), z = k (u + a u^3).
 * Where E is a 2-byte type the result is rounded to 8 (or 11) bits, so
 * the fast exponential and reciprocal (relative errors near 2^-21) change
 * nothing a bound sees, and the kernel, otherwise bound by its IEEE
 * division and expf, runs at memory speed; fp32 keeps the exact forms. */
template <typename E>
__device__ __forceinline__ float gelu_sigmoid(float u) {
    float z = kGeluK * (u + kGeluA * u * u * u);
    if (sizeof(E) == 2) return __frcp_rn(1.0f + __expf(-2.0f * z));
    return 1.0f / (1.0f + expf(-2.0f * z));
}

template <typename E>
__global__ void gelu_forward_kernel(E *out, const E *inp, size_t n, bool vec) {
    size_t n8 = vec ? n / 8 : 0;
    for (size_t i = global_tid(); i < n8; i += grid_threads()) {
        float u[8];
        load8(inp + 8 * i, u);
#pragma unroll
        for (int k = 0; k < 8; k++) u[k] *= gelu_sigmoid<E>(u[k]);
        store8(out + 8 * i, u);
    }
    for (size_t i = 8 * n8 + global_tid(); i < n; i += grid_threads()) {
        float u = ld(inp, i);
        st(out, i, u * gelu_sigmoid<E>(u));
    }
}

/* gelu'(u) = s + u * 2 s (1 - s) * k (1 + 3 a u^2), in place on d. */
template <typename E>
__device__ __forceinline__ float gelu_grad(float u) {
    float s = gelu_sigmoid<E>(u);
    return s + u * 2.0f * s * (1.0f - s) * kGeluK * (1.0f + 3.0f * kGeluA * u * u);
}

template <typename E>
__global__ void gelu_backward_kernel(E *d, const E *inp, size_t n, bool vec) {
    size_t n8 = vec ? n / 8 : 0;
    for (size_t i = global_tid(); i < n8; i += grid_threads()) {
        float u[8], g[8];
        load8(inp + 8 * i, u);
        load8(d + 8 * i, g);
#pragma unroll
        for (int k = 0; k < 8; k++) g[k] *= gelu_grad<E>(u[k]);
        store8(d + 8 * i, g);
    }
    for (size_t i = 8 * n8 + global_tid(); i < n; i += grid_threads())
        st(d, i, ld(d, i) * gelu_grad<E>(ld(inp, i)));
}

/* ------------------------------------------------------------------------ */
/* The model object                                                          */
/* ------------------------------------------------------------------------ */

/* Activations kept for the backward, and backward scratch, for max_batch
 * sequences: N = max_batch * T rows; per-layer buffers are n_layer slabs
 * (block l's slab at (l-1) * N * width elements). `E` marks buffers in the
 * working dtype (void *: their element size is g->es), the rest are fp32. */
struct gpt2_acts {
    float *res;                /* (L+1) x N x C: res[0] = embedding, res[l] = block l out */
    float *ln1m, *ln1r;        /*    L x N: LayerNorm mean and 1/std */
    void *qkv;                 /* E  L x N x 3C */
    void *att;                 /* E  L x max_batch x H x T x T: softmax probabilities
                                     (GEMM path; NULL with fused attention) */
    float *att_lse;            /*    L x max_batch x H x T: the fused attention's
                                     log-sum-exps (NULL on the GEMM path) */
    void *atty;                /* E  L x N x C: attention output before the projection */
    float *mid;                /*    L x N x C: residual after attention */
    float *ln2m, *ln2r;
    void *fch;                 /* E  L x N x 4C: fc output, before gelu */
    void *lnf;                 /* E  N x C */
    float *lnfm, *lnfr;        /*    N */
    /* One layer's worth, written in the forward and rewritten in the
     * backward from what is kept (RECOMPUTE in the header); with
     * cfg.keep_acts L of each (ln: two a layer, ln1's then ln2's), kept: */
    void *ln;                  /* E  N x C: a block's LayerNorm output */
    void *fcg;                 /* E  N x 4C: gelu of fch */
    /* backward scratch */
    float *dres;               /*    N x C: gradient of the residual stream */
    void *dres_e;              /* E  N x C: dres rounded for the products (dres if fp32),
                                  stored with it by the LayerNorm backward */
    float *dc;                 /*    N x C: gradient into a LayerNorm */
    void *dfc;                 /* E  N x 4C: d fch, the MLP branch's */
    /* The attention branch's, inside dfc: the MLP's backward is done with
     * it before the projection's backward writes datty (block_backward) */
    void *dqkv;                /* E  N x 3C, at dfc */
    void *datty;               /* E  N x C, at dfc + 3NC */
    float *score;              /*    max_batch x H x T x T: scores; in the backward d P */
    void *dscore;              /* E  max_batch x H x T x T: d S */
    float *att_dsum;           /*    max_batch x H x T: the fused backward's scratch */
    float *dres_sum;           /*    C: column sums of d out for the next fc2 bias (BIAS SUMS) */
};

struct gpt2_cuda {
    zpp_model base; /* first, so a zpp_model* is a gpt2_cuda* */
    zpp_gpt2_config cfg;
    zpp_gpt2_layout lay;
    zpp_gpt2_stages stages;
    size_t nmax;          /* max_batch * T */
    int fused_attn;       /* attention by attention_cuda.cu (attention_path.h) */
    zpp_attn_cudnn_use cudnn; /* or by cuDNN's engines, where ctx is set (same buffers) */
    /* GELU in the fc and fc2 products' epilogues (GELU in the header):
     * bf16 and fp16; cleared for good when cuBLASLt has no algorithm */
    int gelu_epilogue;
    size_t es;            /* bytes of one E element */
    cudaDataType_t et;    /* E for cuBLASLt */
    cudaStream_t stream;
    zpp_cu cu;            /* cuBLASLt, its cache, the shared ops' scratch (cuda_ops.h) */

    zpp_device *dev; /* allocates the arena and workspace (counted in its peak) */
    float *arena; /* device */
    zpp_cu_batch batch; /* tokens, targets, the embedding backward's grouping */
    zpp_cu_head head;   /* the classifier's buffers (HEAD), carved from the arena */
    zpp_decoder_calls calls; /* decoder.h */
    gpt2_acts act;

    float loss;
    int loss_pending; /* losses are on the device, not yet summed */
    /* With cfg.recompute: the block whose activations the shared slab
     * holds (CHECKPOINTING); 0: none. */
    int slab_block;
    /* act.dres_sum holds the column sums of the residual gradient the last
     * LayerNorm backward left: the next block's fc2 bias gradient (BIAS
     * SUMS). */
    int dres_summed;
    /* overwrite_grads was called: the backward pass under way writes over
     * the engine's stale gradients (OVERWRITE) */
    int overwrite;
};

/* Element i of an E buffer (or of a unit of parameters in E). */
static inline void *eat(const gpt2_cuda *g, const void *p, size_t i) {
    return (char *)p + i * g->es;
}

/* Element i of a unit's gradient, in G (cuda_ops.h; fp32 or E). */
static inline void *gat(const gpt2_cuda *g, void *grads, size_t i) {
    return (char *)grads + i * g->cu.gs;
}

/* Runs `...` with E typedef'd to the model's working dtype (cuda_elem.cuh). */
#define WITH_E(g, ...) ZPP_WITH_E((g)->base.param_dtype, __VA_ARGS__)

/* ---- error plumbing ---- */

#define CU_CHECK(call, what) ZPP_CU_CHECK("gpt2 cuda", call, what)

/* After a kernel launch: a bad configuration shows up here; a fault while
 * running shows up at the next synchronising call (loss()). */
#define LAUNCH_CHECK(what) CU_CHECK(cudaGetLastError(), what)

static unsigned grid_for(size_t n) { return zpp_cu_grid_for(n); }
static unsigned grid_rows(size_t rows) { return zpp_cu_grid_rows(rows); }
#define vec8_ok zpp_cu_vec8_ok

static zpp_status check_device_ptr(const void *p, const char *op, const char *name) {
    return zpp_cu_check_device_ptr("gpt2 cuda", p, op, name);
}

/* ---- building blocks (first n = B*T rows) ---- */

static zpp_status linear_forward(gpt2_cuda *g, void *out, cudaDataType_t ot, const float *resid,
                                 const void *inp, const void *W, const void *bias, int n, int IC,
                                 int OC, const char *what) {
    return zpp_cu_linear_forward(&g->cu, out, ot, resid, inp, W, bias, n, IC, OC, what);
}

static zpp_status linear_backward(gpt2_cuda *g, void *dinp, cudaDataType_t it, void *dW,
                                  void *db, const void *dout, const float *dout_f32,
                                  const void *inp, const void *W, int n, int IC, int OC,
                                  const char *what) {
    return zpp_cu_linear_backward(&g->cu, dinp, it, dW, db, dout, dout_f32, inp, W, n, IC, OC,
                                  what);
}

static zpp_status layernorm_forward(gpt2_cuda *g, void *out, float *mean, float *rstd,
                                    const float *inp, const void *w, const void *b, int n,
                                    int C) {
    WITH_E(g, layernorm_forward_kernel<<<grid_rows((size_t)n), kThreads, 0, g->stream>>>(
                  (E *)out, mean, rstd, inp, (const E *)w, (const E *)b, (size_t)n, C,
                  C % 8 == 0 && vec8_ok(out, inp, w, b)));
    LAUNCH_CHECK("layernorm forward");
    return ZPP_OK;
}

/* d inp += ...; d w += sum dy*xh; d b += sum dy (d inp fp32; d w, d b in
 * G, and ds too with ds_add, else fp32 scratch). d inp is the
 * residual gradient act.dres: its copy in E, act.dres_e, is written too
 * (where E is not fp32), for the products that read it next. With ds (not
 * NULL) the column sums of the updated d inp go into ds (ds_add) or over
 * it, where the row-group kernel runs: *summed says whether they did
 * (BIAS SUMS in the header; the caller sums them itself otherwise). */
static zpp_status layernorm_backward(gpt2_cuda *g, float *dinp, void *dw, void *db,
                                     const float *dout, const float *inp, const void *w,
                                     const float *mean, const float *rstd, int n, int C,
                                     void *ds, int ds_add, int *summed) {
    void *dinp_e = dinp == g->act.dres && g->act.dres_e != (void *)dinp ? g->act.dres_e : NULL;
    const bool vec = C % 8 == 0 && vec8_ok(dinp, dout, inp, w) && vec8_ok(dinp_e, NULL);
    *summed = 0;
    if (vec && C <= 8 * kRowgroupThreads) { /* one pass: the row-group kernel */
        const int threads = (C / 8 + 31) / 32 * 32;
        const int G = zpp_cu_rowgroups(&g->cu, n, C, threads), R = (n + G - 1) / G;
        WITH_E(g, layernorm_backward_rowgroup_kernel<<<(unsigned)G, (unsigned)threads, 0,
                                                         g->stream>>>(
                      dinp, (E *)dinp_e, zpp_cu_rowgroup_part(&g->cu), ds != NULL, dout, inp,
                      (const E *)w, mean, rstd, n, C, R));
        LAUNCH_CHECK("layernorm backward");
        ZPP_CHECK(zpp_cu_rowgroup_finish(&g->cu, dw, db, ds, ds_add, G, C,
                                         "layernorm weight gradient"));
        *summed = ds != NULL;
        return ZPP_OK;
    }
    WITH_E(g, layernorm_backward_kernel<<<grid_rows((size_t)n), kThreads, 0, g->stream>>>(
                  dinp, (E *)dinp_e, dout, inp, (const E *)w, mean, rstd, (size_t)n, C, vec));
    LAUNCH_CHECK("layernorm backward");
    return zpp_cu_colsum(&g->cu, db, dw, dout, CUDA_R_32F, inp, mean, rstd, n, C,
                         "layernorm weight gradient");
}

/* The scratch LayerNorm output (act.ln) of n rows of inp, again. */
static zpp_status layernorm_recompute(gpt2_cuda *g, const float *inp, const float *mean,
                                      const float *rstd, const void *w, const void *b, int n) {
    int C = g->cfg.n_embd;
    size_t k = (size_t)n * C;
    bool v = C % 8 == 0 && vec8_ok(g->act.ln, inp, w, b);
    WITH_E(g, layernorm_recompute_kernel<<<grid_for(v ? k / 8 : k), kThreads, 0, g->stream>>>(
                  (E *)g->act.ln, inp, mean, rstd, (const E *)w, (const E *)b, (size_t)n, C, v));
    LAUNCH_CHECK("layernorm recompute");
    return ZPP_OK;
}

/* fcg = gelu(fch) for n rows: in the forward, and again in the backward
 * for fc2's weight gradient (unless kept, RECOMPUTE). */
static zpp_status gelu_forward(gpt2_cuda *g, void *fcg, const void *fch, int n) {
    size_t n4 = (size_t)n * 4 * g->cfg.n_embd;
    bool v = vec8_ok(fcg, fch);
    WITH_E(g, gelu_forward_kernel<<<grid_for(v ? n4 / 8 : n4), kThreads, 0, g->stream>>>(
                  (E *)fcg, (const E *)fch, n4, v));
    LAUNCH_CHECK("gelu");
    return ZPP_OK;
}

/* The shape of the GEMM attention path's calls (attention_gemm_cuda.h):
 * multi-head, every query head its own key/value head. */
static zpp_attn_gemm_shape attn_shape(const gpt2_cuda *g) {
    const int H = g->cfg.n_head;
    return zpp_attn_gemm_shape{g->calls.B, g->cfg.seq_len, H, H, g->cfg.n_embd / H};
}

/* attention_forward: P = softmax(Q K^T / sqrt(hs) + causal mask), Y = P V.
 * Fused (attention_cuda.cu: no T x T matrix; `att` is the layer's lse), or
 * by GEMMs (attention_gemm_cuda.h): scores in fp32 (the score scratch), P
 * (`att`) and Y in E. */
static zpp_status attention_forward(gpt2_cuda *g, void *y, void *att, const void *qkv) {
    const zpp_attn_gemm_shape s = attn_shape(g);
    return zpp_attn_run_forward(&g->cu, &g->cudnn, g->fused_attn, &s, y, att, g->act.score, qkv);
}

/* attention_backward (writes dqkv, in E), fused or by GEMMs. */
static zpp_status attention_backward(gpt2_cuda *g, void *dqkv, const void *dy, const void *att,
                                     const void *qkv, const void *y) {
    const zpp_attn_gemm_shape s = attn_shape(g);
    return zpp_attn_run_backward(&g->cu, &g->cudnn, g->fused_attn, &s, dqkv, dy, qkv, y, att,
                                 g->act.att_dsum, g->act.score, g->act.dscore);
}

/* ---- stages ---- */

/* Block l's (1..n_layer) slices of the activations. */
struct layer_acts {
    const float *x; /* res[l-1] */
    float *out;     /* res[l] */
    float *mid, *ln1m, *ln1r, *ln2m, *ln2r;
    void *qkv, *atty, *fch; /* E */
    void *att; /* P in E (GEMM path), or the fused attention's fp32 lse */
    void *ln1, *ln2, *fcg;  /* E: the layer's own where kept, else the shared scratch */
};

/* Whether blocks keep what bits (ZPP_KEEP_*) names (RECOMPUTE). */
static bool keeps(const gpt2_cuda *g, int bits) {
    return (g->cfg.keep_acts & bits) && !g->cfg.recompute;
}

static layer_acts layer_of(const gpt2_cuda *g, int l) {
    const gpt2_acts *a = &g->act;
    const size_t C = (size_t)g->cfg.n_embd, T = (size_t)g->cfg.seq_len;
    const size_t H = (size_t)g->cfg.n_head, N = g->nmax, r = (size_t)(l - 1);
    const size_t k = g->cfg.recompute ? 0 : r; /* the slab of block l's activations */
    layer_acts y;
    y.x = a->res + r * N * C;
    y.out = a->res + (r + 1) * N * C;
    y.mid = a->mid + k * N * C;
    y.ln1m = a->ln1m + k * N;
    y.ln1r = a->ln1r + k * N;
    y.ln2m = a->ln2m + k * N;
    y.ln2r = a->ln2r + k * N;
    y.qkv = eat(g, a->qkv, k * N * 3 * C);
    y.att = g->fused_attn ? (void *)(a->att_lse + k * (size_t)g->base.max_batch * H * T)
                          : eat(g, a->att, k * (size_t)g->base.max_batch * H * T * T);
    y.atty = eat(g, a->atty, k * N * C);
    y.fch = eat(g, a->fch, k * N * 4 * C);
    const bool keep_ln = keeps(g, ZPP_KEEP_LAYERNORM);
    y.ln1 = keep_ln ? eat(g, a->ln, 2 * r * N * C) : a->ln;
    y.ln2 = keep_ln ? eat(g, a->ln, (2 * r + 1) * N * C) : a->ln;
    y.fcg = keeps(g, ZPP_KEEP_GELU) ? eat(g, a->fcg, r * N * 4 * C) : a->fcg;
    return y;
}

static zpp_status embed_forward(gpt2_cuda *g, const void *w) {
    int T = g->cfg.seq_len, C = g->cfg.n_embd;
    size_t n = (size_t)g->calls.B * T;
    return zpp_cu_embed_forward(&g->cu, &g->batch, g->act.res, eat(g, w, g->lay.wte),
                                eat(g, w, g->lay.wpe), n, T, C);
}

/* Block l's forward up to what its backward reads (through gelu, not the
 * output): by the forward, and again by the backward with checkpointing. */
static zpp_status block_activations(gpt2_cuda *g, int l, const void *w) {
    const zpp_gpt2_layout *L = &g->lay;
    int T = g->cfg.seq_len, C = g->cfg.n_embd, n = g->calls.B * T;
    const layer_acts y = layer_of(g, l);
    const cudaDataType_t et = g->et, f32 = CUDA_R_32F;

    ZPP_CHECK(layernorm_forward(g, y.ln1, y.ln1m, y.ln1r, y.x, eat(g, w, L->ln1_w),
                                eat(g, w, L->ln1_b), n, C));
    ZPP_CHECK(linear_forward(g, y.qkv, et, NULL, y.ln1, eat(g, w, L->qkv_w), eat(g, w, L->qkv_b),
                             n, C, 3 * C, "qkv forward"));
    ZPP_CHECK(attention_forward(g, y.atty, y.att, y.qkv));
    ZPP_CHECK(linear_forward(g, y.mid, f32, y.x, y.atty, eat(g, w, L->proj_w),
                             eat(g, w, L->proj_b), n, C, C, "attention projection forward"));
    ZPP_CHECK(layernorm_forward(g, y.ln2, y.ln2m, y.ln2r, y.mid, eat(g, w, L->ln2_w),
                                eat(g, w, L->ln2_b), n, C));
    if (g->gelu_epilogue) {
        zpp_status st = zpp_cu_linear_gelu_forward(&g->cu, y.fcg, y.fch, y.ln2,
                                                   eat(g, w, L->fc_w), eat(g, w, L->fc_b), n, C,
                                                   4 * C, "fc forward with gelu");
        if (st != ZPP_ERR_UNSUPPORTED) {
            ZPP_CHECK(st);
            g->slab_block = l;
            return ZPP_OK;
        }
        g->gelu_epilogue = 0; /* cuBLASLt has none: in steps from now on */
    }
    ZPP_CHECK(linear_forward(g, y.fch, et, NULL, y.ln2, eat(g, w, L->fc_w), eat(g, w, L->fc_b), n,
                             C, 4 * C, "fc forward"));
    ZPP_CHECK(gelu_forward(g, y.fcg, y.fch, n));
    g->slab_block = l;
    return ZPP_OK;
}

/* The block's output: out = mid + fcg Wfc2^T + bfc2. */
static zpp_status block_forward(gpt2_cuda *g, int l, const void *w) {
    const zpp_gpt2_layout *L = &g->lay;
    int C = g->cfg.n_embd, n = g->calls.B * g->cfg.seq_len;
    const layer_acts y = layer_of(g, l);
    ZPP_CHECK(block_activations(g, l, w));
    return linear_forward(g, y.out, CUDA_R_32F, y.mid, y.fcg, eat(g, w, L->fc2_w),
                          eat(g, w, L->fc2_b), n, 4 * C, C, "fc2 forward");
}

/* The final LayerNorm, then the classifier over wte (HEAD; cuda_ops.h). */
static zpp_status head_forward(gpt2_cuda *g, const void *w) {
    int C = g->cfg.n_embd, V = g->cfg.vocab_size, L = g->cfg.n_layer,
        n = g->calls.B * g->cfg.seq_len;
    const float *x = g->act.res + (size_t)L * g->nmax * C;
    ZPP_CHECK(layernorm_forward(g, g->act.lnf, g->act.lnfm, g->act.lnfr, x,
                                eat(g, w, g->lay.lnf_w), eat(g, w, g->lay.lnf_b), n, C));
    return zpp_cu_head_forward(&g->cu, &g->head, g->act.lnf, eat(g, w, g->lay.wte),
                               g->calls.have_targets ? g->batch.d_targets : NULL, n, C, V,
                               g->base.real_vocab_size, &g->calls, g->cfg.seq_len);
}

/* From the forward's d logits (HEAD), all rows in two products scaled by
 * f = loss_scale / n:  d wte += f dlogits^T lnf,  d lnf = f dlogits wte;
 * then the final LayerNorm's backward starts dres. */
static zpp_status head_backward(gpt2_cuda *g, const void *w, void *gr, float loss_scale) {
    int C = g->cfg.n_embd, V = g->cfg.vocab_size, L = g->cfg.n_layer,
        n = g->calls.B * g->cfg.seq_len;
    ZPP_CHECK(zpp_cu_head_backward(&g->cu, &g->head, g->act.lnf, eat(g, w, g->lay.wte),
                                   gat(g, gr, g->lay.wte), g->act.dc, n, C, V,
                                   loss_scale / (float)n));
    CU_CHECK(cudaMemsetAsync(g->act.dres, 0, (size_t)n * C * sizeof(float), g->stream),
             "clear the residual gradient");
    const float *x = g->act.res + (size_t)L * g->nmax * C;
    return layernorm_backward(g, g->act.dres, gat(g, gr, g->lay.lnf_w),
                              gat(g, gr, g->lay.lnf_b), g->act.dc, x, eat(g, w, g->lay.lnf_w),
                              g->act.lnfm, g->act.lnfr, n, C,
                              g->act.dres_sum, 0, &g->dres_summed);
}

/* d b += act.dres_sum, the column sums of d out the LayerNorm backward
 * after this layer left (BIAS SUMS). */
__global__ void add_sums_kernel(void *db, int gd, const float *sums, int C) {
    for (int c = (int)global_tid(); c < C; c += (int)grid_threads()) grad_add(db, gd, c, sums[c]);
}

/* Reverse of block_forward; dres = d loss / d out on entry, d loss / d x on
 * exit (residual adds pass it through, branches add theirs). */
static zpp_status block_backward(gpt2_cuda *g, int l, const void *w, void *gr) {
    const zpp_gpt2_layout *L = &g->lay;
    gpt2_acts *a = &g->act;
    int T = g->cfg.seq_len, C = g->cfg.n_embd, n = g->calls.B * T;
    const layer_acts y = layer_of(g, l);
    const cudaDataType_t et = g->et, f32 = CUDA_R_32F;

    /* With checkpointing, block l's activations again, unless the shared
     * slab still holds them (l ran its forward last). */
    if (g->cfg.recompute && g->slab_block != l) ZPP_CHECK(block_activations(g, l, w));
    /* MLP branch: out = mid + fc2(gelu(fc(ln2(mid)))); dres_e is dres in E,
     * written with it by the LayerNorm backward before (layernorm_backward) */
    const bool keep_ln = keeps(g, ZPP_KEEP_LAYERNORM);
    if (!keeps(g, ZPP_KEEP_GELU)) ZPP_CHECK(gelu_forward(g, y.fcg, y.fch, n));
    /* fc2's bias gradient: the sums of d out the LayerNorm backward after
     * this block already made, or a column sum here */
    void *fc2_db = gat(g, gr, L->fc2_b);
    if (g->dres_summed) {
        add_sums_kernel<<<grid_for((size_t)C), kThreads, 0, g->stream>>>(
            fc2_db, grad_code(g->cu.gdtype, g->cu.grad_first), a->dres_sum, C);
        LAUNCH_CHECK("fc2 bias gradient");
        fc2_db = NULL;
        g->dres_summed = 0;
    }
    zpp_status st = ZPP_ERR_UNSUPPORTED;
    if (g->gelu_epilogue)
        st = zpp_cu_linear_dgelu_backward(&g->cu, a->dfc, gat(g, gr, L->fc2_w), fc2_db,
                                          a->dres_e, a->dres, y.fcg, eat(g, w, L->fc2_w), y.fch,
                                          n, 4 * C, C, "fc2 backward with gelu");
    if (st == ZPP_ERR_UNSUPPORTED) {
        g->gelu_epilogue = 0;
        ZPP_CHECK(linear_backward(g, a->dfc, et, gat(g, gr, L->fc2_w), fc2_db, a->dres_e, a->dres,
                                  y.fcg, eat(g, w, L->fc2_w), n, 4 * C, C, "fc2 backward"));
        size_t n4 = (size_t)n * 4 * C;
        bool v = vec8_ok(a->dfc, y.fch);
        WITH_E(g, gelu_backward_kernel<<<grid_for(v ? n4 / 8 : n4), kThreads, 0, g->stream>>>(
                      (E *)a->dfc, (const E *)y.fch, n4, v));
        LAUNCH_CHECK("gelu backward");
    } else {
        ZPP_CHECK(st);
    }
    if (!keep_ln)
        ZPP_CHECK(layernorm_recompute(g, y.mid, y.ln2m, y.ln2r, eat(g, w, L->ln2_w),
                                      eat(g, w, L->ln2_b), n));
    ZPP_CHECK(linear_backward(g, a->dc, f32, gat(g, gr, L->fc_w), gat(g, gr, L->fc_b), a->dfc,
                              NULL, y.ln2, eat(g, w, L->fc_w), n, C, 4 * C, "fc backward"));
    int summed = 0; /* the projection's bias gradient, d mid's column sums, with d mid */
    void *proj_db = gat(g, gr, L->proj_b);
    ZPP_CHECK(layernorm_backward(g, a->dres, gat(g, gr, L->ln2_w), gat(g, gr, L->ln2_b), a->dc,
                                 y.mid, eat(g, w, L->ln2_w), y.ln2m, y.ln2r, n, C, proj_db, 1,
                                 &summed));
    /* attention branch: mid = x + proj(attn(qkv(ln1(x)))) */
    ZPP_CHECK(linear_backward(g, a->datty, et, gat(g, gr, L->proj_w), summed ? NULL : proj_db,
                              a->dres_e, a->dres, y.atty, eat(g, w, L->proj_w), n, C, C,
                              "attention projection backward"));
    ZPP_CHECK(attention_backward(g, a->dqkv, a->datty, y.att, y.qkv, y.atty));
    if (!keep_ln)
        ZPP_CHECK(layernorm_recompute(g, y.x, y.ln1m, y.ln1r, eat(g, w, L->ln1_w),
                                      eat(g, w, L->ln1_b), n));
    ZPP_CHECK(linear_backward(g, a->dc, f32, gat(g, gr, L->qkv_w), gat(g, gr, L->qkv_b), a->dqkv,
                              NULL, y.ln1, eat(g, w, L->qkv_w), n, C, 3 * C, "qkv backward"));
    /* d x is d out of block l - 1: its fc2 bias gradient (none below block 1) */
    return layernorm_backward(g, a->dres, gat(g, gr, L->ln1_w), gat(g, gr, L->ln1_b), a->dc,
                              y.x, eat(g, w, L->ln1_w), y.ln1m, y.ln1r, n, C,
                              l > 1 ? a->dres_sum : NULL, 0, &g->dres_summed);
}

static zpp_status embed_backward(gpt2_cuda *g, void *gr) {
    int T = g->cfg.seq_len, C = g->cfg.n_embd;
    embed_backward_wpe_kernel<<<grid_for((size_t)T * C), kThreads, 0, g->stream>>>(
        gat(g, gr, g->lay.wpe), grad_code(g->cu.gdtype, g->cu.grad_first), g->act.dres,
        g->calls.B, T, C);
    LAUNCH_CHECK("position embedding backward");
    g->cu.grad_first = 0; /* the head's product wrote wte's first part (OVERWRITE) */
    return zpp_cu_embed_backward(&g->cu, &g->batch, gat(g, gr, g->lay.wte), g->act.dres, C);
}

/* ---- ops ---- */

zpp_status op_init_params(zpp_model *m, int unit, size_t offset, size_t count, float *out,
                          uint64_t seed) {
    /* Host fp32: the CPU's helper, so both models start from the same bits.
     * The engine takes op_init_params_device (below) instead: the same
     * values, drawn on the GPU. */
    return zpp_gpt2_init_fill(&((gpt2_cuda *)m)->cfg, unit, offset, count, out, seed);
}

/* Element offset + k of the unit's initial values into out[k], for every k
 * < count, grid-stride: the host's zpp_gpt2_init_value itself (gpt2.h),
 * whose double arithmetic rounds as the host's does (core/random.h). */
__global__ void init_params_kernel(zpp_gpt2_config cfg, zpp_gpt2_layout lay, int unit,
                                   size_t offset, size_t count, float *out, uint64_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        out[k] = zpp_gpt2_init_value(&cfg, &lay, unit, offset + k, seed);
}

/* The same values as op_init_params, drawn on the GPU into device memory:
 * GPT 6.7B over 8 ranks is 840 million values a shard, about 25 s of one
 * host thread at every start, and milliseconds here. */
zpp_status op_init_params_device(zpp_model *m, int unit, size_t offset, size_t count,
                                 float *dev_out, uint64_t seed) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    zpp_gpt2_layout lay;
    ZPP_CHECK(zpp_gpt2_init_check(&g->cfg, unit, offset, count, &lay));
    if (!count) return ZPP_OK;
    ZPP_CHECK(check_device_ptr(dev_out, "init_params_device", "dev_out"));
    init_params_kernel<<<grid_for(count), kThreads, 0, g->stream>>>(g->cfg, lay, unit, offset,
                                                                    count, dev_out, seed);
    LAUNCH_CHECK("init_params_device");
    return ZPP_OK;
}

zpp_status op_set_batch(zpp_model *m, const int32_t *tokens, const int32_t *targets, int B) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    int T = g->cfg.seq_len;
    ZPP_CHECK(zpp_decoder_check_batch(m, tokens, targets, B, "gpt2 cuda"));
    size_t n = (size_t)B * T;
    ZPP_CHECK(zpp_cu_batch_set(&g->cu, &g->batch, tokens, targets, n));
    zpp_decoder_calls_new_batch(&g->calls, B, targets != NULL);
    g->loss = NAN;
    g->loss_pending = 0;
    g->slab_block = 0;
    return ZPP_OK;
}

zpp_status op_forward(zpp_model *m, int stage, const void *params) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_forward(m, &g->calls, stage, params, "gpt2 cuda"));
    ZPP_CHECK(check_device_ptr(params, "forward", "params"));
    g->calls.bwd_next = -1;
    g->loss_pending = 0;
    if (stage == 0) {
        g->loss = NAN;
        g->calls.kept = 0;
        ZPP_CHECK(embed_forward(g, params));
    } else if (stage == S - 1) {
        ZPP_CHECK(head_forward(g, params));
        g->loss_pending = 1;
        g->calls.bwd_next = S - 1;
    } else {
        ZPP_CHECK(block_forward(g, stage, params));
    }
    g->calls.fwd_next = stage + 1;
    return ZPP_OK;
}

/* The mean over rows, in double in row order (the CPU's sum). The first
 * call after the last stage copies the per-row losses and synchronises. */
float op_loss(zpp_model *m) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    if (!g->loss_pending) return g->loss;
    g->loss_pending = 0;
    if (!g->calls.have_targets) return g->loss = NAN;
    size_t n = (size_t)g->calls.B * g->cfg.seq_len;
    (void)zpp_cu_mean_loss(&g->cu, &g->batch, g->head.losses, n, &g->loss); /* NAN on error */
    return g->loss;
}

zpp_status op_backward(zpp_model *m, int stage, const void *params, void *grads,
                       float loss_scale) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_backward(m, &g->calls, stage, params, grads, "gpt2 cuda"));
    if (params) ZPP_CHECK(check_device_ptr(params, "backward", "params"));
    ZPP_CHECK(check_device_ptr(grads, "backward", "grads"));
    g->cu.grad_first = g->overwrite; /* OVERWRITE in the header */
    if (stage == S - 1) {
        ZPP_CHECK(head_backward(g, params, grads, loss_scale));
    } else if (stage == 0) {
        ZPP_CHECK(embed_backward(g, grads));
    } else {
        ZPP_CHECK(block_backward(g, stage, params, grads));
    }
    g->cu.grad_first = 0;
    if (stage == 0) g->overwrite = 0;
    g->calls.bwd_next = stage - 1;
    return ZPP_OK;
}

zpp_status op_set_grad_dtype(zpp_model *m, zpp_dtype dtype) {
    return zpp_cu_set_grad_dtype(&((gpt2_cuda *)m)->cu, dtype);
}

zpp_status op_overwrite_grads(zpp_model *m) {
    ((gpt2_cuda *)m)->overwrite = 1;
    return ZPP_OK;
}

zpp_status op_keep_logits(zpp_model *m, int row) {
    return zpp_decoder_keep_logits(m, &((gpt2_cuda *)m)->calls, row, "gpt2 cuda");
}

zpp_status op_logits(zpp_model *m, float *out) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    ZPP_CHECK(zpp_decoder_check_logits(m, &g->calls, out, "gpt2 cuda"));
    return zpp_cu_head_logits_host(&g->cu, &g->head, g->cfg.vocab_size, out);
}

void op_destroy(zpp_model *m) {
    gpt2_cuda *g = (gpt2_cuda *)m;
    if (!g) return;
    /* Work in flight may still use the buffers; errors are moot here. */
    if (g->arena) (void)cudaStreamSynchronize(g->stream);
    zpp_cu_batch_free(&g->batch, &g->cu);
    zpp_cu_free(&g->cu);
    zpp_attn_cudnn_close(&g->cudnn);
    zpp_device_free(g->dev, g->arena);
    zpp_gpt2_stages_free(&g->stages);
    free(g);
}

const zpp_model_ops gpt2_cuda_ops = {
    op_init_params, op_set_batch, op_forward,  op_loss,
    op_backward,    op_destroy,   op_keep_logits, op_logits,
    op_init_params_device, op_set_grad_dtype, op_overwrite_grads,
};

/* ---- create ---- */

/* rows x width elements of E from the arena. */
static void *take_e(const gpt2_cuda *g, zpp_arena *a, size_t rows, size_t width) {
    return zpp_arena_take_bytes(a, rows, width, g->es);
}

/* The buffers whose values no block's forward or backward pass leaves for
 * another (SCRATCH IN THE LOGITS), from s. */
static void take_scratch(gpt2_cuda *g, zpp_arena *s) {
    const size_t C = (size_t)g->cfg.n_embd, N = g->nmax;
    gpt2_acts *x = &g->act;
    if (!keeps(g, ZPP_KEEP_LAYERNORM)) x->ln = take_e(g, s, N, C);
    if (!keeps(g, ZPP_KEEP_GELU)) x->fcg = take_e(g, s, N, 4 * C);
    x->dres = zpp_arena_take(s, N, C);
    x->dres_e = g->base.param_dtype == ZPP_FP32 ? x->dres : take_e(g, s, N, C);
    x->dfc = take_e(g, s, N, 4 * C);
    x->dqkv = x->dfc;
    x->datty = x->dfc ? eat(g, x->dfc, N * 3 * C) : NULL; /* (a count's base is NULL) */
}

/* Carves the arena, each buffer on a 256-byte boundary (what cuBLASLt
 * likes best): the batch's ints, then gpt2_acts. Pass 1 (base NULL)
 * counts; pass 2 hands out pointers. */
static void plan(gpt2_cuda *g, zpp_arena *a) {
    size_t C = (size_t)g->cfg.n_embd, T = (size_t)g->cfg.seq_len, H = (size_t)g->cfg.n_head;
    size_t L = (size_t)g->cfg.n_layer, V = (size_t)g->cfg.vocab_size;
    size_t N = g->nmax, Bm = (size_t)g->base.max_batch;
    /* Per-layer buffers: L slabs, or with checkpointing one shared slab
     * (CHECKPOINTING); res keeps every block's input either way. */
    const size_t S = g->cfg.recompute ? 1 : L;
    gpt2_acts *x = &g->act;
    x->res = zpp_arena_take(a, (L + 1) * N, C);
    x->ln1m = zpp_arena_take(a, S, N);
    x->ln1r = zpp_arena_take(a, S, N);
    x->qkv = take_e(g, a, S * N, 3 * C);
    if (g->fused_attn) {
        x->att_lse = zpp_arena_take(a, S * Bm * H, T);
        x->att_dsum = zpp_arena_take(a, Bm * H, T);
    } else {
        x->att = take_e(g, a, S * Bm * H, T * T);
        x->score = zpp_arena_take(a, Bm * H, T * T);
        x->dscore = take_e(g, a, Bm * H, T * T);
    }
    x->atty = take_e(g, a, S * N, C);
    x->mid = zpp_arena_take(a, S * N, C);
    x->ln2m = zpp_arena_take(a, S, N);
    x->ln2r = zpp_arena_take(a, S, N);
    x->fch = take_e(g, a, S * N, 4 * C);
    x->lnf = take_e(g, a, N, C);
    x->lnfm = zpp_arena_take(a, N, 1);
    x->lnfr = zpp_arena_take(a, N, 1);
    /* every layer's where kept, else one layer's scratch below (RECOMPUTE) */
    if (keeps(g, ZPP_KEEP_LAYERNORM)) x->ln = take_e(g, a, 2 * L * N, C);
    if (keeps(g, ZPP_KEEP_GELU)) x->fcg = take_e(g, a, L * N, 4 * C);
    x->dc = zpp_arena_take(a, N, C);
    zpp_cu_head_take(&g->head, a, N, V, g->es);
    x->dres_sum = zpp_arena_take(a, 1, C);
    /* the scratch in the d logits' bytes where it fits (SCRATCH IN THE LOGITS) */
    zpp_arena count = {NULL, 0, a->align, 0};
    take_scratch(g, &count);
    const bool fits = !count.overflow && count.used * sizeof(float) <= N * V * g->es;
    zpp_arena in_logits = {(float *)g->head.dlogits, 0, a->align, 0};
    take_scratch(g, fits ? &in_logits : a);
}

/* Everything after the host bookkeeping: device memory, pinned staging,
 * the cuBLASLt handle. On failure the caller's destroy frees what exists. */
static zpp_status create_device_state(gpt2_cuda *g) {
    zpp_arena p = {NULL, 0, 64, 0};
    plan(g, &p);
    if (p.overflow)
        return zpp_error(ZPP_ERR_NOMEM,
                         "gpt2 cuda create: activation memory for max_batch %d overflows "
                         "size_t; use a smaller model or batch", g->base.max_batch);
    void *arena = NULL;
    zpp_status st = zpp_device_alloc(g->dev, p.used * sizeof(float), &arena);
    if (st != ZPP_OK)
        return zpp_error_context(st,
                                 "gpt2 cuda create: the activations of max_batch %d x "
                                 "seq_len %d (use a smaller max_batch)",
                                 g->base.max_batch, g->cfg.seq_len);
    g->arena = (float *)arena;
    p = zpp_arena{g->arena, 0, 64, 0};
    plan(g, &p);
    ZPP_CHECK(zpp_cu_init(&g->cu, g->dev, g->base.param_dtype, 4 * g->cfg.n_embd, "gpt2 cuda"));
    return zpp_cu_batch_init(&g->batch, &g->cu, g->nmax, g->cfg.vocab_size);
}

} /* namespace */

extern "C" zpp_status zpp_gpt2_cuda_create(const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                                           int max_batch, zpp_device *dev,
                                           zpp_model **model_p) {
    if (!model_p) return zpp_error(ZPP_ERR_INVALID, "gpt2 cuda create: model_p is NULL");
    ZPP_CHECK(zpp_gpt2_create_check(cfg, param_dtype, max_batch, "gpt2 cuda"));
    /* The int32 staging holds 5 N + 1 entries: keep positions and offsets
     * inside int32. */
    if ((int64_t)max_batch * cfg->seq_len > (INT32_MAX - 1) / 5)
        return zpp_error(ZPP_ERR_INVALID,
                         "gpt2 cuda create: max_batch %d x seq_len %d rows is too many; use "
                         "at most %d rows", max_batch, cfg->seq_len, (INT32_MAX - 1) / 5);
    if (!dev || dev->mem != ZPP_MEM_DEVICE)
        return zpp_error(ZPP_ERR_INVALID,
                         "gpt2 cuda create: the CUDA model needs a GPU device "
                         "(zpp_device_create_gpu)%s",
                         dev ? "; for the host device use zpp_gpt2_cpu_create" : "");
    /* What this GPU can do: the dtype (bf16 from 8.0), and the attention
     * path (ZPP_ATTENTION, the one place it is read; attention_path.h). */
    int cc_major = 0, cc_minor = 0;
    ZPP_CHECK(zpp_device_compute_capability(dev, &cc_major, &cc_minor));
    char why[320];
    zpp_status cst = zpp_device_dtype_check(cc_major, cc_minor, param_dtype, why, sizeof why);
    if (cst != ZPP_OK) return zpp_error(cst, "gpt2 cuda create: %s", why);
    zpp_attn_path attn = ZPP_ATTN_GEMM;
    cst = zpp_attn_path_pick(zpp_env_get(ZPP_ENV_ATTENTION), param_dtype,
                             cfg->n_embd / cfg->n_head, cc_major, cc_minor, &attn, why, sizeof why);
    if (cst != ZPP_OK) return zpp_error(cst, "gpt2 cuda create: %s", why);

    gpt2_cuda *g = (gpt2_cuda *)calloc(1, sizeof *g);
    if (!g) return zpp_error(ZPP_ERR_NOMEM, "gpt2 cuda create: out of host memory");
    zpp_status st = ZPP_OK;
    g->cfg = *cfg;
    zpp_gpt2_layout_make(cfg, &g->lay);
    g->dev = dev;
    g->stream = (cudaStream_t)dev->stream; /* the device's compute stream */
    if (zpp_gpt2_stages_make(cfg, &g->stages) != ZPP_OK) {
        op_destroy(&g->base);
        return zpp_error(ZPP_ERR_NOMEM, "gpt2 cuda create: out of host memory");
    }

    zpp_gpt2_base_fill(&g->base, cfg, param_dtype, max_batch, &g->stages);
    g->base.ops = &gpt2_cuda_ops;
    g->base.mem = ZPP_MEM_DEVICE;
    g->base.impl = g;
    g->nmax = (size_t)max_batch * cfg->seq_len;
    g->es = zpp_dtype_size(param_dtype);
    /* The fused attention (ours or cuDNN's) is bf16 with head size 64 or
     * 128 on compute capability 8.0+; anything else takes the GEMM path
     * (attention_path.h). */
    g->fused_attn = attn == ZPP_ATTN_FUSED || attn == ZPP_ATTN_CUDNN;
    g->gelu_epilogue = param_dtype != ZPP_FP32;
    g->et = param_dtype == ZPP_BF16 ? CUDA_R_16BF
            : param_dtype == ZPP_FP16 ? CUDA_R_16F : CUDA_R_32F;
    g->loss = NAN;
    g->calls.fwd_next = 0;
    g->calls.bwd_next = -1;
    g->calls.keep_row = -1;

    st = create_device_state(g);
    if (st == ZPP_OK && attn == ZPP_ATTN_CUDNN)
        st = zpp_attn_cudnn_open(&g->cudnn, zpp_env_get(ZPP_ENV_ATTENTION), dev, max_batch,
                                 cfg->seq_len, cfg->n_head, cfg->n_head,
                                 cfg->n_embd / cfg->n_head, g->stream);
    if (st != ZPP_OK) {
        op_destroy(&g->base);
        return st;
    }
    *model_p = &g->base;
    return ZPP_OK;
}

/* model/llama_kernels_cuda.cu — RMSNorm, rotary position embedding and
 * SwiGLU on the GPU (llama_kernels_cuda.h gives the API and layouts), each
 * the CUDA twin of a CPU reference function named in its comment, with the
 * same formula written the same way.
 *
 * PRECISION. Inputs are widened to fp32 exactly, every operation is fp32,
 * and each output is rounded to its dtype once. Per-row statistics (RMSNorm's
 * sum of squares) are warp sums; column sums (RMSNorm's weight gradient)
 * run over a fixed chunking of the rows, then over the chunks in order:
 * other orders than the CPU's, so RMSNorm agrees with it to rounding, not
 * to the bit (nvcc also fuses its products into following adds, one
 * rounding fewer). RoPE and SwiGLU write every product and sum as an _rn
 * intrinsic, which nvcc never fuses, so each is rounded once as in the
 * CPU's C (-ffp-contract=off): RoPE in fp32 gives the CPU's bits, SwiGLU
 * too but for expf (CUDA's within 2 ulp, glibc's within 1).
 * tests/test_llama_kernels_cuda.c derives each kernel's error bound from
 * these roundings.
 *
 * DETERMINISM. No atomics: every output element is written by one thread
 * after a sum in a fixed order (the warp's shuffle tree, a chunk's rows in
 * order, the chunks in order), so the same inputs give the same bits.
 *
 * SHAPES. Warp-per-row kernels launch 8 rows per CTA; elementwise kernels
 * use a grid-stride loop over 64-bit indices, so any n x width that fits
 * in memory is covered. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/cuda_elem.cuh"
#include "model/llama_kernels_cuda.h"

namespace {

constexpr int kChunkRows = 64; /* rows per partial column sum */

/* ==== RMSNorm ============================================================= */

/* zpp_cpu_rmsnorm_forward, one warp per row: ss = sum x^2 (the warp's
 * fixed shuffle tree), r = 1 / sqrt(ss / C + eps) (eps inside the root,
 * after the mean, as the CPU and HF's LlamaRMSNorm), y = x r w in E. */
template <typename E>
__global__ void rmsnorm_forward_kernel(E *out, float *rstd, const float *inp, const E *w,
                                       size_t n, int C, float eps) {
    const size_t row = global_tid() >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= n) return; /* the whole warp leaves together */
    const float *x = inp + row * C;
    E *o = out + row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    ss = warp_sum(ss);
    const float s = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c = lane; c < C; c += 32) st(o, c, x[c] * s * ld(w, c));
    if (lane == 0) rstd[row] = s;
}

/* zpp_cpu_rmsnorm_backward's input gradient, one warp per row. With
 * xh = x r and g = dy w, y = xh w depends on x directly and through r,
 * d r / d x_c = -r^3 x_c / C, so
 *   d x += r (g - xh mean(g xh))
 * (the mean removes g's component along x, the direction the
 * normalisation divides out). */
template <typename E>
__global__ void rmsnorm_backward_dx_kernel(float *dinp, const float *dout, const float *inp,
                                           const E *w, const float *rstd, size_t n, int C) {
    const size_t row = global_tid() >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *x = inp + row * C, *dy = dout + row * C;
    float *dx = dinp + row * C;
    const float s = rstd[row];
    float gx = 0.0f;
    for (int c = lane; c < C; c += 32) gx += dy[c] * ld(w, c) * x[c] * s;
    const float gxmean = warp_sum(gx) / (float)C;
    for (int c = lane; c < C; c += 32) {
        const float xh = x[c] * s;
        dx[c] += s * (dy[c] * ld(w, c) - xh * gxmean);
    }
}

/* The gain's gradient, stage 1: chunk k = blockIdx.y sums dy * xh over its
 * rows k*kChunkRows .. (ascending) for column c, into partial[k][c]. A CTA's
 * threads read consecutive columns of one row at a time (coalesced). */
__global__ void rmsnorm_dw_partial_kernel(float *partial, const float *dout, const float *inp,
                                          const float *rstd, size_t n, int C) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= C) return;
    const size_t r0 = (size_t)blockIdx.y * kChunkRows;
    const size_t r1 = r0 + kChunkRows < n ? r0 + kChunkRows : n;
    float acc = 0.0f;
    for (size_t r = r0; r < r1; r++) {
        const float xh = inp[r * C + c] * rstd[r];
        acc += dout[r * C + c] * xh;
    }
    partial[(size_t)blockIdx.y * C + c] = acc;
}

/* Stage 2: dw[c] += the chunks' partial sums, chunk 0 first. */
__global__ void rmsnorm_dw_sum_kernel(float *dw, const float *partial, int chunks, int C) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= C) return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++) acc += partial[(size_t)k * C + c];
    dw[c] += acc;
}

/* ==== rotary position embedding ========================================== */

/* llama_cpu.c's rope_apply, one thread per (row, head, pair i): q heads
 * 0..H-1 and k heads H..H+KV-1 are adjacent in a row, head h at column
 * h hd, so `heads` = H + KV covers exactly the rotated ones. sign = +1
 * turns by the angle, -1 back (the backward). The products and sums are
 * the _rn intrinsics, which nvcc never contracts into an FMA: each is
 * rounded once, as the CPU (built with -ffp-contract=off) rounds them. */
template <typename E>
__global__ void rope_kernel(E *qkv, const float *cos_t, const float *sin_t, size_t n, int T,
                            int heads, int hd, size_t W, float sign) {
    const int half = hd / 2;
    const size_t total = n * (size_t)heads * (size_t)half;
    for (size_t idx = global_tid(); idx < total; idx += grid_threads()) {
        const int i = (int)(idx % (size_t)half);
        const size_t rest = idx / (size_t)half;
        const int h = (int)(rest % (size_t)heads);
        const size_t r = rest / (size_t)heads;
        const size_t p = r % (size_t)T;
        const float c = cos_t[p * half + i], s = sign * sin_t[p * half + i];
        E *v = qkv + r * W + (size_t)h * hd;
        const float a = ld(v, i), b = ld(v, i + half);
        st(v, i, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
        st(v, i + half, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
    }
}

/* ==== SwiGLU ============================================================== */

/* sigmoid(g) = 1 / (1 + e^-g), as the CPU writes it (expf: within 2 ulp
 * here, 1 in glibc). For g < -88 e^-g overflows to inf and s = 0, the
 * right limit. */
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

/* The CPU's expressions, each product and sum rounded once (the _rn
 * intrinsics are never contracted into FMAs). */
__device__ __forceinline__ float swiglu_value(float g, float up) {
    return __fmul_rn(__fmul_rn(g, sigmoid(g)), up);
}
__device__ __forceinline__ void swiglu_grads(float d, float g, float up, float &dg, float &du) {
    const float s = sigmoid(g);
    du = __fmul_rn(__fmul_rn(d, g), s);
    const float slope = __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))); /* silu'(g) / s */
    dg = __fmul_rn(__fmul_rn(__fmul_rn(d, up), s), slope);
}

/* swiglu_forward: element (r, j) of act from gate (r, j) and up (r, F + j);
 * vec: F % 8 == 0 and 16-byte aligned buffers, eight at a time (a group of
 * eight lies inside one row). */
template <typename E>
__global__ void swiglu_forward_kernel(E *act, const E *gu, size_t n, int F, bool vec) {
    const size_t total = n * (size_t)F;
    if (vec) {
        for (size_t i = global_tid(); i < total / 8; i += grid_threads()) {
            const size_t e = 8 * i, r = e / (size_t)F, j = e % (size_t)F;
            float g[8], u[8];
            load8(gu + r * 2 * F + j, g);
            load8(gu + r * 2 * F + F + j, u);
#pragma unroll
            for (int k = 0; k < 8; k++) g[k] = swiglu_value(g[k], u[k]);
            store8(act + e, g);
        }
        return;
    }
    for (size_t i = global_tid(); i < total; i += grid_threads()) {
        const size_t r = i / (size_t)F, j = i % (size_t)F;
        st(act, i, swiglu_value(ld(gu, r * 2 * F + j), ld(gu, r * 2 * F + F + j)));
    }
}

/* swiglu_backward: [d gate | d up] of row r from dact and gu. */
template <typename E>
__global__ void swiglu_backward_kernel(E *dgu, const E *dact, const E *gu, size_t n, int F,
                                       bool vec) {
    const size_t total = n * (size_t)F;
    if (vec) {
        for (size_t i = global_tid(); i < total / 8; i += grid_threads()) {
            const size_t e = 8 * i, r = e / (size_t)F, j = e % (size_t)F;
            const size_t gate = r * 2 * F + j;
            float d[8], g[8], u[8], dg[8], du[8];
            load8(dact + e, d);
            load8(gu + gate, g);
            load8(gu + gate + F, u);
#pragma unroll
            for (int k = 0; k < 8; k++) swiglu_grads(d[k], g[k], u[k], dg[k], du[k]);
            store8(dgu + gate, dg);
            store8(dgu + gate + F, du);
        }
        return;
    }
    for (size_t i = global_tid(); i < total; i += grid_threads()) {
        const size_t r = i / (size_t)F, j = i % (size_t)F, gate = r * 2 * F + j;
        float dg, du;
        swiglu_grads(ld(dact, i), ld(gu, gate), ld(gu, gate + F), dg, du);
        st(dgu, gate, dg);
        st(dgu, gate + F, du);
    }
}

/* ==== host side =========================================================== */

zpp_status launch_status(const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA, "%s: kernel launch failed: %s (%s)", what,
                         cudaGetErrorString(e), cudaGetErrorName(e));
    return ZPP_OK;
}

unsigned grid_rows(size_t rows) { return zpp_cu_grid_rows(rows); }
unsigned grid_for(size_t n) { return zpp_cu_grid_for(n); }

size_t dtype_bytes(zpp_dtype dt) { return dt == ZPP_FP32 ? 4 : 2; }

zpp_status check_dtype(const char *what, zpp_dtype dt) {
    if (dt != ZPP_FP32 && dt != ZPP_BF16 && dt != ZPP_FP16)
        return zpp_error(ZPP_ERR_INVALID, "%s: dtype %d is not fp32, bf16 or fp16", what,
                         (int)dt);
    return ZPP_OK;
}

/* Non-NULL and aligned to its element (the kernels read single elements). */
zpp_status check_ptr(const char *what, const char *name, const void *p, size_t align) {
    if (!p) return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL", what, name);
    if ((uintptr_t)p % align)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: %s at %p is not %zu-byte aligned (its element's size); pass "
                         "whole elements of a cudaMalloc'd buffer",
                         what, name, p, align);
    return ZPP_OK;
}

zpp_status check_rows(const char *what, int n, int C) {
    if (n < 1 || C < 1)
        return zpp_error(ZPP_ERR_INVALID, "%s: n = %d rows of C = %d; each must be >= 1", what,
                         n, C);
    return ZPP_OK;
}

/* Runs `...` with E typedef'd to the CUDA type of `dt` (checked before). */
#define WITH_E(dt, ...) ZPP_WITH_E(dt, __VA_ARGS__)

int rms_chunks(int n) { return (n + kChunkRows - 1) / kChunkRows; }

} /* namespace */

extern "C" zpp_status zpp_llama_rmsnorm_forward(void *out, float *rstd, const float *inp,
                                                const void *w, int n, int C, float eps,
                                                zpp_dtype dtype, void *stream) {
    const char *what = "llama rmsnorm forward";
    ZPP_CHECK(check_dtype(what, dtype));
    ZPP_CHECK(check_rows(what, n, C));
    if (!(eps > 0.0f) || !isfinite(eps))
        return zpp_error(ZPP_ERR_INVALID, "%s: eps %g must be finite and positive", what,
                         (double)eps);
    const size_t eb = dtype_bytes(dtype);
    ZPP_CHECK(check_ptr(what, "out", out, eb));
    ZPP_CHECK(check_ptr(what, "rstd", rstd, 4));
    ZPP_CHECK(check_ptr(what, "inp", inp, 4));
    ZPP_CHECK(check_ptr(what, "w", w, eb));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    WITH_E(dtype, rmsnorm_forward_kernel<E><<<grid_rows((size_t)n), kThreads, 0, st>>>(
                      static_cast<E *>(out), rstd, inp, static_cast<const E *>(w), (size_t)n,
                      C, eps));
    return launch_status(what);
}

extern "C" size_t zpp_llama_rmsnorm_backward_scratch(int n, int C) {
    if (n < 1 || C < 1) return 0;
    return (size_t)rms_chunks(n) * (size_t)C;
}

extern "C" zpp_status zpp_llama_rmsnorm_backward(float *dinp, float *dw, float *scratch,
                                                 const float *dout, const float *inp,
                                                 const void *w, const float *rstd, int n, int C,
                                                 zpp_dtype dtype, void *stream) {
    const char *what = "llama rmsnorm backward";
    ZPP_CHECK(check_dtype(what, dtype));
    ZPP_CHECK(check_rows(what, n, C));
    ZPP_CHECK(check_ptr(what, "dinp", dinp, 4));
    ZPP_CHECK(check_ptr(what, "dw", dw, 4));
    ZPP_CHECK(check_ptr(what, "scratch", scratch, 4));
    ZPP_CHECK(check_ptr(what, "dout", dout, 4));
    ZPP_CHECK(check_ptr(what, "inp", inp, 4));
    ZPP_CHECK(check_ptr(what, "w", w, dtype_bytes(dtype)));
    ZPP_CHECK(check_ptr(what, "rstd", rstd, 4));
    const int chunks = rms_chunks(n);
    if (chunks > 65535)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: n = %d rows is more than the weight gradient's grid holds (%d)",
                         what, n, 65535 * kChunkRows);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    WITH_E(dtype, rmsnorm_backward_dx_kernel<E><<<grid_rows((size_t)n), kThreads, 0, st>>>(
                      dinp, dout, inp, static_cast<const E *>(w), rstd, (size_t)n, C));
    ZPP_CHECK(launch_status("llama rmsnorm backward (input gradient)"));
    const unsigned col_blocks = (unsigned)((C + kThreads - 1) / kThreads);
    rmsnorm_dw_partial_kernel<<<dim3(col_blocks, (unsigned)chunks), kThreads, 0, st>>>(
        scratch, dout, inp, rstd, (size_t)n, C);
    ZPP_CHECK(launch_status("llama rmsnorm backward (gain gradient, per chunk)"));
    rmsnorm_dw_sum_kernel<<<col_blocks, kThreads, 0, st>>>(dw, scratch, chunks, C);
    return launch_status("llama rmsnorm backward (gain gradient, sum of chunks)");
}

/* The shape checks and the launch of both directions of RoPE. */
static zpp_status rope_run(const char *what, void *qkv, const float *cos_t, const float *sin_t,
                           int B, int T, int H, int KV, int hd, zpp_dtype dtype, float sign,
                           void *stream) {
    ZPP_CHECK(check_dtype(what, dtype));
    if (B < 1 || T < 1 || H < 1 || KV < 1 || KV > H || hd < 2 || hd % 2)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: B = %d, T = %d, H = %d, KV = %d, hd = %d; need B, T, H >= 1, "
                         "1 <= KV <= H and an even hd >= 2 (RoPE turns channel pairs)",
                         what, B, T, H, KV, hd);
    ZPP_CHECK(check_ptr(what, "qkv", qkv, dtype_bytes(dtype)));
    ZPP_CHECK(check_ptr(what, "cos_t", cos_t, 4));
    ZPP_CHECK(check_ptr(what, "sin_t", sin_t, 4));
    const size_t n = (size_t)B * (size_t)T, W = (size_t)(H + 2 * KV) * (size_t)hd;
    const size_t pairs = n * (size_t)(H + KV) * (size_t)(hd / 2);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    WITH_E(dtype, rope_kernel<E><<<grid_for(pairs), kThreads, 0, st>>>(
                      static_cast<E *>(qkv), cos_t, sin_t, n, T, H + KV, hd, W, sign));
    return launch_status(what);
}

extern "C" zpp_status zpp_llama_rope_forward(void *qkv, const float *cos_t, const float *sin_t,
                                             int B, int T, int H, int KV, int hd,
                                             zpp_dtype dtype, void *stream) {
    return rope_run("llama rope forward", qkv, cos_t, sin_t, B, T, H, KV, hd, dtype, 1.0f,
                    stream);
}

extern "C" zpp_status zpp_llama_rope_backward(void *dqkv, const float *cos_t, const float *sin_t,
                                              int B, int T, int H, int KV, int hd,
                                              zpp_dtype dtype, void *stream) {
    return rope_run("llama rope backward", dqkv, cos_t, sin_t, B, T, H, KV, hd, dtype, -1.0f,
                    stream);
}

/* Whether the 8-wide (16-byte) accesses may be used: rows of F split into
 * whole groups of eight, and every buffer 16-byte aligned. */
static bool swiglu_vec(int F, const void *a, const void *b, const void *c = NULL) {
    return F % 8 == 0 && (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15u) == 0;
}

extern "C" zpp_status zpp_llama_swiglu_forward(void *act, const void *gu, int n, int F,
                                               zpp_dtype dtype, void *stream) {
    const char *what = "llama swiglu forward";
    ZPP_CHECK(check_dtype(what, dtype));
    ZPP_CHECK(check_rows(what, n, F));
    ZPP_CHECK(check_ptr(what, "act", act, dtype_bytes(dtype)));
    ZPP_CHECK(check_ptr(what, "gu", gu, dtype_bytes(dtype)));
    const size_t total = (size_t)n * (size_t)F;
    const bool v = swiglu_vec(F, act, gu);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    WITH_E(dtype, swiglu_forward_kernel<E><<<grid_for(v ? total / 8 : total), kThreads, 0, st>>>(
                      static_cast<E *>(act), static_cast<const E *>(gu), (size_t)n, F, v));
    return launch_status(what);
}

extern "C" zpp_status zpp_llama_swiglu_backward(void *dgu, const void *dact, const void *gu,
                                                int n, int F, zpp_dtype dtype, void *stream) {
    const char *what = "llama swiglu backward";
    ZPP_CHECK(check_dtype(what, dtype));
    ZPP_CHECK(check_rows(what, n, F));
    ZPP_CHECK(check_ptr(what, "dgu", dgu, dtype_bytes(dtype)));
    ZPP_CHECK(check_ptr(what, "dact", dact, dtype_bytes(dtype)));
    ZPP_CHECK(check_ptr(what, "gu", gu, dtype_bytes(dtype)));
    const size_t total = (size_t)n * (size_t)F;
    const bool v = swiglu_vec(F, dgu, dact, gu);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    WITH_E(dtype,
           swiglu_backward_kernel<E><<<grid_for(v ? total / 8 : total), kThreads, 0, st>>>(
               static_cast<E *>(dgu), static_cast<const E *>(dact), static_cast<const E *>(gu),
               (size_t)n, F, v));
    return launch_status(what);
}

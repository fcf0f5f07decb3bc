/* model/cuda_elem.cuh — the pieces every CUDA model kernel is written
 * with: loads that widen a working-dtype element E (float, __nv_bfloat16
 * or __half) to fp32 and stores that round it back once, 16-byte accesses
 * of eight elements, warp reductions, grid-stride indices, the launch
 * shapes and the error plumbing of the launchers. Device code and host
 * helpers only, all inline: included by CUDA sources (gpt2_cuda.cu,
 * cuda_ops.cu, the Llama's kernels). */
#ifndef ZPP_MODEL_CUDA_ELEM_CUH
#define ZPP_MODEL_CUDA_ELEM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

constexpr int kThreads = 256;                   /* threads per CTA */
constexpr int kRowsPerCta = kThreads / 32;      /* warp-per-row kernels */
constexpr unsigned kMaxGrid = 65535u * 32u;     /* grid-stride beyond this */

/* Runs `...` with E typedef'd to the working dtype `dt` (a zpp_dtype): the
 * one place that turns the runtime dtype into a kernel's template argument. */
#define ZPP_WITH_E(dt, ...)                                             \
    do {                                                                \
        switch (dt) {                                                   \
        case ZPP_BF16: { typedef __nv_bfloat16 E; __VA_ARGS__; } break; \
        case ZPP_FP16: { typedef __half E; __VA_ARGS__; } break;        \
        default: { typedef float E; __VA_ARGS__; } break;               \
        }                                                               \
    } while (0)

/* Error plumbing of a launcher: `who` names the model ("gpt2 cuda"). */
#define ZPP_CU_CHECK(who, call, what)                                                     \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess)                                                            \
            return zpp_error(e_ == cudaErrorMemoryAllocation ? ZPP_ERR_NOMEM : ZPP_ERR_CUDA, \
                             "%s: %s: %s", who, what, cudaGetErrorString(e_));            \
    } while (0)

#define ZPP_LT_CHECK(who, call, what)                                                     \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                  \
            return zpp_error(ZPP_ERR_CUDA, "%s: %s: cuBLASLt %s (%s)", who, what,         \
                             cublasLtGetStatusName(s_), cublasLtGetStatusString(s_));     \
    } while (0)

static inline unsigned zpp_cu_grid_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    if (b > kMaxGrid) b = kMaxGrid;
    return b ? (unsigned)b : 1u;
}

/* Whether the 8-wide (16-byte) accesses may be used on these pointers
 * (NULL counts as aligned). */
static inline bool zpp_cu_vec8_ok(const void *a, const void *b, const void *c = NULL,
                                  const void *d = NULL) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15u) == 0;
}

static inline unsigned zpp_cu_grid_rows(size_t rows) { /* warp-per-row kernels */
    return (unsigned)((rows + kRowsPerCta - 1) / kRowsPerCta);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ size_t global_tid() {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t grid_threads() { return (size_t)gridDim.x * blockDim.x; }

/* Loads widen exactly; stores round to nearest even. */
__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ float ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void st(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }

/* A parameter gradient's element code, the same for every thread of a
 * launch (no divergence): its dtype (a zpp_dtype: fp32, or the working
 * dtype the engine chose; cuda_ops.h, zpp_cu_set_grad_dtype), with
 * kGradFirst or'ed in when this write is the element's first of the
 * backward pass and the buffer holds stale values (zpp_cu.grad_first):
 * the value is stored, not added. */
constexpr int kGradFirst = 0x100;
static inline int grad_code(zpp_dtype gd, int first) {
    return (int)gd | (first ? kGradFirst : 0);
}

/* Element i of a gradient, widened to fp32 (0 on its first write), and
 * stored back rounded once; grad_add is g[i] += v in fp32. */
__device__ __forceinline__ float grad_ld(const void *g, int gd, size_t i) {
    if (gd & kGradFirst) return 0.0f;
    if (gd == ZPP_BF16) return ld((const __nv_bfloat16 *)g, i);
    if (gd == ZPP_FP16) return ld((const __half *)g, i);
    return ((const float *)g)[i];
}
__device__ __forceinline__ void grad_st(void *g, int gd, size_t i, float v) {
    gd &= ~kGradFirst;
    if (gd == ZPP_BF16) st((__nv_bfloat16 *)g, i, v);
    else if (gd == ZPP_FP16) st((__half *)g, i, v);
    else ((float *)g)[i] = v;
}
__device__ __forceinline__ void grad_add(void *g, int gd, size_t i, float v) {
    grad_st(g, gd, i, grad_ld(g, gd, i) + v);
}

/* Eight consecutive elements at once (16-byte accesses: the elementwise
 * kernels are bound by memory, and 2-byte accesses waste most of each
 * transaction). p must be 16-byte aligned; the launchers check (vec8_ok). */
__device__ __forceinline__ void load8(const float *p, float (&f)[8]) {
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float (&f)[8]) {
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}
__device__ __forceinline__ void load8(const __half *p, float (&f)[8]) {
    uint4 u = *(const uint4 *)p;
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __half22float2(h[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}
__device__ __forceinline__ void store8(float *p, const float (&f)[8]) {
    ((float4 *)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16 *p, const float (&f)[8]) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    *(uint4 *)p = u;
}
__device__ __forceinline__ void store8(__half *p, const float (&f)[8]) {
    uint4 u;
    __half2 *h = (__half2 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
    *(uint4 *)p = u;
}

#endif

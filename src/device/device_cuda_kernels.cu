/* device/device_cuda_kernels.cu — the CUDA backend's kernels for shard arithmetic:
 * add, sum of squares, AdamW (the quantization family lives in
 * quant/quant_cuda.cu). Grid-stride loops, so any n runs on a bounded grid. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "device/device_cuda_kernels.h"

static zpp_status launch_status(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
    return ZPP_OK;
}

static unsigned grid_for(size_t n, unsigned threads) {
    size_t blocks = (n + threads - 1) / threads;
    if (blocks > 132u * 16u) blocks = 132u * 16u; /* grid-stride beyond this */
    return blocks ? (unsigned)blocks : 1u;
}

/* grid_for, at most the blocks of `kernel` the GPU holds at once (every
 * SM at the kernel's occupancy limit). A grid-stride loop over more blocks
 * than that runs in waves, and its last wave, partly full, keeps too few
 * loads in flight to hold the memory's bandwidth: AdamW (48 registers a
 * thread, 5 CTAs of 256 an SM, 660 on 132 SMs) ran grid_for's 2,112 CTAs
 * in three full waves and a fifth of one. grid_for's cap where the
 * runtime cannot say. */
static unsigned grid_resident(const void *kernel, size_t n, unsigned threads) {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)threads, 0) !=
            cudaSuccess ||
        sms <= 0 || per_sm <= 0) {
        (void)cudaGetLastError(); /* not sticky: the launch reports its own errors */
        return grid_for(n, threads);
    }
    const size_t fill = (size_t)sms * (size_t)per_sm, want = (n + threads - 1) / threads;
    return (unsigned)(want < fill ? (want ? want : 1) : fill);
}

__global__ void zpp_dcu_add_kernel(float *acc, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        acc[i] += x[i];
}

extern "C" zpp_status zpp_dcu_add(void *stream, float *acc, const float *x, size_t n) {
    if (n == 0) return ZPP_OK;
    zpp_dcu_add_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(acc, x, n);
    return launch_status("add");
}

extern "C" int zpp_dcu_image_check(void) {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, zpp_dcu_add_kernel);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return (int)e;
}

/* Gradients and the arrays whose sum of squares is asked for come in
 * fp32, bf16 or fp16. Each element widens to fp32, exactly; the kernels
 * are templated on the element type, so the dtype is chosen once a launch
 * and the loops carry no branch on it. */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

/* The two 2-byte elements of a 32-bit word (the lower one first), widened;
 * the pointer only picks the type. bf16 is fp32's upper half. */
__device__ __forceinline__ float2 widen2(unsigned w, const __nv_bfloat16 *) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 widen2(unsigned w, const __half *) {
    __half2 h;
    memcpy(&h, &w, sizeof h);
    return __half22float2(h);
}

/* Sum of squares: per-thread double partials, a block reduction in shared
 * memory, one atomicAdd per block into a double. The order of the block
 * sums varies from run to run: the GPU's norm agrees with the host's to
 * double rounding, not bit for bit. */
/* Sum of squares in double. With a 16-byte aligned x, 16 bytes a load
 * (four fp32 or eight 2-byte elements: 16 bytes in flight instead of 4 or
 * 2, and the kernel is bound by loads in flight) into two accumulators,
 * so the adds do not wait on each other. */
__device__ __forceinline__ void sumsq16(const float *x, size_t i, double &s, double &t) {
    const float4 v = ((const float4 *)x)[i];
    s += (double)v.x * v.x + (double)v.y * v.y;
    t += (double)v.z * v.z + (double)v.w * v.w;
}

template <typename H>
__device__ __forceinline__ void sumsq16(const H *x, size_t i, double &s, double &t) {
    const uint4 u = ((const uint4 *)x)[i];
    const float2 a = widen2(u.x, x), b = widen2(u.y, x), c = widen2(u.z, x), e = widen2(u.w, x);
    s += (double)a.x * a.x + (double)a.y * a.y + (double)b.x * b.x + (double)b.y * b.y;
    t += (double)c.x * c.x + (double)c.y * c.y + (double)e.x * e.x + (double)e.y * e.y;
}

template <typename T>
__global__ void zpp_dcu_sumsq_kernel(const T *__restrict__ x, size_t n, double *out) {
    constexpr size_t per = 16 / sizeof(T); /* elements a 16-byte load */
    __shared__ double part[256];
    double s = 0.0, t = 0.0;
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x,
                 step = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;
    if (((uintptr_t)x & 15u) == 0) {
        for (size_t i = i0; i < n / per; i += step) sumsq16(x, i, s, t);
        tail = n / per * per;
    }
    for (size_t i = tail + i0; i < n; i += step) {
        const float f = to_f32(x[i]);
        s += (double)f * f;
    }
    part[threadIdx.x] = s + t;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

template <typename T>
static void sumsq_launch_as(cudaStream_t s, const T *x, size_t n, double *out) {
    const size_t per = 16 / sizeof(T); /* the kernel's elements a thread an iteration */
    const unsigned blocks =
        grid_resident((const void *)zpp_dcu_sumsq_kernel<T>, (n + per - 1) / per, 256);
    zpp_dcu_sumsq_kernel<<<blocks, 256, 0, s>>>(x, n, out);
}

static void sumsq_launch(cudaStream_t s, const void *x, size_t n, zpp_dtype dt, double *out) {
    if (dt == ZPP_BF16) sumsq_launch_as(s, (const __nv_bfloat16 *)x, n, out);
    else if (dt == ZPP_FP16) sumsq_launch_as(s, (const __half *)x, n, out);
    else sumsq_launch_as(s, (const float *)x, n, out);
}

extern "C" zpp_status zpp_dcu_sumsq(void *stream, const void *const *x, const size_t *n, int k,
                                    zpp_dtype dt, double *tmp_dev, double *sums) {
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemsetAsync(tmp_dev, 0, (size_t)k * sizeof(double), s);
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "sum of squares: %s", cudaGetErrorString(e));
    for (int j = 0; j < k; j++) {
        if (n[j]) sumsq_launch(s, x[j], n[j], dt, tmp_dev + j);
        zpp_status st = launch_status("sum of squares");
        if (st != ZPP_OK) return st;
    }
    e = cudaMemcpyAsync(sums, tmp_dev, (size_t)k * sizeof(double), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "sum of squares: %s", cudaGetErrorString(e));
    return ZPP_OK;
}

/* One element of AdamW: the host loop's expressions, in the same order
 * (device_host.c); c1, c2 are the bias corrections, computed once on the
 * host as there. */
__device__ __forceinline__ void adamw_elem(const zpp_adamw_args &a, float c1, float c2, float wd,
                                           float g0, float &m, float &v, float &p) {
    float g = a.grad_scale * g0;
    float mi = a.beta1 * m + (1.0f - a.beta1) * g;
    float vi = a.beta2 * v + (1.0f - a.beta2) * g * g;
    p -= a.lr * ((mi / c1) / (sqrtf(vi / c2) + a.eps) + wd * p);
    m = mi;
    v = vi;
}

/* A master's halves (core/dtype.h, zpp_split_hi/lo/join): hi is x rounded
 * to bf16 to nearest, ties away from zero; lo x's low 16 bits. */
__device__ __forceinline__ unsigned split_hi(float x) {
    return (__float_as_uint(x) + 0x8000u) >> 16;
}
__device__ __forceinline__ unsigned split_lo(float x) { return __float_as_uint(x) & 0xffffu; }
__device__ __forceinline__ float split_join(unsigned hi, unsigned lo) {
    return __uint_as_float((hi << 16) + (unsigned)(int)(short)(unsigned short)lo);
}
/* Two 16-bit values in one word, the first in its low half (memory order). */
__device__ __forceinline__ unsigned pack2(unsigned a, unsigned b) { return a | b << 16; }

__device__ __forceinline__ void store_work(void *work, int dt, size_t i, float p) {
    if (dt == ZPP_BF16) ((uint16_t *)work)[i] = (uint16_t)split_hi(p);
    else if (dt == ZPP_FP16) ((__half *)work)[i] = __float2half_rn(p);
    else ((float *)work)[i] = p;
}

/* The weight decay of the four elements at i (zpp_adamw_decay_at's
 * values): one test a range for a quad that no range boundary cuts, the
 * usual case, instead of four lookups. Over a constant count, as
 * zpp_adamw_decay_at, so the ranges stay in the kernel's parameters. */
__device__ __forceinline__ void adamw_decay_quad(const zpp_adamw_args &a, size_t i, float wd[4]) {
    unsigned in = a.n_decay == 0 ? 0xFu : 0u; /* bit j: element i + j decays */
#pragma unroll
    for (int k = 0; k < ZPP_ADAMW_RANGES; k++) {
        if (k >= a.n_decay) continue;
        const size_t lo = a.decay_lo[k], hi = a.decay_hi[k];
        if (i >= lo && i + 4 <= hi) {
            in = 0xFu;
        } else if (i + 4 > lo && i < hi) {
            for (int j = 0; j < 4; j++)
                if (i + j >= lo && i + j < hi) in |= 1u << j;
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) wd[j] = (in >> j) & 1u ? a.weight_decay : 0.0f;
}

/* The gradient's four elements at g, widened: one 16-byte load for fp32,
 * one 8-byte load for a 2-byte dtype (the quad path's alignment); and
 * their clearing, one store of the same width. */
__device__ __forceinline__ float4 grad_load4(const float *g) { return *(const float4 *)g; }
template <typename H> __device__ __forceinline__ float4 grad_load4(const H *g) {
    const uint2 u = *(const uint2 *)g;
    const float2 lo = widen2(u.x, g), hi = widen2(u.y, g);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void grad_clear4(float *g) {
    *(float4 *)g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
template <typename H> __device__ __forceinline__ void grad_clear4(H *g) {
    *(uint2 *)g = make_uint2(0u, 0u); /* +0 in bf16 and fp16 alike */
}
/* One element's clearing, for the tail. */
__device__ __forceinline__ void grad_clear1(float *g) { *g = 0.0f; }
__device__ __forceinline__ void grad_clear1(__nv_bfloat16 *g) { *g = __float2bfloat16_rn(0.0f); }
__device__ __forceinline__ void grad_clear1(__half *g) { *g = __float2half_rn(0.0f); }

/* Four elements at i (a multiple of 4) in 16-byte loads and one store per
 * array (8 bytes for a 2-byte gradient): AdamW moves 34 bytes an element
 * with an fp32 gradient (30 with a bf16 one: 2 bytes less to read and 2 to
 * clear) and does little arithmetic, so what limits it is how many bytes
 * each instruction moves. Four scalar streams and a per-element
 * weight-decay lookup made it issue-bound (1.28x the bytes' time at GPT
 * 1.31B). */
template <typename G>
__device__ __forceinline__ void adamw_quad(float *__restrict__ param, float *__restrict__ m,
                                           float *__restrict__ v, G *__restrict__ grad,
                                           size_t i, const zpp_adamw_args &a, float c1, float c2,
                                           void *__restrict__ work, int dt,
                                           uint16_t *__restrict__ lo) {
    const float4 g4 = grad_load4(grad + i);
    float4 m4 = *(const float4 *)(m + i), v4 = *(const float4 *)(v + i);
    float4 p4;
    if (lo) { /* the split master: its bf16 halves in work, the low ones in lo */
        const uint2 h = *(const uint2 *)((const uint16_t *)work + i);
        const uint2 l = *(const uint2 *)(lo + i);
        p4 = make_float4(split_join(h.x & 0xffffu, l.x & 0xffffu), split_join(h.x >> 16, l.x >> 16),
                         split_join(h.y & 0xffffu, l.y & 0xffffu),
                         split_join(h.y >> 16, l.y >> 16));
    } else {
        p4 = *(const float4 *)(param + i);
    }
    float wd[4];
    adamw_decay_quad(a, i, wd);
    adamw_elem(a, c1, c2, wd[0], g4.x, m4.x, v4.x, p4.x);
    adamw_elem(a, c1, c2, wd[1], g4.y, m4.y, v4.y, p4.y);
    adamw_elem(a, c1, c2, wd[2], g4.z, m4.z, v4.z, p4.z);
    adamw_elem(a, c1, c2, wd[3], g4.w, m4.w, v4.w, p4.w);
    *(float4 *)(m + i) = m4;
    *(float4 *)(v + i) = v4;
    if (lo)
        *(uint2 *)(lo + i) = make_uint2(pack2(split_lo(p4.x), split_lo(p4.y)),
                                        pack2(split_lo(p4.z), split_lo(p4.w)));
    else
        *(float4 *)(param + i) = p4;
    if (a.clear_grad) grad_clear4(grad + i);
    if (!work) return;
    if (dt == ZPP_BF16) {
        *(uint2 *)((uint16_t *)work + i) = make_uint2(pack2(split_hi(p4.x), split_hi(p4.y)),
                                                      pack2(split_hi(p4.z), split_hi(p4.w)));
    } else if (dt == ZPP_FP16) {
        __half2 lo = __floats2half2_rn(p4.x, p4.y), hi = __floats2half2_rn(p4.z, p4.w);
        uint2 u;
        u.x = *(const unsigned *)&lo;
        u.y = *(const unsigned *)&hi;
        *(uint2 *)((__half *)work + i) = u;
    } else {
        *(float4 *)((float *)work + i) = p4;
    }
}

/* The four arrays (and the working copy) never overlap: __restrict__ lets
 * every load of an element issue before any store, so each thread keeps
 * its four reads in flight together. Without it a store to one array had
 * to land before the next array's load (they might alias), and the loop
 * ran at memory latency, not bandwidth: writing the cleared gradient back
 * made the step several times slower than a separate memset. `quads`: the
 * first n / 4 * 4 elements go four at a time (every pointer aligned for
 * it), the rest one at a time. G is the gradient's element type. */
template <typename G>
__global__ void zpp_dcu_adamw_kernel(float *__restrict__ param, float *__restrict__ m,
                                     float *__restrict__ v, G *__restrict__ grad, size_t n,
                                     zpp_adamw_args a, float c1, float c2,
                                     void *__restrict__ work, int dt,
                                     uint16_t *__restrict__ lo, bool quads) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t tail = 0;
    if (quads) {
        for (size_t q = t0; q < n / 4; q += stride)
            adamw_quad(param, m, v, grad, 4 * q, a, c1, c2, work, dt, lo);
        tail = n / 4 * 4;
    }
    uint16_t *const hi = (uint16_t *)work; /* with lo: the split master's bf16 halves */
    for (size_t i = tail + t0; i < n; i += stride) {
        float mi = m[i], vi = v[i], p = lo ? split_join(hi[i], lo[i]) : param[i];
        adamw_elem(a, c1, c2, zpp_adamw_decay_at(a, i), to_f32(grad[i]), mi, vi, p);
        m[i] = mi;
        v[i] = vi;
        if (lo) lo[i] = (uint16_t)split_lo(p);
        else param[i] = p;
        if (a.clear_grad) grad_clear1(grad + i);
        if (work) store_work(work, dt, i, p);
    }
}

static bool aligned(const void *p, size_t bytes) { return ((uintptr_t)p % bytes) == 0; }

template <typename G>
static void adamw_launch(cudaStream_t s, float *param, float *m, float *v, void *grad, size_t n,
                         const zpp_adamw_args *a, float c1, float c2, void *work,
                         zpp_dtype work_dtype, bool quads) {
    const unsigned grid =
        grid_resident((const void *)zpp_dcu_adamw_kernel<G>, quads ? n / 4 : n, 256);
    zpp_dcu_adamw_kernel<G><<<grid, 256, 0, s>>>(
        param, m, v, (G *)grad, n, *a, c1, c2, work, (int)work_dtype, a->master_lo, quads);
}

extern "C" zpp_status zpp_dcu_adamw(void *stream, float *param, float *m, float *v, void *grad,
                                    size_t n, const zpp_adamw_args *a, void *work,
                                    zpp_dtype work_dtype) {
    if (n == 0) return ZPP_OK;
    float c1 = 1.0f - powf(a->beta1, (float)a->step);
    float c2 = 1.0f - powf(a->beta2, (float)a->step);
    /* a quad's gradient is one 16-byte (fp32) or 8-byte (2-byte dtype) access */
    const size_t gsize = zpp_dtype_size(a->grad_dtype);
    const bool quads = aligned(param, 16) && aligned(a->master_lo, 8) && aligned(m, 16) &&
                       aligned(v, 16) &&
                       aligned(grad, 4 * gsize) &&
                       (!work || aligned(work, 4 * zpp_dtype_size(work_dtype)));
    cudaStream_t s = (cudaStream_t)stream;
    if (a->grad_dtype == ZPP_BF16)
        adamw_launch<__nv_bfloat16>(s, param, m, v, grad, n, a, c1, c2, work, work_dtype, quads);
    else if (a->grad_dtype == ZPP_FP16)
        adamw_launch<__half>(s, param, m, v, grad, n, a, c1, c2, work, work_dtype, quads);
    else
        adamw_launch<float>(s, param, m, v, grad, n, a, c1, c2, work, work_dtype, quads);
    return launch_status("AdamW");
}

/* The split and the join of masters (zpp_device_master_split/join): four
 * elements a thread where every pointer allows it (a 16-byte fp32 access,
 * 8-byte halves, as AdamW's quads), else one; memory-bound, as the
 * conversion they stand in for at a gather. */
__global__ void master_split_kernel(const float *__restrict__ x, uint16_t *__restrict__ hi,
                                    uint16_t *__restrict__ lo, size_t n, bool quads) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t tail = 0;
    if (quads) {
        for (size_t k = t0; k < n / 4; k += stride) {
            const float4 v = ((const float4 *)x)[k];
            ((uint2 *)hi)[k] = make_uint2(pack2(split_hi(v.x), split_hi(v.y)),
                                          pack2(split_hi(v.z), split_hi(v.w)));
            if (lo)
                ((uint2 *)lo)[k] = make_uint2(pack2(split_lo(v.x), split_lo(v.y)),
                                              pack2(split_lo(v.z), split_lo(v.w)));
        }
        tail = n / 4 * 4;
    }
    for (size_t i = tail + t0; i < n; i += stride) {
        hi[i] = (uint16_t)split_hi(x[i]);
        if (lo) lo[i] = (uint16_t)split_lo(x[i]);
    }
}

__global__ void master_join_kernel(const uint16_t *__restrict__ hi,
                                   const uint16_t *__restrict__ lo, float *__restrict__ x,
                                   size_t n, bool quads) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t tail = 0;
    if (quads) {
        for (size_t k = t0; k < n / 4; k += stride) {
            const uint2 h = ((const uint2 *)hi)[k], l = ((const uint2 *)lo)[k];
            ((float4 *)x)[k] = make_float4(
                split_join(h.x & 0xffffu, l.x & 0xffffu), split_join(h.x >> 16, l.x >> 16),
                split_join(h.y & 0xffffu, l.y & 0xffffu), split_join(h.y >> 16, l.y >> 16));
        }
        tail = n / 4 * 4;
    }
    for (size_t i = tail + t0; i < n; i += stride) x[i] = split_join(hi[i], lo[i]);
}

extern "C" zpp_status zpp_dcu_master_split(void *stream, const float *x, uint16_t *hi,
                                           uint16_t *lo, size_t n) {
    const bool quads = aligned(x, 16) && aligned(hi, 8) && aligned(lo, 8);
    master_split_kernel<<<grid_for(quads ? n / 4 : n, 256), 256, 0, (cudaStream_t)stream>>>(
        x, hi, lo, n, quads);
    return launch_status("master split");
}

extern "C" zpp_status zpp_dcu_master_join(void *stream, const uint16_t *hi, const uint16_t *lo,
                                          float *x, size_t n) {
    const bool quads = aligned(x, 16) && aligned(hi, 8) && aligned(lo, 8);
    master_join_kernel<<<grid_for(quads ? n / 4 : n, 256), 256, 0, (cudaStream_t)stream>>>(
        hi, lo, x, n, quads);
    return launch_status("master join");
}

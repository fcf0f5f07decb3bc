/* device/device_cuda_kernels.cu — the CUDA backend's kernels for shard arithmetic:
 * add, sum of squares, AdamW (the quantization family lives in
 * quant/quant_cuda.cu). Grid-stride loops, so any n runs on a bounded grid. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

/* Sum of squares: per-thread double partials, a block reduction in shared
 * memory, one atomicAdd per block into a double. The order of the block
 * sums varies from run to run: the GPU's norm agrees with the host's to
 * double rounding, not bit for bit. */
/* Sum of squares in double. With a 16-byte aligned x, four elements a load
 * (16 bytes in flight instead of 4: the kernel is bound by loads in
 * flight) into two accumulators, so the adds do not wait on each other. */
__global__ void zpp_dcu_sumsq_kernel(const float *x, size_t n, double *out) {
    __shared__ double part[256];
    double s = 0.0, t = 0.0;
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x,
                 step = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;
    if (((uintptr_t)x & 15u) == 0) {
        const float4 *x4 = (const float4 *)x;
        for (size_t i = i0; i < n / 4; i += step) {
            const float4 v = x4[i];
            s += (double)v.x * v.x + (double)v.y * v.y;
            t += (double)v.z * v.z + (double)v.w * v.w;
        }
        tail = n / 4 * 4;
    }
    for (size_t i = tail + i0; i < n; i += step) s += (double)x[i] * x[i];
    part[threadIdx.x] = s + t;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

extern "C" zpp_status zpp_dcu_sumsq(void *stream, const float *const *x, const size_t *n, int k,
                                    double *tmp_dev, double *sums) {
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemsetAsync(tmp_dev, 0, (size_t)k * sizeof(double), s);
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "sum of squares: %s", cudaGetErrorString(e));
    for (int j = 0; j < k; j++) {
        if (n[j]) zpp_dcu_sumsq_kernel<<<grid_for(n[j], 256), 256, 0, s>>>(x[j], n[j], tmp_dev + j);
        zpp_status st = launch_status("sum of squares");
        if (st != ZPP_OK) return st;
    }
    e = cudaMemcpyAsync(sums, tmp_dev, (size_t)k * sizeof(double), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "sum of squares: %s", cudaGetErrorString(e));
    return ZPP_OK;
}

/* The host loop's expressions, in the same order (device_host.c); c1, c2
 * are the bias corrections, computed once on the host as there. The four
 * arrays (and the working copy) never overlap: __restrict__ lets every load
 * of an element issue before any store, so each thread keeps its four
 * reads in flight together. Without it a store to one array had to land
 * before the next array's load (they might alias), and the loop ran at
 * memory latency, not bandwidth: writing the cleared gradient back made the
 * step several times slower than a separate memset. */
__global__ void zpp_dcu_adamw_kernel(float *__restrict__ param, float *__restrict__ m,
                                     float *__restrict__ v, float *__restrict__ grad, size_t n,
                                     zpp_adamw_args a, float c1, float c2,
                                     void *__restrict__ work, int dt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g0 = grad[i], m0 = m[i], v0 = v[i], p0 = param[i];
        float g = a.grad_scale * g0;
        float mi = a.beta1 * m0 + (1.0f - a.beta1) * g;
        float vi = a.beta2 * v0 + (1.0f - a.beta2) * g * g;
        float p = p0;
        p -= a.lr * ((mi / c1) / (sqrtf(vi / c2) + a.eps) + zpp_adamw_decay_at(a, i) * p);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if (a.clear_grad) grad[i] = 0.0f;
        if (!work) continue;
        if (dt == ZPP_BF16) ((__nv_bfloat16 *)work)[i] = __float2bfloat16_rn(p);
        else if (dt == ZPP_FP16) ((__half *)work)[i] = __float2half_rn(p);
        else ((float *)work)[i] = p;
    }
}

extern "C" zpp_status zpp_dcu_adamw(void *stream, float *param, float *m, float *v,
                                    float *grad, size_t n, const zpp_adamw_args *a,
                                    void *work, zpp_dtype work_dtype) {
    if (n == 0) return ZPP_OK;
    float c1 = 1.0f - powf(a->beta1, (float)a->step);
    float c2 = 1.0f - powf(a->beta2, (float)a->step);
    zpp_dcu_adamw_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(
        param, m, v, grad, n, *a, c1, c2, work, (int)work_dtype);
    return launch_status("AdamW");
}

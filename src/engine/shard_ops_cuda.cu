/* engine/shard_ops_cuda.cu — CUDA twins of shard_ops.c's host loops. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "engine/shard_ops.h"

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

__global__ void zpp_add_kernel(float *acc, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        acc[i] += x[i];
}

extern "C" zpp_status zpp_sops_add_cuda(void *stream, float *acc, const float *x, size_t n) {
    if (n == 0) return ZPP_OK;
    zpp_add_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(acc, x, n);
    return launch_status("shard add");
}

/* Sum of squares: per-thread double partials, block reduction in shared
 * memory, one atomicAdd per block into a double. */
__global__ void zpp_sumsq_kernel(const float *x, size_t n, double *out) {
    __shared__ double part[256];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

extern "C" zpp_status zpp_sops_sumsq_cuda(void *stream, const float *x, size_t n,
                                          double *sum_p) {
    cudaStream_t s = (cudaStream_t)stream;
    double *d = NULL, h = 0.0;
    cudaError_t e = cudaMallocAsync((void **)&d, sizeof(double), s);
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "sumsq: %s", cudaGetErrorString(e));
    cudaMemsetAsync(d, 0, sizeof(double), s);
    if (n) zpp_sumsq_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, n, d);
    zpp_status st = launch_status("shard sum of squares");
    cudaMemcpyAsync(&h, d, sizeof(double), cudaMemcpyDeviceToHost, s);
    cudaFreeAsync(d, s);
    e = cudaStreamSynchronize(s);
    if (st != ZPP_OK) return st;
    if (e != cudaSuccess) return zpp_error(ZPP_ERR_CUDA, "sumsq: %s", cudaGetErrorString(e));
    *sum_p = h;
    return ZPP_OK;
}

__global__ void zpp_adamw_kernel(float *param, float *m, float *v, const float *grad, size_t n,
                                 zpp_adamw_args a, float c1, float c2, void *work, int dt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = a.grad_scale * grad[i];
        float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
        float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        p -= a.lr * ((mi / c1) / (sqrtf(vi / c2) + a.eps) + a.weight_decay * p);
        param[i] = p;
        if (dt == ZPP_BF16) ((__nv_bfloat16 *)work)[i] = __float2bfloat16_rn(p);
        else if (dt == ZPP_FP16) ((__half *)work)[i] = __float2half_rn(p);
        else ((float *)work)[i] = p;
    }
}

extern "C" zpp_status zpp_sops_adamw_cuda(void *stream, float *param, float *m, float *v,
                                          const float *grad, size_t n,
                                          const zpp_adamw_args *a, void *work,
                                          zpp_dtype work_dtype) {
    if (n == 0) return ZPP_OK;
    float c1 = 1.0f - powf(a->beta1, (float)a->step);
    float c2 = 1.0f - powf(a->beta2, (float)a->step);
    zpp_adamw_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(
        param, m, v, grad, n, *a, c1, c2, work, (int)work_dtype);
    return launch_status("AdamW");
}

#ifndef FAKE_CUDA_RUNTIME_H
#define FAKE_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#include <math.h>
#include <stdint.h>
#include <functional>
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
void fake_syncthreads();
float fake_shfl_xor(float v, int o);
#define __syncthreads() fake_syncthreads()
inline float __shfl_xor_sync(unsigned, float v, int o) { return fake_shfl_xor(v, o); }
void fake_run(const std::function<void()> &f, dim3 grid, dim3 block);
template <typename F, typename... A>
void fake_launch(F f, dim3 grid, dim3 block, size_t, cudaStream_t, A... args) {
    fake_run([&]() { f(args...); }, grid, block);
}
#endif

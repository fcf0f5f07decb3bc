/* normal_cuda.cu — the device half of test_gpt2_init_cuda.c's check of
 * core/random.h's normal sample: a kernel that evaluates zpp_log_positive,
 * zpp_cos_2pi and zpp_box_muller on the GPU, so the test can compare their
 * doubles with the host's bit for bit. The fp32 initial weights only show
 * a last-ulp difference of these doubles a few times in a billion (when it
 * moves a value across an fp32 rounding boundary); the doubles themselves
 * show it at once (an fma contracted into the Horner steps of cos changes
 * about 4% of the samples). */
#include <cuda_runtime.h>
#include <stddef.h>

#include "core/random.h"

__global__ void normal_parts_kernel(const double *u1, const double *u2, double *log_u1,
                                    double *cos_u2, double *z, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        log_u1[i] = zpp_log_positive(u1[i]);
        cos_u2[i] = zpp_cos_2pi(u2[i]);
        z[i] = zpp_box_muller(u1[i], u2[i]);
    }
}

/* All five arrays are n doubles of device memory, the inputs already
 * there. Returns once the outputs are written: 0, or the cudaError_t. */
extern "C" int zpp_test_normal_parts_device(const double *u1, const double *u2, double *log_u1,
                                            double *cos_u2, double *z, size_t n) {
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    if (blocks == 0) blocks = 1;
    normal_parts_kernel<<<(unsigned)blocks, 256>>>(u1, u2, log_u1, cos_u2, z, n);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return (int)e;
}

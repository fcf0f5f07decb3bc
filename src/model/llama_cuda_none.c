/* model/llama_cuda_none.c — the CUDA Llama in a build without CUDA (CMake
 * compiles this file instead of llama_cuda.cu). */
#include "core/error.h"
#include "model/llama.h"

zpp_status zpp_llama_cuda_create(const zpp_llama_config *cfg, zpp_dtype param_dtype,
                                 int max_batch, zpp_device *dev, zpp_model **model_p) {
    (void)cfg;
    (void)param_dtype;
    (void)max_batch;
    (void)dev;
    (void)model_p;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "llama: the CUDA model needs a build with CUDA; rebuild with nvcc on the "
                     "PATH, or use the CPU model (--device cpu)");
}

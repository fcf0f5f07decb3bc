/* model/gpt2_factory.c — the GPT-2 for a device: the CPU reference
 * (gpt2_cpu.c) on the host backend, the CUDA model (gpt2_cuda.cu, or its
 * stand-in gpt2_cuda_none.c) on a GPU. The one file that depends on both
 * models; they depend only on what they share (gpt2.c). */
#include "core/error.h"
#include "model/gpt2.h"

zpp_status zpp_gpt2_create(const zpp_gpt2_config *cfg, zpp_dtype param_dtype, int max_batch,
                           zpp_device *dev, zpp_model **model_p) {
    if (!dev)
        return zpp_error(ZPP_ERR_INVALID,
                         "gpt2 create: no device; create one with zpp_device_create_host or "
                         "zpp_device_create_gpu");
    if (dev->mem == ZPP_MEM_HOST)
        return zpp_gpt2_cpu_create(cfg, param_dtype, max_batch, model_p);
    return zpp_gpt2_cuda_create(cfg, param_dtype, max_batch, dev, model_p);
}

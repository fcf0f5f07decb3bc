/* model/llama_factory.c — the "llama" family's factory (family.h): a
 * Llama of a generic decoder shape, for a device: the CPU reference
 * (llama_cpu.c) on the host backend, the CUDA model (llama_cuda.cu, or its
 * stand-in llama_cuda_none.c) on a GPU. */
#include "core/error.h"
#include "model/llama.h"

zpp_dtype zpp_llama_eval_dtype(const zpp_device *dev) {
    return dev && dev->mem != ZPP_MEM_HOST ? ZPP_BF16 : ZPP_FP32;
}

zpp_status zpp_llama_family_create(const zpp_decoder_shape *shape, zpp_dtype param_dtype,
                                   int max_batch, zpp_device *dev, zpp_model **model_p) {
    if (!dev)
        return zpp_error(ZPP_ERR_INVALID,
                         "llama create: no device; create one with zpp_device_create_host");
    zpp_llama_config cfg;
    ZPP_CHECK(zpp_llama_config_of_shape(shape, &cfg));
    if (dev->mem != ZPP_MEM_HOST)
        return zpp_llama_cuda_create(&cfg, param_dtype, max_batch, dev, model_p);
    return zpp_llama_cpu_create(&cfg, param_dtype, max_batch, model_p);
}

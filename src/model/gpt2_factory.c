/* model/gpt2_factory.c — the GPT-2 for a device: the CPU reference
 * (gpt2_cpu.c) on the host backend, the CUDA model (gpt2_cuda.cu, or its
 * stand-in gpt2_cuda_none.c) on a GPU. The one file that depends on both
 * models; they depend only on what they share (gpt2.c). And the "gpt2"
 * family's factory (family.h), from a generic decoder shape. */
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

/* Llama's knobs (family.h) mean nothing to GPT-2: LayerNorm (no RMSNorm
 * epsilon to choose), learned positions (no rotary base or scaling), a head
 * tied to wte, biases everywhere. Any value but the default is refused. */
static zpp_status refuse_llama_knobs(const zpp_decoder_shape *shape) {
    const char *field = shape->rope_theta != 0.0              ? "rope_theta"
                        : shape->norm_eps != 0.0              ? "norm_eps"
                        : shape->untied_head != 0             ? "untied_head"
                        : shape->qkv_bias != 0                ? "qkv_bias"
                        : shape->o_bias != 0                  ? "o_bias"
                        : shape->rope_factor != 0.0           ? "rope_factor"
                        : shape->rope_low_freq_factor != 0.0  ? "rope_low_freq_factor"
                        : shape->rope_high_freq_factor != 0.0 ? "rope_high_freq_factor"
                        : shape->rope_original_max_pos != 0   ? "rope_original_max_pos"
                                                              : NULL;
    if (!field) return ZPP_OK;
    return zpp_error(ZPP_ERR_CONFIG,
                     "gpt2: %s is set, but it is a Llama knob GPT-2 does not have; leave it 0 "
                     "or use the family \"llama\"",
                     field);
}

/* GPT-2's config of a generic shape (gpt2.h, zpp_gpt2_family_create). */
static zpp_status config_of_shape(const zpp_decoder_shape *shape, zpp_gpt2_config *cfg_p) {
    ZPP_CHECK(refuse_llama_knobs(shape));
    if (shape->n_kv_head != 0 && shape->n_kv_head != shape->n_head)
        return zpp_error(ZPP_ERR_CONFIG,
                         "gpt2: n_kv_head %d differs from n_head %d; GPT-2 gives every head "
                         "its own keys and values (use 0 or n_head)",
                         shape->n_kv_head, shape->n_head);
    const long long ffn = 4LL * shape->n_embd;
    if (shape->n_ffn != 0 && shape->n_ffn != ffn)
        return zpp_error(ZPP_ERR_CONFIG,
                         "gpt2: n_ffn %d is not 4 x n_embd = %lld; GPT-2's MLP is 4 n_embd wide "
                         "(use 0 or %lld)",
                         shape->n_ffn, ffn, ffn);
    *cfg_p = (zpp_gpt2_config){.n_layer = shape->n_layer,
                               .n_head = shape->n_head,
                               .n_embd = shape->n_embd,
                               .seq_len = shape->seq_len,
                               .vocab_size = shape->vocab_size,
                               .real_vocab_size = shape->real_vocab_size,
                               .recompute = shape->recompute,
                               .keep_acts = shape->keep_acts};
    return ZPP_OK;
}

void zpp_gpt2_shape_set(const zpp_gpt2_config *cfg, zpp_decoder_shape *shape) {
    shape->n_layer = cfg->n_layer;
    shape->n_head = cfg->n_head;
    shape->n_embd = cfg->n_embd;
    shape->seq_len = cfg->seq_len;
    shape->vocab_size = cfg->vocab_size;
    shape->real_vocab_size = cfg->real_vocab_size;
    shape->recompute = cfg->recompute;
    shape->keep_acts = cfg->keep_acts;
}

zpp_status zpp_gpt2_family_create(const zpp_decoder_shape *shape, zpp_dtype param_dtype,
                                  int max_batch, zpp_device *dev, zpp_model **model_p) {
    zpp_gpt2_config cfg;
    ZPP_CHECK(config_of_shape(shape, &cfg));
    return zpp_gpt2_create(&cfg, param_dtype, max_batch, dev, model_p);
}

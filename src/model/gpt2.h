/* model/gpt2.h — GPT-2 parameter layout and initialisation, shared by the
 * CPU reference (gpt2_cpu.c) and anything else that needs to find a tensor
 * inside a unit (a CUDA model, checkpoints, tests).
 *
 * Units (each one flat buffer, gathered whole by the engine):
 *
 *   unit 0       embeddings + final norm (the LM head is tied to wte)
 *                  wte    V x C      token embedding; also the LM head
 *                  wpe    T x C      position embedding
 *                  lnf_w  C          final LayerNorm weight
 *                  lnf_b  C          final LayerNorm bias
 *                numel = V*C + T*C + 2C
 *
 *   unit l       transformer block l (l = 1..L), pre-LayerNorm
 *                  ln1_w  C
 *                  ln1_b  C
 *                  qkv_w  3C x C     rows 0..C-1 -> q, C..2C-1 -> k, 2C.. -> v
 *                  qkv_b  3C
 *                  proj_w C x C      attention output projection
 *                  proj_b C
 *                  ln2_w  C
 *                  ln2_b  C
 *                  fc_w   4C x C
 *                  fc_b   4C
 *                  fc2_w  C x 4C
 *                  fc2_b  C
 *                numel = 12 C^2 + 13 C
 *
 * in that order, each right after the previous one, no padding (the engine
 * pads units for sharding). Matrices are row-major [out][in], as in
 * PyTorch's nn.Linear: y = x W^T + b.
 *
 * Stages: 0 = embedding (unit 0), 1..L = blocks (unit l), L+1 = final
 * LayerNorm + LM head + loss (unit 0 again). The backward of stage 0 (the
 * scatter of row gradients into wte / wpe) reads no parameters: the CPU
 * model accepts params == NULL there, so an engine may skip that gather.
 *
 * Initialisation (GPT-2 / llm.c): weights N(0, 0.02^2), except proj_w and
 * fc2_w (the matrices that write into the residual stream) whose std is
 * 0.02 / sqrt(2L), so the residual's variance does not grow with depth;
 * biases 0; LayerNorm weights 1, LayerNorm biases 0. Each value is a pure
 * function of (seed, unit, element index), see zpp_gpt2_init_value. */
#ifndef ZPP_MODEL_GPT2_H
#define ZPP_MODEL_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Offsets (in elements) of each tensor inside its unit. */
typedef struct zpp_gpt2_layout {
    /* unit 0 */
    size_t wte, wpe, lnf_w, lnf_b;
    size_t embed_numel;
    /* units 1..L (every block has the same layout) */
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b;
    size_t ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
    size_t block_numel;
} zpp_gpt2_layout;

/* Checks a configuration: every field positive, n_embd divisible by
 * n_head, and sizes small enough for int BLAS dimensions.
 * ZPP_ERR_CONFIG with a message naming the field otherwise. */
zpp_status zpp_gpt2_config_check(const zpp_gpt2_config *cfg);

/* Fills the layout of a (checked) configuration. */
void zpp_gpt2_layout_make(const zpp_gpt2_config *cfg, zpp_gpt2_layout *layout_p);

/* Elements of `unit` (0 for the embeddings, 1..n_layer for blocks). */
size_t zpp_gpt2_unit_numel(const zpp_gpt2_config *cfg, int unit);

/* Initial value of element `index` of `unit`. Pure function of
 * (cfg shape, seed, unit, index). */
float zpp_gpt2_init_value(const zpp_gpt2_config *cfg, const zpp_gpt2_layout *layout,
                          int unit, size_t index, uint64_t seed);

/* Writes elements [offset, offset + count) of `unit`'s initial values into
 * out (host fp32). ZPP_ERR_INVALID if the unit or range is out of bounds. */
zpp_status zpp_gpt2_init_fill(const zpp_gpt2_config *cfg, int unit, size_t offset,
                              size_t count, float *out, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif

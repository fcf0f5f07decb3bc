/* model/gpt2.h — the GPT-2 family: its shape (zpp_gpt2_config), its
 * factories (gpt2_factory.c: the CPU reference gpt2_cpu.c, the CUDA model
 * gpt2_cuda.cu, and the one that picks between them for a device), and what
 * the two models share (gpt2.c): the parameter layout and initialisation,
 * for them and for anything else that needs to find a tensor inside a unit
 * (checkpoints, llm.c files, tests); and the CPU model's activations (the
 * CUDA model keeps its own, each buffer in the dtype it needs).
 *
 * Units (each one flat buffer, gathered whole by the engine):
 *
 *   unit 0       embeddings + final norm (the LM head is tied to wte)
 *                  wte    V x C      token embedding; also the LM head (rows
 *                                    past real_vocab_size: padding, outside
 *                                    the softmax: zpp_gpt2_config)
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
 * scatter of row gradients into wte / wpe) reads no parameters: both models
 * accept params == NULL there and say so in bwd_reads_params, and the
 * engine skips that gather.
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

#include "core/random.h"
#include "device/device.h"
#include "model/decoder.h"
#include "model/family.h"
#include "model/model.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPT-2 shape, from the config's "model" section.
 *
 * real_vocab_size: the tokens the model predicts. The token embedding (and
 * the tied LM head) has vocab_size rows, so the logits have vocab_size
 * columns, but the softmax and the cross-entropy run over the first
 * real_vocab_size of them only; the rest are padding (llm.c pads GPT-2's
 * 50257 tokens to 50304 rows for its kernels: its vocab_size is our
 * real_vocab_size, its padded_vocab_size our vocab_size). Padded columns
 * get a zero gradient, so their rows of wte only ever decay. Targets must
 * lie below real_vocab_size. 0 means vocab_size (no padding). */
typedef struct zpp_gpt2_config {
    int n_layer, n_head, n_embd, seq_len, vocab_size;
    int real_vocab_size;
    /* Activation checkpointing (1; 0 = off), not part of the shape: a
     * block's forward keeps only its input (the residual stream entering
     * it), and its backward first runs the block's forward again into one
     * block's worth of activations shared by all blocks. The re-run is the
     * first run's arithmetic on the same inputs, so losses and gradients are
     * bit for bit those without it; the cost is one more forward of every
     * block but the last (whose activations are still there). Checkpoints
     * and llm.c files do not record it. */
    int recompute;
    /* ZPP_KEEP_* bits (family.h): the CUDA model keeps each block's two
     * LayerNorm outputs (4 C bytes a token and layer more in bf16, two
     * elementwise passes a layer fewer), its GELU output (8 C bytes, one
     * pass), or both, for the backward instead of evaluating them again
     * there (gpt2_cuda.cu, RECOMPUTE). Ignored with recompute and by the
     * CPU model, which keeps them always. 0 (default): recomputed. */
    int keep_acts;
} zpp_gpt2_config;

/* real_vocab_size with 0 read as vocab_size. */
static inline int zpp_gpt2_real_vocab(const zpp_gpt2_config *cfg) {
    return cfg->real_vocab_size > 0 ? cfg->real_vocab_size : cfg->vocab_size;
}

/* ------------------------------------------------------------------------ */
/* The factories (gpt2_factory.c picks one for a device)                     */
/* ------------------------------------------------------------------------ */

/* The CPU reference GPT-2 (OpenBLAS). param_dtype is ZPP_FP32 or ZPP_BF16;
 * max_batch is the largest micro-batch set_batch will get. */
zpp_status zpp_gpt2_cpu_create(const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                               int max_batch, zpp_model **model_p);

/* The CUDA GPT-2 (cuBLASLt), with the same units, stages, parameter layout
 * and initialisation as the CPU reference; params, grads and activations in
 * the GPU's memory; every kernel enqueued on dev's compute stream. set_batch
 * takes host tokens. ZPP_ERR_UNSUPPORTED in a build without CUDA
 * (gpt2_cuda_none.c). */
zpp_status zpp_gpt2_cuda_create(const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                                int max_batch, zpp_device *dev, zpp_model **model_p);

/* The GPT-2 for `dev`: the CPU reference for the host backend, the CUDA
 * model for a GPU. */
zpp_status zpp_gpt2_create(const zpp_gpt2_config *cfg, zpp_dtype param_dtype, int max_batch,
                           zpp_device *dev, zpp_model **model_p);

/* The "gpt2" family's factory (family.h): zpp_gpt2_create of a generic
 * decoder shape. GPT-2 gives every head its own keys and values (n_kv_head
 * 0 or n_head) and its MLP is 4 n_embd wide (n_ffn 0 or 4 n_embd): other
 * values are refused with ZPP_ERR_CONFIG naming the field; the rest of the
 * shape is checked as zpp_gpt2_config_check checks it. */
zpp_status zpp_gpt2_family_create(const zpp_decoder_shape *shape, zpp_dtype param_dtype,
                                  int max_batch, zpp_device *dev, zpp_model **model_p);

/* The other way: sets the fields of *shape a GPT-2 config gives (layers,
 * heads, width, sequence, vocabulary and its real size, recompute) and
 * leaves the family knobs as they are. */
void zpp_gpt2_shape_set(const zpp_gpt2_config *cfg, zpp_decoder_shape *shape);

/* ------------------------------------------------------------------------ */
/* What the two models share (gpt2.c)                                        */
/* ------------------------------------------------------------------------ */

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

/* ---- Initial values ------------------------------------------------------
 * Host C and CUDA device code (ZPP_HD): the CPU model fills host memory
 * with them, one element at a time (zpp_gpt2_init_fill), and the CUDA model
 * fills its shard in device memory, one thread per element
 * (init_params_device in gpt2_cuda.cu). Both evaluate these very
 * functions, whose arithmetic is rounded the same way on either side
 * (core/random.h), so they write the same bits. */

#define ZPP_GPT2_INIT_STD 0.02

/* Initial value of element `i` of `unit` (layout from
 * zpp_gpt2_layout_make): a pure function of (cfg shape, seed, unit, i).
 * The normal is scaled in double and rounded once to fp32. */
ZPP_HD float zpp_gpt2_init_value(const zpp_gpt2_config *cfg, const zpp_gpt2_layout *l,
                                 int unit, size_t i, uint64_t seed) {
    double std = 0.0, one = 0.0;
    if (unit == 0) {
        if (i < l->lnf_w) std = ZPP_GPT2_INIT_STD;      /* wte, wpe */
        else if (i < l->lnf_b) one = 1.0;               /* lnf_w */
    } else {
        double resid_std = ZPP_DDIV(ZPP_GPT2_INIT_STD, ZPP_DSQRT(2.0 * cfg->n_layer));
        if (i < l->ln1_b) one = 1.0;                    /* ln1_w */
        else if (i < l->qkv_w) {}                       /* ln1_b */
        else if (i < l->qkv_b) std = ZPP_GPT2_INIT_STD; /* qkv_w */
        else if (i < l->proj_w) {}                      /* qkv_b */
        else if (i < l->proj_b) std = resid_std;        /* proj_w */
        else if (i < l->ln2_w) {}                       /* proj_b */
        else if (i < l->ln2_b) one = 1.0;               /* ln2_w */
        else if (i < l->fc_w) {}                        /* ln2_b */
        else if (i < l->fc_b) std = ZPP_GPT2_INIT_STD;  /* fc_w */
        else if (i < l->fc2_w) {}                       /* fc_b */
        else if (i < l->fc2_b) std = resid_std;         /* fc2_w */
    }
    if (std == 0.0) return (float)one;
    return (float)ZPP_DMUL(std, zpp_param_normal(seed, unit, i));
}

/* Checks that [offset, offset + count) lies inside `unit` of a checked
 * configuration and fills its layout: ZPP_ERR_INVALID naming the unit or
 * range otherwise. What every init_params of a GPT-2 model checks first. */
zpp_status zpp_gpt2_init_check(const zpp_gpt2_config *cfg, int unit, size_t offset,
                               size_t count, zpp_gpt2_layout *layout_p);

/* Writes elements [offset, offset + count) of `unit`'s initial values into
 * out (host fp32). ZPP_ERR_INVALID if the unit or range is out of bounds. */
zpp_status zpp_gpt2_init_fill(const zpp_gpt2_config *cfg, int unit, size_t offset,
                              size_t count, float *out, uint64_t seed);

/* The units and stages of the zpp_model interface (see the top): the
 * decoder tables every family has (decoder.h: unit_numel[L+1],
 * stage_unit[L+2], bwd_reads_params[L+2], 0 for stage 0 only) and GPT-2's
 * matrix ranges of the L+1 units (wte + wpe, qkv_w, proj_w, fc_w, fc2_w).
 * The struct must not move after zpp_gpt2_stages_make: matrix_ranges
 * points into it. zpp_gpt2_stages_make allocates them (ZPP_ERR_NOMEM leaves
 * nothing allocated); zpp_gpt2_stages_free frees them. */
typedef struct zpp_gpt2_stages {
    zpp_decoder_tables t; /* decoder.h: every family's tables */
    /* The matrix ranges (model.h): unit 0's one range, wte and wpe (they are
     * adjacent), and every block's four, qkv_w, proj_w, fc_w, fc2_w; the
     * per-unit arrays point into them. */
    zpp_elem_range embed_matrices[1], block_matrices[4];
} zpp_gpt2_stages;

zpp_status zpp_gpt2_stages_make(const zpp_gpt2_config *cfg, zpp_gpt2_stages *s);
void zpp_gpt2_stages_free(zpp_gpt2_stages *s);

/* What both models' create do alike: check the config, the dtype (fp32,
 * bf16 or fp16) and max_batch (1..INT32_MAX / seq_len), naming `who` in
 * the messages; and fill every field of a zpp_model but ops, mem and impl
 * (the stages must outlive the model). */
zpp_status zpp_gpt2_create_check(const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                                 int max_batch, const char *who);
void zpp_gpt2_base_fill(zpp_model *base, const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                        int max_batch, const zpp_gpt2_stages *s);

/* The activations the CPU model keeps for the backward, and its backward
 * scratch, for max_batch sequences: N = max_batch * seq_len rows, and the
 * per-layer buffers are n_layer slabs of N rows (layer l at l * N * width).
 * With cfg->recompute the per-layer buffers but the residual stream are one
 * slab, shared by every block (zpp_gpt2_layer_of): (L-1) slabs fewer. */
typedef struct zpp_gpt2_acts {
    float *res;                       /* (L+1) x N x C: res[0] = embedding, res[l] = block l out */
    float *ln1, *ln1_mean, *ln1_rstd; /* L x N x C; L x N; L x N */
    float *qkv;                       /* L x N x 3C */
    float *att;                       /* L x max_batch x H x T x T: softmax probabilities */
    float *atty;                      /* L x N x C: attention output before the projection */
    float *mid;                       /* L x N x C: residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* as ln1 */
    float *fch;                       /* L x N x 4C: fc output, before gelu */
    float *fcg;                       /* L x N x 4C: after gelu */
    float *lnf, *lnf_mean, *lnf_rstd; /* N x C; N; N */
    float *probs;                     /* N x V: logits -> probabilities -> d logits */
    float *losses;                    /* N */
    float *dres;                      /* N x C: gradient of the residual stream */
    float *dc;                        /* N x C */
    float *dqkv;                      /* N x 3C */
    float *dfc;                       /* N x 4C */
} zpp_gpt2_acts;

/* Block l's (1..n_layer) slices of the activations, as the CPU model indexes
 * them: its input and output on the residual stream and what its backward
 * needs (LayerNorm means and reciprocal deviations as ln1m/ln1r, ln2m/ln2r).
 * With cfg->recompute every block's slices but x and out are the one shared
 * slab. */
typedef struct zpp_gpt2_layer {
    const float *x; /* res[l-1] */
    float *out;     /* res[l] */
    float *ln1, *ln1m, *ln1r, *qkv, *att, *atty, *mid, *ln2, *ln2m, *ln2r, *fch, *fcg;
} zpp_gpt2_layer;

zpp_gpt2_layer zpp_gpt2_layer_of(const zpp_gpt2_acts *a, const zpp_gpt2_config *cfg,
                                 int max_batch, int l);

/* Takes the buffers of zpp_gpt2_acts from `a`, in a fixed order. */
void zpp_gpt2_acts_plan(const zpp_gpt2_config *cfg, int max_batch, zpp_arena *a,
                        zpp_gpt2_acts *acts);

#ifdef __cplusplus
}
#endif

#endif

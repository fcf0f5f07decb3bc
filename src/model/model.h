/* model/model.h — how the engine drives a model.
 *
 * The engine owns the parameters (sharded, gathered per unit); the model
 * owns activations and the arithmetic. A model splits its parameters into
 * units (flat buffers gathered together) and its computation into stages,
 * each stage using exactly one unit's parameters. Forward runs stages
 * 0..n_stages-1, backward runs them in reverse. A unit may serve several
 * stages (GPT-2's token embedding is used by the first stage and, tied, by
 * the LM head in the last).
 *
 * Parameters reach the model as a full unit buffer in the working dtype
 * (bf16 or fp32) in the memory of the model's device; gradients are
 * accumulated (+=) into a full unit buffer of fp32 in the same memory. */
#ifndef ZPP_MODEL_MODEL_H
#define ZPP_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_model zpp_model;

/* Elements [begin, end) of a unit. */
typedef struct zpp_elem_range {
    size_t begin, end;
} zpp_elem_range;

typedef struct zpp_model_ops {
    /* Writes the initial values of elements [offset, offset + count) of
     * `unit` as fp32. A pure function of (seed, unit, element index), so
     * each rank can initialise only its own shard. */
    zpp_status (*init_params)(zpp_model *m, int unit, size_t offset, size_t count,
                              float *out, uint64_t seed);
    /* Sets the micro-batch: tokens and targets are B*T int32 in host memory. */
    zpp_status (*set_batch)(zpp_model *m, const int32_t *tokens, const int32_t *targets,
                            int B);
    /* Forward of stage s with its unit's full parameters. */
    zpp_status (*forward)(zpp_model *m, int stage, const void *params);
    /* Mean cross-entropy of the last forward (valid after the last stage). */
    float (*loss)(zpp_model *m);
    /* Backward of stage s: accumulates d(loss * loss_scale)/d(params) into
     * grads (fp32, full unit). The last stage starts from the loss. */
    zpp_status (*backward)(zpp_model *m, int stage, const void *params, float *grads,
                           float loss_scale);
    void (*destroy)(zpp_model *m);
    /* Sampling: the logits of one row, without a second head.
     * keep_logits(m, row) makes every later forward keep the fp32 logits of
     * row `row` of its batch (sequence row / seq_len, position row %
     * seq_len), -1 (the default) none; after a forward's last stage,
     * logits(m, out) copies them into host memory out[vocab_size] (the
     * padded columns too: a sampler reads the first real_vocab_size). They
     * are the very values that forward's softmax read. Attention is causal,
     * so row t of a sequence whose positions past t hold anything at all is
     * the prediction from tokens 0..t: a context shorter than seq_len is
     * padded and read at its last position. ZPP_ERR_STATE from logits when
     * the last forward kept nothing (no row asked for, a row past its
     * batch, or not through its last stage). NULL in a model that cannot (a
     * user model of zeropp.h). */
    zpp_status (*keep_logits)(zpp_model *m, int row);
    zpp_status (*logits)(zpp_model *m, float *out);
} zpp_model_ops;

struct zpp_model {
    const zpp_model_ops *ops;
    zpp_mem_kind mem;         /* where params, grads and activations live */
    zpp_dtype param_dtype;    /* working dtype of gathered params */
    int n_units;
    const size_t *unit_numel; /* elements per unit */
    int n_stages;
    const int *stage_unit;    /* unit used by each stage */
    /* Per stage: 1 if its backward reads the unit's parameters, 0 if it
     * needs none (the engine then gathers nothing for it and passes NULL). */
    const unsigned char *bwd_reads_params;
    int seq_len;              /* T */
    int vocab_size;           /* rows of the token embedding, columns of the logits */
    int real_vocab_size;      /* the softmax's columns, 1..vocab_size (zpp_gpt2_config) */
    int max_batch;            /* B the activations were sized for */
    /* The matrices: the element ranges of each unit that hold tensors of
     * two or more dimensions, sorted and disjoint: unit u's are
     * matrix_ranges[u][0 .. n_matrix_ranges[u]). The rest of a unit are
     * vectors (biases, LayerNorm gains and biases). Two things follow:
     * - weight decay (AdamW's wd * p term) applies to the matrices only, as
     *   llm.c and nanoGPT decay them (the engine's decay_all decays all,
     *   DeepSpeed's behaviour without parameter groups);
     * - qwZ and qgZ quantize the matrices only: vectors travel at full
     *   precision (engine.h, quantize_vectors), as DeepSpeed reduces 1-D
     *   gradients unquantized and keeps small parameters whole.
     * NULL (a user model): every element is a matrix's. */
    const int *n_matrix_ranges;
    const zpp_elem_range *const *matrix_ranges;
    void *impl;
};

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
} zpp_gpt2_config;

/* real_vocab_size with 0 read as vocab_size. */
static inline int zpp_gpt2_real_vocab(const zpp_gpt2_config *cfg) {
    return cfg->real_vocab_size > 0 ? cfg->real_vocab_size : cfg->vocab_size;
}

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

#ifdef __cplusplus
}
#endif

#endif

/* model/model.h — how the engine drives a model: any decoder over tokens.
 *
 * The engine owns the parameters (sharded, gathered per unit); the model
 * owns activations and the arithmetic. A model splits its parameters into
 * units (flat buffers gathered together) and its computation into stages,
 * each stage using exactly one unit's parameters. Forward runs stages
 * 0..n_stages-1, backward runs them in reverse. A unit may serve several
 * stages (a token embedding tied to the LM head is used by the first stage
 * and by the last).
 *
 * Parameters reach the model as a full unit buffer in the working dtype
 * (bf16 or fp32) in the memory of the model's device; gradients are
 * accumulated (+=) into a full unit buffer of fp32 in the same memory (or
 * of the working dtype, where the engine asked through set_grad_dtype).
 *
 * This header names no model family. What makes a model (its shape, its
 * units' layout, its factory) is its family's, and model/family.h creates
 * one by the family's name. */
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
     * grads (full unit; fp32 unless set_grad_dtype chose otherwise). The
     * last stage starts from the loss. */
    zpp_status (*backward)(zpp_model *m, int stage, const void *params, void *grads,
                           float loss_scale);
    void (*destroy)(zpp_model *m);
    /* Sampling: the logits of one row, without a second head.
     * keep_logits(m, row) makes every later forward keep the logits of
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
    /* Optional: init_params's values, bit for bit, written straight into
     * dev_out, fp32 memory of the model's device (ZPP_MEM_DEVICE), by work
     * enqueued on the device's compute stream (so ordered before whatever
     * the caller enqueues there next); it may return before they are
     * written. The engine uses it when present: a large model then starts
     * without drawing billions of values on one host thread and copying
     * them over. NULL in a model without it (the CPU model, a user model
     * of zeropp.h): the engine calls init_params and copies. */
    zpp_status (*init_params_device)(zpp_model *m, int unit, size_t offset, size_t count,
                                     float *dev_out, uint64_t seed);
    /* Optional: the dtype every later backward's `grads` are in, ZPP_FP32
     * (what every model takes) or param_dtype; each add into a 2-byte
     * gradient is done in fp32 and rounded once. The engine asks for
     * param_dtype where that is no coarser than its wire (engine.h,
     * work_grads). ZPP_ERR_UNSUPPORTED for a dtype it cannot write; NULL
     * in a model that writes fp32 only. */
    zpp_status (*set_grad_dtype)(zpp_model *m, zpp_dtype dtype);
    /* Optional: the next backward pass (stages n_stages-1 down to 0) finds
     * stale values in the grads buffers, and writes each element's first
     * contribution over them instead of adding it; later contributions in
     * the pass (a tied unit's second stage) add, and so does every pass
     * after it until this is called again. The engine calls it at world 1
     * after an update, so AdamW need not clear the gradients and the
     * products need not read them (backward's contract is otherwise +=).
     * NULL in a model that only adds: the engine clears the buffers. */
    zpp_status (*overwrite_grads)(zpp_model *m);
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
    /* The decoder's token interface: a batch is max_batch or fewer sequences
     * of seq_len token ids, each below vocab_size, with targets below
     * real_vocab_size; the logits have vocab_size columns, of which the
     * softmax reads the first real_vocab_size (the rest are padding rows of
     * the embedding, kept for the kernels' sake). Every decoder over tokens
     * has these, whatever its blocks hold, and callers that know no family
     * read them: the trainer sizes its batches with seq_len, the sampler
     * reads vocab_size logits and draws among real_vocab_size. The engine
     * reads none of them; a user model of zeropp.h leaves them 0. */
    int seq_len;              /* T */
    int vocab_size;           /* rows of the token embedding, columns of the logits */
    int real_vocab_size;      /* the softmax's columns, 1..vocab_size */
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

#ifdef __cplusplus
}
#endif

#endif

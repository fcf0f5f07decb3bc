/* model/decoder.h — what every family's models share, whatever their
 * blocks compute (decoder.c): the order of calls model.h prescribes and the
 * checks of each call's arguments, with the same messages for every model
 * (`who` names it), the arena their activations are carved from
 * (core/arena.h), and the unit and stage tables they hand the engine. A
 * family's CPU and CUDA models hold a zpp_decoder_calls each and call these
 * first thing in their ops; the engine, the trainer and the tests then meet
 * one behaviour on a misuse, whichever model they drive.
 *
 * The arithmetic a second family shares with GPT-2: the CPU reference's is
 * apart already (cpu_kernels.h: linear layers, LayerNorm, causal attention,
 * softmax with cross-entropy); the CUDA model's is still static inside
 * gpt2_cuda.cu, to be lifted out as that family needs it: the cuBLASLt path
 * (gemm, mm, linear_forward/backward, and attn_gemm with
 * causal_softmax_kernel: the gemm attention), layernorm_*_kernel and
 * cross_entropy_forward/backward_kernel. The fused causal attention is
 * apart too (attention_cuda.h; which path runs: attention_path.h). */
#ifndef ZPP_MODEL_DECODER_H
#define ZPP_MODEL_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h" /* the arena activations are carved from */
#include "model/model.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The checks of create shared by every model: the working dtype is fp32,
 * bf16 or fp16, and max_batch is 1..INT32_MAX / seq_len (so B * T rows fit
 * an int); `who` names the model. */
zpp_status zpp_decoder_check_create(zpp_dtype param_dtype, int max_batch, int seq_len,
                                    const char *who);

/* The order of calls every model enforces (model.h): set_batch, then the
 * forward of stages 0..S-1 in order, then the backward of S-1..0. */
typedef struct zpp_decoder_calls {
    int B, have_batch, have_targets;
    int fwd_next; /* the forward stage expected next (any forward may restart at 0) */
    int bwd_next; /* the backward stage expected next; -1: none until a full forward */
    int keep_row; /* keep_logits's row, -1 none (set -1 at create; kept across batches) */
    int kept;     /* the last forward's head kept that row's logits */
} zpp_decoder_calls;

/* A batch of B sequences was accepted (set_batch): the forward starts over at
 * stage 0 and no backward is due until it completes. */
void zpp_decoder_calls_new_batch(zpp_decoder_calls *c, int B, int have_targets);

/* The checks of set_batch, forward and backward, the same for every model;
 * `who` names the model in the messages ("gpt2", "gpt2 cuda"). Batch: B in
 * 1..max_batch, every token and target inside the vocabulary. Forward: the
 * stage exists, a batch is set, the order holds, params given. Backward:
 * the stage exists and comes in order, targets for the last stage, params
 * (except for stage 0, whose backward reads none) and grads given. */
zpp_status zpp_decoder_check_batch(const zpp_model *m, const int32_t *tokens,
                                   const int32_t *targets, int B, const char *who);
zpp_status zpp_decoder_check_forward(const zpp_model *m, const zpp_decoder_calls *c, int stage,
                                     const void *params, const char *who);
zpp_status zpp_decoder_check_backward(const zpp_model *m, const zpp_decoder_calls *c, int stage,
                                      const void *params, const void *grads, const char *who);
/* keep_logits (model.h), whole: the row is -1 or inside max_batch
 * sequences, and the next forward's head keeps it. logits: the checks
 * (a forward whose head kept the row, and `out`); logits_host also copies
 * the kept row (vocab_size floats in host memory, a CPU model's). */
zpp_status zpp_decoder_keep_logits(const zpp_model *m, zpp_decoder_calls *c, int row,
                                   const char *who);
zpp_status zpp_decoder_check_logits(const zpp_model *m, const zpp_decoder_calls *c,
                                    const float *out, const char *who);
zpp_status zpp_decoder_logits_host(const zpp_model *m, const zpp_decoder_calls *c,
                                   const float *kept, float *out, const char *who);
/* Whether the head of a forward of c->B sequences keeps a row of
 * [r0, r0 + rows): the row's offset in that range, or -1. */
int zpp_decoder_kept_in(const zpp_decoder_calls *c, int seq_len, int r0, int rows);

/* The tables a decoder of L blocks hands the engine (model.h), the same for
 * every family: unit 0 the embedding (and the head), units 1..L the blocks;
 * stages 0 (the embedding, whose backward scatters row gradients and reads
 * no parameters), 1..L (the blocks) and L+1 (the head and the loss, unit 0
 * again). The family fills unit_numel and points each unit's matrix ranges
 * into arrays of its own. */
typedef struct zpp_decoder_tables {
    size_t *unit_numel;              /* L+1 */
    int *stage_unit;                 /* L+2 */
    unsigned char *bwd_reads_params; /* L+2: 0 for stage 0 only */
    int *n_matrix_ranges;            /* L+1 */
    const zpp_elem_range **matrix_ranges;
} zpp_decoder_tables;

/* Allocates the tables of n_layer blocks, stage_unit and bwd_reads_params
 * filled; ZPP_ERR_NOMEM naming `who` leaves nothing allocated. Free with
 * zpp_decoder_tables_free (all pointers NULL after; NULL ones ignored). */
zpp_status zpp_decoder_tables_make(int n_layer, const char *who, zpp_decoder_tables *t);
void zpp_decoder_tables_free(zpp_decoder_tables *t);

/* Fills every field of a zpp_model but ops, mem and impl from the tables
 * of n_layer blocks (they must outlive the model) and the rest given. */
void zpp_decoder_base_fill(zpp_model *base, const zpp_decoder_tables *t, int n_layer,
                           zpp_dtype param_dtype, int max_batch, int seq_len, int vocab_size,
                           int real_vocab_size);

#ifdef __cplusplus
}
#endif

#endif

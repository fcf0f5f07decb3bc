/* model/decoder.h — what every family's models share, whatever their
 * blocks compute (decoder.c): the order of calls model.h prescribes and the
 * checks of each call's arguments, with the same messages for every model
 * (`who` names it), and the arena their activations are carved from. A
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
                                      const void *params, const float *grads, const char *who);
/* keep_logits and logits (model.h): the row is -1 or inside max_batch
 * sequences; logits needs a forward whose head kept the row, and `out`. */
zpp_status zpp_decoder_check_keep_logits(const zpp_model *m, int row, const char *who);
zpp_status zpp_decoder_check_logits(const zpp_model *m, const zpp_decoder_calls *c,
                                    const float *out, const char *who);
/* Whether the head of a forward of c->B sequences keeps a row of
 * [r0, r0 + rows): the row's offset in that range, or -1. */
int zpp_decoder_kept_in(const zpp_decoder_calls *c, int seq_len, int r0, int rows);

/* A bump allocator over one block of floats, run twice: with base NULL it
 * only counts (used), then over the block it hands out the same pointers.
 * Every buffer starts on a multiple of `align` floats. A size that
 * overflows sets `overflow` and returns NULL. */
typedef struct zpp_arena {
    float *base;
    size_t used;  /* floats */
    size_t align; /* floats, >= 1 */
    int overflow;
} zpp_arena;

float *zpp_arena_take(zpp_arena *a, size_t rows, size_t width);

#ifdef __cplusplus
}
#endif

#endif

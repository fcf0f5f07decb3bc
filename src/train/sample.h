/* train/sample.h — text from a decoder of any family (GPT-2, Llama:
 * model/family.h): the next-token draw, the generation
 * loop, and a model held whole on one device for it (`zeropp sample`; the
 * trainer's samples during training go through the engine instead,
 * zpp_trainer_sample, with the same loop and draw).
 *
 * GENERATION. Each new token is one full forward over a window of the
 * sequence so far (prompt, then what was drawn): its last w = min(n, T)
 * tokens at positions 0..w-1, the other T - w positions padded with token
 * 0, and the logits of position w - 1 (model.h, keep_logits). Attention is
 * causal, so the padding changes nothing at w - 1: it is exactly the model's
 * prediction from the window. The simplest correct method (no key/value
 * cache): T forwards' work per token, which a small model does in
 * milliseconds. Once the sequence is longer than T the window slides and
 * the first tokens fall out of the context, as in llm.c and nanoGPT.
 *
 * THE DRAW (zpp_sample_pick), from the logits l_0..l_{V-1} of the V =
 * real_vocab_size tokens the softmax runs over (padded columns never):
 *   temperature 0: the argmax (the lowest index among equal logits);
 *   temperature t > 0: the candidates are the top_k largest logits (ties
 *     go to the lower index), or all V when top_k is 0; each gets
 *         p_i = exp((l_i - m) / t) / sum_j exp((l_j - m) / t),
 *     m the largest logit (subtracted so no exp overflows: the largest
 *     term is exp(0) = 1), in double; the token is the first candidate i,
 *     in index order, whose running sum of the unnormalised terms exceeds
 *     u * (their total), u in [0, 1): inverse-CDF sampling, P(i) = p_i.
 *   t -> 0 tends to the argmax; t = 1 is the model's distribution; t > 1
 *   flattens it. A logit that is NaN or infinite is an error
 *   (ZPP_ERR_NONFINITE): there is no distribution to draw from.
 *
 * THE RANDOM STREAM. Draw k of a generation (k = 0 for the first new token,
 * 1 for the second, ...) reads
 *     u_k = (splitmix64 value k + 1 of the stream whose state starts at
 *            zpp_mix64(seed ^ ZPP_SAMPLE_STREAM)) >> 11, times 2^-53
 * (core/random.h), a pure function of (seed, k): the same seed gives the
 * same draws whatever the prompt, the device or the number of tokens asked
 * for, and a greedy draw consumes its u_k unread. */
#ifndef ZPP_TRAIN_SAMPLE_H
#define ZPP_TRAIN_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h"
#include "model/family.h"
#include "model/gpt2.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "sample" in ASCII: keeps this stream apart from every other stream of a
 * seed (parameter init, data order, ...). */
#define ZPP_SAMPLE_STREAM 0x73616d706c65ull

typedef struct zpp_sample_opts {
    double temperature; /* 0: greedy (argmax); > 0 and finite: softmax(logits / t) */
    int top_k;          /* 0: every token; 1..V: the k largest logits only */
    uint64_t seed;      /* the draws' stream (above) */
} zpp_sample_opts;

/* ZPP_ERR_INVALID naming the option when temperature is negative or not
 * finite, or top_k is outside 0..vocab. */
zpp_status zpp_sample_opts_check(const zpp_sample_opts *o, int vocab);

/* u_k of the stream of `seed` (above), in [0, 1). */
double zpp_sample_uniform(uint64_t seed, uint64_t k);

/* One draw from logits[0..vocab) with uniform u in [0, 1) (above);
 * *token_p in 0..vocab-1. Checks the options and the logits. */
zpp_status zpp_sample_pick(const float *logits, int vocab, const zpp_sample_opts *o, double u,
                           int *token_p);

/* What generation reads from a model: the logits (vocab_size floats, into
 * out) of position n - 1 of `window`, seq_len tokens of which the first n
 * are the context and the rest padding. */
typedef struct zpp_sample_source {
    int seq_len, vocab_size, real_vocab_size;
    zpp_status (*logits)(void *ctx, const int32_t *window, int n, float *out);
    void *ctx;
} zpp_sample_source;

/* Called with each new token as it is drawn (for printing as it goes); a
 * status other than ZPP_OK stops the generation with that status. */
typedef zpp_status (*zpp_sample_emit_fn)(void *ctx, int32_t token);

/* Draws max_new (>= 0) tokens after prompt[0..n_prompt) into out[0..max_new).
 * The prompt needs at least one token, each in 0..real_vocab_size-1
 * (ZPP_ERR_INVALID naming the first one outside, and its position). emit
 * may be NULL. */
zpp_status zpp_sample_generate(const zpp_sample_source *src, const zpp_sample_opts *o,
                               const int32_t *prompt, int n_prompt, int max_new,
                               zpp_sample_emit_fn emit, void *emit_ctx, int32_t *out);

/* ---- A model held whole on one device ------------------------------------ */

/* A model's weights, whole, in host memory, and what they are: the family
 * ("gpt2", "llama") and its shape (family.h; recompute 0), the dtype they
 * were used in, the checkpoint's step, and n_units arrays of fp32 values
 * (unit u: the family's layout of that unit, gpt2.h or llama.h). */
typedef struct zpp_sample_weights {
    char family[16];
    zpp_decoder_shape shape;
    zpp_dtype dtype; /* a checkpoint's working dtype; an llm.c file's (fp32 v3, bf16 v5) */
    int step;        /* -1 for a model file */
    int n_units;
    float **units;
} zpp_sample_weights;

/* The softmax's columns of a shape: real_vocab_size, or vocab_size for 0. */
int zpp_sample_real_vocab(const zpp_decoder_shape *shape);

typedef struct zpp_sample_model zpp_sample_model;

/* The model of w's family and shape on `dev` (the CPU model for the host
 * device, the CUDA model for a GPU; family.h's factory), with max_batch 1
 * and parameters in `dtype` (fp32, bf16 or fp16): unit u gets w->units[u],
 * rounded to dtype (to nearest even, as the engine rounds its fp32 masters
 * when it gathers) and copied to the device; the caller keeps w.
 * ZPP_ERR_FORMAT when w's unit count is not the model's. dev must outlive
 * the model. */
zpp_status zpp_sample_model_create(const zpp_sample_weights *w, zpp_dtype dtype,
                                   zpp_device *dev, zpp_sample_model **model_p);
void zpp_sample_model_destroy(zpp_sample_model *sm); /* NULL is ignored */
/* Its source for zpp_sample_generate. */
zpp_sample_source zpp_sample_model_source(zpp_sample_model *sm);

/* The weights of `path` into *w_p: a checkpoint folder (its published
 * checkpoint, or a step folder), every rank file read and put together
 * whatever the world that saved it (zpp_checkpoint_read_masters, as
 * `zeropp export` reads it), the family and shape from the config it keeps
 * (a manifest without one: a GPT-2 of the manifest's shape), each unit's
 * size checked against the family's layout; a Hugging Face GPT-2 folder
 * (hf_gpt2.h; T its n_positions, seq_len 0) or Llama-family folder
 * (hf_model.h), read as `zeropp train --init-from` reads them (dtype fp32,
 * step -1), a Llama's T `seq_len`, or for 0 its max_position_embeddings up
 * to ZPP_SAMPLE_HF_SEQ_LEN (the window each new token's forward reads: its
 * activations grow with T, and Llama 3's 131072 positions would not fit a
 * host's memory); or an llm.c model file (train/llmc.h: a
 * GPT-2). seq_len must be 0 for the others (ZPP_ERR_CONFIG). Free with
 * zpp_sample_weights_free. ZPP_ERR_IO when path is none of them;
 * ZPP_ERR_FORMAT for sizes that disagree. */
#define ZPP_SAMPLE_HF_SEQ_LEN 1024
zpp_status zpp_sample_read_weights(const char *path, int seq_len, zpp_sample_weights *w_p);
void zpp_sample_weights_free(zpp_sample_weights *w); /* its units; NULL is ignored */

/* ---- From tokens to text -------------------------------------------------- */

/* The decode hook: writes the text of tokens[0..n) into out[0..cap) (no
 * terminating NUL) and its length into *len_p; ZPP_ERR_NOMEM when cap is too
 * small (with *len_p the length needed). A byte-level model's is
 * zpp_sample_decode_bytes; a tokenizer (GPT-2's BPE) plugs in its own. */
typedef struct zpp_sample_decoder {
    zpp_status (*decode)(void *ctx, const int32_t *tokens, size_t n, char *out, size_t cap,
                         size_t *len_p);
    void *ctx;
} zpp_sample_decoder;

/* Vocabulary 256: token b is byte b. */
zpp_status zpp_sample_decode_bytes(void *ctx, const int32_t *tokens, size_t n, char *out,
                                   size_t cap, size_t *len_p);

/* The text of tokens[0..n) as a NUL-terminated string (malloc'd; free it):
 * the decoder's, or without one (dec NULL or dec->decode NULL) the ids
 * written as "12,7,503" (the form --prompt-ids takes). */
zpp_status zpp_sample_text(const zpp_sample_decoder *dec, const int32_t *tokens, size_t n,
                           char **text_p, size_t *len_p);

#ifdef __cplusplus
}
#endif

#endif

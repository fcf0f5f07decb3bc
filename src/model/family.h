/* model/family.h — model families by name, and the shape they are made of.
 *
 * A family is one kind of decoder: the blocks it stacks, how it lays its
 * parameters out in units and initialises them, its CPU and CUDA models.
 * Each family registers one factory under its name (family.c's table:
 * "gpt2", "llama"), so a caller that holds only a
 * name and a shape (a config's "model" section, a checkpoint's manifest)
 * creates any of them, then drives the model through model.h alone.
 *
 * The shape is one struct for every family, not a config per family behind
 * a void pointer: with a pointer, each caller would have to know every
 * family's type, which is what a registry by name is for not knowing; and
 * the decoders trained here differ in a few numbers, not in what a shape
 * is. A number some family does not vary is 0, "the family's own", and a
 * family refuses a value it cannot build, naming the field (GPT-2 has no
 * grouped-query attention and a 4 n_embd MLP, so n_kv_head must be 0 or
 * n_head, n_ffn 0 or 4 n_embd). A knob of one family only (Llama's RoPE
 * base, its norm epsilon, an untied head) joins the struct the same way,
 * 0 = the family's default, refused by the families that have no such
 * knob. */
#ifndef ZPP_MODEL_FAMILY_H
#define ZPP_MODEL_FAMILY_H

#include "device/device.h"
#include "model/model.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a block may keep for its backward beyond what it must: outputs of
 * elementwise functions of what it keeps, which the backward otherwise
 * evaluates again (zpp_decoder_shape.keep_acts; gpt2_cuda.cu, RECOMPUTE). */
enum {
    ZPP_KEEP_LAYERNORM = 1, /* the two LayerNorm outputs: 4 C bytes a token in bf16 */
    ZPP_KEEP_GELU = 2,      /* the GELU output: 8 C bytes a token in bf16 */
    ZPP_KEEP_ALL = ZPP_KEEP_LAYERNORM | ZPP_KEEP_GELU
};

/* The shape of a decoder over tokens: n_layer blocks over a residual stream
 * n_embd wide, each attention (n_head query heads of n_embd / n_head
 * channels, sharing n_kv_head key/value heads) and an MLP n_ffn wide. */
typedef struct zpp_decoder_shape {
    int n_layer;
    int n_head;
    int n_kv_head;       /* a divisor of n_head (grouped-query attention); 0 = n_head */
    int n_embd;
    int n_ffn;           /* the MLP's hidden width; 0 = the family's (GPT-2: 4 n_embd) */
    int seq_len;         /* T, the longest sequence (model.h) */
    int vocab_size;      /* rows of the token embedding, padding included (model.h) */
    int real_vocab_size; /* the softmax's columns, 1..vocab_size; 0 = vocab_size */
    /* Not the shape but how a model keeps it: 1 = activation checkpointing
     * (each block keeps its input and recomputes the rest in its backward;
     * gpt2.h, zpp_gpt2_config.recompute), 0 = off. */
    int recompute;
    /* What a block keeps that its backward would otherwise evaluate again
     * from what it must keep (the CUDA GPT-2's LayerNorm and GELU outputs,
     * zpp_gpt2_config.keep_acts): ZPP_KEEP_* bits; faster, more memory;
     * 0 = recompute them all. */
    int keep_acts;
    /* Llama's knobs (llama.h), 0 = the default; GPT-2 refuses any other
     * value, naming the field. */
    double rope_theta; /* the rotary base: 0 = 10000 (HF's default) */
    double norm_eps;   /* RMSNorm's epsilon: 0 = 1e-5 */
    int untied_head;   /* 1: the output head is a matrix of its own; 0: the token embedding */
    int qkv_bias;      /* 1: q, k and v projections have biases (Qwen2's: not o) */
    int o_bias;        /* 1: the attention output projection has one (HF Llama attention_bias) */
    /* Llama 3's rope_scaling of type llama3 (HF _compute_llama3_parameters):
     * rope_factor 0 = no scaling; else all four are set. */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
} zpp_decoder_shape;

/* What a family registers: its model of `shape` for `dev` (the CPU model on
 * the host backend, the CUDA model on a GPU), in the working dtype
 * param_dtype, for micro-batches of up to max_batch sequences. */
typedef zpp_status (*zpp_model_factory)(const zpp_decoder_shape *shape, zpp_dtype param_dtype,
                                        int max_batch, zpp_device *dev, zpp_model **model_p);

/* The Llama knobs of a shape (the fields past the common ones), named by
 * their config keys ("model.n_kv_head", ...) in keys[i] with their values
 * in values[i] (integers and switches as doubles): the one list that the
 * checks comparing two shapes walk (a checkpoint's against the run's, a
 * Hugging Face config.json's against the run's). */
#define ZPP_DECODER_KNOBS 11
void zpp_decoder_shape_knobs(const zpp_decoder_shape *s, const char *keys[ZPP_DECODER_KNOBS],
                             double values[ZPP_DECODER_KNOBS]);

/* The model of family `family` ("gpt2", "llama"), made by its factory. ZPP_ERR_CONFIG
 * for a name no family registered, the message listing those that did;
 * whatever the family's factory returns otherwise (ZPP_ERR_CONFIG for a
 * shape it cannot build). *model_p is set on success only. */
zpp_status zpp_model_family_create(const char *family, const zpp_decoder_shape *shape,
                                   zpp_dtype param_dtype, int max_batch, zpp_device *dev,
                                   zpp_model **model_p);

#ifdef __cplusplus
}
#endif

#endif

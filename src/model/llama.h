/* model/llama.h — the Llama family (Meta's Llama 2/3 decoder, as Hugging
 * Face's LlamaForCausalLM computes it): its config (zpp_llama_config, from
 * the generic zpp_decoder_shape), the parameter layout in units, the
 * initial values, the units and stages (llama.c), the CPU reference
 * model (llama_cpu.c) and the CUDA model (llama_cuda.cu), picked by the
 * factory (llama_factory.c).
 *
 * Units (each one flat buffer, gathered whole by the engine), with C =
 * n_embd, V = vocab_size, H = n_head, KV = n_kv_head, hd = C / H (the head
 * dim), Ck = KV * hd (the width of k and of v), F = n_ffn:
 *
 *   unit 0       wte     V x C     token embedding (and the head when tied)
 *                norm_f  C         final RMSNorm gain
 *                head    V x C     output head, only when untied_head
 *
 *   unit l       block l (l = 1..L), pre-norm
 *                norm1   C         attention RMSNorm gain
 *                wq      C x C     \
 *                wk      Ck x C     } one (C + 2 Ck) x C matrix: [q | k | v]
 *                wv      Ck x C    /
 *                bq, bk, bv        C + 2 Ck, only when qkv_bias
 *                wo      C x C     attention output projection
 *                bo      C         its bias, only when o_bias
 *                norm2   C         MLP RMSNorm gain
 *                wgate   F x C     \  one 2F x C matrix: [gate | up]
 *                wup     F x C     /
 *                wdown   C x F
 *
 * in that order, no padding; matrices row-major [out][in] as nn.Linear
 * stores them (HF's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
 * down_proj). q, k and v are adjacent so one product makes all three, and
 * so are gate and up; an importer of HF files concatenates them.
 *
 * The biases are two switches: qkv_bias (q, k and v's, as Qwen2 has them)
 * and o_bias (the output projection's); HF's Llama attention_bias = true
 * is both.
 *
 * Stages as GPT-2's: 0 = embedding (unit 0; its backward reads no
 * parameters), 1..L = blocks, L+1 = final RMSNorm + head + loss (unit 0).
 *
 * Initialisation (HF's _init_weights, initializer_range 0.02): every
 * matrix N(0, 0.02^2) (wte included; HF does not shrink the residual
 * projections as GPT-2 does), RMSNorm gains 1, biases 0. Each value is a
 * pure function of (seed, unit, index), drawn by zpp_param_normal (the
 * counter-hashed Box-Muller normal, the same bits on host and device). */
#ifndef ZPP_MODEL_LLAMA_H
#define ZPP_MODEL_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "core/random.h"
#include "model/decoder.h"
#include "model/family.h"
#include "model/model.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A Llama's shape with every default resolved (zpp_llama_config_of_shape):
 * no field is 0 but the switches and the rope scaling (rope_factor 0 =
 * none). */
typedef struct zpp_llama_config {
    int n_layer, n_head, n_kv_head, n_embd, n_ffn, seq_len, vocab_size, real_vocab_size;
    double rope_theta, norm_eps;
    int untied_head, qkv_bias, o_bias;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    /* Activation checkpointing (1; 0 = off), as GPT-2's (gpt2.h): a block
     * keeps its input only and its backward runs its forward again first,
     * the same arithmetic on the same inputs, so the same bits. */
    int recompute;
} zpp_llama_config;

/* The "llama" family's defaults for the 0s of a shape: n_kv_head = n_head,
 * n_ffn = Llama's 2/3 of 4C rounded up to a multiple of 256 (11008 for C =
 * 4096), real_vocab_size = vocab_size, rope_theta 10000, norm_eps 1e-5;
 * then every field checked (ZPP_ERR_CONFIG naming it): sizes in range,
 * n_head dividing n_embd, n_kv_head dividing n_head, an even head dim
 * (RoPE turns pairs), a rope scaling with factor > 0, 0 < low_freq_factor <
 * high_freq_factor and original_max_pos >= 1, recompute 0 or 1. *cfg_p is
 * set on success only. */
zpp_status zpp_llama_config_of_shape(const zpp_decoder_shape *shape, zpp_llama_config *cfg_p);

/* Offsets (in elements) of each tensor inside its unit; head and the
 * biases are meaningful only when the config has them. */
typedef struct zpp_llama_layout {
    size_t wte, norm_f, head, embed_numel;
    size_t norm1, wqkv, bqkv, wo, bo, norm2, wgu, wdown, block_numel;
} zpp_llama_layout;

void zpp_llama_layout_make(const zpp_llama_config *cfg, zpp_llama_layout *layout_p);

#define ZPP_LLAMA_INIT_STD 0.02

/* Initial value of element i of `unit`: a pure function of (layout, seed,
 * unit, i); the normal is scaled in double and rounded once to fp32. */
ZPP_HD float zpp_llama_init_value(const zpp_llama_layout *l, int unit, size_t i, uint64_t seed) {
    double one = 0.0;
    int matrix = 0;
    if (unit == 0) {
        if (i < l->norm_f) matrix = 1;           /* wte */
        else if (i < l->head) one = 1.0;         /* norm_f */
        else matrix = 1;                         /* head */
    } else {
        if (i < l->wqkv) one = 1.0;              /* norm1 */
        else if (i < l->bqkv) matrix = 1;        /* wq, wk, wv */
        else if (i < l->wo) {}                   /* q, k, v biases */
        else if (i < l->bo) matrix = 1;          /* wo */
        else if (i < l->norm2) {}                /* o bias */
        else if (i < l->wgu) one = 1.0;          /* norm2 */
        else matrix = 1;                         /* wgate, wup, wdown */
    }
    if (!matrix) return (float)one;
    return (float)ZPP_DMUL(ZPP_LLAMA_INIT_STD, zpp_param_normal(seed, unit, i));
}

/* Elements [offset, offset + count) of unit's initial values into out
 * (host fp32); ZPP_ERR_INVALID for a unit or range out of bounds. */
zpp_status zpp_llama_init_fill(const zpp_llama_config *cfg, int unit, size_t offset, size_t count,
                               float *out, uint64_t seed);

/* The units, stages and matrix ranges of the zpp_model interface (unit 0:
 * wte and, when untied, head; a block: wqkv, wo, and wgate..wdown). The
 * struct must not move after zpp_llama_stages_make: matrix_ranges points
 * into it. ZPP_ERR_NOMEM leaves nothing allocated. */
typedef struct zpp_llama_stages {
    zpp_decoder_tables t; /* decoder.h: every family's tables */
    zpp_elem_range embed_matrices[2], block_matrices[3];
} zpp_llama_stages;

zpp_status zpp_llama_stages_make(const zpp_llama_config *cfg, zpp_llama_stages *s);
void zpp_llama_stages_free(zpp_llama_stages *s);

/* Fills every field of a zpp_model but ops, mem and impl (the stages must
 * outlive the model). */
void zpp_llama_base_fill(zpp_model *base, const zpp_llama_config *cfg, zpp_dtype param_dtype,
                         int max_batch, const zpp_llama_stages *s);

/* The inverse frequencies of RoPE, hd/2 of them: pair i of a head (channels
 * i and i + hd/2) turns by position * inv_freq[i], inv_freq[i] =
 * theta^(-2i/hd), stretched by the llama3 scaling when rope_factor is set.
 * In double; the CPU model rounds its cos/sin tables once from them. */
void zpp_llama_rope_inv_freq(const zpp_llama_config *cfg, double *inv_freq);

/* The cos and sin tables of positions 0..T-1, row-major T x hd/2 each:
 * cos_t[p * hd/2 + i] = cos(p * inv_freq[i]), the angle and its cosine in
 * double, rounded once to fp32 (sin alike). The one table every model
 * turns q and k by (the CPU model's rows, the CUDA kernels' upload), so
 * both rotate by the same fp32 numbers. ZPP_ERR_NOMEM when hd/2 doubles
 * cannot be had; ZPP_ERR_INVALID for T < 1 or NULL tables. */
zpp_status zpp_llama_rope_tables(const zpp_llama_config *cfg, int T, float *cos_t, float *sin_t);

/* The CPU reference Llama (llama_cpu.c), for the host backend; param_dtype
 * fp32, bf16 or fp16, the arithmetic fp32. cfg as zpp_llama_config_of_shape
 * made it (this checks only the dtype and max_batch). */
zpp_status zpp_llama_cpu_create(const zpp_llama_config *cfg, zpp_dtype param_dtype,
                                int max_batch, zpp_model **model_p);

/* The CUDA Llama (llama_cuda.cu; llama_cuda_none.c in a build without
 * CUDA): fp32, bf16 or fp16, any head dim; the attention fused where it
 * can run (bf16, head dim 64 or 128), by GEMMs elsewhere (attention_path.h). */
zpp_status zpp_llama_cuda_create(const zpp_llama_config *cfg, zpp_dtype param_dtype,
                                 int max_batch, zpp_device *dev, zpp_model **model_p);

/* The "llama" family's factory (family.h): the CPU model on the host
 * backend, the CUDA model on a GPU. */
zpp_status zpp_llama_family_create(const zpp_decoder_shape *shape, zpp_dtype param_dtype,
                                   int max_batch, zpp_device *dev, zpp_model **model_p);

/* The dtype an evaluation of a Llama computes in on dev: fp32 on the host
 * backend; bf16 on a GPU, what a Llama trains in there, with the fused
 * attention and no T x T matrices (at a long max_position_embeddings the
 * GEMM path's would not fit). */
zpp_dtype zpp_llama_eval_dtype(const zpp_device *dev);

#ifdef __cplusplus
}
#endif

#endif

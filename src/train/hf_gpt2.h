/* train/hf_gpt2.h — a GPT-2 as Hugging Face's GPT2LMHeadModel folder, out
 * (`zeropp export --format hf` of a GPT-2 checkpoint, which transformers
 * loads) and in (`zeropp train --init-from DIR`).
 *
 * config.json: {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
 * n_layer, n_head, n_embd, n_positions and n_ctx (the run's T: the
 * position table's rows), vocab_size (the real vocabulary: llm.c's padded
 * rows are left out), activation_function "gelu_new" (GELU's tanh form,
 * the model's), layer_norm_epsilon 1e-5, the three dropouts 0 (the model
 * trained without), tie_word_embeddings true, bos_token_id and
 * eos_token_id 50256 for GPT-2's own vocabulary of 50257 (its
 * <|endoftext|>) and null otherwise, torch_dtype}.
 *
 * THE NAMES, with N = 0..L-1 (unit N + 1), as GPT2LMHeadModel.save_pretrained
 * writes them (lm_head.weight is the tied wte: not written):
 *   transformer.wte.weight              [V, C]   unit 0's wte, rows 0..V-1
 *   transformer.wpe.weight              [T, C]   wpe
 *   transformer.ln_f.{weight,bias}      [C]      lnf
 *   transformer.h.N.ln_1.{weight,bias}  [C]      ln1
 *   transformer.h.N.attn.c_attn.weight  [C, 3C]  qkv_w transposed
 *   transformer.h.N.attn.c_attn.bias    [3C]     qkv_b
 *   transformer.h.N.attn.c_proj.weight  [C, C]   proj_w transposed
 *   transformer.h.N.attn.c_proj.bias    [C]      proj_b
 *   transformer.h.N.ln_2.{weight,bias}  [C]      ln2
 *   transformer.h.N.mlp.c_fc.weight     [C, 4C]  fc_w transposed
 *   transformer.h.N.mlp.c_fc.bias       [4C]     fc_b
 *   transformer.h.N.mlp.c_proj.weight   [4C, C]  fc2_w transposed
 *   transformer.h.N.mlp.c_proj.bias     [C]      fc2_b
 * GPT-2's Conv1D stores a layer's weight [in][out], the transpose of the
 * [out][in] the model (and llm.c) keeps: those four are written transposed.
 *
 * Errors: ZPP_ERR_INVALID, ZPP_ERR_IO, ZPP_ERR_NOMEM. Nothing prints. */
#ifndef ZPP_TRAIN_HF_GPT2_H
#define ZPP_TRAIN_HF_GPT2_H

#include "model/gpt2.h"
#include "train/hf_model.h"
#include "zeropp.h"

/* Writes the GPT-2 of config `cfg` whose units are units[0..L] (fp32,
 * whole; gpt2.h's layout) into the new folder `dir` as above, in
 * opts->dtype, with opts->files beside it (zpp_hf_write_folder; opts->
 * config_from must be NULL). *shards_p (may be NULL): safetensors files. */
zpp_status zpp_hf_gpt2_export(const char *dir, const zpp_gpt2_config *cfg,
                              const float *const *units, const zpp_hf_export_opts *opts,
                              int *shards_p);

/* ---- In: `zeropp train --init-from DIR` of a GPT-2 folder ----------------------
 *
 * config.json's n_layer, n_head, n_embd, n_positions (-> model.seq_len: the
 * position table's rows) and vocab_size (-> real_vocab_size; the run may
 * pad model.vocab_size past it, those rows starting at zero) set the shape.
 * Refused, naming the key: anything that would make another model than
 * zeropp's GPT-2 (an activation other than GELU's tanh form, n_inner other
 * than null or 4 n_embd, layer_norm_epsilon other than 1e-5, an untied
 * head, unscaled or layer-scaled attention, cross-attention). The tensors
 * are named as above, with or without "transformer." (GPT2Model saves
 * without); the causal-mask buffers h.N.attn.bias and h.N.attn.masked_bias
 * older files hold, and a tied lm_head.weight, are ignored; any other
 * name, a missing tensor, another shape or a dtype not BF16, F16 or F32 is
 * refused. */

/* 1 when dir's config.json has model_type "gpt2". */
int zpp_hf_gpt2_is_dir(const char *dir);
/* dir/config.json's GPT-2 (vocab_size = real_vocab_size = the file's). */
zpp_status zpp_hf_gpt2_read_config(const char *dir, zpp_gpt2_config *cfg);

typedef struct zpp_hf_gpt2 zpp_hf_gpt2;
/* Opens the folder: config.json, the safetensors (hf_model.h's
 * zpp_hf_files), every tensor checked against config.json's GPT-2. */
zpp_status zpp_hf_gpt2_open(const char *dir, zpp_hf_gpt2 **model_p);
void zpp_hf_gpt2_close(zpp_hf_gpt2 *m); /* NULL is ignored */
const zpp_gpt2_config *zpp_hf_gpt2_config(const zpp_hf_gpt2 *m);
/* ZPP_ERR_CONFIG naming the key when the run's model is not the folder's
 * (its vocab_size may pad the folder's). */
zpp_status zpp_hf_gpt2_check_model(const zpp_hf_gpt2 *m, const zpp_gpt2_config *run);
/* The same against the folder `dir`'s config `folder`
 * (zpp_hf_gpt2_read_config), before anything is opened. */
zpp_status zpp_hf_gpt2_check_shape(const zpp_gpt2_config *folder, const char *dir,
                                   const zpp_gpt2_config *run);
/* Elements [begin, begin + count) of `unit` of the run's GPT-2 `run`
 * (gpt2.h's layout) as fp32 into out: what the tensors hold there (the
 * Conv1D weights transposed back), padded rows zero. */
zpp_status zpp_hf_gpt2_read_unit(zpp_hf_gpt2 *m, const zpp_gpt2_config *run, int unit,
                                 size_t begin, size_t count, float *out);

#endif

/* train/hf_model.h — a Hugging Face Llama folder (config.json and its
 * safetensors) mapped onto the llama family's units (model/llama.h), in
 * and out: `zeropp train --init-from DIR` and `zeropp export --format hf`.
 *
 * THE FOLDER: config.json (train/hf_config.h: LlamaForCausalLM,
 * MistralForCausalLM or Qwen2ForCausalLM, the same tensor names) and either
 * model.safetensors or model.safetensors.index.json with the shards it
 * names (train/safetensors.h). Tensors in BF16, F16 or F32, any order, in
 * any file.
 *
 * THE SHAPE comes from config.json: hidden_size -> model.n_embd,
 * num_hidden_layers -> n_layer, num_attention_heads -> n_head,
 * num_key_value_heads -> n_kv_head, intermediate_size -> n_ffn,
 * vocab_size -> real_vocab_size (and vocab_size, unless the run pads it),
 * rope_theta, rms_norm_eps -> norm_eps, tie_word_embeddings -> !untied_head,
 * the biases by architecture (zpp_hf_biases: Llama's attention_bias ->
 * qkv_bias and o_bias, Qwen2 -> qkv_bias, Mistral none), the architecture
 * -> model.hf_architecture (what an export names), rope_scaling (llama3)
 * -> rope_factor, rope_low_freq_factor, rope_high_freq_factor,
 * rope_original_max_pos.
 * zpp_hf_apply_shape writes these into a run's config before the user's
 * --config and --set are read over it; zpp_hf_check_shape then refuses, with
 * one line naming the key and both values, a config that changed any of
 * them. Left to the run: model.seq_len (T; RoPE has no table to outgrow;
 * a Mistral's sliding_window bounds it, zpp_hf_check_seq_len),
 * and model.vocab_size, which may pad the embedding past the file's rows
 * (those rows start at zero, outside the softmax). A head_dim other than
 * hidden_size / num_attention_heads is refused: the layout's head dim is
 * n_embd / n_head.
 *
 * THE NAMES, with N = 0..L-1 the layer (unit N + 1) and V the file's
 * vocabulary (the padded rows of a larger model.vocab_size are no tensor):
 *   model.embed_tokens.weight            [V, C]   unit 0's wte, rows 0..V-1
 *   model.norm.weight                    [C]      norm_f
 *   lm_head.weight                       [V, C]   head (untied only)
 *   model.layers.N.input_layernorm.weight           [C]   norm1
 *   model.layers.N.self_attn.{q,k,v}_proj.weight    [H hd | KV hd, C]  wqkv's
 *                                                   three row blocks
 *   model.layers.N.self_attn.{q,k,v}_proj.bias      bqkv's (qkv_bias)
 *   model.layers.N.self_attn.o_proj.weight          [C, C]  wo
 *   model.layers.N.self_attn.o_proj.bias            [C]     bo (o_bias)
 *       A LlamaForCausalLM's attention_bias gives all four biases, so a
 *       model with only some of them (a Qwen2-style run exported as a
 *       Llama) writes the others as zeros (zpp_hf_slots' all_four)
 *   model.layers.N.post_attention_layernorm.weight  [C]   norm2
 *   model.layers.N.mlp.{gate,up}_proj.weight        [F, C]  wgu's two halves
 *   model.layers.N.mlp.down_proj.weight             [C, F]  wdown
 * Row-major [out][in] in both, so each HF tensor is one contiguous range
 * of one unit. Ignored: model.layers.N.self_attn.rotary_emb.inv_freq (a
 * buffer older transformers saved; RoPE's frequencies come from the
 * config) and lm_head.weight of a tied model (transformers ties it to the
 * embedding on load). Any other name, a missing tensor, another shape or
 * dtype is refused with one line naming it.
 *
 * Errors: ZPP_ERR_IO, ZPP_ERR_FORMAT (the files), ZPP_ERR_CONFIG (the
 * shape). Nothing prints. */
#ifndef ZPP_TRAIN_HF_MODEL_H
#define ZPP_TRAIN_HF_MODEL_H

#include <stddef.h>

#include "model/llama.h"
#include "train/config.h"
#include "train/hf_config.h"
#include "train/safetensors.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when `path` is a folder holding config.json (a Hugging Face model), 0
 * otherwise (an llm.c file, or nothing). */
int zpp_hf_is_model_dir(const char *path);

/* config.json's shape into cfg: model.family llama and the keys above
 * (ZPP_ERR_CONFIG for a head_dim this layout cannot hold). */
zpp_status zpp_hf_apply_shape(const zpp_hf_config *hf, zpp_train_config *cfg);
/* ZPP_ERR_CONFIG, naming the key, config.json's value and cfg's, when cfg
 * changed what zpp_hf_apply_shape set (model.vocab_size may only grow);
 * `dir` names the folder. */
zpp_status zpp_hf_check_shape(const zpp_hf_config *hf, const zpp_train_config *cfg,
                              const char *dir);

/* One HF tensor's place in the units: elements [offset, offset + numel) of
 * `unit` are the tensor `name` (row-major, shape[0..ndim)), or, with
 * zero_tensor, a bias the model lacks, in no unit. */
typedef struct zpp_hf_slot {
    char name[96];
    int unit;
    size_t offset, numel;
    int ndim;
    int64_t shape[2];
    int zero_tensor; /* 1: no unit holds it; must read as zeros, is written as zeros */
} zpp_hf_slot;

/* The slots of a Llama of config `cfg` (vocab: the file's rows, cfg's
 * real_vocab_size) in transformers' state_dict order (the order
 * save_pretrained fills shards in); *n_p of them into a malloc'd array.
 * all_four: named as a LlamaForCausalLM, whose attention_bias gives q, k,
 * v and o a bias each when it gives any, those cfg lacks zero tensors. */
zpp_status zpp_hf_slots(const zpp_llama_config *cfg, int all_four, zpp_hf_slot **slots_p,
                        size_t *n_p);

/* The safetensors files of a Hugging Face folder: model.safetensors, or
 * every shard model.safetensors.index.json names, each tensor in the shard
 * the index says (ZPP_ERR_FORMAT otherwise). Close frees them. */
typedef struct zpp_hf_files {
    size_t n;
    zpp_st_file **files;
} zpp_hf_files;
zpp_status zpp_hf_files_open(const char *dir, zpp_hf_files *f);
void zpp_hf_files_close(zpp_hf_files *f);

typedef struct zpp_hf_model zpp_hf_model;

/* Opens folder `dir`: config.json, the index if any, every safetensors
 * file's header, and checks that the tensors are exactly the slots of
 * config.json's Llama (names, shapes, dtypes; zero tensors all zero). */
zpp_status zpp_hf_model_open(const char *dir, zpp_hf_model **model_p);
void zpp_hf_model_close(zpp_hf_model *m); /* NULL is ignored */
const zpp_hf_config *zpp_hf_model_config(const zpp_hf_model *m);
/* The dtype the tensors are stored in (the first one's), for messages. */
const char *zpp_hf_model_dtype(const zpp_hf_model *m);

/* Elements [begin, begin + count) of `unit` of a Llama of config `cfg` (the
 * run's: its vocab_size may pad the file's) as fp32 into out: each HF
 * tensor that overlaps the range is read from its file (those bytes only),
 * padded rows are zero. */
zpp_status zpp_hf_model_read_unit(zpp_hf_model *m, const zpp_llama_config *cfg, int unit,
                                  size_t begin, size_t count, float *out);

/* What an export writes besides the tensors. */
typedef struct zpp_hf_file {
    const char *src;  /* a file to copy into the folder */
    const char *name; /* its name there: "tokenizer.json", ... */
} zpp_hf_file;
typedef struct zpp_hf_export_opts {
    zpp_dtype dtype;        /* ZPP_FP32, ZPP_BF16 (rounded to nearest even), ZPP_FP16 */
    size_t max_shard_bytes; /* 0: one file */
    /* config.json: NULL, written from `hf`; else this config.json (the one
     * `hf` was read from: the model's own), kept whole with its dtype set
     * (zpp_hf_config_write_like) */
    const char *config_from;
    /* copied in beside them (the model's tokenizer files); names other
     * than those written, and without a '/' */
    const zpp_hf_file *files;
    int n_files;
} zpp_hf_export_opts;

/* Writes a Llama of config `cfg` whose units are units[0..L] (fp32, whole)
 * into the folder `dir`: config.json (opts->config_from's, or from `hf`,
 * whose shape fields must be cfg's; torch_dtype set to opts->dtype), the
 * safetensors (zpp_st_write_dir: one file, or shards of at most
 * opts->max_shard_bytes and the index) and opts->files. The files go into
 * DIR.tmp.<pid>, renamed to DIR at the end: DIR must not exist, and a
 * failure leaves no DIR. *shards_p (may be NULL): safetensors files
 * written. */
zpp_status zpp_hf_export(const char *dir, const zpp_llama_config *cfg, const zpp_hf_config *hf,
                         const float *const *units, const zpp_hf_export_opts *opts,
                         int *shards_p);

/* One tensor's bytes as an export writes them (a zpp_st_fill_fn over a
 * zpp_hf_fill_ctx): elements of x[0, rows * cols) (cols 0: a vector; x
 * NULL: zeros), or with transposed the [rows][cols] transpose of the
 * [cols][rows] matrix x (GPT-2's Conv1D weights, train/hf_gpt2.h), in
 * dtype: fp32 as held, bf16 and fp16 rounded to nearest even. */
typedef struct zpp_hf_fill_ctx {
    const float *x;
    int64_t rows, cols;
    int transposed;
    zpp_dtype dtype;
} zpp_hf_fill_ctx;
zpp_status zpp_hf_fill(void *ctx, size_t offset, size_t n, void *out);

/* What every export writes (zpp_hf_export, train/hf_gpt2.h): the folder
 * `dir`, which must not exist, whole or not at all: into DIR.tmp.<pid>
 * config.json by write_config(path, arg), the tensors src[0, n) as
 * zpp_st_write_dir writes them (opts->max_shard_bytes), opts->files
 * copied in; then renamed to DIR. On failure the temporary folder is
 * removed. */
typedef zpp_status (*zpp_hf_config_writer)(const char *path, void *arg);
zpp_status zpp_hf_write_folder(const char *dir, zpp_hf_config_writer write_config, void *arg,
                               const zpp_st_source *src, size_t n,
                               const zpp_hf_export_opts *opts, int *shards_p);

/* The HF config of a Llama `cfg` named as `arch`, with
 * max_position_embeddings given and no token ids (what a checkpoint does
 * not keep). ZPP_ERR_CONFIG when arch cannot name it: a Mistral has no
 * biases, a Qwen2 q/k/v biases and no o bias. */
zpp_status zpp_hf_config_of_llama(const zpp_llama_config *cfg, zpp_hf_arch arch,
                                  int max_position_embeddings, zpp_hf_config *hf_p);

#ifdef __cplusplus
}
#endif

#endif

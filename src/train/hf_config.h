/* train/hf_config.h — a Hugging Face Llama-family config.json, read and
 * written: LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM, one
 * decoder under three names (zpp_hf_arch).
 *
 * transformers describes a model by config.json beside its safetensors
 * files. For the Llama family (LlamaConfig) the keys that fix the math are:
 *   hidden_size C, intermediate_size (the SwiGLU MLP's width),
 *   num_hidden_layers L, num_attention_heads H, num_key_value_heads
 *   (grouped-query attention: each K/V head serves H / KV query heads;
 *   default H), head_dim (default C / H; Llama 3 and Qwen may set it apart
 *   from C / H), vocab_size, max_position_embeddings, rms_norm_eps,
 *   rope_theta (the rotary base: pair i of a head turns by
 *   position * theta^(-2i / head_dim)), rope_scaling (null, or Llama 3.1's
 *   {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
 *   "original_max_position_embeddings"}, which stretches the low
 *   frequencies by `factor` and leaves the high ones), tie_word_embeddings
 *   (the output head is the token embedding), attention_bias (q/k/v/o
 *   biases), torch_dtype (the dtype of the stored weights), bos_token_id and
 *   eos_token_id (an int or a list).
 * MistralForCausalLM (model_type "mistral", MistralConfig) is the same
 * math with no biases (no attention_bias key) and a sliding_window: null,
 * or W, each token attending to the W last positions (itself included),
 * which equals full causal attention for sequences of up to W tokens:
 * zeropp has no sliding-window attention, so a run's seq_len must be <= W
 * (zpp_hf_check_seq_len). Qwen2ForCausalLM (model_type "qwen2",
 * Qwen2Config) always has q, k and v biases and no o bias (no
 * attention_bias key); use_sliding_window must be false, and then
 * sliding_window and max_window_layers change nothing (the first kept, the
 * second ignored). layer_types (what newer transformers write, one
 * attention kind a layer) is read for any of the three when it lists
 * "full_attention" for each of num_hidden_layers layers.
 * Defaults are LlamaConfig's where it has one that a file may leave out;
 * the sizes (hidden, intermediate, layers, heads, vocabulary) are required.
 *
 * Refused, with one line naming the key: an architecture other than
 * those three, a model_type not the architecture's, a key of another
 * architecture (attention_bias outside Llama, sliding_window in Llama), a
 * layer_types entry other than "full_attention", a rope_scaling type other
 * than llama3, a key this
 * reader does not know (it would change the model silently otherwise; the
 * harmless bookkeeping keys transformers writes are accepted and ignored),
 * and shapes that do not fit (sizes not positive, H not dividing C without
 * head_dim, KV not dividing H).
 *
 * zpp_hf_config_write writes every field above, so that reading what it
 * wrote gives the same struct, bit for bit (each double printed with the
 * fewest digits, 15 to 17, that read back as it). Errors: ZPP_ERR_IO,
 * ZPP_ERR_FORMAT (not JSON, or a value of the wrong type), ZPP_ERR_CONFIG
 * (a value or key this model does not take). Nothing prints. */
#ifndef ZPP_TRAIN_HF_CONFIG_H
#define ZPP_TRAIN_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Llama 3.1's frequency scaling of the rotary embedding. */
typedef struct zpp_hf_rope_scaling {
    int llama3; /* 0: none (rope_scaling null or absent); 1: rope_type llama3 */
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings;
} zpp_hf_rope_scaling;

#define ZPP_HF_MAX_EOS 8
#define ZPP_HF_NAME_MAX 64

/* The architectures read (config.json's "architectures"[0]). */
typedef enum zpp_hf_arch { ZPP_HF_LLAMA = 0, ZPP_HF_MISTRAL = 1, ZPP_HF_QWEN2 = 2 } zpp_hf_arch;
#define ZPP_HF_N_ARCH 3
/* "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM". */
const char *zpp_hf_arch_name(zpp_hf_arch a);
/* The architecture called `name`: 1 and *a set, or 0 for an unknown one. */
int zpp_hf_arch_parse(const char *name, zpp_hf_arch *a);

typedef struct zpp_hf_config {
    char architecture[ZPP_HF_NAME_MAX]; /* zpp_hf_arch_name of one of the three */
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* default num_attention_heads */
    int head_dim;            /* default hidden_size / num_attention_heads */
    int vocab_size;
    int max_position_embeddings; /* default 2048 */
    double rms_norm_eps;         /* default 1e-6 */
    double rope_theta;           /* default 10000 */
    zpp_hf_rope_scaling rope_scaling;
    int tie_word_embeddings; /* default 0 */
    int attention_bias;      /* default 0; Llama's key only (0 in the others) */
    int sliding_window;      /* Mistral, Qwen2: W, or 0 for null (absent); 0 in Llama */
    zpp_dtype torch_dtype;   /* "bfloat16", "float16", "float32" (default) */
    int bos_token_id;        /* -1: none (null or absent) */
    int n_eos;               /* eos_token_id: 0 (null or absent), 1, or a list's length */
    int eos_is_list;         /* written back as a list when 1 */
    int eos_token_id[ZPP_HF_MAX_EOS];
} zpp_hf_config;

/* The architecture of a checked config (zpp_hf_config_check). */
zpp_hf_arch zpp_hf_config_arch(const zpp_hf_config *cfg);
/* The model's biases by architecture: Llama's attention_bias gives q, k, v
 * and o one each; Mistral has none; Qwen2 has q, k and v's, never o's. */
void zpp_hf_biases(const zpp_hf_config *cfg, int *qkv_bias_p, int *o_bias_p);
/* ZPP_ERR_CONFIG, naming sliding_window and both numbers, when sequences of
 * seq_len tokens do not fit in a Mistral's sliding window (zeropp attends
 * to every earlier position); `what` names the file. */
zpp_status zpp_hf_check_seq_len(const zpp_hf_config *cfg, int seq_len, const char *what);

/* Parses the JSON text of a config.json; `what` names it in messages (its
 * path). */
zpp_status zpp_hf_config_parse(const char *text, const char *what, zpp_hf_config *cfg_p);
/* Reads and parses the file `path`. */
zpp_status zpp_hf_config_read(const char *path, zpp_hf_config *cfg_p);
/* The text of the config file `path` (a regular file of at most 1 MiB,
 * else ZPP_ERR_IO or ZPP_ERR_FORMAT), NUL-terminated, into *text_p: free()
 * it. For families other than the Llama's (train/hf_gpt2.h). */
zpp_status zpp_hf_config_text(const char *path, char **text_p);
/* Checks the shape rules above (zpp_hf_config_parse calls it). */
zpp_status zpp_hf_config_check(const zpp_hf_config *cfg, const char *what);
/* The JSON text of cfg (malloc'd, free() it), checked first. */
zpp_status zpp_hf_config_format(const zpp_hf_config *cfg, char **text_p);
/* Writes cfg to `path` (PATH.tmp.<pid>, synced, renamed over PATH). */
zpp_status zpp_hf_config_write(const char *path, const zpp_hf_config *cfg);
/* Writes the config.json `like` (one zpp_hf_config_read takes) to `path`
 * with every key it has, its dtype `dtype`: byte for byte where its
 * torch_dtype (and dtype, if it has that key) already names dtype; else
 * with those set to it (torch_dtype added where it has neither), printed
 * by cJSON with every number exact (json_exact.h). */
zpp_status zpp_hf_config_write_like(const char *path, const char *like, zpp_dtype dtype);
/* torch_dtype's name of dtype ("float32", "bfloat16", "float16"); NULL for
 * another dtype. */
const char *zpp_hf_torch_dtype_name(zpp_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif

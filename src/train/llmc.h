/* train/llmc.h — llm.c's GPT-2 model files and token files.
 *
 * MODEL FILE (llm.c's train_gpt2.c / train_gpt2.cu write and read it):
 *   256 little-endian int32: header[0] = 20240326 (magic), header[1] = the
 *   version, 3 (fp32 parameters) or 5 (bf16 parameters), header[2] = maxT,
 *   [3] = V (vocabulary), [4] = L (layers), [5] = NH (heads), [6] = C
 *   (channels), [7] = Vp (V padded up, llm.c uses a multiple of 128), the
 *   rest 0; then every parameter, fp32 or bf16, tensor by tensor, each
 *   tensor holding all L layers one after the other:
 *       wte (Vp, C)  wpe (maxT, C)  ln1w (L, C)  ln1b (L, C)
 *       qkvw (L, 3C, C)  qkvb (L, 3C)  attprojw (L, C, C)  attprojb (L, C)
 *       ln2w (L, C)  ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)
 *       fcprojw (L, C, 4C)  fcprojb (L, C)  lnfw (C)  lnfb (C)
 *   The file size is exactly 1024 + (4 or 2) * P bytes, P = the sum.
 *
 * THE MAPPING to our units (model/gpt2.h). llm.c's Linear weights are
 * (out, in) row-major, as PyTorch's nn.Linear and as ours, and its qkv rows
 * are q, then k, then v, head h at columns h*hs.. of each, as ours: every
 * tensor maps over unchanged, only regrouped. llm.c keeps one tensor for all
 * layers; we keep one unit per layer. So wte, wpe, lnfw and lnfb go to unit
 * 0 (wte, wpe, lnf_w, lnf_b), and layer l's slice of each per-layer tensor
 * (ln1w[l], qkvw[l], ...) to unit l + 1, with attprojw -> proj_w and
 * fcprojw -> fc2_w. The shape becomes n_layer L, n_head NH, n_embd C,
 * seq_len maxT, vocab_size Vp (the rows of wte) and real_vocab_size V: rows
 * V..Vp-1 of wte are llm.c's padding, kept (so a file comes back byte for
 * byte) but outside the softmax (model.h). llm.c's GPT-2 is ours: pre-LN
 * blocks, LayerNorm eps 1e-5, causal attention scaled by 1/sqrt(hs), tanh
 * GELU, the LM head tied to wte.
 *
 * TOKEN FILE (for zpp_llmc_eval): llm.c's, 256 int32 (magic 20240520,
 * version 1, token count) then uint16 tokens, or our version 2 with uint32
 * tokens, as train/data.h reads them;
 * any other file is raw text, one token per byte (data.h's rule: a file
 * holding a NUL byte in its first KiB without the magic is refused).
 *
 * Errors: ZPP_ERR_IO (cannot open/read/write, with strerror), ZPP_ERR_FORMAT
 * (wrong magic, version or size: one line naming the file, what was found
 * and what was expected), ZPP_ERR_CONFIG (a shape that is not a GPT-2, or
 * that disagrees with the config). Nothing prints; nothing is written on
 * error (zpp_llmc_write goes through a temporary file and a rename). */
#ifndef ZPP_TRAIN_LLMC_H
#define ZPP_TRAIN_LLMC_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h"
#include "model/gpt2.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZPP_LLMC_MODEL_MAGIC 20240326
#define ZPP_LLMC_VERSION_FP32 3
#define ZPP_LLMC_VERSION_BF16 5
#define ZPP_LLMC_HEADER_INTS 256

typedef struct zpp_llmc_file zpp_llmc_file;

/* What a model file's header says, checked. */
typedef struct zpp_llmc_info {
    zpp_gpt2_config model; /* seq_len = maxT, vocab_size = Vp, real_vocab_size = V */
    zpp_dtype dtype;       /* ZPP_FP32 (version 3) or ZPP_BF16 (version 5) */
    size_t n_params;       /* P */
} zpp_llmc_info;

/* Parameters of a GPT-2 of this shape (llm.c's count, the same as ours). */
size_t zpp_llmc_param_count(const zpp_gpt2_config *model);

/* Opens a model file and checks its magic, version, shape (a valid GPT-2,
 * V <= Vp) and size. */
zpp_status zpp_llmc_open(const char *path, zpp_llmc_file **file_p);
const zpp_llmc_info *zpp_llmc_info_get(const zpp_llmc_file *f);
void zpp_llmc_close(zpp_llmc_file *f); /* NULL is ignored */

/* Elements [begin, begin + count) of our unit `unit` (0..L, the layout of
 * model/gpt2.h) as fp32, read from the file (only those bytes). bf16
 * values widen exactly. */
zpp_status zpp_llmc_read_unit(zpp_llmc_file *f, int unit, size_t begin, size_t count,
                              float *out);

/* ZPP_ERR_CONFIG naming the first key where `cfg` (the run's model shape)
 * differs from the file's, with both values; ZPP_OK when they agree. */
zpp_status zpp_llmc_check_model(const zpp_llmc_file *f, const zpp_gpt2_config *cfg);

/* Writes a model file of `dtype` (ZPP_FP32: version 3; ZPP_BF16: version 5,
 * each value rounded to nearest even) from whole units (units[u] holds
 * zpp_gpt2_unit_numel(model, u) floats). The shape must fit the header
 * (every field an int32). Written to PATH.tmp, flushed and synced, then
 * renamed over PATH: on error PATH is untouched and PATH.tmp removed. */
zpp_status zpp_llmc_write(const char *path, const zpp_gpt2_config *model, zpp_dtype dtype,
                          const float *const *units);

/* ---- Evaluation ---------------------------------------------------------- */

typedef struct zpp_llmc_eval_opts {
    int batch_size; /* B sequences per batch */
    int batches;    /* K batches */
    int seq_len;    /* a Hugging Face folder's T; 0 = its max_position_embeddings */
} zpp_llmc_eval_opts;

/* The mean loss of K batches of the model file on `dev` (the host: the CPU
 * model; a GPU: the CUDA model), fp32 parameters. model_path may also be a
 * Hugging Face folder (train/hf_model.h), read as `zeropp train
 * --init-from` reads it (config.json defines the llama, at T = seq_len),
 * its parameters fp32 on the host and bf16 on a GPU (the CUDA llama's). Batch i is llm.c's
 * DataLoader batch i from the start of the token file: inputs tokens
 * [i B T, (i + 1) B T), targets the same shifted by one, T the model's
 * seq_len; so the file needs K B T + 1 tokens. Each batch's loss is the mean
 * over its B T positions; the result is their mean (in double). Tokens must
 * lie below the model's vocab_size, targets below its real_vocab_size. */
zpp_status zpp_llmc_eval(const char *model_path, const char *tokens_path,
                         const zpp_llmc_eval_opts *opts, zpp_device *dev, double *loss_p);

#ifdef __cplusplus
}
#endif

#endif

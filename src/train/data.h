/* train/data.h — token sources and deterministic batching.
 *
 * SOURCES (zpp_data_open picks by content, not by file name):
 *   1. llm.c token file: a header of 256 little-endian int32 (header[0] =
 *      20240520 magic, header[1] = version, header[2] = token count), then
 *      that many little-endian tokens: uint16 in version 1 (llm.c's own),
 *      uint32 in version 2 (ours, for vocabularies past 65,536 such as
 *      Llama 3's; train/tokfile.h writes it only when an id needs it; the
 *      rest of the header is zeros in both). A file with the magic but
 *      another version, or whose size is not 1024 + 2 * count (version 2:
 *      4 * count) bytes, is an error (ZPP_ERR_FORMAT) giving the numbers.
 *      Every token is checked against cfg->model.vocab_size when the file
 *      is opened (ZPP_ERR_CONFIG naming the first bad token's index and
 *      value).
 *   2. Any other file: raw bytes, one token per byte (needs vocab_size >=
 *      256, else ZPP_ERR_CONFIG). An empty file is ZPP_ERR_FORMAT.
 *   3. path == NULL: a built-in synthetic corpus of ZPP_DATA_SYNTH_TOKENS
 *      ASCII tokens ('a'-'z', ' ', '.', '\n'; needs vocab_size >= 128),
 *      generated from a fixed seed (the same text for every config): words
 *      from a 48-word lexicon chained by a sparse word-level Markov chain
 *      into sentences. Spelling is deterministic, the next word has a few
 *      likely choices, so a 2-layer GPT sees its loss fall from ln(vocab)
 *      to well under 1 nat per token within a few hundred steps.
 *   Files are read with positioned reads (pread), one per sequence into the
 *   caller's buffer (plus one scan of the tokens at open for the vocabulary
 *   check of llm.c files); no rank copies the file. They are not mapped: a
 *   file that shrinks during a run gives ZPP_ERR_IO ("data file X shrank
 *   from N to M bytes while training") instead of a SIGBUS. A FIFO, a
 *   directory or a device is refused at open (without blocking).
 *
 * SPLIT: of the n tokens, the last n_val = max(floor(n / 10), T + 1) are
 *   held out for validation, the first n_train = n - n_val are for
 *   training (T = cfg->model.seq_len). n_train >= T + 1 is required (so
 *   n >= 2 (T + 1) and n >= T + 1 + ceil(n / 10)); otherwise ZPP_ERR_CONFIG
 *   naming the sizes. A sequence is T + 1 consecutive tokens: tokens are its
 *   first T, targets its last T (targets[t] = tokens[t + 1]).
 *
 * TRAINING ORDER: the training split is cut into K = floor((n_train - 1) / T)
 *   windows; window k of epoch e starts at o_e + k * T, where the epoch's
 *   offset o_e = hash(seed, e) mod (n_train - 1 - K T + 1) shifts the grid
 *   inside the slack (so every window of T + 1 tokens stays in the split).
 *   The training samples form one endless stream: sample i is window
 *   perm_e(i mod K) of epoch e = i / K, perm_e a pseudo-random permutation
 *   of [0, K) keyed by (seed, e) (a Feistel network with cycle-walking: no
 *   table, O(1) per lookup). Each epoch visits every window exactly once.
 *
 * SEQUENTIAL ORDER (cfg->data_order = ZPP_DATA_ORDER_SEQUENTIAL,
 *   `--data-order sequential`): the training split is read front to back, as
 *   llm.c's DataLoader reads a token file. Step s reads the block of
 *   G T + 1 tokens starting at b(s) G T, b(s) = s mod E, where
 *   E = floor((n_train - 1) / (G T)) is the number of whole steps in the
 *   split: sequence j of the step is tokens [b G T + j T, b G T + j T + T]
 *   (T inputs, targets one later). Until the first wrap, step s reads tokens
 *   [s G T, (s + 1) G T]; the tail of the split that holds no whole step is
 *   never read, and the pass starts again at token 0. The step's sequences
 *   are dealt to ranks and micro-steps as below: rank r at micro-step a
 *   reads rows (a * world + r) * micro + b, the llm.c convention (process p
 *   reads the p-th B T tokens of each micro-step's world B T, and each
 *   micro-step moves on by world B T). The wrap is per optimizer step, not
 *   per micro-step as in llm.c (which wraps after floor((n - 1) / (world B
 *   T)) micro-steps): the two agree while the split holds a whole number of
 *   steps, and ours keeps a step's tokens independent of how G is cut into
 *   ranks and micro-batches, so a checkpoint resumes on another world size
 *   with the same batches. E >= 1 is required (n_train >= G T + 1):
 *   ZPP_ERR_CONFIG at open (G = cfg->train_batch_size) and in
 *   zpp_data_sequence. The seed plays no part. For parity with llm.c, give
 *   llm.c a file of the first n_train tokens: llm.c trains on a whole file,
 *   we hold out the last tenth.
 *
 * GLOBAL BATCH: optimizer step s consumes samples s * G .. s * G + G - 1,
 *   G = micro * accum * world; sequence j in [0, G) of the step is sample
 *   s * G + j. Rank r at micro-step a gets the contiguous range
 *       j = a * (micro * world) + r * micro + b,   b in [0, micro).
 *   So the set of sequences of a step depends only on (seed, s, G): 1 rank
 *   x micro 8 sees exactly the samples of 4 ranks x micro 2, or of 2 ranks
 *   x micro 2 x accum 2.
 *
 * VALIDATION: the held-out split is cut into K_val = floor((n_val - 1) / T)
 *   windows starting at n_train + k * T (no shuffling). Validation batch
 *   `index` of B sequences holds windows (index * B + b) mod K_val. To
 *   spread an evaluation over ranks, give rank r the indices r, r + world, ..
 *   (`zeropp eval --split train` reads the training split the same way,
 *   zpp_data_train_eval_batch).
 */
#ifndef ZPP_TRAIN_DATA_H
#define ZPP_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "train/config.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZPP_DATA_LLMC_MAGIC 20240520
#define ZPP_DATA_LLMC_VERSION 1 /* uint16 tokens (llm.c's) */
#define ZPP_DATA_LLMC_VERSION_U32 2 /* uint32 tokens (ours, for vocabularies past 65,536) */
#define ZPP_DATA_LLMC_HEADER_INTS 256
#define ZPP_DATA_SYNTH_TOKENS 262144 /* 2^18 */

typedef enum zpp_data_kind {
    ZPP_DATA_LLMC = 0,      /* llm.c .bin token file */
    ZPP_DATA_RAW_TEXT = 1,  /* bytes as tokens */
    ZPP_DATA_SYNTHETIC = 2  /* built-in corpus */
} zpp_data_kind;

typedef struct zpp_data zpp_data;

typedef struct zpp_data_info {
    zpp_data_kind kind;
    size_t n_tokens;   /* all tokens */
    size_t n_train;    /* training split [0, n_train) */
    size_t n_val;      /* validation split [n_train, n_tokens) */
    size_t train_windows; /* K: samples per epoch */
    size_t val_windows;   /* K_val */
    int vocab;         /* tokens are < vocab: 256 for raw text, 128 for
                        * synthetic, max token + 1 for llm.c */
    int seq_len;       /* T */
    int micro_batch;   /* B of zpp_data_batch */
    int accum;         /* micro-steps per step */
} zpp_data_info;

/* Opens a token source: `path` (llm.c or raw text, decided by the magic) or
 * NULL for the synthetic corpus. Uses cfg->model.seq_len, vocab_size,
 * cfg->seed (sample order), and the batch geometry, which must be resolved
 * (zpp_train_config_resolve) first: ZPP_ERR_INVALID otherwise. The config
 * is copied; `cfg` need not outlive the data. */
zpp_status zpp_data_open(const char *path, const zpp_train_config *cfg, zpp_data **data_p);

/* Micro-batch `micro_step` (in [0, accum)) of optimizer step `step` for
 * rank `rank` of `world`: B = micro sequences, written as B * T int32 into
 * tokens and targets (row b = sequence b, targets shifted by one). */
zpp_status zpp_data_batch(const zpp_data *data, uint64_t step, int micro_step, int rank,
                          int world, int32_t *tokens, int32_t *targets);

/* Sequence j (in [0, global_batch)) of step `step` for a global batch of
 * `global_batch` sequences: T tokens and T targets. zpp_data_batch is built
 * on it; exposed for tests and tools. */
zpp_status zpp_data_sequence(const zpp_data *data, uint64_t step, uint64_t global_batch,
                             uint64_t j, int32_t *tokens, int32_t *targets);

/* Start offset (token index into the whole data) of training sample i of
 * the shuffled stream (sample s * G + j is sequence j of step s); the
 * sequential order is zpp_data_sequence's. */
size_t zpp_data_sample_start(const zpp_data *data, uint64_t sample);

/* Validation batch `index` of B sequences (B >= 1, any size), from the
 * held-out tail only. */
zpp_status zpp_data_val_batch(const zpp_data *data, uint64_t index, int B, int32_t *tokens,
                              int32_t *targets);

/* Batch `index` of B sequences of the training split read as the
 * validation split is (for scoring a model on the text it trained on, not
 * for training): windows (index * B + b) mod K, window k starting at token
 * k * T, in order (no shuffling, no epoch offset). */
zpp_status zpp_data_train_eval_batch(const zpp_data *data, uint64_t index, int B,
                                     int32_t *tokens, int32_t *targets);

/* Sizes and kind. */
zpp_data_info zpp_data_info_get(const zpp_data *data);
/* Token at absolute index i < n_tokens (for tests and tools). */
int32_t zpp_data_token(const zpp_data *data, size_t i);

/* "llm.c", "raw text", "synthetic". */
const char *zpp_data_kind_name(zpp_data_kind kind);

/* Closes / frees; NULL is ignored. */
void zpp_data_close(zpp_data *data);

#ifdef __cplusplus
}
#endif

#endif

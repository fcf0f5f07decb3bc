/* train/tokfile.h — writing llm.c token files, the format zpp_data_open
 * reads (train/data.h, SOURCES 1: a header of 256 little-endian int32,
 * magic 20240520, version 1, token count; then the tokens as little-endian
 * uint16). `zeropp tokenize` writes them.
 *
 * Ids past 65535 (Llama 3's vocabulary is 128,256) do not fit a uint16:
 * the first such id appended turns the file into version 2, whose header
 * is the same but for the version and whose tokens are little-endian
 * uint32 (the tokens already written are rewritten wider, in place). So a
 * file whose ids all fit is version 1, byte for byte llm.c's, whatever the
 * vocabulary; zpp_data_open reads both.
 *
 * The file appears whole or not at all: tokens go to "PATH.tmp.<pid>" in
 * the same folder, and zpp_tokfile_close writes the header, syncs the file
 * and renames it over PATH. A failed or aborted write removes the
 * temporary file and leaves PATH as it was. */
#ifndef ZPP_TRAIN_TOKFILE_H
#define ZPP_TRAIN_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest id a version-1 file can hold (uint16); past it, version 2. */
#define ZPP_TOKFILE_MAX_ID 65535

typedef struct zpp_tokfile zpp_tokfile;

/* Starts a token file for `path` (ZPP_ERR_IO naming the folder when the
 * temporary file cannot be made there). */
zpp_status zpp_tokfile_open(const char *path, zpp_tokfile **f_p);
/* Appends ids[0, n). ZPP_ERR_INVALID for a negative id or a file
 * past 2^31 - 1 tokens (the header's count is an int32); ZPP_ERR_IO. After a
 * failure only zpp_tokfile_abort is left to call. */
zpp_status zpp_tokfile_append(zpp_tokfile *f, const int32_t *ids, size_t n);
/* Writes the header, syncs, renames the file into place and frees f (also
 * on failure, removing the temporary file). ZPP_ERR_INVALID for a file of
 * no tokens (the loader refuses those). *count_p (may be NULL): tokens
 * written. */
zpp_status zpp_tokfile_close(zpp_tokfile *f, size_t *count_p);
/* Removes the temporary file and frees f; NULL is ignored. */
void zpp_tokfile_abort(zpp_tokfile *f);

/* ---- The tokenizer note: which tokenizer made a token file -----------------
 *
 * Token ids mean nothing without the tokenizer that made them, and an llm.c
 * token file does not say which one it was. So `zeropp tokenize` writes,
 * beside OUT.bin, a note OUT.bin.json:
 *     {"tokenizer": "gpt2-bpe", "vocab": "/abs/vocab.json",
 *      "merges": "/abs/merges.txt", "vocab_size": 320, "tokens": 750080}
 * and what turns a model's ids back into text finds it through the data
 * file a checkpoint records (`zeropp sample DIR`, `zeropp train
 * --sample-every`) without being told. The paths are absolute, as the files
 * were when OUT.bin was written; "tokens" is OUT.bin's token count then, so
 * a note beside a token file that something else has rewritten since (a
 * count that differs) is not believed. A Hugging Face tokenizer.json is
 * noted as {"tokenizer": "hf-bpe", "file": "/abs/tokenizer.json",
 * "vocab_size": ..., "tokens": ...}. */
typedef struct zpp_tokfile_note {
    char *vocab, *merges; /* GPT-2's two files (absolute paths); malloc'd */
    int32_t vocab_size;   /* the tokenizer's (zpp_bpe_vocab_size) */
    size_t tokens;        /* the token file's count */
    char *tokenizer_json; /* or, set instead of vocab and merges, a tokenizer.json */
} zpp_tokfile_note;

/* The note's path for a token file: "BIN_PATH.json" into buf[0..cap)
 * (ZPP_ERR_INVALID when it does not fit). */
zpp_status zpp_tokfile_note_path(const char *bin_path, char *buf, size_t cap);
/* Writes the note of bin_path (a temporary file, then a rename; ZPP_ERR_IO
 * naming it). The paths are written as given: make them absolute first. */
zpp_status zpp_tokfile_note_write(const char *bin_path, const zpp_tokfile_note *note);
/* Reads the note of the token file bin_path: *found_p = 1 and *note filled
 * (free it with zpp_tokfile_note_free), or *found_p = 0 and *note zeroed
 * when there is none. ZPP_ERR_FORMAT naming the note when it is malformed,
 * or stale: bin_path is not a token file of the note's token count. */
zpp_status zpp_tokfile_note_read(const char *bin_path, zpp_tokfile_note *note, int *found_p);
void zpp_tokfile_note_free(zpp_tokfile_note *note);

#ifdef __cplusplus
}
#endif

#endif

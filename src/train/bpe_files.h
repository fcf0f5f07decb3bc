/* train/bpe_files.h — what the loaders of tokenizer files share (internal to
 * src/train): GPT-2's vocab.json and merges.txt (bpe_gpt2.c) and Hugging
 * Face's tokenizer.json (bpe_hf.c) write byte-level tokens in the same
 * printable alphabet (bpe.h, zpp_bpe_gpt2_byte_char), and both read whole
 * files of a few MB. */
#ifndef ZPP_TRAIN_BPE_FILES_H
#define ZPP_TRAIN_BPE_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

/* The whole regular file `path`, NUL-terminated, in a malloc'd buffer;
 * `what` names it in messages ("vocab", "tokenizer"). ZPP_ERR_IO,
 * ZPP_ERR_FORMAT past 1 GiB (no tokenizer file is that large). */
zpp_status zpp_bpe_read_file(const char *path, const char *what, char **buf_p, size_t *len_p);

/* A token as byte-level files write it (one printable character a byte)
 * back to its bytes; out holds at least n bytes. 0 on success; -1 for bytes
 * that are not UTF-8; else the first character outside the alphabet (+1,
 * so a NUL is told from success). */
int64_t zpp_bpe_gpt2_string_bytes(const char *s, size_t n, uint8_t *out, size_t *out_n);

/* The ZPP_ERR_FORMAT for a nonzero result r of zpp_bpe_gpt2_string_bytes:
 * "WHAT 'PATH': WHERE "TOK" ..." saying what is wrong with the token. */
zpp_status zpp_bpe_alphabet_error(int64_t r, const char *what, const char *path,
                                  const char *where, const char *tok);

#endif

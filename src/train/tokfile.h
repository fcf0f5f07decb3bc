/* train/tokfile.h — writing llm.c token files, the format zpp_data_open
 * reads (train/data.h, SOURCES 1: a header of 256 little-endian int32,
 * magic 20240520, version 1, token count; then the tokens as little-endian
 * uint16). `zeropp tokenize` writes them.
 *
 * The file appears whole or not at all: tokens go to "PATH.tmp.<pid>" in
 * the same folder, and zpp_tokfile_finish writes the header, syncs the file
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

/* The largest id a version-1 file can hold (uint16). */
#define ZPP_TOKFILE_MAX_ID 65535

typedef struct zpp_tokfile zpp_tokfile;

/* Starts a token file for `path` (ZPP_ERR_IO naming the folder when the
 * temporary file cannot be made there). */
zpp_status zpp_tokfile_create(const char *path, zpp_tokfile **f_p);
/* Appends ids[0, n). ZPP_ERR_INVALID for an id outside [0, 65535] or a file
 * past 2^31 - 1 tokens (the header's count is an int32); ZPP_ERR_IO. After a
 * failure only zpp_tokfile_abort is left to call. */
zpp_status zpp_tokfile_append(zpp_tokfile *f, const int32_t *ids, size_t n);
/* Writes the header, syncs, renames the file into place and frees f (also
 * on failure, removing the temporary file). ZPP_ERR_INVALID for a file of
 * no tokens (the loader refuses those). *count_p (may be NULL): tokens
 * written. */
zpp_status zpp_tokfile_finish(zpp_tokfile *f, size_t *count_p);
/* Removes the temporary file and frees f; NULL is ignored. */
void zpp_tokfile_abort(zpp_tokfile *f);

#ifdef __cplusplus
}
#endif

#endif

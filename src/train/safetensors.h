/* train/safetensors.h — Hugging Face's safetensors files, read and written.
 *
 * THE FORMAT (huggingface/safetensors, the specification of its README):
 *   8 bytes: N, a little-endian u64, the header's length;
 *   N bytes: a UTF-8 JSON object, which may end in spaces (0x20) of padding;
 *   then the byte buffer, every tensor's bytes, little-endian, row-major.
 * The header maps each tensor's name to
 *     {"dtype": "BF16", "shape": [2048, 512], "data_offsets": [BEGIN, END]}
 * with BEGIN, END byte offsets relative to the buffer's start, and may hold
 * one "__metadata__" object of string -> string (PyTorch's writer puts
 * {"format": "pt"} there). The rules a reader enforces, as the reference
 * does: N <= 100,000,000 and within the file; names unique; a known dtype;
 * each dimension a non-negative integer; END - BEGIN = numel * dtype size;
 * and the tensors tile the buffer exactly: sorted by offset each begins
 * where the one before ended, the first at 0, the last ending at the end of
 * the file (no overlap, no hole, nothing outside the buffer).
 *
 * READING mirrors train/llmc.h: zpp_st_open reads and checks the header
 * only; zpp_st_read then reads any byte range of one tensor with pread, so a
 * rank reads only the bytes of its shard, in large sequential reads.
 * zpp_st_read_f32 widens BF16, F16 and F32 tensors to fp32 on the way (the
 * conversion lives here, once, not in each caller).
 *
 * WRITING (zpp_st_write) follows the reference writer: the header's tensor
 * keys sorted by name (bytewise) after "__metadata__": {"format": "pt"}; the
 * tensors laid out in that order with no gaps; the header padded with spaces
 * so that the buffer starts at a multiple of 8 bytes. zpp_st_write_dir splits
 * above a byte limit into model-00001-of-0000N.safetensors files and writes
 * model.safetensors.index.json, as transformers' save_pretrained does:
 *     {"metadata": {"total_size": BYTES}, "weight_map": {NAME: FILE, ...}}
 * Every file goes to PATH.tmp.<pid>, is synced and renamed over PATH: on
 * error PATH is untouched and the temporary file removed.
 *
 * The host is little-endian, as the file (llmc.c makes the same choice).
 * Errors: ZPP_ERR_IO (cannot open/read/write, with strerror), ZPP_ERR_FORMAT
 * (a file that breaks a rule above: one line naming the file, the tensor and
 * the rule), ZPP_ERR_INVALID (bad arguments: a range outside a tensor, a
 * name written twice). Nothing prints. */
#ifndef ZPP_TRAIN_SAFETENSORS_H
#define ZPP_TRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The specification's dtypes. */
typedef enum zpp_st_dtype {
    ZPP_ST_BOOL,
    ZPP_ST_U8,
    ZPP_ST_I8,
    ZPP_ST_F8_E5M2,
    ZPP_ST_F8_E4M3,
    ZPP_ST_I16,
    ZPP_ST_U16,
    ZPP_ST_F16,
    ZPP_ST_BF16,
    ZPP_ST_I32,
    ZPP_ST_U32,
    ZPP_ST_F32,
    ZPP_ST_F64,
    ZPP_ST_I64,
    ZPP_ST_U64,
    ZPP_ST_DTYPES /* how many */
} zpp_st_dtype;

/* "BF16", ...; NULL for a value out of range. */
const char *zpp_st_dtype_name(zpp_st_dtype dtype);
/* Bytes per element; 0 for a value out of range. */
size_t zpp_st_dtype_size(zpp_st_dtype dtype);
/* ZPP_ERR_FORMAT naming `name` when it is no dtype of the format. */
zpp_status zpp_st_dtype_parse(const char *name, zpp_st_dtype *dtype_p);

/* Dimensions a tensor may have here (the format sets no limit; models use 1
 * to 4). */
#define ZPP_ST_MAX_DIMS 8
/* The reference reader's limit on the header (a corrupt length would
 * otherwise ask for gigabytes). */
#define ZPP_ST_MAX_HEADER 100000000u

/* ---- Reading ----------------------------------------------------------------- */

typedef struct zpp_st_tensor {
    const char *name;
    zpp_st_dtype dtype;
    int ndim;
    int64_t shape[ZPP_ST_MAX_DIMS];
    size_t numel;
    size_t begin, end; /* bytes, relative to the buffer (the header's data_offsets) */
} zpp_st_tensor;

typedef struct zpp_st_file zpp_st_file;

/* Opens a safetensors file and checks its header against every rule above. */
zpp_status zpp_st_open(const char *path, zpp_st_file **file_p);
void zpp_st_close(zpp_st_file *f); /* NULL is ignored */

/* The tensors, in the order of their bytes in the buffer. */
size_t zpp_st_count(const zpp_st_file *f);
const zpp_st_tensor *zpp_st_tensor_at(const zpp_st_file *f, size_t i);
/* The tensor called `name`, or NULL. */
const zpp_st_tensor *zpp_st_find(const zpp_st_file *f, const char *name);
/* The value of `key` in "__metadata__", or NULL. */
const char *zpp_st_metadata(const zpp_st_file *f, const char *key);
/* The path the file was opened with. */
const char *zpp_st_path(const zpp_st_file *f);

/* Bytes [offset, offset + n) of tensor t (one of f's) into out, read from
 * the file (only those bytes). */
zpp_status zpp_st_read(zpp_st_file *f, const zpp_st_tensor *t, size_t offset, size_t n,
                       void *out);
/* Elements [first, first + count) of tensor t as fp32: F32 as stored, BF16
 * and F16 widened exactly. ZPP_ERR_UNSUPPORTED for other dtypes. */
zpp_status zpp_st_read_f32(zpp_st_file *f, const zpp_st_tensor *t, size_t first, size_t count,
                           float *out);

/* ---- Writing ----------------------------------------------------------------- */

/* Produces bytes [offset, offset + n) of one tensor into out (a staging
 * buffer of at most ZPP_ST_FILL_CHUNK bytes): for tensors that are not in
 * memory whole (an fp32 master converted to bf16 on the way out). */
typedef zpp_status (*zpp_st_fill_fn)(void *ctx, size_t offset, size_t n, void *out);
#define ZPP_ST_FILL_CHUNK ((size_t)1 << 20)

/* One tensor to write: its bytes are `data` or, when data is NULL, come
 * from fill(ctx, ...). */
typedef struct zpp_st_source {
    const char *name;
    zpp_st_dtype dtype;
    int ndim;
    int64_t shape[ZPP_ST_MAX_DIMS];
    const void *data;
    zpp_st_fill_fn fill;
    void *ctx;
} zpp_st_source;

/* Writes tensors[0, n) to one file `path`. ZPP_ERR_INVALID for an empty or
 * repeated name, "__metadata__" as a name, a bad dtype or shape, or a
 * tensor with neither data nor fill. */
zpp_status zpp_st_write(const char *path, const zpp_st_source *tensors, size_t n);

/* Writes tensors[0, n) into the folder `dir` (which must exist): one
 * model.safetensors when their bytes total at most max_shard_bytes (0: no
 * limit), else shards of at most max_shard_bytes each (a tensor larger than
 * the limit gets a shard of its own), filled in the order given, as
 * model-00001-of-0000N.safetensors ... and model.safetensors.index.json.
 * *shards_p (may be NULL): the number of files, 1 when not sharded. */
zpp_status zpp_st_write_dir(const char *dir, const zpp_st_source *tensors, size_t n,
                            size_t max_shard_bytes, int *shards_p);

/* ---- Sharded checkpoints: the index ----------------------------------------- */

#define ZPP_ST_SINGLE_NAME "model.safetensors"
#define ZPP_ST_INDEX_NAME "model.safetensors.index.json"

typedef struct zpp_st_index zpp_st_index;

/* Opens an index file: "weight_map" an object of tensor name -> file name
 * (a plain name, no '/', the file beside the index), "metadata"."total_size"
 * a byte count when present. */
zpp_status zpp_st_index_open(const char *path, zpp_st_index **index_p);
void zpp_st_index_close(zpp_st_index *x); /* NULL is ignored */
/* The file holding tensor `name` (as written in the index), or NULL. */
const char *zpp_st_index_find(const zpp_st_index *x, const char *name);
/* Tensors in the weight map, and the distinct files they name (sorted). */
size_t zpp_st_index_count(const zpp_st_index *x);
size_t zpp_st_index_files(const zpp_st_index *x);
const char *zpp_st_index_file(const zpp_st_index *x, size_t i);
/* "metadata"."total_size", or 0 when the index does not say. */
size_t zpp_st_index_total_size(const zpp_st_index *x);

#ifdef __cplusplus
}
#endif

#endif

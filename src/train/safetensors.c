/* train/safetensors.c — Hugging Face's safetensors files (safetensors.h). */
#include "train/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"

/* Integers a JSON number (a double in cJSON) holds exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0 /* 2^53 */

/* ---- Dtypes -------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ZPP_ST_DTYPES] = {
    [ZPP_ST_BOOL] = {"BOOL", 1},        [ZPP_ST_U8] = {"U8", 1},   [ZPP_ST_I8] = {"I8", 1},
    [ZPP_ST_F8_E5M2] = {"F8_E5M2", 1},  [ZPP_ST_F8_E4M3] = {"F8_E4M3", 1},
    [ZPP_ST_I16] = {"I16", 2},          [ZPP_ST_U16] = {"U16", 2}, [ZPP_ST_F16] = {"F16", 2},
    [ZPP_ST_BF16] = {"BF16", 2},        [ZPP_ST_I32] = {"I32", 4}, [ZPP_ST_U32] = {"U32", 4},
    [ZPP_ST_F32] = {"F32", 4},          [ZPP_ST_F64] = {"F64", 8}, [ZPP_ST_I64] = {"I64", 8},
    [ZPP_ST_U64] = {"U64", 8},
};

const char *zpp_st_dtype_name(zpp_st_dtype d) {
    return (unsigned)d < ZPP_ST_DTYPES ? st_dtypes[d].name : NULL;
}

size_t zpp_st_dtype_size(zpp_st_dtype d) {
    return (unsigned)d < ZPP_ST_DTYPES ? st_dtypes[d].size : 0;
}

zpp_status zpp_st_dtype_parse(const char *name, zpp_st_dtype *dtype_p) {
    for (int d = 0; d < ZPP_ST_DTYPES; d++)
        if (name && !strcmp(name, st_dtypes[d].name)) {
            *dtype_p = (zpp_st_dtype)d;
            return ZPP_OK;
        }
    return zpp_error(ZPP_ERR_FORMAT,
                     "unknown safetensors dtype '%s'; the format's are BOOL, U8, I8, F8_E5M2, "
                     "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64",
                     name ? name : "(none)");
}

/* numel of a shape, into *numel_p; 0 when the bytes (numel * es) overflow. */
static int shape_numel(const int64_t *shape, int ndim, size_t es, size_t *numel_p) {
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        const size_t d = (size_t)shape[i];
        if (d && numel > SIZE_MAX / es / d) return 0;
        numel *= d;
    }
    *numel_p = numel;
    return 1;
}

/* ---- Reading: the header ------------------------------------------------------- */

struct zpp_st_file {
    int fd;
    char *path;
    size_t data_start; /* 8 + N: where the buffer begins in the file */
    size_t n_tensors;
    zpp_st_tensor *tensors; /* sorted by begin (then end) */
    size_t n_meta;
    char **meta; /* key, value, key, value, ... */
};

/* A JSON number that is an integer in [0, 2^53], into *out. */
static int json_count(const cJSON *v, size_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    const double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_JSON_INT) || d != (double)(uint64_t)d) return 0;
    *out = (size_t)d;
    return 1;
}

/* One header entry `name`: {"dtype", "shape", "data_offsets"} into *t. */
static zpp_status parse_tensor(const char *path, const cJSON *e, zpp_st_tensor *t) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': tensor '%s' is not a JSON object",
                         path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || zpp_st_dtype_parse(dt->valuestring, &t->dtype) != ZPP_OK)
        return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': tensor '%s' has an unknown dtype "
                                         "'%s'; the format's are BF16, F16, F32, ... (its README)",
                         path, name, cJSON_IsString(dt) ? dt->valuestring : "(not a string)");
    const int ndim = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
    if (ndim < 0 || ndim > ZPP_ST_MAX_DIMS)
        return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': tensor '%s' has a shape that is "
                                         "%s",
                         path, name, ndim < 0 ? "not an array" : "of more than 8 dimensions");
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        size_t d;
        if (!json_count(cJSON_GetArrayItem(sh, i), &d))
            return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': tensor '%s' has a shape whose "
                                             "dimension %d is not a non-negative integer",
                             path, name, i);
        t->shape[i] = (int64_t)d;
    }
    const size_t es = zpp_st_dtype_size(t->dtype);
    if (!shape_numel(t->shape, ndim, es, &t->numel))
        return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': tensor '%s' has a shape too large "
                                         "to address", path, name);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_count(cJSON_GetArrayItem(off, 0), &t->begin) ||
        !json_count(cJSON_GetArrayItem(off, 1), &t->end) || t->end < t->begin)
        return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': tensor '%s' has data_offsets that "
                                         "are not [begin, end] with 0 <= begin <= end",
                         path, name);
    if (t->end - t->begin != t->numel * es)
        return zpp_error(ZPP_ERR_FORMAT,
                         "safetensors file '%s': tensor '%s' spans %zu bytes (data_offsets [%zu, "
                         "%zu]) but its shape and dtype %s need %zu",
                         path, name, t->end - t->begin, t->begin, t->end,
                         zpp_st_dtype_name(t->dtype), t->numel * es);
    t->name = name; /* replaced by a copy once the JSON goes */
    return ZPP_OK;
}

/* "__metadata__": an object of string -> string, copied into f->meta. */
static zpp_status parse_metadata(zpp_st_file *f, const cJSON *m) {
    if (!cJSON_IsObject(m))
        return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': __metadata__ is not a JSON object",
                         f->path);
    const size_t n = (size_t)cJSON_GetArraySize(m);
    if (!(f->meta = calloc(2 * n + 1, sizeof *f->meta)))
        return zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        if (!cJSON_IsString(e))
            return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': __metadata__ '%s' is not a "
                                             "string; the format allows strings only",
                             f->path, e->string);
        char **kv = f->meta + 2 * f->n_meta++;
        if (!(kv[0] = strdup(e->string)) || !(kv[1] = strdup(e->valuestring)))
            return zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
    }
    return ZPP_OK;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const zpp_st_tensor *)a)->name, ((const zpp_st_tensor *)b)->name);
}

static int by_offset(const void *a, const void *b) {
    const zpp_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The layout rules: names unique, and the tensors, sorted by offset, tile
 * [0, buffer) exactly. Leaves f->tensors sorted by offset. */
static zpp_status check_layout(zpp_st_file *f, size_t buffer) {
    zpp_st_tensor *t = f->tensors;
    const size_t n = f->n_tensors;
    qsort(t, n, sizeof *t, by_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(t[i - 1].name, t[i].name))
            return zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': duplicate tensor name '%s'",
                             f->path, t[i].name);
    for (size_t i = 0; i < n; i++)
        if (t[i].end > buffer)
            return zpp_error(ZPP_ERR_FORMAT,
                             "safetensors file '%s': tensor '%s' ends at byte %zu, out of the "
                             "%zu-byte buffer: the file is truncated or damaged",
                             f->path, t[i].name, t[i].end, buffer);
    qsort(t, n, sizeof *t, by_offset);
    size_t at = 0; /* where the next tensor must begin */
    for (size_t i = 0; i < n; i++) {
        if (t[i].begin < at)
            return zpp_error(ZPP_ERR_FORMAT,
                             "safetensors file '%s': tensor '%s' (bytes [%zu, %zu)) overlaps "
                             "tensor '%s', which ends at %zu",
                             f->path, t[i].name, t[i].begin, t[i].end, t[i - 1].name, at);
        if (t[i].begin > at)
            return zpp_error(ZPP_ERR_FORMAT,
                             "safetensors file '%s': a hole of bytes [%zu, %zu) before tensor "
                             "'%s'; the format requires the buffer to be fully indexed",
                             f->path, at, t[i].begin, t[i].name);
        at = t[i].end;
    }
    if (at != buffer)
        return zpp_error(ZPP_ERR_FORMAT,
                         "safetensors file '%s': a hole of bytes [%zu, %zu) after the last "
                         "tensor; the format requires the buffer to be fully indexed",
                         f->path, at, buffer);
    return ZPP_OK;
}

/* The header's JSON text (N bytes, spaces allowed after the object): every
 * entry parsed into f, then the layout checked against a buffer of `buffer`
 * bytes. */
static zpp_status parse_header(zpp_st_file *f, const char *text, size_t n, size_t buffer) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    zpp_status st = ZPP_OK;
    if (!cJSON_IsObject(j)) {
        st = zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': its header is not a JSON object",
                       f->path);
        goto out;
    }
    for (const char *p = end; p < text + n; p++)
        if (*p != ' ') {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "safetensors file '%s': byte %zu of its header follows the JSON object "
                           "and is not a space (the only padding allowed)",
                           f->path, (size_t)(p - text));
            goto out;
        }
    const size_t entries = (size_t)cJSON_GetArraySize(j);
    if (!(f->tensors = calloc(entries + 1, sizeof *f->tensors))) {
        st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        goto out;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!strcmp(e->string, "__metadata__")) {
            if (f->meta) {
                st = zpp_error(ZPP_ERR_FORMAT, "safetensors file '%s': duplicate __metadata__",
                               f->path);
                goto out;
            }
            ZPP_CHECK_GOTO(parse_metadata(f, e), st, out);
            continue;
        }
        ZPP_CHECK_GOTO(parse_tensor(f->path, e, &f->tensors[f->n_tensors]), st, out);
        f->n_tensors++;
    }
    ZPP_CHECK_GOTO(check_layout(f, buffer), st, out);
    for (size_t i = 0; i < f->n_tensors; i++) /* the names outlive the JSON */
        if (!(f->tensors[i].name = strdup(f->tensors[i].name))) {
            while (i-- > 0) free((char *)f->tensors[i].name);
            f->n_tensors = 0;
            st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
            goto out;
        }
out:
    if (st != ZPP_OK) f->n_tensors = 0; /* the names still point into the JSON */
    cJSON_Delete(j);
    return st;
}

/* The first 8 bytes (N) and the header, checked, into f. */
static zpp_status read_header(zpp_st_file *f, size_t len) {
    uint8_t b[8];
    if (len < 8)
        return zpp_error(ZPP_ERR_FORMAT, "'%s' is not a safetensors file: %zu bytes, shorter than "
                                         "the 8-byte header length",
                         f->path, len);
    ZPP_CHECK(zpp_pread_all(f->fd, f->path, b, 8, 0));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    if (n > ZPP_ST_MAX_HEADER || n > len - 8)
        return zpp_error(ZPP_ERR_FORMAT,
                         "'%s' is not a safetensors file: its header length %llu is %s", f->path,
                         (unsigned long long)n,
                         n > ZPP_ST_MAX_HEADER ? "over the format's limit of 100000000 bytes"
                                               : "past the end of the file");
    char *text = malloc(n + 1);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
    zpp_status st = zpp_pread_all(f->fd, f->path, text, n, 8);
    text[n] = 0;
    f->data_start = 8 + (size_t)n;
    if (st == ZPP_OK) st = parse_header(f, text, n, len - f->data_start);
    free(text);
    return st;
}

zpp_status zpp_st_open(const char *path, zpp_st_file **file_p) {
    if (!path || !file_p) return zpp_error(ZPP_ERR_INVALID, "zpp_st_open: NULL argument");
    int fd = -1;
    struct stat sb;
    ZPP_CHECK(zpp_open_regular(path, "safetensors file", &fd, &sb));
    zpp_status st = ZPP_OK;
    zpp_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        close(fd);
        return zpp_error(ZPP_ERR_NOMEM, "zpp_st_open: out of memory");
    }
    f->fd = fd;
    ZPP_CHECK_GOTO(read_header(f, (size_t)sb.st_size), st, out);
    *file_p = f;
out:
    if (st != ZPP_OK) zpp_st_close(f);
    return st;
}

void zpp_st_close(zpp_st_file *f) {
    if (!f) return;
    close(f->fd);
    for (size_t i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    for (size_t i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->tensors);
    free(f->meta);
    free(f->path);
    free(f);
}

size_t zpp_st_count(const zpp_st_file *f) { return f->n_tensors; }

const zpp_st_tensor *zpp_st_tensor_at(const zpp_st_file *f, size_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const zpp_st_tensor *zpp_st_find(const zpp_st_file *f, const char *name) {
    for (size_t i = 0; i < f->n_tensors; i++) /* a model has hundreds: a scan is enough */
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *zpp_st_metadata(const zpp_st_file *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

const char *zpp_st_path(const zpp_st_file *f) { return f->path; }

/* ---- Reading: the bytes -------------------------------------------------------- */

zpp_status zpp_st_read(zpp_st_file *f, const zpp_st_tensor *t, size_t offset, size_t n,
                       void *out) {
    if (!f || !t || (n && !out)) return zpp_error(ZPP_ERR_INVALID, "zpp_st_read: NULL argument");
    const size_t bytes = t->end - t->begin;
    if (offset > bytes || n > bytes - offset)
        return zpp_error(ZPP_ERR_INVALID,
                         "zpp_st_read: bytes [%zu, +%zu) are outside tensor '%s' of %zu bytes",
                         offset, n, t->name, bytes);
    return zpp_pread_all(f->fd, f->path, out, n, f->data_start + t->begin + offset);
}

zpp_status zpp_st_read_f32(zpp_st_file *f, const zpp_st_tensor *t, size_t first, size_t count,
                           float *out) {
    if (!f || !t || (count && !out))
        return zpp_error(ZPP_ERR_INVALID, "zpp_st_read_f32: NULL argument");
    if (first > t->numel || count > t->numel - first)
        return zpp_error(ZPP_ERR_INVALID,
                         "zpp_st_read_f32: elements [%zu, +%zu) are outside tensor '%s' of %zu",
                         first, count, t->name, t->numel);
    if (t->dtype == ZPP_ST_F32) /* little-endian fp32, as this host */
        return zpp_st_read(f, t, 4 * first, 4 * count, out);
    if (t->dtype != ZPP_ST_BF16 && t->dtype != ZPP_ST_F16)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "safetensors file '%s': tensor '%s' is %s; only BF16, F16 and F32 "
                         "tensors convert to fp32",
                         f->path, t->name, zpp_st_dtype_name(t->dtype));
    /* One read for the whole range, into the upper half of out, widened
     * front to back in place: writing out[i] (bytes [4i, 4i + 4)) touches
     * only 16-bit elements j <= i (at bytes 2 count + 2 j), already read. */
    const zpp_dtype from = t->dtype == ZPP_ST_BF16 ? ZPP_BF16 : ZPP_FP16;
    unsigned char *half = (unsigned char *)out + 2 * count;
    ZPP_CHECK(zpp_st_read(f, t, 2 * first, 2 * count, half));
    for (size_t i = 0; i < count; i++) {
        uint16_t h;
        memcpy(&h, half + 2 * i, 2);
        out[i] = zpp_load_f32(&h, from, 0);
    }
    return ZPP_OK;
}

/* ---- Writing ------------------------------------------------------------------- */

/* A file appearing whole or not at all: PATH.tmp.<pid>, synced, renamed. */
typedef struct st_out {
    FILE *fp;
    const char *path;
    char *tmp;
} st_out;

static zpp_status out_create(st_out *o, const char *path) {
    const size_t n = strlen(path) + 32;
    o->path = path;
    o->fp = NULL;
    if (!(o->tmp = malloc(n))) return zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
    snprintf(o->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    const int fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0 || !(o->fp = fdopen(fd, "wb"))) {
        const int e = errno;
        if (fd >= 0) close(fd), remove(o->tmp);
        zpp_status st = zpp_error(ZPP_ERR_IO, "cannot write '%s' (a temporary file for '%s'): %s",
                                  o->tmp, path, strerror(e));
        free(o->tmp);
        o->tmp = NULL;
        return st;
    }
    return ZPP_OK;
}

static zpp_status out_write(st_out *o, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, o->fp) != n)
        return zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", o->tmp, strerror(errno));
    return ZPP_OK;
}

/* Syncs and renames into place when `st` is ZPP_OK, else removes the
 * temporary file; returns the first failure. */
static zpp_status out_finish(st_out *o, zpp_status st) {
    if (!o->tmp) return st;
    int ok = fflush(o->fp) == 0 && fsync(fileno(o->fp)) == 0;
    int e = errno;
    if (fclose(o->fp) != 0 && ok) ok = 0, e = errno;
    if (st == ZPP_OK && ok && rename(o->tmp, o->path) != 0) ok = 0, e = errno;
    if (st == ZPP_OK && !ok)
        st = zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", o->path, strerror(e));
    if (st != ZPP_OK) remove(o->tmp);
    free(o->tmp);
    o->tmp = NULL;
    return st;
}

/* The bytes of tensor s, whose shape is checked. */
static size_t source_bytes(const zpp_st_source *s) {
    size_t numel = 0;
    shape_numel(s->shape, s->ndim, zpp_st_dtype_size(s->dtype), &numel);
    return numel * zpp_st_dtype_size(s->dtype);
}

/* Each source well formed: a name, a dtype, a shape, bytes to write. */
static zpp_status check_sources(const zpp_st_source *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *name = s[i].name;
        if (!name || !*name || !strcmp(name, "__metadata__"))
            return zpp_error(ZPP_ERR_INVALID, "safetensors: tensor %zu is named '%s'; give each "
                                              "tensor a name other than __metadata__",
                             i, name ? name : "");
        if (!zpp_st_dtype_size(s[i].dtype) || s[i].ndim < 0 || s[i].ndim > ZPP_ST_MAX_DIMS ||
            (!s[i].data && !s[i].fill))
            return zpp_error(ZPP_ERR_INVALID, "safetensors: tensor '%s' has a bad dtype (%d), "
                                              "ndim (%d) or neither data nor fill",
                             name, (int)s[i].dtype, s[i].ndim);
        size_t numel;
        for (int d = 0; d < s[i].ndim; d++)
            if (s[i].shape[d] < 0 || (double)s[i].shape[d] > ST_MAX_JSON_INT)
                return zpp_error(ZPP_ERR_INVALID, "safetensors: tensor '%s' has dimension %d of "
                                                  "%lld",
                                 name, d, (long long)s[i].shape[d]);
        if (!shape_numel(s[i].shape, s[i].ndim, zpp_st_dtype_size(s[i].dtype), &numel))
            return zpp_error(ZPP_ERR_INVALID, "safetensors: tensor '%s' is too large", name);
    }
    return ZPP_OK;
}

static int by_source_name(const void *a, const void *b) {
    return strcmp((*(const zpp_st_source *const *)a)->name,
                  (*(const zpp_st_source *const *)b)->name);
}

/* A JSON array of integers printed exactly: cJSON prints numbers past
 * 2^31 with 15 significant digits, which is not exact from 10^15 on. */
static cJSON *int_array(const uint64_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        char s[24];
        snprintf(s, sizeof s, "%llu", (unsigned long long)v[i]);
        cJSON *x = cJSON_CreateRaw(s);
        if (!x || !cJSON_AddItemToArray(a, x)) cJSON_Delete(x), cJSON_Delete(a), a = NULL;
    }
    return a;
}

/* The header's text: {"__metadata__":{"format":"pt"}, then each tensor in
 * `order` with its offsets}, padded with spaces to a multiple of 8 bytes so
 * the buffer (after the 8-byte length) starts 8-aligned. */
static zpp_status header_text(const zpp_st_source *const *order, size_t n, char **text_p,
                              size_t *len_p) {
    cJSON *j = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    zpp_status st = ZPP_ERR_NOMEM;
    if (!j || !meta || !cJSON_AddStringToObject(meta, "format", "pt") ||
        !cJSON_AddItemToObject(j, "__metadata__", meta)) {
        cJSON_Delete(meta);
        goto out;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const zpp_st_source *s = order[i];
        const size_t bytes = source_bytes(s);
        uint64_t shape[ZPP_ST_MAX_DIMS], offsets[2] = {at, at + bytes};
        for (int d = 0; d < s->ndim; d++) shape[d] = (uint64_t)s->shape[d];
        cJSON *e = cJSON_CreateObject(), *sh = int_array(shape, s->ndim);
        cJSON *off = int_array(offsets, 2);
        const int made = e && sh && off && cJSON_AddStringToObject(e, "dtype",
                                                                   zpp_st_dtype_name(s->dtype));
        if (!made || !cJSON_AddItemToObject(e, "shape", sh)) cJSON_Delete(sh), sh = NULL;
        if (!made || !sh || !cJSON_AddItemToObject(e, "data_offsets", off))
            cJSON_Delete(off), off = NULL;
        if (!off || !cJSON_AddItemToObject(j, s->name, e)) {
            cJSON_Delete(e);
            goto out;
        }
        at += bytes;
    }
    char *raw = cJSON_PrintUnformatted(j);
    if (!raw) goto out;
    const size_t len = strlen(raw), padded = (len + 7) / 8 * 8;
    char *text = malloc(padded);
    if (text) {
        memcpy(text, raw, len);
        memset(text + len, ' ', padded - len);
        *text_p = text, *len_p = padded;
        st = ZPP_OK;
    }
    cJSON_free(raw);
out:
    cJSON_Delete(j);
    return st == ZPP_OK ? st : zpp_error(st, "safetensors: out of memory building the header");
}

/* The bytes of tensor s, from its data or its fill in chunks. */
static zpp_status write_tensor(st_out *o, const zpp_st_source *s, void *stage) {
    const size_t bytes = source_bytes(s);
    if (s->data) return out_write(o, s->data, bytes);
    for (size_t at = 0; at < bytes; at += ZPP_ST_FILL_CHUNK) {
        const size_t k = bytes - at < ZPP_ST_FILL_CHUNK ? bytes - at : ZPP_ST_FILL_CHUNK;
        ZPP_CHECK(s->fill(s->ctx, at, k, stage));
        ZPP_CHECK(out_write(o, stage, k));
    }
    return ZPP_OK;
}

/* One file of tensors[0, n), checked by the caller: sorted by name, the
 * header, then the bytes in the header's order. */
static zpp_status write_file(const char *path, const zpp_st_source *tensors, size_t n) {
    const zpp_st_source **order = malloc((n + 1) * sizeof *order);
    void *stage = malloc(ZPP_ST_FILL_CHUNK);
    char *text = NULL;
    size_t len = 0;
    st_out o = {0};
    zpp_status st = ZPP_OK;
    if (!order || !stage) {
        st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) order[i] = &tensors[i];
    qsort(order, n, sizeof *order, by_source_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(order[i - 1]->name, order[i]->name)) {
            st = zpp_error(ZPP_ERR_INVALID, "safetensors: tensor '%s' is given twice",
                           order[i]->name);
            goto out;
        }
    ZPP_CHECK_GOTO(header_text(order, n, &text, &len), st, out);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)len >> (8 * i));
    ZPP_CHECK_GOTO(out_create(&o, path), st, out);
    st = out_write(&o, le, 8);
    if (st == ZPP_OK) st = out_write(&o, text, len);
    for (size_t i = 0; i < n && st == ZPP_OK; i++) st = write_tensor(&o, order[i], stage);
    st = out_finish(&o, st);
out:
    free(text);
    free(stage);
    free(order);
    return st;
}

zpp_status zpp_st_write(const char *path, const zpp_st_source *tensors, size_t n) {
    if (!path || (n && !tensors)) return zpp_error(ZPP_ERR_INVALID, "zpp_st_write: NULL argument");
    ZPP_CHECK(check_sources(tensors, n));
    return write_file(path, tensors, n);
}

/* ---- Sharded writing ----------------------------------------------------------- */

/* `dir`/`name` into a fresh string, or NULL. */
static char *join(const char *dir, const char *name) {
    const size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* The shard each tensor goes to, filling shards in the order given: a
 * tensor starts a new shard when it would take the current one past `limit`
 * (as transformers' split_torch_state_dict_into_shards), and one larger
 * than the limit has a shard of its own. Returns the count. */
static int assign_shards(const zpp_st_source *s, size_t n, size_t limit, int *shard) {
    int k = 0, held = 0, closed = 0; /* the current shard: tensors, and full */
    size_t used = 0;                 /* and its bytes */
    for (size_t i = 0; i < n; i++) {
        const size_t b = source_bytes(&s[i]);
        const int alone = b > limit;
        if (held > 0 && (closed || alone || b > limit - used)) k++, used = 0, held = 0;
        shard[i] = k;
        used += b, held++;
        closed = alone; /* nothing joins a tensor past the limit */
    }
    return n ? k + 1 : 1;
}

/* model.safetensors.index.json: total_size and the weight map, sorted by
 * tensor name (cJSON keeps insertion order; `files` is by tensor). */
static zpp_status write_index(const char *dir, const zpp_st_source *s, size_t n, char **files,
                              const int *shard) {
    cJSON *j = cJSON_CreateObject(), *meta = NULL, *map = NULL;
    const zpp_st_source **order = malloc((n + 1) * sizeof *order);
    char *text = NULL, *path = join(dir, ZPP_ST_INDEX_NAME);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += source_bytes(&s[i]);
    char total_text[24];
    snprintf(total_text, sizeof total_text, "%zu", total);
    zpp_status st = ZPP_OK;
    if (!j || !order || !path || !(meta = cJSON_AddObjectToObject(j, "metadata")) ||
        !cJSON_AddRawToObject(meta, "total_size", total_text) || /* exact, as int_array */
        !(map = cJSON_AddObjectToObject(j, "weight_map"))) {
        st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) order[i] = &s[i];
    qsort(order, n, sizeof *order, by_source_name);
    for (size_t i = 0; i < n; i++)
        if (!cJSON_AddStringToObject(map, order[i]->name, files[shard[order[i] - s]])) {
            st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
            goto out;
        }
    if (!(text = cJSON_Print(j))) {
        st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        goto out;
    }
    st_out o = {0};
    ZPP_CHECK_GOTO(out_create(&o, path), st, out);
    st = out_write(&o, text, strlen(text));
    if (st == ZPP_OK) st = out_write(&o, "\n", 1);
    st = out_finish(&o, st);
out:
    cJSON_free(text);
    cJSON_Delete(j);
    free(order);
    free(path);
    return st;
}

/* Shard k's tensors, in the order given, into one file. */
static zpp_status write_shard(const char *path, const zpp_st_source *s, size_t n,
                              const int *shard, int k) {
    zpp_st_source *mine = malloc((n + 1) * sizeof *mine);
    if (!mine) return zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (shard[i] == k) mine[m++] = s[i];
    zpp_status st = write_file(path, mine, m);
    free(mine);
    return st;
}

zpp_status zpp_st_write_dir(const char *dir, const zpp_st_source *tensors, size_t n,
                            size_t max_shard_bytes, int *shards_p) {
    if (!dir || (n && !tensors))
        return zpp_error(ZPP_ERR_INVALID, "zpp_st_write_dir: NULL argument");
    ZPP_CHECK(check_sources(tensors, n));
    int *shard = calloc(n + 1, sizeof *shard);
    char **files = NULL, *path = NULL;
    zpp_status st = ZPP_OK;
    if (!shard) return zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
    const int shards = assign_shards(tensors, n, max_shard_bytes ? max_shard_bytes : SIZE_MAX,
                                     shard);
    if (shards == 1) { /* one file, no index */
        if (!(path = join(dir, ZPP_ST_SINGLE_NAME)))
            st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        else
            st = write_file(path, tensors, n);
        goto out;
    }
    if (!(files = calloc((size_t)shards, sizeof *files))) {
        st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        goto out;
    }
    for (int k = 0; k < shards && st == ZPP_OK; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
        free(path);
        path = NULL;
        if (!(files[k] = strdup(name)) || !(path = join(dir, name)))
            st = zpp_error(ZPP_ERR_NOMEM, "safetensors: out of memory");
        else
            st = write_shard(path, tensors, n, shard, k);
    }
    if (st == ZPP_OK) st = write_index(dir, tensors, n, files, shard); /* last: it names them */
out:
    for (int k = 0; files && k < shards; k++) free(files[k]);
    free(files);
    free(path);
    free(shard);
    if (st == ZPP_OK && shards_p) *shards_p = shards;
    return st;
}

/* ---- Sharded checkpoints: the index -------------------------------------------- */

#define INDEX_MAX_BYTES (256u << 20) /* a 400B model's index is a few MB */

struct zpp_st_index {
    char *path;
    size_t n;            /* tensors */
    char **names, **map; /* tensor names[i] is in file map[i]; sorted by name */
    size_t n_files;
    char **files; /* the distinct map[i], sorted (pointers into map[]) */
    size_t total_size;
};

/* The whole of a small text file, NUL-terminated. */
static zpp_status slurp(const char *path, const char *what, size_t max, char **text_p) {
    FILE *f = NULL;
    ZPP_CHECK(zpp_fopen_regular(path, what, &f));
    char *text = malloc(max + 1);
    const size_t n = text ? fread(text, 1, max + 1, f) : 0;
    const int err = ferror(f);
    fclose(f);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "%s: out of memory", what);
    if (err || n > max) {
        free(text);
        return zpp_error(err ? ZPP_ERR_IO : ZPP_ERR_FORMAT, "cannot read %s '%s'%s", what, path,
                         err ? "" : ": larger than the limit");
    }
    text[n] = 0;
    *text_p = text;
    return ZPP_OK;
}

static int by_string(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The weight map's entries into x (names and file names, each checked). */
static zpp_status index_entries(zpp_st_index *x, const cJSON *map) {
    const size_t n = (size_t)cJSON_GetArraySize(map);
    x->names = calloc(n + 1, sizeof *x->names);
    x->map = calloc(n + 1, sizeof *x->map);
    x->files = calloc(n + 1, sizeof *x->files);
    if (!x->names || !x->map || !x->files)
        return zpp_error(ZPP_ERR_NOMEM, "safetensors index: out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        const char *file = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!file || !*file || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
            return zpp_error(ZPP_ERR_FORMAT, "safetensors index '%s': weight_map['%s'] is not the "
                                             "name of a file beside the index",
                             x->path, e->string);
        x->names[x->n] = strdup(e->string);
        x->map[x->n] = strdup(file);
        if (!x->names[x->n++] || !x->map[x->n - 1])
            return zpp_error(ZPP_ERR_NOMEM, "safetensors index: out of memory");
    }
    return ZPP_OK;
}

/* Sorts the entries by name, refusing duplicates, and lists the distinct
 * files (files[] points into map[]). */
static zpp_status index_sort(zpp_st_index *x) {
    const size_t n = x->n;
    char **pairs = malloc((2 * n + 1) * sizeof *pairs); /* name, file, name, file, ... */
    if (!pairs) return zpp_error(ZPP_ERR_NOMEM, "safetensors index: out of memory");
    for (size_t i = 0; i < n; i++) pairs[2 * i] = x->names[i], pairs[2 * i + 1] = x->map[i];
    qsort(pairs, n, 2 * sizeof *pairs, by_string); /* on the name, the first of each pair */
    for (size_t i = 0; i < n; i++) x->names[i] = pairs[2 * i], x->map[i] = pairs[2 * i + 1];
    free(pairs);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(x->names[i - 1], x->names[i]))
            return zpp_error(ZPP_ERR_FORMAT, "safetensors index '%s': duplicate tensor name '%s'",
                             x->path, x->names[i]);
    for (size_t i = 0; i < n; i++) x->files[i] = x->map[i];
    qsort(x->files, n, sizeof *x->files, by_string);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!k || strcmp(x->files[k - 1], x->files[i])) x->files[k++] = x->files[i];
    x->n_files = k;
    return ZPP_OK;
}

void zpp_st_index_close(zpp_st_index *x) {
    if (!x) return;
    for (size_t i = 0; i < x->n; i++) free(x->names[i]), free(x->map[i]);
    free(x->names);
    free(x->map);
    free(x->files);
    free(x->path);
    free(x);
}

zpp_status zpp_st_index_open(const char *path, zpp_st_index **index_p) {
    if (!path || !index_p) return zpp_error(ZPP_ERR_INVALID, "zpp_st_index_open: NULL argument");
    char *text = NULL;
    ZPP_CHECK(slurp(path, "safetensors index", INDEX_MAX_BYTES, &text));
    cJSON *j = cJSON_Parse(text);
    free(text);
    zpp_st_index *x = calloc(1, sizeof *x);
    zpp_status st = ZPP_OK;
    if (!x || !(x->path = strdup(path))) {
        st = zpp_error(ZPP_ERR_NOMEM, "safetensors index: out of memory");
        goto out;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "metadata");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(meta, "total_size");
    if (!cJSON_IsObject(j) || !cJSON_IsObject(map)) {
        st = zpp_error(ZPP_ERR_FORMAT, "safetensors index '%s' is not a JSON object with a "
                                       "\"weight_map\" object",
                       path);
        goto out;
    }
    if (total && !json_count(total, &x->total_size)) {
        st = zpp_error(ZPP_ERR_FORMAT, "safetensors index '%s': metadata.total_size is not a "
                                       "byte count",
                       path);
        goto out;
    }
    ZPP_CHECK_GOTO(index_entries(x, map), st, out);
    ZPP_CHECK_GOTO(index_sort(x), st, out);
    *index_p = x;
out:
    cJSON_Delete(j);
    if (st != ZPP_OK) zpp_st_index_close(x);
    return st;
}

const char *zpp_st_index_find(const zpp_st_index *x, const char *name) {
    for (size_t lo = 0, hi = x->n; lo < hi;) { /* names[] is sorted */
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(name, x->names[mid]);
        if (!c) return x->map[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

size_t zpp_st_index_count(const zpp_st_index *x) { return x->n; }
size_t zpp_st_index_files(const zpp_st_index *x) { return x->n_files; }
const char *zpp_st_index_file(const zpp_st_index *x, size_t i) {
    return i < x->n_files ? x->files[i] : NULL;
}
size_t zpp_st_index_total_size(const zpp_st_index *x) { return x->total_size; }

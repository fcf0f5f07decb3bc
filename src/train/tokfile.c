/* train/tokfile.c — see tokfile.h. */
#include "train/tokfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "train/data.h"

struct zpp_tokfile {
    FILE *f;
    char *path, *tmp;
    size_t count;
    int failed;
};

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void zpp_tokfile_abort(zpp_tokfile *f) {
    if (!f) return;
    if (f->f) fclose(f->f);
    if (f->tmp) remove(f->tmp);
    free(f->path);
    free(f->tmp);
    free(f);
}

zpp_status zpp_tokfile_open(const char *path, zpp_tokfile **f_p) {
    if (!path || !*path || !f_p) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_create: no path");
    zpp_tokfile *f = calloc(1, sizeof *f);
    const size_t n = strlen(path) + 32;
    if (f) f->path = strdup(path), f->tmp = malloc(n);
    if (!f || !f->path || !f->tmp) {
        zpp_tokfile_abort(f);
        return zpp_error(ZPP_ERR_NOMEM, "token file: out of memory");
    }
    snprintf(f->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    const int fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0 || !(f->f = fdopen(fd, "wb"))) {
        const int e = errno;
        if (fd >= 0) close(fd);
        zpp_status st = zpp_error(ZPP_ERR_IO, "cannot write '%s' (a temporary file for '%s'): %s",
                                  f->tmp, path, strerror(e));
        free(f->tmp); /* never made: nothing to remove */
        f->tmp = NULL;
        zpp_tokfile_abort(f);
        return st;
    }
    /* The header's place; its count is known at the end. */
    uint8_t header[4 * ZPP_DATA_LLMC_HEADER_INTS] = {0};
    if (fwrite(header, 1, sizeof header, f->f) != sizeof header) {
        zpp_status st = zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", f->tmp, strerror(errno));
        zpp_tokfile_abort(f);
        return st;
    }
    *f_p = f;
    return ZPP_OK;
}

zpp_status zpp_tokfile_append(zpp_tokfile *f, const int32_t *ids, size_t n) {
    if (!f || (n && !ids)) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_append: NULL argument");
    if (f->failed) return zpp_error(ZPP_ERR_STATE, "token file '%s': an append failed", f->path);
    if (n > (size_t)INT32_MAX - f->count) {
        f->failed = 1;
        return zpp_error(ZPP_ERR_INVALID,
                         "token file '%s': more than %d tokens, the most an llm.c token file's "
                         "int32 count holds; split the text into several files",
                         f->path, INT32_MAX);
    }
    uint8_t buf[8192];
    for (size_t i = 0; i < n;) {
        size_t m = 0;
        for (; i < n && m < sizeof buf; i++, m += 2) {
            if (ids[i] < 0 || ids[i] > ZPP_TOKFILE_MAX_ID) {
                f->failed = 1;
                return zpp_error(ZPP_ERR_INVALID,
                                 "token file '%s': token %zu is %d; an llm.c token file holds "
                                 "ids 0..%d (uint16)",
                                 f->path, f->count + i, (int)ids[i], ZPP_TOKFILE_MAX_ID);
            }
            buf[m] = (uint8_t)ids[i];
            buf[m + 1] = (uint8_t)(ids[i] >> 8);
        }
        if (fwrite(buf, 1, m, f->f) != m) {
            f->failed = 1;
            return zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", f->tmp, strerror(errno));
        }
    }
    f->count += n;
    return ZPP_OK;
}

zpp_status zpp_tokfile_close(zpp_tokfile *f, size_t *count_p) {
    if (!f) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_finish: NULL file");
    zpp_status st = ZPP_OK;
    if (f->failed) {
        st = zpp_error(ZPP_ERR_STATE, "token file '%s': an append failed", f->path);
        goto out;
    }
    if (!f->count) {
        st = zpp_error(ZPP_ERR_INVALID, "token file '%s': no tokens to write", f->path);
        goto out;
    }
    uint8_t h[12];
    put32(h, ZPP_DATA_LLMC_MAGIC);
    put32(h + 4, ZPP_DATA_LLMC_VERSION);
    put32(h + 8, (uint32_t)f->count);
    int ok = fflush(f->f) == 0 && fseek(f->f, 0, SEEK_SET) == 0 &&
             fwrite(h, 1, sizeof h, f->f) == sizeof h && fflush(f->f) == 0 &&
             fsync(fileno(f->f)) == 0;
    int e = errno;
    if (fclose(f->f) != 0 && ok) ok = 0, e = errno;
    f->f = NULL;
    if (ok && rename(f->tmp, f->path) != 0) ok = 0, e = errno;
    if (!ok) {
        st = zpp_error(ZPP_ERR_IO, "cannot write token file '%s': %s", f->path, strerror(e));
        goto out;
    }
    if (count_p) *count_p = f->count;
    free(f->tmp);
    f->tmp = NULL; /* the file is in place: nothing for abort to remove */
out:
    zpp_tokfile_abort(f); /* frees f (and on failure removes the temporary file) */
    return st;
}

/* ---- The tokenizer note ---------------------------------------------------- */

#define NOTE_KIND "gpt2-bpe"
#define NOTE_MAX_BYTES (1 << 20) /* a note is a few hundred bytes */

zpp_status zpp_tokfile_note_path(const char *bin_path, char *buf, size_t cap) {
    if (!bin_path || !*bin_path)
        return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_note_path: no path");
    const int n = snprintf(buf, cap, "%s.json", bin_path);
    if (n < 0 || (size_t)n >= cap)
        return zpp_error(ZPP_ERR_INVALID, "token file path '%s' is too long", bin_path);
    return ZPP_OK;
}

void zpp_tokfile_note_free(zpp_tokfile_note *note) {
    if (!note) return;
    free(note->vocab);
    free(note->merges);
    memset(note, 0, sizeof *note);
}

zpp_status zpp_tokfile_note_write(const char *bin_path, const zpp_tokfile_note *note) {
    char path[4096], tmp[4096 + 32];
    if (!note || !note->vocab || !note->merges)
        return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_note_write: no tokenizer files");
    ZPP_CHECK(zpp_tokfile_note_path(bin_path, path, sizeof path));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    cJSON *j = cJSON_CreateObject();
    char *text = NULL;
    if (j && cJSON_AddStringToObject(j, "tokenizer", NOTE_KIND) &&
        cJSON_AddStringToObject(j, "vocab", note->vocab) &&
        cJSON_AddStringToObject(j, "merges", note->merges) &&
        cJSON_AddNumberToObject(j, "vocab_size", (double)note->vocab_size) &&
        cJSON_AddNumberToObject(j, "tokens", (double)note->tokens))
        text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "token file note: out of memory");
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 &&
             fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    cJSON_free(text);
    if (!ok) {
        if (f) remove(tmp);
        return zpp_error(ZPP_ERR_IO, "cannot write the tokenizer note '%s': %s", path,
                         strerror(e));
    }
    return ZPP_OK;
}

/* The token count in the header of the llm.c token file `path`, or -1 when
 * it is not one (or cannot be read). */
static long long header_count(const char *path) {
    FILE *f = NULL;
    if (zpp_fopen_regular(path, "data", &f) != ZPP_OK) return -1;
    uint8_t h[12];
    const size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    if (n != sizeof h) return -1;
    uint32_t v[3];
    for (int k = 0; k < 3; k++)
        v[k] = (uint32_t)h[4 * k] | (uint32_t)h[4 * k + 1] << 8 | (uint32_t)h[4 * k + 2] << 16 |
               (uint32_t)h[4 * k + 3] << 24;
    if (v[0] != ZPP_DATA_LLMC_MAGIC || v[1] != ZPP_DATA_LLMC_VERSION) return -1;
    return (long long)v[2];
}

static zpp_status note_string(const cJSON *j, const char *key, const char *path, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return zpp_error(ZPP_ERR_FORMAT, "tokenizer note '%s': \"%s\" is not a file name", path,
                         key);
    if (!(*out = strdup(v->valuestring)))
        return zpp_error(ZPP_ERR_NOMEM, "token file note: out of memory");
    return ZPP_OK;
}

static zpp_status note_count(const cJSON *j, const char *key, const char *path, double hi,
                             double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= hi) ||
        v->valuedouble != (double)(long long)v->valuedouble)
        return zpp_error(ZPP_ERR_FORMAT, "tokenizer note '%s': \"%s\" is not a count in 1..%.0f",
                         path, key, hi);
    *out = v->valuedouble;
    return ZPP_OK;
}

zpp_status zpp_tokfile_note_read(const char *bin_path, zpp_tokfile_note *note, int *found_p) {
    char path[4096];
    if (!note || !found_p) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_note_read: NULL output");
    memset(note, 0, sizeof *note);
    *found_p = 0;
    ZPP_CHECK(zpp_tokfile_note_path(bin_path, path, sizeof path));
    if (access(path, F_OK) != 0) return ZPP_OK; /* none */
    FILE *f = NULL;
    ZPP_CHECK(zpp_fopen_regular(path, "tokenizer note", &f));
    char *text = malloc(NOTE_MAX_BYTES + 1);
    size_t n = text ? fread(text, 1, NOTE_MAX_BYTES + 1, f) : 0;
    const int err = ferror(f);
    fclose(f);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "token file note: out of memory");
    if (err || n > NOTE_MAX_BYTES) {
        free(text);
        return zpp_error(err ? ZPP_ERR_IO : ZPP_ERR_FORMAT, "cannot read tokenizer note '%s'%s",
                         path, err ? "" : ": larger than 1 MiB");
    }
    text[n] = 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    zpp_status st = ZPP_OK;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "tokenizer");
    double vocab_size = 0, tokens = 0;
    long long have = 0;
    if (!cJSON_IsObject(j)) {
        st = zpp_error(ZPP_ERR_FORMAT, "tokenizer note '%s' is not a JSON object", path);
        goto out;
    }
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, NOTE_KIND)) {
        st = zpp_error(ZPP_ERR_FORMAT, "tokenizer note '%s': \"tokenizer\" is not \"%s\"",
                       path, NOTE_KIND);
        goto out;
    }
    ZPP_CHECK_GOTO(note_string(j, "vocab", path, &note->vocab), st, out);
    ZPP_CHECK_GOTO(note_string(j, "merges", path, &note->merges), st, out);
    ZPP_CHECK_GOTO(note_count(j, "vocab_size", path, ZPP_TOKFILE_MAX_ID + 1, &vocab_size), st, out);
    ZPP_CHECK_GOTO(note_count(j, "tokens", path, (double)INT32_MAX, &tokens), st, out);
    have = header_count(bin_path);
    if (have != (long long)tokens)
        st = zpp_error(ZPP_ERR_FORMAT,
                       "tokenizer note '%s' is stale: it describes a token file of %.0f "
                       "tokens, and '%s' %s since; remove the note, or tokenize again",
                       path, tokens, bin_path,
                       have < 0 ? "is no llm.c token file" : "has been rewritten");
out:
    cJSON_Delete(j);
    if (st != ZPP_OK) {
        zpp_tokfile_note_free(note);
        return st;
    }
    note->vocab_size = (int32_t)vocab_size;
    note->tokens = (size_t)tokens;
    *found_p = 1;
    return ZPP_OK;
}

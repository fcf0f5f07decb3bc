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
    int wide; /* version 2: uint32 tokens (some id is past 65535) */
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
    if (!path || !*path || !f_p) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_open: no path");
    zpp_tokfile *f = calloc(1, sizeof *f);
    const size_t n = strlen(path) + 32;
    if (f) f->path = strdup(path), f->tmp = malloc(n);
    if (!f || !f->path || !f->tmp) {
        zpp_tokfile_abort(f);
        return zpp_error(ZPP_ERR_NOMEM, "token file: out of memory");
    }
    snprintf(f->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    /* (read and write: widen() reads back what was written) */
    const int fd = open(f->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
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

/* n bytes at offset off of fd, read (writing 0) or written (1); 0 or -1
 * with errno set (EIO for a file that ends early). */
static int whole_io(int fd, uint8_t *p, size_t n, off_t off, int writing) {
    while (n > 0) {
        const ssize_t r = writing ? pwrite(fd, p, n, off) : pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;
            return -1;
        }
        p += r, n -= (size_t)r, off += r;
    }
    return 0;
}

/* Turns the file into version 2: the f->count uint16 tokens written so far
 * become uint32, in place. It goes from the back, a chunk at a time: chunk
 * [i0, i0 + m) is read at 1024 + 2 i0 and written at 1024 + 4 i0, which
 * lies past every uint16 token still to be read (they end at 1024 + 2 i0). */
static zpp_status widen(zpp_tokfile *f) {
    enum { CHUNK = 2048 }; /* tokens */
    const off_t header = 4 * ZPP_DATA_LLMC_HEADER_INTS;
    uint8_t in[2 * CHUNK], out[4 * CHUNK];
    int ok = fflush(f->f) == 0;
    const int fd = fileno(f->f);
    for (size_t end = f->count; ok && end > 0;) {
        const size_t m = end < CHUNK ? end : CHUNK, i0 = end - m;
        ok = whole_io(fd, in, 2 * m, header + 2 * (off_t)i0, 0) == 0;
        for (size_t i = 0; ok && i < m; i++)
            out[4 * i] = in[2 * i], out[4 * i + 1] = in[2 * i + 1], out[4 * i + 2] = 0,
                    out[4 * i + 3] = 0;
        ok = ok && whole_io(fd, out, 4 * m, header + 4 * (off_t)i0, 1) == 0;
        end = i0;
    }
    ok = ok && fseek(f->f, 0, SEEK_END) == 0; /* where the next token goes */
    if (!ok) {
        f->failed = 1;
        return zpp_error(ZPP_ERR_IO, "cannot rewrite '%s' with uint32 tokens: %s", f->tmp,
                         strerror(errno));
    }
    f->wide = 1;
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
    /* The first id past uint16 makes the file version 2 (uint32 tokens). */
    for (size_t i = 0; i < n && !f->wide; i++)
        if (ids[i] > ZPP_TOKFILE_MAX_ID) ZPP_CHECK(widen(f));
    const size_t elem = f->wide ? 4 : 2;
    uint8_t buf[8192];
    for (size_t i = 0; i < n;) {
        size_t m = 0;
        for (; i < n && m < sizeof buf; i++, m += elem) {
            if (ids[i] < 0) {
                f->failed = 1;
                return zpp_error(ZPP_ERR_INVALID,
                                 "token file '%s': token %zu is %d; a token file holds ids "
                                 "0..%d",
                                 f->path, f->count + i, (int)ids[i], INT32_MAX);
            }
            for (size_t b = 0; b < elem; b++) buf[m + b] = (uint8_t)((uint32_t)ids[i] >> (8 * b));
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
    if (!f) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_close: NULL file");
    zpp_status st = ZPP_OK;
    if (f->failed) st = zpp_error(ZPP_ERR_STATE, "token file '%s': an append failed", f->path);
    else if (!f->count)
        st = zpp_error(ZPP_ERR_INVALID, "token file '%s': no tokens to write", f->path);
    if (st != ZPP_OK) {
        zpp_tokfile_abort(f);
        return st;
    }
    uint8_t h[12];
    put32(h, ZPP_DATA_LLMC_MAGIC);
    put32(h + 4, f->wide ? ZPP_DATA_LLMC_VERSION_U32 : ZPP_DATA_LLMC_VERSION);
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
        zpp_tokfile_abort(f);
        return st;
    }
    if (count_p) *count_p = f->count;
    free(f->tmp);
    f->tmp = NULL;
    zpp_tokfile_abort(f); /* frees (the file is in place) */
    return ZPP_OK;
}

/* ---- The tokenizer note ---------------------------------------------------- */

#define NOTE_KIND "gpt2-bpe"   /* GPT-2's vocab.json and merges.txt */
#define NOTE_KIND_HF "hf-bpe" /* a Hugging Face tokenizer.json */
/* Past the largest vocabulary the tokenizer takes (bpe.h, ZPP_BPE_MAX_ID). */
#define NOTE_MAX_VOCAB (1 << 24)
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
    free(note->tokenizer_json);
    memset(note, 0, sizeof *note);
}

zpp_status zpp_tokfile_note_write(const char *bin_path, const zpp_tokfile_note *note) {
    char path[4096];
    if (!note || (!note->tokenizer_json && (!note->vocab || !note->merges)))
        return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_note_write: no tokenizer files");
    ZPP_CHECK(zpp_tokfile_note_path(bin_path, path, sizeof path));
    cJSON *j = cJSON_CreateObject();
    char *text = NULL;
    const int hf = note->tokenizer_json != NULL;
    if (j && cJSON_AddStringToObject(j, "tokenizer", hf ? NOTE_KIND_HF : NOTE_KIND) &&
        (hf ? cJSON_AddStringToObject(j, "file", note->tokenizer_json) != NULL
            : cJSON_AddStringToObject(j, "vocab", note->vocab) &&
                  cJSON_AddStringToObject(j, "merges", note->merges)) &&
        cJSON_AddNumberToObject(j, "vocab_size", (double)note->vocab_size) &&
        cJSON_AddNumberToObject(j, "tokens", (double)note->tokens))
        text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "token file note: out of memory");
    const zpp_status st = zpp_write_text_atomic(path, text, "the tokenizer note");
    cJSON_free(text);
    return st;
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
    if (v[0] != ZPP_DATA_LLMC_MAGIC ||
        (v[1] != ZPP_DATA_LLMC_VERSION && v[1] != ZPP_DATA_LLMC_VERSION_U32))
        return -1;
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
    if (!cJSON_IsObject(j))
        st = zpp_error(ZPP_ERR_FORMAT, "tokenizer note '%s' is not a JSON object", path);
    else if (!cJSON_IsString(kind) ||
             (strcmp(kind->valuestring, NOTE_KIND) && strcmp(kind->valuestring, NOTE_KIND_HF)))
        st = zpp_error(ZPP_ERR_FORMAT,
                       "tokenizer note '%s': \"tokenizer\" is not \"%s\" or \"%s\"", path,
                       NOTE_KIND, NOTE_KIND_HF);
    else if (!strcmp(kind->valuestring, NOTE_KIND_HF))
        st = note_string(j, "file", path, &note->tokenizer_json);
    else
        st = note_string(j, "vocab", path, &note->vocab);
    if (st == ZPP_OK && !note->tokenizer_json) st = note_string(j, "merges", path, &note->merges);
    if (st == ZPP_OK) st = note_count(j, "vocab_size", path, NOTE_MAX_VOCAB, &vocab_size);
    if (st == ZPP_OK) st = note_count(j, "tokens", path, (double)INT32_MAX, &tokens);
    cJSON_Delete(j);
    if (st == ZPP_OK) {
        const long long have = header_count(bin_path);
        if (have != (long long)tokens)
            st = zpp_error(ZPP_ERR_FORMAT,
                           "tokenizer note '%s' is stale: it describes a token file of %.0f "
                           "tokens, and '%s' %s since; remove the note, or tokenize again",
                           path, tokens, bin_path,
                           have < 0 ? "is no llm.c token file" : "has been rewritten");
    }
    if (st != ZPP_OK) {
        zpp_tokfile_note_free(note);
        return st;
    }
    note->vocab_size = (int32_t)vocab_size;
    note->tokens = (size_t)tokens;
    *found_p = 1;
    return ZPP_OK;
}

/* train/tokfile.c — see tokfile.h. */
#include "train/tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
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

zpp_status zpp_tokfile_create(const char *path, zpp_tokfile **f_p) {
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

zpp_status zpp_tokfile_finish(zpp_tokfile *f, size_t *count_p) {
    if (!f) return zpp_error(ZPP_ERR_INVALID, "zpp_tokfile_finish: NULL file");
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
        zpp_tokfile_abort(f);
        return st;
    }
    if (count_p) *count_p = f->count;
    free(f->tmp);
    f->tmp = NULL;
    zpp_tokfile_abort(f); /* frees (the file is in place) */
    return ZPP_OK;
}

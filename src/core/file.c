/* core/file.c — see file.h. */
#define _GNU_SOURCE
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

static const char *file_type(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

zpp_status zpp_open_regular(const char *path, const char *what, int *fd_p, struct stat *sb_p) {
    if (!path || !what || !fd_p)
        return zpp_error(ZPP_ERR_INVALID, "zpp_open_regular: NULL argument");
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return zpp_error(ZPP_ERR_IO, "cannot open %s '%s': %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return zpp_error(ZPP_ERR_IO, "cannot stat %s '%s': %s", what, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return zpp_error(ZPP_ERR_IO, "%s '%s' is %s, not a regular file; give a file", what, path,
                         file_type(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_p = fd;
    if (sb_p) *sb_p = sb;
    return ZPP_OK;
}

zpp_status zpp_fopen_regular(const char *path, const char *what, FILE **f_p) {
    int fd = -1;
    zpp_status st = zpp_open_regular(path, what, &fd, NULL);
    if (st != ZPP_OK) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return zpp_error(ZPP_ERR_IO, "cannot open %s '%s': %s", what, path, strerror(e));
    }
    *f_p = f;
    return ZPP_OK;
}

zpp_status zpp_pread_all(int fd, const char *path, void *buf, size_t n, size_t off) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return zpp_error(ZPP_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        if (k == 0)
            return zpp_error(ZPP_ERR_IO, "'%s' ends at byte %zu while reading it: the file "
                                         "shrank", path, off);
        p += k, n -= (size_t)k, off += (size_t)k;
    }
    return ZPP_OK;
}

zpp_status zpp_write_text_atomic(const char *path, const char *text, const char *what) {
    char tmp[4096 + 32];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return zpp_error(ZPP_ERR_INVALID, "cannot write %s '%s': the path is too long", what,
                         path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 &&
             fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) {
        if (f) remove(tmp);
        return zpp_error(ZPP_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(e));
    }
    return ZPP_OK;
}

zpp_status zpp_copy_file(const char *src, const char *dst, const char *what) {
    int in = -1;
    struct stat sb;
    ZPP_CHECK(zpp_open_regular(src, what, &in, &sb));
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (out < 0) {
        const int e = errno;
        close(in);
        return zpp_error(ZPP_ERR_IO, "cannot create '%s' (a copy of %s '%s'): %s", dst, what,
                         src, strerror(e));
    }
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    zpp_status st = buf ? ZPP_OK : zpp_error(ZPP_ERR_NOMEM, "copying %s: out of memory", src);
    for (size_t off = 0; st == ZPP_OK && off < (size_t)sb.st_size; off += CHUNK) {
        const size_t n = (size_t)sb.st_size - off < CHUNK ? (size_t)sb.st_size - off : CHUNK;
        st = zpp_pread_all(in, src, buf, n, off);
        for (size_t done = 0; st == ZPP_OK && done < n;) {
            const ssize_t k = write(out, buf + done, n - done);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0)
                st = zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", dst, strerror(errno));
            else done += (size_t)k;
        }
    }
    free(buf);
    close(in);
    if (close(out) != 0 && st == ZPP_OK)
        st = zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", dst, strerror(errno));
    if (st != ZPP_OK) remove(dst);
    return st;
}

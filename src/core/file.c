/* core/file.c — see file.h. */
#define _GNU_SOURCE
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
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

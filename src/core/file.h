/* core/file.h — opening input files the user names (config, data,
 * checkpoints) without blocking and without surprises: a FIFO, a directory
 * or a device is refused with one clear line instead of blocking forever in
 * open() (a FIFO with no writer) or being read as a file. And the two ways
 * every file format here reads and writes: whole byte ranges at an offset,
 * and small text files that appear whole or not at all; and a plain copy. */
#ifndef ZPP_CORE_FILE_H
#define ZPP_CORE_FILE_H

#include <stdio.h>
#include <sys/stat.h>

#include "zeropp.h"

/* Opens `path` read-only (O_NONBLOCK, so a FIFO does not block; the flag is
 * cleared again for a regular file), fstat()s it and refuses anything but a
 * regular file: ZPP_ERR_IO "<what> '<path>' is a FIFO, not a regular file".
 * `what` names the file in messages ("config", "data"). On success *fd_p
 * is the descriptor and *sb_p (if not NULL) its stat. */
zpp_status zpp_open_regular(const char *path, const char *what, int *fd_p, struct stat *sb_p);
/* The same as a FILE * ("rb"). */
zpp_status zpp_fopen_regular(const char *path, const char *what, FILE **f_p);

/* Bytes [off, off + n) of the open file fd into buf, all of them (pread,
 * retried on EINTR and short reads), or ZPP_ERR_IO naming `path`: the
 * system's reason, or the byte where the file ended (it shrank). */
zpp_status zpp_pread_all(int fd, const char *path, void *buf, size_t n, size_t off);

/* Writes `text` and a newline to `path` whole or not at all: into
 * "<path>.tmp.<pid>" in the same folder, flushed to the disk, then renamed
 * over `path`. On failure the temporary file is removed and ZPP_ERR_IO
 * reads "cannot write <what> '<path>': <reason>". */
zpp_status zpp_write_text_atomic(const char *path, const char *text, const char *what);

/* Copies the regular file `src` (the `what` of messages) to `dst`, which
 * must not exist (O_EXCL), in chunks of 1 MiB. On failure dst is removed
 * and ZPP_ERR_IO names the file and the system's reason. */
zpp_status zpp_copy_file(const char *src, const char *dst, const char *what);

#endif

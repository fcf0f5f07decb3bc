/* core/file.h — opening input files the user names (config, data,
 * checkpoints) without blocking and without surprises: a FIFO, a directory
 * or a device is refused with one clear line instead of blocking forever in
 * open() (a FIFO with no writer) or being read as a file. */
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

#endif

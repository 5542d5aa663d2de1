/* error: the per-thread last error (status + message). */
#ifndef CKPT_ERROR_H
#define CKPT_ERROR_H

#include "ckpt.h"

/* Record `status` with a printf-style message for this thread; returns
 * `status` so callers can write `return ckpt_seterr(...)`. */
int ckpt_seterr(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Map a positive errno from a file-system call to a status. */
int ckpt_errno_status(int err);
/* ckpt_seterr with the status from errno `err` and ": strerror" appended. */
int ckpt_seterr_errno(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

/* error: the per-thread last error (status + message), the one idiom for
 * keeping it across cleanup, and the one check of an options version. */
#ifndef CKPT_ERROR_H
#define CKPT_ERROR_H

#include "ckpt.h"

#define CKPT_ERROR_MESSAGE_MAX 1024

/* Record `status` with a printf-style message for this thread; returns
 * `status` so callers can write `return ckpt_seterr(...)`. */
int ckpt_seterr(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Map a positive errno from a file-system call to a status. */
int ckpt_errno_status(int err);
/* ckpt_seterr with the status from errno `err` and ": strerror" appended. */
int ckpt_seterr_errno(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* This thread's last error, kept while cleanup runs calls that may set
 * another (after libgit2's git_error_state_capture):
 *     ckpt_error_state e;
 *     ckpt_error_capture(&e, rc);
 *     ...cleanup...
 *     return ckpt_error_restore(&e);
 */
typedef struct ckpt_error_state {
    int status;
    char message[CKPT_ERROR_MESSAGE_MAX];
} ckpt_error_state;

/* Keep `status` and this thread's current message in `st`. */
void ckpt_error_capture(ckpt_error_state *st, int status);
/* Make `st` this thread's last error again; returns its status. */
int ckpt_error_restore(const ckpt_error_state *st);

/* The check every options struct gets: CKPT_OK when `version` is
 * `expected`, else CKPT_EVERSION naming the struct type `what`. */
int ckpt_check_version(const char *what, unsigned int version, unsigned int expected);

#endif

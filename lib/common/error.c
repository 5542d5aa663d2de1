/* error: status names and descriptions, the per-thread last error. */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One slot per thread, as libgit2's git_error_last(): never NULL. */
static _Thread_local ckpt_error_state last_error;

/* The one table of statuses: the public names and descriptions both come
 * from here (the CLI and the Python binding ask ckpt_status_name()). */
static const struct {
    const char *name;
    const char *text;
} statuses[] = {
    [0] = {"ok", "success"},
    [-CKPT_EINVAL] = {"invalid_argument", "invalid argument"},
    [-CKPT_ENOMEM] = {"no_memory", "out of memory"},
    [-CKPT_EIO] = {"io", "input/output error"},
    [-CKPT_ENOSPC] = {"no_space", "no space left on device"},
    [-CKPT_EBUSY] = {"busy", "checkpoint root is locked by another writer"},
    [-CKPT_ECORRUPT] = {"corrupt", "checkpoint is corrupt"},
    [-CKPT_ENOTFOUND] = {"not_found", "not found"},
    [-CKPT_ENOCKPT] = {"no_checkpoint", "no valid checkpoint"},
    [-CKPT_EMISMATCH] = {"mismatch", "dtype, shape or size mismatch"},
    [-CKPT_EVERSION] = {"version", "unsupported version"},
    [-CKPT_EDEVICE] = {"device", "device (CUDA) error"},
    [-CKPT_ENODEVICE] = {"no_device", "no CUDA runtime or device"},
    [-CKPT_EACCES] = {"access", "permission denied"},
    [-CKPT_EINTERNAL] = {"internal", "internal error"},
    [-CKPT_EINCOMPLETE] = {"incomplete", "checkpoint is incomplete"},
    [-CKPT_EPEER] = {"peer", "another rank failed or did not answer"},
};

static int known(int status)
{
    return status <= 0 && -status < (int)(sizeof statuses / sizeof statuses[0]) &&
           statuses[-status].name;
}

CKPT_API const char *ckpt_strerror(int status)
{
    return known(status) ? statuses[-status].text : "unknown status";
}

CKPT_API const char *ckpt_status_name(int status)
{
    return known(status) ? statuses[-status].name : NULL;
}

CKPT_API const char *ckpt_error_last(void)
{
    return last_error.message;
}

CKPT_API int ckpt_error_last_status(void)
{
    return last_error.status;
}

CKPT_API void ckpt_error_clear(void)
{
    last_error.status = CKPT_OK;
    last_error.message[0] = '\0';
}

/* Formats into a local buffer first: callers often add context to the
 * message already there (`"tensor '%s': %s", name, ckpt_error_last()`), and
 * the slot must not be both source and destination of vsnprintf. */
static void vset(int status, const char *fmt, va_list ap)
{
    char buf[sizeof last_error.message];
    vsnprintf(buf, sizeof buf, fmt, ap);
    last_error.status = status;
    memcpy(last_error.message, buf, sizeof buf);
}

int ckpt_seterr(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(status, fmt, ap);
    va_end(ap);
    return status;
}

int ckpt_errno_status(int err)
{
    switch (err) {
    case ENOSPC:
    case EDQUOT:
        return CKPT_ENOSPC;
    case EACCES:
    case EPERM:
    case EROFS:
        return CKPT_EACCES;
    case ENOMEM:
        return CKPT_ENOMEM;
    case ENOENT:
        return CKPT_ENOTFOUND;
    default:
        return CKPT_EIO;
    }
}

int ckpt_seterr_errno(int err, const char *fmt, ...)
{
    int status = ckpt_errno_status(err);
    va_list ap;
    va_start(ap, fmt);
    vset(status, fmt, ap);
    va_end(ap);
    size_t len = strlen(last_error.message);
    snprintf(last_error.message + len, sizeof last_error.message - len, ": %s",
             strerror(err));
    return status;
}

void ckpt_error_capture(ckpt_error_state *st, int status)
{
    st->status = status;
    memcpy(st->message, last_error.message, sizeof st->message);
}

int ckpt_error_restore(const ckpt_error_state *st)
{
    last_error = *st;
    return st->status;
}

int ckpt_check_version(const char *what, unsigned int version, unsigned int expected)
{
    if (version == expected)
        return CKPT_OK;
    return ckpt_seterr(CKPT_EVERSION, "%s version %u is not supported (expected %u)", what,
                       version, expected);
}

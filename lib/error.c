/* error: status strings and the per-thread last error. */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One slot per thread, as libgit2's git_error_last(): never NULL. */
static _Thread_local struct {
    int status;
    char message[1024];
} last_error;

CKPT_API const char *ckpt_strerror(int status)
{
    switch (status) {
    case CKPT_OK: return "success";
    case CKPT_EINVAL: return "invalid argument";
    case CKPT_ENOMEM: return "out of memory";
    case CKPT_EIO: return "input/output error";
    case CKPT_ENOSPC: return "no space left on device";
    case CKPT_EBUSY: return "checkpoint root is locked by another writer";
    case CKPT_ECORRUPT: return "checkpoint is corrupt";
    case CKPT_ENOTFOUND: return "not found";
    case CKPT_ENOCKPT: return "no valid checkpoint";
    case CKPT_EMISMATCH: return "dtype, shape or size mismatch";
    case CKPT_EVERSION: return "unsupported version";
    case CKPT_EDEVICE: return "device (CUDA) error";
    case CKPT_ENODEVICE: return "no CUDA runtime or device";
    case CKPT_EACCES: return "permission denied";
    case CKPT_EINTERNAL: return "internal error";
    case CKPT_EINCOMPLETE: return "checkpoint is incomplete";
    default: return "unknown status";
    }
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

/* restore: the public faces of ckpt_restore and ckpt_verify; the work is
 * pipeline/restore.c. */
#include <stddef.h>
#include <string.h>

#include "dist.h"
#include "error.h"
#include "eventlog.h"
#include "report.h"
#include "restore.h"
#include "save.h"
#include "validate.h"

CKPT_API int ckpt_restore_options_init(ckpt_restore_options *opts, unsigned int version)
{
    if (!opts)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_restore_options_init: opts is NULL");
    int rc = version == 1 ? CKPT_OK
                          : ckpt_check_version("ckpt_restore_options", version,
                                               CKPT_RESTORE_OPTIONS_VERSION);
    if (rc)
        return rc;
    ckpt_restore_options d = CKPT_RESTORE_OPTIONS_INIT;
    if (version == 1)
        memcpy(opts, &d, offsetof(ckpt_restore_options, verify)); /* a v1 struct */
    else
        *opts = d;
    opts->version = version;
    return CKPT_OK;
}

/* Hand `r` to the caller, or free it. */
static void give_report(ckpt_report *r, ckpt_report **out)
{
    if (out)
        *out = r;
    else
        ckpt_report_free(r);
}

/* ckpt_restore, and with `keep` the step restored from handed back open;
 * `refused`: the caller's status instead of its tensors' (restore_refuse). */
static int restore_api(const char *fn, ckpt_store *s, int64_t step, const ckpt_tensor *t,
                       size_t count, const ckpt_restore_options *opts, ckpt_report **report,
                       ckpt_checkpoint **keep, int refused)
{
    if (report)
        *report = NULL;
    if (!s)
        return ckpt_seterr(CKPT_EINVAL, "%s: store is NULL", fn);
    if (context_usable(s, fn))
        return CKPT_EINVAL;
    ckpt_restore_options o;
    int orc = restore_options_read(opts, &o, fn);
    if (orc)
        return orc;
    if (step < 0 && step != CKPT_LATEST)
        return ckpt_seterr(CKPT_EINVAL, "%s: step must be >= 0 or CKPT_LATEST", fn);
    int rc = refused ? refused : validate_tensors(t, count, 1);
    int agree = s->dist && step == CKPT_LATEST; /* several ranks: collective */
    if (rc && !agree)
        return rc;
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    ckpt_error_state why; /* a failing rank's reason, which the agreement sends */
    ckpt_error_capture(&why, rc);
    if (agree) /* not between another thread's save begin and its save in flight */
        dist_begin_lock(s);
    pthread_mutex_lock(&s->api_lock);
    save_drain(s); /* retention of the save in flight must not race us */
    if (rc)
        ckpt_error_restore(&why);
    if (agree) {
        rc = dist_restore(s, rc, t, count, &o, r);
        if (!rc && keep && (rc = reader_open_step(s, r->step, keep)))
            *keep = NULL;
    } else {
        rc = restore_run(s, step, t, count, &o, r, keep);
    }
    eventlog_restore(s->events, rc, r);
    pthread_mutex_unlock(&s->api_lock);
    if (agree)
        dist_begin_unlock(s);
    give_report(r, report);
    return rc;
}

CKPT_API int ckpt_restore(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                          const ckpt_restore_options *opts, ckpt_report **report)
{
    return restore_api("ckpt_restore", s, step, t, count, opts, report, NULL, 0);
}

CKPT_API int ckpt_restore_open(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                               const ckpt_restore_options *opts, ckpt_report **report,
                               ckpt_checkpoint **out)
{
    if (out)
        *out = NULL;
    if (!out)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_restore_open: out is NULL");
    return restore_api("ckpt_restore_open", s, step, t, count, opts, report, out, 0);
}

CKPT_API int ckpt_verify(ckpt_store *s, int64_t step, ckpt_verify_level level,
                         ckpt_report **report)
{
    if (report)
        *report = NULL;
    if (!s || level < CKPT_VERIFY_QUICK || level > CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_verify: NULL store or invalid level");
    if (step < 0 && step != CKPT_LATEST && step != CKPT_NEWEST)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_verify: step must be >= 0, CKPT_NEWEST or "
                           "CKPT_LATEST");
    if (context_usable(s, "ckpt_verify"))
        return CKPT_EINVAL;
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    int rc = verify_run(s, step, level, r);
    eventlog_verify(s->events, step, level, rc, r);
    pthread_mutex_unlock(&s->api_lock);
    give_report(r, report);
    return rc;
}

CKPT_API int ckpt_restore_refuse(ckpt_store *s, int status, const char *message,
                                 ckpt_report **report)
{
    if (report)
        *report = NULL;
    if (!s || status >= 0 || !ckpt_status_name(status))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_restore_refuse: NULL store, or status %d is "
                           "not an error", status);
    ckpt_seterr(status, "%s", message ? message : ckpt_strerror(status));
    return restore_api("ckpt_restore_refuse", s, CKPT_LATEST, NULL, 0, NULL, report, NULL,
                       status);
}

CKPT_API int ckpt_store_record_restore(ckpt_store *s, int64_t step, int status,
                                       const char *message, const ckpt_problem *skipped,
                                       size_t nskipped)
{
    if (!s || (status == CKPT_OK && step < 0) || !ckpt_status_name(status) ||
        (nskipped && !skipped))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_record_restore: NULL store, a restored "
                           "step < 0, a status that is not one of ckpt_status (%d), or "
                           "skipped problems without their array", status);
    if (context_usable(s, "ckpt_store_record_restore"))
        return CKPT_EINVAL;
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    r->step = status ? -1 : step;
    for (size_t i = 0; i < nskipped; i++) {
        const ckpt_problem *p = &skipped[i];
        report_add(r, p->step, p->status, p->message ? p->message : "",
                   p->file ? p->file : "", p->tensor ? p->tensor : "", p->offset);
    }
    ckpt_error_state caller; /* the event names the caller's error, not theirs kept */
    ckpt_error_capture(&caller, ckpt_error_last_status());
    if (status)
        ckpt_seterr(status, "%s", message && *message ? message : ckpt_strerror(status));
    pthread_mutex_lock(&s->api_lock);
    eventlog_restore(s->events, status, r);
    pthread_mutex_unlock(&s->api_lock);
    ckpt_report_free(r);
    ckpt_error_restore(&caller);
    return CKPT_OK;
}

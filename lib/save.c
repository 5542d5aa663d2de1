/* save: the public face of ckpt_save (include/ckpt.h).  The pipeline's
 * save.c and persist.c do the work. */
#include "save.h"

#include "dist.h"

#include "error.h"
#include "eventlog.h"

#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* Bytes of a version 1 ckpt_save_options: it ends before frameworks_json. */
#define SAVE_OPTIONS_V1_SIZE offsetof(ckpt_save_options, frameworks_json)

CKPT_API int ckpt_save_options_init(ckpt_save_options *opts, unsigned int version)
{
    if (!opts)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_options_init: opts is NULL");
    int rc = version == 1 ? CKPT_OK
                          : ckpt_check_version("ckpt_save_options", version,
                                               CKPT_SAVE_OPTIONS_VERSION);
    if (rc)
        return rc;
    ckpt_save_options d = CKPT_SAVE_OPTIONS_INIT;
    if (version == 1)
        memcpy(opts, &d, SAVE_OPTIONS_V1_SIZE); /* a v1 struct ends there */
    else
        *opts = d;
    opts->version = version;
    return CKPT_OK;
}

static int save_begin_checked(ckpt_save **out, ckpt_store *st, int64_t step,
                              const ckpt_tensor *tensors, size_t count,
                              const ckpt_save_options *opts);

CKPT_API int ckpt_save_begin(ckpt_save **out, ckpt_store *st, int64_t step,
                             const ckpt_tensor *tensors, size_t count,
                             const ckpt_save_options *opts)
{
    if (out)
        *out = NULL;
    if (st && context_usable(st, "ckpt_save_begin"))
        return CKPT_EINVAL;
    if (!st || !st->dist_finish)
        return save_begin_checked(out, st, step, tensors, count, opts);
    /* Several ranks: a rank that fails here still answers the others, and
     * the ranks pace each other from here to the commit. */
    dist_begin_lock(st);
    dist_save_pace_start(st);
    /* The window 03867c7 closed: another thread's begin arriving here
     * would start a second pacing over this one (tests hold it open). */
    fsio_point(&st->lay.fs, "save_begin: paced");
    dist_save_prepare(st, step);
    int rc = save_begin_checked(out, st, step, tensors, count, opts);
    if (rc)
        rc = dist_save_failed(st, step, rc);
    dist_begin_unlock(st);
    return rc;
}

CKPT_API int ckpt_save_refuse(ckpt_store *st, int64_t step, int status, const char *message)
{
    if (!st || status >= 0 || !ckpt_status_name(status))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_refuse: NULL store, or status %d is not "
                           "an error", status);
    if (context_usable(st, "ckpt_save_refuse"))
        return CKPT_EINVAL;
    ckpt_seterr(status, "%s", message ? message : ckpt_strerror(status));
    if (!st->dist_finish)
        return status;
    dist_begin_lock(st);
    dist_save_prepare(st, step);
    int rc = dist_save_failed(st, step, status);
    dist_begin_unlock(st);
    return rc;
}

static int save_begin_checked(ckpt_save **out, ckpt_store *st, int64_t step,
                              const ckpt_tensor *tensors, size_t count,
                              const ckpt_save_options *opts)
{
    if (out)
        *out = NULL;
    if (!out || !st)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_begin: out and store must not be NULL");
    if (st->readonly)
        return ckpt_seterr(CKPT_EACCES, "%s was opened read-only: it cannot be saved to",
                           st->lay.root);
    if (step < 0)
        return ckpt_seterr(CKPT_EINVAL, "step must be in 0..CKPT_STEP_MAX (got %lld)",
                           (long long)step);
    /* From here on every version reads as the current one. */
    ckpt_save_options o = CKPT_SAVE_OPTIONS_INIT;
    if (opts && opts->version == 1) {
        memcpy(&o, opts, SAVE_OPTIONS_V1_SIZE); /* the rest keeps its defaults */
    } else if (opts) {
        int rc = ckpt_check_version("ckpt_save_options", opts->version,
                                    CKPT_SAVE_OPTIONS_VERSION);
        if (rc)
            return rc;
        o = *opts;
    }
    o.version = CKPT_SAVE_OPTIONS_VERSION;
    int rc = save_begin(out, st, step, tensors, count, &o);
    if (rc)
        eventlog_save_end(st->events, step, rc, NULL, 0, 0);
    return rc;
}

CKPT_API int ckpt_save_wait(ckpt_save *s)
{
    if (!s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_wait: save is NULL");
    if (context_usable_by(s->owner, "ckpt_save_wait"))
        return CKPT_EINVAL;
    return save_wait(s);
}

CKPT_API int ckpt_save_done(ckpt_save *s)
{
    if (!s || s->owner != getpid()) /* nothing to wait for here: see ckpt.h */
        return 1;
    pthread_mutex_lock(&s->lock);
    int done = s->done;
    pthread_mutex_unlock(&s->lock);
    return done;
}

/* The snapshot event lives until the persist thread has seen every copy
 * complete; after that there is nothing left to wait for. */
CKPT_API int ckpt_save_wait_snapshot(ckpt_save *s)
{
    if (!s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_wait_snapshot: save is NULL");
    if (context_usable_by(s->owner, "ckpt_save_wait_snapshot"))
        return CKPT_EINVAL;
    pthread_mutex_lock(&s->lock);
    save_wait_snapshot_locked(s);
    int rc = s->snap_ev ? device_snapshot_wait(s->store->dev, s->snap_ev) : CKPT_OK;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

CKPT_API int ckpt_save_fence(ckpt_save *s, void *stream)
{
    if (!s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_fence: save is NULL");
    if (context_usable_by(s->owner, "ckpt_save_fence"))
        return CKPT_EINVAL;
    pthread_mutex_lock(&s->lock);
    save_wait_snapshot_locked(s); /* only STREAM snapshots larger than the pool wait */
    int rc = s->snap_ev ? device_fence(s->store->dev, s->snap_ev, stream) : CKPT_OK;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

CKPT_API int ckpt_save_stats_get(const ckpt_save *s, ckpt_save_stats *stats)
{
    if (!s || !stats)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_stats_get: NULL argument");
    if (context_usable_by(s->owner, "ckpt_save_stats_get"))
        return CKPT_EINVAL;
    ckpt_save *m = (ckpt_save *)s;
    pthread_mutex_lock(&m->lock);
    *stats = m->stats;
    pthread_mutex_unlock(&m->lock);
    return CKPT_OK;
}

CKPT_API void ckpt_save_free(ckpt_save *s)
{
    if (!s || s->owner != getpid()) /* a child's copy: let go of nothing */
        return;
    save_wait(s);
    save_unref(s);
}

CKPT_API int ckpt_save_sync(ckpt_store *st, int64_t step, const ckpt_tensor *tensors,
                            size_t count, const ckpt_save_options *opts)
{
    ckpt_save *s;
    int rc = ckpt_save_begin(&s, st, step, tensors, count, opts);
    if (rc)
        return rc;
    rc = ckpt_save_wait(s);
    ckpt_error_state e;
    ckpt_error_capture(&e, rc);
    ckpt_save_free(s);
    return ckpt_error_restore(&e);
}

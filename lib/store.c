/* store: the public face of ckpt_store: options, open and close, listing,
 * latest, gc.  The root's namespace is io/layout.c; the workers and device
 * are pipeline/workers.c. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist.h"
#include "error.h"
#include "eventlog.h"
#include "reader.h"
#include "report.h"
#include "retention.h"
#include "testing.h"

CKPT_API int ckpt_store_options_init(ckpt_store_options *opts, unsigned int version)
{
    if (!opts)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_options_init: opts is NULL");
    int rc = version == 1 ? CKPT_OK
                          : ckpt_check_version("ckpt_store_options", version,
                                               CKPT_STORE_OPTIONS_VERSION);
    if (rc)
        return rc;
    ckpt_store_options d = CKPT_STORE_OPTIONS_INIT;
    if (version == 1)
        memcpy(opts, &d, DIST_OPTIONS_V1_SIZE); /* a v1 struct ends before `rank` */
    else
        *opts = d;
    opts->version = version;
    return CKPT_OK;
}

/* Replace "use the default" values by real ones, reject nonsense. */
static int resolve_options(const ckpt_store_options *in, ckpt_store_options *o)
{
    ckpt_store_options d = CKPT_STORE_OPTIONS_INIT;
    int rc;
    if (in && in->version != 1 &&
        (rc = ckpt_check_version("ckpt_store_options", in->version,
                                 CKPT_STORE_OPTIONS_VERSION)))
        return rc;
    *o = d;
    if (in && in->version == 1)
        memcpy(o, in, DIST_OPTIONS_V1_SIZE); /* the rest keeps its defaults */
    else if (in)
        *o = *in;
    o->version = CKPT_STORE_OPTIONS_VERSION;
    if ((rc = dist_resolve_options(o)))
        return rc;
    if (o->metrics_path && !*o->metrics_path)
        return ckpt_seterr(CKPT_EINVAL, "metrics_path is empty (NULL for none)");
    if (o->flags & ~(CKPT_OPEN_READONLY | CKPT_OPEN_TRUST_GROUP | CKPT_OPEN_NO_CMDLINE |
                     CKPT_OPEN_REWIND | CKPT_OPEN_COMPRESS_ALL | CKPT_OPEN_KEEP_CACHE |
                     CKPT_OPEN_DROP_CACHE))
        return ckpt_seterr(CKPT_EINVAL, "unknown open flags 0x%x", o->flags);
    if ((o->flags & CKPT_OPEN_KEEP_CACHE) && (o->flags & CKPT_OPEN_DROP_CACHE))
        return ckpt_seterr(CKPT_EINVAL, "open flags: CKPT_OPEN_KEEP_CACHE and "
                           "CKPT_OPEN_DROP_CACHE contradict each other");
    if ((rc = codec_resolve_level(o->level, &o->level)))
        return rc;
    if (o->threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = n > 0 ? (int)(n < CKPT_THREADS_MAX ? n : CKPT_THREADS_MAX) : 1;
    }
    if (o->threads < 0 || o->threads > CKPT_THREADS_MAX)
        return ckpt_seterr(CKPT_EINVAL, "threads %d is out of range (0..%d)", o->threads,
                           CKPT_THREADS_MAX);
    if (o->chunk_bytes == 0)
        o->chunk_bytes = CKPT_CHUNK_DEFAULT;
    if (o->chunk_bytes < CKPT_CHUNK_MIN || o->chunk_bytes > CKPT_CHUNK_MAX ||
        o->chunk_bytes % 16)
        return ckpt_seterr(CKPT_EINVAL, "chunk_bytes %llu must be a multiple of 16 in "
                           "%llu..%llu", (unsigned long long)o->chunk_bytes,
                           (unsigned long long)CKPT_CHUNK_MIN,
                           (unsigned long long)CKPT_CHUNK_MAX);
    if (o->host_memory_limit == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        o->host_memory_limit = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2
                                                    : 1ull << 30;
    }
    if (o->host_memory_limit < o->chunk_bytes)
        o->chunk_bytes = o->host_memory_limit < CKPT_CHUNK_MIN ? CKPT_CHUNK_MIN
                                                               : o->host_memory_limit & ~15ull;
    if (o->keep_last < -1)
        return ckpt_seterr(CKPT_EINVAL, "keep_last %d is invalid (0 keeps all, -1 means "
                           "the default of %d)", o->keep_last, CKPT_KEEP_LAST_DEFAULT);
    if (o->keep_last == -1)
        o->keep_last = CKPT_KEEP_LAST_DEFAULT;
    if (o->fsync != 0 && o->fsync != 1)
        return ckpt_seterr(CKPT_EINVAL, "fsync must be 0 or 1");
    if (o->verify_after_save < CKPT_VERIFY_NONE || o->verify_after_save > CKPT_VERIFY_STORED)
        return ckpt_seterr(CKPT_EINVAL, "invalid verify_after_save %d", o->verify_after_save);
    if (o->snapshot_mode < CKPT_SNAPSHOT_HOST || o->snapshot_mode > CKPT_SNAPSHOT_STREAM)
        return ckpt_seterr(CKPT_EINVAL, "invalid snapshot_mode %d", o->snapshot_mode);
    if (o->pinned_limit == 0)
        o->pinned_limit = CKPT_PINNED_LIMIT_DEFAULT;
    return CKPT_OK;
}

static void store_destroy(ckpt_store *s)
{
    if (!s)
        return;
    context_stop(s);
    dist_free(s->dist);
    eventlog_free(s->events);
    free(s->damaged);
    layout_close(&s->lay); /* releases the lock */
    pthread_mutex_destroy(&s->api_lock);
    free(s);
}

int ckpt_store_open_with_fsio(ckpt_store **out, const char *path,
                              const ckpt_store_options *opts, const fsio *fs)
{
    if (out)
        *out = NULL;
    if (!out || !path)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_open: out and path must not be NULL");
    if (!*path)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_open: the checkpoint root path is empty");
    ckpt_store *s = calloc(1, sizeof *s);
    if (!s)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    s->lay.lock_fd = -1;
    s->owner = getpid();
    pthread_mutex_init(&s->api_lock, NULL);
    if (fs)
        s->lay.fs = *fs;
    int rc = resolve_options(opts, &s->opts);
    if (!rc) {
        s->readonly = (s->opts.flags & CKPT_OPEN_READONLY) != 0;
        s->lay.fsync = s->opts.fsync;
        rc = layout_open(&s->lay, path, !s->readonly,
                         (s->opts.flags & CKPT_OPEN_TRUST_GROUP) != 0);
    }
    if (!rc && s->opts.world_size > 1)
        rc = dist_open(s); /* rank 0 locks and cleans, every rank agrees */
    else if (!rc && !s->readonly && !(rc = layout_lock(&s->lay))) {
        s->cleaned = report_new(); /* NULL: cleaned all the same, unrecorded */
        /* Best effort (retried next open), but for out of memory: then a
         * step moved aside may not have been put back, and the store
         * would open without it (restore taking an older step). */
        if (layout_clean_stale(&s->lay, 0, s->cleaned) == CKPT_ENOMEM)
            rc = CKPT_ENOMEM;
    }
    /* One event log line per event of the job: on several ranks, rank 0's
     * (it holds the lock, and logs the step's sums); W appenders would
     * count every save W times and race on rotation. */
    if (!rc && !s->readonly && (s->opts.world_size <= 1 || s->rank == 0) &&
        !(s->events = eventlog_new(&s->lay, 0, s->opts.metrics_path)))
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    if (!rc)
        eventlog_cleaned(s->events, s->cleaned);
    ckpt_report_free(s->cleaned);
    s->cleaned = NULL;
    s->opts.metrics_path = NULL; /* the caller's string need not outlive open */
    if (!rc)
        rc = context_start(s);
    if (rc) {
        ckpt_error_state e;
        ckpt_error_capture(&e, rc);
        store_destroy(s);
        return ckpt_error_restore(&e);
    }
    *out = s;
    return CKPT_OK;
}

CKPT_API int ckpt_store_open(ckpt_store **out, const char *path, const ckpt_store_options *opts)
{
    return ckpt_store_open_with_fsio(out, path, opts, NULL);
}

CKPT_API void ckpt_store_free(ckpt_store *s)
{
    if (s && context_forked(s)) {
        /* A child made by fork(): the store's threads are the parent's, and
         * joining them would never return.  Give up the lock's descriptor
         * (ckpt_store_release_after_fork) and leave the copy unfreed. */
        layout_forget_lock(&s->lay);
        return;
    }
    store_destroy(s);
}

CKPT_API const char *ckpt_store_path(const ckpt_store *s)
{
    return s ? s->lay.root : NULL;
}

CKPT_API uint64_t ckpt_store_pinned_bytes(const ckpt_store *s)
{
    /* in a forked child, the count's lock may be held by a parent's thread */
    return s && s->dev && !context_forked(s) ? device_pinned_bytes(s->dev) : 0;
}

CKPT_API int ckpt_cuda_available(void)
{
    return device_cuda_available();
}

CKPT_API int ckpt_store_steps(const ckpt_store *cs, int64_t **steps, size_t *count)
{
    if (!cs || !steps || !count)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_steps: NULL argument");
    if (context_usable(cs, "ckpt_store_steps"))
        return CKPT_EINVAL;
    ckpt_store *s = (ckpt_store *)cs;
    pthread_mutex_lock(&s->api_lock);
    int rc = layout_scan(&s->lay, steps, count);
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

CKPT_API int ckpt_store_release_after_fork(ckpt_store *s)
{
    if (!s)
        return CKPT_EINVAL; /* no message: the child may be in any state */
    layout_forget_lock(&s->lay); /* no api_lock: another thread may have held it */
    return CKPT_OK;
}

CKPT_API int ckpt_store_wait(ckpt_store *s)
{
    if (!s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_wait: NULL store");
    if (context_usable(s, "ckpt_store_wait"))
        return CKPT_EINVAL;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    pthread_mutex_unlock(&s->api_lock);
    return CKPT_OK;
}

CKPT_API int ckpt_store_latest(ckpt_store *s, ckpt_verify_level level, int64_t *step)
{
    if (!s || !step || level < CKPT_VERIFY_QUICK || level > CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_latest: invalid argument");
    if (context_usable(s, "ckpt_store_latest"))
        return CKPT_EINVAL;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    ckpt_checkpoint *ck;
    int rc = reader_open_newest(s, level, &ck);
    if (!rc) {
        *step = ck->m.step;
        reader_close(ck);
    }
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

CKPT_API int ckpt_store_gc(ckpt_store *s, int keep_last, int dry_run, ckpt_report **report)
{
    if (report)
        *report = NULL;
    if (!s || keep_last < 1)
        return ckpt_seterr(CKPT_EINVAL, !s ? "ckpt_store_gc: store is NULL"
                                           : "ckpt_store_gc: keep_last must be >= 1");
    if (context_usable(s, "ckpt_store_gc"))
        return CKPT_EINVAL;
    if (s->readonly && !dry_run)
        return ckpt_seterr(CKPT_EACCES, "%s was opened read-only: only a dry run can "
                           "list what gc would remove", s->lay.root);
    if (!s->readonly && !dry_run && s->rank != 0)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_gc: rank %u is not the writer of %s; "
                           "gc runs on rank 0, which holds the lock", s->rank, s->lay.root);
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    if (s->pool) /* steps retired by saves: their files are deleted first */
        pool_group_wait(&s->background);
    /* The newest fully valid step is never removed: a step whose index is
     * fine but whose chunks are not would be no checkpoint to keep. */
    int64_t keep_valid = -1;
    ckpt_checkpoint *ck;
    int rc = reader_open_newest(s, CKPT_VERIFY_FULL, &ck);
    if (rc == CKPT_OK) {
        keep_valid = ck->m.step;
        reader_close(ck);
    }
    /* Not knowing which step that is (out of memory, a listing that
     * failed) is no licence to remove it: nothing is removed then.  None
     * at all (CKPT_ENOCKPT) leaves nothing to protect. */
    if (rc == CKPT_ENOCKPT) {
        ckpt_error_clear();
        rc = CKPT_OK;
    }
    if (!rc)
        rc = retention_apply(s, (size_t)keep_last, -1, keep_valid, dry_run, r);
    if (!rc)
        rc = layout_clean_stale(&s->lay, dry_run, r);
    eventlog_gc(s->events, keep_last, dry_run, rc, r);
    pthread_mutex_unlock(&s->api_lock);
    if (report)
        *report = r;
    else
        ckpt_report_free(r);
    return rc;
}

/* api: versions, options, opening and closing stores, gc. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "internal.h"
#include "reader.h"
#include "report.h"
#include "shard.h"
#include "store.h"
#include "testing.h"
#include "util.h"

#define DEFAULT_LEVEL 1
#define DEFAULT_CHUNK (4u << 20)
#define DEFAULT_KEEP 3
#define MAX_THREADS 256

CKPT_API int ckpt_version_number(void)
{
    return CKPT_VERSION_NUMBER;
}

CKPT_API const char *ckpt_version_string(void)
{
    return CKPT_VERSION_STRING;
}

CKPT_API void ckpt_free(void *ptr)
{
    free(ptr);
}

CKPT_API int ckpt_store_options_init(ckpt_store_options *opts, unsigned int version)
{
    if (!opts)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_options_init: opts is NULL");
    if (version != CKPT_STORE_OPTIONS_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "ckpt_store_options version %u is not supported "
                           "(expected %u)", version, CKPT_STORE_OPTIONS_VERSION);
    ckpt_store_options d = CKPT_STORE_OPTIONS_INIT;
    *opts = d;
    return CKPT_OK;
}

CKPT_API int ckpt_save_options_init(ckpt_save_options *opts, unsigned int version)
{
    if (!opts)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_save_options_init: opts is NULL");
    if (version != CKPT_SAVE_OPTIONS_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "ckpt_save_options version %u is not supported "
                           "(expected %u)", version, CKPT_SAVE_OPTIONS_VERSION);
    ckpt_save_options d = CKPT_SAVE_OPTIONS_INIT;
    *opts = d;
    return CKPT_OK;
}

CKPT_API int ckpt_restore_options_init(ckpt_restore_options *opts, unsigned int version)
{
    if (!opts)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_restore_options_init: opts is NULL");
    if (version != CKPT_RESTORE_OPTIONS_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "ckpt_restore_options version %u is not "
                           "supported (expected %u)", version, CKPT_RESTORE_OPTIONS_VERSION);
    ckpt_restore_options d = CKPT_RESTORE_OPTIONS_INIT;
    *opts = d;
    return CKPT_OK;
}

/* Replace "use the default" values by real ones, reject nonsense. */
static int resolve_options(const ckpt_store_options *in, ckpt_store_options *o)
{
    ckpt_store_options d = CKPT_STORE_OPTIONS_INIT;
    if (in && in->version != CKPT_STORE_OPTIONS_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "ckpt_store_options version %u is not supported "
                           "(expected %u)", in->version, CKPT_STORE_OPTIONS_VERSION);
    *o = in ? *in : d;
    if (o->flags & ~CKPT_OPEN_READONLY)
        return ckpt_seterr(CKPT_EINVAL, "unknown open flags 0x%x", o->flags);
    if (o->level == 0)
        o->level = DEFAULT_LEVEL;
    if (o->level < -7 || o->level > 22)
        return ckpt_seterr(CKPT_EINVAL, "zstd level %d is out of range (-7..22)", o->level);
    if (o->threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = n > 0 ? (int)(n < MAX_THREADS ? n : MAX_THREADS) : 1;
    }
    if (o->threads < 0 || o->threads > MAX_THREADS)
        return ckpt_seterr(CKPT_EINVAL, "threads %d is out of range (0..%d)", o->threads,
                           MAX_THREADS);
    if (o->chunk_bytes == 0)
        o->chunk_bytes = DEFAULT_CHUNK;
    if (o->chunk_bytes < SHARD_CHUNK_MIN || o->chunk_bytes > SHARD_CHUNK_MAX ||
        o->chunk_bytes % 16)
        return ckpt_seterr(CKPT_EINVAL, "chunk_bytes %llu must be a multiple of 16 in "
                           "4 KiB..1 GiB", (unsigned long long)o->chunk_bytes);
    if (o->host_memory_limit == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        o->host_memory_limit = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2
                                                    : 1ull << 30;
    }
    if (o->host_memory_limit < o->chunk_bytes)
        o->chunk_bytes = o->host_memory_limit < SHARD_CHUNK_MIN ? SHARD_CHUNK_MIN
                                                                : o->host_memory_limit & ~15ull;
    if (o->keep_last < -1)
        return ckpt_seterr(CKPT_EINVAL, "keep_last %d is invalid (0 keeps all, -1 means "
                           "the default of %d)", o->keep_last, DEFAULT_KEEP);
    if (o->keep_last == -1)
        o->keep_last = DEFAULT_KEEP;
    if (o->fsync != 0 && o->fsync != 1)
        return ckpt_seterr(CKPT_EINVAL, "fsync must be 0 or 1");
    if (o->verify_after_save < CKPT_VERIFY_NONE || o->verify_after_save > CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "invalid verify_after_save %d", o->verify_after_save);
    if (o->snapshot_mode < CKPT_SNAPSHOT_HOST || o->snapshot_mode > CKPT_SNAPSHOT_STREAM)
        return ckpt_seterr(CKPT_EINVAL, "invalid snapshot_mode %d", o->snapshot_mode);
    if (o->pinned_limit == 0)
        o->pinned_limit = 1ull << 30;
    return CKPT_OK;
}

int worker_reserve_in(worker_ctx *w, size_t n)
{
    if (w->in_cap >= n)
        return CKPT_OK;
    unsigned char *p = realloc(w->in, n ? n : 1);
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory for a %zu-byte read buffer", n);
    w->in = p;
    w->in_cap = n;
    return CKPT_OK;
}

int worker_reserve_out(ckpt_store *s, worker_ctx *w, size_t n, int pinned)
{
    if (w->out_cap >= n && (w->out_pinned || !pinned))
        return CKPT_OK;
    device_host_free(s->dev, w->out, w->out_cap, w->out_pinned);
    w->out = NULL;
    w->out_cap = 0;
    /* Never less than a chunk, so the buffer is allocated once per worker. */
    size_t want = n > s->opts.chunk_bytes ? n : (size_t)s->opts.chunk_bytes;
    void *p;
    int got;
    int rc = device_host_alloc(s->dev, want, pinned, &p, &got);
    if (rc)
        return rc;
    w->out = p;
    w->out_cap = want;
    w->out_pinned = got;
    return CKPT_OK;
}

static void store_destroy(ckpt_store *s)
{
    if (!s)
        return;
    save_drain(s);
    if (s->dev)
        device_quiesce(s->dev); /* no copy may land in memory freed below */
    pool_free(s->pool);
    if (s->workers) {
        for (int i = 0; i < s->opts.threads; i++) {
            codec_free(s->workers[i].codec);
            free(s->workers[i].in);
            device_host_free(s->dev, s->workers[i].out, s->workers[i].out_cap,
                             s->workers[i].out_pinned);
        }
        free(s->workers);
    }
    if (s->arena)
        device_host_free(s->dev, s->arena, s->arena_cap, s->arena_pinned);
    device_free(s->dev);
    if (s->lock_fd >= 0)
        fsio_close(&s->fs, s->lock_fd); /* releases the flock */
    pthread_mutex_destroy(&s->api_lock);
    free(s->root);
    free(s);
}

static int open_root(ckpt_store *s, const char *path)
{
    int is_dir = 0;
    int rc = fsio_stat(&s->fs, path, NULL, &is_dir);
    if (rc == -ENOENT && !s->readonly) {
        rc = fsio_mkdir(&s->fs, path, 0755);
        if (rc == -EEXIST)
            rc = 0;
        if (rc)
            return ckpt_seterr_errno(-rc, "cannot create the checkpoint root %s", path);
        is_dir = 1;
    } else if (rc == -ENOENT) {
        return ckpt_seterr(CKPT_ENOTFOUND, "checkpoint root %s does not exist", path);
    } else if (rc) {
        return ckpt_seterr_errno(-rc, "cannot stat the checkpoint root %s", path);
    }
    if (!is_dir)
        return ckpt_seterr(CKPT_EINVAL, "%s is not a directory", path);
    return CKPT_OK;
}

int ckpt_store_open_with_fsio(ckpt_store **out, const char *path,
                              const ckpt_store_options *opts, const fsio *fs)
{
    if (!out || !path || !*path)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_open: out and path must be given");
    *out = NULL;
    ckpt_store *s = calloc(1, sizeof *s);
    if (!s)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    s->lock_fd = -1;
    pthread_mutex_init(&s->api_lock, NULL);
    if (fs)
        s->fs = *fs;
    int rc = resolve_options(opts, &s->opts);
    if (rc) {
        s->opts.threads = 0;
        store_destroy(s);
        return rc;
    }
    s->readonly = (s->opts.flags & CKPT_OPEN_READONLY) != 0;
    device_options dopts = {s->opts.snapshot_mode, s->opts.pinned_limit};
    rc = open_root(s, path);
    /* Absolute, so paths handed out stay valid if the caller changes
     * directory. */
    if (!rc && !(s->root = realpath(path, NULL)))
        rc = ckpt_seterr_errno(errno, "cannot resolve the checkpoint root %s", path);
    if (!rc && !s->readonly && !(rc = store_lock(s)))
        store_clean_stale(s);
    if (!rc)
        rc = device_open(&s->dev, &dopts);
    int threads = s->opts.threads;
    s->opts.threads = 0; /* counts workers actually set up, for destroy */
    if (!rc && !(s->workers = calloc((size_t)threads, sizeof *s->workers)))
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < threads; i++) {
        rc = codec_create(&s->workers[i].codec, s->opts.level);
        s->opts.threads++;
    }
    if (!rc)
        rc = pool_create(&s->pool, threads);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ckpt_error_last());
        store_destroy(s);
        return ckpt_seterr(rc, "%s", msg);
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
    store_destroy(s);
}

CKPT_API const char *ckpt_store_path(const ckpt_store *s)
{
    return s ? s->root : NULL;
}

CKPT_API uint64_t ckpt_store_pinned_bytes(const ckpt_store *s)
{
    return s && s->dev ? device_pinned_bytes(s->dev) : 0;
}

CKPT_API int ckpt_store_steps(const ckpt_store *cs, int64_t **steps, size_t *count)
{
    if (!cs || !steps || !count)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_steps: NULL argument");
    ckpt_store *s = (ckpt_store *)cs;
    pthread_mutex_lock(&s->api_lock);
    int rc = store_scan(s, steps, count);
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

CKPT_API int ckpt_store_gc(ckpt_store *s, int keep_last, int dry_run, ckpt_report **report)
{
    if (report)
        *report = NULL;
    if (!s || keep_last < 1)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_gc: keep_last must be >= 1");
    if (s->readonly && !dry_run)
        return ckpt_seterr(CKPT_EACCES, "%s was opened read-only: only a dry run can "
                           "list what gc would remove", s->root);
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    int64_t *steps = NULL;
    size_t n = 0;
    char **names = NULL;
    size_t nn = 0;
    int rc = store_scan(s, &steps, &n);
    if (!rc) {
        int64_t keep_valid = -1; /* the newest valid step is never removed */
        ckpt_checkpoint *ck;
        /* Full verification: a step whose index is fine but whose chunks
         * are not would be no checkpoint to keep. */
        if (reader_open_newest(s, CKPT_VERIFY_FULL, &ck) == CKPT_OK) {
            keep_valid = ck->m.step;
            reader_close(ck);
        }
        ckpt_error_clear();
        for (size_t i = 0; i + (size_t)keep_last < n && !rc; i++) {
            if (steps[i] == keep_valid)
                continue;
            char name[32];
            store_step_name(steps[i], name, sizeof name);
            if (!dry_run && (rc = store_retire(s, steps[i])))
                break;
            report_add(r, steps[i], CKPT_OK, dry_run ? "would retire" : "retired", name,
                       "", -1);
        }
    }
    if (!rc && (rc = fsio_list(&s->fs, s->root, &names, &nn)))
        rc = ckpt_seterr_errno(-rc, "cannot list %s", s->root);
    for (size_t i = 0; !rc && i < nn; i++) {
        if (strncmp(names[i], STORE_TMP_PREFIX, strlen(STORE_TMP_PREFIX)) &&
            strncmp(names[i], STORE_TRASH_PREFIX, strlen(STORE_TRASH_PREFIX)))
            continue; /* .replaced-* is a committed step: the writer's open restores it */
        char *p = util_join(s->root, names[i]);
        int e = p ? (dry_run ? 0 : fsio_remove_tree(&s->fs, p)) : -ENOMEM;
        free(p);
        if (e)
            rc = ckpt_seterr_errno(-e, "cannot remove %s/%s", s->root, names[i]);
        else
            report_add(r, -1, CKPT_OK, dry_run ? "would remove stale temporary directory"
                       : "removed stale temporary directory", names[i], "", -1);
    }
    fsio_list_free(names, nn);
    free(steps);
    pthread_mutex_unlock(&s->api_lock);
    if (report)
        *report = r;
    else
        ckpt_report_free(r);
    return rc;
}

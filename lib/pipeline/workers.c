/* workers: the store's per-worker codecs and buffers, its pool and device;
 * whether this process may use them (fork). */
#include "context.h"

#include <stdlib.h>
#include <unistd.h>

#include "error.h"

int context_start(ckpt_store *s)
{
    device_options dopts = {s->opts.snapshot_mode, s->opts.pinned_limit};
    int rc = device_open(&s->dev, &dopts);
    int threads = s->opts.threads;
    if (!rc && !(s->workers = calloc((size_t)threads, sizeof *s->workers)))
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < threads; i++) {
        rc = codec_create(&s->workers[i].codec, s->opts.level);
        s->nworkers++; /* counts workers set up, for context_stop */
    }
    if (!rc && !(rc = pool_create(&s->pool, threads)))
        pool_group_init(&s->background); /* lives as long as the pool */
    if (!rc)
        rc = adapt_create(&s->adapt, threads, (s->opts.flags & CKPT_OPEN_COMPRESS_ALL) != 0);
    /* Retention opens the steps it keeps and the one it retires, beside
     * the step just written: keep_last + 1 manifests, and one to spare. */
    size_t keep = s->opts.keep_last > 0 ? (size_t)s->opts.keep_last : 0;
    if (!rc)
        rc = mcache_create(&s->mcache, keep + 2 < 4 ? 4 : keep + 2 > 64 ? 64 : keep + 2);
    return rc;
}

void context_stop(ckpt_store *s)
{
    save_drain(s);
    device_capture_mode relaxed;
    device_relax_capture(s->dev, &relaxed); /* given back after device_free */
    if (s->dev)
        device_quiesce(s->dev); /* no copy may land in memory freed below */
    if (s->pool) {
        pool_group_wait(&s->background); /* its jobs cannot fail */
        pool_free(s->pool);
        pool_group_destroy(&s->background);
    }
    s->pool = NULL;
    adapt_free(s->adapt);
    s->adapt = NULL;
    mcache_free(s->mcache);
    s->mcache = NULL;
    for (int i = 0; s->workers && i < s->nworkers; i++) {
        codec_free(s->workers[i].codec);
        free(s->workers[i].in);
        free(s->workers[i].frames);
        device_host_free(s->dev, s->workers[i].out, s->workers[i].out_cap,
                         s->workers[i].out_pinned);
    }
    free(s->workers);
    s->workers = NULL;
    s->nworkers = 0;
    if (s->arena)
        device_host_free(s->dev, s->arena, s->arena_cap, s->arena_pinned);
    s->arena = NULL;
    if (s->dpool)
        device_host_free(s->dev, s->dpool, s->dpool_cap, s->dpool_pinned);
    s->dpool = NULL;
    device_free(s->dev);
    s->dev = NULL;
    device_restore_capture(&relaxed);
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

int worker_reserve_frames(worker_ctx *w, size_t n)
{
    if (w->frames_cap >= n)
        return CKPT_OK;
    size_t cap = w->frames_cap ? w->frames_cap : 4096;
    while (cap < n)
        cap *= 2;
    unsigned char *p = realloc(w->frames, cap);
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory for a %zu-byte frame buffer", cap);
    w->frames = p;
    w->frames_cap = cap;
    return CKPT_OK;
}

int worker_reserve_out(ckpt_store *s, worker_ctx *w, size_t n, int pinned)
{
    /* A pageable buffer that pinned memory was refused for is kept: asking
     * again for every chunk would unmap, map and touch it each time. */
    if (w->out_cap >= n && (w->out_pinned || !pinned || w->out_asked_pinned))
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
    w->out_asked_pinned = pinned;
    return CKPT_OK;
}

int context_forked(const ckpt_store *s)
{
    return s->owner != getpid();
}

int context_usable(const ckpt_store *s, const char *fn)
{
    return context_usable_by(s->owner, fn);
}

int context_usable_by(pid_t owner, const char *fn)
{
    if (owner == getpid())
        return CKPT_OK;
    return ckpt_seterr(CKPT_EINVAL,
                       "%s: the store was opened by process %ld, and this process is a child "
                       "it made with fork(): the store's threads and locks did not come along, "
                       "so its stores, saves and checkpoints cannot be used here; open a store "
                       "in this process (the parent's go on working there)",
                       fn, (long)owner);
}

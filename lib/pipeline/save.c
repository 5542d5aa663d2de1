/* save: the asynchronous save pipeline.
 *
 * ckpt_save_begin (caller's thread): validate, copy every chunk into the
 * store's snapshot arena and queue one encode job per chunk, then start the
 * persist thread and return.  Encode jobs (workers): shuffle + zstd + xxh3,
 * append the frame to the shard.  The persist thread (persist.c) commits. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "env.h"
#include "error.h"
#include "layout.h"
#include "save.h"
#include "retention.h"
#include "util.h"
#include "validate.h"

static uint64_t chunk_count(uint64_t bytes, uint64_t chunk)
{
    return bytes == 0 ? 0 : (bytes + chunk - 1) / chunk;
}

/* ---------------------------------------------------------------- handles */


void save_unref(ckpt_save *s)
{
    pthread_mutex_lock(&s->lock);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (!last)
        return;
    if (s->thread_started && !s->joined)
        pthread_join(s->thread, NULL);
    if (!s->thread_started)
        save_release_events(s); /* failed begin: the persist thread never ran */
    free(s->deferred);
    free(s->deferred_mem);
    free(s->jobs);
    shard_writer_free(s->writer);
    manifest_clear(&s->m);
    free(s->tmp);
    pool_group_destroy(&s->group);
    pthread_mutex_destroy(&s->join_lock);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int save_wait(ckpt_save *s)
{
    pthread_mutex_lock(&s->lock);
    while (!s->done)
        pthread_cond_wait(&s->cond, &s->lock);
    int status = s->error.status;
    if (status)
        ckpt_error_restore(&s->error);
    pthread_mutex_unlock(&s->lock);
    /* Join so the thread's resources go now, not at free. */
    pthread_mutex_lock(&s->join_lock);
    if (s->thread_started && !s->joined) {
        pthread_join(s->thread, NULL);
        s->joined = 1;
    }
    pthread_mutex_unlock(&s->join_lock);
    return status;
}

void save_drain(ckpt_store *st)
{
    ckpt_save *s = st->inflight;
    if (!s)
        return;
    st->inflight = NULL;
    save_wait(s);
    ckpt_error_clear(); /* its status belongs to its handle */
    save_unref(s);
}

/* ---------------------------------------------------------------- workers */

static int encode_job_run(void *arg, int worker)
{
    encode_job *j = arg;
    ckpt_save *s = j->save;
    ckpt_store *st = s->store;
    if (j->ev) {
        int rc = device_event_wait(st->dev, j->ev);
        if (rc)
            return rc;
    }
    if (pool_group_failed(&s->group))
        return CKPT_OK; /* the save is lost already; drain quickly */
    const void *stored;
    chunk_meta meta;
    worker_ctx *w = &st->workers[worker];
    adapt_ticket t;
    adapt_choose(st->adapt, j->n, &t);
    double t0 = util_now();
    int rc = CKPT_OK;
    if (t.compress)
        rc = codec_encode(w->codec, j->src, j->n, j->elem, &stored, &meta);
    else
        codec_store_raw(j->src, j->n, &stored, &meta);
    /* STORED verification reads every frame back as it is written. */
    int check = st->opts.verify_after_save == CKPT_VERIFY_STORED;
    if (!rc && check)
        rc = worker_reserve_in(w, (size_t)meta.stored_len);
    if (rc)
        return rc;
    double t1 = util_now();
    rc = shard_writer_append(s->writer, j->tensor, j->offset, &meta, stored,
                             check ? w->in : NULL);
    adapt_record(st->adapt, &t, (size_t)meta.stored_len, t1 - t0, util_now() - t1);
    return rc;
}

/* Wait until every queued job has run, without consuming their status. */
void save_wait_jobs_idle(pool_group *g)
{
    pthread_mutex_lock(&g->lock);
    while (g->pending > 0)
        pthread_cond_wait(&g->done, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

/* ------------------------------------------------------------------ begin */

static int ensure_arena(ckpt_store *st, size_t need, int pinned)
{
    /* Asked for pinned before and the cap said no: pageable it stays. */
    if (st->arena && st->arena_cap >= need &&
        (st->arena_pinned || !pinned || st->arena_asked_pinned))
        return CKPT_OK;
    device_host_free(st->dev, st->arena, st->arena_cap, st->arena_pinned);
    st->arena = NULL;
    st->arena_cap = 0;
    void *p;
    int got_pinned;
    int rc = device_host_alloc(st->dev, need, pinned, &p, &got_pinned);
    if (rc)
        return rc;
    st->arena = p;
    st->arena_cap = need;
    st->arena_pinned = got_pinned;
    st->arena_asked_pinned = pinned;
    return CKPT_OK;
}

static int build_manifest(ckpt_save *s, const ckpt_tensor *t, size_t count,
                          const ckpt_save_options *opts)
{
    ckpt_store *st = s->store;
    manifest *m = &s->m;
    m->time = util_wall_time();
    m->chunk_bytes = st->opts.chunk_bytes;
    m->level = st->opts.level;
    if (getrandom(m->id, sizeof m->id, 0) != (ssize_t)sizeof m->id) {
        uint64_t a = (uint64_t)(m->time * 1e9), b = (uint64_t)m->step ^ (uint64_t)getpid();
        memcpy(m->id, &a, 8);
        memcpy(m->id + 8, &b, 8);
    }
    if (opts && opts->metadata_json) {
        json_error_t err;
        m->metadata = json_loads(opts->metadata_json, JSON_DECODE_ANY, &err);
        if (!m->metadata)
            return ckpt_seterr(CKPT_EINVAL, "metadata is not valid JSON (line %d, "
                               "column %d: %s)", err.line, err.column, err.text);
    }
    if (!(m->env = env_record(st->dev, !(st->opts.flags & CKPT_OPEN_NO_CMDLINE))))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory recording the environment");
    char shard_name[SHARD_NAME_SIZE];
    shard_file_name(0, shard_name); /* one process, one rank: rank 0 */
    m->shards = calloc(1, sizeof *m->shards);
    m->tensors = calloc(count ? count : 1, sizeof *m->tensors);
    if (!m->shards || !m->tensors || !(m->shards[0].file = util_strdup(shard_name)))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    m->nshards = 1;
    for (size_t i = 0; i < count; i++, m->ntensors++) {
        manifest_tensor *mt = &m->tensors[i];
        if (!(mt->name = util_strdup(t[i].name)))
            return ckpt_seterr(CKPT_ENOMEM, "out of memory");
        mt->dtype = t[i].dtype;
        mt->ndim = t[i].ndim;
        for (int d = 0; d < t[i].ndim; d++)
            mt->shape[d] = t[i].shape[d];
        mt->bytes = t[i].bytes;
        mt->chunks = chunk_count(t[i].bytes, m->chunk_bytes);
    }
    return CKPT_OK;
}

/* Queue jobs [from, to): the caller's copy runs alone first, so workers do
 * not compete with it for the cores while the caller is stalled. */
static int submit_range(ckpt_save *s, size_t from, size_t to)
{
    for (size_t k = from; k < to; k++) {
        int rc = pool_submit(s->store->pool, &s->group, encode_job_run, &s->jobs[k]);
        if (rc)
            return rc;
        s->njobs = k + 1;
    }
    return CKPT_OK;
}

/* Order the snapshot after the caller's stream; in DEVICE mode also issue
 * the D2D copies, after which the snapshot marker is known at once. */
static int snapshot_start(ckpt_save *s, const ckpt_tensor *t, size_t count,
                          const ckpt_memory *mem, void *stream)
{
    ckpt_store *st = s->store;
    int rc;
    if ((rc = device_snapshot_reserve(st->dev, t, mem, count, &s->staged)) ||
        (rc = device_snapshot_start(st->dev, stream)) ||
        (s->staged && (rc = device_record(st->dev, &s->snap_ev))))
        return rc;
    return CKPT_OK;
}

/* Copy every chunk into the arena and queue its encode job. */
int save_snapshot_chunks(ckpt_save *s, const ckpt_tensor *t, size_t count,
                           const ckpt_memory *mem, int any_device)
{
    ckpt_store *st = s->store;
    uint64_t chunk = st->opts.chunk_bytes;
    int rc;
    size_t used = 0, k = 0, queued = 0;
    for (size_t i = 0; i < count; i++) {
        for (uint64_t off = 0; off < t[i].bytes; off += chunk, k++) {
            size_t n = (size_t)(t[i].bytes - off < chunk ? t[i].bytes - off : chunk);
            if (used + n > st->arena_cap) {
                /* The state is larger than the arena: encode what it holds,
                 * let it drain, then reuse it from the start (memory stays
                 * bounded; the caller waits for that part). */
                if ((rc = submit_range(s, queued, k)))
                    return rc;
                queued = k;
                save_wait_jobs_idle(&s->group);
                if (pool_group_failed(&s->group))
                    return CKPT_OK; /* persist reports the job's error */
                used = 0;
            }
            unsigned char *dst = st->arena + used;
            const unsigned char *src = (const unsigned char *)t[i].data + off;
            encode_job *j = &s->jobs[k];
            *j = (encode_job){s, (uint32_t)i, off, dst, n, codec_shuffle_width(t[i].dtype), NULL};
            if (mem[i] == CKPT_MEM_DEVICE) {
                if ((rc = device_copy_d2h(st->dev, dst, src, n, t[i].name)) ||
                    (rc = device_record(st->dev, &j->ev)))
                    return rc;
            } else {
                memcpy(dst, src, n);
            }
            used += n;
        }
    }
    if ((rc = submit_range(s, queued, k)))
        return rc;
    if (any_device && !s->staged) {
        device_event *ev;
        if ((rc = device_record(st->dev, &ev)))
            return rc;
        pthread_mutex_lock(&s->lock);
        s->snap_ev = ev;
        pthread_mutex_unlock(&s->lock);
    }
    return CKPT_OK;
}

static int begin_locked(ckpt_save *s, const ckpt_tensor *t, size_t count,
                        const ckpt_save_options *opts)
{
    ckpt_store *st = s->store;
    int rc = validate_tensors(t, count, 0);
    if (rc)
        return rc;
    ckpt_memory *mem = calloc(count ? count : 1, sizeof *mem);
    if (!mem)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int any_device = 0;
    uint64_t total = 0, chunks = 0;
    for (size_t i = 0; i < count && !rc; i++) {
        if (t[i].bytes == 0)
            mem[i] = CKPT_MEM_HOST;
        else if ((rc = device_classify(st->dev, t[i].data, t[i].memory, &mem[i])))
            ckpt_seterr(rc, "tensor '%s': %s", t[i].name, ckpt_error_last());
        any_device |= mem[i] == CKPT_MEM_DEVICE;
        total += t[i].bytes;
        chunks += chunk_count(t[i].bytes, st->opts.chunk_bytes);
    }
    if (!rc)
        rc = build_manifest(s, t, count, opts);
    if (!rc)
        adapt_save_begin(st->adapt); /* no job of an earlier save runs now */
    if (!rc && !(s->jobs = calloc(chunks ? chunks : 1, sizeof *s->jobs)))
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory for %llu chunk jobs",
                         (unsigned long long)chunks);
    if (!rc)
        s->jobs_total = (size_t)chunks;
    s->stats.raw_bytes = total;
    /* The arena holds the whole state when the limit allows, else at least
     * one chunk; it is grown only here, while no save is in flight. */
    uint64_t need = total < st->opts.host_memory_limit ? total : st->opts.host_memory_limit;
    if (any_device && st->opts.snapshot_mode == CKPT_SNAPSHOT_STREAM &&
        need > st->opts.pinned_limit)
        need = st->opts.pinned_limit; /* a bounded pinned pool, reused in passes */
    if (need < st->opts.chunk_bytes && total > need)
        need = st->opts.chunk_bytes;
    if (!rc)
        rc = ensure_arena(st, (size_t)need, any_device);
    if (!rc)
        rc = layout_make_temp(&st->lay, s->m.step, &s->tmp);
    if (!rc) {
        char *path = util_join(s->tmp, s->m.shards[0].file);
        rc = path ? shard_writer_open(&s->writer, &st->lay.fs, path, st->lay.file_mode,
                                     s->m.step, s->m.id, 0)
                  : ckpt_seterr(CKPT_ENOMEM, "out of memory");
        free(path);
    }
    if (!rc && any_device)
        rc = snapshot_start(s, t, count, mem, opts ? opts->cuda_stream : NULL);
    if (!rc && any_device && st->opts.snapshot_mode == CKPT_SNAPSHOT_STREAM &&
        total > st->arena_cap) {
        /* Several passes through the pool: let the persist thread run them
         * so the caller is not held for compression and writing. */
        s->deferred = malloc((count ? count : 1) * sizeof *s->deferred);
        if (!s->deferred) {
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
        } else {
            for (size_t i = 0; i < count; i++) {
                s->deferred[i] = t[i];
                s->deferred[i].name = s->m.tensors[i].name;
                s->deferred[i].shape = NULL; /* not needed for copying */
            }
            s->deferred_mem = mem;
            s->ndeferred = count;
            mem = NULL;
        }
    } else if (!rc) {
        rc = save_snapshot_chunks(s, t, count, mem, any_device);
        s->snapshot_done = 1;
    }
    free(mem);
    if (rc) {
        /* Let queued jobs finish before the arena and writer go away. */
        save_wait_jobs_idle(&s->group);
        device_quiesce(st->dev); /* copies already enqueued write into the arena */
        ckpt_error_state e;
        ckpt_error_capture(&e, rc);
        shard_writer_free(s->writer);
        s->writer = NULL;
        if (s->tmp)
            layout_remove_temp(&st->lay, s->tmp);
        ckpt_error_restore(&e);
    }
    return rc;
}

int save_begin(ckpt_save **out, ckpt_store *st, int64_t step, const ckpt_tensor *tensors,
               size_t count, const ckpt_save_options *opts)
{
    ckpt_save *s = calloc(1, sizeof *s);
    if (!s)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    s->store = st;
    s->refs = 1;
    s->m.step = step;
    s->stats.step = step;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->join_lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pool_group_init(&s->group);

    pthread_mutex_lock(&st->api_lock);
    save_drain(st); /* one save in flight at a time: memory stays bounded */
    s->t_begin = util_now();
    int rc = retention_check_order(st, step);
    if (!rc)
        rc = begin_locked(s, tensors, count, opts);
    if (!rc) {
        s->t_return = util_now();
        s->stats.stall_s = s->t_return - s->t_begin;
        s->refs = 2;
        if (pthread_create(&s->thread, NULL, save_persist_thread, s) != 0) {
            s->refs = 1;
            rc = ckpt_seterr(CKPT_ENOMEM, "cannot start the persist thread");
            save_wait_jobs_idle(&s->group);
            shard_writer_free(s->writer);
            s->writer = NULL;
            layout_remove_temp(&st->lay, s->tmp);
        } else {
            s->thread_started = 1;
            st->inflight = s;
        }
    }
    pthread_mutex_unlock(&st->api_lock);
    if (rc) {
        ckpt_error_state e;
        ckpt_error_capture(&e, rc);
        save_unref(s);
        return ckpt_error_restore(&e);
    }
    *out = s;
    return CKPT_OK;
}

void save_wait_snapshot_locked(ckpt_save *s)
{
    while (!s->snapshot_done && !s->done)
        pthread_cond_wait(&s->cond, &s->lock);
}

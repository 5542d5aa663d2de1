/* save: the asynchronous save pipeline.
 *
 * ckpt_save_begin (caller's thread): validate, copy every chunk into the
 * store's snapshot arena and queue one encode job per chunk, then start the
 * persist thread and return.  Encode jobs (workers): shuffle + zstd + xxh3,
 * append the frame to the shard.  The persist thread (persist.c) commits. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "env.h"
#include "error.h"
#include "eventlog.h"
#include "jsonscan.h"
#include "jsontext.h"
#include "layout.h"
#include "save.h"
#include "retention.h"
#include "util.h"
#include "validate.h"

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

/* Small chunks go in batches: consecutive jobs of up to BATCH_BYTES raw
 * bytes (BATCH_MAX jobs) run as one, and their frames reach the shard in
 * one write and one read back.  10,000 tiny tensors would otherwise cost
 * 10,000 rounds of queueing, system calls and rate bookkeeping. */
#define BATCH_BYTES ((size_t)256 << 10)
#define BATCH_MAX 256

/* Bytes of a batch compressed to measure zstd when adapt asks (a 16th of a
 * default chunk: long enough to time, short enough to cost little). */
#define PROBE_BYTES (256u << 10)

/* Compress up to PROBE_BYTES of the batch's first bytes, discard the output
 * and report its rate and ratio to adapt.  A failure (no memory for the
 * codec's buffers) leaves no sample: the choice is made without it. */
static void probe_zstd(ckpt_store *st, worker_ctx *w, const encode_job *jobs, size_t count)
{
    size_t done = 0, stored = 0;
    double t0 = util_now();
    for (size_t i = 0; i < count && done < PROBE_BYTES; i++) {
        size_t n = jobs[i].n < PROBE_BYTES - done ? jobs[i].n : PROBE_BYTES - done;
        if (jobs[i].elem > 1 && n >= jobs[i].elem)
            n -= n % jobs[i].elem; /* whole elements, shuffled as the chunk's */
        const void *out;
        chunk_meta meta;
        if (n == 0 || codec_encode(w->codec, jobs[i].src, n, jobs[i].elem, &out, &meta))
            continue;
        done += n;
        stored += (size_t)meta.stored_len;
    }
    adapt_record_probe(st->adapt, done, stored, util_now() - t0);
}

/* Runs the `batch` jobs starting at `arg`. */
static int encode_job_run(void *arg, int worker)
{
    encode_job *jobs = arg;
    ckpt_save *s = jobs->save;
    ckpt_store *st = s->store;
    size_t count = jobs->batch, raw = 0;
    for (size_t i = 0; i < count; i++) {
        raw += jobs[i].n;
        if (jobs[i].ev) {
            int rc = device_event_wait(st->dev, jobs[i].ev);
            if (rc)
                return rc;
        }
    }
    if (pool_group_failed(&s->group))
        return CKPT_OK; /* the save is lost already; drain quickly */
    shard_frame frames[BATCH_MAX];
    const void *stored = NULL;
    size_t total = 0;
    worker_ctx *w = &st->workers[worker];
    adapt_ticket t;
    if (adapt_probe_wanted(st->adapt))
        probe_zstd(st, w, jobs, count);
    adapt_choose(st->adapt, raw, &t);
    double t0 = util_now();
    int rc = CKPT_OK;
    for (size_t i = 0; i < count && !rc; i++) {
        encode_job *j = &jobs[i];
        shard_frame *f = &frames[i];
        f->tensor = j->tensor;
        f->offset = j->offset;
        if (t.compress)
            rc = codec_encode(w->codec, j->src, j->n, j->elem, &stored, &f->meta);
        else
            codec_store_raw(j->src, j->n, &stored, &f->meta);
        if (rc || count == 1)
            break; /* one frame is written from where the codec left it */
        rc = worker_reserve_frames(w, total + (size_t)f->meta.stored_len);
        if (!rc)
            memcpy(w->frames + total, stored, (size_t)f->meta.stored_len);
        total += (size_t)f->meta.stored_len;
    }
    if (count == 1)
        total = (size_t)frames[0].meta.stored_len;
    else
        stored = w->frames;
    /* STORED verification reads every frame back as it is written. */
    int check = st->opts.verify_after_save == CKPT_VERIFY_STORED;
    if (!rc && check)
        rc = worker_reserve_in(w, total);
    if (rc)
        return rc;
    double t1 = util_now();
    rc = shard_writer_append_frames(s->writer, frames, count, stored, check ? w->in : NULL);
    adapt_record(st->adapt, &t, total, t1 - t0, util_now() - t1);
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

/* A host buffer of at least `need` bytes in *buf (pinned when asked and the
 * pinned cap allows).  Grown only in begin, while no save is in flight. */
static int ensure_buffer(ckpt_store *st, unsigned char **buf, size_t *cap, int *is_pinned,
                         int *asked_pinned, size_t need, int pinned)
{
    /* Asked for pinned before and the cap said no: pageable it stays. */
    if (*buf && *cap >= need && (*is_pinned || !pinned || *asked_pinned))
        return CKPT_OK;
    device_host_retire(st->dev, *buf, *cap, *is_pinned); /* no device sync here */
    *buf = NULL;
    *cap = 0;
    void *p;
    int got_pinned;
    int rc = device_host_alloc(st->dev, need, pinned, &p, &got_pinned);
    if (rc)
        return rc;
    *buf = p;
    *cap = need;
    *is_pinned = got_pinned;
    *asked_pinned = pinned;
    return CKPT_OK;
}

static int ensure_arena(ckpt_store *st, size_t need, int pinned)
{
    return ensure_buffer(st, &st->arena, &st->arena_cap, &st->arena_pinned,
                         &st->arena_asked_pinned, need, pinned);
}

/* Whether a pinned snapshot buffer of `need` bytes is at hand: the store's
 * is pinned and large enough, or one fits under pinned_limit beside the
 * pinned memory held elsewhere (the current buffer is freed to grow). */
static int arena_fits_pinned(ckpt_store *st, uint64_t need)
{
    if (st->arena && st->arena_pinned && st->arena_cap >= need)
        return 1;
    uint64_t held = device_pinned_bytes(st->dev);
    if (st->arena && st->arena_pinned)
        held -= held >= st->arena_cap ? st->arena_cap : held;
    return need <= st->opts.pinned_limit && held <= st->opts.pinned_limit - need;
}

static int ensure_dpool(ckpt_store *st, size_t need)
{
    return ensure_buffer(st, &st->dpool, &st->dpool_cap, &st->dpool_pinned,
                         &st->dpool_asked_pinned, need, 1);
}

static int build_manifest(ckpt_save *s, const ckpt_tensor *t, size_t count,
                          const ckpt_save_options *opts)
{
    ckpt_store *st = s->store;
    manifest *m = &s->m;
    m->time = util_wall_time();
    m->chunk_bytes = st->opts.chunk_bytes;
    m->level = st->opts.level;
    if (st->shared_id_set) {
        memcpy(m->id, st->shared_id, sizeof m->id); /* every rank's shard carries it */
    } else if (getrandom(m->id, sizeof m->id, 0) != (ssize_t)sizeof m->id) {
        uint64_t a = (uint64_t)(m->time * 1e9), b = (uint64_t)m->step ^ (uint64_t)getpid();
        memcpy(m->id, &a, 8);
        memcpy(m->id + 8, &b, 8);
    }
    if (!(m->env = env_record(st->dev, !(st->opts.flags & CKPT_OPEN_NO_CMDLINE))))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory recording the environment");
    if (opts && opts->frameworks_json) {
        int rc = env_add_frameworks(m->env, opts->frameworks_json);
        if (rc)
            return rc;
    }
    char shard_name[SHARD_NAME_SIZE];
    shard_file_name(st->rank, shard_name); /* one process: rank 0 */
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
        mt->chunks = save_chunk_count(t[i].bytes, m->chunk_bytes);
    }
    return CKPT_OK;
}

/* The jobs are queued after the snapshot copy that feeds them (the
 * caller's, shared with the workers: snapshot.c's host_flush), so encoding
 * does not compete with it for the cores while the caller is stalled. */
int save_submit_range(ckpt_save *s, size_t from, size_t to)
{
    void **heads = calloc(to > from ? to - from : 1, sizeof *heads);
    if (!heads)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory queueing %zu jobs", to - from);
    size_t nheads = 0, end = from;
    for (size_t k = from; k < to;) {
        encode_job *j = &s->jobs[k];
        if (!j->src || j->queued) {
            k++;
            continue;
        }
        size_t n = 1, bytes = j->n;
        for (; k + n < to && n < BATCH_MAX; n++) {
            const encode_job *x = &s->jobs[k + n];
            if (!x->src || x->queued || bytes + x->n > BATCH_BYTES)
                break;
            bytes += x->n;
        }
        j->batch = n;
        heads[nheads++] = j;
        k += n;
        end = k;
    }
    /* One wake-up for all: the caller is stalled until this returns. */
    int rc = pool_submit_many(s->store->pool, &s->group, encode_job_run, heads, nheads);
    free(heads);
    if (rc)
        return rc;
    for (size_t k = from; k < end; k++)
        if (s->jobs[k].src)
            s->jobs[k].queued = 1;
    if (nheads && s->njobs < end)
        s->njobs = end;
    return CKPT_OK;
}

/* Order the snapshot after the caller's stream; in DEVICE mode also issue
 * the D2D copies, after which the snapshot marker is known at once. */
static int snapshot_start(ckpt_save *s, const ckpt_tensor *t, size_t count,
                          const ckpt_memory *mem, int ordinal, void *stream)
{
    ckpt_store *st = s->store;
    int rc;
    if ((rc = device_snapshot_reserve(st->dev, t, mem, count, ordinal, &s->staged)) ||
        (rc = device_snapshot_start(st->dev, stream)) ||
        (s->staged && (rc = device_record(st->dev, &s->snap_ev))))
        return rc;
    return CKPT_OK;
}

/* Copy runs a save of device tensors queues at most from the caller's
 * thread (each one copy; events mark them in groups); beyond that the
 * device chunk loop goes to the persist thread, where a full stream may
 * block. */
#define CALLER_RUNS_MAX 128

/* Where every device tensor of the save lives: one CUDA device (managed
 * memory, ordinal -1, goes with any). */
static int save_device(const ckpt_tensor *t, const ckpt_memory *mem, const int *ord,
                       size_t count, int *ordinal)
{
    size_t first = count;
    for (size_t i = 0; i < count; i++) {
        if (mem[i] != CKPT_MEM_DEVICE || ord[i] < 0)
            continue;
        if (first == count) {
            first = i;
        } else if (ord[i] != ord[first]) {
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s' is on CUDA device %d and tensor "
                               "'%s' on CUDA device %d: one save takes the device tensors "
                               "of one device (use one store per device, as one process "
                               "or thread per GPU does)", t[first].name, ord[first],
                               t[i].name, ord[i]);
        }
    }
    *ordinal = first == count ? -1 : ord[first];
    return CKPT_OK;
}

/* Keep copies of the device tensors' descriptors for the persist thread. */
static int defer_device(ckpt_save *s, const ckpt_tensor *t, size_t count, ckpt_memory **mem)
{
    s->deferred = malloc((count ? count : 1) * sizeof *s->deferred);
    if (!s->deferred)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        s->deferred[i] = t[i];
        s->deferred[i].name = s->m.tensors[i].name;
        s->deferred[i].shape = NULL; /* not needed for copying */
    }
    s->deferred_mem = *mem;
    s->ndeferred = count;
    *mem = NULL;
    return CKPT_OK;
}

/* The caller's metadata, checked on a worker while the caller copies the
 * snapshot, and kept as compact text for the manifest.  jsonscan (no tree)
 * is sure of almost every text, a Python state's structure included; the
 * rest jansson parses and prints (duplicate keys: the last one stays). */
typedef struct meta_parse {
    const char *text; /* the caller's, valid while begin runs; NULL: none */
    int queued;
    pool_group group;
    char *out;        /* the compact text; NULL: not JSON, or no memory */
    int nomem;
    int too_deep;     /* JSON that jansson reads but a manifest cannot hold */
    size_t values, containers; /* jsonscan_tally's counts, when too many */
    json_error_t err;
} meta_parse;

/* How deep jansson counts `v` (a scalar is 1, [1] is 2).  Recursion is
 * bounded: jansson builds no tree deeper than JSON_PARSER_MAX_DEPTH. */
static size_t json_depth(const json_t *v)
{
    size_t most = 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            size_t d = json_depth(json_array_get(v, i));
            most = d > most ? d : most;
        }
    } else if (json_is_object(v)) {
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)v, key, member) {
            size_t d = json_depth(member);
            most = d > most ? d : most;
        }
    }
    return most + 1;
}

static int meta_parse_run(void *arg, int worker)
{
    (void)worker;
    meta_parse *p = arg;
    size_t containers, values = jsonscan_tally(p->text, strlen(p->text), &containers);
    if (values > MANIFEST_META_MAX_VALUES || containers > MANIFEST_META_MAX_CONTAINERS) {
        p->values = values;
        p->containers = containers;
        return CKPT_OK;
    }
    int rc = jsonscan_whole(p->text, strlen(p->text), MANIFEST_META_MAX_DEPTH, &p->out);
    if (rc != 0) {
        p->nomem = rc < 0;
        return CKPT_OK; /* judged by meta_parse_end, on the caller's thread */
    }
    json_t *v = json_loads(p->text, JSON_DECODE_ANY, &p->err);
    /* jansson reads one level more than a manifest holds under its root:
     * refuse that here, not when the save reads its manifest back. */
    if (!v)
        return CKPT_OK;
    if (json_depth(v) > MANIFEST_META_MAX_DEPTH) {
        p->too_deep = 1;
    } else {
        p->out = jsontext_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
        p->nomem = !p->out;
    }
    json_decref(v);
    return CKPT_OK;
}

static void meta_parse_start(ckpt_store *st, meta_parse *p, const ckpt_save_options *opts)
{
    memset(p, 0, sizeof *p);
    p->text = opts ? opts->metadata_json : NULL;
    if (!p->text)
        return;
    pool_group_init(&p->group);
    p->queued = st->pool && pool_submit(st->pool, &p->group, meta_parse_run, p) == CKPT_OK;
    if (!p->queued) /* no pool, or no memory to queue: here */
        meta_parse_run(p, 0);
}

/* Why jansson refused the metadata, in words: valid JSON can hold what a
 * checkpoint cannot. */
static const char *meta_refusal(enum json_error_code code)
{
    switch (code) {
    case json_error_numeric_overflow:
        return "holds a number a checkpoint cannot store (integers must fit in 64 bits, "
               "reals in a double)";
    case json_error_null_character:
        return "holds a string with U+0000, which a checkpoint cannot store";
    case json_error_stack_overflow:
        return "nests deeper than a checkpoint holds";
    default:
        return "is not valid JSON";
    }
}

/* Wait for the check; the text goes into the manifest when `rc` (the rest
 * of begin) is CKPT_OK.  Returns `rc`, or CKPT_EINVAL for text that is not
 * JSON, CKPT_ENOMEM. */
static int meta_parse_end(meta_parse *p, manifest *m, int rc)
{
    if (!p->text)
        return rc;
    if (p->queued)
        pool_group_wait(&p->group);
    pool_group_destroy(&p->group);
    if (!rc && p->nomem)
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory reading the metadata");
    else if (!rc && (p->values || p->containers))
        rc = ckpt_seterr(CKPT_EINVAL, "metadata holds %zu JSON values (%zu of them arrays "
                         "or objects), more than a checkpoint's metadata holds (%u, %u): "
                         "save large arrays as tensors", p->values, p->containers,
                         MANIFEST_META_MAX_VALUES, MANIFEST_META_MAX_CONTAINERS);
    else if (!rc && p->too_deep)
        rc = ckpt_seterr(CKPT_EINVAL, "metadata nests deeper than a checkpoint holds "
                         "(maximum parsing depth %d)", MANIFEST_META_MAX_DEPTH);
    else if (!rc && !p->out)
        rc = ckpt_seterr(CKPT_EINVAL, "metadata %s (line %d, column %d: %s)",
                         meta_refusal(json_error_code(&p->err)), p->err.line,
                         p->err.column, p->err.text);
    if (rc)
        free(p->out);
    else
        m->metadata = p->out;
    return rc;
}

static int begin_locked(ckpt_save *s, const ckpt_tensor *t, size_t count,
                        const ckpt_save_options *opts)
{
    ckpt_store *st = s->store;
    int rc = validate_tensors(t, count, 0);
    if (rc)
        return rc;
    meta_parse meta;
    meta_parse_start(st, &meta, opts);
    device_note_reset(st->dev);
    ckpt_memory *mem = calloc(count ? count : 1, sizeof *mem);
    int *ord = calloc(count ? count : 1, sizeof *ord);
    if (!mem || !ord) {
        free(mem);
        free(ord);
        return meta_parse_end(&meta, &s->m, ckpt_seterr(CKPT_ENOMEM, "out of memory"));
    }
    int any_device = 0, ordinal = -1;
    uint64_t total = 0, chunks = 0, dev_bytes = 0, host_bytes = 0, runs = 0;
    for (size_t i = 0; i < count && !rc; i++) {
        ord[i] = -1;
        if (t[i].bytes == 0)
            mem[i] = CKPT_MEM_HOST;
        else if ((rc = device_classify(st->dev, t[i].data, t[i].memory, &mem[i], &ord[i])))
            ckpt_seterr(rc, "tensor '%s': %s", t[i].name, ckpt_error_last());
        if (mem[i] == CKPT_MEM_DEVICE) {
            any_device = 1;
            dev_bytes += t[i].bytes;
            runs += 1 + t[i].bytes / SAVE_RUN_MAX;
        } else {
            host_bytes += t[i].bytes;
        }
        total += t[i].bytes;
        chunks += save_chunk_count(t[i].bytes, st->opts.chunk_bytes);
    }
    if (!rc)
        rc = save_device(t, mem, ord, count, &ordinal);
    if (!rc && any_device && ordinal < 0) /* managed memory only: the caller's device */
        ordinal = device_current_ordinal(st->dev);
    free(ord);
    if (!rc && any_device && opts) /* before any pinned allocation */
        rc = device_refuse_capture(st->dev, ordinal, opts->cuda_stream, "save");
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
    /* Device tensors beyond the pinned cap would otherwise land in pageable
     * memory, where a D2H copy is synchronous: the caller would wait for
     * its queued GPU work and the whole copy.  They go through a pinned
     * pool in passes on the persist thread instead, as do device tensors
     * too many to queue from here (DEVICE mode stages on the GPU). */
    int many = runs > CALLER_RUNS_MAX;
    uint64_t limit = st->opts.host_memory_limit, chunk = st->opts.chunk_bytes;
    /* The whole snapshot buffer must be pinned for the caller to queue
     * device copies: pinned memory already held (a restore's staging, the
     * pool of an earlier save) counts against the cap, and host tensors
     * share the buffer. */
    int pinned_ok = !any_device || arena_fits_pinned(st, total < limit ? total : limit);
    int stage = st->opts.snapshot_mode == CKPT_SNAPSHOT_DEVICE && !many && pinned_ok &&
                total <= limit;
    /* A snapshot buffer smaller than the state (host_memory_limit) wraps:
     * waiting for its first part to drain would make the caller wait for
     * the device copies queued behind its GPU work (in DEVICE mode too, as
     * the staged copies drain into it), so device tensors go through the
     * pool on the persist thread then. */
    int split = any_device && !stage &&
                (dev_bytes > st->opts.pinned_limit || many || !pinned_ok || total > limit);
    uint64_t arena_bytes = split ? host_bytes : total;
    uint64_t need = arena_bytes < limit ? arena_bytes : limit;
    if (need < chunk && arena_bytes > need)
        need = chunk;
    if (!rc && (need > 0 || !split))
        rc = ensure_arena(st, (size_t)need, any_device && !split);
    int refused = 0; /* the snapshot buffer came back pageable */
    if (!rc && any_device && !split && !st->arena_pinned) {
        /* The system refused pinned memory and the buffer is pageable
         * (device_host_alloc's fallback): a D2H copy into it is
         * synchronous, so the caller would wait for its own GPU work.
         * Device tensors go through the pool on the persist thread. */
        split = 1;
        stage = 0;
        refused = 1; /* device_host_alloc's note says so */
    }
    if (!rc && split) {
        uint64_t pool_bytes = dev_bytes < st->opts.pinned_limit ? dev_bytes : st->opts.pinned_limit;
        if (pool_bytes > limit)
            pool_bytes = limit;
        if (pool_bytes < chunk)
            pool_bytes = chunk;
        rc = ensure_dpool(st, (size_t)pool_bytes);
    }
    if (!rc)
        rc = layout_make_temp(&st->lay, s->m.step, &s->tmp);
    if (!rc) {
        char *path = util_join(s->tmp, s->m.shards[0].file);
        rc = path ? shard_writer_open(&s->writer, &st->lay.fs, path, st->lay.file_mode,
                                     s->m.step, s->m.id, st->rank)
                  : ckpt_seterr(CKPT_ENOMEM, "out of memory");
        free(path);
        if (!rc)
            layout_file_made(&st->lay, shard_writer_fd(s->writer));
        if (!rc && st->lay.fsync) /* the save ends in an fsync: start the disk now */
            shard_writer_write_back_early(s->writer);
    }
    if (!rc && any_device && !stage && !refused &&
        st->opts.snapshot_mode == CKPT_SNAPSHOT_DEVICE) {
        if (many)
            device_note(st->dev, "device snapshot mode used the host path: %llu copies "
                        "(separate device tensors) are too many to stage from the "
                        "training thread", (unsigned long long)runs);
        else
            device_note(st->dev, "device snapshot mode used the host path: a snapshot "
                        "buffer of %llu bytes does not fit under pinned_limit (%llu "
                        "bytes, %llu pinned already)", (unsigned long long)total,
                        (unsigned long long)st->opts.pinned_limit,
                        (unsigned long long)device_pinned_bytes(st->dev));
    }
    int started = !rc && any_device; /* device copies may be queued from here on */
    if (started) /* staging nothing when `stage` is off */
        rc = snapshot_start(s, t, stage ? count : 0, mem, ordinal,
                            opts ? opts->cuda_stream : NULL);
    if (!rc && any_device)
        device_describe(st->dev, s->m.env); /* with this save's fallbacks */
    if (!rc && split) {
        /* Host tensors now (their buffers are free when begin returns);
         * device tensors on the persist thread. */
        rc = save_snapshot_chunks(s, t, count, mem, PASS_HOST, st->arena, st->arena_cap);
        if (!rc)
            rc = defer_device(s, t, count, &mem);
    } else if (!rc) {
        rc = save_snapshot_chunks(s, t, count, mem, PASS_ALL, st->arena, st->arena_cap);
        s->snapshot_done = 1;
    }
    free(mem);
    rc = meta_parse_end(&meta, &s->m, rc);
    if (rc) {
        /* Let queued jobs finish before the arena and writer go away. */
        save_wait_jobs_idle(&s->group);
        /* Copies already enqueued write into the arena.  None before the
         * snapshot started: then no stream is synchronized (which, from a
         * thread capturing a CUDA graph, would break its capture). */
        if (started)
            device_quiesce(st->dev);
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
    s->owner = st->owner;
    s->refs = 1;
    s->m.step = step;
    s->stats.step = step;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->join_lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pool_group_init(&s->group);

    pthread_mutex_lock(&st->api_lock);
    save_drain(st); /* one save in flight at a time: memory stays bounded */
    eventlog_save_begun(st->events, step); /* after the previous one's end */
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
            /* as when begin fails: copies already enqueued would still
             * write into the arena the next save fills */
            device_quiesce(st->dev);
            shard_writer_free(s->writer);
            s->writer = NULL;
            layout_remove_temp(&st->lay, s->tmp);
        } else {
            s->thread_started = 1;
            st->inflight = s;
        }
    }
    /* Under the lock: the next begin on another thread frees the names of
     * this one's temporary directory (layout_make_temp). */
    if (rc)
        rc = layout_shown_error(&st->lay, rc);
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

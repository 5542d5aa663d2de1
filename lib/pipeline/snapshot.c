/* snapshot: the caller's copy of a save's chunks into the snapshot arena.
 * Host chunks are memcpy'd, the larger runs shared with idle workers; device
 * chunks are queued as copies on the backend's stream, merged into runs
 * and marked by events that the chunks' encode jobs wait for.  Each chunk's
 * encode job is queued once its copy is (save.c owns the jobs). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "save.h"

/* Device chunks that are contiguous both in device memory and in the
 * arena are copied by one cudaMemcpyAsync, up to SAVE_RUN_MAX bytes: a stream
 * holds about a thousand pending operations, and one copy per 4 MiB chunk
 * would fill it at 4 GiB.  The copies are marked by events in groups of at
 * least `mark_bytes` (SAVE_RUN_MAX, or a share of the state so that a save
 * records at most DEVICE_CALLER_RECORDS of them: a stream holds only 56
 * pending records of our blocking-sync events, device.h); the chunks of a
 * group wait for its event. */
typedef struct copy_run {
    unsigned char *dst;
    const unsigned char *src;
    size_t n;
    size_t first_job;  /* jobs [first_job, end_job) inside [dst, dst + n) */
    size_t end_job;
    const char *tensor;
    size_t tensor_index; /* the last chunk's tensor */
    /* The end of the device allocation the run starts in, asked once the
     * run could take another tensor's chunk (NULL: unknown, or not asked
     * yet while `asked` is 0).  A copy may not run from one allocation into
     * the next, though separate cudaMalloc blocks often sit side by side. */
    const unsigned char *alloc_end;
    int asked;
    /* Copies queued but not marked yet: their jobs are the `copied` ones
     * from mark_first on, `unmarked` bytes. */
    size_t mark_first;
    uint64_t unmarked;
    uint64_t mark_bytes;
} copy_run;

/* One event after the copies queued since the last: each copied job not
 * marked yet gets it (the first the original, the others duplicates). */
static int run_mark(ckpt_save *s, copy_run *r)
{
    if (r->unmarked == 0)
        return CKPT_OK;
    ckpt_store *st = s->store;
    device_event *ev = NULL, *first = NULL;
    int rc = device_record(st->dev, &ev);
    for (size_t k = r->mark_first; k < r->end_job && !rc; k++) {
        encode_job *j = &s->jobs[k];
        if (!j->copied || j->ev)
            continue; /* a host chunk, or marked already */
        if (!first) {
            j->ev = first = ev; /* the first job owns the original */
            ev = NULL;
        } else {
            rc = device_event_dup(st->dev, first, &j->ev);
        }
    }
    device_event_free(st->dev, ev);
    r->mark_first = r->end_job;
    r->unmarked = 0;
    return rc;
}

/* Queue run r's copy; mark the copies queued so far when they reach
 * mark_bytes, or always when `mark` (their jobs are about to run). */
static int run_flush(ckpt_save *s, copy_run *r, int mark)
{
    int rc = CKPT_OK;
    if (r->n) {
        if (r->unmarked == 0)
            r->mark_first = r->first_job;
        rc = device_copy_d2h(s->store->dev, r->dst, r->src, r->n, r->tensor);
        if (!rc)
            for (size_t k = r->first_job; k < r->end_job; k++) {
                encode_job *j = &s->jobs[k];
                if (j->src >= r->dst && j->src < r->dst + r->n)
                    j->copied = 1; /* not a host chunk between */
            }
        r->unmarked += r->n;
        r->n = 0;
    }
    if (!rc && (mark || r->unmarked >= r->mark_bytes))
        rc = run_mark(s, r);
    return rc;
}

/* Whether a chunk of another tensor at [src, src + n) may join run r: only
 * inside the allocation r starts in. */
static int same_allocation(ckpt_save *s, copy_run *r, const unsigned char *src, size_t n)
{
    if (!r->asked) {
        const void *end;
        r->asked = 1;
        r->alloc_end = device_alloc_end(s->store->dev, r->src, &end) == CKPT_OK ? end : NULL;
    }
    return r->alloc_end && n <= (size_t)(r->alloc_end - src) && src < r->alloc_end;
}

static int run_add(ckpt_save *s, copy_run *r, unsigned char *dst, const unsigned char *src,
                   size_t n, size_t job, const char *tensor, size_t tensor_index)
{
    /* Staged (DEVICE mode), each tensor is its own region of scratch: a
     * run across two would find no staged copy and read the caller's
     * memory itself, after the fence had let the next step overwrite it. */
    if (r->n && (dst != r->dst + r->n || src != r->src + r->n || r->n + n > SAVE_RUN_MAX ||
                 (tensor_index != r->tensor_index &&
                  (s->staged || !same_allocation(s, r, src, n))))) {
        int rc = run_flush(s, r, 0);
        if (rc)
            return rc;
    }
    if (r->n == 0) {
        r->dst = dst;
        r->src = src;
        r->first_job = job;
        r->asked = 0;
        r->alloc_end = NULL;
    }
    r->n += n;
    r->end_job = job + 1;
    r->tensor = tensor;
    r->tensor_index = tensor_index;
    return CKPT_OK;
}

/* Host chunks adjacent both in the caller's memory and in the arena (views
 * of one buffer, a flat parameter buffer) are copied as one piece, up to
 * PIECE_MAX bytes: a copy of 4 KiB runs at well below the speed of a large
 * one (which streams past the caches).
 *
 * The pieces are copied when the arena is full or the state is all in: by
 * the caller and, above PARALLEL_MIN bytes, by every worker as well, each
 * taking the next group of pieces (GROUP_MIN below) until none is left.
 * The caller is stalled for the copy anyway, and two threads copy about
 * 1.6 times as fast as one here (memory bandwidth one core cannot use
 * alone); the encode jobs are queued only after it, so nothing else
 * competes with it. */
#define PIECE_MAX ((size_t)4 << 20)
#define PARALLEL_MIN ((size_t)8 << 20)

typedef struct copy_piece {
    unsigned char *dst;
    const unsigned char *src;
    size_t n;
} copy_piece;

/* Threads take pieces in groups of at least GROUP_MIN bytes: one atomic
 * step per 4 KiB tensor of a state allocated tensor by tensor bounces the
 * counter's cache line between the cores for each (about a third of the
 * time of the copy itself, measured with bench_tiny ... apart). */
#define GROUP_MIN ((size_t)256 << 10)

typedef struct host_copy {
    copy_piece *p; /* cap pieces: one per chunk at most */
    size_t *g;     /* cap entries: the first piece of each group */
    size_t n, ng, cap;
    size_t bytes, gbytes; /* all pieces', the last group's */
    atomic_size_t next;   /* the next group to take */
} host_copy;

static void host_add(host_copy *h, unsigned char *dst, const unsigned char *src, size_t n)
{
    copy_piece *last = h->n ? &h->p[h->n - 1] : NULL;
    if (last && dst == last->dst + last->n && src == last->src + last->n &&
        last->n + n <= PIECE_MAX) {
        last->n += n;
    } else { /* n <= chunk bytes: at most one piece per chunk, within cap */
        if (h->ng == 0 || h->gbytes >= GROUP_MIN) {
            h->g[h->ng++] = h->n;
            h->gbytes = 0;
        }
        h->p[h->n++] = (copy_piece){dst, src, n};
    }
    h->bytes += n;
    h->gbytes += n;
}

static void copy_pieces(host_copy *h)
{
    for (size_t i; (i = atomic_fetch_add(&h->next, 1)) < h->ng;) {
        size_t end = i + 1 < h->ng ? h->g[i + 1] : h->n;
        for (size_t k = h->g[i]; k < end; k++)
            memcpy(h->p[k].dst, h->p[k].src, h->p[k].n);
    }
}

static int copy_job(void *arg, int worker)
{
    (void)worker;
    copy_pieces(arg);
    return CKPT_OK;
}

/* Copy every piece added since the last call (see above), then forget them. */
static void host_flush(ckpt_store *st, host_copy *h)
{
    atomic_store(&h->next, 0);
    size_t helpers = h->bytes >= PARALLEL_MIN && st->pool ? (size_t)st->nworkers : 0;
    if (helpers > h->ng - (h->ng > 0))
        helpers = h->ng ? h->ng - 1 : 0;
    void *args[64];
    if (helpers > sizeof args / sizeof args[0])
        helpers = sizeof args / sizeof args[0];
    for (size_t i = 0; i < helpers; i++)
        args[i] = h;
    pool_group g;
    pool_group_init(&g);
    int queued = helpers && pool_submit_many(st->pool, &g, copy_job, args, helpers) == CKPT_OK;
    copy_pieces(h); /* the caller's share; all of it when nothing was queued */
    if (queued) {
        pool_withdraw(st->pool, &g); /* helpers still queued behind other work */
        pool_group_wait(&g);         /* those copying their last piece */
    }
    pool_group_destroy(&g);
    h->n = h->ng = 0;
    h->bytes = h->gbytes = 0;
}

int save_snapshot_chunks(ckpt_save *s, const ckpt_tensor *t, size_t count,
                         const ckpt_memory *mem, save_pass pass,
                         unsigned char *arena, size_t cap)
{
    ckpt_store *st = s->store;
    uint64_t chunk = st->opts.chunk_bytes;
    int rc;
    size_t used = 0, k = 0, queued = 0;
    int any_device = 0;
    copy_run run = {0};
    uint64_t dev_bytes = 0;
    for (size_t i = 0; i < count; i++)
        if (mem[i] == CKPT_MEM_DEVICE && pass != PASS_HOST)
            dev_bytes += t[i].bytes;
    run.mark_bytes = dev_bytes / (DEVICE_CALLER_RECORDS - 2) + 1;
    if (run.mark_bytes < SAVE_RUN_MAX)
        run.mark_bytes = SAVE_RUN_MAX;
    host_copy host = {0};
    host.cap = s->jobs_total ? s->jobs_total : 1;
    /* one allocation: the pieces, then the groups' first pieces */
    if (!(host.p = malloc(host.cap * (sizeof *host.p + sizeof *host.g))))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory for %zu copies", host.cap);
    host.g = (size_t *)(host.p + host.cap);
    for (size_t i = 0; i < count; i++) {
        int is_dev = mem[i] == CKPT_MEM_DEVICE;
        if ((pass == PASS_HOST && is_dev) || (pass == PASS_DEVICE && !is_dev)) {
            k += save_chunk_count(t[i].bytes, chunk);
            continue;
        }
        any_device |= is_dev;
        for (uint64_t off = 0; off < t[i].bytes; off += chunk, k++) {
            size_t n = (size_t)(t[i].bytes - off < chunk ? t[i].bytes - off : chunk);
            if (used + n > cap) {
                /* The state is larger than the arena: encode what it holds,
                 * let it drain, then reuse it from the start (memory stays
                 * bounded; the thread running this waits for that part). */
                host_flush(st, &host);
                if ((rc = run_flush(s, &run, 1)) || (rc = save_submit_range(s, queued, k))) {
                    free(host.p);
                    return rc;
                }
                queued = k;
                save_wait_jobs_idle(&s->group);
                if (pool_group_failed(&s->group)) {
                    free(host.p);
                    return CKPT_OK; /* persist reports the job's error */
                }
                used = 0;
            }
            unsigned char *dst = arena + used;
            const unsigned char *src = (const unsigned char *)t[i].data + off;
            encode_job *j = &s->jobs[k];
            *j = (encode_job){s, (uint32_t)i, off, dst, n, codec_shuffle_width(t[i].dtype),
                              NULL, 0, 0, 0};
            if (is_dev) {
                if ((rc = run_add(s, &run, dst, src, n, k, t[i].name, i))) {
                    free(host.p);
                    return rc;
                }
            } else {
                host_add(&host, dst, src, n);
            }
            used += n;
        }
    }
    host_flush(st, &host);
    free(host.p);
    if ((rc = run_flush(s, &run, 1)) || (rc = save_submit_range(s, queued, k)))
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

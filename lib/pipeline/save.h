/* save: the state of one save, shared by its two halves: save.c (the
 * caller's side: validate, snapshot, queue encode jobs) and persist.c (the
 * background thread that commits).  lib/save.c is the public face. */
#ifndef CKPT_SAVE_H
#define CKPT_SAVE_H

#include <pthread.h>

#include "context.h"
#include "error.h"
#include "manifest.h"
#include "shardfile.h"

typedef struct encode_job {
    struct ckpt_save *save;
    uint32_t tensor;
    uint64_t offset;       /* in the tensor */
    const unsigned char *src; /* in the arena */
    size_t n;
    unsigned elem;
    device_event *ev;      /* copy completion for device chunks, else NULL */
    int queued;            /* submitted to the pool (alone or in a batch) */
    size_t batch;          /* a batch's first job: how many jobs it runs */
    int copied;            /* a device chunk whose copy is queued */
} encode_job;

/* Which chunks one run of the chunk loop snapshots. */
typedef enum save_pass { PASS_ALL, PASS_HOST, PASS_DEVICE } save_pass;

struct ckpt_save {
    ckpt_store *store;      /* may be freed before the handle (ckpt.h) */
    pid_t owner;            /* the store's owner: a forked child's copy is
                               refused without reading the store */
    pthread_mutex_t lock;   /* protects refs, done, error, stats, snap_ev,
                               snapshot_done */
    pthread_cond_t cond;
    int refs;               /* caller + store's in-flight slot */
    int done;
    ckpt_error_state error; /* the outcome, once done */
    ckpt_save_stats stats;
    pthread_t thread;
    int thread_started, joined;
    pthread_mutex_t join_lock;

    /* Owned by the pipeline until done. */
    ckpt_save_stats job_stats; /* rank 0 of several, once committed: every rank's
                                  sums (the global manifest's), for the event log */
    int have_job_stats;
    manifest m;
    char *tmp;
    shard_writer *writer;
    pool_group group;
    encode_job *jobs;
    size_t njobs;          /* queued so far */
    size_t jobs_total;     /* allocated (events may sit in unqueued ones) */
    device_event *snap_ev;  /* all snapshot copies complete */
    int staged;             /* DEVICE mode: tensors staged in device memory */
    /* Device tensors larger than the pinned pool, or too many to queue
     * from the caller's thread: their chunk loop (PASS_DEVICE, through
     * store->dpool) runs on the persist thread, from these copies of the
     * caller's descriptors; the caller must leave its device buffers alone
     * until snapshot_done (ckpt_save_wait_snapshot, ckpt_save_fence). */
    ckpt_tensor *deferred;
    ckpt_memory *deferred_mem;
    size_t ndeferred;
    int snapshot_done;      /* protected by lock; signalled on cond */
    double t_begin, t_return;
};

/* Begin a save (ckpt_save_begin after its argument checks): wait for the
 * save in flight, snapshot, start the persist thread.  *out gets a handle
 * with one reference, the caller's. */
int save_begin(ckpt_save **out, ckpt_store *st, int64_t step, const ckpt_tensor *t,
               size_t count, const ckpt_save_options *opts);
/* Block until the save has finished; its status, and its message as this
 * thread's last error.  Any thread, any number of times. */
int save_wait(ckpt_save *s);
/* Drop one reference; the last frees the save. */
void save_unref(ckpt_save *s);
/* Deferred (STREAM) snapshots: block, with s->lock held, until the chunk
 * loop has finished. */
void save_wait_snapshot_locked(ckpt_save *s);

/* persist.c: the thread body started by save_begin. */
void *save_persist_thread(void *arg);
/* Free the copy events (all complete once the jobs have run). */
void save_release_events(ckpt_save *s);

/* Chunks of `bytes` cut at `chunk` bytes each. */
static inline uint64_t save_chunk_count(uint64_t bytes, uint64_t chunk)
{
    return bytes == 0 ? 0 : (bytes + chunk - 1) / chunk;
}

/* The most bytes one device copy run covers (snapshot.c); begin counts a
 * save's runs with it. */
#define SAVE_RUN_MAX ((size_t)64 << 20)

/* snapshot.c */
/* Copy the chunks of `pass` into `arena` (cap bytes, reused in passes when
 * the state is larger) and queue their encode jobs. */
int save_snapshot_chunks(ckpt_save *s, const ckpt_tensor *t, size_t count,
                         const ckpt_memory *mem, save_pass pass,
                         unsigned char *arena, size_t cap);

/* save.c */
/* Queue the prepared jobs among s->jobs[from, to) that are not queued yet
 * (those with a source), in batches; CKPT_ENOMEM when the batch list cannot
 * be allocated. */
int save_submit_range(ckpt_save *s, size_t from, size_t to);
/* Wait until every queued job has run, without consuming their status. */
void save_wait_jobs_idle(pool_group *g);

#endif

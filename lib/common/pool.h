/* pool: a fixed set of worker threads running jobs from a bounded-free FIFO
 * (after zstd's lib/common/pool.c).  Jobs are grouped; a group counts its
 * outstanding jobs and keeps the first error, which the owner re-raises. */
#ifndef CKPT_POOL_H
#define CKPT_POOL_H

#include <pthread.h>
#include <stddef.h>

typedef struct pool pool;
/* A job gets the index of the worker running it (for per-worker state such
 * as codecs) and returns a status; on failure it also leaves a message. */
typedef int (*pool_fn)(void *arg, int worker);

typedef struct pool_group {
    pthread_mutex_t lock; /* protects pending, status, message */
    pthread_cond_t done;
    size_t pending;
    int status;           /* first error, CKPT_OK until then */
    char message[1024];
} pool_group;

int pool_create(pool **out, int threads);
/* Waits for queued jobs to finish, then joins the workers. */
void pool_free(pool *p);

void pool_group_init(pool_group *g);
void pool_group_destroy(pool_group *g);
/* Queue fn(arg) in group g.  Never blocks on the queue (it grows). */
int pool_submit(pool *p, pool_group *g, pool_fn fn, void *arg);
/* Queue fn(args[i]) for each of the n args in group g, under one lock and
 * one wake-up: the workers do not start (and compete for the cores with
 * the thread queueing) until every job is in.  All or none are queued. */
int pool_submit_many(pool *p, pool_group *g, pool_fn fn, void *const *args, size_t n);
/* Take back the jobs of g that no worker has started (they never run, and
 * count as done); returns how many.  For helpers that only share work the
 * caller finishes itself: waiting for them to start behind other jobs
 * would only delay it. */
size_t pool_withdraw(pool *p, pool_group *g);
/* Block until every job of g has run; returns g's status and, on error,
 * sets this thread's last error to the job's message. */
int pool_group_wait(pool_group *g);
/* Non-blocking: has the group an error already?  (Jobs use it to skip work
 * once a sibling failed.) */
int pool_group_failed(pool_group *g);

/* Threads the library owns (pool workers, a save's persist thread) mark
 * themselves so that code which must not disturb an application thread's
 * state (the CUDA device current on it) can tell the two apart. */
void pool_mark_library_thread(void);
/* 1 on a thread that called pool_mark_library_thread, else 0. */
int pool_on_library_thread(void);

#endif

#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "error.h"

typedef struct job {
    pool_fn fn;
    void *arg;
    pool_group *group;
    struct job *next;
} job;

struct pool {
    pthread_mutex_t lock; /* protects head, tail, stop */
    pthread_cond_t ready; /* a job was queued, or stop */
    job *head, *tail;
    int stop;
    int nthreads;
    pthread_t *threads;
};

typedef struct worker_arg {
    pool *p;
    int index;
} worker_arg;

static void finish(pool_group *g, int status)
{
    pthread_mutex_lock(&g->lock);
    if (status != CKPT_OK && g->status == CKPT_OK) {
        g->status = status;
        snprintf(g->message, sizeof g->message, "%s", ckpt_error_last());
    }
    if (--g->pending == 0)
        pthread_cond_broadcast(&g->done);
    pthread_mutex_unlock(&g->lock);
}

/* Per thread, written only by the thread itself: not shared state. */
static _Thread_local int tl_library_thread;

void pool_mark_library_thread(void)
{
    tl_library_thread = 1;
}

int pool_on_library_thread(void)
{
    return tl_library_thread;
}

static void *worker(void *varg)
{
    pool_mark_library_thread();
    worker_arg *wa = varg;
    pool *p = wa->p;
    int index = wa->index;
    free(wa);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->ready, &p->lock);
        job *j = p->head;
        if (!j) { /* stop, and nothing left */
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->lock);
        ckpt_error_clear();
        int status = j->fn(j->arg, index);
        pool_group *g = j->group;
        free(j);
        finish(g, status);
    }
}

int pool_create(pool **out, int threads)
{
    pool *p = calloc(1, sizeof *p);
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory creating the worker pool");
    if (threads < 1)
        threads = 1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->ready, NULL);
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    if (!p->threads) {
        pool_free(p);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory creating the worker pool");
    }
    for (int i = 0; i < threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || (wa->p = p, wa->index = i,
                    pthread_create(&p->threads[i], NULL, worker, wa) != 0)) {
            free(wa);
            pool_free(p);
            return ckpt_seterr(CKPT_ENOMEM, "cannot start worker thread %d", i);
        }
        p->nthreads++;
    }
    *out = p;
    return CKPT_OK;
}

void pool_free(pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->ready);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->ready);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void pool_group_init(pool_group *g)
{
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->done, NULL);
    g->pending = 0;
    g->status = CKPT_OK;
    g->message[0] = '\0';
}

void pool_group_destroy(pool_group *g)
{
    pthread_cond_destroy(&g->done);
    pthread_mutex_destroy(&g->lock);
}

int pool_submit(pool *p, pool_group *g, pool_fn fn, void *arg)
{
    job *j = malloc(sizeof *j);
    if (!j)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory queueing a job");
    j->fn = fn;
    j->arg = arg;
    j->group = g;
    j->next = NULL;
    pthread_mutex_lock(&g->lock);
    g->pending++;
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->ready);
    pthread_mutex_unlock(&p->lock);
    return CKPT_OK;
}

int pool_group_wait(pool_group *g)
{
    pthread_mutex_lock(&g->lock);
    while (g->pending > 0)
        pthread_cond_wait(&g->done, &g->lock);
    int status = g->status;
    if (status != CKPT_OK)
        ckpt_seterr(status, "%s", g->message);
    pthread_mutex_unlock(&g->lock);
    return status;
}

int pool_group_failed(pool_group *g)
{
    pthread_mutex_lock(&g->lock);
    int failed = g->status != CKPT_OK;
    pthread_mutex_unlock(&g->lock);
    return failed;
}

int pool_submit_many(pool *p, pool_group *g, pool_fn fn, void *const *args, size_t n)
{
    if (n == 0)
        return CKPT_OK;
    job *first = NULL, *last = NULL;
    for (size_t i = 0; i < n; i++) {
        job *j = malloc(sizeof *j);
        if (!j) {
            while (first) {
                job *next = first->next;
                free(first);
                first = next;
            }
            return ckpt_seterr(CKPT_ENOMEM, "out of memory queueing %zu jobs", n);
        }
        *j = (job){fn, args[i], g, NULL};
        if (last)
            last->next = j;
        else
            first = j;
        last = j;
    }
    pthread_mutex_lock(&g->lock);
    g->pending += n;
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->next = first;
    else
        p->head = first;
    p->tail = last;
    if (n == 1)
        pthread_cond_signal(&p->ready);
    else
        pthread_cond_broadcast(&p->ready);
    pthread_mutex_unlock(&p->lock);
    return CKPT_OK;
}

size_t pool_withdraw(pool *p, pool_group *g)
{
    size_t k = 0;
    pthread_mutex_lock(&p->lock);
    job *prev = NULL;
    for (job *j = p->head, *next; j; j = next) {
        next = j->next;
        if (j->group != g) {
            prev = j;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            p->head = next;
        if (p->tail == j)
            p->tail = prev;
        free(j);
        k++;
    }
    pthread_mutex_unlock(&p->lock);
    if (k) {
        pthread_mutex_lock(&g->lock);
        g->pending -= k;
        if (g->pending == 0)
            pthread_cond_broadcast(&g->done);
        pthread_mutex_unlock(&g->lock);
    }
    return k;
}

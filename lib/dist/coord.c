/* coord: collectives with a deadline the caller's runtime cannot break. */
#include "coord.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "pool.h"
#include "util.h"

/* A callback gets timeout_ms; the waiter gives it this much longer, so
 * that a runtime that honours its timeout reports the failure itself. */
#define GRACE_MS 2000

enum { OP_BARRIER, OP_BCAST, OP_ALLREDUCE, OP_GATHER };

/* One collective in flight.  Shared by the waiter and the thread running
 * the callback; the last of the two to let go frees it, so a callback that
 * returns after the waiter gave up writes only into memory of its own. */
typedef struct call {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs, done, rc;   /* protected by lock */
    ckpt_coordinator cb;
    int op, root, timeout_ms;
    int64_t value;
    size_t n;
    unsigned char *buf;   /* bcast: in/out; gather: what is sent */
    unsigned char *recv;  /* gather, on root */
} call;

static void call_unref(call *k)
{
    pthread_mutex_lock(&k->lock);
    int last = --k->refs == 0;
    pthread_mutex_unlock(&k->lock);
    if (!last)
        return;
    pthread_cond_destroy(&k->cond);
    pthread_mutex_destroy(&k->lock);
    free(k->buf);
    free(k->recv);
    free(k);
}

static void *call_thread(void *arg)
{
    call *k = arg;
    void *u = k->cb.user;
    int rc;
    switch (k->op) {
    case OP_BARRIER: rc = k->cb.barrier(u, k->timeout_ms); break;
    case OP_BCAST: rc = k->cb.broadcast(u, k->buf, k->n, k->root, k->timeout_ms); break;
    case OP_ALLREDUCE: rc = k->cb.allreduce_min(u, &k->value, k->timeout_ms); break;
    default: rc = k->cb.gather(u, k->buf, k->n, k->recv, k->root, k->timeout_ms); break;
    }
    pthread_mutex_lock(&k->lock);
    k->rc = rc;
    k->done = 1;
    pthread_cond_broadcast(&k->cond);
    pthread_mutex_unlock(&k->lock);
    call_unref(k);
    return NULL;
}

int coord_init(coord *c, const ckpt_coordinator *cb, int rank, int world, int timeout_ms)
{
    memset(c, 0, sizeof *c);
    if (!cb)
        return ckpt_seterr(CKPT_EINVAL, "world_size %d needs a coordinator", world);
    int rc = ckpt_check_version("ckpt_coordinator", cb->version, CKPT_COORDINATOR_VERSION);
    if (rc)
        return rc;
    if (!cb->barrier || !cb->broadcast || !cb->allreduce_min || !cb->gather)
        return ckpt_seterr(CKPT_EINVAL, "the coordinator lacks a callback (barrier, "
                           "broadcast, allreduce_min and gather are all needed)");
    c->cb = *cb;
    c->rank = rank;
    c->world = world;
    c->timeout_ms = timeout_ms;
    pthread_mutex_init(&c->lock, NULL);
    return CKPT_OK;
}

void coord_destroy(coord *c)
{
    pthread_mutex_destroy(&c->lock);
}

static int fail(coord *c, const char *fmt, const char *what, double secs)
{
    pthread_mutex_lock(&c->lock);
    if (!c->broken) {
        c->broken = 1;
        snprintf(c->why, sizeof c->why, fmt, what, secs);
    }
    int rc = ckpt_seterr(CKPT_EPEER, "rank %d: %s", c->rank, c->why);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Run `k` (one reference, the caller's, which it keeps: the caller reads
 * the results, then drops it). */
static int run(coord *c, call *k, const char *what)
{
    pthread_mutex_lock(&c->lock);
    if (c->broken) {
        int rc = ckpt_seterr(CKPT_EPEER, "rank %d: %s not attempted: an earlier collective "
                             "failed (%s), so the ranks may be out of step; open the store "
                             "again with a fresh coordinator", c->rank, what, c->why);
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    pthread_mutex_unlock(&c->lock);
    k->cb = c->cb;
    k->timeout_ms = c->timeout_ms;
    k->refs = 2;
    double t0 = util_now();
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&th, &attr, call_thread, k);
    pthread_attr_destroy(&attr);
    if (e) {
        k->refs = 1;
        return ckpt_seterr(CKPT_ENOMEM, "cannot start a thread for the collective %s", what);
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    long long ms = (long long)c->timeout_ms + GRACE_MS;
    dl.tv_sec += (time_t)(ms / 1000);
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&k->lock);
    while (!k->done)
        if (pthread_cond_timedwait(&k->cond, &k->lock, &dl) == ETIMEDOUT)
            break;
    int done = k->done, rc = k->rc;
    pthread_mutex_unlock(&k->lock);
    double secs = util_now() - t0;
    if (!done)
        return fail(c, "the collective %s did not return in %.1f s: a rank died or hung "
                    "(its callback is left running)", what, secs);
    if (rc)
        return fail(c, "the collective %s failed after %.1f s: a rank failed, died or did "
                    "not answer within the store's timeout (timeout_ms; timeout= in "
                    "Python), or never made this call: opening, saving and restoring the "
                    "newest step are collective, every rank calls them in the same order",
                    what, secs);
    return CKPT_OK;
}

static call *new_call(int op, size_t n, size_t nrecv)
{
    call *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->op = op;
    k->n = n;
    k->refs = 1;
    pthread_mutex_init(&k->lock, NULL);
    pthread_cond_init(&k->cond, NULL);
    if ((n && !(k->buf = malloc(n))) || (nrecv && !(k->recv = calloc(1, nrecv)))) {
        call_unref(k);
        return NULL;
    }
    return k;
}

int coord_barrier(coord *c, const char *what)
{
    call *k = new_call(OP_BARRIER, 0, 0);
    if (!k)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = run(c, k, what);
    call_unref(k);
    return rc;
}

int coord_bcast(coord *c, void *buf, size_t n, int root, const char *what)
{
    call *k = new_call(OP_BCAST, n, 0);
    if (!k)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    memcpy(k->buf, buf, n);
    k->root = root;
    int rc = run(c, k, what);
    if (!rc)
        memcpy(buf, k->buf, n);
    call_unref(k);
    return rc;
}

int coord_allreduce_min(coord *c, int64_t *value, const char *what)
{
    call *k = new_call(OP_ALLREDUCE, 0, 0);
    if (!k)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    k->value = *value;
    int rc = run(c, k, what);
    if (!rc)
        *value = k->value;
    call_unref(k);
    return rc;
}

int coord_gather(coord *c, const void *send, size_t n, void *recv, int root,
                 const char *what)
{
    int here = c->rank == root;
    call *k = new_call(OP_GATHER, n, here ? n * (size_t)c->world : 0);
    if (!k)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    memcpy(k->buf, send, n);
    k->root = root;
    int rc = run(c, k, what);
    if (!rc && here)
        memcpy(recv, k->recv, n * (size_t)c->world);
    call_unref(k);
    return rc;
}

/* The most processes the check of coord_check_ranks makes room for: the
 * most ranks a store has (dist_resolve_options). */
#define CHECK_SLOTS 65536

/* What each process tells the coordinator's root in coord_check_ranks. */
typedef struct ident {
    uint32_t rank1; /* the rank it claims, plus one: 0 is a slot nobody wrote */
    uint32_t world;
} ident;

/* The root's verdict on the slots the gather filled (`s`, CHECK_SLOTS). */
static void judge_ranks(const coord *c, const ident *s, int32_t *status, char *msg, size_t len)
{
    *status = CKPT_EINVAL;
    for (int i = 0; i < CHECK_SLOTS; i++) {
        if (i < c->world && !s[i].rank1) {
            snprintf(msg, len, "world_size is %d but the coordinator has %d process%s: each "
                     "process must pass the coordinator's size as world_size (ckpt_mpi_size, "
                     "the process group's size)", c->world, i, i == 1 ? "" : "es");
            return;
        }
        if (i >= c->world && s[i].rank1) {
            snprintf(msg, len, "world_size is %d but the coordinator has more processes (its "
                     "process %d says it is rank %u): each process must pass the "
                     "coordinator's size as world_size", c->world, i, s[i].rank1 - 1);
            return;
        }
        if (i >= c->world)
            continue;
        if (s[i].world != (uint32_t)c->world) {
            snprintf(msg, len, "rank %d says world_size is %u, rank 0 says %d: every process "
                     "must pass the same world_size", i, s[i].world, c->world);
            return;
        }
        if (s[i].rank1 - 1 != (uint32_t)i) {
            snprintf(msg, len, "the coordinator's process %d says it is rank %u: each process "
                     "must pass its own rank in the coordinator as rank (ckpt_mpi_rank, the "
                     "process group's rank), not one from the environment", i, s[i].rank1 - 1);
            return;
        }
    }
    *status = CKPT_OK;
}

int coord_check_ranks(coord *c)
{
    /* First, whether the coordinator's root (process 0) claims rank 0: it
     * gathers below, and only a process claiming rank 0 brings room for
     * that (recv is NULL elsewhere, as ckpt_coordinator says; a root
     * without room would have the coordinator write through NULL). */
    int32_t claim = c->rank;
    int rc = coord_bcast(c, &claim, sizeof claim, 0, "open: which process is rank 0");
    if (rc)
        return rc;
    if (claim != 0)
        return ckpt_seterr(CKPT_EINVAL, "rank %d: the coordinator's process 0 says it is rank "
                           "%d: each process must pass its own rank in the coordinator as rank "
                           "(ckpt_mpi_rank, the process group's rank), not one from the "
                           "environment", c->rank, (int)claim);
    ident me = {(uint32_t)c->rank + 1, (uint32_t)c->world};
    /* Room for every process the coordinator may have (a coordinator with
     * more processes than world_size writes more slots), zeroed so that an
     * empty slot shows.  A second process claiming rank 0 brings room too,
     * which stays empty: only the coordinator's root is written. */
    call *k = new_call(OP_GATHER, sizeof me, c->rank == 0 ? (size_t)CHECK_SLOTS * sizeof me : 0);
    if (!k)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    memcpy(k->buf, &me, sizeof me);
    k->root = 0;
    rc = run(c, k, "open: which process is which rank");
    struct {
        int32_t status;
        char message[380];
    } v;
    memset(&v, 0, sizeof v);
    const ident *s = (const ident *)k->recv;
    if (!rc && s && s[0].rank1) /* this process is the coordinator's root */
        judge_ranks(c, s, &v.status, v.message, sizeof v.message);
    call_unref(k);
    if (rc)
        return rc;
    rc = coord_bcast(c, &v, sizeof v, 0, "open: the ranks' check");
    if (rc)
        return rc;
    if (v.status)
        return ckpt_seterr(v.status == CKPT_EINVAL ? CKPT_EINVAL : CKPT_EPEER,
                           "rank %d: %.*s", c->rank, (int)sizeof v.message, v.message);
    return CKPT_OK;
}

/* What a pace's beating thread and the working one share. */
struct coord_pace_t {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;              /* the work ended (protected by lock) */
    coord *c;
    const char *what;
    int ms;                /* beat interval */
    int rc;                /* the beats' outcome: written by the beater */
    ckpt_error_state err;  /* its message when rc != 0 */
    pthread_t th;
    int beating;           /* th runs the beats */
};
typedef struct coord_pace_t pace;

/* Wait up to `ms` for the work to end; 1 when it has. */
static int pace_wait(pace *p, int ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)(ms / 1000);
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->lock);
    while (!p->done)
        if (pthread_cond_timedwait(&p->cond, &p->lock, &dl) == ETIMEDOUT)
            break;
    int done = p->done;
    pthread_mutex_unlock(&p->lock);
    return done;
}

/* The beats: until every rank is done (or the ranks fail). */
static int beat(pace *p)
{
    for (;;) {
        int64_t done = pace_wait(p, p->ms);
        int rc = coord_allreduce_min(p->c, &done, p->what);
        if (rc)
            return rc;
        if (done == 1)
            return CKPT_OK;
        if (done != 0) /* another rank is in another collective */
            return fail(p->c, "the collective %s got %.0f from a rank that is in another "
                        "collective: the ranks are out of step", p->what, (double)done);
    }
}

static void *beat_thread(void *arg)
{
    pace *p = arg;
    pool_mark_library_thread();
    p->rc = beat(p);
    ckpt_error_capture(&p->err, p->rc);
    return NULL;
}

coord_pace_t *coord_pace_start(coord *c, const char *what)
{
    pace *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->c = c;
    p->what = what;
    /* A quarter of the timeout: the others' collective, waiting for this
     * rank's next beat, is never near its deadline. */
    p->ms = c->timeout_ms / 4 > 0 ? c->timeout_ms / 4 : 1;
    p->beating = pthread_create(&p->th, NULL, beat_thread, p) == 0;
    return p;
}

int coord_pace_end(coord *c, coord_pace_t *p, const char *what)
{
    int rc;
    if (!p) { /* no pace (out of memory at its start): meet once, done */
        pace q;
        memset(&q, 0, sizeof q);
        pthread_mutex_init(&q.lock, NULL);
        pthread_cond_init(&q.cond, NULL);
        q.c = c;
        q.what = what;
        q.done = 1;
        rc = beat(&q);
        pthread_cond_destroy(&q.cond);
        pthread_mutex_destroy(&q.lock);
        return rc;
    }
    pthread_mutex_lock(&p->lock);
    p->done = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    if (p->beating) {
        pthread_join(p->th, NULL);
        rc = p->rc;
        if (rc)
            ckpt_error_restore(&p->err);
    } else { /* no thread: the ranks meet now, this one done */
        rc = beat(p);
    }
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return rc;
}

int coord_pace(coord *c, int (*work)(void *arg), void *arg, int *work_rc, const char *what)
{
    /* The work runs here, on the caller's thread (its CUDA device, its
     * per-thread stream, its errors); without a beating thread it runs
     * first and the ranks meet after, as before pacing. */
    coord_pace_t *p = work ? coord_pace_start(c, what) : NULL;
    *work_rc = work ? work(arg) : CKPT_OK;
    ckpt_error_state mine;
    ckpt_error_capture(&mine, *work_rc);
    int rc = coord_pace_end(c, p, what);
    if (!rc && work)
        ckpt_error_restore(&mine);
    return rc;
}

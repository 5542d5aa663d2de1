/* The harness of the tests of several ranks in one process
 * (test_ranks.c, test_ranks_faults.c): each rank a thread with its own
 * store on the same root, an in-memory coordinator (threads meeting at a
 * barrier), a job per rank and the states they save.  Each file includes
 * it once, for its own copies. */
#ifndef RANKS_UTIL_H
#define RANKS_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "fstrace.h"
#include "helpers.h"
#include "testing.h"

#define WORLD 2
#define SLOT 2048

/* ------------------------------------------------- in-memory coordinator */

typedef struct meet {
    pthread_mutex_t m;
    pthread_cond_t c;
    int arrived;
    unsigned gen;
    unsigned char slot[WORLD][SLOT];
    int64_t value[WORLD];
    int recv_elsewhere; /* gathers that gave a rank other than the root room */
} meet;

typedef struct rank_user {
    meet *mt;
    int rank;
} rank_user;

/* Wait until every rank arrived; -1 after timeout_ms. */
static inline int meet_barrier(meet *mt, int timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000 + 1;
    pthread_mutex_lock(&mt->m);
    unsigned gen = mt->gen;
    int rc = 0;
    if (++mt->arrived == WORLD) {
        mt->arrived = 0;
        mt->gen++;
        pthread_cond_broadcast(&mt->c);
    } else {
        while (mt->gen == gen && rc == 0)
            rc = pthread_cond_timedwait(&mt->c, &mt->m, &dl);
    }
    pthread_mutex_unlock(&mt->m);
    return rc ? -1 : 0;
}

static inline int cb_barrier(void *user, int timeout_ms)
{
    rank_user *u = user;
    return meet_barrier(u->mt, timeout_ms);
}

static inline int cb_broadcast(void *user, void *buf, size_t n, int root, int timeout_ms)
{
    rank_user *u = user;
    cr_assert_leq(n, SLOT);
    if (u->rank == root)
        memcpy(u->mt->slot[root], buf, n);
    if (meet_barrier(u->mt, timeout_ms))
        return -1;
    memcpy(buf, u->mt->slot[root], n);
    return meet_barrier(u->mt, timeout_ms); /* nobody overwrites it before all read */
}

static inline int cb_allreduce(void *user, int64_t *v, int timeout_ms)
{
    rank_user *u = user;
    u->mt->value[u->rank] = *v;
    if (meet_barrier(u->mt, timeout_ms))
        return -1;
    for (int r = 0; r < WORLD; r++)
        if (u->mt->value[r] < *v)
            *v = u->mt->value[r];
    return meet_barrier(u->mt, timeout_ms);
}

static inline int cb_gather(void *user, const void *send, size_t n, void *recv, int root,
                     int timeout_ms)
{
    rank_user *u = user;
    cr_assert_leq(n, SLOT);
    if (u->rank != root && recv) { /* ckpt.h: recv is NULL elsewhere */
        pthread_mutex_lock(&u->mt->m);
        u->mt->recv_elsewhere++;
        pthread_mutex_unlock(&u->mt->m);
    }
    memcpy(u->mt->slot[u->rank], send, n);
    if (meet_barrier(u->mt, timeout_ms))
        return -1;
    if (u->rank == root)
        for (int r = 0; r < WORLD; r++)
            memcpy((unsigned char *)recv + (size_t)r * n, u->mt->slot[r], n);
    return meet_barrier(u->mt, timeout_ms);
}

static inline void rank_opts(ckpt_store_options *o, ckpt_coordinator *c, rank_user *u)
{
    tc_opts(o);
    o->version = CKPT_STORE_OPTIONS_VERSION;
    o->rank = u->rank;
    o->world_size = WORLD;
    o->timeout_ms = 20000;
    *c = (ckpt_coordinator){CKPT_COORDINATOR_VERSION, u, cb_barrier, cb_broadcast,
                            cb_allreduce, cb_gather};
    o->coordinator = c;
}

/* Rank r's state at `step`: its own tensor names. */
static inline void rank_state(tc_state *s, int r, int64_t step)
{
    char name[32];
    int64_t shape[1] = {3000 + 1000 * r};
    tc_state_init(s);
    snprintf(name, sizeof name, "rank%d.w", r);
    tc_state_add(s, name, CKPT_F32, 1, shape, TC_RANDOM, (uint64_t)(r * 1000 + step));
    snprintf(name, sizeof name, "rank%d.step", r);
    tc_state_add(s, name, CKPT_I64, 0, NULL, TC_RANDOM, (uint64_t)(r * 1000 + step + 7));
}

/* ------------------------------------------------------ the ranks' work */

typedef struct job {
    rank_user u;
    int (*body)(struct job *j, ckpt_store *st);
    int64_t restored;
    size_t skipped;
    int status;
    char message[512];
    fsio *fs; /* NULL: the real file system, untraced */
    int readonly; /* open with CKPT_OPEN_READONLY */
    int timeout_ms; /* 0: rank_opts' */
    int fsync;      /* 1: fsync (tc_opts turns it off) */
    int (*bcast)(void *, void *, size_t, int, int); /* NULL: cb_broadcast */
    int small_arena; /* 1: 4 KiB chunks through a 4 KiB host_memory_limit */
    int claim_rank;  /* 0: the coordinator's rank; else the rank claimed, plus one */
    int claim_world; /* 0: WORLD; else the world_size claimed */
} job;

static inline void *rank_main(void *arg)
{
    job *j = arg;
    ckpt_store_options o;
    ckpt_coordinator c;
    rank_opts(&o, &c, &j->u);
    if (j->readonly)
        o.flags |= CKPT_OPEN_READONLY;
    if (j->timeout_ms)
        o.timeout_ms = j->timeout_ms;
    if (j->fsync)
        o.fsync = 1;
    if (j->bcast)
        c.broadcast = j->bcast;
    if (j->claim_rank)
        o.rank = j->claim_rank - 1;
    if (j->claim_world)
        o.world_size = j->claim_world;
    if (j->small_arena) {
        o.chunk_bytes = 4096;
        o.host_memory_limit = 4096;
        o.threads = 1;
    }
    ckpt_store *st = NULL;
    j->status = j->fs ? ckpt_store_open_with_fsio(&st, tc_root, &o, j->fs)
                      : ckpt_store_open(&st, tc_root, &o);
    if (j->status == CKPT_OK)
        j->status = j->body(j, st);
    if (j->status)
        snprintf(j->message, sizeof j->message, "%s", ckpt_error_last());
    ckpt_store_free(st);
    return NULL;
}

static meet ranks_meet; /* one per test process (Criterion forks) */

/* Gathers of the last run_ranks that gave a non-root rank room. */
static inline int ranks_recv_elsewhere(void)
{
    return ranks_meet.recv_elsewhere;
}

static inline void run_ranks(job *jobs, int (*body)(job *, ckpt_store *))
{
    meet *mt = &ranks_meet;
    memset(mt, 0, sizeof *mt);
    pthread_mutex_init(&mt->m, NULL);
    pthread_cond_init(&mt->c, NULL);
    pthread_t th[WORLD];
    for (int r = 0; r < WORLD; r++) {
        jobs[r].u = (rank_user){mt, r};
        jobs[r].body = body;
        jobs[r].restored = -1;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    pthread_cond_destroy(&mt->c);
    pthread_mutex_destroy(&mt->m);
}

/* Restore LATEST into fresh buffers; checks the data of the step it got. */
static inline int restore_latest(job *j, ckpt_store *st)
{
    tc_state got;
    tc_state_init(&got);
    tc_state want;
    rank_state(&want, j->u.rank, 0);
    tc_state_like(&got, &want, 0xee);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep);
    j->restored = ckpt_report_step(rep);
    j->skipped = ckpt_report_count(rep);
    for (size_t i = 0; i < j->skipped; i++)
        cr_log_info("rank %d skipped step %lld: %s", j->u.rank,
                    (long long)ckpt_report_get(rep, i)->step, ckpt_report_get(rep, i)->message);
    ckpt_report_free(rep);
    if (rc == CKPT_OK) {
        tc_state_free(&want);
        rank_state(&want, j->u.rank, j->restored);
        tc_assert_state_eq(&got, &want, "restored");
    }
    tc_state_free(&got);
    tc_state_free(&want);
    return rc;
}

/* Save steps first..last, each rank the state `state_of` makes. */
static inline int save_range(job *j, ckpt_store *st, int64_t first, int64_t last,
                      void (*state_of)(tc_state *s, int r, int64_t step))
{
    for (int64_t step = first; step <= last; step++) {
        tc_state s;
        state_of(&s, j->u.rank, step);
        int rc = tc_save(st, step, &s, NULL);
        tc_state_free(&s);
        if (rc)
            return rc;
    }
    return CKPT_OK;
}

#endif

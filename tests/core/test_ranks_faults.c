/* Several ranks in one process (ranks_util.h), when something goes
 * wrong: a rank whose begin fails or that refuses, a coordinator that
 * fails or never returns, a step retired under the ranks, a rank that
 * dies after the commit, slow ranks that must be waited for, two
 * threads of one rank saving at once.  The agreement itself is in
 * test_ranks.c. */
#include "ranks_util.h"

TestSuite(ranks, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

/* Rank 1 hands in a bad tensor: its begin fails, yet it answers, and rank
 * 0's save fails with its reason; nothing is committed. */
static int one_rank_fails(job *j, ckpt_store *st)
{
    tc_state s;
    rank_state(&s, j->u.rank, 3);
    if (j->u.rank == 1)
        s.t[0].dtype = CKPT_DTYPE_INVALID;
    int rc = tc_save(st, 3, &s, NULL);
    tc_state_free(&s);
    return rc;
}

Test(ranks, a_failing_rank_fails_every_rank)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, one_rank_fails);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_EINVAL, "rank %d: %d %s", r, jobs[r].status,
                     jobs[r].message);
    cr_assert(strstr(jobs[0].message, "rank 1 failed"), "%s", jobs[0].message);
    char *dir = tc_step_dir(tc_root, 3);
    cr_assert_not(tc_exists(dir));
    free(dir);
    /* the next open (rank 0) removes what the failed save left */
    ckpt_store *st = tc_open(tc_root);
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp-"), 0);
    ckpt_store_free(st);
}

/* ------------------------------------------------------ options, timeouts */

static int cb_fail(void *user, int timeout_ms)
{
    return -1;
}

static pthread_mutex_t hang_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hang_cond = PTHREAD_COND_INITIALIZER;
static int hang_released;

/* A runtime that cannot tell a dead rank from a slow one: never returns
 * until the test lets it go. */
static int cb_hang_bcast(void *user, void *buf, size_t n, int root, int timeout_ms)
{
    pthread_mutex_lock(&hang_lock);
    while (!hang_released)
        pthread_cond_wait(&hang_cond, &hang_lock);
    pthread_mutex_unlock(&hang_lock);
    return -1;
}

static int cb_hang_gather(void *user, const void *send, size_t n, void *recv, int root,
                          int timeout_ms)
{
    return cb_hang_bcast(user, NULL, 0, root, timeout_ms);
}

static int cb_fail_bcast(void *user, void *buf, size_t n, int root, int timeout_ms)
{
    return -1;
}

static int cb_fail_allreduce(void *user, int64_t *v, int timeout_ms)
{
    return -1;
}

static int cb_fail_gather(void *user, const void *send, size_t n, void *recv, int root,
                          int timeout_ms)
{
    return -1;
}

Test(ranks, options_are_checked)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.version = CKPT_STORE_OPTIONS_VERSION;
    o.world_size = 2;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_EINVAL); /* no coordinator */
    cr_assert(strstr(ckpt_error_last(), "coordinator"));
    ckpt_coordinator c = {CKPT_COORDINATOR_VERSION, NULL, cb_fail, cb_fail_bcast, NULL,
                          NULL};
    o.coordinator = &c;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_EINVAL); /* callbacks missing */
    c.version = 99;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_EVERSION);
    o.rank = 2;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_EINVAL);
    o.rank = 0;
    o.world_size = -1;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_EINVAL);
    cr_assert_null(st);
    /* a rank given, world_size forgotten: every rank would write as 0 */
    for (int ws = 0; ws <= 1; ws++) {
        o.world_size = ws;
        o.rank = 3;
        cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_EINVAL, "world_size %d", ws);
        cr_assert(strstr(ckpt_error_last(), "world_size"), "%s", ckpt_error_last());
        cr_assert_null(st);
    }
    o.rank = 0;
    /* A version-1 struct: the fields from `rank` on are not read. */
    ckpt_store_options v1;
    cr_assert_eq(ckpt_store_options_init(&v1, 1), CKPT_OK);
    v1.fsync = 0;
    v1.world_size = 5; /* beyond a v1 struct: ignored */
    cr_assert_eq(ckpt_store_open(&st, tc_root, &v1), CKPT_OK, "%s", ckpt_error_last());
    /* a refusal's status is one of ckpt_status, an error */
    cr_assert_eq(ckpt_save_refuse(st, 1, -999, "x"), CKPT_EINVAL);
    cr_assert_eq(ckpt_restore_refuse(st, -999, "x", NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_save_refuse(st, 1, CKPT_OK, "x"), CKPT_EINVAL);
    cr_assert_eq(ckpt_save_refuse(st, 1, CKPT_EIO, "x"), CKPT_EIO);
    ckpt_store_free(st);
}

static int open_only(job *j, ckpt_store *st)
{
    (void)j;
    (void)st;
    return CKPT_OK;
}

/* Ranks that are not the coordinator's (a rank or size read from the
 * environment: SLURM_PROCID under mpirun is 0 on every rank of a node) are
 * refused at open on every rank, naming the mismatch, before rank 0 takes
 * the lock.  Two "rank 0"s used to both open, the second's lock failure
 * lost; a world_size above the coordinator's left gather slots unwritten. */
Test(ranks, ranks_that_are_not_the_coordinators_are_refused)
{
    struct {
        int claim[WORLD], world[WORLD];
        const char *words;
    } cases[] = {
        {{1, 1}, {0, 0}, "the coordinator's process 1 says it is rank 0"},
        {{2, 1}, {0, 0}, "the coordinator's process 0 says it is rank 1"},
        {{0, 0}, {3, 3}, "world_size is 3 but the coordinator has 2 processes"},
        {{0, 0}, {2, 3}, "rank 1 says world_size is 3, rank 0 says 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        job jobs[WORLD];
        memset(jobs, 0, sizeof jobs);
        for (int r = 0; r < WORLD; r++) {
            jobs[r].claim_rank = cases[i].claim[r];
            jobs[r].claim_world = cases[i].world[r];
            jobs[r].timeout_ms = 5000;
        }
        run_ranks(jobs, open_only);
        for (int r = 0; r < WORLD; r++) {
            cr_assert_eq(jobs[r].status, CKPT_EINVAL, "case %zu rank %d: %d %s", i, r,
                         jobs[r].status, jobs[r].message);
            cr_assert(strstr(jobs[r].message, cases[i].words), "case %zu rank %d: %s", i, r,
                      jobs[r].message);
        }
        char *lock = tc_join(tc_root, ".lock");
        cr_assert_neq(access(lock, F_OK), 0, "case %zu: a lock was taken", i);
        free(lock);
    }
    job ok[WORLD]; /* and the same harness, ranks as the coordinator's, opens */
    memset(ok, 0, sizeof ok);
    run_ranks(ok, open_only);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(ok[r].status, CKPT_OK, "rank %d: %s", r, ok[r].message);
    /* ckpt.h: a gather's recv is NULL on every rank but the root */
    cr_assert_eq(ranks_recv_elsewhere(), 0, "a non-root rank was given room to receive");
}

static void hang_open(int which, int *status, char *msg)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.version = CKPT_STORE_OPTIONS_VERSION;
    o.world_size = 2;
    o.rank = 1;
    o.timeout_ms = 100;
    ckpt_coordinator c = {CKPT_COORDINATOR_VERSION, NULL, cb_fail,
                          which ? cb_hang_bcast : cb_fail_bcast, cb_fail_allreduce,
                          which ? cb_hang_gather : cb_fail_gather}; /* open gathers first */
    o.coordinator = &c;
    ckpt_store *st = NULL;
    *status = ckpt_store_open(&st, tc_root, &o);
    snprintf(msg, 512, "%s", ckpt_error_last());
    cr_assert_null(st);
}

Test(ranks, a_failing_collective_is_a_peer_error)
{
    int status;
    char msg[512];
    hang_open(0, &status, msg);
    cr_assert_eq(status, CKPT_EPEER, "%d %s", status, msg);
    cr_assert(strstr(msg, "failed"), "%s", msg);
    /* a rank that never made the call (`if rank == 0: save`) is a cause */
    cr_assert(strstr(msg, "or never made this call: opening, saving and restoring the newest "
                          "step are collective"), "%s", msg);
}

Test(ranks, a_callback_that_never_returns_times_out)
{
    int status;
    char msg[512];
    hang_open(1, &status, msg); /* returns: libckpt's deadline, not the callback's */
    cr_assert_eq(status, CKPT_EPEER, "%d %s", status, msg);
    cr_assert(strstr(msg, "did not return"), "%s", msg);
    pthread_mutex_lock(&hang_lock); /* let the abandoned callback finish */
    hang_released = 1;
    pthread_cond_broadcast(&hang_cond);
    pthread_mutex_unlock(&hang_lock);
}

/* A rank whose binding refuses its part before calling the library (a
 * state it cannot describe, metadata it cannot encode) calls the refuse
 * functions in its place: the other ranks fail that save or restore at
 * once with its reason, and the next save and restore of all ranks work.
 * (The Python binding raised on that rank alone: its next save met the
 * others' collectives of the previous one, and no save committed again.) */
/* Turns an unexpected outcome into a failure naming it (rank_main reports
 * the thread's message). */
static int unexpected(int rc, const char *what)
{
    char was[512];
    snprintf(was, sizeof was, "%s", ckpt_error_last());
    return ckpt_seterr(CKPT_EIO, "%s: %d (%s) %s", what, rc, ckpt_status_name(rc), was);
}

static int one_rank_refuses(job *j, ckpt_store *st)
{
    tc_state s;
    int rc;
    rank_state(&s, j->u.rank, 3);
    if (j->u.rank == 1)
        rc = ckpt_save_refuse(st, 3, CKPT_EINVAL, "metadata: NaN is not JSON");
    else
        rc = tc_save(st, 3, &s, NULL);
    tc_state_free(&s);
    if (rc != CKPT_EINVAL || !strstr(ckpt_error_last(), "NaN is not JSON"))
        return unexpected(rc, "save 3, refused by rank 1");
    rank_state(&s, j->u.rank, 4);
    rc = tc_save(st, 4, &s, NULL);
    tc_state_free(&s);
    if (rc)
        return rc;
    if (j->u.rank == 1) {
        ckpt_report *rep = NULL;
        rc = ckpt_restore_refuse(st, CKPT_EINVAL, "tensor 'x': not an array", &rep);
        ckpt_report_free(rep);
    } else {
        rc = restore_latest(j, st);
    }
    if (rc != CKPT_EINVAL || !strstr(ckpt_error_last(), "not an array"))
        return unexpected(rc, "restore, refused by rank 1");
    return restore_latest(j, st);
}

Test(ranks, a_rank_that_refuses_keeps_every_rank_in_step)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, one_rank_refuses);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 4, "rank %d restored %lld", r,
                     (long long)jobs[r].restored);
    }
    char *dir = tc_step_dir(tc_root, 3);
    cr_assert_not(tc_exists(dir), "the refused save committed");
    free(dir);
}

/* A job reading a root while another job's retention retires the step it
 * listed as newest (keep_last 1): the rank that finds its step gone does
 * not report it as damage, and when no step is left that every rank has,
 * every rank lists the root again and they agree on the new step.  It was
 * "no checkpoint ... that every rank can restore" on every rank. */
typedef struct retire2 {
    pthread_mutex_t mu;
    int fired;
    char *step2, *trash, *side3, *step3;
} retire2;

static int retire_when_opened(void *ctx, fsio_op op, const char *path)
{
    retire2 *r = ctx;
    if (op != FSIO_OPEN || !path || !strstr(path, "step-000000000002/"))
        return 0;
    pthread_mutex_lock(&r->mu);
    if (!r->fired) { /* the writer's save of step 3, and its retention */
        r->fired = 1;
        if (rename(r->side3, r->step3) || rename(r->step2, r->trash))
            r->fired = -errno;
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static int save_two_and_three(job *j, ckpt_store *st)
{
    return save_range(j, st, 2, 3, rank_state);
}

Test(ranks, a_step_retired_under_the_ranks_is_passed_for_the_new_one)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two_and_three);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    retire2 race = {PTHREAD_MUTEX_INITIALIZER, 0, tc_step_dir(tc_root, 2),
                    tc_join(tc_root, ".trash-2"), tc_join(tc_root, "side-3"),
                    tc_step_dir(tc_root, 3)};
    cr_assert_eq(rename(race.step3, race.side3), 0); /* step 3 is not saved yet */
    fsio fs = {.fault = retire_when_opened, .ctx = &race};
    job readers[WORLD] = {0};
    for (int r = 0; r < WORLD; r++) {
        readers[r].fs = &fs;
        readers[r].readonly = 1;
    }
    run_ranks(readers, restore_latest);
    cr_assert_eq(race.fired, 1, "the race was not run (%d)", race.fired);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(readers[r].status, CKPT_OK, "rank %d: %s", r, readers[r].message);
        cr_assert_eq(readers[r].restored, 3, "rank %d restored %lld", r,
                     (long long)readers[r].restored);
        cr_assert_eq(readers[r].skipped, 0, "rank %d reported a retired step", r);
    }
    free(race.step2);
    free(race.trash);
    free(race.side3);
    free(race.step3);
}

/* Rank 1 dies after its part is durable, before rank 0's answer reaches
 * it: rank 0 commits the step, then its broadcast of the decision times
 * out.  Rank 0 knows the step is committed and says so (it said "whether
 * step 5 was committed is unknown here") and runs retention; rank 1 only
 * knows that it does not know. */
static int rank1_dead;

static int cb_broadcast_rank1_dies(void *user, void *buf, size_t n, int root, int timeout_ms)
{
    rank_user *u = user;
    if (u->rank == 1 && __atomic_load_n(&rank1_dead, __ATOMIC_ACQUIRE))
        return -1; /* gone: never meets rank 0 */
    return cb_broadcast(user, buf, n, root, timeout_ms);
}

static int save_then_rank1_dies(job *j, ckpt_store *st)
{
    for (int64_t step = 4; step <= 5; step++) {
        tc_state s;
        rank_state(&s, j->u.rank, step);
        if (step == 5 && j->u.rank == 1)
            __atomic_store_n(&rank1_dead, 1, __ATOMIC_RELEASE);
        int rc = tc_save(st, step, &s, NULL);
        tc_state_free(&s);
        if (rc)
            return rc;
    }
    return CKPT_OK;
}

Test(ranks, rank_0_knows_a_step_it_committed_when_the_answer_is_lost)
{
    job jobs[WORLD] = {0};
    for (int r = 0; r < WORLD; r++) {
        jobs[r].timeout_ms = 1000;
        jobs[r].bcast = cb_broadcast_rank1_dies;
    }
    run_ranks(jobs, save_then_rank1_dies);
    cr_assert_eq(jobs[0].status, CKPT_EPEER, "rank 0: %s", jobs[0].message);
    cr_assert(strstr(jobs[0].message, "step 5 is committed"), "rank 0: %s", jobs[0].message);
    cr_assert_eq(jobs[1].status, CKPT_EPEER, "rank 1: %s", jobs[1].message);
    cr_assert(strstr(jobs[1].message, "unknown here"), "rank 1: %s", jobs[1].message);
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t step = -1;
    cr_assert_eq(ckpt_store_latest(ro, CKPT_VERIFY_FULL, &step), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(step, 5);
    ckpt_store_free(ro);
}

/* Rank 1 is slow, not dead: its first fsync of a save takes 4 s, ten
 * times the store's timeout_ms (400 ms; its collectives are given 2.4 s).
 * Rank 0, done long before, used to wait for rank 1's report in one
 * collective and fail the save with CKPT_EPEER although no rank died;
 * the ranks now pace each other while they persist (every timeout_ms / 4
 * a rank still writing says so), and the step is committed. */
static int slow_armed;

static int slow_fsync(void *ctx, fsio_op op, const char *path)
{
    (void)ctx;
    (void)path;
    if (op == FSIO_FSYNC && __atomic_exchange_n(&slow_armed, 0, __ATOMIC_ACQ_REL)) {
        struct timespec ts = {4, 0};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
            ;
    }
    return 0;
}

static int save_with_rank1_slow(job *j, ckpt_store *st)
{
    int rc = save_range(j, st, 1, 1, rank_state);
    if (!rc && j->u.rank == 1)
        __atomic_store_n(&slow_armed, 1, __ATOMIC_RELEASE);
    return rc ? rc : save_range(j, st, 2, 2, rank_state);
}

Test(ranks, a_slow_rank_is_waited_for_while_it_writes)
{
    fsio fs = {.fault = slow_fsync};
    job jobs[WORLD] = {0};
    for (int r = 0; r < WORLD; r++) {
        jobs[r].timeout_ms = 400;
        jobs[r].fsync = 1;
    }
    jobs[1].fs = &fs;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(jobs, save_with_rank1_slow);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(slow_armed, 0, "rank 1 never fsynced in its second save");
    cr_assert_geq(t1.tv_sec - t0.tv_sec, 4, "rank 1 was not slowed");
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t step = -1;
    cr_assert_eq(ckpt_store_latest(ro, CKPT_VERIFY_FULL, &step), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(step, 2);
    ckpt_store_free(ro);
}

/* The same on restore: rank 1's first read takes 4 s (more shard to
 * read, a slower disk); rank 0, done, used to fail CKPT_EPEER in the
 * collective that compares the ranks' outcomes. */
static int slow_read_armed;

static int slow_read(void *ctx, fsio_op op, const char *path)
{
    (void)ctx;
    (void)path;
    if (op == FSIO_PREAD && __atomic_exchange_n(&slow_read_armed, 0, __ATOMIC_ACQ_REL)) {
        struct timespec ts = {4, 0};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
            ;
    }
    return 0;
}

static int save_then_restore_rank1_slow(job *j, ckpt_store *st)
{
    int rc = save_range(j, st, 1, 2, rank_state);
    if (!rc && j->u.rank == 1)
        __atomic_store_n(&slow_read_armed, 1, __ATOMIC_RELEASE);
    return rc ? rc : restore_latest(j, st);
}

Test(ranks, a_slow_rank_is_waited_for_while_it_reads)
{
    fsio fs = {.fault = slow_read};
    job jobs[WORLD] = {0};
    for (int r = 0; r < WORLD; r++)
        jobs[r].timeout_ms = 400;
    jobs[1].fs = &fs;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(jobs, save_then_restore_rank1_slow);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(slow_read_armed, 0, "rank 1 never read in its restore");
    cr_assert_geq(t1.tv_sec - t0.tv_sec, 4, "rank 1 was not slowed");
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 2, "rank %d restored %lld", r,
                     (long long)jobs[r].restored);
    }
}

/* The same inside ckpt_save_begin: a state larger than host_memory_limit
 * wraps the snapshot buffer, so begin itself waits for earlier chunks to
 * reach the disk.  Rank 1's six 1 s writes there used to come before its
 * first beat, and rank 0, pacing already, failed with CKPT_EPEER. */
static int slow_writes_left;

static int slow_pwrite(void *ctx, fsio_op op, const char *path)
{
    (void)ctx;
    (void)path;
    if (op == FSIO_PWRITE && __atomic_fetch_sub(&slow_writes_left, 1, __ATOMIC_ACQ_REL) > 0) {
        struct timespec ts = {1, 0};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
            ;
    }
    return 0;
}

static void big_state(tc_state *s, int r, int64_t step)
{
    char name[32];
    int64_t shape[1] = {6 * 1024}; /* 24 KiB: six chunks through one */
    tc_state_init(s);
    snprintf(name, sizeof name, "rank%d.w", r);
    tc_state_add(s, name, CKPT_F32, 1, shape, TC_RANDOM, (uint64_t)(r * 1000 + step));
}

static int save_big_rank1_slow_in_begin(job *j, ckpt_store *st)
{
    int rc = save_range(j, st, 1, 1, big_state);
    if (!rc && j->u.rank == 1)
        __atomic_store_n(&slow_writes_left, 6, __ATOMIC_RELEASE);
    return rc ? rc : save_range(j, st, 2, 2, big_state);
}

Test(ranks, a_slow_rank_is_waited_for_while_it_writes_inside_save_begin)
{
    fsio fs = {.fault = slow_pwrite};
    job jobs[WORLD] = {0};
    for (int r = 0; r < WORLD; r++) {
        jobs[r].timeout_ms = 400;
        jobs[r].small_arena = 1;
    }
    jobs[1].fs = &fs;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(jobs, save_big_rank1_slow_in_begin);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_leq(slow_writes_left, 0, "rank 1 wrote fewer than 6 times in its second save");
    cr_assert_geq(t1.tv_sec - t0.tv_sec, 4, "rank 1 was not slowed");
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t step = -1;
    cr_assert_eq(ckpt_store_latest(ro, CKPT_VERIFY_FULL, &step), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(step, 2);
    ckpt_store_free(ro);
}

/* Two threads of one rank saving at once (a training thread and a
 * "save now" thread, say): the second's begin comes while the first is
 * still inside its own (its snapshot wraps a 4 KiB buffer, and its first
 * write waits half a second).  The second save must follow the first on
 * this rank as on the others (rank 1 saves steps 1 and 2 one after the
 * other), both commit, and no library thread (a pacing's beater
 * included) outlives the stores.  The race fixed in 03867c7 lay in a
 * narrower window, between a begin's pacing start and its taking the
 * store's lock: the next test holds that one open. */
static struct {
    pthread_mutex_t m;
    pthread_cond_t c;
    int armed, inside;
} hold = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

static int hold_first_write(void *ctx, fsio_op op, const char *path)
{
    (void)ctx;
    (void)path;
    if (op != FSIO_PWRITE || !__atomic_exchange_n(&hold.armed, 0, __ATOMIC_ACQ_REL))
        return 0;
    pthread_mutex_lock(&hold.m);
    hold.inside = 1;
    pthread_cond_broadcast(&hold.c);
    pthread_mutex_unlock(&hold.m);
    /* The window in which the other thread's begin runs (or, now, waits). */
    struct timespec ts = {0, 500 * 1000 * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
    return 0;
}

typedef struct second_saver {
    ckpt_store *st;
    int status;
    char message[512];
} second_saver;

static void *save_step2_once_inside(void *arg)
{
    second_saver *b = arg;
    pthread_mutex_lock(&hold.m);
    while (!hold.inside)
        pthread_cond_wait(&hold.c, &hold.m);
    pthread_mutex_unlock(&hold.m);
    tc_state s;
    big_state(&s, 0, 2);
    b->status = tc_save(b->st, 2, &s, NULL);
    if (b->status)
        snprintf(b->message, sizeof b->message, "%s", ckpt_error_last());
    tc_state_free(&s);
    return NULL;
}

static int save_from_two_threads_on_rank0(job *j, ckpt_store *st)
{
    if (j->u.rank != 0)
        return save_range(j, st, 1, 2, big_state);
    second_saver b = {st, -1, ""};
    pthread_t th;
    __atomic_store_n(&hold.armed, 1, __ATOMIC_RELEASE);
    pthread_create(&th, NULL, save_step2_once_inside, &b);
    int rc = save_range(j, st, 1, 1, big_state);
    pthread_join(th, NULL);
    cr_assert_eq(b.status, CKPT_OK, "rank 0's second thread: %s", b.message);
    return rc;
}

static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The thread count once it is back to `want`, or what it still is after
 * 5 s.  Each collective runs on a detached thread (a hung callback is left
 * running, coord.c), which may still be exiting, and the kernel reaps even
 * a joined thread's task a moment after pthread_join returns: a count read
 * at once can be one high (CI saw it).  A thread that outlives its store,
 * a pacing's beater, runs for ever, so waiting does not hide it. */
static int threads_settled_to(int want)
{
    struct timespec until, now, nap = {0, 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += 5;
    int n;
    while ((n = count_threads()) != want) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > until.tv_sec ||
            (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec))
            break;
        nanosleep(&nap, NULL);
    }
    return n;
}

Test(ranks, a_second_threads_save_waits_for_the_first_ones_begin)
{
    fsio fs = {.fault = hold_first_write};
    job jobs[WORLD] = {0};
    for (int r = 0; r < WORLD; r++) {
        jobs[r].timeout_ms = 2000;
        jobs[r].small_arena = 1;
    }
    jobs[0].fs = &fs;
    int threads_before = count_threads();
    run_ranks(jobs, save_from_two_threads_on_rank0);
    cr_assert_eq(hold.inside, 1, "rank 0's first save never wrote inside its begin");
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    /* Every store freed: none of their threads (a pacing's beater too) is left. */
    cr_assert_eq(threads_settled_to(threads_before), threads_before,
                 "a library thread outlived its store");
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t step = -1;
    cr_assert_eq(ckpt_store_latest(ro, CKPT_VERIFY_FULL, &step), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(step, 2);
    tc_state got, want;
    big_state(&want, 0, 2);
    tc_state_init(&got);
    tc_state_like(&got, &want, 0xee);
    cr_assert_eq(ckpt_restore(ro, 2, got.t, got.count, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    tc_assert_state_eq(&got, &want, "rank 0's step 2");
    tc_state_free(&got);
    tc_state_free(&want);
    ckpt_store_free(ro);
}

/* The race 03867c7 fixed, held open: rank 0's first thread stops right
 * after its save's pacing has started (the "save_begin: paced" point),
 * before its save is in flight, while a second thread of the same rank
 * begins step 2.  That second begin must wait there for the first (the
 * store's begin lock) and not reach the point itself: reaching it would
 * mean a second pacing started over the first, whose beats then go on
 * for ever (after the store is freed too).  The first thread waits for
 * the second to arrive for a bounded time, the window the bug needs, not
 * one the test needs to pass; then both saves must commit in order. */
static struct {
    pthread_mutex_t m;
    pthread_cond_t c;
    int armed, first_held, second_reached;
} paced = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};

static void hold_first_paced_begin(void *ctx, const char *where)
{
    (void)ctx;
    if (strcmp(where, "save_begin: paced") != 0)
        return;
    pthread_mutex_lock(&paced.m);
    if (!paced.armed) { /* a later begin: the second thread's, or rank 0's own next */
        if (paced.first_held == 1) { /* said now: what follows may hang */
            paced.second_reached++;
            fprintf(stderr, "test_ranks: a second thread's begin started its pacing while "
                            "the first one's save was not yet in flight\n");
        }
        pthread_cond_broadcast(&paced.c);
        pthread_mutex_unlock(&paced.m);
        return;
    }
    paced.armed = 0;
    paced.first_held = 1;
    pthread_cond_broadcast(&paced.c);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 300 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (!paced.second_reached &&
           pthread_cond_timedwait(&paced.c, &paced.m, &until) != ETIMEDOUT)
        ;
    paced.first_held = 2; /* let go: the window is closed */
    pthread_mutex_unlock(&paced.m);
}

static void *save_step2_once_paced(void *arg)
{
    second_saver *b = arg;
    pthread_mutex_lock(&paced.m);
    while (!paced.first_held)
        pthread_cond_wait(&paced.c, &paced.m);
    pthread_mutex_unlock(&paced.m);
    tc_state s;
    big_state(&s, 0, 2);
    b->status = tc_save(b->st, 2, &s, NULL);
    if (b->status)
        snprintf(b->message, sizeof b->message, "%s", ckpt_error_last());
    tc_state_free(&s);
    return NULL;
}

static int save_from_two_threads_while_paced(job *j, ckpt_store *st)
{
    if (j->u.rank != 0)
        return save_range(j, st, 1, 2, big_state);
    second_saver b = {st, -1, ""};
    pthread_t th;
    pthread_create(&th, NULL, save_step2_once_paced, &b);
    int rc = save_range(j, st, 1, 1, big_state);
    pthread_join(th, NULL);
    cr_assert_eq(b.status, CKPT_OK, "rank 0's second thread: %s", b.message);
    return rc;
}

/* Without the begin lock the ranks' collectives fall out of step and
 * hang: the timeout turns that into a failure (the test takes 0.5 s). */
Test(ranks, a_second_threads_begin_never_starts_a_pacing_over_the_first_ones, .timeout = 30)
{
    fsio fs = {.point = hold_first_paced_begin};
    job jobs[WORLD] = {0};
    for (int r = 0; r < WORLD; r++)
        jobs[r].timeout_ms = 2000;
    jobs[0].fs = &fs;
    paced.armed = 1;
    int threads_before = count_threads();
    run_ranks(jobs, save_from_two_threads_while_paced);
    cr_assert_eq(paced.first_held, 2, "rank 0's first save never passed its pacing start");
    cr_assert_eq(paced.second_reached, 0,
                 "a second thread's begin started its pacing while the first one's save "
                 "was not yet in flight");
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    cr_assert_eq(threads_settled_to(threads_before), threads_before,
                 "a library thread outlived its store");
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t step = -1;
    cr_assert_eq(ckpt_store_latest(ro, CKPT_VERIFY_FULL, &step), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(step, 2);
    ckpt_store_free(ro);
}

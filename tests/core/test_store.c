/* The checkpoint root: one writer at a time, read-only opens, retention,
 * replacing a step, stale temporary directories, garbage collection, a
 * read-only root, threads sharing a store (metadata: test_store_metadata.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "manifest.h"
#include "testing.h"

TestSuite(store, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

/* ------------------------------------------------------------------ lock */

Test(store, second_writer_is_busy)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *a = tc_open(tc_root);
    tc_save_ok(a, 1, &s);

    ckpt_store_options o;
    tc_opts(&o);
    ckpt_store *b = NULL;
    ckpt_error_clear();
    int rc = ckpt_store_open(&b, tc_root, &o);
    cr_assert_eq(rc, CKPT_EBUSY, "second writer: %d (%s)", rc, ckpt_strerror(rc));
    cr_assert_null(b);
    cr_assert_eq(ckpt_error_last_status(), CKPT_EBUSY);
    /* the same program opening one root twice is told so, not sent after
     * "another writer" (the lock note names its own pid) */
    cr_assert(strstr(ckpt_error_last(), "already open for writing in this process"),
              "%s", ckpt_error_last());

    /* a reader needs no lock and can restore while the writer holds it */
    ckpt_store *r = tc_open_ro(tc_root);
    tc_restore_check(r, CKPT_LATEST, &s);
    int64_t one[1] = {1};
    tc_assert_steps(r, one, 1);
    cr_assert_str_eq(ckpt_store_path(r), tc_root);

    /* the writer keeps saving with the reader open */
    tc_state s2;
    tc_state_standard(&s2, 2);
    tc_save_ok(a, 2, &s2);
    cr_assert_eq(tc_restore_check(r, CKPT_LATEST, &s2), 2, "reader sees the new step");

    ckpt_store_free(a);
    rc = ckpt_store_open(&b, tc_root, &o);
    cr_assert_eq(rc, CKPT_OK, "after the first writer is freed: %s", ckpt_error_last());
    tc_restore_check(b, 1, &s);
    ckpt_store_free(b);
    ckpt_store_free(r);
    tc_state_free(&s);
    tc_state_free(&s2);
}

/* A child process, forked before the parent opens anything (so that it
 * holds none of the parent's allocations), that opens a writer on tc_root
 * each time it is asked and answers with the status through a pipe.  Its
 * exit code is not used: a wrapper such as valgrind may replace it. */
typedef struct child {
    pid_t pid;
    int cmd, ans;
} child;

static void child_start(child *c)
{
    int p2c[2], c2p[2];
    cr_assert_eq(pipe(p2c), 0);
    cr_assert_eq(pipe(c2p), 0);
    fflush(NULL);
    c->pid = fork();
    cr_assert_neq(c->pid, -1);
    if (c->pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        char x;
        while (read(p2c[0], &x, 1) == 1) {
            ckpt_store_options o;
            int rc = ckpt_store_options_init(&o, CKPT_STORE_OPTIONS_VERSION);
            o.fsync = 0;
            ckpt_store *b = NULL;
            if (rc == CKPT_OK)
                rc = ckpt_store_open(&b, tc_root, &o);
            ckpt_store_free(b);
            if (write(c2p[1], &rc, sizeof rc) != (ssize_t)sizeof rc)
                break;
        }
        _exit(0);
    }
    close(p2c[0]);
    close(c2p[1]);
    c->cmd = p2c[1];
    c->ans = c2p[0];
}

static int child_open(child *c)
{
    cr_assert_eq(write(c->cmd, "o", 1), 1);
    int rc = 12345;
    cr_assert_eq(read(c->ans, &rc, sizeof rc), (ssize_t)sizeof rc, "the child died");
    return rc;
}

static void child_stop(child *c)
{
    close(c->cmd);
    close(c->ans);
    int status;
    cr_assert_eq(waitpid(c->pid, &status, 0), c->pid);
}

/* Another process is refused too, and gets the lock once we let go. */
Test(store, writer_in_other_process)
{
    child c;
    child_start(&c);
    ckpt_store *a = tc_open(tc_root);
    int rc = child_open(&c);
    cr_assert_eq(rc, CKPT_EBUSY, "other process: open = %d (%s)", rc, ckpt_strerror(rc));
    ckpt_store_free(a);
    rc = child_open(&c);
    cr_assert_eq(rc, CKPT_OK, "other process after release: open = %d (%s)", rc,
                 ckpt_strerror(rc));
    child_stop(&c);
}

/* A child made by fork() (a data-loading worker, a program that forks to
 * write a report) gets the parent's handles as bytes, without the threads
 * they wait for or the locks' owners: each call on them must say so at
 * once, and freeing them only lets go.  They used to wait for ever (a
 * checkpoint read joined pool threads that do not exist in the child).
 * The parent's handles go on working. */
Test(store, a_forked_child_is_refused_the_parents_handles_at_once)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *a = tc_open(tc_root);
    tc_save_ok(a, 1, &s);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, a, 1, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, a, 2, s.t, s.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    uint64_t bytes = s.t[0].bytes;
    void *buf = malloc(bytes ? bytes : 1);
    int res[2];
    cr_assert_eq(pipe(res), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(res[0]);
        alarm(60); /* a call that hangs ends the child: the parent sees too few answers */
        int64_t step = -1;
        ckpt_save *sv2 = NULL;
        int rc[9];
        char msg[9][160];
        rc[0] = ckpt_checkpoint_read(ck, s.t[0].name, buf, bytes);
        snprintf(msg[0], sizeof msg[0], "%s", ckpt_error_last());
        rc[1] = ckpt_save_wait(sv);
        snprintf(msg[1], sizeof msg[1], "%s", ckpt_error_last());
        rc[2] = ckpt_store_latest(a, CKPT_VERIFY_QUICK, &step);
        snprintf(msg[2], sizeof msg[2], "%s", ckpt_error_last());
        rc[3] = ckpt_restore(a, CKPT_LATEST, s.t, s.count, NULL, NULL);
        snprintf(msg[3], sizeof msg[3], "%s", ckpt_error_last());
        rc[4] = ckpt_save_begin(&sv2, a, 3, s.t, s.count, NULL);
        snprintf(msg[4], sizeof msg[4], "%s", ckpt_error_last());
        rc[5] = ckpt_checkpoint_restore(ck, s.t, s.count, NULL);
        snprintf(msg[5], sizeof msg[5], "%s", ckpt_error_last());
        rc[6] = ckpt_verify(a, 1, CKPT_VERIFY_FULL, NULL);
        snprintf(msg[6], sizeof msg[6], "%s", ckpt_error_last());
        ckpt_tensor_info info;
        rc[7] = ckpt_checkpoint_tensor(ck, 0, &info);
        snprintf(msg[7], sizeof msg[7], "%s", ckpt_error_last());
        ckpt_save_stats stats;
        rc[8] = ckpt_checkpoint_stats(ck, &stats);
        snprintf(msg[8], sizeof msg[8], "%s", ckpt_error_last());
        ckpt_checkpoint_free(ck);
        ckpt_save_free(sv);
        ckpt_store_free(a);
        if (write(res[1], rc, sizeof rc) == (ssize_t)sizeof rc)
            (void)!write(res[1], msg, sizeof msg);
        /* What the parent's threads held is not the child's to free: a
         * leak check at exit (valgrind follows the child) would call it
         * lost.  The answers went through the pipe. */
        raise(SIGKILL);
        _exit(1);
    }
    close(res[1]);
    int rc[9];
    char msg[9][160];
    ssize_t got = read(res[0], rc, sizeof rc);
    ssize_t got2 = got == (ssize_t)sizeof rc ? read(res[0], msg, sizeof msg) : 0;
    close(res[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(got == (ssize_t)sizeof rc && got2 == (ssize_t)sizeof msg,
              "the child did not answer (a call hung or crashed it: status 0x%x)", status);
    for (int i = 0; i < 9; i++) {
        msg[i][sizeof msg[i] - 1] = 0;
        cr_expect_eq(rc[i], CKPT_EINVAL, "call %d in the child: %d (%s)", i, rc[i],
                     ckpt_strerror(rc[i]));
        cr_expect(strstr(msg[i], "fork()"), "call %d: the message names no fork: %s", i,
                  msg[i]);
    }
    /* the parent's handles are untouched */
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    cr_assert_eq(ckpt_checkpoint_read(ck, s.t[0].name, buf, bytes), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(memcmp(buf, s.t[0].data, bytes), 0);
    ckpt_checkpoint_free(ck);
    cr_assert_eq(tc_restore_check(a, CKPT_LATEST, &s), 2);
    ckpt_store_free(a);
    free(buf);
    tc_state_free(&s);
}

/* A save handle may outlive its store (ckpt.h, Lifetimes): freeing the
 * store waits for the save, and the handle's functions still work without
 * it.  The fork check read the freed store (ASan: heap-use-after-free in
 * ckpt_save_done); it now keeps the owner in the handle. */
Test(store, a_save_handle_outlives_its_store)
{
    tc_state s;
    tc_state_standard(&s, 4);
    ckpt_store *a = tc_open(tc_root);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, a, 1, s.t, s.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    ckpt_store_free(a);
    /* memory the store held, reused: a stale read would see these bytes */
    void *reuse[64];
    for (int i = 0; i < 64; i++)
        memset(reuse[i] = malloc(4096), 0x5a, 4096);
    cr_assert_eq(ckpt_save_done(sv), 1);
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_wait_snapshot(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_stats st;
    cr_assert_eq(ckpt_save_stats_get(sv, &st), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(st.step, 1);
    ckpt_save_free(sv);
    for (int i = 0; i < 64; i++)
        free(reuse[i]);
    ckpt_store *r = tc_open_ro(tc_root);
    cr_assert_eq(tc_restore_check(r, CKPT_LATEST, &s), 1);
    ckpt_store_free(r);
    tc_state_free(&s);
}

Test(store, open_creates_root_and_readonly_needs_it)
{
    char *sub = tc_join(tc_root, "new-root");
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = CKPT_OPEN_READONLY;
    ckpt_store *st = NULL;
    int rc = ckpt_store_open(&st, sub, &o);
    cr_assert_neq(rc, CKPT_OK, "read-only open of a missing root succeeded");
    cr_assert_null(st);
    cr_assert(tc_nonempty(ckpt_error_last()));
    cr_assert(!tc_exists(sub), "read-only open created the root");

    st = tc_open(sub);
    cr_assert(tc_exists(sub), "writer did not create the root");
    cr_assert_str_eq(ckpt_store_path(st), sub);
    ckpt_store_free(st);
    free(sub);

    /* a root that is a regular file */
    char *file = tc_join(tc_root, "file");
    tc_write_file(file, "x", 1);
    tc_opts(&o);
    rc = ckpt_store_open(&st, file, &o);
    cr_assert_neq(rc, CKPT_OK, "a regular file opened as a root");
    cr_assert(tc_nonempty(ckpt_error_last()));
    free(file);
}

Test(store, readonly_store_refuses_writes)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s);
    ckpt_store_free(w);

    ckpt_store *r = tc_open_ro(tc_root);
    int rc = tc_save(r, 2, &s, NULL);
    cr_assert(rc == CKPT_EACCES || rc == CKPT_EINVAL, "save on a read-only store = %d", rc);
    cr_assert(tc_nonempty(ckpt_error_last()));
    ckpt_report *rep = NULL;
    rc = ckpt_store_gc(r, 1, 0, &rep);
    cr_assert(rc == CKPT_EACCES || rc == CKPT_EINVAL, "gc on a read-only store = %d", rc);
    ckpt_report_free(rep);
    int64_t one[1] = {1};
    tc_assert_steps(r, one, 1);
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);
    ckpt_store_free(r);
    tc_state_free(&s);
}

/* ------------------------------------------------------------- retention */

static void save_steps(ckpt_store *st, int from, int to, tc_state *states)
{
    for (int i = from; i <= to; i++) {
        tc_state_standard(&states[i], (uint64_t)i + 100);
        tc_save_ok(st, i, &states[i]);
    }
}

static int count_step_dirs(void)
{
    return tc_count_prefix(tc_root, "step-");
}

static void check_retention(int keep_last, const int64_t *want, size_t nwant)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = keep_last;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state states[6];
    save_steps(st, 1, 5, states);
    tc_assert_steps(st, want, nwant);
    cr_assert_eq(count_step_dirs(), (int)nwant, "step-* entries in the root");
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);
    for (size_t i = 0; i < nwant; i++)
        tc_restore_check(st, want[i], &states[want[i]]);
    ckpt_store_free(st);
    /* the retired steps' files, deleted in the background, are gone once
     * the store is closed */
    cr_assert_eq(tc_count_prefix(tc_root, ".trash-"), 0);
    /* as seen by a fresh reader */
    st = tc_open_ro(tc_root);
    tc_assert_steps(st, want, nwant);
    ckpt_store_free(st);
    for (int i = 1; i <= 5; i++)
        tc_state_free(&states[i]);
}

Test(store, keep_last_2)
{
    int64_t want[] = {4, 5};
    check_retention(2, want, 2);
}

Test(store, keep_last_1)
{
    int64_t want[] = {5};
    check_retention(1, want, 1);
}

Test(store, keep_last_0_keeps_all)
{
    int64_t want[] = {1, 2, 3, 4, 5};
    check_retention(0, want, 5);
}

Test(store, keep_last_default_is_3)
{
    int64_t want[] = {3, 4, 5};
    check_retention(-1, want, 3);
}

/* A save retires what keep_last does not keep before it returns (renamed
 * out of the namespace, durably); deleting the files runs in the
 * background, and ckpt_store_gc waits for it: it finds nothing stale. */
Test(store, retired_steps_deleted_in_background)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 1;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_standard(&s, 3);
    for (int i = 1; i <= 4; i++) {
        tc_save_ok(st, i, &s);
        cr_assert_eq(count_step_dirs(), 1, "after step %d", i);
    }
    ckpt_report *rep = NULL;
    cr_assert_eq(ckpt_store_gc(st, 1, 0, &rep), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_report_count(rep), 0, "gc found %zu entries to remove",
                 ckpt_report_count(rep));
    ckpt_report_free(rep);
    cr_assert_eq(tc_count_prefix(tc_root, ".trash-"), 0);
    tc_save_ok(st, 5, &s);
    ckpt_store_free(st);
    cr_assert_eq(tc_count_prefix(tc_root, ".trash-"), 0);
    cr_assert_eq(count_step_dirs(), 1);
    st = tc_open_ro(tc_root);
    tc_restore_check(st, 5, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* A reader racing a writer that keeps one step: the step the reader listed
 * as newest is retired (renamed away) by the writer's next save while the
 * reader lists the root (the entry vanishes between the listing and its
 * stat) or before the reader opens it.  The reader must look again and
 * take the new step; it used to fail with "no checkpoint" or with "no
 * valid checkpoint ... (step N) because: no step N", reporting a retired
 * step as a damaged one. */
typedef struct retire_race {
    ckpt_store *writer;
    const tc_state *state;
    char victim[64];   /* "step-…" of the step to retire */
    int skip;          /* touches of it to let pass first */
    int64_t next;      /* the step the writer saves then */
    int fired;
} retire_race;

static int retire_on_touch(void *ctx, fsio_op op, const char *path)
{
    (void)op;
    retire_race *r = ctx;
    if (r->fired || !path || !strstr(path, r->victim) || r->skip-- > 0)
        return 0;
    r->fired = 1;
    ckpt_error_state e; /* the reader's message slot is the reader's */
    ckpt_error_capture(&e, 0);
    int rc = tc_save(r->writer, r->next, r->state, NULL);
    ckpt_error_restore(&e);
    return rc ? EIO : 0; /* a failed save shows as a failed open */
}

static void race_arm(retire_race *r, int64_t victim, int skip)
{
    char *dir = tc_step_dir(tc_root, victim);
    snprintf(r->victim, sizeof r->victim, "%s", strrchr(dir, '/') + 1);
    free(dir);
    r->next = victim + 1;
    r->skip = skip;
    r->fired = 0;
}

Test(store, a_step_retired_while_the_reader_looks_is_passed_for_the_new_one)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 1;
    retire_race race = {.fired = 1}; /* armed by race_arm */
    tc_state s, got;
    tc_state_standard(&s, 7);
    tc_state_like(&got, &s, 0);
    race.state = &s;
    cr_assert_eq(ckpt_store_open(&race.writer, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(race.writer, 1, &s);
    fsio fs = {.fault = retire_on_touch, .ctx = &race};
    ckpt_store_options ro;
    tc_opts(&ro);
    ro.flags = CKPT_OPEN_READONLY;
    ckpt_store *rd = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&rd, tc_root, &ro, &fs), CKPT_OK, "%s",
                 ckpt_error_last());
    int64_t victim = 1;
    /* skip 0: retired while listed; skip 1: listed, then retired */
    for (int skip = 0; skip < 2; skip++) {
        race_arm(&race, victim++, skip); /* ckpt_restore(CKPT_LATEST) */
        ckpt_report *rep = NULL;
        memset(got.t[0].data, 0, got.t[0].bytes);
        int rc = ckpt_restore(rd, CKPT_LATEST, got.t, got.count, NULL, &rep);
        cr_assert(race.fired, "the race was not run (skip %d)", skip);
        cr_assert_eq(rc, CKPT_OK, "restore, skip %d: %s", skip, ckpt_error_last());
        cr_assert_eq(ckpt_report_step(rep), victim);
        cr_assert_eq(ckpt_report_count(rep), 0, "a retired step reported as a problem: %s",
                     ckpt_report_count(rep) ? ckpt_report_get(rep, 0)->message : "");
        tc_assert_state_eq(&got, &s, "restored after the race");
        ckpt_report_free(rep);

        race_arm(&race, victim++, skip); /* ckpt_store_latest */
        int64_t step = -1;
        rc = ckpt_store_latest(rd, CKPT_VERIFY_FULL, &step);
        cr_assert(race.fired);
        cr_assert_eq(rc, CKPT_OK, "latest, skip %d: %s", skip, ckpt_error_last());
        cr_assert_eq(step, victim);

        race_arm(&race, victim++, skip); /* ckpt_checkpoint_open(CKPT_LATEST) */
        ckpt_checkpoint *ck = NULL;
        rc = ckpt_checkpoint_open(&ck, rd, CKPT_LATEST, CKPT_VERIFY_QUICK);
        cr_assert(race.fired);
        cr_assert_eq(rc, CKPT_OK, "open, skip %d: %s", skip, ckpt_error_last());
        cr_assert_eq(ckpt_checkpoint_step(ck), victim);
        ckpt_checkpoint_free(ck);
    }
    ckpt_store_free(rd);
    ckpt_store_free(race.writer);
    tc_state_free(&got);
    tc_state_free(&s);
}

/* A save below the newest committed step is refused (a new run restarted
 * in a used directory would otherwise be hidden behind the old steps), and
 * nothing changes. */
Test(store, lower_step_is_refused)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state s;
    tc_state_standard(&s, 1);
    tc_save_ok(st, 10, &s);
    tc_save_ok(st, 30, &s);
    int rc = tc_save(st, 20, &s, NULL);
    cr_assert_eq(rc, CKPT_EINVAL);
    const char *msg = ckpt_error_last();
    cr_assert(strstr(msg, "step 20") && strstr(msg, "step 30") &&
              strstr(msg, "CKPT_OPEN_REWIND") && strstr(msg, "new directory"), "%s", msg);
    int64_t want[] = {10, 30};
    tc_assert_steps(st, want, 2);
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);
    tc_save_ok(st, 30, &s); /* the same step again replaces it */
    tc_state_free(&s);
    ckpt_store_free(st);
}

/* With CKPT_OPEN_REWIND, going back to step 20 retires the steps above it
 * once 20 commits, so restore(LATEST) takes the new step. */
Test(store, rewind_retires_steps_above)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = CKPT_OPEN_REWIND;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state a, b;
    tc_state_standard(&a, 1);
    tc_state_standard(&b, 2);
    tc_save_ok(st, 10, &a);
    tc_save_ok(st, 30, &a);
    tc_save_ok(st, 40, &a);
    tc_save_ok(st, 20, &b);
    int64_t want[] = {10, 20};
    tc_assert_steps(st, want, 2);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &b), 20);
    tc_state_free(&a);
    tc_state_free(&b);
    ckpt_store_free(st);
}

/* keep_last counts steps that open: a damaged step is not one of the kept,
 * so the older good step stays.  (Counting by number kept the damaged
 * step and the new one, retiring the last good one before it.) */
Test(store, retention_counts_only_valid_steps)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 2;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK);
    tc_state s;
    tc_state_standard(&s, 1);
    for (int i = 1; i <= 3; i++)
        tc_save_ok(st, i, &s);
    char *dir = tc_step_dir(tc_root, 3), *man = tc_join(dir, "manifest.json");
    tc_truncate(man, tc_file_size(man) / 2);
    tc_save_ok(st, 4, &s);
    int64_t want[] = {2, 3, 4};
    tc_assert_steps(st, want, 3);
    tc_restore_check(st, 2, &s);
    tc_save_ok(st, 5, &s); /* 3 is now old enough to go */
    int64_t want2[] = {4, 5};
    tc_assert_steps(st, want2, 2);
    free(man);
    free(dir);
    tc_state_free(&s);
    ckpt_store_free(st);
}

Test(store, resave_replaces_step)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state a, b;
    tc_state_standard(&a, 1);
    tc_state_standard(&b, 2);
    tc_save_ok(st, 7, &a);
    tc_restore_check(st, 7, &a);
    tc_save_ok(st, 7, &b);
    tc_restore_check(st, 7, &b);
    int64_t want[] = {7};
    tc_assert_steps(st, want, 1);
    cr_assert_eq(count_step_dirs(), 1, "a replaced step left another step-* entry");
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);

    /* a replacement with other tensors: the old names are gone */
    tc_state c;
    tc_state_init(&c);
    int64_t n[1] = {10};
    tc_state_add(&c, "only.this", CKPT_U16, 1, n, TC_RANDOM, 3);
    tc_save_ok(st, 7, &c);
    tc_restore_check(st, 7, &c);
    void *data = NULL;
    uint64_t bytes;
    cr_assert_eq(ckpt_load(st, 7, "model.weight", &data, &bytes, NULL), CKPT_ENOTFOUND);
    cr_assert_eq(ckpt_verify(st, 7, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    ckpt_store_free(st);

    st = tc_open_ro(tc_root);
    tc_restore_check(st, CKPT_LATEST, &c);
    ckpt_store_free(st);
    tc_state_free(&a);
    tc_state_free(&b);
    tc_state_free(&c);
}

/* ----------------------------------------------------- stale temp dirs */

static char *make_stale_tmp(const char *name, int with_checkpoint_files)
{
    char *dir = tc_join(tc_root, name);
    cr_assert_eq(mkdir(dir, 0755), 0);
    char *junk = tc_join(dir, "junk.bin");
    tc_write_file(junk, "\x00\x01garbage", 9);
    free(junk);
    if (with_checkpoint_files) {
        /* a complete, valid-looking checkpoint: still never a checkpoint */
        char *src = tc_step_dir(tc_root, 1);
        char *man = tc_join(src, "manifest.json");
        char *dman = tc_join(dir, "manifest.json");
        tc_copy_file(man, dman);
        char *shard = tc_find_suffix(src, ".shard");
        cr_assert(shard);
        const char *base = strrchr(shard, '/') + 1;
        char *dshard = tc_join(dir, base);
        tc_copy_file(shard, dshard);
        free(src);
        free(man);
        free(dman);
        free(shard);
        free(dshard);
    }
    return dir;
}

Test(store, stale_temp_dirs)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s);
    ckpt_store_free(w);

    char *t7 = make_stale_tmp(".tmp-step-000000000007-dead", 0);
    char *t9 = make_stale_tmp(".tmp-step-000000000009-dead", 1);

    /* a reader ignores them and leaves them alone */
    char *before = tc_tree_snapshot(tc_root);
    ckpt_store *r = tc_open_ro(tc_root);
    int64_t one[1] = {1};
    tc_assert_steps(r, one, 1);
    int64_t latest = -1;
    cr_assert_eq(ckpt_store_latest(r, CKPT_VERIFY_FULL, &latest), CKPT_OK);
    cr_assert_eq(latest, 1);
    cr_assert_eq(tc_restore_check(r, CKPT_LATEST, &s), 1);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, r, 9, CKPT_VERIFY_QUICK), CKPT_ENOTFOUND);
    cr_assert_eq(ckpt_checkpoint_open(&ck, r, 7, CKPT_VERIFY_QUICK), CKPT_ENOTFOUND);
    ckpt_store_free(r);
    cr_assert(tc_exists(t7) && tc_exists(t9), "a reader removed a temp dir");
    char *after = tc_tree_snapshot(tc_root);
    cr_assert_str_eq(after, before, "a reader changed the root");
    free(before);
    free(after);

    /* a writer removes them on open */
    w = tc_open(tc_root);
    cr_assert(!tc_exists(t7), "%s survived the writer's open", t7);
    cr_assert(!tc_exists(t9), "%s survived the writer's open", t9);
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);
    tc_assert_steps(w, one, 1);
    tc_restore_check(w, 1, &s);
    ckpt_store_free(w);
    free(t7);
    free(t9);
    tc_state_free(&s);
}

/* A file, link or socket named like the next step (left by someone: no
 * writer makes one) makes every save of that step fail.  It used to fail
 * with "cannot commit ... Not a directory" (EIO); the message now says what
 * stands there and that it must go.  Nothing is removed, the previous step
 * stays, and once the entry is gone the step saves. */
Test(store, an_entry_that_is_not_a_step_where_the_step_goes_is_named)
{
    tc_state s1, s2;
    tc_state_standard(&s1, 1);
    tc_state_standard(&s2, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s1);
    char path[4096];
    snprintf(path, sizeof path, "%s/step-000000000002", tc_root);
    const struct {
        const char *what;
        int link;
    } kinds[] = {{"a regular file", 0}, {"a symbolic link", 1}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (kinds[i].link) {
            cr_assert_eq(symlink("step-000000000001", path), 0);
        } else {
            FILE *f = fopen(path, "w");
            cr_assert_not_null(f);
            fputs("not a checkpoint\n", f);
            fclose(f);
        }
        cr_assert_eq(tc_save(w, 2, &s2, NULL), CKPT_EIO);
        const char *msg = ckpt_error_last();
        cr_assert(strstr(msg, path) && strstr(msg, kinds[i].what) &&
                  strstr(msg, "not a checkpoint") && strstr(msg, "remove it"),
                  "%s: %s", kinds[i].what, msg);
        struct stat sb;
        cr_assert_eq(lstat(path, &sb), 0, "the entry was removed");
        int64_t one[1] = {1};
        tc_assert_steps(w, one, 1);
        tc_restore_check(w, 1, &s1);
        cr_assert_eq(unlink(path), 0);
    }
    tc_save_ok(w, 2, &s2);
    tc_restore_check(w, 2, &s2);
    ckpt_store_free(w);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* A committed step moved aside by a writer that died while replacing it
 * (.replaced-step-N-...) is put back by the next writer's open, or removed
 * when the replacement made it.  A file standing at step-N is no
 * replacement: the copy aside was deleted, the step's only copy. */
Test(store, a_step_moved_aside_is_kept_when_a_file_stands_in_its_place)
{
    tc_state s1, s2;
    tc_state_standard(&s1, 1);
    tc_state_standard(&s2, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s1);
    tc_save_ok(w, 2, &s2);
    ckpt_store_free(w);
    char step[4096], aside[4096];
    snprintf(step, sizeof step, "%s/step-000000000002", tc_root);
    snprintf(aside, sizeof aside, "%s/.replaced-step-000000000002-99999-1", tc_root);
    cr_assert_eq(rename(step, aside), 0);
    FILE *f = fopen(step, "w");
    cr_assert_not_null(f);
    fclose(f);
    w = tc_open(tc_root);
    ckpt_store_free(w);
    cr_assert(tc_exists(aside), "the only copy of step 2 was deleted");
    /* once the file is gone, the next open puts the step back */
    cr_assert_eq(unlink(step), 0);
    w = tc_open(tc_root);
    cr_assert(!tc_exists(aside));
    tc_restore_check(w, 2, &s2);
    ckpt_store_free(w);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

Test(store, gc_reports_and_removes)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *w = tc_open(tc_root); /* keep_last 0 */
    for (int i = 1; i <= 3; i++)
        tc_save_ok(w, i, &s);
    /* a stale dir that appears while the writer is open */
    char *t = make_stale_tmp(".tmp-step-000000000004-dead", 0);

    ckpt_report *rep = NULL;
    int rc = ckpt_store_gc(w, 1, 1, &rep);
    cr_assert_eq(rc, CKPT_OK, "gc dry run: %s", ckpt_error_last());
    cr_assert(rep);
    int seen_tmp = 0, seen1 = 0, seen2 = 0;
    for (size_t i = 0; i < ckpt_report_count(rep); i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        cr_assert_eq(p->status, CKPT_OK);
        cr_assert(p->file);
        if (p->step == -1) {
            cr_assert_str_eq(p->file, ".tmp-step-000000000004-dead");
            seen_tmp++;
        } else if (p->step == 1) {
            cr_assert_str_eq(p->file, "step-000000000001");
            seen1++;
        } else if (p->step == 2) {
            cr_assert_str_eq(p->file, "step-000000000002");
            seen2++;
        } else {
            cr_assert_fail("gc would remove step %" PRId64 " (%s)", p->step, p->file);
        }
    }
    cr_assert(seen_tmp == 1 && seen1 == 1 && seen2 == 1,
              "dry-run report: tmp %d, step1 %d, step2 %d", seen_tmp, seen1, seen2);
    ckpt_report_free(rep);
    int64_t all[] = {1, 2, 3};
    tc_assert_steps(w, all, 3);
    cr_assert(tc_exists(t), "dry run removed the temp dir");

    rep = NULL;
    rc = ckpt_store_gc(w, 1, 0, &rep);
    cr_assert_eq(rc, CKPT_OK, "gc: %s", ckpt_error_last());
    cr_assert_eq(ckpt_report_count(rep), 3);
    ckpt_report_free(rep);
    int64_t last[] = {3};
    tc_assert_steps(w, last, 1);
    cr_assert(!tc_exists(t));
    cr_assert_eq(count_step_dirs(), 1);
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);
    tc_restore_check(w, 3, &s);

    /* nothing left to do */
    rep = NULL;
    cr_assert_eq(ckpt_store_gc(w, 1, 0, &rep), CKPT_OK);
    cr_assert_eq(ckpt_report_count(rep), 0);
    ckpt_report_free(rep);
    ckpt_store_free(w);
    free(t);
    tc_state_free(&s);
}

/* gc never removes the newest step that passes quick verification. */
Test(store, gc_keeps_newest_good_step)
{
    tc_state s[4];
    ckpt_store *w = tc_open(tc_root);
    for (int i = 1; i <= 3; i++) {
        tc_state_standard(&s[i], (uint64_t)i);
        tc_save_ok(w, i, &s[i]);
    }
    char *dir = tc_step_dir(tc_root, 3);
    char *man = tc_join(dir, "manifest.json");
    tc_truncate(man, tc_file_size(man) / 2);
    cr_assert_eq(ckpt_store_gc(w, 1, 0, NULL), CKPT_OK, "gc: %s", ckpt_error_last());
    size_t n;
    int64_t *steps = tc_steps(w, &n);
    int has2 = 0, has1 = 0;
    for (size_t i = 0; i < n; i++) {
        has1 |= steps[i] == 1;
        has2 |= steps[i] == 2;
    }
    ckpt_free(steps);
    cr_assert(has2, "gc removed step 2, the newest good one");
    cr_assert(!has1, "gc kept step 1 with keep_last 1");
    cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &s[2]), 2);
    ckpt_store_free(w);
    free(man);
    free(dir);
    for (int i = 1; i <= 3; i++)
        tc_state_free(&s[i]);
}

/* ------------------------------------------------------- read-only root */

Test(store, readonly_root_directory)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s);
    tc_save_ok(w, 2, &s);
    ckpt_store_free(w);
    cr_assert_eq(chmod(tc_root, 0555), 0);
    /* chmod does not stop root: make everything immutable as well */
    int enforced = geteuid() != 0 || tc_set_immutable(tc_root, 1) == 0;
    char *before = tc_tree_snapshot(tc_root);

    ckpt_store *r = tc_open_ro(tc_root);
    int64_t want[] = {1, 2};
    tc_assert_steps(r, want, 2);
    cr_assert_eq(ckpt_verify(r, 2, CKPT_VERIFY_FULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    int64_t latest;
    cr_assert_eq(ckpt_store_latest(r, CKPT_VERIFY_FULL, &latest), CKPT_OK);
    cr_assert_eq(latest, 2);
    cr_assert_eq(tc_restore_check(r, CKPT_LATEST, &s), 2);
    void *data = NULL;
    uint64_t bytes;
    cr_assert_eq(ckpt_load(r, 1, "model.bias", &data, &bytes, NULL), CKPT_OK);
    ckpt_free(data);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, r, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(r);

    char *after = tc_tree_snapshot(tc_root);
    cr_assert_str_eq(after, before, "a read-only store changed the root");
    free(after);
    free(before);

    if (!enforced) {
        tc_state_free(&s);
        cr_skip_test("running as root without chattr +i: the check that a writer "
                     "on a read-only root gets CKPT_EACCES was skipped");
    }
    ckpt_store_options o;
    tc_opts(&o);
    w = NULL;
    int rc = ckpt_store_open(&w, tc_root, &o);
    cr_assert_eq(rc, CKPT_EACCES, "writer on a read-only root = %d (%s): %s", rc,
                 ckpt_strerror(rc), ckpt_error_last());
    cr_assert(tc_nonempty(ckpt_error_last()));
    cr_assert_null(w);
    tc_set_immutable(tc_root, 0);
    chmod(tc_root, 0755);
    tc_state_free(&s);
}

/* ------------------------------------------------------------ threads */

/* One store used from several threads at once: restores and verifies run
 * while another thread saves.  Threads only record what they saw; the test
 * thread asserts (Criterion assertions belong to the test's thread). */
typedef struct reader_arg {
    ckpt_store *st;
    const tc_state *a, *b; /* steps 1 and 2..: contents a (odd) or b (even) */
    int rounds;
    int bad;          /* restores that failed or returned wrong data */
    char why[256];
} reader_arg;

static void *reader_thread(void *p)
{
    reader_arg *r = p;
    for (int i = 0; i < r->rounds && !r->bad; i++) {
        tc_state got;
        tc_state_like(&got, r->a, 0);
        ckpt_report *rep = NULL;
        int rc = ckpt_restore(r->st, CKPT_LATEST, got.t, got.count, NULL, &rep);
        if (rc != CKPT_OK) {
            r->bad++;
            snprintf(r->why, sizeof r->why, "restore = %d: %s", rc, ckpt_error_last());
        } else {
            int64_t s = ckpt_report_step(rep);
            const tc_state *want = s % 2 ? r->a : r->b;
            for (size_t k = 0; k < got.count; k++)
                if (memcmp(got.t[k].data, want->t[k].data, got.t[k].bytes) != 0) {
                    r->bad++;
                    snprintf(r->why, sizeof r->why, "step %lld: tensor %s differs",
                             (long long)s, got.t[k].name);
                    break;
                }
        }
        ckpt_report_free(rep);
        tc_state_free(&got);
    }
    return NULL;
}

/* Savers take the next step number and begin its save under one mutex,
 * as a training loop's threads would: steps begin in order, and their
 * waits run concurrently. */
typedef struct saver_arg {
    ckpt_store *st;
    const tc_state *a, *b;
    pthread_mutex_t *mu;
    int *next, last;
    int rc;
    char why[256];
} saver_arg;

static void *saver_thread(void *p)
{
    saver_arg *s = p;
    for (;;) {
        pthread_mutex_lock(s->mu);
        int step = (*s->next)++;
        if (step > s->last) {
            pthread_mutex_unlock(s->mu);
            break;
        }
        const tc_state *src = step % 2 ? s->a : s->b;
        ckpt_save *sv = NULL;
        s->rc = ckpt_save_begin(&sv, s->st, step, src->t, src->count, NULL);
        pthread_mutex_unlock(s->mu);
        if (s->rc == CKPT_OK)
            s->rc = ckpt_save_wait(sv);
        if (s->rc != CKPT_OK)
            snprintf(s->why, sizeof s->why, "step %d: %s", step, ckpt_error_last());
        ckpt_save_free(sv);
        if (s->rc != CKPT_OK)
            break;
    }
    return NULL;
}

Test(store, threads_share_a_store)
{
    tc_state a, b;
    tc_state_standard(&a, 1);
    tc_state_standard(&b, 2);
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 3;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(st, 1, &a);

    enum { READERS = 3 };
    reader_arg rd[READERS];
    pthread_t th[READERS + 2];
    for (int i = 0; i < READERS; i++) {
        rd[i] = (reader_arg){st, &a, &b, 15, 0, ""};
        cr_assert_eq(pthread_create(&th[i], NULL, reader_thread, &rd[i]), 0);
    }
    /* two savers on one store: the steps interleave but every save commits */
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    int next = 2;
    saver_arg sa = {st, &a, &b, &mu, &next, 21, CKPT_OK, ""};
    saver_arg sb = {st, &a, &b, &mu, &next, 21, CKPT_OK, ""};
    cr_assert_eq(pthread_create(&th[READERS], NULL, saver_thread, &sa), 0);
    cr_assert_eq(pthread_create(&th[READERS + 1], NULL, saver_thread, &sb), 0);
    for (int i = 0; i < READERS + 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < READERS; i++)
        cr_assert_eq(rd[i].bad, 0, "reader %d: %s", i, rd[i].why);
    cr_assert_eq(sa.rc, CKPT_OK, "saver a: %s", sa.why);
    cr_assert_eq(sb.rc, CKPT_OK, "saver b: %s", sb.why);
    /* Retention keeps the three highest steps. */
    size_t n;
    int64_t *steps = tc_steps(st, &n);
    cr_assert(n == 3 && steps[0] == 19 && steps[1] == 20 && steps[2] == 21,
              "%zu steps kept, the newest %lld", n, (long long)steps[n - 1]);
    ckpt_free(steps);
    tc_restore_check(st, 21, &a);
    tc_restore_check(st, 20, &b);
    ckpt_store_free(st);
    tc_state_free(&a);
    tc_state_free(&b);
}

/* The root removed under a writer (rm -rf of the run): its pinned
 * directory lists as empty, so a restarting job's restore found "no
 * checkpoint" and trained from scratch.  Every call that lists the root
 * says it is gone, as a reader's does. */
Test(store, a_root_removed_under_a_writer_is_said_gone)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    tc_rmtree(tc_root);
    int64_t *steps = NULL, step = -1;
    size_t n = 9;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_ENOTFOUND, "%s", ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "was removed"), "%s", ckpt_error_last());
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &step), CKPT_ENOTFOUND, "%s",
                 ckpt_error_last());
    tc_state got;
    tc_state_like(&got, &s, 0);
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, NULL), CKPT_ENOTFOUND,
                 "%s", ckpt_error_last());
    ckpt_free(steps);
    ckpt_store_free(st);
    cr_assert_eq(mkdir(tc_root, 0700), 0); /* for the teardown */
    tc_state_free(&got);
    tc_state_free(&s);
}

/* A writer cleans up stale temporaries in the root it pinned at open, the
 * one it lists and saves in, not in whatever the root's path names by now
 * (a member of a trusted group may rename it): it listed the path and
 * removed those names in the pinned root, missing the pinned root's own
 * leftovers. */
Test(store, gc_cleans_the_root_the_writer_pinned)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    char moved[4096];
    snprintf(moved, sizeof moved, "%s-moved", tc_root);
    char *ours = tc_join(moved, ".tmp-step-000000000007-1-1");
    char *theirs = tc_join(tc_root, ".tmp-step-000000000008-1-1");
    cr_assert_eq(rename(tc_root, moved), 0);
    cr_assert_eq(mkdir(ours, 0700), 0);
    cr_assert_eq(mkdir(tc_root, 0700), 0);
    cr_assert_eq(mkdir(theirs, 0700), 0);
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_store_gc(st, 1, 0, &r), CKPT_OK, "%s", ckpt_error_last());
    ckpt_report_free(r);
    cr_assert(!tc_exists(ours), "the pinned root's stale temporary is left");
    cr_assert(tc_exists(theirs), "a directory of the path's new root was removed");
    ckpt_store_free(st);
    tc_rmtree(moved);
    free(ours);
    free(theirs);
    tc_state_free(&s);
}

/* Injected file-system faults (lib/testing.h): the Nth call of one fsio
 * operation fails with ENOSPC or EIO, for every N up to the number of calls
 * a fault-free run makes.  Whatever fails, the save returns OK or the
 * injected error with a message, the checkpoints committed before stay
 * intact, a reopen leaves no temporary directory behind, and a step that
 * did commit restores exactly. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"
#include "testing.h"

TestSuite(faults, .init = tc_setup, .fini = tc_teardown, .timeout = 900);

/* ------------------------------------------------------------ the hook */

typedef struct fault {
    pthread_mutex_t mu;
    int armed;                  /* count (and fail) only while armed */
    fsio_op op;                 /* the operation to fail */
    long nth;                   /* its call to fail, 1-based; 0: none */
    int err;                    /* errno to fail it with */
    long calls[FSIO_OP_COUNT];  /* calls seen while armed */
    int fired;
    char path[512];             /* path of the failed call, or "" */
    /* Emulate a file system without renameat2(RENAME_EXCHANGE): the second
     * rename of a .tmp-* path (the first failed because step-N exists; the
     * second is the swap) fails with EINVAL. */
    int no_exchange;
    long tmp_renames;
} fault;

static int hook(void *ctx, fsio_op op, const char *path)
{
    fault *f = ctx;
    int ret = 0;
    pthread_mutex_lock(&f->mu);
    if (f->armed && (int)op >= 0 && op < FSIO_OP_COUNT) {
        long n = ++f->calls[op];
        if (f->no_exchange && op == FSIO_RENAME && path && strstr(path, "/.tmp-") &&
            ++f->tmp_renames == 2)
            ret = EINVAL;
        else if (op == f->op && n == f->nth) {
            ret = f->err;
            f->fired = 1;
            snprintf(f->path, sizeof f->path, "%s", path ? path : "(fd)");
        }
    }
    pthread_mutex_unlock(&f->mu);
    return ret;
}

static void fault_reset(fault *f, fsio_op op, long nth, int err)
{
    pthread_mutex_lock(&f->mu);
    f->no_exchange = 0;
    f->armed = 0;
    f->op = op;
    f->nth = nth;
    f->err = err;
    memset(f->calls, 0, sizeof f->calls);
    f->tmp_renames = 0;
    f->fired = 0;
    f->path[0] = 0;
    pthread_mutex_unlock(&f->mu);
}

static void fault_arm(fault *f, int on)
{
    pthread_mutex_lock(&f->mu);
    f->armed = on;
    pthread_mutex_unlock(&f->mu);
}

static int status_of(int err)
{
    return err == ENOSPC ? CKPT_ENOSPC : CKPT_EIO;
}

/* ENOSPC only where a write can run out of space. */
static int can_enospc(fsio_op op)
{
    return op == FSIO_PWRITE || op == FSIO_FSYNC || op == FSIO_OPEN ||
           op == FSIO_MKDIR || op == FSIO_RENAME || op == FSIO_CLOSE;
}

/* -------------------------------------------------------------- fixture */

static tc_state st1, st2, st3;
static char *pristine; /* a root holding steps 1 and 2 */
static int run_no;

static void small_state(tc_state *s, uint64_t seed)
{
    tc_state_init(s);
    int64_t a[1] = {6000}, b[2] = {64, 65}, c[1] = {3};
    tc_state_add(s, "w", CKPT_F32, 1, a, TC_RANDOM, seed * 3 + 1);
    tc_state_add(s, "m", CKPT_F16, 2, b, TC_COMPRESSIBLE, seed);
    tc_state_add(s, "k", CKPT_I64, 1, c, TC_RANDOM, seed * 3 + 2);
}

static void durable_opts(ckpt_store_options *o, int keep_last)
{
    tc_opts(o);
    o->fsync = 1;
    o->keep_last = keep_last;
    o->chunk_bytes = 8 * 1024;
    o->verify_after_save = CKPT_VERIFY_FULL;
}

static void make_pristine(int keep_last, int stale_tmp)
{
    small_state(&st1, 1);
    small_state(&st2, 2);
    small_state(&st3, 3);
    pristine = tc_join(tc_root, "pristine");
    ckpt_store_options o;
    durable_opts(&o, keep_last);
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, pristine, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(st, 1, &st1);
    tc_save_ok(st, 2, &st2);
    ckpt_store_free(st);
    if (stale_tmp) {
        char *d = tc_join(pristine, ".tmp-step-000000000005-dead");
        cr_assert_eq(mkdir(d, 0755), 0);
        char *f = tc_join(d, "rank-00000.shard");
        tc_write_file(f, "partial", 7);
        free(f);
        free(d);
    }
}

static void free_pristine(void)
{
    tc_state_free(&st1);
    tc_state_free(&st2);
    tc_state_free(&st3);
    free(pristine);
    pristine = NULL;
}

static char *fresh_run_root(void)
{
    char name[32];
    snprintf(name, sizeof name, "run-%d", run_no++);
    char *root = tc_join(tc_root, name);
    tc_copy_tree(pristine, root);
    return root;
}

static int has_step(const int64_t *steps, size_t n, int64_t s)
{
    for (size_t i = 0; i < n; i++)
        if (steps[i] == s)
            return 1;
    return 0;
}

/* After a run: reopen normally and check what must hold.  `committed` is
 * 1 when step 3 must exist, 0 when it may.  With retention (keep_last 2)
 * step 1 may be gone, but only once step 3 is committed. */
static void check_after(const char *root, int committed, int retention,
                        const char *what)
{
    ckpt_store *st = tc_open(root);
    cr_assert_eq(tc_count_prefix(root, ".tmp"), 0, "%s: a .tmp-* entry survived a reopen",
                 what);
    size_t n;
    int64_t *steps = tc_steps(st, &n);
    int h1 = has_step(steps, n, 1), h2 = has_step(steps, n, 2), h3 = has_step(steps, n, 3);
    for (size_t i = 0; i < n; i++)
        cr_assert(steps[i] >= 1 && steps[i] <= 3, "%s: unexpected step %" PRId64, what,
                  steps[i]);
    ckpt_free(steps);
    cr_assert(h2, "%s: step 2 is gone", what);
    if (committed)
        cr_assert(h3, "%s: the save returned OK but step 3 is missing", what);
    if (!retention || !h3)
        cr_assert(h1, "%s: step 1 is gone", what);
    if (h1)
        tc_restore_check(st, 1, &st1);
    tc_restore_check(st, 2, &st2);
    if (h3) {
        int rc = ckpt_verify(st, 3, CKPT_VERIFY_FULL, NULL);
        cr_assert_eq(rc, CKPT_OK, "%s: step 3 is listed but does not verify: %s", what,
                     ckpt_error_last());
        tc_restore_check(st, 3, &st3);
    }
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, h3 ? &st3 : &st2), h3 ? 3 : 2);
    ckpt_store_free(st);
}

/* After a run that saved st3 as step 2 again (replacing it): step 1 is
 * intact, step 2 holds either the old or the new state, exactly, and the
 * new one if the save returned OK. */
static void check_after_replace(const char *root, int committed, const char *what)
{
    ckpt_store *st = tc_open(root);
    cr_assert_eq(tc_count_prefix(root, ".tmp"), 0, "%s: a .tmp-* entry survived a reopen",
                 what);
    cr_assert_eq(tc_count_prefix(root, ".trash"), 0,
                 "%s: a .trash-* entry survived a reopen", what);
    size_t n;
    int64_t *steps = tc_steps(st, &n);
    int h1 = has_step(steps, n, 1), h2 = has_step(steps, n, 2);
    ckpt_free(steps);
    cr_assert(h1 && h2 && n == 2, "%s: steps 1 and 2 must remain (step 1: %s, step 2: %s, "
              "%zu steps)", what, h1 ? "present" : "GONE", h2 ? "present" : "GONE", n);
    tc_restore_check(st, 1, &st1);
    tc_state got;
    tc_state_like(&got, &st2, 0);
    int rc = ckpt_restore(st, 2, got.t, got.count, NULL, NULL);
    cr_assert_eq(rc, CKPT_OK, "%s: step 2 does not restore: %s", what, ckpt_error_last());
    int is_old = 1, is_new = 1;
    for (size_t i = 0; i < got.count; i++) {
        is_old &= memcmp(got.t[i].data, st2.t[i].data, got.t[i].bytes) == 0;
        is_new &= memcmp(got.t[i].data, st3.t[i].data, got.t[i].bytes) == 0;
    }
    cr_assert(is_old || is_new, "%s: step 2 is neither the old nor the new state", what);
    if (committed)
        cr_assert(is_new, "%s: the save returned OK but step 2 holds the old state", what);
    tc_state_free(&got);
    ckpt_store_free(st);
}

/* ------------------------------------------------------------ save path */

/* One save of st3 as `step` on a copy of the pristine root with `f`
 * configured; returns the save's status (checked: OK, or the injected error
 * with a message that names the file whose call failed). */
static int faulty_save(fault *f, const char *root, int keep_last, int64_t step,
                       const char *what)
{
    ckpt_store_options o;
    durable_opts(&o, keep_last);
    fsio fs = {.fault = hook, .ctx = f};
    ckpt_store *st = NULL;
    int rc = ckpt_store_open_with_fsio(&st, root, &o, &fs);
    cr_assert_eq(rc, CKPT_OK, "%s: open: %s", what, ckpt_error_last());
    fault_arm(f, 1);
    ckpt_save *sv = NULL;
    ckpt_error_clear();
    rc = ckpt_save_begin(&sv, st, step, st3.t, st3.count, NULL);
    if (rc == CKPT_OK) {
        cr_assert(sv);
        rc = ckpt_save_wait(sv);
        int rc2 = ckpt_save_wait(sv);
        cr_assert_eq(rc2, rc, "%s: second wait %d, first %d", what, rc2, rc);
        cr_assert_eq(ckpt_save_done(sv), 1);
    } else {
        cr_assert_null(sv);
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    fault_arm(f, 0);
    ckpt_store_free(st);

    if (rc != CKPT_OK) {
        cr_assert(f->fired, "%s: save failed (%d: %s) with no fault injected", what, rc,
                  msg);
        cr_assert_eq(rc, status_of(f->err), "%s (on %s): save = %d (%s), want %s: %s",
                     what, f->path, rc, ckpt_strerror(rc), ckpt_strerror(status_of(f->err)),
                     msg);
        cr_assert(msg[0], "%s: save failed with no message", what);
        const char *base = strrchr(f->path, '/');
        /* The pinned root (layout.h) is "/proc/self/fd/N": named by its path. */
        if (strncmp(f->path, "/proc/self/fd/", 14) == 0 && base == f->path + 13)
            cr_assert(strstr(msg, root), "%s: the message does not name the root: %s", what,
                      msg);
        else if (base && base[1])
            cr_assert(strstr(msg, base + 1), "%s: the message does not name %s: %s", what,
                      base + 1, msg);
    }
    return rc;
}

enum matrix { NEW_STEP, NEW_STEP_RETENTION, REPLACE_STEP, REPLACE_NO_EXCHANGE };

static void save_fault_matrix(enum matrix mode)
{
    int keep_last = mode == NEW_STEP_RETENTION ? 2 : 0;
    int replace = mode == REPLACE_STEP || mode == REPLACE_NO_EXCHANGE;
    int64_t step = replace ? 2 : 3;
    make_pristine(keep_last, 0);
    fault f;
    pthread_mutex_init(&f.mu, NULL);

    /* counting pass: what a fault-free save does */
    fault_reset(&f, FSIO_OP_COUNT, 0, 0);
    f.no_exchange = mode == REPLACE_NO_EXCHANGE;
    char *root = fresh_run_root();
    int rc = faulty_save(&f, root, keep_last, step, "counting pass");
    cr_assert_eq(rc, CKPT_OK, "counting pass: %s", ckpt_error_last());
    long counts[FSIO_OP_COUNT];
    memcpy(counts, f.calls, sizeof counts);
    if (replace)
        check_after_replace(root, 1, "counting pass");
    else
        check_after(root, 1, keep_last > 0, "counting pass");
    tc_rmtree(root);
    free(root);
    cr_assert_gt(counts[FSIO_PWRITE], 0, "a save made no pwrite calls through fsio");
    cr_assert_gt(counts[FSIO_RENAME], 0, "a save made no rename calls through fsio");
    cr_assert_gt(counts[FSIO_FSYNC], 0, "a durable save made no fsync calls");

    for (int op = 0; op < FSIO_OP_COUNT; op++) {
        if (counts[op] == 0)
            continue;
        long failed = 0, ok = 0;
        for (int e = 0; e < 2; e++) {
            int err = e == 0 ? EIO : ENOSPC;
            if (err == ENOSPC && !can_enospc((fsio_op)op))
                continue;
            /* one past the count: nothing fires and the save must succeed */
            for (long nth = 1; nth <= counts[op] + 1; nth++) {
                char what[160];
                snprintf(what, sizeof what, "%s%s call %ld/%ld failing with %s",
                         replace ? "replacing step 2: " : "",
                         tc_fsio_op_name(op), nth, counts[op], strerror(err));
                fault_reset(&f, (fsio_op)op, nth, err);
                f.no_exchange = mode == REPLACE_NO_EXCHANGE;
                root = fresh_run_root();
                rc = faulty_save(&f, root, keep_last, step, what);
                if (nth > counts[op] && !f.fired)
                    cr_assert_eq(rc, CKPT_OK, "%s", what);
                if (replace)
                    check_after_replace(root, rc == CKPT_OK, what);
                else
                    check_after(root, rc == CKPT_OK, keep_last > 0, what);
                tc_rmtree(root);
                free(root);
                if (rc == CKPT_OK)
                    ok++;
                else
                    failed++;
            }
        }
        cr_log_info("%-8s %ld calls per save: %ld faulty saves failed, %ld still succeeded",
                    tc_fsio_op_name(op), counts[op], failed, ok);
    }
    pthread_mutex_destroy(&f.mu);
    free_pristine();
}

Test(faults, save_without_retention) { save_fault_matrix(NEW_STEP); }
Test(faults, save_with_retention) { save_fault_matrix(NEW_STEP_RETENTION); }
Test(faults, replace_existing_step) { save_fault_matrix(REPLACE_STEP); }
Test(faults, replace_without_rename_exchange) { save_fault_matrix(REPLACE_NO_EXCHANGE); }

/* ------------------------------------------------------------- open path */

Test(faults, open_with_stale_temp_dir)
{
    make_pristine(0, 1);
    fault f;
    pthread_mutex_init(&f.mu, NULL);
    ckpt_store_options o;
    durable_opts(&o, 0);

    fault_reset(&f, FSIO_OP_COUNT, 0, 0);
    fault_arm(&f, 1);
    char *root = fresh_run_root();
    fsio fs = {.fault = hook, .ctx = &f};
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&st, root, &o, &fs), CKPT_OK, "%s",
                 ckpt_error_last());
    fault_arm(&f, 0);
    ckpt_store_free(st);
    long counts[FSIO_OP_COUNT];
    memcpy(counts, f.calls, sizeof counts);
    cr_assert_eq(tc_count_prefix(root, ".tmp"), 0, "the stale temp dir survived the open");
    tc_rmtree(root);
    free(root);
    cr_assert_gt(counts[FSIO_LOCK], 0, "a writer's open took no lock through fsio");
    for (int op = 0; op < FSIO_OP_COUNT; op++)
        if (counts[op])
            cr_log_info("open: %-8s %ld calls", tc_fsio_op_name(op), counts[op]);

    for (int op = 0; op < FSIO_OP_COUNT; op++) {
        for (long nth = 1; nth <= counts[op]; nth++) {
            char what[128];
            snprintf(what, sizeof what, "open: %s call %ld/%ld failing with EIO",
                     tc_fsio_op_name(op), nth, counts[op]);
            fault_reset(&f, (fsio_op)op, nth, EIO);
            fault_arm(&f, 1);
            root = fresh_run_root();
            st = NULL;
            ckpt_error_clear();
            int rc = ckpt_store_open_with_fsio(&st, root, &o, &fs);
            if (rc == CKPT_OK) {
                cr_assert(st);
                /* the store works for reading */
                tc_restore_check(st, CKPT_LATEST, &st2);
            } else {
                cr_assert_null(st);
                cr_assert(f.fired, "%s: open failed (%d) with no fault", what, rc);
                cr_assert_eq(rc, CKPT_EIO, "%s (on %s): open = %d (%s): %s", what, f.path,
                             rc, ckpt_strerror(rc), ckpt_error_last());
                cr_assert(tc_nonempty(ckpt_error_last()));
            }
            fault_arm(&f, 0);
            ckpt_store_free(st);
            check_after(root, 0, 0, what);
            tc_rmtree(root);
            free(root);
        }
    }
    pthread_mutex_destroy(&f.mu);
    free_pristine();
}

/* ---------------------------------------------------------- restore path */

Test(faults, restore_and_verify)
{
    make_pristine(0, 0);
    fault f;
    pthread_mutex_init(&f.mu, NULL);
    ckpt_store_options o;
    durable_opts(&o, 0);
    o.flags = CKPT_OPEN_READONLY;
    fsio fs = {.fault = hook, .ctx = &f};

    for (int mode = 0; mode < 2; mode++) { /* 0: restore(LATEST), 1: verify(2) */
        long counts[FSIO_OP_COUNT];
        fault_reset(&f, FSIO_OP_COUNT, 0, 0);
        ckpt_store *st = NULL;
        cr_assert_eq(ckpt_store_open_with_fsio(&st, pristine, &o, &fs), CKPT_OK);
        fault_arm(&f, 1);
        if (mode == 0)
            tc_restore_check(st, CKPT_LATEST, &st2);
        else
            cr_assert_eq(ckpt_verify(st, 2, CKPT_VERIFY_FULL, NULL), CKPT_OK);
        fault_arm(&f, 0);
        ckpt_store_free(st);
        memcpy(counts, f.calls, sizeof counts);
        cr_assert_gt(counts[FSIO_PREAD], 0, "no pread calls through fsio");
        for (int op = 0; op < FSIO_OP_COUNT; op++)
            if (counts[op])
                cr_log_info("%s: %-8s %ld calls", mode ? "verify" : "restore",
                            tc_fsio_op_name(op), counts[op]);

        for (int op = 0; op < FSIO_OP_COUNT; op++) {
            for (long nth = 1; nth <= counts[op]; nth++) {
                char what[128];
                snprintf(what, sizeof what, "%s: %s call %ld/%ld failing with EIO",
                         mode ? "verify" : "restore", tc_fsio_op_name(op), nth,
                         counts[op]);
                fault_reset(&f, (fsio_op)op, nth, EIO);
                st = NULL;
                cr_assert_eq(ckpt_store_open_with_fsio(&st, pristine, &o, &fs), CKPT_OK);
                fault_arm(&f, 1);
                ckpt_error_clear();
                int rc;
                if (mode == 0) {
                    tc_state got;
                    tc_state_like(&got, &st2, 0x77);
                    ckpt_report *rep = NULL;
                    rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep);
                    if (rc == CKPT_OK) {
                        /* it may have skipped step 2 for step 1 */
                        int64_t s = ckpt_report_step(rep);
                        cr_assert(s == 1 || s == 2, "%s: restored step %" PRId64, what, s);
                        tc_assert_state_eq(&got, s == 2 ? &st2 : &st1, what);
                    }
                    ckpt_report_free(rep);
                    tc_state_free(&got);
                } else {
                    rc = ckpt_verify(st, 2, CKPT_VERIFY_FULL, NULL);
                }
                char msg[512];
                snprintf(msg, sizeof msg, "%s", ckpt_error_last());
                fault_arm(&f, 0);
                ckpt_store_free(st);
                if (rc != CKPT_OK) {
                    cr_assert(f.fired, "%s: failed (%d) with no fault", what, rc);
                    cr_assert_eq(rc, CKPT_EIO,
                                 "%s (on %s): %d (%s): an I/O error is not %s: %s", what,
                                 f.path, rc, ckpt_strerror(rc), ckpt_strerror(rc), msg);
                    cr_assert(msg[0], "%s: no message", what);
                }
            }
        }
    }
    /* nothing was damaged */
    ckpt_store *st = tc_open_ro(pristine);
    tc_restore_check(st, 1, &st1);
    tc_restore_check(st, 2, &st2);
    ckpt_store_free(st);
    pthread_mutex_destroy(&f.mu);
    free_pristine();
}

/* A full disk at the first write of a save leaves the store usable: the
 * next save with room succeeds. */
Test(faults, store_usable_after_failed_save)
{
    make_pristine(0, 0);
    fault f;
    pthread_mutex_init(&f.mu, NULL);
    fault_reset(&f, FSIO_PWRITE, 1, ENOSPC);
    ckpt_store_options o;
    durable_opts(&o, 0);
    fsio fs = {.fault = hook, .ctx = &f};
    char *root = fresh_run_root();
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&st, root, &o, &fs), CKPT_OK);
    fault_arm(&f, 1);
    int rc = tc_save(st, 3, &st3, NULL);
    cr_assert_eq(rc, CKPT_ENOSPC, "save with a full disk = %d (%s): %s", rc,
                 ckpt_strerror(rc), ckpt_error_last());
    cr_assert(f.fired);
    cr_assert_eq(tc_count_prefix(root, ".tmp"), 0,
                 "a failed save left its temp dir behind in a live store");
    /* the fault has fired; the disk has room again */
    rc = tc_save(st, 3, &st3, NULL);
    cr_assert_eq(rc, CKPT_OK, "save after the failed one: %s", ckpt_error_last());
    fault_arm(&f, 0);
    tc_restore_check(st, 3, &st3);
    ckpt_store_free(st);
    check_after(root, 1, 0, "retry");
    tc_rmtree(root);
    free(root);
    pthread_mutex_destroy(&f.mu);
    free_pristine();
}

/* Crashes and lying disks, through the fsio seam:
 *  - SIGKILL at every file-system call of save, retention and gc, for each
 *    scenario of crashcheck.c (one shard, many tensors, passes, replacing a
 *    step with and without an atomic exchange), then the invariants of
 *    crashcheck.h.  CKPT_CRASH_REPEAT=N kills at every call N times (the
 *    thread interleaving differs run to run): the long mode.
 *  - The durability order of a save, read off a trace of its calls.
 *  - Garbled writes (the save fails, nothing is committed) and short
 *    writes (the save completes them and restores exactly). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crashcheck.h"
#include "helpers.h"
#include "testing.h"

TestSuite(crash, .init = tc_setup, .fini = tc_teardown, .timeout = 3600);

/* ------------------------------------------------------- SIGKILL harness */

static void ack_to_pipe(void *ctx, int64_t step, int i)
{
    (void)step;
    unsigned char b = (unsigned char)i;
    cr_assert_eq(write(*(int *)ctx, &b, 1), 1);
}

/* Run the scenario in a child killed at call `kill_at` (0: never).
 * Fills acked[]; returns the calls counted when it ran to the end, else 0. */
static long run_child(const cc_scenario *sc, const char *root, long kill_at, int *acked)
{
    int p[2], cnt[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(pipe(cnt), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        close(cnt[0]);
        cc_hooks h;
        cc_hooks_init(&h, sc, NULL, kill_at);
        fsio fs;
        cc_hooks_fsio(&h, &fs);
        int rc = cc_run(sc, root, &fs, ack_to_pipe, &p[1]);
        long calls = h.calls;
        if (write(cnt[1], &calls, sizeof calls) != (ssize_t)sizeof calls)
            _exit(3);
        _exit(rc == CKPT_OK ? 0 : 2);
    }
    close(p[1]);
    close(cnt[1]);
    unsigned char b;
    memset(acked, 0, CC_MAX_SAVES * sizeof *acked);
    while (read(p[0], &b, 1) == 1)
        acked[b] = 1;
    long calls = 0;
    if (read(cnt[0], &calls, sizeof calls) != (ssize_t)sizeof calls)
        calls = 0;
    close(p[0]);
    close(cnt[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    if (kill_at)
        cr_assert(WIFSIGNALED(status) ? WTERMSIG(status) == SIGKILL
                                      : WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "%s: the child ended neither killed nor successfully (status 0x%x)",
                  sc->name, status);
    else
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "%s: the uninterrupted run failed (status 0x%x)", sc->name, status);
    return WIFEXITED(status) ? calls : 0;
}

static void kill_everywhere(const cc_scenario *sc)
{
    int acked[CC_MAX_SAVES];
    char *root = tc_join(tc_root, "count");
    long total = run_child(sc, root, 0, acked);
    cc_check(sc, root, acked, sc->name);
    tc_rmtree(root);
    free(root);
    cr_assert(total > 10, "%s: only %ld calls counted", sc->name, total);
    const char *r = getenv("CKPT_CRASH_REPEAT");
    long repeat = r && atol(r) > 0 ? atol(r) : 1, kills = 0;
    for (long rep = 0; rep < repeat; rep++)
        for (long n = 1; n <= total + 5; n++) {
            char name[64], what[128];
            snprintf(name, sizeof name, "kill-%ld-%ld", rep, n);
            root = tc_join(tc_root, name);
            long done = run_child(sc, root, n, acked);
            kills += done == 0;
            snprintf(what, sizeof what, "%s, SIGKILL before call %ld of %ld", sc->name, n,
                     total);
            cc_check(sc, root, acked, what);
            tc_rmtree(root);
            free(root);
        }
    fprintf(stderr, "crash %s: %ld file-system calls, %ld runs killed and checked\n",
            sc->name, total, kills);
    cr_assert(kills >= total * repeat * 9 / 10);
}

Test(crash, kill_one_shard) { kill_everywhere(&cc_scenarios[0]); }
Test(crash, kill_many_tensors) { kill_everywhere(&cc_scenarios[1]); }
Test(crash, kill_passes) { kill_everywhere(&cc_scenarios[2]); }
Test(crash, kill_replace) { kill_everywhere(&cc_scenarios[3]); }
Test(crash, kill_replace_no_exchange) { kill_everywhere(&cc_scenarios[4]); }

/* ----------------------------------------------------- durability order */

static int has_prefix(const char *s, const char *p)
{
    return s && strncmp(s, p, strlen(p)) == 0;
}

/* Index of the last event in [from, to) matching op and node, or -1. */
static long last_of(const fstrace *t, size_t from, size_t to, int op, int node)
{
    long at = -1;
    for (size_t i = from; i < to; i++)
        if (ft_get(t, i)->op == op && ft_get(t, i)->node == node)
            at = (long)i;
    return at;
}

/* For each commit (rename of .tmp-* to step-*): every file written in the
 * temporary directory was fsynced after its last write; a full read-back
 * (verify) touched each file after that; the directory was fsynced after
 * its files were created; all before the rename; and the root was fsynced
 * after the rename, before the save was acknowledged. */
Test(crash, durability_order)
{
    const cc_scenario *sc = &cc_scenarios[0];
    char *rec = tc_join(tc_root, "rec");
    cr_assert_eq(mkdir(rec, 0755), 0);
    fstrace *t = ft_new(rec);
    cc_hooks h;
    cc_hooks_init(&h, sc, t, 0);
    fsio fs;
    cc_hooks_fsio(&h, &fs);
    ft_record(t, 1);
    cr_assert_eq(cc_run(sc, rec, &fs, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    size_t n = ft_count(t), commits = 0, begin = 0;
    for (size_t r = 0; r < n; r++) {
        const ft_event *e = ft_get(t, r);
        if (e->op != FSIO_RENAME || !has_prefix(e->path, ".tmp-") ||
            !has_prefix(e->path2, "step-") || e->flags)
            continue;
        commits++;
        size_t plen = strlen(e->path);
        int tmpdir = e->node, files = 0;
        long last_create = -1;
        for (size_t i = begin; i < r; i++) {
            const ft_event *c = ft_get(t, i);
            if (c->op != FSIO_OPEN || !c->created || strncmp(c->path, e->path, plen) != 0)
                continue;
            files++;
            last_create = (long)i;
            long w = last_of(t, i, r, FSIO_PWRITE, c->node);
            long s = last_of(t, i, r, FSIO_FSYNC, c->node);
            long rd = last_of(t, i, r, FSIO_PREAD, c->node);
            cr_assert(w >= 0, "%s was never written", c->path);
            cr_assert(s > w, "%s: written at event %ld, not fsynced before the commit at "
                      "%zu", c->path, w, r);
            cr_assert(rd > s, "%s: not read back (verify) between its fsync and the "
                      "commit", c->path);
        }
        cr_assert(files >= 2, "commit %zu: %d files in %s", r, files, e->path);
        cr_assert(last_of(t, (size_t)last_create, r, FSIO_FSYNC, tmpdir) > last_create,
                  "%s was not fsynced after its files were created", e->path);
        long ack = -1;
        for (size_t i = r; i < n && ack < 0; i++)
            if (ft_get(t, i)->op == FT_ACK)
                ack = (long)i;
        size_t end = ack >= 0 ? (size_t)ack : n;
        cr_assert(last_of(t, r, end, FSIO_FSYNC, 0) > (long)r,
                  "the root was not fsynced after committing %s", e->path2);
        begin = r + 1;
    }
    cr_assert_eq(commits, (size_t)sc->nsaves);
    ft_free(t);
    free(rec);
}

/* ------------------------------------------------------ lying writes */

typedef struct writes {
    long calls;
    long garble_at;  /* garble the bytes of this write call (1-based) */
    size_t max_len;  /* > 0: every write call is cut to this many bytes */
    unsigned char *copy;
} writes;

static size_t on_write(void *ctx, int fd, uint64_t off, const void **data, size_t n)
{
    (void)fd;
    (void)off;
    writes *w = ctx;
    w->calls++;
    if (w->garble_at == w->calls && n) {
        free(w->copy);
        w->copy = malloc(n);
        memcpy(w->copy, *data, n);
        w->copy[n / 2] ^= 0x40;
        *data = w->copy;
    }
    return w->max_len && n > w->max_len ? w->max_len : n;
}

static ckpt_store *open_writes(const char *root, writes *w)
{
    ckpt_store_options o;
    cc_opts(&cc_scenarios[0], &o);
    o.keep_last = 0;
    fsio fs = {0};
    fs.write = on_write;
    fs.ctx = w;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&st, root, &o, &fs), CKPT_OK, "%s",
                 ckpt_error_last());
    return st;
}

/* A disk that changes one byte of one write: whichever write it is (shard
 * data, shard index, manifest), the read-back before the commit sees it,
 * the save fails and step 2 never appears; step 1 stays as it was. */
Test(crash, garbled_write_commits_nothing)
{
    const cc_scenario *sc = &cc_scenarios[0];
    tc_state s1, s2;
    cc_state(sc, 0, &s1);
    cc_state(sc, 1, &s2);
    long total = 0;
    for (long g = 1; g == 1 || g <= total; g++) {
        char name[32];
        snprintf(name, sizeof name, "g%ld", g);
        char *root = tc_join(tc_root, name);
        writes w = {0};
        ckpt_store *st = open_writes(root, &w);
        tc_save_ok(st, 1, &s1);
        long before = w.calls;
        w.garble_at = before + g;
        int rc = tc_save(st, 2, &s2, NULL);
        if (g == 1)
            total = w.calls - before;
        cr_assert_neq(rc, CKPT_OK, "write %ld of %ld garbled, yet the save succeeded", g,
                      total);
        cr_assert(tc_nonempty(ckpt_error_last()));
        int64_t one[] = {1};
        tc_assert_steps(st, one, 1);
        tc_restore_check(st, CKPT_LATEST, &s1);
        ckpt_store_free(st);
        free(w.copy);
        tc_rmtree(root);
        free(root);
    }
    cr_assert(total >= 3, "only %ld writes in a save", total);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* Every write call comes back short (as on a signal or a full pipe): the
 * writer continues each one, and the checkpoint restores exactly. */
Test(crash, short_writes_are_completed)
{
    const cc_scenario *sc = &cc_scenarios[0];
    tc_state s1;
    cc_state(sc, 0, &s1);
    writes w = {0};
    w.max_len = 1000;
    ckpt_store *st = open_writes(tc_root, &w);
    tc_save_ok(st, 1, &s1);
    cr_assert(w.calls > 20, "only %ld write calls", w.calls);
    ckpt_store_free(st);
    st = tc_open(tc_root);
    cr_assert_eq(ckpt_verify(st, 1, CKPT_VERIFY_FULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    tc_restore_check(st, 1, &s1);
    ckpt_store_free(st);
    tc_state_free(&s1);
}

/* ----------------------------------------- replace without an exchange */

typedef struct replace_fault {
    int tmp_renames; /* renames of the .tmp- directory seen */
} replace_fault;

/* No RENAME_EXCHANGE (the second rename of the temporary directory, the
 * swap, fails with EINVAL), and the third, which would move the
 * replacement in after the old step was moved aside, fails with EIO. */
static int replace_hook(void *ctx, fsio_op op, const char *path)
{
    replace_fault *f = ctx;
    if (op != FSIO_RENAME || !path || !strstr(path, "/.tmp-"))
        return 0;
    f->tmp_renames++;
    return f->tmp_renames == 2 ? EINVAL : f->tmp_renames == 3 ? EIO : 0;
}

/* The old step is moved aside and its replacement cannot be renamed in:
 * the old step must be back at once, for readers that do not reopen (the
 * next writer's open would also put it back, but readers do not wait). */
Test(crash, failed_replacement_puts_the_old_step_back)
{
    const cc_scenario *sc = &cc_scenarios[0];
    tc_state s1, s2;
    cc_state(sc, 0, &s1);
    cc_state(sc, 1, &s2);
    replace_fault f = {0};
    fsio fs = {.fault = replace_hook, .ctx = &f};
    ckpt_store_options o;
    cc_opts(sc, &o);
    o.keep_last = 0;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&st, tc_root, &o, &fs), CKPT_OK);
    tc_save_ok(st, 1, &s1);
    f.tmp_renames = 0; /* count the replacement's renames only */
    int rc = tc_save(st, 1, &s2, NULL);
    cr_assert_eq(rc, CKPT_EIO, "replacement: %s (%s)", ckpt_status_name(rc),
                 ckpt_error_last());
    cr_assert_eq(f.tmp_renames, 3);
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t one[] = {1};
    tc_assert_steps(ro, one, 1);
    tc_restore_check(ro, 1, &s1);
    ckpt_store_free(ro);
    ckpt_store_free(st);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* A root on a shared server: links planted where the library removes
 * things, names that look like steps but are not, steps as large as
 * time_ns(), FIFOs where files belong, a removed lock file, metadata a
 * reader would refuse.  Nothing outside the root may be touched, nothing
 * may hang, and what is acknowledged must be readable. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "testing.h"

TestSuite(shared, .init = tc_setup, .fini = tc_teardown, .timeout = 60);

/* A directory outside the root with one file in it, to plant links to. */
static char *outside_with_file(char **file)
{
    char *dir = tc_mkdtemp();
    *file = tc_join(dir, "precious");
    tc_write_file(*file, "keep me", 7);
    return dir;
}

static void plant_link(const char *target, const char *name)
{
    char *link = tc_join(tc_root, name);
    cr_assert_eq(symlink(target, link), 0, "symlink %s: %s", link, strerror(errno));
    free(link);
}

Test(shared, links_named_like_temporaries_are_removed_as_links)
{
    char *file, *out = outside_with_file(&file);
    plant_link(out, ".tmp-step-000000000001-1-1");
    plant_link(out, ".trash-step-000000000002-1-1");
    plant_link(out, ".replaced-step-000000000003-1-1");
    ckpt_store *st = tc_open(tc_root); /* cleans stale temporaries */
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_store_gc(st, 1, 0, &r), CKPT_OK, "%s", ckpt_error_last());
    ckpt_report_free(r);
    ckpt_store_free(st);
    cr_assert(tc_exists(file), "a file outside the root was deleted through a link");
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp-"), 0, "the link itself stays");
    cr_assert_eq(tc_count_prefix(tc_root, ".trash-"), 0);
    tc_rmtree(out);
    free(out);
    free(file);
}

Test(shared, a_step_that_is_a_link_is_no_step_and_is_never_retired)
{
    char *file, *out = outside_with_file(&file);
    plant_link(out, "step-000000000001");
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 1;
    ckpt_store *st;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(st, 2, &s);
    tc_save_ok(st, 3, &s); /* retention runs twice with keep_last 1 */
    const int64_t want[] = {3};
    tc_assert_steps(st, want, 1);
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_store_gc(st, 1, 0, &r), CKPT_OK, "%s", ckpt_error_last());
    ckpt_report_free(r);
    ckpt_store_free(st);
    cr_assert(tc_exists(file), "retention deleted a file outside the root");
    tc_state_free(&s);
    tc_rmtree(out);
    free(out);
    free(file);
}

Test(shared, only_canonical_step_directories_are_steps)
{
    tc_state s;
    tc_state_standard(&s, 2);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 4, &s);
    /* step-5 (unpadded), 13 digits for 3, a file named like step 7 */
    char *p = tc_join(tc_root, "step-5");
    cr_assert_eq(mkdir(p, 0755), 0);
    free(p);
    p = tc_join(tc_root, "step-0000000000003");
    cr_assert_eq(mkdir(p, 0755), 0);
    free(p);
    p = tc_join(tc_root, "step-000000000007");
    tc_write_file(p, "x", 1);
    free(p);
    const int64_t want[] = {4};
    tc_assert_steps(st, want, 1);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s), 4);
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_store_gc(st, 1, 0, &r), CKPT_OK, "gc with foreign names: %s",
                 ckpt_error_last());
    ckpt_report_free(r);
    ckpt_store_free(st);
    tc_state_free(&s);
}

Test(shared, steps_as_large_as_time_ns_are_listed_restored_and_retired)
{
    tc_state s1, s2, s3;
    tc_state_standard(&s1, 11);
    tc_state_standard(&s2, 12);
    tc_state_standard(&s3, 13);
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 2;
    ckpt_store *st;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    const int64_t a = 999999999999ll, b = 1700000000123456789ll, c = CKPT_STEP_MAX;
    tc_save_ok(st, a, &s1);
    tc_save_ok(st, b, &s2);
    const int64_t two[] = {a, b};
    tc_assert_steps(st, two, 2);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s2), b);
    tc_save_ok(st, c, &s3);
    const int64_t kept[] = {b, c}; /* a retired: retention sees the large ones */
    tc_assert_steps(st, kept, 2);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s3), c);
    cr_assert_eq(tc_save(st, -3, &s1, NULL), CKPT_EINVAL);
    ckpt_store_free(st);
    tc_state_free(&s1);
    tc_state_free(&s2);
    tc_state_free(&s3);
}

/* Replace `name` of step 2 by a FIFO: readers must not block on it. */
static void fifo_instead_of(const char *name)
{
    tc_state s1, s2;
    tc_state_standard(&s1, 21);
    tc_state_standard(&s2, 22);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s1);
    tc_save_ok(st, 2, &s2);
    char *dir = tc_step_dir(tc_root, 2);
    char *path = name ? tc_join(dir, name) : tc_find_suffix(dir, ".shard");
    cr_assert_not_null(path);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo: %s", strerror(errno));
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s1), 1);
    int rc = ckpt_verify(st, 2, CKPT_VERIFY_FULL, NULL);
    cr_assert_eq(rc, CKPT_ECORRUPT, "verify = %d: %s", rc, ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "not a regular file"), "%s", ckpt_error_last());
    int64_t latest = -1;
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest), CKPT_OK);
    cr_assert_eq(latest, 1);
    ckpt_store_free(st);
    free(path);
    free(dir);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

Test(shared, a_fifo_manifest_is_refused_without_blocking) { fifo_instead_of("manifest.json"); }
Test(shared, a_fifo_shard_is_refused_without_blocking) { fifo_instead_of(NULL); }

Test(shared, a_replaced_directory_with_a_short_name_is_harmless)
{
    char *p = tc_join(tc_root, ".replaced-x");
    cr_assert_eq(mkdir(p, 0755), 0);
    ckpt_store *st = tc_open(tc_root); /* recovery parses the name */
    ckpt_store_free(st);
    cr_assert(tc_exists(p), "an unparsable name is left alone");
    free(p);
}

Test(shared, the_lock_is_private_and_names_its_holder)
{
    ckpt_store *a = tc_open(tc_root);
    char *lock = tc_join(tc_root, ".lock");
    struct stat sb;
    cr_assert_eq(lstat(lock, &sb), 0);
    cr_assert_eq(sb.st_mode & 077, 0, "lock file mode %o lets others open it",
                 (unsigned)(sb.st_mode & 0777));
    ckpt_store_options o;
    tc_opts(&o);
    ckpt_store *b = NULL;
    cr_assert_eq(ckpt_store_open(&b, tc_root, &o), CKPT_EBUSY);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    cr_assert(strstr(ckpt_error_last(), pid), "busy message names no holder: %s",
              ckpt_error_last());
    ckpt_store_free(a);
    free(lock);
}

/* A lock file that is a link or a FIFO is refused alike (EACCES, "remove
 * it"); the link used to give "input/output error: ... Too many levels of
 * symbolic links", naming no fix.  Its target is left as it was. */
Test(shared, a_lock_file_that_is_a_link_or_a_fifo_is_named)
{
    char *lock = tc_join(tc_root, ".lock"), *target = tc_join(tc_root, "elsewhere");
    FILE *f = fopen(target, "w");
    cr_assert_not_null(f);
    fputs("keep\n", f);
    fclose(f);
    ckpt_store_options o;
    tc_opts(&o);
    for (int fifo = 0; fifo < 2; fifo++) {
        if (fifo)
            cr_assert_eq(mkfifo(lock, 0600), 0);
        else
            cr_assert_eq(symlink(target, lock), 0);
        ckpt_store *w = NULL;
        cr_assert_eq(ckpt_store_open(&w, tc_root, &o), CKPT_EACCES, "%s", ckpt_error_last());
        const char *msg = ckpt_error_last();
        cr_assert(strstr(msg, lock) && strstr(msg, "remove it") &&
                  strstr(msg, fifo ? "not a regular file" : "is a symbolic link"), "%s", msg);
        cr_assert_eq(unlink(lock), 0);
    }
    struct stat sb;
    cr_assert_eq(stat(target, &sb), 0);
    cr_assert_eq(sb.st_size, 5, "the link's target was written");
    free(lock);
    free(target);
}

Test(shared, a_removed_lock_file_cannot_admit_two_writers)
{
    tc_state s;
    tc_state_standard(&s, 31);
    ckpt_store *a = tc_open(tc_root);
    char *lock = tc_join(tc_root, ".lock");
    cr_assert_eq(unlink(lock), 0);
    ckpt_store *b = tc_open(tc_root); /* takes a lock of its own */
    cr_assert_eq(tc_save(a, 1, &s, NULL), CKPT_EBUSY, "the writer whose lock was removed "
                 "committed: %s", ckpt_error_last());
    cr_assert_eq(tc_count_prefix(tc_root, "step-"), 0);
    /* b's save in flight must survive a's gc */
    ckpt_save *sv;
    cr_assert_eq(ckpt_save_begin(&sv, b, 2, s.t, s.count, NULL), CKPT_OK);
    cr_assert_eq(ckpt_store_gc(a, 1, 0, NULL), CKPT_EBUSY);
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    const int64_t want[] = {2};
    tc_assert_steps(b, want, 1);
    ckpt_store_free(a);
    ckpt_store_free(b);
    free(lock);
    tc_state_free(&s);
}

Test(shared, metadata_a_reader_would_refuse_is_refused_by_the_writer)
{
    /* Nesting the reader cannot parse once inside the manifest. */
    enum { DEPTH = 2048 };
    char *meta = malloc(2 * DEPTH + 1);
    for (int i = 0; i < DEPTH; i++) {
        meta[i] = '[';
        meta[2 * DEPTH - 1 - i] = ']';
    }
    meta[2 * DEPTH] = 0;
    tc_state s;
    tc_state_standard(&s, 41);
    ckpt_store_options o;
    tc_opts(&o);
    o.verify_after_save = CKPT_VERIFY_NONE; /* the writer's own check, not verify */
    ckpt_store *st;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK);
    int rc = tc_save(st, 1, &s, meta);
    if (rc == CKPT_OK) { /* accepted: then it must read back */
        ckpt_checkpoint *ck = NULL;
        cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK,
                     "acknowledged but unreadable: %s", ckpt_error_last());
        ckpt_checkpoint_free(ck);
    } else {
        cr_assert_eq(rc, CKPT_EINVAL, "%s", ckpt_error_last());
        cr_assert_eq(tc_count_prefix(tc_root, "step-"), 0);
    }
    ckpt_store_free(st);
    tc_state_free(&s);
    free(meta);
}

/* A step directory copied under another step's name (by a careless `cp -r`
 * or a co-tenant) holds a manifest for the other step, every checksum
 * intact: it is not that step, and restore passes over it. */
Test(shared, a_step_copied_under_another_name_is_refused)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state s1;
    tc_state_standard(&s1, 1);
    tc_save_ok(st, 1, &s1);
    char *d1 = tc_step_dir(tc_root, 1), *d2 = tc_step_dir(tc_root, 2);
    tc_copy_tree(d1, d2);
    cr_assert_eq(ckpt_verify(st, 2, CKPT_VERIFY_QUICK, NULL), CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "manifest is for step 1"), "%s", ckpt_error_last());
    int64_t latest = -1;
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest), CKPT_OK);
    cr_assert_eq(latest, 1);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s1), 1);
    ckpt_store_free(st);
    free(d1);
    free(d2);
    tc_state_free(&s1);
}

/* Whoever may rename the root's last entry (its owner; in a root that
 * trusts its group, a member who can write the directory above) renames
 * the root away while a writer has it open and puts a link to another of
 * the writer's roots (a private run) in its place.  The writer goes on in
 * the root it opened: lists, restores and saves there, never in the
 * other (it would restore the private run and save it into the shared
 * root). */
Test(shared, a_writer_stays_in_its_root_when_the_path_is_swapped)
{
    char *other = tc_mkdtemp();
    tc_state mine, theirs;
    tc_state_standard(&mine, 11);
    tc_state_standard(&theirs, 99);
    ckpt_store *o = tc_open(other);
    for (int64_t step = 1; step <= 5; step++)
        tc_save_ok(o, step, &theirs);
    ckpt_store_free(o);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &mine);
    tc_save_ok(st, 2, &mine);
    char *moved = tc_join(other, "moved-root");
    cr_assert_eq(rename(tc_root, moved), 0, "%s", strerror(errno));
    cr_assert_eq(symlink(other, tc_root), 0, "%s", strerror(errno));
    int64_t want[] = {1, 2};
    tc_assert_steps(st, want, 2);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &mine), 2);
    tc_save_ok(st, 3, &mine);
    ckpt_checkpoint *ck;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 3, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_null(strstr(ckpt_checkpoint_path(ck), "/proc/"), "path shown: %s",
                   ckpt_checkpoint_path(ck));
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
    char *step3 = tc_join(moved, "step-000000000003");
    cr_assert(tc_exists(step3), "step 3 was not saved in the root the writer opened");
    ckpt_store *ro = tc_open_ro(other);
    int64_t theirs_steps[] = {1, 2, 3, 4, 5};
    tc_assert_steps(ro, theirs_steps, 5);
    cr_assert_eq(tc_restore_check(ro, 3, &theirs), 3, "the other root's step 3 changed");
    ckpt_store_free(ro);
    unlink(tc_root);
    cr_assert_eq(rename(moved, tc_root), 0);
    tc_state_free(&mine);
    tc_state_free(&theirs);
    tc_rmtree(other);
    free(other);
    free(moved);
    free(step3);
}

/* The temporary directory of a save is swapped for a link to a directory
 * outside the root as the shard is created (a member of a trusted group
 * can rename the root's entries).  The save's files go on into the
 * directory it made (written through a descriptor of it, not its name),
 * none lands outside, and the step is not reported saved: the commit
 * finds that the entry is not the directory the save made. */
typedef struct swap_ctx {
    char *outside;
    char aside[4200];
    int done;
} swap_ctx;

/* The directory holding `path`, with a leading "/proc/self/fd/N" (a
 * pinned directory) resolved to the path it names. */
static int dir_of(const char *path, char *dir, size_t size)
{
    char d[4096];
    snprintf(d, sizeof d, "%s", path);
    *strrchr(d, '/') = '\0';
    if (strncmp(d, "/proc/self/fd/", 14) != 0) {
        snprintf(dir, size, "%s", d);
        return 0;
    }
    const char *rest = d + 14 + strspn(d + 14, "0123456789");
    char link[64];
    snprintf(link, sizeof link, "%.*s", (int)(rest - d), d);
    ssize_t n = readlink(link, dir, size - 1);
    if (n <= 0 || (size_t)n + strlen(rest) >= size)
        return -1;
    snprintf(dir + n, size - (size_t)n, "%s", rest);
    return 0;
}

static int swap_temp(void *ctx, fsio_op op, const char *path)
{
    swap_ctx *c = ctx;
    char dir[4096];
    if (c->done || op != FSIO_OPEN || !path || !strstr(path, ".shard") ||
        dir_of(path, dir, sizeof dir) != 0 || !strstr(dir, "/.tmp-"))
        return 0;
    c->done = 1;
    snprintf(c->aside, sizeof c->aside, "%s-aside", c->outside);
    if (rename(dir, c->aside) != 0 || symlink(c->outside, dir) != 0)
        return -EIO;
    return 0;
}

Test(shared, a_temporary_directory_swapped_for_a_link_is_never_committed)
{
    swap_ctx c = {tc_mkdtemp(), "", 0};
    fsio fs = {.fault = swap_temp, .ctx = &c};
    ckpt_store_options o;
    tc_opts(&o);
    ckpt_store *st;
    cr_assert_eq(ckpt_store_open_with_fsio(&st, tc_root, &o, &fs), CKPT_OK, "%s",
                 ckpt_error_last());
    tc_state s;
    tc_state_standard(&s, 5);
    int rc = tc_save(st, 1, &s, NULL);
    cr_assert(c.done, "the hook never saw the shard created");
    cr_assert_eq(rc, CKPT_EACCES, "save: %d %s", rc, ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "not committed") &&
              strstr(ckpt_error_last(), tc_root) && !strstr(ckpt_error_last(), "/proc/"),
              "%s", ckpt_error_last());
    cr_assert_eq(tc_count_prefix(c.outside, ""), 0, "the save's files went through the link");
    char *shard = tc_join(c.aside, "rank-00000.shard");
    cr_assert(tc_exists(shard), "the shard is not in the directory the save made");
    free(shard);
    int64_t none[1];
    tc_assert_steps(st, none, 0);
    ckpt_store_free(st);
    tc_state_free(&s);
    tc_rmtree(c.outside);
    tc_rmtree(c.aside);
    free(c.outside);
}

/* fsio_preadv (lib/io/fsio.h): one read scattered over several buffers,
 * in file order, the last one short at the end of the file; an injected
 * fault fails it like a pread; the trace sees one read of all its bytes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsio.h"
#include "helpers.h"

TestSuite(fsio, .init = tc_setup, .fini = tc_teardown, .timeout = 60);

static int fail_reads(void *ctx, fsio_op op, const char *path)
{
    (void)path;
    return op == FSIO_PREAD ? *(int *)ctx : 0;
}

static size_t traced;

static void trace_reads(void *ctx, const fsio_event *ev)
{
    (void)ctx;
    if (ev->op == FSIO_PREAD)
        traced += ev->len;
}

Test(fsio, preadv_scatters_in_file_order)
{
    char path[4096], file[100];
    snprintf(path, sizeof path, "%s/data", tc_root);
    for (int i = 0; i < 100; i++)
        file[i] = (char)i;
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    cr_assert(fd >= 0 && write(fd, file, 100) == 100 && close(fd) == 0);
    fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);

    char a[30], b[1], c[50], d[40];
    memset(d, 0x7f, sizeof d);
    struct iovec iov[] = {{a, 30}, {b, 0}, {c, 50}, {d, 40}};
    fsio fs = {.trace = trace_reads};
    traced = 0;
    cr_assert_eq(fsio_preadv(&fs, fd, iov, 4, 0), 100, "the file has 100 bytes");
    cr_assert_eq(traced, 100);
    cr_assert(memcmp(a, file, 30) == 0 && memcmp(c, file + 30, 50) == 0);
    cr_assert(memcmp(d, file + 80, 20) == 0);
    cr_assert_eq(d[20], 0x7f, "nothing past the end of the file");

    struct iovec mid[] = {{a, 5}, {c, 5}};
    cr_assert_eq(fsio_preadv(&fs, fd, mid, 2, 42), 10, "from an offset");
    cr_assert(memcmp(a, file + 42, 5) == 0 && memcmp(c, file + 47, 5) == 0);

    int err = EIO;
    fsio faulty = {.fault = fail_reads, .ctx = &err};
    struct iovec one[] = {{a, 30}};
    cr_assert_eq(fsio_preadv(&faulty, fd, one, 1, 0), -EIO);
    close(fd);
}

/* fsio_remove_tree on a tree another user may write (a stale temporary
 * directory of a group-shared root): when a subdirectory is swapped for a
 * link to somewhere else while the tree is being removed, the removal must
 * not go through the link.  The swap happens from the fault hook, right
 * before the first unlink inside `sub`, after `sub` was listed: what an
 * attacker watching with inotify does. */
struct swap {
    char sub[4096], aside[4096], outside[4096];
    int swapped;
};

static int swap_on_first_unlink(void *ctx, fsio_op op, const char *path)
{
    struct swap *s = ctx;
    if (op == FSIO_UNLINK && !s->swapped && strncmp(path, s->sub, strlen(s->sub)) == 0) {
        s->swapped = 1;
        cr_assert_eq(rename(s->sub, s->aside), 0);
        cr_assert_eq(symlink(s->outside, s->sub), 0);
    }
    return 0;
}

static void touch(const char *dir, const char *name)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    cr_assert(fd >= 0, "create %s", p);
    close(fd);
}

Test(fsio, remove_tree_never_follows_a_directory_swapped_for_a_link)
{
    struct swap s = {.swapped = 0};
    char tree[4096], p[4096];
    snprintf(tree, sizeof tree, "%s/.tmp-step-000000000099-1-1", tc_root);
    snprintf(s.sub, sizeof s.sub, "%s/.tmp-step-000000000099-1-1/sub", tc_root);
    snprintf(s.aside, sizeof s.aside, "%s/moved", tc_root);
    snprintf(s.outside, sizeof s.outside, "%s/precious", tc_root);
    cr_assert_eq(mkdir(tree, 0700), 0);
    cr_assert_eq(mkdir(s.sub, 0700), 0);
    cr_assert_eq(mkdir(s.outside, 0700), 0);
    const char *names[] = {"a", "b", "c", "important.conf"};
    for (int i = 0; i < 4; i++) {
        touch(s.sub, names[i]);
        touch(s.outside, names[i]);
    }
    snprintf(p, sizeof p, "%s/.tmp-step-000000000099-1-1/sub/importantdir", tc_root);
    cr_assert_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/precious/importantdir", tc_root);
    cr_assert_eq(mkdir(p, 0700), 0);

    fsio fs = {.fault = swap_on_first_unlink, .ctx = &s};
    int rc = fsio_remove_tree(&fs, tree);
    cr_assert(s.swapped, "the hook never ran: no unlink inside sub");
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/precious/%s", tc_root, names[i]);
        cr_expect_eq(access(p, F_OK), 0, "%s was removed through the link (rc %d)", p, rc);
    }
    snprintf(p, sizeof p, "%s/precious/importantdir", tc_root);
    cr_expect_eq(access(p, F_OK), 0, "%s was removed through the link", p);
    /* What was listed went from the directory that was listed, now moved
     * aside; the tree itself went, link included. */
    snprintf(p, sizeof p, "%s/moved/importantdir", tc_root);
    cr_expect_neq(access(p, F_OK), 0, "the listed directory was not emptied");
    cr_expect_eq(rc, 0, "rc %d", rc);
    cr_expect_neq(access(tree, F_OK), 0, "the tree is still there");
}

/* The superuser removing a tree in another user's root (a stale temporary
 * directory, a retired step): the owner, who may rename entries there,
 * swaps a directory of root's (which the owner cannot empty) under the
 * name being removed, right after the path was checked.  With
 * spare_superuser_dirs the removal judges each directory it opened, not
 * the path: root's directory and its files stay, -EPERM.  Without it they
 * went (a co-tenant's race against root's `ckpt gc`). */
struct exchange {
    char a[4096], b[4096];
    int done;
};

static int exchange_on_first_stat(void *ctx, fsio_op op, const char *path)
{
    struct exchange *x = ctx;
    if (op == FSIO_STAT && !x->done && strcmp(path, x->a) == 0) {
        x->done = 1;
        cr_assert_eq(renameat2(AT_FDCWD, x->a, AT_FDCWD, x->b, RENAME_EXCHANGE), 0, "%s",
                     strerror(errno));
    }
    return 0;
}

Test(fsio, remove_tree_spares_the_superusers_directory_swapped_in)
{
    if (geteuid() != 0)
        cr_skip_test("needs root (the superuser's own directory)");
    struct exchange x = {.done = 0};
    char p[8192];
    snprintf(x.a, sizeof x.a, "%s/.tmp-step-000000000009-1-1", tc_root);
    snprintf(x.b, sizeof x.b, "%s/roots", tc_root);
    cr_assert_eq(mkdir(x.a, 0700), 0);
    cr_assert_eq(chown(x.a, 65534, 65534), 0);
    cr_assert_eq(mkdir(x.b, 0700), 0); /* root's, with root's files */
    for (int spare = 0; spare <= 1; spare++) {
        touch(x.b, "a");
        touch(x.b, "b");
        x.done = 0;
        fsio fs = {.fault = exchange_on_first_stat, .ctx = &x,
                   .spare_superuser_dirs = spare};
        int rc = fsio_remove_tree(&fs, x.a);
        cr_assert(x.done, "the hook never ran");
        /* root's directory now sits at x.a, the owner's at x.b */
        snprintf(p, sizeof p, "%s/a", x.a);
        if (spare) {
            cr_assert_eq(rc, -FSIO_ESPARED, "rc %d", rc);
            cr_assert_eq(access(p, F_OK), 0, "root's file was removed");
        } else {
            cr_assert_neq(access(p, F_OK), 0, "without the guard the race deletes it");
            cr_assert_eq(mkdir(x.a, 0700), 0); /* put back for the guarded round */
            cr_assert_eq(renameat2(AT_FDCWD, x.a, AT_FDCWD, x.b, RENAME_EXCHANGE), 0);
        }
    }
    /* the owner's own tree still goes, guard or not */
    snprintf(p, sizeof p, "%s/owners", tc_root);
    cr_assert_eq(mkdir(p, 0700), 0);
    touch(p, "f");
    cr_assert_eq(chown(p, 65534, 65534), 0);
    fsio fs = {.spare_superuser_dirs = 1};
    cr_assert_eq(fsio_remove_tree(&fs, p), 0);
    cr_assert_neq(access(p, F_OK), 0);
}

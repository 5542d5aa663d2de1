/* Roots shared by a group (CKPT_OPEN_TRUST_GROUP) and the permissions
 * around them (lib/io/trust.h): hard-linked lock files and event logs,
 * writable directories above the root, POSIX ACLs (access and default),
 * modes whatever the umask, members writing after each other, links and
 * directories swapped in while open, the roots' group on members' steps.
 * Changing owners needs root (CI runs as root); those tests skip
 * otherwise. */
#include "trust_util.h"

TestSuite(trust, .init = tc_setup, .fini = tc_teardown, .timeout = 120);

/* The lock file and the event log are written into.  Whoever may write the
 * root (its owner; the group, trusted) can make either a hard link to a
 * file elsewhere, which the lock note or an event would overwrite: any
 * file of anyone where fs.protected_hardlinks is 0, when root runs gc.
 * Both are refused, and the file elsewhere keeps its bytes. */
Test(trust, a_lock_file_or_event_log_with_other_names_is_not_written)
{
    char root[4096], victim[4096], lk[4096];
    snprintf(root, sizeof root, "%s/r", tc_root);
    snprintf(victim, sizeof victim, "%s/shared.cfg", tc_root);
    ckpt_store *st;
    cr_assert_eq(open_flags(root, 0, &st), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    const char text[] = "precious = 1\n";
    FILE *f = fopen(victim, "w");
    cr_assert(f && fputs(text, f) >= 0 && fclose(f) == 0);

    snprintf(lk, sizeof lk, "%s/r/.lock", tc_root);
    cr_assert_eq(unlink(lk), 0);
    cr_assert_eq(link(victim, lk), 0, "link %s", lk);
    assert_refused(open_flags(root, 0, &st), "a hard-linked lock file", "hard link");
    cr_assert_eq(unlink(lk), 0);

    snprintf(lk, sizeof lk, "%s/r/ckpt-events.jsonl", tc_root);
    unlink(lk);
    cr_assert_eq(link(victim, lk), 0, "link %s", lk);
    cr_assert_eq(open_flags(root, 0, &st), CKPT_OK, "%s", ckpt_error_last());
    float w[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    ckpt_tensor t = {"w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);

    char got[256] = "";
    f = fopen(victim, "r");
    cr_assert(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = 0;
    cr_expect_str_eq(got, text, "the file linked in was written: '%s'", got);
}

/* A directory above the root that others may write lets them rename the
 * root away, or swap in another directory between two saves: the writer
 * reaches its files by path, and would write there.  Refused for writing
 * (nothing left behind), unless the sticky bit of the caller or root
 * protects the entries (as /tmp), or the group is trusted; readers are
 * unaffected. */
Test(trust, a_directory_above_the_root_that_others_may_write_is_refused)
{
    char shared[4096], root[4096];
    snprintf(shared, sizeof shared, "%s/proj", tc_root);
    snprintf(root, sizeof root, "%s/proj/mine", tc_root);
    cr_assert_eq(mkdir(shared, 0700), 0);
    ckpt_store *st;

    cr_assert_eq(chmod(shared, 0777), 0);
    assert_refused(open_flags(root, 0, &st), "world-writable parent", "above the checkpoint root");
    cr_expect_neq(access(root, F_OK), 0, "the refused root was left behind");
    assert_refused(open_flags(root, CKPT_OPEN_TRUST_GROUP, &st), "world-writable parent, group",
                   "writable by every user");

    cr_assert_eq(chmod(shared, 01777), 0); /* sticky, ours: as /tmp */
    cr_assert_eq(open_flags(root, 0, &st), CKPT_OK, "sticky parent: %s", ckpt_error_last());
    ckpt_store_free(st);
    cr_assert_eq(chmod(shared, 0777), 0);
    assert_refused(open_flags(root, 0, &st), "existing root, world-writable parent",
                   "writable by every user");
    cr_assert_eq(open_flags(root, CKPT_OPEN_READONLY, &st), CKPT_OK, "a reader: %s",
                 ckpt_error_last());
    ckpt_store_free(st);

    char deeper[4096];
    snprintf(deeper, sizeof deeper, "%s/proj/mine/a/b", tc_root);
    cr_assert_eq(chmod(shared, 0700), 0);
    char mid[4096];
    snprintf(mid, sizeof mid, "%s/proj/mine/a", tc_root);
    cr_assert_eq(mkdir(mid, 0700), 0);
    cr_assert_eq(open_flags(deeper, 0, &st), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    cr_assert_eq(chmod(shared, 0777), 0);
    assert_refused(open_flags(deeper, 0, &st), "a grandparent others may write", shared);
    cr_assert_eq(chmod(shared, 0700), 0);

    if (geteuid() != 0)
        return; /* the group case needs chown */
    cr_assert_eq(chown(shared, 0, shared_gid()), 0);
    cr_assert_eq(chmod(shared, 0770), 0);
    assert_refused(open_flags(root, 0, &st), "group-writable parent", "writable by its group");
    cr_assert(strstr(ckpt_error_last(), "CKPT_OPEN_TRUST_GROUP"), "%s", ckpt_error_last());
    cr_assert_eq(open_flags(root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "trusting the group: %s",
                 ckpt_error_last());
    ckpt_store_free(st);
}

/* Set a POSIX access ACL on `path` naming user `uid` with `perm` (and a
 * mask of `mask`), in the kernel's xattr layout (what setfacl writes);
 * skips the test where the file system keeps no ACLs. */
static void set_acl(const char *path, unsigned uid, unsigned perm, unsigned mask)
{
    struct { uint16_t tag, perm; uint32_t id; } e[5] = {
        {0x01, 7, 0xffffffffu},  /* ACL_USER_OBJ */
        {0x02, (uint16_t)perm, uid}, /* ACL_USER */
        {0x04, 5, 0xffffffffu},  /* ACL_GROUP_OBJ r-x */
        {0x10, (uint16_t)mask, 0xffffffffu}, /* ACL_MASK */
        {0x20, 0, 0xffffffffu},  /* ACL_OTHER */
    };
    unsigned char buf[4 + sizeof e];
    uint32_t version = 2;
    memcpy(buf, &version, 4); /* little-endian, as the machines CI runs on */
    memcpy(buf + 4, e, sizeof e);
    if (setxattr(path, "system.posix_acl_access", buf, sizeof buf, 0) != 0) {
        if (errno == ENOTSUP || errno == EOPNOTSUPP)
            cr_skip_test("this file system keeps no POSIX ACLs");
        cr_assert_fail("setxattr %s: %s", path, strerror(errno));
    }
}

/* The group bits of a directory with an ACL show only its mask: a named
 * user given write by the ACL could rename steps (or the root) away,
 * which the mode alone does not tell when the owning group is private. */
Test(trust, a_posix_acl_letting_another_user_write_is_refused)
{
    char shared[4096], root[4096];
    snprintf(shared, sizeof shared, "%s/proj", tc_root);
    snprintf(root, sizeof root, "%s/proj/run", tc_root);
    cr_assert_eq(mkdir(shared, 0700), 0);
    cr_assert_eq(mkdir(root, 0700), 0);
    ckpt_store *st;
    /* read and search only for another user: nothing to fear */
    set_acl(root, OTHER_UID, 5, 5);
    cr_assert_eq(open_flags(root, 0, &st), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    /* write, but masked off: not effective */
    set_acl(root, OTHER_UID, 7, 5);
    cr_assert_eq(open_flags(root, 0, &st), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    /* write for another user on the root */
    set_acl(root, OTHER_UID, 7, 7);
    assert_refused(open_flags(root, 0, &st), "root with an ACL writer", "POSIX ACL");
    assert_refused(open_flags(root, CKPT_OPEN_READONLY, &st), "reader", "POSIX ACL");
    cr_assert_eq(open_flags(root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "trusting: %s",
                 ckpt_error_last());
    ckpt_store_free(st);
    /* on the directory above it */
    cr_assert_eq(removexattr(root, "system.posix_acl_access"), 0);
    cr_assert_eq(chmod(root, 0700), 0);
    set_acl(shared, OTHER_UID, 7, 7);
    assert_refused(open_flags(root, 0, &st), "parent with an ACL writer",
                   "above the checkpoint root");
    cr_assert(strstr(ckpt_error_last(), "POSIX ACL"), "%s", ckpt_error_last());
    cr_assert_eq(chmod(shared, 01770), 0); /* sticky, ours: renames are ours alone */
    cr_assert_eq(open_flags(root, 0, &st), CKPT_OK, "sticky parent: %s", ckpt_error_last());
    ckpt_store_free(st);
}

/* A root shared with a trusted group is made 0770 and so are its step
 * directories, whatever the umask (022 would take the group's write bit,
 * and another member's writer could not remove the steps it retires); a
 * setgid bit passed down by a project directory stays. */
Test(trust, a_trusted_group_root_is_group_writable_whatever_the_umask)
{
    char proj[4096], root[4096], step[4096];
    snprintf(proj, sizeof proj, "%s/proj", tc_root);
    snprintf(root, sizeof root, "%s/proj/shared", tc_root);
    cr_assert_eq(mkdir(proj, 0700), 0);
    cr_assert_eq(chmod(proj, 02700), 0);
    mode_t old = umask(022);
    ckpt_store *st;
    int rc = open_flags(root, CKPT_OPEN_TRUST_GROUP, &st);
    if (rc == CKPT_OK) {
        float w[2] = {1, 2};
        int64_t shape[1] = {2};
        ckpt_tensor t = {"w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_HOST};
        rc = ckpt_save_sync(st, 1, &t, 1, NULL);
        ckpt_store_free(st);
    }
    umask(old);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    struct stat sb;
    cr_assert_eq(stat(root, &sb), 0);
    cr_expect_eq(sb.st_mode & 07777, 02770, "root mode %04o", (unsigned)(sb.st_mode & 07777));
    snprintf(step, sizeof step, "%s/proj/shared/step-000000000001", tc_root);
    cr_assert_eq(stat(step, &sb), 0);
    cr_expect_eq(sb.st_mode & 0777, 0770, "step mode %04o", (unsigned)(sb.st_mode & 07777));
}

/* A member whose umask is 077 saves into a root shared with a trusted
 * group: the step's files are still group-readable (0640, as FORMAT.md
 * says), or no other member could restore the step. */
Test(trust, a_trusted_group_roots_files_are_group_readable_whatever_the_umask)
{
    char root[4096];
    snprintf(root, sizeof root, "%s/shared77", tc_root);
    mode_t old = umask(077);
    ckpt_store *st;
    int rc = open_flags(root, CKPT_OPEN_TRUST_GROUP, &st);
    if (rc == CKPT_OK) {
        float w[2] = {1, 2};
        int64_t shape[1] = {2};
        ckpt_tensor t = {"w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_HOST};
        rc = ckpt_save_sync(st, 1, &t, 1, NULL);
        ckpt_store_free(st);
    }
    umask(old);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    char step[8192];
    snprintf(step, sizeof step, "%s/step-000000000001", root);
    DIR *d = opendir(step);
    cr_assert(d, "%s: %s", step, strerror(errno));
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[8192 + 256];
        snprintf(path, sizeof path, "%s/%s", step, e->d_name);
        struct stat sb;
        cr_assert_eq(stat(path, &sb), 0);
        cr_expect_eq(sb.st_mode & 0777, 0640, "%s: mode %04o", e->d_name,
                     (unsigned)(sb.st_mode & 0777));
        files++;
    }
    closedir(d);
    cr_expect_geq(files, 2, "the manifest and the shard");
}

/* A root shared with a trusted group is written by its members in turn:
 * the second member's writer opens the lock file (and appends to the event
 * log) that the first one made, so both are group-writable there, whatever
 * the umask (they were 0600 and 0640: only the first member could ever
 * write the root again). */
Test(trust, another_member_of_a_trusted_group_writes_the_root_next)
{
    need_root();
    char proj[4096], root[4096];
    snprintf(proj, sizeof proj, "%s/proj", tc_root);
    snprintf(root, sizeof root, "%s/proj/shared", tc_root);
    cr_assert_eq(mkdir(proj, 0700), 0);
    cr_assert_eq(chown(tc_root, 0, shared_gid()), 0);
    cr_assert_eq(chmod(tc_root, 0750), 0); /* nobody may enter, as a member */
    cr_assert_eq(chown(proj, 0, shared_gid()), 0);
    cr_assert_eq(chmod(proj, 02770), 0);
    mode_t old = umask(022);
    ckpt_store *st;
    cr_assert_eq(open_flags(root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    float w[2] = {1, 2};
    int64_t shape[1] = {2};
    ckpt_tensor t = {"w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    umask(old);

    /* the other member: a child as user nobody in the shared group */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        gid_t g = shared_gid();
        char msg[512] = "ok";
        if (setgroups(1, &g) != 0 || setgid(g) != 0 || setuid(OTHER_UID) != 0) {
            snprintf(msg, sizeof msg, "cannot become uid %d: %s", OTHER_UID, strerror(errno));
        } else {
            ckpt_store *s2 = NULL;
            int rc = open_flags(root, CKPT_OPEN_TRUST_GROUP, &s2);
            if (rc == CKPT_OK)
                rc = ckpt_save_sync(s2, 2, &t, 1, NULL);
            if (rc != CKPT_OK)
                snprintf(msg, sizeof msg, "%s: %s", ckpt_status_name(rc), ckpt_error_last());
            ckpt_store_free(s2);
        }
        ssize_t unused = write(fds[1], msg, strlen(msg) + 1);
        (void)unused;
        _exit(0);
    }
    close(fds[1]);
    char got[512] = "";
    ssize_t n = read(fds[0], got, sizeof got - 1);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(n > 0, "the child said nothing");
    cr_assert_str_eq(got, "ok", "the second member's writer: %s", got);
    char step[4096];
    snprintf(step, sizeof step, "%s/proj/shared/step-000000000002", tc_root);
    struct stat sb;
    cr_assert_eq(stat(step, &sb), 0, "step 2 of the second member is missing");
    cr_expect_eq(sb.st_uid, (uid_t)OTHER_UID);
}

/* The root's owner may always rename its entry (in /tmp, in a home): here
 * the root is swapped for a link to another root right before the first
 * retirement (from the fault hook, as a racer watching with inotify
 * would), while gc, which checked the lock, is retiring steps (root
 * running `ckpt gc --trust-group` on a user's root).  The steps retired
 * are the opened root's: the other root keeps every step. */
typedef struct swap_ctx {
    const char *root, *moved, *other;
    int swapped;
} swap_ctx;

static int swap_on_rename(void *ctx, fsio_op op, const char *path)
{
    swap_ctx *c = ctx;
    (void)path;
    if (op == FSIO_RENAME && !c->swapped) {
        c->swapped = 1;
        cr_assert_eq(rename(c->root, c->moved), 0);
        cr_assert_eq(symlink(c->other, c->root), 0);
    }
    return 0;
}

Test(trust, a_root_swapped_for_a_link_while_open_is_not_followed)
{
    char *a = tc_join(tc_root, "a"), *b = tc_join(tc_root, "b");
    char *moved = tc_join(tc_root, "a.moved");
    tc_state s;
    tc_state_standard(&s, 7);
    ckpt_store *st = tc_open(b);
    for (int64_t step = 1; step <= 3; step++)
        tc_save_ok(st, step, &s);
    ckpt_store_free(st);
    st = tc_open(a);
    for (int64_t step = 1; step <= 3; step++)
        tc_save_ok(st, step, &s);
    ckpt_store_free(st);

    swap_ctx c = {a, moved, b, 0};
    ckpt_store_options o;
    tc_opts(&o);
    fsio fs = {.fault = swap_on_rename, .ctx = &c};
    cr_assert_eq(ckpt_store_open_with_fsio(&st, a, &o, &fs), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_gc(st, 1, 0, NULL);
    ckpt_store_free(st);
    cr_assert(c.swapped, "no rename happened");
    ckpt_store *ro = tc_open_ro(b);
    int64_t all[] = {1, 2, 3};
    tc_assert_steps(ro, all, 3); /* nothing of b retired */
    ckpt_store_free(ro);
    ro = tc_open_ro(moved);
    int64_t last[] = {3};
    tc_assert_steps(ro, last, 1); /* the root opened was the one cleaned */
    ckpt_store_free(ro);
    tc_state_free(&s);
    free(a), free(b), free(moved);
}

/* Trusting the group trusts its members with the shared root, not with
 * the caller's other roots: a member's link in the project directory,
 * pointing at a private root of the caller's, is refused (it led the
 * writer into that root: a restore of another run, retention retiring its
 * steps). */
Test(trust, a_group_members_link_is_not_followed_trusting_the_group)
{
    char *proj = tc_join(tc_root, "proj"), *priv = tc_join(tc_root, "private");
    char *link = tc_join(proj, "shared-run");
    cr_assert_eq(mkdir(proj, 0770), 0);
    cr_assert_eq(chmod(proj, 02770), 0);
    tc_state s;
    tc_state_standard(&s, 3);
    ckpt_store *st = tc_open(priv);
    tc_save_ok(st, 1, &s);
    tc_save_ok(st, 2, &s);
    ckpt_store_free(st);
    cr_assert_eq(symlink(priv, link), 0);
    if (lchown(link, 65534, getegid()) != 0)
        cr_skip_test("needs root to give the link another owner");
    ckpt_store_options o;
    tc_opts(&o);
    o.flags |= CKPT_OPEN_TRUST_GROUP;
    o.keep_last = 1;
    st = NULL;
    int rc = ckpt_store_open(&st, link, &o);
    cr_assert_eq(rc, CKPT_EACCES, "a member's link was followed: %d %s", rc,
                 ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "symbolic link"), "%s", ckpt_error_last());
    ckpt_store *ro = tc_open_ro(priv);
    int64_t both[] = {1, 2};
    tc_assert_steps(ro, both, 2);
    ckpt_store_free(ro);
    tc_state_free(&s);
    free(proj), free(priv), free(link);
}

/* A user whose primary group is shared (here nobody, whose group is
 * nogroup, not a private group): the root, its steps and files are made
 * private (0700, 0600) whatever the umask lets, instead of readable by
 * the group (0750, 0640, as for a user-private group). */
Test(trust, a_shared_primary_group_gets_private_modes)
{
    need_root();
    struct passwd *pw = getpwuid(OTHER_UID);
    if (!pw || trust_private_group(OTHER_UID, pw->pw_gid))
        cr_skip_test("needs a user %d without a private group", OTHER_UID);
    cr_assert_eq(chmod(tc_root, 01777), 0);
    char root[4096]; /* on the stack: the child leaves by _exit */
    snprintf(root, sizeof root, "%s/run", tc_root);
    gid_t gid = pw->pw_gid;
    pid_t pid = fork();
    if (pid == 0) {
        umask(022);
        if (setgid(gid) || setuid(OTHER_UID))
            _exit(10);
        tc_state s;
        tc_state_standard(&s, 1);
        ckpt_store *st = NULL;
        ckpt_store_options o;
        tc_opts(&o);
        int rc = ckpt_store_open(&st, root, &o);
        if (!rc)
            rc = tc_save(st, 1, &s, NULL);
        ckpt_store_free(st);
        tc_state_free(&s);
        _exit(rc ? 11 : 0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %d", status);
    char *step = tc_step_dir(root, 1), *man = tc_join(step, "manifest.json");
    char *shard = tc_join(step, "rank-00000.shard"), *log = tc_join(root, "ckpt-events.jsonl");
    const char *paths[] = {root, step, man, shard, log};
    for (size_t i = 0; i < 5; i++) {
        struct stat sb;
        cr_assert_eq(stat(paths[i], &sb), 0, "%s", paths[i]);
        cr_assert_eq(sb.st_mode & 0077, 0, "%s is mode %04o", paths[i],
                     (unsigned)(sb.st_mode & 07777));
    }
    free(step), free(man), free(shard), free(log);
}

/* A root its owner made read-only (chmod 555) refuses a writer at open,
 * saying so, rather than at the first save, after the job has trained up
 * to it; read-only opens still work.  (As another user: root may write
 * anything.) */
Test(trust, a_root_without_write_permission_refuses_a_writer_at_open)
{
    need_root();
    cr_assert_eq(chmod(tc_root, 01777), 0);
    char root[4096];
    snprintf(root, sizeof root, "%s/ro", tc_root);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(OTHER_UID) || setuid(OTHER_UID))
            _exit(10);
        tc_state s;
        tc_state_standard(&s, 1);
        ckpt_store *st = NULL;
        if (open_flags(root, 0, &st) || tc_save(st, 1, &s, NULL))
            _exit(11);
        ckpt_store_free(st);
        if (chmod(root, 0555) != 0)
            _exit(12);
        int rc = open_flags(root, 0, &st);
        int named = strstr(ckpt_error_last(), "not writable by you") &&
                    strstr(ckpt_error_last(), "0555") && strstr(ckpt_error_last(), "READONLY");
        ckpt_store_free(st);
        if (rc != CKPT_EACCES || !named) {
            fprintf(stderr, "writer open: %s: %s\n", ckpt_status_name(rc), ckpt_error_last());
            _exit(13);
        }
        if (open_flags(root, CKPT_OPEN_READONLY, &st) != CKPT_OK)
            _exit(14);
        int64_t step = -1;
        rc = ckpt_store_latest(st, CKPT_VERIFY_FULL, &step);
        ckpt_store_free(st);
        tc_state_free(&s);
        chmod(root, 0755);
        _exit(rc || step != 1 ? 15 : 0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %d", status);
}

/* Trusting the group is trusting the root's group, for a member of it,
 * and its members; not every user.  A stranger (uid 65534, not in the
 * group) who made a root of their own group first (in /tmp, on a path a
 * project's job will open), with an ACL letting the caller write, is
 * refused; so is a step a stranger planted in a member's shared root, and
 * a root whose ACL lets a stranger write.  Run as a member in a child
 * (uid 4242, primary group 4242, in the group "users"). */
#define MEMBER_UID 4242

/* Is `name` listed as a member of group `gid`? */
static int user_listed_in(const char *name, gid_t gid)
{
    struct group *g = getgrgid(gid);
    for (char **m = g ? g->gr_mem : NULL; m && *m; m++)
        if (strcmp(*m, name) == 0)
            return 1;
    return 0;
}

static void as_member(const char *what, void (*body)(char *msg, size_t n, void *arg),
                      void *arg)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* a primary group of its own, the shared one supplementary (as
         * /etc/group lists a project's members) */
        gid_t g = shared_gid();
        char msg[1024] = "ok";
        if (setgroups(1, &g) != 0 || setgid(MEMBER_UID) != 0 || setuid(MEMBER_UID) != 0)
            snprintf(msg, sizeof msg, "cannot become uid %d: %s", MEMBER_UID, strerror(errno));
        else
            body(msg, sizeof msg, arg);
        ssize_t unused = write(fds[1], msg, strlen(msg) + 1);
        (void)unused;
        _exit(0);
    }
    close(fds[1]);
    char got[1024] = "";
    ssize_t n = read(fds[0], got, sizeof got - 1);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(n > 0, "%s: the child said nothing", what);
    cr_assert_str_eq(got, "ok", "%s: %s", what, got);
}

/* The child's writer trusting the group must be refused with `word`. */
static void writer_refused(char *msg, size_t n, void *arg)
{
    const char *const *a = arg; /* {root, word} */
    ckpt_store *st = NULL;
    int rc = open_flags(a[0], CKPT_OPEN_TRUST_GROUP, &st);
    if (rc != CKPT_EACCES || !strstr(ckpt_error_last(), a[1]))
        snprintf(msg, n, "%s, want CKPT_EACCES naming '%s': %s", ckpt_status_name(rc), a[1],
                 ckpt_error_last());
    ckpt_store_free(st);
}

/* The child's reader trusting the group restores step 1, reporting step 2
 * (the stranger's) as refused. */
static void stranger_step_skipped(char *msg, size_t n, void *arg)
{
    const char *root = arg;
    ckpt_store *st = NULL;
    int rc = open_flags(root, CKPT_OPEN_READONLY | CKPT_OPEN_TRUST_GROUP, &st);
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_report *rep = NULL;
    if (!rc)
        rc = ckpt_restore(st, CKPT_LATEST, s.t, s.count, NULL, &rep);
    if (rc)
        snprintf(msg, n, "%s: %s", ckpt_status_name(rc), ckpt_error_last());
    else if (ckpt_report_step(rep) != 1 || ckpt_report_count(rep) != 1 ||
             ckpt_report_get(rep, 0)->status != CKPT_EACCES ||
             !strstr(ckpt_report_get(rep, 0)->message, "uid 65534"))
        snprintf(msg, n, "restored step %lld, %zu problems (%s)",
                 (long long)ckpt_report_step(rep), ckpt_report_count(rep),
                 ckpt_report_count(rep) ? ckpt_report_get(rep, 0)->message : "-");
    ckpt_report_free(rep);
    tc_state_free(&s);
    ckpt_store_free(st);
}

Test(trust, trusting_the_group_trusts_its_members_not_every_user)
{
    need_root();
    struct passwd *nobody = getpwuid(OTHER_UID);
    if (nobody && user_listed_in(nobody->pw_name, shared_gid()))
        cr_skip_test("uid 65534 is a member of the shared group here");
    cr_assert_eq(chmod(tc_root, 0755), 0); /* the member may enter */
    char proj[4096], root[4096];
    snprintf(proj, sizeof proj, "%s/tmp", tc_root);
    snprintf(root, sizeof root, "%s/tmp/run", tc_root);
    cr_assert_eq(mkdir(proj, 01777), 0); /* as /tmp */
    cr_assert_eq(chmod(proj, 01777), 0);
    cr_assert_eq(mkdir(root, 0770), 0);

    /* 1. the stranger's root, of the stranger's group, writable by the
     * member through an ACL: the member's writer does not write there */
    cr_assert_eq(chown(root, OTHER_UID, OTHER_UID), 0);
    set_acl(root, MEMBER_UID, 7, 7);
    const char *a1[2] = {root, "belongs to uid 65534"};
    as_member("a stranger's root", writer_refused, a1);

    /* 2. a shared root (root's, group users) whose ACL lets the stranger
     * write: refused; a member may be named */
    cr_assert_eq(chown(root, 0, shared_gid()), 0);
    cr_assert_eq(chmod(root, 02770), 0);
    set_acl(root, OTHER_UID, 7, 7);
    const char *a2[2] = {root, "POSIX ACL"};
    as_member("an ACL naming a stranger", writer_refused, a2);
    cr_assert_eq(removexattr(root, "system.posix_acl_access"), 0);
    cr_assert_eq(chmod(root, 02770), 0);

    /* 3. a step the stranger planted in the shared root: skipped */
    ckpt_store *st = NULL;
    cr_assert_eq(open_flags(root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    tc_state s1, s2;
    tc_state_standard(&s1, 1);
    tc_state_standard(&s2, 2);
    tc_save_ok(st, 1, &s1);
    tc_save_ok(st, 2, &s2);
    ckpt_store_free(st);
    char *d2 = tc_step_dir(root, 2);
    chown_tree(d2, OTHER_UID, shared_gid());
    as_member("a stranger's step", stranger_step_skipped, root);
    free(d2);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* A member of the group may write the project directory: right after the
 * writer's mkdir of a new root, that member swaps the entry for another
 * directory of the caller's (a private one kept beside it).  The writer
 * made the swapped-in directory group-writable (0770): the member then
 * read and wrote the caller's private files.  Only the directory mkdir
 * just made (the caller's, empty, of the mode mkdir gives) is changed. */
typedef struct mkdir_swap {
    const char *root, *moved, *private_dir;
    int swapped;
} mkdir_swap;

static int swap_after_mkdir(void *ctx, fsio_op op, const char *path)
{
    mkdir_swap *c = ctx;
    if (op == FSIO_OPEN && !c->swapped && strcmp(path, c->root) == 0) {
        c->swapped = 1;
        cr_assert_eq(rename(c->root, c->moved), 0);
        cr_assert_eq(rename(c->private_dir, c->root), 0);
    }
    return 0;
}

Test(trust, a_directory_swapped_in_for_a_new_root_keeps_its_mode)
{
    char proj[4096], root[4096], moved[4096], priv[4096], secret[4096];
    snprintf(proj, sizeof proj, "%s/proj", tc_root);
    snprintf(root, sizeof root, "%s/proj/run", tc_root);
    snprintf(moved, sizeof moved, "%s/proj/run.moved", tc_root);
    snprintf(priv, sizeof priv, "%s/proj/private", tc_root);
    snprintf(secret, sizeof secret, "%s/proj/private/secret", tc_root);
    cr_assert_eq(mkdir(proj, 0700), 0);
    cr_assert_eq(chmod(proj, 02770), 0);
    cr_assert_eq(mkdir(priv, 0700), 0);
    FILE *f = fopen(secret, "w");
    cr_assert(f);
    fputs("mine", f);
    fclose(f);
    mode_t old = umask(022);
    mkdir_swap c = {root, moved, priv, 0};
    fsio fs = {.fault = swap_after_mkdir, .ctx = &c};
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = CKPT_OPEN_TRUST_GROUP;
    ckpt_store *st = NULL;
    int rc = ckpt_store_open_with_fsio(&st, root, &o, &fs);
    ckpt_store_free(st);
    umask(old);
    (void)rc; /* the open may go on in the swapped-in directory: its mode is the point */
    cr_assert(c.swapped, "the hook never saw the open after the mkdir");
    struct stat sb;
    cr_assert_eq(stat(root, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0700, "the caller's private directory became %04o",
                 (unsigned)(sb.st_mode & 07777));
}

/* The member's writer trusting the group saves step `arg` into a root. */
typedef struct member_save {
    const char *root;
    int64_t step;
} member_save;

static void member_saves(char *msg, size_t n, void *arg)
{
    const member_save *a = arg;
    ckpt_store *st = NULL;
    int rc = open_flags(a->root, CKPT_OPEN_TRUST_GROUP, &st);
    float w[2] = {1, 2};
    int64_t shape[1] = {2}, latest = -1;
    ckpt_tensor t = {"w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    if (!rc)
        rc = ckpt_save_sync(st, a->step, &t, 1, NULL);
    if (!rc)
        rc = ckpt_store_latest(st, CKPT_VERIFY_FULL, &latest);
    if (rc)
        snprintf(msg, n, "step %lld: %s: %s", (long long)a->step, ckpt_status_name(rc),
                 ckpt_error_last());
    else if (latest != a->step)
        snprintf(msg, n, "saved step %lld, the newest valid is %lld", (long long)a->step,
                 (long long)latest);
    ckpt_store_free(st);
}

/* Shared projects a member uses trusting the group, which the first form
 * of the rule above refused: a project directory shared by a POSIX ACL
 * naming the group (a default ACL: roots made in it get it too, their own
 * group being the maker's), and a group-writable project directory
 * without the setgid bit (the root is the caller's, of its own group). */
Test(trust, a_member_saves_in_projects_shared_by_acl_or_group_mode)
{
    need_root();
    cr_assert_eq(chmod(tc_root, 0755), 0);
    char acl_proj[4096], acl_root[4096], grp_proj[4096], grp_root[4096];
    snprintf(acl_proj, sizeof acl_proj, "%s/aclproj", tc_root);
    snprintf(acl_root, sizeof acl_root, "%s/aclproj/run", tc_root);
    snprintf(grp_proj, sizeof grp_proj, "%s/grpproj", tc_root);
    snprintf(grp_root, sizeof grp_root, "%s/grpproj/run", tc_root);
    cr_assert_eq(mkdir(acl_proj, 0750), 0);
    /* user::rwx group::r-x group:users:rwx mask::rwx other::--- , access
     * and default */
    struct { uint16_t tag, perm; uint32_t id; } e[5] = {
        {0x01, 7, 0xffffffffu}, {0x04, 5, 0xffffffffu}, {0x08, 7, (uint32_t)shared_gid()},
        {0x10, 7, 0xffffffffu}, {0x20, 0, 0xffffffffu}};
    unsigned char buf[4 + sizeof e];
    uint32_t version = 2;
    memcpy(buf, &version, 4);
    memcpy(buf + 4, e, sizeof e);
    if (setxattr(acl_proj, "system.posix_acl_access", buf, sizeof buf, 0) != 0)
        cr_skip_test("this file system keeps no POSIX ACLs");
    cr_assert_eq(setxattr(acl_proj, "system.posix_acl_default", buf, sizeof buf, 0), 0);
    member_save a = {acl_root, 1};
    as_member("a root made in a project shared by an ACL", member_saves, &a);
    ckpt_store *st = NULL; /* the owner of the project (root here) saves next */
    cr_assert_eq(open_flags(acl_root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    ckpt_store_free(st);
    member_save a2 = {acl_root, 2};
    as_member("the member again", member_saves, &a2);

    cr_assert_eq(mkdir(grp_proj, 0770), 0);
    cr_assert_eq(chown(grp_proj, 0, shared_gid()), 0);
    cr_assert_eq(chmod(grp_proj, 0770), 0);
    member_save g = {grp_root, 1};
    as_member("a root made in a group-writable project directory", member_saves, &g);
}

/* A shared root whose default ACL (what entries made in it inherit) lets a
 * stranger write: every step a member saved there went to the stranger
 * too (to read, remove, lock), and the member's own restore then skipped
 * them all.  The writer refuses such a root, naming the default ACL. */
Test(trust, a_default_acl_naming_a_stranger_is_refused)
{
    need_root();
    cr_assert_eq(chmod(tc_root, 0755), 0);
    char root[4096];
    snprintf(root, sizeof root, "%s/run", tc_root);
    cr_assert_eq(mkdir(root, 0770), 0);
    cr_assert_eq(chown(root, 0, shared_gid()), 0);
    cr_assert_eq(chmod(root, 02770), 0);
    struct { uint16_t tag, perm; uint32_t id; } e[5] = {
        {0x01, 7, 0xffffffffu}, {0x02, 7, OTHER_UID}, {0x04, 7, 0xffffffffu},
        {0x10, 7, 0xffffffffu}, {0x20, 0, 0xffffffffu}};
    unsigned char buf[4 + sizeof e];
    uint32_t version = 2;
    memcpy(buf, &version, 4);
    memcpy(buf + 4, e, sizeof e);
    if (setxattr(root, "system.posix_acl_default", buf, sizeof buf, 0) != 0)
        cr_skip_test("this file system keeps no POSIX ACLs");
    const char *a[2] = {root, "default POSIX ACL"};
    as_member("a default ACL naming a stranger", writer_refused, a);
}

/* A member whose primary group is its own (or shared with users outside
 * the project) saving into a shared root without the setgid bit: its
 * steps took its primary group, group-writable, so every member's restore
 * refused them (and that group's other users could have written them).
 * What the writer makes there gets the root's group. */
static void member_step_has_root_group(char *msg, size_t n, void *arg)
{
    member_saves(msg, n, arg);
    if (strcmp(msg, "ok") != 0)
        return;
    const member_save *a = arg;
    char step[4096], shard[4200];
    snprintf(step, sizeof step, "%s/step-%012lld", a->root, (long long)a->step);
    snprintf(shard, sizeof shard, "%s/rank-00000.shard", step);
    struct stat d, f;
    if (stat(step, &d) != 0 || stat(shard, &f) != 0)
        snprintf(msg, n, "no step %lld", (long long)a->step);
    else if (d.st_gid != shared_gid() || f.st_gid != shared_gid() || !(d.st_mode & S_ISGID))
        snprintf(msg, n, "step gid %u (mode %04o), shard gid %u, want gid %u",
                 (unsigned)d.st_gid, (unsigned)(d.st_mode & 07777), (unsigned)f.st_gid,
                 (unsigned)shared_gid());
}

Test(trust, a_members_steps_take_the_roots_group)
{
    need_root();
    cr_assert_eq(chmod(tc_root, 0755), 0);
    char root[4096];
    snprintf(root, sizeof root, "%s/shared", tc_root);
    cr_assert_eq(mkdir(root, 0770), 0);
    cr_assert_eq(chown(root, 0, shared_gid()), 0);
    cr_assert_eq(chmod(root, 0770), 0); /* no setgid bit */
    member_save a = {root, 1};
    as_member("a member saving into a root without setgid", member_step_has_root_group, &a);
}

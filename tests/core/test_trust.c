/* Whose checkpoints are used (lib/io/trust.h): a root or step that another
 * user owns or may write is refused for writing and skipped, with the
 * reason, on restore; links of others on the way are not followed.
 * Also: files are not readable by other users, the command line can be
 * left out of the environment record, and a step re-saved while readers
 * restore it never gives them a mix of the two.  Groups, ACLs and roots
 * shared by a trusted group: test_trust_groups.c.  Changing owners needs
 * root (CI runs as root); those tests skip otherwise. */
#include "trust_util.h"

TestSuite(trust, .init = tc_setup, .fini = tc_teardown, .timeout = 120);

Test(trust, a_world_writable_root_is_refused_even_when_trusting_the_group)
{
    cr_assert_eq(chmod(tc_root, 0777), 0);
    ckpt_store *st;
    assert_refused(open_flags(tc_root, 0, &st), "writer", "chmod o-w");
    assert_refused(open_flags(tc_root, CKPT_OPEN_TRUST_GROUP, &st), "trusting writer",
                   "writable by every user");
    assert_refused(open_flags(tc_root, CKPT_OPEN_READONLY, &st), "reader", "o-w");
    cr_assert_eq(tc_count_prefix(tc_root, ".lock"), 0, "a refused writer created its lock");
    /* A shared scratch directory (sticky, like /tmp) is not to be opened up
     * or closed: the advice is a directory of one's own inside it. */
    cr_assert_eq(chmod(tc_root, 01777), 0);
    assert_refused(open_flags(tc_root, CKPT_OPEN_READONLY, &st), "sticky",
                   "use a directory of your own inside it");
    cr_assert_null(strstr(ckpt_error_last(), "chmod o-w"), "%s", ckpt_error_last());
}

Test(trust, a_group_writable_root_needs_the_group_trusted)
{
    need_root();
    cr_assert_eq(chown(tc_root, 0, shared_gid()), 0);
    cr_assert_eq(chmod(tc_root, 0770), 0);
    ckpt_store *st;
    assert_refused(open_flags(tc_root, 0, &st), "writer", "CKPT_OPEN_TRUST_GROUP");
    cr_assert_eq(open_flags(tc_root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    tc_state s;
    tc_state_standard(&s, 1);
    tc_save_ok(st, 1, &s);
    tc_restore_check(st, 1, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
}

Test(trust, a_root_of_another_user_is_not_written)
{
    need_root();
    cr_assert_eq(chown(tc_root, OTHER_UID, OTHER_UID), 0);
    ckpt_store *st;
    assert_refused(open_flags(tc_root, 0, &st), "writer", "uid 65534");
    cr_assert_eq(tc_count_prefix(tc_root, ".lock"), 0, "a refused writer created its lock");
    /* reading another user's checkpoints is fine: they own what they wrote */
    cr_assert_eq(open_flags(tc_root, CKPT_OPEN_READONLY, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    ckpt_store_free(st);
    cr_assert_eq(open_flags(tc_root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    ckpt_store_free(st);
}

/* The superuser runs an admin's gc trusting the group over a user's root
 * (docs/OPERATIONS.md): the user's lock file keeps its private mode (0660
 * would let the group hold the lock and block the user's writer), and the
 * event log the gc writes is the user's, not root's (a root:root 0660 file
 * the user could never open again). */
Test(trust, an_admins_gc_leaves_a_users_lock_private_and_the_log_theirs)
{
    need_root();
    char lock[4096], log[4096];
    snprintf(lock, sizeof lock, "%s/.lock", tc_root);
    snprintf(log, sizeof log, "%s/ckpt-events.jsonl", tc_root);
    int fd = open(lock, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0, "%s", strerror(errno));
    cr_assert_eq(fchown(fd, OTHER_UID, OTHER_UID), 0);
    close(fd);
    cr_assert_eq(chown(tc_root, OTHER_UID, OTHER_UID), 0);
    mode_t old = umask(022);
    ckpt_store *st;
    int rc = open_flags(tc_root, CKPT_OPEN_TRUST_GROUP, &st);
    if (rc == CKPT_OK) {
        rc = ckpt_store_gc(st, 1, 0, NULL);
        ckpt_store_free(st);
    }
    umask(old);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    struct stat sb;
    cr_assert_eq(stat(lock, &sb), 0);
    cr_expect_eq(sb.st_mode & 0777, 0600, "the user's lock made %04o",
                 (unsigned)(sb.st_mode & 0777));
    cr_expect_eq(sb.st_uid, OTHER_UID);
    cr_assert_eq(stat(log, &sb), 0, "no event log written by the gc");
    cr_expect_eq(sb.st_uid, OTHER_UID, "the event log belongs to uid %u",
                 (unsigned)sb.st_uid);
}

/* The superuser's writer (an admin's gc trusting the group) in a user's
 * root where the user moved in a file of root's (one that sat in a
 * directory of theirs) as the lock file or the event log: writing the lock
 * note or an event would change root's file, and handing it to the root's
 * owner (as a lock file root just made is) would give it to them.  The
 * lock file is refused, naming it; the event log is left out; both keep
 * their bytes, owner and mode. */
Test(trust, an_admins_gc_neither_writes_nor_hands_over_a_file_of_roots_moved_in)
{
    need_root();
    char lock[4096], log[4096], buf[64] = "";
    snprintf(lock, sizeof lock, "%s/.lock", tc_root);
    snprintf(log, sizeof log, "%s/ckpt-events.jsonl", tc_root);
    tc_write_file(lock, "ROOT'S FILE\n", 12);
    cr_assert_eq(chmod(lock, 0600), 0);
    cr_assert_eq(chown(tc_root, OTHER_UID, OTHER_UID), 0);
    ckpt_store *st;
    int rc = open_flags(tc_root, CKPT_OPEN_TRUST_GROUP, &st);
    cr_assert_eq(rc, CKPT_EACCES, "%s: %s", ckpt_status_name(rc), ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), lock) && strstr(ckpt_error_last(), "belongs to root"),
              "%s", ckpt_error_last());
    struct stat sb;
    cr_assert_eq(stat(lock, &sb), 0);
    cr_expect(sb.st_uid == 0 && (sb.st_mode & 0777) == 0600 && sb.st_size == 12,
              "the lock file: uid %u, mode %04o, %lld bytes", (unsigned)sb.st_uid,
              (unsigned)(sb.st_mode & 0777), (long long)sb.st_size);
    int fd = open(lock, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_expect_eq(read(fd, buf, sizeof buf - 1), 12);
    close(fd);
    cr_expect_str_eq(buf, "ROOT'S FILE\n");

    cr_assert_eq(rename(lock, log), 0); /* now as the event log */
    rc = open_flags(tc_root, CKPT_OPEN_TRUST_GROUP, &st);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_store_gc(st, 1, 0, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    cr_assert_eq(stat(log, &sb), 0);
    cr_expect(sb.st_uid == 0 && (sb.st_mode & 0777) == 0600 && sb.st_size == 12,
              "the event log: uid %u, mode %04o, %lld bytes", (unsigned)sb.st_uid,
              (unsigned)(sb.st_mode & 0777), (long long)sb.st_size);
    cr_assert_eq(stat(lock, &sb), 0, "the writer made no lock file of its own");
    cr_expect_eq(sb.st_uid, OTHER_UID, "the lock file it made belongs to uid %u",
                 (unsigned)sb.st_uid);
}

static void mkdir_owned(const char *path, uid_t uid)
{
    cr_assert_eq(mkdir(path, 0755), 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(chown(path, uid, uid), 0);
}

/* The user moves a directory of theirs that holds one of root's (which
 * they may not empty) into their root as a stale temporary, or into a
 * step that retention retires: the superuser's gc would delete root's
 * directory for them.  Both are left in place; a stale temporary of the
 * user's alone, and a step without one, go as before. */
Test(trust, an_admins_gc_leaves_a_tree_holding_a_directory_of_roots)
{
    need_root();
    char root[2048], p[4096];
    snprintf(root, sizeof root, "%.2000s/r", tc_root);
    ckpt_store *st = tc_open(root);
    tc_state s;
    tc_state_init(&s);
    tc_state_standard(&s, 7);
    for (int64_t step = 1; step <= 3; step++)
        tc_save_ok(st, step, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
    chown_tree(root, OTHER_UID, OTHER_UID);
    snprintf(p, sizeof p, "%s/.tmp-step-000000000009-1-1", root); /* holds root's */
    mkdir_owned(p, OTHER_UID);
    snprintf(p, sizeof p, "%s/.tmp-step-000000000009-1-1/admin-data", root);
    mkdir_owned(p, 0);
    snprintf(p, sizeof p, "%s/.tmp-step-000000000009-1-1/admin-data/quota.db", root);
    tc_write_file(p, "quota\n", 6);
    snprintf(p, sizeof p, "%s/.tmp-step-000000000008-1-1", root); /* the user's alone */
    mkdir_owned(p, OTHER_UID);
    snprintf(p, sizeof p, "%s/step-000000000001/admin-data", root);
    mkdir_owned(p, 0);
    /* a third user's directory the owner moved in (from a project
     * directory where the owner may rename): not the owner's to delete,
     * so not root's either (uid 65533 is no member of the root's group) */
    snprintf(p, sizeof p, "%s/.tmp-step-000000000007-1-1", root);
    mkdir_owned(p, 65533);
    snprintf(p, sizeof p, "%s/.tmp-step-000000000007-1-1/theirs", root);
    tc_write_file(p, "bob\n", 4);
    cr_assert_eq(open_flags(root, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_store_gc(st, 1, 0, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    struct stat sb;
    snprintf(p, sizeof p, "%s/.tmp-step-000000000009-1-1/admin-data/quota.db", root);
    cr_expect_eq(stat(p, &sb), 0, "root's file in a stale temporary was deleted");
    snprintf(p, sizeof p, "%s/step-000000000001/admin-data", root);
    cr_expect_eq(stat(p, &sb), 0, "root's directory in a retired step was deleted");
    snprintf(p, sizeof p, "%s/.tmp-step-000000000008-1-1", root);
    cr_expect_neq(stat(p, &sb), 0, "the user's own stale temporary was left");
    snprintf(p, sizeof p, "%s/.tmp-step-000000000007-1-1/theirs", root);
    cr_expect_eq(stat(p, &sb), 0, "a third user's file moved in was deleted by root");
    snprintf(p, sizeof p, "%s/step-000000000002", root);
    cr_expect_neq(stat(p, &sb), 0, "step 2 (nothing of root's in it) was not retired");
    snprintf(p, sizeof p, "%s/step-000000000003", root);
    cr_expect_eq(stat(p, &sb), 0, "the newest step is gone");
}

/* The superuser saving into a user's root (an admin's job, trusting the
 * group): the directories it makes are handed to the root's owner, so its
 * retired steps go as anyone's do (a step directory of root's would be
 * left in place, layout_holds_superusers_dir) and the owner can remove
 * them; its files too, with the root's group, so that the owner (with no
 * group to trust: a reader's default) restores them. */
Test(trust, the_superusers_saves_in_a_users_root_are_retired_and_theirs)
{
    need_root();
    char root[2048], p[4096];
    snprintf(root, sizeof root, "%.2000s/r", tc_root);
    cr_assert_eq(mkdir(root, 0750), 0);
    cr_assert_eq(chown(root, OTHER_UID, OTHER_UID), 0);
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = CKPT_OPEN_TRUST_GROUP;
    o.keep_last = 1;
    ckpt_store *st;
    cr_assert_eq(ckpt_store_open(&st, root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_init(&s);
    tc_state_standard(&s, 3);
    for (int64_t step = 1; step <= 3; step++)
        tc_save_ok(st, step, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
    struct stat sb;
    for (int64_t step = 1; step <= 2; step++) {
        snprintf(p, sizeof p, "%s/step-%012lld", root, (long long)step);
        cr_expect_neq(stat(p, &sb), 0, "step %lld was not retired", (long long)step);
    }
    snprintf(p, sizeof p, "%s/step-000000000003", root);
    cr_assert_eq(stat(p, &sb), 0);
    cr_expect_eq(sb.st_uid, OTHER_UID, "the step directory belongs to uid %u",
                 (unsigned)sb.st_uid);
    /* and so does every file in it, with the root's group: the owner
     * restores the step (they could not read a file of root's, 0640) */
    DIR *d = opendir(p);
    cr_assert(d);
    for (struct dirent *e; (e = readdir(d));) {
        char f[4400];
        snprintf(f, sizeof f, "%s/%s", p, e->d_name);
        cr_assert_eq(lstat(f, &sb), 0);
        cr_expect(sb.st_uid == OTHER_UID && sb.st_gid == OTHER_UID,
                  "%s belongs to uid %u gid %u", f, (unsigned)sb.st_uid, (unsigned)sb.st_gid);
    }
    closedir(d);
    cr_assert_eq(chmod(tc_root, 0711), 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(OTHER_UID) || setuid(OTHER_UID))
            _exit(10);
        tc_state want;
        tc_state_init(&want);
        tc_state_standard(&want, 3);
        ckpt_store *ro = NULL;
        if (open_flags(root, CKPT_OPEN_READONLY, &ro) != CKPT_OK)
            _exit(11);
        tc_state got;
        tc_state_like(&got, &want, 0xA5);
        ckpt_report *rep = NULL;
        int rc = ckpt_restore(ro, CKPT_LATEST, got.t, got.count, NULL, &rep);
        int same = rc == CKPT_OK && ckpt_report_step(rep) == 3;
        for (size_t i = 0; same && i < got.count; i++)
            same = !memcmp(got.t[i].data, want.t[i].data, (size_t)want.t[i].bytes);
        if (!same)
            fprintf(stderr, "the owner's restore: %s: %s\n", ckpt_status_name(rc),
                    ckpt_error_last());
        ckpt_report_free(rep);
        ckpt_store_free(ro);
        tc_state_free(&got);
        tc_state_free(&want);
        _exit(same ? 0 : 12);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the root's owner could not restore root's step (child: %d)", status);
}

/* A symbolic link planted by another user in a shared sticky directory
 * (as in /tmp) where a job's root would be: a writer refuses to follow it,
 * naming the link and its owner, and writes nothing where it points, even
 * to a directory of the caller's own (or, under root, to /etc); a link of
 * the caller's own is followed; a reader may follow either. */
Test(trust, a_link_of_another_user_on_the_way_to_the_root_is_not_followed)
{
    need_root();
    char *shared = tc_join(tc_root, "scratch"), *target = tc_join(tc_root, "mine");
    char *planted = tc_join(shared, "job"), *mine = tc_join(shared, "job2");
    char *below = tc_join(planted, "sub");
    cr_assert_eq(mkdir(shared, 01777), 0);
    cr_assert_eq(chmod(shared, 01777), 0);
    cr_assert_eq(mkdir(target, 0750), 0);
    cr_assert_eq(symlink(target, planted), 0);
    cr_assert_eq(lchown(planted, OTHER_UID, OTHER_UID), 0);
    ckpt_store *st;
    const char *paths[] = {planted, below};
    for (int i = 0; i < 2; i++) {
        assert_refused(open_flags(paths[i], 0, &st), paths[i], "uid 65534");
        cr_assert(strstr(ckpt_error_last(), planted), "%s", ckpt_error_last());
        assert_refused(open_flags(paths[i], CKPT_OPEN_TRUST_GROUP, &st), paths[i],
                       "symbolic link");
    }
    cr_assert_eq(tc_count_prefix(target, ""), 0, "a refused writer created something");
    cr_assert_eq(open_flags(planted, CKPT_OPEN_READONLY, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    ckpt_store_free(st);

    cr_assert_eq(symlink("../mine", mine), 0); /* the caller's own link */
    cr_assert_eq(open_flags(mine, 0, &st), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_str_eq(ckpt_store_path(st), target);
    ckpt_store_free(st);

    /* Another user's link in that user's own directory, which no one else
     * may write (a colleague's "current -> run42"), is followed: it gives
     * that user no say they lack over paths through their directory.  The
     * superuser (these tests' caller) follows it only into that user's own
     * root: into anyone else's (here root's own `mine`; an admin's
     * `ckpt gc --trust-group` of "their run" leading to a third user's
     * root) it would retire steps the link's owner could never touch. */
    char *theirs = tc_join(tc_root, "theirs"), *current = tc_join(theirs, "current");
    char *run42 = tc_join(theirs, "run42");
    cr_assert_eq(mkdir(theirs, 0755), 0);
    cr_assert_eq(mkdir(run42, 0750), 0);
    cr_assert_eq(chown(run42, OTHER_UID, OTHER_UID), 0);
    cr_assert_eq(symlink(target, current), 0);
    cr_assert_eq(lchown(current, OTHER_UID, OTHER_UID), 0);
    cr_assert_eq(chown(theirs, OTHER_UID, OTHER_UID), 0);
    char *before = tc_tree_snapshot(target);
    for (int tg = 0; tg <= 1; tg++) {
        assert_refused(open_flags(current, tg ? CKPT_OPEN_TRUST_GROUP : 0, &st),
                       "only into that user's own root", "symbolic link");
        cr_assert(strstr(ckpt_error_last(), "uid 65534"), "%s", ckpt_error_last());
    }
    char *after = tc_tree_snapshot(target);
    cr_assert_str_eq(after, before, "a refused writer changed the root it was sent to");
    free(before);
    free(after);
    cr_assert_eq(unlink(current), 0);
    cr_assert_eq(symlink(run42, current), 0);
    cr_assert_eq(lchown(current, OTHER_UID, OTHER_UID), 0);
    /* (the superuser writes another user's root only trusting the group) */
    cr_assert_eq(open_flags(current, CKPT_OPEN_TRUST_GROUP, &st), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_str_eq(ckpt_store_path(st), run42);
    ckpt_store_free(st);
    cr_assert_eq(open_flags(current, CKPT_OPEN_READONLY, &st), CKPT_OK); /* reading: any */
    ckpt_store_free(st);
    /* nor does it create a root through their link: it would be root's,
     * wherever they point the link */
    char *fresh = tc_join(current, "newrun"), *made = tc_join(run42, "newrun");
    assert_refused(open_flags(fresh, CKPT_OPEN_TRUST_GROUP, &st), "a new root",
                   "creates no root through another user's link");
    cr_assert_neq(access(made, F_OK), 0, "root created %s", made);
    free(fresh);
    free(made);
    cr_assert_eq(chmod(theirs, 0775), 0); /* unless their group may plant it */
    assert_refused(open_flags(current, 0, &st), "group-writable", "symbolic link");
    free(run42);
    free(theirs);
    free(current);
    free(shared);
    free(target);
    free(planted);
    free(mine);
    free(below);
}

/* Step 3 planted by another user (a copy of a real step, so every checksum
 * holds): restore(LATEST) takes step 2 and reports step 3 with the reason;
 * asking for step 3 is refused; trusting the group accepts it. */
Test(trust, a_step_planted_by_another_user_is_never_restored)
{
    need_root();
    ckpt_store *st = tc_open(tc_root);
    tc_state s1, s2;
    tc_state_standard(&s1, 1);
    tc_state_standard(&s2, 2);
    tc_save_ok(st, 1, &s1);
    tc_save_ok(st, 2, &s2);
    ckpt_store_free(st);
    /* a real step 3, written elsewhere (every checksum holds), moved in */
    char *elsewhere = tc_mkdtemp();
    ckpt_store *other = tc_open(elsewhere);
    tc_save_ok(other, 3, &s1);
    ckpt_store_free(other);
    char *src = tc_step_dir(elsewhere, 3), *d2 = tc_step_dir(tc_root, 2),
         *d3 = tc_step_dir(tc_root, 3);
    cr_assert_eq(rename(src, d3), 0);
    tc_rmtree(elsewhere);
    free(elsewhere);
    free(src);
    char *m3 = NULL;
    chown_tree(d3, OTHER_UID, OTHER_UID);

    st = tc_open_ro(tc_root);
    tc_state got;
    tc_state_like(&got, &s2, 0);
    ckpt_report *rep = NULL;
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_report_step(rep), 2);
    tc_assert_state_eq(&got, &s2, "restore next to a planted step");
    int seen = 0;
    for (size_t i = 0; i < ckpt_report_count(rep); i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        if (p->step == 3) {
            seen = 1;
            cr_assert_eq(p->status, CKPT_EACCES);
            cr_assert(strstr(p->message, "belongs to uid 65534"), "%s", p->message);
        }
    }
    cr_assert(seen, "the planted step is not reported");
    ckpt_report_free(rep);
    int64_t latest = -1;
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_FULL, &latest), CKPT_OK);
    cr_assert_eq(latest, 2);
    assert_refused(ckpt_verify(st, 3, CKPT_VERIFY_QUICK, NULL), "verify(3)", "belongs to");
    ckpt_store_free(st);

    /* a writer never retires it either: it is not ours to delete */
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 1;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK);
    cr_assert_eq(ckpt_store_gc(st, 1, 0, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert(tc_exists(d3), "gc removed another user's directory");
    ckpt_store_free(st);

    cr_assert_eq(open_flags(tc_root, CKPT_OPEN_READONLY | CKPT_OPEN_TRUST_GROUP, &st),
                 CKPT_OK);
    cr_assert_eq(ckpt_verify(st, 3, CKPT_VERIFY_FULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    free(m3);
    free(d2);
    free(d3);
    tc_state_free(&got);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* Retention retires old steps without reading them, but never one holding
 * anything of another user's: a foreign shard, or any foreign file. */
Test(trust, retention_never_retires_a_step_holding_a_foreign_file)
{
    need_root();
    ckpt_store_options o;
    tc_opts(&o);
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK);
    tc_state s;
    tc_state_standard(&s, 1);
    for (int64_t step = 1; step <= 3; step++)
        tc_save_ok(st, step, &s);
    ckpt_store_free(st);
    char *d1 = tc_step_dir(tc_root, 1), *d2 = tc_step_dir(tc_root, 2);
    char shard[4096], note[4096];
    snprintf(shard, sizeof shard, "%s/rank-00000.shard", d1);
    cr_assert_eq(chown(shard, OTHER_UID, OTHER_UID), 0); /* a shard not ours */
    snprintf(note, sizeof note, "%s/notes.txt", d2);
    FILE *f = fopen(note, "w");
    cr_assert(f && fputs("not yours\n", f) >= 0 && fclose(f) == 0);
    cr_assert_eq(chown(note, OTHER_UID, OTHER_UID), 0); /* an extra file not ours */

    o.keep_last = 1;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK);
    tc_save_ok(st, 4, &s); /* keeps 4; 3 goes, 1 and 2 are not ours to delete */
    const int64_t left[] = {1, 2, 4};
    tc_assert_steps(st, left, 3);
    cr_assert(tc_exists(shard) && tc_exists(note), "retention deleted another user's file");
    ckpt_store_free(st);
    free(d1);
    free(d2);
    tc_state_free(&s);
}

Test(trust, a_step_others_may_write_is_skipped)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state s;
    tc_state_standard(&s, 1);
    tc_save_ok(st, 1, &s);
    tc_save_ok(st, 2, &s);
    char *d2 = tc_step_dir(tc_root, 2);
    cr_assert_eq(chmod(d2, 0757), 0);
    int64_t latest = -1;
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest), CKPT_OK);
    cr_assert_eq(latest, 1, "a world-writable step was chosen");
    assert_refused(ckpt_verify(st, 2, CKPT_VERIFY_QUICK, NULL), "verify(2)", "o-w");
    ckpt_store_free(st);
    free(d2);
    tc_state_free(&s);
}

/* ---------------------------------------------- privacy of what is saved */

static json_t *manifest_of(int64_t step)
{
    char *d = tc_step_dir(tc_root, step), *m = tc_join(d, "manifest.json");
    json_error_t err;
    json_t *j = json_load_file(m, 0, &err);
    cr_assert(j, "%s: %s", m, err.text);
    free(m);
    free(d);
    return j;
}

Test(trust, files_are_not_readable_by_other_users)
{
    umask(022);
    ckpt_store *st = tc_open(tc_root);
    tc_state s;
    tc_state_standard(&s, 1);
    tc_save_ok(st, 1, &s);
    ckpt_store_free(st);
    char *d = tc_step_dir(tc_root, 1), *m = tc_join(d, "manifest.json");
    char *sh = tc_find_suffix(d, ".shard");
    struct stat a, b, c;
    cr_assert(stat(d, &a) == 0 && stat(m, &b) == 0 && sh && stat(sh, &c) == 0);
    cr_assert_eq(a.st_mode & 07, 0, "step directory mode %o", a.st_mode & 0777);
    cr_assert_eq(b.st_mode & 07, 0, "manifest mode %o", b.st_mode & 0777);
    cr_assert_eq(c.st_mode & 07, 0, "shard mode %o", c.st_mode & 0777);
    free(sh);
    free(m);
    free(d);
    tc_state_free(&s);
}

Test(trust, the_command_line_can_be_left_out)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    ckpt_store_free(st);
    cr_assert_eq(open_flags(tc_root, CKPT_OPEN_NO_CMDLINE, &st), CKPT_OK);
    tc_save_ok(st, 2, &s);
    ckpt_store_free(st);
    json_t *m1 = manifest_of(1), *m2 = manifest_of(2);
    const char *c1 = json_string_value(json_object_get(json_object_get(m1, "env"),
                                                       "command_line"));
    const char *c2 = json_string_value(json_object_get(json_object_get(m2, "env"),
                                                       "command_line"));
    cr_assert(c1 && *c1 && strcmp(c1, "(not recorded)") != 0, "default record: %s",
              c1 ? c1 : "none");
    cr_assert(c2 && strcmp(c2, "(not recorded)") == 0, "left out, yet recorded: %s", c2);
    json_decref(m1);
    json_decref(m2);
    tc_state_free(&s);
}

/* ------------------------------------------------- re-save under readers */

typedef struct race {
    ckpt_store *st;
    const tc_state *a, *b;
    int stop, reads, bad;
    char why[512];
} race;

static void *race_reader(void *p)
{
    race *r = p;
    tc_state got;
    tc_state_like(&got, r->a, 0);
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        int rc = ckpt_restore(r->st, 5, got.t, got.count, NULL, NULL);
        int same_a = 1, same_b = 1;
        for (size_t i = 0; rc == CKPT_OK && i < got.count; i++) {
            same_a &= memcmp(got.t[i].data, r->a->t[i].data, (size_t)got.t[i].bytes) == 0;
            same_b &= memcmp(got.t[i].data, r->b->t[i].data, (size_t)got.t[i].bytes) == 0;
        }
        if (rc != CKPT_OK || !(same_a || same_b)) {
            __atomic_add_fetch(&r->bad, 1, __ATOMIC_RELEASE);
            snprintf(r->why, sizeof r->why, "%s: %s",
                     rc ? ckpt_status_name(rc) : "a mix of two saves", ckpt_error_last());
            break;
        }
        __atomic_add_fetch(&r->reads, 1, __ATOMIC_RELEASE);
    }
    tc_state_free(&got);
    return NULL;
}

/* One writer re-saves step 5 over and over while another process-like
 * reader (its own read-only store) restores it: every restore gives one
 * save or the other, never an error from reading halves of both. */
Test(trust, resaving_a_step_under_readers)
{
    tc_state a, b;
    tc_state_standard(&a, 1);
    tc_state_standard(&b, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 5, &a);
    race r = {tc_open_ro(tc_root), &a, &b, 0, 0, 0, ""};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, race_reader, &r), 0);
    /* At least 150 re-saves, and on until the reader (which a loaded
     * machine may starve) has restored 20 times. */
    for (int i = 0; (i < 150 || __atomic_load_n(&r.reads, __ATOMIC_ACQUIRE) < 20) &&
                    !__atomic_load_n(&r.bad, __ATOMIC_ACQUIRE) && i < 1000000;
         i++)
        tc_save_ok(w, 5, i % 2 ? &a : &b);
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    cr_assert_eq(r.bad, 0, "after %d good reads: %s", r.reads, r.why);
    cr_assert(r.reads >= 20, "only %d reads", r.reads);
    ckpt_store_free(r.st);
    ckpt_store_free(w);
    tc_state_free(&a);
    tc_state_free(&b);
}

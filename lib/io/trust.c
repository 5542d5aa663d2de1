/* trust: ownership and permission rules for shared servers (trust.h). */
#include "trust.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "util.h"

int trust_caller_in_group(unsigned gid)
{
    if ((unsigned)getegid() == gid)
        return 1;
    int n = getgroups(0, NULL);
    if (n <= 0)
        return 0;
    gid_t *g = malloc((size_t)n * sizeof *g);
    int found = 0;
    if (g && (n = getgroups(n, g)) > 0)
        for (int i = 0; i < n && !found; i++)
            found = (unsigned)g[i] == gid;
    free(g);
    return found;
}

/* Is user `uid` a member of group `gid`: every group the system's
 * databases give the user (getgrouplist: its primary group, the groups
 * listing it, through NSS, LDAP included), however many. */
static int user_in_group(unsigned uid, unsigned gid)
{
    struct passwd pw, *pres = NULL;
    char b1[4096];
    if (getpwuid_r((uid_t)uid, &pw, b1, sizeof b1, &pres) != 0 || !pres)
        return 0;
    if ((unsigned)pw.pw_gid == gid)
        return 1;
    int n = 64, found = 0;
    for (int tries = 0; tries < 8; tries++) {
        gid_t *g = malloc((size_t)n * sizeof *g);
        if (!g)
            return 0;
        int want = n;
        int rc = getgrouplist(pw.pw_name, pw.pw_gid, g, &want);
        if (rc >= 0)
            for (int i = 0; i < want && !found; i++)
                found = (unsigned)g[i] == gid;
        free(g);
        if (rc >= 0)
            return found;
        n = want > n ? want : 2 * n; /* too small: the size it needs */
    }
    return 0;
}

static void add_gid(trust *t, unsigned gid, int writing)
{
    for (int i = 0; i < t->ngids; i++)
        if (t->gids[i] == gid)
            return;
    if (t->ngids < (int)(sizeof t->gids / sizeof t->gids[0]) &&
        (!writing || trust_caller_in_group(gid)))
        t->gids[t->ngids++] = gid;
}

void trust_init(trust *t, const fsio_info *root, int group, int writing)
{
    t->self = (unsigned)geteuid();
    t->root_uid = root->uid;
    t->group = group;
    t->any = group && t->self == 0;
    t->ngids = 0;
    if (!group || t->any)
        return;
    add_gid(t, root->gid, writing);
    for (int i = 0; i < root->acl_nnamed; i++)
        if (root->acl_named[i].group)
            add_gid(t, root->acl_named[i].id, writing);
}

/* Does trusting the group cover group `gid` / user `uid`? */
static int group_trusted(const trust *t, unsigned gid)
{
    if (t->any)
        return 1;
    for (int i = 0; i < t->ngids; i++)
        if (t->gids[i] == gid)
            return 1;
    return 0;
}

static int member_trusted(const trust *t, unsigned uid)
{
    if (t->any)
        return 1;
    if (!t->ngids)
        return 0;
    if (uid == t->self || uid == 0)
        return 1;
    for (int i = 0; i < t->ngids; i++)
        if (user_in_group(uid, t->gids[i]))
            return 1;
    return 0;
}

/* Are the named writers of `in`'s POSIX ACL all covered by trusting the
 * group?  `caller_groups`: also groups the caller is a member of (a
 * directory above the root, shared with a group of the caller's). */
static int named_trusted(const trust *t, int nnamed, const fsio_acl_entry *named,
                         int caller_groups)
{
    if (t->any)
        return 1;
    if (!t->group || nnamed < 0)
        return 0;
    for (int i = 0; i < nnamed; i++) {
        unsigned id = named[i].id;
        if (named[i].group ? !(group_trusted(t, id) ||
                               (caller_groups && trust_caller_in_group(id)))
                           : !member_trusted(t, id))
            return 0;
    }
    return 1;
}

static int acl_trusted(const trust *t, const fsio_info *in, int caller_groups)
{
    return named_trusted(t, in->acl_nnamed, in->acl_named, caller_groups);
}

/* May the owning group of `in` write it (its ACL entry when it has an
 * ACL, whose mask the mode's group bits show)? */
static int group_may_write(const fsio_info *in)
{
    return in->acl_present ? in->acl_group_w : (in->mode & 0020) != 0;
}

/* Why trusting the group did not cover a group (for messages). */
static const char *not_the_group(const trust *t)
{
    return !t->group ? "" : t->ngids ? " (trusting the group covers the root's groups, its "
                                       "own and those its ACL lets write, and their members "
                                       "only)"
                                     : " (trusting the group covers the root's groups, "
                                       "of none of which you are a member)";
}

static void user_name(unsigned uid, char *buf, size_t size)
{
    struct passwd pw, *res = NULL;
    char tmp[4096];
    if (getpwuid_r((uid_t)uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, size, "uid %u (%s)", uid, pw.pw_name);
    else
        snprintf(buf, size, "uid %u", uid);
}

/* 1 when a local account (/etc/passwd) other than `uid` has `gid` as its
 * primary group: such members are not listed in the group entry.  Only
 * the local file is read: enumerating a directory service (LDAP) on every
 * open would cost too much on a large site, and its users get private
 * groups of their own anyway.  Unreadable: 1 (assume the worst). */
static int other_primary_member(unsigned uid, unsigned gid)
{
    FILE *f = fopen("/etc/passwd", "re");
    if (!f)
        return 1;
    struct passwd pw, *res = NULL;
    char buf[4096];
    int found = 0;
    while (!found && fgetpwent_r(f, &pw, buf, sizeof buf, &res) == 0 && res)
        found = (unsigned)pw.pw_gid == gid && (unsigned)pw.pw_uid != uid;
    fclose(f);
    return found;
}

/* The user-private-group convention (Debian's USERGROUPS_ENAB): a group
 * named as its owner, having no other members (listed, or having it as
 * their primary group), shares nothing when group-writable. */
int trust_private_group(unsigned uid, unsigned gid)
{
    struct passwd pw, *pres = NULL;
    struct group gr, *gres = NULL;
    char b1[4096], b2[4096];
    if (getpwuid_r((uid_t)uid, &pw, b1, sizeof b1, &pres) != 0 || !pres ||
        getgrgid_r((gid_t)gid, &gr, b2, sizeof b2, &gres) != 0 || !gres)
        return 0;
    return (unsigned)pw.pw_gid == gid && strcmp(gr.gr_name, pw.pw_name) == 0 &&
           (!gr.gr_mem || !gr.gr_mem[0]) && !other_primary_member(uid, gid);
}

int trust_owner_removable(unsigned uid, unsigned root_uid, unsigned root_gid)
{
    return uid == root_uid || (uid != 0 && user_in_group(uid, root_gid));
}

/* CKPT_OK unless others may write `in`. */
static int check_mode(const trust *t, const char *path, const fsio_info *in, const char *what)
{
    if (in->mode & 0002) {
        /* Advice the reader can follow: a shared directory such as /tmp
         * (sticky, another owner's) is not to be changed, but a root made
         * inside it, one's own, is. */
        if (in->uid != t->self || (in->mode & 01000))
            return ckpt_seterr(CKPT_EACCES, "%s %s is writable by every user (mode %04o%s): "
                               "anyone could plant or swap checkpoints there; use a "
                               "directory of your own inside it as the root (mkdir -m 700 "
                               "%s/NAME)", what, path, in->mode,
                               in->mode & 01000 ? ", a shared scratch directory" : "", path);
        return ckpt_seterr(CKPT_EACCES, "%s %s is writable by every user (mode %04o): "
                           "anyone could plant or swap checkpoints there; run "
                           "chmod o-w on it", what, path, in->mode);
    }
    if (in->acl_writers && !acl_trusted(t, in, 0))
        return ckpt_seterr(CKPT_EACCES, "%s %s has a POSIX ACL that lets other users or "
                           "groups write it (getfacl lists them): they could plant or swap "
                           "checkpoints there; remove those entries (setfacl -x, or -b for "
                           "all), or trust the group (CKPT_OPEN_TRUST_GROUP, ckpt "
                           "--trust-group, Store(trust_group=True)) if it is shared on "
                           "purpose with the root's group%s", what, path, not_the_group(t));
    /* What entries made in a directory inherit: a default ACL naming a
     * stranger would hand every step saved there to that stranger. */
    if (in->dacl_writers && !named_trusted(t, in->dacl_nnamed, in->dacl_named, 0))
        return ckpt_seterr(CKPT_EACCES, "%s %s has a default POSIX ACL that lets other users "
                           "or groups write what is made in it (getfacl lists them): "
                           "checkpoints saved there would be theirs to change or remove; "
                           "remove those default entries (setfacl -k, or -x d:ENTRY), or "
                           "trust the group (CKPT_OPEN_TRUST_GROUP, ckpt --trust-group, "
                           "Store(trust_group=True)) if they are the root's group and its "
                           "members%s", what, path, not_the_group(t));
    if (group_may_write(in) && !group_trusted(t, in->gid) &&
        !trust_private_group(in->uid, in->gid))
        return ckpt_seterr(CKPT_EACCES, "%s %s is writable by its group (gid %u, mode "
                           "%04o): run chmod g-w on it, or trust the group "
                           "(CKPT_OPEN_TRUST_GROUP, ckpt --trust-group, "
                           "Store(trust_group=True)) if it is a shared project directory%s",
                           what, path, in->gid, in->mode, not_the_group(t));
    return CKPT_OK;
}

int trust_check_root(const trust *t, const char *path, const fsio_info *root, int writing)
{
    if (writing && root->uid != t->self && !member_trusted(t, root->uid)) {
        char owner[128];
        user_name(root->uid, owner, sizeof owner);
        return ckpt_seterr(CKPT_EACCES, "the checkpoint root %s belongs to %s, not to you "
                           "(uid %u): libckpt writes only into its own directories, or "
                           "into a group's shared one when told to trust the group "
                           "(CKPT_OPEN_TRUST_GROUP)%s", path, owner, t->self,
                           !t->group ? ""
                           : t->ngids ? ", and the owner is not a member of the root's "
                                        "groups"
                                         : ", of which you are a member (the root's group, "
                                           "here, is not one of yours)");
    }
    return check_mode(t, path, root, "the checkpoint root");
}

int trust_check_entry(const trust *t, const char *path, const fsio_info *in)
{
    if (in->kind == FSIO_KIND_LINK) /* its mode (0777) says nothing of its target */
        return ckpt_seterr(CKPT_EACCES, "%s is a symbolic link: a checkpoint's files and "
                           "directories are never reached through links", path);
    if (in->uid != t->self && in->uid != t->root_uid && in->uid != 0 &&
        !member_trusted(t, in->uid)) {
        char owner[128];
        user_name(in->uid, owner, sizeof owner);
        return ckpt_seterr(CKPT_EACCES, "%s belongs to %s, who is neither you (uid %u) nor "
                           "the owner of the checkpoint root (uid %u): a checkpoint "
                           "planted by another user is never used (trust the group with "
                           "CKPT_OPEN_TRUST_GROUP if that user shares it with you)%s", path,
                           owner, t->self, t->root_uid, not_the_group(t));
    }
    return check_mode(t, path, in, in->kind == FSIO_KIND_DIR ? "the directory" : "the file");
}

int trust_check_path(const trust *t, const fsio *fs, const char *path)
{
    fsio_info in;
    int rc = fsio_info_of(fs, path, -1, &in);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot stat %s", path);
    return trust_check_entry(t, path, &in);
}

/* Symbolic links followed at most (as the kernel's MAXSYMLINKS). */
#define MAX_LINKS 40

/* May a link that `in` describes, held by the directory `dir`, be followed
 * on the way to a root the caller writes into?  As the kernel's
 * protected_symlinks rule, made strict for directories others may write:
 * a link of the caller or root; or of the owner of a directory that no one
 * else may write (that user decides where paths through it lead anyway).
 * Never a stranger's link in /tmp or a scratch directory, and not a group
 * member's either, trusting the group: the group is trusted with the
 * shared root, and a member's link could lead the caller's writer into a
 * private root of the caller's (restoring another run, retiring its
 * steps) that the member cannot touch. */
static int link_ok(unsigned self, const fsio *fs, const char *dir, const fsio_info *in)
{
    if (in->uid == self || in->uid == 0)
        return 1;
    fsio_info d;
    if (fsio_info_of(fs, dir[0] ? dir : "/", -1, &d) != 0 || (d.mode & 0002))
        return 0;
    return d.uid == in->uid && !(d.mode & 0020);
}

int trust_check_ancestors(const trust *t, const fsio *fs, const char *root)
{
    unsigned self = t->self;
    size_t len = strlen(root);
    char *dir = malloc(len + 2);
    if (!dir)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = CKPT_OK;
    /* Each directory above the root: "/", "/a", "/a/b", ... its parent. */
    for (size_t end = 0; rc == CKPT_OK && len > 1;) {
        size_t cut = end == 0 ? 1 : end;
        memcpy(dir, root, cut);
        dir[cut] = '\0';
        const char *slash = strchr(root + end + 1, '/');
        end = slash ? (size_t)(slash - root) : len; /* len: `dir` is the parent */
        fsio_info in;
        int e = fsio_info_of(fs, dir, -1, &in);
        if (e) {
            rc = ckpt_seterr_errno(-e, "cannot stat %s", dir);
            break;
        }
        /* With the sticky bit only an entry's owner, the directory's owner
         * and root may rename the entry. */
        int sticky = (in.mode & 01000) && (in.uid == self || in.uid == 0);
        const char *who = NULL;
        if ((in.mode & 0002) && !sticky)
            who = "every user";
        else if (group_may_write(&in) && !sticky && !group_trusted(t, in.gid) &&
                 !(t->group && trust_caller_in_group(in.gid)) &&
                 !trust_private_group(in.uid, in.gid))
            who = "its group";
        else if (in.acl_writers && !sticky && !acl_trusted(t, &in, 1))
            who = "users or groups its POSIX ACL names (getfacl lists them)";
        if (who)
            rc = ckpt_seterr(CKPT_EACCES, "the directory %s, above the checkpoint root %s, "
                             "is writable by %s (gid %u, mode %04o) and no sticky bit of yours "
                             "or root's stops them renaming what it holds: they could "
                             "rename or replace the root between two saves and "
                             "send its checkpoints elsewhere; keep the root in a directory "
                             "only you may write (or one with the sticky bit, as /tmp)%s",
                             dir, root, who, in.gid, in.mode,
                             who[0] == 'e' ? ""
                             : !t->group ? ", or trust the group (CKPT_OPEN_TRUST_GROUP, "
                                           "ckpt --trust-group, Store(trust_group=True)) if "
                                           "it is a shared project directory"
                                         : " (trusting the group covers groups you are a "
                                           "member of and the root's groups' members: not "
                                           "this one)");
        if (end == len)
            break;
    }
    free(dir);
    return rc;
}

int trust_resolve(const fsio *fs, const char *path, int writing, char **out)
{
    unsigned self = (unsigned)geteuid();
    char *todo = strdup(path);                   /* components still to walk */
    char *done = path[0] == '/' ? strdup("") : getcwd(NULL, 0); /* "" is "/" */
    if (done && strcmp(done, "/") == 0)
        done[0] = '\0';
    int rc = CKPT_OK;
    if (!done && path[0] != '/' && errno != ENOMEM) /* removed under us, say */
        rc = ckpt_seterr_errno(errno, "cannot resolve %s: no current directory", path);
    else if (!todo || !done)
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    size_t at = 0;
    /* The superuser writing follows a link of another user (link_ok) only
     * into a root of that user: the first such link, its owner. */
    long link_uid = -1;
    char *link_path = NULL;
    for (int hops = 0; !rc;) {
        while (todo[at] == '/')
            at++;
        if (!todo[at])
            break;
        const char *comp = todo + at;
        size_t len = strcspn(comp, "/");
        at += len;
        if (len == 1 && comp[0] == '.')
            continue;
        if (len == 2 && comp[0] == '.' && comp[1] == '.') { /* done has no links */
            char *slash = strrchr(done, '/');
            if (slash)
                *slash = '\0';
            continue;
        }
        char *next = util_printf("%s/%.*s", done, (int)len, comp);
        fsio_info in;
        int e = next ? fsio_info_of(fs, next, -1, &in) : -ENOMEM;
        if (e == -ENOENT)
            rc = ckpt_seterr(CKPT_ENOTFOUND, "%s does not exist", next);
        else if (e)
            rc = ckpt_seterr_errno(-e, "cannot resolve %s", next ? next : path);
        else if (in.kind != FSIO_KIND_LINK) {
            free(done);
            done = next;
            continue;
        } else if (++hops > MAX_LINKS)
            rc = ckpt_seterr(CKPT_EINVAL, "cannot resolve %s: more than %d symbolic links",
                             path, MAX_LINKS);
        char *target = NULL;
        if (!rc && (e = fsio_readlink(fs, next, &target)))
            rc = ckpt_seterr_errno(-e, "cannot read the symbolic link %s", next);
        if (!rc && writing && !link_ok(self, fs, done, &in)) {
            char owner[128];
            user_name(in.uid, owner, sizeof owner);
            rc = ckpt_seterr(CKPT_EACCES, "the path %s goes through the symbolic link %s "
                             "(-> %s), which belongs to %s, not to you (uid %u) or root: "
                             "another user could send the checkpoints anywhere with it; "
                             "give the directory it points to, if that is meant", path,
                             next, target, owner, self);
        }
        if (!rc && writing && self == 0 && in.uid != 0 && link_uid < 0) {
            link_uid = (long)in.uid;
            free(link_path);
            link_path = strdup(next);
        } else if (!rc && writing && self == 0 && in.uid != 0 && (long)in.uid != link_uid) {
            link_uid = -2; /* links of two users: one of them is not the root's owner */
        }
        if (!rc) { /* walk the target, then what followed the link */
            char *rest = util_printf("%s/%s", target, todo + at);
            if (!rest)
                rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
            free(todo);
            todo = rest;
            at = 0;
            if (target[0] == '/')
                done[0] = '\0';
        }
        free(target);
        free(next);
    }
    free(todo);
    if (rc == CKPT_ENOTFOUND && link_uid != -1) {
        /* The caller would create the root through the link: a directory
         * of root's wherever the link's owner points it. */
        char lo[128];
        user_name(link_uid < 0 ? 0u : (unsigned)link_uid, lo, sizeof lo);
        rc = ckpt_seterr(CKPT_EACCES, "the path %s does not exist and goes through the "
                         "symbolic link %s of %s: as root, a writer creates no root through "
                         "another user's link (it would make a directory of root's wherever "
                         "they point it); create the root as its owner, or give its real "
                         "path", path, link_path ? link_path : "?",
                         link_uid < 0 ? "several users" : lo);
    }
    if (!rc && link_uid != -1) {
        /* root's writer (an admin's gc) sent by a user's link into another
         * user's root would retire or write steps that user's link owner
         * could never touch. */
        fsio_info root;
        int e = fsio_info_of(fs, done[0] ? done : "/", -1, &root);
        if (e)
            rc = ckpt_seterr_errno(-e, "cannot resolve %s", path);
        else if (link_uid < 0 || (long)root.uid != link_uid) {
            char lo[128], ro[128];
            user_name(link_uid < 0 ? 0u : (unsigned)link_uid, lo, sizeof lo);
            user_name(root.uid, ro, sizeof ro);
            rc = ckpt_seterr(CKPT_EACCES, "the path %s goes through the symbolic link %s of "
                             "%s to %s, which belongs to %s: as root, a writer follows "
                             "another user's link only into that user's own root (the "
                             "link's owner could otherwise have root retire or overwrite "
                             "checkpoints that are not theirs); give the root's real path",
                             path, link_path ? link_path : "?",
                             link_uid < 0 ? "several users" : lo, done[0] ? done : "/", ro);
        }
    }
    free(link_path);
    if (rc) {
        free(done);
        return rc;
    }
    if (!done[0]) {
        free(done);
        if (!(done = strdup("/")))
            return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    *out = done;
    return CKPT_OK;
}

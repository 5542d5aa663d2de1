/* trust: ownership and permission rules for shared servers (trust.h). */
#include "trust.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

void trust_init(trust *t, const fsio_info *root, int group)
{
    t->self = (unsigned)geteuid();
    t->root_uid = root->uid;
    t->group = group;
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

/* The user-private-group convention (Debian's USERGROUPS_ENAB): a group
 * named as its owner, having no other members, shares nothing when
 * group-writable. */
static int private_group(unsigned uid, unsigned gid)
{
    struct passwd pw, *pres = NULL;
    struct group gr, *gres = NULL;
    char b1[4096], b2[4096];
    if (getpwuid_r((uid_t)uid, &pw, b1, sizeof b1, &pres) != 0 || !pres ||
        getgrgid_r((gid_t)gid, &gr, b2, sizeof b2, &gres) != 0 || !gres)
        return 0;
    return (unsigned)pw.pw_gid == gid && strcmp(gr.gr_name, pw.pw_name) == 0 &&
           (!gr.gr_mem || !gr.gr_mem[0]);
}

/* CKPT_OK unless others may write `in`. */
static int check_mode(const trust *t, const char *path, const fsio_info *in, const char *what)
{
    if (in->mode & 0002)
        return ckpt_seterr(CKPT_EACCES, "%s %s is writable by every user (mode %04o): "
                           "anyone could plant or swap checkpoints there; run "
                           "chmod o-w on it", what, path, in->mode);
    if ((in->mode & 0020) && !t->group && !private_group(in->uid, in->gid))
        return ckpt_seterr(CKPT_EACCES, "%s %s is writable by its group (gid %u, mode "
                           "%04o): run chmod g-w on it, or trust the group "
                           "(CKPT_OPEN_TRUST_GROUP, ckpt --trust-group, "
                           "Store(trust_group=True)) if it is a shared project directory",
                           what, path, in->gid, in->mode);
    return CKPT_OK;
}

int trust_check_root(const trust *t, const char *path, const fsio_info *root, int writing)
{
    if (writing && root->uid != t->self && !t->group) {
        char owner[128];
        user_name(root->uid, owner, sizeof owner);
        return ckpt_seterr(CKPT_EACCES, "the checkpoint root %s belongs to %s, not to you "
                           "(uid %u): libckpt writes only into its own directories, or "
                           "into a group's shared one when told to trust the group "
                           "(CKPT_OPEN_TRUST_GROUP)", path, owner, t->self);
    }
    return check_mode(t, path, root, "the checkpoint root");
}

int trust_check_entry(const trust *t, const char *path, const fsio_info *in)
{
    if (in->uid != t->self && in->uid != t->root_uid && in->uid != 0 && !t->group) {
        char owner[128];
        user_name(in->uid, owner, sizeof owner);
        return ckpt_seterr(CKPT_EACCES, "%s belongs to %s, who is neither you (uid %u) nor "
                           "the owner of the checkpoint root (uid %u): a checkpoint "
                           "planted by another user is never used (trust the group with "
                           "CKPT_OPEN_TRUST_GROUP if that user shares it with you)", path,
                           owner, t->self, t->root_uid);
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

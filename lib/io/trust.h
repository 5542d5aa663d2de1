/* trust: whose directories and files libckpt accepts in a checkpoint root.
 *
 * On a server shared by many users, a checksum proves that a checkpoint is
 * intact, not who wrote it.  So every root, step directory and file is
 * checked before it is used:
 *  - writing into a root: the caller must own it, unless the store trusts
 *    its group (CKPT_OPEN_TRUST_GROUP, for a project directory shared by a
 *    group); a root anyone may write (o+w) is refused, and a group-writable
 *    one unless the group is trusted or is the owner's private group;
 *  - using a step directory or file (restore, verify, retention): its owner
 *    must be the caller, the root's owner or root (uid 0), or a member of
 *    the trusted group; the same write-permission rules apply to it.
 * The trusted group is the root's group, and only for a caller who is a
 * member of it: a root some stranger made, of the stranger's own group,
 * is not a project's shared root whatever flag the caller passes.
 * A refusal is CKPT_EACCES with a message naming the path, its owner and
 * mode, and what would make it acceptable. */
#ifndef CKPT_TRUST_H
#define CKPT_TRUST_H

#include "fsio.h"

typedef struct trust {
    unsigned self;      /* the caller's effective uid */
    unsigned root_uid;  /* the root's owner */
    int group;          /* trust the group (CKPT_OPEN_TRUST_GROUP) */
    /* Trusting the group means trusting the root's groups and their
     * members: its owning group and the groups its POSIX ACL lets write
     * (a project shared by an ACL), each when the caller is a member of
     * it (a writer) or at all (a reader, who trusts the root's owner
     * anyway).  The superuser (an admin's `ckpt gc --trust-group` on a
     * user's root) trusts every owner and group (any). */
    unsigned gids[FSIO_ACL_NAMED_MAX + 1];
    int ngids;
    int any;
} trust;

/* Set up the rules for a root whose information is `root`, for a writer
 * or a reader. */
void trust_init(trust *t, const fsio_info *root, int group, int writing);
/* Is the calling process in group `gid` (effective or supplementary)? */
int trust_caller_in_group(unsigned gid);
/* May the caller write into the root at `path`?  CKPT_OK or CKPT_EACCES. */
int trust_check_root(const trust *t, const char *path, const fsio_info *root, int writing);
/* May the caller use the step directory or file `path`? */
int trust_check_entry(const trust *t, const char *path, const fsio_info *in);
/* The same, reading the information first (CKPT_EIO etc. when it cannot). */
int trust_check_path(const trust *t, const fsio *fs, const char *path);

/* The user-private-group convention (Debian's USERGROUPS_ENAB): is `gid` a
 * group named as user `uid`, with no other members (listed, or having it
 * as their primary group)?  Such a group shares nothing. */
int trust_private_group(unsigned uid, unsigned gid);

/* May the superuser, cleaning up in a root owned by `root_uid` with group
 * `root_gid`, remove a directory that user `uid` owns: the root's owner's,
 * or a member's of the root's group (a shared project's steps).  Not a
 * third user's the owner moved in (fsio.owner_ok). */
int trust_owner_removable(unsigned uid, unsigned root_uid, unsigned root_gid);

/* Resolve `path` as realpath(3) does (absolute; no ".", ".." or links)
 * into a malloc'd *out, walking it one component at a time.  With
 * `writing`, every symbolic link met on the way must belong to the caller
 * or root, or to the owner of the directory holding it when no one else
 * may write that directory: a link that another user planted in a shared
 * directory (/tmp, scratch) would send this writer's checkpoints wherever
 * it points.  Trusting the group does not extend to its members' links,
 * which could lead into the caller's own private roots.
 * CKPT_OK; CKPT_ENOTFOUND when a component does not exist (the caller may
 * create it and resolve again); CKPT_EACCES naming a refused link and its
 * owner; CKPT_EIO etc. otherwise.  Each with a message. */
int trust_resolve(const fsio *fs, const char *path, int writing, char **out);
/* For a writer: every directory above the resolved `root` ("/" to its
 * parent) must keep others from renaming what it holds: writable by no
 * other user, or by its group only when `t` trusts that group (or it is a
 * private group), or sticky and owned by the caller or root.  Otherwise
 * whoever may write it could swap the root for another directory between
 * two saves, and the writer (which reaches its files by path) would write
 * there.  CKPT_OK, or CKPT_EACCES naming the directory and its mode. */
int trust_check_ancestors(const trust *t, const fsio *fs, const char *root);

#endif

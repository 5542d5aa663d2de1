/* layout: the checkpoint root's namespace.  Everything that names, creates,
 * renames or deletes an entry of the root lives here: step and temporary
 * names, the writer lock, the scan, the commit rename, retirement,
 * retention, stale-temporary cleanup and the listing gc prints.  Callers
 * decide policy (which steps to keep); this module carries it out. */
#ifndef CKPT_LAYOUT_H
#define CKPT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "fsio.h"
#include "trust.h"

#define LAYOUT_LOCK_NAME ".lock"
#define LAYOUT_TMP_PREFIX ".tmp-"
#define LAYOUT_TRASH_PREFIX ".trash-"
/* A committed step moved aside while its replacement is renamed in (only on
 * file systems without RENAME_EXCHANGE); put back at open if left alone. */
#define LAYOUT_REPLACED_PREFIX ".replaced-"
/* "step-" and at least 12 digits: the step zero-padded to 12 digits, more
 * digits only when the step needs them (docs/FORMAT.md). */
#define LAYOUT_STEP_PREFIX "step-"
#define LAYOUT_STEP_DIGITS 12
#define LAYOUT_NAME_SIZE 32u

typedef struct layout {
    char *root;       /* absolute path, malloc'd */
    fsio fs;          /* every call goes through it */
    int fsync;        /* fsync the root and directories after changes */
    int lock_fd;      /* the writer's lock, -1 for readers */
    unsigned seq;     /* makes temporary names unique within the process */
    trust tr;         /* whose entries are accepted (trust.h) */
    int dir_mode;     /* for the root and step directories it creates */
    int share_gid;    /* trusting the group, a writer who is a member of the
                         root's group: that gid, given to every directory
                         and file it creates (and setgid on directories),
                         so that its primary group (shared with whoever)
                         never owns its steps; else -1 */
    int file_mode;    /* for the files of a step */
    /* The superuser's writer in another user's root (an admin's job or
     * gc): what it makes is handed to the root's owner and group, with the
     * modes the owner's own writer would give them, so that the owner can
     * read and remove it; -1 otherwise. */
    int hand_uid, hand_gid;
    /* Several ranks: the tag every rank puts in the name of the save's
     * temporary directory instead of its pid, so all write into one
     * (lib/dist sets it before each save); "" for one process. */
    char shared_tag[48];
    /* Set around a save's retention (retention_after_save): layout_retire
     * renames a step out of the namespace and fsyncs the root, as always,
     * but leaves deleting its files to the caller, listing the renamed
     * path here (deleting a 1 GiB step's files takes a third of a second
     * here, which the save would otherwise wait for).  Freed by
     * layout_take_removals or layout_close. */
    int defer_removal;
    char **removals;
    size_t nremovals;
    /* A writer's root, pinned when opened: an O_PATH descriptor of the
     * directory checked, and "/proc/self/fd/N", through which every
     * rename and removal in the root goes.  The path can be renamed under
     * us by whoever may rename its last entry (the root's owner always
     * can, in /tmp or in a home): root running gc on a user's root, or a
     * writer trusting its group, would otherwise retire the steps of
     * whatever directory that user swapped in.  -1 and NULL for readers
     * and where /proc is not mounted (paths are used then). */
    int pin_fd;
    char *at;
    /* The temporary directory of the save in progress (layout_make_temp):
     * its identity, checked when it is committed, so that an entry another
     * user who can write the root swapped in (a link to a directory of
     * theirs) is never committed as the step the caller was told is
     * safe (tmp_known 0: none); and, like the root, a descriptor of it
     * (tmp_fd, -1: none) whose "/proc/self/fd/N" (tmp_at) is the path the
     * save writes its files through, so that a swap of the entry cannot
     * send them elsewhere.  tmp_name is the entry's name in the root,
     * tmp_shown its path as users know it (messages); both stay until the
     * next layout_make_temp, for messages formed after the cleanup. */
    int tmp_known;
    uint64_t tmp_dev, tmp_ino;
    int tmp_fd;
    char *tmp_at, *tmp_name, *tmp_shown;
} layout;

/* Resolve `path` into l->root (absolute), creating the directory when
 * `writing` (then also checked fit for writing, trust.h).  `trust_group`:
 * accept a root and entries of the group's members, and create directories
 * the group may write.  CKPT_ENOTFOUND if it is missing and !writing;
 * CKPT_EINVAL if it is not a directory; CKPT_EACCES if it is not trusted.
 * l->fs and l->fsync must be set before. */
int layout_open(layout *l, const char *path, int writing, int trust_group);
/* CKPT_OK when the step directory or file `path` may be used (trust.h). */
int layout_check_trusted(layout *l, const char *path);
/* Release the lock (if held) and free.  Safe on a zeroed layout. */
void layout_close(layout *l);
/* In a child made by fork(): close this copy of the lock's descriptor
 * without unlocking (the flock stays the parent's) and forget it, so the
 * child can commit nothing.  Only close(): safe right after fork(). */
void layout_forget_lock(layout *l);
/* A file just created in the root, open as `fd`: in a root shared with a
 * trusted group it is given l->file_mode whatever the umask (a member with
 * umask 077 would otherwise leave files the group cannot read, and no
 * other member could restore the step); elsewhere the umask stands.  The
 * superuser's writer in another user's root hands it to the root's owner
 * and group (hand_uid).  Best effort: a file left narrower fails closed,
 * with a clear error on read. */
void layout_file_made(const layout *l, int fd);
/* The root's lock file or event log, open as `fd` and known to be a plain
 * file of the root alone: in a root that trusts its group, made writable
 * by the group (`shared`: 0660, whatever the umask) if it is the caller's
 * own; another user's is left as it is (root running an admin's gc must
 * not hand a user's lock or log to their group).  One the superuser owns
 * in another user's root is given to the root's owner (who could
 * otherwise not open it again) when this process just made it (`made`:
 * opened with O_EXCL); one that was there before returns -1, for the
 * caller to refuse: the owner moved a file of root's in from elsewhere,
 * which writing as root would change and chown would hand them.  Else 0
 * (the rest best effort). */
int layout_adopt_file(const layout *l, int fd, int shared, int made);

/* The canonical name of `step` (>= 0) into buf. */
void layout_step_name(int64_t step, char buf[LAYOUT_NAME_SIZE]);
/* 1 and *step when `name` is exactly the canonical name of a step, else 0
 * (so "step-9" or "step-0000000000009" are not steps). */
int layout_parse_step_name(const char *name, int64_t *step);
/* malloc'd ROOT/<step name>, for a writer through its pinned root (l->at:
 * reads of its steps never follow a rename of the root's path); NULL when
 * out of memory.  layout_shown_path gives the path to show. */
char *layout_step_path(const layout *l, int64_t step);
/* `path` as users know it: a path through the pinned root (l->at...) with
 * l->root in its place; others as they are.  malloc'd; NULL: no memory. */
char *layout_shown_path(const layout *l, const char *path);
/* The thread's error message with each path through the pinned root shown
 * as under l->root (messages name what users know); returns `status`. */
int layout_shown_error(const layout *l, int status);

/* Take the writer lock (ROOT/.lock, private to the owner, holding the
 * holder's pid and host); CKPT_EBUSY naming the holder if held elsewhere. */
int layout_lock(layout *l);
/* CKPT_OK when ROOT/.lock is still the file this writer locked; CKPT_EBUSY
 * when it was removed or replaced (a second writer could then hold a lock
 * of its own).  Commit, retention and cleanup check it first, so at most
 * one writer changes the root. */
int layout_check_lock(layout *l);

/* Committed steps, ascending: directories with canonical step names. */
int layout_scan(layout *l, int64_t **steps, size_t *count);

/* Create a fresh temporary directory for `step`; *path malloc'd: where to
 * write its files (through a descriptor of the directory made, where /proc
 * allows; pass it back to layout_commit or layout_remove_temp).  With a
 * shared tag the name is the same on every rank and one that another rank
 * created already is used (when it is a directory this writer trusts). */
int layout_make_temp(layout *l, int64_t step, char **path);
/* ROOT/name as a writer renames or removes it: through the pinned root
 * (l->at) when there is one.  malloc'd; NULL when out of memory.  For
 * messages, name l->root. */
char *layout_pinned_path(const layout *l, const char *name);

/* Remove a temporary directory made by layout_make_temp (a failed save).
 * Best effort: what is left is cleaned at the next writer's open. */
void layout_remove_temp(layout *l, const char *path);
/* Make `tmp` visible as the step atomically (replacing an existing one)
 * and fsync the root. */
int layout_commit(layout *l, const char *tmp, int64_t step);
/* Retire a step: rename out of the step namespace, fsync, then delete (or,
 * with l->defer_removal, list the renamed path in l->removals; inline when
 * there is no memory to list it). */
int layout_retire(layout *l, int64_t step);
/* layout_retire in two halves, for a retirement that must not run out of
 * memory once begun: _prepare allocates the step's path and a trash name
 * (CKPT_OK, or CKPT_ENOMEM said, both NULL); _prepared does the rest
 * without allocating but for the deferred list (inline deletion without
 * it), and takes (frees or keeps) both strings. */
int layout_retire_prepare(layout *l, int64_t step, char **path, char **trash);
int layout_retire_prepared(layout *l, int64_t step, char *path, char *trash);
/* The paths listed by deferred retirements (the caller deletes each with
 * fsio_remove_tree and frees it and the array); *n = 0 and NULL when none. */
char **layout_take_removals(layout *l, size_t *n);

/* Retire every step of `steps` (ascending, `n` of them) except the newest
 * `keep_last` and the two protected ones (-1: none).  With `dry_run`
 * nothing changes.  Each (would-be) retirement is added to `report` (may
 * be NULL) with status CKPT_OK, its step and its directory name.  Stops at
 * the first failure, returning it. */
int layout_retain(layout *l, const int64_t *steps, size_t n, size_t keep_last,
                  int64_t protect1, int64_t protect2, int dry_run, ckpt_report *report);

/* 1 when the caller is the superuser, the root belongs to another user,
 * and the tree at `path` (an entry of the root) holds a directory owned
 * by root (uid 0), or is too deep or unreadable to tell: the root's owner
 * could neither have made nor emptied such a directory, so it was moved
 * in from elsewhere (a directory of the admin's under one of the
 * owner's), and an admin's gc deleting it would delete, as root, what
 * the owner may not.  Stale temporaries, leftovers of a replaced step and
 * retired steps holding one are left in place.  Else 0. */
int layout_holds_superusers_dir(const layout *l, const char *path);
/* Remove the temporary and trash directories of writers that died and put
 * back a moved-aside step whose replacement never arrived (the caller holds
 * the lock, so their writers are dead).  With `dry_run` only list them
 * (the replaced ones are then left out: they are steps, not garbage).
 * Each (would-be) removal goes to `report` (may be NULL) with step -1.
 * Returns the first failure (best effort: the rest is still tried). */
int layout_clean_stale(layout *l, int dry_run, ckpt_report *report);

#endif

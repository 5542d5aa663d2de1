/* layout: root namespace, lock, commit protocol, retention, cleanup. */
#include "layout.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "report.h"
#include "util.h"

/* The process's umask, read without changing it (umask(2) would, for
 * every thread); -1 when /proc does not say. */
static int current_umask(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    int mask = -1;
    while (f && mask < 0 && fgets(line, sizeof line, f))
        if (strncmp(line, "Umask:", 6) == 0)
            mask = (int)strtol(line + 6, NULL, 8);
    if (f)
        fclose(f);
    return mask;
}

/* Is the directory open as `fd` (`st`) the one mkdir(`mode`) just made:
 * the caller's, empty, with the mode mkdir gives under the umask?  A
 * member of the group who may write the parent can swap the new entry for
 * another directory of the caller's between the mkdir and the open (a
 * private one): that one is never made group-writable. */
static int made_just_now(int fd, const struct stat *st, unsigned mode)
{
    int mask = current_umask();
    if (st->st_uid != geteuid() ||
        (mask >= 0 && (st->st_mode & 0777) != (mode & ~(unsigned)mask & 0777)))
        return 0;
    int dup_fd = dup(fd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return 0;
    }
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

/* Trusting the group: `fd` (made by this writer) gets the root's group,
 * and a directory the setgid bit, so that what is made inside it does too.
 * A member's primary group may be shared with users outside the project,
 * who would otherwise own its steps through the group bits. */
static void give_share_group(const layout *l, int fd, int dir)
{
    struct stat st;
    if (l->share_gid < 0 || fd < 0 || fstat(fd, &st) != 0 || st.st_uid != geteuid())
        return;
    if (st.st_gid != (gid_t)l->share_gid && fchown(fd, (uid_t)-1, (gid_t)l->share_gid) != 0)
        return;
    if (dir && !(st.st_mode & S_ISGID))
        (void)fchmod(fd, (st.st_mode & 07777) | S_ISGID);
}

/* To the root's owner and group, with `mode` (layout.h: hand_uid). */
static void hand_over(const layout *l, int fd, int mode)
{
    struct stat st; /* a directory keeps the setgid bit a project directory passes down */
    if (fstat(fd, &st) == 0 && fchown(fd, (uid_t)l->hand_uid, (gid_t)l->hand_gid) == 0)
        (void)fchmod(fd, (mode_t)mode | (S_ISDIR(st.st_mode) ? st.st_mode & S_ISGID : 0));
}

/* mkdir with l->dir_mode.  In a root shared with a trusted group (0770)
 * the umask (022 by default) would take the group's write bit away, and
 * another member's writer could then not remove the steps it retires: the
 * mode asked for is set whatever the umask.  Returns 0 or -errno. */
static int make_dir(layout *l, const char *path)
{
    int rc = fsio_mkdir(&l->fs, path, l->dir_mode);
    /* The superuser's writer in another user's root (an admin's job) hands
     * the directories it makes to the root's owner: its steps are then
     * retired as anyone's (a directory of root's is left in place:
     * layout_holds_superusers_dir), and the owner can remove them. */
    int hand = rc == 0 && l->hand_uid >= 0;
    if (rc != 0 || (!(l->dir_mode & 0020) && !hand))
        return rc;
    /* Through a descriptor of the directory itself, never a path that a
     * member of the group could have swapped for a link since the mkdir
     * (chmod would follow it). */
    int fd = fsio_open(&l->fs, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    struct stat st; /* keep the setgid bit a project directory passes down */
    if (fd >= 0 && fstat(fd, &st) == 0 && made_just_now(fd, &st, l->dir_mode)) {
        if ((l->dir_mode & 0020) && (st.st_mode & 0777) != (mode_t)l->dir_mode)
            fchmod(fd, (st.st_mode & 07000) | (mode_t)l->dir_mode); /* best effort */
        if (l->dir_mode & 0020)
            give_share_group(l, fd, 1);
        if (hand)
            hand_over(l, fd, l->dir_mode);
    }
    if (fd >= 0)
        fsio_close(&l->fs, fd);
    return rc;
}

/* A committed step directory given where its root belongs (a job script
 * that passed `ckpt latest`'s path back, say): a writer would put a lock,
 * an event log and steps inside a committed step, and a reader would find
 * no checkpoints and say nothing useful.  Refused with the root named. */
static int refuse_step_dir(layout *l)
{
    const char *slash = strrchr(l->root, '/');
    int64_t step;
    if (!slash || !layout_parse_step_name(slash + 1, &step))
        return 0;
    char *manifest = util_join(l->root, "manifest.json");
    int kind = FSIO_KIND_NONE;
    int rc = manifest ? fsio_kind(&l->fs, manifest, 0, &kind) : -ENOMEM;
    free(manifest);
    if (rc == -ENOMEM)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    if (kind != FSIO_KIND_FILE)
        return 0;
    int plen = slash == l->root ? 1 : (int)(slash - l->root);
    return ckpt_seterr(CKPT_EINVAL,
                       "%s is step %lld of the checkpoint root %.*s, not a root: open %.*s "
                       "(and name step %lld there)",
                       l->root, (long long)step, plen, l->root, plen, l->root, (long long)step);
}

char *layout_pinned_path(const layout *l, const char *name)
{
    return util_join(l->at ? l->at : l->root, name);
}

/* The entry of `path` (a path in the root) as a pinned path. */
static char *pinned_entry(const layout *l, const char *path)
{
    const char *slash = strrchr(path, '/');
    return layout_pinned_path(l, slash ? slash + 1 : path);
}

/* Pin the writer's root (layout.h): the directory whose stat `in` was
 * checked, or a refusal if the path names another one by now. */
static int pin_root(layout *l, const fsio_info *in)
{
    int fd = open(l->root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return ckpt_seterr_errno(errno, "cannot open the checkpoint root %s", l->root);
    struct stat sb, via;
    char at[40];
    snprintf(at, sizeof at, "/proc/self/fd/%d", fd);
    if (fstat(fd, &sb) != 0 || sb.st_dev != in->dev || sb.st_ino != in->ino) {
        close(fd);
        return ckpt_seterr(CKPT_EACCES, "the checkpoint root %s was replaced while it was "
                           "being opened: another user may be renaming it", l->root);
    }
    if (stat(at, &via) != 0 || via.st_dev != sb.st_dev || via.st_ino != sb.st_ino ||
        !(l->at = strdup(at))) {
        close(fd); /* no /proc (or no memory): paths, unpinned */
        return CKPT_OK;
    }
    l->pin_fd = fd;
    return CKPT_OK;
}

int layout_open(layout *l, const char *path, int writing, int trust_group)
{
    l->lock_fd = -1;
    l->pin_fd = -1;
    l->at = NULL;
    l->root = NULL;
    l->tmp_fd = -1;
    l->tmp_at = l->tmp_name = l->tmp_shown = NULL;
    /* Private to the owner (and the group's readers) unless shared with a
     * trusted group; the command line in each manifest is no one else's. */
    l->dir_mode = trust_group ? 0770 : 0750;
    l->share_gid = -1; /* known once the root is */
    l->hand_uid = l->hand_gid = -1;
    l->file_mode = 0640;
    /* Resolved here, one component at a time, so that a writer refuses a
     * link another user planted on the way before creating anything. */
    int rc = trust_resolve(&l->fs, path, writing, &l->root), created = 0;
    if (rc == CKPT_ENOTFOUND && writing) {
        int e = make_dir(l, path);
        if (e == -ENOENT) {
            /* Only the root is created: a parent made here would take
             * modes and an owner nobody chose (and mkdir -p hides a typo). */
            size_t end = strlen(path);
            while (end > 1 && path[end - 1] == '/')
                end--; /* "a/b/" names b */
            const char *slash = NULL;
            for (size_t i = 0; i < end; i++)
                if (path[i] == '/')
                    slash = path + i;
            int plen = !slash ? 1 : slash == path ? 1 : (int)(slash - path);
            char *parent = util_printf("%.*s", plen, slash ? path : ".");
            struct stat ps;
            int there = parent && stat(parent, &ps) == 0;
            free(parent);
            if (there) /* /proc, say: a parent that takes no new directory */
                return ckpt_seterr_errno(-e, "cannot create the checkpoint root %s", path);
            return ckpt_seterr(CKPT_ENOTFOUND, "cannot create the checkpoint root %s: its "
                               "parent directory %.*s does not exist (libckpt creates the "
                               "root, not the directories above it: mkdir -p them first)",
                               path, plen, slash ? path : ".");
        }
        if (e && e != -EEXIST)
            return ckpt_seterr_errno(-e, "cannot create the checkpoint root %s", path);
        created = e == 0;
        rc = trust_resolve(&l->fs, path, writing, &l->root);
    }
    if (rc == CKPT_ENOTFOUND)
        return ckpt_seterr(CKPT_ENOTFOUND, "checkpoint root %s does not exist", path);
    if (rc)
        return rc;
    fsio_info in;
    if ((rc = fsio_info_of(&l->fs, l->root, -1, &in)))
        return ckpt_seterr_errno(-rc, "cannot stat the checkpoint root %s", l->root);
    if (writing) { /* the group trusted is the root's: known now */
        trust t;
        trust_init(&t, &in, trust_group, 1);
        if ((rc = trust_check_ancestors(&t, &l->fs, l->root))) {
            if (created)
                fsio_rmdir(&l->fs, l->root); /* the empty root made just now */
            return rc;
        }
    }
    if (in.kind != FSIO_KIND_DIR)
        return ckpt_seterr(CKPT_EINVAL, "%s is not a directory", path);
    if ((rc = refuse_step_dir(l)))
        return rc;
    /* Private unless told to share: group-readable (0750, 0640) only when
     * the root's group is the owner's private group.  A user whose primary
     * group is shared (a lab's "users", another user's group) would
     * otherwise let every member read the checkpoints. */
    if (writing && !trust_group && in.uid == (unsigned)geteuid() &&
        !trust_private_group(in.uid, in.gid)) {
        l->dir_mode = 0700;
        l->file_mode = 0600;
        if (created && (in.mode & 0077) && chmod(l->root, 0700) == 0)
            in.mode &= ~(unsigned)0077;
    }
    if (writing && geteuid() == 0 && in.uid != 0) {
        /* What the owner's writer would make (above): group-writable only
         * in a root its group may write (a project's), group-readable only
         * with the owner's private group or such a project group. */
        l->hand_uid = (int)in.uid;
        l->hand_gid = (int)in.gid;
        int shared = (in.mode & 0020) != 0, own_group = trust_private_group(in.uid, in.gid);
        l->dir_mode = shared ? l->dir_mode : own_group ? 0750 : 0700;
        l->file_mode = shared || own_group ? 0640 : 0600;
    }
    trust_init(&l->tr, &in, trust_group, writing);
    /* layout_holds_superusers_dir checks a tree by path before it is
     * removed; the removal itself checks each directory it opens, so that
     * the owner cannot swap one of root's in between. */
    l->fs.spare_superuser_dirs = geteuid() == 0 && in.uid != 0;
    if (l->fs.spare_superuser_dirs) { /* nor a third user's the owner moved in */
        l->fs.owner_ok = trust_owner_removable;
        l->fs.spare_root_uid = in.uid;
        l->fs.spare_root_gid = in.gid;
    }
    l->share_gid = writing && trust_group && trust_caller_in_group(in.gid) ? (int)in.gid : -1;
    if ((rc = trust_check_root(&l->tr, l->root, &in, writing)))
        return rc;
    /* A writer must be able to make its steps there: said now, not after
     * the job has trained up to its first save. */
    if (writing && faccessat(AT_FDCWD, l->root, W_OK | X_OK, AT_EACCESS) != 0) {
        int e = errno;
        if (e == EROFS)
            return ckpt_seterr(CKPT_EACCES, "the checkpoint root %s is on a read-only file "
                               "system: no save could be written there; open it with "
                               "CKPT_OPEN_READONLY (Python: readonly=True) to read", l->root);
        if (e == EACCES || e == EPERM)
            return ckpt_seterr(CKPT_EACCES, "the checkpoint root %s is not writable by you "
                               "(mode %04o, owner uid %u): no save could create its step "
                               "there; open it with CKPT_OPEN_READONLY (Python: "
                               "readonly=True) to read, or give it back write permission",
                               l->root, in.mode & 07777, in.uid);
    }
    return writing ? pin_root(l, &in) : CKPT_OK;
}

int layout_check_trusted(layout *l, const char *path)
{
    return trust_check_path(&l->tr, &l->fs, path);
}

char **layout_take_removals(layout *l, size_t *n)
{
    char **list = l->removals;
    *n = l->nremovals;
    l->removals = NULL;
    l->nremovals = 0;
    return list;
}

void layout_file_made(const layout *l, int fd)
{
    if (fd >= 0 && l->hand_uid >= 0)
        hand_over(l, fd, l->file_mode);
    else if (fd >= 0 && (l->dir_mode & 0020)) {
        (void)fchmod(fd, (mode_t)l->file_mode);
        give_share_group(l, fd, 0);
    }
}

int layout_adopt_file(const layout *l, int fd, int shared, int made)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return 0;
    unsigned self = (unsigned)geteuid();
    int handed = 0;
    if (self == 0 && st.st_uid == 0 && l->tr.root_uid != 0) {
        if (!made)
            return -1;
        if (fchown(fd, (uid_t)l->tr.root_uid, (gid_t)l->hand_gid) == 0)
            handed = 1; /* theirs from now on, with the mode a member's would have */
    }
    if (shared && (st.st_uid == self || handed) && (st.st_mode & 0777) != 0660)
        (void)fchmod(fd, 0660);
    if (shared && st.st_uid == self)
        give_share_group(l, fd, 0);
    return 0;
}

void layout_forget_lock(layout *l)
{
    if (l->lock_fd >= 0)
        close(l->lock_fd); /* not LOCK_UN: that would release the parent's lock */
    l->lock_fd = -1;
}

void layout_close(layout *l)
{
    for (size_t i = 0; i < l->nremovals; i++) { /* never taken: deleted here */
        fsio_remove_tree(&l->fs, l->removals[i]);
        free(l->removals[i]);
    }
    free(l->removals);
    l->removals = NULL;
    l->nremovals = 0;
    if (l->lock_fd >= 0)
        fsio_close(&l->fs, l->lock_fd); /* releases the flock */
    l->lock_fd = -1;
    if (l->at && l->pin_fd >= 0) /* `at` set: pinned by layout_open (a zeroed
                                    layout holds fd 0, not its own) */
        close(l->pin_fd);
    if (l->tmp_at && l->tmp_fd >= 0) /* likewise: set with tmp_at */
        close(l->tmp_fd);
    l->tmp_fd = -1;
    free(l->tmp_at);
    free(l->tmp_name);
    free(l->tmp_shown);
    l->tmp_at = l->tmp_name = l->tmp_shown = NULL;
    l->pin_fd = -1;
    free(l->at);
    l->at = NULL;
    free(l->root);
    l->root = NULL;
}

void layout_step_name(int64_t step, char buf[LAYOUT_NAME_SIZE])
{
    snprintf(buf, LAYOUT_NAME_SIZE, LAYOUT_STEP_PREFIX "%0*lld", LAYOUT_STEP_DIGITS,
             (long long)step);
}

int layout_parse_step_name(const char *name, int64_t *step)
{
    size_t plen = strlen(LAYOUT_STEP_PREFIX);
    if (strncmp(name, LAYOUT_STEP_PREFIX, plen) != 0)
        return 0;
    const char *d = name + plen;
    size_t n = strlen(d);
    if (n < LAYOUT_STEP_DIGITS || n > 19)
        return 0;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9' || v > (INT64_MAX - (d[i] - '0')) / 10)
            return 0;
        v = v * 10 + (d[i] - '0');
    }
    char canon[LAYOUT_NAME_SIZE];
    layout_step_name(v, canon);
    if (strcmp(canon, name) != 0)
        return 0; /* not the name a writer gives: leading zeros beyond 12 digits */
    *step = v;
    return 1;
}

char *layout_step_path(const layout *l, int64_t step)
{
    char name[LAYOUT_NAME_SIZE];
    layout_step_name(step, name);
    return layout_pinned_path(l, name);
}

/* Whether `s` starts with the pin `at` ("/proc/self/fd/N", not N7). */
static int starts_with_pin(const char *s, const char *at)
{
    size_t n = at ? strlen(at) : 0;
    return n && strncmp(s, at, n) == 0 &&
           (s[n] == '/' || s[n] == '\0' || s[n] == ' ' || s[n] == ':' || s[n] == ',' ||
            s[n] == ')' || s[n] == '\'');
}

char *layout_shown_path(const layout *l, const char *path)
{
    if (starts_with_pin(path, l->tmp_at) && l->tmp_shown)
        return util_printf("%s%s", l->tmp_shown, path + strlen(l->tmp_at));
    if (starts_with_pin(path, l->at))
        return util_printf("%s%s", l->root, path + strlen(l->at));
    return util_strdup(path);
}

int layout_shown_error(const layout *l, int status)
{
    const char *msg = ckpt_error_last();
    if (!status || !((l->at && strstr(msg, l->at)) || (l->tmp_at && strstr(msg, l->tmp_at))))
        return status;
    char out[CKPT_ERROR_MESSAGE_MAX];
    size_t k = 0;
    for (const char *c = msg; *c && k + 1 < sizeof out;) {
        const char *pin = NULL, *shown = NULL;
        if (l->tmp_shown && starts_with_pin(c, l->tmp_at))
            pin = l->tmp_at, shown = l->tmp_shown;
        else if (starts_with_pin(c, l->at))
            pin = l->at, shown = l->root;
        if (pin) {
            k += (size_t)snprintf(out + k, sizeof out - k, "%s", shown);
            if (k >= sizeof out)
                k = sizeof out - 1;
            c += strlen(pin);
        } else {
            out[k++] = *c++;
        }
    }
    out[k] = '\0';
    return ckpt_seterr(status, "%s", out);
}

/* The lock file holds "pid host" of its holder, padded to a fixed size so
 * that rewriting it never needs a truncate. */
#define LOCK_NOTE_SIZE 128

/* Describe the lock's holder into `who`; returns 1 when the note names
 * this very process (a second writable open of one root in one program,
 * which flock refuses like any other: each open is its own lock). */
static int read_holder(layout *l, const char *path, char *who, size_t size)
{
    char buf[LOCK_NOTE_SIZE + 1] = "";
    /* no note to read: the holder took the lock a moment ago and has not
     * written it yet, or could not (a full disk) */
    snprintf(who, size, "its note, the holder's pid and host, cannot be read: it may have "
             "just taken the lock");
    int fd = fsio_open_regular(&l->fs, path);
    if (fd < 0)
        return 0;
    int64_t n = fsio_pread(&l->fs, fd, buf, LOCK_NOTE_SIZE, 0);
    fsio_close(&l->fs, fd);
    long pid;
    char host[LOCK_NOTE_SIZE], me[64] = "?";
    if (n <= 0 || sscanf(buf, "%ld %127s", &pid, host) != 2)
        return 0;
    snprintf(who, size, "pid %ld on %s", pid, host);
    gethostname(me, sizeof me - 1);
    return pid == (long)getpid() && strcmp(host, me) == 0;
}

/* The lock file is written (its holder's note): it must be a regular file
 * of this root alone.  One with several names is a hard link to a file
 * elsewhere, made by whoever could write the root, and writing the note
 * would overwrite that file's start (any file of anyone, root's included,
 * where fs.protected_hardlinks is 0). */
static int lock_file_ok(layout *l, int fd, const char *path)
{
    fsio_info in;
    int rc = fsio_info_of(&l->fs, NULL, fd, &in);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot stat the lock file %s", path);
    if (in.kind != FSIO_KIND_FILE)
        return ckpt_seterr(CKPT_EACCES, "the lock file %s is not a regular file: remove it",
                           path);
    if (in.nlink > 1)
        return ckpt_seterr(CKPT_EACCES, "the lock file %s has %u names (a hard link to a "
                           "file elsewhere, which writing the lock note would overwrite): "
                           "remove it", path, in.nlink);
    return CKPT_OK;
}

int layout_lock(layout *l)
{
    char *path = util_join(l->root, LAYOUT_LOCK_NAME);
    char *at = layout_pinned_path(l, LAYOUT_LOCK_NAME); /* in the pinned root */
    if (!path || !at) {
        free(path);
        free(at);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    /* Private (0600): no other user can open it, so none can hold the flock
     * to block this writer; never through a planted link.  In a root shared
     * with a trusted group (dir_mode 0770) every member's writer must open
     * it: 0660, whatever the umask (as make_dir). */
    int shared = (l->dir_mode & 0020) != 0;
    /* Made here, or there before (whose owner layout_adopt_file checks). */
    int fd = fsio_open(&l->fs, at, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK,
                       shared ? 0660 : 0600);
    int made = fd >= 0;
    if (fd == -EEXIST)
        fd = fsio_open(&l->fs, at, O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0);
    free(at);
    int rc = fd == -ELOOP /* O_NOFOLLOW on a link: refused, as any non-file */
                 ? ckpt_seterr(CKPT_EACCES, "the lock file %s is a symbolic link, not a "
                               "regular file: remove it", path)
             : fd < 0 ? ckpt_seterr_errno(-fd, "cannot open the lock file %s", path)
                      : 0;
    if (!rc && (rc = lock_file_ok(l, fd, path))) {
        fsio_close(&l->fs, fd);
    } else if (!rc && layout_adopt_file(l, fd, shared, made) != 0) {
        /* Once it is known to be a file of this root alone (a hard link's
         * target would have taken the mode or the owner). */
        fsio_close(&l->fs, fd);
        rc = ckpt_seterr(CKPT_EACCES, "the lock file %s belongs to root, not to the root's "
                         "owner (uid %u), and was not made by this writer: a file moved "
                         "in from elsewhere, which writing the lock note as root would "
                         "overwrite: remove it", path, l->tr.root_uid);
    }
    if (!rc && (rc = fsio_lock(&l->fs, fd))) {
        fsio_close(&l->fs, fd);
        if (rc == -EWOULDBLOCK) {
            char who[LOCK_NOTE_SIZE + 32];
            if (read_holder(l, path, who, sizeof who))
                rc = ckpt_seterr(CKPT_EBUSY, "%s is already open for writing in this "
                                 "process (%s; lock file %s): close that store first, or "
                                 "open this one with CKPT_OPEN_READONLY to read", l->root,
                                 who, path);
            else
                rc = ckpt_seterr(CKPT_EBUSY, "%s is locked by another writer (%s; lock "
                                 "file %s); open it with CKPT_OPEN_READONLY to read",
                                 l->root, who, path);
        } else {
            rc = ckpt_seterr_errno(-rc, "cannot lock %s", path);
        }
    }
    if (!rc) {
        char note[LOCK_NOTE_SIZE], host[64] = "?";
        gethostname(host, sizeof host - 1);
        int n = snprintf(note, sizeof note, "%ld %s", (long)getpid(), host);
        memset(note + n, ' ', sizeof note - (size_t)n);
        note[sizeof note - 1] = '\n';
        fsio_pwrite(&l->fs, fd, note, sizeof note, 0); /* informative only */
        l->lock_fd = fd;
    }
    free(path);
    return rc;
}

int layout_check_lock(layout *l)
{
    if (l->lock_fd < 0)
        return ckpt_seterr(CKPT_EACCES, "%s is not open for writing", l->root);
    char *path = util_join(l->root, LAYOUT_LOCK_NAME);
    char *at = layout_pinned_path(l, LAYOUT_LOCK_NAME); /* the root it locked */
    if (!path || !at) {
        free(path);
        free(at);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    int same = 0;
    int rc = fsio_same_file(&l->fs, l->lock_fd, at, &same);
    free(at);
    if (rc && rc != -ENOENT)
        rc = ckpt_seterr_errno(-rc, "cannot check the lock file %s", path);
    else if (rc || !same)
        rc = ckpt_seterr(CKPT_EBUSY, "the lock file %s was removed or replaced while this "
                         "writer held it: another writer may be using %s, so nothing more is "
                         "committed or removed", path, l->root);
    free(path);
    return rc;
}

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The kind of ROOT/name (in the pinned root), not following a link, in
 * *kind: FSIO_KIND_NONE when it cannot be told (gone since the listing).
 * Returns 0, or -ENOMEM: out of memory is not "no such entry", which would
 * drop a committed step from the listing (a restore then took an older
 * one). */
static int entry_kind(layout *l, const char *name, int *kind)
{
    *kind = FSIO_KIND_NONE;
    char *p = layout_pinned_path(l, name);
    if (!p)
        return -ENOMEM;
    if (fsio_kind(&l->fs, p, 0, kind))
        *kind = FSIO_KIND_NONE;
    free(p);
    return 0;
}

/* An entry's kind in words, for messages. */
static const char *kind_words(int kind)
{
    switch (kind) {
    case FSIO_KIND_FILE: return "a regular file";
    case FSIO_KIND_LINK: return "a symbolic link";
    case FSIO_KIND_DIR: return "a directory";
    default: return "a special file (FIFO, socket or device)";
    }
}

int layout_scan(layout *l, int64_t **steps, size_t *count)
{
    *steps = NULL;
    *count = 0;
    char **names;
    size_t n;
    /* A writer lists the root it pinned, whatever its path names by now:
     * a member of a trusted group who renames the root's path to another
     * of the caller's directories must not have the writer restore (and
     * save again in the shared root) a private run. */
    int rc = fsio_list(&l->fs, l->at ? l->at : l->root, &names, &n);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot list the checkpoint root %s", l->root);
    /* A removed directory lists as empty: the job would start afresh. */
    fsio_info in;
    if (l->at && l->pin_fd >= 0 && fsio_info_of(&l->fs, l->at, l->pin_fd, &in) == 0 &&
        in.nlink == 0) {
        fsio_list_free(names, n);
        return ckpt_seterr(CKPT_ENOTFOUND, "the checkpoint root %s was removed while this "
                           "store had it open (a directory made since under that name is "
                           "another one): open the store again", l->root);
    }
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) {
        fsio_list_free(names, n);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory listing %s", l->root);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { /* a file or link named like a step is none */
        int kind;
        if (!layout_parse_step_name(names[i], &v[k]))
            continue;
        if (entry_kind(l, names[i], &kind)) {
            fsio_list_free(names, n);
            free(v);
            return ckpt_seterr(CKPT_ENOMEM, "out of memory listing %s", l->root);
        }
        k += kind == FSIO_KIND_DIR;
    }
    fsio_list_free(names, n);
    qsort(v, k, sizeof *v, cmp_i64);
    *steps = v;
    *count = k;
    return CKPT_OK;
}

/* A fresh entry name for `prefix` (ROOT/name; pinned: through l->at). */
static char *unique_name(layout *l, const char *prefix, int64_t step, int pinned)
{
    char name[128];
    snprintf(name, sizeof name, "%sstep-%012lld-%ld-%u", prefix, (long long)step,
             (long)getpid(), ++l->seq);
    return pinned ? layout_pinned_path(l, name) : util_join(l->root, name);
}

static char *pinned_step_path(const layout *l, int64_t step)
{
    char name[LAYOUT_NAME_SIZE];
    layout_step_name(step, name);
    return layout_pinned_path(l, name);
}

/* fsync the root directory itself (the pinned one). */
static int sync_root(layout *l)
{
    return fsio_fsync_path(&l->fs, l->at ? l->at : l->root);
}

/* Forget the previous save's temporary directory (its descriptor and
 * names). */
static void temp_forget(layout *l)
{
    if (l->tmp_fd >= 0)
        close(l->tmp_fd);
    l->tmp_fd = -1;
    l->tmp_known = 0;
    free(l->tmp_at);
    free(l->tmp_name);
    free(l->tmp_shown);
    l->tmp_at = l->tmp_name = l->tmp_shown = NULL;
}

/* The temporary directory `p` (a path through the pinned root, just made
 * or found, known to be a directory of identity `in`), pinned like the
 * root: *path becomes "/proc/self/fd/N" of a descriptor of it, through
 * which every file of the save is created, so that renaming the entry
 * (a trusted group's member may) cannot send them elsewhere.  Without
 * /proc (or memory for the names), p stays the path: unpinned. */
static void temp_pin(layout *l, char **path, const fsio_info *in)
{
    const char *slash = strrchr(*path, '/');
    const char *name = slash ? slash + 1 : *path;
    int fd = open(*path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb, via;
    char at[40];
    snprintf(at, sizeof at, "/proc/self/fd/%d", fd);
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_dev != in->dev || sb.st_ino != in->ino ||
        stat(at, &via) != 0 || via.st_ino != sb.st_ino || !(l->tmp_at = util_strdup(at)) ||
        !(l->tmp_name = util_strdup(name)) || !(l->tmp_shown = util_join(l->root, name))) {
        if (fd >= 0)
            close(fd);
        free(l->tmp_at);
        free(l->tmp_name);
        l->tmp_at = l->tmp_name = NULL;
        return;
    }
    l->tmp_fd = fd;
    /* `name` points into *path: the new path is made before it is freed */
    char *pinned = util_strdup(at);
    if (!pinned)
        pinned = util_join(l->at ? l->at : l->root, name);
    if (pinned) { /* else keep the path given, which works */
        free(*path);
        *path = pinned;
    }
}

/* The entry of the save's temporary directory `tmp` (as layout_make_temp
 * gave it) in the pinned root. */
static char *temp_entry(const layout *l, const char *tmp)
{
    if (l->tmp_at && l->tmp_name && strcmp(tmp, l->tmp_at) == 0)
        return layout_pinned_path(l, l->tmp_name);
    return pinned_entry(l, tmp);
}

int layout_make_temp(layout *l, int64_t step, char **path)
{
    temp_forget(l);
    char *p;
    if (l->shared_tag[0]) {
        char name[128];
        snprintf(name, sizeof name, "%sstep-%012lld-%s", LAYOUT_TMP_PREFIX, (long long)step,
                 l->shared_tag);
        p = layout_pinned_path(l, name);
    } else {
        p = unique_name(l, LAYOUT_TMP_PREFIX, step, 1);
    }
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = make_dir(l, p);
    if (rc == -EEXIST && l->shared_tag[0]) {
        int kind = FSIO_KIND_NONE; /* another rank was first: never through a link */
        rc = fsio_kind(&l->fs, p, 0, &kind);
        if (!rc && kind != FSIO_KIND_DIR)
            rc = -EEXIST;
        int trc = rc ? CKPT_OK : layout_check_trusted(l, p);
        if (trc) {
            free(p);
            return trc;
        }
    }
    if (rc) {
        rc = layout_shown_error(l, ckpt_seterr_errno(-rc, "cannot create the temporary "
                                                     "directory %s", p));
        free(p);
        return rc;
    }
    /* What was made (or found, on several ranks), in the pinned root: a
     * directory, not a link swapped in since. */
    fsio_info in;
    char *pinned = pinned_entry(l, p);
    rc = pinned ? fsio_info_of(&l->fs, pinned, -1, &in) : -ENOMEM;
    free(pinned);
    if (rc || in.kind != FSIO_KIND_DIR) {
        rc = rc ? ckpt_seterr_errno(-rc, "cannot stat the temporary directory %s", p)
                : ckpt_seterr(CKPT_EACCES, "the temporary directory %s was replaced as "
                              "soon as it was made (another user who can write the root "
                              "renamed it): nothing is written", p);
        free(p);
        return layout_shown_error(l, rc);
    }
    l->tmp_known = 1;
    l->tmp_dev = in.dev;
    l->tmp_ino = in.ino;
    temp_pin(l, &p, &in);
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    *path = p;
    return CKPT_OK;
}

void layout_remove_temp(layout *l, const char *path)
{
    char *p = temp_entry(l, path);
    if (p)
        fsio_remove_tree(&l->fs, p);
    free(p);
}

/* CKPT_OK when `pinned` (the temporary directory, or the step it was
 * renamed to) is the directory layout_make_temp made for this save; else
 * CKPT_EACCES: a member of a group the root trusts (who may rename its
 * entries) swapped another entry in, and the save's files went there or
 * nowhere.  The caller must not be told the step is safe. */
static int temp_is_ours(layout *l, const char *pinned, const char *tmp, int64_t step)
{
    fsio_info in;
    int rc = fsio_info_of(&l->fs, pinned, -1, &in);
    if (!l->tmp_known || (!rc && in.kind == FSIO_KIND_DIR && in.dev == l->tmp_dev &&
                          in.ino == l->tmp_ino))
        return CKPT_OK;
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot check the temporary directory %s before "
                                 "committing step %lld", tmp, (long long)step);
    return layout_shown_error(
        l, ckpt_seterr(CKPT_EACCES, "step %lld is not committed: %s is no longer the "
                       "temporary directory this save made and wrote (another user who can "
                       "write %s replaced it%s)", (long long)step, tmp, l->root,
                       in.kind == FSIO_KIND_LINK ? " with a link" : ""));
}

int layout_commit(layout *l, const char *tmp, int64_t step)
{
    int lrc = layout_check_lock(l);
    if (lrc)
        return lrc;
    /* Renamed in the pinned root, whatever its path names by now. */
    char *final = pinned_step_path(l, step), *from = temp_entry(l, tmp);
    int rc = final && from ? CKPT_OK
                           : ckpt_seterr(CKPT_ENOMEM, "out of memory committing step %lld",
                                         (long long)step);
    if (rc || (rc = temp_is_ours(l, from, tmp, step))) {
        free(final);
        free(from);
        return rc;
    }
    rc = fsio_rename(&l->fs, from, final);
    if (rc == -ENOTEMPTY || rc == -EEXIST) {
        /* Replace an existing step atomically: swap, then delete the old
         * one, which now sits under the temporary name. */
        rc = fsio_exchange(&l->fs, from, final);
        if (rc == 0) {
            fsio_remove_tree(&l->fs, from);
        } else if (rc == -EINVAL || rc == -ENOSYS || rc == -ENOTSUP) {
            /* No atomic swap on this file system: move the old one aside
             * under a name the next open puts back if we die in between,
             * and put it back ourselves if the second rename fails. */
            char *aside = unique_name(l, LAYOUT_REPLACED_PREFIX, step, 1);
            rc = aside ? fsio_rename(&l->fs, final, aside) : -ENOMEM;
            if (rc == 0) {
                rc = fsio_rename(&l->fs, from, final);
                if (rc == 0)
                    fsio_remove_tree(&l->fs, aside);
                else
                    fsio_rename(&l->fs, aside, final);
            }
            free(aside);
        }
    }
    if (!rc && (rc = temp_is_ours(l, final, tmp, step))) {
        free(final);
        free(from);
        return rc;
    }
    free(final);
    free(from);
    if (rc) {
        char name[LAYOUT_NAME_SIZE];
        layout_step_name(step, name);
        char *shown = util_join(l->root, name);
        int kind = FSIO_KIND_NONE;
        if (rc == -ENOTDIR && !entry_kind(l, name, &kind) && kind != FSIO_KIND_NONE &&
            kind != FSIO_KIND_DIR) {
            /* Left by someone, not by a writer: every later save of this
             * step would fail the same way until it is removed. */
            rc = layout_shown_error(
                l, ckpt_seterr(CKPT_EIO, "cannot commit step %lld: %s is %s, not a "
                               "checkpoint, and stands where the step goes; remove it "
                               "(ckpt doctor lists such entries)", (long long)step,
                               shown ? shown : name, kind_words(kind)));
        } else {
            rc = layout_shown_error(l, ckpt_seterr_errno(-rc, "cannot commit %s as %s", tmp,
                                                         shown ? shown : "?"));
        }
        free(shown);
        return rc;
    }
    if (l->fsync && (rc = sync_root(l)))
        return ckpt_seterr_errno(-rc, "cannot fsync the checkpoint root %s", l->root);
    return CKPT_OK;
}

int layout_retire_prepare(layout *l, int64_t step, char **path, char **trash)
{
    *path = pinned_step_path(l, step);
    *trash = unique_name(l, LAYOUT_TRASH_PREFIX, step, 1);
    if (*path && *trash)
        return CKPT_OK;
    free(*path);
    free(*trash);
    *path = *trash = NULL;
    return ckpt_seterr_errno(ENOMEM, "cannot retire step %lld", (long long)step);
}

int layout_retire(layout *l, int64_t step)
{
    char *path, *trash;
    int rc = layout_retire_prepare(l, step, &path, &trash);
    return rc ? rc : layout_retire_prepared(l, step, path, trash);
}

int layout_retire_prepared(layout *l, int64_t step, char *path, char *trash)
{
    int rc = path && trash ? fsio_rename(&l->fs, path, trash) : -ENOMEM;
    if (rc == 0) {
        if (l->fsync)
            sync_root(l);
        char **more = l->defer_removal
                          ? realloc(l->removals, (l->nremovals + 1) * sizeof *more) : NULL;
        if (more) {
            l->removals = more;
            l->removals[l->nremovals++] = trash;
            trash = NULL; /* the list owns it */
        } else {
            fsio_remove_tree(&l->fs, trash); /* leftovers are cleaned next open */
        }
    }
    if (rc)
        rc = ckpt_seterr_errno(-rc, "cannot retire step %lld", (long long)step);
    free(path);
    free(trash);
    return rc;
}

int layout_retain(layout *l, const int64_t *steps, size_t n, size_t keep_last,
                  int64_t protect1, int64_t protect2, int dry_run, ckpt_report *report)
{
    int rc = dry_run ? CKPT_OK : layout_check_lock(l);
    if (rc)
        return rc;
    for (size_t i = 0; i + keep_last < n; i++) {
        if (steps[i] == protect1 || steps[i] == protect2)
            continue;
        if (!dry_run && (rc = layout_retire(l, steps[i])))
            return rc;
        char name[LAYOUT_NAME_SIZE];
        layout_step_name(steps[i], name);
        if (report_add(report, steps[i], CKPT_OK, dry_run ? "would retire" : "retired", name,
                       "", -1))
            return ckpt_seterr(CKPT_ENOMEM, "out of memory listing step %lld in the report",
                               (long long)steps[i]);
    }
    return CKPT_OK;
}

/* `.replaced-step-N-...`: the committed step N, moved aside by a writer
 * that died before its replacement was renamed in.  It is still the
 * checkpoint, unless the replacement made it. */
static int recover_replaced(layout *l, const char *name)
{
    int64_t step;
    char stepname[LAYOUT_NAME_SIZE];
    const char *rest = name + strlen(LAYOUT_REPLACED_PREFIX);
    const char *dash = strlen(rest) > strlen(LAYOUT_STEP_PREFIX)
                           ? strchr(rest + strlen(LAYOUT_STEP_PREFIX), '-') : NULL;
    if (!dash || (size_t)(dash - rest) >= sizeof stepname)
        return CKPT_OK;
    memcpy(stepname, rest, (size_t)(dash - rest));
    stepname[dash - rest] = '\0';
    if (!layout_parse_step_name(stepname, &step))
        return CKPT_OK;
    char *from = layout_pinned_path(l, name), *to = pinned_step_path(l, step);
    /* Out of memory must be said: the store would open without step N
     * (restore taking an older one) until the next open put it back. */
    int rc = from && to ? CKPT_OK
                        : ckpt_seterr(CKPT_ENOMEM, "out of memory putting back step %lld, "
                                      "moved aside in %s/%s", (long long)step, l->root, name);
    if (from && to) {
        int kind = FSIO_KIND_NONE, krc = fsio_kind(&l->fs, to, 0, &kind);
        if (krc == -ENOENT) {
            if (fsio_rename(&l->fs, from, to) == 0 && l->fsync)
                sync_root(l);
        } else if (!krc && kind == FSIO_KIND_DIR && !layout_holds_superusers_dir(l, from)) {
            fsio_remove_tree(&l->fs, from); /* the replacement made it */
        }
        /* else step-N is no step (a file or link left there) or cannot be
         * looked at: the copy aside may be the only one, and stays */
    }
    free(from);
    free(to);
    return rc;
}

/* Directories deeper than this below an entry are not walked: a tree that
 * deep counts as holding one of root's (layout_holds_superusers_dir). */
#define SUPERUSER_WALK_DEPTH 32

static int holds_superusers_dir(const fsio *fs, const char *path, int depth)
{
    fsio_info in;
    if (fsio_info_of(fs, path, -1, &in) != 0 || in.kind != FSIO_KIND_DIR)
        return 0; /* gone, a file or a link: removing it empties nothing */
    if (in.uid == 0 || depth >= SUPERUSER_WALK_DEPTH)
        return 1;
    char **names;
    size_t n;
    if (fsio_list(fs, path, &names, &n) != 0)
        return 1; /* cannot tell: keep it */
    int held = 0;
    for (size_t i = 0; i < n; i++) {
        char *sub = held ? NULL : util_join(path, names[i]);
        if (!held)
            held = !sub || holds_superusers_dir(fs, sub, depth + 1);
        free(sub);
    }
    fsio_list_free(names, n);
    return held;
}

int layout_holds_superusers_dir(const layout *l, const char *path)
{
    if (geteuid() != 0 || l->tr.root_uid == 0)
        return 0;
    return holds_superusers_dir(&l->fs, path, 0);
}

int layout_clean_stale(layout *l, int dry_run, ckpt_report *report)
{
    char **names;
    size_t n;
    int rc = dry_run ? CKPT_OK : layout_check_lock(l);
    if (rc)
        return rc;
    /* The pinned root, as layout_scan lists it: the names are removed
     * there, whatever the root's path names by now. */
    rc = fsio_list(&l->fs, l->at ? l->at : l->root, &names, &n);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot list %s", l->root);
    for (size_t i = 0; i < n; i++) {
        if (has_prefix(names[i], LAYOUT_REPLACED_PREFIX)) {
            int e = dry_run ? CKPT_OK : recover_replaced(l, names[i]);
            if (e && (!rc || e == CKPT_ENOMEM)) /* a step left aside: the open */
                rc = e;                          /* must fail, whatever came before */
            continue;
        }
        if (!has_prefix(names[i], LAYOUT_TMP_PREFIX) &&
            !has_prefix(names[i], LAYOUT_TRASH_PREFIX))
            continue;
        char *p = layout_pinned_path(l, names[i]);
        if (p && layout_holds_superusers_dir(l, p)) {
            free(p); /* not the owner's to remove, so not ours: left in place */
            continue;
        }
        int e = p ? (dry_run ? 0 : fsio_remove_tree(&l->fs, p)) : -ENOMEM;
        free(p);
        if (e == -FSIO_ESPARED)
            continue; /* holds what is not the owner's to remove: left in place */
        if (e) {
            if (!rc)
                rc = ckpt_seterr_errno(-e, "cannot remove %s/%s", l->root, names[i]);
            continue;
        }
        if (report_add(report, -1, CKPT_OK, dry_run ? "would remove stale temporary directory"
                       : "removed stale temporary directory", names[i], "", -1) && !rc)
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory listing %s in the report", names[i]);
    }
    fsio_list_free(names, n);
    return rc;
}

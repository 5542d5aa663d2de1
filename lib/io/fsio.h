/* fsio: every file-system call libckpt makes goes through here, so tests can
 * make any one of them fail on purpose (the idea of SQLite's aSyscall[]).
 * Functions return 0 (or a count / fd) on success and -errno on failure;
 * callers turn that into a status with a message naming the file. */
#ifndef CKPT_FSIO_H
#define CKPT_FSIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef enum fsio_op {
    FSIO_OPEN, FSIO_CLOSE, FSIO_PREAD, FSIO_PWRITE, FSIO_FSYNC, FSIO_RENAME,
    FSIO_UNLINK, FSIO_MKDIR, FSIO_RMDIR, FSIO_READDIR, FSIO_STAT, FSIO_LOCK,
    FSIO_OP_COUNT
} fsio_op;

/* Called before each operation; returning a positive errno makes the
 * operation fail with it without touching the file system.  `path` is the
 * file's path, or NULL for calls on a descriptor. */
typedef int (*fsio_fault_fn)(void *ctx, fsio_op op, const char *path);

/* What one completed operation did, for a test's trace of the calls (the
 * durability-order checks and the power-loss simulation replay it). */
typedef struct fsio_event {
    fsio_op op;
    const char *path;   /* the path operated on, NULL for descriptor calls */
    const char *path2;  /* rename/exchange: the destination; else NULL */
    int fd;             /* open: the new descriptor; descriptor calls: it */
    int flags;          /* open: the flags; exchange: 1, rename: 0 */
    const void *buf;    /* pwrite: the bytes written (as written) */
    size_t len;         /* pwrite, pread: the byte count */
    uint64_t off;       /* pwrite, pread: the file offset */
} fsio_event;
/* Called after each operation that succeeded (one pwrite system call is one
 * event: a write the hook shortened shows as several). */
typedef void (*fsio_trace_fn)(void *ctx, const fsio_event *ev);
/* Called before each pwrite system call with the `n` bytes at `*data` due
 * at `off`.  May return fewer (>= 1) to make the call short, as a real
 * write may be, and may point *data at other bytes of that length to write
 * instead (a device garbling data).  Returns how many to write. */
typedef size_t (*fsio_write_fn)(void *ctx, int fd, uint64_t off, const void **data,
                                size_t n);

/* Told of each write-back hint before it is given (fsio_writeback_start:
 * `wait` 0; fsio_writeback: 1): the hints are neither faulted nor traced,
 * and this only watches them. */
typedef void (*fsio_hint_fn)(void *ctx, int fd, uint64_t off, uint64_t len, int wait);

/* Told when a thread passes a named point of the library (fsio_point)
 * where a race window opens that no file-system call falls in, so that a
 * test can hold the window open there.  Never faulted or traced. */
typedef void (*fsio_point_fn)(void *ctx, const char *where);

typedef struct fsio {
    fsio_fault_fn fault; /* all NULL in production */
    fsio_trace_fn trace;
    fsio_write_fn write;
    void *ctx;           /* passed to each of them */
    fsio_hint_fn hint;
    fsio_point_fn point;
    /* 1: fsio_remove_tree leaves a directory owned by uid 0, and what it
     * holds, in place (-FSIO_ESPARED), judged on the directory it opened, not on
     * a path: the superuser's writer in another user's root (layout.c),
     * whose owner could swap a directory of root's under a name being
     * removed and have root delete what the owner may not.  So is one of
     * an owner for which owner_ok (when set) returns 0: a third user's
     * directory the root's owner moved in. */
    int spare_superuser_dirs;
    int (*owner_ok)(unsigned uid, unsigned root_uid, unsigned root_gid);
    unsigned spare_root_uid, spare_root_gid; /* passed to owner_ok */
} fsio;

/* Tell fs->point, if any, that this thread is at `where` (a string
 * constant naming the point, e.g. "save_begin: paced"). */
void fsio_point(const fsio *fs, const char *where);

int fsio_open(const fsio *fs, const char *path, int flags, int mode);
/* Open an existing regular file for reading, never blocking and never
 * following a link: a FIFO, device, directory or symbolic link at `path`
 * is FSIO_ENOTREG (negated) instead of a hang or a read of its target. */
#define FSIO_ENOTREG 4096 /* not an errno: above their range */
/* fsio_remove_tree met a directory it spares (fsio.spare_superuser_dirs):
 * left in place on purpose, not a failure to report. */
#define FSIO_ESPARED 4097
int fsio_open_regular(const fsio *fs, const char *path);
int fsio_close(const fsio *fs, int fd);
/* Full reads and writes: loop over short counts.  fsio_pread returns the
 * number of bytes read (less than n only at end of file). */
int64_t fsio_pread(const fsio *fs, int fd, void *buf, size_t n, uint64_t off);
/* fsio_pread of consecutive file bytes into `iovcnt` buffers (at most
 * IOV_MAX; `iov` is advanced over what was read): one call scatters a run
 * of frames straight into the buffers they belong in. */
int64_t fsio_preadv(const fsio *fs, int fd, struct iovec *iov, int iovcnt, uint64_t off);
int fsio_pwrite(const fsio *fs, int fd, const void *buf, size_t n, uint64_t off);
int fsio_fsync(const fsio *fs, int fd);
int fsio_fsync_path(const fsio *fs, const char *dir); /* open O_RDONLY + fsync */
/* Write the dirty pages of [off, off + len) of `fd` out now and wait for
 * them (Linux sync_file_range; len 0: to the end of the file): a hint that
 * keeps the disk busy and lets the caller time it.  It promises no durability (no metadata, no device cache flush;
 * only fsync does), so it is neither faulted nor traced: a test's fault
 * counts and power-loss replay stay what the durable calls make them.
 * 0, or -errno where the file system cannot (callers ignore it). */
int fsio_writeback(const fsio *fs, int fd, uint64_t off, uint64_t len);
/* Start writing [off, off + len) of `fd` out to the disk and return
 * without waiting (sync_file_range, SYNC_FILE_RANGE_WRITE): the disk works
 * while the caller goes on, instead of idling until someone waits.  A
 * hint like fsio_writeback (no durability, never faulted or traced).
 * 0, or -errno where the file system cannot (callers ignore it). */
int fsio_writeback_start(const fsio *fs, int fd, uint64_t off, uint64_t len);
/* Drop the clean pages of [off, off + len) of `fd` from the page cache
 * (POSIX_FADV_DONTNEED): a hint, like fsio_writeback never faulted or
 * traced.  Dirty pages stay (the kernel drops only what is on the disk),
 * so no data is ever lost.  0, or -errno (callers ignore it). */
int fsio_drop_cache(const fsio *fs, int fd, uint64_t off, uint64_t len);
int fsio_rename(const fsio *fs, const char *from, const char *to);
/* Atomically swap two existing paths (renameat2 RENAME_EXCHANGE); -EINVAL or
 * -ENOSYS where the file system cannot. */
int fsio_exchange(const fsio *fs, const char *a, const char *b);
int fsio_unlink(const fsio *fs, const char *path);
int fsio_mkdir(const fsio *fs, const char *path, int mode);
int fsio_rmdir(const fsio *fs, const char *path);
/* Names in `dir` except "." and "..", malloc'd array of malloc'd strings. */
int fsio_list(const fsio *fs, const char *dir, char ***names, size_t *count);
void fsio_list_free(char **names, size_t count);
/* What a path is (FSIO_STAT): with `follow` 0 a symbolic link is
 * FSIO_KIND_LINK, never its target. */
enum { FSIO_KIND_NONE, FSIO_KIND_FILE, FSIO_KIND_DIR, FSIO_KIND_LINK, FSIO_KIND_OTHER };
int fsio_kind(const fsio *fs, const char *path, int follow, int *kind);
/* The target of the symbolic link `path`, malloc'd and NUL-terminated
 * (FSIO_STAT). */
int fsio_readlink(const fsio *fs, const char *path, char **target);
/* Named writers of a POSIX ACL that fsio_info lists. */
#define FSIO_ACL_NAMED_MAX 16
typedef struct fsio_acl_entry {
    unsigned id;
    int group;     /* 1: a named group, 0: a named user */
} fsio_acl_entry;
/* Who owns a path or descriptor and who may write it (FSIO_STAT). */
typedef struct fsio_info {
    int kind;          /* FSIO_KIND_* */
    unsigned uid, gid; /* owner */
    unsigned mode;     /* permission bits (07777) */
    unsigned nlink;    /* names (hard links) the file has */
    uint64_t dev, ino; /* identity */
    int64_t ctime_ns;  /* last status change: a rename changes it, so an
                          inode number reused by a new directory differs */
    int acl_writers;   /* a POSIX access ACL lets a named user other than
                          the owner, or a named group, write it (mode's
                          group bits then show only the ACL's mask) */
    int acl_present;   /* an access ACL with named entries: the mode's group
                          bits are its mask; acl_group_w says whether the
                          owning group may write (its entry, masked) */
    int acl_group_w;
    int acl_nnamed;    /* those writers listed in acl_named (-1: more than
                          fit, or an ACL too large to read: unknown) */
    fsio_acl_entry acl_named[FSIO_ACL_NAMED_MAX];
    /* A directory's default ACL, which entries made in it inherit: its
     * named writers, as above. */
    int dacl_writers;
    int dacl_nnamed;
    fsio_acl_entry dacl_named[FSIO_ACL_NAMED_MAX];
} fsio_info;
/* Of `path`, not following a link (fd < 0), or of the open `fd`. */
int fsio_info_of(const fsio *fs, const char *path, int fd, fsio_info *info);
/* *same = 1 when `path` (not followed) is the file open as `fd`. */
int fsio_same_file(const fsio *fs, int fd, const char *path, int *same);
/* st_size of a descriptor. */
int fsio_fstat(const fsio *fs, int fd, uint64_t *size);
/* Bytes available to the caller on the file system holding `path`
 * (statvfs f_bavail * f_frsize; FSIO_STAT). */
int fsio_free_bytes(const fsio *fs, const char *path, uint64_t *bytes);
/* flock(LOCK_EX | LOCK_NB); -EWOULDBLOCK when another holder has it. */
int fsio_lock(const fsio *fs, int fd);
/* Read a whole (small) file into a malloc'd, NUL-terminated buffer. */
int fsio_read_file(const fsio *fs, const char *path, uint64_t max_bytes,
                   char **data, size_t *len);
/* Remove a directory and what is in it.  Never follows a symbolic link: a
 * link (at the top or inside) is removed as a link, its target untouched.
 * With fs->spare_superuser_dirs, a directory owned by uid 0 (or by an
 * owner fs->owner_ok refuses) met on the way, judged by descriptor, ends
 * the removal with -FSIO_ESPARED, itself untouched. */
int fsio_remove_tree(const fsio *fs, const char *dir);

#endif

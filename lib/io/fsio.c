/* fsio: the one seam for file-system calls (see fsio.h). */
#include "fsio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "util.h"

#define FAULT(fs, op, path)                                  \
    do {                                                     \
        if ((fs) && (fs)->fault) {                           \
            int e_ = (fs)->fault((fs)->ctx, (op), (path));   \
            if (e_ > 0)                                      \
                return -e_;                                  \
        }                                                    \
    } while (0)

/* Report a completed operation to the tracer, if any. */
static void trace(const fsio *fs, fsio_op op, const char *path, const char *path2, int fd,
                  int flags, const void *buf, size_t len, uint64_t off)
{
    if (fs && fs->trace) {
        fsio_event ev = {op, path, path2, fd, flags, buf, len, off};
        fs->trace(fs->ctx, &ev);
    }
}
#define TRACE_PATH(fs, op, path, rc) \
    ((rc) == 0 ? trace((fs), (op), (path), NULL, -1, 0, NULL, 0, 0) : (void)0)

int fsio_open(const fsio *fs, const char *path, int flags, int mode)
{
    FAULT(fs, FSIO_OPEN, path);
    int fd = open(path, flags | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    trace(fs, FSIO_OPEN, path, NULL, fd, flags, NULL, 0, 0);
    return fd;
}

int fsio_open_regular(const fsio *fs, const char *path)
{
    FAULT(fs, FSIO_OPEN, path);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ELOOP ? -FSIO_ENOTREG : -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return S_ISREG(st.st_mode) ? -e : -FSIO_ENOTREG;
    }
    trace(fs, FSIO_OPEN, path, NULL, fd, O_RDONLY, NULL, 0, 0);
    return fd;
}

int fsio_close(const fsio *fs, int fd)
{
    if (fs && fs->fault) {
        int e = fs->fault(fs->ctx, FSIO_CLOSE, NULL);
        if (e > 0) {
            close(fd); /* never leak the descriptor, even when failing on purpose */
            return -e;
        }
    }
    /* Traced before: once closed, another thread may get the same number. */
    trace(fs, FSIO_CLOSE, NULL, NULL, fd, 0, NULL, 0, 0);
    return close(fd) == 0 ? 0 : -errno;
}

int64_t fsio_pread(const fsio *fs, int fd, void *buf, size_t n, uint64_t off)
{
    struct iovec one = {buf, n};
    return fsio_preadv(fs, fd, &one, 1, off);
}

int64_t fsio_preadv(const fsio *fs, int fd, struct iovec *iov, int iovcnt, uint64_t off)
{
    FAULT(fs, FSIO_PREAD, NULL);
    const void *first = iovcnt > 0 ? iov[0].iov_base : NULL;
    size_t done = 0;
    while (iovcnt > 0) {
        ssize_t r = preadv(fd, iov, iovcnt, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        done += (size_t)r;
        size_t left = (size_t)r;
        while (iovcnt > 0 && left >= iov[0].iov_len) { /* the buffers filled whole */
            left -= iov[0].iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) { /* a short read stopped inside iov[0] */
            iov[0].iov_base = (char *)iov[0].iov_base + left;
            iov[0].iov_len -= left;
        }
    }
    trace(fs, FSIO_PREAD, NULL, NULL, fd, 0, first, done, off);
    return (int64_t)done;
}

int fsio_pwrite(const fsio *fs, int fd, const void *buf, size_t n, uint64_t off)
{
    FAULT(fs, FSIO_PWRITE, NULL);
    size_t done = 0;
    while (done < n) {
        const void *p = (const char *)buf + done;
        size_t want = n - done;
        if (fs && fs->write) {
            size_t w = fs->write(fs->ctx, fd, off + done, &p, want);
            want = w >= 1 && w < want ? w : want;
        }
        ssize_t r = pwrite(fd, p, want, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO;
        trace(fs, FSIO_PWRITE, NULL, NULL, fd, 0, p, (size_t)r, off + done);
        done += (size_t)r;
    }
    return 0;
}

int fsio_fsync(const fsio *fs, int fd)
{
    FAULT(fs, FSIO_FSYNC, NULL);
    if (fsync(fd) != 0)
        return -errno;
    trace(fs, FSIO_FSYNC, NULL, NULL, fd, 0, NULL, 0, 0);
    return 0;
}

int fsio_writeback(const fsio *fs, int fd, uint64_t off, uint64_t len)
{
    if (fs && fs->hint)
        fs->hint(fs->ctx, fd, off, len, 1);
#if defined(__linux__)
    unsigned flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                     SYNC_FILE_RANGE_WAIT_AFTER;
    return sync_file_range(fd, (off_t)off, (off_t)len, flags) == 0 ? 0 : -errno;
#else
    (void)fd;
    (void)off;
    (void)len;
    return -ENOSYS;
#endif
}

void fsio_point(const fsio *fs, const char *where)
{
    if (fs && fs->point)
        fs->point(fs->ctx, where);
}

int fsio_writeback_start(const fsio *fs, int fd, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 0; /* 0 would mean "to the end of the file" */
    if (fs && fs->hint)
        fs->hint(fs->ctx, fd, off, len, 0);
#if defined(__linux__)
    return sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE) == 0 ? 0 : -errno;
#else
    (void)fd;
    (void)off;
    return -ENOSYS;
#endif
}

int fsio_drop_cache(const fsio *fs, int fd, uint64_t off, uint64_t len)
{
    (void)fs;
    if (len == 0)
        return 0; /* 0 would mean "to the end of the file" */
    return -posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

int fsio_fsync_path(const fsio *fs, const char *dir)
{
    int fd = fsio_open(fs, dir, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0)
        return fd;
    int rc = fsio_fsync(fs, fd);
    int rc2 = fsio_close(fs, fd);
    return rc ? rc : rc2;
}

int fsio_rename(const fsio *fs, const char *from, const char *to)
{
    FAULT(fs, FSIO_RENAME, from);
    if (rename(from, to) != 0)
        return -errno;
    trace(fs, FSIO_RENAME, from, to, -1, 0, NULL, 0, 0);
    return 0;
}

int fsio_exchange(const fsio *fs, const char *a, const char *b)
{
    FAULT(fs, FSIO_RENAME, a);
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0)
        return -errno;
    trace(fs, FSIO_RENAME, a, b, -1, 1, NULL, 0, 0);
    return 0;
#else
    return -ENOSYS;
#endif
}

int fsio_unlink(const fsio *fs, const char *path)
{
    FAULT(fs, FSIO_UNLINK, path);
    int rc = unlink(path) == 0 ? 0 : -errno;
    TRACE_PATH(fs, FSIO_UNLINK, path, rc);
    return rc;
}

int fsio_mkdir(const fsio *fs, const char *path, int mode)
{
    FAULT(fs, FSIO_MKDIR, path);
    int rc = mkdir(path, (mode_t)mode) == 0 ? 0 : -errno;
    TRACE_PATH(fs, FSIO_MKDIR, path, rc);
    return rc;
}

int fsio_rmdir(const fsio *fs, const char *path)
{
    FAULT(fs, FSIO_RMDIR, path);
    int rc = rmdir(path) == 0 ? 0 : -errno;
    TRACE_PATH(fs, FSIO_RMDIR, path, rc);
    return rc;
}

void fsio_list_free(char **names, size_t count)
{
    if (!names)
        return;
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

int fsio_list(const fsio *fs, const char *dir, char ***names, size_t *count)
{
    *names = NULL;
    *count = 0;
    FAULT(fs, FSIO_READDIR, dir);
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    char **v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        if (!(v[n] = util_strdup(e->d_name))) {
            rc = -ENOMEM;
            break;
        }
        n++;
        errno = 0;
    }
    if (!rc && errno)
        rc = -errno;
    closedir(d);
    if (rc) {
        fsio_list_free(v, n);
        return rc;
    }
    *names = v;
    *count = n;
    return 0;
}

int fsio_kind(const fsio *fs, const char *path, int follow, int *kind)
{
    FAULT(fs, FSIO_STAT, path);
    struct stat st;
    if ((follow ? stat(path, &st) : lstat(path, &st)) != 0)
        return -errno;
    *kind = S_ISREG(st.st_mode) ? FSIO_KIND_FILE : S_ISDIR(st.st_mode) ? FSIO_KIND_DIR
          : S_ISLNK(st.st_mode) ? FSIO_KIND_LINK : FSIO_KIND_OTHER;
    return 0;
}

int fsio_readlink(const fsio *fs, const char *path, char **target)
{
    FAULT(fs, FSIO_STAT, path);
    for (size_t size = 256;; size *= 2) { /* st_size lies on some file systems */
        char *buf = malloc(size);
        if (!buf)
            return -ENOMEM;
        ssize_t n = readlink(path, buf, size);
        if (n < 0) {
            int e = errno;
            free(buf);
            return -e;
        }
        if ((size_t)n < size) {
            buf[n] = '\0';
            *target = buf;
            return 0;
        }
        free(buf);
        if (size >= ((size_t)1 << 20))
            return -ENAMETOOLONG;
    }
}

/* One ACL xattr `name` of `path` (or `fd`): whether it has named entries
 * (*present), lets the owning group write (*group_w), and its named
 * writers (*writers; listed in named[*nnamed], -1 when unknown). */
static void acl_read(const char *path, int fd, const char *name, unsigned owner, int *present,
                     int *group_w, int *writers, int *nnamed, fsio_acl_entry *named)
{
    unsigned char b[4 + 8 * 128];
    *present = *group_w = *writers = *nnamed = 0;
    ssize_t n = fd >= 0 ? fgetxattr(fd, name, b, sizeof b) : lgetxattr(path, name, b, sizeof b);
    if (n < 0) {
        if (errno == ERANGE)
            *writers = 1, *nnamed = -1;
        return;
    }
    if (n < 4 || (n - 4) % 8 != 0)
        return;
    unsigned mask = 7, group_obj = 0;
    for (ssize_t i = 4; i < n; i += 8) {
        unsigned tag = b[i] | (unsigned)b[i + 1] << 8, perm = b[i + 2] | (unsigned)b[i + 3] << 8;
        if (tag == 0x10) /* ACL_MASK */
            mask = perm, *present = 1;
        else if (tag == 0x04) /* ACL_GROUP_OBJ */
            group_obj = perm;
    }
    *group_w = *present && (group_obj & mask & 2);
    if (!(mask & 2))
        return;
    for (ssize_t i = 4; i < n; i += 8) {
        unsigned tag = b[i] | (unsigned)b[i + 1] << 8, perm = b[i + 2] | (unsigned)b[i + 3] << 8;
        uint32_t id = b[i + 4] | (uint32_t)b[i + 5] << 8 | (uint32_t)b[i + 6] << 16 |
                      (uint32_t)b[i + 7] << 24;
        int user = tag == 0x02 && id != owner, group = tag == 0x08; /* ACL_USER, ACL_GROUP */
        if (!(perm & 2) || !(user || group))
            continue;
        *writers = 1;
        if (*nnamed < 0)
            continue;
        if (*nnamed == FSIO_ACL_NAMED_MAX) {
            *nnamed = -1;
            continue;
        }
        named[*nnamed].id = id;
        named[*nnamed].group = group;
        (*nnamed)++;
    }
}

/* Whether the POSIX access ACL of `path` (or `fd`) gives write permission,
 * after its mask, to a named user other than `owner` or to a named group
 * (and, of a directory, its default ACL: what entries made there get).
 * The xattr is the kernel's posix_acl_xattr layout: a 4-byte version,
 * then 8-byte entries {le16 tag, le16 perm, le32 id}.  No ACL (ENODATA),
 * or no ACL support: none.  One too large to read: writers, unknown
 * (assume the worst). */
static void acl_writers(const char *path, int fd, unsigned owner, int dir, fsio_info *info)
{
    acl_read(path, fd, "system.posix_acl_access", owner, &info->acl_present,
             &info->acl_group_w, &info->acl_writers, &info->acl_nnamed, info->acl_named);
    int unused_present, unused_group_w;
    info->dacl_writers = info->dacl_nnamed = 0;
    if (dir)
        acl_read(path, fd, "system.posix_acl_default", owner, &unused_present, &unused_group_w,
                 &info->dacl_writers, &info->dacl_nnamed, info->dacl_named);
}

int fsio_info_of(const fsio *fs, const char *path, int fd, fsio_info *info)
{
    FAULT(fs, FSIO_STAT, path);
    struct stat st;
    if ((fd >= 0 ? fstat(fd, &st) : lstat(path, &st)) != 0)
        return -errno;
    /* Links carry no ACL; an ACL without named entries is the mode itself
     * and is never stored as an attribute, so most files cost one failed
     * getxattr (ENODATA). */
    if (S_ISLNK(st.st_mode))
        info->acl_writers = info->acl_nnamed = info->acl_present = info->acl_group_w =
            info->dacl_writers = info->dacl_nnamed = 0;
    else
        acl_writers(path, fd, (unsigned)st.st_uid, S_ISDIR(st.st_mode), info);
    info->kind = S_ISREG(st.st_mode) ? FSIO_KIND_FILE : S_ISDIR(st.st_mode) ? FSIO_KIND_DIR
               : S_ISLNK(st.st_mode) ? FSIO_KIND_LINK : FSIO_KIND_OTHER;
    info->uid = (unsigned)st.st_uid;
    info->gid = (unsigned)st.st_gid;
    info->mode = (unsigned)st.st_mode & 07777;
    info->nlink = (unsigned)st.st_nlink;
    info->dev = (uint64_t)st.st_dev;
    info->ino = (uint64_t)st.st_ino;
    info->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    return 0;
}

int fsio_same_file(const fsio *fs, int fd, const char *path, int *same)
{
    FAULT(fs, FSIO_STAT, path);
    struct stat a, b;
    if (fstat(fd, &a) != 0 || lstat(path, &b) != 0)
        return -errno;
    *same = a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    return 0;
}

int fsio_fstat(const fsio *fs, int fd, uint64_t *size)
{
    FAULT(fs, FSIO_STAT, NULL);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    *size = (uint64_t)st.st_size;
    return 0;
}

int fsio_free_bytes(const fsio *fs, const char *path, uint64_t *bytes)
{
    FAULT(fs, FSIO_STAT, path);
    struct statvfs v;
    if (statvfs(path, &v) != 0)
        return -errno;
    *bytes = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    return 0;
}

int fsio_lock(const fsio *fs, int fd)
{
    FAULT(fs, FSIO_LOCK, NULL);
    return flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : -errno;
}

int fsio_read_file(const fsio *fs, const char *path, uint64_t max_bytes,
                   char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd = fsio_open_regular(fs, path);
    if (fd < 0)
        return fd;
    uint64_t size;
    int rc = fsio_fstat(fs, fd, &size);
    if (rc == 0 && size > max_bytes)
        rc = -EFBIG;
    char *buf = NULL;
    if (rc == 0 && !(buf = malloc((size_t)size + 1)))
        rc = -ENOMEM;
    if (rc == 0) {
        int64_t got = fsio_pread(fs, fd, buf, (size_t)size, 0);
        if (got < 0)
            rc = (int)got;
        else if ((uint64_t)got != size)
            rc = -EIO; /* the file changed under us */
    }
    fsio_close(fs, fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return 0;
}

/* Deeper than any tree libckpt makes (a step directory holds files): a
 * crafted deeper one is refused, not recursed into. */
#define REMOVE_MAX_DEPTH 32

static int remove_in(const fsio *fs, int dfd, const char *path, int depth);

/* -FSIO_ESPARED when `fd` (a directory opened for removal) is one fs
 * spares (the superuser's, or a third user's: fsio.h); 0 otherwise. */
static int spared(const fsio *fs, int fd)
{
    struct stat st;
    if (!fs->spare_superuser_dirs)
        return 0;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (st.st_uid == 0)
        return -FSIO_ESPARED;
    if (fs->owner_ok && !fs->owner_ok((unsigned)st.st_uid, fs->spare_root_uid,
                                      fs->spare_root_gid))
        return -FSIO_ESPARED;
    return 0;
}

/* Remove entry `name` of the directory open as `dfd`, whose path is `path`
 * (named to the fault hook and the trace only).  Every call is relative to
 * `dfd` and none follows a link: a directory swapped for a symbolic link
 * while the tree is removed (by another user who may write in it) cannot
 * send an unlink outside the tree, as it could by path. */
static int remove_entry(const fsio *fs, int dfd, const char *name, const char *path,
                        int depth)
{
    FAULT(fs, FSIO_STAT, path);
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -errno;
    if (S_ISDIR(st.st_mode)) {
        int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK |
                                        O_CLOEXEC);
        if (cfd < 0 && errno != ELOOP && errno != ENOTDIR)
            return errno == ENOENT ? 0 : -errno;
        if (cfd >= 0) { /* else swapped for a link or file: unlinked below */
            int rc = spared(fs, cfd);
            if (!rc)
                rc = depth >= REMOVE_MAX_DEPTH ? -ELOOP : remove_in(fs, cfd, path, depth + 1);
            close(cfd);
            if (rc)
                return rc;
            FAULT(fs, FSIO_RMDIR, path);
            if (unlinkat(dfd, name, AT_REMOVEDIR) == 0) {
                TRACE_PATH(fs, FSIO_RMDIR, path, 0);
                return 0;
            }
            if (errno != ENOTDIR) /* else swapped for a link meanwhile: unlinked below */
                return errno == ENOENT ? 0 : -errno;
        }
    }
    FAULT(fs, FSIO_UNLINK, path);
    if (unlinkat(dfd, name, 0) != 0)
        return errno == ENOENT ? 0 : -errno;
    TRACE_PATH(fs, FSIO_UNLINK, path, 0);
    return 0;
}

/* Empty the directory open as `dfd` (its path `path`). */
static int remove_in(const fsio *fs, int dfd, const char *path, int depth)
{
    FAULT(fs, FSIO_READDIR, path);
    int lfd = dup(dfd); /* closedir closes it */
    if (lfd < 0)
        return -errno;
    DIR *d = fdopendir(lfd);
    if (!d) {
        int e = errno;
        close(lfd);
        return -e;
    }
    char **v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    errno = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        if (!(v[n] = util_strdup(e->d_name)))
            rc = -ENOMEM;
        else
            n++;
        errno = 0;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(d);
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *p = util_join(path, v[i]);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        rc = remove_entry(fs, dfd, v[i], p, depth);
        free(p);
    }
    fsio_list_free(v, n);
    return rc;
}

int fsio_remove_tree(const fsio *fs, const char *dir)
{
    FAULT(fs, FSIO_STAT, dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno != ELOOP && errno != ENOTDIR)
            return -errno;
        /* a link, file or FIFO: remove it, not its target */
        int rc = fsio_unlink(fs, dir);
        return rc == -ENOENT ? 0 : rc;
    }
    int rc = spared(fs, fd);
    if (!rc)
        rc = remove_in(fs, fd, dir, 0);
    close(fd);
    if (rc == 0) {
        rc = fsio_rmdir(fs, dir);
        if (rc == -ENOENT)
            rc = 0;
    }
    return rc;
}

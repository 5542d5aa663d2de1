/* shardfile: write and read shard files through the fsio seam. */
#include "shardfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "util.h"

/* Writes remembered between two write-back rounds (more merge). */
#define WRITE_LOG 64

struct shard_writer {
    const fsio *fs;
    char *path;
    int fd;
    unsigned char id[SHARD_ID_SIZE];
    pthread_mutex_t lock; /* protects next, written, entries, count, cap */
    uint64_t next;        /* file offset of the next frame */
    uint64_t written;     /* frame bytes whose pwrite has returned */
    uint64_t *busy;       /* start offsets of ranges reserved and not yet */
    size_t nbusy, capbusy; /* written and read back (one per worker) */
    shard_entry *entries;
    uint64_t count, cap;
    /* Write-back: with `early`, each frame range is handed to the disk as
     * soon as it is written.  `log` holds the writes not yet counted by a
     * write-back round (shard_writer_writeback), for the disk's rate. */
    int early;
    uint64_t page;       /* the system's page size: write-back cuts at it */
    struct written_range {
        double t;        /* when its write-back could start (seconds) */
        uint64_t end;    /* end offset of the range (a merged entry: the
                            largest) */
        uint64_t bytes;  /* bytes written */
    } log[WRITE_LOG];
    size_t nlog;
    uint64_t synced;     /* offset below which the last round waited */
    double round_end;    /* when the last round's wait returned (0: none) */
};

/* Under w->lock: note a written range; when the log is full, pairs of
 * entries merge (earliest time, largest end, bytes summed), which only
 * makes the rate estimate more cautious. */
static void log_written(shard_writer *w, double t, uint64_t end, uint64_t bytes)
{
    if (w->nlog == WRITE_LOG) {
        size_t k = 0;
        for (size_t i = 0; i + 1 < WRITE_LOG; i += 2, k++) {
            struct written_range a = w->log[i], b = w->log[i + 1];
            w->log[k] = (struct written_range){a.t < b.t ? a.t : b.t,
                                               a.end > b.end ? a.end : b.end,
                                               a.bytes + b.bytes};
        }
        w->nlog = k;
    }
    w->log[w->nlog++] = (struct written_range){t, end, bytes};
}

int shard_writer_fd(const shard_writer *w)
{
    return w ? w->fd : -1;
}

int shard_writer_open(shard_writer **out, const fsio *fs, const char *path,
                      int mode, int64_t step, const unsigned char id[SHARD_ID_SIZE],
                      uint32_t rank)
{
    shard_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = util_strdup(path))) {
        free(w);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory opening shard %s", path);
    }
    w->fs = fs;
    long page = sysconf(_SC_PAGESIZE);
    w->page = page > 0 ? (uint64_t)page : 4096;
    memcpy(w->id, id, SHARD_ID_SIZE);
    pthread_mutex_init(&w->lock, NULL);
    /* Read-write: frames may be read back (shard_writer_append). */
    w->fd = fsio_open(fs, path, O_RDWR | O_CREAT | O_EXCL, mode);
    if (w->fd < 0) {
        int e = -w->fd;
        w->fd = -1;
        shard_writer_free(w);
        return ckpt_seterr_errno(e, "cannot create shard %s", path);
    }
    unsigned char h[SHARD_HEADER_SIZE];
    shard_encode_header(h, step, id, rank);
    int rc = fsio_pwrite(fs, w->fd, h, sizeof h, 0);
    if (rc) {
        shard_writer_free(w);
        return ckpt_seterr_errno(-rc, "cannot write the header of shard %s", path);
    }
    w->next = SHARD_HEADER_SIZE;
    *out = w;
    return CKPT_OK;
}

int shard_writer_append(shard_writer *w, uint32_t tensor, uint64_t offset,
                        const chunk_meta *meta, const void *stored, void *check)
{
    shard_frame f = {tensor, offset, *meta};
    return shard_writer_append_frames(w, &f, 1, stored, check);
}

static int write_frames(shard_writer *w, const shard_frame *frames, size_t count,
                        const void *stored, void *check, uint64_t at, uint64_t total,
                        int early);

int shard_writer_append_frames(shard_writer *w, const shard_frame *frames, size_t count,
                               const void *stored, void *check)
{
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += frames[i].meta.stored_len;
    pthread_mutex_lock(&w->lock);
    if (w->nbusy == w->capbusy) {
        size_t ncap = w->capbusy ? w->capbusy * 2 : 8;
        uint64_t *nb = realloc(w->busy, ncap * sizeof *nb);
        if (!nb) {
            pthread_mutex_unlock(&w->lock);
            return ckpt_seterr(CKPT_ENOMEM, "out of memory for the shard index");
        }
        w->busy = nb;
        w->capbusy = ncap;
    }
    if (w->count + count > w->cap) {
        uint64_t ncap = w->cap ? w->cap * 2 : 256;
        while (ncap < w->count + count)
            ncap *= 2;
        shard_entry *ne = realloc(w->entries, ncap * sizeof *ne);
        if (!ne) {
            pthread_mutex_unlock(&w->lock);
            return ckpt_seterr(CKPT_ENOMEM, "out of memory for the shard index");
        }
        w->entries = ne;
        w->cap = ncap;
    }
    /* Reserve the range under the lock, write outside it: workers write
     * their frames in parallel, each to its own range. */
    uint64_t at = w->next;
    w->next += total;
    for (size_t i = 0, pos = 0; i < count; i++) {
        shard_entry *e = &w->entries[w->count++];
        e->tensor = frames[i].tensor;
        e->offset = frames[i].offset;
        e->file_offset = at + pos;
        e->meta = frames[i].meta;
        pos += frames[i].meta.stored_len;
    }
    if (total == 0) {
        pthread_mutex_unlock(&w->lock);
        return CKPT_OK;
    }
    w->busy[w->nbusy++] = at;
    int early = w->early;
    pthread_mutex_unlock(&w->lock);
    int rc = write_frames(w, frames, count, stored, check, at, total, early);
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < w->nbusy; i++)
        if (w->busy[i] == at) {
            w->busy[i] = w->busy[--w->nbusy];
            break;
        }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

/* Start the write-back of the whole pages of [from, to): a page shared
 * with a neighbouring frame not written yet would go to the disk twice
 * (its bytes come with a later round or the fsync). */
static int start_writeback(shard_writer *w, uint64_t from, uint64_t to)
{
    from = (from + w->page - 1) / w->page * w->page;
    to = to / w->page * w->page;
    return to > from ? fsio_writeback_start(w->fs, w->fd, from, to - from) : 0;
}

/* Write the reserved range [at, at + total), with `early` start its
 * write-back, and with `check` read it back and check every frame's stored
 * hash. */
static int write_frames(shard_writer *w, const shard_frame *frames, size_t count,
                        const void *stored, void *check, uint64_t at, uint64_t total,
                        int early)
{
    int rc = fsio_pwrite(w->fs, w->fd, stored, (size_t)total, at);
    double t = util_now();
    /* Hand the range to the disk now: waiting for the persist thread's
     * next round would leave the disk idle meanwhile. */
    int started = !rc && early && start_writeback(w, at, at + total) == 0;
    pthread_mutex_lock(&w->lock);
    w->written += total;
    if (!rc)
        log_written(w, t, at + total, total);
    if (early && !rc && !started)
        w->early = 0; /* not supported here: rounds alone, as without */
    pthread_mutex_unlock(&w->lock);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot write %llu bytes at offset %llu of shard %s",
                                 (unsigned long long)total, (unsigned long long)at, w->path);
    if (!check)
        return CKPT_OK;
    /* Read the frames back from the file: what a reader will get, not what
     * this process meant to write (a garbling device or file system). */
    int64_t got = fsio_pread(w->fs, w->fd, check, (size_t)total, at);
    if (got < 0)
        return ckpt_seterr_errno((int)-got, "cannot read back %llu bytes at offset %llu of "
                                 "shard %s", (unsigned long long)total,
                                 (unsigned long long)at, w->path);
    const unsigned char *c = check;
    for (size_t i = 0, pos = 0; i < count; pos += frames[i].meta.stored_len, i++) {
        const chunk_meta *meta = &frames[i].meta;
        int short_read = (uint64_t)got < pos + meta->stored_len;
        if (short_read || codec_check_stored(c + pos, meta))
            return ckpt_seterr(CKPT_ECORRUPT, "shard %s: the %llu bytes written at offset "
                               "%llu read back differently (%s)", w->path,
                               (unsigned long long)meta->stored_len,
                               (unsigned long long)(at + pos),
                               short_read ? "file too short" : ckpt_error_last());
    }
    return CKPT_OK;
}

static int cmp_entry(const void *a, const void *b)
{
    const shard_entry *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return 0;
}

int shard_writer_finish(shard_writer *w, int do_fsync, uint64_t *size,
                        uint64_t *index_hash, uint64_t *chunks)
{
    int rc = shard_writer_seal(w, size, index_hash, chunks);
    return rc ? rc : shard_writer_close(w, do_fsync);
}

int shard_writer_seal(shard_writer *w, uint64_t *size, uint64_t *index_hash,
                      uint64_t *chunks)
{
    if (w->count > 0) /* entries is NULL for a save of empty tensors only */
        qsort(w->entries, (size_t)w->count, sizeof *w->entries, cmp_entry);
    size_t ilen = (size_t)w->count * SHARD_ENTRY_SIZE;
    unsigned char *buf = malloc(ilen + SHARD_TRAILER_SIZE);
    if (!buf)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory for the index of shard %s", w->path);
    for (uint64_t i = 0; i < w->count; i++)
        shard_encode_entry(buf + i * SHARD_ENTRY_SIZE, &w->entries[i]);
    uint64_t ih = codec_hash(buf, ilen);
    shard_trailer tr = {w->next, w->count, ih};
    shard_encode_trailer(buf + ilen, &tr, w->id);
    /* Index and trailer in one write: the file's last bytes make it whole. */
    int rc = fsio_pwrite(w->fs, w->fd, buf, ilen + SHARD_TRAILER_SIZE, w->next);
    free(buf);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot write the index of shard %s", w->path);
    *size = w->next + ilen + SHARD_TRAILER_SIZE;
    *index_hash = ih;
    *chunks = w->count;
    return CKPT_OK;
}

int shard_writer_close(shard_writer *w, int do_fsync)
{
    int rc;
    if (do_fsync && (rc = fsio_fsync(w->fs, w->fd)))
        return ckpt_seterr_errno(-rc, "cannot fsync shard %s", w->path);
    rc = fsio_close(w->fs, w->fd);
    w->fd = -1;
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot close shard %s", w->path);
    return CKPT_OK;
}

uint64_t shard_writer_written(shard_writer *w)
{
    pthread_mutex_lock(&w->lock);
    uint64_t n = w->written;
    pthread_mutex_unlock(&w->lock);
    return n;
}

void shard_writer_write_back_early(shard_writer *w)
{
    pthread_mutex_lock(&w->lock);
    w->early = 1;
    pthread_mutex_unlock(&w->lock);
}

/* The disk's rate over a round, from the ranges it waited for: the disk
 * writes in the order ranges reach it, so once it is busy it stays busy
 * until the round's end `e`; the bytes handed over from time t_j on took at
 * most e - t_j (or e - the last round's end, when later: it was busy with
 * the older ones until then).  The largest bytes / time over the writes is
 * the rate (any idle time makes the others smaller, never larger): its
 * bytes and seconds go to `*bytes` and `*secs`.  Without early write-back
 * nothing reached the disk before the round began (t0). */
static void round_rate(const struct written_range *log, size_t n, double t0, double e,
                       double last_end, int early, uint64_t *bytes_out, double *secs_out)
{
    double best = 0;
    for (size_t j = 0; j < n; j++) {
        double start = early ? log[j].t : t0;
        start = start > last_end ? start : last_end;
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++)
            bytes += log[i].t >= log[j].t ? log[i].bytes : 0;
        if (e > start && bytes / (e - start) > best) {
            best = bytes / (e - start);
            *bytes_out = bytes;
            *secs_out = e - start;
        }
    }
}

int shard_writer_writeback(shard_writer *w, uint64_t *bytes, double *secs)
{
    *bytes = 0;
    *secs = 0;
    /* Wait only below `settled`: every frame there is written, so the
     * round's bytes are known; ranges written above it (out of order, or
     * while the round waits) count in a later round. */
    struct written_range mine[WRITE_LOG];
    size_t n = 0;
    pthread_mutex_lock(&w->lock);
    uint64_t upto = w->next;
    for (size_t i = 0; i < w->nbusy; i++)
        upto = w->busy[i] < upto ? w->busy[i] : upto;
    size_t k = 0;
    for (size_t i = 0; i < w->nlog; i++) {
        if (w->log[i].end <= upto)
            mine[n++] = w->log[i];
        else
            w->log[k++] = w->log[i];
    }
    w->nlog = k;
    int early = w->early;
    pthread_mutex_unlock(&w->lock);
    /* Below the last round's end every page was on the disk, but the one
     * it shared with the next frame. */
    uint64_t from = w->synced / w->page * w->page;
    double t0 = util_now();
    int rc = upto > w->synced ? fsio_writeback(w->fs, w->fd, from, upto - from) : 0;
    if (rc)
        return rc;
    double e = util_now();
    round_rate(mine, n, t0, e, w->round_end, early, bytes, secs);
    w->round_end = e;
    w->synced = upto > w->synced ? upto : w->synced;
    return 0;
}

uint64_t shard_writer_settled(shard_writer *w)
{
    pthread_mutex_lock(&w->lock);
    uint64_t low = w->next;
    for (size_t i = 0; i < w->nbusy; i++)
        low = w->busy[i] < low ? w->busy[i] : low;
    pthread_mutex_unlock(&w->lock);
    return low;
}

int shard_writer_drop_cache(shard_writer *w, uint64_t from, uint64_t to)
{
    return to > from ? fsio_drop_cache(w->fs, w->fd, from, to - from) : 0;
}

const shard_entry *shard_writer_entries(const shard_writer *w)
{
    return w->entries;
}

void shard_writer_free(shard_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        fsio_close(w->fs, w->fd);
    pthread_mutex_destroy(&w->lock);
    free(w->entries);
    free(w->busy);
    free(w->path);
    free(w);
}

/* ------------------------------------------------------------------ reader */

#define CORRUPT(...) ckpt_seterr(CKPT_ECORRUPT, __VA_ARGS__)

int shard_read_index(const fsio *fs, const char *path, const char *name,
                     const shard_expect *x, int *fd_out, shard_index *ix)
{
    ix->entries = NULL;
    ix->count = 0;
    *fd_out = -1;
    unsigned char *ibuf = NULL;
    int rc = CKPT_OK;
    int fd = fsio_open_regular(fs, path);
    if (fd < 0) {
        if (fd == -ENOENT)
            return ckpt_seterr(CKPT_EINCOMPLETE, "%s: shard file is missing", name);
        if (fd == -FSIO_ENOTREG)
            return ckpt_seterr(CKPT_ECORRUPT, "%s is not a regular file (a link, FIFO or "
                               "device is never read as a shard)", name);
        return ckpt_seterr_errno(-fd, "cannot open shard %s", path);
    }
    uint64_t size;
    if ((rc = fsio_fstat(fs, fd, &size))) {
        rc = ckpt_seterr_errno(-rc, "cannot stat shard %s", path);
        goto done;
    }
    if (size != x->size) {
        rc = ckpt_seterr(size < x->size ? CKPT_EINCOMPLETE : CKPT_ECORRUPT,
                         "%s: shard is %llu bytes, manifest says %llu", name,
                         (unsigned long long)size, (unsigned long long)x->size);
        goto done;
    }
    if (size < SHARD_HEADER_SIZE + SHARD_TRAILER_SIZE) {
        rc = CORRUPT("%s: shard of %llu bytes is too small", name,
                     (unsigned long long)size);
        goto done;
    }
    unsigned char h[SHARD_HEADER_SIZE], t[SHARD_TRAILER_SIZE];
    int64_t got = fsio_pread(fs, fd, h, sizeof h, 0);
    if (got == (int64_t)sizeof h)
        got = fsio_pread(fs, fd, t, sizeof t, size - SHARD_TRAILER_SIZE);
    if (got != (int64_t)sizeof t) {
        rc = got < 0 ? ckpt_seterr_errno((int)-got, "cannot read shard %s", path)
                     : ckpt_seterr(CKPT_EINCOMPLETE, "%s: short read", name);
        goto done;
    }
    if ((rc = shard_check_header(h, name, x->step, x->id)))
        goto done;
    uint64_t toff = size - SHARD_TRAILER_SIZE;
    shard_trailer tr;
    if ((rc = shard_decode_trailer(t, name, toff, x->id, &tr)))
        goto done;
    uint64_t index_offset = tr.index_offset, count = tr.count;
    uint64_t ilen = count * SHARD_ENTRY_SIZE; /* checked by shard_decode_trailer */
    if (tr.index_hash != x->index_hash) {
        rc = CORRUPT("%s: trailer index checksum differs from the manifest (offset %llu)",
                     name, (unsigned long long)(toff + 16));
        goto done;
    }
    if (!(ibuf = malloc(ilen ? (size_t)ilen : 1)) ||
        !(ix->entries = calloc(count ? (size_t)count : 1, sizeof *ix->entries))) {
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory for the index of %s", name);
        goto done;
    }
    got = fsio_pread(fs, fd, ibuf, (size_t)ilen, index_offset);
    if (got != (int64_t)ilen) {
        rc = got < 0 ? ckpt_seterr_errno((int)-got, "cannot read shard %s", path)
                     : ckpt_seterr(CKPT_EINCOMPLETE, "%s: short read of the index", name);
        goto done;
    }
    if (codec_hash(ibuf, (size_t)ilen) != x->index_hash) {
        rc = CORRUPT("%s: index (offset %llu, %llu bytes) fails its checksum", name,
                     (unsigned long long)index_offset, (unsigned long long)ilen);
        goto done;
    }
    for (uint64_t i = 0; i < count && !rc; i++)
        if (shard_decode_entry(ibuf + i * SHARD_ENTRY_SIZE, &ix->entries[i]))
            rc = CORRUPT("%s: index entry %llu (offset %llu) has non-zero reserved bytes",
                         name, (unsigned long long)i,
                         (unsigned long long)(index_offset + i * SHARD_ENTRY_SIZE));
    ix->count = count;
    if (!rc)
        rc = shard_check_index(name, x, ix, index_offset);
done:
    free(ibuf);
    if (rc) {
        shard_index_free(ix);
        fsio_close(fs, fd);
        return rc;
    }
    *fd_out = fd;
    return CKPT_OK;
}

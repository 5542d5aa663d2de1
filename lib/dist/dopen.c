/* dopen: options, and the collective open of a multi-rank store. */
#include "dist.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "error.h"
#include "report.h"
#include "util.h"

int dist_resolve_options(ckpt_store_options *o)
{
    if (o->world_size == 0)
        o->world_size = 1;
    if (o->world_size < 0 || o->world_size > 65536)
        return ckpt_seterr(CKPT_EINVAL, "world_size %d is out of range (1..65536)",
                           o->world_size);
    if (o->world_size == 1) {
        /* A job that gave its rank and forgot world_size would have every
         * rank write as rank 0 (and meet EBUSY later): said now. */
        if (o->rank != 0)
            return ckpt_seterr(CKPT_EINVAL, "rank %d with world_size %d: one process is "
                               "rank 0 (set world_size, and a coordinator, for several "
                               "ranks)", o->rank, o->world_size);
        return CKPT_OK;
    }
    if (o->rank < 0 || o->rank >= o->world_size)
        return ckpt_seterr(CKPT_EINVAL, "rank %d is out of range (0..%d)", o->rank,
                           o->world_size - 1);
    if (o->timeout_ms == 0)
        o->timeout_ms = CKPT_TIMEOUT_MS_DEFAULT;
    if (o->timeout_ms < 0)
        return ckpt_seterr(CKPT_EINVAL, "timeout_ms %d is negative", o->timeout_ms);
    if (!o->coordinator)
        return ckpt_seterr(CKPT_EINVAL, "world_size %d needs a coordinator",
                           o->world_size);
    return CKPT_OK;
}

void dist_free(struct dist_state *d)
{
    if (!d)
        return;
    coord_destroy(&d->c);
    pthread_mutex_destroy(&d->begin_lock);
    free(d);
}

/* What rank 0 tells the others at open: fixed size, so every runtime can
 * broadcast it as bytes. */
typedef struct open_note {
    int32_t status;
    uint32_t pad;
    unsigned char token[16];
    char lock[128];     /* ROOT/.lock as rank 0 wrote it ("pid host ...") */
    char message[360];
} open_note;

static void read_lock_note(ckpt_store *s, char out[128])
{
    memset(out, 0, 128);
    char *path = util_join(s->lay.root, ".lock");
    int fd = path ? fsio_open_regular(&s->lay.fs, path) : -1;
    if (fd >= 0) {
        fsio_pread(&s->lay.fs, fd, out, 127, 0);
        fsio_close(&s->lay.fs, fd);
    }
    free(path);
}

int dist_open(ckpt_store *s)
{
    const ckpt_store_options *o = &s->opts;
    struct dist_state *d = calloc(1, sizeof *d);
    if (!d)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = coord_init(&d->c, o->coordinator, o->rank, o->world_size, o->timeout_ms);
    if (rc) {
        free(d);
        return rc;
    }
    pthread_mutex_init(&d->begin_lock, NULL);
    s->dist = d;
    s->rank = (uint32_t)o->rank;
    /* Before rank 0 takes the lock: two processes claiming rank 0 (a rank
     * read from the environment) would race for it. */
    if ((rc = coord_check_ranks(&d->c)))
        return rc;
    open_note note;
    memset(&note, 0, sizeof note);
    if (o->rank == 0) {
        if (!s->readonly && !(rc = layout_lock(&s->lay))) {
            s->cleaned = report_new(); /* logged by ckpt_store_open */
            /* before any rank writes; out of memory fails the open, as
             * ckpt_store_open's (a step moved aside may not be back) */
            if (layout_clean_stale(&s->lay, 0, s->cleaned) == CKPT_ENOMEM)
                rc = CKPT_ENOMEM;
        }
        if (!rc && getrandom(note.token, sizeof note.token, 0) != (ssize_t)sizeof note.token) {
            uint64_t a = (uint64_t)(util_wall_time() * 1e9), b = (uint64_t)getpid();
            memcpy(note.token, &a, 8);
            memcpy(note.token + 8, &b, 8);
        }
        if (!rc && !s->readonly)
            read_lock_note(s, note.lock);
        note.status = rc;
        if (rc)
            snprintf(note.message, sizeof note.message, "%s", ckpt_error_last());
    }
    int mine = coord_bcast(&d->c, &note, sizeof note, 0, "open: rank 0's lock");
    if (!mine && o->rank != 0 && note.status) {
        mine = ckpt_seterr(note.status, "rank 0 could not open %s: %s", s->lay.root,
                           note.message);
    } else if (!mine && o->rank != 0 && !s->readonly) {
        /* The lock is one per job: rank 0 holds it; this rank checks that
         * it sees the same file, i.e. the same root. */
        char seen[128];
        read_lock_note(s, seen);
        if (memcmp(seen, note.lock, sizeof seen) != 0)
            mine = ckpt_seterr(CKPT_EINVAL, "rank %d: %s/.lock does not name rank 0's "
                               "process (%.40s): the root must be one directory shared by "
                               "every rank", o->rank, s->lay.root, note.lock);
    } else if (o->rank == 0 && note.status) {
        mine = ckpt_seterr(note.status, "%s", note.message);
    }
    memcpy(d->token, note.token, sizeof d->token);
    /* Every rank learns whether all opened: a store that fails on one rank
     * fails on all, and rank 0 then releases the lock. */
    ckpt_error_state e;
    ckpt_error_capture(&e, mine);
    int64_t all = mine;
    rc = coord_allreduce_min(&d->c, &all, "open: every rank's outcome");
    if (mine)
        return ckpt_error_restore(&e);
    if (rc)
        return rc;
    if (all)
        return ckpt_seterr((int)all, "rank %d: another rank could not open %s (%s)",
                           o->rank, s->lay.root, ckpt_status_name((int)all));
    if (!s->readonly)
        s->dist_finish = dist_finish;
    return CKPT_OK;
}

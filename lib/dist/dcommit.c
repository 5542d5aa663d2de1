/* dcommit: the end of a save on several ranks (include/ckpt.h, "ranks").
 *
 * Every rank, on its persist thread, once its shard is written and fsynced:
 * write its part manifest (its tensors and its shard, checksummed like any
 * manifest), fsync it, verify its shard against it (verify_after_save),
 * then report {status, size and hash of the part} to rank 0 (gather).
 * Rank 0 reads every part, checks it is the one reported, merges them into
 * the global manifest, writes and fsyncs it and renames the directory into
 * place, then broadcasts the outcome, which every rank returns.  Nothing is
 * renamed unless every rank reported its part durable. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "dist.h"
#include "error.h"
#include "manifest.h"
#include "reader.h"
#include "retention.h"
#include "save.h"
#include "util.h"


/* The pacing of a save, named in messages. */
#define PACE_WHAT "save: pacing the ranks that still write their parts"

/* A rank's report to rank 0; fixed size (bytes on the wire). */
typedef struct part_report {
    int32_t status;
    uint32_t rank;
    int64_t step;
    uint64_t part_bytes;
    uint64_t part_hash;
    char message[480];
} part_report;

/* Rank 0's answer to all. */
typedef struct commit_result {
    int64_t step;       /* rank 0's: the directory it commits or removes */
    int32_t status;
    int32_t rank;       /* the rank whose failure it is, or -1 */
    char message[496];  /* 512 bytes in all: docs/SCALING.md */
} commit_result;
_Static_assert(sizeof(commit_result) == 512, "the commit answer is 512 bytes");
_Static_assert(sizeof(part_report) == 512, "a rank's report is 512 bytes");

static void note_message(char *dst, size_t size, const char *msg)
{
    snprintf(dst, size, "%s", msg);
}

/* Write `text` as dir/name, fsynced (the directory is fsynced by rank 0
 * before the commit). */
static int write_durable(ckpt_store *st, const char *dir, const char *name, const char *text,
                         size_t len)
{
    char *path = util_join(dir, name);
    if (!path)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = CKPT_OK;
    int fd = fsio_open(&st->lay.fs, path, O_WRONLY | O_CREAT | O_EXCL, st->lay.file_mode);
    if (fd < 0) {
        rc = ckpt_seterr_errno(-fd, "cannot create %s", path);
        goto done;
    }
    layout_file_made(&st->lay, fd);
    int e = fsio_pwrite(&st->lay.fs, fd, text, len, 0);
    if (e)
        rc = ckpt_seterr_errno(-e, "cannot write %s", path);
    if (!rc && st->lay.fsync && (e = fsio_fsync(&st->lay.fs, fd)))
        rc = ckpt_seterr_errno(-e, "cannot fsync %s", path);
    e = fsio_close(&st->lay.fs, fd);
    if (!rc && e)
        rc = ckpt_seterr_errno(-e, "cannot close %s", path);
done:
    free(path);
    return rc;
}

/* This rank's part: its manifest, written, then its shard verified. */
static int write_part(ckpt_save *s, part_report *rep)
{
    ckpt_store *st = s->store;
    char name[MANIFEST_PART_NAME_SIZE];
    manifest_part_name(st->rank, name);
    char *text = NULL;
    size_t len;
    int rc = manifest_encode(&s->m, &text, &len);
    if (!rc)
        rc = write_durable(st, s->tmp, name, text, len);
    if (!rc) {
        rep->part_bytes = len;
        rep->part_hash = codec_hash(text, len);
    }
    free(text);
    if (rc || st->opts.verify_after_save == CKPT_VERIFY_NONE)
        return rc;
    ckpt_checkpoint *ck;
    rc = reader_open_manifest(st, s->tmp, name, s->m.step, &ck);
    if (!rc && st->opts.verify_after_save == CKPT_VERIFY_FULL)
        rc = reader_verify_all(ck, NULL);
    reader_close(ck);
    if (rc)
        ckpt_seterr(rc, "step %lld did not verify after writing: %s", (long long)s->m.step,
                    ckpt_error_last());
    return rc;
}

/* Append part `p` of rank `r` to the global manifest `g`: the names are
 * copied into g's block of names at *at (a part's may be one block of its
 * own, not to be taken apart), the shard's file name is moved. */
static void merge_part(manifest *g, manifest *p, uint32_t r, char **at)
{
    for (size_t i = 0; i < p->ntensors; i++) {
        size_t n = strlen(p->tensors[i].name) + 1;
        g->tensors[g->ntensors] = p->tensors[i];
        g->tensors[g->ntensors].name = memcpy(*at, p->tensors[i].name, n);
        g->tensors[g->ntensors++].shard = r;
        *at += n;
    }
    g->shards[r] = p->shards[0];
    p->shards[0].file = NULL;
    g->stats.raw_bytes += p->stats.raw_bytes;
    g->stats.stored_bytes += p->stats.stored_bytes;
    g->stats.chunks += p->stats.chunks;
    if (p->stats.stall_s > g->stats.stall_s)
        g->stats.stall_s = p->stats.stall_s; /* the job waited for its slowest rank */
}

/* Read and check every rank's part against its report; build `g`. */
static int gather_parts(ckpt_save *s, const part_report *reps, manifest *g)
{
    ckpt_store *st = s->store;
    int world = st->dist->c.world;
    manifest *parts = calloc((size_t)world, sizeof *parts);
    if (!parts)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = CKPT_OK;
    size_t ntensors = 0, name_bytes = 0;
    for (int r = 0; r < world && !rc; r++) {
        char name[MANIFEST_PART_NAME_SIZE], shard[SHARD_NAME_SIZE];
        manifest_part_name((uint32_t)r, name);
        shard_file_name((uint32_t)r, shard);
        char *path = util_join(s->tmp, name), *text = NULL;
        size_t len = 0;
        int e = path ? fsio_read_file(&st->lay.fs, path, MANIFEST_MAX_BYTES, &text, &len)
                     : -12;
        if (e)
            rc = ckpt_seterr_errno(-e, "cannot read rank %d's part %s", r,
                                   path ? path : name);
        else if (len != reps[r].part_bytes || codec_hash(text, len) != reps[r].part_hash)
            rc = ckpt_seterr(CKPT_ECORRUPT, "rank %d's part %s is not the one it reported "
                             "durable (%zu bytes, %llu reported)", r, name, len,
                             (unsigned long long)reps[r].part_bytes);
        else if (!(rc = manifest_decode(text, len, name, &parts[r])) &&
                 (parts[r].step != s->m.step || memcmp(parts[r].id, s->m.id, SHARD_ID_SIZE) ||
                  parts[r].nshards != 1 || strcmp(parts[r].shards[0].file, shard) != 0))
            rc = ckpt_seterr(CKPT_ECORRUPT, "rank %d's part %s is for another save (step "
                             "%lld)", r, name, (long long)parts[r].step);
        else if (!rc && parts[r].chunk_bytes != s->m.chunk_bytes)
            rc = ckpt_seterr(CKPT_EINVAL, "rank %d saved with chunk_bytes %llu, rank 0 with "
                             "%llu: every rank must use the same", r,
                             (unsigned long long)parts[r].chunk_bytes,
                             (unsigned long long)s->m.chunk_bytes);
        for (size_t i = 0; !rc && i < parts[r].ntensors; i++)
            name_bytes += strlen(parts[r].tensors[i].name) + 1;
        if (!rc)
            ntensors += parts[r].ntensors;
        free(text);
        free(path);
    }
    if (!rc) {
        g->step = s->m.step;
        memcpy(g->id, s->m.id, SHARD_ID_SIZE);
        g->time = s->m.time;
        g->chunk_bytes = s->m.chunk_bytes;
        g->level = s->m.level;
        g->world_size = (uint32_t)world;
        g->env = json_incref(s->m.env);
        g->metadata = s->m.metadata ? util_strdup(s->m.metadata) : NULL; /* rank 0's */
        g->tensors = calloc(ntensors ? ntensors : 1, sizeof *g->tensors);
        g->shards = calloc((size_t)world, sizeof *g->shards);
        g->names = malloc(name_bytes ? name_bytes : 1);
        if (!g->tensors || !g->shards || !g->names || (s->m.metadata && !g->metadata))
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory merging %d parts", world);
        else
            g->nshards = (size_t)world;
    }
    char *at = g->names;
    for (int r = 0; r < world && !rc; r++)
        merge_part(g, &parts[r], (uint32_t)r, &at);
    for (int r = 0; r < world; r++)
        manifest_clear(&parts[r]);
    free(parts);
    return rc;
}

/* Rank 0, every part durable: write the global manifest and commit. */
static int commit_global(ckpt_save *s, const part_report *reps)
{
    ckpt_store *st = s->store;
    manifest g;
    memset(&g, 0, sizeof g);
    char *text = NULL;
    size_t len = 0;
    int rc = gather_parts(s, reps, &g);
    g.stats.step = g.step;
    g.stats.persist_s = util_now() - s->t_return;
    if (!rc)
        rc = manifest_encode(&g, &text, &len);
    if (!rc) { /* what is committed must be readable: size, names unique across ranks */
        manifest back;
        if (len > MANIFEST_MAX_BYTES)
            rc = ckpt_seterr(CKPT_EINVAL, "the global manifest would be %zu bytes, more "
                             "than readers accept (%u)", len, MANIFEST_MAX_BYTES);
        else if (!(rc = manifest_decode(text, len, "the global manifest", &back)))
            manifest_clear(&back);
        if (rc)
            rc = ckpt_seterr(CKPT_EINVAL, "step %lld not saved: %s", (long long)g.step,
                             ckpt_error_last());
    }
    if (!rc)
        rc = write_durable(st, s->tmp, MANIFEST_NAME, text, len);
    int e;
    if (!rc && st->lay.fsync && (e = fsio_fsync_path(&st->lay.fs, s->tmp)))
        rc = ckpt_seterr_errno(-e, "cannot fsync %s", s->tmp);
    if (!rc)
        rc = layout_commit(&st->lay, s->tmp, g.step);
    if (!rc) { /* the job's save, as the event log records it */
        s->job_stats = g.stats;
        s->have_job_stats = 1;
    }
    free(text);
    manifest_clear(&g);
    return rc;
}

/* Rank 0: the outcome, from every report (the lowest failing rank wins). */
static void decide(ckpt_save *s, const part_report *reps, commit_result *res)
{
    int world = s->store->dist->c.world;
    for (int r = 0; r < world; r++) {
        if (reps[r].status == CKPT_OK && reps[r].step == s->m.step)
            continue;
        res->rank = r;
        if (reps[r].status == CKPT_OK) {
            res->status = CKPT_EINVAL;
            snprintf(res->message, sizeof res->message, "rank %d saved step %lld while rank "
                     "0 saved step %lld: every rank must save the same step", r,
                     (long long)reps[r].step, (long long)s->m.step);
        } else {
            res->status = reps[r].status;
            snprintf(res->message, sizeof res->message, "rank %d failed: %.470s", r,
                     reps[r].message);
        }
        return;
    }
    int rc = commit_global(s, reps);
    res->status = rc;
    res->rank = rc ? 0 : -1;
    if (rc)
        snprintf(res->message, sizeof res->message, "rank 0 could not commit: %.470s",
                 ckpt_error_last());
}

/* A rank's work before its report: the pipeline's persist (the shard
 * written and fsynced), then its part.  Runs on coord_pace's thread. */
typedef struct part_job {
    ckpt_save *s;
    int (*persist)(ckpt_save *s);
    part_report *rep;
} part_job;

static int part_job_run(void *arg)
{
    part_job *j = arg;
    int rc = j->persist(j->s);
    return rc ? rc : write_part(j->s, j->rep);
}

/* The report and the answer, for a save that ran (`s`, whose persist is
 * still to run unless `status` already failed it) or failed to begin (`s`
 * NULL).  The ranks pace each other while they persist (coord_pace): the
 * fastest waits for the slowest as long as that one is alive.  Returns the
 * agreed status with its message; *alone is set
 * on a rank other than 0 that knows nothing was committed and saved
 * another step than rank 0: rank 0 never commits or removes its temporary
 * directory, so it removes it (ranks of the same other step share one and
 * all remove it: every part is written before rank 0 answers, and removing
 * a tree another rank removed is no error).  *committed is set on rank 0
 * when it committed the step, whatever the answer's fate. */
static int exchange(ckpt_store *st, ckpt_save *s, int (*persist)(ckpt_save *s), int64_t step,
                    int status, int *alone, int *committed)
{
    *alone = 0;
    *committed = 0;
    struct dist_state *d = st->dist;
    part_report rep;
    memset(&rep, 0, sizeof rep);
    rep.rank = st->rank;
    rep.step = step;
    part_job job = {s, persist, &rep};
    int run = !status && s, work_rc = CKPT_OK, rc;
    if (d->pace) { /* begun in ckpt_save_begin (dist_save_pace_start) */
        coord_pace_t *p = d->pace;
        d->pace = NULL;
        work_rc = run ? part_job_run(&job) : CKPT_OK;
        ckpt_error_state mine;
        ckpt_error_capture(&mine, work_rc);
        rc = coord_pace_end(&d->c, p, PACE_WHAT);
        if (!rc && run)
            ckpt_error_restore(&mine);
    } else {
        rc = coord_pace(&d->c, run ? part_job_run : NULL, &job, &work_rc, PACE_WHAT);
    }
    if (rc) { /* no rank reports before all are done: rank 0 cannot decide */
        char why[1024];
        snprintf(why, sizeof why, "%s", ckpt_error_last());
        return ckpt_seterr(rc, "%s; step %lld not committed", why, (long long)step);
    }
    if (run)
        status = work_rc;
    rep.status = status;
    if (status) {
        /* paths as every rank knows them, not this rank's /proc/self/fd/N */
        layout_shown_error(&st->lay, status);
        note_message(rep.message, sizeof rep.message, ckpt_error_last());
    }
    part_report *reps = NULL;
    if (st->rank == 0 && !(reps = calloc((size_t)d->c.world, sizeof *reps)))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    commit_result res;
    memset(&res, 0, sizeof res);
    res.step = step;
    rc = coord_gather(&d->c, &rep, sizeof rep, reps, 0,
                          "save: gathering every rank's part report");
    if (!rc && st->rank == 0) {
        if (s) {
            decide(s, reps, &res);
            *committed = res.status == CKPT_OK;
        }
        else { /* rank 0 itself could not begin */
            res.status = status;
            res.rank = 0;
            snprintf(res.message, sizeof res.message, "rank 0 failed: %.470s", rep.message);
        }
    }
    free(reps);
    if (rc && st->rank == 0)
        return rc; /* rank 0 commits only once every part has reached it */
    if (!rc)
        rc = coord_bcast(&d->c, &res, sizeof res, 0,
                         "save: waiting for rank 0's decision on the commit");
    if (rc && *committed) {
        /* Rank 0 committed, then a rank died or hung before the answer
         * reached it: rank 0 knows the outcome, the others may not. */
        char why[1024];
        snprintf(why, sizeof why, "%s", ckpt_error_last());
        return ckpt_seterr(rc, "%s; step %lld is committed (this rank, rank 0, committed it "
                           "before telling the others), but a rank may not know: the job's "
                           "ranks are out of step", why, (long long)step);
    }
    if (rc) {
        /* CKPT_EPEER on another rank: rank 0 decides once every rank's part
         * has reached it, so any rank may be the one missing, and rank 0
         * may have committed before it failed. */
        char why[1024];
        snprintf(why, sizeof why, "%s", ckpt_error_last());
        return ckpt_seterr(rc, "%s; rank 0 decides only once every rank's part has reached "
                           "it, so the rank missing may be any, and whether step %lld was "
                           "committed is unknown here (rank 0 may have committed it before "
                           "failing): ckpt latest, or the next restore, tells", why,
                           (long long)step);
    }
    if (res.status) {
        *alone = st->rank != 0 && res.step != step;
        return ckpt_seterr(res.status, "step %lld not committed: %s", (long long)step,
                           res.message);
    }
    return CKPT_OK;
}

int dist_finish(ckpt_save *s, int status, int (*persist)(ckpt_save *s))
{
    ckpt_store *st = s->store;
    int alone, committed;
    int rc = exchange(st, s, persist, s->m.step, status, &alone, &committed);
    if (st->rank != 0 && !alone) {
        /* The directory is rank 0's to commit or remove (one of another
         * step is this rank's: the caller removes it, as rank 0 its own). */
        free(s->tmp);
        s->tmp = NULL;
    } else if (rc == CKPT_OK || committed) {
        free(s->tmp);
        s->tmp = NULL;
        retention_after_save(st, s->m.step, NULL); /* after the answer: no rank waits for it */
    }
    return rc;
}

void dist_begin_lock(ckpt_store *st)
{
    pthread_mutex_lock(&st->dist->begin_lock);
}

void dist_begin_unlock(ckpt_store *st)
{
    pthread_mutex_unlock(&st->dist->begin_lock);
}

void dist_save_pace_start(ckpt_store *st)
{
    struct dist_state *d = st->dist;
    pthread_mutex_lock(&st->api_lock);
    save_drain(st); /* the previous save's collectives come first */
    d->pace = coord_pace_start(&d->c, PACE_WHAT);
    pthread_mutex_unlock(&st->api_lock);
}

void dist_save_prepare(ckpt_store *st, int64_t step)
{
    struct dist_state *d = st->dist;
    d->saves++;
    unsigned char seed[16 + 16];
    memcpy(seed, d->token, 16);
    memcpy(seed + 16, &d->saves, 8);
    memcpy(seed + 24, &step, 8);
    uint64_t a = codec_hash(seed, sizeof seed);
    seed[0] ^= 0x5a;
    uint64_t b = codec_hash(seed, sizeof seed);
    memcpy(st->shared_id, &a, 8);
    memcpy(st->shared_id + 8, &b, 8);
    st->shared_id_set = 1;
    char tok[17];
    util_hex64(a, tok); /* unique per job and save: one directory for all ranks */
    snprintf(st->lay.shared_tag, sizeof st->lay.shared_tag, "job%.16s", tok);
}

int dist_save_failed(ckpt_store *st, int64_t step, int status)
{
    ckpt_error_state e;
    ckpt_error_capture(&e, status);
    pthread_mutex_lock(&st->api_lock);
    save_drain(st); /* the collectives of the previous save come first */
    ckpt_error_restore(&e);
    int alone, committed; /* no directory: this rank's save never began */
    int rc = exchange(st, NULL, NULL, step, status, &alone, &committed);
    pthread_mutex_unlock(&st->api_lock);
    (void)rc;
    return ckpt_error_restore(&e); /* this rank's own reason */
}

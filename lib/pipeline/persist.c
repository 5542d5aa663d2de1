/* persist: the background half of a save, on its own thread.  Wait for the
 * encode jobs, write the shard index, fsync, write the manifest, fsync,
 * verify the temporary directory, rename it into place, fsync the root,
 * apply retention; on failure remove the temporary directory.  Nothing
 * committed before is touched until the new step is durable. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "eventlog.h"
#include "manifest.h"
#include "layout.h"
#include "reader.h"
#include "retention.h"
#include "save.h"
#include "util.h"

static void finish(ckpt_save *s, int status)
{
    pthread_mutex_lock(&s->lock);
    if (status)
        ckpt_error_capture(&s->error, status);
    s->stats.persist_s = util_now() - s->t_return;
    s->done = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* The writer enforces every limit the reader does (size, nesting depth of
 * the caller's metadata, ...) by reading its own manifest back: a step that
 * is acknowledged must be readable, whatever verify_after_save says.  The
 * decoding is left in `back` (verify_temp reuses it).
 *
 * The decoding runs on a worker while the persist thread waits for the
 * disk (for thousands of tensors it takes about as long as the fsyncs). */
typedef struct check_job {
    const char *text;
    size_t len;
    const char *where;
    manifest *back;
} check_job;

static int check_job_run(void *arg, int worker)
{
    (void)worker;
    check_job *j = arg;
    return manifest_decode(j->text, j->len, j->where, j->back);
}

/* Make the shard durable (sealed by persist), then write the manifest and
 * make it durable too.  The temporary directory is never read as a
 * checkpoint, so writing the manifest before its check has passed is
 * harmless: a failed check removes the directory. */
static int write_durable(ckpt_save *s, const char *path, const char *text, size_t len)
{
    ckpt_store *st = s->store;
    int rc = shard_writer_close(s->writer, st->lay.fsync);
    if (rc)
        return rc;
    int fd = fsio_open(&st->lay.fs, path, O_WRONLY | O_CREAT | O_EXCL,
                     st->lay.file_mode);
    if (fd < 0)
        return ckpt_seterr_errno(-fd, "cannot create %s", path);
    layout_file_made(&st->lay, fd);
    int e = fsio_pwrite(&st->lay.fs, fd, text, len, 0);
    if (e)
        rc = ckpt_seterr_errno(-e, "cannot write %s", path);
    if (!rc && st->lay.fsync && (e = fsio_fsync(&st->lay.fs, fd)))
        rc = ckpt_seterr_errno(-e, "cannot fsync %s", path);
    e = fsio_close(&st->lay.fs, fd);
    if (!rc && e)
        rc = ckpt_seterr_errno(-e, "cannot close %s", path);
    if (!rc && st->lay.fsync && (e = fsio_fsync_path(&st->lay.fs, s->tmp)))
        rc = ckpt_seterr_errno(-e, "cannot fsync %s", s->tmp);
    return rc;
}

/* Write the manifest; on success `*text` (`*len` bytes) is what was
 * written and `*back` its decoding, both the caller's to free. */
static int write_manifest(ckpt_save *s, char **text_out, size_t *len_out, manifest *back)
{
    ckpt_store *st = s->store;
    char *text = NULL, *path = util_join(s->tmp, MANIFEST_NAME);
    size_t len = 0;
    char where[64];
    snprintf(where, sizeof where, "the manifest of step %lld", (long long)s->m.step);
    memset(back, 0, sizeof *back);
    int rc = !path ? ckpt_seterr(CKPT_ENOMEM, "out of memory")
                   : manifest_encode(&s->m, &text, &len);
    if (!rc && len > MANIFEST_MAX_BYTES) {
        ckpt_seterr(CKPT_EINVAL, "%s would be %zu bytes, more than readers accept (%u): make "
                    "the metadata smaller", where, len, MANIFEST_MAX_BYTES);
        rc = ckpt_seterr(CKPT_EINVAL, "step %lld not saved: a reader could not read it back "
                         "(%s)", (long long)s->m.step, ckpt_error_last());
    }
    if (rc)
        goto done;
    check_job job = {text, len, where, back};
    void *arg = &job;
    pool_group g;
    pool_group_init(&g);
    int queued = pool_submit_many(st->pool, &g, check_job_run, &arg, 1) == CKPT_OK;
    int check = queued ? CKPT_OK : check_job_run(&job, 0); /* out of memory to queue: here */
    ckpt_error_state written;
    ckpt_error_capture(&written, check ? check : write_durable(s, path, text, len));
    if (queued)
        check = pool_group_wait(&g);
    pool_group_destroy(&g);
    if (check) {
        manifest_clear(back);
        rc = ckpt_seterr(CKPT_EINVAL, "step %lld not saved: a reader could not read it back "
                         "(%s)", (long long)s->m.step, ckpt_error_last());
    } else {
        rc = ckpt_error_restore(&written);
    }
done:
    free(path);
    if (rc) {
        free(text);
        manifest_clear(back);
        return rc;
    }
    *text_out = text;
    *len_out = len;
    return CKPT_OK;
}

/* `text` and `back`: what write_manifest wrote and decoded (consumed). */
static int verify_temp(ckpt_save *s, const char *text, size_t len, manifest *back)
{
    ckpt_store *st = s->store;
    /* Retention after the next saves and a restore open this step: its
     * decoding goes into mcache (when the check below closes the step). */
    if (st->opts.verify_after_save == CKPT_VERIFY_NONE) {
        ckpt_error_state keep; /* best effort: no memory, no cache */
        ckpt_error_capture(&keep, CKPT_OK);
        mdecoded *d;
        if (mdecoded_make(&d, back, NULL, NULL) == CKPT_OK)
            mcache_put(st->mcache, text, len, d);
        mdecoded_release(d);
        ckpt_error_restore(&keep);
        return CKPT_OK;
    }
    ckpt_checkpoint *ck;
    /* The manifest file is read back and compared with what was written;
     * only its decoding is not done a second time. */
    int rc = reader_open_written(st, s->tmp, s->m.step, text, len, back, &ck);
    /* STORED: every frame was read back as it was written (save.c);
     * opening checks the rest (manifest, index, tiling). */
    if (!rc && st->opts.verify_after_save == CKPT_VERIFY_FULL)
        rc = reader_verify_all(ck, NULL);
    reader_close(ck);
    if (rc)
        ckpt_seterr(rc, "step %lld did not verify after writing, not committed: %s",
                    (long long)s->m.step, ckpt_error_last());
    return rc;
}

static int persist(ckpt_save *s)
{
    ckpt_store *st = s->store;
    /* While the workers run, keep the disk writing (and time it).  A full
     * check after writing reads every frame back at once: those stay. */
    adapt_cache cache = (st->opts.flags & CKPT_OPEN_KEEP_CACHE)   ? ADAPT_CACHE_KEEP
                        : (st->opts.flags & CKPT_OPEN_DROP_CACHE) ? ADAPT_CACHE_DROP
                                                                  : ADAPT_CACHE_AUTO;
    int drop = st->opts.verify_after_save != CKPT_VERIFY_FULL &&
               adapt_drop_wanted(cache, s->stats.raw_bytes,
                                 cache == ADAPT_CACHE_AUTO ? util_mem_free() : 0);
    int rc = adapt_wait_jobs(st->adapt, &s->group, s->writer, st->lay.fsync, drop);
    if (rc)
        return rc;
    manifest_shard *sh = &s->m.shards[0];
    uint64_t chunks;
    rc = shard_writer_seal(s->writer, &sh->size, &sh->index_hash, &chunks);
    if (!rc && st->dist_finish) /* no manifest here: see write_durable otherwise */
        rc = shard_writer_close(s->writer, st->lay.fsync);
    if (rc)
        return rc;
    sh->chunks = chunks;
    const shard_entry *entries = shard_writer_entries(s->writer);
    for (uint64_t i = 0; i < chunks; i++)
        s->m.tensors[entries[i].tensor].stored_bytes += entries[i].meta.stored_len;
    pthread_mutex_lock(&s->lock);
    s->stats.stored_bytes = sh->size;
    s->stats.chunks = chunks;
    s->m.stats = s->stats;
    pthread_mutex_unlock(&s->lock);
    s->m.stats.persist_s = util_now() - s->t_return;
    if (st->dist_finish)
        return CKPT_OK; /* several ranks: the part manifest and commit are lib/dist's */
    char *text;
    size_t len;
    manifest back;
    if ((rc = write_manifest(s, &text, &len, &back)))
        return rc;
    rc = verify_temp(s, text, len, &back);
    free(text);
    if (rc)
        return rc;
    /* A rewinding save retires the steps above it once committed; what
     * that needs is allocated now, while the save can still fail. */
    retention_plan plan;
    if ((rc = retention_plan_rewind(st, s->m.step, &plan)))
        return rc;
    if ((rc = layout_commit(&st->lay, s->tmp, s->m.step))) {
        retention_plan_free(&plan);
        return rc;
    }
    free(s->tmp);
    s->tmp = NULL; /* committed: nothing to clean up any more */
    retention_after_save(st, s->m.step, &plan);
    retention_plan_free(&plan);
    return CKPT_OK;
}

/* Every copy has completed once the jobs have run (each waited for its
 * chunk's event), so the events can go now: a handle that outlives its
 * store must not touch the store's device later. */
void save_release_events(ckpt_save *s)
{
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->jobs_total; i++)
        if (s->jobs[i].ev) {
            device_event_free(s->store->dev, s->jobs[i].ev);
            s->jobs[i].ev = NULL;
        }
    if (s->snap_ev) {
        device_event_free(s->store->dev, s->snap_ev);
        s->snap_ev = NULL;
    }
    pthread_mutex_unlock(&s->lock);
}

static int manifest_free_job(void *arg, int worker)
{
    (void)worker;
    manifest_clear(arg);
    free(arg);
    return CKPT_OK;
}

/* Nothing reads the manifest once the save is over, and for thousands of
 * tensors (their names and shapes, the caller's metadata tree) freeing it
 * takes milliseconds: a worker frees it, in the background, so neither
 * ckpt_save_wait nor the caller's ckpt_save_free waits for that.  The store
 * is alive here (ckpt_store_free waits for saves in flight and then for
 * its background jobs); a handle freed later finds an empty manifest. */
static void release_manifest(ckpt_save *s)
{
    ckpt_store *st = s->store;
    manifest *m = st->pool ? malloc(sizeof *m) : NULL;
    if (!m)
        return; /* save_unref frees it */
    *m = s->m;
    memset(&s->m, 0, sizeof s->m);
    s->m.step = m->step; /* kept for messages */
    if (pool_submit(st->pool, &st->background, manifest_free_job, m)) {
        s->m = *m; /* no memory to queue: save_unref frees it */
        free(m);
    }
}

/* The persist thread's work: the device tensors' pass deferred to it (a
 * STREAM snapshot), then persist. */
static int snapshot_and_persist(ckpt_save *s)
{
    int rc = CKPT_OK;
    if (s->deferred) {
        ckpt_store *st = s->store;
        rc = save_snapshot_chunks(s, s->deferred, s->ndeferred, s->deferred_mem,
                                  PASS_DEVICE, st->dpool, st->dpool_cap);
        if (rc)
            save_wait_jobs_idle(&s->group);
        pthread_mutex_lock(&s->lock);
        s->snapshot_done = 1;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
    return rc ? rc : persist(s);
}

void *save_persist_thread(void *arg)
{
    ckpt_save *s = arg;
    int rc;
    pool_mark_library_thread();
    if (s->store->dist_finish) /* paced with the other ranks, then every */
        rc = s->store->dist_finish(s, CKPT_OK, snapshot_and_persist); /* rank learns all */
    else
        rc = snapshot_and_persist(s);
    if (rc)
        device_quiesce(s->store->dev); /* copies of chunks never queued */
    save_release_events(s);
    device_trim(s->store->dev); /* here, not in the next begin: it syncs the GPU */
    if (rc && s->tmp) {
        ckpt_error_state e; /* cleanup may overwrite this thread's error */
        ckpt_error_capture(&e, rc);
        shard_writer_free(s->writer);
        s->writer = NULL;
        layout_remove_temp(&s->store->lay, s->tmp);
        ckpt_error_restore(&e);
    }
    /* Its files were written through the pinned root: named as users know
     * them. */
    rc = layout_shown_error(&s->store->lay, rc);
    eventlog_save_end(s->store->events, s->m.step, rc,
                      s->have_job_stats ? &s->job_stats : &s->stats, s->m.time,
                      util_now() - s->t_return);
    release_manifest(s);
    finish(s, rc);
    return NULL;
}

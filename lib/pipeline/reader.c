/* reader: open, read and verify one checkpoint directory. */
#include "reader.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "layout.h"
#include "util.h"
#include "walk.h"

void reader_close(ckpt_checkpoint *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; ck->ix && i < ck->m.nshards; i++) {
        shard_index_free(&ck->ix[i]);
        if (ck->fds && ck->fds[i] >= 0)
            fsio_close(&ck->store->lay.fs, ck->fds[i]);
    }
    free(ck->ix);
    free(ck->fds);
    free(ck->first);
    for (uint32_t r = 0; ck->rank_meta && r < ck->m.world_size; r++)
        free(ck->rank_meta[r]);
    free(ck->rank_meta);
    if (ck->cache_on_close) { /* a later open of these bytes shares them */
        mcache_put_owned(ck->store->mcache, ck->text, ck->text_len, ck->decoded);
        ck->text = NULL;
    }
    mdecoded_release(ck->decoded); /* ck->m is its: nothing else to free */
    free(ck->text);
    free(ck->dir);
    free(ck->shown);
    free(ck->label);
    free(ck);
}

static int open_shards(ckpt_checkpoint *ck)
{
    manifest *m = &ck->m;
    const fsio *fs = &ck->store->lay.fs;
    size_t nt = m->ntensors;
    uint64_t *bytes = calloc(nt ? nt : 1, sizeof *bytes);
    uint32_t *local = calloc(nt ? nt : 1, sizeof *local); /* shard's tensor -> manifest's */
    ck->ix = calloc(m->nshards, sizeof *ck->ix);
    ck->fds = malloc(m->nshards * sizeof *ck->fds);
    /* Marked closed before anything can fail: reader_close closes what
     * fds holds, and a heap's leftovers there would be someone's files. */
    for (size_t i = 0; ck->fds && i < m->nshards; i++)
        ck->fds[i] = -1;
    ck->first = malloc((nt ? nt : 1) * sizeof *ck->first);
    if (!bytes || !local || !ck->ix || !ck->fds || !ck->first) {
        free(bytes);
        free(local);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory opening %s", ck->label);
    }
    for (size_t i = 0; i < nt; i++)
        ck->first[i] = UINT64_MAX;
    int rc = CKPT_OK;
    for (size_t sh = 0; sh < m->nshards && !rc; sh++) {
        /* A shard numbers its chunks' tensors among its own tensors, in
         * manifest order (with one shard: the manifest's numbers). */
        uint32_t nlocal = 0;
        for (size_t i = 0; i < nt; i++)
            if (m->tensors[i].shard == sh) {
                bytes[nlocal] = m->tensors[i].bytes;
                local[nlocal++] = (uint32_t)i;
            }
        char *path = util_join(ck->dir, m->shards[sh].file);
        char *name = util_printf("%s/%s", ck->label, m->shards[sh].file);
        if (!path || !name) {
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
        } else {
            /* A missing shard is reported by the read below (incomplete). */
            int kind;
            if (fsio_kind(fs, path, 0, &kind) == 0)
                rc = layout_check_trusted(&ck->store->lay, path);
        }
        if (!rc) {
            shard_expect x = {m->shards[sh].size, m->shards[sh].index_hash, m->step, m->id,
                              nlocal, bytes, m->chunk_bytes};
            rc = shard_read_index(fs, path, name, &x, &ck->fds[sh], &ck->ix[sh]);
            for (uint64_t e = 0; !rc && e < ck->ix[sh].count; e++) /* checked < nlocal */
                ck->ix[sh].entries[e].tensor = local[ck->ix[sh].entries[e].tensor];
            if (!rc && ck->ix[sh].count != m->shards[sh].chunks)
                rc = ckpt_seterr(CKPT_ECORRUPT, "%s: index has %llu chunks, manifest "
                                 "says %llu", name, (unsigned long long)ck->ix[sh].count,
                                 (unsigned long long)m->shards[sh].chunks);
            for (uint64_t e = 0; !rc && e < ck->ix[sh].count; e++) {
                uint32_t t = ck->ix[sh].entries[e].tensor;
                if (ck->first[t] == UINT64_MAX)
                    ck->first[t] = e;
            }
        }
        free(path);
        free(name);
    }
    free(bytes);
    free(local);
    /* Every non-empty tensor must have its chunks (tiling was checked). */
    for (size_t i = 0; i < nt && !rc; i++) {
        const manifest_tensor *t = &m->tensors[i];
        uint64_t n = 0, stored = 0;
        if (ck->first[i] != UINT64_MAX) {
            const shard_index *ix = &ck->ix[t->shard];
            for (uint64_t e = ck->first[i]; e < ix->count && ix->entries[e].tensor == i; e++) {
                n++;
                stored += ix->entries[e].meta.stored_len;
            }
        }
        if ((t->bytes > 0 && n == 0) || n != t->chunks || stored != t->stored_bytes)
            rc = ckpt_seterr(CKPT_ECORRUPT, "%s: tensor '%s' has %llu chunks of %llu "
                             "stored bytes in its shard, manifest says %llu of %llu",
                             ck->label, t->name, (unsigned long long)n,
                             (unsigned long long)stored, (unsigned long long)t->chunks,
                             (unsigned long long)t->stored_bytes);
    }
    return rc;
}

static int open_manifest(ckpt_store *s, const char *dir, const char *manifest_name,
                         int64_t step, const char *known, size_t known_len,
                         manifest *decoded, ckpt_checkpoint **out);

static int free_job(void *arg, int worker)
{
    json_decref(arg);
    return CKPT_OK;
}

/* Free a decoded manifest's JSON tree (or its env) on a worker: a
 * restore of 10,000 tensors need not wait the 10 ms or so that takes. */
static void free_later(ckpt_store *s, json_t *tree)
{
    if (tree && (!s->pool || pool_submit(s->pool, &s->background, free_job, tree)))
        json_decref(tree); /* no pool or no memory to queue: here */
}

int reader_open_dir(ckpt_store *s, const char *dir, int64_t step, ckpt_checkpoint **out)
{
    return open_manifest(s, dir, MANIFEST_NAME, step, NULL, 0, NULL, out);
}

int reader_open_written(ckpt_store *s, const char *dir, int64_t step, const char *text,
                        size_t len, manifest *decoded, ckpt_checkpoint **out)
{
    int rc = open_manifest(s, dir, MANIFEST_NAME, step, text, len, decoded, out);
    manifest_clear(decoded); /* no-op when taken over */
    return rc;
}

int reader_open_manifest(ckpt_store *s, const char *dir, const char *manifest_name,
                         int64_t step, ckpt_checkpoint **out)
{
    return open_manifest(s, dir, manifest_name, step, NULL, 0, NULL, out);
}

/* A 10,000-tensor manifest costs a save as much to decode as to write; the
 * writer's own decode is reused when the file read back is that text. */
static int open_manifest(ckpt_store *s, const char *dir, const char *manifest_name,
                         int64_t step, const char *known, size_t known_len,
                         manifest *decoded, ckpt_checkpoint **out)
{
    *out = NULL;
    ckpt_checkpoint *ck = calloc(1, sizeof *ck);
    char name[LAYOUT_NAME_SIZE];
    layout_step_name(step, name);
    if (!ck || !(ck->dir = util_strdup(dir)) || !(ck->label = util_strdup(name)) ||
        !(ck->shown = layout_shown_path(&s->lay, dir))) {
        if (ck) {
            free(ck->dir);
            free(ck->label);
        }
        free(ck);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory opening step %lld", (long long)step);
    }
    ck->store = s;
    char *mpath = util_join(dir, manifest_name);
    char *where = util_printf("%s/%s", ck->label, manifest_name);
    size_t len = 0;
    int rc = mpath && where ? 0 : -ENOMEM;
    int kind;
    if (!rc && fsio_kind(&s->lay.fs, mpath, 0, &kind) == 0 &&
        (rc = layout_check_trusted(&s->lay, mpath)))
        goto done; /* a missing manifest is reported below, as incomplete */
    if (!rc)
        rc = fsio_read_file(&s->lay.fs, mpath, MANIFEST_MAX_BYTES, &ck->text, &len);
    if (rc == -ENOENT)
        rc = ckpt_seterr(CKPT_EINCOMPLETE, "%s is missing", where ? where : "manifest");
    else if (rc == -FSIO_ENOTREG)
        rc = ckpt_seterr(CKPT_ECORRUPT, "%s is not a regular file (a link, FIFO or device "
                         "is never read as a manifest)", where);
    else if (rc == -EFBIG)
        rc = ckpt_seterr(CKPT_ECORRUPT, "%s is larger than %u bytes", where,
                         MANIFEST_MAX_BYTES);
    else if (rc)
        rc = ckpt_seterr_errno(-rc, "cannot read %s", mpath ? mpath : "manifest");
    int cached = 0;
    ck->text_len = len;
    manifest m = {0}; /* decoded here, then kept in ck->decoded */
    if (!rc && decoded && len == known_len && memcmp(ck->text, known, len) == 0) {
        m = *decoded; /* the same bytes decode the same */
        memset(decoded, 0, sizeof *decoded);
    } else if (!rc && (ck->decoded = mcache_get(s->mcache, ck->text, len))) {
        cached = 1;
    } else if (!rc) {
        json_t *tree;
        rc = manifest_decode_keep(ck->text, len, where, &m, &tree);
        free_later(s, tree);
    }
    if (!rc && !cached) {
        /* Only the texts are given out: the trees go (on a worker). */
        char *env = manifest_json_text(m.env);
        free_later(s, m.env);
        m.env = NULL;
        if (!env)
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
        else
            rc = mdecoded_make(&ck->decoded, &m, NULL, env);
    }
    manifest_clear(&m); /* empty unless decoding failed */
    if (!rc) {
        ck->m = ck->decoded->m;
        ck->meta_text = ck->decoded->meta_text;
        ck->env_text = ck->decoded->env_text;
    }
    if (!rc && ck->m.step != step)
        rc = ckpt_seterr(CKPT_ECORRUPT, "%s: manifest is for step %lld", where,
                         (long long)ck->m.step);
    if (!rc)
        rc = open_shards(ck);
    ck->cache_on_close = !rc && !cached;
done:
    free(mpath);
    free(where);
    if (rc) {
        reader_close(ck);
        return rc;
    }
    *out = ck;
    return CKPT_OK;
}

/* A writer replacing the step (a re-save) swaps its directory while we
 * read: the manifest then comes from one and a shard from the other.  So a
 * failed open is retried when the directory changed under it. */
#define REPLACED_RETRIES 100 /* each costs a manifest read; a writer re-saving
                                 * in a tight loop can win many rounds */

int reader_open_step(ckpt_store *s, int64_t step, ckpt_checkpoint **out)
{
    *out = NULL;
    char *dir = layout_step_path(&s->lay, step);
    if (!dir)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc;
    char *mixed_before = NULL; /* the last "another checkpoint" message */
    for (int attempt = 0;; attempt++) {
        fsio_info before, after;
        rc = fsio_info_of(&s->lay.fs, dir, -1, &before);
        if (rc == -ENOENT || (!rc && before.kind != FSIO_KIND_DIR)) {
            rc = ckpt_seterr(CKPT_ENOTFOUND, "no step %lld in %s", (long long)step,
                             s->lay.root);
            break;
        }
        if (rc) {
            rc = ckpt_seterr_errno(-rc, "cannot stat %s", dir);
            break;
        }
        if ((rc = trust_check_entry(&s->lay.tr, dir, &before)))
            break;
        rc = reader_open_dir(s, dir, step, out);
        if (!rc || !reader_is_damage(rc) || attempt == REPLACED_RETRIES)
            break;
        ckpt_error_state e;
        ckpt_error_capture(&e, rc);
        int same = fsio_info_of(&s->lay.fs, dir, -1, &after) == 0 &&
                   after.dev == before.dev && after.ino == before.ino &&
                   after.ctime_ns == before.ctime_ns;
        /* A shard of another checkpoint than the manifest read before it
         * is the signature of a replacement even when the new directory
         * reused the inode number within one coarse ctime tick (seen under
         * ASan with saves milliseconds apart).  Real damage of that kind
         * (another step's shard copied in) looks the same once, but a
         * retry reads the same manifest and shard again, so the message,
         * which names both ids, repeats: that ends the retries (each one
         * reads the whole manifest, up to its 256 MiB limit). */
        int mixed = strstr(e.message, "belongs to another checkpoint") != NULL;
        int repeated = mixed && mixed_before && strcmp(mixed_before, e.message) == 0;
        if (mixed && !repeated) {
            free(mixed_before);
            mixed_before = strdup(e.message);
        }
        ckpt_error_restore(&e);
        if (same && (!mixed || repeated))
            break; /* damaged, not replaced */
    }
    free(mixed_before);
    free(dir);
    return layout_shown_error(&s->lay, rc);
}

int reader_open_newest(ckpt_store *s, ckpt_verify_level level, ckpt_checkpoint **out)
{
    *out = NULL;
    step_walk w;
    int rc = walk_start(s, &w);
    ckpt_error_state newest; /* why the newest step was passed over */
    int64_t newest_step = -1, step;
    size_t checked = 0;
    int more;
    while (!rc && (more = walk_next(s, &w, &step)) != 0) {
        if (more < 0) {
            rc = more;
            break;
        }
        ckpt_checkpoint *ck;
        if ((rc = reader_open_step(s, step, &ck)) == CKPT_OK &&
            level == CKPT_VERIFY_FULL && (rc = reader_verify_all(ck, NULL)) != CKPT_OK)
            reader_close(ck);
        if (rc == CKPT_OK) {
            *out = ck;
            break;
        }
        if (!reader_is_damage(rc))
            break;
        int bad = rc;
        rc = CKPT_OK;
        if (walk_gone(s, &w, step))
            continue; /* retired since the listing: not damage */
        checked++;
        if (newest_step < 0) {
            ckpt_error_capture(&newest, bad);
            newest_step = step;
        }
    }
    walk_free(&w);
    if (rc || *out)
        return rc;
    if (newest_step < 0)
        return ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s", s->lay.root);
    /* A job script's `ckpt latest` says why, not only that, none is valid. */
    return ckpt_seterr(CKPT_ENOCKPT, "no valid checkpoint in %s: %zu checked, the newest "
                       "(step %" PRId64 ") because: %s", s->lay.root, checked, newest_step,
                       newest.message);
}

void reader_report_failure(ckpt_report *r, int64_t step, int status, const char *message)
{
    char dir[LAYOUT_NAME_SIZE + 1], file[64] = "";
    layout_step_name(step, dir);
    strcat(dir, "/");
    const char *at = message ? strstr(message, dir) : NULL;
    if (at) { /* a step's files have safe names: no blank, ':' or '/' */
        at += strlen(dir);
        size_t n = strcspn(at, ": \t/");
        if (n > 0 && n < sizeof file && at[n] != '/') {
            memcpy(file, at, n);
            file[n] = '\0';
        }
    }
    report_add(r, step, status, message, file, "", -1);
}

int reader_is_damage(int rc)
{
    return rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE || rc == CKPT_EIO ||
           rc == CKPT_EVERSION || rc == CKPT_ENOTFOUND || rc == CKPT_EACCES;
}

int reader_newest_step(ckpt_store *s, int64_t *step)
{
    int64_t *steps;
    size_t n;
    int rc = layout_scan(&s->lay, &steps, &n);
    if (!rc && n == 0)
        rc = ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s", s->lay.root);
    if (!rc)
        *step = steps[n - 1];
    free(steps);
    return rc;
}

int reader_open_select(ckpt_store *s, int64_t step, ckpt_verify_level level,
                       ckpt_checkpoint **out)
{
    *out = NULL;
    if (step == CKPT_LATEST)
        return reader_open_newest(s, level, out);
    int rc = CKPT_OK;
    if (step == CKPT_NEWEST)
        rc = reader_newest_step(s, &step);
    else if (step < 0)
        rc = ckpt_seterr(CKPT_EINVAL, "step %lld is neither a step nor CKPT_LATEST or "
                         "CKPT_NEWEST", (long long)step);
    if (!rc)
        rc = reader_open_step(s, step, out);
    if (!rc && level == CKPT_VERIFY_FULL && (rc = reader_verify_all(*out, NULL))) {
        reader_close(*out);
        *out = NULL;
    }
    return rc;
}

int reader_part_agrees(const manifest *g, const manifest *p, uint32_t rank)
{
    size_t k = 0;
    for (size_t i = 0; i < g->ntensors; i++) {
        const manifest_tensor *a = &g->tensors[i];
        if (a->shard != rank)
            continue;
        if (k >= p->ntensors)
            return 0;
        const manifest_tensor *b = &p->tensors[k++];
        if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->bytes != b->bytes ||
            a->chunks != b->chunks || a->ndim != b->ndim ||
            memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]))
            return 0;
    }
    return k == p->ntensors && p->step == g->step && !memcmp(p->id, g->id, sizeof g->id);
}

long reader_find(ckpt_checkpoint *ck, const char *name)
{
    return mdecoded_find(ck->decoded, name);
}

/* ------------------------------------------------------------- chunk jobs */

typedef struct chunk_task {
    ckpt_checkpoint *ck;
    const shard_entry *e;
    uint32_t shard;
    unsigned char *dst;     /* NULL: verify only */
    ckpt_memory memory;
    void *stream;
    int device;             /* CUDA device of dst (DEVICE memory) */
    ckpt_report *report;    /* verify: collect every problem */
    pool_group *group;
    size_t batch;           /* a batch's first task: how many tasks it runs */
    uint64_t base;          /* the tensor byte that dst holds (0: dst is the
                             * whole tensor; a range read's window starts later) */
} chunk_task;

/* Where chunk task `t`'s raw bytes go. */
static unsigned char *task_dst(const chunk_task *t)
{
    return t->dst + (t->e->offset - t->base);
}

static int chunk_fail(chunk_task *t, int status)
{
    const manifest *m = &t->ck->m;
    const char *tname = m->tensors[t->e->tensor].name;
    const char *file = m->shards[t->shard].file;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s/%s: tensor '%s' chunk at byte %llu (file offset %llu): %s",
             t->ck->label, file, tname, (unsigned long long)t->e->offset,
             (unsigned long long)t->e->file_offset, ckpt_error_last());
    report_add(t->report, m->step, status, msg, file, tname, (int64_t)t->e->file_offset);
    return ckpt_seterr(status, "%s", msg);
}

/* Raw chunks larger than this are read and hashed in pieces of it (an
 * eighth of this machine kind's 2 MiB L2 cache per core). */
#define RAW_PIECE ((size_t)256 << 10)

/* A raw chunk into host memory: read straight into the caller's buffer
 * and hash it once (its stored and raw hashes must be equal: checks 10
 * and 12 of docs/FORMAT.md are then one), half the memory traffic of
 * reading into a buffer and copying. */
static int raw_chunk_job(chunk_task *t)
{
    ckpt_store *s = t->ck->store;
    const chunk_meta *meta = &t->e->meta;
    unsigned char *dst = task_dst(t);
    if (meta->stored_hash != meta->raw_hash)
        return chunk_fail(t, ckpt_seterr(CKPT_ECORRUPT, "raw chunk with a stored hash "
                                         "%016llx and a different raw hash %016llx",
                                         (unsigned long long)meta->stored_hash,
                                         (unsigned long long)meta->raw_hash));
    if (meta->stored_len <= RAW_PIECE) {
        int64_t got = fsio_pread(&s->lay.fs, t->ck->fds[t->shard], dst,
                                 (size_t)meta->stored_len, t->e->file_offset);
        if (got < 0)
            return chunk_fail(t, ckpt_seterr_errno((int)-got, "read failed"));
        if ((uint64_t)got != meta->stored_len)
            return chunk_fail(t, ckpt_seterr(CKPT_EINCOMPLETE, "file ends early"));
        int rc = codec_check_stored(dst, meta);
        return rc ? chunk_fail(t, rc) : CKPT_OK;
    }
    /* Read and hash piece by piece: each piece is hashed while it is
     * still in the core's cache (reading 4 MiB and hashing it afterwards
     * fetches it from memory again: about 20% slower here). */
    codec_hasher *h;
    int rc = codec_hasher_create(&h);
    if (rc)
        return chunk_fail(t, rc);
    codec_hasher_reset(h);
    for (uint64_t at = 0; at < meta->stored_len && !rc;) {
        size_t n = meta->stored_len - at < RAW_PIECE ? (size_t)(meta->stored_len - at)
                                                      : RAW_PIECE;
        int64_t got = fsio_pread(&s->lay.fs, t->ck->fds[t->shard], dst + at, n,
                                 t->e->file_offset + at);
        if (got < 0)
            rc = ckpt_seterr_errno((int)-got, "read failed");
        else if ((size_t)got != n)
            rc = ckpt_seterr(CKPT_EINCOMPLETE, "file ends early");
        else
            codec_hasher_update(h, dst + at, n);
        at += n;
    }
    uint64_t hash = codec_hasher_digest(h);
    codec_hasher_free(h);
    if (!rc && hash != meta->stored_hash)
        rc = ckpt_seterr(CKPT_ECORRUPT, "stored bytes hash %016llx, index says %016llx",
                         (unsigned long long)hash, (unsigned long long)meta->stored_hash);
    return rc ? chunk_fail(t, rc) : CKPT_OK;
}

static int chunk_job(void *arg, int worker)
{
    chunk_task *t = arg;
    if (!t->report && pool_group_failed(t->group))
        return CKPT_OK; /* a sibling failed: the read is lost anyway */
    ckpt_store *s = t->ck->store;
    worker_ctx *w = &s->workers[worker];
    const chunk_meta *meta = &t->e->meta;
    if (meta->codec == CODEC_RAW && t->dst && t->memory != CKPT_MEM_DEVICE)
        return raw_chunk_job(t);
    int rc = worker_reserve_in(w, (size_t)meta->stored_len);
    if (rc)
        return rc;
    int64_t got = fsio_pread(&s->lay.fs, t->ck->fds[t->shard], w->in, (size_t)meta->stored_len,
                             t->e->file_offset);
    if (got < 0)
        return chunk_fail(t, ckpt_seterr_errno((int)-got, "read failed"));
    if ((uint64_t)got != meta->stored_len)
        return chunk_fail(t, ckpt_seterr(CKPT_EINCOMPLETE, "file ends early"));
    /* Check what was read before sizing anything by what it claims. */
    if ((rc = codec_check_stored(w->in, meta)))
        return chunk_fail(t, rc);
    unsigned char *dst;
    int to_device = t->dst && t->memory == CKPT_MEM_DEVICE;
    if (w->out_busy) { /* the previous H2D copy from `out` must be done */
        rc = device_event_wait(s->dev, w->out_busy);
        device_event_free(s->dev, w->out_busy);
        w->out_busy = NULL;
        if (rc)
            return chunk_fail(t, rc);
    }
    if (t->dst && !to_device) {
        dst = task_dst(t);
    } else {
        if ((rc = worker_reserve_out(s, w, (size_t)meta->raw_len, to_device)))
            return chunk_fail(t, rc);
        dst = w->out;
    }
    if ((rc = codec_decode_checked(w->codec, w->in, meta, dst)))
        return chunk_fail(t, rc);
    if (to_device) {
        /* Queue the copy and go on decoding: other workers' chunks overlap
         * with it; this worker waits for it only before reusing `out`. */
        const char *name = t->ck->m.tensors[t->e->tensor].name;
        rc = device_copy_h2d(s->dev, task_dst(t), dst, (size_t)meta->raw_len,
                             t->stream, t->device, name);
        if (!rc)
            rc = device_record_stream(s->dev, t->stream, t->device, &w->out_busy);
        if (rc)
            return chunk_fail(t, rc);
    }
    return CKPT_OK;
}

/* Small chunks that lie back to back in one shard are read in batches
 * (one pread of up to BATCH_BYTES for up to BATCH_MAX chunks), each chunk
 * then checked and decoded as chunk_job would: 10,000 tiny tensors would
 * otherwise cost 10,000 queued jobs and reads. */
#define BATCH_BYTES ((uint64_t)256 << 10)
#define BATCH_MAX 256

/* Can task `b` join the batch that ends with task `a`? */
static int batchable(const chunk_task *a, const chunk_task *b)
{
    return b->shard == a->shard && b->dst && b->memory != CKPT_MEM_DEVICE &&
           b->e->file_offset == a->e->file_offset + a->e->meta.stored_len;
}

/* Runs the `batch` tasks starting at `arg` (host destinations).  One read
 * scatters the run of frames: a raw frame straight into its tensor (then
 * checked there, as raw_chunk_job does), the others into the worker's
 * input buffer to be decoded from. */
static int chunk_batch_job(void *arg, int worker)
{
    chunk_task *tasks = arg;
    size_t count = tasks->batch;
    if (count == 1)
        return chunk_job(arg, worker);
    if (pool_group_failed(tasks->group))
        return CKPT_OK;
    ckpt_store *s = tasks->ck->store;
    worker_ctx *w = &s->workers[worker];
    struct iovec iov[BATCH_MAX];
    size_t coded = 0;
    for (size_t i = 0; i < count; i++)
        if (tasks[i].e->meta.codec != CODEC_RAW)
            coded += (size_t)tasks[i].e->meta.stored_len;
    int rc = coded ? worker_reserve_in(w, coded) : CKPT_OK;
    if (rc)
        return rc;
    for (size_t i = 0, at = 0; i < count; i++) {
        const shard_entry *e = tasks[i].e;
        int raw = e->meta.codec == CODEC_RAW;
        if (raw && e->meta.stored_hash != e->meta.raw_hash) /* before any byte lands */
            return chunk_fail(&tasks[i], ckpt_seterr(CKPT_ECORRUPT, "raw chunk with a "
                                                     "stored hash %016llx and a different "
                                                     "raw hash %016llx",
                                                     (unsigned long long)e->meta.stored_hash,
                                                     (unsigned long long)e->meta.raw_hash));
        iov[i].iov_base = raw ? task_dst(&tasks[i]) : w->in + at;
        iov[i].iov_len = (size_t)e->meta.stored_len;
        at += raw ? 0 : iov[i].iov_len;
    }
    unsigned char *place[BATCH_MAX]; /* preadv advances iov */
    for (size_t i = 0; i < count; i++)
        place[i] = iov[i].iov_base;
    int64_t got = fsio_preadv(&s->lay.fs, tasks->ck->fds[tasks->shard], iov, (int)count,
                              tasks->e->file_offset);
    if (got < 0)
        return chunk_fail(tasks, ckpt_seterr_errno((int)-got, "read failed"));
    for (size_t i = 0; i < count; i++) {
        chunk_task *t = &tasks[i];
        const chunk_meta *meta = &t->e->meta;
        uint64_t at = t->e->file_offset - tasks->e->file_offset;
        if ((uint64_t)got < at + meta->stored_len)
            return chunk_fail(t, ckpt_seterr(CKPT_EINCOMPLETE, "file ends early"));
        /* Check what was read before sizing anything by what it claims. */
        if ((rc = codec_check_stored(place[i], meta)))
            return chunk_fail(t, rc);
        if (meta->codec != CODEC_RAW &&
            (rc = codec_decode_checked(w->codec, place[i], meta, task_dst(t))))
            return chunk_fail(t, rc);
    }
    return CKPT_OK;
}

/* After the jobs: every H2D copy must have landed before the restore is
 * reported good (and before the staging buffers are touched again). */
static int drain_copies(ckpt_store *s)
{
    int rc = CKPT_OK;
    for (int i = 0; i < s->nworkers; i++) {
        worker_ctx *w = &s->workers[i];
        if (!w->out_busy)
            continue;
        int r = device_event_wait(s->dev, w->out_busy);
        device_event_free(s->dev, w->out_busy);
        w->out_busy = NULL;
        if (r && !rc)
            rc = r;
    }
    return rc;
}

static int run_tasks(ckpt_checkpoint *ck, chunk_task *tasks, size_t n)
{
    pool_group g;
    pool_group_init(&g);
    void **heads = malloc((n ? n : 1) * sizeof *heads);
    if (!heads) {
        pool_group_destroy(&g);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", ck->label);
    }
    size_t nheads = 0;
    for (size_t i = 0; i < n;) {
        size_t b = 1;
        uint64_t bytes = tasks[i].e->meta.stored_len;
        if (!tasks[i].report && tasks[i].dst && tasks[i].memory != CKPT_MEM_DEVICE)
            for (; i + b < n && b < BATCH_MAX && batchable(&tasks[i + b - 1], &tasks[i + b]) &&
                   bytes + tasks[i + b].e->meta.stored_len <= BATCH_BYTES; b++)
                bytes += tasks[i + b].e->meta.stored_len;
        for (size_t k = i; k < i + b; k++)
            tasks[k].group = &g;
        tasks[i].batch = b;
        heads[nheads++] = &tasks[i];
        i += b;
    }
    int rc = pool_submit_many(ck->store->pool, &g, chunk_batch_job, heads, nheads);
    free(heads);
    int wrc = pool_group_wait(&g);
    pool_group_destroy(&g);
    return rc ? rc : wrc;
}

static size_t count_chunks(const ckpt_checkpoint *ck, uint32_t tensor)
{
    const manifest_tensor *t = &ck->m.tensors[tensor];
    return ck->first[tensor] == UINT64_MAX ? 0 : (size_t)t->chunks;
}

int reader_read(ckpt_checkpoint *ck, const reader_target *targets, size_t count)
{
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        n += count_chunks(ck, targets[i].tensor);
    chunk_task *tasks = calloc(n ? n : 1, sizeof *tasks);
    if (!tasks)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", ck->label);
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t ti = targets[i].tensor;
        uint32_t sh = ck->m.tensors[ti].shard;
        for (size_t c = 0; c < count_chunks(ck, ti); c++, k++)
            tasks[k] = (chunk_task){ck, &ck->ix[sh].entries[ck->first[ti] + c], sh,
                                    targets[i].dst, targets[i].memory, targets[i].stream,
                                    targets[i].device, NULL, NULL, 0, 0};
    }
    int rc = run_tasks(ck, tasks, n);
    int drc = drain_copies(ck->store);
    free(tasks);
    return rc ? rc : drc;
}

int reader_read_range(ckpt_checkpoint *ck, uint32_t tensor, uint64_t offset, unsigned char *dst,
                      uint64_t bytes)
{
    size_t nchunks = count_chunks(ck, tensor);
    uint32_t sh = ck->m.tensors[tensor].shard;
    uint64_t end = offset + bytes;
    chunk_task *tasks = calloc(nchunks ? nchunks : 1, sizeof *tasks);
    if (!tasks)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", ck->label);
    /* A chunk inside the range decodes into dst; one that sticks out (the
     * first and the last at most) into a buffer of its own, verified
     * whole, and the part in range is copied from there. */
    size_t n = 0, nedge = 0, edge[2] = {0, 0};
    int rc = CKPT_OK;
    for (size_t c = 0; c < nchunks && !rc; c++) {
        const shard_entry *e = &ck->ix[sh].entries[ck->first[tensor] + c];
        uint64_t lo = e->offset, hi = lo + e->meta.raw_len;
        if (hi <= offset || lo >= end)
            continue;
        unsigned char *into = dst;
        uint64_t base = offset;
        if (lo < offset || hi > end) {
            if (!(into = malloc(e->meta.raw_len ? (size_t)e->meta.raw_len : 1))) {
                rc = ckpt_seterr(CKPT_ENOMEM, "out of memory for a %llu-byte chunk of %s",
                                 (unsigned long long)e->meta.raw_len, ck->label);
                break;
            }
            base = lo;
            edge[nedge++] = n; /* at most two: the range is one interval */
        }
        tasks[n++] = (chunk_task){ck, e, sh, into, CKPT_MEM_HOST, NULL, -1, NULL, NULL, 0, base};
    }
    if (!rc)
        rc = run_tasks(ck, tasks, n);
    for (size_t k = 0; k < nedge; k++) {
        const chunk_task *t = &tasks[edge[k]];
        uint64_t lo = t->e->offset, hi = lo + t->e->meta.raw_len;
        uint64_t from = lo > offset ? lo : offset, to = hi < end ? hi : end;
        if (!rc)
            memcpy(dst + (from - offset), t->dst + (from - lo), (size_t)(to - from));
        free(t->dst);
    }
    free(tasks);
    return rc;
}

static int verify_some(ckpt_checkpoint *ck, ckpt_report *report, uint32_t first,
                       uint32_t stride, const unsigned char *skip)
{
    size_t n = 0;
    for (size_t sh = first; sh < ck->m.nshards; sh += stride)
        n += (size_t)ck->ix[sh].count;
    chunk_task *tasks = calloc(n ? n : 1, sizeof *tasks);
    ckpt_report *local = report ? NULL : report_new();
    if (!tasks || (!report && !local)) {
        free(tasks);
        ckpt_report_free(local);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory verifying %s", ck->label);
    }
    size_t k = 0;
    for (uint32_t sh = first; sh < ck->m.nshards; sh += stride)
        for (uint64_t e = 0; e < ck->ix[sh].count; e++) {
            const shard_entry *en = &ck->ix[sh].entries[e];
            if (skip && en->tensor < ck->m.ntensors && skip[en->tensor])
                continue;
            tasks[k++] = (chunk_task){ck, en, sh, NULL, CKPT_MEM_HOST,
                                      NULL, -1, report ? report : local, NULL, 0, 0};
        }
    int rc = run_tasks(ck, tasks, k);
    free(tasks);
    ckpt_report_free(local);
    return rc;
}

int reader_verify_all(ckpt_checkpoint *ck, ckpt_report *report)
{
    return verify_some(ck, report, 0, 1, NULL);
}

int reader_verify_shards(ckpt_checkpoint *ck, uint32_t first, uint32_t stride,
                         const unsigned char *skip)
{
    return verify_some(ck, NULL, first, stride ? stride : 1, skip);
}

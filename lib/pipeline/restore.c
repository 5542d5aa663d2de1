/* restore: newest-valid restore and verification on top of reader.c. */
#include "restore.h"

#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "layout.h"
#include "reader.h"
#include "retention.h"
#include "util.h"
#include "walk.h"

/* Match caller tensors to the checkpoint: caller errors, never damage. */
static int match(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count, int allow_missing,
                 reader_target *targets, size_t *ntargets, unsigned char *hit)
{
    ckpt_store *s = ck->store;
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        /* The caller's order is usually the save's: try that first. */
        long idx = i < ck->m.ntensors && strcmp(ck->m.tensors[i].name, t[i].name) == 0
                       ? (long)i
                       : reader_find(ck, t[i].name);
        if (idx < 0) {
            if (allow_missing)
                continue;
            return ckpt_seterr(CKPT_ENOTFOUND, "tensor '%s' is not in %s", t[i].name,
                               ck->label);
        }
        const manifest_tensor *mt = &ck->m.tensors[idx];
        int same_shape = mt->ndim == t[i].ndim;
        for (int d = 0; same_shape && d < mt->ndim; d++)
            same_shape = mt->shape[d] == t[i].shape[d];
        if (mt->dtype != t[i].dtype)
            return ckpt_seterr(CKPT_EMISMATCH, "tensor '%s': %s holds %s, the buffer is %s",
                               t[i].name, ck->label, ckpt_dtype_name(mt->dtype),
                               ckpt_dtype_name(t[i].dtype));
        if (!same_shape || mt->bytes != t[i].bytes) {
            char have[256] = "", want[256] = "";
            for (int d = 0; d < mt->ndim; d++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld",
                         d ? "," : "", (long long)mt->shape[d]);
            for (int d = 0; d < t[i].ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld",
                         d ? "," : "", (long long)t[i].shape[d]);
            return ckpt_seterr(CKPT_EMISMATCH, "tensor '%s': %s holds shape [%s] (%llu "
                               "bytes), the buffer is [%s] (%llu bytes)", t[i].name,
                               ck->label, have, (unsigned long long)mt->bytes, want,
                               (unsigned long long)t[i].bytes);
        }
        ckpt_memory mem = CKPT_MEM_HOST;
        int ordinal = -1;
        int rc = t[i].bytes ? device_classify(s->dev, t[i].data, t[i].memory, &mem,
                                              &ordinal) : 0;
        if (rc)
            return ckpt_seterr(rc, "tensor '%s': %s", t[i].name, ckpt_error_last());
        if (mem == CKPT_MEM_DEVICE && ordinal < 0) /* managed: the caller's device */
            ordinal = device_current_ordinal(s->dev);
        targets[k++] = (reader_target){(uint32_t)idx, t[i].data, mem, NULL, ordinal};
        if (hit)
            hit[i] = 1;
    }
    *ntargets = k;
    return CKPT_OK;
}

typedef struct span {
    uintptr_t at;
    uint64_t bytes;
    size_t k; /* index in the targets, which is the caller's order */
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* Targets that share memory.  Workers write and then hash each chunk in
 * its target, so two of them writing one buffer at once would break the
 * hashes and pass for damage, and the restore fall back to an older step.
 * One buffer under two names (tied weights: a model's embedding and its
 * output layer) is allowed: the last name given is written into it, as
 * load_state_dict copies in order, and each other one is read into a
 * scratch buffer of its own, so that its chunks are still checked.  Any
 * other overlap is the caller's error (CKPT_EINVAL).  The scratch buffers
 * are added to *scratch (*nscratch of them), for the caller to free. */
static int separate_shared(ckpt_checkpoint *ck, reader_target *tg, size_t n, void ***scratch,
                           size_t *nscratch)
{
    *scratch = NULL;
    *nscratch = 0;
    if (n < 2)
        return CKPT_OK;
    span *v = malloc(n * sizeof *v);
    if (!v)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t bytes = ck->m.tensors[tg[k].tensor].bytes;
        if (bytes)
            v[m++] = (span){(uintptr_t)tg[k].dst, bytes, k};
    }
    qsort(v, m, sizeof *v, span_cmp);
    int rc = CKPT_OK;
    size_t far = 0; /* the span reaching furthest so far */
    for (size_t i = 1; i < m && !rc; i++) {
        const span *a = &v[far], *b = &v[i];
        if (b->at - a->at >= a->bytes) { /* b starts past every earlier end */
            far = i;
            continue;
        }
        if (b->at == a->at && b->bytes == a->bytes) {
            /* a second name for a's buffer: a (given earlier) goes to scratch */
            void *buf = malloc(a->bytes);
            void **grown = realloc(*scratch, (*nscratch + 1) * sizeof *grown);
            if (!buf || !grown) {
                free(buf);
                if (grown)
                    *scratch = grown;
                rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
                break;
            }
            *scratch = grown;
            (*scratch)[(*nscratch)++] = buf;
            reader_target *x = &tg[a->k];
            x->dst = buf;
            x->memory = CKPT_MEM_HOST;
            x->stream = NULL;
            x->device = -1;
            far = i;
            continue;
        }
        rc = ckpt_seterr(CKPT_EINVAL, "tensors '%s' and '%s' overlap in memory (%llu bytes "
                         "at %p, %llu bytes at %p): a restore cannot write both; give each "
                         "a buffer of its own", ck->m.tensors[tg[a->k].tensor].name,
                         ck->m.tensors[tg[b->k].tensor].name, (unsigned long long)a->bytes,
                         (void *)a->at, (unsigned long long)b->bytes, (void *)b->at);
    }
    free(v);
    return rc;
}

int restore_options_read(const ckpt_restore_options *in, ckpt_restore_options *out,
                         const char *fn)
{
    ckpt_restore_options d = CKPT_RESTORE_OPTIONS_INIT;
    *out = d;
    if (!in)
        return CKPT_OK;
    int rc = in->version == 1 ? CKPT_OK
                              : ckpt_check_version("ckpt_restore_options", in->version,
                                                   CKPT_RESTORE_OPTIONS_VERSION);
    if (rc)
        return rc;
    if (in->version == 1) { /* a v1 struct ends before `verify` */
        memcpy(out, in, offsetof(ckpt_restore_options, verify));
        out->version = CKPT_RESTORE_OPTIONS_VERSION;
        return CKPT_OK;
    }
    *out = *in;
    if (out->verify != 0 && out->verify != CKPT_VERIFY_STORED &&
        out->verify != CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "%s: verify %d is not 0, CKPT_VERIFY_STORED or "
                           "CKPT_VERIFY_FULL", fn, (int)out->verify);
    return CKPT_OK;
}

int restore_verify_part(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                        const ckpt_restore_options *o, int own)
{
    if (o->verify != CKPT_VERIFY_FULL)
        return CKPT_OK;
    const ckpt_store *s = ck->store;
    uint32_t world = s->dist && s->opts.world_size > 1 ? (uint32_t)s->opts.world_size : 1;
    unsigned char *skip = calloc(ck->m.ntensors ? ck->m.ntensors : 1, 1);
    if (!skip)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        long idx = reader_find(ck, t[i].name);
        if (idx >= 0)
            skip[idx] = 1;
    }
    int rc = own ? reader_verify_shards(ck, 0, 1, skip)
                 : reader_verify_shards(ck, s->rank, world, skip);
    free(skip);
    return rc;
}

int restore_step(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error, ckpt_checkpoint **keep,
                 unsigned char *hit)
{
    ckpt_checkpoint *ck;
    *caller_error = 0;
    int rc = reader_open_step(s, step, &ck);
    if (rc)
        return rc;
    rc = restore_from(ck, t, count, o, caller_error, hit);
    if (rc == CKPT_OK)
        rc = restore_verify_part(ck, t, count, o, 0);
    if (rc == CKPT_OK && keep)
        *keep = ck;
    else
        reader_close(ck);
    return rc;
}

int restore_from(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error, unsigned char *hit)
{
    int rc;
    *caller_error = 0;
    reader_target *targets = calloc(count ? count : 1, sizeof *targets);
    size_t n = 0, nscratch = 0;
    void **scratch = NULL;
    if (!targets) {
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    } else if ((rc = match(ck, t, count, o->allow_missing, targets, &n, hit))) {
        *caller_error = 1;
    } else {
        int any_device = 0, ordinal = -1;
        for (size_t i = 0; i < n; i++) {
            targets[i].stream = o->cuda_stream;
            if (targets[i].memory == CKPT_MEM_DEVICE && !any_device)
                ordinal = targets[i].device;
            any_device |= targets[i].memory == CKPT_MEM_DEVICE;
        }
        /* before any copy, and the caller's error: an older step would be
         * refused the same way */
        if (any_device && (rc = device_refuse_capture(ck->store->dev, ordinal, o->cuda_stream,
                                                      "restore")))
            *caller_error = 1;
        else if ((rc = separate_shared(ck, targets, n, &scratch, &nscratch)))
            *caller_error = 1;
        else
            rc = reader_read(ck, targets, n);
    }
    for (size_t i = 0; i < nscratch; i++)
        free(scratch[i]);
    free(scratch);
    free(targets);
    return rc;
}

int restore_leftovers(const ckpt_tensor *t, size_t count, restore_marks *mk, int64_t restored)
{
    size_t left = 0, first = 0;
    for (size_t i = 0; i < count; i++)
        if (mk->dirty[i] && !mk->hit[i] && !left++)
            first = i;
    if (!left)
        return CKPT_OK;
    char more[48] = "";
    if (left > 1)
        snprintf(more, sizeof more, " and %zu more", left - 1);
    return ckpt_seterr(CKPT_ECORRUPT, "restored step %lld, which lacks tensor '%s'%s: the "
                       "abandoned restore of step %lld had already written into %s buffer, "
                       "which now holds neither its old contents nor a checkpoint's; set %s "
                       "again and restore step %lld by number, which leaves %s untouched",
                       (long long)restored, t[first].name, more, (long long)mk->abandoned,
                       left > 1 ? "their" : "its", left > 1 ? "them" : "it",
                       (long long)restored, left > 1 ? "them" : "it");
}

int restore_marks_init(restore_marks *mk, size_t count)
{
    mk->abandoned = -1;
    mk->dirty = calloc(count ? count : 1, 2);
    mk->hit = mk->dirty ? mk->dirty + (count ? count : 1) : NULL;
    mk->count = count;
    return mk->dirty ? CKPT_OK : ckpt_seterr(CKPT_ENOMEM, "out of memory");
}

void restore_marks_abandon(restore_marks *mk, int64_t step)
{
    for (size_t i = 0; i < mk->count; i++)
        mk->dirty[i] |= mk->hit[i];
    if (mk->abandoned < 0)
        mk->abandoned = step;
}

void restore_marks_free(restore_marks *mk)
{
    free(mk->dirty);
    mk->dirty = mk->hit = NULL;
}

/* Whether a step older than steps[i] opens and fits the caller's tensors. */
static int an_older_step_fits(ckpt_store *s, const int64_t *steps, size_t i,
                              const ckpt_tensor *t, size_t count, int allow_missing)
{
    reader_target *tg = calloc(count ? count : 1, sizeof *tg);
    int fits = 0;
    for (size_t j = i; tg && j-- > 0 && !fits;) {
        ckpt_checkpoint *ck;
        if (reader_open_step(s, steps[j], &ck) != CKPT_OK)
            continue;
        size_t n;
        fits = match(ck, t, count, allow_missing, tg, &n, NULL) == CKPT_OK;
        reader_close(ck);
    }
    free(tg);
    return fits;
}

/* restore.h.  Reading the whole step costs, so it is done only when an
 * older step fits: a state that fits no step (a model of another size)
 * fails at once. */
int restore_damaged_anyway(ckpt_store *s, const int64_t *steps, size_t i,
                           const ckpt_tensor *t, size_t count, int allow_missing, int *rc)
{
    ckpt_error_state mismatch;
    ckpt_error_capture(&mismatch, *rc);
    int v = CKPT_OK;
    if (an_older_step_fits(s, steps, i, t, count, allow_missing)) {
        ckpt_checkpoint *ck;
        v = reader_open_step(s, steps[i], &ck);
        if (!v) {
            v = reader_verify_all(ck, NULL);
            reader_close(ck);
        }
    }
    if (v && reader_is_damage(v)) {
        *rc = v;
        return 1;
    }
    ckpt_error_restore(&mismatch);
    return 0;
}

int restore_run(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                const ckpt_restore_options *o, ckpt_report *r, ckpt_checkpoint **keep)
{
    step_walk w = {0};
    restore_marks mk;
    int rc = restore_marks_init(&mk, count);
    if (!rc)
        rc = step == CKPT_LATEST ? walk_start(s, &w) : walk_one(&w, step);
    int restored = 0, more;
    int64_t at;
    while (!rc && (more = walk_next(s, &w, &at)) != 0) {
        if (more < 0) {
            rc = more;
            break;
        }
        int caller_error;
        ckpt_checkpoint *ck = NULL;
        memset(mk.hit, 0, count);
        int r1 = restore_step(s, at, t, count, o, &caller_error, keep ? &ck : NULL, mk.hit);
        if (r1 == CKPT_OK) {
            /* A buffer written by the attempt at a newer, damaged step and
             * absent from this one holds that step's unverified bytes. */
            if ((rc = restore_leftovers(t, count, &mk, at))) {
                reader_close(ck);
                break;
            }
            if (keep)
                *keep = ck;
            r->step = at;
            restored = 1;
            break;
        }
        if (caller_error && step == CKPT_LATEST &&
            restore_damaged_anyway(s, w.steps, walk_index(&w), t, count, o->allow_missing,
                                   &r1))
            caller_error = 0;
        if (caller_error || !reader_is_damage(r1) || step != CKPT_LATEST) {
            rc = r1;
            /* The caller learns why the newer steps were not the ones. */
            if (caller_error && r->count)
                ckpt_seterr(r1, "%s (newer step %lld skipped: %s)", ckpt_error_last(),
                            (long long)r->items[0].step, r->items[0].message);
            break;
        }
        restore_marks_abandon(&mk, at);
        if (walk_gone(s, &w, at))
            continue; /* retired since the listing: not damage */
        retention_note_damaged(s, at, r1);
        reader_report_failure(r, at, r1, ckpt_error_last());
    }
    restore_marks_free(&mk);
    if (!rc && !restored) {
        if (r->count)
            rc = ckpt_seterr(CKPT_ENOCKPT, "no valid checkpoint in %s: %zu skipped, newest "
                             "because: %s", s->lay.root, r->count, r->items[0].message);
        else
            rc = ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s", s->lay.root);
    }
    walk_free(&w);
    return rc;
}

/* The part manifests of a step saved by several ranks (each rank restores
 * through its own: lib/dist/drestore.c).  One that is damaged or does not
 * match the global manifest is passed over by restore, whose record of
 * the commit is the global manifest: the step stays valid, so the problem
 * is listed with a message saying so and does not fail the verification
 * (its status is still the damage's, for scripts that want to act on it).
 * A missing part is the same to restore and is not listed: a job may
 * remove them to save space. */
static void verify_parts(ckpt_store *s, ckpt_checkpoint *ck, ckpt_report *r)
{
    for (uint32_t rank = 0; ck->m.world_size > 1 && rank < ck->m.world_size; rank++) {
        char part[MANIFEST_PART_NAME_SIZE];
        manifest_part_name(rank, part);
        char *path = util_join(ck->dir, part);
        int kind = FSIO_KIND_NONE;
        int absent = !path || fsio_kind(&s->lay.fs, path, 0, &kind) != 0 ||
                     kind == FSIO_KIND_NONE;
        free(path);
        if (absent)
            continue;
        ckpt_checkpoint *pk = NULL;
        int rc = reader_open_manifest(s, ck->dir, part, ck->m.step, &pk);
        char why[768];
        if (rc)
            snprintf(why, sizeof why, "%s", ckpt_error_last());
        else if (!reader_part_agrees(&ck->m, &pk->m, rank))
            rc = CKPT_ECORRUPT, snprintf(why, sizeof why, "it does not list what %s gives "
                                         "rank %u", MANIFEST_NAME, rank);
        reader_close(pk);
        if (!rc || !reader_is_damage(rc))
            continue; /* no memory, say: nothing learnt about the part */
        char msg[1024];
        snprintf(msg, sizeof msg, "warning: %s/%s, rank %u's part manifest: %s; restore "
                 "passes over it (rank %u reads %s instead), so the step stays valid",
                 ck->label, part, rank, why, rank, MANIFEST_NAME);
        report_add(r, ck->m.step, rc, msg, part, "", -1);
    }
    ckpt_error_clear();
}

static int verify_step(ckpt_store *s, int64_t step, ckpt_verify_level level, ckpt_report *r)
{
    ckpt_checkpoint *ck;
    int rc = reader_open_step(s, step, &ck);
    if (rc) {
        reader_report_failure(r, step, rc, ckpt_error_last());
        return rc;
    }
    if (level == CKPT_VERIFY_FULL)
        rc = reader_verify_all(ck, r);
    if (!rc)
        verify_parts(s, ck, r);
    reader_close(ck);
    return rc;
}

int verify_run(ckpt_store *s, int64_t step, ckpt_verify_level level, ckpt_report *r)
{
    int rc = CKPT_OK;
    if (step == CKPT_NEWEST) {
        rc = reader_newest_step(s, &step);
    } else if (step == CKPT_LATEST) {
        ckpt_checkpoint *ck;
        if (!(rc = reader_open_newest(s, level, &ck))) {
            r->step = ck->m.step;
            reader_close(ck);
        }
        return rc; /* it passed `level` to be chosen */
    }
    if (rc)
        return rc;
    r->step = step;
    rc = verify_step(s, step, level, r);
    if (rc && r->count)
        ckpt_seterr(rc, "%s", r->items[0].message);
    return rc;
}

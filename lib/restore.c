/* restore: newest-valid restore, verification and the read-only
 * checkpoint API, all on top of reader.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "internal.h"
#include "reader.h"
#include "report.h"
#include "store.h"
#include "util.h"
#include "validate.h"

static int is_damage(int rc)
{
    return rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE || rc == CKPT_EIO ||
           rc == CKPT_EVERSION || rc == CKPT_ENOTFOUND;
}

/* Match caller tensors to the checkpoint: caller errors, never damage. */
static int match(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count, int allow_missing,
                 reader_target *targets, size_t *ntargets)
{
    ckpt_store *s = ck->store;
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        long idx = reader_find(ck, t[i].name);
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
        int rc = t[i].bytes ? device_classify(s->dev, t[i].data, t[i].memory, &mem) : 0;
        if (rc)
            return ckpt_seterr(rc, "tensor '%s': %s", t[i].name, ckpt_error_last());
        targets[k++] = (reader_target){(uint32_t)idx, t[i].data, mem, NULL};
    }
    *ntargets = k;
    return CKPT_OK;
}

static int restore_one(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                       const ckpt_restore_options *o, int *caller_error)
{
    ckpt_checkpoint *ck;
    *caller_error = 0;
    int rc = reader_open_step(s, step, &ck);
    if (rc)
        return rc;
    reader_target *targets = calloc(count ? count : 1, sizeof *targets);
    size_t n = 0;
    if (!targets) {
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    } else if ((rc = match(ck, t, count, o->allow_missing, targets, &n))) {
        *caller_error = 1;
    } else {
        for (size_t i = 0; i < n; i++)
            targets[i].stream = o->cuda_stream;
        rc = reader_read(ck, targets, n);
    }
    free(targets);
    reader_close(ck);
    return rc;
}

CKPT_API int ckpt_restore(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                          const ckpt_restore_options *opts, ckpt_report **report)
{
    if (report)
        *report = NULL;
    if (!s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_restore: store is NULL");
    if (opts && opts->version != CKPT_RESTORE_OPTIONS_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "ckpt_restore_options version %u is not "
                           "supported (expected %u)", opts->version,
                           CKPT_RESTORE_OPTIONS_VERSION);
    if (step < 0 && step != CKPT_LATEST)
        return ckpt_seterr(CKPT_EINVAL, "step must be >= 0 or CKPT_LATEST");
    ckpt_restore_options o = CKPT_RESTORE_OPTIONS_INIT;
    if (opts)
        o = *opts;
    int rc = validate_tensors(t, count, 1);
    if (rc)
        return rc;
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_lock(&s->api_lock);
    save_drain(s); /* retention of the save in flight must not race us */
    int64_t *steps = NULL;
    size_t n = 0;
    if (step == CKPT_LATEST) {
        rc = store_scan(s, &steps, &n);
    } else if (!(steps = malloc(sizeof *steps))) {
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    } else {
        steps[0] = step;
        n = 1;
    }
    int restored = 0;
    for (size_t i = n; i-- > 0 && !rc;) {
        int caller_error;
        int r1 = restore_one(s, steps[i], t, count, &o, &caller_error);
        if (r1 == CKPT_OK) {
            r->step = steps[i];
            restored = 1;
            break;
        }
        if (caller_error || !is_damage(r1) || step != CKPT_LATEST) {
            rc = r1;
            break;
        }
        report_add(r, steps[i], r1, ckpt_error_last(), "", "", -1);
    }
    if (!rc && !restored) {
        if (r->count)
            rc = ckpt_seterr(CKPT_ENOCKPT, "no valid checkpoint in %s: %zu skipped, newest "
                             "because: %s", s->root, r->count, r->items[0].message);
        else
            rc = ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s", s->root);
    }
    pthread_mutex_unlock(&s->api_lock);
    free(steps);
    if (report) {
        *report = r;
    } else {
        ckpt_report_free(r);
    }
    return rc;
}

/* ------------------------------------------------------------------ verify */

static int verify_step(ckpt_store *s, int64_t step, ckpt_verify_level level, ckpt_report *r)
{
    ckpt_checkpoint *ck;
    int rc = reader_open_step(s, step, &ck);
    if (rc) {
        report_add(r, step, rc, ckpt_error_last(), "", "", -1);
        return rc;
    }
    if (level == CKPT_VERIFY_FULL)
        rc = reader_verify_all(ck, r);
    reader_close(ck);
    return rc;
}

CKPT_API int ckpt_verify(ckpt_store *s, int64_t step, ckpt_verify_level level,
                         ckpt_report **report)
{
    if (report)
        *report = NULL;
    if (!s || level < CKPT_VERIFY_QUICK || level > CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_verify: NULL store or invalid level");
    ckpt_report *r = report_new();
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    int rc = CKPT_OK;
    if (step == CKPT_LATEST) {
        int64_t *steps;
        size_t n;
        rc = store_scan(s, &steps, &n);
        if (!rc && n == 0)
            rc = ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s", s->root);
        if (!rc)
            step = steps[n - 1];
        free(steps);
    }
    if (!rc) {
        r->step = step;
        rc = verify_step(s, step, level, r);
        if (rc && r->count)
            ckpt_seterr(rc, "%s", r->items[0].message);
    }
    pthread_mutex_unlock(&s->api_lock);
    if (report)
        *report = r;
    else
        ckpt_report_free(r);
    return rc;
}

CKPT_API int ckpt_store_latest(ckpt_store *s, ckpt_verify_level level, int64_t *step)
{
    if (!s || !step || level < CKPT_VERIFY_QUICK || level > CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_latest: invalid argument");
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    ckpt_checkpoint *ck;
    int rc = reader_open_newest(s, level, &ck);
    if (!rc) {
        *step = ck->m.step;
        reader_close(ck);
    }
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

/* -------------------------------------------------------------- checkpoint */

CKPT_API int ckpt_checkpoint_open(ckpt_checkpoint **out, ckpt_store *s, int64_t step)
{
    if (!out || !s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_open: NULL argument");
    *out = NULL;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    int rc = step != CKPT_LATEST ? reader_open_step(s, step, out)
                                 : reader_open_newest(s, CKPT_VERIFY_QUICK, out);
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

CKPT_API void ckpt_checkpoint_free(ckpt_checkpoint *ck)
{
    reader_close(ck);
}

CKPT_API int64_t ckpt_checkpoint_step(const ckpt_checkpoint *ck)
{
    return ck ? ck->m.step : -1;
}

CKPT_API const char *ckpt_checkpoint_path(const ckpt_checkpoint *ck)
{
    return ck ? ck->dir : NULL;
}

CKPT_API size_t ckpt_checkpoint_tensor_count(const ckpt_checkpoint *ck)
{
    return ck ? ck->m.ntensors : 0;
}

CKPT_API int ckpt_checkpoint_tensor(const ckpt_checkpoint *ck, size_t i, ckpt_tensor_info *info)
{
    if (!ck || !info || i >= ck->m.ntensors)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensor: index %zu out of range", i);
    const manifest_tensor *t = &ck->m.tensors[i];
    memset(info, 0, sizeof *info);
    info->name = t->name;
    info->dtype = t->dtype;
    info->ndim = t->ndim;
    memcpy(info->shape, t->shape, sizeof t->shape);
    info->bytes = t->bytes;
    info->stored_bytes = t->stored_bytes;
    info->chunks = t->chunks;
    return CKPT_OK;
}

CKPT_API int ckpt_checkpoint_find(const ckpt_checkpoint *ck, const char *name, size_t *index)
{
    if (!ck || !name || !index)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_find: NULL argument");
    long i = reader_find(ck, name);
    if (i < 0)
        return ckpt_seterr(CKPT_ENOTFOUND, "tensor '%s' is not in %s", name, ck->label);
    *index = (size_t)i;
    return CKPT_OK;
}

CKPT_API const char *ckpt_checkpoint_metadata(const ckpt_checkpoint *ck)
{
    return ck ? ck->meta_text : NULL;
}

CKPT_API const char *ckpt_checkpoint_env(const ckpt_checkpoint *ck)
{
    return ck ? ck->env_text : NULL;
}

CKPT_API const char *ckpt_checkpoint_manifest(const ckpt_checkpoint *ck)
{
    return ck ? ck->text : NULL;
}

CKPT_API double ckpt_checkpoint_time(const ckpt_checkpoint *ck)
{
    return ck ? ck->m.time : 0.0;
}

CKPT_API int ckpt_checkpoint_stats(const ckpt_checkpoint *ck, ckpt_save_stats *stats)
{
    if (!ck || !stats)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_stats: NULL argument");
    *stats = ck->m.stats;
    return CKPT_OK;
}

CKPT_API int ckpt_checkpoint_read(ckpt_checkpoint *ck, const char *name, void *dst,
                                  uint64_t bytes)
{
    if (!ck || !name || (!dst && bytes))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_read: NULL argument");
    long i = reader_find(ck, name);
    if (i < 0)
        return ckpt_seterr(CKPT_ENOTFOUND, "tensor '%s' is not in %s", name, ck->label);
    if (ck->m.tensors[i].bytes != bytes)
        return ckpt_seterr(CKPT_EMISMATCH, "tensor '%s' has %llu bytes, buffer %llu", name,
                           (unsigned long long)ck->m.tensors[i].bytes,
                           (unsigned long long)bytes);
    reader_target t = {(uint32_t)i, dst, CKPT_MEM_HOST, NULL};
    pthread_mutex_lock(&ck->store->api_lock);
    int rc = reader_read(ck, &t, 1);
    pthread_mutex_unlock(&ck->store->api_lock);
    return rc;
}

CKPT_API int ckpt_load(ckpt_store *s, int64_t step, const char *name, void **data,
                       uint64_t *bytes, ckpt_tensor_info *info)
{
    if (!s || !name || !data)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_load: NULL argument");
    *data = NULL;
    ckpt_checkpoint *ck;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    /* CKPT_LATEST: the newest step whose every chunk verifies, so that
     * tensors loaded one by one all come from the same valid step. */
    int rc = step != CKPT_LATEST ? reader_open_step(s, step, &ck)
                                 : reader_open_newest(s, CKPT_VERIFY_FULL, &ck);
    pthread_mutex_unlock(&s->api_lock);
    if (rc)
        return rc;
    size_t i;
    void *buf = NULL;
    if (!(rc = ckpt_checkpoint_find(ck, name, &i))) {
        uint64_t n = ck->m.tensors[i].bytes;
        if (!(buf = malloc(n ? (size_t)n : 1)))
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory for %llu bytes of '%s'",
                             (unsigned long long)n, name);
        else if (!(rc = ckpt_checkpoint_read(ck, name, buf, n))) {
            if (bytes)
                *bytes = n;
            if (info) {
                ckpt_checkpoint_tensor(ck, i, info);
                info->name = NULL; /* owned by the checkpoint, which goes now */
            }
        }
    }
    ckpt_checkpoint_free(ck);
    if (rc) {
        free(buf);
        return rc;
    }
    *data = buf;
    return CKPT_OK;
}

/* restore: newest-valid restore and verification on top of reader.c. */
#include "restore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "layout.h"
#include "reader.h"

/* Match caller tensors to the checkpoint: caller errors, never damage. */
static int match(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count, int allow_missing,
                 reader_target *targets, size_t *ntargets)
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
        targets[k++] = (reader_target){(uint32_t)idx, t[i].data, mem, NULL, ordinal};
    }
    *ntargets = k;
    return CKPT_OK;
}

int restore_step(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error, ckpt_checkpoint **keep)
{
    ckpt_checkpoint *ck;
    *caller_error = 0;
    int rc = reader_open_step(s, step, &ck);
    if (rc)
        return rc;
    rc = restore_from(ck, t, count, o, caller_error);
    if (rc == CKPT_OK && keep)
        *keep = ck;
    else
        reader_close(ck);
    return rc;
}

int restore_from(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error)
{
    int rc;
    *caller_error = 0;
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
    return rc;
}

int restore_run(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                const ckpt_restore_options *o, ckpt_report *r, ckpt_checkpoint **keep)
{
    int64_t *steps = NULL;
    size_t n = 0;
    int rc = CKPT_OK;
    if (step == CKPT_LATEST) {
        rc = layout_scan(&s->lay, &steps, &n);
    } else if (!(steps = malloc(sizeof *steps))) {
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    } else {
        steps[0] = step;
        n = 1;
    }
    int restored = 0;
    for (size_t i = n; i-- > 0 && !rc;) {
        int caller_error;
        int r1 = restore_step(s, steps[i], t, count, o, &caller_error, keep);
        if (r1 == CKPT_OK) {
            r->step = steps[i];
            restored = 1;
            break;
        }
        if (caller_error || !reader_is_damage(r1) || step != CKPT_LATEST) {
            rc = r1;
            break;
        }
        reader_report_failure(r, steps[i], r1, ckpt_error_last());
    }
    if (!rc && !restored) {
        if (r->count)
            rc = ckpt_seterr(CKPT_ENOCKPT, "no valid checkpoint in %s: %zu skipped, newest "
                             "because: %s", s->lay.root, r->count, r->items[0].message);
        else
            rc = ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s", s->lay.root);
    }
    free(steps);
    return rc;
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

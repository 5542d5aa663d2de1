/* retention: step order and which steps are kept (retention.h). */
#include "retention.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "eventlog.h"
#include "fsio.h"
#include "layout.h"
#include "reader.h"
#include "report.h"
#include "util.h"

static int known_damaged(const ckpt_store *st, int64_t step)
{
    for (size_t i = 0; i < st->ndamaged; i++)
        if (st->damaged[i] == step)
            return 1;
    return 0;
}

void retention_note_damaged(ckpt_store *st, int64_t step, int status)
{
    if ((status != CKPT_ECORRUPT && status != CKPT_EINCOMPLETE) || known_damaged(st, step))
        return;
    int64_t *grown = realloc(st->damaged, (st->ndamaged + 1) * sizeof *grown);
    if (!grown)
        return;
    st->damaged = grown;
    st->damaged[st->ndamaged++] = step;
}

/* Is committed step `step` damaged?  Verified in full (every chunk's
 * hashes, as a restore checks what it reads) unless known already. */
static int is_damaged(ckpt_store *st, int64_t step)
{
    if (known_damaged(st, step))
        return 1;
    ckpt_checkpoint *ck = NULL;
    int rc = reader_open_step(st, step, &ck);
    if (!rc)
        rc = reader_verify_all(ck, NULL);
    reader_close(ck);
    ckpt_error_clear();
    retention_note_damaged(st, step, rc);
    return rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE;
}

int retention_check_order(ckpt_store *st, int64_t step)
{
    if (st->opts.flags & CKPT_OPEN_REWIND)
        return CKPT_OK;
    int64_t *steps;
    size_t n;
    int rc = layout_scan(&st->lay, &steps, &n);
    if (rc)
        return rc;
    /* The newest step above `step` that restore would take. */
    int64_t newest = -1;
    for (size_t i = n; i-- > 0 && newest < 0 && steps[i] > step;)
        if (!is_damaged(st, steps[i]))
            newest = steps[i];
    free(steps);
    if (newest < 0)
        return CKPT_OK;
    return ckpt_seterr(CKPT_EINVAL, "step %lld is below step %lld, already committed in %s: "
                       "restore would go on choosing the higher step.  A new run belongs "
                       "in a new directory (or remove the old steps first); to go back to "
                       "an earlier step of this run, open the store with CKPT_OPEN_REWIND "
                       "(ckpt import --rewind; Python: Store(..., rewind=True)), which "
                       "retires the steps above it once it commits", (long long)step, (long long)newest, st->lay.root);
}

/* 1: counts as kept, 0: damaged (retire when old enough), -1: not ours
 * (never touched), -2: out of memory (the error is set).  Out of memory
 * is no verdict: taken for damage, the newest step went uncounted and an
 * older one was kept in its place (a gc's report listing the wrong
 * steps). */
static int classify(ckpt_store *st, int64_t step, int64_t just)
{
    if (step == just)
        return 1;
    ckpt_checkpoint *ck = NULL;
    int rc = reader_open_step(st, step, &ck);
    reader_close(ck);
    if (rc == CKPT_ENOMEM)
        return -2;
    ckpt_error_clear();
    return rc == CKPT_OK ? 1 : rc == CKPT_EACCES ? -1 : 0;
}

/* For a step retired whatever its state: 1 when it is not ours to touch
 * (the directory or any entry in it fails the trust rules, as an open
 * would refuse a foreign manifest or shard), else 0.  Neither the
 * manifest nor the shard index is read: after each commit the step
 * retired is the oldest, and reading a 10,000-tensor step costs as much
 * as a third of the save. */
static int foreign(ckpt_store *st, int64_t step)
{
    char *dir = layout_step_path(&st->lay, step);
    int oom = !dir;
    int bad = !dir || layout_check_trusted(&st->lay, dir) == CKPT_EACCES ||
              layout_holds_superusers_dir(&st->lay, dir);
    char **names;
    size_t n;
    int lrc = bad ? 0 : fsio_list(&st->lay.fs, dir, &names, &n);
    if (!bad && lrc == 0) {
        for (size_t i = 0; i < n; i++) {
            char *path = util_join(dir, names[i]);
            oom |= !path;
            bad |= !path || layout_check_trusted(&st->lay, path) == CKPT_EACCES;
            free(path);
            free(names[i]);
        }
        free(names);
    }
    free(dir);
    ckpt_error_clear();
    /* Out of memory (-2, said) is no verdict either: taken for "not
     * ours", the step was silently kept (and left off a gc's report). */
    if (oom || lrc == -ENOMEM)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory looking at step %lld",
                           (long long)step), -2;
    return bad;
}

/* Delete the renamed steps' directories (best effort: leftovers are
 * cleaned at the next writer's open) and free the list. */
static void remove_paths(const fsio *fs, char **paths, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fsio_remove_tree(fs, paths[i]);
        free(paths[i]);
    }
    free(paths);
}

typedef struct removal {
    const fsio *fs; /* the store's: it outlives its background jobs */
    char **paths;
    size_t n;
} removal;

static int removal_job(void *arg, int worker)
{
    (void)worker;
    removal *r = arg;
    remove_paths(r->fs, r->paths, r->n);
    free(r);
    return CKPT_OK; /* background jobs never fail (context_stop) */
}

void retention_plan_free(retention_plan *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->paths[i]);
        free(p->trash[i]);
    }
    free(p->steps);
    free(p->paths);
    free(p->trash);
    memset(p, 0, sizeof *p);
}

int retention_plan_rewind(ckpt_store *st, int64_t just, retention_plan *p)
{
    memset(p, 0, sizeof *p);
    if (!(st->opts.flags & CKPT_OPEN_REWIND))
        return CKPT_OK;
    int64_t *steps;
    size_t n;
    int rc = layout_scan(&st->lay, &steps, &n);
    if (rc)
        return rc;
    size_t above = 0;
    while (above < n && steps[n - 1 - above] > just)
        above++;
    if (above) {
        p->steps = malloc(above * sizeof *p->steps);
        p->paths = calloc(above, sizeof *p->paths);
        p->trash = calloc(above, sizeof *p->trash);
        if (!p->steps || !p->paths || !p->trash)
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    for (size_t i = n - above; !rc && i < n; i++) {
        int f = foreign(st, steps[i]);
        if (f == -2)
            rc = CKPT_ENOMEM; /* said */
        else if (f == 0 && !(rc = layout_retire_prepare(&st->lay, steps[i],
                                                        &p->paths[p->n], &p->trash[p->n])))
            p->steps[p->n++] = steps[i];
    }
    free(steps);
    if (rc)
        retention_plan_free(p);
    return rc;
}

void retention_after_save(ckpt_store *st, int64_t just, retention_plan *plan)
{
    if (st->opts.keep_last <= 0 && !(st->opts.flags & CKPT_OPEN_REWIND))
        return;
    ckpt_error_state e; /* the save succeeded: keep its (empty) error */
    ckpt_error_capture(&e, CKPT_OK);
    st->lay.defer_removal = 1;
    /* The rewound run's abandoned steps first, with nothing to allocate
     * (a failure here is a rename's, as for any retirement). */
    for (size_t i = 0; plan && i < plan->n; i++) {
        layout_retire_prepared(&st->lay, plan->steps[i], plan->paths[i], plan->trash[i]);
        plan->paths[i] = plan->trash[i] = NULL;
    }
    int rc = retention_apply(st, st->opts.keep_last > 0 ? (size_t)st->opts.keep_last
                                                        : SIZE_MAX, just, -1, 0, NULL);
    st->lay.defer_removal = 0;
    /* The save stands; but old steps that stay fill the disk, unseen
     * unless the log says so (ckpt log, metrics). */
    eventlog_retire_failed(st->events, just, rc);
    size_t n;
    char **paths = layout_take_removals(&st->lay, &n);
    removal *r = n && st->pool ? malloc(sizeof *r) : NULL;
    if (r) {
        *r = (removal){&st->lay.fs, paths, n};
        if (pool_submit(st->pool, &st->background, removal_job, r) == CKPT_OK) {
            paths = NULL; /* the job's now */
            n = 0;
        } else {
            free(r);
        }
    }
    remove_paths(&st->lay.fs, paths, n); /* without a pool or memory: here */
    ckpt_error_restore(&e);
}

int retention_apply(ckpt_store *st, size_t keep_last, int64_t just, int64_t protect,
                    int dry_run, ckpt_report *report)
{
    int64_t *steps, *retire;
    size_t n, m = 0;
    int rc = layout_scan(&st->lay, &steps, &n);
    if (rc)
        return rc;
    if (!(retire = malloc((n ? n : 1) * sizeof *retire))) {
        free(steps);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    int rewind = just >= 0 && (st->opts.flags & CKPT_OPEN_REWIND);
    size_t kept = 0;
    for (size_t i = n; i-- > 0;) {
        int64_t s = steps[i];
        int c;
        if (just >= 0 && s > just) {
            if (rewind && (c = foreign(st, s)) == 0)
                retire[m++] = s; /* the abandoned future of a rewound run */
            if (rewind && c == -2) {
                free(retire);
                free(steps);
                return CKPT_ENOMEM;
            }
            continue;
        }
        /* Whether a step counts as kept needs an open (quick verification);
         * past the count, only whether it may be touched. */
        c = kept < keep_last ? classify(st, s, just) : -foreign(st, s);
        if (c == 2)
            c = -2; /* foreign's out of memory */
        if (c == -2) {
            free(retire);
            free(steps);
            return CKPT_ENOMEM;
        }
        if (c < 0)
            continue;
        if (kept < keep_last && c == 1)
            kept++;
        else if (kept >= keep_last && s != protect)
            retire[m++] = s;
    }
    /* Oldest first, as layout_retain expects; keep none of the list. */
    for (size_t i = 0; i < m / 2; i++) {
        int64_t t = retire[i];
        retire[i] = retire[m - 1 - i];
        retire[m - 1 - i] = t;
    }
    rc = layout_retain(&st->lay, retire, m, 0, -1, -1, dry_run, report);
    free(retire);
    free(steps);
    return rc;
}

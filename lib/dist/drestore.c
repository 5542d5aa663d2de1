/* drestore: the agreed restore (include/ckpt.h, "ranks").
 *
 * Rounds, until every rank holds the same step: each rank restores the
 * newest step not above the bound that it can (verifying every chunk it
 * reads); an all-reduce (minimum) gives the newest step every rank
 * restored; ranks above it go down to it in the next round.  The lowest
 * rank that stopped at the agreed step tells the others why it could not
 * restore the newer ones, and each rank that had to give up a newer step
 * lists it in its report with that reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "error.h"
#include "layout.h"
#include "reader.h"
#include "restore.h"
#include "retention.h"
#include "util.h"
#include "walk.h"

typedef struct skip_reason {
    int32_t status;
    int32_t rank;
    char message[504];
} skip_reason;

/* Restore from `step` through this rank's part manifest when the step has
 * one and it holds every tensor asked for: the rank then reads its own
 * part and shard only, whatever the world size (docs/SCALING.md).  Rank
 * 0, and any rank that needs another's tensors (resharding), opens the
 * global manifest, which checks every shard's index: a step whose commit
 * record is damaged is skipped by rank 0, so by all.  A damaged part sends
 * its rank to the global manifest too. */
static int restore_rank_step(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                             const ckpt_restore_options *o, int *caller_error,
                             unsigned char *hit)
{
    *caller_error = 0;
    if (s->rank == 0)
        return restore_step(s, step, t, count, o, caller_error, NULL, hit);
    char part[MANIFEST_PART_NAME_SIZE];
    manifest_part_name(s->rank, part);
    char *dir = layout_step_path(&s->lay, step), *path = dir ? util_join(dir, part) : NULL;
    int kind = FSIO_KIND_NONE, own = 0, rc = CKPT_OK;
    ckpt_checkpoint *ck = NULL;
    if (!path)
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    else if (fsio_kind(&s->lay.fs, path, 0, &kind) == 0 && kind == FSIO_KIND_FILE &&
             !(rc = layout_check_trusted(&s->lay, dir)) &&
             !(rc = reader_open_manifest(s, dir, part, step, &ck))) {
        own = 1;
        for (size_t i = 0; i < count && own; i++)
            own = reader_find(ck, t[i].name) >= 0;
    }
    /* The part is a shortcut, the global manifest the record of the
     * commit (what ckpt verify and ckpt latest check): a damaged part does
     * not make the step unrestorable when the global manifest is intact. */
    if (rc && reader_is_damage(rc))
        rc = CKPT_OK, own = 0;
    /* A step saved by more ranks than the store has: with verify FULL this
     * rank also answers for the shards of ranks rank + W, ... which only
     * the global manifest opens. */
    if (!rc && own && o->verify == CKPT_VERIFY_FULL &&
        ck->m.world_size > (uint32_t)s->opts.world_size)
        own = 0;
    if (!rc && own)
        rc = restore_from(ck, t, count, o, caller_error, hit);
    if (!rc && own)
        rc = restore_verify_part(ck, t, count, o, 1); /* the part: this rank's shard */
    reader_close(ck);
    free(path);
    free(dir);
    if (rc || own)
        return rc;
    return restore_step(s, step, t, count, o, caller_error, NULL, hit);
}

/* The newest step <= bound this rank restores; -1 if none.  A failure
 * that is not damage (the caller's mistake, no memory) ends the restore:
 * *fatal.  A step gone from the root since the listing (a writer's
 * retention) is passed over unreported, setting *vanished. */
static int64_t newest_restorable(ckpt_store *s, const int64_t *steps, size_t n, int64_t bound,
                                 int64_t have, const ckpt_tensor *t, size_t count,
                                 const ckpt_restore_options *o, ckpt_report *r,
                                 restore_marks *mk, int *fatal, int *vanished)
{
    for (size_t i = n; i-- > 0;) {
        if (steps[i] > bound)
            continue;
        if (steps[i] == have)
            return have; /* restored in an earlier round: the buffers (and hits) hold it */
        int caller_error;
        memset(mk->hit, 0, count);
        int rc = restore_rank_step(s, steps[i], t, count, o, &caller_error, mk->hit);
        if (rc == CKPT_OK)
            return steps[i];
        /* As in one process: a step of other shapes that is damaged too is
         * skipped for its damage when an older one fits this rank. */
        if (caller_error &&
            restore_damaged_anyway(s, steps, i, t, count, o->allow_missing, &rc))
            caller_error = 0;
        if (caller_error || !reader_is_damage(rc)) {
            *fatal = rc;
            return -1;
        }
        restore_marks_abandon(mk, steps[i]);
        if (walk_step_gone(s, steps[i])) {
            *vanished = 1;
            continue;
        }
        retention_note_damaged(s, steps[i], rc);
        reader_report_failure(r, steps[i], rc, ckpt_error_last());
    }
    return -1;
}

/* newest_restorable's arguments and results, for coord_pace's thread. */
typedef struct search_job {
    ckpt_store *s;
    const int64_t *steps;
    size_t n;
    int64_t bound, have;
    const ckpt_tensor *t;
    size_t count;
    const ckpt_restore_options *o;
    ckpt_report *r;
    restore_marks *mk;
    int64_t mine;
    int fatal, vanished;
} search_job;

static int search_job_run(void *arg)
{
    search_job *j = arg;
    j->mine = newest_restorable(j->s, j->steps, j->n, j->bound, j->have, j->t, j->count, j->o,
                                j->r, j->mk, &j->fatal, &j->vanished);
    return j->fatal;
}

/* newest_restorable, paced with the other ranks (a rank with more to read
 * is slow, not dead); *rc: the pacing's failure. */
static int64_t newest_paced(search_job *j, int *fatal, int *vanished, int *rc)
{
    int work_rc;
    j->fatal = 0;
    j->vanished = 0;
    j->mine = -1;
    *rc = coord_pace(&j->s->dist->c, *fatal ? NULL : search_job_run, j, &work_rc,
                     "restore: pacing the ranks that still read");
    if (!*fatal) {
        *fatal = j->fatal;
        *vanished |= j->vanished;
    }
    return j->mine;
}

/* The first reason this rank recorded for a step above `agreed`. */
static void my_reason(const ckpt_report *r, int64_t agreed, skip_reason *why)
{
    for (size_t i = 0; i < r->count; i++)
        if (r->items[i].step > agreed) {
            why->status = r->items[i].status;
            snprintf(why->message, sizeof why->message, "%s", r->items[i].message);
            return;
        }
    why->status = CKPT_ENOCKPT;
    snprintf(why->message, sizeof why->message, "it has no newer step");
}

static int agree_restore(ckpt_store *s, int status, const ckpt_tensor *t, size_t count,
                         const ckpt_restore_options *o, ckpt_report *r, restore_marks *mk)
{
    coord *c = &s->dist->c;
    int64_t *steps = NULL;
    size_t n = 0;
    int fatal = status;
    if (!fatal)
        fatal = layout_scan(&s->lay, &steps, &n);
    int64_t bound = INT64_MAX, have = -2, agreed = -1;
    int vanished = 0, relists = 0;
    for (;;) {
        search_job job = {s, steps, n, bound, have, t, count, o, r, mk, -1, 0, 0};
        int rc;
        int64_t mine = newest_paced(&job, &fatal, &vanished, &rc);
        if (rc) {
            free(steps);
            return rc;
        }
        if (mine >= 0)
            have = mine;
        /* Anyone failing outright fails everyone (a caller's mistake on
         * one rank is everyone's restore failing). */
        ckpt_error_state mine_err;
        ckpt_error_capture(&mine_err, fatal);
        int64_t worst = fatal;
        rc = coord_allreduce_min(c, &worst, "restore: every rank's status");
        if (!rc && worst) {
            /* Every rank is here: the lowest failing rank says why, so
             * that the others name it (a tensor no rank of this job holds,
             * say, when the step was saved by fewer ranks). */
            int64_t culprit = fatal ? c->rank : c->world;
            skip_reason why;
            memset(&why, 0, sizeof why);
            int rc2 = coord_allreduce_min(c, &culprit, "restore: who failed");
            if (!rc2 && culprit < c->world) {
                if (culprit == c->rank) {
                    why.status = fatal;
                    snprintf(why.message, sizeof why.message, "%.500s", mine_err.message);
                }
                why.rank = (int32_t)culprit;
                rc2 = coord_bcast(c, &why, sizeof why, (int)culprit, "restore: why it failed");
            }
            free(steps);
            if (fatal)
                return ckpt_error_restore(&mine_err);
            if (rc2 || culprit >= c->world || !why.status)
                return ckpt_seterr((int)worst, "rank %d: another rank's restore failed (%s)",
                                   c->rank, ckpt_status_name((int)worst));
            return ckpt_seterr(why.status, "rank %d: rank %d's restore failed, so every "
                               "rank's did: %s", c->rank, why.rank, why.message);
        }
        agreed = mine;
        if (!rc)
            rc = coord_allreduce_min(c, &agreed, "restore: the newest step every rank has");
        int64_t all_there = mine == agreed;
        if (!rc)
            rc = coord_allreduce_min(c, &all_there, "restore: did every rank have it");
        if (rc) {
            free(steps);
            return rc;
        }
        if (agreed < 0 && relists < WALK_MAX_RELISTS) {
            /* No step every rank has: when a rank saw a step retired under
             * it (a writer keeping few steps), newer ones have come; every
             * rank lists the root again and the rounds start over. */
            int64_t none_vanished = !vanished;
            if ((rc = coord_allreduce_min(c, &none_vanished, "restore: a step retired"))) {
                free(steps);
                return rc;
            }
            if (!none_vanished) {
                if (mine >= 0) /* restored here, but no longer the step */
                    restore_marks_abandon(mk, mine);
                free(steps);
                steps = NULL;
                n = 0;
                fatal = layout_scan(&s->lay, &steps, &n);
                bound = INT64_MAX, have = -2, vanished = 0, relists++;
                continue;
            }
        }
        if (all_there || agreed < 0)
            break;
        if (mine > agreed) /* restored, but this rank goes down: abandoned */
            restore_marks_abandon(mk, mine);
        /* Some rank stopped lower: the lowest such rank says why. */
        int64_t culprit = mine == agreed ? c->rank : c->world;
        skip_reason why;
        memset(&why, 0, sizeof why);
        if (!(rc = coord_allreduce_min(c, &culprit, "restore: who stopped lower"))) {
            if (culprit == c->rank)
                my_reason(r, agreed, &why);
            why.rank = (int32_t)culprit;
            rc = coord_bcast(c, &why, sizeof why, (int)culprit, "restore: why");
        }
        if (rc) {
            free(steps);
            return rc;
        }
        for (size_t i = 0; i < n && mine > agreed; i++)
            if (steps[i] > agreed && steps[i] <= mine) {
                char msg[700];
                snprintf(msg, sizeof msg, "step %lld skipped on every rank: rank %d could not "
                         "restore it or a newer one: %s", (long long)steps[i], why.rank,
                         why.message);
                report_add(r, steps[i], why.status ? why.status : CKPT_ECORRUPT, msg, "", "",
                           -1);
                if (why.status != CKPT_ENOCKPT) /* not "it has no newer step" */
                    retention_note_damaged(s, steps[i], why.status);
            }
        bound = agreed;
    }
    free(steps);
    if (agreed < 0) {
        if (r->count)
            return ckpt_seterr(CKPT_ENOCKPT, "no step that every rank can restore in %s: %zu "
                               "skipped here, newest because: %s", s->lay.root, r->count,
                               r->items[0].message);
        return ckpt_seterr(CKPT_ENOCKPT, "no checkpoint in %s that every rank can restore",
                           s->lay.root);
    }
    r->step = agreed;
    return CKPT_OK;
}

/* Every rank restored the agreed step: a rank whose buffers still hold
 * bytes of a step it abandoned, in tensors the agreed step lacks
 * (allow_missing), fails, and so does every other rank, so that no rank
 * trains on while one stops. */
static int agree_leftovers(ckpt_store *s, const ckpt_tensor *t, size_t count,
                           restore_marks *mk, int64_t agreed)
{
    coord *c = &s->dist->c;
    int mine = restore_leftovers(t, count, mk, agreed);
    ckpt_error_state e;
    ckpt_error_capture(&e, mine);
    int64_t worst = mine;
    int rc = coord_allreduce_min(c, &worst, "restore: buffers of abandoned steps");
    if (rc)
        return rc;
    if (mine)
        return ckpt_error_restore(&e);
    if (worst)
        return ckpt_seterr((int)worst, "rank %d: another rank restored step %lld, but a "
                           "tensor of it that the step lacks holds bytes of a newer step it "
                           "abandoned; that rank names it", c->rank, (long long)agreed);
    return CKPT_OK;
}

int dist_restore(ckpt_store *s, int status, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, ckpt_report *r)
{
    restore_marks mk;
    int rc = restore_marks_init(&mk, count);
    if (rc && !status)
        status = rc; /* still takes part in the collectives, failing */
    rc = agree_restore(s, status, t, count, o, r, &mk);
    if (rc == CKPT_OK && (rc = agree_leftovers(s, t, count, &mk, r->step)))
        r->step = -1;
    restore_marks_free(&mk);
    return rc;
}

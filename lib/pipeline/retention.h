/* retention: which committed steps a writer keeps.  The order of steps is
 * the order of the run: a save may not go below the newest committed step
 * (unless the store rewinds, CKPT_OPEN_REWIND), and retention keeps the
 * newest `keep_last` steps that open (quick verification), never counting a
 * damaged step, never retiring a step above the one just committed, never
 * touching a step another user owns. */
#ifndef CKPT_RETENTION_H
#define CKPT_RETENTION_H

#include <stdint.h>

#include "context.h"

/* CKPT_OK when `step` may be saved now: not below the newest committed step
 * (CKPT_EINVAL naming both and the ways out), or the store rewinds.  Steps
 * above it that are damaged do not count: restore passes over them, so a
 * job that resumed below a damaged newest step saves on (the damaged step
 * stays, for ckpt verify to name, until a save of its number replaces it
 * or gc retires it).  Whether a step above is damaged is known from this
 * store's restores (retention_note_damaged), else found by verifying it
 * in full, once. */
int retention_check_order(ckpt_store *st, int64_t step);

/* A restore skipped committed step `step` as damaged (CKPT_ECORRUPT,
 * CKPT_EINCOMPLETE): remember it for retention_check_order.  Out of memory
 * forgets it (the check then verifies the step). */
void retention_note_damaged(ckpt_store *st, int64_t step, int status);

/* Retire what is not kept.  `just`: the step just committed (kept and
 * counted; with CKPT_OPEN_REWIND every step above it is retired), or -1.
 * `protect`: a step never retired (-1: none).  With `dry_run` nothing
 * changes.  Each (would-be) retirement goes to `report` (may be NULL).
 * Returns the first failure. */
int retention_apply(ckpt_store *st, size_t keep_last, int64_t just, int64_t protect,
                    int dry_run, ckpt_report *report);

struct retention_plan; /* below */

/* A save (of one process or of several ranks) committed `just`: retire
 * what the store's keep_last and CKPT_OPEN_REWIND do not keep, best effort
 * (a step left over is retired by a later save or gc; this thread's error
 * is left as it was).  The retired steps are renamed out of the namespace
 * and the root fsynced here; deleting their files is queued on the store's
 * background jobs (inline without a pool or memory), which ckpt_gc and
 * closing the store wait for. */
void retention_after_save(ckpt_store *st, int64_t just, struct retention_plan *plan);
/* (`plan`: NULL, or the steps above `just` prepared by retention_plan_rewind,
 * retired first; the strings are taken, the caller frees the plan.) */

/* With CKPT_OPEN_REWIND, the steps above the one a save is about to
 * commit, with their retirement prepared (layout_retire_prepare) before
 * the commit: once it is committed the steps above must go, or
 * restore(LATEST) goes on taking the abandoned, higher steps, and a
 * failure to allocate after the commit could not fail the save.
 * retention_after_save retires them first. */
typedef struct retention_plan {
    size_t n;
    int64_t *steps;
    char **paths, **trash;
} retention_plan;
/* Fill `p` (all zero when the store does not rewind or nothing is above
 * `just`).  CKPT_OK, or the error (said; `p` is then empty): the save
 * must fail before its commit. */
int retention_plan_rewind(ckpt_store *st, int64_t just, retention_plan *p);
void retention_plan_free(retention_plan *p);

#endif

/* walk: the committed steps of a root from the newest down, for the
 * searches for the newest valid step (reader_open_newest, restore_run).
 *
 * A writer that keeps few steps retires the step a reader listed as the
 * newest while the reader opens it, or while the reader lists the root
 * (the entry vanishes from the listing, and the step replacing it was
 * made after).  A step gone from the root is not damage, and the search
 * must not end without its successor: the walk lists the root again. */
#ifndef CKPT_WALK_H
#define CKPT_WALK_H

#include <stddef.h>
#include <stdint.h>

#include "context.h"

/* How many times a search lists the root again (drestore.c too). */
#define WALK_MAX_RELISTS 16

typedef struct step_walk {
    int64_t *steps;  /* the latest listing, ascending */
    size_t n, i;     /* the next step tried is steps[i - 1] */
    int64_t *tried;  /* steps found unusable (damaged) in this walk */
    size_t ntried, cap;
    int relists;     /* listings made after the first */
} step_walk;

/* Begin a walk over the steps of `s` (lists the root): CKPT_OK or the
 * listing's status.  walk_free it either way. */
int walk_start(ckpt_store *s, step_walk *w);
/* A walk over the single step `step` (a caller naming a step): no listing,
 * never listed again. */
int walk_one(step_walk *w, int64_t step);
/* The next step to try, newest first, skipping those found damaged: 1 and
 * `*step`.  At the end of a listing the root is listed again, and the walk
 * goes on when that shows a step not tried yet (a bounded number of
 * times).  0 at the end; a negative status when a listing failed. */
int walk_next(ckpt_store *s, step_walk *w, int64_t *step);
/* `step`, just returned by walk_next, cannot be used (a damage status):
 * returns 1 when its directory is gone from the root (retired or removed
 * since the listing: no damage to report), the root having been listed
 * again so that walk_next starts over from the new newest step; returns 0
 * when it is still there (damaged: not tried again) or the listings are
 * spent.  Keeps the caller's error message. */
int walk_gone(ckpt_store *s, step_walk *w, int64_t step);
/* 1 when step `step`'s directory is gone from the root of `s` (retired by
 * a writer or removed: no damage to report), else 0. */
int walk_step_gone(ckpt_store *s, int64_t step);
/* Index of `step` in w->steps, the listing walk_next took it from (for a
 * look at the steps older than it). */
size_t walk_index(const step_walk *w);
void walk_free(step_walk *w);

#endif

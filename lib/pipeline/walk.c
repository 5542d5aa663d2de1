/* walk: the committed steps of a root from the newest down (walk.h). */
#include "walk.h"

#include <errno.h>
#include <stdlib.h>

#include "error.h"
#include "fsio.h"
#include "layout.h"

/* A reader racing a writer that saves in a tight loop can lose a few
 * rounds; each costs one listing of the root. */
#define WALK_RELISTS WALK_MAX_RELISTS

int walk_start(ckpt_store *s, step_walk *w)
{
    *w = (step_walk){0};
    int rc = layout_scan(&s->lay, &w->steps, &w->n);
    w->i = w->n;
    return rc;
}

int walk_one(step_walk *w, int64_t step)
{
    *w = (step_walk){0};
    w->relists = WALK_RELISTS;
    if (!(w->steps = malloc(sizeof *w->steps)))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    w->steps[0] = step;
    w->n = w->i = 1;
    return CKPT_OK;
}

static int tried(const step_walk *w, int64_t step)
{
    for (size_t k = 0; k < w->ntried; k++)
        if (w->tried[k] == step)
            return 1;
    return 0;
}

static int relist(ckpt_store *s, step_walk *w)
{
    int64_t *steps;
    size_t n;
    int rc = layout_scan(&s->lay, &steps, &n);
    if (rc)
        return rc;
    free(w->steps);
    w->steps = steps;
    w->n = w->i = n;
    w->relists++;
    return CKPT_OK;
}

int walk_next(ckpt_store *s, step_walk *w, int64_t *step)
{
    for (int relisted = 0;; relisted = 1) {
        while (w->i > 0) {
            int64_t at = w->steps[--w->i];
            if (!tried(w, at)) {
                w->i++; /* steps[i - 1] is the one being tried */
                *step = at;
                return 1;
            }
        }
        /* One more look for steps made since the listing: none is new
         * when nothing raced us, and the walk ends. */
        if (relisted || w->relists >= WALK_RELISTS)
            return 0;
        int rc = relist(s, w);
        if (rc)
            return rc;
    }
}

size_t walk_index(const step_walk *w)
{
    return w->i - 1;
}

int walk_step_gone(ckpt_store *s, int64_t step)
{
    char *dir = layout_step_path(&s->lay, step);
    fsio_info info;
    int st = dir ? fsio_info_of(&s->lay.fs, dir, -1, &info) : -ENOMEM;
    free(dir);
    return st == -ENOENT || (!st && info.kind != FSIO_KIND_DIR);
}

int walk_gone(ckpt_store *s, step_walk *w, int64_t step)
{
    w->i--; /* done with this one, whatever it was */
    if (walk_step_gone(s, step) && w->relists < WALK_RELISTS) {
        ckpt_error_state e;
        ckpt_error_capture(&e, 0);
        int rc = relist(s, w);
        ckpt_error_restore(&e);
        if (!rc)
            return 1;
    }
    if (w->ntried == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 8;
        int64_t *t = realloc(w->tried, cap * sizeof *t);
        if (!t)
            return 0; /* only the skip is lost: the step may be tried again */
        w->tried = t;
        w->cap = cap;
    }
    w->tried[w->ntried++] = step;
    return 0;
}

void walk_free(step_walk *w)
{
    free(w->steps);
    free(w->tried);
    *w = (step_walk){0};
}

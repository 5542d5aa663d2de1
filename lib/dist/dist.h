/* dist: several ranks saving one checkpoint (include/ckpt.h, "ranks";
 * docs/SCALING.md).  A layer above the pipeline: it agrees at open on who
 * holds the lock, names each save's shared temporary directory and
 * checkpoint id, ends each save's persist thread with the global commit
 * (dcommit.c) and agrees on the step a restore takes (drestore.c).  Every
 * collective goes through coord.c.  The public faces (store.c, save.c,
 * restore.c) call in here only when world_size > 1. */
#ifndef CKPT_DIST_H
#define CKPT_DIST_H

#include <stddef.h>

#include "context.h"
#include "coord.h"
#include "report.h"

/* Bytes of a version-1 ckpt_store_options: it ends before `rank`. */
#define DIST_OPTIONS_V1_SIZE offsetof(ckpt_store_options, rank)
struct dist_state {
    coord c;
    unsigned char token[16]; /* rank 0's, agreed at open: names this job's saves */
    uint64_t saves;          /* collective saves begun (same count on every rank) */
    coord_pace_t *pace;      /* the save's pacing, from its begin to its exchange */
    /* Held by ckpt_save_begin and ckpt_save_refuse from the pacing's start
     * until the save is in flight or its failure exchanged: another
     * thread's begin would otherwise find no save to wait for and start a
     * second pacing over the first. */
    pthread_mutex_t begin_lock;
};

/* Check rank, world_size and timeout_ms; 0 -> defaults. */
int dist_resolve_options(ckpt_store_options *o);
/* The collective part of ckpt_store_open (world_size > 1), after the root
 * is resolved: rank 0 locks and cleans, the others check the lock names
 * rank 0, all agree.  Sets s->dist, s->rank and (writers) s->dist_finish. */
int dist_open(ckpt_store *s);
/* NULL is fine. */
void dist_free(struct dist_state *d);

/* First in every collective save, before its begin: waits for the save
 * in flight, then starts beating with the other ranks, so that a rank
 * whose begin writes (a state over host_memory_limit) is waited for; the
 * save's exchange (dist_finish or dist_save_failed) ends the beats. */
void dist_save_pace_start(ckpt_store *s);
/* d->begin_lock around a collective save's begin (or refusal). */
void dist_begin_lock(ckpt_store *s);
void dist_begin_unlock(ckpt_store *s);
/* Before every collective save: the shared temporary name and id. */
void dist_save_prepare(ckpt_store *s, int64_t step);
/* A save whose begin failed with `status` on this rank still takes part in
 * the commit protocol (the others wait for it), reporting the failure.
 * Returns `status` with its message. */
int dist_save_failed(ckpt_store *s, int64_t step, int status);
/* The persist thread's work on several ranks (context.h's dist_finish):
 * `persist` (unless `status` already failed the save) paced with the other
 * ranks, this rank's part, the report, rank 0's commit and its answer. */
int dist_finish(struct ckpt_save *save, int status, int (*persist)(struct ckpt_save *save));

/* ckpt_restore(CKPT_LATEST) on several ranks: `status` is this rank's
 * failure before it could try (checking arguments), CKPT_OK normally.  The
 * caller holds s->api_lock and drained the save in flight. */
int dist_restore(ckpt_store *s, int status, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, ckpt_report *r);

#endif

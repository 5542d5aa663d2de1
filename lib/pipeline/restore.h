/* restore: the newest-valid restore and verification, on top of reader.c
 * (lib/restore.c is the public face). */
#ifndef CKPT_RESTORE_H
#define CKPT_RESTORE_H

#include "context.h"
#include "reader.h"
#include "report.h"

/* The caller's restore options `in` (NULL: the defaults) in *out, a
 * version-1 struct's missing fields at their defaults.  CKPT_OK;
 * CKPT_EVERSION for an unknown version, CKPT_EINVAL for a `verify` other
 * than 0, CKPT_VERIFY_STORED or CKPT_VERIFY_FULL; `fn` names the call. */
int restore_options_read(const ckpt_restore_options *in, ckpt_restore_options *out,
                         const char *fn);

/* Restore `count` caller tensors from `step` (CKPT_LATEST: the newest step
 * that restores, each damaged newer one recorded in `r` and skipped).  The
 * caller holds s->api_lock and has drained the save in flight.  With
 * `keep` non-NULL, on success *keep is the step restored from, still open
 * (the caller's to reader_close); untouched on failure. */
int restore_run(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                const ckpt_restore_options *o, ckpt_report *r, ckpt_checkpoint **keep);

/* Restore the tensors from the one step `step` (>= 0).  *caller_error is
 * set when the failure is the caller's (a name not found, a mismatch), not
 * damage to the step.  Same locking and `keep` as restore_run.  `hit`
 * (NULL, or `count` bytes): set to 1 for each caller tensor the step
 * holds, whose buffer the restore writes (also when it then fails). */
int restore_step(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error, ckpt_checkpoint **keep,
                 unsigned char *hit);

/* The same from a step opened already (reader.h).  Does not look at
 * o->verify (restore_verify_part). */
int restore_from(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error, unsigned char *hit);

/* With o->verify CKPT_VERIFY_FULL, after restore_from of the caller's
 * `count` tensors `t` succeeded: verify every other chunk of the shards of
 * `ck` this process saved (`own`: all of them, a rank's part manifest;
 * else those of ranks rank, rank + W, ... of the store's world W); the
 * chunks restored were verified already.  CKPT_OK, or the damage
 * (reader_is_damage) naming it; CKPT_ENOMEM. */
int restore_verify_part(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                        const ckpt_restore_options *o, int own);

/* For a search of CKPT_LATEST over the ascending `steps`: steps[i] does
 * not fit the caller's tensors (status *rc, a caller error).  When an
 * older step does (the shapes changed since that one) and steps[i] is
 * damaged as well, no restore could use steps[i]: 1, with *rc and the
 * message the damage's, so that the search passes over it as over any
 * damaged step.  Else 0, with the caller's error and message as they were. */
int restore_damaged_anyway(ckpt_store *s, const int64_t *steps, size_t i,
                           const ckpt_tensor *t, size_t count, int allow_missing, int *rc);

/* Which caller buffers restores of abandoned steps wrote into.  A restore
 * that falls back from a step (found damaged while its chunks were being
 * written into the caller's buffers; on several ranks, also a step the
 * other ranks did not restore) leaves its bytes in every buffer the step
 * restored to in the end does not hold: with allow_missing such a tensor
 * would pass for untouched.  Each attempt fills `hit`; an abandoned one
 * adds it to `dirty`. */
typedef struct restore_marks {
    unsigned char *dirty, *hit; /* `count` bytes each, one allocation */
    size_t count;
    int64_t abandoned;          /* the newest step abandoned, -1 if none */
} restore_marks;

int restore_marks_init(restore_marks *mk, size_t count);
/* The attempt that filled `hit`, at `step`, was abandoned. */
void restore_marks_abandon(restore_marks *mk, int64_t step);
void restore_marks_free(restore_marks *mk);
/* After restoring `restored` (its hits in mk->hit): CKPT_ECORRUPT naming
 * the buffers abandoned attempts wrote and `restored` does not hold, which
 * the caller must set again; CKPT_OK if none. */
int restore_leftovers(const ckpt_tensor *t, size_t count, restore_marks *mk, int64_t restored);

/* Verify `step` (CKPT_NEWEST, CKPT_LATEST or a number) at `level`; every
 * problem goes to `r`, whose step is set to the step checked.  Same locking
 * as restore_run. */
int verify_run(ckpt_store *s, int64_t step, ckpt_verify_level level, ckpt_report *r);

#endif

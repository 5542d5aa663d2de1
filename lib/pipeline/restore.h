/* restore: the newest-valid restore and verification, on top of reader.c
 * (lib/restore.c is the public face). */
#ifndef CKPT_RESTORE_H
#define CKPT_RESTORE_H

#include "context.h"
#include "reader.h"
#include "report.h"

/* Restore `count` caller tensors from `step` (CKPT_LATEST: the newest step
 * that restores, each damaged newer one recorded in `r` and skipped).  The
 * caller holds s->api_lock and has drained the save in flight.  With
 * `keep` non-NULL, on success *keep is the step restored from, still open
 * (the caller's to reader_close); untouched on failure. */
int restore_run(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                const ckpt_restore_options *o, ckpt_report *r, ckpt_checkpoint **keep);

/* Restore the tensors from the one step `step` (>= 0).  *caller_error is
 * set when the failure is the caller's (a name not found, a mismatch), not
 * damage to the step.  Same locking and `keep` as restore_run. */
int restore_step(ckpt_store *s, int64_t step, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error, ckpt_checkpoint **keep);

/* The same from a step opened already (reader.h). */
int restore_from(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                 const ckpt_restore_options *o, int *caller_error);

/* Verify `step` (CKPT_NEWEST, CKPT_LATEST or a number) at `level`; every
 * problem goes to `r`, whose step is set to the step checked.  Same locking
 * as restore_run. */
int verify_run(ckpt_store *s, int64_t step, ckpt_verify_level level, ckpt_report *r);

#endif

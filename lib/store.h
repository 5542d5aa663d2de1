/* store: the checkpoint root.  Naming, lock, scan, commit, retention and
 * cleanup of stale temporary directories.  Nothing else touches the
 * root's namespace. */
#ifndef CKPT_STORE_H
#define CKPT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define STORE_LOCK_NAME ".lock"
#define STORE_TMP_PREFIX ".tmp-"
#define STORE_TRASH_PREFIX ".trash-"
/* A committed step moved aside while its replacement is renamed in (only on
 * file systems without RENAME_EXCHANGE); put back at open if left alone. */
#define STORE_REPLACED_PREFIX ".replaced-"

/* "step-%012lld" into buf (at least 32 bytes). */
void store_step_name(int64_t step, char *buf, size_t size);
/* Parse a committed step directory name; false for anything else. */
int store_parse_step_name(const char *name, int64_t *step);
/* malloc'd ROOT/step-N. */
char *store_step_path(const ckpt_store *s, int64_t step);

/* Take the writer lock; CKPT_EBUSY if held elsewhere. */
int store_lock(ckpt_store *s);
/* Remove `.tmp-*` and `.trash-*` directories left by dead writers and put
 * back a `.replaced-step-N-*` whose step-N is missing.  Best effort: what
 * cannot be done now is tried again next open. */
void store_clean_stale(ckpt_store *s);

/* Committed steps, ascending. */
int store_scan(ckpt_store *s, int64_t **steps, size_t *count);

/* Create a fresh temporary directory for step; *path malloc'd. */
int store_make_temp(ckpt_store *s, int64_t step, char **path);
/* Make tmp visible as step-N atomically (replacing an existing step-N) and
 * fsync the root. */
int store_commit(ckpt_store *s, const char *tmp, int64_t step);
/* Retire step-N: rename out of the step namespace, fsync, then delete. */
int store_retire(ckpt_store *s, int64_t step);
/* After a commit of `just`: keep the newest keep_last steps and `just`. */
void store_apply_retention(ckpt_store *s, int64_t just);

#endif

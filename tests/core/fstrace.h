/* fstrace: a record of every file-system call a store makes under one root
 * (through the fsio seam's trace hook), and a model of what a power loss at
 * any point of that record could leave on disk.
 *
 * The model (stricter than ext4, as SQLite's crash tests are):
 *  - File data written and then fsynced (that file, before the crash) is
 *    on disk.  Each write not yet fsynced is independently kept, dropped,
 *    or garbled (kept with some bytes changed), as the `fate` mode says.
 *  - A directory change (create, mkdir, rename, exchange, unlink, rmdir)
 *    survives when its parent directory was fsynced after it.  Of the
 *    others, a prefix in call order survives (a journaling file system
 *    writes metadata in order): everything before a cut point, which the
 *    mode chooses.  A change whose parent did not survive is lost with it.
 *  - The root itself exists before the record starts.
 * Events are recorded with the nodes (files, directories) they touch, so
 * renames of directories carry their contents along. */
#ifndef TCORE_FSTRACE_H
#define TCORE_FSTRACE_H

#include <stddef.h>
#include <stdint.h>

#include "fsio.h"

#define FT_ACK 100 /* not an fsio op: the test's own mark "save acknowledged" */

typedef struct ft_event {
    int op;              /* fsio_op, FT_ACK */
    int ns;              /* 1: a directory change (see above) */
    int created;         /* an open that created its file */
    int node;            /* the file or directory acted on, -1 if none */
    int parent, parent2; /* directory changes: parent(s) of the names */
    char *path, *path2;  /* relative to the root ("" is the root) */
    int flags;           /* open: flags; rename: 1 for an exchange */
    unsigned char *data; /* pwrite: a copy of the bytes */
    size_t len;
    uint64_t off;
    int64_t step;        /* FT_ACK: the step */
    int tag;             /* FT_ACK: the caller's number for the save */
} ft_event;

typedef struct fstrace fstrace;

/* A recorder for `root` (absolute, existing).  ft_hook fills `fs` so that
 * every call through it is recorded; `fs->fault` is left as it was. */
fstrace *ft_new(const char *root);
void ft_free(fstrace *t);
void ft_hook(fstrace *t, fsio *fs);
/* The trace hook itself, for callers that chain several hooks. */
void ft_on_event(void *t, const fsio_event *ev);
/* Turn recording on or off (off: calls pass unseen). */
void ft_record(fstrace *t, int on);
/* Mark that the save numbered `tag` of `step` was acknowledged (wait OK). */
void ft_ack(fstrace *t, int64_t step, int tag);

size_t ft_count(const fstrace *t);
const ft_event *ft_get(const fstrace *t, size_t i);
/* 1 when event i is a crash point: an fsync or a rename. */
int ft_is_crash_point(const fstrace *t, size_t i);
/* 1 when `node` is a directory. */
int ft_is_dir(const fstrace *t, int node);

enum ft_fate { FT_KEEP_ALL, FT_DROP_ALL, FT_RANDOM };
/* Write into `out` (must not exist; created) what a power loss just
 * before event `k` (k == ft_count: after the last) could leave, unsynced
 * writes and directory changes decided by `fate` and `seed`.  Returns the
 * number of unsynced writes that were changed from what was written
 * (dropped or garbled). */
size_t ft_materialize(const fstrace *t, size_t k, enum ft_fate fate, uint64_t seed,
                      const char *out);

#endif

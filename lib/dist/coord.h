/* coord: libckpt's side of the caller's coordinator (include/ckpt.h,
 * "ranks").  Every collective runs on a thread of its own while the calling
 * thread waits with a deadline, so a callback that hangs (a rank died and
 * the runtime cannot tell) costs the caller timeout_ms and no more.  After
 * any failure the ranks may be out of step (one rank's collective may have
 * completed, another's not), so the channel is closed for good. */
#ifndef CKPT_DIST_COORD_H
#define CKPT_DIST_COORD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

typedef struct coord {
    ckpt_coordinator cb;  /* copied at open */
    int rank, world;
    int timeout_ms;
    pthread_mutex_t lock; /* protects broken and why */
    int broken;           /* a collective failed: every later one fails */
    char why[512];
} coord;

/* Check the callbacks (version, none NULL) and set up.  CKPT_EINVAL or
 * CKPT_EVERSION with a message. */
int coord_init(coord *c, const ckpt_coordinator *cb, int rank, int world, int timeout_ms);
void coord_destroy(coord *c);

/* Check, collectively, that the coordinator's processes are the ranks the
 * options name: world_size processes joined it, each claims the rank of
 * its place in the coordinator's order and the same world_size.  Every
 * later collective relies on it (a root, the order of a gather, the size
 * of its buffer).  Returns CKPT_OK on every rank, or the same CKPT_EINVAL
 * on every rank naming the first mismatch; CKPT_EPEER, CKPT_ENOMEM.  (A
 * coordinator of more than 65536 processes, the most a store has, is not
 * supported: its gather would write past the room made for the check.) */
int coord_check_ranks(coord *c);

/* The collectives of ckpt_coordinator.  `what` names the step of the
 * protocol in messages.  CKPT_OK, or CKPT_EPEER (the callback failed, did
 * not return within timeout_ms plus a grace period, or an earlier one
 * failed) with a message; CKPT_ENOMEM. */
int coord_barrier(coord *c, const char *what);
int coord_bcast(coord *c, void *buf, size_t n, int root, const char *what);
int coord_allreduce_min(coord *c, int64_t *value, const char *what);
/* `recv` (world * n bytes) is used on `root` only. */
int coord_gather(coord *c, const void *send, size_t n, void *recv, int root,
                 const char *what);

/* Run work(arg) on this thread while a thread of its own tells the other
 * ranks, every timeout_ms / 4 and when the work ends, that this rank is
 * alive and whether its work is done (an all-reduce, `what` in messages);
 * return once every rank's work is done.  So a rank that is slow (a
 * larger shard, a slower disk) never makes the others time out, while one
 * that died or whose process hangs is still found within timeout_ms.
 * Every rank calls it at the same point of the protocol; one with nothing
 * to do passes work NULL.  *work_rc is what work returned (with its
 * message, as this thread's last error, when the ranks did not fail).
 * Returns CKPT_OK, or the collective's failure (CKPT_EPEER); work has
 * finished either way. */
int coord_pace(coord *c, int (*work)(void *arg), void *arg, int *work_rc, const char *what);

/* coord_pace in two halves, for work that spans calls (a save's begin on
 * the caller's thread, then its persist on another): start beating "not
 * done" now; end says done and returns as coord_pace does, once every
 * rank's work is done.  Every start is followed by exactly one end, with
 * no other collective of this coordinator between them on this rank.
 * start returns NULL out of memory; end(NULL) then meets the ranks once,
 * as a rank with nothing to do. */
typedef struct coord_pace_t coord_pace_t;
coord_pace_t *coord_pace_start(coord *c, const char *what);
int coord_pace_end(coord *c, coord_pace_t *p, const char *what);

#endif

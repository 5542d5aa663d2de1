/* context: the store handle as the pipeline sees it.  The public faces in
 * lib/ (store.c, save.c, checkpoint.c) create and free it; the pipeline's
 * modules (save, persist, reader, restore) work on it.  Nothing here is
 * installed. */
#ifndef CKPT_CONTEXT_H
#define CKPT_CONTEXT_H

#include <pthread.h>
#include <sys/types.h>
#include <stdint.h>

#include "adapt.h"
#include "ckpt.h"
#include "codec.h"
#include "device.h"
#include "layout.h"
#include "mcache.h"
#include "pool.h"

/* Per-worker state: jobs reach it through the worker index. */
typedef struct worker_ctx {
    codec *codec;
    unsigned char *in;  /* stored bytes read from a shard */
    size_t in_cap;
    unsigned char *out; /* decoded bytes (verify, device staging) */
    size_t out_cap;
    int out_pinned;
    int out_asked_pinned;      /* pinned was asked for (and maybe refused: the
                                  cap was reached); not asked again until
                                  the buffer must grow */
    device_event *out_busy; /* H2D copy still reading `out`, or NULL */
    unsigned char *frames;  /* a batch of encoded frames, back to back */
    size_t frames_cap;
} worker_ctx;

struct ckpt_store {
    layout lay;                /* the root: path, fsio seam, lock */
    ckpt_store_options opts;   /* resolved: no "default" values left */
    int readonly;
    pid_t owner;               /* the process that opened it: a child made by
                                  fork() must not join threads it lacks */
    pthread_mutex_t api_lock;  /* serialises public calls on this store */
    pool *pool;
    pool_group background;     /* jobs nobody waits for (freeing a decoded
                                  manifest's JSON); context_stop drains it */
    adapt *adapt;              /* compress or store raw, per chunk (adapt.h) */
    mcache *mcache;            /* manifests decoded last (mcache.h) */
    worker_ctx *workers;       /* nworkers of them */
    int nworkers;
    device *dev;
    /* Snapshot arena: allocated once, grown when a bigger state comes,
     * pre-faulted, reused by every save.  Touched only by the save that
     * is in flight (one at a time). */
    unsigned char *arena;
    size_t arena_cap;
    int arena_pinned;
    int arena_asked_pinned;
    /* Pinned pool for device tensors when they do not fit in pinned_limit
     * (or are too many to queue from the caller's thread): filled in
     * passes on the persist thread.  Same lifetime rules as the arena. */
    unsigned char *dpool;
    size_t dpool_cap;
    int dpool_pinned;
    int dpool_asked_pinned;
    struct ckpt_save *inflight; /* the save not yet waited for, or NULL */
    /* Several ranks (lib/dist): this process's rank (0 for one process);
     * the checkpoint id every rank writes into its shard, set before each
     * save; the hook that runs a save's persist paced with the other
     * ranks and ends it with the global commit (NULL for one process:
     * persist.c commits alone); the rank
     * state, owned by lib/dist. */
    uint32_t rank;
    int shared_id_set;
    unsigned char shared_id[16];
    int (*dist_finish)(struct ckpt_save *s, int status, int (*persist)(struct ckpt_save *s));
    struct dist_state *dist;
    struct eventlog *events;    /* the root's event log; NULL: read-only */
    ckpt_report *cleaned;       /* stale temporaries removed while opening,
                                   until the log exists to record them */
    /* Committed steps this store found damaged (a restore skipped them,
     * or retention_check_order verified them): a save may go below them,
     * since restore never takes them.  Owned by retention.c. */
    int64_t *damaged;
    size_t ndamaged;
};

/* Set up the workers, codecs, pool and device of a store whose options are
 * resolved and whose root is open. */
int context_start(ckpt_store *s);
/* Drain the save in flight, quiesce the device, free everything the
 * pipeline holds (not the layout). */
void context_stop(ckpt_store *s);

/* Worker buffer growth (stored bytes in / decoded bytes out). */
int worker_reserve_in(worker_ctx *w, size_t n);
int worker_reserve_frames(worker_ctx *w, size_t n);
int worker_reserve_out(ckpt_store *s, worker_ctx *w, size_t n, int pinned);

/* CKPT_OK in the process that opened `s`.  In a child made by fork() (a
 * data-loading worker): CKPT_EINVAL, the message naming `fn` and why, for
 * the store's threads and the owners of its locks stayed in the parent,
 * and a call that waited for them would wait for ever.  Every public call
 * on a store, a save or a checkpoint asks first; one that frees lets go of
 * nothing in a child (context_forked). */
int context_usable(const ckpt_store *s, const char *fn);
/* The same for a handle that outlives its store (a save: ckpt.h), which
 * keeps the store's owner: CKPT_OK in process `owner`. */
int context_usable_by(pid_t owner, const char *fn);
/* 1 in a child made by fork() after `s` was opened. */
int context_forked(const ckpt_store *s);

/* save.c: wait for the in-flight save, if any, and drop the store's hold
 * on it.  Its status stays with its handle; this returns nothing. */
void save_drain(ckpt_store *s);

#endif

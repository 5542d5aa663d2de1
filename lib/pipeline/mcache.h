/* mcache: the manifests a store decoded last, keyed by their exact bytes,
 * and the shared decodings (mdecoded) that open checkpoints read.
 *
 * Decoding is a pure function of the bytes, and a 10,000-tensor manifest
 * takes longer to decode than its shard takes to read.  A store decodes
 * the same files again and again: the writer's own check, retention after
 * every commit (each kept step, and the one it retires), a restore after a
 * save.  A file whose bytes equal those of a cached entry shares that
 * entry's decoding instead; everything else about opening a step (shards,
 * index, trust) is done as before.
 *
 * A decoding is immutable once made, so it is shared, not copied: the
 * cache and every checkpoint opened on those bytes hold a reference, and
 * the last to let go frees it.  (A copy per open cost a restore of 10,000
 * tiny tensors about a tenth of its time: 1 MB of fresh memory to fault in
 * and free again.)  It keeps the manifest without its env and metadata
 * trees, and their compact JSON texts instead: that is all a reader gives
 * out (ckpt_checkpoint_metadata / _env), and a state saved from Python
 * puts every tensor name in the metadata once more.
 *
 * Bounded: at most `entries` manifests (mcache_create) whose texts add up
 * to MCACHE_MAX_BYTES (their decodings take about as much again, and live
 * on while an open checkpoint holds them).  When full, the entry of the
 * lowest step goes first: retention retires the lowest steps, restores
 * read the newest.  Thread-safe (one mutex; references are atomic). */
#ifndef CKPT_MCACHE_H
#define CKPT_MCACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "manifest.h"

#define MCACHE_MAX_BYTES ((size_t)64 << 20)

/* One decoded manifest, shared read-only.  Only `m`, `meta_text` and
 * `env_text` are for readers; never change them (mdecoded_find is the way
 * to look a name up). */
typedef struct mdecoded {
    manifest m;                      /* env and metadata NULL */
    char *meta_text, *env_text;      /* their compact JSON texts */
    atomic_long refs;
    pthread_mutex_t lock;            /* protects by_name */
    const manifest_tensor **by_name; /* sorted by name; made on first find */
} mdecoded;

/* Make a decoding of `*m` with one reference (the caller's).  Takes *m (left
 * empty) and both texts (malloc'd); a NULL text is m's own (its metadata
 * text, its env tree printed by manifest_json_text), and m's env tree and
 * metadata text are freed or moved.  On
 * failure (CKPT_ENOMEM) everything given is freed and *out is NULL. */
int mdecoded_make(mdecoded **out, manifest *m, char *meta_text, char *env_text);
/* One more reference to `d` (returned). */
mdecoded *mdecoded_ref(mdecoded *d);
/* Drop a reference; the last frees `d`.  NULL is fine. */
void mdecoded_release(mdecoded *d);
/* Index of the tensor named `name` in d->m.tensors, or -1.  The first call
 * sorts the names once for every holder (a linear search when memory for
 * that is short). */
long mdecoded_find(mdecoded *d, const char *name);

typedef struct mcache mcache;

/* `entries`: how many manifests at most (at least 1). */
int mcache_create(mcache **out, size_t entries);
/* Drops the cache's references (open checkpoints keep theirs).  NULL is
 * fine. */
void mcache_free(mcache *c);
/* The decoding of `text` (`len` bytes) with a reference for the caller, or
 * NULL when the cache does not hold those bytes: decode then. */
mdecoded *mcache_get(mcache *c, const char *text, size_t len);
/* Remember that `text` (`len` bytes, copied) decodes to `d`: the cache takes
 * a reference of its own.  Best effort: nothing is remembered when memory
 * is short or the text large. */
void mcache_put(mcache *c, const char *text, size_t len, mdecoded *d);
/* mcache_put that takes `text` (malloc'd) instead of copying it, keeping or
 * freeing it.  For a checkpoint being closed: a 10,000-tensor manifest is
 * 1 MB of text. */
void mcache_put_owned(mcache *c, char *text, size_t len, mdecoded *d);

#endif

/* mcache: the manifests a store decoded last, keyed by their exact bytes.
 *
 * Decoding is a pure function of the bytes, and a 10,000-tensor manifest
 * takes longer to decode (jansson builds, and frees, some 250,000 values)
 * than its shard takes to read.  A store decodes the same files again and
 * again: the writer's own check, retention after every commit (each kept
 * step, and the one it retires), a restore after a save.  A file whose
 * bytes equal those of a cached entry takes a copy of that entry's
 * decoding instead; everything else about opening a step (shards, index,
 * trust) is done as before.
 *
 * Bounded: at most `entries` manifests (mcache_create) whose texts add up
 * to MCACHE_MAX_BYTES (their decodings take about as much again).  When
 * full, the entry of the lowest step goes first: retention retires the
 * lowest steps, restores read the newest.  Thread-safe (one mutex). */
#ifndef CKPT_MCACHE_H
#define CKPT_MCACHE_H

#include <stddef.h>

#include "manifest.h"

#define MCACHE_MAX_BYTES ((size_t)64 << 20)

typedef struct mcache mcache;

/* `entries`: how many manifests at most (at least 1). */
int mcache_create(mcache **out, size_t entries);
void mcache_free(mcache *c); /* NULL is fine */
/* 1 with a copy of the decoding of `text` (`len` bytes) in *m when the
 * cache holds those bytes; 0 (and *m empty) when it does not, or when the
 * copy ran out of memory: decode then. */
int mcache_get(mcache *c, const char *text, size_t len, manifest *m);
/* Remember that `text` (`len` bytes) decodes to `m` (both copied; best
 * effort: nothing is remembered when memory is short or the text large). */
void mcache_put(mcache *c, const char *text, size_t len, const manifest *m);

#endif

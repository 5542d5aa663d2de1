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
 * An entry keeps the manifest without its env and metadata trees, and
 * their compact JSON texts instead: that is all a reader gives out
 * (ckpt_checkpoint_metadata / _env), and a state saved from Python puts
 * every tensor name in the metadata once more, so copying and printing
 * that tree on every open would cost as much as the rest of the copy.
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
/* 1 with a copy of the decoding of `text` (`len` bytes) in *m, env and
 * metadata left NULL, and their JSON texts (manifest_json_text, malloc'd)
 * in *meta_text and *env_text, when the cache holds those bytes; 0 (and
 * *m empty, the texts NULL) when it does not, or when a copy ran out of
 * memory: decode then. */
int mcache_get(mcache *c, const char *text, size_t len, manifest *m, char **meta_text,
               char **env_text);
/* Remember that `text` (`len` bytes) decodes to `m`, whose metadata and env
 * print as `meta_text` and `env_text` (both NULL: printed here from m's
 * trees).  Everything is copied; best effort: nothing is remembered when
 * memory is short or the text large. */
void mcache_put(mcache *c, const char *text, size_t len, const manifest *m,
                const char *meta_text, const char *env_text);
/* mcache_put without copies: takes `text`, `*m` (its env and metadata
 * trees are dropped) and both texts (all malloc'd, none NULL), keeping or
 * freeing them; *m is left empty.  For a checkpoint being closed, whose
 * manifest (10,000 tensors: 2 MB of text, as much again decoded) would
 * otherwise be freed right after a copy was made of it. */
void mcache_put_owned(mcache *c, char *text, size_t len, manifest *m, char *meta_text,
                      char *env_text);

#endif

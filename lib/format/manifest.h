/* manifest: the JSON document that makes a step directory a checkpoint.
 * Encoding appends a checksum member; decoding checks it, then validates
 * every field before anything else uses it. */
#ifndef CKPT_MANIFEST_H
#define CKPT_MANIFEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "shard.h"

#define MANIFEST_FORMAT "libckpt"
#define MANIFEST_VERSION 1
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_MAX_BYTES (256u << 20)

typedef struct manifest_tensor {
    char *name;
    ckpt_dtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    uint64_t bytes;
    uint32_t shard;        /* index into shards */
    uint64_t chunks;
    uint64_t stored_bytes;
} manifest_tensor;

typedef struct manifest_shard {
    char *file;
    uint64_t size;
    uint64_t index_hash;
    uint64_t chunks;
} manifest_shard;

typedef struct manifest {
    int64_t step;
    unsigned char id[SHARD_ID_SIZE];
    double time;            /* Unix seconds at save begin */
    uint64_t chunk_bytes;
    int level;
    ckpt_save_stats stats;  /* persist_s: up to writing the manifest */
    manifest_tensor *tensors;
    size_t ntensors;
    manifest_shard *shards;
    size_t nshards;
    json_t *env;            /* object, owned */
    json_t *metadata;       /* any JSON value, owned */
    uint32_t world_size;    /* ranks that wrote the step, one shard each
                               (shard i is rank i's); 0 or 1: one process,
                               and the member is not written */
} manifest;

/* Serialise with the trailing checksum member.  *text is malloc'd. */
int manifest_encode(const manifest *m, char **text, size_t *len);
/* Check the checksum, parse and validate.  `where` names the file in
 * messages.  On failure *m is left empty. */
int manifest_decode(const char *text, size_t len, const char *where, manifest *m);
/* manifest_decode that leaves the freeing of the parsed document to the
 * caller (a JSON tree of a value or so per byte takes a third as long to
 * free as to parse): on success *tree is that document, sharing nothing
 * with *m, for json_decref on any thread; NULL on failure. */
int manifest_decode_keep(const char *text, size_t len, const char *where, manifest *m,
                         json_t **tree);
/* manifest_decode by jansson alone, never the quick route through the
 * tensors (mtensors.h): the reference that route is tested against. */
int manifest_decode_reference(const char *text, size_t len, const char *where, manifest *m);
void manifest_clear(manifest *m);

/* Where the tensors array of a text from manifest_encode_split lies: its
 * '[' and ']', and per tensor the offset of the '[' or ',' before its
 * element. */
typedef struct manifest_split {
    size_t open, close;
    size_t *cut; /* n entries, owned */
    size_t n;
} manifest_split;
void manifest_split_free(manifest_split *sp);
/* manifest_encode, noting in *sp where each tensor's element lies (for a
 * writer that decodes its text back on several threads).  m->ntensors
 * must be at least 1. */
int manifest_encode_split(const manifest *m, char **text, size_t *len, manifest_split *sp);
/* manifest_decode in pieces (the same checks, the same result), for the
 * text manifest_encode_split made with `sp`:
 * - _head: the checksum and everything but the tensors (m->ntensors = 0);
 * - _piece: tensors [a, b) into out[a..b) (their names are the caller's to
 *   free, also on failure), any number at once on other threads;
 * - _finish: with every tensor in m (ntensors = sp->n), the checks across
 *   tensors (their shards exist, their names are unique).
 * A text not made with `sp` fails (CKPT_EINTERNAL) or is decoded as the
 * whole would be. */
int manifest_decode_head(const char *text, size_t len, const manifest_split *sp,
                         const char *where, manifest *m);
int manifest_decode_piece(const char *text, const manifest_split *sp, size_t a, size_t b,
                          const char *where, manifest_tensor *out);
int manifest_decode_finish(manifest *m, const char *where);
/* A deep copy of `src` into `dst` (env and metadata copied too, so the two
 * share nothing).  On failure (CKPT_ENOMEM) *dst is left empty. */
int manifest_copy(manifest *dst, const manifest *src);

/* JSON text of a value, malloc'd ("null" for NULL). */
char *manifest_json_text(const json_t *v);

#endif

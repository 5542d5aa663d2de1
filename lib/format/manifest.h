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
/* A rank's part manifest beside the global one in a step saved by several
 * ranks, "rank-00001.json" (docs/FORMAT.md): the one place they are named. */
#define MANIFEST_PART_NAME_SIZE 32u

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
    char *names;            /* NULL, or one block holding every tensor's
                               name: freed at once, not name by name */
    manifest_shard *shards;
    size_t nshards;
    json_t *env;            /* object, owned */
    char *metadata;         /* the caller's JSON value as compact text,
                               owned; NULL: null.  Kept as text: a Python
                               state's structure is tens of thousands of
                               values, slow to parse and print (jsonscan.h) */
    uint32_t world_size;    /* ranks that wrote the step, one shard each
                               (shard i is rank i's); 0 or 1: one process,
                               and the member is not written */
} manifest;

/* The deepest metadata the quick route reads (jsonscan_value's count): the
 * manifest's root is one level more for jansson. */
#define MANIFEST_META_MAX_DEPTH (JSON_PARSER_MAX_DEPTH - 1)

/* The most a reader builds from a manifest, besides its tensors: JSON
 * values and, of those, arrays and objects (jsonscan_tally).  jansson
 * spends up to ~90 bytes on a value and ~350 on an object, whatever the
 * bytes of the file: at these limits a reader holds at most about half a
 * GB, where a 256 MiB "[[],[],...]" would have taken 25 GB.  A writer
 * refuses metadata beyond the META limits, which leave the rest of the
 * manifest (environment, shards) room. */
#define MANIFEST_MAX_VALUES (1u << 22)
#define MANIFEST_MAX_CONTAINERS (1u << 19)
#define MANIFEST_META_MAX_VALUES (MANIFEST_MAX_VALUES - (1u << 19))
#define MANIFEST_META_MAX_CONTAINERS (MANIFEST_MAX_CONTAINERS - (1u << 17))

/* The part manifest name of `rank` ("rank-00001.json"). */
void manifest_part_name(uint32_t rank, char name[MANIFEST_PART_NAME_SIZE]);

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

/* JSON text of a value, malloc'd ("null" for NULL). */
char *manifest_json_text(const json_t *v);

#endif

/* shard: the byte layout of shard files (docs/FORMAT.md), as pure
 * functions over bytes: a header, frames, an index of fixed-size entries
 * sorted by (tensor, offset), and a fixed-size trailer.  No I/O here:
 * pipeline/shardfile.c reads and writes the files. */
#ifndef CKPT_SHARD_H
#define CKPT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

#define SHARD_MAGIC "CKPTSHRD"
#define SHARD_TRAILER_MAGIC "CKPTEND1"
#define SHARD_VERSION 1u
#define SHARD_HEADER_SIZE 64u
#define SHARD_ENTRY_SIZE 64u
#define SHARD_TRAILER_SIZE 48u
#define SHARD_ID_SIZE 16u
/* Raw bytes per chunk: what writers may choose and readers accept (a reader
 * sizes buffers by it, so a hostile manifest must not pick it). */
#define SHARD_CHUNK_MIN ((uint64_t)CKPT_CHUNK_MIN)
#define SHARD_CHUNK_MAX ((uint64_t)CKPT_CHUNK_MAX)
/* "rank-NNNNN.shard": the one place shard files are named. */
#define SHARD_NAME_SIZE 32u

typedef struct shard_entry {
    uint32_t tensor;      /* index into the manifest's tensor list */
    uint64_t offset;      /* raw byte offset within the tensor */
    uint64_t file_offset; /* where the stored bytes start */
    chunk_meta meta;
} shard_entry;

/* The file name of rank `rank`'s shard ("rank-00000.shard"). */
void shard_file_name(uint32_t rank, char name[SHARD_NAME_SIZE]);

void shard_encode_header(unsigned char h[SHARD_HEADER_SIZE], int64_t step,
                         const unsigned char id[SHARD_ID_SIZE], uint32_t rank);
/* Check magic, hash, version and reserved bytes, and that the header
 * belongs to checkpoint (step, id).  CKPT_ECORRUPT / CKPT_EVERSION with a
 * message naming `name` and the byte offset. */
int shard_check_header(const unsigned char h[SHARD_HEADER_SIZE], const char *name,
                       int64_t step, const unsigned char id[SHARD_ID_SIZE]);

void shard_encode_entry(unsigned char p[SHARD_ENTRY_SIZE], const shard_entry *e);
/* Decode one entry; CKPT_ECORRUPT if a reserved byte is not zero. */
int shard_decode_entry(const unsigned char p[SHARD_ENTRY_SIZE], shard_entry *e);

typedef struct shard_trailer {
    uint64_t index_offset;
    uint64_t count;
    uint64_t index_hash;
} shard_trailer;

void shard_encode_trailer(unsigned char t[SHARD_TRAILER_SIZE], const shard_trailer *tr,
                          const unsigned char id[SHARD_ID_SIZE]);
/* Decode a trailer found at `trailer_offset` of a file: magic and id must
 * match, and the index it locates must lie between the header and the
 * trailer exactly. */
int shard_decode_trailer(const unsigned char t[SHARD_TRAILER_SIZE], const char *name,
                         uint64_t trailer_offset, const unsigned char id[SHARD_ID_SIZE],
                         shard_trailer *tr);

/* What the manifest says a shard must hold. */
typedef struct shard_expect {
    uint64_t size;        /* from the manifest */
    uint64_t index_hash;  /* from the manifest */
    int64_t step;
    const unsigned char *id; /* SHARD_ID_SIZE bytes */
    uint32_t ntensors;
    const uint64_t *tensor_bytes; /* ntensors; 0 for tensors of other shards */
    uint64_t max_chunk;   /* largest raw chunk allowed */
} shard_expect;

typedef struct shard_index {
    shard_entry *entries;
    uint64_t count;
} shard_index;

/* Check decoded entries against the rules a reader enforces: tensor in
 * range, codec rules (codec_check_meta), raw length within max_chunk,
 * frames inside [header end, index_offset) and not overlapping one
 * another, sorted by (tensor, offset), every tensor tiled exactly from 0. */
int shard_check_index(const char *name, const shard_expect *x, const shard_index *ix,
                      uint64_t index_offset);
void shard_index_free(shard_index *index);

#endif

/* shard: the shard file layout (docs/FORMAT.md).  A header, independently
 * compressed frames in any order, an index of fixed-size entries sorted by
 * (tensor, offset), and a fixed-size trailer at the end. */
#ifndef CKPT_SHARD_H
#define CKPT_SHARD_H

#include <pthread.h>
#include <stdint.h>

#include "codec.h"
#include "fsio.h"

#define SHARD_MAGIC "CKPTSHRD"
#define SHARD_TRAILER_MAGIC "CKPTEND1"
#define SHARD_VERSION 1u
#define SHARD_HEADER_SIZE 64u
#define SHARD_ENTRY_SIZE 64u
#define SHARD_TRAILER_SIZE 48u
#define SHARD_ID_SIZE 16u
/* Raw bytes per chunk: what writers may choose and readers accept (a reader
 * sizes buffers by it, so a hostile manifest must not pick it). */
#define SHARD_CHUNK_MIN 4096u
#define SHARD_CHUNK_MAX (1ull << 30)

typedef struct shard_entry {
    uint32_t tensor;      /* index into the manifest's tensor list */
    uint64_t offset;      /* raw byte offset within the tensor */
    uint64_t file_offset; /* where the stored bytes start */
    chunk_meta meta;
} shard_entry;

/* ---- writing (append is thread-safe) */
typedef struct shard_writer shard_writer;

int shard_writer_open(shard_writer **out, const fsio *fs, const char *path,
                      int64_t step, const unsigned char id[SHARD_ID_SIZE],
                      uint32_t rank);
int shard_writer_append(shard_writer *w, uint32_t tensor, uint64_t offset,
                        const chunk_meta *meta, const void *stored);
/* Write index and trailer, fsync if asked, close.  Reports the file size and
 * the index hash for the manifest. */
int shard_writer_finish(shard_writer *w, int do_fsync, uint64_t *size,
                        uint64_t *index_hash, uint64_t *chunks);
/* After finish: the entries written, sorted by (tensor, offset). */
const shard_entry *shard_writer_entries(const shard_writer *w);
/* Close (if still open) and free; the file is left for the caller. */
void shard_writer_free(shard_writer *w);

/* ---- reading: never trusts the file */
typedef struct shard_expect {
    uint64_t size;        /* from the manifest */
    uint64_t index_hash;  /* from the manifest */
    int64_t step;
    const unsigned char *id; /* SHARD_ID_SIZE bytes */
    uint32_t ntensors;
    const uint64_t *tensor_bytes; /* ntensors */
    uint64_t max_chunk;   /* largest raw chunk allowed */
} shard_expect;

typedef struct shard_index {
    shard_entry *entries;
    uint64_t count;
} shard_index;

/* Open `path`, check header, trailer, sizes and the index checksum, and that
 * every tensor with chunks in this shard is tiled exactly by them.  On
 * failure the message names the file (`name`) and the byte offset. */
int shard_read_index(const fsio *fs, const char *path, const char *name,
                     const shard_expect *expect, int *fd_out, shard_index *index);
void shard_index_free(shard_index *index);

#endif

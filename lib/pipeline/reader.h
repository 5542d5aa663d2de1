/* reader: a committed (or about-to-be-committed) checkpoint opened for
 * reading.  Opening is quick verification: manifest checksum and schema,
 * every shard's header, trailer, index checksum and bounds, and that the
 * chunks tile every tensor.  Reading and full verification check every
 * chunk's hashes, decoding in parallel on the store's workers. */
#ifndef CKPT_READER_H
#define CKPT_READER_H

#include "context.h"
#include "manifest.h"
#include "mcache.h"
#include "report.h"
#include "shardfile.h"

struct ckpt_checkpoint {
    ckpt_store *store;  /* borrowed */
    char *dir;          /* absolute or as given; a writer's through its
                           pinned root (layout_step_path)                */
    char *shown;        /* dir as users know it (ckpt_checkpoint_path)    */
    char *label;        /* "step-NNNNNNNNNNNN" for messages */
    mdecoded *decoded;  /* the manifest decoded, shared (mcache.h); NULL
                         * until opened */
    manifest m;         /* once opened, a copy of decoded->m: its arrays and
                         * strings are decoded's, read-only */
    char *text;         /* manifest as stored */
    size_t text_len;
    const char *meta_text, *env_text; /* decoded's */
    int cache_on_close; /* decoded here, not from mcache: hand text and
                         * decoding to it when closed (mcache_put_owned) */
    shard_index *ix;    /* per shard */
    int *fds;           /* per shard */
    uint64_t *first;    /* per tensor: its first entry in its shard's index */
    char **rank_meta;   /* several ranks: each rank's metadata, read from
                         * its part manifest when first asked for
                         * (ckpt_checkpoint_rank_metadata, under the
                         * store's api_lock); NULL until then */
};

/* Open the checkpoint in `dir`, which must be step `step`.  Problems are
 * returned (first one) and, if `report`, listed there. */
int reader_open_dir(ckpt_store *s, const char *dir, int64_t step, ckpt_checkpoint **out);
/* reader_open_dir for a writer that has just written, and decoded, the
 * manifest: when the file holds exactly `text` (`len` bytes), `*decoded`
 * (manifest_decode of that text) is taken over instead of decoding it a
 * second time; otherwise the file is decoded as usual.  `*decoded` is
 * cleared either way (its owner is then the checkpoint, or nobody). */
int reader_open_written(ckpt_store *s, const char *dir, int64_t step, const char *text,
                        size_t len, manifest *decoded, ckpt_checkpoint **out);
/* The same with another manifest file of `dir` (a rank's part manifest). */
int reader_open_manifest(ckpt_store *s, const char *dir, const char *manifest_name,
                         int64_t step, ckpt_checkpoint **out);
int reader_open_step(ckpt_store *s, int64_t step, ckpt_checkpoint **out);
/* Does part manifest `p` (rank `rank`'s) describe what the global one `g`
 * gives that rank: the same tensors, in the same order, on its shard, of
 * the same step and checkpoint id? */
int reader_part_agrees(const manifest *g, const manifest *p, uint32_t rank);
void reader_close(ckpt_checkpoint *ck);
/* 1 when `status` from opening or reading a step says the step cannot be
 * used (damaged, incomplete, newer format, unreadable, gone): a search for
 * the newest valid step skips it.  Anything else (out of memory, a device
 * error, a bug) ends the search. */
int reader_is_damage(int status);

/* report_add of a step that failed to open or verify with `message`: the
 * file is the one the message names inside the step's directory
 * ("step-…/manifest.json: …", "cannot read …/step-…/rank-00000.shard: …"),
 * else none, so a report gives scripts the file whatever the problem. */
void reader_report_failure(ckpt_report *r, int64_t step, int status, const char *message);
/* The newest committed step that verifies at `level` (QUICK: opening it;
 * FULL: every chunk too), opened.  CKPT_ENOCKPT when none does. */
int reader_open_newest(ckpt_store *s, ckpt_verify_level level, ckpt_checkpoint **out);
/* The step the public calls name: CKPT_LATEST (reader_open_newest),
 * CKPT_NEWEST (the newest committed step, whatever its state) or a step
 * number, opened and verified at `level` (QUICK or FULL).  CKPT_ENOCKPT
 * when the root has no (valid) step, CKPT_EINVAL for a negative step. */
int reader_open_select(ckpt_store *s, int64_t step, ckpt_verify_level level,
                       ckpt_checkpoint **out);
/* The newest committed step (CKPT_ENOCKPT when there is none). */
int reader_newest_step(ckpt_store *s, int64_t *step);

typedef struct reader_target {
    uint32_t tensor;    /* index in ck->m.tensors */
    void *dst;          /* tensor bytes, exactly its size */
    ckpt_memory memory; /* HOST or DEVICE */
    void *stream;       /* for DEVICE */
    int device;         /* for DEVICE: its CUDA device */
} reader_target;

/* Decode and verify every chunk of the targets into their buffers. */
int reader_read(ckpt_checkpoint *ck, const reader_target *targets, size_t count);
/* Decode and verify the chunks of tensor `tensor` that hold any of its
 * bytes [offset, offset + bytes) (a range inside it, checked by the
 * caller), and copy those bytes into `dst` (host memory).  Each chunk
 * touched is verified whole; chunks only partly in the range cost a
 * buffer of their raw size each (two at most). */
int reader_read_range(ckpt_checkpoint *ck, uint32_t tensor, uint64_t offset, unsigned char *dst,
                      uint64_t bytes);
/* Decode and verify every chunk; each failing chunk becomes a problem in
 * `report` (may be NULL).  Returns the first failure's status. */
int reader_verify_all(ckpt_checkpoint *ck, ckpt_report *report);
/* The same for the shards first, first + stride, ... of ck (stride >= 1),
 * less the chunks of tensors whose `skip` byte (NULL, or one per manifest
 * tensor) is set; the damage found is returned with its message. */
int reader_verify_shards(ckpt_checkpoint *ck, uint32_t first, uint32_t stride,
                         const unsigned char *skip);

/* Index of tensor `name`, or -1 (a binary search: restoring 10,000 tensors
 * by name must not cost 10,000 scans of 10,000 names; a scan when there is
 * no memory for the sorted list).  Thread-safe. */
long reader_find(ckpt_checkpoint *ck, const char *name);

#endif

/* shardfile: shard files on disk, through the fsio seam.  The writer
 * appends frames from several workers at once and ends the file with the
 * index and trailer; the reader checks a file against what the manifest
 * says before anything trusts it.  The byte layout is format/shard.h. */
#ifndef CKPT_SHARDFILE_H
#define CKPT_SHARDFILE_H

#include <stdint.h>

#include "fsio.h"
#include "shard.h"

/* ---- writing (append is thread-safe) */
typedef struct shard_writer shard_writer;

int shard_writer_open(shard_writer **out, const fsio *fs, const char *path,
                      int mode, int64_t step, const unsigned char id[SHARD_ID_SIZE],
                      uint32_t rank);
/* The shard's descriptor (for its mode: layout_file_made); -1 once closed. */
int shard_writer_fd(const shard_writer *w);
/* Append one frame.  With `check` (a buffer of meta->stored_len bytes) the
 * frame is read back from the file and its stored hash checked: a
 * mismatch is CKPT_ECORRUPT naming the file and offset. */
int shard_writer_append(shard_writer *w, uint32_t tensor, uint64_t offset,
                        const chunk_meta *meta, const void *stored, void *check);
/* One frame of shard_writer_append_frames. */
typedef struct shard_frame {
    uint32_t tensor;
    uint64_t offset; /* in the tensor */
    chunk_meta meta;
} shard_frame;
/* Append `count` frames whose stored bytes lie back to back in `stored`
 * (the sum of their stored_len): one range of the file, one write and,
 * with `check` (a buffer of that sum), one read back after which every
 * frame's stored hash is checked.  Many small chunks then cost the system
 * calls of one. */
int shard_writer_append_frames(shard_writer *w, const shard_frame *frames, size_t count,
                               const void *stored, void *check);
/* Frame bytes whose write has returned so far (thread-safe). */
uint64_t shard_writer_written(shard_writer *w);
/* From now on, hand each frame range to the disk as soon as it is written
 * (fsio_writeback_start; a hint, dropped where unsupported).  For a save
 * that will fsync: the disk then works from the first frame on.  Call
 * before the first append. */
void shard_writer_write_back_early(shard_writer *w);
/* A write-back round: write out the file below shard_writer_settled (every
 * frame there written) and wait (a hint, fsio_writeback: not
 * durable); -errno where unsupported.  The disk's rate over the round,
 * estimated from when each range reached it (round_rate): `*bytes` written
 * in `*secs` seconds (0 bytes when nothing new was waited for).
 * Thread-safe against appends; one caller at a time; not against finish or
 * free. */
int shard_writer_writeback(shard_writer *w, uint64_t *bytes, double *secs);
/* The file offset below which every frame has been written and, where
 * appends check, read back: nothing below it is written or read by the
 * writer again (thread-safe). */
uint64_t shard_writer_settled(shard_writer *w);
/* Drop the file's clean pages in [from, to) from the page cache
 * (fsio_drop_cache: dirty pages stay, nothing is lost); -errno where
 * unsupported.  Thread-safe against appends. */
int shard_writer_drop_cache(shard_writer *w, uint64_t from, uint64_t to);
/* Write index and trailer, fsync if asked, close.  Reports the file size and
 * the index hash for the manifest (shard_writer_seal, then _close). */
int shard_writer_finish(shard_writer *w, int do_fsync, uint64_t *size,
                        uint64_t *index_hash, uint64_t *chunks);
/* Write index and trailer (no more appends); the file stays open, so that
 * the manifest can be prepared while shard_writer_close fsyncs it. */
int shard_writer_seal(shard_writer *w, uint64_t *size, uint64_t *index_hash,
                      uint64_t *chunks);
/* After seal: fsync if asked, close. */
int shard_writer_close(shard_writer *w, int do_fsync);
/* After finish: the entries written, sorted by (tensor, offset). */
const shard_entry *shard_writer_entries(const shard_writer *w);
/* Close (if still open) and free; the file is left for the caller. */
void shard_writer_free(shard_writer *w);

/* ---- reading: never trusts the file */
/* Open `path`, check header, trailer, sizes, the index checksum and every
 * entry (shard_check_index).  On failure the message names the file
 * (`name`) and the byte offset; on success *fd_out is open for reading
 * chunks. */
int shard_read_index(const fsio *fs, const char *path, const char *name,
                     const shard_expect *expect, int *fd_out, shard_index *index);

#endif

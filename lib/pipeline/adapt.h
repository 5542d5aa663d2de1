/* adapt: per chunk, compress or store raw, so that a save is committed as
 * soon as the disk allows.
 *
 * A save runs two resources side by side: the workers (hash, maybe zstd,
 * pwrite into the page cache) and the disk (write-back: each frame's pages
 * are handed to it as soon as they are written, when the save fsyncs, and
 * the persist thread times it in rounds while the workers run).
 * Compressing a chunk costs worker time and saves disk time.  From
 * measured rates (worker seconds per byte to compress, to hash only, to
 * pwrite; disk seconds per byte written back; the compression ratio), each
 * chunk takes the choice that keeps the projected finish, max(worker time
 * / workers, disk time), lowest, compressing on a tie: on slow storage
 * every chunk is compressed, on storage faster than the cores some go raw.
 * Where compressing costs the workers time, a chunk is compressed only
 * when the disk time it saves is at least what decoding it will cost a
 * restore, and only while the disk has a backlog to write meanwhile: the
 * first chunks of a save go raw (the disk starts at once), and a disk that
 * keeps up with the workers is never left waiting for zstd.  zstd's rate and ratio are
 * measured on a sample at the start of every save (adapt_probe_wanted).  A
 * chunk that would not shrink is stored raw either way (codec_encode).
 *
 * One per store: rates learnt in one save carry to the next.  Thread-safe
 * (one mutex): workers of the save in flight call choose/record, its
 * persist thread times the write-back. */
#ifndef CKPT_ADAPT_H
#define CKPT_ADAPT_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "shardfile.h"

typedef struct adapt adapt;

/* `workers`: how many encode in parallel; `compress_all`: every chunk is
 * compressed (the store's CKPT_OPEN_COMPRESS_ALL). */
int adapt_create(adapt **out, int workers, int compress_all);
void adapt_free(adapt *a); /* NULL is fine */

/* A save starts: its totals start from zero (the rates stay). */
void adapt_save_begin(adapt *a);
/* Whether the calling worker is to measure zstd before its next choice:
 * yes for the first `workers` calls of a save (each worker's first chunk),
 * unless every chunk is compressed anyway (compress_all).  The worker then
 * compresses a sample of the chunk, discards the output and reports it
 * with adapt_record_probe: zstd's rate and ratio follow the data from save
 * to save at a fraction of a chunk's cost, and no chunk is compressed only
 * to be measured. */
int adapt_probe_wanted(adapt *a);
/* A sample of n raw bytes compressed to `stored` bytes in `secs` worker
 * seconds (counted in the save's worker time). */
void adapt_record_probe(adapt *a, size_t n, size_t stored, double secs);
/* One chunk's choice and the cost projected for it. */
typedef struct adapt_ticket {
    int compress;     /* 1: compress the chunk; 0: store it raw */
    size_t n;         /* raw bytes */
    double work_s;    /* projected worker seconds */
    double stored;    /* projected stored bytes */
} adapt_ticket;
/* Choose for the next chunk of n raw bytes.  Its projected cost counts in
 * the save's totals until adapt_record replaces it with the measured one. */
void adapt_choose(adapt *a, size_t n, adapt_ticket *t);
/* What the chunk cost: `stored` bytes (raw when compression did not
 * shrink it), `encode_s` seconds to encode (hash, maybe shuffle + zstd),
 * `write_s` to write (and read back when the save checks that). */
void adapt_record(adapt *a, const adapt_ticket *t, size_t stored, double encode_s,
                  double write_s);

/* A write-back round: the disk wrote `bytes` in `secs` seconds (ignored
 * when either is 0).  The disk's rate is the sum over its last rounds, so
 * that a burst into a write cache does not stand for it. */
void adapt_record_disk(adapt *a, uint64_t bytes, double secs);

/* The rates learnt so far, in words (nanoseconds per byte; "-" where not
 * measured yet), into `buf` of `n` bytes: for messages and tests. */
void adapt_describe(adapt *a, char *buf, size_t n);

/* The persist thread: until every job of `g` has run, wait for the frames
 * written so far to reach the disk (when `writeback`; the save fsyncs) and
 * time it, which is how the disk's rate is known; with `drop`, the frames
 * written back and checked then leave the page cache
 * (adapt_drop_wanted).  Returns pool_group_wait(g). */
int adapt_wait_jobs(adapt *a, pool_group *g, shard_writer *w, int writeback, int drop);

/* Page cache policy of a save (the store's CKPT_OPEN_KEEP_CACHE or
 * CKPT_OPEN_DROP_CACHE, else automatic). */
typedef enum { ADAPT_CACHE_AUTO, ADAPT_CACHE_KEEP, ADAPT_CACHE_DROP } adapt_cache;
/* Whether a save of `raw` bytes drops its frames from the page cache as
 * they reach the disk.  Automatic: when it is at least ADAPT_DROP_MIN
 * bytes, or larger than half the free memory `mem_free` (bytes; 0:
 * unknown).  The kernel would otherwise evict other pages (the
 * application's, other users') to cache a checkpoint that is only read
 * again after a crash, and allocating page cache is what slowed large
 * saves most: under memory pressure, and on a VM whose free memory the
 * host takes back even with gigabytes free (bench_host, keep against
 * drop: 512 MiB 0.78-0.94 s against 0.39-0.40 s, 1 GiB 2.6-4.3 s against
 * 0.96-1.10 s, the raw write + fsync 0.5 and 1.0-1.2 s; 384 MiB and
 * below: no difference).  Smaller saves stay cached, so a restore soon
 * after reads from the cache. */
#define ADAPT_DROP_MIN ((uint64_t)512 << 20)
int adapt_drop_wanted(adapt_cache policy, uint64_t raw, uint64_t mem_free);

#endif

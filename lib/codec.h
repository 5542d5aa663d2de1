/* codec: one chunk in, one chunk out.  Byte shuffle by element size, zstd,
 * xxh3 of stored and raw bytes, raw fallback when compression would not
 * shrink the chunk.  One codec per worker thread (it owns the zstd contexts
 * and scratch buffers); never shared. */
#ifndef CKPT_CODEC_H
#define CKPT_CODEC_H

#include <stddef.h>
#include <stdint.h>

enum { CODEC_RAW = 0, CODEC_ZSTD_SHUFFLE = 1 };

typedef struct chunk_meta {
    uint8_t codec;       /* CODEC_* */
    uint8_t elem;        /* shuffle width in bytes (1 = no shuffle) */
    uint64_t raw_len;
    uint64_t stored_len;
    uint64_t stored_hash; /* XXH3-64 of the stored bytes */
    uint64_t raw_hash;    /* XXH3-64 of the raw bytes */
} chunk_meta;

typedef struct codec codec;

int codec_create(codec **out, int level);
void codec_free(codec *c);

/* Encode n raw bytes whose elements are `elem` bytes wide.  *stored points
 * into the codec's buffer (or at raw when stored raw) until the next call. */
int codec_encode(codec *c, const void *raw, size_t n, unsigned elem,
                 const void **stored, chunk_meta *meta);

/* Hash of bytes, for callers that check hashes themselves. */
uint64_t codec_hash(const void *p, size_t n);

/* Decode a chunk whose stored bytes were read into `stored` into dst, which
 * holds exactly meta->raw_len bytes.  Checks the stored hash before and the
 * raw hash after.  CKPT_ECORRUPT with a message saying which check failed;
 * the caller prefixes file/tensor/offset. */
int codec_decode(codec *c, const void *stored, const chunk_meta *meta, void *dst);

/* codec_decode for stored bytes whose hash the caller has just checked
 * (codec_check_stored), so that it is not computed twice. */
int codec_decode_checked(codec *c, const void *stored, const chunk_meta *meta, void *dst);

/* Only the stored hash (quick path used when the raw bytes are not needed). */
int codec_check_stored(const void *stored, const chunk_meta *meta);

#endif

/* codec: one chunk in, one chunk out.  Byte shuffle by element size, zstd,
 * xxh3 of stored and raw bytes, raw fallback when compression would not
 * shrink the chunk.  One codec per worker thread (it owns the zstd contexts
 * and scratch buffers); never shared. */
#ifndef CKPT_CODEC_H
#define CKPT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

/* Codec ids as stored in index entries (docs/FORMAT.md).  A new codec is a
 * new id here and a row in codec.c's table: the index checks, the writer
 * and the options all read the table. */
enum { CODEC_RAW = 0, CODEC_ZSTD_SHUFFLE = 1 };

/* Widest element a chunk may be shuffled by (complex128 shuffles by its
 * 8-byte components, so 8 is the widest the writer uses). */
#define CODEC_ELEM_MAX 16u

typedef struct chunk_meta {
    uint8_t codec;       /* CODEC_* */
    uint8_t elem;        /* shuffle width in bytes (1 = no shuffle) */
    uint64_t raw_len;
    uint64_t stored_len;
    uint64_t stored_hash; /* XXH3-64 of the stored bytes */
    uint64_t raw_hash;    /* XXH3-64 of the raw bytes */
} chunk_meta;

typedef struct codec codec;

/* The largest stored size a chunk of `raw_len` raw bytes may have under
 * codec `id` (what a reader bounds its buffers by); 0 when unknown. */
uint64_t codec_stored_bound(unsigned id, uint64_t raw_len);
/* CKPT_OK when meta's codec-specific fields are possible (known codec,
 * shuffle width, stored length within the codec's bound); else
 * CKPT_ECORRUPT with a message (no file named: callers prefix it). */
int codec_check_meta(const chunk_meta *meta);
/* The compression level a store uses: 0 means the default; out of range is
 * CKPT_EINVAL naming it. */
int codec_resolve_level(int level, int *resolved);
/* Element width chunks of `dtype` are shuffled by: complex numbers by
 * component, opaque bytes not at all. */
unsigned codec_shuffle_width(ckpt_dtype dtype);

int codec_create(codec **out, int level);
void codec_free(codec *c);

/* Encode n raw bytes whose elements are `elem` bytes wide.  *stored points
 * into the codec's buffer (or at raw when stored raw) until the next call. */
int codec_encode(codec *c, const void *raw, size_t n, unsigned elem,
                 const void **stored, chunk_meta *meta);

/* Store n raw bytes as they are (CODEC_RAW): only the hash is computed.
 * *stored is raw.  For chunks the save decides not to compress. */
void codec_store_raw(const void *raw, size_t n, const void **stored, chunk_meta *meta);

/* Hash of bytes, for callers that check hashes themselves. */
uint64_t codec_hash(const void *p, size_t n);

/* The same hash taken piece by piece: after codec_hasher_reset, the
 * digest of the pieces given to codec_hasher_update, in order, is
 * codec_hash of their concatenation.  For a reader that hashes each piece
 * while it is still in cache instead of the whole chunk afterwards. */
typedef struct codec_hasher codec_hasher;
int codec_hasher_create(codec_hasher **out); /* CKPT_ENOMEM */
void codec_hasher_free(codec_hasher *h);     /* NULL is fine */
void codec_hasher_reset(codec_hasher *h);
void codec_hasher_update(codec_hasher *h, const void *p, size_t n);
uint64_t codec_hasher_digest(const codec_hasher *h);

/* Check the stored hash of a chunk read into `stored`: do this before
 * anything is sized or decoded by what the chunk claims.  CKPT_ECORRUPT
 * with a message saying which check failed; the caller prefixes
 * file/tensor/offset. */
int codec_check_stored(const void *stored, const chunk_meta *meta);

/* Decode a chunk whose stored hash was checked (codec_check_stored) into
 * dst, which holds exactly meta->raw_len bytes, and check the raw hash.  A
 * zstd chunk must be exactly one frame declaring raw_len bytes.
 * CKPT_ECORRUPT with a message saying which check failed. */
int codec_decode_checked(codec *c, const void *stored, const chunk_meta *meta, void *dst);

#endif

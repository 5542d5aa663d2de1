/* codec: shuffle + zstd + xxh3 for one chunk. */
#include "codec.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#define XXH_INLINE_ALL /* several times faster than calls into libxxhash */
#include <xxhash.h>

#include "ckpt.h"
#include "error.h"

struct codec {
    int level;
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    unsigned char *shuf; /* shuffled raw bytes (encode) / decoded bytes */
    size_t shuf_cap;
    unsigned char *out;  /* compressed frame */
    size_t out_cap;
};

int codec_create(codec **out, int level)
{
    codec *c = calloc(1, sizeof *c);
    if (!c)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory creating a codec");
    c->level = level;
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    if (!c->cctx || !c->dctx) {
        codec_free(c);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory creating zstd contexts");
    }
    *out = c;
    return CKPT_OK;
}

void codec_free(codec *c)
{
    if (!c)
        return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c->shuf);
    free(c->out);
    free(c);
}

static int reserve(unsigned char **buf, size_t *cap, size_t n)
{
    if (*cap >= n)
        return CKPT_OK;
    unsigned char *p = realloc(*buf, n);
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory for a %zu-byte codec buffer", n);
    *buf = p;
    *cap = n;
    return CKPT_OK;
}

uint64_t codec_hash(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* Byte k of every element goes to plane k: floats' exponent bytes then sit
 * together, which zstd compresses far better. */
static void shuffle(unsigned char *restrict dst, const unsigned char *restrict src,
                    size_t n, unsigned elem)
{
    size_t count = n / elem;
    for (unsigned k = 0; k < elem; k++) {
        unsigned char *plane = dst + (size_t)k * count;
        for (size_t i = 0; i < count; i++)
            plane[i] = src[i * elem + k];
    }
    memcpy(dst + count * elem, src + count * elem, n - count * elem);
}

static void unshuffle(unsigned char *restrict dst, const unsigned char *restrict src,
                      size_t n, unsigned elem)
{
    size_t count = n / elem;
    for (unsigned k = 0; k < elem; k++) {
        const unsigned char *plane = src + (size_t)k * count;
        for (size_t i = 0; i < count; i++)
            dst[i * elem + k] = plane[i];
    }
    memcpy(dst + count * elem, src + count * elem, n - count * elem);
}

int codec_encode(codec *c, const void *raw, size_t n, unsigned elem,
                 const void **stored, chunk_meta *meta)
{
    if (elem == 0 || elem > 255)
        elem = 1;
    meta->raw_len = n;
    meta->raw_hash = XXH3_64bits(raw, n);
    const void *src = raw;
    if (elem > 1 && n >= elem) {
        int rc = reserve(&c->shuf, &c->shuf_cap, n);
        if (rc)
            return rc;
        shuffle(c->shuf, raw, n, elem);
        src = c->shuf;
    }
    size_t bound = ZSTD_compressBound(n);
    int rc = reserve(&c->out, &c->out_cap, bound);
    if (rc)
        return rc;
    size_t z = n ? ZSTD_compressCCtx(c->cctx, c->out, bound, src, n, c->level) : 0;
    if (n && ZSTD_isError(z))
        return ckpt_seterr(CKPT_EINTERNAL, "zstd compression failed: %s",
                           ZSTD_getErrorName(z));
    if (n == 0 || z >= n) { /* would not shrink: store raw */
        meta->codec = CODEC_RAW;
        meta->elem = 1;
        meta->stored_len = n;
        meta->stored_hash = meta->raw_hash;
        *stored = raw;
    } else {
        meta->codec = CODEC_ZSTD_SHUFFLE;
        meta->elem = (uint8_t)(src == raw ? 1 : elem);
        meta->stored_len = z;
        meta->stored_hash = XXH3_64bits(c->out, z);
        *stored = c->out;
    }
    return CKPT_OK;
}

int codec_check_stored(const void *stored, const chunk_meta *meta)
{
    uint64_t h = XXH3_64bits(stored, (size_t)meta->stored_len);
    if (h != meta->stored_hash)
        return ckpt_seterr(CKPT_ECORRUPT,
                           "stored bytes hash %016llx, index says %016llx",
                           (unsigned long long)h, (unsigned long long)meta->stored_hash);
    return CKPT_OK;
}

int codec_decode(codec *c, const void *stored, const chunk_meta *meta, void *dst)
{
    int rc = codec_check_stored(stored, meta);
    if (rc)
        return rc;
    size_t n = (size_t)meta->raw_len;
    if (meta->codec == CODEC_RAW) {
        if (meta->stored_len != meta->raw_len)
            return ckpt_seterr(CKPT_ECORRUPT, "raw chunk of %llu stored bytes "
                               "declares %llu raw bytes",
                               (unsigned long long)meta->stored_len,
                               (unsigned long long)meta->raw_len);
        memcpy(dst, stored, n);
    } else if (meta->codec == CODEC_ZSTD_SHUFFLE) {
        unsigned elem = meta->elem ? meta->elem : 1;
        unsigned long long fcs = ZSTD_getFrameContentSize(stored, (size_t)meta->stored_len);
        if (fcs != meta->raw_len)
            return ckpt_seterr(CKPT_ECORRUPT, "zstd frame declares %llu bytes, "
                               "index says %llu", fcs,
                               (unsigned long long)meta->raw_len);
        unsigned char *target = dst;
        if (elem > 1) {
            rc = reserve(&c->shuf, &c->shuf_cap, n);
            if (rc)
                return rc;
            target = c->shuf;
        }
        /* Capacity is exactly the declared size: zstd never writes past it. */
        size_t got = ZSTD_decompressDCtx(c->dctx, target, n, stored,
                                         (size_t)meta->stored_len);
        if (ZSTD_isError(got))
            return ckpt_seterr(CKPT_ECORRUPT, "zstd cannot decode the chunk: %s",
                               ZSTD_getErrorName(got));
        if (got != n)
            return ckpt_seterr(CKPT_ECORRUPT, "chunk decoded to %zu bytes, expected %zu",
                               got, n);
        if (elem > 1)
            unshuffle(dst, c->shuf, n, elem);
    } else {
        return ckpt_seterr(CKPT_ECORRUPT, "unknown codec %u", meta->codec);
    }
    uint64_t h = XXH3_64bits(dst, n);
    if (h != meta->raw_hash)
        return ckpt_seterr(CKPT_ECORRUPT, "decoded bytes hash %016llx, index says %016llx",
                           (unsigned long long)h, (unsigned long long)meta->raw_hash);
    return CKPT_OK;
}

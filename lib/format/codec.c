/* codec: shuffle + zstd + xxh3 for one chunk. */
#include "codec.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "error.h"
#include "xxh3.h"

/* The codec table: every codec-specific rule lives in this row. */
typedef struct codec_info {
    const char *name;
    int compressed;            /* 0: stored bytes are the raw bytes */
} codec_info;

static const codec_info codecs[] = {
    [CODEC_RAW] = {"raw", 0},
    [CODEC_ZSTD_SHUFFLE] = {"zstd+shuffle", 1},
};
#define NCODECS (sizeof codecs / sizeof codecs[0])

/* ZSTD_compressBound's formula (zstd.h, ZSTD_COMPRESSBOUND), written out
 * so that it is the same for every zstd version and docs/FORMAT.md can
 * state it: n + n/256 + (n < 128 KiB ? (128 KiB - n) / 2048 : 0). */
uint64_t codec_stored_bound(unsigned id, uint64_t n)
{
    if (id >= NCODECS)
        return 0;
    if (!codecs[id].compressed)
        return n;
    const uint64_t k128 = 128u << 10;
    return n + (n >> 8) + (n < k128 ? (k128 - n) >> 11 : 0);
}

int codec_check_meta(const chunk_meta *m)
{
    if (m->codec >= NCODECS)
        return ckpt_seterr(CKPT_ECORRUPT, "unknown codec %u", m->codec);
    if (m->elem == 0 || m->elem > CODEC_ELEM_MAX || (m->codec == CODEC_RAW && m->elem != 1))
        return ckpt_seterr(CKPT_ECORRUPT, "invalid shuffle width %u for codec %s", m->elem,
                           codecs[m->codec].name);
    if (m->codec == CODEC_RAW ? m->stored_len != m->raw_len
                              : m->stored_len == 0 ||
                                m->stored_len > codec_stored_bound(m->codec, m->raw_len))
        return ckpt_seterr(CKPT_ECORRUPT, "%llu stored bytes are impossible for %llu raw "
                           "bytes under codec %s", (unsigned long long)m->stored_len,
                           (unsigned long long)m->raw_len, codecs[m->codec].name);
    return CKPT_OK;
}

int codec_resolve_level(int level, int *resolved)
{
    if (level == 0)
        level = CKPT_LEVEL_DEFAULT;
    if (level < CKPT_LEVEL_MIN || level > CKPT_LEVEL_MAX)
        return ckpt_seterr(CKPT_EINVAL, "zstd level %d is out of range (%d..%d)", level,
                           CKPT_LEVEL_MIN, CKPT_LEVEL_MAX);
    *resolved = level;
    return CKPT_OK;
}

unsigned codec_shuffle_width(ckpt_dtype d)
{
    switch (d) {
    case CKPT_C64: return 4;
    case CKPT_C128: return 8;
    case CKPT_BYTES: return 1;
    default: return (unsigned)ckpt_dtype_size(d);
    }
}

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
    return xxh3_64(p, n);
}

struct codec_hasher {
    xxh3_stream *st;
};

int codec_hasher_create(codec_hasher **out)
{
    codec_hasher *h = malloc(sizeof *h);
    if (h && !(h->st = xxh3_stream_new())) {
        free(h);
        h = NULL;
    }
    *out = h;
    return h ? CKPT_OK : ckpt_seterr(CKPT_ENOMEM, "out of memory");
}

void codec_hasher_free(codec_hasher *h)
{
    if (!h)
        return;
    xxh3_stream_free(h->st);
    free(h);
}

void codec_hasher_reset(codec_hasher *h)
{
    xxh3_stream_reset(h->st);
}

void codec_hasher_update(codec_hasher *h, const void *p, size_t n)
{
    xxh3_stream_update(h->st, p, n);
}

uint64_t codec_hasher_digest(const codec_hasher *h)
{
    return xxh3_stream_digest(h->st);
}

/* Byte k of every element goes to plane k: floats' exponent bytes then sit
 * together, which zstd compresses far better.  Widths 2 and 4 (bf16/fp16,
 * fp32) have SSE2 paths: the scalar loops gather with strides and run at a
 * fraction of memory speed. */
#if defined(__SSE2__)
#include <emmintrin.h>

/* Even bytes of a:b packed in order, and odd bytes likewise. */
static inline void split_bytes(__m128i a, __m128i b, __m128i *even, __m128i *odd)
{
    const __m128i lo = _mm_set1_epi16(0x00ff);
    *even = _mm_packus_epi16(_mm_and_si128(a, lo), _mm_and_si128(b, lo));
    *odd = _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
}

static size_t shuffle2_sse2(unsigned char *dst, const unsigned char *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m128i v0 = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        __m128i v1 = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));
        __m128i p0, p1;
        split_bytes(v0, v1, &p0, &p1);
        _mm_storeu_si128((__m128i *)(dst + i), p0);
        _mm_storeu_si128((__m128i *)(dst + count + i), p1);
    }
    return i;
}

static size_t shuffle4_sse2(unsigned char *dst, const unsigned char *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        const unsigned char *s = src + 4 * i;
        __m128i v0 = _mm_loadu_si128((const __m128i *)s);
        __m128i v1 = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i v2 = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i v3 = _mm_loadu_si128((const __m128i *)(s + 48));
        __m128i e01, o01, e23, o23, p0, p1, p2, p3;
        split_bytes(v0, v1, &e01, &o01); /* e: bytes 0,2 of elements; o: 1,3 */
        split_bytes(v2, v3, &e23, &o23);
        split_bytes(e01, e23, &p0, &p2);
        split_bytes(o01, o23, &p1, &p3);
        _mm_storeu_si128((__m128i *)(dst + i), p0);
        _mm_storeu_si128((__m128i *)(dst + count + i), p1);
        _mm_storeu_si128((__m128i *)(dst + 2 * count + i), p2);
        _mm_storeu_si128((__m128i *)(dst + 3 * count + i), p3);
    }
    return i;
}

static size_t unshuffle2_sse2(unsigned char *dst, const unsigned char *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m128i p0 = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i p1 = _mm_loadu_si128((const __m128i *)(src + count + i));
        _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(p0, p1));
        _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(p0, p1));
    }
    return i;
}

static size_t unshuffle4_sse2(unsigned char *dst, const unsigned char *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m128i p0 = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i p1 = _mm_loadu_si128((const __m128i *)(src + count + i));
        __m128i p2 = _mm_loadu_si128((const __m128i *)(src + 2 * count + i));
        __m128i p3 = _mm_loadu_si128((const __m128i *)(src + 3 * count + i));
        __m128i a = _mm_unpacklo_epi8(p0, p2), b = _mm_unpacklo_epi8(p1, p3);
        __m128i c = _mm_unpackhi_epi8(p0, p2), d = _mm_unpackhi_epi8(p1, p3);
        unsigned char *o = dst + 4 * i;
        _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi8(a, b));
        _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi8(a, b));
        _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi8(c, d));
        _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi8(c, d));
    }
    return i;
}
#endif

static void shuffle(unsigned char *restrict dst, const unsigned char *restrict src,
                    size_t n, unsigned elem)
{
    size_t count = n / elem, start = 0;
#if defined(__SSE2__)
    if (elem == 2)
        start = shuffle2_sse2(dst, src, count);
    else if (elem == 4)
        start = shuffle4_sse2(dst, src, count);
#endif
    for (unsigned k = 0; k < elem; k++)
        for (size_t i = start; i < count; i++)
            dst[(size_t)k * count + i] = src[i * elem + k];
    memcpy(dst + count * elem, src + count * elem, n - count * elem);
}

static void unshuffle(unsigned char *restrict dst, const unsigned char *restrict src,
                      size_t n, unsigned elem)
{
    size_t count = n / elem, start = 0;
#if defined(__SSE2__)
    if (elem == 2)
        start = unshuffle2_sse2(dst, src, count);
    else if (elem == 4)
        start = unshuffle4_sse2(dst, src, count);
#endif
    for (unsigned k = 0; k < elem; k++)
        for (size_t i = start; i < count; i++)
            dst[i * elem + k] = src[(size_t)k * count + i];
    memcpy(dst + count * elem, src + count * elem, n - count * elem);
}

void codec_store_raw(const void *raw, size_t n, const void **stored, chunk_meta *meta)
{
    meta->codec = CODEC_RAW;
    meta->elem = 1;
    meta->raw_len = n;
    meta->stored_len = n;
    meta->raw_hash = xxh3_64(raw, n);
    meta->stored_hash = meta->raw_hash;
    *stored = raw;
}

int codec_encode(codec *c, const void *raw, size_t n, unsigned elem,
                 const void **stored, chunk_meta *meta)
{
    if (elem == 0 || elem > CODEC_ELEM_MAX)
        elem = 1;
    meta->raw_len = n;
    meta->raw_hash = xxh3_64(raw, n);
    const void *src = raw;
    if (elem > 1 && n >= elem) {
        int rc = reserve(&c->shuf, &c->shuf_cap, n);
        if (rc)
            return rc;
        shuffle(c->shuf, raw, n, elem);
        src = c->shuf;
    }
    size_t bound = ZSTD_compressBound(n); /* == codec_stored_bound() */
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
        meta->stored_hash = xxh3_64(c->out, z);
        *stored = c->out;
    }
    return CKPT_OK;
}

int codec_check_stored(const void *stored, const chunk_meta *meta)
{
    uint64_t h = xxh3_64(stored, (size_t)meta->stored_len);
    if (h != meta->stored_hash)
        return ckpt_seterr(CKPT_ECORRUPT,
                           "stored bytes hash %016llx, index says %016llx",
                           (unsigned long long)h, (unsigned long long)meta->stored_hash);
    return CKPT_OK;
}

int codec_decode_checked(codec *c, const void *stored, const chunk_meta *meta, void *dst)
{
    int rc;
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
        /* Exactly one frame, nothing after it (not even a skippable frame). */
        size_t flen = ZSTD_findFrameCompressedSize(stored, (size_t)meta->stored_len);
        if (ZSTD_isError(flen) || flen != meta->stored_len)
            return ckpt_seterr(CKPT_ECORRUPT, "stored bytes are not exactly one zstd frame");
        unsigned long long fcs = ZSTD_getFrameContentSize(stored, (size_t)meta->stored_len);
        if (fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs == ZSTD_CONTENTSIZE_ERROR)
            return ckpt_seterr(CKPT_ECORRUPT, "zstd frame %s its content size (the index "
                               "says %llu bytes; libckpt always writes it)",
                               fcs == ZSTD_CONTENTSIZE_UNKNOWN ? "does not declare"
                                                               : "has no readable",
                               (unsigned long long)meta->raw_len);
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
    uint64_t h = xxh3_64(dst, n);
    if (h != meta->raw_hash)
        return ckpt_seterr(CKPT_ECORRUPT, "decoded bytes hash %016llx, index says %016llx",
                           (unsigned long long)h, (unsigned long long)meta->raw_hash);
    return CKPT_OK;
}

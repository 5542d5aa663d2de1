/* codec: round trips at every shuffle width and size, and the exact byte
 * layout docs/FORMAT.md specifies (an independent reader relies on it). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "codec.h"
#include "ckpt.h"

/* What a reader does with a chunk it has read: stored hash, then decode. */
static int codec_decode(codec *c, const void *stored, const chunk_meta *m, void *dst)
{
    int rc = codec_check_stored(stored, m);
    return rc ? rc : codec_decode_checked(c, stored, m, dst);
}

static void fill(unsigned char *p, size_t n, unsigned elem)
{
    for (size_t i = 0; i < n; i++) /* compressible, but not trivially */
        p[i] = (unsigned char)(i % elem == 0 ? (i * 2654435761u) >> 13 : i / elem % 3);
}

Test(codec, round_trip_every_width_and_size)
{
    codec *c;
    cr_assert_eq(codec_create(&c, 1), CKPT_OK);
    for (unsigned elem = 1; elem <= 16; elem++) {
        for (size_t n = 1; n < 600; n += 1 + n / 5) {
            unsigned char *src = malloc(n), *dst = malloc(n), *copy = NULL;
            fill(src, n, elem);
            const void *stored;
            chunk_meta m;
            cr_assert_eq(codec_encode(c, src, n, elem, &stored, &m), CKPT_OK);
            cr_assert_eq(m.raw_len, n);
            cr_assert(m.stored_len <= n, "stored %llu > raw %zu", (unsigned long long)m.stored_len, n);
            copy = malloc(m.stored_len ? m.stored_len : 1);
            memcpy(copy, stored, m.stored_len);
            memset(dst, 0xAA, n);
            cr_assert_eq(codec_decode(c, copy, &m, dst), CKPT_OK, "elem %u n %zu: %s", elem,
                         n, ckpt_error_last());
            cr_assert_arr_eq(src, dst, n, "elem %u n %zu differs", elem, n);
            free(src);
            free(dst);
            free(copy);
        }
    }
    codec_free(c);
}

Test(codec, shuffle_layout_matches_the_format)
{
    codec *c;
    cr_assert_eq(codec_create(&c, 1), CKPT_OK);
    const unsigned widths[] = {2, 4, 8, 16, 3};
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        unsigned elem = widths[w];
        for (size_t n = 64; n < 20000; n = n * 3 + elem + 1) {
            unsigned char *src = malloc(n), *ref = malloc(n), *got = malloc(n);
            for (size_t i = 0; i < n; i++)
                src[i] = (unsigned char)(i % elem == 0 ? i : 7);
            size_t count = n / elem; /* output byte j*k+i is input byte i*w+j */
            for (unsigned j = 0; j < elem; j++)
                for (size_t i = 0; i < count; i++)
                    ref[j * count + i] = src[i * elem + j];
            memcpy(ref + count * elem, src + count * elem, n - count * elem);
            const void *stored;
            chunk_meta m;
            cr_assert_eq(codec_encode(c, src, n, elem, &stored, &m), CKPT_OK);
            cr_assert_eq(m.codec, CODEC_ZSTD_SHUFFLE, "this data compresses");
            cr_assert_eq(m.elem, elem);
            size_t r = ZSTD_decompress(got, n, stored, (size_t)m.stored_len);
            cr_assert_eq(r, n);
            cr_assert_arr_eq(got, ref, n, "width %u, %zu bytes: layout differs", elem, n);
            free(src);
            free(ref);
            free(got);
        }
    }
    codec_free(c);
}

Test(codec, incompressible_chunks_are_stored_raw)
{
    codec *c;
    cr_assert_eq(codec_create(&c, 1), CKPT_OK);
    size_t n = 1 << 16;
    unsigned char *src = malloc(n), *dst = malloc(n);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        src[i] = (unsigned char)x;
    }
    const void *stored;
    chunk_meta m;
    cr_assert_eq(codec_encode(c, src, n, 4, &stored, &m), CKPT_OK);
    cr_assert_eq(m.codec, CODEC_RAW);
    cr_assert_eq(m.stored_len, n);
    cr_assert_eq(m.stored_hash, m.raw_hash);
    cr_assert_eq(codec_decode(c, stored, &m, dst), CKPT_OK);
    cr_assert_arr_eq(src, dst, n);
    free(src);
    free(dst);
    codec_free(c);
}

Test(codec, decode_rejects_lies_in_the_metadata)
{
    codec *c;
    cr_assert_eq(codec_create(&c, 1), CKPT_OK);
    size_t n = 4096;
    unsigned char src[4096], dst[4096];
    fill(src, n, 4);
    const void *stored;
    chunk_meta m;
    cr_assert_eq(codec_encode(c, src, n, 4, &stored, &m), CKPT_OK);
    unsigned char *copy = malloc(m.stored_len);
    memcpy(copy, stored, m.stored_len);

    chunk_meta bad = m;
    bad.raw_len = n - 16; /* frame says n: must not write n into n-16 */
    cr_assert_eq(codec_decode(c, copy, &bad, dst), CKPT_ECORRUPT);
    bad = m;
    bad.raw_hash ^= 1;
    cr_assert_eq(codec_decode(c, copy, &bad, dst), CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "decoded bytes hash") != NULL);
    bad = m;
    bad.codec = 9;
    cr_assert_eq(codec_decode(c, copy, &bad, dst), CKPT_ECORRUPT);
    copy[m.stored_len / 2] ^= 0x10;
    cr_assert_eq(codec_decode(c, copy, &m, dst), CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "stored bytes hash") != NULL);
    free(copy);
    codec_free(c);
}

/* A zstd frame written without its content size (a streaming encoder's
 * default) is refused saying so, not as a frame that "declares
 * 18446744073709551615 bytes" (zstd's marker for an unknown size). */
Test(codec, a_frame_without_its_content_size_is_named)
{
    codec *c;
    cr_assert_eq(codec_create(&c, 1), CKPT_OK);
    size_t n = 4096;
    unsigned char src[4096], dst[4096];
    fill(src, n, 1);
    const void *stored;
    chunk_meta m;
    cr_assert_eq(codec_encode(c, src, n, 1, &stored, &m), CKPT_OK);
    cr_assert_eq(m.codec, CODEC_ZSTD_SHUFFLE, "the chunk compressed");
    ZSTD_CCtx *z = ZSTD_createCCtx();
    cr_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(z, ZSTD_c_contentSizeFlag, 0)));
    size_t cap = ZSTD_compressBound(n);
    unsigned char *frame = malloc(cap);
    size_t flen = ZSTD_compress2(z, frame, cap, src, n);
    cr_assert(!ZSTD_isError(flen));
    cr_assert_eq(ZSTD_getFrameContentSize(frame, flen), ZSTD_CONTENTSIZE_UNKNOWN);
    m.stored_len = flen;
    cr_assert_eq(codec_decode_checked(c, frame, &m, dst), CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "zstd frame does not declare its content size "
                                        "(the index says 4096 bytes"), "%s", ckpt_error_last());
    free(frame);
    ZSTD_freeCCtx(z);
    codec_free(c);
}

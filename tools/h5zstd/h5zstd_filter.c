/* h5zstd_filter: HDF5 filter callback compressing each chunk as one zstd
 * frame.  A chunk may also come from H5Dwrite_chunk (ckpt export), so the
 * reverse direction trusts nothing in the frame it is given. */
#include <stdint.h>
#include <string.h>

#include <zstd.h>

#include "h5zstd.h"

/* HDF5 chunks are at most 4 GiB; a frame claiming more is damaged. */
#define MAX_CHUNK ((unsigned long long)UINT32_MAX)

static size_t decompress(size_t nbytes, size_t *buf_size, void **buf)
{
    unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
    void *out = NULL;
    size_t cap, got;

    if (n == ZSTD_CONTENTSIZE_ERROR || (n != ZSTD_CONTENTSIZE_UNKNOWN && n > MAX_CHUNK))
        return 0;
    if (n != ZSTD_CONTENTSIZE_UNKNOWN) {
        cap = (size_t)n;
        out = H5allocate_memory(cap ? cap : 1, 0);
        if (!out)
            return 0;
        got = ZSTD_decompress(out, cap, *buf, nbytes);
        if (ZSTD_isError(got) || got != cap) {
            H5free_memory(out);
            return 0;
        }
    } else {
        /* Streaming frame without a size: grow the buffer as needed. */
        ZSTD_DStream *ds = ZSTD_createDStream();
        ZSTD_inBuffer in = {*buf, nbytes, 0};
        size_t r = 1;
        cap = nbytes * 4 + 4096;
        got = 0;
        out = H5allocate_memory(cap, 0);
        if (!ds || !out) {
            ZSTD_freeDStream(ds);
            if (out)
                H5free_memory(out);
            return 0;
        }
        ZSTD_initDStream(ds);
        while (r != 0) {
            if (got == cap) {
                if (cap >= MAX_CHUNK)
                    goto fail;
                size_t ncap = cap * 2;
                void *p = H5resize_memory(out, ncap);
                if (!p)
                    goto fail;
                out = p;
                cap = ncap;
            }
            ZSTD_outBuffer ob = {(char *)out + got, cap - got, 0};
            r = ZSTD_decompressStream(ds, &ob, &in);
            if (ZSTD_isError(r))
                goto fail;
            got += ob.pos;
            if (r != 0 && in.pos == in.size && ob.pos < ob.size)
                goto fail; /* truncated frame */
        }
        ZSTD_freeDStream(ds);
        goto ok;
    fail:
        ZSTD_freeDStream(ds);
        H5free_memory(out);
        return 0;
    }
ok:
    H5free_memory(*buf);
    *buf = out;
    *buf_size = cap;
    return got;
}

static size_t compress(size_t cd_nelmts, const unsigned int cd_values[], size_t nbytes,
                       size_t *buf_size, void **buf)
{
    int level = cd_nelmts > 0 ? (int)cd_values[0] : ZSTD_CLEVEL_DEFAULT;
    if (level > ZSTD_maxCLevel())
        level = ZSTD_maxCLevel();
    size_t cap = ZSTD_compressBound(nbytes);
    void *out = H5allocate_memory(cap, 0);
    if (!out)
        return 0;
    size_t n = ZSTD_compress(out, cap, *buf, nbytes, level);
    if (ZSTD_isError(n)) {
        H5free_memory(out);
        return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = cap;
    return n;
}

static size_t zstd_filter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                          size_t nbytes, size_t *buf_size, void **buf)
{
    if (flags & H5Z_FLAG_REVERSE)
        return decompress(nbytes, buf_size, buf);
    return compress(cd_nelmts, cd_values, nbytes, buf_size, buf);
}

const H5Z_class2_t ckpt_h5zstd_class[1] = {{
    H5Z_CLASS_T_VERS,
    (H5Z_filter_t)CKPT_H5Z_FILTER_ZSTD,
    1, /* encoder present */
    1, /* decoder present */
    "zstd",
    NULL,
    NULL,
    zstd_filter,
}};

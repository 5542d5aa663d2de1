/* h5zstd_filter: HDF5 filter callback compressing each chunk as one zstd
 * frame.  A chunk may also come from H5Dwrite_chunk (ckpt export), so the
 * reverse direction trusts nothing in the frame it is given. */
#include <stdint.h>
#include <string.h>

#include <zstd.h>

#include "h5zstd.h"

/* HDF5 chunks are at most 4 GiB; a frame claiming more is damaged. */
#define MAX_CHUNK ((unsigned long long)UINT32_MAX)

static size_t decode(size_t nbytes, size_t *buf_size, void **buf);

/* The chunk size a program reading with this filter compiled in (ckpt
 * import) knows for the dataset it reads (ckpt_h5zstd_expect); 0: none. */
static size_t expected;

void ckpt_h5zstd_expect(size_t chunk_bytes)
{
    expected = chunk_bytes;
}

/* HDF5 uses a chunk the filter hands back as a whole chunk whatever size
 * the filter says it has: a frame decoding to less would have HDF5 read
 * past the buffer (and hand out heap bytes as data), to more would be cut
 * silently.  So the chunk's size is recorded with the filter (set_local)
 * and a frame of any other size refused; for a file without it (written by
 * another program), ckpt import tells the filter the size it expects
 * (ckpt_h5zstd_expect); other programs reading it through the plugin get
 * what HDF5 makes of it. */
static size_t decompress(size_t cd_nelmts, const unsigned int cd_values[], size_t nbytes,
                         size_t *buf_size, void **buf)
{
    size_t got = decode(nbytes, buf_size, buf);
    size_t want = cd_nelmts >= 2 ? cd_values[1] : expected;
    if (got && want && got != want)
        return 0; /* *buf is the decoded frame: HDF5 frees it */
    return got;
}

/* Record the chunk's size in bytes as cd_values[1] (cd_values[0], the
 * level, kept or given the default). */
static herr_t set_local(hid_t dcpl, hid_t type, hid_t space)
{
    (void)space;
    unsigned int flags, values[8];
    size_t n = 8;
    if (H5Pget_filter_by_id2(dcpl, CKPT_H5Z_FILTER_ZSTD, &flags, &n, values, 0, NULL, NULL) < 0)
        return -1;
    hsize_t dims[H5S_MAX_RANK];
    int nd = H5Pget_chunk(dcpl, H5S_MAX_RANK, dims);
    size_t esize = H5Tget_size(type);
    if (nd <= 0 || esize == 0)
        return -1;
    unsigned long long bytes = esize;
    for (int d = 0; d < nd; d++) {
        if (dims[d] && bytes > MAX_CHUNK / dims[d])
            return -1;
        bytes *= dims[d];
    }
    unsigned int cd[2] = {n > 0 ? values[0] : (unsigned int)ZSTD_CLEVEL_DEFAULT,
                          (unsigned int)bytes};
    return H5Pmodify_filter(dcpl, CKPT_H5Z_FILTER_ZSTD, flags, 2, cd);
}

static size_t decode(size_t nbytes, size_t *buf_size, void **buf)
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
        return decompress(cd_nelmts, cd_values, nbytes, buf_size, buf);
    return compress(cd_nelmts, cd_values, nbytes, buf_size, buf);
}

const H5Z_class2_t ckpt_h5zstd_class[1] = {{
    H5Z_CLASS_T_VERS,
    (H5Z_filter_t)CKPT_H5Z_FILTER_ZSTD,
    1, /* encoder present */
    1, /* decoder present */
    "zstd",
    NULL,      /* can_apply */
    set_local, /* the chunk's size, checked on reading */
    zstd_filter,
}};

/* shard: encode and check the shard file's header, index and trailer. */
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "util.h"

#define CORRUPT(...) ckpt_seterr(CKPT_ECORRUPT, __VA_ARGS__)

void shard_file_name(uint32_t rank, char name[SHARD_NAME_SIZE])
{
    snprintf(name, SHARD_NAME_SIZE, "rank-%05u.shard", rank);
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

void shard_encode_header(unsigned char h[SHARD_HEADER_SIZE], int64_t step,
                         const unsigned char id[SHARD_ID_SIZE],
                         uint32_t rank)
{
    memset(h, 0, SHARD_HEADER_SIZE);
    memcpy(h, SHARD_MAGIC, 8);
    util_put_u32(h + 8, SHARD_VERSION);
    util_put_u32(h + 12, SHARD_HEADER_SIZE);
    util_put_u64(h + 16, (uint64_t)step);
    memcpy(h + 24, id, SHARD_ID_SIZE);
    util_put_u32(h + 40, rank);
    util_put_be64(h + 56, codec_hash(h, 56));
}

int shard_check_header(const unsigned char h[SHARD_HEADER_SIZE], const char *name,
                       int64_t step, const unsigned char id[SHARD_ID_SIZE])
{
    if (memcmp(h, SHARD_MAGIC, 8) != 0 || util_get_be64(h + 56) != codec_hash(h, 56))
        return CORRUPT("%s: bad shard header (offset 0)", name);
    if (util_get_u32(h + 8) != SHARD_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "%s: shard format version %u, this library "
                           "reads %u", name, util_get_u32(h + 8), SHARD_VERSION);
    if (util_get_u32(h + 12) != SHARD_HEADER_SIZE || !all_zero(h + 44, 12))
        return CORRUPT("%s: shard header has a wrong size or non-zero reserved bytes "
                       "(offset 12)", name);
    if ((int64_t)util_get_u64(h + 16) != step || memcmp(h + 24, id, SHARD_ID_SIZE)) {
        /* Both ids: what it came from, and (reader.c) whether a retry read
         * another manifest or the same one again. */
        char its[2 * SHARD_ID_SIZE + 1], want[2 * SHARD_ID_SIZE + 1];
        for (size_t i = 0; i < SHARD_ID_SIZE; i++) {
            snprintf(its + 2 * i, 3, "%02x", h[24 + i]);
            snprintf(want + 2 * i, 3, "%02x", id[i]);
        }
        return CORRUPT("%s: shard header belongs to another checkpoint (offset 16: step "
                       "%lld, id %s; the manifest's: step %lld, id %s)", name,
                       (long long)(int64_t)util_get_u64(h + 16), its, (long long)step, want);
    }
    return CKPT_OK;
}

void shard_encode_entry(unsigned char p[SHARD_ENTRY_SIZE], const shard_entry *e)
{
    memset(p, 0, SHARD_ENTRY_SIZE);
    util_put_u32(p, e->tensor);
    p[4] = e->meta.codec;
    p[5] = e->meta.elem;
    util_put_u64(p + 8, e->offset);
    util_put_u64(p + 16, e->meta.raw_len);
    util_put_u64(p + 24, e->meta.stored_len);
    util_put_u64(p + 32, e->file_offset);
    util_put_be64(p + 40, e->meta.stored_hash);
    util_put_be64(p + 48, e->meta.raw_hash);
}

int shard_decode_entry(const unsigned char p[SHARD_ENTRY_SIZE], shard_entry *e)
{
    e->tensor = util_get_u32(p);
    e->meta.codec = p[4];
    e->meta.elem = p[5];
    e->offset = util_get_u64(p + 8);
    e->meta.raw_len = util_get_u64(p + 16);
    e->meta.stored_len = util_get_u64(p + 24);
    e->file_offset = util_get_u64(p + 32);
    e->meta.stored_hash = util_get_be64(p + 40);
    e->meta.raw_hash = util_get_be64(p + 48);
    return all_zero(p + 6, 2) && all_zero(p + 56, 8) ? CKPT_OK : CKPT_ECORRUPT;
}

void shard_encode_trailer(unsigned char t[SHARD_TRAILER_SIZE], const shard_trailer *tr,
                          const unsigned char id[SHARD_ID_SIZE])
{
    util_put_u64(t, tr->index_offset);
    util_put_u64(t + 8, tr->count);
    util_put_be64(t + 16, tr->index_hash);
    memcpy(t + 24, id, SHARD_ID_SIZE);
    memcpy(t + 40, SHARD_TRAILER_MAGIC, 8);
}

int shard_decode_trailer(const unsigned char t[SHARD_TRAILER_SIZE], const char *name,
                         uint64_t toff, const unsigned char id[SHARD_ID_SIZE],
                         shard_trailer *tr)
{
    if (memcmp(t + 40, SHARD_TRAILER_MAGIC, 8) != 0 || memcmp(t + 24, id, SHARD_ID_SIZE) != 0)
        return CORRUPT("%s: bad shard trailer (offset %llu)", name, (unsigned long long)toff);
    tr->index_offset = util_get_u64(t);
    tr->count = util_get_u64(t + 8);
    tr->index_hash = util_get_be64(t + 16);
    uint64_t ilen, iend;
    if (!util_mul_u64(tr->count, SHARD_ENTRY_SIZE, &ilen) ||
        !util_add_u64(tr->index_offset, ilen, &iend) ||
        tr->index_offset < SHARD_HEADER_SIZE || iend != toff)
        return CORRUPT("%s: trailer (offset %llu) locates the index out of bounds", name,
                       (unsigned long long)toff);
    return CKPT_OK;
}

void shard_index_free(shard_index *index)
{
    free(index->entries);
    index->entries = NULL;
    index->count = 0;
}

static int cmp_u64_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Frames may not share bytes: entries that alias one frame would let a
 * tiny file declare a huge tensor that verifies. */
static int check_no_overlap(const char *name, const shard_index *ix)
{
    /* The index is in (tensor, offset) order.  Entries that follow each
     * other in the file (end to start) form a run, one contiguous range:
     * a save's batch of small tensors, or one worker's chunks in order.
     * Frames overlap exactly when two runs do (a run's own frames only
     * touch), so the runs are sorted, not the frames: a few hundred ranges
     * for 10,000 tiny tensors.  An index whose runs overlap is sorted frame
     * by frame, so the overlap named is the first in the file either way. */
    uint64_t runs = 0, end = 0, frames = 0;
    for (uint64_t i = 0; i < ix->count; i++) {
        const shard_entry *e = &ix->entries[i];
        if (e->meta.stored_len == 0)
            continue;
        runs += frames == 0 || e->file_offset != end;
        end = e->file_offset + e->meta.stored_len;
        frames++;
    }
    if (runs <= 1)
        return CKPT_OK;
    uint64_t (*r)[2] = malloc(runs * sizeof *r);
    if (!r)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory checking the index of %s", name);
    uint64_t n = 0;
    for (uint64_t i = 0; i < ix->count; i++) {
        const shard_entry *e = &ix->entries[i];
        if (e->meta.stored_len == 0)
            continue;
        if (n > 0 && r[n - 1][1] == e->file_offset)
            r[n - 1][1] += e->meta.stored_len; /* bounds checked: no overflow */
        else {
            r[n][0] = e->file_offset;
            r[n][1] = e->file_offset + e->meta.stored_len;
            n++;
        }
    }
    int rc = CKPT_OK;
    qsort(r, (size_t)n, sizeof *r, cmp_u64_pair);
    uint64_t i = 1;
    while (i < n && r[i][0] >= r[i - 1][1])
        i++;
    if (i < n) { /* runs overlap: find the first two frames that do */
        free(r);
        if (!(r = malloc(frames * sizeof *r)))
            return ckpt_seterr(CKPT_ENOMEM, "out of memory checking the index of %s", name);
        n = 0;
        for (i = 0; i < ix->count; i++)
            if (ix->entries[i].meta.stored_len > 0) {
                r[n][0] = ix->entries[i].file_offset;
                r[n][1] = ix->entries[i].file_offset + ix->entries[i].meta.stored_len;
                n++;
            }
        qsort(r, (size_t)n, sizeof *r, cmp_u64_pair);
        for (i = 1; i < n && !rc; i++)
            if (r[i][0] < r[i - 1][1])
                rc = CORRUPT("%s: frames at file offsets %llu and %llu overlap", name,
                             (unsigned long long)r[i - 1][0], (unsigned long long)r[i][0]);
    }
    free(r);
    return rc;
}

int shard_check_index(const char *name, const shard_expect *x, const shard_index *ix,
                      uint64_t index_offset)
{
    uint64_t covered_tensor = UINT32_MAX, covered = 0;
    for (uint64_t i = 0; i < ix->count; i++) {
        const shard_entry *e = &ix->entries[i];
        uint64_t at = index_offset + i * SHARD_ENTRY_SIZE, end, fend;
        if (e->tensor >= x->ntensors)
            return CORRUPT("%s: index entry %llu (offset %llu) names tensor %u of %u",
                           name, (unsigned long long)i, (unsigned long long)at,
                           e->tensor, x->ntensors);
        if (codec_check_meta(&e->meta) != CKPT_OK)
            return CORRUPT("%s: index entry %llu (offset %llu): %s", name,
                           (unsigned long long)i, (unsigned long long)at, ckpt_error_last());
        if (e->meta.raw_len == 0 || e->meta.raw_len > x->max_chunk ||
            !util_add_u64(e->offset, e->meta.raw_len, &end) ||
            end > x->tensor_bytes[e->tensor] || e->file_offset < SHARD_HEADER_SIZE ||
            !util_add_u64(e->file_offset, e->meta.stored_len, &fend) ||
            fend > index_offset)
            return CORRUPT("%s: index entry %llu (offset %llu) is out of bounds",
                           name, (unsigned long long)i, (unsigned long long)at);
        /* Sorted by (tensor, offset): each tensor must be tiled from 0. */
        if (covered_tensor != UINT32_MAX && e->tensor < covered_tensor)
            return CORRUPT("%s: index entry %llu (offset %llu) is out of order", name,
                           (unsigned long long)i, (unsigned long long)at);
        if (e->tensor != covered_tensor) {
            if (covered_tensor != UINT32_MAX &&
                covered != x->tensor_bytes[covered_tensor])
                return CORRUPT("%s: tensor %llu has %llu of %llu bytes in chunks",
                               name, (unsigned long long)covered_tensor,
                               (unsigned long long)covered,
                               (unsigned long long)x->tensor_bytes[covered_tensor]);
            covered_tensor = e->tensor;
            covered = 0;
        }
        if (e->offset != covered)
            return CORRUPT("%s: index entry %llu (offset %llu): chunk at tensor offset "
                           "%llu, expected %llu", name, (unsigned long long)i,
                           (unsigned long long)at, (unsigned long long)e->offset,
                           (unsigned long long)covered);
        covered = end;
    }
    if (covered_tensor != UINT32_MAX && covered != x->tensor_bytes[covered_tensor])
        return CORRUPT("%s: tensor %llu has %llu of %llu bytes in chunks", name,
                       (unsigned long long)covered_tensor, (unsigned long long)covered,
                       (unsigned long long)x->tensor_bytes[covered_tensor]);
    return check_no_overlap(name, ix);
}

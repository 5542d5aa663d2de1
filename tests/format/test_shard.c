/* shard layout (lib/format/shard.c): header, entry and trailer round trips,
 * and every rule a reader enforces on an index, each tried exactly at its
 * bound (accepted) and one past it (refused). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "ckpt.h"
#include "codec.h"
#include "shard.h"
#include "util.h"

static const unsigned char ID[SHARD_ID_SIZE] = "0123456789abcdef";

static void rehash(unsigned char *h)
{
    util_put_be64(h + 56, codec_hash(h, 56));
}

Test(shard, header_round_trip_and_reserved_bytes)
{
    unsigned char h[SHARD_HEADER_SIZE];
    shard_encode_header(h, 42, ID, 3);
    cr_assert_eq(shard_check_header(h, "s", 42, ID), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(util_get_u32(h + 40), 3u, "rank field");
    cr_assert_eq(shard_check_header(h, "s", 43, ID), CKPT_ECORRUPT);
    for (int off = 44; off < 56; off++) {
        unsigned char b[SHARD_HEADER_SIZE];
        memcpy(b, h, sizeof b);
        b[off] = 1;
        rehash(b);
        cr_assert_eq(shard_check_header(b, "s", 42, ID), CKPT_ECORRUPT, "reserved %d", off);
    }
    unsigned char b[SHARD_HEADER_SIZE];
    memcpy(b, h, sizeof b);
    util_put_u32(b + 12, SHARD_HEADER_SIZE + 1);
    rehash(b);
    cr_assert_eq(shard_check_header(b, "s", 42, ID), CKPT_ECORRUPT, "header size");
    memcpy(b, h, sizeof b);
    util_put_u32(b + 8, SHARD_VERSION + 1);
    rehash(b);
    cr_assert_eq(shard_check_header(b, "s", 42, ID), CKPT_EVERSION);
    memcpy(b, h, sizeof b);
    b[20] ^= 1; /* not rehashed */
    cr_assert_eq(shard_check_header(b, "s", 42, ID), CKPT_ECORRUPT);
}

Test(shard, entry_round_trip_and_reserved_bytes)
{
    shard_entry e = {7, 4096, 64, {CODEC_ZSTD_SHUFFLE, 4, 4096, 100, 0x1122334455667788ull,
                                   0x99aabbccddeeff00ull}};
    unsigned char p[SHARD_ENTRY_SIZE];
    shard_encode_entry(p, &e);
    shard_entry d;
    cr_assert_eq(shard_decode_entry(p, &d), CKPT_OK);
    cr_assert(d.tensor == e.tensor && d.offset == e.offset && d.file_offset == e.file_offset &&
              d.meta.codec == e.meta.codec && d.meta.elem == e.meta.elem &&
              d.meta.raw_len == e.meta.raw_len && d.meta.stored_len == e.meta.stored_len &&
              d.meta.stored_hash == e.meta.stored_hash && d.meta.raw_hash == e.meta.raw_hash);
    const int reserved[] = {6, 7, 56, 63};
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
        unsigned char q[SHARD_ENTRY_SIZE];
        memcpy(q, p, sizeof q);
        q[reserved[i]] = 0x80;
        cr_assert_eq(shard_decode_entry(q, &d), CKPT_ECORRUPT, "byte %d", reserved[i]);
    }
}

Test(shard, trailer_locates_the_index_exactly)
{
    unsigned char t[SHARD_TRAILER_SIZE];
    shard_trailer tr = {SHARD_HEADER_SIZE + 1000, 2, 5}, got;
    uint64_t toff = tr.index_offset + 2 * SHARD_ENTRY_SIZE;
    shard_encode_trailer(t, &tr, ID);
    cr_assert_eq(shard_decode_trailer(t, "s", toff, ID, &got), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert(got.index_offset == tr.index_offset && got.count == 2 && got.index_hash == 5);
    cr_assert_eq(shard_decode_trailer(t, "s", toff + 1, ID, &got), CKPT_ECORRUPT);
    cr_assert_eq(shard_decode_trailer(t, "s", toff - 1, ID, &got), CKPT_ECORRUPT);
    unsigned char other[SHARD_ID_SIZE] = "0123456789abcdeX";
    cr_assert_eq(shard_decode_trailer(t, "s", toff, other, &got), CKPT_ECORRUPT);
    /* The index may start right after the header, not one byte earlier. */
    shard_trailer low = {SHARD_HEADER_SIZE, 1, 0};
    shard_encode_trailer(t, &low, ID);
    cr_assert_eq(shard_decode_trailer(t, "s", SHARD_HEADER_SIZE + SHARD_ENTRY_SIZE, ID, &got),
                 CKPT_OK);
    low.index_offset = SHARD_HEADER_SIZE - 1;
    shard_encode_trailer(t, &low, ID);
    cr_assert_eq(shard_decode_trailer(t, "s", SHARD_HEADER_SIZE - 1 + SHARD_ENTRY_SIZE, ID,
                                      &got), CKPT_ECORRUPT);
    /* A count whose byte size overflows. */
    shard_trailer huge = {SHARD_HEADER_SIZE, UINT64_MAX / 8, 0};
    shard_encode_trailer(t, &huge, ID);
    cr_assert_eq(shard_decode_trailer(t, "s", 1u << 20, ID, &got), CKPT_ECORRUPT);
}

/* A valid index: tensor 0 of 10000 bytes in chunks of 4096 (zstd, raw,
 * zstd), tensor 1 of 8 bytes (raw), frames back to back from the header. */
#define CHUNK 4096u
static uint64_t tbytes[2] = {10000, 8};
static shard_entry ent[4];
static shard_index ix = {ent, 4};
static shard_expect x = {0, 0, 1, ID, 2, tbytes, CHUNK};
static uint64_t index_offset;

static void valid_index(void)
{
    uint64_t at = SHARD_HEADER_SIZE;
    const struct { uint32_t t; uint64_t off, raw, stored; uint8_t codec, elem; } v[4] = {
        {0, 0, CHUNK, 1000, CODEC_ZSTD_SHUFFLE, 4},
        {0, CHUNK, CHUNK, CHUNK, CODEC_RAW, 1},
        {0, 2 * CHUNK, 10000 - 2 * CHUNK, 700, CODEC_ZSTD_SHUFFLE, 4},
        {1, 0, 8, 8, CODEC_RAW, 1},
    };
    for (int i = 0; i < 4; i++) {
        ent[i] = (shard_entry){v[i].t, v[i].off, at,
                               {v[i].codec, v[i].elem, v[i].raw, v[i].stored, 0, 0}};
        at += v[i].stored;
    }
    index_offset = at;
}

static int check(void)
{
    return shard_check_index("s", &x, &ix, index_offset);
}

Test(shard, valid_index_passes)
{
    valid_index();
    cr_assert_eq(check(), CKPT_OK, "%s", ckpt_error_last());
}

Test(shard, each_bound_exactly_and_one_past)
{
    /* raw_len: max_chunk is allowed, one more is not */
    valid_index();
    tbytes[0] = 2 * CHUNK + CHUNK + 1;
    ent[2].meta.raw_len = CHUNK + 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "raw_len max_chunk + 1");
    tbytes[0] = 3 * CHUNK;
    ent[2].meta.raw_len = CHUNK;
    cr_assert_eq(check(), CKPT_OK, "raw_len max_chunk: %s", ckpt_error_last());
    tbytes[0] = 10000;

    /* a chunk may end at the tensor's end, not a byte past it */
    valid_index();
    ent[3].meta.raw_len = 9;
    ent[3].meta.stored_len = 9;
    cr_assert_eq(check(), CKPT_ECORRUPT, "past the tensor");

    /* frames start at the header's end at the earliest */
    valid_index();
    ent[0].file_offset = SHARD_HEADER_SIZE - 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "frame inside the header");

    /* frames end at the index at the latest */
    valid_index();
    index_offset -= 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "frame runs into the index");
    index_offset += 1;
    cr_assert_eq(check(), CKPT_OK);

    /* zstd stored length: the compress bound is allowed, one more is not */
    valid_index();
    uint64_t bound = codec_stored_bound(CODEC_ZSTD_SHUFFLE, CHUNK);
    cr_assert_eq(bound, CHUNK + (CHUNK >> 8) + (((128u << 10) - CHUNK) >> 11));
    ent[0].meta.stored_len = bound;
    uint64_t at = SHARD_HEADER_SIZE;
    for (int i = 0; i < 4; i++) {
        ent[i].file_offset = at;
        at += ent[i].meta.stored_len;
    }
    index_offset = at;
    cr_assert_eq(check(), CKPT_OK, "stored at the bound: %s", ckpt_error_last());
    ent[0].meta.stored_len = bound + 1;
    for (int i = 1; i < 4; i++)
        ent[i].file_offset += 1;
    index_offset += 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "stored bound + 1");

    /* raw chunks: stored == raw, width 1 */
    valid_index();
    ent[1].meta.stored_len = CHUNK - 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "raw with stored != raw");
    valid_index();
    ent[1].meta.elem = 2;
    cr_assert_eq(check(), CKPT_ECORRUPT, "raw with width 2");

    /* shuffle width 1..16 */
    valid_index();
    ent[0].meta.elem = CODEC_ELEM_MAX;
    cr_assert_eq(check(), CKPT_OK, "width 16: %s", ckpt_error_last());
    ent[0].meta.elem = CODEC_ELEM_MAX + 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "width 17");
    ent[0].meta.elem = 0;
    cr_assert_eq(check(), CKPT_ECORRUPT, "width 0");

    /* codec ids: the last known one passes, the next is unknown */
    valid_index();
    ent[0].meta.codec = CODEC_ZSTD_SHUFFLE + 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "unknown codec");

    /* tensor index: ntensors - 1 passes (tensor 1), ntensors does not */
    valid_index();
    ent[3].tensor = 2;
    cr_assert_eq(check(), CKPT_ECORRUPT, "tensor out of range");
}

Test(shard, tiling_order_and_aliasing)
{
    valid_index();
    ent[1].offset += 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "gap in the tiling");

    valid_index();
    shard_entry t = ent[0];
    ent[0] = ent[3];
    ent[3] = t;
    cr_assert_eq(check(), CKPT_ECORRUPT, "out of order");

    /* two entries pointing at one frame (same stored bytes) */
    valid_index();
    ent[2].file_offset = ent[0].file_offset;
    ent[2].meta.stored_len = ent[0].meta.stored_len;
    cr_assert_eq(check(), CKPT_ECORRUPT, "aliased frames");
    cr_assert(strstr(ckpt_error_last(), "overlap"), "%s", ckpt_error_last());

    /* frames touching end to start do not overlap */
    valid_index();
    cr_assert_eq(ent[1].file_offset, ent[0].file_offset + ent[0].meta.stored_len);
    cr_assert_eq(check(), CKPT_OK);
    ent[1].file_offset -= 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "one byte of overlap");

    /* frames in another order than the file's pass when disjoint (the
     * sorted check), and fail when two of them then overlap */
    valid_index();
    uint64_t first = ent[0].file_offset;
    ent[0].file_offset = ent[3].file_offset + ent[3].meta.stored_len - ent[0].meta.stored_len;
    ent[3].file_offset = first;
    ent[1].file_offset -= ent[0].meta.stored_len - ent[3].meta.stored_len;
    ent[2].file_offset -= ent[0].meta.stored_len - ent[3].meta.stored_len;
    cr_assert_eq(check(), CKPT_OK, "disjoint frames out of file order: %s", ckpt_error_last());
    ent[3].file_offset += 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "overlap out of file order");
    cr_assert(strstr(ckpt_error_last(), "overlap"), "%s", ckpt_error_last());

    /* runs of frames back to back (a batch each), the second run first in
     * the file: disjoint passes; one byte of overlap between the runs is
     * named by the two frames that share it, not by the runs */
    valid_index();
    uint64_t h = SHARD_HEADER_SIZE, s0 = ent[0].meta.stored_len, s2 = ent[2].meta.stored_len;
    ent[2].file_offset = h;
    ent[3].file_offset = h + s2;
    ent[0].file_offset = h + s2 + 8;
    ent[1].file_offset = h + s2 + 8 + s0;
    cr_assert_eq(check(), CKPT_OK, "two disjoint runs out of file order: %s", ckpt_error_last());
    ent[0].file_offset -= 1;
    ent[1].file_offset -= 1;
    cr_assert_eq(check(), CKPT_ECORRUPT, "two runs sharing a byte");
    char want[128];
    snprintf(want, sizeof want, "frames at file offsets %llu and %llu overlap",
             (unsigned long long)(h + s2), (unsigned long long)(h + s2 + 7));
    cr_assert(strstr(ckpt_error_last(), want), "%s (wanted: %s)", ckpt_error_last(), want);
}

Test(shard, file_name)
{
    char name[SHARD_NAME_SIZE];
    shard_file_name(0, name);
    cr_assert_str_eq(name, "rank-00000.shard");
    shard_file_name(123456, name);
    cr_assert_str_eq(name, "rank-123456.shard");
}

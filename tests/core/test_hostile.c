/* Hostile checkpoints: files whose checksums are all recomputed to match,
 * so only validation stands between them and the reader.  Every case must
 * be refused with a clear status and message (and, under the sanitizers,
 * without a single out-of-bounds access), and the previous step must still
 * restore. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "codec.h"
#include "shard.h"
#include "util.h"

#define N 6000
static char root[64];
static char mpath[256], spath[256];
static float data1[N], data2[N];

static void setup(void)
{
    strcpy(root, "/tmp/ckpt-hostile-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    ckpt_store *s;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.chunk_bytes = 4096;
    o.fsync = 0;
    cr_assert_eq(ckpt_store_open(&s, root, &o), CKPT_OK);
    for (int i = 0; i < N; i++) {
        data1[i] = (float)i;
        data2[i] = (float)-i;
    }
    int64_t shape[1] = {N};
    ckpt_tensor t = {"w", data1, sizeof data1, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    cr_assert_eq(ckpt_save_sync(s, 1, &t, 1, NULL), CKPT_OK);
    t.data = data2;
    cr_assert_eq(ckpt_save_sync(s, 2, &t, 1, NULL), CKPT_OK);
    ckpt_store_free(s);
    snprintf(mpath, sizeof mpath, "%s/step-000000000002/manifest.json", root);
    snprintf(spath, sizeof spath, "%s/step-000000000002/rank-00000.shard", root);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_assert_eq(system(cmd), 0);
}

static json_t *load_manifest(void)
{
    json_error_t e;
    json_t *m = json_load_file(mpath, 0, &e);
    cr_assert_not_null(m, "%s", e.text);
    json_object_del(m, "checksum");
    return m;
}

/* Write the manifest back with a correct checksum (docs/FORMAT.md). */
static void store_manifest(json_t *m)
{
    char *body = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    size_t blen = strlen(body) - 2; /* drop "\n}" */
    char hex[17];
    util_hex64(codec_hash(body, blen), hex);
    FILE *f = fopen(mpath, "wb");
    fprintf(f, "%.*s,\n  \"checksum\": \"%s\"\n}\n", (int)blen, body, hex);
    fclose(f);
    free(body);
    json_decref(m);
}

static json_t *tensor0(json_t *m)
{
    return json_array_get(json_object_get(m, "tensors"), 0);
}

/* The damaged step 2 is refused; a restore falls back to step 1 exactly. */
static void expect_refused(const char *what)
{
    ckpt_store *s;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.flags = CKPT_OPEN_READONLY;
    cr_assert_eq(ckpt_store_open(&s, root, &o), CKPT_OK);
    int rc = ckpt_verify(s, 2, CKPT_VERIFY_FULL, NULL);
    cr_assert(rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE || rc == CKPT_EVERSION,
              "%s: verify gave %d (%s)", what, rc, ckpt_error_last());
    cr_assert_neq(ckpt_error_last()[0], '\0', "%s: no message", what);
    static float out[N];
    int64_t shape[1] = {N};
    ckpt_tensor t = {"w", out, sizeof out, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    ckpt_report *r;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &t, 1, NULL, &r), CKPT_OK, "%s: %s", what,
                 ckpt_error_last());
    cr_assert_eq(ckpt_report_step(r), 1, "%s", what);
    cr_assert_eq(ckpt_report_count(r), 1);
    cr_assert_arr_eq(out, data1, sizeof data1, "%s: fallback data differs", what);
    ckpt_report_free(r);
    ckpt_store_free(s);
}

TestSuite(hostile, .init = setup, .fini = teardown);

Test(hostile, manifest_huge_shape_overflows)
{
    json_t *m = load_manifest(), *t = tensor0(m);
    json_object_set_new(t, "shape", json_pack("[I]", (json_int_t)4611686018427387904LL));
    json_object_set_new(t, "bytes", json_integer(0));
    store_manifest(m);
    expect_refused("shape overflow");
}

Test(hostile, manifest_bytes_disagree_with_shape)
{
    json_t *m = load_manifest();
    json_object_set_new(tensor0(m), "bytes", json_integer(N * 8));
    store_manifest(m);
    expect_refused("bytes vs shape");
}

Test(hostile, manifest_shard_path_escapes)
{
    json_t *m = load_manifest();
    json_t *sh = json_array_get(json_object_get(m, "shards"), 0);
    json_object_set_new(sh, "file", json_string("../step-000000000001/rank-00000.shard"));
    store_manifest(m);
    expect_refused("path traversal");
}

Test(hostile, manifest_shard_index_out_of_range)
{
    json_t *m = load_manifest();
    json_object_set_new(tensor0(m), "shard", json_integer(7));
    store_manifest(m);
    expect_refused("shard index");
}

Test(hostile, manifest_duplicate_names)
{
    json_t *m = load_manifest();
    json_t *ts = json_object_get(m, "tensors");
    json_array_append_new(ts, json_deep_copy(tensor0(m)));
    store_manifest(m);
    expect_refused("duplicate names");
}

Test(hostile, manifest_unknown_dtype_and_dims)
{
    json_t *m = load_manifest();
    json_object_set_new(tensor0(m), "dtype", json_string("float128"));
    store_manifest(m);
    expect_refused("dtype");
    m = load_manifest();
    json_t *shape = json_array();
    for (int i = 0; i < 17; i++)
        json_array_append_new(shape, json_integer(1));
    json_object_set_new(tensor0(m), "shape", shape);
    store_manifest(m);
    expect_refused("17 dims");
}

Test(hostile, manifest_wrong_types_and_version)
{
    json_t *m = load_manifest();
    json_object_set_new(m, "tensors", json_string("many"));
    store_manifest(m);
    expect_refused("tensors type");
    m = load_manifest();
    json_object_set_new(m, "format_version", json_integer(99));
    store_manifest(m);
    expect_refused("version");
    m = load_manifest();
    json_object_set_new(m, "step", json_integer(1));
    store_manifest(m);
    expect_refused("step of another directory");
    m = load_manifest();
    json_object_set_new(json_object_get(m, "save"), "chunk_bytes", json_integer(0));
    store_manifest(m);
    expect_refused("chunk_bytes 0");
    m = load_manifest(); /* readers size buffers by it: no 2 GiB chunks */
    json_object_set_new(json_object_get(m, "save"), "chunk_bytes", json_integer(1LL << 31));
    store_manifest(m);
    expect_refused("chunk_bytes 2^31");
    m = load_manifest();
    json_object_set_new(json_object_get(m, "save"), "chunk_bytes", json_integer(4097));
    store_manifest(m);
    expect_refused("chunk_bytes not a multiple of 16");
    m = load_manifest();
    json_object_set_new(m, "checkpoint_id", json_string("-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1"));
    store_manifest(m);
    expect_refused("checkpoint_id not hex");
}

Test(hostile, manifest_chunk_accounting)
{
    json_t *m = load_manifest();
    json_object_set_new(tensor0(m), "stored_bytes", json_integer(1));
    store_manifest(m);
    expect_refused("stored bytes");
    m = load_manifest();
    json_object_set_new(tensor0(m), "chunks", json_integer(1));
    store_manifest(m);
    expect_refused("chunk count");
}

/* ---- index entries rewritten with a matching index checksum */

typedef void (*entry_fn)(unsigned char *entry, uint64_t index_offset);

static void rewrite_entry(int which, entry_fn fn)
{
    FILE *f = fopen(spath, "r+b");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    unsigned char t[SHARD_TRAILER_SIZE];
    fseek(f, size - SHARD_TRAILER_SIZE, SEEK_SET);
    cr_assert_eq(fread(t, 1, sizeof t, f), sizeof t);
    uint64_t ioff = util_get_u64(t), count = util_get_u64(t + 8);
    size_t ilen = (size_t)count * SHARD_ENTRY_SIZE;
    unsigned char *ix = malloc(ilen);
    fseek(f, (long)ioff, SEEK_SET);
    cr_assert_eq(fread(ix, 1, ilen, f), ilen);
    fn(ix + (size_t)which * SHARD_ENTRY_SIZE, ioff);
    uint64_t h = codec_hash(ix, ilen);
    util_put_be64(t + 16, h);
    fseek(f, (long)ioff, SEEK_SET);
    fwrite(ix, 1, ilen, f);
    fwrite(t, 1, sizeof t, f);
    fclose(f);
    free(ix);
    json_t *m = load_manifest();
    char hex[17];
    util_hex64(h, hex);
    json_object_set_new(json_array_get(json_object_get(m, "shards"), 0), "index_xxh3",
                        json_string(hex));
    store_manifest(m);
}

static void into_index(unsigned char *e, uint64_t ioff) { util_put_u64(e + 32, ioff - 8); }
static void past_end(unsigned char *e, uint64_t ioff) { util_put_u64(e + 32, UINT64_MAX - 4); (void)ioff; }
static void huge_raw(unsigned char *e, uint64_t ioff) { util_put_u64(e + 16, 1ull << 40); (void)ioff; }
static void huge_stored(unsigned char *e, uint64_t ioff) { util_put_u64(e + 24, 1ull << 62); (void)ioff; }
static void bad_tensor(unsigned char *e, uint64_t ioff) { util_put_u32(e, 3); (void)ioff; }
static void gap(unsigned char *e, uint64_t ioff) { util_put_u64(e + 8, util_get_u64(e + 8) + 4); (void)ioff; }
static void bad_codec(unsigned char *e, uint64_t ioff) { e[4] = 7; (void)ioff; }
static void wide_shuffle(unsigned char *e, uint64_t ioff) { e[5] = 200; (void)ioff; }
static void shorter_raw(unsigned char *e, uint64_t ioff) { util_put_u64(e + 16, util_get_u64(e + 16) - 4); (void)ioff; }

Test(hostile, index_frame_overlaps_index) { rewrite_entry(0, into_index); expect_refused("frame in index"); }
Test(hostile, index_offset_wraps) { rewrite_entry(1, past_end); expect_refused("offset wraps"); }
Test(hostile, index_raw_length_huge) { rewrite_entry(0, huge_raw); expect_refused("raw length"); }
Test(hostile, index_stored_length_huge) { rewrite_entry(2, huge_stored); expect_refused("stored length"); }
Test(hostile, index_tensor_out_of_range) { rewrite_entry(1, bad_tensor); expect_refused("tensor index"); }
Test(hostile, index_chunks_leave_a_gap) { rewrite_entry(3, gap); expect_refused("tiling"); }
Test(hostile, index_unknown_codec) { rewrite_entry(0, bad_codec); expect_refused("codec"); }
Test(hostile, index_shuffle_width) { rewrite_entry(0, wide_shuffle); expect_refused("width"); }
Test(hostile, index_raw_shorter_than_frame) { rewrite_entry(0, shorter_raw); expect_refused("raw shorter"); }

/* Round trips: every dtype and awkward size through ckpt_restore, ckpt_load
 * and ckpt_checkpoint_read; chunking, incompressible data, many tensors,
 * multi-pass saves; save statistics; asynchronous save semantics. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "reader.h"

TestSuite(roundtrip, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

static const struct {
    ckpt_dtype dtype;
    size_t size;
    const char *name;
} dtypes[] = {
    {CKPT_BOOL, 1, "bool"},       {CKPT_U8, 1, "uint8"},
    {CKPT_I8, 1, "int8"},         {CKPT_U16, 2, "uint16"},
    {CKPT_I16, 2, "int16"},       {CKPT_U32, 4, "uint32"},
    {CKPT_I32, 4, "int32"},       {CKPT_U64, 8, "uint64"},
    {CKPT_I64, 8, "int64"},       {CKPT_F16, 2, "float16"},
    {CKPT_BF16, 2, "bfloat16"},   {CKPT_F32, 4, "float32"},
    {CKPT_F64, 8, "float64"},     {CKPT_C64, 8, "complex64"},
    {CKPT_C128, 16, "complex128"}, {CKPT_F8_E4M3, 1, "float8_e4m3fn"},
    {CKPT_F8_E5M2, 1, "float8_e5m2"}, {CKPT_BYTES, 1, "bytes"},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

/* Shapes tried for every dtype. */
static const struct {
    const char *tag;
    int ndim;
    int64_t shape[3];
} shapes[] = {
    {"scalar", 0, {0}},     {"empty", 1, {0}},        {"one", 1, {1}},
    {"three", 1, {3}},      {"four", 1, {4}},         {"page1", 1, {4097}},
    {"cube", 3, {3, 5, 7}}, {"hollow", 3, {4, 0, 3}},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

Test(roundtrip, dtype_table)
{
    cr_assert_eq((size_t)CKPT_DTYPE_COUNT_ - 1, N_DTYPES);
    for (size_t i = 0; i < N_DTYPES; i++) {
        cr_assert_eq(ckpt_dtype_size(dtypes[i].dtype), dtypes[i].size,
                     "size of %s", dtypes[i].name);
        const char *nm = ckpt_dtype_name(dtypes[i].dtype);
        cr_assert(tc_nonempty(nm), "dtype %d has no name", (int)dtypes[i].dtype);
        cr_assert_eq(ckpt_dtype_from_name(nm), dtypes[i].dtype, "from_name(%s)", nm);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(nm, ckpt_dtype_name(dtypes[j].dtype));
    }
    cr_assert_eq(ckpt_dtype_size(CKPT_DTYPE_INVALID), 0);
    cr_assert_eq(ckpt_dtype_size(CKPT_DTYPE_COUNT_), 0);
    cr_assert_eq(ckpt_dtype_size((ckpt_dtype)1000), 0);
    cr_assert_null(ckpt_dtype_name(CKPT_DTYPE_INVALID));
    cr_assert_null(ckpt_dtype_name((ckpt_dtype)1000));
    cr_assert_eq(ckpt_dtype_from_name("no-such-type"), CKPT_DTYPE_INVALID);
    cr_assert_eq(ckpt_dtype_from_name(""), CKPT_DTYPE_INVALID);
    cr_assert_eq(ckpt_dtype_from_name(NULL), CKPT_DTYPE_INVALID);
    cr_assert_str_eq(ckpt_dtype_name(CKPT_F32), "float32");
    cr_assert_str_eq(ckpt_dtype_name(CKPT_BF16), "bfloat16");
    cr_assert_str_eq(ckpt_dtype_name(CKPT_BOOL), "bool");
}

static void build_all_dtypes(tc_state *s)
{
    tc_state_init(s);
    char name[96];
    uint64_t seed = 1;
    for (size_t i = 0; i < N_DTYPES; i++)
        for (size_t j = 0; j < N_SHAPES; j++) {
            snprintf(name, sizeof name, "%s/%s", dtypes[i].name, shapes[j].tag);
            tc_state_add(s, name, dtypes[i].dtype, shapes[j].ndim, shapes[j].shape,
                         TC_RANDOM, seed++);
        }
}

/* Compare a tensor's description with the tensor that was saved. */
static void check_info(const ckpt_tensor_info *info, const ckpt_tensor *t)
{
    cr_assert_eq(info->dtype, t->dtype, "%s: dtype %d, want %d", t->name,
                 (int)info->dtype, (int)t->dtype);
    cr_assert_eq(info->ndim, t->ndim, "%s: ndim %d, want %d", t->name, info->ndim,
                 t->ndim);
    for (int d = 0; d < t->ndim; d++)
        cr_assert_eq(info->shape[d], t->shape[d], "%s: dim %d", t->name, d);
    cr_assert_eq(info->bytes, t->bytes, "%s: bytes %" PRIu64 ", want %" PRIu64,
                 t->name, info->bytes, t->bytes);
}

Test(roundtrip, every_dtype_and_shape)
{
    tc_state s;
    build_all_dtypes(&s);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 5, &s);

    /* ckpt_restore, explicit and latest */
    tc_restore_check(st, 5, &s);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s), 5);

    /* ckpt_load */
    for (size_t i = 0; i < s.count; i++) {
        const ckpt_tensor *t = &s.t[i];
        void *data = NULL;
        uint64_t bytes = 12345;
        ckpt_tensor_info info;
        memset(&info, 0x7f, sizeof info);
        int rc = ckpt_load(st, 5, t->name, &data, &bytes, &info);
        cr_assert_eq(rc, CKPT_OK, "ckpt_load(%s) = %d: %s", t->name, rc,
                     ckpt_error_last());
        cr_assert_eq(bytes, t->bytes, "ckpt_load(%s) bytes", t->name);
        cr_assert(bytes == 0 || data, "ckpt_load(%s) gave no buffer", t->name);
        if (bytes)
            cr_assert(memcmp(data, t->data, bytes) == 0, "ckpt_load(%s) data", t->name);
        cr_assert_null(info.name, "ckpt_load must set info.name to NULL");
        check_info(&info, t);
        ckpt_free(data);
    }

    /* ckpt_checkpoint_* */
    ckpt_checkpoint *ck = NULL;
    int rc = ckpt_checkpoint_open(&ck, st, 5, CKPT_VERIFY_QUICK);
    cr_assert_eq(rc, CKPT_OK, "checkpoint_open: %s", ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_step(ck), 5);
    cr_assert_eq(ckpt_checkpoint_tensor_count(ck), s.count);
    for (size_t i = 0; i < s.count; i++) {
        const ckpt_tensor *t = &s.t[i];
        size_t idx = (size_t)-1;
        cr_assert_eq(ckpt_checkpoint_find(ck, t->name, &idx), CKPT_OK, "find %s", t->name);
        cr_assert_lt(idx, s.count);
        ckpt_tensor_info info;
        cr_assert_eq(ckpt_checkpoint_tensor(ck, idx, &info), CKPT_OK);
        cr_assert_str_eq(info.name, t->name);
        check_info(&info, t);
        void *buf = malloc(t->bytes + 1);
        memset(buf, 0xEE, t->bytes + 1);
        rc = ckpt_checkpoint_read(ck, t->name, buf, t->bytes);
        cr_assert_eq(rc, CKPT_OK, "checkpoint_read(%s) = %d: %s", t->name, rc,
                     ckpt_error_last());
        cr_assert(memcmp(buf, t->data, t->bytes) == 0, "checkpoint_read(%s) data",
                  t->name);
        cr_assert_eq(((unsigned char *)buf)[t->bytes], 0xEE,
                     "checkpoint_read(%s) wrote past the buffer", t->name);
        free(buf);
    }
    /* every tensor listed exactly once */
    for (size_t i = 0; i < s.count; i++) {
        ckpt_tensor_info info;
        cr_assert_eq(ckpt_checkpoint_tensor(ck, i, &info), CKPT_OK);
        size_t idx;
        cr_assert_eq(ckpt_checkpoint_find(ck, info.name, &idx), CKPT_OK);
        cr_assert_eq(idx, i, "find(%s) = %zu, listed at %zu", info.name, idx, i);
    }
    ckpt_tensor_info info;
    cr_assert_neq(ckpt_checkpoint_tensor(ck, s.count, &info), CKPT_OK,
                  "index past the end must fail");
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);

    /* and again from a fresh read-only handle */
    st = tc_open_ro(tc_root);
    tc_restore_check(st, 5, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* Restoring a subset, in another order, works: tensors are matched by name. */
Test(roundtrip, subset_any_order)
{
    tc_state s, sub;
    tc_state_standard(&s, 3);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    tc_state_init(&sub);
    for (size_t i = s.count; i-- > 0;)
        if (i % 2 == 0) {
            ckpt_tensor *t = tc_state_add(&sub, s.t[i].name, s.t[i].dtype, s.t[i].ndim,
                                          s.t[i].shape, TC_CONST, 0);
            memcpy(t->data, s.t[i].data, t->bytes);
        }
    tc_restore_check(st, 1, &sub);
    tc_state_free(&sub);
    tc_state_free(&s);
    ckpt_store_free(st);
}

/* Two names for one buffer (tied weights) restore as load_state_dict
 * would: the name given last is written into it, every chunk of both is
 * checked, and the newest step is not mistaken for a damaged one (workers
 * writing one buffer at once broke each other's hashes); two targets that
 * overlap otherwise are refused, naming both, before anything is read. */
Test(roundtrip, one_buffer_under_two_names)
{
    const int64_t shape[1] = {1 << 18}; /* 1 MiB of float32: several chunks */
    tc_state s1, s2;
    tc_state_init(&s1);
    tc_state_init(&s2);
    tc_state_add(&s1, "a", CKPT_F32, 1, shape, TC_RANDOM, 1);
    tc_state_add(&s1, "b", CKPT_F32, 1, shape, TC_RANDOM, 1);
    tc_state_add(&s2, "a", CKPT_F32, 1, shape, TC_RANDOM, 2); /* random: stored raw */
    tc_state_add(&s2, "b", CKPT_F32, 1, shape, TC_RANDOM, 3);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s1);
    tc_save_ok(st, 2, &s2);
    size_t bytes = s2.t[0].bytes;
    unsigned char *w = malloc(bytes);
    ckpt_tensor t[2] = {s2.t[0], s2.t[1]};
    t[0].data = t[1].data = w;
    ckpt_report *r = NULL;
    for (int rep = 0; rep < 5; rep++) {
        memset(w, 0, bytes);
        cr_assert_eq(ckpt_restore(st, CKPT_LATEST, t, 2, NULL, &r), CKPT_OK, "%s",
                     ckpt_error_last());
        cr_assert_eq(ckpt_report_step(r), 2, "restored step %lld",
                     (long long)ckpt_report_step(r));
        cr_assert_eq(ckpt_report_count(r), 0, "a step skipped: %s",
                     ckpt_report_get(r, 0)->message);
        ckpt_report_free(r);
        cr_assert(memcmp(w, s2.t[1].data, bytes) == 0, "the buffer does not hold 'b'");
    }
    /* the other order: 'a' is written last */
    t[0] = s2.t[1];
    t[1] = s2.t[0];
    t[0].data = t[1].data = w;
    cr_assert_eq(ckpt_restore(st, 2, t, 2, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert(memcmp(w, s2.t[0].data, bytes) == 0, "the buffer does not hold 'a'");
    char *dir = tc_step_dir(tc_root, 2);
    char *shard = tc_find_suffix(dir, ".shard");
    /* overlapping otherwise: refused, naming both */
    unsigned char *big = malloc(bytes + 4096);
    t[0] = s2.t[0];
    t[1] = s2.t[1];
    t[0].data = big;
    t[1].data = big + 4096;
    memset(big, 0x5a, bytes + 4096);
    cr_assert_eq(ckpt_restore(st, 2, t, 2, NULL, NULL), CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), "'a' and 'b' overlap in memory"), "%s",
              ckpt_error_last());
    for (size_t i = 0; i < bytes + 4096; i++)
        cr_assert_eq(big[i], 0x5a, "byte %zu written by a refused restore", i);
    /* tied targets never hide damage: flip a byte of the step's shard (of
     * 'a' or 'b'), and the restore of step 2 fails whichever name it hit */
    tc_flip_byte(shard, 100);
    t[0] = s2.t[0];
    t[1] = s2.t[1];
    t[0].data = t[1].data = w;
    cr_assert_eq(ckpt_restore(st, 2, t, 2, NULL, NULL), CKPT_ECORRUPT, "%s",
                 ckpt_error_last());
    free(big);
    free(shard);
    free(dir);
    free(w);
    ckpt_store_free(st);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

static uint64_t save_stats(ckpt_store *st, int64_t step, const tc_state *s,
                           ckpt_save_stats *stats)
{
    ckpt_save *sv = NULL;
    int rc = ckpt_save_begin(&sv, st, step, s->t, s->count, NULL);
    cr_assert_eq(rc, CKPT_OK, "save_begin: %s", ckpt_error_last());
    rc = ckpt_save_wait(sv);
    cr_assert_eq(rc, CKPT_OK, "save_wait: %s", ckpt_error_last());
    cr_assert_eq(ckpt_save_done(sv), 1);
    cr_assert_eq(ckpt_save_stats_get(sv, stats), CKPT_OK);
    ckpt_save_free(sv);
    cr_assert_eq(stats->step, step);
    cr_assert_eq(stats->raw_bytes, tc_state_bytes(s), "raw_bytes %" PRIu64 ", want %" PRIu64,
                 stats->raw_bytes, tc_state_bytes(s));
    cr_assert_gt(stats->stored_bytes, 0);
    cr_assert_geq(stats->stall_s, 0.0);
    cr_assert_geq(stats->persist_s, 0.0);
    return stats->stored_bytes;
}

/* Tensors much larger than a chunk, compressible and not. */
Test(roundtrip, larger_than_chunk)
{
    const uint64_t chunk = 64 * 1024;
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = chunk;
    /* Sizes below assume compression: without fsync the disk looks free
     * and the adaptive default would store chunks raw (test_adapt.c). */
    o.flags |= CKPT_OPEN_COMPRESS_ALL;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());

    tc_state s;
    tc_state_init(&s);
    int64_t big[1] = {3 * 1024 * 1024}, odd[1] = {3 * 1024 * 1024 + 17},
            f32[2] = {1024, 769};
    tc_state_add(&s, "random", CKPT_U8, 1, big, TC_RANDOM, 11);
    tc_state_add(&s, "smooth", CKPT_U8, 1, big, TC_COMPRESSIBLE, 12);
    tc_state_add(&s, "random.odd", CKPT_BYTES, 1, odd, TC_RANDOM, 13);
    tc_state_add(&s, "random.f32", CKPT_F32, 2, f32, TC_RANDOM, 14);

    ckpt_save_stats stats;
    save_stats(st, 1, &s, &stats);
    uint64_t min_chunks = 0;
    for (size_t i = 0; i < s.count; i++)
        min_chunks += (s.t[i].bytes + chunk - 1) / chunk;
    cr_assert_geq(stats.chunks, min_chunks, "%" PRIu64 " chunks for %" PRIu64
                  " of %" PRIu64 "-byte chunks", stats.chunks, tc_state_bytes(&s), chunk);

    tc_restore_check(st, 1, &s);

    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_stats cs;
    cr_assert_eq(ckpt_checkpoint_stats(ck, &cs), CKPT_OK);
    cr_assert_eq(cs.raw_bytes, stats.raw_bytes);
    cr_assert_eq(cs.chunks, stats.chunks);
    cr_assert_eq(cs.stored_bytes, stats.stored_bytes);
    for (size_t i = 0; i < s.count; i++) {
        ckpt_tensor_info info;
        size_t idx;
        cr_assert_eq(ckpt_checkpoint_find(ck, s.t[i].name, &idx), CKPT_OK);
        cr_assert_eq(ckpt_checkpoint_tensor(ck, idx, &info), CKPT_OK);
        uint64_t want_chunks = (s.t[i].bytes + chunk - 1) / chunk;
        cr_assert_eq(info.chunks, want_chunks, "%s: %" PRIu64 " chunks, want %" PRIu64,
                     s.t[i].name, info.chunks, want_chunks);
        if (strcmp(s.t[i].name, "smooth") == 0)
            cr_assert_lt(info.stored_bytes, info.bytes / 4,
                         "compressible tensor stored in %" PRIu64 " bytes",
                         info.stored_bytes);
        else /* incompressible: stored raw, a small overhead per frame at most */
            cr_assert_leq(info.stored_bytes, info.bytes + 64 * info.chunks,
                          "%s: random data stored in %" PRIu64 " bytes for %" PRIu64,
                          s.t[i].name, info.stored_bytes, info.bytes);
    }
    ckpt_checkpoint_free(ck);

    /* ckpt_load of a multi-chunk tensor */
    void *data = NULL;
    uint64_t bytes = 0;
    cr_assert_eq(ckpt_load(st, CKPT_LATEST, "random.odd", &data, &bytes, NULL), CKPT_OK,
                 "%s", ckpt_error_last());
    cr_assert_eq(bytes, s.t[2].bytes);
    cr_assert(memcmp(data, s.t[2].data, bytes) == 0);
    ckpt_free(data);

    ckpt_store_free(st);
    tc_state_free(&s);
}

Test(roundtrip, thousands_of_tiny_tensors)
{
    tc_state s;
    tc_state_init(&s);
    char name[32];
    for (int i = 0; i < 3000; i++) {
        int64_t n[1] = {1 + i % 7};
        snprintf(name, sizeof name, "layer.%04d.p", i);
        tc_state_add(&s, name, (ckpt_dtype)(CKPT_BOOL + i % (int)N_DTYPES),
                     i % 5 == 0 ? 0 : 1, n, TC_RANDOM, (uint64_t)i);
    }
    ckpt_store *st = tc_open(tc_root);
    ckpt_save_stats stats;
    save_stats(st, 9, &s, &stats);
    tc_restore_check(st, 9, &s);
    /* Another store has not cached the manifest: it decodes the file. */
    ckpt_store *ro = tc_open_ro(tc_root);
    tc_restore_check(ro, 9, &s);
    ckpt_store_free(ro);

    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, CKPT_LATEST, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_tensor_count(ck), 3000);
    size_t idx;
    cr_assert_eq(ckpt_checkpoint_find(ck, "layer.2999.p", &idx), CKPT_OK);
    void *buf = malloc(s.t[2999].bytes);
    cr_assert_eq(ckpt_checkpoint_read(ck, "layer.2999.p", buf, s.t[2999].bytes), CKPT_OK);
    cr_assert(memcmp(buf, s.t[2999].data, s.t[2999].bytes) == 0);
    free(buf);

    /* All their descriptions in one call, as one by one. */
    ckpt_tensor_info *infos = calloc(s.count, sizeof *infos);
    cr_assert_not_null(infos);
    cr_assert_eq(ckpt_checkpoint_tensors(ck, 0, s.count, infos), CKPT_OK, "%s",
                 ckpt_error_last());
    for (size_t i = 0; i < s.count; i++) {
        cr_assert_str_eq(infos[i].name, s.t[i].name);
        check_info(&infos[i], &s.t[i]);
    }
    cr_assert_eq(ckpt_checkpoint_tensors(ck, 2990, 10, infos), CKPT_OK);
    cr_assert_str_eq(infos[9].name, "layer.2999.p");
    cr_assert_eq(ckpt_checkpoint_tensors(ck, 2990, 11, infos), CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), "out of range"), "%s", ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_tensors(ck, 3001, 0, infos), CKPT_EINVAL);
    int rank = -1; /* one process: world 1, every tensor rank 0's */
    cr_assert_eq(ckpt_checkpoint_world_size(ck), 1);
    cr_assert_eq(ckpt_checkpoint_tensor_rank(ck, 2999, &rank), CKPT_OK);
    cr_assert_eq(rank, 0);
    cr_assert_eq(ckpt_checkpoint_tensor_rank(ck, 3000, &rank), CKPT_EINVAL);
    cr_assert_eq(ckpt_checkpoint_tensors(ck, 3000, 0, NULL), CKPT_OK);
    free(infos);

    /* All of them in one ckpt_checkpoint_restore, into fresh buffers (in
     * reverse order: matched by name, not position). */
    ckpt_tensor *into = calloc(s.count, sizeof *into);
    cr_assert_not_null(into);
    for (size_t i = 0; i < s.count; i++) {
        into[i] = s.t[s.count - 1 - i];
        into[i].data = into[i].bytes ? malloc(into[i].bytes) : NULL;
        if (into[i].bytes)
            memset(into[i].data, 0xEE, into[i].bytes);
    }
    cr_assert_eq(ckpt_checkpoint_restore(ck, into, s.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    for (size_t i = 0; i < s.count; i++)
        cr_assert(into[i].bytes == 0 ||
                      memcmp(into[i].data, s.t[s.count - 1 - i].data, into[i].bytes) == 0,
                  "ckpt_checkpoint_restore: %s differs", into[i].name);
    /* A wrong dtype is refused naming the tensor; so is a name not saved,
     * unless allow_missing. */
    ckpt_tensor bad = into[1];
    bad.dtype = bad.dtype == CKPT_U8 ? CKPT_I8 : CKPT_U8;
    bad.bytes = 1; /* of a one-byte dtype: its element count */
    for (int d = 0; d < bad.ndim; d++)
        bad.bytes *= (uint64_t)bad.shape[d];
    cr_assert_eq(ckpt_checkpoint_restore(ck, &bad, 1, NULL), CKPT_EMISMATCH);
    cr_assert(strstr(ckpt_error_last(), bad.name), "%s", ckpt_error_last());
    ckpt_tensor absent = into[0];
    absent.name = "not.saved";
    cr_assert_eq(ckpt_checkpoint_restore(ck, &absent, 1, NULL), CKPT_ENOTFOUND);
    cr_assert(strstr(ckpt_error_last(), "not.saved"), "%s", ckpt_error_last());
    ckpt_restore_options missing_ok;
    ckpt_restore_options_init(&missing_ok, CKPT_RESTORE_OPTIONS_VERSION);
    missing_ok.allow_missing = 1;
    cr_assert_eq(ckpt_checkpoint_restore(ck, &absent, 1, &missing_ok), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_restore(NULL, into, 1, NULL), CKPT_EINVAL);
    for (size_t i = 0; i < s.count; i++)
        free(into[i].data);
    free(into);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* A host memory limit far below the state forces a save in several passes. */
Test(roundtrip, multi_pass_save)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 64 * 1024;
    o.host_memory_limit = 256 * 1024;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_init(&s);
    int64_t a[1] = {1024 * 1024}, b[2] = {512, 1025}, c[1] = {700 * 1024};
    tc_state_add(&s, "a", CKPT_F32, 1, a, TC_RANDOM, 1);         /* 4 MiB */
    tc_state_add(&s, "b", CKPT_F64, 2, b, TC_COMPRESSIBLE, 2);   /* ~4 MiB */
    tc_state_add(&s, "c", CKPT_U8, 1, c, TC_RANDOM, 3);
    ckpt_save_stats stats;
    save_stats(st, 2, &s, &stats);
    tc_restore_check(st, 2, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* Tensors that are views of one buffer (copied into the snapshot as one
 * run) in a save of several passes: every pass must hold its own bytes,
 * and the chunks come back in the right tensors. */
Test(roundtrip, views_of_one_buffer_in_passes)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 16 * 1024;
    o.host_memory_limit = 40 * 1024; /* 2.5 chunks: runs are cut mid-tensor */
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    enum { T = 40, EACH = 12 * 1024 }; /* tensors straddle chunks of the arena */
    unsigned char *buf = malloc(T * EACH), *back = calloc(T, EACH);
    cr_assert(buf && back);
    for (size_t i = 0; i < (size_t)T * EACH; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    ckpt_tensor t[T], r[T];
    char names[T][16];
    int64_t shape[1] = {EACH};
    for (int i = 0; i < T; i++) {
        snprintf(names[i], sizeof names[i], "v%02d", i);
        t[i] = (ckpt_tensor){names[i], buf + (size_t)i * EACH, EACH, CKPT_U8, 1, shape,
                             CKPT_MEM_HOST};
        r[i] = t[i];
        r[i].data = back + (size_t)(T - 1 - i) * EACH; /* other places, other order */
    }
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 1, t, T, NULL), CKPT_OK, "%s", ckpt_error_last());
    memset(buf, 0, (size_t)T * EACH); /* the snapshot is taken: the buffer is free */
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    cr_assert_eq(ckpt_restore(st, 1, r, T, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    for (int i = 0; i < T; i++)
        for (size_t j = 0; j < EACH; j++) {
            size_t at = (size_t)i * EACH + j;
            cr_assert_eq(back[(size_t)(T - 1 - i) * EACH + j],
                         (unsigned char)(at * 2654435761u >> 13), "tensor %d byte %zu", i, j);
        }
    free(buf);
    free(back);
    ckpt_store_free(st);
}

/* A snapshot large enough that the workers copy it with the caller (in
 * passes, as the arena is smaller than the state): every byte is in the
 * snapshot when begin returns, whichever thread copied it.  Views of one
 * buffer (copied as pieces of up to 4 MiB) and separate buffers. */
Test(roundtrip, snapshot_copied_by_several_threads_is_whole_at_return)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 1 << 20;
    o.host_memory_limit = 12 << 20; /* 48 MiB in four passes of >= 8 MiB */
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    enum { VIEWS = 24, EACH = (1 << 20) + 4096, SEP = 20 };
    size_t vbytes = (size_t)VIEWS * EACH, sbytes = (size_t)SEP * EACH;
    unsigned char *buf = malloc(vbytes), *want = malloc(vbytes + sbytes);
    unsigned char *back = calloc(1, vbytes + sbytes), *sep[SEP];
    cr_assert(buf && want && back);
    for (size_t i = 0; i < vbytes + sbytes; i++)
        want[i] = (unsigned char)(i * 2654435761u >> 11);
    memcpy(buf, want, vbytes);
    ckpt_tensor t[VIEWS + SEP], r[VIEWS + SEP];
    char names[VIEWS + SEP][16];
    int64_t shape[1] = {EACH};
    for (int i = 0; i < VIEWS + SEP; i++) {
        unsigned char *data;
        if (i < VIEWS) {
            data = buf + (size_t)i * EACH;
        } else {
            cr_assert((sep[i - VIEWS] = malloc(EACH)));
            data = memcpy(sep[i - VIEWS], want + vbytes + (size_t)(i - VIEWS) * EACH, EACH);
        }
        snprintf(names[i], sizeof names[i], "t%02d", i);
        t[i] = (ckpt_tensor){names[i], data, EACH, CKPT_U8, 1, shape, CKPT_MEM_HOST};
        r[i] = t[i];
        r[i].data = back + (size_t)i * EACH;
    }
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 1, t, VIEWS + SEP, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    memset(buf, 0, vbytes); /* the snapshot is taken: the buffers are free */
    for (int i = 0; i < SEP; i++) {
        memset(sep[i], 0, EACH);
        free(sep[i]);
    }
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    cr_assert_eq(ckpt_restore(st, 1, r, VIEWS + SEP, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    for (int i = 0; i < VIEWS + SEP; i++)
        cr_assert(memcmp(back + (size_t)i * EACH, want + (size_t)i * EACH, EACH) == 0,
                  "tensor %d differs", i);
    free(buf);
    free(want);
    free(back);
    ckpt_store_free(st);
}

/* Thousands of small tensors, each allocated apart (a PyTorch state dict):
 * the threads take their pieces in groups, and every piece of every group,
 * the last included, is copied before ckpt_save_begin returns. */
Test(roundtrip, many_small_tensors_copied_in_groups_are_whole_at_return)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.host_memory_limit = 12 << 20; /* about 20 MiB in two passes of >= 8 MiB */
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    enum { N = 4099 };
    ckpt_tensor *t = calloc(N, sizeof *t), *r = calloc(N, sizeof *r);
    char(*names)[16] = calloc(N, sizeof *names);
    int64_t *shape = calloc(N, sizeof *shape);
    unsigned char **want = calloc(N, sizeof *want), **back = calloc(N, sizeof *back);
    cr_assert(t && r && names && shape && want && back);
    for (int i = 0; i < N; i++) {
        size_t n = 1024 + (size_t)(i * 7919 % 8) * 1024; /* 1 to 8 KiB */
        shape[i] = (int64_t)n;
        cr_assert((want[i] = malloc(n)) && (back[i] = calloc(1, n)));
        for (size_t k = 0; k < n; k++)
            want[i][k] = (unsigned char)((k + (size_t)i) * 2654435761u >> 13);
        snprintf(names[i], sizeof names[i], "t%05d", i);
        t[i] = (ckpt_tensor){names[i], malloc(n), n, CKPT_U8, 1, &shape[i], CKPT_MEM_HOST};
        cr_assert(t[i].data);
        memcpy(t[i].data, want[i], n);
        r[i] = t[i];
        r[i].data = back[i];
    }
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 1, t, N, NULL), CKPT_OK, "%s", ckpt_error_last());
    for (int i = 0; i < N; i++) { /* the snapshot is taken: the buffers are free */
        memset(t[i].data, 0, t[i].bytes);
        free(t[i].data);
    }
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    cr_assert_eq(ckpt_restore(st, 1, r, N, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    for (int i = 0; i < N; i++) {
        cr_assert(memcmp(back[i], want[i], r[i].bytes) == 0, "tensor %d differs", i);
        free(want[i]);
        free(back[i]);
    }
    free(t), free(r), free(names), free(shape), free(want), free(back);
    ckpt_store_free(st);
}

/* A tensor larger than the host memory limit on its own. */
Test(roundtrip, tensor_larger_than_memory_limit)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 64 * 1024;
    o.host_memory_limit = 200 * 1024;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_init(&s);
    int64_t a[1] = {2 * 1024 * 1024 + 3};
    tc_state_add(&s, "huge", CKPT_U8, 1, a, TC_RANDOM, 7);
    ckpt_save_stats stats;
    save_stats(st, 1, &s, &stats);
    tc_restore_check(st, 1, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* Every zstd level the options allow still round trips. */
Test(roundtrip, compression_levels)
{
    const int levels[] = {1, 3, 9, 19};
    tc_state s;
    tc_state_standard(&s, 4);
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        ckpt_store_options o;
        tc_opts(&o);
        o.level = levels[i];
        o.threads = 1 + (int)(i % 3);
        ckpt_store *st = NULL;
        cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "level %d: %s",
                     levels[i], ckpt_error_last());
        tc_save_ok(st, (int64_t)i, &s);
        tc_restore_check(st, (int64_t)i, &s);
        ckpt_store_free(st);
    }
    tc_state_free(&s);
}

/* ------------------------------------------------------------------ async */

TestSuite(async, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

static void big_state(tc_state *s, uint64_t seed)
{
    tc_state_init(s);
    int64_t n[1] = {2 * 1024 * 1024};
    tc_state_add(s, "x", CKPT_F32, 1, n, TC_RANDOM, seed);        /* 8 MiB */
    tc_state_add(s, "y", CKPT_U8, 1, n, TC_COMPRESSIBLE, seed);   /* 2 MiB */
    int64_t one[1] = {1};
    tc_state_add(s, "z", CKPT_I64, 1, one, TC_RANDOM, seed + 1);
}

Test(async, caller_may_overwrite_after_begin)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 256 * 1024;
    o.fsync = 1; /* a slower persist keeps the save in flight longer */
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state live, orig;
    big_state(&live, 21);
    tc_state_copy(&orig, &live);

    ckpt_save *sv = NULL;
    int rc = ckpt_save_begin(&sv, st, 1, live.t, live.count, NULL);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_wait_snapshot(sv), CKPT_OK, "host snapshot is already done");
    for (size_t i = 0; i < live.count; i++)
        memset(live.t[i].data, 0x3C, live.t[i].bytes);
    rc = ckpt_save_wait(sv);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);

    tc_restore_check(st, 1, &orig);
    ckpt_store_free(st);
    tc_state_free(&live);
    tc_state_free(&orig);
}

Test(async, free_buffers_after_begin)
{
    /* Not only overwritten: the caller's memory may be gone. */
    ckpt_store *st = tc_open(tc_root);
    tc_state live, orig;
    big_state(&live, 22);
    tc_state_copy(&orig, &live);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 4, live.t, live.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    tc_state_free(&live);
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    tc_restore_check(st, 4, &orig);
    ckpt_store_free(st);
    tc_state_free(&orig);
}

Test(async, second_save_while_first_persists)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.fsync = 1;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state a, b;
    big_state(&a, 31);
    big_state(&b, 32);

    ckpt_save *s1 = NULL, *s2 = NULL;
    cr_assert_eq(ckpt_save_begin(&s1, st, 1, a.t, a.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_save_begin(&s2, st, 2, b.t, b.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    /* the first one must be finished by the time the second was accepted */
    cr_assert_eq(ckpt_save_done(s1), 1, "at most one save in flight per store");
    cr_assert_eq(ckpt_save_wait(s2), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_wait(s1), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_wait(s1), CKPT_OK, "second wait");
    cr_assert_eq(ckpt_save_wait(s2), CKPT_OK, "second wait");
    cr_assert_eq(ckpt_save_done(s1), 1);
    cr_assert_eq(ckpt_save_done(s2), 1);
    ckpt_save_stats x, y;
    cr_assert_eq(ckpt_save_stats_get(s1, &x), CKPT_OK);
    cr_assert_eq(ckpt_save_stats_get(s2, &y), CKPT_OK);
    cr_assert_eq(x.step, 1);
    cr_assert_eq(y.step, 2);
    ckpt_save_free(s1);
    ckpt_save_free(s2);

    int64_t want[2] = {1, 2};
    tc_assert_steps(st, want, 2);
    tc_restore_check(st, 1, &a);
    tc_restore_check(st, 2, &b);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &b), 2);
    ckpt_store_free(st);
    tc_state_free(&a);
    tc_state_free(&b);
}

/* Freeing the store with a save in flight waits for it: it commits. */
Test(async, store_free_waits_for_save)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state a;
    big_state(&a, 41);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 3, a.t, a.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    /* save handle freed first (waits), then the store */
    ckpt_save_free(sv);
    ckpt_store_free(st);
    st = tc_open_ro(tc_root);
    tc_restore_check(st, 3, &a);
    ckpt_store_free(st);
    tc_state_free(&a);
}

Test(async, wait_many_times_and_done)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state a;
    tc_state_standard(&a, 5);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 0, a.t, a.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    int d = ckpt_save_done(sv);
    cr_assert(d == 0 || d == 1);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "wait #%d: %s", i, ckpt_error_last());
    cr_assert_eq(ckpt_save_done(sv), 1);
    cr_assert_eq(ckpt_save_fence(sv, NULL), CKPT_OK,
                 "fence is a no-op for host-only saves: %s", ckpt_error_last());
    ckpt_save_free(sv);
    tc_restore_check(st, 0, &a);
    ckpt_save_free(NULL);
    ckpt_store_free(st);
    tc_state_free(&a);
}

static void *wait_thread(void *p)
{
    ckpt_save *sv = p;
    return (void *)(intptr_t)ckpt_save_wait(sv);
}

/* ckpt_save_wait from several threads at once. */
Test(async, wait_from_other_threads)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state a;
    big_state(&a, 51);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 1, a.t, a.count, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, wait_thread, sv), 0);
    int rc = ckpt_save_wait(sv);
    for (int i = 0; i < 3; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        cr_assert_eq((int)(intptr_t)ret, CKPT_OK, "wait in thread %d", i);
    }
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    tc_restore_check(st, 1, &a);
    ckpt_store_free(st);
    tc_state_free(&a);
}

/* ckpt_save_sync is begin + wait + free. */
Test(roundtrip, save_sync)
{
    tc_state s;
    tc_state_standard(&s, 8);
    ckpt_store *st = tc_open(tc_root);
    int rc = ckpt_save_sync(st, 3, s.t, s.count, NULL);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    tc_restore_check(st, 3, &s);
    s.t[0].bytes += 4; /* no longer shape x dtype */
    ckpt_error_clear();
    cr_assert_eq(ckpt_save_sync(st, 4, s.t, s.count, NULL), CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), s.t[0].name), "%s", ckpt_error_last());
    s.t[0].bytes -= 4;
    int64_t want[1] = {3};
    tc_assert_steps(st, want, 1);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* The shuffle width of every dtype, as docs/FORMAT.md's table gives it
 * (complex types by component), read back from the index a save wrote:
 * a reader of the format relies on it, and shuffling complex64 by 8
 * compresses worse without any test noticing otherwise. */
Test(roundtrip, shuffle_width_of_every_dtype)
{
    static const struct { ckpt_dtype d; unsigned width; } table[] = {
        {CKPT_BOOL, 1}, {CKPT_U8, 1}, {CKPT_I8, 1}, {CKPT_U16, 2}, {CKPT_I16, 2},
        {CKPT_U32, 4}, {CKPT_I32, 4}, {CKPT_U64, 8}, {CKPT_I64, 8}, {CKPT_F16, 2},
        {CKPT_BF16, 2}, {CKPT_F32, 4}, {CKPT_F64, 8}, {CKPT_C64, 4}, {CKPT_C128, 8},
        {CKPT_F8_E4M3, 1}, {CKPT_F8_E5M2, 1}, {CKPT_BYTES, 1},
    };
    size_t n = sizeof table / sizeof *table;
    cr_assert_eq(n, (size_t)CKPT_DTYPE_COUNT_ - 1, "a dtype is missing from this table");
    tc_state s;
    tc_state_init(&s);
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%02zu", i);
        int64_t shape[1] = {4096};
        tc_state_add(&s, name, table[i].d, 1, shape, TC_COMPRESSIBLE, i + 1);
    }
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    for (uint64_t e = 0; e < ck->ix[0].count; e++) {
        const shard_entry *en = &ck->ix[0].entries[e];
        unsigned want = en->meta.codec == 0 ? 1 : table[en->tensor].width;
        cr_assert_eq(en->meta.elem, want, "%s (%s): stored with shuffle width %u, want %u",
                     ck->m.tensors[en->tensor].name,
                     ckpt_dtype_name(table[en->tensor].d), en->meta.elem, want);
    }
    ckpt_checkpoint_free(ck);
    tc_restore_check(st, 1, &s);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* The window [a, b) of tensor `name` read with ckpt_checkpoint_read_range
 * is `data`'s, and nothing past it is written. */
static void check_window(ckpt_checkpoint *ck, const char *name, const unsigned char *data,
                         unsigned char *buf, uint64_t a, uint64_t b)
{
    memset(buf, 0xEE, (size_t)(b - a) + 1);
    int rc = ckpt_checkpoint_read_range(ck, name, a, buf, b - a);
    cr_assert_eq(rc, CKPT_OK, "%s [%" PRIu64 ", %" PRIu64 "): %s", name, a, b,
                 ckpt_error_last());
    cr_assert(memcmp(buf, data + a, (size_t)(b - a)) == 0, "%s [%" PRIu64 ", %" PRIu64 ")",
              name, a, b);
    cr_assert_eq(buf[b - a], 0xEE, "%s [%" PRIu64 ", %" PRIu64 ") wrote past its end", name, a,
                 b);
}

/* ckpt_checkpoint_read_range: any window of a tensor, its chunks stored raw
 * or compressed, cut at either end or not; a range past the tensor is
 * refused; only the chunks a window touches are read, each verified whole
 * (a damaged byte outside the window fails the window). */
Test(roundtrip, read_range_gives_any_window_and_verifies_the_chunks_it_touches)
{
    enum { CH = 4096 };
    tc_state s;
    tc_state_init(&s);
    int64_t n[1] = {(16 * CH + 100) / 4};
    tc_state_add(&s, "raw", CKPT_F32, 1, n, TC_RANDOM, 7);
    tc_state_add(&s, "coded", CKPT_F32, 1, n, TC_COMPRESSIBLE, 8);
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = CH;
    o.flags |= CKPT_OPEN_COMPRESS_ALL;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(st, 1, &s);
    ckpt_save_stats stats;
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_stats(ck, &stats), CKPT_OK);
    cr_assert_lt(stats.stored_bytes, stats.raw_bytes, "nothing was compressed");

    uint64_t size = s.t[0].bytes;
    const uint64_t cuts[] = {0,    1,        CH - 1,   CH,        CH + 1,   2 * CH,
                             3000 + 2 * CH,  size - CH - 1,       size - 100,
                             size - 1,       size};
    size_t ncuts = sizeof cuts / sizeof cuts[0];
    unsigned char *buf = malloc((size_t)size + 1);
    cr_assert_not_null(buf);
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < ncuts; i++)
            for (size_t j = i; j < ncuts; j++)
                check_window(ck, s.t[t].name, s.t[t].data, buf, cuts[i], cuts[j]);

    cr_assert_eq(ckpt_checkpoint_read_range(ck, "raw", size, buf, 0), CKPT_OK);
    cr_assert_eq(ckpt_checkpoint_read_range(ck, "raw", size - 1, buf, 2), CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), "outside tensor 'raw'"), "%s", ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_read_range(ck, "raw", size + 1, buf, 0), CKPT_EINVAL);
    cr_assert_eq(ckpt_checkpoint_read_range(ck, "raw", UINT64_MAX, buf, 2), CKPT_EINVAL);
    cr_assert_eq(ckpt_checkpoint_read_range(ck, "raw", 0, NULL, 1), CKPT_EINVAL);
    cr_assert_eq(ckpt_checkpoint_read_range(ck, "nothing", 0, buf, 1), CKPT_ENOTFOUND);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);

    /* Damage chunk 5 of "raw" (random bytes: stored raw, found in the
     * shard by its first bytes) at its 11th byte. */
    char *dir = tc_step_dir(tc_root, 1);
    char *shard = tc_find_suffix(dir, ".shard");
    cr_assert_not_null(shard);
    int64_t ssize = tc_file_size(shard);
    unsigned char *file = malloc((size_t)ssize);
    FILE *f = fopen(shard, "rb");
    cr_assert(f && fread(file, 1, (size_t)ssize, f) == (size_t)ssize);
    fclose(f);
    const unsigned char *want = (const unsigned char *)s.t[0].data + 5 * CH;
    int64_t at = -1;
    for (int64_t k = 0; k + 64 <= ssize && at < 0; k++)
        if (memcmp(file + k, want, 64) == 0)
            at = k;
    cr_assert_geq(at, 0, "chunk 5 of 'raw' is not stored raw in the shard");
    tc_flip_byte(shard, at + 10);

    st = tc_open_ro(tc_root);
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    check_window(ck, "raw", s.t[0].data, buf, 0, 5 * CH);
    check_window(ck, "raw", s.t[0].data, buf, 6 * CH, size);
    check_window(ck, "coded", s.t[1].data, buf, 0, size);
    int rc = ckpt_checkpoint_read_range(ck, "raw", 5 * CH + 100, buf, 100);
    cr_assert_eq(rc, CKPT_ECORRUPT, "a window in the damaged chunk, not on its damaged byte: "
                                    "%d (%s)", rc, ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "tensor 'raw' chunk at byte 20480"), "%s",
              ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_read_range(ck, "raw", CH, buf, 6 * CH), CKPT_ECORRUPT);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
    free(file), free(shard), free(dir), free(buf);
    tc_state_free(&s);
}

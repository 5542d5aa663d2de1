/* Caller errors: mismatched or unknown tensors on restore, invalid save
 * arguments, unknown option versions; status strings and the last-error
 * slot; version numbers. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"

TestSuite(errors, .init = tc_setup, .fini = tc_teardown, .timeout = 120);

static int names(const char *msg, const char *needle)
{
    return !needle || strstr(msg, needle) != NULL;
}

/* The failing call's status and a message that names `needle` (or NULL). */
#define assert_failed(rc, want, needle)                                           \
    do {                                                                          \
        int rc_ = (rc);                                                           \
        cr_assert_eq(rc_, (want), "got %d (%s), want %d (%s): %s", rc_,           \
                     ckpt_strerror(rc_), (int)(want), ckpt_strerror(want),        \
                     ckpt_error_last());                                          \
        cr_assert(tc_nonempty(ckpt_error_last()), "no message for %d", rc_);     \
        cr_assert_eq(ckpt_error_last_status(), rc_);                              \
        cr_assert(names(ckpt_error_last(), (needle)),                             \
                  "message \"%s\" does not name \"%s\"", ckpt_error_last(),      \
                  (needle) ? (const char *)(needle) : "");                        \
    } while (0)

/* Step 1 holds "encoder.weight" (f32 [2,3]) and "encoder.bias" (i64 [4]). */
static ckpt_store *st;
static tc_state saved;

/* Runs after the suite's tc_setup (Criterion runs the suite's .init, then
 * the test's; .fini in the reverse order). */
static void setup_saved(void)
{
    st = tc_open(tc_root);
    tc_state_init(&saved);
    int64_t w[2] = {2, 3}, b[1] = {4};
    tc_state_add(&saved, "encoder.weight", CKPT_F32, 2, w, TC_RANDOM, 1);
    tc_state_add(&saved, "encoder.bias", CKPT_I64, 1, b, TC_RANDOM, 2);
    tc_save_ok(st, 1, &saved);
}

static void teardown_saved(void)
{
    ckpt_store_free(st);
    st = NULL;
    tc_state_free(&saved);
}

/* Restore one tensor described by (dtype, ndim, shape, bytes) into a fresh
 * buffer; returns the status. */
static int restore_one(const char *name, ckpt_dtype dt, int ndim, const int64_t *shape,
                       uint64_t bytes, const ckpt_restore_options *ro)
{
    void *buf = calloc(1, bytes + 8);
    ckpt_tensor t = {name, buf, bytes, dt, ndim, shape, CKPT_MEM_HOST};
    ckpt_report *rep = NULL;
    ckpt_error_clear();
    int rc = ckpt_restore(st, 1, &t, 1, ro, &rep);
    ckpt_report_free(rep);
    free(buf);
    return rc;
}

Test(errors, restore_wrong_dtype, .init = setup_saved, .fini = teardown_saved)
{
    int64_t w[2] = {2, 3};
    /* same byte size, other dtype */
    assert_failed(restore_one("encoder.weight", CKPT_I32, 2, w, 24, NULL),
                  CKPT_EMISMATCH, "encoder.weight");
    assert_failed(restore_one("encoder.weight", CKPT_F64, 2, w, 48, NULL),
                  CKPT_EMISMATCH, "encoder.weight");
    int64_t b2[2] = {4, 2};
    assert_failed(restore_one("encoder.bias", CKPT_F32, 2, b2, 32, NULL), CKPT_EMISMATCH,
                  "encoder.bias");
    /* also from CKPT_LATEST: a caller error is not a reason to fall back */
    void *buf = calloc(1, 24);
    ckpt_tensor t = {"encoder.weight", buf, 24, CKPT_U32, 2, w, CKPT_MEM_HOST};
    assert_failed(ckpt_restore(st, CKPT_LATEST, &t, 1, NULL, NULL), CKPT_EMISMATCH,
                  "encoder.weight");
    free(buf);
}

Test(errors, restore_wrong_shape, .init = setup_saved, .fini = teardown_saved)
{
    int64_t t32[2] = {3, 2}, flat[1] = {6}, three[3] = {1, 2, 3};
    assert_failed(restore_one("encoder.weight", CKPT_F32, 2, t32, 24, NULL),
                  CKPT_EMISMATCH, "encoder.weight");
    assert_failed(restore_one("encoder.weight", CKPT_F32, 1, flat, 24, NULL),
                  CKPT_EMISMATCH, "encoder.weight");
    assert_failed(restore_one("encoder.weight", CKPT_F32, 3, three, 24, NULL),
                  CKPT_EMISMATCH, "encoder.weight");
    assert_failed(restore_one("encoder.bias", CKPT_I64, 0, NULL, 8, NULL), CKPT_EMISMATCH,
                  "encoder.bias");
    int64_t b5[1] = {5};
    assert_failed(restore_one("encoder.bias", CKPT_I64, 1, b5, 40, NULL), CKPT_EMISMATCH,
                  "encoder.bias");
}

Test(errors, restore_wrong_size, .init = setup_saved, .fini = teardown_saved)
{
    /* size differs (and so does the shape) */
    int64_t w[2] = {2, 4};
    assert_failed(restore_one("encoder.weight", CKPT_F32, 2, w, 32, NULL), CKPT_EMISMATCH,
                  "encoder.weight");
    /* checkpoint_read / load with a buffer of the wrong size */
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    char buf[64];
    assert_failed(ckpt_checkpoint_read(ck, "encoder.weight", buf, 23), CKPT_EMISMATCH,
                  "encoder.weight");
    assert_failed(ckpt_checkpoint_read(ck, "encoder.weight", buf, 25), CKPT_EMISMATCH,
                  "encoder.weight");
    assert_failed(ckpt_checkpoint_read(ck, "encoder.nothing", buf, 24), CKPT_ENOTFOUND,
                  "encoder.nothing");
    ckpt_checkpoint_free(ck);
}

/* bytes inconsistent with shape x dtype is a bad argument (or a mismatch:
 * either way not CKPT_OK, and the buffer's neighbours are not written). */
Test(errors, restore_inconsistent_tensor, .init = setup_saved, .fini = teardown_saved)
{
    int64_t w[2] = {2, 3};
    unsigned char buf[64];
    memset(buf, 0x5A, sizeof buf);
    ckpt_tensor t = {"encoder.weight", buf, 20, CKPT_F32, 2, w, CKPT_MEM_HOST};
    int rc = ckpt_restore(st, 1, &t, 1, NULL, NULL);
    cr_assert(rc == CKPT_EINVAL || rc == CKPT_EMISMATCH, "restore = %d (%s)", rc,
              ckpt_strerror(rc));
    cr_assert(strstr(ckpt_error_last(), "encoder.weight"), "message: %s",
              ckpt_error_last());
    for (size_t i = 20; i < sizeof buf; i++)
        cr_assert_eq(buf[i], 0x5A, "restore wrote past the 20-byte buffer at %zu", i);
}

Test(errors, restore_unknown_name, .init = setup_saved, .fini = teardown_saved)
{
    int64_t n[1] = {4};
    assert_failed(restore_one("decoder.weight", CKPT_F32, 1, n, 16, NULL),
                  CKPT_ENOTFOUND, "decoder.weight");

    /* allow_missing: the unknown one is left untouched, the others restored */
    ckpt_restore_options ro;
    cr_assert_eq(ckpt_restore_options_init(&ro, CKPT_RESTORE_OPTIONS_VERSION), CKPT_OK);
    ro.allow_missing = 1;
    tc_state want;
    tc_state_copy(&want, &saved);
    tc_state got;
    tc_state_like(&got, &saved, 0);
    ckpt_tensor *missing = tc_state_add(&got, "decoder.weight", CKPT_F32, 1, n, TC_CONST,
                                        0x5A);
    (void)missing;
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, 1, got.t, got.count, &ro, &rep);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    ckpt_report_free(rep);
    const unsigned char *p = got.t[2].data;
    for (int i = 0; i < 16; i++)
        cr_assert_eq(p[i], 0x5A, "allow_missing must leave the buffer untouched");
    got.count = 2; /* compare the two that exist */
    tc_assert_state_eq(&got, &want, "allow_missing restore");
    got.count = 3;
    tc_state_free(&got);
    tc_state_free(&want);

    /* ckpt_load and checkpoint_find */
    void *data = (void *)1;
    uint64_t bytes = 7;
    assert_failed(ckpt_load(st, 1, "decoder.weight", &data, &bytes, NULL), CKPT_ENOTFOUND,
                  "decoder.weight");
    cr_assert_null(data, "ckpt_load left a pointer on failure");
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    size_t idx;
    cr_assert_eq(ckpt_checkpoint_find(ck, "decoder.weight", &idx), CKPT_ENOTFOUND);
    ckpt_checkpoint_free(ck);
}

Test(errors, unknown_step, .init = setup_saved, .fini = teardown_saved)
{
    tc_state got;
    tc_state_like(&got, &saved, 0);
    ckpt_error_clear();
    int rc = ckpt_restore(st, 77, got.t, got.count, NULL, NULL);
    cr_assert(rc == CKPT_ENOTFOUND || rc == CKPT_ENOCKPT, "restore(77) = %d", rc);
    cr_assert(strstr(ckpt_error_last(), "77"), "message does not name step 77: %s",
              ckpt_error_last());
    rc = ckpt_verify(st, 77, CKPT_VERIFY_QUICK, NULL);
    cr_assert_eq(rc, CKPT_ENOTFOUND, "verify(77) = %d", rc);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 77, CKPT_VERIFY_QUICK), CKPT_ENOTFOUND);
    cr_assert_null(ck);
    void *data = NULL;
    uint64_t bytes;
    cr_assert_eq(ckpt_load(st, 77, "encoder.weight", &data, &bytes, NULL), CKPT_ENOTFOUND);
    cr_assert_eq(ckpt_restore(st, -5, got.t, got.count, NULL, NULL), CKPT_EINVAL);
    tc_state_free(&got);
}

/* A committed step directory given as a root (a job script passing back
 * the path `ckpt latest` printed): refused for reading and for writing,
 * with the root named, and nothing is created inside the step. */
Test(errors, step_directory_is_not_a_root, .init = setup_saved, .fini = teardown_saved)
{
    char step_dir[4096], inner[4200];
    snprintf(step_dir, sizeof step_dir, "%s/step-000000000001", tc_root);
    for (int writing = 0; writing < 2; writing++) {
        ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
        o.flags = writing ? 0u : CKPT_OPEN_READONLY;
        ckpt_store *inner_st = NULL;
        ckpt_error_clear();
        assert_failed(ckpt_store_open(&inner_st, step_dir, &o), CKPT_EINVAL, "not a root");
        cr_assert_null(inner_st);
        cr_assert(strstr(ckpt_error_last(), "step 1"), "%s", ckpt_error_last());
    }
    snprintf(inner, sizeof inner, "%s/.lock", step_dir);
    cr_assert(!tc_exists(inner), "a lock was created inside the committed step");
    cr_assert_eq(ckpt_verify(st, 1, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    /* a directory named like a step but holding no manifest is a root */
    char plain[4200];
    snprintf(plain, sizeof plain, "%s/other", tc_root);
    cr_assert_eq(mkdir(plain, 0700), 0);
    snprintf(plain, sizeof plain, "%s/other/step-000000000005", tc_root);
    ckpt_store *ok = NULL;
    cr_assert_eq(ckpt_store_open(&ok, plain, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(ok);
}

/* A root whose parent is missing: not created (nor its parents), and the
 * message names the missing parent, not only ENOENT. */
Test(errors, a_missing_parent_is_named)
{
    char path[4200], parent[4096];
    snprintf(parent, sizeof parent, "%s/no-such-dir", tc_root);
    snprintf(path, sizeof path, "%s/run1", parent);
    ckpt_store *s = NULL;
    ckpt_error_clear();
    assert_failed(ckpt_store_open(&s, path, NULL), CKPT_ENOTFOUND, "does not exist");
    cr_assert(strstr(ckpt_error_last(), parent), "%s", ckpt_error_last());
    cr_assert_null(s);
    cr_assert(!tc_exists(parent));
    snprintf(path, sizeof path, "%s/run1/", parent); /* a trailing slash names run1 */
    assert_failed(ckpt_store_open(&s, path, NULL), CKPT_ENOTFOUND, "does not exist");
    cr_assert(strstr(ckpt_error_last(), "parent directory /") &&
                  !strstr(ckpt_error_last(), "run1 does not"),
              "%s", ckpt_error_last());
}

/* ------------------------------------------------------------ bad saves */

static void assert_save_einval(const ckpt_tensor *t, size_t n, int64_t step,
                               const char *meta, const char *what)
{
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.metadata_json = meta;
    ckpt_save *sv = NULL;
    ckpt_error_clear();
    int rc = ckpt_save_begin(&sv, st, step, t, n, &so);
    cr_assert_eq(rc, CKPT_EINVAL, "%s: save_begin = %d (%s)", what, rc, ckpt_strerror(rc));
    cr_assert(tc_nonempty(ckpt_error_last()), "%s: no message", what);
    cr_assert_eq(ckpt_error_last_status(), CKPT_EINVAL);
    cr_assert_null(sv, "%s: a handle came back from a failed save", what);
}

Test(errors, invalid_save_arguments, .init = setup_saved, .fini = teardown_saved)
{
    float f[6] = {0};
    int64_t sh[2] = {2, 3}, neg[2] = {-2, -3}, many[CKPT_MAX_DIMS + 1];
    for (int i = 0; i <= CKPT_MAX_DIMS; i++)
        many[i] = 1;
    char longname[300];
    memset(longname, 'n', 256);
    longname[256] = 0;
    ckpt_tensor ok = {"good", f, 24, CKPT_F32, 2, sh, CKPT_MEM_HOST};
    ckpt_tensor t[2];

    t[0] = ok; t[0].name = NULL;
    assert_save_einval(t, 1, 2, NULL, "NULL name");
    t[0] = ok; t[0].name = "";
    assert_save_einval(t, 1, 2, NULL, "empty name");
    t[0] = ok; t[0].name = longname;
    assert_save_einval(t, 1, 2, NULL, "256-byte name");
    t[0] = ok; t[0].name = "bad\xff\xfeutf8";
    assert_save_einval(t, 1, 2, NULL, "invalid UTF-8 name");
    t[0] = ok; t[1] = ok;
    assert_save_einval(t, 2, 2, NULL, "duplicate names");
    t[0] = ok; t[0].bytes = 20;
    assert_save_einval(t, 1, 2, NULL, "bytes < shape x dtype");
    t[0] = ok; t[0].bytes = 28;
    assert_save_einval(t, 1, 2, NULL, "bytes > shape x dtype");
    t[0] = ok; t[0].dtype = CKPT_DTYPE_INVALID;
    assert_save_einval(t, 1, 2, NULL, "invalid dtype");
    t[0] = ok; t[0].dtype = CKPT_DTYPE_COUNT_;
    assert_save_einval(t, 1, 2, NULL, "dtype count");
    t[0] = ok; t[0].dtype = (ckpt_dtype)1000;
    assert_save_einval(t, 1, 2, NULL, "dtype 1000");
    t[0] = ok; t[0].ndim = -1;
    assert_save_einval(t, 1, 2, NULL, "negative ndim");
    t[0] = ok; t[0].ndim = CKPT_MAX_DIMS + 1; t[0].shape = many; t[0].bytes = 4;
    assert_save_einval(t, 1, 2, NULL, "ndim > CKPT_MAX_DIMS");
    t[0] = ok; t[0].shape = neg;
    assert_save_einval(t, 1, 2, NULL, "negative dims");
    t[0] = ok; t[0].shape = NULL;
    assert_save_einval(t, 1, 2, NULL, "NULL shape with ndim 2");
    /* empty, but its other dimensions beyond 2^63-1 bytes: in any order */
    int64_t zero_first[3] = {0, INT64_MAX, INT64_MAX}, zero_last[3] = {INT64_MAX, INT64_MAX, 0};
    t[0] = ok; t[0].ndim = 3; t[0].shape = zero_first; t[0].bytes = 0;
    assert_save_einval(t, 1, 2, NULL, "[0, 2^63-1, 2^63-1]");
    cr_assert(strstr(ckpt_error_last(), "invalid shape: its nonzero dimensions times the "
                                        "float32 element size exceed"), "%s", ckpt_error_last());
    t[0].shape = zero_last;
    assert_save_einval(t, 1, 2, NULL, "[2^63-1, 2^63-1, 0]");
    t[0] = ok; t[0].data = NULL;
    assert_save_einval(t, 1, 2, NULL, "NULL data");
    t[0] = ok; t[0].memory = (ckpt_memory)9;
    assert_save_einval(t, 1, 2, NULL, "invalid memory kind");
    assert_save_einval(NULL, 1, 2, NULL, "NULL tensors");
    assert_save_einval(&ok, 1, -5, NULL, "negative step");
    assert_save_einval(&ok, 1, CKPT_LATEST, NULL, "CKPT_LATEST as a step");
    assert_save_einval(&ok, 1, 2, "{\"epoch\": ", "truncated metadata JSON");
    assert_save_einval(&ok, 1, 2, "{epoch: 1}", "invalid metadata JSON");
    /* parsed on a worker while the snapshot is taken: still refused here */
    cr_assert(strstr(ckpt_error_last(), "metadata is not valid JSON (line 1, column 6: "
                                        "string or '}' expected"),
              "message: %s", ckpt_error_last());
    assert_save_einval(&ok, 1, 2, "{} {}", "two metadata JSON values");
    /* valid JSON that a checkpoint cannot hold says so */
    assert_save_einval(&ok, 1, 2, "{\"seed\": 123456789012345678901234}", "huge integer");
    cr_assert(strstr(ckpt_error_last(), "metadata holds a number a checkpoint cannot store "
                                        "(integers must fit in 64 bits"),
              "message: %s", ckpt_error_last());
    assert_save_einval(&ok, 1, 2, "[1e999]", "real overflow");
    cr_assert(strstr(ckpt_error_last(), "number a checkpoint cannot store"), "message: %s",
              ckpt_error_last());
    assert_save_einval(&ok, 1, 2, "\"a\\u0000b\"", "U+0000 in a string");
    cr_assert(strstr(ckpt_error_last(), "U+0000"), "message: %s", ckpt_error_last());

    /* the name is in the message */
    t[0] = ok; t[0].name = "layer.17.weight"; t[0].bytes = 20;
    assert_save_einval(t, 1, 2, NULL, "bytes mismatch");
    cr_assert(strstr(ckpt_error_last(), "layer.17.weight"), "message: %s",
              ckpt_error_last());
    t[0] = ok; t[0].name = "dup.name"; t[1] = t[0];
    assert_save_einval(t, 2, 2, NULL, "duplicate");
    cr_assert(strstr(ckpt_error_last(), "dup.name"), "message: %s", ckpt_error_last());

    /* NULL store / out */
    ckpt_error_clear();
    cr_assert_eq(ckpt_save_begin(NULL, st, 2, &ok, 1, NULL), CKPT_EINVAL);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, NULL, 2, &ok, 1, NULL), CKPT_EINVAL);
    cr_assert(tc_nonempty(ckpt_error_last()));

    /* nothing was written and the store still works */
    int64_t one[1] = {1};
    tc_assert_steps(st, one, 1);
    cr_assert_eq(tc_count_prefix(tc_root, ".tmp"), 0);
    tc_state good;
    tc_state_init(&good);
    tc_state_add(&good, "good", CKPT_F32, 2, sh, TC_RANDOM, 3);
    tc_save_ok(st, 2, &good);
    tc_restore_check(st, 2, &good);
    tc_state_free(&good);
    int64_t two[2] = {1, 2};
    tc_assert_steps(st, two, 2);
}

/* A save of zero tensors is a valid (empty) checkpoint. */
Test(errors, empty_save, .init = setup_saved, .fini = teardown_saved)
{
    tc_state none;
    tc_state_init(&none);
    tc_save_ok(st, 5, &none);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 5, CKPT_VERIFY_QUICK), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_tensor_count(ck), 0);
    ckpt_checkpoint_free(ck);
    cr_assert_eq(ckpt_verify(st, 5, CKPT_VERIFY_FULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    /* restoring nothing from it works */
    cr_assert_eq(ckpt_restore(st, 5, NULL, 0, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
}

Test(errors, restore_invalid_arguments, .init = setup_saved, .fini = teardown_saved)
{
    int64_t w[2] = {2, 3};
    float f[6];
    ckpt_tensor t[2] = {{"encoder.weight", f, 24, CKPT_F32, 2, w, CKPT_MEM_HOST},
                        {"encoder.weight", f, 24, CKPT_F32, 2, w, CKPT_MEM_HOST}};
    ckpt_error_clear();
    cr_assert_eq(ckpt_restore(st, 1, t, 2, NULL, NULL), CKPT_EINVAL,
                 "one name twice in a restore");
    cr_assert(tc_nonempty(ckpt_error_last()));
    cr_assert_eq(ckpt_restore(st, 1, NULL, 1, NULL, NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_restore(NULL, 1, t, 1, NULL, NULL), CKPT_EINVAL);
    t[0].data = NULL;
    cr_assert_eq(ckpt_restore(st, 1, t, 1, NULL, NULL), CKPT_EINVAL, "NULL data");
    t[0].data = f;
    t[0].name = NULL;
    cr_assert_eq(ckpt_restore(st, 1, t, 1, NULL, NULL), CKPT_EINVAL, "NULL name");
    cr_assert_eq(ckpt_verify(st, 1, (ckpt_verify_level)7, NULL), CKPT_EINVAL);
    int64_t s;
    cr_assert_eq(ckpt_store_latest(st, (ckpt_verify_level)7, &s), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_load(st, 1, "encoder.weight", NULL, NULL, NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_steps(st, NULL, NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_wait(NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_release_after_fork(NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_wait(st), CKPT_OK, "nothing in flight");
}

/* ---------------------------------------------------------- option versions */

Test(errors, options_versions)
{
    ckpt_store_options so;
    ckpt_save_options sa;
    ckpt_restore_options ro;

    /* _init with the current version equals the _INIT macro */
    ckpt_store_options so_macro = CKPT_STORE_OPTIONS_INIT;
    memset(&so, 0xCC, sizeof so);
    cr_assert_eq(ckpt_store_options_init(&so, CKPT_STORE_OPTIONS_VERSION), CKPT_OK);
    cr_assert_eq(so.version, so_macro.version);
    cr_assert_eq(so.flags, so_macro.flags);
    cr_assert_eq(so.level, so_macro.level);
    cr_assert_eq(so.threads, so_macro.threads);
    cr_assert_eq(so.chunk_bytes, so_macro.chunk_bytes);
    cr_assert_eq(so.host_memory_limit, so_macro.host_memory_limit);
    cr_assert_eq(so.keep_last, so_macro.keep_last);
    cr_assert_eq(so.fsync, so_macro.fsync);
    cr_assert_eq(so.verify_after_save, so_macro.verify_after_save);
    cr_assert_eq(so.snapshot_mode, so_macro.snapshot_mode);
    cr_assert_eq(so.pinned_limit, so_macro.pinned_limit);
    ckpt_save_options sa_macro = CKPT_SAVE_OPTIONS_INIT;
    cr_assert_eq(ckpt_save_options_init(&sa, CKPT_SAVE_OPTIONS_VERSION), CKPT_OK);
    cr_assert_eq(sa.version, sa_macro.version);
    cr_assert_null(sa.metadata_json);
    cr_assert_null(sa.cuda_stream);
    ckpt_restore_options ro_macro = CKPT_RESTORE_OPTIONS_INIT;
    cr_assert_eq(ckpt_restore_options_init(&ro, CKPT_RESTORE_OPTIONS_VERSION), CKPT_OK);
    cr_assert_eq(ro.version, ro_macro.version);
    cr_assert_eq(ro.allow_missing, 0);

    /* unknown versions */
    assert_failed(ckpt_store_options_init(&so, 0), CKPT_EVERSION, NULL);
    assert_failed(ckpt_store_options_init(&so, 99), CKPT_EVERSION, NULL);
    assert_failed(ckpt_save_options_init(&sa, 99), CKPT_EVERSION, NULL);
    assert_failed(ckpt_restore_options_init(&ro, 99), CKPT_EVERSION, NULL);

    ckpt_store *s2 = NULL;
    tc_opts(&so);
    so.version = 99;
    assert_failed(ckpt_store_open(&s2, tc_root, &so), CKPT_EVERSION, NULL);
    cr_assert_null(s2);
    so.version = 0;
    assert_failed(ckpt_store_open(&s2, tc_root, &so), CKPT_EVERSION, NULL);

    /* save / restore options with unknown versions */
    s2 = tc_open(tc_root);
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_save_options bad_sa = CKPT_SAVE_OPTIONS_INIT;
    bad_sa.version = 99;
    ckpt_save *sv = NULL;
    assert_failed(ckpt_save_begin(&sv, s2, 1, s.t, s.count, &bad_sa), CKPT_EVERSION, NULL);
    cr_assert_null(sv);
    tc_save_ok(s2, 1, &s);
    ckpt_restore_options bad_ro = CKPT_RESTORE_OPTIONS_INIT;
    bad_ro.version = 99;
    assert_failed(ckpt_restore(s2, 1, s.t, s.count, &bad_ro, NULL), CKPT_EVERSION, NULL);
    ckpt_store_free(s2);
    tc_state_free(&s);
}

Test(errors, invalid_store_options)
{
    static const char *cases[] = {
        "flags = 0x100", "fsync = 2", "threads = -1", "keep_last = -2",
        "level = 1000", "verify_after_save = 7", "snapshot_mode = 9",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ckpt_store_options o;
        tc_opts(&o);
        switch (i) {
        case 0: o.flags = 0x100; break;
        case 1: o.fsync = 2; break;
        case 2: o.threads = -1; break;
        case 3: o.level = 1000; break;
        case 4: o.verify_after_save = (ckpt_verify_level)7; break;
        case 5: o.snapshot_mode = (ckpt_snapshot_mode)9; break;
        case 6: o.keep_last = -2; break;
        }
        ckpt_store *s2 = NULL;
        ckpt_error_clear();
        int rc = ckpt_store_open(&s2, tc_root, &o);
        cr_assert_eq(rc, CKPT_EINVAL, "%s: open = %d (%s)", cases[i], rc,
                     ckpt_strerror(rc));
        cr_assert(tc_nonempty(ckpt_error_last()), "%s: no message", cases[i]);
        cr_assert_null(s2);
    }
    ckpt_store *s2 = NULL;
    cr_assert_eq(ckpt_store_open(&s2, NULL, NULL), CKPT_EINVAL);
    cr_assert_null(s2);
    cr_assert_eq(ckpt_store_open(&s2, "", NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_open(NULL, tc_root, NULL), CKPT_EINVAL);
}

/* --------------------------------------------------------- status strings */

Test(errors, strerror_every_status)
{
    const int codes[] = {CKPT_OK,        CKPT_EINVAL,     CKPT_ENOMEM,    CKPT_EIO,
                         CKPT_ENOSPC,    CKPT_EBUSY,      CKPT_ECORRUPT,  CKPT_ENOTFOUND,
                         CKPT_ENOCKPT,   CKPT_EMISMATCH,  CKPT_EVERSION,  CKPT_EDEVICE,
                         CKPT_ENODEVICE, CKPT_EACCES,     CKPT_EINTERNAL, CKPT_EINCOMPLETE};
    const size_t n = sizeof codes / sizeof codes[0];
    cr_assert_eq(n, 16);
    for (size_t i = 0; i < n; i++) {
        const char *a = ckpt_strerror(codes[i]);
        cr_assert(tc_nonempty(a), "ckpt_strerror(%d) is empty", codes[i]);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(a, ckpt_strerror(codes[j]), "%d and %d share \"%s\"",
                              codes[i], codes[j], a);
    }
    /* unknown codes still get a string, not one of the known ones */
    const int unknown[] = {1, -16, -1000, 1000, INT32_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *u = ckpt_strerror(unknown[i]);
        cr_assert(tc_nonempty(u), "ckpt_strerror(%d)", unknown[i]);
        cr_assert_str_neq(u, ckpt_strerror(CKPT_OK));
    }
}

Test(errors, error_last_slot)
{
    cr_assert_not_null(ckpt_error_last());
    ckpt_error_clear();
    cr_assert_str_eq(ckpt_error_last(), "");
    cr_assert_eq(ckpt_error_last_status(), CKPT_OK);
    ckpt_store_options o;
    cr_assert_eq(ckpt_store_options_init(&o, 12345), CKPT_EVERSION);
    cr_assert(tc_nonempty(ckpt_error_last()));
    cr_assert_eq(ckpt_error_last_status(), CKPT_EVERSION);
    ckpt_error_clear();
    cr_assert_str_eq(ckpt_error_last(), "");
    cr_assert_eq(ckpt_error_last_status(), CKPT_OK);
}

static void *other_thread(void *arg)
{
    const char **out = arg;
    /* a fresh thread has no error, whatever the other thread did */
    out[0] = ckpt_error_last()[0] == '\0' ? "empty" : "not empty";
    out[1] = ckpt_error_last_status() == CKPT_OK ? "ok" : "not ok";
    return NULL;
}

Test(errors, error_last_is_per_thread)
{
    ckpt_store_options o;
    cr_assert_eq(ckpt_store_options_init(&o, 12345), CKPT_EVERSION);
    const char *res[2] = {NULL, NULL};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, other_thread, res), 0);
    pthread_join(th, NULL);
    cr_assert_str_eq(res[0], "empty");
    cr_assert_str_eq(res[1], "ok");
    cr_assert(tc_nonempty(ckpt_error_last()), "this thread's error was lost");
    cr_assert_eq(ckpt_error_last_status(), CKPT_EVERSION);
}

Test(errors, versions)
{
    cr_assert_eq(ckpt_version_number(), CKPT_VERSION_NUMBER);
    cr_assert_str_eq(ckpt_version_string(), CKPT_VERSION_STRING);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR,
             CKPT_VERSION_PATCH);
    cr_assert_str_eq(buf, CKPT_VERSION_STRING);
}

Test(errors, free_functions_accept_null)
{
    ckpt_store_free(NULL);
    ckpt_save_free(NULL);
    ckpt_report_free(NULL);
    ckpt_checkpoint_free(NULL);
    ckpt_free(NULL);
}

/* Without a CUDA runtime a tensor declared as device memory is refused with
 * CKPT_ENODEVICE and a readable message naming it (once). */
Test(errors, device_tensor_without_cuda, .init = setup_saved, .fini = teardown_saved)
{
    if (ckpt_cuda_available() == CKPT_OK)
        cr_skip_test("a CUDA device is present: tests/cuda covers device tensors");
    int64_t w[2] = {2, 3};
    float f[6] = {0};
    ckpt_tensor t = {"gpu.only.weight", f, 24, CKPT_F32, 2, w, CKPT_MEM_DEVICE};
    for (int pass = 0; pass < 2; pass++) {
        ckpt_error_clear();
        int rc;
        if (pass == 0) {
            ckpt_save *sv = NULL;
            rc = ckpt_save_begin(&sv, st, 2, &t, 1, NULL);
            if (rc == CKPT_OK)
                rc = ckpt_save_wait(sv);
            ckpt_save_free(sv);
        } else {
            t.name = "encoder.weight";
            rc = ckpt_restore(st, 1, &t, 1, NULL, NULL);
        }
        const char *msg = ckpt_error_last();
        cr_assert_eq(rc, CKPT_ENODEVICE, "%s: %d (%s): %s", pass ? "restore" : "save", rc,
                     ckpt_strerror(rc), msg);
        const char *first = strstr(msg, t.name);
        cr_assert(first, "message does not name %s: %s", t.name, msg);
        cr_assert_null(strstr(first + strlen(t.name), t.name),
                       "message names %s more than once (garbled?): %s", t.name, msg);
    }
    int64_t one[1] = {1};
    tc_assert_steps(st, one, 1);
}

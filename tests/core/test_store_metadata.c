/* The caller's metadata and the environment record of each checkpoint:
 * the frameworks found, the metadata kept as written (objects, scalars,
 * reals bit for bit), its depth and count limits.  The root itself is
 * test_store.c's. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "helpers.h"
#include "manifest.h"
#include "testing.h"

TestSuite(store, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

/* ------------------------------------------------------------- metadata */

static int json_has_string(const json_t *j, const char *needle)
{
    if (json_is_string(j))
        return strstr(json_string_value(j), needle) != NULL;
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) if (json_has_string(v, needle)) return 1;
    }
    if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) if (json_has_string(v, needle)) return 1;
    }
    return 0;
}

static json_t *parse(const char *text, const char *what)
{
    cr_assert(text, "%s is NULL", what);
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
    cr_assert(j, "%s is not JSON (%s at %d): %.200s", what, err.text, err.position, text);
    return j;
}

/* The wall clock the library reads (time(NULL) may read the kernel's
 * coarse clock, a tick behind: a save across a second boundary then looked
 * like one from the future). */
static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check_metadata(const char *meta, int64_t step)
{
    tc_state s;
    tc_state_standard(&s, (uint64_t)step);
    ckpt_store *st = tc_open(tc_root);
    double t0 = wall_now();
    int rc = tc_save(st, step, &s, meta);
    double t1 = wall_now();
    cr_assert_eq(rc, CKPT_OK, "save with metadata %s: %s", meta ? meta : "NULL",
                 ckpt_error_last());
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, step, CKPT_VERIFY_QUICK), CKPT_OK, "%s", ckpt_error_last());

    json_t *want = parse(meta ? meta : "null", "expected metadata");
    json_t *got = parse(ckpt_checkpoint_metadata(ck), "ckpt_checkpoint_metadata");
    cr_assert(json_equal(want, got), "metadata %s came back as %s", meta ? meta : "NULL",
              ckpt_checkpoint_metadata(ck));
    json_decref(want);
    json_decref(got);

    json_t *env = parse(ckpt_checkpoint_env(ck), "ckpt_checkpoint_env");
    cr_assert(json_is_object(env), "env is not an object");
    cr_assert(json_has_string(env, CKPT_VERSION_STRING), "env does not name libckpt %s: %s",
              CKPT_VERSION_STRING, ckpt_checkpoint_env(ck));
    json_decref(env);

    json_t *man = parse(ckpt_checkpoint_manifest(ck), "ckpt_checkpoint_manifest");
    cr_assert(json_is_object(man));
    json_decref(man);

    double t = ckpt_checkpoint_time(ck);
    cr_assert(t >= t0 - 1 && t <= t1 + 1, "checkpoint time %.3f outside [%.3f, %.3f]", t,
              t0, t1);
    cr_assert_eq(ckpt_checkpoint_step(ck), step);
    const char *path = ckpt_checkpoint_path(ck);
    cr_assert(path && path[0] == '/', "checkpoint path not absolute: %s", path);
    char tail[32];
    snprintf(tail, sizeof tail, "step-%012lld", (long long)step);
    size_t pl = strlen(path), tl = strlen(tail);
    cr_assert(pl >= tl && strcmp(path + pl - tl, tail) == 0, "checkpoint path %s", path);
    ckpt_save_stats cs;
    cr_assert_eq(ckpt_checkpoint_stats(ck, &cs), CKPT_OK);
    cr_assert_eq(cs.raw_bytes, tc_state_bytes(&s));
    cr_assert_eq(cs.step, step);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
    tc_state_free(&s);
}

/* Save `s` as `step` with options `so`; the status of ckpt_save_begin, or
 * of ckpt_save_wait when it began. */
static int save_with(ckpt_store *st, int64_t step, tc_state *s, const ckpt_save_options *so)
{
    ckpt_save *sv = NULL;
    int rc = ckpt_save_begin(&sv, st, step, s->t, s->count, so);
    if (rc == CKPT_OK)
        rc = ckpt_save_wait(sv);
    ckpt_save_free(sv);
    return rc;
}

/* frameworks_json lands as env["frameworks"]; version 1 options (without
 * it) still save; what is not an object of strings or null is refused. */
Test(store, frameworks_recorded_in_env)
{
    tc_state s;
    tc_state_standard(&s, 5);
    ckpt_store *st = tc_open(tc_root);
    ckpt_save_options so;
    cr_assert_eq(ckpt_save_options_init(&so, CKPT_SAVE_OPTIONS_VERSION), CKPT_OK);
    cr_assert_null(so.frameworks_json);
    so.frameworks_json = "{\"python\": \"3.11.2\", \"torch.cuda\": null}";
    cr_assert_eq(save_with(st, 5, &s, &so), CKPT_OK, "%s", ckpt_error_last());
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 5, CKPT_VERIFY_QUICK), CKPT_OK);
    json_t *env = parse(ckpt_checkpoint_env(ck), "ckpt_checkpoint_env");
    json_t *want = parse(so.frameworks_json, "frameworks_json");
    cr_assert(json_equal(json_object_get(env, "frameworks"), want), "env: %s",
              ckpt_checkpoint_env(ck));
    json_decref(want);
    json_decref(env);
    ckpt_checkpoint_free(ck);

    ckpt_save_options v1;
    memset(&v1, 0xff, sizeof v1); /* a v1 caller's struct ends before frameworks_json */
    cr_assert_eq(ckpt_save_options_init(&v1, 1), CKPT_OK);
    cr_assert_eq(v1.version, 1u);
    cr_assert_null(v1.metadata_json);
    cr_assert_eq(save_with(st, 6, &s, &v1), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 6, CKPT_VERIFY_QUICK), CKPT_OK);
    env = parse(ckpt_checkpoint_env(ck), "ckpt_checkpoint_env");
    cr_assert_null(json_object_get(env, "frameworks"), "v1: %s", ckpt_checkpoint_env(ck));
    json_decref(env);
    ckpt_checkpoint_free(ck);

    static const char *const bad[] = {"[1]", "{\"torch\": 1}", "{\"\": \"1\"}", "{",
                                      "\"1.0\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        so.frameworks_json = bad[i];
        int rc = save_with(st, 7, &s, &so);
        cr_assert_eq(rc, CKPT_EINVAL, "%s: %d", bad[i], rc);
        cr_assert(strstr(ckpt_error_last(), "frameworks_json"), "%s: %s", bad[i],
                  ckpt_error_last());
    }
    ckpt_store_free(st);
    tc_state_free(&s);
}

Test(store, metadata_object)
{
    check_metadata("{\"epoch\": 3, \"lr\": 0.001, \"tags\": [\"a\", \"b\"], "
                   "\"nested\": {\"x\": null, \"u\": \"\\u00e9t\\u00e9 \xe2\x9c\x93\", "
                   "\"big\": 9007199254740993, \"neg\": -1.5e-300, \"t\": true}}",
                   3);
}

/* Every real comes back as the same double (json_equal compares values),
 * and in its short form: no 17-digit noise. */
Test(store, metadata_reals_exact_and_short)
{
    const char *meta = "{\"lr\": 0.1, \"third\": 0.3333333333333333, \"tiny\": 5e-324, "
                       "\"huge\": 1.7976931348623157e+308, \"loss\": [2.5, 0.7]}";
    check_metadata(meta, 8);
    ckpt_store *st = tc_open(tc_root);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 8, CKPT_VERIFY_QUICK), CKPT_OK, "%s", ckpt_error_last());
    const char *text = ckpt_checkpoint_metadata(ck);
    cr_expect(strstr(text, "\"lr\": 0.1,") || strstr(text, "\"lr\":0.1,"), "%s", text);
    cr_expect(strstr(text, "0.3333333333333333") && !strstr(text, "0.33333333333333331"), "%s",
              text);
    /* the manifest file itself says 0.1 too */
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", ckpt_checkpoint_path(ck));
    int64_t size = tc_file_size(path);
    FILE *f = fopen(path, "rb");
    cr_assert(f && size > 0, "cannot read %s", path);
    char *file = calloc(1, (size_t)size + 1);
    cr_assert(file && fread(file, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    /* (on one line: the manifest's metadata member is printed compact) */
    cr_expect(strstr(file, "\"metadata\": {\"lr\":0.1,\"third\":0.3333333333333333,") &&
              !strstr(file, "0.10000000000000001"), "%s", file);
    free(file);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
}

/* The metadata text of step `step` of the store at tc_root. */
static char *metadata_of(int64_t step)
{
    ckpt_store *st = tc_open_ro(tc_root);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, step, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    char *text = strdup(ckpt_checkpoint_metadata(ck));
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
    return text;
}

/* Metadata is kept as the caller wrote it, less the whitespace between
 * tokens (escapes, number forms and key order as given); text that only
 * jansson reads (a key given twice, a real too large for the quick check)
 * comes back as the same value, printed by jansson. */
Test(store, metadata_kept_as_written)
{
    check_metadata("{ \"a\" :\n\t[1e5, -0, 2.50, \"\\u00e9\\/\"],\r\n \"z\": {}, \"b\": true }", 9);
    char *text = metadata_of(9);
    cr_assert_str_eq(text, "{\"a\":[1e5,-0,2.50,\"\\u00e9\\/\"],\"z\":{},\"b\":true}");
    free(text);

    check_metadata("{\"k\": 1, \"k\": 2}", 10); /* json_equal: {"k": 2} */
    text = metadata_of(10);
    cr_assert_str_eq(text, "{\"k\":2}");
    free(text);

    check_metadata("[1.7976931348623157e308, 1e-400]", 11);
    text = metadata_of(11);
    cr_assert_str_eq(text, "[1.7976931348623157e308,0.0]");
    free(text);
}

/* Metadata as deep as a manifest holds saves and reads back; one level
 * more is refused, by begin or wait, never committed unreadable. */
Test(store, metadata_depth_limit)
{
    const size_t most = JSON_PARSER_MAX_DEPTH - 1; /* the manifest's root is one */
    for (size_t levels = most; levels <= most + 1; levels++) {
        char *meta = malloc(2 * levels + 2);
        memset(meta, '[', levels - 1);
        meta[levels - 1] = '1';
        memset(meta + levels, ']', levels - 1);
        meta[2 * levels - 1] = '\0';
        tc_state s;
        tc_state_standard(&s, 12);
        ckpt_store *st = tc_open(tc_root);
        int64_t step = 12 + (int64_t)(levels - most);
        /* refused by begin itself, before anything is written */
        ckpt_save_options so;
        cr_assert_eq(ckpt_save_options_init(&so, CKPT_SAVE_OPTIONS_VERSION), CKPT_OK);
        so.metadata_json = meta;
        ckpt_save *sv = NULL;
        int rc = ckpt_save_begin(&sv, st, step, s.t, s.count, &so);
        if (rc == CKPT_OK)
            rc = ckpt_save_wait(sv);
        ckpt_save_free(sv);
        if (levels == most) {
            cr_assert_eq(rc, CKPT_OK, "%zu levels: %s", levels, ckpt_error_last());
            char *back = metadata_of(step);
            cr_assert_str_eq(back, meta);
            free(back);
        } else {
            cr_assert_eq(rc, CKPT_EINVAL, "%zu levels: %d", levels, rc);
            cr_assert_null(sv, "begin refused it");
            cr_assert(strstr(ckpt_error_last(), "nests deeper"), "%s", ckpt_error_last());
            int64_t latest = -1;
            cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest), CKPT_OK);
            cr_assert_eq(latest, step - 1, "nothing committed");
        }
        ckpt_store_free(st);
        tc_state_free(&s);
        free(meta);
    }
}

/* Metadata with as many arrays as a checkpoint holds saves and reads
 * back; one more is refused by begin, naming the limit (a reader would
 * refuse the manifest: a tree costs far more than its text). */
Test(store, metadata_count_limit)
{
    for (size_t n = MANIFEST_META_MAX_CONTAINERS; n <= MANIFEST_META_MAX_CONTAINERS + 1; n++) {
        char *meta = malloc(3 * n + 1), *o = meta; /* "[[],[],...]": n arrays */
        *o++ = '[';
        for (size_t i = 1; i < n; i++)
            o += sprintf(o, "[]%s", i + 1 < n ? "," : "");
        strcpy(o, "]");
        tc_state s;
        tc_state_standard(&s, 12);
        ckpt_store *st = tc_open(tc_root);
        int64_t step = 20 + (int64_t)(n - MANIFEST_META_MAX_CONTAINERS);
        ckpt_save_options so;
        cr_assert_eq(ckpt_save_options_init(&so, CKPT_SAVE_OPTIONS_VERSION), CKPT_OK);
        so.metadata_json = meta;
        ckpt_save *sv = NULL;
        int rc = ckpt_save_begin(&sv, st, step, s.t, s.count, &so);
        if (rc == CKPT_OK)
            rc = ckpt_save_wait(sv);
        ckpt_save_free(sv);
        if (n == MANIFEST_META_MAX_CONTAINERS) {
            cr_assert_eq(rc, CKPT_OK, "%zu arrays: %s", n, ckpt_error_last());
            char *back = metadata_of(step);
            cr_assert_str_eq(back, meta);
            free(back);
        } else {
            cr_assert_eq(rc, CKPT_EINVAL, "%zu arrays: %d", n, rc);
            cr_assert_null(sv, "begin refused it");
            cr_assert(strstr(ckpt_error_last(), "more than a checkpoint's metadata holds"),
                      "%s", ckpt_error_last());
            char want[96]; /* the counts, exactly: n arrays, each one value */
            snprintf(want, sizeof want, "holds %zu JSON values (%zu of them", n, n);
            cr_assert(strstr(ckpt_error_last(), want), "%s: %s", want, ckpt_error_last());
        }
        ckpt_store_free(st);
        tc_state_free(&s);
        free(meta);
    }
}

Test(store, metadata_none_is_null) { check_metadata(NULL, 4); }
Test(store, metadata_scalar) { check_metadata("42", 5); }
Test(store, metadata_string) { check_metadata("\"run \\\"alpha\\\"\\n\"", 6); }
Test(store, metadata_empty_array) { check_metadata("[]", 7); }

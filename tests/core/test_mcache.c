/* The store's cache of decoded manifests (lib/pipeline/mcache.h): a hit
 * needs the exact bytes and gives an independent copy; when full, the
 * lowest step goes first; the byte budget holds.  And a store reading a
 * step whose manifest was replaced on disk decodes the new bytes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "mcache.h"

TestSuite(mcache, .init = tc_setup, .fini = tc_teardown, .timeout = 300);

/* A decoded manifest of step `step` with one tensor, and its "text". */
static void make(manifest *m, int64_t step, char *text, size_t cap)
{
    memset(m, 0, sizeof *m);
    m->step = step;
    m->tensors = calloc(1, sizeof *m->tensors);
    m->shards = calloc(1, sizeof *m->shards);
    cr_assert(m->tensors && m->shards);
    m->tensors[0].name = strdup("w");
    m->shards[0].file = strdup("rank-00000.shard");
    m->ntensors = m->nshards = 1;
    m->env = json_pack("{s:I}", "step", (json_int_t)step);
    snprintf(text, cap, "manifest of step %lld", (long long)step);
}

Test(mcache, hit_needs_the_same_bytes_and_copies)
{
    mcache *c;
    cr_assert_eq(mcache_create(&c, 4), CKPT_OK);
    manifest m, got;
    char text[64], *meta, *env;
    make(&m, 7, text, sizeof text);
    m.metadata = json_pack("{s:[s,s]}", "tensors", "a", "b");
    cr_assert_eq(mcache_get(c, text, strlen(text), &got, &meta, &env), 0);
    cr_assert(!meta && !env);
    mcache_put(c, text, strlen(text), &m, NULL, NULL); /* texts printed from m */
    manifest_clear(&m); /* the cache holds its own copy */
    cr_assert_eq(mcache_get(c, text, strlen(text), &got, &meta, &env), 1);
    cr_assert_eq(got.step, 7);
    cr_assert_str_eq(got.tensors[0].name, "w");
    cr_assert(!got.env && !got.metadata, "the trees stay out of copies");
    cr_assert_str_eq(env, "{\"step\":7}");
    cr_assert_str_eq(meta, "{\"tensors\":[\"a\",\"b\"]}");
    got.tensors[0].name[0] = 'x'; /* copies: the cached entry is untouched */
    meta[0] = env[0] = '!';
    manifest_clear(&got);
    free(meta);
    free(env);
    cr_assert_eq(mcache_get(c, text, strlen(text), &got, &meta, &env), 1);
    cr_assert_str_eq(got.tensors[0].name, "w");
    cr_assert_str_eq(env, "{\"step\":7}");
    cr_assert_str_eq(meta, "{\"tensors\":[\"a\",\"b\"]}");
    manifest_clear(&got);
    free(meta);
    free(env);
    text[0] ^= 1; /* one byte differs: a miss */
    cr_assert_eq(mcache_get(c, text, strlen(text), &got, &meta, &env), 0);
    cr_assert_eq(mcache_get(c, text, strlen(text) - 1, &got, &meta, &env), 0);
    make(&m, 9, text, sizeof text); /* texts given: kept as given */
    mcache_put(c, text, strlen(text), &m, "[1]", "{}");
    manifest_clear(&m);
    cr_assert_eq(mcache_get(c, text, strlen(text), &got, &meta, &env), 1);
    cr_assert_str_eq(meta, "[1]");
    cr_assert_str_eq(env, "{}");
    manifest_clear(&got);
    free(meta);
    free(env);
    mcache_free(c);
}

/* mcache_get when only the manifest matters. */
static int get(mcache *c, const char *text, size_t len, manifest *m)
{
    char *meta, *env;
    int hit = mcache_get(c, text, len, m, &meta, &env);
    free(meta);
    free(env);
    return hit;
}

Test(mcache, full_drops_the_lowest_step)
{
    mcache *c;
    cr_assert_eq(mcache_create(&c, 3), CKPT_OK);
    char text[6][64];
    manifest m, got;
    int64_t steps[] = {5, 3, 9, 4}; /* 3 goes when 4 comes, then 4 when 1 comes */
    for (int i = 0; i < 4; i++) {
        make(&m, steps[i], text[i], sizeof text[i]);
        mcache_put(c, text[i], strlen(text[i]), &m, NULL, NULL);
        manifest_clear(&m);
    }
    int want[] = {1, 0, 1, 1};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(get(c, text[i], strlen(text[i]), &got), want[i], "step %lld",
                     (long long)steps[i]);
        manifest_clear(&got);
    }
    make(&m, 1, text[4], sizeof text[4]);
    mcache_put(c, text[4], strlen(text[4]), &m, NULL, NULL);
    manifest_clear(&m);
    cr_assert_eq(get(c, text[3], strlen(text[3]), &got), 0, "step 4 stayed");
    cr_assert_eq(get(c, text[4], strlen(text[4]), &got), 1);
    manifest_clear(&got);
    mcache_free(c);
}

Test(mcache, byte_budget)
{
    mcache *c;
    cr_assert_eq(mcache_create(&c, 8), CKPT_OK);
    size_t big = MCACHE_MAX_BYTES / 2 + 1; /* two do not fit */
    char *a = calloc(1, big), *b = calloc(1, big), *huge = calloc(1, MCACHE_MAX_BYTES + 1);
    cr_assert(a && b && huge);
    a[0] = 'a';
    b[0] = 'b';
    manifest m, got;
    char unused[64];
    make(&m, 2, unused, sizeof unused);
    mcache_put(c, a, big, &m, NULL, NULL);
    m.step = 3;
    mcache_put(c, b, big, &m, NULL, NULL);
    mcache_put(c, huge, MCACHE_MAX_BYTES + 1, &m, NULL, NULL); /* over the budget alone: not kept */
    manifest_clear(&m);
    cr_assert_eq(get(c, a, big, &got), 0, "both held: over the budget");
    cr_assert_eq(get(c, b, big, &got), 1);
    manifest_clear(&got);
    cr_assert_eq(get(c, huge, MCACHE_MAX_BYTES + 1, &got), 0);
    free(a);
    free(b);
    free(huge);
    mcache_free(c);
}

/* A step re-saved by another store: this store's cached decoding of the
 * old manifest must not stand for the new bytes. */
Test(mcache, replaced_manifest_is_decoded_again)
{
    tc_state s1, s2;
    tc_state_standard(&s1, 1);
    tc_state_standard(&s2, 2);
    ckpt_store *a = tc_open(tc_root);
    tc_save_ok(a, 4, &s1);
    tc_restore_check(a, 4, &s1); /* cached now */
    ckpt_store_free(a);
    ckpt_store *reader = tc_open_ro(tc_root);
    tc_restore_check(reader, 4, &s1);
    ckpt_store *b = tc_open(tc_root);
    tc_save_ok(b, 4, &s2); /* the same step, other bytes */
    ckpt_store_free(b);
    tc_restore_check(reader, 4, &s2);
    ckpt_store_free(reader);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

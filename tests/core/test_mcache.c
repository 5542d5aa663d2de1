/* The store's cache of decoded manifests (lib/pipeline/mcache.h): a hit
 * needs the exact bytes and shares one decoding, which outlives the cache
 * while held; names are found from many threads; when full, the
 * lowest step goes first; the byte budget holds.  And a store reading a
 * step whose manifest was replaced on disk decodes the new bytes. */
#include <criterion/criterion.h>
#include <pthread.h>
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

/* A decoding of `m` (taken), NULL texts printed from it. */
static mdecoded *made(manifest *m)
{
    mdecoded *d;
    cr_assert_eq(mdecoded_make(&d, m, NULL, NULL), CKPT_OK);
    cr_assert(!m->tensors && !m->env, "taken");
    return d;
}

Test(mcache, hit_needs_the_same_bytes_and_shares)
{
    mcache *c;
    cr_assert_eq(mcache_create(&c, 4), CKPT_OK);
    manifest m;
    char text[64];
    make(&m, 7, text, sizeof text);
    m.metadata = strdup("{\"tensors\":[\"a\",\"b\"]}");
    cr_assert_null(mcache_get(c, text, strlen(text)));
    mdecoded *d = made(&m);
    cr_assert(!d->m.env && !d->m.metadata, "the env tree goes, the texts stay");
    cr_assert_str_eq(d->env_text, "{\"step\":7}");
    cr_assert_str_eq(d->meta_text, "{\"tensors\":[\"a\",\"b\"]}");
    mcache_put(c, text, strlen(text), d);
    mdecoded_release(d); /* the cache holds its own reference */
    mdecoded *got = mcache_get(c, text, strlen(text));
    cr_assert_not_null(got);
    cr_assert_eq(got->m.step, 7);
    cr_assert_str_eq(got->m.tensors[0].name, "w");
    mdecoded *again = mcache_get(c, text, strlen(text));
    cr_assert_eq(again, got, "one decoding, shared");
    mdecoded_release(again);
    text[0] ^= 1; /* one byte differs: a miss */
    cr_assert_null(mcache_get(c, text, strlen(text)));
    text[0] ^= 1;
    cr_assert_null(mcache_get(c, text, strlen(text) - 1));
    mcache_free(c); /* a holder outlives the cache */
    cr_assert_str_eq(got->m.tensors[0].name, "w");
    cr_assert_eq(mdecoded_find(got, "w"), 0);
    cr_assert_eq(mdecoded_find(got, "x"), -1);
    mdecoded_release(got);
    cr_assert_eq(mcache_create(&c, 4), CKPT_OK);
    make(&m, 9, text, sizeof text); /* texts given: kept as given */
    char *meta = strdup("[1]"), *env = strdup("{}");
    cr_assert_eq(mdecoded_make(&d, &m, meta, env), CKPT_OK);
    mcache_put_owned(c, strdup(text), strlen(text), d);
    mdecoded_release(d);
    got = mcache_get(c, text, strlen(text));
    cr_assert_not_null(got);
    cr_assert_str_eq(got->meta_text, "[1]");
    cr_assert_str_eq(got->env_text, "{}");
    mdecoded_release(got);
    mcache_free(c);
}

/* Many names, looked up from several threads at once: the index is made
 * once, and every name is found where it is. */
#define FIND_N 5000
static void *find_all(void *arg)
{
    mdecoded *d = arg;
    char name[32];
    for (int i = FIND_N; i-- > 0;) {
        snprintf(name, sizeof name, "t%d", i);
        if (mdecoded_find(d, name) != i)
            return d; /* not NULL: a failure */
    }
    return mdecoded_find(d, "t") == -1 && mdecoded_find(d, "") == -1 ? NULL : d;
}

Test(mcache, find_from_threads)
{
    manifest m = {0};
    m.tensors = calloc(FIND_N, sizeof *m.tensors);
    cr_assert(m.tensors);
    for (int i = 0; i < FIND_N; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        m.tensors[i].name = strdup(name);
    }
    m.ntensors = FIND_N;
    mdecoded *d = made(&m);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, find_all, mdecoded_ref(d)), 0);
    for (int i = 0; i < 4; i++) {
        void *bad;
        pthread_join(th[i], &bad);
        cr_assert_null(bad, "thread %d", i);
        mdecoded_release(d);
    }
    mdecoded_release(d);
}

/* Whether the cache holds `text`. */
static int get(mcache *c, const char *text, size_t len)
{
    mdecoded *d = mcache_get(c, text, len);
    mdecoded_release(d);
    return d != NULL;
}

/* Put a fresh decoding of step `step` under `text` (len bytes). */
static void put(mcache *c, int64_t step, const char *text, size_t len)
{
    manifest m;
    char unused[64];
    make(&m, step, unused, sizeof unused);
    mdecoded *d = made(&m);
    mcache_put(c, text, len, d);
    mdecoded_release(d);
}

Test(mcache, full_drops_the_lowest_step)
{
    mcache *c;
    cr_assert_eq(mcache_create(&c, 3), CKPT_OK);
    char text[6][64];
    int64_t steps[] = {5, 3, 9, 4}; /* 3 goes when 4 comes, then 4 when 1 comes */
    for (int i = 0; i < 4; i++) {
        snprintf(text[i], sizeof text[i], "manifest of step %lld", (long long)steps[i]);
        put(c, steps[i], text[i], strlen(text[i]));
    }
    int want[] = {1, 0, 1, 1};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(get(c, text[i], strlen(text[i])), want[i], "step %lld",
                     (long long)steps[i]);
    snprintf(text[4], sizeof text[4], "manifest of step 1");
    put(c, 1, text[4], strlen(text[4]));
    cr_assert_eq(get(c, text[3], strlen(text[3])), 0, "step 4 stayed");
    cr_assert_eq(get(c, text[4], strlen(text[4])), 1);
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
    put(c, 2, a, big);
    put(c, 3, b, big);
    put(c, 3, huge, MCACHE_MAX_BYTES + 1); /* over the budget alone: not kept */
    cr_assert_eq(get(c, a, big), 0, "both held: over the budget");
    cr_assert_eq(get(c, b, big), 1);
    cr_assert_eq(get(c, huge, MCACHE_MAX_BYTES + 1), 0);
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

/* Checkpoints opened on a cached decoding keep it while later saves push
 * it out of the cache: their names, metadata and data stay readable, and a
 * lookup by name still works (the decoding is shared, not copied, since
 * an open no longer takes a copy of its own). */
Test(mcache, an_open_checkpoint_outlives_its_cache_entry)
{
    tc_state s1, other;
    tc_state_standard(&s1, 1);
    tc_state_standard(&other, 2);
    ckpt_store *st = tc_open(tc_root);
    cr_assert_eq(tc_save(st, 1, &s1, "{\"epoch\":1}"), CKPT_OK);
    ckpt_checkpoint *a, *b;
    cr_assert_eq(ckpt_checkpoint_open(&a, st, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    cr_assert_eq(ckpt_checkpoint_open(&b, st, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    ckpt_tensor_info ia, ib;
    cr_assert_eq(ckpt_checkpoint_tensor(a, 0, &ia), CKPT_OK);
    cr_assert_eq(ckpt_checkpoint_tensor(b, 0, &ib), CKPT_OK);
    cr_assert_eq(ia.name, ib.name, "two opens of one manifest share its decoding");
    ckpt_checkpoint_free(b);
    for (int64_t step = 2; step <= 80; step++) /* far more than the cache holds */
        tc_save_ok(st, step, &other);
    cr_assert_str_eq(ckpt_checkpoint_metadata(a), "{\"epoch\":1}");
    cr_assert_eq(ckpt_checkpoint_tensor_count(a), s1.count);
    for (size_t i = 0; i < s1.count; i++) {
        ckpt_tensor_info info;
        size_t at;
        cr_assert_eq(ckpt_checkpoint_tensor(a, i, &info), CKPT_OK);
        cr_assert_str_eq(info.name, s1.t[i].name);
        cr_assert_eq(ckpt_checkpoint_find(a, s1.t[i].name, &at), CKPT_OK);
        cr_assert_eq(at, i);
        void *buf = malloc(info.bytes ? info.bytes : 1);
        cr_assert(buf);
        cr_assert_eq(ckpt_checkpoint_read(a, info.name, buf, info.bytes), CKPT_OK,
                     "%s", ckpt_error_last());
        cr_assert(info.bytes == 0 || memcmp(buf, s1.t[i].data, info.bytes) == 0,
                  "tensor %s", info.name);
        free(buf);
    }
    ckpt_checkpoint_free(a);
    tc_restore_check(st, 1, &s1); /* decoded again from the file */
    ckpt_store_free(st);
    tc_state_free(&s1);
    tc_state_free(&other);
}

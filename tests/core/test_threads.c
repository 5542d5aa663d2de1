/* One store used from several threads at once, as ckpt.h allows ("calls
 * on one store are serialised by an internal mutex"): what a call reads
 * of the store after it drops that mutex must not be what another
 * thread's call frees.  A race: under ASan (build-asan) a stray read shows
 * in some runs, not every one (an ASan report of a heap-use-after-free in
 * layout_shown_error, called after the lock was dropped, before the fix). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

TestSuite(threads, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

typedef struct {
    ckpt_store *st;
    const tc_state *s;
    atomic_int *stop;
    int rounds;
    int rc;
    char why[512];
} racer;

/* Begins saves of ever higher steps, each making a new temporary
 * directory (and forgetting the previous one's names). */
static void *saver(void *arg)
{
    racer *r = arg;
    for (int64_t step = 1000; !atomic_load(r->stop); step++) {
        ckpt_save *sv = NULL;
        int rc = ckpt_save_begin(&sv, r->st, step, r->s->t, r->s->count, NULL);
        ckpt_save_free(sv); /* the next begin waits for it */
        if (rc != CKPT_OK) {
            r->rc = rc;
            snprintf(r->why, sizeof r->why, "step %lld: %s", (long long)step,
                     ckpt_error_last());
            break;
        }
    }
    return NULL;
}

/* Begins saves of a step below the newest: refused, and the message of
 * each refusal is formed from the store's paths. */
static void *refused(void *arg)
{
    racer *r = arg;
    for (int i = 0; i < r->rounds; i++) {
        ckpt_save *sv = NULL;
        int rc = ckpt_save_begin(&sv, r->st, 1, r->s->t, r->s->count, NULL);
        ckpt_save_free(sv);
        if (rc != CKPT_EINVAL || !strstr(ckpt_error_last(), "step 1 is below step")) {
            r->rc = rc ? rc : CKPT_EINTERNAL;
            snprintf(r->why, sizeof r->why, "round %d: %s", i, ckpt_error_last());
            break;
        }
    }
    return NULL;
}

Test(threads, a_refused_save_beside_another_threads_saves)
{
    tc_state s;
    tc_state_init(&s);
    int64_t shape[1] = {4};
    tc_state_add(&s, "w", CKPT_F32, 1, shape, TC_RANDOM, 1);
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 2;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(st, 999, &s);
    atomic_int stop = 0;
    racer good = {st, &s, &stop, 0, CKPT_OK, ""};
    racer bad[2] = {{st, &s, &stop, 5000, CKPT_OK, ""}, {st, &s, &stop, 5000, CKPT_OK, ""}};
    pthread_t tg, tb[2];
    cr_assert_eq(pthread_create(&tg, NULL, saver, &good), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&tb[i], NULL, refused, &bad[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(tb[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(tg, NULL);
    ckpt_store_free(st);
    cr_assert_eq(good.rc, CKPT_OK, "%s", good.why);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(bad[i].rc, CKPT_OK, "refused saver %d: %s", i, bad[i].why);
    tc_state_free(&s);
}

/* crashcheck: scenarios and post-crash invariants (crashcheck.h). */
#include "crashcheck.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing.h"

/* Small enough to run thousands of times; each exercises another path:
 * one chunk per tensor, many tensors, a state saved in passes, the
 * replacement of a step with and without an atomic exchange, retention
 * and gc. */
const cc_scenario cc_scenarios[] = {
    {"one-shard", 3, 3000, 16 * 1024, 0, 2, 4, {1, 2, 3, 4}, 0, 0},
    {"many-tensors", 24, 200, 4096, 0, 0, 3, {10, 20, 30}, 1, 0},
    {"passes", 2, 12000, 8192, 16384, 2, 3, {1, 2, 3}, 0, 0},
    {"replace", 3, 2000, 8192, 0, 0, 4, {1, 2, 2, 3}, 0, 0},
    {"replace-no-exchange", 3, 2000, 8192, 0, 0, 4, {1, 2, 2, 3}, 0, 1},
};
const size_t cc_nscenarios = sizeof cc_scenarios / sizeof cc_scenarios[0];

void cc_state(const cc_scenario *sc, int i, tc_state *s)
{
    tc_state_init(s);
    for (int k = 0; k < sc->ntensors; k++) {
        char name[32];
        snprintf(name, sizeof name, "layer%02d.w", k);
        int64_t shape[1] = {sc->elems};
        tc_state_add(s, name, CKPT_F32, 1, shape, k % 2 ? TC_COMPRESSIBLE : TC_RANDOM,
                     (uint64_t)(i + 1) * 1000 + (uint64_t)k);
    }
}

void cc_opts(const cc_scenario *sc, ckpt_store_options *o)
{
    tc_opts(o);
    o->fsync = 1;
    o->keep_last = sc->keep_last;
    o->chunk_bytes = sc->chunk_bytes;
    if (sc->host_memory_limit)
        o->host_memory_limit = sc->host_memory_limit;
    o->verify_after_save = CKPT_VERIFY_FULL;
}

/* ----------------------------------------------------------------- hooks */

static int fault(void *ctx, fsio_op op, const char *path)
{
    cc_hooks *h = ctx;
    int ret = 0;
    pthread_mutex_lock(&h->mu);
    long n = ++h->calls;
    if (h->kill_at && n == h->kill_at)
        raise(SIGKILL); /* a crash exactly before this call */
    if (op == FSIO_RENAME && path) {
        /* A replacement is rename (fails: the step exists), then exchange
         * of the same path: refuse the exchange as old kernels and some
         * file systems do. */
        if (h->sc->no_exchange && strstr(path, "/.tmp-") &&
            strcmp(path, h->last_rename) == 0)
            ret = EINVAL;
        snprintf(h->last_rename, sizeof h->last_rename, "%s", path);
    }
    pthread_mutex_unlock(&h->mu);
    return ret;
}

static void trace(void *ctx, const fsio_event *ev)
{
    cc_hooks *h = ctx;
    if (h->trace)
        ft_on_event(h->trace, ev);
}

void cc_hooks_init(cc_hooks *h, const cc_scenario *sc, fstrace *tr, long kill_at)
{
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    h->sc = sc;
    h->trace = tr;
    h->kill_at = kill_at;
}

void cc_hooks_fsio(cc_hooks *h, fsio *fs)
{
    memset(fs, 0, sizeof *fs);
    fs->fault = fault;
    fs->trace = trace;
    fs->ctx = h;
}

/* ------------------------------------------------------------------ run */

int cc_run(const cc_scenario *sc, const char *root, const fsio *fs, cc_ack_fn ack, void *ctx)
{
    ckpt_store_options o;
    cc_opts(sc, &o);
    ckpt_store *st = NULL;
    int rc = ckpt_store_open_with_fsio(&st, root, &o, fs);
    for (int i = 0; rc == CKPT_OK && i < sc->nsaves; i++) {
        tc_state s;
        cc_state(sc, i, &s);
        rc = tc_save(st, sc->steps[i], &s, NULL);
        tc_state_free(&s);
        if (rc == CKPT_OK && ack)
            ack(ctx, sc->steps[i], i);
    }
    if (rc == CKPT_OK && sc->gc_keep > 0)
        rc = ckpt_store_gc(st, sc->gc_keep, 0, NULL);
    ckpt_store_free(st);
    return rc;
}

/* ---------------------------------------------------------------- check */

/* 1 when restoring `step` gives exactly the state of save `i`. */
static int restores_as(ckpt_store *st, const cc_scenario *sc, int64_t step, int i,
                       int64_t *got_step)
{
    tc_state want, got;
    cc_state(sc, i, &want);
    tc_state_like(&got, &want, 0xA5);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, step, got.t, got.count, NULL, &rep);
    int same = rc == CKPT_OK;
    if (rep && got_step)
        *got_step = ckpt_report_step(rep);
    for (size_t k = 0; same && k < want.count; k++)
        same = memcmp(got.t[k].data, want.t[k].data, (size_t)want.t[k].bytes) == 0;
    ckpt_report_free(rep);
    tc_state_free(&want);
    tc_state_free(&got);
    return same;
}

/* Saves of `step` it may hold: the newest acknowledged one or later. */
static int step_matches(ckpt_store *st, const cc_scenario *sc, const int *acked,
                        int64_t step, int64_t *got_step)
{
    int from = 0;
    for (int i = 0; i < sc->nsaves; i++)
        if (sc->steps[i] == step && acked[i])
            from = i;
    for (int i = from; i < sc->nsaves; i++)
        if (sc->steps[i] == step && restores_as(st, sc, step, i, got_step))
            return 1;
    return 0;
}

int64_t cc_check(const cc_scenario *sc, const char *root, const int *acked, const char *what)
{
    ckpt_store_options o;
    cc_opts(sc, &o);
    o.fsync = 0;
    o.keep_last = 0;
    ckpt_store *st = NULL;
    int rc = ckpt_store_open(&st, root, &o);
    cr_assert_eq(rc, CKPT_OK, "%s: reopen = %s: %s", what, ckpt_status_name(rc),
                 ckpt_error_last());
    int left = tc_count_prefix(root, ".tmp-") + tc_count_prefix(root, ".trash-") +
               tc_count_prefix(root, ".replaced-");
    cr_assert_eq(left, 0, "%s: a temporary directory survived the reopen", what);
    size_t n;
    int64_t *steps = tc_steps(st, &n);
    for (size_t i = 0; i < n; i++) {
        rc = ckpt_verify(st, steps[i], CKPT_VERIFY_FULL, NULL);
        cr_assert_eq(rc, CKPT_OK, "%s: step %" PRId64 " is listed but does not verify: %s",
                     what, steps[i], ckpt_error_last());
        cr_assert(step_matches(st, sc, acked, steps[i], NULL),
                  "%s: step %" PRId64 " does not restore to the data of its newest "
                  "acknowledged save or a later one", what, steps[i]);
    }
    int64_t newest_acked = -1;
    for (int i = 0; i < sc->nsaves; i++)
        if (acked[i] && sc->steps[i] > newest_acked)
            newest_acked = sc->steps[i];
    int64_t latest = -1;
    if (n) {
        int64_t got = -1;
        cr_assert(step_matches(st, sc, acked, steps[n - 1], NULL));
        cr_assert(ckpt_store_latest(st, CKPT_VERIFY_FULL, &latest) == CKPT_OK,
                  "%s: steps are listed but none is the latest: %s", what, ckpt_error_last());
        int any = 0;
        for (int i = 0; i < sc->nsaves && !any; i++)
            any = sc->steps[i] == latest && restores_as(st, sc, CKPT_LATEST, i, &got);
        cr_assert(any && got == latest, "%s: restore(LATEST) took step %" PRId64
                  ", ckpt_store_latest says %" PRId64, what, got, latest);
    }
    cr_assert(latest >= newest_acked, "%s: step %" PRId64 " was acknowledged but the "
              "newest valid step is %" PRId64, what, newest_acked, latest);
    ckpt_free(steps);
    ckpt_store_free(st);
    return latest;
}

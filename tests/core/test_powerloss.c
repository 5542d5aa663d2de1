/* Power-loss simulation.  Each scenario of crashcheck.c is saved once with
 * every file-system call recorded (fstrace.h); then, for every crash point
 * of the record (each fsync and rename) and several fates of what had not
 * been synced (all kept, all lost, random mixes of kept, lost and garbled
 * writes and of surviving directory changes), the state the disk could be
 * left in is written out and the invariants of crashcheck.h are checked
 * on it: the newest acknowledged step (or a newer committed one) restores
 * bit-exactly, nothing torn is listed or chosen, ckpt_store_latest agrees.
 *
 * CI runs a few hundred states.  CKPT_POWERLOSS_SEEDS=N runs N random
 * fates per crash point (the long mode: 200 gives over 20,000 states). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "crashcheck.h"
#include "helpers.h"

TestSuite(powerloss, .init = tc_setup, .fini = tc_teardown, .timeout = 3600);

static void on_ack(void *ctx, int64_t step, int i)
{
    ft_ack(ctx, step, i);
}

static long seeds_per_point(void)
{
    const char *s = getenv("CKPT_POWERLOSS_SEEDS");
    long n = s ? strtol(s, NULL, 10) : 2;
    return n > 0 ? n : 2;
}

static void simulate(const cc_scenario *sc)
{
    char *rec = tc_join(tc_root, "recorded");
    cr_assert_eq(mkdir(rec, 0755), 0);
    fstrace *t = ft_new(rec);
    cc_hooks h;
    cc_hooks_init(&h, sc, t, 0);
    fsio fs;
    cc_hooks_fsio(&h, &fs);
    ft_record(t, 1);
    int rc = cc_run(sc, rec, &fs, on_ack, t);
    ft_record(t, 0);
    cr_assert_eq(rc, CKPT_OK, "%s: the recorded run failed: %s", sc->name, ckpt_error_last());

    long seeds = seeds_per_point();
    size_t count = ft_count(t), states = 0, points = 0, changed = 0, with_step = 0;
    int acked[CC_MAX_SAVES] = {0};
    for (size_t k = 0; k <= count; k++) {
        if (k > 0 && ft_get(t, k - 1)->op == FT_ACK)
            acked[ft_get(t, k - 1)->tag] = 1;
        if (k < count && !ft_is_crash_point(t, k))
            continue;
        points++;
        for (long f = 0; f < seeds + 2; f++) {
            enum ft_fate fate = f == 0 ? FT_KEEP_ALL : f == 1 ? FT_DROP_ALL : FT_RANDOM;
            char name[64], what[160];
            snprintf(name, sizeof name, "state-%zu-%ld", k, f);
            char *out = tc_join(tc_root, name);
            changed += ft_materialize(t, k, fate, (uint64_t)(k * 1000 + (size_t)f), out);
            snprintf(what, sizeof what, "%s, crash before event %zu of %zu, fate %ld",
                     sc->name, k, count, f);
            with_step += cc_check(sc, out, acked, what) >= 0;
            tc_rmtree(out);
            free(out);
            states++;
        }
    }
    fprintf(stderr, "powerloss %s: %zu events, %zu crash points, %zu states checked "
            "(%zu with a step to restore), %zu unsynced writes or directory changes "
            "lost or garbled\n", sc->name, count, points, states, with_step, changed);
    cr_assert(states > 10 && with_step > 0);
    ft_free(t);
    free(rec);
}

Test(powerloss, one_shard) { simulate(&cc_scenarios[0]); }
Test(powerloss, many_tensors) { simulate(&cc_scenarios[1]); }
Test(powerloss, passes) { simulate(&cc_scenarios[2]); }
Test(powerloss, replace) { simulate(&cc_scenarios[3]); }
Test(powerloss, replace_no_exchange) { simulate(&cc_scenarios[4]); }

/* crashcheck: save scenarios ("layouts") run against a store whose file
 * system calls are watched, and the invariants that must hold on what a
 * crash at any point of one leaves behind:
 *  - a writer's open succeeds and leaves no temporary, trash or
 *    moved-aside directory;
 *  - every listed step passes full verification and restores bit-exactly
 *    to the data of one of the saves of that step (the newest acknowledged
 *    one or a later one): nothing torn is ever listed;
 *  - once any save was acknowledged, the newest valid step is at least the
 *    newest acknowledged step, restore(LATEST) takes it, and
 *    ckpt_store_latest(FULL) names the same step.
 * Used by the power-loss simulation (test_powerloss.c) and the SIGKILL
 * harness (test_crash.c). */
#ifndef TCORE_CRASHCHECK_H
#define TCORE_CRASHCHECK_H

#include <pthread.h>
#include <stdint.h>

#include "ckpt.h"
#include "fstrace.h"
#include "helpers.h"

#define CC_MAX_SAVES 8

typedef struct cc_scenario {
    const char *name;
    int ntensors;               /* f32 tensors per state */
    int64_t elems;              /* elements per tensor */
    uint64_t chunk_bytes;
    uint64_t host_memory_limit; /* 0: default; small: the state goes in passes */
    int keep_last;              /* retention after each commit */
    int nsaves;
    int64_t steps[CC_MAX_SAVES]; /* the saves in order; a repeat replaces */
    int gc_keep;                /* > 0: ckpt_store_gc(keep) after the saves */
    int no_exchange;            /* file system without RENAME_EXCHANGE */
} cc_scenario;

extern const cc_scenario cc_scenarios[];
extern const size_t cc_nscenarios;

/* The state save number `i` of a scenario writes. */
void cc_state(const cc_scenario *sc, int i, tc_state *s);
/* The store options of a scenario (fsync on). */
void cc_opts(const cc_scenario *sc, ckpt_store_options *o);

/* The fsio hooks a scenario runs under: no_exchange emulation, an
 * optional SIGKILL at the kill_at-th call (1-based, counting every fault
 * hook call), an optional trace recorder, and a call counter. */
typedef struct cc_hooks {
    pthread_mutex_t mu;
    const cc_scenario *sc;
    fstrace *trace;     /* may be NULL */
    long kill_at;       /* 0: never */
    long calls;
    char last_rename[512];
} cc_hooks;

void cc_hooks_init(cc_hooks *h, const cc_scenario *sc, fstrace *trace, long kill_at);
void cc_hooks_fsio(cc_hooks *h, fsio *fs);

/* Called after each acknowledged save (number i, of `step`). */
typedef void (*cc_ack_fn)(void *ctx, int64_t step, int i);
/* Open `root` through `fs`, run every save of the scenario (then gc),
 * calling `ack` after each save that returned OK.  Returns CKPT_OK or the
 * first failure (then stops). */
int cc_run(const cc_scenario *sc, const char *root, const fsio *fs, cc_ack_fn ack,
           void *ctx);

/* Check the invariants on `root`; acked[i] is 1 when save i was
 * acknowledged before the crash.  `what` names the case in failures.
 * Returns the step restore(LATEST) took, or -1 when there was none. */
int64_t cc_check(const cc_scenario *sc, const char *root, const int *acked,
                 const char *what);

#endif

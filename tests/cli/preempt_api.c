/* preempt_api: the ckpt_preempt_* contract, checked without a framework
 * (exit 0 when every check holds). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ckpt.h"

static int failures;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                    \
        }                                                                  \
    } while (0)

static int disposition_is_default(int sig)
{
    struct sigaction sa;
    sigaction(sig, NULL, &sa);
    return sa.sa_handler == SIG_DFL;
}

static void usr2_handler(int sig)
{
    (void)sig;
}

int main(void)
{
    /* Start from default dispositions whatever we inherited (nohup, for
     * one, starts us with SIGHUP ignored): the checks compare against them. */
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    CHECK(ckpt_preempt_requested() == 0);

    /* defaults: SIGTERM and SIGUSR1; the first signal wins until reset */
    CHECK(ckpt_preempt_watch(NULL, 0) == CKPT_OK);
    CHECK(!disposition_is_default(SIGTERM) && !disposition_is_default(SIGUSR1));
    raise(SIGUSR1);
    CHECK(ckpt_preempt_requested() == SIGUSR1);
    raise(SIGTERM); /* does not kill: watched */
    CHECK(ckpt_preempt_requested() == SIGUSR1);
    ckpt_preempt_reset();
    CHECK(ckpt_preempt_requested() == 0);
    raise(SIGTERM);
    CHECK(ckpt_preempt_requested() == SIGTERM);
    ckpt_preempt_reset();

    /* unwatch restores what was there before */
    ckpt_preempt_unwatch();
    CHECK(disposition_is_default(SIGTERM) && disposition_is_default(SIGUSR1));

    /* a chosen set; watching again replaces it and restores the old ones */
    struct sigaction mine;
    memset(&mine, 0, sizeof mine);
    mine.sa_handler = usr2_handler;
    sigaction(SIGUSR2, &mine, NULL);
    int sigs[] = {SIGUSR2, SIGHUP, SIGUSR2};
    CHECK(ckpt_preempt_watch(sigs, 3) == CKPT_OK);
    raise(SIGHUP);
    CHECK(ckpt_preempt_requested() == SIGHUP);
    ckpt_preempt_reset();
    int term[] = {SIGTERM};
    CHECK(ckpt_preempt_watch(term, 1) == CKPT_OK);
    struct sigaction now;
    sigaction(SIGUSR2, NULL, &now);
    CHECK(now.sa_handler == usr2_handler);
    CHECK(disposition_is_default(SIGHUP));
    raise(SIGTERM);
    CHECK(ckpt_preempt_requested() == SIGTERM);
    ckpt_preempt_reset();
    ckpt_preempt_unwatch();
    CHECK(disposition_is_default(SIGTERM));

    /* bad arguments */
    int bad[] = {SIGKILL};
    CHECK(ckpt_preempt_watch(bad, 1) == CKPT_EINVAL);
    CHECK(ckpt_error_last()[0] != '\0');
    int bad2[] = {0};
    CHECK(ckpt_preempt_watch(bad2, 1) == CKPT_EINVAL);
    CHECK(ckpt_preempt_watch(NULL, 2) == CKPT_EINVAL);
    CHECK(disposition_is_default(SIGTERM)); /* a refused watch changes nothing */
    ckpt_preempt_unwatch(); /* harmless when nothing is watched */

    printf("preempt_api: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

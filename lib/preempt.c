/* preempt: turn preemption signals into a flag the training loop polls.
 *
 * The handler only stores the signal number in a volatile sig_atomic_t,
 * which is all that is async-signal-safe; the loop does the real work
 * (save, wait, exit CKPT_EXIT_PREEMPTED) outside signal context. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "ckpt.h"
#include "error.h"

#ifndef NSIG
#define NSIG 65
#endif

/* Written by the handler, read and cleared by the loop. */
static volatile sig_atomic_t requested;

/* Dispositions before ckpt_preempt_watch(), for ckpt_preempt_unwatch().
 * Touched only under `watch_lock`, never by the handler. */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction saved[NSIG];
static unsigned char watched[NSIG];

static void on_signal(int sig)
{
    /* Keep the first: it says why the job is stopping.  The other watched
     * signals are blocked while this runs, so the check cannot race. */
    if (!requested)
        requested = sig;
}

static void unwatch_locked(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        if (watched[sig]) {
            sigaction(sig, &saved[sig], NULL);
            watched[sig] = 0;
        }
    }
}

CKPT_API int ckpt_preempt_watch(const int *signals, size_t count)
{
    static const int defaults[] = {SIGTERM, SIGUSR1};
    struct sigaction sa;
    int rc = CKPT_OK;

    if (!signals || count == 0) {
        if (signals == NULL && count != 0)
            return ckpt_seterr(CKPT_EINVAL, "ckpt_preempt_watch: signals is NULL but count is %zu",
                               count);
        signals = defaults;
        count = sizeof defaults / sizeof defaults[0];
    }
    for (size_t i = 0; i < count; i++) {
        int sig = signals[i];
        if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP)
            return ckpt_seterr(CKPT_EINVAL, "ckpt_preempt_watch: signal %d cannot be watched",
                               sig);
    }

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    /* Restart interrupted system calls: the loop should not see EINTR
     * from its file or CUDA calls because a preemption notice arrived. */
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < count; i++)
        sigaddset(&sa.sa_mask, signals[i]);

    pthread_mutex_lock(&watch_lock);
    /* A second watch replaces the first: start from the original state. */
    unwatch_locked();
    for (size_t i = 0; i < count; i++) {
        int sig = signals[i];
        if (watched[sig])
            continue; /* listed twice */
        if (sigaction(sig, &sa, &saved[sig]) != 0) {
            int err = errno;
            unwatch_locked();
            rc = ckpt_seterr(CKPT_EINVAL, "ckpt_preempt_watch: sigaction(%d): %s", sig,
                             strerror(err));
            break;
        }
        watched[sig] = 1;
    }
    pthread_mutex_unlock(&watch_lock);
    return rc;
}

CKPT_API int ckpt_preempt_requested(void)
{
    return (int)requested;
}

CKPT_API void ckpt_preempt_reset(void)
{
    requested = 0;
}

CKPT_API void ckpt_preempt_unwatch(void)
{
    pthread_mutex_lock(&watch_lock);
    unwatch_locked();
    pthread_mutex_unlock(&watch_lock);
}

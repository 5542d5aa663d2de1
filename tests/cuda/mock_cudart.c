/* A CUDA runtime on host memory, for tests (see mock_cudart.h): its state,
 * the helpers of mock_cudart_impl.h, the streams' engine and the control
 * interface; the runtime functions are mock_cudart_api.c's.
 *
 * One mutex (g_mu) guards every field below and one condition variable
 * (g_cv) is broadcast on any progress; stream threads run operations with
 * the mutex released.  Simple rather than fast: tests move megabytes. */
#include "mock_cudart_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ----------------------------------------------------------------- state */

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
struct mstream *g_default[MAX_DEVICES]; /* legacy default streams */
struct mstream *g_streams;  /* all live streams */
struct alloc *g_allocs;
size_t g_nallocs, g_capallocs;
struct fault g_faults[MAX_FAULTS];
struct counted g_counted[MAX_COUNTED];
int g_sticky;
unsigned g_copy_delay_us;
int g_device_count = 1;
/* mock_cuda_set_adjacent: the region device allocations are carved from */
char *g_adj_base;
size_t g_adj_cap, g_adj_used;
int g_adj_on;
size_t g_device_total = (size_t)4 << 30;
size_t g_reported_free = SIZE_MAX; /* cudaMemGetInfo's lie, if any */
unsigned g_queue_depth = 1024;     /* pending operations per stream */
unsigned g_sync_records = 56;      /* pending blocking-sync records per stream */
mock_cuda_counters g_cnt;
__thread int t_device;
/* A driver-API context the test made current on this thread, and whether
 * any is in use (then no primary context counts as active): see
 * mock_cuda_set_user_context. */
__thread void *t_user_context;
int g_user_context;
__thread int t_last_error;
__thread struct mstream *t_per_thread[MAX_DEVICES]; /* cudaStreamPerThread */
__thread int t_capture_mode; /* cudaStreamCaptureModeGlobal (0) until exchanged */
__thread mock_cuda_thread_counters t_cnt;

/* ------------------------------------------------------------ utilities */

struct counted *counted_for(const char *fn)
{
    for (int i = 0; i < MAX_COUNTED; i++) {
        if (g_counted[i].fn[0] == 0) {
            snprintf(g_counted[i].fn, sizeof g_counted[i].fn, "%s", fn);
            return &g_counted[i];
        }
        if (strcmp(g_counted[i].fn, fn) == 0)
            return &g_counted[i];
    }
    return &g_counted[MAX_COUNTED - 1];
}

static int is_release(const char *fn)
{
    return strstr(fn, "Destroy") || strcmp(fn, "cudaFree") == 0 ||
           strcmp(fn, "cudaFreeHost") == 0;
}

/* Called with g_mu held at the entry of every runtime function.  Returns
 * the error to fail with now, or 0; *async_err gets an error for the
 * stream operation to fail with later.  A sticky error fails everything
 * except releases, which report it but still release (as a lost device
 * takes its resources along), so leak checks stay meaningful. */
int g_release_err;

/* Calls that do not make the runtime create (or bind to) the calling
 * thread's current device's primary context.  Every other call does, as
 * the real runtime's lazy initialisation does: a library thread that never
 * chose a device creates a context on device 0 with its first call. */
static int needs_context(const char *fn)
{
    static const char *const free_calls[] = {
        "cudaGetDevice", "cudaGetDeviceCount", "cudaDriverGetVersion",
        "cudaRuntimeGetVersion", "cudaGetDeviceProperties",
        "cudaSetDevice", /* counted for the device it selects */
        /* not cudaPointerGetAttributes: it runs in (and creates) the current
         * device's context, which is why PyTorch's isPinnedPtr switches to a
         * device with a primary context before calling it */
    };
    for (size_t i = 0; i < sizeof free_calls / sizeof free_calls[0]; i++)
        if (strcmp(fn, free_calls[i]) == 0)
            return 0;
    return 1;
}

void touch_context(int dev)
{
    if (dev >= 0 && dev < MAX_DEVICES)
        g_cnt.context_mask |= 1u << dev;
}

/* Calls a capture forbids ("potentially unsafe": they are not stream
 * operations, so a graph would not replay them, or they wait on work). */
static int capture_unsafe(const char *fn)
{
    static const char *const unsafe[] = {
        "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "cudaEventQuery",
        "cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize",
    };
    for (size_t i = 0; i < sizeof unsafe / sizeof unsafe[0]; i++)
        if (strcmp(fn, unsafe[i]) == 0)
            return 1;
    return 0;
}

/* g_mu held.  The runtime's capture interaction rules
 * (cudaThreadExchangeStreamCaptureMode): a thread in global mode may not
 * make an unsafe call while it has a capture of its own that is not
 * relaxed, or while any other thread has one begun in global mode; in
 * thread-local mode only its own captures count; relaxed threads may.  A
 * forbidden call fails and invalidates the captures concerned. */
static int capture_forbids(const char *fn)
{
    if (t_capture_mode == 2 || !capture_unsafe(fn))
        return 0;
    int hit = 0;
    for (struct mstream *o = g_streams; o; o = o->next_all) {
        if (!o->capturing || o->origin)
            continue;
        int mine = pthread_equal(o->capturer, pthread_self());
        if ((mine && o->capture_mode != 2) ||
            (!mine && t_capture_mode == 0 && o->capture_mode == 0)) {
            o->invalidated = 1;
            hit = 1;
        }
    }
    if (hit)
        g_cnt.capture_breaks++;
    if (hit && getenv("MOCK_DEBUG_CAPTURE"))
        fprintf(stderr, "mock: %s refused during a capture (thread mode %d)\n", fn,
                t_capture_mode);
    return hit ? cudaErrorStreamCaptureUnsupported : 0;
}

int enter(const char *fn, int *async_err)
{
    struct counted *c = counted_for(fn);
    c->calls++;
    if (needs_context(fn)) {
        if (getenv("MOCK_DEBUG_CTX") && !(g_cnt.context_mask & (1u << t_device)))
            fprintf(stderr, "mock: %s creates a context on device %d\n", fn, t_device);
        touch_context(t_device);
    }
    if (async_err)
        *async_err = 0;
    g_release_err = 0;
    if (g_sticky) {
        if (!is_release(fn))
            return g_sticky;
        g_release_err = g_sticky;
    }
    int forbidden = capture_forbids(fn);
    if (forbidden)
        return forbidden;
    for (int i = 0; i < MAX_FAULTS; i++) {
        struct fault *f = &g_faults[i];
        if (!f->active || strcmp(f->fn, fn) != 0)
            continue;
        f->seen++;
        if (f->nth > 0 && f->seen != f->nth)
            continue;
        f->fired++;
        c->fired++;
        if (f->nth > 0)
            f->active = 0;
        if ((f->flags & MOCK_FAULT_STICKY) ||
            (is_sticky_error(f->err) && !(f->flags & MOCK_FAULT_ASYNC)))
            g_sticky = f->err;
        if ((f->flags & MOCK_FAULT_ASYNC) && async_err) {
            *async_err = f->err;
            return 0;
        }
        return f->err;
    }
    return 0;
}

cudaError_t ret(cudaError_t e)
{
    if (e)
        t_last_error = e;
    return e;
}

struct alloc *find_alloc(const void *p)
{
    const char *c = p;
    for (size_t i = 0; i < g_nallocs; i++)
        if (c >= g_allocs[i].p && c < g_allocs[i].p + g_allocs[i].n)
            return &g_allocs[i];
    return NULL;
}

int add_alloc(char *p, size_t n, enum alloc_kind kind)
{
    if (g_nallocs == g_capallocs) {
        size_t cap = g_capallocs ? g_capallocs * 2 : 64;
        struct alloc *a = realloc(g_allocs, cap * sizeof *a);
        if (!a)
            return -1;
        g_allocs = a;
        g_capallocs = cap;
    }
    g_allocs[g_nallocs++] = (struct alloc){ p, n, kind, t_device };
    return 0;
}

int remove_alloc(const void *p, enum alloc_kind kind, size_t *n)
{
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].p == p && g_allocs[i].kind == kind) {
            *n = g_allocs[i].n;
            g_allocs[i] = g_allocs[--g_nallocs];
            return 0;
        }
    }
    return -1;
}

void event_unref(struct mevent *e)
{
    if (--e->refs == 0)
        free(e);
}

/* ---------------------------------------------------------------- streams */

static void *stream_main(void *arg)
{
    struct mstream *s = arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&g_cv, &g_mu);
        if (!s->head)
            break;
        struct op *op = s->head;
        switch (op->kind) {
        case OP_COPY:
            if (op->err || g_sticky) { /* a lost device copies nothing */
                if (!s->pending_err)
                    s->pending_err = op->err ? op->err : g_sticky;
                if (is_sticky_error(op->err))
                    g_sticky = op->err; /* the context is lost for good */
                break;
            } else {
                unsigned delay = g_copy_delay_us;
                pthread_mutex_unlock(&g_mu);
                if (delay)
                    usleep(delay);
                memmove(op->dst, op->src, op->n);
                pthread_mutex_lock(&g_mu);
                g_cnt.copies++;
            }
            break;
        case OP_MEMSET:
            pthread_mutex_unlock(&g_mu);
            memset(op->dst, op->value, op->n);
            pthread_mutex_lock(&g_mu);
            break;
        case OP_HOSTFN:
            pthread_mutex_unlock(&g_mu);
            op->fn(op->arg);
            pthread_mutex_lock(&g_mu);
            break;
        case OP_RECORD:
            if (!op->quiet) {
                op->ev->err = s->pending_err;
                s->pending_err = 0;
            }
            if (op->ev->done_gen < op->gen)
                op->ev->done_gen = op->gen;
            event_unref(op->ev);
            break;
        case OP_WAIT:
            while (op->ev->done_gen < op->gen)
                pthread_cond_wait(&g_cv, &g_mu);
            event_unref(op->ev);
            break;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        if (op->sync_record)
            s->sync_pending--;
        s->done++;
        free(op);
        pthread_cond_broadcast(&g_cv);
    }
    /* destroyed and drained: unlink and free */
    for (struct mstream **pp = &g_streams; *pp; pp = &(*pp)->next_all) {
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    }
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    free(s);
    return NULL;
}

/* g_mu held. */
struct mstream *stream_new(void)
{
    struct mstream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, stream_main, s) != 0) {
        pthread_attr_destroy(&attr);
        free(s);
        return NULL;
    }
    pthread_attr_destroy(&attr);
    s->next_all = g_streams;
    g_streams = s;
    return s;
}

/* g_mu held.  NULL and cudaStreamLegacy (1) are the calling thread's
 * current device's legacy default stream, one per device; cudaStreamPerThread
 * (2) is the calling thread's own default stream on that device. */
struct mstream *resolve_stream(cudaStream_t s)
{
    if ((uintptr_t)s <= 2) {
        int d = t_device >= 0 && t_device < MAX_DEVICES ? t_device : 0;
        struct mstream **slot = (uintptr_t)s == 2 ? &t_per_thread[d] : &g_default[d];
        if (!*slot) {
            *slot = stream_new();
            if (*slot) {
                (*slot)->device = d;
                (*slot)->blocking = 1;
            }
        }
        return *slot;
    }
    return s;
}

static void queue_op(struct mstream *s, struct op *op);

/* g_mu held: `waiter`'s next operation starts after the work queued so
 * far on `on` (a record of the mock's own on `on`, a wait on `waiter`). */
static void stream_after(struct mstream *waiter, struct mstream *on)
{
    if (!on || on == waiter || on->destroyed || on->capturing || on->enq == on->done)
        return;
    struct mevent *e = calloc(1, sizeof *e);
    struct op *rec = calloc(1, sizeof *rec), *w = calloc(1, sizeof *w);
    if (!e || !rec || !w) {
        free(e), free(rec), free(w);
        return;
    }
    e->device = on->device;
    e->flags = 0x1u;
    e->refs = 2;
    *rec = (struct op){ .kind = OP_RECORD, .ev = e, .gen = ++e->record_gen, .quiet = 1 };
    *w = (struct op){ .kind = OP_WAIT, .ev = e, .gen = e->record_gen };
    queue_op(on, rec);
    queue_op(waiter, w);
}

/* g_mu held.  CUDA's legacy default stream: work queued on it waits for
 * the work queued before on every blocking stream of its device (the
 * per-thread default streams included), and work queued on a blocking
 * stream waits for the legacy stream's. */
static void legacy_order(struct mstream *s)
{
    int d = s->device >= 0 && s->device < MAX_DEVICES ? s->device : 0;
    if (s == g_default[d]) {
        for (struct mstream *o = g_streams; o; o = o->next_all)
            if (o->blocking && o->device == d)
                stream_after(s, o);
    } else if (s->blocking) {
        stream_after(s, g_default[d]);
    }
}

/* g_mu held.  A stream in capture records the operation into its graph
 * instead of running it (freed here: the mock's graphs hold nothing).
 * Otherwise the operation is queued; past g_queue_depth pending operations
 * the enqueueing thread blocks until the stream makes room, as CUDA's
 * bounded push buffer does.  Returns 1 when the operation was captured. */
int enqueue(struct mstream *s, struct op *op)
{
    if (s->capturing) {
        if (op->ev)
            event_unref(op->ev);
        free(op);
        g_cnt.captured_ops++;
        return 1;
    }
    legacy_order(s);
    queue_op(s, op);
    return 0;
}

/* g_mu held: append op to s, blocking while s is full. */
static void queue_op(struct mstream *s, struct op *op)
{
    if (s->enq - s->done >= g_queue_depth) {
        g_cnt.enqueue_waits++;
        t_cnt.enqueue_waits++;
        while (s->enq - s->done >= g_queue_depth)
            pthread_cond_wait(&g_cv, &g_mu);
    }
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->enq++;
    pthread_cond_broadcast(&g_cv);
}

/* g_mu held: the capture origin of s, or NULL. */
struct mstream *capture_origin(struct mstream *s)
{
    return s->capturing ? (s->origin ? s->origin : s) : NULL;
}

/* g_mu held: a call not allowed on a capturing stream breaks its capture. */
int capture_violation(struct mstream *s)
{
    struct mstream *o = capture_origin(s);
    if (!o)
        return 0;
    o->invalidated = 1;
    return cudaErrorStreamCaptureUnsupported;
}

/* g_mu held */
int stream_sync_locked(struct mstream *s)
{
    uint64_t target = s->enq;
    while (s->done < target)
        pthread_cond_wait(&g_cv, &g_mu);
    int err = s->pending_err;
    s->pending_err = 0;
    return err;
}

/* g_mu held.  Waits until every stream is idle.  A stream may be destroyed
 * and freed while we wait, so the walk restarts from the list head after
 * every wait instead of following a pointer that may be stale. */
void drain_all_locked(void)
{
again:
    for (struct mstream *s = g_streams; s; s = s->next_all) {
        if (s->done < s->enq) {
            pthread_cond_wait(&g_cv, &g_mu);
            goto again;
        }
    }
}

void *aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 256, n ? n : 1) != 0)
        return NULL;
    return p;
}

/* --------------------------------------------------------------- control */

EXPORT void mock_cuda_set_reported_free(size_t bytes)
{
    pthread_mutex_lock(&g_mu);
    g_reported_free = bytes;
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_set_adjacent(size_t region)
{
    pthread_mutex_lock(&g_mu);
    if (region && !g_adj_base && (g_adj_base = aligned(region)))
        g_adj_cap = region; /* once per process: carved blocks may outlive a test */
    g_adj_on = region != 0 && g_adj_base;
    pthread_mutex_unlock(&g_mu);
}

/* The driver's cuMemGetAddressRange (the _v2 ABI, what cuda.h maps the
 * name to): the base and size of the device allocation holding dptr. */
EXPORT int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size,
                                   unsigned long long dptr)
{
    pthread_mutex_lock(&g_mu);
    struct alloc *a = find_alloc((const void *)(uintptr_t)dptr);
    int ok = a && a->kind != A_PINNED;
    if (ok) {
        if (base)
            *base = (unsigned long long)(uintptr_t)a->p;
        if (size)
            *size = a->n;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? 0 : 1; /* CUDA_ERROR_INVALID_VALUE */
}

EXPORT void mock_cuda_set_queue_depth(unsigned int ops)
{
    pthread_mutex_lock(&g_mu);
    g_queue_depth = ops ? ops : 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_set_sync_records(unsigned int records)
{
    pthread_mutex_lock(&g_mu);
    g_sync_records = records ? records : 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_get_thread_counters(mock_cuda_thread_counters *out)
{
    *out = t_cnt;
}

EXPORT void mock_cuda_forget_contexts(void)
{
    pthread_mutex_lock(&g_mu);
    /* A device holding memory has a context: only the others are forgotten
     * (the driver's primary context state would say so). */
    unsigned mask = 0;
    for (size_t i = 0; i < g_nallocs; i++)
        if (g_allocs[i].kind != A_PINNED && g_allocs[i].device >= 0 &&
            g_allocs[i].device < MAX_DEVICES)
            mask |= 1u << g_allocs[i].device;
    g_cnt.context_mask = mask;
    pthread_mutex_unlock(&g_mu);
}

static void arm(const char *fn, long nth, int err, unsigned flags)
{
    for (int i = 0; i < MAX_FAULTS; i++) {
        if (!g_faults[i].active) {
            g_faults[i] = (struct fault){ .nth = nth, .err = err, .flags = flags,
                                          .active = 1 };
            snprintf(g_faults[i].fn, sizeof g_faults[i].fn, "%s", fn);
            return;
        }
    }
    fprintf(stderr, "mock_cudart: too many faults armed\n");
    abort();
}

EXPORT void mock_cuda_reset(void)
{
    pthread_mutex_lock(&g_mu);
    /* Work queued before the reset belongs to the faulted device: let the
     * streams drain it (failing, while the sticky error holds) so that none
     * of it fails or lands after the device "comes back". */
    drain_all_locked();
    memset(g_faults, 0, sizeof g_faults);
    g_sticky = 0;
    for (struct mstream *s = g_streams; s; s = s->next_all)
        s->pending_err = 0; /* errors left over from the faults */
    g_copy_delay_us = 0;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_fault(const char *fn, int nth, int err, unsigned int flags)
{
    pthread_mutex_lock(&g_mu);
    arm(fn, nth, err, flags);
    pthread_mutex_unlock(&g_mu);
}

EXPORT long mock_cuda_fault_fired(const char *fn)
{
    pthread_mutex_lock(&g_mu);
    long n = counted_for(fn)->fired;
    pthread_mutex_unlock(&g_mu);
    return n;
}

EXPORT long mock_cuda_calls(const char *fn)
{
    pthread_mutex_lock(&g_mu);
    long n = counted_for(fn)->calls;
    pthread_mutex_unlock(&g_mu);
    return n;
}

EXPORT void mock_cuda_set_copy_delay_us(unsigned int us)
{
    pthread_mutex_lock(&g_mu);
    g_copy_delay_us = us;
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_set_device_count(int n)
{
    pthread_mutex_lock(&g_mu);
    g_device_count = n;
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_set_device_memory(size_t total)
{
    pthread_mutex_lock(&g_mu);
    g_device_total = total;
    pthread_mutex_unlock(&g_mu);
}

EXPORT void mock_cuda_get_counters(mock_cuda_counters *out)
{
    pthread_mutex_lock(&g_mu);
    *out = g_cnt;
    pthread_mutex_unlock(&g_mu);
}

/* MOCK_CUDA_FAULTS="fn:nth:err[:async][:sticky],..." and friends. */
__attribute__((constructor)) static void mock_init(void)
{
    const char *v = getenv("MOCK_CUDA_COPY_DELAY_US");
    if (v)
        g_copy_delay_us = (unsigned)strtoul(v, NULL, 10);
    v = getenv("MOCK_CUDA_DEVICE_COUNT");
    if (v)
        g_device_count = atoi(v);
    v = getenv("MOCK_CUDA_QUEUE_DEPTH");
    if (v && atoi(v) > 0)
        g_queue_depth = (unsigned)atoi(v);
    v = getenv("MOCK_CUDA_SYNC_RECORDS");
    if (v && atoi(v) > 0)
        g_sync_records = (unsigned)atoi(v);
    v = getenv("MOCK_CUDA_DEVICE_MEMORY");
    if (v)
        g_device_total = (size_t)strtoull(v, NULL, 10);
    v = getenv("MOCK_CUDA_FAULTS");
    if (!v)
        return;
    char *copy = strdup(v), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char fn[64] = "";
        long nth = 0;
        int err = 0, used = 0;
        unsigned flags = 0;
        if (sscanf(item, "%63[^:]:%ld:%d%n", fn, &nth, &err, &used) < 3) {
            fprintf(stderr, "mock_cudart: bad MOCK_CUDA_FAULTS item '%s'\n", item);
            continue;
        }
        if (strstr(item + used, "async"))
            flags |= MOCK_FAULT_ASYNC;
        if (strstr(item + used, "sticky"))
            flags |= MOCK_FAULT_STICKY;
        arm(fn, nth, err, flags);
    }
    free(copy);
}

/* A CUDA runtime on host memory, for tests (see mock_cudart.h).
 *
 * One mutex (g_mu) guards every field below and one condition variable
 * (g_cv) is broadcast on any progress; stream threads run operations with
 * the mutex released.  Simple rather than fast: tests move megabytes. */
#include "mock_cudart.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int cudaError_t;
typedef struct mstream *cudaStream_t;
typedef struct mevent *cudaEvent_t;
typedef void (*cudaHostFn_t)(void *user);

typedef struct mgraph *cudaGraph_t;

enum {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100, cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400, cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700, cudaErrorLaunchFailure = 719,
    cudaErrorECCUncorrectable = 214,
    cudaErrorStreamCaptureUnsupported = 900, cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnjoined = 904,
};

#define MAX_DEVICES 8

/* Errors that corrupt the context: every later call fails with them. */
static int is_sticky_error(int err)
{
    return err == cudaErrorIllegalAddress || err == cudaErrorLaunchFailure ||
           err == cudaErrorECCUncorrectable;
}

struct cudaPointerAttributes {
    int type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

/* ----------------------------------------------------------------- state */

enum op_kind { OP_COPY, OP_MEMSET, OP_RECORD, OP_WAIT, OP_HOSTFN };

struct op {
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    int err;             /* OP_COPY: fail with this instead of copying */
    int quiet;           /* OP_RECORD of the mock's own (legacy stream
                            ordering): leaves the stream's error alone */
    int value;           /* OP_MEMSET */
    int sync_record;     /* OP_RECORD of a cudaEventBlockingSync event */
    struct mevent *ev;   /* OP_RECORD / OP_WAIT (holds a reference)     */
    uint64_t gen;
    cudaHostFn_t fn;
    void *arg;
    struct op *next;
};

struct mstream {
    int device;          /* the device current when it was created      */
    int capturing;       /* ops are captured into a graph, not run      */
    int invalidated;     /* origin: a forbidden call broke the capture  */
    int capture_mode;    /* origin: cudaStreamCaptureMode given to Begin */
    pthread_t capturer;  /* origin: the thread that began the capture    */
    struct mstream *origin; /* the stream whose capture this one joined */
    struct op *head, *tail;
    uint64_t enq, done;  /* operations queued / finished */
    unsigned sync_pending; /* of them, records of blocking-sync events */
    int pending_err;     /* first failure not yet reported */
    int destroyed;
    int blocking;        /* not cudaStreamNonBlocking: ordered with the
                            device's legacy default stream */
    struct mstream *next_all;
};

struct mevent {
    uint64_t record_gen; /* records issued   */
    uint64_t done_gen;   /* records reached  */
    int err;             /* stream error seen by the last record reached */
    int refs;
    unsigned flags;      /* as created: cudaEventBlockingSync is 0x1 */
    int device;          /* the device current when it was created */
    struct mstream *captured; /* last recorded inside this capture origin */
};

enum alloc_kind { A_DEVICE, A_PINNED, A_MANAGED };
struct alloc {
    char *p;
    size_t n;
    enum alloc_kind kind;
    int device;
};

#define MAX_FAULTS 16
struct fault {
    char fn[64];
    long nth;     /* fire on this call number (counted from arming); 0: all */
    long seen;
    int err;
    unsigned flags;
    int active;
    long fired;
};

#define MAX_COUNTED 64
struct counted {
    char fn[64];
    long calls;
    long fired;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static struct mstream *g_default[MAX_DEVICES]; /* legacy default streams */
static struct mstream *g_streams;  /* all live streams */
static struct alloc *g_allocs;
static size_t g_nallocs, g_capallocs;
static struct fault g_faults[MAX_FAULTS];
static struct counted g_counted[MAX_COUNTED];
static int g_sticky;
static unsigned g_copy_delay_us;
static int g_device_count = 1;
/* mock_cuda_set_adjacent: the region device allocations are carved from */
static char *g_adj_base;
static size_t g_adj_cap, g_adj_used;
static int g_adj_on;
static size_t g_device_total = (size_t)4 << 30;
static size_t g_reported_free = SIZE_MAX; /* cudaMemGetInfo's lie, if any */
static unsigned g_queue_depth = 1024;     /* pending operations per stream */
static unsigned g_sync_records = 56;      /* pending blocking-sync records per stream */
static mock_cuda_counters g_cnt;
static __thread int t_device;
/* A driver-API context the test made current on this thread, and whether
 * any is in use (then no primary context counts as active): see
 * mock_cuda_set_user_context. */
static __thread void *t_user_context;
static int g_user_context;
static __thread int t_last_error;
static __thread struct mstream *t_per_thread[MAX_DEVICES]; /* cudaStreamPerThread */
static __thread int t_capture_mode; /* cudaStreamCaptureModeGlobal (0) until exchanged */
static __thread mock_cuda_thread_counters t_cnt;

/* ------------------------------------------------------------ utilities */

static struct counted *counted_for(const char *fn)
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

#ifndef MOCK_RUNTIME_VERSION
#define MOCK_RUNTIME_VERSION 13000 /* CUDA 13.0 */
#endif

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
static int g_release_err;

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

static void touch_context(int dev)
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

static int enter(const char *fn, int *async_err)
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

static cudaError_t ret(cudaError_t e)
{
    if (e)
        t_last_error = e;
    return e;
}

#define ENTER(name)                                   \
    pthread_mutex_lock(&g_mu);                        \
    int fault_ = enter(name, NULL);                   \
    if (fault_) {                                     \
        pthread_mutex_unlock(&g_mu);                  \
        return ret(fault_);                           \
    }

static struct alloc *find_alloc(const void *p)
{
    const char *c = p;
    for (size_t i = 0; i < g_nallocs; i++)
        if (c >= g_allocs[i].p && c < g_allocs[i].p + g_allocs[i].n)
            return &g_allocs[i];
    return NULL;
}

static int add_alloc(char *p, size_t n, enum alloc_kind kind)
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

static int remove_alloc(const void *p, enum alloc_kind kind, size_t *n)
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

static void event_unref(struct mevent *e)
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
static struct mstream *stream_new(void)
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
static struct mstream *resolve_stream(cudaStream_t s)
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
static int enqueue(struct mstream *s, struct op *op)
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
static struct mstream *capture_origin(struct mstream *s)
{
    return s->capturing ? (s->origin ? s->origin : s) : NULL;
}

/* g_mu held: a call not allowed on a capturing stream breaks its capture. */
static int capture_violation(struct mstream *s)
{
    struct mstream *o = capture_origin(s);
    if (!o)
        return 0;
    o->invalidated = 1;
    return cudaErrorStreamCaptureUnsupported;
}

/* g_mu held */
static int stream_sync_locked(struct mstream *s)
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
static void drain_all_locked(void)
{
again:
    for (struct mstream *s = g_streams; s; s = s->next_all) {
        if (s->done < s->enq) {
            pthread_cond_wait(&g_cv, &g_mu);
            goto again;
        }
    }
}

/* ------------------------------------------------------ runtime functions */

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last_error;
    t_last_error = 0;
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return t_last_error;
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    ENTER("cudaGetDeviceCount");
    int n = g_device_count;
    pthread_mutex_unlock(&g_mu);
#if defined(MOCK_INSUFFICIENT_DRIVER) || defined(MOCK_NO_DRIVER)
    /* A runtime newer than the driver: what CUDA 13 does on an R550 node,
     * and what every runtime does where no driver is installed. */
    (void)n;
    *count = 0;
    return ret(35);
#else
    *count = n;
    return ret(n > 0 ? cudaSuccess : cudaErrorNoDevice);
#endif
}

EXPORT cudaError_t cudaGetDevice(int *dev)
{
    ENTER("cudaGetDevice");
    pthread_mutex_unlock(&g_mu);
    *dev = t_device;
    return cudaSuccess;
}

/* The two driver calls libckpt makes (it finds them here before
 * libcuda.so.1).  A device's primary context is active once any thread has
 * used the device since the last mock_cuda_forget_contexts(). */
EXPORT int cuDeviceGet(int *device, int ordinal)
{
    pthread_mutex_lock(&g_mu);
    int n = g_device_count;
    pthread_mutex_unlock(&g_mu);
    if (ordinal < 0 || ordinal >= n || ordinal >= MAX_DEVICES)
        return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = ordinal;
    return 0;
}

EXPORT int cuDevicePrimaryCtxGetState(int device, unsigned int *flags, int *active)
{
    pthread_mutex_lock(&g_mu);
    int n = g_device_count;
    unsigned mask = g_user_context ? 0 : g_cnt.context_mask;
    pthread_mutex_unlock(&g_mu);
    if (device < 0 || device >= n || device >= MAX_DEVICES)
        return 101;
    *flags = 0;
    *active = (mask >> device) & 1;
    return 0;
}

/* The calling thread's context made with the driver API, if the test set
 * one (mock_cuda_set_user_context); NULL otherwise (the mock's primary
 * contexts are not handed out: libckpt asks only when the current
 * device's primary context is inactive, where a real thread has none). */
EXPORT int cuCtxGetCurrent(void **ctx)
{
    *ctx = t_user_context;
    return 0;
}

/* cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE): the driver
 * answers for every context's memory without a current context (and
 * creates none); CUDA_ERROR_INVALID_VALUE for memory CUDA does not know. */
EXPORT int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    if (attribute != 2)
        return 1;
    pthread_mutex_lock(&g_mu);
    struct alloc *al = find_alloc((const void *)(uintptr_t)ptr);
    int kind = al ? (int)al->kind : -1;
    pthread_mutex_unlock(&g_mu);
    if (kind < 0)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    *(unsigned int *)data = kind == A_DEVICE || kind == A_MANAGED ? 2 : 1;
    return 0;
}

EXPORT void mock_cuda_set_user_context(void *ctx)
{
    t_user_context = ctx;
    pthread_mutex_lock(&g_mu);
    g_user_context = ctx != NULL;
    pthread_mutex_unlock(&g_mu);
}

EXPORT cudaError_t cudaSetDevice(int dev)
{
    ENTER("cudaSetDevice");
    int n = g_device_count;
    pthread_mutex_unlock(&g_mu);
    if (dev < 0 || dev >= n || dev >= MAX_DEVICES)
        return ret(cudaErrorInvalidDevice);
    t_device = dev;
#if MOCK_RUNTIME_VERSION >= 12000
    pthread_mutex_lock(&g_mu);
    touch_context(dev); /* CUDA 12 initializes the device's primary context */
    pthread_mutex_unlock(&g_mu);
#endif /* before 12.0 it only notes the choice: the context comes with use */
    return cudaSuccess;
}

EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a,
                                            const void *p)
{
    ENTER("cudaPointerGetAttributes");
    struct alloc *al = find_alloc(p);
    memset(a, 0, sizeof *a);
    if (!al) {
        a->type = 0;
        a->device = -2;
    } else if (al->kind == A_DEVICE) {
        a->type = 2;
        a->device = al->device;
        a->devicePointer = (void *)p;
    } else if (al->kind == A_MANAGED) {
        a->type = 3;
        a->device = al->device;
        a->devicePointer = (void *)p;
        a->hostPointer = (void *)p;
    } else {
        a->type = 1;
        a->devicePointer = (void *)p;
        a->hostPointer = (void *)p;
    }
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    ENTER("cudaStreamCreateWithFlags");
    struct mstream *m = stream_new();
    if (m) {
        m->device = t_device;
        m->blocking = !(flags & 0x1u); /* cudaStreamNonBlocking */
        g_cnt.streams++;
        g_cnt.streams_created++;
    }
    pthread_mutex_unlock(&g_mu);
    if (!m)
        return ret(cudaErrorMemoryAllocation);
    *s = m;
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, 0);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENTER("cudaStreamDestroy");
    if ((uintptr_t)s <= 2 || s->destroyed) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidResourceHandle);
    }
    s->destroyed = 1; /* its thread drains the queue, then frees it */
    g_cnt.streams--;
    int rel = g_release_err;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    return ret(rel);
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ENTER("cudaStreamSynchronize");
    struct mstream *m = resolve_stream(s);
    int err = capture_violation(m);
    if (!err && m->done < m->enq)
        g_cnt.spin_waits++; /* under the default scheduling the real runtime
                               spins here until the stream is idle */
    if (!err)
        err = stream_sync_locked(m);
    pthread_mutex_unlock(&g_mu);
    return ret(err);
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t s)
{
    ENTER("cudaStreamQuery");
    struct mstream *m = resolve_stream(s);
    int busy = m->done < m->enq;
    pthread_mutex_unlock(&g_mu);
    return busy ? cudaErrorNotReady : cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    ENTER("cudaDeviceSynchronize");
    int err = 0;
    resolve_stream(NULL);
    drain_all_locked();
    for (struct mstream *s = g_streams; s; s = s->next_all) {
        if (!err)
            err = s->pending_err;
        s->pending_err = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return ret(err);
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    ENTER("cudaEventCreateWithFlags");
    struct mevent *m = calloc(1, sizeof *m);
    if (m) {
        m->refs = 1;
        m->flags = flags;
        m->device = t_device;
        g_cnt.events++;
    }
    pthread_mutex_unlock(&g_mu);
    if (!m)
        return ret(cudaErrorMemoryAllocation);
    *e = m;
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, 0);
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    ENTER("cudaEventDestroy");
    if (!e) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidResourceHandle);
    }
    g_cnt.events--;
    event_unref(e);
    int rel = g_release_err;
    pthread_mutex_unlock(&g_mu);
    return ret(rel);
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER("cudaEventRecord");
    struct op *op = calloc(1, sizeof *op);
    if (!op) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    struct mstream *m = resolve_stream(s);
    if (e->device != m->device) {
        /* "cudaEventRecord() will fail if the input event and input stream
         * are associated to different devices." */
        free(op);
        g_cnt.cross_device_records++;
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidResourceHandle);
    }
    op->kind = OP_RECORD;
    op->ev = e;
    e->refs++;
    e->captured = capture_origin(m);
    if (!e->captured)
        op->gen = ++e->record_gen;
    if (!m->capturing && (e->flags & 0x1u)) {
        /* A real stream holds 56 pending records of blocking-sync events
         * (an H200, driver 580, CUDA 13.0): the next record blocks the
         * enqueueing thread until the GPU reaches the first, far sooner
         * than the queue depth does. */
        if (m->sync_pending >= g_sync_records) {
            g_cnt.enqueue_waits++;
            t_cnt.enqueue_waits++;
            while (m->sync_pending >= g_sync_records)
                pthread_cond_wait(&g_cv, &g_mu);
        }
        op->sync_record = 1;
        m->sync_pending++;
    }
    enqueue(m, op);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    ENTER("cudaEventSynchronize");
    if (e->captured) { /* recorded into a graph: nothing to wait for */
        int err = capture_violation(e->captured);
        pthread_mutex_unlock(&g_mu);
        return ret(err ? err : cudaErrorStreamCaptureUnsupported);
    }
    uint64_t target = e->record_gen;
    if (!(e->flags & 0x1u) && e->done_gen < target)
        g_cnt.spin_waits++; /* the real runtime would spin here */
    while (e->done_gen < target) {
        pthread_cond_wait(&g_cv, &g_mu);
        if (g_sticky)
            break;
    }
    int err = g_sticky ? g_sticky : e->err;
    pthread_mutex_unlock(&g_mu);
    return ret(err);
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t e)
{
    ENTER("cudaEventQuery");
    if (e->captured) {
        int err = capture_violation(e->captured);
        pthread_mutex_unlock(&g_mu);
        return ret(err ? err : cudaErrorStreamCaptureUnsupported);
    }
    int err = e->done_gen < e->record_gen ? cudaErrorNotReady : e->err;
    pthread_mutex_unlock(&g_mu);
    return err == cudaErrorNotReady ? err : ret(err);
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    ENTER("cudaStreamWaitEvent");
    struct op *op = calloc(1, sizeof *op);
    if (!op) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    op->kind = OP_WAIT;
    op->ev = e;
    op->gen = e->record_gen;
    e->refs++;
    struct mstream *m = resolve_stream(s);
    if (e->captured && e->captured->capturing && !m->capturing) {
        /* Waiting on an event recorded in a capture pulls the stream into
         * that capture (cross-stream capture). */
        m->capturing = 1;
        m->origin = e->captured;
    }
    enqueue(m, op);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
    ENTER("cudaLaunchHostFunc");
    struct op *op = calloc(1, sizeof *op);
    if (!op) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    op->kind = OP_HOSTFN;
    op->fn = fn;
    op->arg = arg;
    enqueue(resolve_stream(s), op);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* g_mu held: one side device memory, the other plain (unpinned) host. */
static int is_pageable_transfer(const void *dst, const void *src)
{
    struct alloc *d = find_alloc(dst), *s = find_alloc(src);
    int dst_dev = d && d->kind == A_DEVICE, src_dev = s && s->kind == A_DEVICE;
    return (dst_dev && !s) || (src_dev && !d);
}

/* A device pointer's range must lie inside its allocation; kinds 1..3 must
 * match where the pointers are (kind 0 host-to-host, 4 default: anything). */
static int check_copy(void *dst, const void *src, size_t n, int kind)
{
    struct alloc *d = find_alloc(dst), *s = find_alloc(src);
    if (d && d->kind == A_DEVICE && (char *)dst + n > d->p + d->n)
        return cudaErrorInvalidValue;
    if (s && s->kind == A_DEVICE && (const char *)src + n > s->p + s->n)
        return cudaErrorInvalidValue;
    int dst_dev = d && d->kind == A_DEVICE, src_dev = s && s->kind == A_DEVICE;
    switch (kind) {
    case 1: return !dst_dev || src_dev ? cudaErrorInvalidValue : 0;
    case 2: return dst_dev || !src_dev ? cudaErrorInvalidValue : 0;
    case 3: return !dst_dev || !src_dev ? cudaErrorInvalidValue : 0;
    case 4: return 0;
    case 0: return dst_dev || src_dev ? cudaErrorInvalidValue : 0;
    default: return 21; /* cudaErrorInvalidMemcpyDirection */
    }
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                                   cudaStream_t s)
{
    pthread_mutex_lock(&g_mu);
    int async_err;
    int err = enter("cudaMemcpyAsync", &async_err);
    if (!err)
        err = check_copy(dst, src, n, kind);
    if (err) {
        pthread_mutex_unlock(&g_mu);
        return ret(err);
    }
    struct op *op = calloc(1, sizeof *op);
    if (!op) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    op->kind = OP_COPY;
    op->dst = dst;
    op->src = src;
    op->n = n;
    op->err = async_err;
    struct mstream *m = resolve_stream(s);
    int pageable = is_pageable_transfer(dst, src);
    if (enqueue(m, op) == 0 && pageable) {
        /* A transfer between device and pageable host memory is staged by
         * the driver: the call returns only once the copy has run. */
        g_cnt.pageable_copies++;
        t_cnt.pageable_copies++;
        uint64_t target = m->enq;
        while (m->done < target)
            pthread_cond_wait(&g_cv, &g_mu);
    }
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, NULL);
    return e ? e : cudaStreamSynchronize(NULL);
}

EXPORT cudaError_t cudaMemset(void *p, int value, size_t n)
{
    ENTER("cudaMemset");
    struct mstream *s = resolve_stream(NULL);
    int err = stream_sync_locked(s);
    pthread_mutex_unlock(&g_mu);
    memset(p, value, n);
    return ret(err);
}

EXPORT cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    ENTER("cudaMemsetAsync");
    struct op *op = calloc(1, sizeof *op);
    if (!op) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    op->kind = OP_MEMSET;
    op->dst = p;
    op->value = value;
    op->n = n;
    enqueue(resolve_stream(s), op);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

static void *aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 256, n ? n : 1) != 0)
        return NULL;
    return p;
}

EXPORT cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    ENTER("cudaHostAlloc");
    size_t sz = n ? n : 1;
    char *m = aligned(sz);
    if (!m || add_alloc(m, sz, A_PINNED) != 0) {
        free(m);
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    g_cnt.pinned_allocs++;
    g_cnt.pinned_bytes += sz;
    pthread_mutex_unlock(&g_mu);
    *p = m;
    return cudaSuccess;
}

EXPORT cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaHostAlloc(p, n, 0);
}

EXPORT cudaError_t cudaFreeHost(void *p)
{
    ENTER("cudaFreeHost");
    t_cnt.frees++;
    size_t n;
    if (!p) {
        pthread_mutex_unlock(&g_mu);
        return cudaSuccess;
    }
    if (!find_alloc(p)) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidValue);
    }
    /* Like cudaFree, cudaFreeHost synchronizes the device (the reason
     * PyTorch caches pinned blocks instead of freeing them). */
    g_cnt.free_syncs++;
    drain_all_locked();
    if (remove_alloc(p, A_PINNED, &n) != 0) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidValue);
    }
    g_cnt.pinned_allocs--;
    g_cnt.pinned_bytes -= n;
    int rel = g_release_err;
    pthread_mutex_unlock(&g_mu);
    free(p);
    return ret(rel);
}

static cudaError_t device_alloc(void **p, size_t n, enum alloc_kind kind);

EXPORT cudaError_t cudaMalloc(void **p, size_t n)
{
    return device_alloc(p, n, A_DEVICE);
}

/* Managed memory counts as device memory here. */
EXPORT cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    return device_alloc(p, n, A_MANAGED);
}

static cudaError_t device_alloc(void **p, size_t n, enum alloc_kind kind)
{
    ENTER(kind == A_DEVICE ? "cudaMalloc" : "cudaMallocManaged");
    size_t sz = n ? n : 1;
    if (g_cnt.device_bytes + sz > g_device_total) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    size_t carve = (sz + 255) / 256 * 256;
    int carved = kind == A_DEVICE && g_adj_on && g_adj_used + carve <= g_adj_cap;
    char *m = carved ? g_adj_base + g_adj_used : aligned(sz);
    if (!m || add_alloc(m, sz, kind) != 0) {
        if (!carved)
            free(m);
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorMemoryAllocation);
    }
    if (carved)
        g_adj_used += carve;
    memset(m, 0xA5, sz); /* device memory starts as garbage */
    g_cnt.device_allocs++;
    g_cnt.device_bytes += sz;
    if (g_cnt.device_bytes > g_cnt.device_bytes_peak)
        g_cnt.device_bytes_peak = g_cnt.device_bytes;
    pthread_mutex_unlock(&g_mu);
    *p = m;
    return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *p)
{
    ENTER("cudaFree");
    t_cnt.frees++;
    size_t n;
    if (!p) {
        pthread_mutex_unlock(&g_mu);
        return cudaSuccess;
    }
    if (!find_alloc(p)) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidValue);
    }
    /* cudaFree synchronizes the device: it waits for every stream. */
    g_cnt.free_syncs++;
    drain_all_locked();
    if (remove_alloc(p, A_DEVICE, &n) != 0 && remove_alloc(p, A_MANAGED, &n) != 0) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidValue);
    }
    g_cnt.device_allocs--;
    g_cnt.device_bytes -= n;
    int rel = g_release_err;
    int carved = (char *)p >= g_adj_base && (char *)p < g_adj_base + g_adj_cap;
    pthread_mutex_unlock(&g_mu);
    if (!carved) /* a carved one is part of the region, kept for the process */
        free(p);
    return ret(rel);
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    ENTER("cudaMemGetInfo");
    *total = g_device_total;
    *free_bytes = g_device_total > g_cnt.device_bytes ? g_device_total - g_cnt.device_bytes : 0;
    if (g_reported_free != SIZE_MAX)
        *free_bytes = g_reported_free; /* another allocator's view, e.g. a cache */
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
    ENTER("cudaDriverGetVersion");
    pthread_mutex_unlock(&g_mu);
#ifdef MOCK_NO_DRIVER
    *v = 0; /* "If no driver is installed, then 0 is returned" */
#else
    *v = 13000;
#endif
    return cudaSuccess;
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    ENTER("cudaRuntimeGetVersion");
    pthread_mutex_unlock(&g_mu);
    *v = MOCK_RUNTIME_VERSION;
    return cudaSuccess;
}

/* Writes only `name`, the first member of struct cudaDeviceProp. */
EXPORT cudaError_t cudaGetDeviceProperties(void *prop, int dev)
{
    ENTER("cudaGetDeviceProperties");
    int n = g_device_count;
    pthread_mutex_unlock(&g_mu);
    if (dev < 0 || dev >= n)
        return ret(cudaErrorInvalidDevice);
    snprintf(prop, 256, "Mock CUDA Device %d", dev);
    return cudaSuccess;
}

/* CUDA 12's cuda_runtime_api.h renames cudaGetDeviceProperties to this
 * (#define), so code compiled against those headers (tests/gpu built on
 * the mock) links to it; CUDA 11 and 13 export only the plain name. */
EXPORT cudaError_t cudaGetDeviceProperties_v2(void *prop, int dev)
{
    return cudaGetDeviceProperties(prop, dev);
}

static const struct {
    int code;
    const char *name;
    const char *text;
} k_errors[] = {
    { 0, "cudaSuccess", "no error" },
    { 1, "cudaErrorInvalidValue", "invalid argument" },
    { 2, "cudaErrorMemoryAllocation", "out of memory" },
    { 3, "cudaErrorInitializationError", "initialization error" },
    { 21, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy" },
    { 35, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version" },
    { 46, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable" },
    { 100, "cudaErrorNoDevice", "no CUDA-capable device is detected" },
    { 101, "cudaErrorInvalidDevice", "invalid device ordinal" },
    { 214, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered" },
    { 400, "cudaErrorInvalidResourceHandle", "invalid resource handle" },
    { 600, "cudaErrorNotReady", "device not ready" },
    { 700, "cudaErrorIllegalAddress", "an illegal memory access was encountered" },
    { 719, "cudaErrorLaunchFailure", "unspecified launch failure" },
    { 999, "cudaErrorUnknown", "unknown error" },
};

EXPORT const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == e)
            return k_errors[i].name;
    return "cudaErrorUnknown";
}

EXPORT const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == e)
            return k_errors[i].text;
    return "unrecognized error code";
}

/* ----------------------------------------------------------- graph capture */

struct mgraph {
    int unused;
};

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode)
{
    ENTER("cudaStreamBeginCapture");
    if ((uintptr_t)s <= 2 || s->capturing) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidValue); /* no capture on the legacy stream */
    }
    s->capturing = 1;
    s->origin = NULL;
    s->invalidated = 0;
    s->capture_mode = mode;
    s->capturer = pthread_self();
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* Ends the capture begun on s.  Every stream that joined it must have been
 * joined back (its last work waited for on s), else
 * cudaErrorStreamCaptureUnjoined; a forbidden call during the capture makes
 * it cudaErrorStreamCaptureInvalidated. */
EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    ENTER("cudaStreamEndCapture");
    if ((uintptr_t)s <= 2 || !s->capturing || s->origin) {
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorInvalidValue);
    }
    int err = s->invalidated ? cudaErrorStreamCaptureInvalidated : 0;
    for (struct mstream *o = g_streams; o; o = o->next_all) {
        if (o->origin == s) {
            if (!err)
                err = cudaErrorStreamCaptureUnjoined;
            o->capturing = 0;
            o->origin = NULL;
        }
    }
    for (int d = 0; d < MAX_DEVICES; d++)
        if (g_default[d] && g_default[d]->origin == s)
            g_default[d]->capturing = 0, g_default[d]->origin = NULL;
    s->capturing = 0;
    s->invalidated = 0;
    pthread_mutex_unlock(&g_mu);
    if (err) {
        *graph = NULL;
        return ret(err);
    }
    *graph = calloc(1, sizeof **graph);
    return *graph ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

/* Sets the calling thread's capture interaction mode to *mode (0 global,
 * 1 thread-local, 2 relaxed) and returns the previous one in *mode. */
EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode)
{
    ENTER("cudaThreadExchangeStreamCaptureMode");
    pthread_mutex_unlock(&g_mu);
    if (!mode || *mode < 0 || *mode > 2)
        return ret(cudaErrorInvalidValue);
    int prev = t_capture_mode;
    t_capture_mode = *mode;
    *mode = prev;
    return cudaSuccess;
}

/* status: 0 none, 1 active, 2 invalidated (cudaStreamCaptureStatus). */
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status)
{
    ENTER("cudaStreamIsCapturing");
    struct mstream *m = resolve_stream(s);
    struct mstream *o = capture_origin(m);
    *status = !o ? 0 : o->invalidated ? 2 : 1;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    ENTER("cudaGraphDestroy");
    pthread_mutex_unlock(&g_mu);
    free(g);
    return cudaSuccess;
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

/* Private to the mock CUDA runtime (tests/cuda/mock_cudart.c and
 * mock_cudart_api.c, one shared library): the CUDA types it defines, its
 * state (one mutex, g_mu, guards every field; g_cv is broadcast on any
 * progress), and the helpers both halves use.  The library is built with
 * -fvisibility=hidden: nothing here is exported, only EXPORT functions. */
#ifndef MOCK_CUDART_IMPL_H
#define MOCK_CUDART_IMPL_H

#include "mock_cudart.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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
static inline int is_sticky_error(int err)
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

#ifndef MOCK_RUNTIME_VERSION
#define MOCK_RUNTIME_VERSION 13000 /* CUDA 13.0 */
#endif

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

extern pthread_mutex_t g_mu;
extern pthread_cond_t g_cv;
extern struct mstream *g_default[MAX_DEVICES]; /* legacy default streams */
extern struct mstream *g_streams;  /* all live streams */
extern struct alloc *g_allocs;
extern size_t g_nallocs, g_capallocs;
extern struct fault g_faults[MAX_FAULTS];
extern struct counted g_counted[MAX_COUNTED];
extern int g_sticky;
extern unsigned g_copy_delay_us;
extern int g_device_count;
/* mock_cuda_set_adjacent: the region device allocations are carved from */
extern char *g_adj_base;
extern size_t g_adj_cap, g_adj_used;
extern int g_adj_on;
extern size_t g_device_total;
extern size_t g_reported_free; /* cudaMemGetInfo's lie, if any */
extern unsigned g_queue_depth;     /* pending operations per stream */
extern unsigned g_sync_records;      /* pending blocking-sync records per stream */
extern mock_cuda_counters g_cnt;
extern __thread int t_device;
/* A driver-API context the test made current on this thread, and whether
 * any is in use (then no primary context counts as active): see
 * mock_cuda_set_user_context. */
extern __thread void *t_user_context;
extern int g_user_context;
extern __thread int t_last_error;
extern __thread struct mstream *t_per_thread[MAX_DEVICES]; /* cudaStreamPerThread */
extern __thread int t_capture_mode; /* cudaStreamCaptureModeGlobal (0) until exchanged */
extern __thread mock_cuda_thread_counters t_cnt;

/* ------------------------------------------- helpers both halves use */
/* Every one but aligned and counted_for is called with g_mu held. */

/* The count of calls (and faults fired) of runtime function `fn`. */
struct counted *counted_for(const char *fn);
/* At the entry of every runtime function: counts the call, creates the
 * thread's context where the real runtime would, and returns the error to
 * fail with now (a sticky error, a capture rule, an armed fault), or 0;
 * *async_err (when not NULL) gets an error for the stream operation to
 * fail with later.  Releases report a sticky error but still release
 * (g_release_err then holds it). */
int enter(const char *fn, int *async_err);
extern int g_release_err;
/* e, remembered for cudaGetLastError when it is an error. */
cudaError_t ret(cudaError_t e);
/* Device `dev`'s primary context counts as created (context_mask). */
void touch_context(int dev);
/* The registered allocation holding p, or NULL. */
struct alloc *find_alloc(const void *p);
/* Register [p, p + n) of `kind` on the calling thread's device; -1 when
 * out of memory. */
int add_alloc(char *p, size_t n, enum alloc_kind kind);
/* Unregister the allocation starting at p of `kind`; *n gets its size;
 * -1 when there is none. */
int remove_alloc(const void *p, enum alloc_kind kind, size_t *n);
/* Drop a reference to e; the last frees it. */
void event_unref(struct mevent *e);
/* A new stream with its own thread, linked into g_streams; NULL when out
 * of memory. */
struct mstream *stream_new(void);
/* The stream a handle names: NULL and cudaStreamLegacy (1) the calling
 * thread's current device's legacy default stream, cudaStreamPerThread (2)
 * the thread's own; either made on first use. */
struct mstream *resolve_stream(cudaStream_t s);
/* Queue op on s in CUDA's order (after the legacy stream's work, or the
 * blocking streams', as the case may be), blocking while s is full; a
 * capturing stream captures it instead (freed): then 1, else 0. */
int enqueue(struct mstream *s, struct op *op);
/* The capture origin of s, or NULL when it is not capturing. */
struct mstream *capture_origin(struct mstream *s);
/* A call not allowed on a capturing stream: breaks its capture and
 * returns the error to fail with (0 when s is not capturing). */
int capture_violation(struct mstream *s);
/* Wait until s ran everything queued so far; its pending error, cleared. */
int stream_sync_locked(struct mstream *s);
/* Wait until every stream is idle. */
void drain_all_locked(void);
/* n bytes (at least 1) aligned to 256, as cudaMalloc's are; NULL when out
 * of memory. */
void *aligned(size_t n);

/* A runtime function's entry: g_mu taken and enter() asked; a fault
 * returns it at once (g_mu released). */
#define ENTER(name)                                   \
    pthread_mutex_lock(&g_mu);                        \
    int fault_ = enter(name, NULL);                   \
    if (fault_) {                                     \
        pthread_mutex_unlock(&g_mu);                  \
        return ret(fault_);                           \
    }

#endif

/* device_cuda: snapshots and restores of CUDA device memory.
 *
 * Ordering.  A snapshot records `start` on the caller's stream and makes our
 * copy stream wait for it: the copies see exactly what the caller's stream
 * had produced when the save began, and the CPU never waits for that.  Every
 * device_record() marks the copies enqueued so far with (pooled) events;
 * workers wait for them before reading a chunk, and fence() makes any stream
 * wait for them on the GPU.
 *
 * Modes.  HOST and STREAM copy device -> host on the copy stream, chunk by
 * chunk (they differ in how big a snapshot buffer the pipeline hands us).
 * DEVICE ("staged") copies every device tensor whole into spare device memory
 * (`scratch`) as soon as the snapshot starts, a handful of large D2D copies
 * marked by one shared `snap` event; the chunk copies then only drain
 * scratch -> host on a second stream.  Those drains cost no CUDA call when
 * the pipeline asks for them: they are coalesced and issued in batches of
 * DRAIN_BATCH bytes (or a share of the state, so that one snapshot records
 * at most DEVICE_CALLER_RECORDS batch events: device.h), or when a worker
 * waits for one, so the caller is not held by thousands of small enqueues
 * while the D2D copy takes milliseconds, nor by a full stream.
 * An event carries `snap`, when the caller's memory has been read (what
 * fence and wait_snapshot use), and `data`, when the host bytes are there
 * (what workers wait for).
 *
 * Threads.  The save side runs on the store's API thread; event waits and
 * frees, host allocations and the restore side also come from workers.
 * `mu` guards the drain batch and reference counts, `pool_mu` the event
 * pool (taken inside `mu`, never the other way round). */
#include "device_cuda.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "error.h"
#include "pool.h"

#define TENSOR_NAME_MAX (CKPT_NAME_MAX + 1) /* with its NUL */
#define SCRATCH_ALIGN 256u
#define DRAIN_BATCH ((uint64_t)64 << 20)

/* A CUDA event that several device_events share. */
typedef struct shared_ev {
    cu_event e;
    int dev;        /* the device it was created on (and is pooled for) */
    int refs;       /* mu */
    int issued;     /* mu: recorded on its stream (drain batches start at 0) */
    cu_err err;     /* mu: enqueueing the batch failed with this */
} shared_ev;

struct device_event {
    shared_ev *data; /* host bytes present                         */
    shared_ev *snap; /* caller memory read (DEVICE mode), or NULL  */
    char tensor[TENSOR_NAME_MAX]; /* the last tensor it covers, for messages */
};

/* Idle events of one device (an event may only be recorded on a stream of
 * the device it was created on). */
typedef struct evpool {
    cu_event *ev;
    size_t n, cap;
} evpool;

typedef struct drain {
    void *dst;
    const char *src;
    size_t n;
} drain;

/* A device tensor staged whole in scratch. */
typedef struct region {
    const char *src;
    uint64_t len;
    uint64_t off;   /* in scratch */
    char name[TENSOR_NAME_MAX];
} region;

struct dcuda {
    const cuda_api *api;
    ckpt_snapshot_mode mode;
    int ordinal;           /* the CUDA device our streams live on         */
    cu_stream copy;        /* device -> host, or -> scratch               */
    cu_stream drain;       /* scratch -> host, DEVICE mode; NULL before   */
    cu_event start;        /* recorded on the caller's stream             */
    cu_event drained;      /* recorded on `drain` before a new snapshot   */

    /* Save side: API thread */
    void *scratch;         /* spare device memory, kept for the next save */
    uint64_t scratch_bytes;
    int planned;           /* reserve staged the next snapshot            */
    int scratch_on;        /* this snapshot is staged in scratch          */
    region *regions;       /* what is staged where                        */
    size_t nregions, capregions, cur_region;
    shared_ev *snap;       /* marks the staging copies (our reference)    */
    int direct;            /* unstaged D2H copies since the last record   */
    char last_tensor[TENSOR_NAME_MAX];

    pthread_mutex_t mu;    /* guards what follows, and shared_ev fields   */
    drain *drains;         /* staged drains not yet issued (coalesced)    */
    size_t ndrains, capdrains;
    uint64_t pending;      /* their bytes                                 */
    uint64_t drain_batch;  /* issue a batch once pending reaches this     */
    shared_ev *batch;      /* the event they will complete (our ref)      */
    char last_h2d[TENSOR_NAME_MAX];
    char note[512];
    /* environment facts, looked up once (cudaGetDeviceProperties is slow) */
    int described, runtime_version, driver_version;
    uint64_t scratch_want;  /* API/persist thread: scratch found too small */

    char gpu_name[256];

    pthread_mutex_t pool_mu; /* guards the pools                          */
    evpool pools[CU_MAX_DEVICES]; /* idle events, by device               */
};

static const char *errstr(const dcuda *cu, cu_err err, char *buf, size_t len)
{
    cu->api->GetLastError(); /* clear a non-sticky error for the caller */
    return cuda_loader_errstr(cu->api, err, buf, len);
}

/* Run CUDA calls with device `dev` current, as streams, events and the
 * legacy default stream belong to one device.  On an application thread
 * the caller's choice is restored afterwards (guard_leave).  A library
 * thread (pool worker, persist thread) is bound to `dev` and stays bound:
 * switching it back would create a context on device 0, which on a
 * multi-GPU node costs every rank's process memory on GPU 0 and fails on
 * GPUs in exclusive-process mode. */
static int guard_enter_on(dcuda *cu, int dev, int *prev)
{
    if (cu->api->GetDevice(prev) != CU_SUCCESS) {
        cu->api->GetLastError();
        *prev = dev;
    }
    if (*prev != dev) {
        cu_err err = cu->api->SetDevice(dev);
        if (err != CU_SUCCESS) {
            char buf[256];
            return ckpt_seterr(CKPT_EDEVICE, "cannot make CUDA device %d current: %s",
                               dev, errstr(cu, err, buf, sizeof buf));
        }
    }
    if (pool_on_library_thread()) {
        *prev = -1; /* stay bound */
        /* Relaxed capture mode: by default a thread's waits, frees and
         * pinned allocations are refused, and break the capture, while any
         * other thread of the process captures a CUDA graph in global mode
         * (torch.cuda.graph's default).  The library's threads never touch
         * the application's streams, so the application may capture while
         * a save persists or a restore reads. */
        int mode = 2;
        if (cu->api->ThreadExchangeStreamCaptureMode &&
            cu->api->ThreadExchangeStreamCaptureMode(&mode) != CU_SUCCESS)
            cu->api->GetLastError();
    }
    return CKPT_OK;
}

/* Waits (stream and event synchronizations) work across devices, but on a
 * thread with no context yet the runtime first creates one on the thread's
 * current device: device 0 unless chosen, hundreds of MiB of GPU 0 in
 * every process saving from another GPU.  So `dev`, where the waited-on
 * objects live, is made current for the wait as for every other call
 * (guard_enter_on; guard_leave after), on application threads too
 * (ckpt_save_wait_snapshot, a failed begin's cleanup).  Quietly: a failure
 * leaves the thread as it was and the caller's message alone, and the
 * wait itself reports.  Returns what guard_leave takes. */
static int wait_enter(dcuda *cu, int dev)
{
    ckpt_error_state e;
    ckpt_error_capture(&e, CKPT_OK);
    int prev = -1;
    if (guard_enter_on(cu, dev, &prev) != CKPT_OK) {
        cu->api->GetLastError();
        prev = -1;
    }
    ckpt_error_restore(&e);
    return prev;
}

static int guard_enter(dcuda *cu, int *prev)
{
    return guard_enter_on(cu, cu->ordinal, prev);
}

/* 1 when device `dev` has no primary context yet, so making it current
 * would create one; 0 when it has one or the driver cannot tell. */
static int primary_inactive(const cuda_api *a, int dev)
{
    unsigned int flags = 0;
    int handle = 0, active = 1;
    if (!a->DrvDeviceGet || !a->DrvPrimaryCtxGetState || a->DrvDeviceGet(&handle, dev) != 0 ||
        a->DrvPrimaryCtxGetState(handle, &flags, &active) != 0)
        return 0;
    return !active;
}

static void guard_leave(dcuda *cu, int prev)
{
    int cur;
    if (prev < 0 || cu->api->GetDevice(&cur) != CU_SUCCESS || cur == prev)
        return;
    /* A thread that never chose a device reports device 0 without having a
     * context there.  Switching it back would create one: hundreds of MiB
     * of GPU 0 in every process saving from another GPU, and a failure on
     * GPUs in exclusive-process mode.  As PyTorch does (c10::cuda::
     * MaybeExchangeDevice), such a thread is left on the device it used.
     * Before CUDA 12 cudaSetDevice makes no context: an inactive device
     * may be one the thread chose, and going back to it costs nothing. */
    if (cu->api->runtime_version >= 12000 && primary_inactive(cu->api, prev))
        return;
    /* A failure (exclusive-process mode) must not stay in the thread's
     * last-error slot, where the application's next check would find it. */
    if (cu->api->SetDevice(prev) != CU_SUCCESS)
        cu->api->GetLastError();
}

static int grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * size);
    if (!p)
        return -1;
    *arr = p;
    *cap = n;
    return 0;
}

void dcuda_note_reset(dcuda *cu)
{
    pthread_mutex_lock(&cu->mu);
    cu->note[0] = 0;
    pthread_mutex_unlock(&cu->mu);
}

void dcuda_note(dcuda *cu, const char *fmt, ...)
{
    pthread_mutex_lock(&cu->mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cu->note, sizeof cu->note, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&cu->mu);
}

int dcuda_pointer_type(const cuda_api *api, const void *ptr, int *type, int *ordinal)
{
    /* cudaPointerGetAttributes runs in the calling thread's current
     * device's context and creates it when there is none: a thread that
     * never chose a device would get a context on GPU 0 (hundreds of MiB,
     * and a failure in exclusive-process mode) for asking about a tensor on
     * GPU 1.  As PyTorch's isPinnedPtr does, ask from a device that has a
     * context already; the thread is left there (making its device current
     * again would create the context after all: see guard_leave), except
     * before CUDA 12, where that costs nothing and the thread may have
     * chosen its device. */
    int cur = -1, back = -1;
    if (api->GetDevice(&cur) != CU_SUCCESS) {
        api->GetLastError();
    } else if (primary_inactive(api, cur)) {
        /* A context is current all the same: one the application made with
         * the driver API.  Its memory is unknown to the primary contexts
         * libckpt copies in (and asking from another device would replace
         * the application's context on this thread), so it is refused
         * rather than taken for host memory and read with memcpy. */
        void *ctx = NULL;
        if (api->DrvCtxGetCurrent && api->DrvCtxGetCurrent(&ctx) == 0 && ctx)
            return ckpt_seterr(CKPT_EINVAL, "pointer %p: the calling thread's current CUDA "
                               "context is not device %d's primary context (one made with "
                               "the driver API: cuCtxCreate, PyCUDA's make_context); libckpt "
                               "works in primary contexts, as the runtime API and PyTorch "
                               "do: allocate the tensors there, or declare host buffers "
                               "CKPT_MEM_HOST", ptr, cur);
        int active = -1;
        for (int d = 0; d < api->device_count && active < 0; d++)
            if (d != cur && !primary_inactive(api, d))
                active = d;
        unsigned int memtype = 0; /* CUmemorytype: 2 is device (or managed) */
        if (active < 0 && api->DrvPointerGetAttribute &&
            api->DrvPointerGetAttribute(&memtype, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */,
                                        (unsigned long long)(uintptr_t)ptr) == 0 &&
            memtype == 2)
            /* No primary context, but the driver (which needs no context
             * to answer) knows the pointer: memory of a context the
             * application made on another thread.  Never memcpy'd. */
            return ckpt_seterr(CKPT_EINVAL, "pointer %p is device memory of a CUDA context "
                               "that is not a device's primary context (one made with the "
                               "driver API: cuCtxCreate, PyCUDA's make_context); libckpt "
                               "works in primary contexts, as the runtime API and PyTorch "
                               "do: allocate the tensors there", ptr);
        if (active < 0) {
            /* No device has a context (the driver says so, and does not
             * know the pointer): no device, pinned or managed memory can
             * exist, so the pointer is plain host memory, and asking the
             * runtime would create a context on GPU 0 in a process that
             * has the runtime loaded but never used it. */
            *type = CU_MEM_UNREGISTERED;
            *ordinal = -1;
            return CKPT_OK;
        }
        if (api->SetDevice(active) != CU_SUCCESS)
            api->GetLastError();
        else if (api->runtime_version < 12000)
            back = cur; /* the thread may have chosen `cur`: see guard_leave */
    }
    cu_pointer_attributes attr;
    memset(&attr, 0, sizeof attr);
    cu_err err = api->PointerGetAttributes(&attr, ptr);
    if (back >= 0 && api->SetDevice(back) != CU_SUCCESS)
        api->GetLastError();
    if (err == CU_ERR_INVALID_VALUE) {
        /* Runtimes before 11.0 reported plain host memory this way. */
        api->GetLastError();
        *type = CU_MEM_UNREGISTERED;
        return CKPT_OK;
    }
    if (err != CU_SUCCESS) {
        char buf[256];
        api->GetLastError();
        return ckpt_seterr(CKPT_EDEVICE, "cannot tell where pointer %p lives: %s", ptr,
                           cuda_loader_errstr(api, err, buf, sizeof buf));
    }
    *type = attr.type;
    *ordinal = attr.device;
    return CKPT_OK;
}

/* ---------------------------------------------------------------- events */

/* An idle event of device `dev`; that device must be current. */
static int event_get(dcuda *cu, int dev, cu_event *out)
{
    if (dev < 0 || dev >= CU_MAX_DEVICES)
        return ckpt_seterr(CKPT_EDEVICE, "CUDA device %d is beyond the %d devices "
                           "libckpt supports", dev, CU_MAX_DEVICES);
    evpool *p = &cu->pools[dev];
    pthread_mutex_lock(&cu->pool_mu);
    if (p->n) {
        *out = p->ev[--p->n];
        pthread_mutex_unlock(&cu->pool_mu);
        return CKPT_OK;
    }
    pthread_mutex_unlock(&cu->pool_mu);
    cu_err err = cu->api->EventCreateWithFlags(out, CU_EVENT_FLAGS);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "cannot create a CUDA event: %s",
                           errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

static void event_put(dcuda *cu, int dev, cu_event e)
{
    evpool *p = &cu->pools[dev];
    pthread_mutex_lock(&cu->pool_mu);
    if (grow((void **)&p->ev, &p->cap, p->n + 1, sizeof *p->ev) == 0) {
        p->ev[p->n++] = e;
        e = NULL;
    }
    pthread_mutex_unlock(&cu->pool_mu);
    if (e)
        cu->api->EventDestroy(e);
}

/* A shared event of device `dev` (current) with one reference; `issued`
 * says whether it is recorded. */
static int shared_new_on(dcuda *cu, int dev, int issued, shared_ev **out)
{
    shared_ev *s = calloc(1, sizeof *s);
    if (!s)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating a device event");
    s->dev = dev;
    int rc = event_get(cu, dev, &s->e);
    if (rc != CKPT_OK) {
        free(s);
        return rc;
    }
    s->refs = 1;
    s->issued = issued;
    *out = s;
    return CKPT_OK;
}

static int shared_new(dcuda *cu, int issued, shared_ev **out)
{
    return shared_new_on(cu, cu->ordinal, issued, out);
}

/* With mu held. */
static shared_ev *shared_take_locked(shared_ev *s)
{
    s->refs++;
    return s;
}

static shared_ev *shared_take(dcuda *cu, shared_ev *s)
{
    pthread_mutex_lock(&cu->mu);
    shared_take_locked(s);
    pthread_mutex_unlock(&cu->mu);
    return s;
}

/* With mu held (event_put takes only pool_mu). */
static void shared_release_locked(dcuda *cu, shared_ev *s)
{
    if (s && --s->refs == 0) {
        event_put(cu, s->dev, s->e);
        free(s);
    }
}

static void shared_release(dcuda *cu, shared_ev *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&cu->mu);
    shared_release_locked(cu, s);
    pthread_mutex_unlock(&cu->mu);
}

void dcuda_event_free(dcuda *cu, device_event *ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&cu->mu);
    shared_release_locked(cu, ev->data);
    shared_release_locked(cu, ev->snap);
    pthread_mutex_unlock(&cu->mu);
    free(ev);
}

/* Issue the pending staged drains and record their batch event.  With mu
 * held; any thread (a worker waiting for a chunk of the batch may do it). */
static void flush_locked(dcuda *cu)
{
    shared_ev *b = cu->batch;
    if (!b)
        return;
    int prev;
    cu_err err = CU_SUCCESS;
    if (guard_enter(cu, &prev) != CKPT_OK) {
        err = CU_ERR_INVALID_VALUE;
    } else {
        for (size_t i = 0; i < cu->ndrains && err == CU_SUCCESS; i++)
            err = cu->api->MemcpyAsync(cu->drains[i].dst, cu->drains[i].src,
                                       cu->drains[i].n, CU_MEMCPY_DEFAULT, cu->drain);
        if (err == CU_SUCCESS)
            err = cu->api->EventRecord(b->e, cu->drain);
        guard_leave(cu, prev);
    }
    if (err != CU_SUCCESS)
        cu->api->GetLastError();
    b->err = err;
    b->issued = 1;
    cu->batch = NULL;
    cu->ndrains = 0;
    cu->pending = 0;
    shared_release_locked(cu, b);
}

/* ------------------------------------------------------------- lifecycle */

int dcuda_open(dcuda **out, ckpt_snapshot_mode mode, int ordinal)
{
    const cuda_api *api;
    int rc = cuda_loader_get(&api);
    if (rc != CKPT_OK)
        return rc;
    dcuda *cu = calloc(1, sizeof *cu);
    if (!cu)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating the CUDA backend");
    cu->api = api;
    cu->mode = mode;
    pthread_mutex_init(&cu->mu, NULL);
    cu->drain_batch = DRAIN_BATCH;
    pthread_mutex_init(&cu->pool_mu, NULL);
    char buf[256];
    cu_err err = CU_SUCCESS;
    if (ordinal < 0 && (err = api->GetDevice(&ordinal)) != CU_SUCCESS) {
        rc = ckpt_seterr(CKPT_EDEVICE, "cannot get the current CUDA device: %s",
                         errstr(cu, err, buf, sizeof buf));
        goto fail;
    }
    cu->ordinal = ordinal;
    int prev;
    if ((rc = guard_enter(cu, &prev)) != CKPT_OK)
        goto fail;
    err = api->StreamCreateWithFlags(&cu->copy, CU_STREAM_NON_BLOCKING);
    if (err == CU_SUCCESS)
        err = api->EventCreateWithFlags(&cu->start, CU_EVENT_FLAGS);
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        rc = ckpt_seterr(CKPT_EDEVICE, "cannot create the CUDA copy stream: %s",
                         errstr(cu, err, buf, sizeof buf));
        goto fail;
    }
    *out = cu;
    return CKPT_OK;
fail:
    dcuda_free(cu);
    return rc;
}

/* Wait for the work queued on `stream` (of cu's device, current) without
 * spinning a core: cudaStreamSynchronize spins under the default
 * scheduling (cudaDeviceScheduleAuto spins while the process has fewer
 * active contexts than cores, which a GPU node always has) and
 * the application, not libckpt, owns the device flags; a host thread
 * waiting on an event created with cudaEventBlockingSync sleeps.  Falls
 * back to the stream synchronize when no event can be had (a sticky
 * error: then either call returns at once). */
static cu_err sync_stream_blocking(dcuda *cu, cu_stream stream)
{
    cu_event ev;
    int cur = -1;
    if (cu->api->GetDevice(&cur) != CU_SUCCESS || cur != cu->ordinal) {
        cu->api->GetLastError(); /* an event made here would be of another device */
        return cu->api->StreamSynchronize(stream);
    }
    ckpt_error_state e;
    ckpt_error_capture(&e, CKPT_OK);
    int got = event_get(cu, cu->ordinal, &ev) == CKPT_OK;
    ckpt_error_restore(&e);
    if (!got)
        return cu->api->StreamSynchronize(stream);
    cu_err err = cu->api->EventRecord(ev, stream);
    if (err == CU_SUCCESS)
        err = cu->api->EventSynchronize(ev);
    else
        err = cu->api->StreamSynchronize(stream);
    event_put(cu, cu->ordinal, ev);
    return err;
}

void dcuda_quiesce(dcuda *cu)
{
    if (!cu)
        return;
    int prev = wait_enter(cu, cu->ordinal);
    pthread_mutex_lock(&cu->mu);
    flush_locked(cu);
    pthread_mutex_unlock(&cu->mu);
    cu_err e1 = cu->copy ? sync_stream_blocking(cu, cu->copy) : CU_SUCCESS;
    cu_err e2 = cu->drain ? sync_stream_blocking(cu, cu->drain) : CU_SUCCESS;
    /* Clear only an error these calls left: an error the application had
     * pending before is the application's to read. */
    if (e1 != CU_SUCCESS || e2 != CU_SUCCESS)
        cu->api->GetLastError();
    guard_leave(cu, prev);
    cu->direct = 0;
}

/* Destroy the save side's events, streams and scratch (those that exist),
 * in the current device's context; 1 when a call failed (the caller clears
 * that error: see dcuda_quiesce).  The pointers are left to the caller. */
static int destroy_save_side(dcuda *cu)
{
    int failed = 0;
    if (cu->start)
        failed |= cu->api->EventDestroy(cu->start) != CU_SUCCESS;
    if (cu->drained)
        failed |= cu->api->EventDestroy(cu->drained) != CU_SUCCESS;
    if (cu->copy)
        failed |= cu->api->StreamDestroy(cu->copy) != CU_SUCCESS;
    if (cu->drain)
        failed |= cu->api->StreamDestroy(cu->drain) != CU_SUCCESS;
    if (cu->scratch)
        failed |= cu->api->Free(cu->scratch) != CU_SUCCESS;
    return failed;
}

void dcuda_free(dcuda *cu)
{
    if (!cu)
        return;
    /* Errors are ignored: after a sticky CUDA error every call fails, and
     * there is nothing better to do than to let go of the handles. */
    dcuda_quiesce(cu);
    shared_release(cu, cu->snap);
    cu->snap = NULL;
    int prev;
    int guarded = cu->copy && guard_enter(cu, &prev) == CKPT_OK;
    int failed = 0; /* clear only errors of our own calls (see quiesce) */
    for (int d = 0; d < CU_MAX_DEVICES; d++)
        for (size_t i = 0; i < cu->pools[d].n; i++)
            failed |= cu->api->EventDestroy(cu->pools[d].ev[i]) != CU_SUCCESS;
    failed |= destroy_save_side(cu);
    if (failed)
        cu->api->GetLastError();
    if (guarded)
        guard_leave(cu, prev);
    for (int d = 0; d < CU_MAX_DEVICES; d++)
        free(cu->pools[d].ev);
    free(cu->drains);
    free(cu->regions);
    pthread_mutex_destroy(&cu->pool_mu);
    pthread_mutex_destroy(&cu->mu);
    free(cu);
}

int dcuda_host_alloc(dcuda *cu, size_t bytes, void **ptr)
{
    /* Pinned memory is allocated in the current device's context: ours, so
     * a worker never initializes device 0 for it. */
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->HostAlloc(ptr, bytes ? bytes : 1, CU_HOST_ALLOC_PORTABLE);
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        *ptr = NULL;
        /* Out of page-locked memory (a scarce resource, refused long before
         * pageable memory is): CKPT_ENOMEM, which the caller answers with
         * pageable memory; any other error is the device's. */
        return ckpt_seterr(err == CU_ERR_MEMORY_ALLOCATION ? CKPT_ENOMEM : CKPT_EDEVICE,
                           "cannot allocate %zu bytes of pinned host memory for "
                           "device tensors: %s", bytes, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_host_free(dcuda *cu, void *ptr)
{
    int prev, guarded = guard_enter(cu, &prev) == CKPT_OK, rc = CKPT_OK;
    if (cu->api->FreeHost(ptr) != CU_SUCCESS) {
        cu->api->GetLastError();
        rc = CKPT_EDEVICE;
    }
    if (guarded)
        guard_leave(cu, prev);
    return rc;
}

int dcuda_current(dcuda *cu)
{
    int dev = -1;
    if (cu->api->GetDevice(&dev) != CU_SUCCESS) {
        cu->api->GetLastError();
        return -1;
    }
    return dev;
}

int dcuda_relax_capture(dcuda *cu, const cuda_api **api)
{
    *api = NULL;
    int mode = 2; /* cudaStreamCaptureModeRelaxed */
    if (!cu || pool_on_library_thread() || !cu->api->ThreadExchangeStreamCaptureMode)
        return -1;
    if (cu->api->ThreadExchangeStreamCaptureMode(&mode) != CU_SUCCESS) {
        cu->api->GetLastError();
        return -1;
    }
    *api = cu->api;
    return mode;
}

void dcuda_restore_capture(const cuda_api *api, int mode)
{
    if (api && mode >= 0 && api->ThreadExchangeStreamCaptureMode(&mode) != CU_SUCCESS)
        api->GetLastError();
}

/* Move the save side to CUDA device `ordinal` (no save is in flight: begin
 * waited for it).  The old device's streams, events and scratch go (its
 * cudaFree synchronizes that device, once per move). */
static int rehome(dcuda *cu, int ordinal)
{
    char buf[256];
    /* Home already, with both handles: an earlier rehome that failed
     * half-way (the stream made, not the event) is tried again. */
    if (ordinal == cu->ordinal && cu->copy && cu->start)
        return CKPT_OK;
    dcuda_quiesce(cu);
    shared_release(cu, cu->snap);
    cu->snap = NULL;
    int prev, failed = 0;
    if (guard_enter(cu, &prev) == CKPT_OK) {
        if ((failed = destroy_save_side(cu)))
            cu->api->GetLastError();
        guard_leave(cu, prev);
    }
    cu->start = cu->drained = NULL;
    cu->copy = cu->drain = NULL;
    cu->scratch = NULL;
    cu->scratch_bytes = 0;
    cu->ordinal = ordinal;
    int rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->StreamCreateWithFlags(&cu->copy, CU_STREAM_NON_BLOCKING);
    if (err == CU_SUCCESS)
        err = cu->api->EventCreateWithFlags(&cu->start, CU_EVENT_FLAGS);
    if (err != CU_SUCCESS) {
        rc = ckpt_seterr(CKPT_EDEVICE, "cannot create the CUDA copy stream on device "
                         "%d: %s", ordinal, errstr(cu, err, buf, sizeof buf));
        /* Neither half kept: the next save makes both again instead of
         * recording on a NULL event. */
        if (cu->copy && cu->api->StreamDestroy(cu->copy) != CU_SUCCESS)
            cu->api->GetLastError();
        cu->copy = NULL;
        cu->start = NULL;
    }
    guard_leave(cu, prev);
    return rc;
}

/* --------------------------------------------------------------- save side */

int dcuda_snapshot_reserve(dcuda *cu, const ckpt_tensor *t, const ckpt_memory *mem,
                           size_t count, int ordinal, int *staged)
{
    *staged = 0;
    cu->scratch_on = 0;
    cu->planned = 0;
    cu->nregions = 0;
    cu->cur_region = 0;
    int rc0 = ordinal >= 0 ? rehome(cu, ordinal) : CKPT_OK;
    if (rc0 != CKPT_OK || cu->mode != CKPT_SNAPSHOT_DEVICE)
        return rc0;
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (mem[i] != CKPT_MEM_DEVICE || t[i].bytes == 0)
            continue;
        if (grow((void **)&cu->regions, &cu->capregions, cu->nregions + 1, sizeof(region)))
            return ckpt_seterr(CKPT_ENOMEM, "out of memory planning the device snapshot");
        region *r = &cu->regions[cu->nregions++];
        r->src = t[i].data;
        r->len = t[i].bytes;
        r->off = total;
        snprintf(r->name, sizeof r->name, "%s", t[i].name ? t[i].name : "");
        total += (t[i].bytes + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
    }
    if (total == 0)
        return CKPT_OK;
    /* Batches of a share of the state: at most DEVICE_CALLER_RECORDS - 2
     * batch events (the drain stream also gets `drained`, and a last one). */
    uint64_t batch = total / (DEVICE_CALLER_RECORDS - 2) + 1;
    pthread_mutex_lock(&cu->mu);
    cu->drain_batch = batch > DRAIN_BATCH ? batch : DRAIN_BATCH;
    pthread_mutex_unlock(&cu->mu);
    char buf[256];
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err;
    if (cu->scratch && cu->scratch_bytes < total) {
        /* Growing would cudaFree the old scratch here, and cudaFree waits
         * for the whole device: the training thread would stall on its own
         * queued work.  This save goes through the host; dcuda_trim frees
         * the scratch off the caller's thread, and the next save allocates
         * one of the new size. */
        cu->scratch_want = total;
        dcuda_note(cu, "device snapshot mode used the host path once: the state grew "
                   "to %llu bytes, beyond the %llu bytes of spare device memory "
                   "reserved", (unsigned long long)total,
                   (unsigned long long)cu->scratch_bytes);
        goto done;
    }
    if (cu->scratch_bytes < total) {
        size_t free_b = 0, total_b = 0;
        err = cu->api->MemGetInfo(&free_b, &total_b);
        if (err != CU_SUCCESS) {
            rc = ckpt_seterr(CKPT_EDEVICE, "cannot query free device memory: %s",
                             errstr(cu, err, buf, sizeof buf));
            goto done;
        }
        /* Leave the application headroom: 5% of the device, at least 256 MiB. */
        uint64_t headroom = total_b / 20;
        if (headroom < ((uint64_t)256 << 20))
            headroom = (uint64_t)256 << 20;
        if ((uint64_t)free_b < total + headroom) {
            dcuda_note(cu, "device snapshot mode fell back to host: %llu bytes of "
                       "device tensors do not fit in %zu free bytes of device memory",
                       (unsigned long long)total, free_b);
            goto done;
        }
        err = cu->api->Malloc(&cu->scratch, total);
        if (err != CU_SUCCESS) {
            cu->scratch = NULL;
            dcuda_note(cu, "device snapshot mode fell back to host: cannot allocate %llu "
                       "bytes of device memory: %s", (unsigned long long)total,
                       errstr(cu, err, buf, sizeof buf));
            goto done;
        }
        cu->scratch_bytes = total;
    }
    if (!cu->drain) {
        err = cu->api->StreamCreateWithFlags(&cu->drain, CU_STREAM_NON_BLOCKING);
        if (err != CU_SUCCESS) {
            cu->drain = NULL;
            rc = ckpt_seterr(CKPT_EDEVICE, "cannot create the CUDA drain stream: %s",
                             errstr(cu, err, buf, sizeof buf));
            goto done;
        }
    }
    cu->scratch_on = 1;
    cu->planned = 1;
    *staged = 1;
done:
    guard_leave(cu, prev);
    return rc;
}

int dcuda_refuse_capture(dcuda *cu, void *stream, const char *op)
{
    int capturing = 0;
    if (!stream || !cu->api->StreamIsCapturing)
        return CKPT_OK;
    if (cu->api->StreamIsCapturing(stream, &capturing) != CU_SUCCESS) {
        cu->api->GetLastError(); /* not told: EventRecord reports a bad stream */
        return CKPT_OK;
    }
    if (!capturing)
        return CKPT_OK;
    /* A save's start event recorded there would pull the copy stream into
     * the capture, and a restore's copies would be enqueued on it: either
     * way the copies would be recorded into the application's graph
     * instead of running (a restore's from staging memory reused at once),
     * and the capture would fail or keep them. */
    return ckpt_seterr(CKPT_EINVAL, "the CUDA stream %p given to the %s is capturing a "
                       "CUDA graph: a checkpoint cannot be part of a graph; %s before "
                       "cudaStreamBeginCapture or after cudaStreamEndCapture", stream, op, op);
}

int dcuda_snapshot_start(dcuda *cu, void *caller_stream)
{
    char buf[256];
    pthread_mutex_lock(&cu->mu);
    flush_locked(cu); /* nothing should be left; never mix two snapshots */
    /* Drains queued by a save whose batch was never made (it failed in
     * between) would write that save's scratch into this one's buffer. */
    cu->ndrains = 0;
    cu->pending = 0;
    pthread_mutex_unlock(&cu->mu);
    shared_release(cu, cu->snap);
    cu->snap = NULL;
    cu->direct = 0;
    cu->last_tensor[0] = 0;
    if (!cu->planned)
        cu->scratch_on = 0; /* a plan serves one snapshot: its pointers may be gone */
    cu->planned = 0;
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    const char *what = "cannot order the snapshot after the caller's CUDA stream";
    const char *name = "";
    if ((rc = dcuda_refuse_capture(cu, caller_stream, "save")) != CKPT_OK) {
        guard_leave(cu, prev);
        return rc;
    }
    cu_err err = cu->api->EventRecord(cu->start, caller_stream);
    int bad_stream = err == CU_ERR_INVALID_HANDLE; /* the caller's argument, not the GPU */
    if (bad_stream)
        what = "cannot order the snapshot after the caller's CUDA stream (it must "
               "belong to the device the tensors are on)";
    if (err == CU_SUCCESS)
        err = cu->api->StreamWaitEvent(cu->copy, cu->start, 0);
    /* Scratch is rewritten from the start: not before the last drain has
     * read it (on the GPU; the pipeline normally waited already). */
    if (err == CU_SUCCESS && cu->drain) {
        if (!cu->drained)
            err = cu->api->EventCreateWithFlags(&cu->drained, CU_EVENT_FLAGS);
        if (err == CU_SUCCESS)
            err = cu->api->EventRecord(cu->drained, cu->drain);
        if (err == CU_SUCCESS)
            err = cu->api->StreamWaitEvent(cu->copy, cu->drained, 0);
    }
    if (err == CU_SUCCESS && cu->scratch_on) {
        /* Stage every device tensor now, whole: the snapshot point is then
         * complete after a few large D2D copies. */
        what = "CUDA error while copying to spare device memory";
        for (size_t i = 0; i < cu->nregions && err == CU_SUCCESS; i++) {
            region *r = &cu->regions[i];
            name = r->name;
            err = cu->api->MemcpyAsync((char *)cu->scratch + r->off, r->src, r->len,
                                       CU_MEMCPY_DEFAULT, cu->copy);
        }
        if (err == CU_SUCCESS) {
            name = "";
            what = "cannot record a CUDA event";
            if ((rc = shared_new(cu, 1, &cu->snap)) != CKPT_OK) {
                cu->scratch_on = 0;
                guard_leave(cu, prev);
                return rc;
            }
            err = cu->api->EventRecord(cu->snap->e, cu->copy);
            if (err == CU_SUCCESS)
                err = cu->api->StreamWaitEvent(cu->drain, cu->snap->e, 0);
        }
    }
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        cu->scratch_on = 0;
        int status = bad_stream ? CKPT_EINVAL : CKPT_EDEVICE;
        if (*name)
            return ckpt_seterr(status, "tensor '%s': %s: %s", name, what,
                               errstr(cu, err, buf, sizeof buf));
        return ckpt_seterr(status, "%s: %s", what, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

/* The staged copy of [src, src + n), or NULL. */
static const char *staged_copy(dcuda *cu, const void *src, size_t n)
{
    const char *p = src;
    for (size_t k = 0; k < cu->nregions; k++) {
        size_t i = (cu->cur_region + k) % cu->nregions; /* usually the same one */
        region *r = &cu->regions[i];
        if (p >= r->src && (uint64_t)(p - r->src) <= r->len &&
            (uint64_t)(p - r->src) + n <= r->len) {
            cu->cur_region = i;
            return (const char *)cu->scratch + r->off + (uint64_t)(p - r->src);
        }
    }
    return NULL;
}

int dcuda_copy_d2h(dcuda *cu, void *dst, const void *src, size_t n, const char *tensor)
{
    snprintf(cu->last_tensor, sizeof cu->last_tensor, "%s", tensor ? tensor : "");
    const char *stage = cu->scratch_on && cu->snap ? staged_copy(cu, src, n) : NULL;
    if (stage) {
        /* Bookkeeping only: issued with its batch (flush_locked). */
        int rc = CKPT_OK;
        pthread_mutex_lock(&cu->mu);
        drain *last = cu->ndrains ? &cu->drains[cu->ndrains - 1] : NULL;
        if (last && (char *)last->dst + last->n == (char *)dst && last->src + last->n == stage)
            last->n += n; /* contiguous in both: one copy */
        else if (grow((void **)&cu->drains, &cu->capdrains, cu->ndrains + 1, sizeof(drain)))
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory queueing a device copy");
        else
            cu->drains[cu->ndrains++] = (drain){ dst, stage, n };
        if (rc == CKPT_OK)
            cu->pending += n;
        pthread_mutex_unlock(&cu->mu);
        return rc;
    }
    char buf[256];
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->MemcpyAsync(dst, src, n, CU_MEMCPY_DEFAULT, cu->copy);
    guard_leave(cu, prev);
    if (err != CU_SUCCESS)
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while copying %zu bytes "
                           "to the host: %s", tensor ? tensor : "", n,
                           errstr(cu, err, buf, sizeof buf));
    cu->direct = 1;
    return CKPT_OK;
}

int dcuda_alloc_end(dcuda *cu, const void *p, const void **end)
{
    if (!cu->api->DrvMemGetAddressRange)
        return CKPT_ENOTFOUND;
    int prev;
    if (guard_enter(cu, &prev) != CKPT_OK)
        return CKPT_ENOTFOUND; /* the copy itself will say why */
    unsigned long long base = 0;
    size_t size = 0;
    int res = cu->api->DrvMemGetAddressRange(&base, &size, (unsigned long long)(uintptr_t)p);
    guard_leave(cu, prev);
    if (res != 0 || (uintptr_t)p < base || (uintptr_t)p - base >= size)
        return CKPT_ENOTFOUND;
    *end = (const char *)(uintptr_t)base + size;
    return CKPT_OK;
}

/* Staged snapshot: the event joins the pending drain batch.  Copies of
 * memory that was not staged went straight to the host on the copy stream:
 * they get a snap of their own, which the drain stream waits for, so the
 * batch event covers them too. */
static int record_staged(dcuda *cu, device_event *ev, cu_err *err)
{
    int rc;
    if (cu->direct) {
        if ((rc = shared_new(cu, 1, &ev->snap)) != CKPT_OK)
            return rc;
        *err = cu->api->EventRecord(ev->snap->e, cu->copy);
        if (*err == CU_SUCCESS)
            *err = cu->api->StreamWaitEvent(cu->drain, ev->snap->e, 0);
        if (*err != CU_SUCCESS)
            return CKPT_OK;
        cu->direct = 0;
    } else {
        ev->snap = shared_take(cu, cu->snap);
    }
    shared_ev *fresh = NULL;
    pthread_mutex_lock(&cu->mu);
    if (!cu->batch) {
        pthread_mutex_unlock(&cu->mu);
        if ((rc = shared_new(cu, 0, &fresh)) != CKPT_OK)
            return rc;
        pthread_mutex_lock(&cu->mu);
        cu->batch = fresh; /* only this thread creates batches */
    }
    ev->data = shared_take_locked(cu->batch);
    if (cu->pending >= cu->drain_batch)
        flush_locked(cu);
    pthread_mutex_unlock(&cu->mu);
    return CKPT_OK;
}

/* The application's restore stream as a library worker must name it.
 * cudaStreamPerThread (2) means the calling thread's own stream, so on a
 * worker it would be the worker's, unordered with the application's work.
 * The legacy default stream (NULL) stands in: the per-thread streams
 * synchronize with it (CUDA's "stream synchronization behavior"), so the
 * copies start after the application's queued work and its later work
 * waits for them. */
static void *worker_stream(void *stream)
{
    return (uintptr_t)stream == 2 ? NULL : stream;
}

int dcuda_record(dcuda *cu, int on_stream, void *stream, int ordinal, device_event **out)
{
    char buf[256];
    device_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating a device event");
    if (!on_stream || ordinal < 0)
        ordinal = cu->ordinal;
    if (on_stream)
        stream = worker_stream(stream);
    int prev, rc = guard_enter_on(cu, ordinal, &prev);
    if (rc != CKPT_OK) {
        free(ev);
        return rc;
    }
    cu_err err = CU_SUCCESS;
    if (on_stream) {
        pthread_mutex_lock(&cu->mu);
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_h2d);
        pthread_mutex_unlock(&cu->mu);
        if ((rc = shared_new_on(cu, ordinal, 1, &ev->data)) == CKPT_OK)
            err = cu->api->EventRecord(ev->data->e, stream);
        if ((rc != CKPT_OK || err != CU_SUCCESS) &&
            cu->api->StreamSynchronize(stream) != CU_SUCCESS)
            cu->api->GetLastError(); /* no marker: copies queued there still read
                                        the caller's staging buffer; let them end */
        if (err == CU_ERR_INVALID_HANDLE) {
            guard_leave(cu, prev);
            rc = ckpt_seterr(CKPT_EINVAL, "tensor '%s': the CUDA stream %p is not on "
                             "device %d, where the tensor lives: pass a stream of that "
                             "device (or NULL)", ev->tensor, stream, ordinal);
            cu->api->GetLastError();
            dcuda_event_free(cu, ev);
            return rc;
        }
    } else if (cu->scratch_on && cu->snap) {
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_tensor);
        rc = record_staged(cu, ev, &err);
    } else {
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_tensor);
        if ((rc = shared_new(cu, 1, &ev->data)) == CKPT_OK)
            err = cu->api->EventRecord(ev->data->e, cu->copy);
        cu->direct = 0;
    }
    guard_leave(cu, prev);
    if (rc == CKPT_OK && err != CU_SUCCESS)
        rc = ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while queueing the copy "
                         "to the host: %s", ev->tensor, errstr(cu, err, buf, sizeof buf));
    else if (rc != CKPT_OK && ev->tensor[0]) /* name what the marker was for */
        rc = ckpt_seterr(rc, "tensor '%s': %s", ev->tensor, ckpt_error_last());
    if (rc != CKPT_OK) {
        dcuda_event_free(cu, ev);
        return rc;
    }
    *out = ev;
    return CKPT_OK;
}

int dcuda_event_dup(dcuda *cu, const device_event *ev, device_event **out)
{
    device_event *d = malloc(sizeof *d);
    if (!d)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating a device event");
    *d = *ev;
    pthread_mutex_lock(&cu->mu);
    if (d->data)
        shared_take_locked(d->data);
    if (d->snap)
        shared_take_locked(d->snap);
    pthread_mutex_unlock(&cu->mu);
    *out = d;
    return CKPT_OK;
}

int dcuda_event_wait(dcuda *cu, device_event *ev, int snapshot_only)
{
    /* A failed D2D shows on `snap`, not on the drain's event. */
    cu_err err = CU_SUCCESS;
    int prev = wait_enter(cu, ev->data ? ev->data->dev : cu->ordinal);
    if (ev->snap)
        err = cu->api->EventSynchronize(ev->snap->e);
    if (err == CU_SUCCESS && ev->data && !(snapshot_only && ev->snap)) {
        pthread_mutex_lock(&cu->mu);
        if (!ev->data->issued)
            flush_locked(cu); /* the batch holding our chunk */
        err = ev->data->err;
        pthread_mutex_unlock(&cu->mu);
        if (err == CU_SUCCESS)
            err = cu->api->EventSynchronize(ev->data->e);
    }
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error during the device "
                           "copy: %s", ev->tensor, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_fence(dcuda *cu, device_event *ev, void *stream)
{
    shared_ev *s = ev->snap ? ev->snap : ev->data;
    /* The legacy default stream (NULL or cudaStreamLegacy) and the
     * per-thread stream are those of the calling thread's current device:
     * the tensors' device must be current, or another device's stream
     * would wait (legal, so no error) and the caller's next kernel on the
     * tensors' device would race the snapshot copy. */
    int prev = -1, implicit = (uintptr_t)stream <= 2;
    if (implicit) {
        int rc = guard_enter_on(cu, s->dev, &prev);
        if (rc != CKPT_OK)
            return rc;
    } else {
        /* An explicit stream may be waited on from any device, but on a
         * thread with no context yet the runtime would first create one on
         * device 0 (a fence from a thread other than the one that saved):
         * quietly make the tensors' device current, as for waits. */
        prev = wait_enter(cu, s->dev);
    }
    cu_err err = cu->api->StreamWaitEvent(stream, s->e, 0);
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "cannot make CUDA stream %p wait for the "
                           "snapshot: %s", stream, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

/* ------------------------------------------------------------ restore side */

int dcuda_copy_h2d(dcuda *cu, void *dst, const void *src, size_t n, void *stream,
                   int ordinal, const char *tensor)
{
    stream = worker_stream(stream);
    pthread_mutex_lock(&cu->mu);
    snprintf(cu->last_h2d, sizeof cu->last_h2d, "%s", tensor ? tensor : "");
    pthread_mutex_unlock(&cu->mu);
    /* The tensor's device current: a NULL stream is that device's legacy
     * stream, and a worker never touches another device. */
    int prev, rc = guard_enter_on(cu, ordinal >= 0 ? ordinal : cu->ordinal, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->MemcpyAsync(dst, src, n, CU_MEMCPY_DEFAULT, stream);
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while copying %zu "
                           "bytes to the device: %s", tensor ? tensor : "", n,
                           errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

void dcuda_trim(dcuda *cu)
{
    if (!cu || !cu->scratch || cu->scratch_want <= cu->scratch_bytes)
        return;
    int prev;
    if (guard_enter(cu, &prev) != CKPT_OK)
        return;
    if (cu->api->Free(cu->scratch) != CU_SUCCESS)
        cu->api->GetLastError();
    guard_leave(cu, prev);
    cu->scratch = NULL;
    cu->scratch_bytes = 0;
    cu->scratch_want = 0;
}

/* ------------------------------------------------------------- environment */

static json_t *version_json(int v)
{
    char s[32];
    snprintf(s, sizeof s, "%d.%d", v / 1000, (v % 1000) / 10);
    return json_string(s);
}

void dcuda_describe(dcuda *cu, struct json_t *env, uint64_t pinned_bytes)
{
    const cuda_api *api = cu->api;
    json_t *o = json_object();
    if (!o)
        return;
    pthread_mutex_lock(&cu->mu);
    if (!cu->described) {
        cu->described = 1;
        int failed = 0; /* clear only errors of these calls (see quiesce) */
        if (api->RuntimeGetVersion(&cu->runtime_version) != CU_SUCCESS)
            cu->runtime_version = 0, failed = 1;
        if (api->DriverGetVersion(&cu->driver_version) != CU_SUCCESS)
            cu->driver_version = 0, failed = 1;
        /* cudaDeviceProp is about 1 KiB; `name` (char[256]) comes first. */
        char *prop = api->GetDeviceProperties ? calloc(1, 16384) : NULL;
        if (prop && api->GetDeviceProperties(prop, cu->ordinal) == CU_SUCCESS)
            snprintf(cu->gpu_name, sizeof cu->gpu_name, "%.255s", prop);
        else if (prop)
            failed = 1;
        free(prop);
        if (failed)
            api->GetLastError();
    }
    if (cu->runtime_version)
        json_object_set_new(o, "runtime_version", version_json(cu->runtime_version));
    if (cu->driver_version)
        json_object_set_new(o, "driver_version", version_json(cu->driver_version));
    json_object_set_new(o, "device", json_integer(cu->ordinal));
    if (cu->gpu_name[0])
        json_object_set_new(o, "gpu_name", json_string(cu->gpu_name));
    json_object_set_new(o, "library", json_string(api->library ? api->library : ""));
    static const char *const modes[] = { "host", "device", "stream" };
    json_object_set_new(o, "snapshot_mode",
                        json_string((unsigned)cu->mode < 3 ? modes[cu->mode] : "?"));
    json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)pinned_bytes));
    if (cu->note[0])
        json_object_set_new(o, "note", json_string(cu->note));

    pthread_mutex_unlock(&cu->mu);
    json_object_set_new((json_t *)env, "cuda", o);
}

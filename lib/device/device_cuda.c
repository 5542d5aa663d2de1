/* device_cuda: snapshots and restores of CUDA device memory (this file:
 * threads and devices, events, lifecycle; the copies: device_cuda_copy.c).
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
#include "device_cuda_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pool.h"

const char *dcuda_errstr(const dcuda *cu, cu_err err, char *buf, size_t len)
{
    cu->api->GetLastError(); /* clear a non-sticky error for the caller */
    return cuda_loader_errstr(cu->api, err, buf, len);
}

/* Run CUDA calls with device `dev` current, as streams, events and the
 * legacy default stream belong to one device.  On an application thread
 * the caller's choice is restored afterwards (dcuda_guard_leave).  A library
 * thread (pool worker, persist thread) is bound to `dev` and stays bound:
 * switching it back would create a context on device 0, which on a
 * multi-GPU node costs every rank's process memory on GPU 0 and fails on
 * GPUs in exclusive-process mode. */
int dcuda_guard_enter_on(dcuda *cu, int dev, int *prev)
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
                               dev, dcuda_errstr(cu, err, buf, sizeof buf));
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
 * (dcuda_guard_enter_on; dcuda_guard_leave after), on application threads too
 * (ckpt_save_wait_snapshot, a failed begin's cleanup).  Quietly: a failure
 * leaves the thread as it was and the caller's message alone, and the
 * wait itself reports.  Returns what dcuda_guard_leave takes. */
int dcuda_wait_enter(dcuda *cu, int dev)
{
    ckpt_error_state e;
    ckpt_error_capture(&e, CKPT_OK);
    int prev = -1;
    if (dcuda_guard_enter_on(cu, dev, &prev) != CKPT_OK) {
        cu->api->GetLastError();
        prev = -1;
    }
    ckpt_error_restore(&e);
    return prev;
}

int dcuda_guard_enter(dcuda *cu, int *prev)
{
    return dcuda_guard_enter_on(cu, cu->ordinal, prev);
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

/* dcuda_guard_leave with the runtime only (the store's dcuda may be gone). */
static void guard_leave_api(const cuda_api *api, int prev)
{
    int cur;
    if (prev < 0 || api->GetDevice(&cur) != CU_SUCCESS || cur == prev)
        return;
    /* A thread that never chose a device reports device 0 without having a
     * context there.  Switching it back would create one: hundreds of MiB
     * of GPU 0 in every process saving from another GPU, and a failure on
     * GPUs in exclusive-process mode.  As PyTorch does (c10::cuda::
     * MaybeExchangeDevice), such a thread is left on the device it used.
     * Before CUDA 12 cudaSetDevice makes no context: an inactive device
     * may be one the thread chose, and going back to it costs nothing. */
    if (api->runtime_version >= 12000 && primary_inactive(api, prev))
        return;
    /* A failure (exclusive-process mode) must not stay in the thread's
     * last-error slot, where the application's next check would find it. */
    if (api->SetDevice(prev) != CU_SUCCESS)
        api->GetLastError();
}

void dcuda_guard_leave(dcuda *cu, int prev)
{
    guard_leave_api(cu->api, prev);
}

int dcuda_grow(void **arr, size_t *cap, size_t need, size_t size)
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
     * again would create the context after all: see dcuda_guard_leave), except
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
            back = cur; /* the thread may have chosen `cur`: see dcuda_guard_leave */
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
                           dcuda_errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

static void event_put(dcuda *cu, int dev, cu_event e)
{
    evpool *p = &cu->pools[dev];
    pthread_mutex_lock(&cu->pool_mu);
    if (dcuda_grow((void **)&p->ev, &p->cap, p->n + 1, sizeof *p->ev) == 0) {
        p->ev[p->n++] = e;
        e = NULL;
    }
    pthread_mutex_unlock(&cu->pool_mu);
    if (e)
        cu->api->EventDestroy(e);
}

/* A shared event of device `dev` (current) with one reference; `issued`
 * says whether it is recorded. */
int dcuda_shared_new_on(dcuda *cu, int dev, int issued, shared_ev **out)
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

int dcuda_shared_new(dcuda *cu, int issued, shared_ev **out)
{
    return dcuda_shared_new_on(cu, cu->ordinal, issued, out);
}

/* With mu held. */
shared_ev *dcuda_shared_take_locked(shared_ev *s)
{
    s->refs++;
    return s;
}

shared_ev *dcuda_shared_take(dcuda *cu, shared_ev *s)
{
    pthread_mutex_lock(&cu->mu);
    dcuda_shared_take_locked(s);
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

void dcuda_shared_release(dcuda *cu, shared_ev *s)
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
void dcuda_flush_locked(dcuda *cu)
{
    shared_ev *b = cu->batch;
    if (!b)
        return;
    int prev;
    cu_err err = CU_SUCCESS;
    if (dcuda_guard_enter(cu, &prev) != CKPT_OK) {
        err = CU_ERR_INVALID_VALUE;
    } else {
        for (size_t i = 0; i < cu->ndrains && err == CU_SUCCESS; i++)
            err = cu->api->MemcpyAsync(cu->drains[i].dst, cu->drains[i].src,
                                       cu->drains[i].n, CU_MEMCPY_DEFAULT, cu->drain);
        if (err == CU_SUCCESS)
            err = cu->api->EventRecord(b->e, cu->drain);
        dcuda_guard_leave(cu, prev);
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
                         dcuda_errstr(cu, err, buf, sizeof buf));
        goto fail;
    }
    cu->ordinal = ordinal;
    int prev;
    if ((rc = dcuda_guard_enter(cu, &prev)) != CKPT_OK)
        goto fail;
    err = api->StreamCreateWithFlags(&cu->copy, CU_STREAM_NON_BLOCKING);
    if (err == CU_SUCCESS)
        err = api->EventCreateWithFlags(&cu->start, CU_EVENT_FLAGS);
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        rc = ckpt_seterr(CKPT_EDEVICE, "cannot create the CUDA copy stream: %s",
                         dcuda_errstr(cu, err, buf, sizeof buf));
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
    int prev = dcuda_wait_enter(cu, cu->ordinal);
    pthread_mutex_lock(&cu->mu);
    dcuda_flush_locked(cu);
    pthread_mutex_unlock(&cu->mu);
    cu_err e1 = cu->copy ? sync_stream_blocking(cu, cu->copy) : CU_SUCCESS;
    cu_err e2 = cu->drain ? sync_stream_blocking(cu, cu->drain) : CU_SUCCESS;
    /* Clear only an error these calls left: an error the application had
     * pending before is the application's to read. */
    if (e1 != CU_SUCCESS || e2 != CU_SUCCESS)
        cu->api->GetLastError();
    dcuda_guard_leave(cu, prev);
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
    dcuda_shared_release(cu, cu->snap);
    cu->snap = NULL;
    int prev;
    int guarded = cu->copy && dcuda_guard_enter(cu, &prev) == CKPT_OK;
    int failed = 0; /* clear only errors of our own calls (see quiesce) */
    for (int d = 0; d < CU_MAX_DEVICES; d++)
        for (size_t i = 0; i < cu->pools[d].n; i++)
            failed |= cu->api->EventDestroy(cu->pools[d].ev[i]) != CU_SUCCESS;
    failed |= destroy_save_side(cu);
    if (failed)
        cu->api->GetLastError();
    if (guarded)
        dcuda_guard_leave(cu, prev);
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
    int prev, rc = dcuda_guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->HostAlloc(ptr, bytes ? bytes : 1, CU_HOST_ALLOC_PORTABLE);
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        *ptr = NULL;
        /* Out of page-locked memory (a scarce resource, refused long before
         * pageable memory is): CKPT_ENOMEM, which the caller answers with
         * pageable memory; any other error is the device's. */
        return ckpt_seterr(err == CU_ERR_MEMORY_ALLOCATION ? CKPT_ENOMEM : CKPT_EDEVICE,
                           "cannot allocate %zu bytes of pinned host memory for "
                           "device tensors: %s", bytes, dcuda_errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_host_free(dcuda *cu, void *ptr)
{
    int prev, guarded = dcuda_guard_enter(cu, &prev) == CKPT_OK, rc = CKPT_OK;
    if (cu->api->FreeHost(ptr) != CU_SUCCESS) {
        cu->api->GetLastError();
        rc = CKPT_EDEVICE;
    }
    if (guarded)
        dcuda_guard_leave(cu, prev);
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

int dcuda_relax_capture(dcuda *cu, const cuda_api **api, int *ordinal)
{
    *api = NULL;
    *ordinal = cu ? cu->ordinal : -1;
    int mode = 2, prev; /* cudaStreamCaptureModeRelaxed */
    if (!cu || pool_on_library_thread() || !cu->api->ThreadExchangeStreamCaptureMode)
        return -1;
    /* From the store's device, which has a context (its streams): on a
     * thread that never chose a device (ckpt_store_free from another
     * thread) the call would make a context on GPU 0. */
    if (dcuda_guard_enter(cu, &prev) != CKPT_OK)
        return -1;
    cu_err err = cu->api->ThreadExchangeStreamCaptureMode(&mode);
    if (err != CU_SUCCESS)
        cu->api->GetLastError();
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS)
        return -1;
    *api = cu->api;
    return mode;
}

void dcuda_restore_capture(const cuda_api *api, int mode, int ordinal)
{
    if (!api || mode < 0)
        return;
    /* From `ordinal`, as dcuda_relax_capture, for the same reason. */
    int prev = ordinal;
    if (api->GetDevice(&prev) != CU_SUCCESS) {
        api->GetLastError();
        prev = ordinal;
    }
    if (prev != ordinal && api->SetDevice(ordinal) != CU_SUCCESS) {
        api->GetLastError();
        return; /* left relaxed: better than a context on another GPU */
    }
    if (api->ThreadExchangeStreamCaptureMode(&mode) != CU_SUCCESS)
        api->GetLastError();
    guard_leave_api(api, prev);
}

/* Move the save side to CUDA device `ordinal` (no save is in flight: begin
 * waited for it).  The old device's streams, events and scratch go (its
 * cudaFree synchronizes that device, once per move). */
int dcuda_rehome(dcuda *cu, int ordinal)
{
    char buf[256];
    /* Home already, with both handles: an earlier rehome that failed
     * half-way (the stream made, not the event) is tried again. */
    if (ordinal == cu->ordinal && cu->copy && cu->start)
        return CKPT_OK;
    dcuda_quiesce(cu);
    dcuda_shared_release(cu, cu->snap);
    cu->snap = NULL;
    int prev, failed = 0;
    if (dcuda_guard_enter(cu, &prev) == CKPT_OK) {
        if ((failed = destroy_save_side(cu)))
            cu->api->GetLastError();
        dcuda_guard_leave(cu, prev);
    }
    cu->start = cu->drained = NULL;
    cu->copy = cu->drain = NULL;
    cu->scratch = NULL;
    cu->scratch_bytes = 0;
    cu->ordinal = ordinal;
    int rc = dcuda_guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->StreamCreateWithFlags(&cu->copy, CU_STREAM_NON_BLOCKING);
    if (err == CU_SUCCESS)
        err = cu->api->EventCreateWithFlags(&cu->start, CU_EVENT_FLAGS);
    if (err != CU_SUCCESS) {
        rc = ckpt_seterr(CKPT_EDEVICE, "cannot create the CUDA copy stream on device "
                         "%d: %s", ordinal, dcuda_errstr(cu, err, buf, sizeof buf));
        /* Neither half kept: the next save makes both again instead of
         * recording on a NULL event. */
        if (cu->copy && cu->api->StreamDestroy(cu->copy) != CU_SUCCESS)
            cu->api->GetLastError();
        cu->copy = NULL;
        cu->start = NULL;
    }
    dcuda_guard_leave(cu, prev);
    return rc;
}

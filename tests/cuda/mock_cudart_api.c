/* The mock CUDA runtime's runtime functions (see mock_cudart.h): devices
 * and contexts, streams, events, copies and memsets, allocations, versions
 * and properties, graph capture.  Its state, stream engine and control
 * interface are mock_cudart.c's; both share mock_cudart_impl.h. */
#include "mock_cudart_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

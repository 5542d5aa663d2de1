/* device: the host backend (memcpy into pre-faulted memory) and the switch
 * to the cuda backend (device_cuda.c), which is created the first time a
 * device pointer is seen. */
#include "device.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda_loader.h"
#include "device_cuda.h"
#include "error.h"

struct device {
    device_options opts;
    pthread_mutex_t mu;             /* guards pinned_bytes, retired, cu creation */
    uint64_t pinned_bytes;          /* held, retired buffers included */
    dcuda *_Atomic cu;              /* NULL until a device pointer is seen */
    /* Pinned buffers given up in ckpt_save_begin, freed by device_trim on
     * the persist thread: cudaFreeHost waits for the whole device, which
     * on the caller's thread would stall training on its own queued work. */
    void *retired[DEVICE_RETIRED_MAX];
    size_t retired_bytes[DEVICE_RETIRED_MAX];
    int nretired;
};

static dcuda *cuda_of(const device *dev)
{
    return atomic_load_explicit(&((device *)dev)->cu, memory_order_acquire);
}

/* The cuda backend, created on first need.  `ordinal` is the CUDA device of
 * the first device pointer (-1: the current one). */
static int cuda_get(device *dev, int ordinal, dcuda **out)
{
    dcuda *cu = cuda_of(dev);
    if (cu) {
        *out = cu;
        return CKPT_OK;
    }
    pthread_mutex_lock(&dev->mu);
    int rc = CKPT_OK;
    cu = atomic_load_explicit(&dev->cu, memory_order_relaxed);
    if (!cu) {
        rc = dcuda_open(&cu, dev->opts.mode, ordinal);
        if (rc == CKPT_OK)
            atomic_store_explicit(&dev->cu, cu, memory_order_release);
    }
    pthread_mutex_unlock(&dev->mu);
    *out = cu;
    return rc;
}

int device_open(device **out, const device_options *opts)
{
    device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating the device backend");
    dev->opts = *opts;
    if (dev->opts.pinned_limit == 0)
        dev->opts.pinned_limit = CKPT_PINNED_LIMIT_DEFAULT;
    pthread_mutex_init(&dev->mu, NULL);
    *out = dev;
    return CKPT_OK;
}

/* Free the retired pinned buffers (on whichever thread calls: see device.h). */
static void free_retired(device *dev)
{
    dcuda *cu = cuda_of(dev);
    for (;;) {
        pthread_mutex_lock(&dev->mu);
        if (dev->nretired == 0) {
            pthread_mutex_unlock(&dev->mu);
            return;
        }
        int i = --dev->nretired;
        void *p = dev->retired[i];
        size_t n = dev->retired_bytes[i];
        pthread_mutex_unlock(&dev->mu);
        /* pinned memory exists only once the runtime did */
        if (cu && dcuda_host_free(cu, p) != CKPT_OK)
            continue; /* still page-locked (a dead context): still counted */
        pthread_mutex_lock(&dev->mu);
        dev->pinned_bytes -= n <= dev->pinned_bytes ? n : dev->pinned_bytes;
        pthread_mutex_unlock(&dev->mu);
    }
}

int device_current_ordinal(device *dev)
{
    dcuda *cu = cuda_of(dev);
    return cu ? dcuda_current(cu) : -1;
}

void device_relax_capture(device *dev, device_capture_mode *m)
{
    const cuda_api *api = NULL;
    m->ordinal = -1;
    m->mode = dev ? dcuda_relax_capture(cuda_of(dev), &api, &m->ordinal) : -1;
    m->api = api;
}

void device_restore_capture(const device_capture_mode *m)
{
    dcuda_restore_capture(m->api, m->mode, m->ordinal);
}

void device_free(device *dev)
{
    if (!dev)
        return;
    free_retired(dev);
    dcuda_free(cuda_of(dev));
    pthread_mutex_destroy(&dev->mu);
    free(dev);
}

int device_cuda_available(void)
{
    const cuda_api *api;
    return cuda_loader_get(&api);
}

static int pageable_alloc(size_t bytes, void **ptr)
{
    if (bytes == 0)
        bytes = 1;
    /* mmap, then touch every page now: fresh pages cost far more to fault in
     * during a save (under 1 GB/s) than a memcpy into warm memory. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return ckpt_seterr(CKPT_ENOMEM, "cannot allocate %zu bytes of snapshot memory", bytes);
    memset(p, 0, bytes);
    *ptr = p;
    return CKPT_OK;
}

int device_host_alloc(device *dev, size_t bytes, int want_pinned, void **ptr,
                      int *pinned)
{
    *pinned = 0;
    dcuda *cu = cuda_of(dev);
    if (want_pinned && cu) {
        /* Reserve under the cap first so concurrent callers cannot overshoot. */
        pthread_mutex_lock(&dev->mu);
        int fits = dev->pinned_bytes + bytes <= dev->opts.pinned_limit;
        int retired = dev->nretired > 0;
        if (fits)
            dev->pinned_bytes += bytes;
        pthread_mutex_unlock(&dev->mu);
        if (!fits && retired) {
            /* Retired buffers still count against the cap: free them here
             * (a device synchronization) rather than go pageable. */
            free_retired(dev);
            pthread_mutex_lock(&dev->mu);
            fits = dev->pinned_bytes + bytes <= dev->opts.pinned_limit;
            if (fits)
                dev->pinned_bytes += bytes;
            pthread_mutex_unlock(&dev->mu);
        }
        if (fits) {
            int rc = dcuda_host_alloc(cu, bytes, ptr);
            if (rc == CKPT_OK) {
                *pinned = 1;
                return CKPT_OK;
            }
            pthread_mutex_lock(&dev->mu);
            dev->pinned_bytes -= bytes;
            pthread_mutex_unlock(&dev->mu);
            if (rc != CKPT_ENOMEM)
                return rc;
            /* The system refused page-locked memory (ulimit -l, a container,
             * other processes' pinned buffers): the save goes on through
             * pageable memory, slower (each device copy into it returns
             * only once done), rather than failing. */
            char why[512];
            snprintf(why, sizeof why, "%s", ckpt_error_last());
            dcuda_note(cu, "%s: a %zu-byte buffer is pageable instead, device copies into "
                       "it are slower", why, bytes);
        } else {
            dcuda_note(cu, "pinned memory cap of %llu bytes reached: a %zu-byte buffer is "
                       "pageable, device copies into it are slower (raise pinned_limit)",
                       (unsigned long long)dev->opts.pinned_limit, bytes);
        }
    }
    return pageable_alloc(bytes, ptr);
}

void device_host_free(device *dev, void *ptr, size_t bytes, int pinned)
{
    if (!ptr)
        return;
    if (pinned) {
        dcuda *cu = cuda_of(dev);
        if (cu && dcuda_host_free(cu, ptr) != CKPT_OK)
            return; /* still page-locked (a dead context): still counted */
        pthread_mutex_lock(&dev->mu);
        dev->pinned_bytes -= bytes <= dev->pinned_bytes ? bytes : dev->pinned_bytes;
        pthread_mutex_unlock(&dev->mu);
        return;
    }
    munmap(ptr, bytes ? bytes : 1);
}

uint64_t device_pinned_bytes(const device *dev)
{
    device *d = (device *)dev;
    pthread_mutex_lock(&d->mu);
    uint64_t n = d->pinned_bytes;
    pthread_mutex_unlock(&d->mu);
    return n;
}

int device_classify(device *dev, const void *ptr, ckpt_memory declared,
                    ckpt_memory *actual, int *ordinal_out)
{
    if (ordinal_out)
        *ordinal_out = -1;
    const cuda_api *api = NULL;
    int rc, type = CU_MEM_UNREGISTERED, ordinal = -1;
    dcuda *cu;

    switch (declared) {
    case CKPT_MEM_HOST:
        *actual = CKPT_MEM_HOST;
        return CKPT_OK;
    case CKPT_MEM_DEVICE:
        if ((rc = cuda_loader_get(&api)) != CKPT_OK) {
            char why[2048];
            strncpy(why, ckpt_error_last(), sizeof why - 1);
            why[sizeof why - 1] = 0;
            return ckpt_seterr(rc, "device tensors need CUDA: %s", why);
        }
        if (ptr) {
            if ((rc = dcuda_pointer_type(api, ptr, &type, &ordinal)) != CKPT_OK)
                return rc;
            if (type == CU_MEM_UNREGISTERED)
                return ckpt_seterr(CKPT_EINVAL, "pointer %p is declared device memory "
                                   "but the CUDA runtime reports host memory", ptr);
            if (type == CU_MEM_HOST) {
                *actual = CKPT_MEM_HOST; /* pinned host memory: memcpy is right */
                return CKPT_OK;
            }
        }
        break;
    case CKPT_MEM_AUTO:
        api = ptr ? cuda_loader_peek() : NULL;
        if (!api && ptr && cuda_loader_driver_says_device(ptr)) {
            /* A runtime libckpt cannot see (linked statically) made it: a
             * memcpy would fault.  Say what to do instead. */
            const cuda_api *none;
            char why[2048];
            cuda_loader_get(&none);
            snprintf(why, sizeof why, "%s", ckpt_error_last());
            return ckpt_seterr(CKPT_ENODEVICE, "pointer %p is device memory (the CUDA "
                               "driver in this process says so) but libckpt could not load "
                               "a CUDA runtime to copy it: %s; install libcudart.so (or set "
                               "CKPT_CUDART_LIBRARY to it), or link the program with "
                               "-cudart shared", ptr, why);
        }
        if (!api) {
            *actual = CKPT_MEM_HOST;
            return CKPT_OK;
        }
        if ((rc = dcuda_pointer_type(api, ptr, &type, &ordinal)) == CKPT_EINVAL) {
            return rc; /* a context libckpt cannot work in: said as it is */
        } else if (rc != CKPT_OK) {
            /* A sticky error (a fault in any kernel of the process, a lost
             * device) fails every CUDA call until the process exits, and so
             * does a child forked after its parent started CUDA
             * (cudaErrorInitializationError): say how a save of host memory
             * still goes through. */
            char why[2048];
            snprintf(why, sizeof why, "%s", ckpt_error_last());
            return ckpt_seterr(rc, "%s; CKPT_MEM_AUTO asks CUDA where a buffer lives, and "
                               "CUDA fails every call after a sticky error or in a child "
                               "forked after CUDA started: declare host buffers "
                               "CKPT_MEM_HOST to save them without asking", why);
        }
        if (type != CU_MEM_DEVICE && type != CU_MEM_MANAGED) {
            *actual = CKPT_MEM_HOST;
            return CKPT_OK;
        }
        break;
    default:
        return ckpt_seterr(CKPT_EINVAL, "unknown memory kind %d", (int)declared);
    }
    /* Managed memory is every device's: the runtime's `device` is only the
     * one current when it was allocated.  It goes with the save's device
     * tensors, else with the caller's current device (save.c, restore.c),
     * where the caller's stream orders it. */
    if (type == CU_MEM_MANAGED)
        ordinal = -1;
    if ((rc = cuda_get(dev, ordinal, &cu)) != CKPT_OK)
        return rc;
    *actual = CKPT_MEM_DEVICE;
    if (ordinal_out)
        *ordinal_out = ordinal;
    return CKPT_OK;
}

/* The cuda backend for an operation on device memory; its absence means the
 * caller skipped device_classify. */
static int need_cuda(device *dev, const char *tensor, dcuda **cu)
{
    *cu = cuda_of(dev);
    if (*cu)
        return CKPT_OK;
    return ckpt_seterr(CKPT_ENODEVICE, "tensor '%s': no CUDA backend (device memory "
                       "was not classified)", tensor ? tensor : "");
}

int device_snapshot_reserve(device *dev, const ckpt_tensor *t, const ckpt_memory *mem,
                            size_t count, int ordinal, int *staged)
{
    dcuda *cu = cuda_of(dev);
    *staged = 0;
    return cu ? dcuda_snapshot_reserve(cu, t, mem, count, ordinal, staged) : CKPT_OK;
}

int device_refuse_capture(device *dev, int ordinal, void *caller_stream, const char *op)
{
    dcuda *cu = cuda_of(dev);
    return cu ? dcuda_refuse_capture(cu, ordinal, caller_stream, op) : CKPT_OK;
}

int device_snapshot_start(device *dev, void *caller_stream)
{
    dcuda *cu = cuda_of(dev);
    return cu ? dcuda_snapshot_start(cu, caller_stream) : CKPT_OK;
}

int device_alloc_end(device *dev, const void *p, const void **end)
{
    dcuda *cu = cuda_of(dev);
    return cu ? dcuda_alloc_end(cu, p, end) : CKPT_ENOTFOUND;
}

int device_copy_d2h(device *dev, void *dst, const void *src, size_t n,
                    const char *tensor)
{
    dcuda *cu;
    int rc = need_cuda(dev, tensor, &cu);
    return rc != CKPT_OK ? rc : dcuda_copy_d2h(cu, dst, src, n, tensor);
}

int device_record(device *dev, device_event **ev)
{
    dcuda *cu = cuda_of(dev);
    *ev = NULL; /* host copies are complete when they return */
    return cu ? dcuda_record(cu, 0, NULL, -1, ev) : CKPT_OK;
}

int device_event_wait(device *dev, device_event *ev)
{
    return ev ? dcuda_event_wait(cuda_of(dev), ev, 0) : CKPT_OK;
}

int device_event_dup(device *dev, const device_event *ev, device_event **out)
{
    *out = NULL;
    return ev ? dcuda_event_dup(cuda_of(dev), ev, out) : CKPT_OK;
}

void device_host_retire(device *dev, void *ptr, size_t bytes, int pinned)
{
    if (!ptr)
        return;
    if (pinned) {
        pthread_mutex_lock(&dev->mu);
        int kept = dev->nretired < DEVICE_RETIRED_MAX;
        if (kept) {
            dev->retired[dev->nretired] = ptr;
            dev->retired_bytes[dev->nretired++] = bytes;
        }
        pthread_mutex_unlock(&dev->mu);
        if (kept)
            return;
    }
    device_host_free(dev, ptr, bytes, pinned);
}

void device_trim(device *dev)
{
    free_retired(dev);
    dcuda_trim(cuda_of(dev));
}

int device_snapshot_wait(device *dev, device_event *ev)
{
    return ev ? dcuda_event_wait(cuda_of(dev), ev, 1) : CKPT_OK;
}

int device_fence(device *dev, device_event *ev, void *stream)
{
    return ev ? dcuda_fence(cuda_of(dev), ev, stream) : CKPT_OK;
}

void device_event_free(device *dev, device_event *ev)
{
    if (ev)
        dcuda_event_free(cuda_of(dev), ev);
}

void device_quiesce(device *dev)
{
    dcuda_quiesce(cuda_of(dev));
}

int device_copy_h2d(device *dev, void *dst, const void *src, size_t n,
                    void *stream, int ordinal, const char *tensor)
{
    dcuda *cu;
    int rc = need_cuda(dev, tensor, &cu);
    return rc != CKPT_OK ? rc : dcuda_copy_h2d(cu, dst, src, n, stream, ordinal, tensor);
}

int device_record_stream(device *dev, void *stream, int ordinal, device_event **ev)
{
    dcuda *cu = cuda_of(dev);
    *ev = NULL;
    return cu ? dcuda_record(cu, 1, stream, ordinal, ev) : CKPT_OK;
}

void device_note(device *dev, const char *fmt, ...)
{
    dcuda *cu = cuda_of(dev);
    if (!cu)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    dcuda_note(cu, "%s", buf);
}

void device_note_reset(device *dev)
{
    dcuda *cu = cuda_of(dev);
    if (cu)
        dcuda_note_reset(cu);
}

void device_describe(device *dev, struct json_t *env)
{
    dcuda *cu = cuda_of(dev);
    if (cu)
        dcuda_describe(cu, env, device_pinned_bytes(dev));
}

/* device_cuda: snapshots and restores of CUDA device memory.
 *
 * Ordering.  A snapshot records `start` on the caller's stream and makes our
 * copy stream wait for it: the copies see exactly what the caller's stream
 * had produced when the save began, and the CPU never waits for that.  Every
 * device_record() marks the copies enqueued so far with pooled events;
 * workers wait for them before reading a chunk, and fence() makes any stream
 * wait for them on the GPU.
 *
 * Modes.  HOST and STREAM copy device -> host on the copy stream (they differ
 * in how big a snapshot buffer the pipeline hands us).  DEVICE copies device
 * -> spare device memory (`scratch`) on the copy stream and drains scratch ->
 * host on a second stream; an event then carries two CUDA events: `snap`,
 * when the caller's memory has been read (what fence and wait_snapshot use),
 * and `data`, when the host bytes are there (what workers wait for).
 *
 * Threads.  Everything runs on the store's API thread except
 * dcuda_event_wait() and dcuda_event_free(), which workers call: those touch
 * only the event itself and the pool, which `mu` guards. */
#include "device_cuda.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "error.h"

#define TENSOR_NAME_MAX 256
#define SCRATCH_ALIGN 256u

struct device_event {
    cu_event data;  /* host bytes present                         */
    cu_event snap;  /* caller memory read (DEVICE mode), or NULL  */
    char tensor[TENSOR_NAME_MAX]; /* the last tensor it covers, for messages */
};

typedef struct drain {
    void *dst;
    const void *src;
    size_t n;
} drain;

struct dcuda {
    const cuda_api *api;
    ckpt_snapshot_mode mode;
    int ordinal;           /* the CUDA device our streams live on        */
    cu_stream copy;        /* device -> host (or -> scratch)             */
    cu_stream drain;       /* scratch -> host, DEVICE mode; NULL before  */
    cu_event start;        /* recorded on the caller's stream            */

    /* DEVICE mode (API thread) */
    void *scratch;         /* spare device memory, kept for the next save */
    uint64_t scratch_bytes;
    uint64_t scratch_used; /* cursor within this snapshot                 */
    int scratch_on;        /* this snapshot goes through scratch          */
    drain *drains;         /* D2H copies to issue at the next record      */
    size_t ndrains, capdrains;
    char last_tensor[TENSOR_NAME_MAX]; /* last copied, API thread         */

    pthread_mutex_t mu;    /* guards the fields below                     */
    cu_event *pool;        /* idle events                                 */
    size_t npool, cappool;
    char last_h2d[TENSOR_NAME_MAX];
    char note[512];
};

static const char *errstr(const dcuda *cu, cu_err err, char *buf, size_t len)
{
    cu->api->GetLastError(); /* clear a non-sticky error for the caller */
    return cuda_loader_errstr(cu->api, err, buf, len);
}

/* Run the enqueueing calls with our device current, as streams and events
 * belong to one device; restore the caller's choice afterwards. */
static int guard_enter(dcuda *cu, int *prev)
{
    if (cu->api->GetDevice(prev) != CU_SUCCESS) {
        cu->api->GetLastError();
        *prev = cu->ordinal;
    }
    if (*prev != cu->ordinal) {
        cu_err err = cu->api->SetDevice(cu->ordinal);
        if (err != CU_SUCCESS) {
            char buf[256];
            return ckpt_seterr(CKPT_EDEVICE, "cannot make CUDA device %d current: %s",
                               cu->ordinal, errstr(cu, err, buf, sizeof buf));
        }
    }
    return CKPT_OK;
}

static void guard_leave(dcuda *cu, int prev)
{
    if (prev != cu->ordinal)
        cu->api->SetDevice(prev);
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
    cu_pointer_attributes attr;
    memset(&attr, 0, sizeof attr);
    cu_err err = api->PointerGetAttributes(&attr, ptr);
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
        err = api->EventCreateWithFlags(&cu->start, CU_EVENT_DISABLE_TIMING);
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

void dcuda_quiesce(dcuda *cu)
{
    if (!cu)
        return;
    if (cu->copy)
        cu->api->StreamSynchronize(cu->copy);
    if (cu->drain)
        cu->api->StreamSynchronize(cu->drain);
    cu->api->GetLastError();
    cu->ndrains = 0;
}

void dcuda_free(dcuda *cu)
{
    if (!cu)
        return;
    /* Errors are ignored: after a sticky CUDA error every call fails, and
     * there is nothing better to do than to let go of the handles. */
    dcuda_quiesce(cu);
    int prev;
    int guarded = cu->copy && guard_enter(cu, &prev) == CKPT_OK;
    for (size_t i = 0; i < cu->npool; i++)
        cu->api->EventDestroy(cu->pool[i]);
    if (cu->start)
        cu->api->EventDestroy(cu->start);
    if (cu->copy)
        cu->api->StreamDestroy(cu->copy);
    if (cu->drain)
        cu->api->StreamDestroy(cu->drain);
    if (cu->scratch)
        cu->api->Free(cu->scratch);
    cu->api->GetLastError();
    if (guarded)
        guard_leave(cu, prev);
    free(cu->pool);
    free(cu->drains);
    pthread_mutex_destroy(&cu->mu);
    free(cu);
}

int dcuda_host_alloc(dcuda *cu, size_t bytes, void **ptr)
{
    cu_err err = cu->api->HostAlloc(ptr, bytes ? bytes : 1, CU_HOST_ALLOC_PORTABLE);
    if (err != CU_SUCCESS) {
        char buf[256];
        *ptr = NULL;
        return ckpt_seterr(CKPT_EDEVICE,
                           "cannot allocate %zu bytes of pinned host memory for "
                           "device tensors: %s", bytes, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

void dcuda_host_free(dcuda *cu, void *ptr)
{
    if (cu->api->FreeHost(ptr) != CU_SUCCESS)
        cu->api->GetLastError();
}

/* ---------------------------------------------------------------- events */

static int event_get(dcuda *cu, cu_event *out)
{
    pthread_mutex_lock(&cu->mu);
    if (cu->npool) {
        *out = cu->pool[--cu->npool];
        pthread_mutex_unlock(&cu->mu);
        return CKPT_OK;
    }
    pthread_mutex_unlock(&cu->mu);
    cu_err err = cu->api->EventCreateWithFlags(out, CU_EVENT_DISABLE_TIMING);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "cannot create a CUDA event: %s",
                           errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

static void event_put(dcuda *cu, cu_event e)
{
    if (!e)
        return;
    pthread_mutex_lock(&cu->mu);
    if (cu->npool == cu->cappool) {
        size_t cap = cu->cappool ? cu->cappool * 2 : 16;
        cu_event *p = realloc(cu->pool, cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&cu->mu);
            cu->api->EventDestroy(e);
            return;
        }
        cu->pool = p;
        cu->cappool = cap;
    }
    cu->pool[cu->npool++] = e;
    pthread_mutex_unlock(&cu->mu);
}

void dcuda_event_free(dcuda *cu, device_event *ev)
{
    if (!ev)
        return;
    event_put(cu, ev->data);
    event_put(cu, ev->snap);
    free(ev);
}

/* --------------------------------------------------------------- save side */

int dcuda_snapshot_reserve(dcuda *cu, uint64_t device_bytes)
{
    cu->scratch_on = 0;
    if (cu->mode != CKPT_SNAPSHOT_DEVICE || device_bytes == 0)
        return CKPT_OK;
    char buf[256];
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err;
    if (cu->scratch_bytes < device_bytes) {
        if (cu->scratch) {
            cu->api->Free(cu->scratch); /* no save is using it: begin waits */
            cu->scratch = NULL;
            cu->scratch_bytes = 0;
        }
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
        if ((uint64_t)free_b < device_bytes + headroom) {
            dcuda_note(cu, "device snapshot mode fell back to host: %llu bytes of "
                       "device tensors do not fit in %zu free bytes of device memory",
                       (unsigned long long)device_bytes, free_b);
            goto done;
        }
        err = cu->api->Malloc(&cu->scratch, device_bytes);
        if (err != CU_SUCCESS) {
            cu->scratch = NULL;
            dcuda_note(cu, "device snapshot mode fell back to host: cannot allocate %llu "
                       "bytes of device memory: %s", (unsigned long long)device_bytes,
                       errstr(cu, err, buf, sizeof buf));
            goto done;
        }
        cu->scratch_bytes = device_bytes;
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
done:
    guard_leave(cu, prev);
    return rc;
}

int dcuda_snapshot_start(dcuda *cu, void *caller_stream)
{
    char buf[256];
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu->scratch_used = 0;
    cu->ndrains = 0;
    cu->last_tensor[0] = 0;
    cu_err err = cu->api->EventRecord(cu->start, caller_stream);
    if (err == CU_SUCCESS)
        err = cu->api->StreamWaitEvent(cu->copy, cu->start, 0);
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        cu->scratch_on = 0;
        return ckpt_seterr(CKPT_EDEVICE, "cannot order the snapshot after the caller's "
                           "CUDA stream %p: %s", caller_stream,
                           errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_copy_d2h(dcuda *cu, void *dst, const void *src, size_t n, const char *tensor)
{
    char buf[256];
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    snprintf(cu->last_tensor, sizeof cu->last_tensor, "%s", tensor ? tensor : "");
    cu_err err;
    const char *what = "copying %zu bytes to the host";
    if (cu->scratch_on && cu->scratch_used + n <= cu->scratch_bytes) {
        if (cu->ndrains == cu->capdrains) {
            size_t cap = cu->capdrains ? cu->capdrains * 2 : 16;
            drain *d = realloc(cu->drains, cap * sizeof *d);
            if (!d) {
                guard_leave(cu, prev);
                return ckpt_seterr(CKPT_ENOMEM, "out of memory queueing a device copy");
            }
            cu->drains = d;
            cu->capdrains = cap;
        }
        char *stage = (char *)cu->scratch + cu->scratch_used;
        what = "copying %zu bytes to spare device memory";
        err = cu->api->MemcpyAsync(stage, src, n, CU_MEMCPY_DEFAULT, cu->copy);
        if (err == CU_SUCCESS) {
            cu->drains[cu->ndrains++] = (drain){ dst, stage, n };
            cu->scratch_used += (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
        }
    } else {
        err = cu->api->MemcpyAsync(dst, src, n, CU_MEMCPY_DEFAULT, cu->copy);
    }
    guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char msg[64];
        snprintf(msg, sizeof msg, what, n);
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while %s: %s",
                           tensor ? tensor : "", msg, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_record(dcuda *cu, int on_stream, void *stream, device_event **out)
{
    char buf[256];
    device_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating a device event");
    int prev, rc = guard_enter(cu, &prev);
    if (rc != CKPT_OK) {
        free(ev);
        return rc;
    }
    cu_err err = CU_SUCCESS;
    if (on_stream) {
        pthread_mutex_lock(&cu->mu);
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_h2d);
        pthread_mutex_unlock(&cu->mu);
        if ((rc = event_get(cu, &ev->data)) == CKPT_OK)
            err = cu->api->EventRecord(ev->data, stream);
    } else if (cu->ndrains) {
        /* copy stream: D2D done -> drain stream waits, drains, marks data */
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_tensor);
        if ((rc = event_get(cu, &ev->snap)) == CKPT_OK &&
            (rc = event_get(cu, &ev->data)) == CKPT_OK) {
            err = cu->api->EventRecord(ev->snap, cu->copy);
            if (err == CU_SUCCESS)
                err = cu->api->StreamWaitEvent(cu->drain, ev->snap, 0);
            for (size_t i = 0; i < cu->ndrains && err == CU_SUCCESS; i++)
                err = cu->api->MemcpyAsync(cu->drains[i].dst, cu->drains[i].src,
                                           cu->drains[i].n, CU_MEMCPY_DEFAULT, cu->drain);
            if (err == CU_SUCCESS)
                err = cu->api->EventRecord(ev->data, cu->drain);
        }
        cu->ndrains = 0;
    } else {
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_tensor);
        if ((rc = event_get(cu, &ev->data)) == CKPT_OK)
            err = cu->api->EventRecord(ev->data, cu->copy);
    }
    guard_leave(cu, prev);
    if (rc == CKPT_OK && err != CU_SUCCESS)
        rc = ckpt_seterr(CKPT_EDEVICE, "tensor '%s': cannot record a CUDA event: %s",
                         ev->tensor, errstr(cu, err, buf, sizeof buf));
    if (rc != CKPT_OK) {
        dcuda_event_free(cu, ev);
        return rc;
    }
    *out = ev;
    return CKPT_OK;
}

int dcuda_event_wait(dcuda *cu, device_event *ev, int snapshot_only)
{
    /* In DEVICE mode a failed D2D shows on `snap`, not on the drain's event. */
    cu_err err = CU_SUCCESS;
    if (ev->snap)
        err = cu->api->EventSynchronize(ev->snap);
    if (err == CU_SUCCESS && !(snapshot_only && ev->snap))
        err = cu->api->EventSynchronize(ev->data);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error during the device "
                           "copy: %s", ev->tensor, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_fence(dcuda *cu, device_event *ev, void *stream)
{
    cu_err err = cu->api->StreamWaitEvent(stream, ev->snap ? ev->snap : ev->data, 0);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "cannot make CUDA stream %p wait for the "
                           "snapshot: %s", stream, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

/* ------------------------------------------------------------ restore side */

int dcuda_copy_h2d(dcuda *cu, void *dst, const void *src, size_t n, void *stream,
                   const char *tensor)
{
    pthread_mutex_lock(&cu->mu);
    snprintf(cu->last_h2d, sizeof cu->last_h2d, "%s", tensor ? tensor : "");
    pthread_mutex_unlock(&cu->mu);
    cu_err err = cu->api->MemcpyAsync(dst, src, n, CU_MEMCPY_DEFAULT, stream);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while copying %zu "
                           "bytes to the device: %s", tensor ? tensor : "", n,
                           errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

int dcuda_stream_sync(dcuda *cu, void *stream)
{
    cu_err err = cu->api->StreamSynchronize(stream);
    if (err != CU_SUCCESS) {
        char buf[256], name[TENSOR_NAME_MAX];
        pthread_mutex_lock(&cu->mu);
        snprintf(name, sizeof name, "%s", cu->last_h2d);
        pthread_mutex_unlock(&cu->mu);
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while copying to the "
                           "device: %s", name, errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
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
    int v = 0;
    if (api->RuntimeGetVersion(&v) == CU_SUCCESS)
        json_object_set_new(o, "runtime_version", version_json(v));
    if (api->DriverGetVersion(&v) == CU_SUCCESS)
        json_object_set_new(o, "driver_version", version_json(v));
    json_object_set_new(o, "device", json_integer(cu->ordinal));
    if (api->GetDeviceProperties) {
        /* cudaDeviceProp is about 1 KiB; `name` (char[256]) comes first. */
        char *prop = calloc(1, 16384);
        if (prop && api->GetDeviceProperties(prop, cu->ordinal) == CU_SUCCESS) {
            prop[255] = 0;
            json_object_set_new(o, "gpu_name", json_string(prop));
        }
        free(prop);
    }
    json_object_set_new(o, "library", json_string(api->library ? api->library : ""));
    static const char *const modes[] = { "host", "device", "stream" };
    json_object_set_new(o, "snapshot_mode",
                        json_string((unsigned)cu->mode < 3 ? modes[cu->mode] : "?"));
    json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)pinned_bytes));
    pthread_mutex_lock(&cu->mu);
    if (cu->note[0])
        json_object_set_new(o, "note", json_string(cu->note));
    pthread_mutex_unlock(&cu->mu);
    api->GetLastError();
    json_object_set_new((json_t *)env, "cuda", o);
}

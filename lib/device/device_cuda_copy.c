/* device_cuda_copy: the copies of the CUDA backend.  The save side
 * reserves scratch, starts a snapshot on the caller's stream and enqueues
 * D2H copies (or staged D2D copies and their drains), marking them with
 * events that workers wait for and fences make streams wait for; the
 * restore side enqueues H2D copies on the caller's stream.  Ordering, modes
 * and locking: device_cuda.c. */
#include "device_cuda_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pool.h"

/* --------------------------------------------------------------- save side */

int dcuda_snapshot_reserve(dcuda *cu, const ckpt_tensor *t, const ckpt_memory *mem,
                           size_t count, int ordinal, int *staged)
{
    *staged = 0;
    cu->scratch_on = 0;
    cu->planned = 0;
    cu->nregions = 0;
    cu->cur_region = 0;
    int rc0 = ordinal >= 0 ? dcuda_rehome(cu, ordinal) : CKPT_OK;
    if (rc0 != CKPT_OK || cu->mode != CKPT_SNAPSHOT_DEVICE)
        return rc0;
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (mem[i] != CKPT_MEM_DEVICE || t[i].bytes == 0)
            continue;
        if (dcuda_grow((void **)&cu->regions, &cu->capregions, cu->nregions + 1, sizeof(region)))
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
    int prev, rc = dcuda_guard_enter(cu, &prev);
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
                             dcuda_errstr(cu, err, buf, sizeof buf));
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
                       dcuda_errstr(cu, err, buf, sizeof buf));
            goto done;
        }
        cu->scratch_bytes = total;
    }
    if (!cu->drain) {
        err = cu->api->StreamCreateWithFlags(&cu->drain, CU_STREAM_NON_BLOCKING);
        if (err != CU_SUCCESS) {
            cu->drain = NULL;
            rc = ckpt_seterr(CKPT_EDEVICE, "cannot create the CUDA drain stream: %s",
                             dcuda_errstr(cu, err, buf, sizeof buf));
            goto done;
        }
    }
    cu->scratch_on = 1;
    cu->planned = 1;
    *staged = 1;
done:
    dcuda_guard_leave(cu, prev);
    return rc;
}

int dcuda_refuse_capture(dcuda *cu, int ordinal, void *stream, const char *op)
{
    int capturing = 0, prev, rc;
    if (!stream || !cu->api->StreamIsCapturing)
        return CKPT_OK;
    /* From the tensors' device: on a thread with no context yet, the call
     * would make one on its current device (GPU 0 unless chosen). */
    if ((rc = dcuda_guard_enter_on(cu, ordinal >= 0 ? ordinal : cu->ordinal, &prev)))
        return rc;
    cu_err err = cu->api->StreamIsCapturing(stream, &capturing);
    if (err != CU_SUCCESS)
        cu->api->GetLastError(); /* not told: EventRecord reports a bad stream */
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS || !capturing)
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
    dcuda_flush_locked(cu); /* nothing should be left; never mix two snapshots */
    /* Drains queued by a save whose batch was never made (it failed in
     * between) would write that save's scratch into this one's buffer. */
    cu->ndrains = 0;
    cu->pending = 0;
    pthread_mutex_unlock(&cu->mu);
    dcuda_shared_release(cu, cu->snap);
    cu->snap = NULL;
    cu->direct = 0;
    cu->last_tensor[0] = 0;
    if (!cu->planned)
        cu->scratch_on = 0; /* a plan serves one snapshot: its pointers may be gone */
    cu->planned = 0;
    int prev, rc = dcuda_guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    const char *what = "cannot order the snapshot after the caller's CUDA stream";
    const char *name = "";
    if ((rc = dcuda_refuse_capture(cu, cu->ordinal, caller_stream, "save")) != CKPT_OK) {
        dcuda_guard_leave(cu, prev);
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
            if ((rc = dcuda_shared_new(cu, 1, &cu->snap)) != CKPT_OK) {
                cu->scratch_on = 0;
                dcuda_guard_leave(cu, prev);
                return rc;
            }
            err = cu->api->EventRecord(cu->snap->e, cu->copy);
            if (err == CU_SUCCESS)
                err = cu->api->StreamWaitEvent(cu->drain, cu->snap->e, 0);
        }
    }
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        cu->scratch_on = 0;
        int status = bad_stream ? CKPT_EINVAL : CKPT_EDEVICE;
        if (*name)
            return ckpt_seterr(status, "tensor '%s': %s: %s", name, what,
                               dcuda_errstr(cu, err, buf, sizeof buf));
        return ckpt_seterr(status, "%s: %s", what, dcuda_errstr(cu, err, buf, sizeof buf));
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
        /* Bookkeeping only: issued with its batch (dcuda_flush_locked). */
        int rc = CKPT_OK;
        pthread_mutex_lock(&cu->mu);
        drain *last = cu->ndrains ? &cu->drains[cu->ndrains - 1] : NULL;
        if (last && (char *)last->dst + last->n == (char *)dst && last->src + last->n == stage)
            last->n += n; /* contiguous in both: one copy */
        else if (dcuda_grow((void **)&cu->drains, &cu->capdrains, cu->ndrains + 1, sizeof(drain)))
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory queueing a device copy");
        else
            cu->drains[cu->ndrains++] = (drain){ dst, stage, n };
        if (rc == CKPT_OK)
            cu->pending += n;
        pthread_mutex_unlock(&cu->mu);
        return rc;
    }
    char buf[256];
    int prev, rc = dcuda_guard_enter(cu, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->MemcpyAsync(dst, src, n, CU_MEMCPY_DEFAULT, cu->copy);
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS)
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while copying %zu bytes "
                           "to the host: %s", tensor ? tensor : "", n,
                           dcuda_errstr(cu, err, buf, sizeof buf));
    cu->direct = 1;
    return CKPT_OK;
}

int dcuda_alloc_end(dcuda *cu, const void *p, const void **end)
{
    if (!cu->api->DrvMemGetAddressRange)
        return CKPT_ENOTFOUND;
    int prev;
    if (dcuda_guard_enter(cu, &prev) != CKPT_OK)
        return CKPT_ENOTFOUND; /* the copy itself will say why */
    unsigned long long base = 0;
    size_t size = 0;
    int res = cu->api->DrvMemGetAddressRange(&base, &size, (unsigned long long)(uintptr_t)p);
    dcuda_guard_leave(cu, prev);
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
        if ((rc = dcuda_shared_new(cu, 1, &ev->snap)) != CKPT_OK)
            return rc;
        *err = cu->api->EventRecord(ev->snap->e, cu->copy);
        if (*err == CU_SUCCESS)
            *err = cu->api->StreamWaitEvent(cu->drain, ev->snap->e, 0);
        if (*err != CU_SUCCESS)
            return CKPT_OK;
        cu->direct = 0;
    } else {
        ev->snap = dcuda_shared_take(cu, cu->snap);
    }
    shared_ev *fresh = NULL;
    pthread_mutex_lock(&cu->mu);
    if (!cu->batch) {
        pthread_mutex_unlock(&cu->mu);
        if ((rc = dcuda_shared_new(cu, 0, &fresh)) != CKPT_OK)
            return rc;
        pthread_mutex_lock(&cu->mu);
        cu->batch = fresh; /* only this thread creates batches */
    }
    ev->data = dcuda_shared_take_locked(cu->batch);
    if (cu->pending >= cu->drain_batch)
        dcuda_flush_locked(cu);
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
    int prev, rc = dcuda_guard_enter_on(cu, ordinal, &prev);
    if (rc != CKPT_OK) {
        free(ev);
        return rc;
    }
    cu_err err = CU_SUCCESS;
    if (on_stream) {
        pthread_mutex_lock(&cu->mu);
        snprintf(ev->tensor, sizeof ev->tensor, "%s", cu->last_h2d);
        pthread_mutex_unlock(&cu->mu);
        if ((rc = dcuda_shared_new_on(cu, ordinal, 1, &ev->data)) == CKPT_OK)
            err = cu->api->EventRecord(ev->data->e, stream);
        if ((rc != CKPT_OK || err != CU_SUCCESS) &&
            cu->api->StreamSynchronize(stream) != CU_SUCCESS)
            cu->api->GetLastError(); /* no marker: copies queued there still read
                                        the caller's staging buffer; let them end */
        if (err == CU_ERR_INVALID_HANDLE) {
            dcuda_guard_leave(cu, prev);
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
        if ((rc = dcuda_shared_new(cu, 1, &ev->data)) == CKPT_OK)
            err = cu->api->EventRecord(ev->data->e, cu->copy);
        cu->direct = 0;
    }
    dcuda_guard_leave(cu, prev);
    if (rc == CKPT_OK && err != CU_SUCCESS)
        rc = ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while queueing the copy "
                         "to the host: %s", ev->tensor, dcuda_errstr(cu, err, buf, sizeof buf));
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
        dcuda_shared_take_locked(d->data);
    if (d->snap)
        dcuda_shared_take_locked(d->snap);
    pthread_mutex_unlock(&cu->mu);
    *out = d;
    return CKPT_OK;
}

int dcuda_event_wait(dcuda *cu, device_event *ev, int snapshot_only)
{
    /* A failed D2D shows on `snap`, not on the drain's event. */
    cu_err err = CU_SUCCESS;
    int prev = dcuda_wait_enter(cu, ev->data ? ev->data->dev : cu->ordinal);
    if (ev->snap)
        err = cu->api->EventSynchronize(ev->snap->e);
    if (err == CU_SUCCESS && ev->data && !(snapshot_only && ev->snap)) {
        pthread_mutex_lock(&cu->mu);
        if (!ev->data->issued)
            dcuda_flush_locked(cu); /* the batch holding our chunk */
        err = ev->data->err;
        pthread_mutex_unlock(&cu->mu);
        if (err == CU_SUCCESS)
            err = cu->api->EventSynchronize(ev->data->e);
    }
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error during the device "
                           "copy: %s", ev->tensor, dcuda_errstr(cu, err, buf, sizeof buf));
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
        int rc = dcuda_guard_enter_on(cu, s->dev, &prev);
        if (rc != CKPT_OK)
            return rc;
    } else {
        /* An explicit stream may be waited on from any device, but on a
         * thread with no context yet the runtime would first create one on
         * device 0 (a fence from a thread other than the one that saved):
         * quietly make the tensors' device current, as for waits. */
        prev = dcuda_wait_enter(cu, s->dev);
    }
    cu_err err = cu->api->StreamWaitEvent(stream, s->e, 0);
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "cannot make CUDA stream %p wait for the "
                           "snapshot: %s", stream, dcuda_errstr(cu, err, buf, sizeof buf));
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
    int prev, rc = dcuda_guard_enter_on(cu, ordinal >= 0 ? ordinal : cu->ordinal, &prev);
    if (rc != CKPT_OK)
        return rc;
    cu_err err = cu->api->MemcpyAsync(dst, src, n, CU_MEMCPY_DEFAULT, stream);
    dcuda_guard_leave(cu, prev);
    if (err != CU_SUCCESS) {
        char buf[256];
        return ckpt_seterr(CKPT_EDEVICE, "tensor '%s': CUDA error while copying %zu "
                           "bytes to the device: %s", tensor ? tensor : "", n,
                           dcuda_errstr(cu, err, buf, sizeof buf));
    }
    return CKPT_OK;
}

void dcuda_trim(dcuda *cu)
{
    if (!cu || !cu->scratch || cu->scratch_want <= cu->scratch_bytes)
        return;
    int prev;
    if (dcuda_guard_enter(cu, &prev) != CKPT_OK)
        return;
    if (cu->api->Free(cu->scratch) != CU_SUCCESS)
        cu->api->GetLastError();
    dcuda_guard_leave(cu, prev);
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

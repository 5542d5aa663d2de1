/* device_cuda: the CUDA half of the device backend.  device.c owns the
 * device object and the host path and calls these once a device pointer has
 * been seen; they follow the contracts written in device.h. */
#ifndef CKPT_DEVICE_CUDA_H
#define CKPT_DEVICE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "cuda_loader.h"

typedef struct dcuda dcuda;
struct json_t;

/* Load the runtime (CKPT_ENODEVICE if none) and create the copy stream on
 * CUDA device `ordinal` (-1: the calling thread's current device). */
int dcuda_open(dcuda **out, ckpt_snapshot_mode mode, int ordinal);
void dcuda_free(dcuda *cu);

/* Where `ptr` lives according to the runtime (CU_MEM_*); CKPT_EDEVICE on a
 * runtime error.  *ordinal gets its CUDA device when it is device memory. */
int dcuda_pointer_type(const cuda_api *api, const void *ptr, int *type, int *ordinal);

/* The calling thread's current CUDA device, or -1 (asked without error
 * left behind; no context is made). */
int dcuda_current(dcuda *cu);

int dcuda_host_alloc(dcuda *cu, size_t bytes, void **ptr);
/* cudaFreeHost; CKPT_EDEVICE (no message) when the runtime refused, and
 * the buffer is still page-locked. */
int dcuda_host_free(dcuda *cu, void *ptr);

/* On an application thread: switch it to relaxed stream-capture mode and
 * return the mode to give back (dcuda_restore_capture with *api and
 * *ordinal), else -1 (a library thread is relaxed already; a runtime
 * without the call).  Both switch from the store's device (`ordinal`), so
 * that a thread that never chose one gets no context on GPU 0. */
int dcuda_relax_capture(dcuda *cu, const cuda_api **api, int *ordinal);
void dcuda_restore_capture(const cuda_api *api, int mode, int ordinal);

/* `ordinal` (>= 0): the CUDA device of this save's tensors; the save side
 * moves there first if it lives elsewhere. */
int dcuda_snapshot_reserve(dcuda *cu, const ckpt_tensor *t, const ckpt_memory *mem,
                           size_t count, int ordinal, int *staged);
/* CKPT_EINVAL, naming it, when `stream` (not NULL) is capturing a CUDA
 * graph; CKPT_OK otherwise (or when the runtime cannot tell).  Asks from
 * device `ordinal` (< 0: the store's), the thread's device given back
 * after (dcuda_guard_leave); CKPT_EDEVICE when it cannot be made current.
 * Makes no call a capture forbids, so it may run before anything else of
 * a save. */
int dcuda_refuse_capture(dcuda *cu, int ordinal, void *stream, const char *op);
int dcuda_snapshot_start(dcuda *cu, void *caller_stream);
int dcuda_copy_d2h(dcuda *cu, void *dst, const void *src, size_t n, const char *tensor);
/* The end of the device allocation holding `p` (on the store's device)
 * into *end: CKPT_OK; CKPT_ENOTFOUND when the driver cannot say. */
int dcuda_alloc_end(dcuda *cu, const void *p, const void **end);

typedef struct device_event device_event;
/* on_stream 0: mark the copies on our own streams (save side); 1: mark the
 * work enqueued so far on `stream` of device `ordinal` (restore side; NULL
 * is that device's legacy default stream; -1: our device). */
int dcuda_record(dcuda *cu, int on_stream, void *stream, int ordinal, device_event **ev);
int dcuda_event_wait(dcuda *cu, device_event *ev, int snapshot_only);
/* A second handle on the same marker (freed on its own). */
int dcuda_event_dup(dcuda *cu, const device_event *ev, device_event **out);
int dcuda_fence(dcuda *cu, device_event *ev, void *stream);
void dcuda_event_free(dcuda *cu, device_event *ev);
void dcuda_quiesce(dcuda *cu);

int dcuda_copy_h2d(dcuda *cu, void *dst, const void *src, size_t n, void *stream,
                   int ordinal, const char *tensor);
/* Free spare device memory found too small by the last reserve (cudaFree
 * synchronizes the device: call it from a library thread, between saves). */
void dcuda_trim(dcuda *cu);

/* Keep a note for the manifest's environment record (a fallback taken). */
void dcuda_note(dcuda *cu, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dcuda_note_reset(dcuda *cu);
void dcuda_describe(dcuda *cu, struct json_t *env, uint64_t pinned_bytes);

#endif

/* device: where tensor bytes come from and go to.  The save pipeline and the
 * restore path talk only to this interface; the `host` backend is memcpy,
 * the `cuda` backend (device_cuda.c) drives the CUDA runtime loaded at run
 * time (cuda_loader.c).  One device object per store.  The save-side calls
 * (classify, reserve, snapshot_start, copy_d2h, record, fence, quiesce) come
 * from the store's API thread; device_event_wait/snapshot_wait/event_free,
 * the host allocation calls and the restore-side calls (copy_h2d,
 * record_stream) are thread-safe and may come from workers. */
#ifndef CKPT_DEVICE_H
#define CKPT_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include "ckpt.h"

typedef struct device device;
typedef struct device_event device_event; /* completion marker of copies */

typedef struct device_options {
    ckpt_snapshot_mode mode;
    uint64_t pinned_limit; /* bytes; 0 means 1 GiB */
} device_options;

/* Always succeeds for the host part; CUDA is loaded lazily on first use of
 * a device pointer (so host-only users never dlopen anything). */
int device_open(device **out, const device_options *opts);
/* Waits for the device's own copies, then releases its streams, events and
 * spare device memory.  Host buffers from device_host_alloc must have been
 * freed before.  NULL is fine. */
void device_free(device *dev);

/* Tearing a store down on an application thread (waits, frees): those
 * calls are refused, and break the capture, while another thread of the
 * process captures a CUDA graph in global mode (torch.cuda.graph's
 * default).  device_relax_capture switches the calling thread to relaxed
 * mode (libckpt never touches the application's streams) until
 * device_restore_capture, which may come after device_free. */
typedef struct device_capture_mode {
    const void *api; /* NULL: nothing to give back */
    int mode;
    int ordinal;     /* the store's CUDA device, where the mode is switched */
} device_capture_mode;
void device_relax_capture(device *dev, device_capture_mode *m);
void device_restore_capture(const device_capture_mode *m);

/* CKPT_OK when a CUDA runtime loads and reports a device, else
 * CKPT_ENODEVICE with the reason (what ckpt_cuda_available() returns). */
int device_cuda_available(void);

/* Host memory for snapshot and staging buffers, pre-faulted.  Pinned (page
 * locked through the CUDA runtime) when `want_pinned` and CUDA is loaded and
 * the pinned cap allows (else pageable, noted in device_describe); *pinned
 * tells which.  CKPT_EDEVICE when the runtime fails to allocate pinned
 * memory.  Free with device_host_free. */
int device_host_alloc(device *dev, size_t bytes, int want_pinned, void **ptr,
                      int *pinned);
/* The calling thread's current CUDA device (where tensors of managed
 * memory, ordinal -1, are copied), or -1 without a CUDA backend. */
int device_current_ordinal(device *dev);

/* A pinned buffer the runtime refuses to free (a dead context) stays
 * page-locked, and counted against the cap. */
void device_host_free(device *dev, void *ptr, size_t bytes, int pinned);
/* Give up a buffer from device_host_alloc that no copy uses any more, from
 * the caller's thread: pageable memory is freed now; pinned memory (whose
 * cudaFreeHost waits for the whole device) is kept, still counted against
 * the pinned cap, until device_trim, device_free or an allocation that
 * needs its room under the cap frees it. */
#define DEVICE_RETIRED_MAX 8

/* Event records a save's caller queues on one library stream, at most.
 * libckpt's events are blocking-sync (waits sleep instead of spinning a
 * core), and a CUDA stream holds only so many pending records of such
 * events: measured on an H200 (driver 580, CUDA 13.0), the 57th blocks the
 * enqueuing thread until the GPU reaches the first (1021 pending copies
 * block it too; records of other events count as copies or not at all).
 * Behind a training stream still busy, that thread is the training loop's,
 * inside ckpt_save_begin: the copies of a large state are marked in at
 * most this many groups, well under 56, whatever its size. */
#define DEVICE_CALLER_RECORDS 24
void device_host_retire(device *dev, void *ptr, size_t bytes, int pinned);
uint64_t device_pinned_bytes(const device *dev);

/* Resolve where `ptr` lives; *ordinal (may be NULL) gets the CUDA device
 * of device memory, else -1 (managed memory too: any device may copy it).  CKPT_MEM_DEVICE (declared or detected)
 * without a usable CUDA runtime is CKPT_ENODEVICE; declared DEVICE for
 * memory the runtime calls plain host memory is CKPT_EINVAL.  AUTO asks the
 * runtime only when one is in the process (or named by CKPT_CUDART_LIBRARY);
 * otherwise it is HOST.  Messages do not name the tensor. */
int device_classify(device *dev, const void *ptr, ckpt_memory declared,
                    ckpt_memory *actual, int *ordinal);

/* --- save side (API thread) */
/* Before device_snapshot_start.  `ordinal` is the one CUDA device holding
 * this save's device tensors: the copy stream moves there if needed.
 * CKPT_SNAPSHOT_DEVICE only:
 * plan to stage the device tensors among t[0..count) (those with mem[i] ==
 * CKPT_MEM_DEVICE) whole in spare device memory.  *staged is 1 when that
 * fits: device_snapshot_start then issues all the D2D copies at once, the
 * device_copy_d2h calls of chunks of those tensors only drain from there,
 * and a device_record made right after device_snapshot_start is already the
 * snapshot marker (fence / wait_snapshot: the caller's memory has been
 * read).  Not an error when it does not fit (*staged 0, noted in
 * device_describe): the snapshot then goes straight to the host.  `t` and
 * `mem` need only live during the call. */
int device_snapshot_reserve(device *dev, const ckpt_tensor *t, const ckpt_memory *mem,
                            size_t count, int ordinal, int *staged);
/* CKPT_EINVAL, naming it and `op` ("save", "restore"), when caller_stream
 * is capturing a CUDA graph (a save checks before allocating anything:
 * pinned allocations during a capture would break it; a restore before any
 * copy: its copies would be recorded into the application's graph instead
 * of running); CKPT_OK otherwise, and without CUDA.  Asked from CUDA
 * device `ordinal`, the tensors' (< 0: the store's): a thread that never
 * chose a device gets no context on GPU 0 for it. */
int device_refuse_capture(device *dev, int ordinal, void *caller_stream, const char *op);
/* Order the copies that follow after all work enqueued on caller_stream
 * (refusing a capturing one, as device_refuse_capture). */
int device_snapshot_start(device *dev, void *caller_stream);
/* The end of the device allocation holding `p` into *end: CKPT_OK, or
 * CKPT_ENOTFOUND when unknown (no CUDA driver function to ask). */
int device_alloc_end(device *dev, const void *p, const void **end);
/* Copy n bytes of device memory src into host memory dst, asynchronously on
 * the copy stream.  `tensor` names it in error messages. */
int device_copy_d2h(device *dev, void *dst, const void *src, size_t n,
                    const char *tensor);
/* A marker that completes when every copy enqueued so far has.  NULL (and
 * CKPT_OK) when no CUDA is in use. */
int device_record(device *dev, device_event **ev);
/* Block until ev's host bytes are there; CKPT_EDEVICE naming the CUDA error
 * and tensor if a copy failed.  NULL is complete.  Thread-safe. */
int device_event_wait(device *dev, device_event *ev);
/* Another handle on the marker ev (NULL stays NULL), freed separately:
 * several chunks covered by one coalesced copy share one marker. */
int device_event_dup(device *dev, const device_event *ev, device_event **out);
/* Between saves, on a library thread: release what the last save found
 * too small (DEVICE-mode scratch, retired pinned buffers), as freeing
 * device or pinned memory synchronizes the device and must not happen in
 * ckpt_save_begin. */
void device_trim(device *dev);
/* Block until the caller's memory covered by ev has been read (what
 * ckpt_save_wait_snapshot needs): the D2D copy in DEVICE mode, else the same
 * as device_event_wait. */
int device_snapshot_wait(device *dev, device_event *ev);
/* Make `stream` wait on the GPU until the caller's memory covered by ev has
 * been read (the D2D copy in DEVICE mode). */
int device_fence(device *dev, device_event *ev, void *stream);
/* Thread-safe; NULL is fine.  An event must outlive its last wait/fence. */
void device_event_free(device *dev, device_event *ev);
/* Block until every copy on the device's own streams has finished, errors
 * ignored: call it on a failed save before its snapshot buffer is reused or
 * freed, since copies already enqueued still write into it. */
void device_quiesce(device *dev);

/* --- restore side */
/* Copy host src (staging) to device dst, on CUDA device `ordinal`, on
 * `stream` (a stream of that device, or NULL for its legacy stream),
 * asynchronously.  The calling worker thread is bound to that device. */
int device_copy_h2d(device *dev, void *dst, const void *src, size_t n,
                    void *stream, int ordinal, const char *tensor);
/* A marker on `stream` (NULL: the legacy default stream) completing when the
 * work enqueued there so far has: wait for it (device_event_wait) before
 * reusing one staging buffer while others are in flight. */
int device_record_stream(device *dev, void *stream, int ordinal, device_event **ev);

/* Environment facts for the manifest: adds an object "cuda" (driver and
 * runtime versions, GPU name, device, library, snapshot mode, pinned bytes,
 * a note on any fallback) when this device object uses CUDA; nothing
 * otherwise.  `env` is a json_t object. */
struct json_t;
void device_describe(device *dev, struct json_t *env);
/* Forget the fallback note: a save calls it first, so that its manifest
 * (described after its snapshot has started) names its own fallbacks. */
void device_note_reset(device *dev);
/* Record a fallback for this save's manifest (no-op without CUDA). */
void device_note(device *dev, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

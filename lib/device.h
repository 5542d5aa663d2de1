/* device: where tensor bytes come from and go to.  The save pipeline and the
 * restore path talk only to this interface; the `host` backend is memcpy,
 * the `cuda` backend (device_cuda.c) drives the CUDA runtime loaded at run
 * time.  One device object per store; calls are made by the store's API
 * thread except device_event_wait(), which workers call. */
#ifndef CKPT_DEVICE_H
#define CKPT_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include "ckpt.h"

typedef struct device device;
typedef struct device_event device_event; /* completion marker of copies */

typedef struct device_options {
    ckpt_snapshot_mode mode;
    uint64_t pinned_limit; /* bytes */
} device_options;

/* Always succeeds for the host part; CUDA is loaded lazily on first use of
 * a device pointer (so host-only users never dlopen anything). */
int device_open(device **out, const device_options *opts);
void device_free(device *dev);

/* Host memory for snapshot and staging buffers, pre-faulted.  Pinned (page
 * locked through the CUDA runtime) when `want_pinned` and CUDA is loaded and
 * the pinned cap allows; *pinned tells which.  Free with device_host_free. */
int device_host_alloc(device *dev, size_t bytes, int want_pinned, void **ptr,
                      int *pinned);
void device_host_free(device *dev, void *ptr, size_t bytes, int pinned);
uint64_t device_pinned_bytes(const device *dev);

/* Resolve where `ptr` lives.  CKPT_MEM_DEVICE (declared or detected)
 * without a usable CUDA runtime is CKPT_ENODEVICE. */
int device_classify(device *dev, const void *ptr, ckpt_memory declared,
                    ckpt_memory *actual);

/* --- save side (API thread) */
/* Order the copies that follow after all work enqueued on caller_stream. */
int device_snapshot_start(device *dev, void *caller_stream);
/* Copy n bytes of device memory src into host memory dst, asynchronously on
 * the copy stream.  `tensor` names it in error messages. */
int device_copy_d2h(device *dev, void *dst, const void *src, size_t n,
                    const char *tensor);
/* A marker that completes when every copy enqueued so far has. */
int device_record(device *dev, device_event **ev);
/* Block until ev completes; CKPT_EDEVICE naming the CUDA error if a copy
 * failed.  Thread-safe. */
int device_event_wait(device *dev, device_event *ev);
/* Make `stream` wait on the GPU for ev. */
int device_fence(device *dev, device_event *ev, void *stream);
void device_event_free(device *dev, device_event *ev);

/* --- restore side */
/* Copy host src (staging) to device dst on `stream`, asynchronously. */
int device_copy_h2d(device *dev, void *dst, const void *src, size_t n,
                    void *stream, const char *tensor);
int device_stream_sync(device *dev, void *stream);

/* Environment facts for the manifest (driver/runtime versions, GPU name);
 * adds nothing when CUDA is not loaded.  `env` is a json_t object. */
struct json_t;
void device_describe(device *dev, struct json_t *env);

#endif

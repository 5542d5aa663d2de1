/* device: the host backend (memcpy into pre-faulted memory).  The cuda
 * backend hooks in here once a device pointer is seen. */
#include "device.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "error.h"

struct device {
    device_options opts;
    uint64_t pinned_bytes;
};

int device_open(device **out, const device_options *opts)
{
    device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory allocating the device backend");
    dev->opts = *opts;
    *out = dev;
    return CKPT_OK;
}

void device_free(device *dev)
{
    free(dev);
}

int device_host_alloc(device *dev, size_t bytes, int want_pinned, void **ptr,
                      int *pinned)
{
    (void)dev;
    (void)want_pinned;
    *pinned = 0;
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

void device_host_free(device *dev, void *ptr, size_t bytes, int pinned)
{
    (void)dev;
    (void)pinned;
    if (ptr)
        munmap(ptr, bytes ? bytes : 1);
}

uint64_t device_pinned_bytes(const device *dev)
{
    return dev->pinned_bytes;
}

int device_classify(device *dev, const void *ptr, ckpt_memory declared,
                    ckpt_memory *actual)
{
    (void)dev;
    (void)ptr;
    if (declared == CKPT_MEM_DEVICE)
        return ckpt_seterr(CKPT_ENODEVICE, "device tensors need the CUDA backend, "
                           "which this build does not have yet");
    *actual = CKPT_MEM_HOST;
    return CKPT_OK;
}

int device_snapshot_start(device *dev, void *caller_stream)
{
    (void)dev;
    (void)caller_stream;
    return CKPT_OK;
}

int device_copy_d2h(device *dev, void *dst, const void *src, size_t n,
                    const char *tensor)
{
    (void)dev;
    (void)dst;
    (void)src;
    (void)n;
    return ckpt_seterr(CKPT_ENODEVICE, "tensor '%s': no CUDA backend", tensor);
}

int device_record(device *dev, device_event **ev)
{
    (void)dev;
    *ev = NULL; /* host copies are complete when they return */
    return CKPT_OK;
}

int device_event_wait(device *dev, device_event *ev)
{
    (void)dev;
    (void)ev;
    return CKPT_OK;
}

int device_fence(device *dev, device_event *ev, void *stream)
{
    (void)dev;
    (void)ev;
    (void)stream;
    return CKPT_OK;
}

void device_event_free(device *dev, device_event *ev)
{
    (void)dev;
    (void)ev;
}

int device_copy_h2d(device *dev, void *dst, const void *src, size_t n,
                    void *stream, const char *tensor)
{
    (void)dev;
    (void)dst;
    (void)src;
    (void)n;
    (void)stream;
    return ckpt_seterr(CKPT_ENODEVICE, "tensor '%s': no CUDA backend", tensor);
}

int device_stream_sync(device *dev, void *stream)
{
    (void)dev;
    (void)stream;
    return CKPT_OK;
}

void device_describe(device *dev, struct json_t *env)
{
    (void)dev;
    (void)env;
}

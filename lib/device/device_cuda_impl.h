/* device_cuda_impl: what the two halves of the CUDA backend share,
 * device_cuda.c (threads and devices, events, the backend's lifecycle) and
 * device_cuda_copy.c (the save side's snapshot copies, the restore side's
 * H2D copies, the environment).  Private to lib/device: device.c and the
 * layers above see only device_cuda.h.  Ordering, modes and locking are
 * described at the top of device_cuda.c. */
#ifndef CKPT_DEVICE_CUDA_IMPL_H
#define CKPT_DEVICE_CUDA_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "device_cuda.h"

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

/* ------------------------------------------------ shared by both halves */

/* The message for CUDA error `err`, after clearing a non-sticky error from
 * the thread's last-error slot. */
const char *dcuda_errstr(const dcuda *cu, cu_err err, char *buf, size_t len);

/* Make device `dev` current for the CUDA calls that follow (streams,
 * events and the legacy default stream belong to one device); *prev gets
 * what dcuda_guard_leave takes.  A library thread stays bound to `dev`
 * (and runs in relaxed capture mode); an application thread gets its
 * device back.  CKPT_EDEVICE when `dev` cannot be made current. */
int dcuda_guard_enter_on(dcuda *cu, int dev, int *prev);
/* dcuda_guard_enter_on(cu, cu->ordinal, prev). */
int dcuda_guard_enter(dcuda *cu, int *prev);
/* Before a wait on objects of device `dev`: the same, quietly (a failure
 * leaves the thread and the caller's message as they were).  Returns what
 * dcuda_guard_leave takes. */
int dcuda_wait_enter(dcuda *cu, int dev);
/* Give an application thread its device back, unless that would create a
 * context (a thread that never chose a device); never leaves an error in
 * the thread's last-error slot. */
void dcuda_guard_leave(dcuda *cu, int prev);

/* Grow the array *arr of *cap elements of `size` bytes to hold `need`
 * (doubling); 0, or -1 when out of memory (the array is unchanged). */
int dcuda_grow(void **arr, size_t *cap, size_t need, size_t size);

/* A shared event of device `dev` (current) with one reference; `issued`
 * says whether it is recorded. */
int dcuda_shared_new_on(dcuda *cu, int dev, int issued, shared_ev **out);
/* dcuda_shared_new_on on cu->ordinal. */
int dcuda_shared_new(dcuda *cu, int issued, shared_ev **out);
/* One more reference to `s`: with mu held, or taking it. */
shared_ev *dcuda_shared_take_locked(shared_ev *s);
shared_ev *dcuda_shared_take(dcuda *cu, shared_ev *s);
/* Drop a reference (NULL: nothing); the last returns the event to its
 * device's pool.  Takes mu. */
void dcuda_shared_release(dcuda *cu, shared_ev *s);

/* Issue the pending staged drains and record their batch event.  With mu
 * held; any thread (a worker waiting for a chunk of the batch may do it). */
void dcuda_flush_locked(dcuda *cu);

/* Move the save side to CUDA device `ordinal` (no save is in flight).  The
 * old device's streams, events and scratch go. */
int dcuda_rehome(dcuda *cu, int ordinal);

#endif

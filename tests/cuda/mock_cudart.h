/* Control interface of the host-memory CUDA runtime used by the tests
 * (mock_cudart.c, built as libcudart_mock.so).  libckpt loads the mock
 * through CKPT_CUDART_LIBRARY exactly as it would load libcudart; the tests
 * dlopen the same file to reach these functions and the few runtime calls
 * they make themselves (mock_api_open in cuda_test_util.h).
 *
 * Model: "device" memory is host memory remembered in a registry, each
 * stream is an ordered queue run by its own thread, events complete when the
 * stream reaches them, cudaStreamWaitEvent holds a queue until the event
 * completes, cudaLaunchHostFunc runs a host function in stream order (the
 * tests' "kernels").  Everything is counted, so a test can check that
 * nothing leaked. */
#ifndef MOCK_CUDART_H
#define MOCK_CUDART_H

#include <stddef.h>

/* Strictness, as the real runtime behaves: streams, events and allocations
 * belong to the device current when they were made, and an event recorded
 * on another device's stream fails; each thread has a current device (0
 * until cudaSetDevice) and any call but a handful creates that device's
 * context (counted in context_mask, reported by cuDevicePrimaryCtxGetState);
 * cudaStreamPerThread is each thread's own stream, and the legacy default
 * stream is ordered with its device's blocking streams (work on it waits
 * for theirs, theirs for its); device <-> pageable host copies block
 * the caller until they ran; a stream holds a bounded number of pending
 * operations; cudaFree and cudaFreeHost wait for every stream; cudaErrorIllegalAddress,
 * LaunchFailure and ECCUncorrectable are sticky; streams can capture
 * (cudaStreamBeginCapture), and waiting on a captured event joins the
 * waiter to the capture, which must be joined back before EndCapture. */

/* Fault flags. */
#define MOCK_FAULT_ASYNC 0x1u  /* a stream operation (cudaMemcpyAsync) is
                                  accepted but fails when the stream runs
                                  it; the error is reported by the next
                                  event or stream synchronisation, as real
                                  kernels' faults are */
#define MOCK_FAULT_STICKY 0x2u /* once fired, every later call fails with the
                                  error (a lost device) until mock_cuda_reset */

typedef struct mock_cuda_counters {
    long streams;         /* created and not destroyed (default stream not counted) */
    long events;          /* created and not destroyed */
    long pinned_allocs;   /* cudaHostAlloc'd, not freed */
    size_t pinned_bytes;
    long device_allocs;   /* cudaMalloc'd, not freed */
    size_t device_bytes;
    size_t device_bytes_peak;
    long copies;          /* memcpy operations run */
    long streams_created; /* ever */
    long spin_waits;      /* cudaEventSynchronize on an event created without
                             cudaEventBlockingSync, or cudaStreamSynchronize
                             on a stream with work pending: a CPU core spun
                             (CUDA's default scheduling) for the whole wait */
    unsigned context_mask;   /* bit d: a thread used device d, creating its
                                primary context (mock_cuda_forget_contexts) */
    long pageable_copies;    /* device <-> pageable host transfers: the
                                enqueueing thread waited for each to run  */
    long enqueue_waits;      /* enqueues that blocked on a full stream    */
    long free_syncs;         /* cudaFree and cudaFreeHost calls: each
                                synchronized the device                    */
    long cross_device_records; /* cudaEventRecord refused: event and stream
                                  on different devices                      */
    long captured_ops;       /* operations captured into a graph, not run  */
    long capture_breaks;     /* calls refused (and captures invalidated) by
                                the capture interaction mode rules */
} mock_cuda_counters;

/* Forget faults, the sticky error, errors streams have not reported yet and
 * the copy delay; counters of live objects stay.  The settings also read from the environment at load:
 *   MOCK_CUDA_FAULTS="cudaMemcpyAsync:3:700:async,cudaHostAlloc:1:2"
 *       (function:nth:error[:async][:sticky], comma separated)
 *   MOCK_CUDA_COPY_DELAY_US=20000   MOCK_CUDA_DEVICE_COUNT=1
 *   MOCK_CUDA_DEVICE_MEMORY=bytes (total "device" memory, default 4 GiB)
 *   MOCK_CUDA_QUEUE_DEPTH=ops   MOCK_DEBUG_CTX=1 (print the call creating each context) */
void mock_cuda_reset(void);

/* Make the nth call (1 = next) of runtime function `fn` counted from now
 * fail with `err` (a cudaError_t value).  nth <= 0 fails every call. */
void mock_cuda_fault(const char *fn, int nth, int err, unsigned int flags);
/* How many times faults on `fn` fired. */
long mock_cuda_fault_fired(const char *fn);
/* Calls made to `fn` since load. */
long mock_cuda_calls(const char *fn);

/* Each memcpy operation sleeps this long before copying. */
void mock_cuda_set_copy_delay_us(unsigned int us);
void mock_cuda_set_device_count(int n);
void mock_cuda_set_device_memory(size_t total);
void mock_cuda_get_counters(mock_cuda_counters *out);
/* cudaMemGetInfo reports `bytes` free (SIZE_MAX: the truth), as it does
 * when another allocator (PyTorch's cache) holds memory it would reuse. */
void mock_cuda_set_reported_free(size_t bytes);
/* Pending operations a stream holds before enqueueing blocks (default
 * 1024, MOCK_CUDA_QUEUE_DEPTH). */
void mock_cuda_set_queue_depth(unsigned int ops);
/* Pending records of cudaEventBlockingSync events a stream holds before
 * cudaEventRecord of another blocks (default 56, as measured on an H200;
 * MOCK_CUDA_SYNC_RECORDS).  Captured records do not count. */
void mock_cuda_set_sync_records(unsigned int records);
/* With `region` > 0: cudaMalloc carves device allocations one after the
 * other (256-byte aligned) out of a region of that size, as the real
 * allocator often places them: separate allocations then sit next to each
 * other in the address space, and a copy that runs from one into the next
 * fails (cudaErrorInvalidValue) as on a real device.  0: back to separate
 * blocks (carved ones stay valid until freed). */
void mock_cuda_set_adjacent(size_t region);
/* Forget which devices have a context, except those holding device memory
 * (a test's baseline before the calls it checks). */
void mock_cuda_forget_contexts(void);
/* Make `ctx` (any non-NULL token) the calling thread's current context, as
 * one made with the driver API would be (cuCtxCreate): cuCtxGetCurrent
 * returns it and no primary context counts as active.  NULL undoes it. */
void mock_cuda_set_user_context(void *ctx);
/* What the calling thread itself waited for: enqueues blocked on a full
 * stream, pageable transfers it had to wait out, and its cudaFree and
 * cudaFreeHost calls (each synchronized the device). */
typedef struct mock_cuda_thread_counters {
    long enqueue_waits;
    long pageable_copies;
    long frees;
} mock_cuda_thread_counters;
void mock_cuda_get_thread_counters(mock_cuda_thread_counters *out);

#endif

/* cuda_loader: the CUDA runtime, found at run time with dlopen.
 *
 * libckpt never links libcudart: the same libckpt.so runs on machines without
 * CUDA.  The runtime is taken, in this order, from
 *   1. the process, when one is already loaded (PyTorch, CuPy, a CUDA program
 *      linked with -cudart shared): dlopen(RTLD_NOLOAD) of libcudart.so.13,
 *      .12 and libcudart.so, or cudaGetDeviceCount visible globally;
 *   2. $CKPT_CUDART_LIBRARY when set (and then only that file);
 *   3. libcudart.so.13, then libcudart.so.12.
 * Only the functions below are resolved, and the few types and constants they
 * need are declared here, so no CUDA header is needed to build.
 *
 * The loaded table is the one piece of process-wide state of the device
 * layer: it is filled once (pthread_once) and never unloaded. */
#ifndef CKPT_CUDA_LOADER_H
#define CKPT_CUDA_LOADER_H

#include <stddef.h>

/* cudaError_t values used by name (driver_types.h). */
enum {
    CU_SUCCESS = 0,
    CU_ERR_INVALID_VALUE = 1,
    CU_ERR_MEMORY_ALLOCATION = 2,
    CU_ERR_INSUFFICIENT_DRIVER = 35,
    CU_ERR_NO_DEVICE = 100,
    CU_ERR_INVALID_HANDLE = 400,
    CU_ERR_NOT_READY = 600,
    CU_ERR_ILLEGAL_ADDRESS = 700
};

/* cudaMemcpyKind */
enum { CU_MEMCPY_H2D = 1, CU_MEMCPY_D2H = 2, CU_MEMCPY_D2D = 3, CU_MEMCPY_DEFAULT = 4 };
/* cudaMemoryType */
enum { CU_MEM_UNREGISTERED = 0, CU_MEM_HOST = 1, CU_MEM_DEVICE = 2, CU_MEM_MANAGED = 3 };
/* flags */
#define CU_STREAM_NON_BLOCKING 0x01u
#define CU_EVENT_BLOCKING_SYNC 0x01u
#define CU_EVENT_DISABLE_TIMING 0x02u
/* Every event libckpt creates: no timing, and a host thread waiting on it
 * sleeps instead of spinning a core for the whole copy. */
#define CU_EVENT_FLAGS (CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC)
#define CU_HOST_ALLOC_PORTABLE 0x01u
#define CU_MAX_DEVICES 64 /* device ordinals libckpt handles: 0..63 */

/* struct cudaPointerAttributes of CUDA 11 to 13.  CUDA 12 ends after
 * hostPointer, CUDA 13 adds `long reserved[8]`; we pass the larger, zeroed
 * layout, which suits both. */
typedef struct cu_pointer_attributes {
    int type;
    int device;
    void *device_pointer;
    void *host_pointer;
    long reserved[8];
} cu_pointer_attributes;

typedef int cu_err;           /* cudaError_t */
typedef void *cu_stream;      /* cudaStream_t */
typedef void *cu_event;       /* cudaEvent_t  */

typedef struct cuda_api {
    cu_err (*GetDeviceCount)(int *count);
    cu_err (*GetDevice)(int *dev);
    cu_err (*SetDevice)(int dev);
    cu_err (*PointerGetAttributes)(cu_pointer_attributes *attr, const void *ptr);
    cu_err (*StreamCreateWithFlags)(cu_stream *s, unsigned int flags);
    cu_err (*StreamDestroy)(cu_stream s);
    cu_err (*StreamWaitEvent)(cu_stream s, cu_event e, unsigned int flags);
    cu_err (*StreamSynchronize)(cu_stream s);
    cu_err (*EventCreateWithFlags)(cu_event *e, unsigned int flags);
    cu_err (*EventRecord)(cu_event e, cu_stream s);
    cu_err (*EventSynchronize)(cu_event e);
    cu_err (*EventQuery)(cu_event e);
    cu_err (*EventDestroy)(cu_event e);
    cu_err (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind, cu_stream s);
    cu_err (*HostAlloc)(void **p, size_t n, unsigned int flags);
    cu_err (*FreeHost)(void *p);
    cu_err (*Malloc)(void **p, size_t n);
    cu_err (*Free)(void *p);
    cu_err (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    const char *(*GetErrorString)(cu_err err);
    const char *(*GetErrorName)(cu_err err);
    cu_err (*GetLastError)(void);
    cu_err (*DriverGetVersion)(int *v);
    cu_err (*RuntimeGetVersion)(int *v);
    /* Optional (NULL when absent): cudaGetDeviceProperties[_v2].  Only the
     * first member, char name[256], is read; every CUDA version puts it
     * first. */
    cu_err (*GetDeviceProperties)(void *prop, int dev);
    /* Optional: cudaPeekAtLastError, to leave an application's runtime's
     * last-error slot as libckpt found it. */
    cu_err (*PeekAtLastError)(void);
    /* Optional: cudaStreamIsCapturing (status 0: not capturing). */
    cu_err (*StreamIsCapturing)(cu_stream s, int *status);
    /* Optional (CUDA 10.1+): cudaThreadExchangeStreamCaptureMode; *mode is
     * 0 global, 1 thread-local, 2 relaxed. */
    cu_err (*ThreadExchangeStreamCaptureMode)(int *mode);
    /* Optional, from the driver (libcuda.so.1, which every runtime loads;
     * CUresult status, 0 is success): cuDeviceGet and
     * cuDevicePrimaryCtxGetState, to tell whether a device already has its
     * primary context before making it current (which creates one). */
    int (*DrvDeviceGet)(int *device, int ordinal);
    int (*DrvPrimaryCtxGetState)(int device, unsigned int *flags, int *active);
    /* Optional, from the driver: cuCtxGetCurrent, to tell a context the
     * application made itself (cuCtxCreate, PyCUDA's make_context) from
     * none when the current device's primary context is inactive. */
    int (*DrvCtxGetCurrent)(void **ctx);
    /* Optional, from the driver: cuMemGetAddressRange (the _v2 ABI), the
     * base and size of the device allocation holding a pointer, so that no
     * copy runs from one allocation into the next. */
    int (*DrvMemGetAddressRange)(unsigned long long *base, size_t *size,
                                 unsigned long long dptr);
    /* Optional, from the driver: cuPointerGetAttribute, which needs no
     * current context: whether a pointer is memory of any context (one the
     * application made with the driver API on another thread too). */
    int (*DrvPointerGetAttribute)(void *data, int attribute, unsigned long long ptr);

    int runtime_version; /* cudaRuntimeGetVersion's (11080 for 11.8); 0 if
                            unknown.  Before 12.0 cudaSetDevice only notes
                            the choice: a chosen device may have no context */
    const char *library; /* what was loaded ("libcudart.so.13", a path, or
                            "(in process)") */
    int device_count;
} cuda_api;

/* The runtime table, loading it on first use.  CKPT_ENODEVICE with a message
 * ("no CUDA runtime found (tried ...)", "CUDA runtime loaded but no
 * device") when there is none.  A look that found a runtime, usable or
 * not, is final; one that found none is made again once the process has
 * loaded another object (a framework imported after libckpt was asked).
 * CKPT_ENODEVICE in a child forked after a runtime was loaded (loading
 * started CUDA, which does not survive fork). */
int cuda_loader_get(const cuda_api **api);

/* The table when a runtime is already loaded, is in the process, or was asked
 * for with $CKPT_CUDART_LIBRARY; NULL (and no error set) otherwise.  Used to
 * classify CKPT_MEM_AUTO pointers without pulling CUDA into host-only
 * programs.  Cheap enough to ask per pointer: the search for a runtime in
 * the process is remembered until another library is loaded. */
const cuda_api *cuda_loader_peek(void);

/* Whether the CUDA driver loaded in this process (none: 0) reports `p` as
 * device memory (cuPointerGetAttribute): for a CKPT_MEM_AUTO pointer when
 * the driver is in the process but no runtime could be loaded (a program
 * with a statically linked runtime, on a machine without libcudart.so). */
int cuda_loader_driver_says_device(const void *p);

/* "cudaErrorIllegalAddress (an illegal memory access was encountered)" into
 * buf; never fails. */
const char *cuda_loader_errstr(const cuda_api *api, cu_err err, char *buf,
                               size_t len);

#endif

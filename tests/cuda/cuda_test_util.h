/* Helpers shared by the tests that run the cuda backend against the mock
 * runtime.  The mock is the file named by CKPT_CUDART_LIBRARY (set by
 * meson); dlopen of the same path returns the very object libckpt loads, so
 * the tests and the library share its state. */
#ifndef CUDA_TEST_UTIL_H
#define CUDA_TEST_UTIL_H

#include <dlfcn.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "mock_cudart.h"

typedef int (*mock_hostfn_t)(void);

typedef struct mock_api {
    void (*reset)(void);
    void (*fault)(const char *fn, int nth, int err, unsigned int flags);
    long (*fault_fired)(const char *fn);
    long (*calls)(const char *fn);
    void (*set_copy_delay_us)(unsigned int us);
    void (*set_device_count)(int n);
    void (*set_device_memory)(size_t total);
    void (*get_counters)(mock_cuda_counters *out);
    /* the runtime calls tests make themselves */
    int (*Malloc)(void **p, size_t n);
    int (*MallocManaged)(void **p, size_t n, unsigned int flags);
    int (*Free)(void *p);
    int (*HostAlloc)(void **p, size_t n, unsigned int flags);
    int (*FreeHost)(void *p);
    int (*GetLastError)(void);
    int (*StreamCreate)(void **s);
    int (*StreamDestroy)(void *s);
    int (*StreamSynchronize)(void *s);
    int (*LaunchHostFunc)(void *s, void (*fn)(void *), void *arg);
    int (*DeviceSynchronize)(void);
    /* strict-mode controls and the calls that go with them */
    void (*set_reported_free)(size_t bytes);
    void (*set_queue_depth)(unsigned int ops);
    void (*set_sync_records)(unsigned int records);
    void (*set_adjacent)(size_t region);
    void (*forget_contexts)(void);
    void (*set_user_context)(void *ctx);
    void (*get_thread_counters)(mock_cuda_thread_counters *out);
    int (*SetDevice)(int dev);
    int (*GetDevice)(int *dev);
    int (*StreamBeginCapture)(void *s, int mode);
    int (*StreamEndCapture)(void *s, void **graph);
    int (*GraphDestroy)(void *graph);
    int (*ThreadExchangeStreamCaptureMode)(int *mode);
} mock_api;

static inline mock_api mock_api_open(void)
{
    mock_api m;
    memset(&m, 0, sizeof m);
    const char *path = getenv("CKPT_CUDART_LIBRARY");
    cr_assert(path, "CKPT_CUDART_LIBRARY is not set (run through meson test)");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "cannot load the mock runtime %s: %s", path, dlerror());
#define MOCK_SYM(field, name)                                          \
    do {                                                               \
        *(void **)(&m.field) = dlsym(h, name);                         \
        cr_assert(m.field, "mock runtime lacks %s", name);             \
    } while (0)
    MOCK_SYM(reset, "mock_cuda_reset");
    MOCK_SYM(fault, "mock_cuda_fault");
    MOCK_SYM(fault_fired, "mock_cuda_fault_fired");
    MOCK_SYM(calls, "mock_cuda_calls");
    MOCK_SYM(set_copy_delay_us, "mock_cuda_set_copy_delay_us");
    MOCK_SYM(set_device_count, "mock_cuda_set_device_count");
    MOCK_SYM(set_device_memory, "mock_cuda_set_device_memory");
    MOCK_SYM(get_counters, "mock_cuda_get_counters");
    MOCK_SYM(Malloc, "cudaMalloc");
    MOCK_SYM(MallocManaged, "cudaMallocManaged");
    MOCK_SYM(Free, "cudaFree");
    MOCK_SYM(HostAlloc, "cudaHostAlloc");
    MOCK_SYM(FreeHost, "cudaFreeHost");
    MOCK_SYM(GetLastError, "cudaGetLastError");
    MOCK_SYM(StreamCreate, "cudaStreamCreate");
    MOCK_SYM(StreamDestroy, "cudaStreamDestroy");
    MOCK_SYM(StreamSynchronize, "cudaStreamSynchronize");
    MOCK_SYM(LaunchHostFunc, "cudaLaunchHostFunc");
    MOCK_SYM(DeviceSynchronize, "cudaDeviceSynchronize");
    MOCK_SYM(set_reported_free, "mock_cuda_set_reported_free");
    MOCK_SYM(set_queue_depth, "mock_cuda_set_queue_depth");
    MOCK_SYM(set_sync_records, "mock_cuda_set_sync_records");
    MOCK_SYM(set_adjacent, "mock_cuda_set_adjacent");
    MOCK_SYM(forget_contexts, "mock_cuda_forget_contexts");
    MOCK_SYM(set_user_context, "mock_cuda_set_user_context");
    MOCK_SYM(get_thread_counters, "mock_cuda_get_thread_counters");
    MOCK_SYM(SetDevice, "cudaSetDevice");
    MOCK_SYM(GetDevice, "cudaGetDevice");
    MOCK_SYM(StreamBeginCapture, "cudaStreamBeginCapture");
    MOCK_SYM(StreamEndCapture, "cudaStreamEndCapture");
    MOCK_SYM(GraphDestroy, "cudaGraphDestroy");
    MOCK_SYM(ThreadExchangeStreamCaptureMode, "cudaThreadExchangeStreamCaptureMode");
#undef MOCK_SYM
    return m;
}

/* A slow "kernel": sleeps, then fills `n` bytes at `p` with a pattern
 * derived from `seed`.  Enqueue it with LaunchHostFunc(stream, kernel_fill, k). */
typedef struct fill_kernel {
    unsigned char *p;
    size_t n;
    unsigned seed;
    unsigned sleep_us;
} fill_kernel;

static inline unsigned char pattern_byte(unsigned seed, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (unsigned char)(x * 0x94D049BB133111EBull >> 56);
}

static inline void pattern_fill(void *p, size_t n, unsigned seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = pattern_byte(seed, i);
}

/* Index of the first byte that differs from the pattern, or -1. */
static inline long pattern_check(const void *p, size_t n, unsigned seed)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != pattern_byte(seed, i))
            return (long)i;
    return -1;
}

static inline void kernel_fill(void *arg)
{
    fill_kernel *k = arg;
    if (k->sleep_us)
        usleep(k->sleep_us);
    pattern_fill(k->p, k->n, k->seed);
}

/* A fresh directory under $TMPDIR (malloc'd path), and rm -rf. */
static inline char *ct_mkdtemp(void)
{
    const char *tmp = getenv("TMPDIR");
    char *path = malloc(4096);
    cr_assert(path);
    snprintf(path, 4096, "%s/ckpt-cuda-test.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert(mkdtemp(path), "mkdtemp %s failed", path);
    return path;
}

static inline int ct_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static inline void ct_rmtree(const char *path)
{
    if (path)
        nftw(path, ct_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A suite whose tests each get a fresh temporary root, ct_root:
 * TestSuite(name, .init = ct_root_setup, .fini = ct_root_teardown). */
static char *ct_root;

static inline void ct_root_setup(void)
{
    ct_root = ct_mkdtemp();
}

static inline void ct_root_teardown(void)
{
    ct_rmtree(ct_root);
    free(ct_root);
}

static inline void expect_no_leaks(const mock_api *m)
{
    mock_cuda_counters c;
    m->get_counters(&c);
    cr_expect_eq(c.streams, 0, "%ld CUDA streams leaked", c.streams);
    cr_expect_eq(c.events, 0, "%ld CUDA events leaked", c.events);
    cr_expect_eq(c.pinned_allocs, 0, "%ld pinned allocations leaked (%zu bytes)",
                 c.pinned_allocs, c.pinned_bytes);
    cr_expect_eq(c.device_allocs, 0, "%ld device allocations leaked (%zu bytes)",
                 c.device_allocs, c.device_bytes);
}

#endif

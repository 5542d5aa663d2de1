/* Device tensors on a real GPU, through the public API.
 *
 * Prints "SKIP: no CUDA device (...)" and exits 77 (meson's skip) where the
 * CUDA runtime reports no device; with CKPT_GPU_REQUIRED=1 in the
 * environment (tests/gpu/run.sh sets it once it has seen a GPU) that is a
 * failure instead (exit 1), so an old driver cannot pass as "no GPU".
 * Checks, in each snapshot mode:
 *   - the checkpoint holds exactly what the caller's stream had produced
 *     when the save began, though that work had not run yet: the stream is
 *     held by a host function until ckpt_save_begin has returned (a gate),
 *     so the copy provably cannot have started before (no timing involved);
 *   - a write enqueued after ckpt_save_fence() never reaches it;
 *   - after ckpt_save_wait_snapshot() the CPU may overwrite the buffer;
 *   - restore into device buffers (H2D on the caller's stream, and on the
 *     legacy NULL stream: complete when ckpt_restore returns);
 *   - AUTO tells device, managed, pinned and pageable memory apart;
 *   - pinned memory is reported and capped; the manifest names the GPU.
 * And once each: a state four times pinned_limit with default options
 * (HOST mode, bounded pinned passes, begin does not wait for the caller's
 * stream), STREAM mode in several passes over odd-sized tensors, DEVICE mode
 * falling back to HOST when spare device memory is too small, a caller
 * stream in graph capture (CKPT_EINVAL; the capture still ends well), and,
 * with two or more GPUs, tensors on device 1 (in a child process that never
 * touches device 0 first: no context is created there) and a save mixing
 * devices 0 and 1 (CKPT_EINVAL).
 * Uses only runtime API calls (copies, memsets, host functions, capture), so
 * it builds with a C compiler against libcudart (tests/gpu/meson.build). */
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

/* Referenced weakly: the same source also runs on tests/cuda's mock runtime
 * (tests/cuda/meson.build), which may lack them; NULL there, and the parts
 * that need them say they were left out. */
extern __typeof__(cudaStreamBeginCapture) cudaStreamBeginCapture __attribute__((weak));
extern __typeof__(cudaStreamEndCapture) cudaStreamEndCapture __attribute__((weak));
extern __typeof__(cudaGraphInstantiateWithFlags) cudaGraphInstantiateWithFlags
    __attribute__((weak));
extern __typeof__(cudaGraphLaunch) cudaGraphLaunch __attribute__((weak));
extern __typeof__(cudaGraphExecDestroy) cudaGraphExecDestroy __attribute__((weak));
extern __typeof__(cudaGraphDestroy) cudaGraphDestroy __attribute__((weak));
extern __typeof__(cudaThreadExchangeStreamCaptureMode) cudaThreadExchangeStreamCaptureMode
    __attribute__((weak));
/* Only the mock has it: it then shrinks the device instead of the test
 * filling a real one. */
void mock_cuda_set_device_memory(size_t total) __attribute__((weak));

static int failures, checks;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        checks++;                                                               \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

#define CK(call)                                                                \
    do {                                                                        \
        int rc_ = (call);                                                       \
        CHECK(rc_ == CKPT_OK, "%s: %s: %s", #call, ckpt_strerror(rc_),          \
              ckpt_error_last());                                               \
    } while (0)

#define CU(call)                                                                \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,   \
                    cudaGetErrorString(e_));                                    \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define MIB ((size_t)1 << 20)
#define N (64 * MIB)       /* bytes per tensor */
/* A gate that nobody opens is a bug in libckpt (it waited for the caller's
 * stream); after this long the gate opens itself so that the bug shows as a
 * failed check instead of a hung test.  Not a timing assertion: no correct
 * run comes near it. */
#define GATE_DEADLOCK_S 60

/* A host function enqueued on a stream that blocks it until gate_open():
 * work enqueued after it cannot run before the test says so. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;        /* set by gate_open or by the deadlock breaker; mu */
    int broke;       /* 1: nobody opened it in GATE_DEADLOCK_S; mu      */
} gate;

static void gate_fn(void *arg) /* runs on a CUDA runtime thread, no CUDA calls */
{
    gate *g = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += GATE_DEADLOCK_S;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT) {
            g->open = g->broke = 1;
            fprintf(stderr, "test_gpu: gate not opened in %d s: libckpt waited for "
                    "the caller's stream; opening it\n", GATE_DEADLOCK_S);
        }
    pthread_mutex_unlock(&g->mu);
}

static void gate_close(gate *g, cudaStream_t s)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = g->broke = 0;
    CU(cudaLaunchHostFunc(s, gate_fn, g));
}

/* Opens the gate; returns 1 if it had already been broken open. */
static int gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    int broke = g->broke;
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return broke;
}

/* Call after the gated stream is synchronized. */
static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static char *new_root(void)
{
    const char *tmp = getenv("TMPDIR");
    char *path = malloc(4096);
    snprintf(path, 4096, "%s/ckpt-gpu-test.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        exit(1);
    }
    return path;
}

static void free_root(char *root)
{
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(root);
}

static ckpt_store *open_store(const char *root, ckpt_snapshot_mode mode,
                              uint64_t pinned_limit)
{
    ckpt_store *st = NULL;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    o.snapshot_mode = mode;
    o.pinned_limit = pinned_limit;
    int rc = ckpt_store_open(&st, root, &o);
    if (rc != CKPT_OK) {
        fprintf(stderr, "FATAL: ckpt_store_open %s: %s\n", root, ckpt_error_last());
        exit(1);
    }
    return st;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, n - i < 8 ? n - i : 8);
    }
}

static int64_t g_shape[1] = { (int64_t)N };

static ckpt_tensor tensor(const char *name, void *p, ckpt_memory mem)
{
    ckpt_tensor t = { name, p, N, CKPT_U8, 1, g_shape, mem };
    return t;
}

/* Compare tensor `name` (n bytes) of `step` with `want` (host). */
static void expect_saved_n(ckpt_store *st, int64_t step, const char *name,
                           const unsigned char *want, size_t n, const char *what)
{
    void *data = NULL;
    uint64_t bytes = 0;
    int rc = ckpt_load(st, step, name, &data, &bytes, NULL);
    CHECK(rc == CKPT_OK, "%s: ckpt_load %s: %s", what, name, ckpt_error_last());
    if (rc == CKPT_OK)
        CHECK(bytes == n && memcmp(data, want, n) == 0,
              "%s: tensor %s in the checkpoint differs from the state the stream had "
              "produced", what, name);
    ckpt_free(data);
}

static void expect_saved(ckpt_store *st, int64_t step, const char *name,
                         const unsigned char *want, const char *what)
{
    expect_saved_n(st, step, name, want, N, what);
}

/* Device buffer `d` (n bytes) equals `want`, read back on a non-blocking
 * stream of its own, which does not synchronize with the legacy stream: a
 * restore that returned before its copies were done can show here. */
static void expect_device(const void *d, const unsigned char *want, size_t n,
                          const char *what)
{
    cudaStream_t rs;
    unsigned char *back;
    CU(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
    CU(cudaHostAlloc((void **)&back, n, cudaHostAllocDefault));
    memset(back, 0x5A, n);
    CU(cudaMemcpyAsync(back, d, n, cudaMemcpyDeviceToHost, rs));
    CU(cudaStreamSynchronize(rs));
    CHECK(memcmp(back, want, n) == 0, "%s: device buffer differs from the checkpoint", what);
    CU(cudaFreeHost(back));
    CU(cudaStreamDestroy(rs));
}

static const char *mode_name(ckpt_snapshot_mode m)
{
    return m == CKPT_SNAPSHOT_HOST ? "host" : m == CKPT_SNAPSHOT_DEVICE ? "device" : "stream";
}

/* Stream s, gated: A is written; save; fence; B is written; only then is
 * the gate opened, so the save's copy runs after A and before B or not at
 * all.  Then wait_snapshot and restores on s and on the NULL stream. */
static void fence_ordering(ckpt_snapshot_mode mode, unsigned char *ha, unsigned char *hb)
{
    char what[64];
    snprintf(what, sizeof what, "fence ordering (%s mode)", mode_name(mode));
    char *root = new_root();
    ckpt_store *st = open_store(root, mode, 0);
    cudaStream_t s;
    void *d;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaMalloc(&d, N));
    CU(cudaMemset(d, 0, N));
    CU(cudaDeviceSynchronize());
    gate g;
    gate_close(&g, s);
    CU(cudaMemcpyAsync(d, ha, N, cudaMemcpyHostToDevice, s));
    ckpt_tensor t = tensor("w", d, CKPT_MEM_DEVICE);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save = NULL;
    CK(ckpt_save_begin(&save, st, 1, &t, 1, &so));
    if (save)
        CK(ckpt_save_fence(save, s));
    CU(cudaMemcpyAsync(d, hb, N, cudaMemcpyHostToDevice, s));
    CHECK(!gate_open(&g), "%s: ckpt_save_begin or ckpt_save_fence waited for the caller's "
          "stream", what);
    if (save)
        CK(ckpt_save_wait(save));
    ckpt_save_free(save);
    CU(cudaStreamSynchronize(s));
    gate_destroy(&g);
    expect_saved(st, 1, "w", ha, what);

    /* wait_snapshot, then overwrite from the CPU side */
    CU(cudaMemcpy(d, ha, N, cudaMemcpyHostToDevice));
    save = NULL;
    CK(ckpt_save_begin(&save, st, 2, &t, 1, NULL));
    if (save) {
        CK(ckpt_save_wait_snapshot(save));
        CU(cudaMemset(d, 0xEE, N));
        CK(ckpt_save_wait(save));
    }
    ckpt_save_free(save);
    snprintf(what, sizeof what, "wait_snapshot (%s mode)", mode_name(mode));
    expect_saved(st, 2, "w", ha, what);

    /* restore into another device buffer on the stream */
    void *r;
    CU(cudaMalloc(&r, N));
    CU(cudaMemset(r, 0, N));
    ckpt_tensor rt = tensor("w", r, CKPT_MEM_AUTO);
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    CK(ckpt_restore(st, CKPT_LATEST, &rt, 1, &ro, NULL));
    CU(cudaStreamSynchronize(s));
    snprintf(what, sizeof what, "restore on a stream (%s mode)", mode_name(mode));
    expect_device(r, ha, N, what);

    /* and on the legacy NULL stream: complete when ckpt_restore returns */
    CU(cudaMemset(r, 0, N));
    CU(cudaDeviceSynchronize());
    CK(ckpt_restore(st, CKPT_LATEST, &rt, 1, NULL, NULL));
    snprintf(what, sizeof what, "restore on the NULL stream (%s mode)", mode_name(mode));
    expect_device(r, ha, N, what);
    CHECK(ckpt_store_pinned_bytes(st) > 0, "no pinned memory reported (%s mode)",
          mode_name(mode));

    ckpt_store_free(st);
    CU(cudaFree(r));
    CU(cudaFree(d));
    CU(cudaStreamDestroy(s));
    free_root(root);
}

/* AUTO: device, managed, pinned and pageable pointers all round-trip. */
static void auto_classification(unsigned char *ha)
{
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, 0);
    void *dev, *managed, *pinned;
    unsigned char *pageable = malloc(N);
    CU(cudaMalloc(&dev, N));
    CU(cudaMallocManaged(&managed, N, cudaMemAttachGlobal));
    CU(cudaHostAlloc(&pinned, N, cudaHostAllocDefault));
    CU(cudaMemcpy(dev, ha, N, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(managed, ha, N, cudaMemcpyDefault));
    CU(cudaDeviceSynchronize());
    memcpy(pinned, ha, N);
    memcpy(pageable, ha, N);
    ckpt_tensor t[4] = { tensor("dev", dev, CKPT_MEM_AUTO),
                         tensor("managed", managed, CKPT_MEM_AUTO),
                         tensor("pinned", pinned, CKPT_MEM_AUTO),
                         tensor("pageable", pageable, CKPT_MEM_AUTO) };
    CK(ckpt_save_sync(st, 1, t, 4, NULL));
    for (int i = 0; i < 4; i++)
        expect_saved(st, 1, t[i].name, ha, t[i].name);

    /* a host pointer declared as device memory is refused */
    ckpt_tensor bad = tensor("bad", pageable, CKPT_MEM_DEVICE);
    int rc = ckpt_save_sync(st, 2, &bad, 1, NULL);
    CHECK(rc == CKPT_EINVAL, "declared-device host memory: got %s (%s)", ckpt_strerror(rc),
          ckpt_error_last());

    /* the manifest names the GPU */
    ckpt_checkpoint *ck = NULL;
    CK(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK));
    struct cudaDeviceProp prop;
    int devno = 0;
    CU(cudaGetDevice(&devno));
    CU(cudaGetDeviceProperties(&prop, devno));
    if (ck) {
        const char *env = ckpt_checkpoint_env(ck);
        CHECK(strstr(env, "\"cuda\"") && strstr(env, prop.name),
              "environment does not name the GPU %s: %s", prop.name, env);
        ckpt_checkpoint_free(ck);
    }
    ckpt_store_free(st);
    CU(cudaFree(dev));
    CU(cudaFree(managed));
    CU(cudaFreeHost(pinned));
    free(pageable);
    free_root(root);
}

/* The pinned cap holds; a pageable snapshot buffer still gives right data. */
static void pinned_cap(unsigned char *ha)
{
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, 8 * MIB);
    void *d;
    CU(cudaMalloc(&d, N));
    CU(cudaMemcpy(d, ha, N, cudaMemcpyHostToDevice));
    ckpt_tensor t = tensor("w", d, CKPT_MEM_DEVICE);
    CK(ckpt_save_sync(st, 1, &t, 1, NULL));
    CHECK(ckpt_store_pinned_bytes(st) <= 8 * MIB, "pinned bytes %llu over the 8 MiB cap",
          (unsigned long long)ckpt_store_pinned_bytes(st));
    expect_saved(st, 1, "w", ha, "pinned cap");
    ckpt_store_free(st);
    CU(cudaFree(d));
    free_root(root);
}

/* Several device buffers of any sizes, filled from the host. */
typedef struct state {
    int n;
    void *d[8];
    unsigned char *h[8];
    size_t bytes[8];
    int64_t shape[8];
    char name[8][16];
    ckpt_tensor t[8];
} state;

static void state_make(state *x, int n, const size_t *bytes, unsigned seed)
{
    memset(x, 0, sizeof *x);
    x->n = n;
    for (int i = 0; i < n; i++) {
        x->bytes[i] = bytes[i];
        x->shape[i] = (int64_t)bytes[i];
        snprintf(x->name[i], sizeof x->name[i], "t%d", i);
        /* pinned: an async copy from pageable memory may block the caller
         * until its stream gets there, and the tests gate their streams */
        CU(cudaHostAlloc((void **)&x->h[i], bytes[i], cudaHostAllocDefault));
        fill(x->h[i], bytes[i], seed + (unsigned)i);
        CU(cudaMalloc(&x->d[i], bytes[i]));
        CU(cudaMemcpy(x->d[i], x->h[i], bytes[i], cudaMemcpyHostToDevice));
        x->t[i] = (ckpt_tensor){ x->name[i], x->d[i], bytes[i], CKPT_U8, 1, &x->shape[i],
                                 CKPT_MEM_DEVICE };
    }
}

static void state_expect_saved(ckpt_store *st, int64_t step, const state *x, const char *what)
{
    for (int i = 0; i < x->n; i++)
        expect_saved_n(st, step, x->name[i], x->h[i], x->bytes[i], what);
}

/* Restore every tensor of `x` into new device buffers on `s`; compare. */
static void state_expect_restore(ckpt_store *st, const state *x, cudaStream_t s,
                                 const char *what)
{
    ckpt_tensor rt[8];
    void *r[8];
    for (int i = 0; i < x->n; i++) {
        CU(cudaMalloc(&r[i], x->bytes[i]));
        CU(cudaMemset(r[i], 0, x->bytes[i]));
        rt[i] = x->t[i];
        rt[i].data = r[i];
    }
    CU(cudaDeviceSynchronize());
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    CK(ckpt_restore(st, CKPT_LATEST, rt, (size_t)x->n, &ro, NULL));
    CU(cudaStreamSynchronize(s));
    for (int i = 0; i < x->n; i++) {
        expect_device(r[i], x->h[i], x->bytes[i], what);
        CU(cudaFree(r[i]));
    }
}

static void state_free(state *x)
{
    for (int i = 0; i < x->n; i++) {
        CU(cudaFree(x->d[i]));
        CU(cudaFreeHost(x->h[i]));
    }
}

/* Save the four-tensor state `x` as step 1 on stream `s` while a kernel
 * gates the stream: tensor 0's content is written by the gated stream,
 * tensor 3 is overwritten right after the fence.  ckpt_save_begin must
 * return while the gate is closed, and the step must hold the state as
 * the stream had it at the save. */
static void gated_save(ckpt_store *st, state *x, cudaStream_t s, const char *what)
{
    /* tensor 0 holds zeros until the gated stream writes its content */
    CU(cudaMemset(x->d[0], 0, x->bytes[0]));
    CU(cudaDeviceSynchronize());
    gate g;
    gate_close(&g, s);
    CU(cudaMemcpyAsync(x->d[0], x->h[0], x->bytes[0], cudaMemcpyHostToDevice, s));
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save = NULL;
    CK(ckpt_save_begin(&save, st, 1, x->t, 4, &so));
    CHECK(!gate_open(&g), "%s: ckpt_save_begin waited for the caller's stream", what);
    if (save) {
        CK(ckpt_save_fence(save, s));
        CU(cudaMemsetAsync(x->d[3], 0xEE, x->bytes[3], s)); /* after the fence */
        CK(ckpt_save_wait(save));
    }
    ckpt_save_free(save);
    CU(cudaStreamSynchronize(s));
    gate_destroy(&g);
    CU(cudaMemcpy(x->d[3], x->h[3], x->bytes[3], cudaMemcpyHostToDevice));
    state_expect_saved(st, 1, x, what);
}

/* Default options but a small pinned_limit: a device state four times the
 * limit.  begin must return while the caller's stream is still gated (no
 * pageable copy, no wait for the stream on the caller's thread), pinned
 * memory stays under the limit, and the data is exact. */
static void larger_than_pinned_limit(void)
{
    const char *what = "state 4x pinned_limit, default options";
    const size_t limit = 64 * MIB;
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, limit);
    size_t sizes[4] = { 64 * MIB, 64 * MIB, 64 * MIB, 64 * MIB };
    state x;
    state_make(&x, 4, sizes, 10);
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    gated_save(st, &x, s, what);
    CHECK(ckpt_store_pinned_bytes(st) <= limit, "%s: pinned bytes %llu over the %zu MiB limit",
          what, (unsigned long long)ckpt_store_pinned_bytes(st), limit / MIB);
    state_expect_restore(st, &x, s, "restore of a state 4x pinned_limit");
    CHECK(ckpt_store_pinned_bytes(st) <= limit,
          "%s: pinned bytes %llu over the %zu MiB limit after a restore", what,
          (unsigned long long)ckpt_store_pinned_bytes(st), limit / MIB);
    ckpt_store_free(st);
    state_free(&x);
    CU(cudaStreamDestroy(s));
    free_root(root);
}

/* host_memory_limit below the device state (the snapshot buffer wraps),
 * pinned_limit above it, in each mode: begin must return while the
 * caller's stream is still gated (the wrap happens on the persist thread,
 * never in begin), and the data is exact. */
static void smaller_host_memory_limit(ckpt_snapshot_mode mode)
{
    char what[96];
    snprintf(what, sizeof what, "host_memory_limit 32 MiB under a 256 MiB state, %s mode",
             mode_name(mode));
    char *root = new_root();
    ckpt_store *st = NULL;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    o.snapshot_mode = mode;
    o.pinned_limit = (uint64_t)1 << 30;
    o.host_memory_limit = 32 * MIB;
    if (ckpt_store_open(&st, root, &o) != CKPT_OK) {
        CHECK(0, "%s: ckpt_store_open: %s", what, ckpt_error_last());
        free_root(root);
        return;
    }
    size_t sizes[4] = { 64 * MIB, 64 * MIB, 64 * MIB, 64 * MIB };
    state x;
    state_make(&x, 4, sizes, 30);
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    gated_save(st, &x, s, what);
    ckpt_store_free(st);
    state_free(&x);
    CU(cudaStreamDestroy(s));
    free_root(root);
}

/* STREAM mode through a 16 MiB pool: tensors of odd sizes, many passes;
 * after wait_snapshot the device buffers are overwritten. */
static void stream_passes(void)
{
    const char *what = "STREAM mode, many passes";
    const size_t pool = 16 * MIB;
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_STREAM, pool);
    size_t sizes[3] = { 100 * MIB + 7, 60 * MIB + 1, 96 * MIB + 4093 };
    state x;
    state_make(&x, 3, sizes, 20);
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* the last write of tensor 1 is still queued on s when the save begins */
    CU(cudaMemset(x.d[1], 0, x.bytes[1]));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpyAsync(x.d[1], x.h[1], x.bytes[1], cudaMemcpyHostToDevice, s));
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save = NULL;
    CK(ckpt_save_begin(&save, st, 1, x.t, 3, &so));
    if (save) {
        CK(ckpt_save_wait_snapshot(save));
        for (int i = 0; i < 3; i++)
            CU(cudaMemsetAsync(x.d[i], 0xEE, x.bytes[i], s));
        CK(ckpt_save_wait(save));
    }
    ckpt_save_free(save);
    CU(cudaStreamSynchronize(s));
    state_expect_saved(st, 1, &x, what);
    CHECK(ckpt_store_pinned_bytes(st) <= pool, "%s: pinned bytes %llu over the %zu MiB pool",
          what, (unsigned long long)ckpt_store_pinned_bytes(st), pool / MIB);
    state_expect_restore(st, &x, s, "restore of a STREAM-mode state");
    ckpt_store_free(st);
    state_free(&x);
    CU(cudaStreamDestroy(s));
    free_root(root);
}

/* DEVICE mode when spare device memory is smaller than the state: the save
 * must still succeed (through host memory) with exact data. */
static void device_fallback(void)
{
    const char *what = "DEVICE mode without spare device memory";
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_DEVICE, 0);
    size_t sizes[2] = { 256 * MIB, 256 * MIB };
    size_t fr = 0, tot = 0, mock_total = 0;
    CU(cudaMemGetInfo(&fr, &tot));
    if (mock_cuda_set_device_memory) { /* the mock: a device 640 MiB larger than in use */
        mock_total = tot;
        mock_cuda_set_device_memory(tot - fr + 640 * MIB);
    }
    state x;
    state_make(&x, 2, sizes, 30);
    /* Take device memory until under 256 MiB (half the state) is left. */
    void *hog[512];
    int nhog = 0;
    CU(cudaMemGetInfo(&fr, &tot));
    size_t piece = (size_t)4 << 30;
    while (fr > 320 * MIB && nhog < 512 && piece >= 16 * MIB) {
        size_t want = fr - 256 * MIB < piece ? fr - 256 * MIB : piece;
        if (cudaMalloc(&hog[nhog], want) != cudaSuccess) {
            (void)cudaGetLastError(); /* our own failed allocation */
            piece /= 2;               /* fragmentation, or a reserve: smaller */
            continue;
        }
        nhog++;
        CU(cudaMemGetInfo(&fr, &tot));
    }
    printf("device fallback: %d allocations leave %zu MiB of %zu MiB free for a %zu MiB "
           "state\n", nhog, fr / MIB, tot / MIB, (sizes[0] + sizes[1]) / MIB);
    CHECK(fr < sizes[0] + sizes[1], "%s: could not fill the device (free %zu MiB)", what,
          fr / MIB);
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save = NULL;
    CK(ckpt_save_begin(&save, st, 1, x.t, 2, &so));
    if (save) {
        CK(ckpt_save_fence(save, s));
        CU(cudaMemsetAsync(x.d[0], 0xEE, x.bytes[0], s));
        CK(ckpt_save_wait(save));
    }
    ckpt_save_free(save);
    CU(cudaStreamSynchronize(s));
    for (int i = 0; i < nhog; i++)
        CU(cudaFree(hog[i]));
    if (mock_total)
        mock_cuda_set_device_memory(mock_total);
    CU(cudaMemcpy(x.d[0], x.h[0], x.bytes[0], cudaMemcpyHostToDevice));
    state_expect_saved(st, 1, &x, what);
    ckpt_store_free(st);
    state_free(&x);
    CU(cudaStreamDestroy(s));
    free_root(root);
}

/* A caller stream in graph capture (global mode, as torch.cuda.graph uses):
 * the save is refused with CKPT_EINVAL, nothing is written, and the
 * caller's capture still ends, instantiates and runs. */
static int graph_capture(unsigned char *ha)
{
    const char *what = "save from a capturing stream";
    if (!cudaStreamBeginCapture || !cudaStreamEndCapture) {
        printf("graph capture: left out (this runtime has no capture API)\n");
        return 0;
    }
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, 0);
    cudaStream_t s;
    void *d;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaMalloc(&d, N));
    CU(cudaMemcpy(d, ha, N, cudaMemcpyHostToDevice));
    ckpt_tensor t = tensor("w", d, CKPT_MEM_DEVICE);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    /* warm-up: the store's streams, events and pinned memory exist */
    CK(ckpt_save_sync(st, 1, &t, 1, &so));

    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaError_t e = cudaMemsetAsync(d, 0x11, N, s);
    ckpt_save *save = NULL;
    int rc = ckpt_save_begin(&save, st, 2, &t, 1, &so);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ckpt_error_last());
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(s, &graph);
    CHECK(e == cudaSuccess, "%s: cudaMemsetAsync under capture: %s", what,
          cudaGetErrorString(e));
    CHECK(rc == CKPT_EINVAL && save == NULL, "%s: got %s (%s), want CKPT_EINVAL", what,
          ckpt_strerror(rc), msg);
    CHECK(rc != CKPT_EINVAL || strlen(msg) > 0, "%s: CKPT_EINVAL without a message", what);
    if (save) { /* not expected: finish it so the test can go on */
        ckpt_save_wait(save);
        ckpt_save_free(save);
    }
    CHECK(end == cudaSuccess && graph != NULL, "%s: the caller's capture failed to end: %s",
          what, cudaGetErrorString(end));
    if (end == cudaSuccess && graph &&
        !(cudaGraphInstantiateWithFlags && cudaGraphLaunch && cudaGraphExecDestroy)) {
        printf("graph capture: the graph was not launched (this runtime cannot)\n");
        if (cudaGraphDestroy)
            CU(cudaGraphDestroy(graph));
    } else if (end == cudaSuccess && graph) {
        cudaGraphExec_t exec = NULL;
        CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
        CU(cudaGraphLaunch(exec, s));
        CU(cudaStreamSynchronize(s));
        unsigned char *want = malloc(N);
        memset(want, 0x11, N);
        expect_device(d, want, N, "the captured graph, launched");
        free(want);
        CU(cudaGraphExecDestroy(exec));
        CU(cudaGraphDestroy(graph));
    } else {
        (void)cudaGetLastError();
    }
    void *data = NULL;
    uint64_t bytes = 0;
    CHECK(ckpt_load(st, 2, "w", &data, &bytes, NULL) != CKPT_OK,
          "%s: step 2 was committed though the save was refused", what);
    ckpt_free(data);
    /* the store still saves once the capture is over */
    CU(cudaMemcpy(d, ha, N, cudaMemcpyHostToDevice));
    CK(ckpt_save_sync(st, 3, &t, 1, &so));
    expect_saved(st, 3, "w", ha, "a save after the capture ended");
    /* a restore onto the capturing stream is refused too, before any copy
     * (they would be recorded into the graph), and the capture survives */
    what = "restore onto a capturing stream";
    CU(cudaMemset(d, 0x22, N));
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    rc = ckpt_restore(st, CKPT_LATEST, &t, 1, &ro, NULL);
    snprintf(msg, sizeof msg, "%s", ckpt_error_last());
    graph = NULL;
    end = cudaStreamEndCapture(s, &graph);
    CHECK(rc == CKPT_EINVAL, "%s: got %s (%s), want CKPT_EINVAL", what, ckpt_strerror(rc),
          msg);
    CHECK(end == cudaSuccess, "%s: the caller's capture failed to end: %s", what,
          cudaGetErrorString(end));
    if (end == cudaSuccess && graph && cudaGraphDestroy)
        CU(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    unsigned char *untouched = malloc(N);
    memset(untouched, 0x22, N);
    expect_device(d, untouched, N, "a buffer after a refused restore");
    free(untouched);
    ckpt_store_free(st);
    CU(cudaFree(d));
    CU(cudaStreamDestroy(s));
    free_root(root);
    return 1;
}

/* The driver's view of device 0's primary context (dlsym'd: the test links
 * only libcudart).  Returns -1 when the driver API cannot be reached. */
/* Managed memory saved and restored on a stream of the device it is used
 * on (its pointer attributes name the device current at allocation). */
static void managed_on_a_stream(unsigned char *ha)
{
    const char *what = "managed memory on a stream";
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, 0);
    void *m;
    cudaStream_t s;
    CU(cudaMallocManaged(&m, N, cudaMemAttachGlobal));
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaMemcpyAsync(m, ha, N, cudaMemcpyDefault, s)); /* queued, not waited for */
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_tensor t = tensor("managed", m, CKPT_MEM_AUTO);
    CK(ckpt_save_sync(st, 1, &t, 1, &so));
    expect_saved(st, 1, "managed", ha, what);
    CU(cudaMemsetAsync(m, 0, N, s));
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    CK(ckpt_restore(st, 1, &t, 1, &ro, NULL));
    CU(cudaStreamSynchronize(s));
    CHECK(memcmp(m, ha, N) == 0, "%s: the restore left other bytes", what);
    ckpt_store_free(st);
    CU(cudaStreamDestroy(s));
    CU(cudaFree(m));
    free_root(root);
}

/* A child forked after CUDA started cannot use it: libckpt says so
 * (CKPT_ENODEVICE naming fork) without calling into CUDA. */
static void forked_child(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = ckpt_cuda_available();
        _exit(rc == CKPT_ENODEVICE && strstr(ckpt_error_last(), "fork()") ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "a forked child was not told that CUDA did not come along (status 0x%x)", status);
}

/* Another thread captures a graph in global mode while this one frees a
 * store holding pinned memory: the capture survives (the store's frees
 * and waits run in relaxed mode) and this thread's mode is given back. */
typedef struct other_capture {
    cudaStream_t s;
    cudaError_t end;
    pthread_barrier_t begun, go;
} other_capture;

static void *capture_elsewhere(void *arg)
{
    other_capture *c = arg;
    c->end = cudaStreamBeginCapture(c->s, cudaStreamCaptureModeGlobal);
    pthread_barrier_wait(&c->begun);
    pthread_barrier_wait(&c->go);
    cudaGraph_t g = NULL;
    if (c->end == cudaSuccess)
        c->end = cudaStreamEndCapture(c->s, &g);
    if (g && cudaGraphDestroy)
        cudaGraphDestroy(g);
    return NULL;
}

static void store_free_beside_a_capture(unsigned char *ha)
{
    if (!cudaStreamBeginCapture || !cudaStreamEndCapture || !cudaThreadExchangeStreamCaptureMode)
        return;
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, 0);
    void *d;
    CU(cudaMalloc(&d, N));
    CU(cudaMemcpy(d, ha, N, cudaMemcpyHostToDevice));
    ckpt_tensor t = tensor("w", d, CKPT_MEM_DEVICE);
    CK(ckpt_save_sync(st, 1, &t, 1, NULL)); /* pinned buffers, streams, events */
    other_capture c;
    memset(&c, 0, sizeof c);
    CU(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    pthread_barrier_init(&c.begun, NULL, 2);
    pthread_barrier_init(&c.go, NULL, 2);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, capture_elsewhere, &c) == 0, "pthread_create");
    pthread_barrier_wait(&c.begun);
    ckpt_store_free(st);
    pthread_barrier_wait(&c.go);
    pthread_join(th, NULL);
    CHECK(c.end == cudaSuccess, "the other thread's capture broke while a store was freed: %s",
          cudaGetErrorString(c.end));
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    CU(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(mode == cudaStreamCaptureModeGlobal, "the freeing thread was left in capture mode %d",
          (int)mode);
    pthread_barrier_destroy(&c.begun);
    pthread_barrier_destroy(&c.go);
    CU(cudaStreamDestroy(c.s));
    CU(cudaFree(d));
    free_root(root);
}

static int primary_ctx_active(int ordinal)
{
    typedef int (*get_fn)(int *, int);
    typedef int (*state_fn)(int, unsigned *, int *);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib)
        return -1;
    get_fn get;
    state_fn st;
    *(void **)(&get) = dlsym(lib, "cuDeviceGet");
    *(void **)(&st) = dlsym(lib, "cuDevicePrimaryCtxGetState");
    int dev = 0, active = -1;
    unsigned flags = 0;
    if (!get || !st || get(&dev, ordinal) != 0 || st(dev, &flags, &active) != 0)
        active = -1;
    dlclose(lib);
    return active;
}

/* Runs in a child forked before any CUDA call: tensors on device 1, the
 * caller's current device 1; device 0 is never touched by the test until
 * the mixed-device check at the end.  Returns the exit status. */
static int multi_gpu_child(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("multi-GPU: skipped (%d device%s)\n", n, n == 1 ? "" : "s");
        return 77;
    }
    CU(cudaSetDevice(1));
    unsigned char *ha;
    CU(cudaHostAlloc((void **)&ha, N, cudaHostAllocDefault));
    fill(ha, N, 40);
    ckpt_snapshot_mode modes[3] = { CKPT_SNAPSHOT_HOST, CKPT_SNAPSHOT_DEVICE,
                                    CKPT_SNAPSHOT_STREAM };
    for (int m = 0; m < 3; m++) {
        char what[80];
        snprintf(what, sizeof what, "device 1 (%s mode)", mode_name(modes[m]));
        char *root = new_root();
        ckpt_store *st = open_store(root, modes[m], 0);
        cudaStream_t s;
        void *d, *r;
        CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CU(cudaMalloc(&d, N));
        CU(cudaMalloc(&r, N));
        CU(cudaMemset(d, 0, N));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpyAsync(d, ha, N, cudaMemcpyHostToDevice, s));
        ckpt_tensor t = tensor("w", d, CKPT_MEM_DEVICE);
        ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
        so.cuda_stream = s;
        ckpt_save *save = NULL;
        CK(ckpt_save_begin(&save, st, 1, &t, 1, &so));
        if (save) {
            CK(ckpt_save_fence(save, s));
            CU(cudaMemsetAsync(d, 0xEE, N, s));
            CK(ckpt_save_wait(save));
        }
        ckpt_save_free(save);
        CU(cudaStreamSynchronize(s));
        expect_saved(st, 1, "w", ha, what);
        int cur = -1;
        CU(cudaGetDevice(&cur));
        CHECK(cur == 1, "%s: the caller's current device is %d after a save", what, cur);

        ckpt_tensor rt = tensor("w", r, CKPT_MEM_AUTO);
        ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
        ro.cuda_stream = s;
        CU(cudaMemset(r, 0, N));
        CU(cudaDeviceSynchronize());
        CK(ckpt_restore(st, CKPT_LATEST, &rt, 1, &ro, NULL));
        CU(cudaStreamSynchronize(s));
        expect_device(r, ha, N, "restore onto device 1, caller's stream");
        CU(cudaMemset(r, 0, N));
        CU(cudaDeviceSynchronize());
        CK(ckpt_restore(st, CKPT_LATEST, &rt, 1, NULL, NULL));
        expect_device(r, ha, N, "restore onto device 1, NULL stream");
        CU(cudaGetDevice(&cur));
        CHECK(cur == 1, "%s: the caller's current device is %d after a restore", what, cur);
        ckpt_store_free(st);
        CU(cudaFree(r));
        CU(cudaFree(d));
        CU(cudaStreamDestroy(s));
        free_root(root);
    }
    int active = primary_ctx_active(0);
    if (active < 0)
        printf("multi-GPU: the driver API is out of reach: device 0's context not checked\n");
    else
        CHECK(active == 0, "libckpt created a context on device 0 though the caller and "
              "every tensor were on device 1");

    /* one save mixing devices 0 and 1 is refused */
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, 0);
    void *d0, *d1;
    CU(cudaSetDevice(0));
    CU(cudaMalloc(&d0, N));
    CU(cudaMemcpy(d0, ha, N, cudaMemcpyHostToDevice));
    CU(cudaSetDevice(1));
    CU(cudaMalloc(&d1, N));
    CU(cudaMemcpy(d1, ha, N, cudaMemcpyHostToDevice));
    ckpt_tensor mixed[2] = { tensor("on0", d0, CKPT_MEM_DEVICE),
                             tensor("on1", d1, CKPT_MEM_DEVICE) };
    ckpt_save *save = NULL;
    int rc = ckpt_save_begin(&save, st, 1, mixed, 2, NULL);
    CHECK(rc == CKPT_EINVAL && save == NULL && strlen(ckpt_error_last()) > 0,
          "a save mixing devices 0 and 1: got %s (%s), want CKPT_EINVAL with a message",
          ckpt_strerror(rc), ckpt_error_last());
    if (save) {
        ckpt_save_wait(save);
        ckpt_save_free(save);
    }
    void *data = NULL;
    uint64_t bytes = 0;
    CHECK(ckpt_load(st, 1, "on1", &data, &bytes, NULL) != CKPT_OK,
          "a refused mixed-device save was committed");
    ckpt_free(data);
    ckpt_store_free(st);
    free_root(root);
    CU(cudaFree(d1));
    CU(cudaSetDevice(0));
    CU(cudaFree(d0));
    CU(cudaFreeHost(ha));
    if (failures) {
        printf("multi-GPU: FAILED %d of %d checks\n", failures, checks);
        return 1;
    }
    printf("multi-GPU: done (%d checks)\n", checks);
    return 0;
}

/* Forks before this process makes any CUDA call (a child of a process that
 * initialised CUDA may not use it). */
static void multi_gpu(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0)
        _exit(multi_gpu_child());
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) {
        perror("waitpid");
        exit(1);
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    CHECK(rc == 0 || rc == 77, "the multi-GPU child failed (status %d)", rc);
}

/* --probe: what the CUDA runtime sees, for tests/gpu/run.sh: exit 0 with
 * one line per device, or 1 naming the runtime's error. */
static int probe(void)
{
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("CUDA driver API %d.%d, runtime %d.%d\n", drv / 1000, drv % 1000 / 10, rt / 1000,
           rt % 1000 / 10);
    if (e != cudaSuccess || n == 0) {
        printf("cudaGetDeviceCount: %s\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp prop;
        e = cudaGetDeviceProperties(&prop, i);
        if (e != cudaSuccess) {
            printf("device %d: cudaGetDeviceProperties: %s\n", i, cudaGetErrorString(e));
            return 1;
        }
        printf("device %d: %s, %.1f GiB, compute %d.%d\n", i, prop.name,
               (double)prop.totalGlobalMem / (double)(1u << 30), prop.major, prop.minor);
    }
    printf("devices: %d\n", n);
    return 0;
}

/* Separate cudaMalloc blocks often sit side by side in the address space:
 * libckpt joins the copies of adjacent chunks, but never across two
 * allocations (one cudaMemcpyAsync may not run from one into the next).
 * Sixteen 2 MiB blocks saved as sixteen device tensors must each load back
 * as written. */
static void separate_allocations(void)
{
    enum { K = 16 };
    const size_t n = (size_t)2 << 20;
    unsigned char *d[K], *want = malloc(n * K);
    int adjacent = 0;
    for (int i = 0; i < K; i++) {
        CU(cudaMalloc((void **)&d[i], n));
        fill(want + (size_t)i * n, n, (unsigned)(40 + i));
        CU(cudaMemcpy(d[i], want + (size_t)i * n, n, cudaMemcpyHostToDevice));
        adjacent += i > 0 && d[i] == d[i - 1] + n;
    }
    char *root = new_root();
    ckpt_store *st = open_store(root, CKPT_SNAPSHOT_HOST, (uint64_t)64 << 20);
    ckpt_tensor t[K];
    char names[K][8];
    int64_t shape[1] = { (int64_t)n };
    for (int i = 0; i < K; i++) {
        snprintf(names[i], sizeof names[i], "a%d", i);
        t[i] = (ckpt_tensor){ names[i], d[i], n, CKPT_U8, 1, shape, CKPT_MEM_DEVICE };
    }
    int rc = ckpt_save_sync(st, 1, t, K, NULL);
    CHECK(rc == CKPT_OK, "separate allocations (%d adjacent pairs): save: %s", adjacent,
          ckpt_error_last());
    for (int i = 0; i < K && rc == CKPT_OK; i++)
        expect_saved_n(st, 1, names[i], want + (size_t)i * n, n, "separate allocations");
    printf("separate allocations: %d of %d pairs adjacent in the address space\n", adjacent,
           K - 1);
    ckpt_store_free(st);
    free_root(root);
    for (int i = 0; i < K; i++)
        CU(cudaFree(d[i]));
    free(want);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "--probe") == 0)
        return probe();
    const char *required = getenv("CKPT_GPU_REQUIRED");
    int require = required && *required && strcmp(required, "0") != 0;
    multi_gpu(); /* first: it forks, which CUDA allows only before any call */
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0";
        if (require) {
            printf("FAIL: a GPU is visible but the CUDA runtime cannot use it (%s)\n", why);
            return 1;
        }
        printf("SKIP: no CUDA device (%s)\n", why);
        return 77;
    }
    int rc = ckpt_cuda_available();
    CHECK(rc == CKPT_OK, "ckpt_cuda_available: %s", ckpt_error_last());

    unsigned char *ha, *hb;
    CU(cudaHostAlloc((void **)&ha, N, cudaHostAllocDefault));
    CU(cudaHostAlloc((void **)&hb, N, cudaHostAllocDefault));
    fill(ha, N, 1);
    fill(hb, N, 2);

    ckpt_snapshot_mode modes[3] = { CKPT_SNAPSHOT_HOST, CKPT_SNAPSHOT_DEVICE,
                                    CKPT_SNAPSHOT_STREAM };
    for (int i = 0; i < 3; i++) {
        fence_ordering(modes[i], ha, hb);
        printf("gated fence ordering, wait_snapshot, restore (stream and NULL): %s mode "
               "done\n", mode_name(modes[i]));
    }
    auto_classification(ha);
    printf("AUTO classification, GPU name in manifest: done\n");
    pinned_cap(ha);
    printf("pinned cap: done\n");
    larger_than_pinned_limit();
    printf("default options, state 4x pinned_limit: done\n");
    stream_passes();
    printf("STREAM mode in passes: done\n");
    device_fallback();
    printf("DEVICE mode falling back to host memory: done\n");
    for (int i = 0; i < 3; i++)
        smaller_host_memory_limit(modes[i]);
    printf("host_memory_limit below the state, each mode: done\n");
    separate_allocations();
    printf("separate allocations side by side: done\n");
    if (graph_capture(ha))
        printf("graph capture: done\n");
    managed_on_a_stream(ha);
    printf("managed memory on a stream: done\n");
    forked_child();
    printf("forked child told CUDA did not come along: done\n");
    store_free_beside_a_capture(ha);
    printf("store freed beside another thread's capture: done\n");

    CU(cudaFreeHost(ha));
    CU(cudaFreeHost(hb));
    if (failures) {
        printf("FAILED: %d of %d checks\n", failures, checks);
        return 1;
    }
    printf("PASS: %d checks\n", checks);
    return 0;
}

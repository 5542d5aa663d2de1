/* Device tensors on a real GPU, through the public API.
 *
 * Prints "SKIP: no CUDA device (...)" and exits 77 (meson's skip) where the
 * CUDA runtime reports no device.  Checks, in each snapshot mode:
 *   - the checkpoint holds exactly what the caller's stream had produced
 *     when the save began, though that work was still running;
 *   - a write enqueued after ckpt_save_fence() never reaches it;
 *   - after ckpt_save_wait_snapshot() the CPU may overwrite the buffer;
 *   - restore into device buffers (H2D on the caller's stream);
 *   - AUTO tells device, managed, pinned and pageable memory apart;
 *   - pinned memory is reported and capped; the manifest names the GPU.
 * Uses only cudaMemcpyAsync/cudaMemsetAsync, so it builds with a C compiler
 * against libcudart (tests/gpu/meson.build). */
#include <cuda_runtime_api.h>

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"

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
static size_t BUSY = 1024 * MIB; /* memset target that keeps a stream busy
                                    ($CKPT_TEST_BUSY_MIB) */

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

/* Compare tensor `name` of `step` with `want` (host). */
static void expect_saved(ckpt_store *st, int64_t step, const char *name,
                         const unsigned char *want, const char *what)
{
    void *data = NULL;
    uint64_t bytes = 0;
    int rc = ckpt_load(st, step, name, &data, &bytes, NULL);
    CHECK(rc == CKPT_OK, "%s: ckpt_load: %s", what, ckpt_error_last());
    if (rc == CKPT_OK)
        CHECK(bytes == N && memcmp(data, want, N) == 0,
              "%s: the checkpoint does not hold the state the stream had produced", what);
    ckpt_free(data);
}

static const char *mode_name(ckpt_snapshot_mode m)
{
    return m == CKPT_SNAPSHOT_HOST ? "host" : m == CKPT_SNAPSHOT_DEVICE ? "device" : "stream";
}

/* Stream s: busy work, then A is written; save; fence; B is written. */
static void fence_ordering(ckpt_snapshot_mode mode, unsigned char *ha, unsigned char *hb,
                           void *busy)
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
    for (int i = 0; i < 64; i++) /* tens of ms of work the save must wait for */
        CU(cudaMemsetAsync(busy, i, BUSY, s));
    CU(cudaMemcpyAsync(d, ha, N, cudaMemcpyHostToDevice, s));
    ckpt_tensor t = tensor("w", d, CKPT_MEM_DEVICE);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save = NULL;
    CK(ckpt_save_begin(&save, st, 1, &t, 1, &so));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady,
          "%s: ckpt_save_begin blocked the CPU until the caller's stream was idle", what);
    CK(ckpt_save_fence(save, s));
    CU(cudaMemcpyAsync(d, hb, N, cudaMemcpyHostToDevice, s));
    CK(ckpt_save_wait(save));
    ckpt_save_free(save);
    CU(cudaStreamSynchronize(s));
    expect_saved(st, 1, "w", ha, what);

    /* wait_snapshot, then overwrite from the CPU side */
    CU(cudaMemcpy(d, ha, N, cudaMemcpyHostToDevice));
    CK(ckpt_save_begin(&save, st, 2, &t, 1, NULL));
    CK(ckpt_save_wait_snapshot(save));
    CU(cudaMemset(d, 0xEE, N));
    CK(ckpt_save_wait(save));
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
    unsigned char *back = malloc(N);
    CU(cudaMemcpy(back, r, N, cudaMemcpyDeviceToHost));
    CHECK(memcmp(back, ha, N) == 0, "restore into device memory (%s mode) differs",
          mode_name(mode));
    free(back);
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

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        return 77;
    }
    const char *busy_mib = getenv("CKPT_TEST_BUSY_MIB");
    if (busy_mib && atoi(busy_mib) > 0)
        BUSY = (size_t)atoi(busy_mib) * MIB;
    int rc = ckpt_cuda_available();
    CHECK(rc == CKPT_OK, "ckpt_cuda_available: %s", ckpt_error_last());

    unsigned char *ha, *hb;
    void *busy;
    CU(cudaHostAlloc((void **)&ha, N, cudaHostAllocDefault));
    CU(cudaHostAlloc((void **)&hb, N, cudaHostAllocDefault));
    CU(cudaMalloc(&busy, BUSY));
    fill(ha, N, 1);
    fill(hb, N, 2);

    ckpt_snapshot_mode modes[3] = { CKPT_SNAPSHOT_HOST, CKPT_SNAPSHOT_DEVICE,
                                    CKPT_SNAPSHOT_STREAM };
    for (int i = 0; i < 3; i++) {
        fence_ordering(modes[i], ha, hb, busy);
        printf("fence ordering, wait_snapshot, restore: %s mode done\n", mode_name(modes[i]));
    }
    auto_classification(ha);
    printf("AUTO classification, GPU name in manifest: done\n");
    pinned_cap(ha);
    printf("pinned cap: done\n");

    CU(cudaFree(busy));
    CU(cudaFreeHost(ha));
    CU(cudaFreeHost(hb));
    if (failures) {
        printf("FAILED: %d of %d checks\n", failures, checks);
        return 1;
    }
    printf("PASS: %d checks\n", checks);
    return 0;
}

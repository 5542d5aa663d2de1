/* bench_gpu: libckpt on device buffers, as ratios to baselines measured
 * with plain CUDA copies (or libckpt's host path) in the same run.
 *
 * For each size S (GiB of device buffers, default 1 and 4):
 *   baselines   pinned D2H, pinned H2D and D2D copies of S bytes, timed on
 *               the GPU with events
 *   per mode    (host, device, stream) one warm-up save, then a measured one:
 *     begin     caller-thread time in ckpt_save_begin per GiB (target < 1 ms)
 *     fence     GPU time the training stream waits at ckpt_save_fence: the
 *               stream is held by a host function until begin and fence are
 *               queued, then events before and after the fence time the
 *               wait; over the plain pinned D2H copy (host mode, target
 *               <= 1.2) or the D2D copy (device mode, target <= 1.2).  Stream
 *               mode with a state over its pool fences from the CPU (the
 *               passes are queued by a thread), so it is timed without the
 *               hold and reported, no target.
 *     stall     ckpt_save_begin + ckpt_save_wait_snapshot, CPU wall time
 *     save      S / (begin .. committed), as a ratio to the D2H bandwidth
 *     cpu       CPU time of every thread but the caller's (libckpt's pool and
 *               persist threads, and the CUDA runtime's) from begin to
 *               committed (getrusage RUSAGE_SELF minus RUSAGE_THREAD), in
 *               core-seconds per GiB and as busy cores; and the caller's own
 *               CPU time while blocked in wait_snapshot over its wall time
 *               (near 0 when waits block, near 1 when they spin)
 *   restore     into device buffers, page cache warm, every chunk verified,
 *               over the bound read + decompress + H2D: the same restore
 *               into host buffers plus one pinned H2D copy (target <= 1.2);
 *               also over pinned H2D bandwidth alone
 * Then once:
 *   --big G     begin time of a HOST-mode save of G GiB with the default
 *               pinned_limit (bounded pinned passes), per GiB (run.sh: 16)
 *   --many N    begin time of a save of N tensors of 64 KiB (run.sh: 10000)
 *
 * Usage: bench_gpu [--sizes 1,4] [--modes host,device,stream] [--dir DIR]
 *                  [--big GIB] [--many N] [--fsync] [--verify none|quick|full]
 *                  [--threads N] [--chunk-mib N] [--json FILE] [--enforce]
 * --big and --many default to 0, which leaves those parts out.  Defaults: fsync off and quick
 * verification after each save, so that the numbers are the pipeline's and
 * not the disk's; DIR defaults to /dev/shm when it has room, else $TMPDIR.
 * Exits 77 with "SKIP: no CUDA device" without a GPU (1 instead with
 * CKPT_GPU_REQUIRED=1).  Sizes that do not fit in free device or host
 * memory are skipped with a message.  Exit status 1 when a save or restore
 * fails, restores wrong data or begin waits for the training stream; with
 * --enforce, 3 when a target is missed.
 */
#include <cuda_runtime_api.h>

#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

/* Weak: the mock runtime of tests/cuda (which also runs this source) may
 * lack it; CPU wall time around a synchronize stands in for it there. */
extern __typeof__(cudaEventElapsedTime) cudaEventElapsedTime __attribute__((weak));

#define GIB ((uint64_t)1 << 30)
#define MIB ((uint64_t)1 << 20)
#define PATTERN (64 * MIB)
#define HOLD_LIMIT_S 30 /* a hold nobody releases: begin waited for the stream */

#define CU(call)                                                                \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "bench_gpu: %s: %s\n", #call, cudaGetErrorString(e_)); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

typedef struct options {
    double sizes[8];
    int nsizes;
    int modes[3];
    int nmodes;
    const char *dir;
    int fsync;
    ckpt_verify_level verify;
    int threads;
    uint64_t chunk;
    const char *json;
    int enforce;
    double big;  /* GiB for the begin-only run; 0: none */
    int many;    /* tensors for the many-tensor run; 0: none */
} options;

static int g_errors; /* failed saves or restores, wrong data: exit status 1 */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static const char *mode_name(int m)
{
    return m == CKPT_SNAPSHOT_HOST ? "host" : m == CKPT_SNAPSHOT_DEVICE ? "device" : "stream";
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

/* The run's directory, removed at exit however the run ends: CU() exits on
 * the first CUDA error, which would otherwise leave it (in /dev/shm, in
 * memory) behind. */
static char g_base[4096];

static void remove_base(void)
{
    if (g_base[0])
        nftw(g_base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static uint64_t free_bytes(const char *dir)
{
    struct statvfs v;
    if (statvfs(dir, &v) != 0)
        return 0;
    return (uint64_t)v.f_bavail * v.f_frsize;
}

static uint64_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* Float32 weights with full mantissas (zstd gains little, as on real ones). */
static void fill_pattern(float *w, size_t n)
{
    uint64_t x = 0x243F6A8885A308D3ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w[i] = (float)((int64_t)(x >> 11) - (1ll << 52)) * (0.02f / (float)(1ll << 52));
    }
}

/* A host function that holds a stream until hold_release() (or, as a
 * deadlock breaker, HOLD_LIMIT_S). */
typedef struct hold {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int released, broke; /* mu */
} hold;

static void hold_fn(void *arg) /* CUDA runtime thread: no CUDA calls */
{
    hold *h = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += HOLD_LIMIT_S;
    pthread_mutex_lock(&h->mu);
    while (!h->released)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT)
            h->released = h->broke = 1;
    pthread_mutex_unlock(&h->mu);
}

static void hold_start(hold *h, cudaStream_t s)
{
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->released = h->broke = 0;
    CU(cudaLaunchHostFunc(s, hold_fn, h));
}

static int hold_release(hold *h) /* 1: it had been broken open */
{
    pthread_mutex_lock(&h->mu);
    int broke = h->broke;
    h->released = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return broke;
}

static void hold_destroy(hold *h) /* after the stream is synchronized */
{
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

/* GPU time of one cudaMemcpyAsync of n bytes (after a warm-up of 256 MiB). */
static double time_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t s)
{
    size_t warm = n < 256 * MIB ? n : 256 * MIB;
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    CU(cudaMemcpyAsync(dst, src, warm, kind, s));
    CU(cudaStreamSynchronize(s));
    CU(cudaEventRecord(a, s));
    double t0 = now();
    CU(cudaMemcpyAsync(dst, src, n, kind, s));
    CU(cudaEventRecord(b, s));
    CU(cudaEventSynchronize(b));
    float ms = (float)((now() - t0) * 1e3);
    if (cudaEventElapsedTime)
        CU(cudaEventElapsedTime(&ms, a, b));
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return ms * 1e-3;
}

static int parse(int argc, char **argv, options *o)
{
    o->nsizes = 2;
    o->sizes[0] = 1;
    o->sizes[1] = 4;
    o->nmodes = 3;
    o->modes[0] = CKPT_SNAPSHOT_HOST;
    o->modes[1] = CKPT_SNAPSHOT_DEVICE;
    o->modes[2] = CKPT_SNAPSHOT_STREAM;
    o->verify = CKPT_VERIFY_QUICK;
    o->big = 0;
    o->many = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--fsync")) {
            o->fsync = 1;
            continue;
        }
        if (!strcmp(a, "--enforce")) {
            o->enforce = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_gpu: %s needs a value (see the header of bench_gpu.c)\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--sizes")) {
            o->nsizes = 0;
            char *copy = strdup(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t && o->nsizes < 8;
                 t = strtok_r(NULL, ",", &save))
                o->sizes[o->nsizes++] = atof(t);
            free(copy);
        } else if (!strcmp(a, "--modes")) {
            o->nmodes = 0;
            if (strstr(v, "host"))
                o->modes[o->nmodes++] = CKPT_SNAPSHOT_HOST;
            if (strstr(v, "device"))
                o->modes[o->nmodes++] = CKPT_SNAPSHOT_DEVICE;
            if (strstr(v, "stream"))
                o->modes[o->nmodes++] = CKPT_SNAPSHOT_STREAM;
        } else if (!strcmp(a, "--dir")) {
            o->dir = v;
        } else if (!strcmp(a, "--verify")) {
            o->verify = !strcmp(v, "none") ? CKPT_VERIFY_NONE
                      : !strcmp(v, "full") ? CKPT_VERIFY_FULL : CKPT_VERIFY_QUICK;
        } else if (!strcmp(a, "--threads")) {
            o->threads = atoi(v);
        } else if (!strcmp(a, "--chunk-mib")) {
            o->chunk = (uint64_t)atoi(v) * MIB;
        } else if (!strcmp(a, "--json")) {
            o->json = v;
        } else if (!strcmp(a, "--big")) {
            o->big = atof(v);
        } else if (!strcmp(a, "--many")) {
            o->many = atoi(v);
        } else {
            fprintf(stderr, "bench_gpu: unknown option %s\n", a);
            return -1;
        }
    }
    return 0;
}

typedef struct result {
    double gib;
    double d2h, h2d, d2d;               /* baseline copy times, seconds; d2d 0 if
                                           not measured */
    int done[3];                        /* per mode index */
    double begin[3], stall[3], save[3]; /* seconds, CPU wall */
    double fence[3];                    /* GPU wait at the fence, seconds */
    int held[3];                        /* fence timed with the stream held */
    double cpu_other[3];                /* core-seconds, other threads */
    double wait_spin[3];                /* caller CPU / wall in wait_snapshot */
    double restore, restore_host;       /* seconds; 0 if not measured */
} result;

static ckpt_store *open_store(const char *dir, const options *o, int mode, uint64_t bytes)
{
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    so.fsync = o->fsync;
    so.keep_last = 1;
    so.threads = o->threads;
    so.chunk_bytes = o->chunk;
    so.verify_after_save = o->verify;
    so.snapshot_mode = (ckpt_snapshot_mode)mode;
    /* Room for the whole state pinned (host and device mode), so that no
     * pass hides the copy engine's speed; stream mode keeps the default
     * bounded pool.  bytes 0: the defaults (the --big run). */
    if (bytes) {
        so.host_memory_limit = bytes + 64 * MIB;
        if (mode != CKPT_SNAPSHOT_STREAM)
            so.pinned_limit = bytes + 512 * MIB; /* + the restore staging */
    }
    ckpt_store *st = NULL;
    if (ckpt_store_open(&st, dir, &so) != CKPT_OK) {
        fprintf(stderr, "bench_gpu: ckpt_store_open %s: %s\n", dir, ckpt_error_last());
        exit(1);
    }
    return st;
}

/* Tensors of at most `each` bytes, like a model's parameters. */
static size_t make_tensors(void *d, uint64_t bytes, uint64_t each, ckpt_tensor *t,
                           int64_t *shapes, char (*names)[32], size_t max)
{
    size_t n = 0;
    for (uint64_t off = 0; off < bytes && n < max; n++) {
        uint64_t len = bytes - off < each ? bytes - off : each;
        snprintf(names[n], 32, "layer%zu.w", n);
        shapes[n] = (int64_t)(len / 4);
        t[n] = (ckpt_tensor){ names[n], (char *)d + off, len, CKPT_F32, 1, &shapes[n],
                              CKPT_MEM_DEVICE };
        off += len;
    }
    return n;
}

/* One measured save in `mode` (after a warm-up one). */
static void measure_save(ckpt_store *st, int mode, const ckpt_tensor *t, size_t nt,
                         cudaStream_t s, result *r)
{
    ckpt_save_options sopt = CKPT_SAVE_OPTIONS_INIT;
    sopt.cuda_stream = s;
    int rc = ckpt_save_sync(st, 0, t, nt, &sopt); /* warm-up: buffers allocated */
    if (rc != CKPT_OK) {
        printf("  %-6s warm-up save failed: %s: %s\n", mode_name(mode), ckpt_strerror(rc),
               ckpt_error_last());
        g_errors++;
        return;
    }
    /* Stream mode over its pool queues passes from a thread and fences from
     * the CPU: holding the stream would hold the fence too. */
    int held = mode != CKPT_SNAPSHOT_STREAM;
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    hold h;
    if (held)
        hold_start(&h, s);
    CU(cudaEventRecord(e0, s));
    ckpt_save *sv = NULL;
    double c0 = cpu_s(RUSAGE_SELF), m0 = cpu_s(RUSAGE_THREAD);
    double t0 = now(), t1, t2, t3, w0 = 0, w1 = 0;
    rc = ckpt_save_begin(&sv, st, 1, t, nt, &sopt);
    t1 = now();
    if (rc == CKPT_OK)
        rc = ckpt_save_fence(sv, s);
    CU(cudaEventRecord(e1, s));
    if (held && hold_release(&h)) {
        printf("  %-6s ckpt_save_begin waited for the training stream (held %d s)\n",
               mode_name(mode), HOLD_LIMIT_S);
        g_errors++;
    }
    w0 = cpu_s(RUSAGE_THREAD);
    double tw = now();
    if (rc == CKPT_OK)
        rc = ckpt_save_wait_snapshot(sv);
    t2 = now();
    w1 = cpu_s(RUSAGE_THREAD);
    if (rc == CKPT_OK)
        rc = ckpt_save_wait(sv);
    t3 = now();
    double c1 = cpu_s(RUSAGE_SELF), m1 = cpu_s(RUSAGE_THREAD);
    ckpt_save_free(sv);
    CU(cudaStreamSynchronize(s));
    if (held)
        hold_destroy(&h);
    float fence_ms = -1e3f; /* -1 s: not measured (no cudaEventElapsedTime) */
    if (cudaEventElapsedTime)
        CU(cudaEventElapsedTime(&fence_ms, e0, e1));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    if (rc != CKPT_OK) {
        printf("  %-6s save failed: %s: %s\n", mode_name(mode), ckpt_strerror(rc),
               ckpt_error_last());
        g_errors++;
        return;
    }
    r->done[mode] = 1;
    r->begin[mode] = t1 - t0;
    r->stall[mode] = t2 - t0;
    r->save[mode] = t3 - t0;
    r->fence[mode] = fence_ms * 1e-3;
    r->held[mode] = held;
    r->cpu_other[mode] = (c1 - c0) - (m1 - m0);
    r->wait_spin[mode] = t2 - tw > 1e-3 ? (w1 - w0) / (t2 - tw) : 0;
    double base = mode == CKPT_SNAPSHOT_DEVICE && r->d2d > 0 ? r->d2d : r->d2h;
    char fence[96] = "fence not measured (no cudaEventElapsedTime)";
    if (r->fence[mode] >= 0)
        snprintf(fence, sizeof fence, "fence %.1f ms = %.2fx %s copy%s", r->fence[mode] * 1e3,
                 r->fence[mode] / base, base == r->d2d ? "D2D" : "D2H",
                 held ? "" : " (not held)");
    printf("  %-6s begin %.2f ms/GiB; %s; stall %.1f ms; save %.2fx D2H; other threads "
           "%.2f core-s/GiB (%.1f cores); caller CPU in wait_snapshot %.2f of wall; pinned "
           "%.2f GiB\n", mode_name(mode), r->begin[mode] * 1e3 / r->gib, fence,
           r->stall[mode] * 1e3, r->d2h / r->save[mode], r->cpu_other[mode] / r->gib,
           r->cpu_other[mode] / r->save[mode], r->wait_spin[mode],
           (double)ckpt_store_pinned_bytes(st) / GIB);
}

/* Restore into the device tensors, then into host buffers (the bound). */
static void measure_restore(ckpt_store *st, ckpt_tensor *t, size_t nt, void *d, uint64_t bytes,
                            cudaStream_t s, const float *pattern_h, result *r)
{
    CU(cudaMemsetAsync(d, 0, bytes, s));
    CU(cudaStreamSynchronize(s));
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    double t0 = now();
    int rc = ckpt_restore(st, CKPT_LATEST, t, nt, &ro, NULL);
    CU(cudaStreamSynchronize(s));
    double t1 = now();
    if (rc != CKPT_OK) {
        printf("  restore failed: %s: %s\n", ckpt_strerror(rc), ckpt_error_last());
        g_errors++;
        return;
    }
    float *check = malloc(PATTERN);
    CU(cudaMemcpy(check, (char *)d + bytes - PATTERN, PATTERN, cudaMemcpyDeviceToHost));
    int same = memcmp(check, pattern_h, PATTERN) == 0;
    free(check);
    if (!same) {
        printf("  restore: WRONG DATA\n");
        g_errors++;
        return;
    }
    r->restore = t1 - t0;

    char *host = malloc(bytes);
    if (!host) {
        printf("  restore bound: no host memory for %.1f GiB\n", r->gib);
        return;
    }
    memset(host, 0, bytes); /* fault the pages in before timing */
    ckpt_tensor *ht = malloc(nt * sizeof *ht);
    for (size_t i = 0; i < nt; i++) {
        ht[i] = t[i];
        ht[i].data = host + ((char *)t[i].data - (char *)d);
        ht[i].memory = CKPT_MEM_HOST;
    }
    t0 = now();
    rc = ckpt_restore(st, CKPT_LATEST, ht, nt, NULL, NULL);
    t1 = now();
    if (rc != CKPT_OK) {
        printf("  restore into host memory failed: %s: %s\n", ckpt_strerror(rc),
               ckpt_error_last());
        g_errors++;
    } else {
        r->restore_host = t1 - t0;
    }
    free(ht);
    free(host);
    if (r->restore_host > 0)
        printf("  restore %.2f GB/s = %.2fx (restore to host %.0f ms + pinned H2D %.0f ms); "
               "%.2fx pinned H2D bandwidth (every chunk verified)\n",
               (double)bytes / r->restore / 1e9, r->restore / (r->restore_host + r->h2d),
               r->restore_host * 1e3, r->h2d * 1e3, r->h2d / r->restore);
}

static int run_size(const options *o, const char *base, double gib, cudaStream_t s,
                    const float *pattern_h, result *r)
{
    uint64_t bytes = (uint64_t)(gib * (double)GIB) / PATTERN * PATTERN;
    if (bytes == 0)
        bytes = PATTERN;
    memset(r, 0, sizeof *r);
    r->gib = (double)bytes / (double)GIB;
    size_t dfree = 0, dtotal = 0;
    CU(cudaMemGetInfo(&dfree, &dtotal));
    if (dfree < bytes + 512 * MIB || host_available() < 3 * bytes + 2 * GIB) {
        printf("%g GiB: skipped (device free %.1f GiB, host available %.1f GiB)\n", gib,
               (double)dfree / GIB, (double)host_available() / GIB);
        return 0;
    }
    void *d, *h;
    CU(cudaMalloc(&d, bytes));
    for (uint64_t off = 0; off < bytes; off += PATTERN)
        CU(cudaMemcpyAsync((char *)d + off, pattern_h, PATTERN, cudaMemcpyHostToDevice, s));
    CU(cudaStreamSynchronize(s));

    /* baselines */
    CU(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
    r->d2h = time_copy(h, d, bytes, cudaMemcpyDeviceToHost, s);
    r->h2d = time_copy(d, h, bytes, cudaMemcpyHostToDevice, s);
    CU(cudaFreeHost(h));
    CU(cudaMemGetInfo(&dfree, &dtotal));
    void *d2 = NULL;
    if (dfree > bytes + 512 * MIB && cudaMalloc(&d2, bytes) == cudaSuccess) {
        r->d2d = time_copy(d2, d, bytes, cudaMemcpyDeviceToDevice, s);
        CU(cudaFree(d2));
    }
    printf("%g GiB: pinned D2H %.1f GB/s, pinned H2D %.1f GB/s, D2D %.1f GB/s\n", r->gib,
           (double)bytes / r->d2h / 1e9, (double)bytes / r->h2d / 1e9,
           r->d2d > 0 ? (double)bytes / r->d2d / 1e9 : 0.0);

    ckpt_tensor t[64];
    int64_t shapes[64];
    char names[64][32];
    size_t nt = make_tensors(d, bytes, GIB, t, shapes, names, 64);
    for (int mi = 0; mi < o->nmodes; mi++) {
        int mode = o->modes[mi];
        char dir[4200];
        snprintf(dir, sizeof dir, "%.4000s/%s-%gg", base, mode_name(mode), gib);
        ckpt_store *st = open_store(dir, o, mode, bytes);
        measure_save(st, mode, t, nt, s, r);
        if (r->done[mode] && mode == o->modes[0])
            measure_restore(st, t, nt, d, bytes, s, pattern_h, r);
        ckpt_store_free(st);
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    CU(cudaFree(d));
    return 1;
}

/* Caller-thread time in begin for `n` tensors of `each` bytes (HOST mode,
 * default options but fsync and verification); 0 when skipped. */
static double begin_only(const options *o, const char *base, const char *label, uint64_t n,
                         uint64_t each, cudaStream_t s, const float *pattern_h,
                         double *save_s)
{
    uint64_t bytes = n * each;
    size_t dfree = 0, dtotal = 0;
    CU(cudaMemGetInfo(&dfree, &dtotal));
    if (dfree < bytes + 512 * MIB || host_available() < bytes + 4 * GIB ||
        free_bytes(base) < 2 * bytes + 2 * GIB) { /* two steps while the second commits */
        printf("%s: skipped (device free %.1f GiB, host available %.1f GiB, %.1f GiB free "
               "in %s)\n", label, (double)dfree / GIB, (double)host_available() / GIB,
               (double)free_bytes(base) / GIB, base);
        return 0;
    }
    void *d;
    CU(cudaMalloc(&d, bytes));
    for (uint64_t off = 0; off < bytes; off += PATTERN)
        CU(cudaMemcpyAsync((char *)d + off, pattern_h,
                           bytes - off < PATTERN ? bytes - off : PATTERN,
                           cudaMemcpyHostToDevice, s));
    CU(cudaStreamSynchronize(s));
    ckpt_tensor *t = malloc(n * sizeof *t);
    int64_t *shapes = malloc(n * sizeof *shapes);
    char(*names)[32] = malloc(n * sizeof *names);
    size_t nt = make_tensors(d, bytes, each, t, shapes, names, (size_t)n);
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s/%s", base, label);
    options oo = *o;
    oo.verify = CKPT_VERIFY_NONE;
    oo.chunk = 0;
    ckpt_store *st = open_store(dir, &oo, CKPT_SNAPSHOT_HOST, 0);
    ckpt_save_options sopt = CKPT_SAVE_OPTIONS_INIT;
    sopt.cuda_stream = s;
    /* warm-up: the arena and pinned buffers exist, as in a training loop */
    size_t warm = nt;
    double begin = 0;
    int rc = ckpt_save_sync(st, 0, t, warm, &sopt);
    ckpt_save *sv = NULL;
    double t0 = now(), t1 = t0, t2 = t0;
    if (rc == CKPT_OK) {
        rc = ckpt_save_begin(&sv, st, 1, t, nt, &sopt);
        t1 = now();
    }
    if (rc == CKPT_OK)
        rc = ckpt_save_fence(sv, s);
    if (rc == CKPT_OK)
        rc = ckpt_save_wait(sv);
    t2 = now();
    ckpt_save_free(sv);
    CU(cudaStreamSynchronize(s));
    if (rc != CKPT_OK) {
        printf("%s: save failed: %s: %s\n", label, ckpt_strerror(rc), ckpt_error_last());
        g_errors++;
    } else {
        begin = t1 - t0;
        *save_s = t2 - t0;
        printf("%s: begin %.1f ms (%.2f ms/GiB, %.1f us/tensor), whole save %.2f s, pinned "
               "%.2f GiB\n", label, begin * 1e3, begin * 1e3 / ((double)bytes / GIB),
               begin * 1e6 / (double)nt, *save_s, (double)ckpt_store_pinned_bytes(st) / GIB);
    }
    ckpt_store_free(st);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(t);
    free(shapes);
    free(names);
    CU(cudaFree(d));
    return begin;
}

int main(int argc, char **argv)
{
    options o;
    memset(&o, 0, sizeof o);
    if (parse(argc, argv, &o) != 0)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0";
        const char *req = getenv("CKPT_GPU_REQUIRED");
        if (req && *req && strcmp(req, "0") != 0) {
            printf("bench_gpu: FAIL: a GPU is visible but the CUDA runtime cannot use it "
                   "(%s)\n", why);
            return 1;
        }
        printf("SKIP: no CUDA device (%s)\n", why);
        return 77;
    }
    double biggest = o.big;
    for (int i = 0; i < o.nsizes; i++)
        biggest = o.sizes[i] > biggest ? o.sizes[i] : biggest;
    char *base = g_base;
    const char *parent = o.dir;
    if (!parent)
        parent = free_bytes("/dev/shm") > (uint64_t)(2.5 * biggest * (double)GIB) + 4 * GIB
                 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(base, sizeof g_base, "%s/ckpt-bench-gpu.XXXXXX", parent);
    if (!mkdtemp(base)) {
        perror(base);
        base[0] = '\0';
        return 1;
    }
    atexit(remove_base);
    struct cudaDeviceProp prop;
    int dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("bench_gpu: %s, driver %d.%d, runtime %d.%d, libckpt %s, %ld CPUs; checkpoints "
           "in %s (fsync %s, verify %s)\n", prop.name, drv / 1000, drv % 1000 / 10, rt / 1000,
           rt % 1000 / 10, ckpt_version_string(), sysconf(_SC_NPROCESSORS_ONLN), base,
           o.fsync ? "on" : "off",
           o.verify == CKPT_VERIFY_NONE ? "none" : o.verify == CKPT_VERIFY_FULL ? "full"
                                                                                : "quick");
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *pattern_h;
    CU(cudaHostAlloc((void **)&pattern_h, PATTERN, cudaHostAllocDefault));
    fill_pattern(pattern_h, PATTERN / 4);

    result res[8];
    int nres = 0;
    for (int i = 0; i < o.nsizes; i++)
        if (run_size(&o, base, o.sizes[i], s, pattern_h, &res[nres]))
            nres++;
    double big_begin = 0, big_save = 0, many_begin = 0, many_save = 0;
    char label[64];
    uint64_t big_bytes = (uint64_t)(o.big * (double)GIB) / PATTERN * PATTERN;
    if (big_bytes) {
        snprintf(label, sizeof label, "big-%ggib", o.big);
        big_begin = begin_only(&o, base, label, big_bytes / GIB ? big_bytes / GIB : 1,
                               big_bytes / GIB ? GIB : big_bytes, s, pattern_h, &big_save);
    }
    if (o.many > 0) {
        snprintf(label, sizeof label, "many-%d", o.many);
        many_begin = begin_only(&o, base, label, (uint64_t)o.many, 64 * 1024, s, pattern_h,
                                &many_save);
    }

    /* Targets (issue 10): begin < 1 ms/GiB; fence wait <= 1.2x the plain
     * copy (D2H for host mode, D2D for device mode); restore <= 1.2x the
     * read + decompress + H2D bound. */
    printf("\nsummary (ratios; targets: begin < 1 ms/GiB, host fence/D2H <= 1.2, device "
           "fence/D2D <= 1.2, restore/bound <= 1.2)\n");
    printf("%6s %9s %9s %9s %10s %12s %12s %9s %13s %11s %8s\n", "GiB", "begin/GiB",
           "(device)", "(stream)", "fence/D2H", "fence/D2D", "stream fence", "save/D2H",
           "restore/bound", "core-s/GiB", "targets");
    FILE *js = o.json ? fopen(o.json, "w") : NULL;
    if (js)
        fprintf(js, "{\"gpu\":\"%s\",\"driver\":%d,\"runtime\":%d,\"results\":[", prop.name,
                drv, rt);
    int missed = 0;
    for (int i = 0; i < nres; i++) {
        result *r = &res[i];
        double b[3], f[3];
        for (int m = 0; m < 3; m++) {
            b[m] = r->done[m] ? r->begin[m] * 1e3 / r->gib : -1;
            f[m] = -1;
        }
        if (r->done[0] && r->fence[0] >= 0)
            f[0] = r->fence[0] / r->d2h;
        if (r->done[1] && r->fence[1] >= 0 && r->d2d > 0)
            f[1] = r->fence[1] / r->d2d;
        if (r->done[2] && r->fence[2] >= 0)
            f[2] = r->fence[2] / r->d2h;
        double sv = r->done[0] ? r->d2h / r->save[0] : -1;
        double rb = r->restore > 0 && r->restore_host > 0
                    ? r->restore / (r->restore_host + r->h2d) : -1;
        double cpu = r->done[0] ? r->cpu_other[0] / r->gib : -1;
        int ok = (b[0] < 0 || b[0] < 1) && (b[1] < 0 || b[1] < 1) && (f[0] < 0 || f[0] <= 1.2) &&
                 (f[1] < 0 || f[1] <= 1.2) && (rb < 0 || rb <= 1.2);
        missed += !ok;
        printf("%6g %9.2f %9.2f %9.2f %10.2f %12.2f %12.2f %9.2f %13.2f %11.2f %8s\n", r->gib,
               b[0], b[1], b[2], f[0], f[1], f[2], sv, rb, cpu, ok ? "met" : "MISSED");
        if (js) {
            fprintf(js, "%s{\"gib\":%.3f,\"d2h_gbps\":%.3f,\"h2d_gbps\":%.3f,\"d2d_gbps\":%.3f",
                    i ? "," : "", r->gib, r->gib * GIB / r->d2h / 1e9,
                    r->gib * GIB / r->h2d / 1e9, r->d2d > 0 ? r->gib * GIB / r->d2d / 1e9 : 0);
            for (int m = 0; m < 3; m++)
                fprintf(js, ",\"%s\":{\"begin_ms_per_gib\":%.4f,\"fence_s\":%.6f,"
                        "\"fence_held\":%d,\"stall_s\":%.6f,\"save_s\":%.6f,"
                        "\"other_threads_core_s\":%.4f,\"caller_cpu_in_wait\":%.4f}",
                        mode_name(m), b[m], r->done[m] ? r->fence[m] : -1, r->held[m],
                        r->done[m] ? r->stall[m] : -1, r->done[m] ? r->save[m] : -1,
                        r->done[m] ? r->cpu_other[m] : -1, r->done[m] ? r->wait_spin[m] : -1);
            fprintf(js, ",\"host_fence_over_d2h\":%.4f,\"device_fence_over_d2d\":%.4f,"
                    "\"stream_fence_over_d2h\":%.4f,\"save_over_d2h\":%.4f,"
                    "\"restore_s\":%.6f,\"restore_host_s\":%.6f,\"restore_over_bound\":%.4f,"
                    "\"restore_over_h2d\":%.4f,\"targets_met\":%s}", f[0], f[1], f[2], sv,
                    r->restore, r->restore_host, rb,
                    r->restore > 0 ? r->h2d / r->restore : -1, ok ? "true" : "false");
        }
    }
    double big_ms_gib = big_begin > 0 ? big_begin * 1e3 / ((double)big_bytes / GIB) : -1;
    double many_gib = (double)o.many * 65536.0 / GIB;
    double many_ms_gib = many_begin > 0 ? many_begin * 1e3 / many_gib : -1;
    if (o.big > 0 || o.many > 0)
        printf("begin, %g GiB default options: %.2f ms/GiB; %d tensors of 64 KiB: %.1f ms "
               "(%.2f ms/GiB)%s\n", o.big, big_ms_gib, o.many, many_begin * 1e3, many_ms_gib,
               (big_ms_gib < 0 || big_ms_gib < 1) ? "" : "  MISSED (target < 1 ms/GiB)");
    missed += big_ms_gib >= 1;
    printf("(-1: not measured)\n");
    if (js) {
        fprintf(js, "],\"big\":{\"gib\":%g,\"begin_s\":%.6f,\"save_s\":%.4f,"
                "\"begin_ms_per_gib\":%.4f},\"many\":{\"tensors\":%d,\"begin_s\":%.6f,"
                "\"save_s\":%.4f,\"begin_us_per_tensor\":%.3f},\"errors\":%d,"
                "\"targets_missed\":%d}\n", o.big, big_begin, big_save, big_ms_gib, o.many,
                many_begin, many_save, o.many > 0 ? many_begin * 1e6 / o.many : -1, g_errors,
                missed);
        fclose(js);
    }
    CU(cudaFreeHost(pattern_h));
    CU(cudaStreamDestroy(s));
    nftw(base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    if (g_errors) {
        printf("bench_gpu: %d save(s) or restore(s) failed, gave wrong data or waited for "
               "the training stream\n", g_errors);
        return 1;
    }
    return missed && o.enforce ? 3 : 0;
}

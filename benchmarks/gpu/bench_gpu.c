/* bench_gpu: libckpt on device buffers, as ratios to copy bandwidths
 * measured with plain cudaMemcpyAsync in the same run.
 *
 * For each size S (GiB of device buffers, default 1, 4 and 16):
 *   baselines   pinned D2H, pinned H2D and D2D bandwidth of S bytes
 *   per mode    (host, device, stream) one warm-up save, then a measured one:
 *     stall     ckpt_save_begin + ckpt_save_wait_snapshot: how long until the
 *               caller may overwrite its buffers.  Reported over the time
 *               the baseline copy of S bytes takes: D2H for host and stream
 *               mode (target <= 1.2), D2D for device mode (target <= 1.2)
 *     save      S / (begin .. committed), as a ratio to the D2H bandwidth
 *   restore     S / (ckpt_restore into device buffers .. stream synced), page
 *               cache warm, every chunk verified: ratio to pinned H2D
 *               bandwidth (target >= 0.8)
 *
 * Usage: bench_gpu [--sizes 1,4,16] [--modes host,device,stream] [--dir DIR]
 *                  [--fsync] [--verify none|quick|full] [--threads N]
 *                  [--chunk-mib N] [--json FILE] [--enforce]
 * Defaults: fsync off and quick verification after each save, so that the
 * numbers are the pipeline's and not the disk's; DIR defaults to /dev/shm
 * when it has room, else $TMPDIR.  Exits 77 with "SKIP: no CUDA device"
 * without a GPU.  Sizes that do not fit in free device or host memory are
 * skipped with a message.  Exit status 1 when a save or restore fails or
 * restores wrong data; with --enforce, 3 when a target is missed.
 */
#include <cuda_runtime_api.h>

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

#define GIB ((uint64_t)1 << 30)
#define MIB ((uint64_t)1 << 20)
#define PATTERN (64 * MIB)

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
} options;

static int g_errors; /* failed saves or restores, wrong data: exit status 1 */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

/* Time one cudaMemcpyAsync of n bytes (after a warm-up of 256 MiB). */
static double time_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t s)
{
    size_t warm = n < 256 * MIB ? n : 256 * MIB;
    CU(cudaMemcpyAsync(dst, src, warm, kind, s));
    CU(cudaStreamSynchronize(s));
    double t0 = now();
    CU(cudaMemcpyAsync(dst, src, n, kind, s));
    CU(cudaStreamSynchronize(s));
    return now() - t0;
}

static int parse(int argc, char **argv, options *o)
{
    o->nsizes = 3;
    o->sizes[0] = 1;
    o->sizes[1] = 4;
    o->sizes[2] = 16;
    o->nmodes = 3;
    o->modes[0] = CKPT_SNAPSHOT_HOST;
    o->modes[1] = CKPT_SNAPSHOT_DEVICE;
    o->modes[2] = CKPT_SNAPSHOT_STREAM;
    o->verify = CKPT_VERIFY_QUICK;
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
        } else {
            fprintf(stderr, "bench_gpu: unknown option %s\n", a);
            return -1;
        }
    }
    return 0;
}

typedef struct result {
    double gib;
    double d2h, h2d, d2d;             /* GB/s baselines; d2d 0 if not measured */
    double stall[3], begin[3], save[3]; /* seconds, per mode index */
    int done[3];
    double restore;                   /* seconds; 0 if not measured */
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
     * pass and no pageable fallback hides the copy engine's speed; stream
     * mode keeps the default bounded pool. */
    so.host_memory_limit = bytes + 64 * MIB;
    if (mode != CKPT_SNAPSHOT_STREAM)
        so.pinned_limit = bytes + 512 * MIB; /* + the restore staging */
    ckpt_store *st = NULL;
    if (ckpt_store_open(&st, dir, &so) != CKPT_OK) {
        fprintf(stderr, "bench_gpu: ckpt_store_open %s: %s\n", dir, ckpt_error_last());
        exit(1);
    }
    return st;
}

/* Tensors of at most 1 GiB each, like a model's parameters. */
static size_t make_tensors(void *d, uint64_t bytes, ckpt_tensor *t, int64_t *shapes,
                           char names[][32], size_t max)
{
    size_t n = 0;
    for (uint64_t off = 0; off < bytes && n < max; n++) {
        uint64_t len = bytes - off < GIB ? bytes - off : GIB;
        snprintf(names[n], 32, "layer%03zu.weight", n);
        shapes[n] = (int64_t)(len / 4);
        t[n] = (ckpt_tensor){ names[n], (char *)d + off, len, CKPT_F32, 1, &shapes[n],
                              CKPT_MEM_DEVICE };
        off += len;
    }
    return n;
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
    if (dfree < bytes + 512 * MIB || host_available() < 2 * bytes + 2 * GIB) {
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
    r->d2h = (double)bytes / time_copy(h, d, bytes, cudaMemcpyDeviceToHost, s) / 1e9;
    r->h2d = (double)bytes / time_copy(d, h, bytes, cudaMemcpyHostToDevice, s) / 1e9;
    CU(cudaFreeHost(h));
    CU(cudaMemGetInfo(&dfree, &dtotal));
    void *d2 = NULL;
    if (dfree > bytes + 512 * MIB && cudaMalloc(&d2, bytes) == cudaSuccess) {
        r->d2d = (double)bytes / time_copy(d2, d, bytes, cudaMemcpyDeviceToDevice, s) / 1e9;
        CU(cudaFree(d2));
    }
    printf("%g GiB: pinned D2H %.1f GB/s, pinned H2D %.1f GB/s, D2D %.1f GB/s\n", r->gib,
           r->d2h, r->h2d, r->d2d);

    ckpt_tensor t[64];
    int64_t shapes[64];
    char names[64][32];
    size_t nt = make_tensors(d, bytes, t, shapes, names, 64);
    ckpt_save_options sopt = CKPT_SAVE_OPTIONS_INIT;
    sopt.cuda_stream = s;

    for (int mi = 0; mi < o->nmodes; mi++) {
        int mode = o->modes[mi];
        char dir[4200];
        snprintf(dir, sizeof dir, "%.4000s/%s-%gg", base, mode_name(mode), gib);
        ckpt_store *st = open_store(dir, o, mode, bytes);
        int rc = ckpt_save_sync(st, 0, t, nt, &sopt); /* warm-up: buffers allocated */
        ckpt_save *sv = NULL;
        double t0 = now(), t1 = 0, t2 = 0, t3 = 0;
        if (rc == CKPT_OK)
            rc = ckpt_save_begin(&sv, st, 1, t, nt, &sopt);
        t1 = now();
        if (rc == CKPT_OK)
            rc = ckpt_save_wait_snapshot(sv);
        t2 = now();
        if (rc == CKPT_OK)
            rc = ckpt_save_wait(sv);
        t3 = now();
        ckpt_save_free(sv);
        if (rc != CKPT_OK) {
            printf("  %-6s save failed: %s: %s\n", mode_name(mode), ckpt_strerror(rc),
                   ckpt_error_last());
            g_errors++;
        } else {
            r->begin[mode] = t1 - t0;
            r->stall[mode] = t2 - t0;
            r->save[mode] = t3 - t0;
            r->done[mode] = 1;
            double base_t = (double)bytes / ((mode == CKPT_SNAPSHOT_DEVICE && r->d2d > 0
                                              ? r->d2d : r->d2h) * 1e9);
            printf("  %-6s stall %8.1f ms (begin %.1f ms) = %.2fx %s copy; save %.2f GB/s "
                   "= %.2fx D2H; pinned %.1f GiB\n", mode_name(mode), r->stall[mode] * 1e3,
                   r->begin[mode] * 1e3, r->stall[mode] / base_t,
                   mode == CKPT_SNAPSHOT_DEVICE && r->d2d > 0 ? "D2D" : "D2H",
                   (double)bytes / r->save[mode] / 1e9,
                   (double)bytes / r->save[mode] / 1e9 / r->d2h,
                   (double)ckpt_store_pinned_bytes(st) / GIB);
        }
        if (rc == CKPT_OK && mode == o->modes[0]) {
            CU(cudaMemsetAsync(d, 0, bytes, s));
            CU(cudaStreamSynchronize(s));
            ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
            ro.cuda_stream = s;
            t0 = now();
            rc = ckpt_restore(st, CKPT_LATEST, t, nt, &ro, NULL);
            CU(cudaStreamSynchronize(s));
            t1 = now();
            if (rc != CKPT_OK) {
                printf("  restore failed: %s: %s\n", ckpt_strerror(rc), ckpt_error_last());
                g_errors++;
            } else {
                r->restore = t1 - t0;
                float *check = malloc(PATTERN);
                CU(cudaMemcpy(check, (char *)d + bytes - PATTERN, PATTERN,
                              cudaMemcpyDeviceToHost));
                int same = memcmp(check, pattern_h, PATTERN) == 0;
                free(check);
                printf("  restore %.2f GB/s = %.2fx pinned H2D (every chunk verified)%s\n",
                       (double)bytes / r->restore / 1e9,
                       (double)bytes / r->restore / 1e9 / r->h2d,
                       same ? "" : "  WRONG DATA");
                if (!same) {
                    r->restore = 0;
                    g_errors++;
                }
            }
        }
        ckpt_store_free(st);
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    CU(cudaFree(d));
    return 1;
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
        printf("SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        return 77;
    }
    double biggest = 0;
    for (int i = 0; i < o.nsizes; i++)
        biggest = o.sizes[i] > biggest ? o.sizes[i] : biggest;
    char base[4096];
    const char *parent = o.dir;
    if (!parent)
        parent = free_bytes("/dev/shm") > (uint64_t)(2.5 * biggest * (double)GIB) + 4 * GIB
                 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(base, sizeof base, "%s/ckpt-bench-gpu.XXXXXX", parent);
    if (!mkdtemp(base)) {
        perror(base);
        return 1;
    }
    struct cudaDeviceProp prop;
    int dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("bench_gpu: %s, driver %d.%d, runtime %d.%d, libckpt %s; checkpoints in %s "
           "(fsync %s, verify %s)\n", prop.name, drv / 1000, drv % 1000 / 10, rt / 1000,
           rt % 1000 / 10, ckpt_version_string(), base, o.fsync ? "on" : "off",
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

    /* Targets (issue 3): host stall <= 1.2x D2H, device stall <= 1.2x D2D,
     * restore >= 0.8x pinned H2D. */
    printf("\nsummary (ratios; targets: host stall/D2H <= 1.2, device stall/D2D <= 1.2, "
           "restore/H2D >= 0.8)\n");
    printf("%8s %14s %16s %14s %13s %13s %13s\n", "GiB", "host stall/D2H",
           "device stall/D2D", "stream stall", "save/D2H", "restore/H2D", "targets");
    FILE *js = o.json ? fopen(o.json, "w") : NULL;
    if (js)
        fprintf(js, "{\"gpu\":\"%s\",\"results\":[", prop.name);
    int missed = 0;
    for (int i = 0; i < nres; i++) {
        result *r = &res[i];
        double b = (double)(uint64_t)(r->gib * (double)GIB);
        double hs = r->done[0] ? r->stall[0] / (b / (r->d2h * 1e9)) : -1;
        double ds = r->done[1] && r->d2d > 0 ? r->stall[1] / (b / (r->d2d * 1e9)) : -1;
        double ss = r->done[2] ? r->stall[2] / (b / (r->d2h * 1e9)) : -1;
        double sv = r->done[0] ? b / r->save[0] / 1e9 / r->d2h : -1;
        double rs = r->restore > 0 ? b / r->restore / 1e9 / r->h2d : -1;
        int ok = (hs < 0 || hs <= 1.2) && (ds < 0 || ds <= 1.2) && (rs < 0 || rs >= 0.8);
        missed += !ok;
        printf("%8g %14.2f %16.2f %14.2f %13.2f %13.2f %13s\n", r->gib, hs, ds, ss, sv, rs,
               ok ? "met" : "MISSED");
        if (js)
            fprintf(js, "%s{\"gib\":%.3f,\"d2h_gbps\":%.3f,\"h2d_gbps\":%.3f,\"d2d_gbps\":%.3f,"
                    "\"host_stall_over_d2h\":%.3f,\"device_stall_over_d2d\":%.3f,"
                    "\"stream_stall_over_d2h\":%.3f,\"save_over_d2h\":%.3f,"
                    "\"restore_over_h2d\":%.3f}", i ? "," : "", r->gib, r->d2h, r->h2d,
                    r->d2d, hs, ds, ss, sv, rs);
    }
    printf("(-1: not measured)\n");
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    CU(cudaFreeHost(pattern_h));
    CU(cudaStreamDestroy(s));
    nftw(base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    if (g_errors) {
        printf("bench_gpu: %d save(s) or restore(s) failed or gave wrong data\n", g_errors);
        return 1;
    }
    return missed && o.enforce ? 3 : 0;
}

/* bench_host: libckpt on host buffers, as ratios to baselines measured in
 * the same run (the machines are shared and noisy; absolute numbers are
 * printed too, but the ratios are what to compare).
 *
 *   stall / memcpy      time the caller is blocked in ckpt_save_begin, over a
 *                       plain memcpy of the same bytes into warm memory
 *   save / write        begin-to-committed time, over writing the same raw
 *                       bytes to one file in the same directory (+ fsync)
 *   restore / read      newest-valid restore (every chunk verified), over
 *                       reading the raw file back into the same buffers:
 *                       right after the save (from the disk when the save
 *                       dropped its pages: a 512 MiB or larger one by
 *                       default), against both the cached read and the
 *                       read with the raw file's pages dropped first; and
 *                       once more (cached), against the cached read
 *                       reading the raw file back into the same buffers
 *   ratio               raw bytes / stored bytes
 *
 * Usage: bench_host DIR [MiB] [reps] [verify] [auto|keep|drop]
 *   defaults: 256 MiB, 3 reps (best of), verify_after_save 3 (stored, the library's
 *   default; 2 full, 1 quick, 0 none), page cache policy auto (keep:
 *   CKPT_OPEN_KEEP_CACHE, drop: CKPT_OPEN_DROP_CACHE)
 */
#include <ckpt.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "settle.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Weights that look like a trained network's: normal, small, full mantissas. */
static void fill_weights(float *w, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 2) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((seed >> 11) + 1.0) / 9007199254740993.0;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = (seed >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1)) * 0.02;
        w[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n)
            w[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

static void to_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        dst[i] = (uint16_t)(u >> 16);
    }
}

/* write(2) and read(2) move at most about 2 GiB per call: loop. */
static int io_all(int fd, void *buf, size_t n, int writing)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int die(const char *what)
{
    fprintf(stderr, "bench_host: %s: %s\n", what, ckpt_error_last());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_host DIR [MiB] [reps] [verify] [auto|keep|drop]\n");
        return 2;
    }
    const char *dir = argv[1];
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 256;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    int verify = argc > 4 ? atoi(argv[4]) : CKPT_VERIFY_STORED;
    const char *cache = argc > 5 ? argv[5] : "auto";
    unsigned cache_flags = strcmp(cache, "keep") == 0   ? CKPT_OPEN_KEEP_CACHE
                           : strcmp(cache, "drop") == 0 ? CKPT_OPEN_DROP_CACHE
                                                        : 0;
    if (!cache_flags && strcmp(cache, "auto") != 0) {
        fprintf(stderr, "bench_host: page cache policy is auto, keep or drop, not %s\n", cache);
        return 2;
    }
    size_t bytes = mib << 20;
    /* Two thirds fp32 weights, one third bf16 (optimizer state, activations). */
    size_t n32 = bytes * 2 / 3 / 4, n16 = (bytes - n32 * 4) / 2;
    float *w = malloc(n32 * 4);
    uint16_t *h = malloc(n16 * 2);
    float *tmp = malloc(n16 * 4);
    unsigned char *copy = malloc(bytes);
    if (!w || !h || !tmp || !copy)
        return 1;
    fill_weights(w, n32, 1);
    fill_weights(tmp, n16, 2);
    to_bf16(tmp, h, n16);
    free(tmp);
    memset(copy, 1, bytes);
    int64_t s32[1] = {(int64_t)n32}, s16[1] = {(int64_t)n16};
    ckpt_tensor t[2] = {{"weights.fp32", w, n32 * 4, CKPT_F32, 1, s32, CKPT_MEM_HOST},
                        {"state.bf16", h, n16 * 2, CKPT_BF16, 1, s16, CKPT_MEM_HOST}};
    size_t total = n32 * 4 + n16 * 2;

    char root[4096], raw[4200];
    snprintf(root, sizeof root, "%s/bench-root", dir);
    snprintf(raw, sizeof raw, "%s/bench-raw.bin", dir);
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.keep_last = 2;
    o.verify_after_save = (ckpt_verify_level)verify;
    /* A second run on the same DIR saves from step 0 again: retire the
     * last run's steps instead of refusing a step below them. */
    o.flags |= cache_flags | CKPT_OPEN_REWIND;
    if (ckpt_store_open(&st, root, &o))
        return die("open");

    double best_memcpy = 1e9, best_write = 1e9, best_read = 1e9;
    double best_stall = 1e9, best_save = 1e9, best_restore = 1e9, best_again = 1e9;
    double best_cold = 1e9;
    uint64_t stored = 0;
    for (int r = 0; r < reps + 1; r++) { /* rep 0 warms the arena and caches */
        double t0 = now();
        memcpy(copy, w, n32 * 4);
        memcpy(copy + n32 * 4, h, n16 * 2);
        double t_memcpy = now() - t0;

        if (bench_settle(root))
            return die("settle");
        t0 = now();
        int fd = open(raw, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || io_all(fd, w, n32 * 4, 1) || io_all(fd, h, n16 * 2, 1) || fsync(fd) != 0)
            return 1;
        close(fd);
        double t_write = now() - t0;

        ckpt_save *sv;
        t0 = now();
        if (ckpt_save_begin(&sv, st, r, t, 2, NULL))
            return die("save");
        double t_stall = now() - t0;
        if (ckpt_save_wait(sv))
            return die("save wait");
        double t_save = now() - t0;
        ckpt_save_stats ss;
        ckpt_save_stats_get(sv, &ss);
        stored = ss.stored_bytes;
        ckpt_save_free(sv);

        if (bench_settle(root))
            return die("settle");
        t0 = now();
        fd = open(raw, O_RDONLY);
        if (fd < 0 || io_all(fd, w, n32 * 4, 0) || io_all(fd, h, n16 * 2, 0))
            return 1;
        close(fd);
        double t_read = now() - t0;

        /* The raw file's clean pages dropped: a read from the disk. */
        fd = open(raw, O_RDONLY);
        if (fd < 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
            return 1;
        t0 = now();
        if (io_all(fd, w, n32 * 4, 0) || io_all(fd, h, n16 * 2, 0))
            return 1;
        close(fd);
        double t_cold = now() - t0;

        t0 = now();
        if (ckpt_restore(st, CKPT_LATEST, t, 2, NULL, NULL))
            return die("restore");
        double t_restore = now() - t0;
        t0 = now();
        if (ckpt_restore(st, CKPT_LATEST, t, 2, NULL, NULL))
            return die("restore");
        double t_again = now() - t0;
        if (r == 0)
            continue;
#define MIN(a, b) ((a) < (b) ? (a) : (b))
        best_memcpy = MIN(best_memcpy, t_memcpy);
        best_write = MIN(best_write, t_write);
        best_read = MIN(best_read, t_read);
        best_stall = MIN(best_stall, t_stall);
        best_save = MIN(best_save, t_save);
        best_restore = MIN(best_restore, t_restore);
        best_again = MIN(best_again, t_again);
        best_cold = MIN(best_cold, t_cold);
    }
    ckpt_store_free(st);
    unlink(raw);
    double gb = (double)total / 1e9;
    printf("state            %.0f MiB (fp32 %.0f MiB + bf16 %.0f MiB), best of %d, "
           "verify_after_save %d, page cache %s\n", total / 1048576.0, n32 * 4 / 1048576.0,
           n16 * 2 / 1048576.0, reps, verify, cache);
    printf("memcpy           %8.3f s  %6.2f GB/s   (baseline)\n", best_memcpy, gb / best_memcpy);
    printf("stall            %8.3f s  %6.2f GB/s   stall/memcpy   = %.2f\n", best_stall,
           gb / best_stall, best_stall / best_memcpy);
    printf("write+fsync raw  %8.3f s  %6.2f GB/s   (baseline)\n", best_write, gb / best_write);
    printf("save (committed) %8.3f s  %6.2f GB/s   save/write     = %.2f\n", best_save,
           gb / best_save, best_save / best_write);
    printf("read raw         %8.3f s  %6.2f GB/s   (baseline, cached)\n", best_read,
           gb / best_read);
    printf("read raw, cold   %8.3f s  %6.2f GB/s   (baseline, pages dropped first)\n",
           best_cold, gb / best_cold);
    printf("restore          %8.3f s  %6.2f GB/s   restore/read   = %.2f  (/ cold read %.2f;"
           " right after the save)\n", best_restore, gb / best_restore,
           best_restore / best_read, best_restore / best_cold);
    printf("restore again    %8.3f s  %6.2f GB/s   restore/read   = %.2f  (cached)\n",
           best_again, gb / best_again, best_again / best_read);
    printf("compression      raw/stored = %.3f\n", (double)total / (double)stored);
    free(w);
    free(h);
    free(copy);
    return 0;
}

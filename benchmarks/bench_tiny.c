/* bench_tiny: the per-tensor cost of the C library alone (no binding).
 *
 * Saves and restores the same bytes twice in one run: as N tiny tensors and
 * as one tensor, and prints each figure (stall, persist, restore) for both
 * and their ratio, so a binding's figures (bench_persist.py) can be split
 * into library cost and binding cost.
 *
 * Usage: bench_tiny DIR [N] [bytes per tensor] [reps] [apart] [random]
 *   defaults: 10000 tensors of 4096 bytes, best of 3 reps.
 *
 * The tiny tensors are views of the one tensor's buffer, back to back (a
 * flat parameter buffer), unless "apart" is given: then each has an
 * allocation of its own, as the tensors of a PyTorch state dict do, and
 * is filled with the same bytes.
 *
 * The data are small floats with full mantissas (their exponent bytes
 * compress), unless "random" is given: then bytes no codec shrinks, so
 * every chunk is stored raw and a restore decodes nothing (what is left is
 * the per-tensor cost alone).
 *
 * "restore" runs on the store that saved (which has the manifest decoded
 * already); "new store" on a read-only store opened for it, as a job
 * restarted after a crash restores (the page cache stays warm: it is the
 * manifest decoding a new process pays, not a cold read).
 */
#include <ckpt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "settle.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Best stall, persist and restore of `n` tensors over `data` (one root per
 * layout, so retention never mixes them). */
static int run(const char *dir, const char *tag, ckpt_tensor *t, size_t n, int reps,
               double out[4])
{
    char root[4096];
    snprintf(root, sizeof root, "%s/%s", dir, tag);
    ckpt_store_options o;
    ckpt_store_options_init(&o, CKPT_STORE_OPTIONS_VERSION);
    o.keep_last = 2;
    ckpt_store *st = NULL;
    if (ckpt_store_open(&st, root, &o))
        return -1;
    static int64_t step; /* steps only grow in a root, across both rounds */
    out[0] = out[1] = out[2] = out[3] = 1e9;
    for (int r = 0; r <= reps; r++) {
        ckpt_save *sv = NULL;
        if (bench_settle(root))
            goto fail;
        double t0 = now();
        if (ckpt_save_begin(&sv, st, ++step, t, n, NULL))
            goto fail;
        double t1 = now();
        int rc = ckpt_save_wait(sv);
        double t2 = now();
        ckpt_save_free(sv);
        if (rc || bench_settle(root))
            goto fail;
        double t3 = now();
        if (ckpt_restore(st, CKPT_LATEST, t, n, NULL, NULL))
            goto fail;
        double t4 = now();
        if (r) { /* the first round warms caches and files */
            out[0] = MIN(out[0], t1 - t0);
            out[1] = MIN(out[1], t2 - t1);
            out[2] = MIN(out[2], t4 - t3);
        }
    }
    ckpt_store_free(st);
    ckpt_store_options ro;
    ckpt_store_options_init(&ro, CKPT_STORE_OPTIONS_VERSION);
    ro.flags = CKPT_OPEN_READONLY;
    for (int r = 0; r < reps; r++) {
        if (ckpt_store_open(&st, root, &ro))
            return -1;
        double t0 = now();
        int rc = ckpt_restore(st, CKPT_LATEST, t, n, NULL, NULL);
        double t1 = now();
        ckpt_store_free(st);
        if (rc)
            return -1;
        out[3] = MIN(out[3], t1 - t0);
    }
    return 0;
fail:
    ckpt_store_free(st);
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_tiny DIR [N] [bytes per tensor] [reps] [apart] [random]\n");
        return 2;
    }
    size_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 10000;
    size_t each = argc > 3 ? strtoull(argv[3], NULL, 10) : 4096;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    int apart = argc > 5 && strcmp(argv[5], "apart") == 0;
    int random_bytes = argc > 6 && strcmp(argv[6], "random") == 0;
    if (n == 0 || each < 4 || reps < 1 || (argc > 5 && !apart) || (argc > 6 && !random_bytes))
        return 2;
    float *data = malloc(n * each);
    ckpt_tensor *t = calloc(n, sizeof *t);
    char *names = malloc(n * 24);
    int64_t *shapes = malloc(n * sizeof *shapes);
    if (!data || !t || !names || !shapes)
        return 1;
    uint64_t seed = 1;
    for (size_t i = 0; i < n * each / 4; i++) { /* small values, full mantissas */
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        if (random_bytes) {
            uint32_t bits = (uint32_t)(seed >> 32);
            memcpy(&data[i], &bits, sizeof bits);
        } else {
            data[i] = (float)((int32_t)(seed >> 32)) * 1e-11f;
        }
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(names + i * 24, 24, "t%zu", i);
        shapes[i] = (int64_t)(each / 4);
        char *at = (char *)data + i * each;
        if (apart) {
            if (!(at = malloc(each)))
                return 1;
            memcpy(at, (char *)data + i * each, each);
        }
        t[i] = (ckpt_tensor){names + i * 24, at, each, CKPT_F32, 1, &shapes[i],
                             CKPT_MEM_HOST};
    }
    int64_t all = (int64_t)(n * each / 4);
    ckpt_tensor one = {"t", data, n * each, CKPT_F32, 1, &all, CKPT_MEM_HOST};
    double a[4], b[4];
    if (run(argv[1], "one", &one, 1, reps, a) || run(argv[1], "tiny", t, n, reps, b) ||
        run(argv[1], "one", &one, 1, reps, a) || run(argv[1], "tiny", t, n, reps, b)) {
        fprintf(stderr, "bench_tiny: %s\n", ckpt_error_last());
        return 1;
    }
    const char *what[4] = {"stall", "persist", "restore", "new store"};
    printf("%zu x %zu B%s%s vs 1 x %zu B (best of %d)\n", n, each,
           apart ? " (each allocated apart)" : "", random_bytes ? " (random bytes)" : "", n * each,
           reps);
    for (int i = 0; i < 4; i++)
        printf("%-10s one %8.4f s  tiny %8.4f s  ratio %6.2fx\n", what[i], a[i], b[i],
               b[i] / a[i]);
    for (size_t i = 0; apart && i < n; i++)
        free(t[i].data);
    free(data), free(t), free(names), free(shapes);
    return 0;
}

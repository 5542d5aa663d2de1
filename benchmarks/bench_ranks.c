/* bench_ranks: per-rank stall and persist of a multi-rank save (MPI).
 *
 *   mpirun -np N bench_ranks ROOT [MIB_PER_RANK [SAVES]]
 *
 * Every rank saves MIB_PER_RANK MiB (default 64) of float32 noise (zstd
 * level 1 gains little on it, so the disk sees about as many bytes) SAVES
 * times (default 5), fsync on, verify_after_save full, and reports the
 * median stall_s (time in ckpt_save_begin) and persist_s (begin returning
 * to the global commit known) over the saves.  Rank 0 prints one line:
 * ranks, MiB per rank, the slowest rank's medians, and the job's aggregate
 * write rate (all ranks' bytes over the slowest median persist).  Compare
 * runs with 1, 2, 4 ranks on the same machine (docs/SCALING.md). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "ckpt_mpi.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N bench_ranks ROOT [MIB_PER_RANK [SAVES]]\n");
        MPI_Finalize();
        return 2;
    }
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 64;
    int saves = argc > 3 ? atoi(argv[3]) : 5;
    size_t n = mib << 18; /* float32 elements */
    float *data = malloc(n * sizeof *data);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = (float)(x >> 40) / (float)(1u << 24);
    }
    ckpt_mpi *m;
    if (ckpt_mpi_new(&m, MPI_COMM_WORLD)) {
        fprintf(stderr, "ckpt_mpi_new failed (MPI_THREAD_MULTIPLE?)\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    so.keep_last = 2;
    so.rank = rank;
    so.world_size = size;
    so.coordinator = ckpt_mpi_coordinator(m);
    ckpt_store *st;
    int rc = ckpt_store_open(&st, argv[1], &so);
    if (rc) {
        fprintf(stderr, "rank %d: open: %s\n", rank, ckpt_error_last());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char name[32];
    snprintf(name, sizeof name, "rank%d.data", rank);
    int64_t shape[1] = {(int64_t)n};
    ckpt_tensor t = {name, data, n * sizeof *data, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    double *stall = calloc((size_t)saves, sizeof *stall);
    double *persist = calloc((size_t)saves, sizeof *persist);
    for (int i = 0; i < saves; i++) {
        MPI_Barrier(MPI_COMM_WORLD); /* every rank starts together, as in training */
        ckpt_save *s;
        if ((rc = ckpt_save_begin(&s, st, i + 1, &t, 1, NULL)) == CKPT_OK)
            rc = ckpt_save_wait(s);
        ckpt_save_stats stats;
        ckpt_save_stats_get(s, &stats);
        ckpt_save_free(s);
        if (rc) {
            fprintf(stderr, "rank %d: save: %s\n", rank, ckpt_error_last());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        stall[i] = stats.stall_s;
        persist[i] = stats.persist_s;
    }
    double mine[2] = {median(stall, saves), median(persist, saves)}, worst[2];
    MPI_Reduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("ranks %d  MiB/rank %zu  saves %d  stall_s %.4f  persist_s %.3f  "
               "aggregate %.0f MiB/s\n", size, mib, saves, worst[0], worst[1],
               (double)mib * size / worst[1]);
    ckpt_store_free(st);
    ckpt_mpi_free(m);
    free(stall);
    free(persist);
    free(data);
    MPI_Finalize();
    return 0;
}

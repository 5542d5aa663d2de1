/*
 * libckpt_mpi -- a ckpt_coordinator (include/ckpt.h, "ranks") made from an
 * MPI communicator.  Built when meson finds MPI (option `mpi`); link with
 * `pkg-config --libs libckpt_mpi`.  libckpt itself never links MPI.
 *
 *     ckpt_mpi *m;
 *     ckpt_mpi_new(&m, MPI_COMM_WORLD);            // collective (or _timeout)
 *     opts.rank = rank; opts.world_size = size;
 *     opts.coordinator = ckpt_mpi_coordinator(m);
 *     ckpt_store_open(&store, dir, &opts);         // collective
 *     ...
 *     ckpt_store_free(store);
 *     ckpt_mpi_free(m);
 *
 * Threads: libckpt calls the coordinator from background threads, on a
 * duplicate of the communicator (so its collectives never mix with the
 * application's), so MPI must be initialised with MPI_THREAD_MULTIPLE.
 *
 * Timeouts: each collective is a non-blocking MPI call (MPI_Ibcast,
 * MPI_Igather, MPI_Iallreduce, MPI_Ibarrier) polled until it completes or
 * the store's timeout_ms passes; then it fails and libckpt fails the save
 * or restore with CKPT_EPEER.  MPI cannot cancel a collective, so the
 * request is abandoned and the duplicate communicator is not used again
 * (every later call fails at once; make a new ckpt_mpi for a new store).
 * What happens to a job whose rank died is up to the MPI runtime: Open
 * MPI's mpirun by default kills the other ranks at once (nothing is
 * committed, and the next run restores the previous step); with
 * `mpirun --enable-recovery` (or on runtimes that keep going) the other
 * ranks see their save fail within timeout_ms.
 */
#ifndef CKPT_MPI_H
#define CKPT_MPI_H

#include <mpi.h>

#include "ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ckpt_mpi ckpt_mpi;

/**
 * Make a coordinator for the ranks of `comm` (collective over `comm`: it
 * duplicates it, with MPI_Comm_idup polled like every collective here, so a
 * rank that never calls it fails the others instead of hanging them).
 * Returns CKPT_OK and `*out` (free with ckpt_mpi_free()); CKPT_EINVAL (NULL
 * `out`, MPI not initialised or not with MPI_THREAD_MULTIPLE,
 * MPI_COMM_NULL); CKPT_EPEER (the duplication failed, or not every rank
 * came within CKPT_TIMEOUT_MS_DEFAULT: the pending request is abandoned, as
 * a collective given up on is, at the cost of a few bytes never freed);
 * CKPT_ENOMEM.
 */
int ckpt_mpi_new(ckpt_mpi **out, MPI_Comm comm);
/** ckpt_mpi_new waiting at most `timeout_ms` (0: CKPT_TIMEOUT_MS_DEFAULT;
 *  negative: CKPT_EINVAL) for every rank; the store's timeout_ms is a
 *  natural choice. */
int ckpt_mpi_new_timeout(ckpt_mpi **out, MPI_Comm comm, int timeout_ms);
/** The coordinator to put in ckpt_store_options (owned by `m`). */
const ckpt_coordinator *ckpt_mpi_coordinator(const ckpt_mpi *m);
/** This process's rank and the number of ranks of the communicator. */
int ckpt_mpi_rank(const ckpt_mpi *m);
int ckpt_mpi_size(const ckpt_mpi *m);
/** Free it (after every store that uses it).  NULL is fine.  Frees the
 *  duplicate communicator unless a collective on it was abandoned. */
void ckpt_mpi_free(ckpt_mpi *m);

#ifdef __cplusplus
}
#endif
#endif

/* mpi: a ckpt_coordinator over a duplicated MPI communicator, with
 * non-blocking collectives polled against a deadline (include/ckpt_mpi.h). */
#include "ckpt_mpi.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ckpt_mpi {
    MPI_Comm comm;          /* libckpt's own duplicate */
    int rank, size;
    atomic_int abandoned;   /* a request was left pending: comm is unusable */
    ckpt_coordinator coord;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Poll `req` until done or `timeout_ms`; back off from 50 us to 2 ms so a
 * long wait costs little CPU and a short one little latency. */
static int wait_for(ckpt_mpi *m, MPI_Request *req, int timeout_ms)
{
    double deadline = now() + timeout_ms / 1000.0;
    long sleep_ns = 50000;
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            atomic_store(&m->abandoned, 1);
            return -1;
        }
        if (done)
            return 0;
        if (now() > deadline) {
            atomic_store(&m->abandoned, 1); /* MPI cannot cancel a collective */
            return -1;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 2000000)
            sleep_ns *= 2;
    }
}

static int usable(ckpt_mpi *m)
{
    return !atomic_load(&m->abandoned);
}

static int cb_barrier(void *user, int timeout_ms)
{
    ckpt_mpi *m = user;
    MPI_Request req;
    if (!usable(m) || MPI_Ibarrier(m->comm, &req) != MPI_SUCCESS)
        return -1;
    return wait_for(m, &req, timeout_ms);
}

/* MPI cannot cancel a collective: one given up on at its deadline stays
 * posted, and a late rank's data still lands in its buffers, at any time
 * later.  So no collective is posted on the caller's memory (coord.c frees
 * its buffers once it gives up; a value to reduce would be a stack slot):
 * each works in a block of its own, copied back when it completes, freed
 * when it fails to start, and left allocated on purpose when abandoned
 * (once per communicator at most: an abandoned one is never used again). */
static int finish(ckpt_mpi *m, MPI_Request *req, int timeout_ms, void *block, void *out,
                  const void *result, size_t result_bytes)
{
    if (wait_for(m, req, timeout_ms) != 0)
        return -1; /* `block` stays: MPI may still write into it */
    if (result_bytes)
        memcpy(out, result, result_bytes);
    free(block);
    return 0;
}

static int cb_broadcast(void *user, void *buf, size_t bytes, int root, int timeout_ms)
{
    ckpt_mpi *m = user;
    MPI_Request req;
    if (!usable(m) || bytes > (size_t)INT32_MAX)
        return -1;
    unsigned char *block = malloc(bytes ? bytes : 1);
    if (!block)
        return -1;
    if (m->rank == root)
        memcpy(block, buf, bytes);
    if (MPI_Ibcast(block, (int)bytes, MPI_BYTE, root, m->comm, &req) != MPI_SUCCESS) {
        free(block);
        return -1;
    }
    return finish(m, &req, timeout_ms, block, buf, block, m->rank == root ? 0 : bytes);
}

static int cb_allreduce_min(void *user, int64_t *value, int timeout_ms)
{
    ckpt_mpi *m = user;
    MPI_Request req;
    if (!usable(m))
        return -1;
    int64_t *block = malloc(2 * sizeof *block); /* [0] in, [1] out */
    if (!block)
        return -1;
    block[0] = *value;
    if (MPI_Iallreduce(&block[0], &block[1], 1, MPI_INT64_T, MPI_MIN, m->comm, &req) !=
        MPI_SUCCESS) {
        free(block);
        return -1;
    }
    return finish(m, &req, timeout_ms, block, value, &block[1], sizeof *value);
}

static int cb_gather(void *user, const void *send, size_t bytes, void *recv, int root,
                     int timeout_ms)
{
    ckpt_mpi *m = user;
    MPI_Request req;
    size_t nrecv = m->rank == root ? (size_t)m->size : 0;
    if (!usable(m) || bytes > (size_t)INT32_MAX ||
        (bytes && nrecv > (SIZE_MAX - bytes) / bytes))
        return -1;
    unsigned char *block = malloc(bytes + bytes * nrecv + 1); /* send, then recv */
    if (!block)
        return -1;
    memcpy(block, send, bytes);
    if (MPI_Igather(block, (int)bytes, MPI_BYTE, nrecv ? block + bytes : NULL, (int)bytes,
                    MPI_BYTE, root, m->comm, &req) != MPI_SUCCESS) {
        free(block);
        return -1;
    }
    return finish(m, &req, timeout_ms, block, recv, block + bytes, bytes * nrecv);
}

int ckpt_mpi_new_timeout(ckpt_mpi **out, MPI_Comm comm, int timeout_ms)
{
    if (out)
        *out = NULL;
    int init = 0, level = MPI_THREAD_SINGLE;
    if (!out || comm == MPI_COMM_NULL || timeout_ms < 0 || MPI_Initialized(&init) != MPI_SUCCESS ||
        !init)
        return CKPT_EINVAL;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return CKPT_EINVAL; /* libckpt calls from its own threads */
    ckpt_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return CKPT_ENOMEM;
    atomic_init(&m->abandoned, 0);
    /* Non-blocking, polled as every collective here is: a rank that never
     * comes (dead before it got here, under a runtime that keeps the others
     * going) fails the others after timeout_ms instead of hanging them. */
    MPI_Request req;
    if (MPI_Comm_idup(comm, &m->comm, &req) != MPI_SUCCESS) {
        free(m);
        return CKPT_EPEER;
    }
    if (wait_for(m, &req, timeout_ms ? timeout_ms : CKPT_TIMEOUT_MS_DEFAULT) != 0)
        return CKPT_EPEER; /* `m` stays allocated: MPI may still write m->comm */
    /* Failures come back as return codes, not an abort of the job. */
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->size);
    m->coord = (ckpt_coordinator){CKPT_COORDINATOR_VERSION, m, cb_barrier, cb_broadcast,
                                  cb_allreduce_min, cb_gather};
    *out = m;
    return CKPT_OK;
}

int ckpt_mpi_new(ckpt_mpi **out, MPI_Comm comm)
{
    return ckpt_mpi_new_timeout(out, comm, 0);
}

const ckpt_coordinator *ckpt_mpi_coordinator(const ckpt_mpi *m)
{
    return m ? &m->coord : NULL;
}

int ckpt_mpi_rank(const ckpt_mpi *m)
{
    return m ? m->rank : -1;
}

int ckpt_mpi_size(const ckpt_mpi *m)
{
    return m ? m->size : 0;
}

void ckpt_mpi_free(ckpt_mpi *m)
{
    if (!m)
        return;
    if (!atomic_load(&m->abandoned))
        MPI_Comm_free(&m->comm);
    free(m);
}

/* dist_job: one rank of a multi-rank job under mpirun (run_dist.sh drives
 * it).  Rank r saves the tensors "r<r>.w" and "r<r>.b", whose contents
 * are a function of (r, step), so any rank can check any tensor.
 *
 *   dist_job save ROOT STEP...          save each step, then restore LATEST
 *                                       (agreed) and check it is the last
 *                                       (DIST_ODD_RANK=r: rank r saves
 *                                       STEP + 1, and every save must fail)
 *   dist_job kill ROOT STEP VICTIM      every rank saves STEP; VICTIM kills
 *                                       itself with SIGKILL mid-save
 *   dist_job restore ROOT STEP SKIPPED  restore LATEST: must be STEP on every
 *                                       rank, with SKIPPED newer steps in
 *                                       each rank's report
 *   dist_job reshard ROOT STEP OLDW     restore, by name, the tensors of a
 *                                       checkpoint saved by OLDW ranks,
 *                                       rank r taking old ranks r, r+W, ...
 *   dist_job single ROOT STEP OLDW      no MPI: one process loads every
 *                                       tensor of an OLDW-rank step by name
 *   dist_job busy ROOT                  a second job on a root this one
 *                                       holds gets CKPT_EBUSY on every rank
 *   dist_job late ROOT STEP LATE        rank LATE starts saving STEP two
 *                                       timeouts after the others, whose
 *                                       saves fail (CKPT_EPEER) and who then
 *                                       live on, allocating, while its data
 *                                       arrives (run_dist.sh runs rank 0 under
 *                                       valgrind: nothing may land in memory
 *                                       libckpt gave back)
 *   dist_job latenew ROOT LATE          rank LATE calls ckpt_mpi_new two
 *                                       seconds after the others, who give up
 *                                       after 500 ms (ckpt_mpi_new_timeout:
 *                                       CKPT_EPEER, not a hang); the late one's
 *                                       then completes against their
 *                                       abandoned requests
 * Exit 0 when every check passed, 1 otherwise (the message says which). */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_mpi.h"

static int g_rank = 0;

#define FAIL(...)                                                                        \
    do {                                                                                 \
        fprintf(stderr, "rank %d: FAIL: ", g_rank);                                      \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fprintf(stderr, " (%s)\n", ckpt_error_last());                                   \
        return 1;                                                                        \
    } while (0)

/* Tensor `which` (0: w, 1: b) of old rank `r`: its element count. */
static size_t elems(int r, int which)
{
    return which ? 17 + (size_t)r : 5000 + 1300 * (size_t)r; /* several 4 KiB chunks */
}

static uint32_t value(int r, int which, int64_t step, size_t i)
{
    return (uint32_t)(r * 1000003u + which * 77u + (uint32_t)step * 7919u + i);
}

typedef struct owned {
    char names[2][32];
    uint32_t *data[2];
    int64_t shape[2];
    ckpt_tensor t[2];
} owned;

static void fill(owned *o, int r, int64_t step, int with_values)
{
    for (int k = 0; k < 2; k++) {
        snprintf(o->names[k], sizeof o->names[k], "r%d.%s", r, k ? "b" : "w");
        size_t n = elems(r, k);
        if (!o->data[k])
            o->data[k] = calloc(n, sizeof(uint32_t));
        for (size_t i = 0; i < n; i++)
            o->data[k][i] = with_values ? value(r, k, step, i) : 0xdeadbeefu;
        o->shape[k] = (int64_t)n;
        o->t[k] = (ckpt_tensor){o->names[k], o->data[k], n * sizeof(uint32_t), CKPT_U32, 1,
                                &o->shape[k], CKPT_MEM_HOST};
    }
}

static int check(const owned *o, int r, int64_t step)
{
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < elems(r, k); i++)
            if (o->data[k][i] != value(r, k, step, i)) {
                fprintf(stderr, "rank %d: FAIL: %s[%zu] is %u, step %lld has %u\n", g_rank,
                        o->names[k], i, o->data[k][i], (long long)step,
                        value(r, k, step, i));
                return 1;
            }
    return 0;
}

static int open_store(ckpt_store **st, const char *root, ckpt_mpi *m, unsigned flags)
{
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    so.flags = flags;
    so.chunk_bytes = 4096;
    so.threads = 2;
    so.keep_last = 0;
    so.rank = ckpt_mpi_rank(m);
    so.world_size = ckpt_mpi_size(m);
    so.coordinator = ckpt_mpi_coordinator(m);
    const char *t = getenv("DIST_TIMEOUT_MS");
    so.timeout_ms = t ? atoi(t) : 20000;
    return ckpt_store_open(st, root, &so);
}

static void print_report(const ckpt_report *rep)
{
    for (size_t i = 0; i < ckpt_report_count(rep); i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        printf("rank %d: skipped step %lld (%s): %s\n", g_rank, (long long)p->step,
               ckpt_status_name(p->status), p->message);
    }
}

static int do_save(ckpt_mpi *m, const char *root, int nsteps, char **steps)
{
    ckpt_store *st;
    if (open_store(&st, root, m, 0))
        FAIL("open %s", root);
    owned o = {0};
    int64_t last = -1;
    const char *odd = getenv("DIST_ODD_RANK"); /* that rank saves each step + 1 */
    for (int i = 0; i < nsteps; i++) {
        last = atoll(steps[i]) + (odd && atoi(odd) == g_rank ? 1 : 0);
        fill(&o, g_rank, last, 1);
        ckpt_save *s;
        int rc = ckpt_save_begin(&s, st, last, o.t, 2, NULL);
        if (rc)
            FAIL("save_begin %lld: %s", (long long)last, ckpt_status_name(rc));
        fill(&o, g_rank, -1, 0); /* the snapshot is taken: the buffers are ours */
        rc = ckpt_save_wait(s);
        ckpt_save_stats stats;
        ckpt_save_stats_get(s, &stats);
        ckpt_save_free(s);
        if (rc)
            FAIL("save %lld: %s", (long long)last, ckpt_status_name(rc));
        printf("rank %d: saved step %lld stall_s %.6f persist_s %.6f\n", g_rank,
               (long long)last, stats.stall_s, stats.persist_s);
    }
    ckpt_report *rep = NULL;
    fill(&o, g_rank, -1, 0);
    int rc = ckpt_restore(st, CKPT_LATEST, o.t, 2, NULL, &rep);
    int64_t got = ckpt_report_step(rep);
    ckpt_report_free(rep);
    if (rc || got != last)
        FAIL("restore LATEST: %s, step %lld, want %lld", ckpt_status_name(rc),
             (long long)got, (long long)last);
    if (check(&o, g_rank, last))
        return 1;
    ckpt_store_free(st);
    printf("rank %d: restored step %lld\n", g_rank, (long long)got);
    return 0;
}

static int do_kill(ckpt_mpi *m, const char *root, int64_t step, int victim)
{
    ckpt_store *st;
    if (open_store(&st, root, m, 0))
        FAIL("open %s", root);
    owned o = {0};
    fill(&o, g_rank, step, 1);
    ckpt_save *s;
    int rc = ckpt_save_begin(&s, st, step, o.t, 2, NULL);
    if (rc)
        FAIL("save_begin: %s", ckpt_status_name(rc));
    if (g_rank == victim) {
        printf("rank %d: killing myself mid-save\n", g_rank);
        fflush(stdout);
        raise(SIGKILL);
    }
    rc = ckpt_save_wait(s);
    printf("rank %d: save of step %lld returned %s: %s\n", g_rank, (long long)step,
           ckpt_status_name(rc), rc ? ckpt_error_last() : "");
    fflush(stdout);
    ckpt_save_free(s);
    if (rc == CKPT_OK)
        FAIL("a save with a dead rank committed");
    ckpt_store_free(st);
    /* A rank is dead: no collective of MPI's own would complete now. */
    _exit(rc == CKPT_EPEER ? 0 : 1);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static int do_late(ckpt_mpi *m, const char *root, int64_t step, int late)
{
    const char *t = getenv("DIST_TIMEOUT_MS");
    long timeout_ms = t ? atol(t) : 20000;
    MPI_Barrier(MPI_COMM_WORLD); /* a rank under valgrind starts late */
    ckpt_store *st;
    if (open_store(&st, root, m, 0))
        FAIL("open %s", root);
    owned o = {0};
    fill(&o, g_rank, step, 1);
    if (g_rank == late)
        sleep_ms(2 * timeout_ms);
    ckpt_save *s;
    int rc = ckpt_save_begin(&s, st, step, o.t, 2, NULL);
    if (rc == CKPT_OK) {
        rc = ckpt_save_wait(s);
        ckpt_save_free(s);
    }
    printf("rank %d: save of step %lld returned %s: %s\n", g_rank, (long long)step,
           ckpt_status_name(rc), rc ? ckpt_error_last() : "");
    fflush(stdout);
    /* Live on while the late rank's data arrives: Open MPI moves data into
     * posted buffers only inside MPI calls, as a job's next collectives
     * would make (MPI_Iprobe here). */
    if (g_rank != late)
        for (long waited = 0; waited < 3 * timeout_ms; waited += 10) {
            for (int k = 0; k < 8; k++)
                free(calloc(1, 512u * (unsigned)(k + 1)));
            int flag;
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            sleep_ms(10);
        }
    ckpt_store_free(st);
    printf("rank %d: done\n", g_rank);
    fflush(stdout);
    /* The communicator was abandoned: no collective of MPI's would end. */
    _exit(rc == CKPT_EPEER ? 0 : 1);
}

static int do_restore(ckpt_mpi *m, const char *root, int64_t step, size_t skipped)
{
    ckpt_store *st;
    if (open_store(&st, root, m, 0))
        FAIL("open %s", root);
    owned o = {0};
    fill(&o, g_rank, -1, 0);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, o.t, 2, NULL, &rep);
    int64_t got = ckpt_report_step(rep);
    print_report(rep);
    size_t n = ckpt_report_count(rep);
    ckpt_report_free(rep);
    if (rc || got != step)
        FAIL("restore LATEST: %s, step %lld, want %lld", ckpt_status_name(rc),
             (long long)got, (long long)step);
    if (n != skipped)
        FAIL("report lists %zu skipped steps, want %zu", n, skipped);
    if (check(&o, g_rank, step))
        return 1;
    ckpt_store_free(st);
    printf("rank %d: restored step %lld, %zu skipped\n", g_rank, (long long)got, n);
    return 0;
}

static int do_reshard(ckpt_mpi *m, const char *root, int64_t step, int oldw)
{
    ckpt_store *st;
    if (open_store(&st, root, m, CKPT_OPEN_READONLY))
        FAIL("open %s", root);
    int w = ckpt_mpi_size(m);
    int mine = 0;
    owned *o = calloc((size_t)oldw, sizeof *o);
    ckpt_tensor *t = calloc(2 * (size_t)oldw, sizeof *t);
    for (int r = g_rank; r < oldw; r += w, mine++) {
        fill(&o[mine], r, -1, 0);
        t[2 * mine] = o[mine].t[0];
        t[2 * mine + 1] = o[mine].t[1];
    }
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, t, 2 * (size_t)mine, NULL, &rep);
    int64_t got = ckpt_report_step(rep);
    ckpt_report_free(rep);
    if (rc || got != step)
        FAIL("restore of old ranks' tensors: %s, step %lld, want %lld",
             ckpt_status_name(rc), (long long)got, (long long)step);
    mine = 0;
    for (int r = g_rank; r < oldw; r += w, mine++)
        if (check(&o[mine], r, step))
            return 1;
    printf("rank %d of %d: restored the tensors of %d old ranks from step %lld\n", g_rank, w,
           mine, (long long)got);
    ckpt_store_free(st);
    return 0;
}

static int do_single(const char *root, int64_t step, int oldw)
{
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    so.flags = CKPT_OPEN_READONLY;
    ckpt_store *st;
    if (ckpt_store_open(&st, root, &so))
        FAIL("open %s", root);
    for (int r = 0; r < oldw; r++)
        for (int k = 0; k < 2; k++) {
            char name[32];
            snprintf(name, sizeof name, "r%d.%s", r, k ? "b" : "w");
            void *data;
            uint64_t bytes;
            ckpt_tensor_info info;
            int rc = ckpt_load(st, CKPT_LATEST, name, &data, &bytes, &info);
            if (rc)
                FAIL("load %s: %s", name, ckpt_status_name(rc));
            if (bytes != elems(r, k) * 4)
                FAIL("%s has %llu bytes", name, (unsigned long long)bytes);
            for (size_t i = 0; i < elems(r, k); i++)
                if (((uint32_t *)data)[i] != value(r, k, step, i))
                    FAIL("%s[%zu] differs from step %lld", name, i, (long long)step);
            ckpt_free(data);
        }
    ckpt_store_free(st);
    printf("one process loaded the %d tensors of %d ranks from step %lld\n", 2 * oldw, oldw,
           (long long)step);
    return 0;
}

static int do_busy(ckpt_mpi *m, const char *root)
{
    ckpt_store *st, *second = NULL;
    if (open_store(&st, root, m, 0))
        FAIL("open %s", root);
    /* A second job: another coordinator, another lock attempt. */
    ckpt_mpi *m2;
    if (ckpt_mpi_new(&m2, MPI_COMM_WORLD))
        FAIL("second communicator");
    int rc = open_store(&second, root, m2, 0);
    ckpt_store_free(second);
    ckpt_mpi_free(m2);
    if (rc != CKPT_EBUSY)
        FAIL("a second job's open returned %s, want busy", ckpt_status_name(rc));
    printf("rank %d: second job: %s\n", g_rank, ckpt_error_last());
    ckpt_store_free(st);
    return 0;
}

static int do_latenew(int late)
{
    ckpt_mpi *m = NULL;
    struct timespec a, b;
    if (g_rank == late)
        sleep_ms(2000);
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = ckpt_mpi_new_timeout(&m, MPI_COMM_WORLD, 500);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("rank %d: ckpt_mpi_new_timeout returned %s after %.1f s\n", g_rank,
           ckpt_status_name(rc), s);
    fflush(stdout);
    int ok = g_rank == late ? rc == CKPT_OK : rc == CKPT_EPEER && m == NULL && s < 1.5;
    ckpt_mpi_free(m);
    int all = 0, mine = !ok;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return all;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: see the comment at the top of dist_job.c\n");
        return 2;
    }
    const char *mode = argv[1], *root = argv[2];
    if (strcmp(mode, "single") == 0)
        return argc == 5 ? do_single(root, atoll(argv[3]), atoi(argv[4])) : 2;
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    ckpt_mpi *m;
    if (strcmp(mode, "latenew") == 0 && argc == 4)
        return do_latenew(atoi(argv[3]));
    int rc = ckpt_mpi_new(&m, MPI_COMM_WORLD);
    if (rc) {
        fprintf(stderr, "rank %d: ckpt_mpi_new: %s (MPI thread level %d)\n", g_rank,
                ckpt_status_name(rc), provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (strcmp(mode, "save") == 0)
        rc = do_save(m, root, argc - 3, argv + 3);
    else if (strcmp(mode, "kill") == 0 && argc == 5)
        rc = do_kill(m, root, atoll(argv[3]), atoi(argv[4]));
    else if (strcmp(mode, "restore") == 0 && argc == 5)
        rc = do_restore(m, root, atoll(argv[3]), (size_t)atoi(argv[4]));
    else if (strcmp(mode, "reshard") == 0 && argc == 5)
        rc = do_reshard(m, root, atoll(argv[3]), atoi(argv[4]));
    else if (strcmp(mode, "late") == 0 && argc == 5)
        rc = do_late(m, root, atoll(argv[3]), atoi(argv[4]));
    else if (strcmp(mode, "busy") == 0)
        rc = do_busy(m, root);
    else
        rc = 2;
    fflush(stdout);
    ckpt_mpi_free(m);
    /* Every rank's verdict: one failing rank fails the job. */
    int all = 0;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return all;
}

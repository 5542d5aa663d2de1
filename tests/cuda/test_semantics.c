/* The device path under the real runtime's rules, enforced by the strict
 * mock (mock_cudart.h): several devices, device-bound streams and events,
 * contexts created by stray calls, pageable copies that block, bounded
 * stream queues, cudaFree that synchronizes, graph capture.  Each test
 * failed against the device code before it followed these rules. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <criterion/criterion.h>

#include "ckpt.h"
#include "cuda_test_util.h"

#define N ((size_t)1 << 20) /* bytes per device tensor */
#define CHUNK ((uint64_t)64 << 10)

static mock_api M;
static char *root;

static void setup(void)
{
    M = mock_api_open();
    M.reset();
    root = ct_mkdtemp();
}

static void teardown(void)
{
    ct_rmtree(root);
    free(root);
}

TestSuite(semantics, .init = setup, .fini = teardown, .timeout = 120);

static ckpt_store *open_store(ckpt_snapshot_mode mode, uint64_t pinned_limit)
{
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    o.threads = 2;
    o.chunk_bytes = CHUNK;
    o.snapshot_mode = mode;
    o.pinned_limit = pinned_limit;
    cr_assert_eq(ckpt_store_open(&st, root, &o), CKPT_OK, "%s", ckpt_error_last());
    return st;
}

static int64_t g_shape[1] = { (int64_t)(N / 4) };

static ckpt_tensor tensor(const char *name, void *p, size_t bytes, ckpt_memory mem)
{
    static int64_t shapes[512][1];
    static int next;
    int64_t *shape = bytes == N ? g_shape : shapes[next++ % 512];
    shape[0] = (int64_t)(bytes / 4);
    return (ckpt_tensor){ name, p, bytes, CKPT_F32, 1, shape, mem };
}

static void *dmalloc_on(int dev, size_t n)
{
    void *p = NULL;
    cr_assert_eq(M.SetDevice(dev), 0);
    cr_assert_eq(M.Malloc(&p, n), 0);
    return p;
}

/* Read tensor `name` of `step` back and compare it with `seed`. */
static void expect_saved(ckpt_store *st, int64_t step, const char *name, size_t n,
                         unsigned seed)
{
    void *data = NULL;
    uint64_t bytes = 0;
    cr_assert_eq(ckpt_load(st, step, name, &data, &bytes, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(bytes, n);
    long at = pattern_check(data, n, seed);
    cr_expect_eq(at, -1, "step %lld tensor '%s' differs at byte %ld", (long long)step,
                 name, at);
    ckpt_free(data);
}

/* Tensors on GPU 1, the application's thread on GPU 1: saving and restoring
 * (NULL stream: GPU 1's legacy stream) must never create a context on GPU 0
 * — every library thread binds to GPU 1 — and must leave the caller on
 * GPU 1. */
Test(semantics, second_gpu_only_touches_that_gpu)
{
    M.set_device_count(2);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 1);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    M.forget_contexts();
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    memset(d, 0, N);
    cr_assert_eq(ckpt_restore(st, 1, &t, 1, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_expect_eq(pattern_check(d, N, 1), -1, "restore landed wrong bytes");
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0x2u, "contexts created on devices 0x%x, want only "
                 "GPU 1 (0x2)", c.context_mask);
    cr_expect_eq(c.cross_device_records, 0);
    int cur = -1;
    M.GetDevice(&cur);
    cr_expect_eq(cur, 1, "the caller's current device changed to %d", cur);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* The move of the copy stream to GPU 1 fails half-way (the stream made,
 * its start event refused): that save fails naming the cause, and the next
 * one makes both again instead of recording on a missing event. */
Test(semantics, a_move_between_gpus_that_fails_half_way_is_retried)
{
    M.set_device_count(2);
    void *d0 = dmalloc_on(0, N), *d1 = dmalloc_on(1, N);
    pattern_fill(d0, N, 5);
    pattern_fill(d1, N, 6);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t0 = tensor("w", d0, N, CKPT_MEM_DEVICE);
    ckpt_tensor t1 = tensor("w", d1, N, CKPT_MEM_DEVICE);
    M.SetDevice(0);
    cr_assert_eq(ckpt_save_sync(st, 1, &t0, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.SetDevice(1);
    M.fault("cudaEventCreateWithFlags", 1, 2 /* cudaErrorMemoryAllocation */, 0);
    int rc = ckpt_save_sync(st, 2, &t1, 1, NULL);
    cr_assert_eq(rc, CKPT_EDEVICE, "%d %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "copy stream on device 1"), "%s", ckpt_error_last());
    M.reset();
    cr_assert_eq(ckpt_save_sync(st, 3, &t1, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 3, "w", N, 6);
    ckpt_store_free(st);
    M.Free(d0);
    M.Free(d1);
    expect_no_leaks(&M);
}

/* The same store may save from GPU 0 and later from GPU 1 (its copy
 * stream moves), and restore into a tensor on either. */
Test(semantics, store_moves_between_gpus_and_restores_anywhere)
{
    M.set_device_count(2);
    void *d0 = dmalloc_on(0, N), *d1 = dmalloc_on(1, N);
    pattern_fill(d0, N, 3);
    pattern_fill(d1, N, 4);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t0 = tensor("w", d0, N, CKPT_MEM_DEVICE);
    ckpt_tensor t1 = tensor("w", d1, N, CKPT_MEM_DEVICE);
    M.SetDevice(0);
    cr_assert_eq(ckpt_save_sync(st, 1, &t0, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.SetDevice(1);
    cr_assert_eq(ckpt_save_sync(st, 2, &t1, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 1, "w", N, 3);
    expect_saved(st, 2, "w", N, 4);
    /* step 1 (from GPU 0) into GPU 1's buffer, from a thread on GPU 1 */
    cr_assert_eq(ckpt_restore(st, 1, &t1, 1, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_expect_eq(pattern_check(d1, N, 3), -1);
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.cross_device_records, 0);
    ckpt_store_free(st);
    M.Free(d0);
    M.Free(d1);
    expect_no_leaks(&M);
}

Test(semantics, one_save_mixing_gpus_is_refused)
{
    M.set_device_count(2);
    void *d0 = dmalloc_on(0, N), *d1 = dmalloc_on(1, N);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t[2] = { tensor("a", d0, N, CKPT_MEM_DEVICE),
                         tensor("b", d1, N, CKPT_MEM_DEVICE) };
    ckpt_save *s = NULL;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, t, 2, NULL), CKPT_EINVAL);
    const char *msg = ckpt_error_last();
    cr_expect(strstr(msg, "'a' is on CUDA device 0") && strstr(msg, "'b' on CUDA device 1"),
              "%s", msg);
    int64_t *steps;
    size_t n;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_OK);
    cr_expect_eq(n, 0);
    ckpt_free(steps);
    ckpt_store_free(st);
    M.Free(d0);
    M.Free(d1);
    expect_no_leaks(&M);
}

/* A stream of another device than the tensor's is a clear error. */
Test(semantics, restore_stream_of_another_gpu_is_refused)
{
    M.set_device_count(2);
    void *d1 = dmalloc_on(1, N);
    pattern_fill(d1, N, 5);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d1, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    void *s0;
    M.SetDevice(0);
    cr_assert_eq(M.StreamCreate(&s0), 0);
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s0;
    int rc = ckpt_restore(st, 1, &t, 1, &ro, NULL);
    cr_expect_eq(rc, CKPT_EINVAL, "got %d: %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "not on device 1"), "%s", ckpt_error_last());
    M.StreamDestroy(s0);
    ckpt_store_free(st);
    M.Free(d1);
    expect_no_leaks(&M);
}

/* The same on save (CUDA.md: CKPT_EINVAL, as on restore): it was
 * CKPT_EDEVICE, the status of a GPU failure, though the GPU is fine and
 * the caller's argument is wrong.  Nothing is committed. */
Test(semantics, save_stream_of_another_gpu_is_refused)
{
    M.set_device_count(2);
    void *d1 = dmalloc_on(1, N);
    pattern_fill(d1, N, 5);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    void *s0;
    M.SetDevice(0);
    cr_assert_eq(M.StreamCreate(&s0), 0);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s0;
    ckpt_tensor t = tensor("w", d1, N, CKPT_MEM_DEVICE);
    int rc = ckpt_save_sync(st, 1, &t, 1, &so);
    cr_expect_eq(rc, CKPT_EINVAL, "got %d: %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "belong to the device"), "%s", ckpt_error_last());
    cr_expect_eq(M.GetLastError(), 0, "an error was left in the thread's slot");
    int64_t *steps = NULL;
    size_t n = 9;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_OK);
    cr_expect_eq(n, 0, "a refused save committed");
    ckpt_free(steps);
    M.StreamDestroy(s0);
    ckpt_store_free(st);
    M.Free(d1);
    expect_no_leaks(&M);
}

/* Four device tensors of N bytes and a host one, the snapshot buffer over
 * `pinned_limit` (the device tensors alone too, or only with the host
 * tensor beside them): no device<->pageable copy may run on the caller's
 * thread (it would wait for the caller's queued GPU work and the whole
 * copy); host buffers are free when begin returns, device buffers once
 * wait_snapshot returns; every byte is right. */
static void large_state(ckpt_snapshot_mode mode, uint64_t pinned_limit)
{
    enum { K = 4 };
    void *d[K];
    char names[K][8];
    ckpt_tensor t[K + 1];
    for (int i = 0; i < K; i++) {
        d[i] = dmalloc_on(0, N);
        pattern_fill(d[i], N, 10 + (unsigned)i);
        snprintf(names[i], sizeof names[i], "d%d", i);
        t[i] = tensor(names[i], d[i], N, CKPT_MEM_DEVICE);
    }
    char *h = malloc(N);
    pattern_fill(h, N, 20);
    t[K] = tensor("host", h, N, CKPT_MEM_HOST);
    ckpt_store *st = open_store(mode, pinned_limit);
    M.set_copy_delay_us(2000);
    mock_cuda_thread_counters before, after;
    M.get_thread_counters(&before);
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, t, K + 1, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    M.get_thread_counters(&after);
    memset(h, 0, N); /* allowed: host tensors were copied */
    cr_expect_eq(after.pageable_copies - before.pageable_copies, 0,
                 "begin ran %ld device copies through pageable memory",
                 after.pageable_copies - before.pageable_copies);
    cr_assert_eq(ckpt_save_wait_snapshot(s), CKPT_OK, "%s", ckpt_error_last());
    for (int i = 0; i < K; i++)
        memset(d[i], 0, N); /* allowed now */
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    M.set_copy_delay_us(0);
    cr_expect_leq(ckpt_store_pinned_bytes(st), pinned_limit, "pinned bytes %llu",
                  (unsigned long long)ckpt_store_pinned_bytes(st));
    for (int i = 0; i < K; i++)
        expect_saved(st, 1, names[i], N, 10 + (unsigned)i);
    expect_saved(st, 1, "host", N, 20);
    ckpt_store_free(st);
    for (int i = 0; i < K; i++)
        M.Free(d[i]);
    free(h);
    expect_no_leaks(&M);
}

Test(semantics, host_mode_state_beyond_pinned_limit)
{
    large_state(CKPT_SNAPSHOT_HOST, 4 * CHUNK); /* 256 KiB of pinned memory */
}

Test(semantics, stream_mode_state_beyond_pinned_limit)
{
    large_state(CKPT_SNAPSHOT_STREAM, 4 * CHUNK);
}

/* The device tensors fit under the cap, not with the host tensor beside
 * them in one buffer: they take the pinned pool all the same. */
Test(semantics, host_tensors_beside_device_ones_over_the_pinned_cap)
{
    large_state(CKPT_SNAPSHOT_HOST, 4 * N + N / 2);
}

/* 300 separate device tensors and a stream that holds 32 operations: the
 * caller's thread must not block on the full stream (the GPU would then
 * hold the training loop); the copies still all land. */
static void many_tensors(ckpt_snapshot_mode mode)
{
    enum { K = 300, SZ = 4096 };
    void **d = calloc(K, sizeof *d);
    ckpt_tensor *t = calloc(K, sizeof *t);
    char (*names)[16] = calloc(K, sizeof *names);
    cr_assert(d && t && names);
    for (int i = 0; i < K; i++) {
        d[i] = dmalloc_on(0, SZ);
        pattern_fill(d[i], SZ, 100 + (unsigned)i);
        snprintf(names[i], sizeof names[i], "p%03d", i);
        t[i] = tensor(names[i], d[i], SZ, CKPT_MEM_DEVICE);
    }
    ckpt_store *st = open_store(mode, 0);
    M.set_queue_depth(32);
    M.set_copy_delay_us(200);
    mock_cuda_thread_counters before, after;
    M.get_thread_counters(&before);
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, t, K, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.get_thread_counters(&after);
    cr_expect_eq(after.enqueue_waits - before.enqueue_waits, 0,
                 "begin blocked %ld times on a full stream",
                 after.enqueue_waits - before.enqueue_waits);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    M.set_copy_delay_us(0);
    M.set_queue_depth(1024);
    for (int i = 0; i < K; i += 37)
        expect_saved(st, 1, names[i], SZ, 100 + (unsigned)i);
    expect_saved(st, 1, names[K - 1], SZ, 100 + K - 1);
    ckpt_store_free(st);
    for (int i = 0; i < K; i++)
        M.Free(d[i]);
    free(d);
    free(t);
    free(names);
    expect_no_leaks(&M);
}

Test(semantics, many_tensors_do_not_fill_the_stream_from_begin)
{
    many_tensors(CKPT_SNAPSHOT_HOST);
}

Test(semantics, many_tensors_in_device_mode_do_not_fill_the_stream_from_begin)
{
    many_tensors(CKPT_SNAPSHOT_DEVICE);
}

/* A host function standing for GPU work still queued on the training
 * stream: it holds the stream until opened, or for 10 s. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, timed_out;
} gate;

static void gate_hold(void *arg) /* a stream thread: no CUDA calls */
{
    gate *g = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&g->mu);
    while (!g->open && !g->timed_out)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT)
            g->timed_out = 1;
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* 100 separate device tensors (each its own copy) while the training
 * stream is still busy: a real stream holds only 56 pending records of the
 * library's blocking-sync events, so marking each copy with its own event
 * made ckpt_save_begin wait for the training stream (the mock is as
 * strict).  Begin must return at once; the snapshot completes once the
 * stream moves on. */
static void separate_tensors_behind_a_busy_stream(ckpt_snapshot_mode mode)
{
    enum { K = 100, SZ = 64 << 10 };
    void *d[K];
    ckpt_tensor t[K];
    char names[K][16];
    for (int i = 0; i < K; i++) {
        d[i] = dmalloc_on(0, SZ);
        pattern_fill(d[i], SZ, 300 + (unsigned)i);
        snprintf(names[i], sizeof names[i], "q%03d", i);
        t[i] = tensor(names[i], d[i], SZ, CKPT_MEM_DEVICE);
    }
    ckpt_store *st = open_store(mode, 0);
    void *train = NULL;
    cr_assert_eq(M.StreamCreate(&train), 0);
    gate g = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
    cr_assert_eq(M.LaunchHostFunc(train, gate_hold, &g), 0);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = train;
    mock_cuda_thread_counters before, after;
    M.get_thread_counters(&before);
    ckpt_save *s;
    int rc = ckpt_save_begin(&s, st, 1, t, K, &so);
    M.get_thread_counters(&after);
    gate_open(&g);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(after.enqueue_waits - before.enqueue_waits, 0,
                 "begin blocked %ld times on the training stream's queued work",
                 after.enqueue_waits - before.enqueue_waits);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    cr_assert_eq(M.StreamSynchronize(train), 0);
    cr_expect(!g.timed_out, "the training stream was held until the gate timed out");
    cr_assert_eq(M.StreamDestroy(train), 0);
    for (int i = 0; i < K; i += 33)
        expect_saved(st, 1, names[i], SZ, 300 + (unsigned)i);
    expect_saved(st, 1, names[K - 1], SZ, 300 + K - 1);
    ckpt_store_free(st);
    for (int i = 0; i < K; i++)
        M.Free(d[i]);
    expect_no_leaks(&M);
}

Test(semantics, separate_tensors_behind_a_busy_stream_do_not_hold_begin)
{
    separate_tensors_behind_a_busy_stream(CKPT_SNAPSHOT_HOST);
}

Test(semantics, separate_tensors_behind_a_busy_stream_do_not_hold_begin_device_mode)
{
    separate_tensors_behind_a_busy_stream(CKPT_SNAPSHOT_DEVICE);
}

typedef struct overwrite {
    unsigned char *p;
    size_t n;
} overwrite;

static void overwrite_fn(void *arg) /* the training step after the fence */
{
    overwrite *o = arg;
    memset(o->p, 0xEE, o->n);
}

/* DEVICE mode, two tensors that are views of one cudaMalloc block (a flat
 * parameter buffer), copies slow: after ckpt_save_fence the next step
 * overwrites both, and the checkpoint must hold the bytes of before.  Their
 * chunks once joined one copy across the two staged regions, which then
 * read the caller's memory itself, after the fence. */
Test(semantics, views_of_one_block_in_device_mode_keep_the_fenced_bytes)
{
    enum { SZ = 1 << 20 };
    unsigned char *a = NULL;
    cr_assert_eq(M.Malloc((void **)&a, 2 * SZ), 0);
    unsigned char *b = a + SZ;
    memset(a, 0x11, SZ);
    memset(b, 0x22, SZ);
    static int64_t shape[1] = { SZ / 4 };
    ckpt_tensor t[2] = { { "a", a, SZ, CKPT_F32, 1, shape, CKPT_MEM_DEVICE },
                         { "b", b, SZ, CKPT_F32, 1, shape, CKPT_MEM_DEVICE } };
    ckpt_store *st = open_store(CKPT_SNAPSHOT_DEVICE, 0);
    void *app = NULL;
    cr_assert_eq(M.StreamCreate(&app), 0);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = app;
    M.set_copy_delay_us(50000);
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, t, 2, &so), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_fence(s, app), CKPT_OK, "%s", ckpt_error_last());
    overwrite o = { a, 2 * SZ };
    cr_assert_eq(M.LaunchHostFunc(app, overwrite_fn, &o), 0);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.StreamSynchronize(app), 0);
    M.set_copy_delay_us(0);
    ckpt_save_free(s);
    const char *names[2] = { "a", "b" };
    for (int i = 0; i < 2; i++) {
        void *data = NULL;
        uint64_t n = 0;
        cr_assert_eq(ckpt_load(st, 1, names[i], &data, &n, NULL), CKPT_OK, "%s",
                     ckpt_error_last());
        const unsigned char *c = data;
        size_t bad = 0;
        for (uint64_t j = 0; j < n; j++)
            bad += c[j] != (i ? 0x22 : 0x11);
        cr_expect_eq(bad, 0, "tensor %s: %zu bytes of the step after the fence", names[i], bad);
        ckpt_free(data);
    }
    ckpt_store_free(st);
    cr_assert_eq(M.StreamDestroy(app), 0);
    M.Free(a);
    expect_no_leaks(&M);
}

/* A restore onto a caller stream in graph capture: refused before any copy
 * (the copies would be recorded into the application's graph instead of
 * running), as the caller's error, so no older step is tried in its place;
 * the buffer is untouched and the capture ends cleanly. */
Test(semantics, restore_on_capturing_stream_is_refused_and_capture_survives)
{
    void *d = dmalloc_on(0, N);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    for (unsigned step = 1; step <= 2; step++) {
        pattern_fill(d, N, 20 + step);
        cr_assert_eq(ckpt_save_sync(st, step, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    }
    pattern_fill(d, N, 5);
    void *s, *graph = NULL;
    cr_assert_eq(M.StreamCreate(&s), 0);
    cr_assert_eq(M.StreamBeginCapture(s, 0), 0);
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    ckpt_report *r = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, &t, 1, &ro, &r);
    cr_expect_eq(rc, CKPT_EINVAL, "got %d: %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "capturing a CUDA graph") &&
              strstr(ckpt_error_last(), "restore"), "%s", ckpt_error_last());
    cr_expect(ckpt_report_step(r) < 0 && ckpt_report_count(r) == 0, "step %lld restored, "
              "%zu problems reported, from a capturing stream", (long long)ckpt_report_step(r),
              ckpt_report_count(r));
    ckpt_report_free(r);
    cr_expect_eq(M.StreamEndCapture(s, &graph), 0, "the application's capture broke");
    M.GraphDestroy(graph);
    cr_expect_eq(pattern_check(d, N, 5), -1, "the buffer was written by a refused restore");
    /* outside the capture the same stream restores the newest step */
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, &t, 1, &ro, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(M.StreamSynchronize(s), 0);
    cr_expect_eq(pattern_check(d, N, 22), -1, "not step 2's bytes after the restore");
    M.StreamDestroy(s);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* A caller stream in graph capture: the save is refused before anything is
 * recorded on it, and the application's capture still ends cleanly. */
Test(semantics, capturing_stream_is_refused_and_capture_survives)
{
    void *d = dmalloc_on(0, N);
    pattern_fill(d, N, 7);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    void *s, *graph = NULL;
    cr_assert_eq(M.StreamCreate(&s), 0);
    cr_assert_eq(M.StreamBeginCapture(s, 0), 0);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save = NULL;
    int rc = ckpt_save_begin(&save, st, 1, &t, 1, &so);
    cr_expect_eq(rc, CKPT_EINVAL, "got %d: %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "capturing a CUDA graph"), "%s", ckpt_error_last());
    if (save) {
        ckpt_save_wait(save);
        ckpt_save_free(save);
    }
    cr_expect_eq(M.StreamEndCapture(s, &graph), 0, "the application's capture broke");
    M.GraphDestroy(graph);
    /* and outside the capture the same stream works */
    so.cuda_stream = s;
    cr_assert_eq(ckpt_save_begin(&save, st, 1, &t, 1, &so), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_save_wait(save), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(save);
    expect_saved(st, 1, "w", N, 7);
    M.StreamDestroy(s);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* DEVICE mode: a state that outgrows the spare device memory reserved by
 * an earlier save must not make begin call cudaFree (it would wait for the
 * whole GPU, the caller's queued work included). */
Test(semantics, device_mode_begin_never_frees_device_memory)
{
    void *a = dmalloc_on(0, N), *b = dmalloc_on(0, N);
    pattern_fill(a, N, 30);
    pattern_fill(b, N, 31);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_DEVICE, 0);
    ckpt_tensor t[2] = { tensor("a", a, N, CKPT_MEM_DEVICE),
                         tensor("b", b, N, CKPT_MEM_DEVICE) };
    cr_assert_eq(ckpt_save_sync(st, 1, t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    for (int64_t step = 2; step <= 3; step++) {
        /* This thread's calls: the save's persist thread, started by
         * begin, may trim (cudaFree) before begin's caller looks. */
        mock_cuda_thread_counters before, after;
        M.get_thread_counters(&before);
        ckpt_save *s;
        cr_assert_eq(ckpt_save_begin(&s, st, step, t, 2, NULL), CKPT_OK, "%s",
                     ckpt_error_last());
        M.get_thread_counters(&after);
        cr_expect_eq(after.frees - before.frees, 0, "begin of step %lld called cudaFree",
                     (long long)step);
        cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
        ckpt_save_free(s);
        expect_saved(st, step, "a", N, 30);
        expect_saved(st, step, "b", N, 31);
    }
    ckpt_store_free(st);
    M.Free(a);
    M.Free(b);
    expect_no_leaks(&M);
}

/* cudaMemGetInfo sees memory a caching allocator holds as used and may
 * also claim more than cudaMalloc then grants: either way DEVICE mode
 * falls back to the host path and the save is whole. */
Test(semantics, device_mode_survives_a_lying_mem_get_info)
{
    void *a = dmalloc_on(0, N);
    pattern_fill(a, N, 40);
    M.set_device_memory(N + N / 2); /* room for a, not for a staged copy */
    M.set_reported_free((size_t)64 << 30);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_DEVICE, 0);
    ckpt_tensor t = tensor("a", a, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 1, "a", N, 40);
    M.set_reported_free(0); /* and claiming nothing is free: host path too */
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 2, "a", N, 40);
    M.set_reported_free(SIZE_MAX);
    M.set_device_memory((size_t)4 << 30);
    ckpt_store_free(st);
    M.Free(a);
    expect_no_leaks(&M);
}

/* A fallback is recorded in the manifest of the save that took it, and
 * not in the next one's. */
Test(semantics, fallback_note_lands_in_its_own_manifest)
{
    void *a = dmalloc_on(0, N);
    pattern_fill(a, N, 41);
    M.set_device_memory(N + N / 2); /* no room for a staged copy */
    ckpt_store *st = open_store(CKPT_SNAPSHOT_DEVICE, 0);
    ckpt_tensor t = tensor("a", a, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.set_device_memory((size_t)4 << 30);
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    for (int64_t step = 1; step <= 2; step++) {
        ckpt_checkpoint *ck;
        cr_assert_eq(ckpt_checkpoint_open(&ck, st, step, CKPT_VERIFY_QUICK), CKPT_OK);
        const char *env = ckpt_checkpoint_env(ck);
        int noted = env && strstr(env, "fell back to host") != NULL;
        cr_expect_eq(noted, step == 1, "step %lld env: %s", (long long)step, env);
        ckpt_checkpoint_free(ck);
    }
    ckpt_store_free(st);
    M.Free(a);
    expect_no_leaks(&M);
}

static void zero_tensor(void *p)
{
    memset(p, 0, N);
}

/* ckpt_save_fence(save, NULL) makes the legacy stream of the tensors'
 * device wait, whatever device the calling thread has current: a NULL
 * stream is the current device's, and a real runtime lets another
 * device's stream wait on the event without an error, leaving the
 * application's next kernel on the tensors' device racing the copy. */
static void fence_from(int current)
{
    M.set_device_count(2);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 50);
    M.SetDevice(0);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    M.set_copy_delay_us(50000); /* the snapshot copy is still running */
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.SetDevice(current);
    cr_assert_eq(ckpt_save_fence(s, NULL), CKPT_OK, "%s", ckpt_error_last());
    int cur = -1;
    M.GetDevice(&cur);
    cr_expect_eq(cur, current, "the fence left device %d current, not %d", cur, current);
    /* the application's next work on GPU 1's legacy stream overwrites w */
    M.SetDevice(1);
    cr_assert_eq(M.LaunchHostFunc(NULL, (void (*)(void *))zero_tensor, d), 0);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    M.set_copy_delay_us(0);
    expect_saved(st, 1, "w", N, 50);
    M.DeviceSynchronize();
    ckpt_store_free(st);
    M.Free(d);
}

Test(semantics, fence_on_null_stream_from_the_tensors_device)
{
    fence_from(1);
}

Test(semantics, fence_on_null_stream_from_another_device)
{
    fence_from(0);
}

/* When switching the application's thread back to its device fails (a GPU
 * in exclusive-process mode taken by another process), the failure is not
 * left in the thread's last-error slot for the application to find. */
Test(semantics, failed_switch_back_leaves_no_error_behind)
{
    M.set_device_count(2);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 7);
    M.SetDevice(0);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.GetLastError(), 0);
    /* the fence enters GPU 1 (1st cudaSetDevice) and switches back (2nd) */
    M.fault("cudaSetDevice", 2, 46 /* cudaErrorDevicesUnavailable */, 0);
    cr_assert_eq(ckpt_save_fence(s, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(M.fault_fired("cudaSetDevice"), 1, "the switch back was not tried");
    cr_expect_eq(M.GetLastError(), 0, "a failed switch back left an error for the caller");
    M.SetDevice(0);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    expect_saved(st, 1, "w", N, 7);
    ckpt_store_free(st);
    M.Free(d);
}

/* A thread that never chose a device: it reports device 0 but has no
 * context there.  Saving and restoring tensors of GPU 1 from it must not
 * create one on GPU 0 by "switching back"; a thread that did use GPU 0 is
 * switched back. */
struct fresh_thread {
    ckpt_store *st;
    void *d;
    int rc_save, rc_restore, device_after;
    char err[512];
};

static void *fresh_thread_run(void *arg)
{
    struct fresh_thread *f = arg;
    ckpt_tensor t = tensor("w", f->d, N, CKPT_MEM_DEVICE);
    f->rc_save = ckpt_save_sync(f->st, 1, &t, 1, NULL);
    if (f->rc_save == CKPT_OK)
        f->rc_restore = ckpt_restore(f->st, 1, &t, 1, NULL, NULL);
    snprintf(f->err, sizeof f->err, "%s", ckpt_error_last());
    M.GetDevice(&f->device_after);
    return NULL;
}

/* A context the application made with the driver API (cuCtxCreate,
 * PyCUDA's make_context) is current and no primary context is active:
 * the tensor's memory is that context's, which libckpt's primary-context
 * copies cannot reach.  It is refused, naming the context, for AUTO and
 * DEVICE alike: not taken for host memory (a memcpy of device memory), not
 * misreported as "host memory declared device", and nothing is saved. */
Test(semantics, a_driver_api_context_is_refused_not_read_as_host_memory)
{
    void *d = dmalloc_on(0, N);
    pattern_fill(d, N, 4);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    static int token;
    M.set_user_context(&token);
    ckpt_memory kinds[2] = {CKPT_MEM_AUTO, CKPT_MEM_DEVICE};
    int rc[2];
    char msg[2][1024];
    for (int k = 0; k < 2; k++) {
        ckpt_tensor t = tensor("w", d, N, kinds[k]);
        rc[k] = ckpt_save_sync(st, 1 + k, &t, 1, NULL);
        snprintf(msg[k], sizeof msg[k], "%s", ckpt_error_last());
    }
    M.set_user_context(NULL);
    for (int k = 0; k < 2; k++) {
        cr_expect_eq(rc[k], CKPT_EINVAL, "memory kind %d: got %d (%s)", (int)kinds[k], rc[k],
                     msg[k]);
        cr_expect(strstr(msg[k], "primary context"), "memory kind %d: %s", (int)kinds[k],
                  msg[k]);
    }
    int64_t *steps = NULL;
    size_t n = 9;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_OK);
    cr_expect_eq(n, 0, "a refused save committed");
    ckpt_free(steps);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* The same context current on another thread of the application (its
 * own worker), none on the thread that saves: no primary context is
 * active anywhere, and the pointer was taken for plain host memory (AUTO:
 * memcpy'd, a SIGSEGV on a GPU; DEVICE: "declared device memory but the
 * runtime reports host memory").  The driver, asked without a context,
 * knows the pointer: refused for both kinds, nothing saved. */
static void *make_context_here(void *arg)
{
    static int token;
    M.set_user_context(&token); /* and it stays current on this thread */
    return arg;
}

Test(semantics, a_driver_api_context_on_another_thread_is_refused_too)
{
    void *d = dmalloc_on(0, N);
    pattern_fill(d, N, 4);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, make_context_here, NULL), 0);
    pthread_join(th, NULL);
    long copies = M.calls("cudaMemcpyAsync");
    ckpt_memory kinds[2] = {CKPT_MEM_AUTO, CKPT_MEM_DEVICE};
    int rc[2];
    char msg[2][1024];
    for (int k = 0; k < 2; k++) {
        ckpt_tensor t = tensor("w", d, N, kinds[k]);
        rc[k] = ckpt_save_sync(st, 1 + k, &t, 1, NULL);
        snprintf(msg[k], sizeof msg[k], "%s", ckpt_error_last());
    }
    M.set_user_context(NULL);
    for (int k = 0; k < 2; k++) {
        cr_expect_eq(rc[k], CKPT_EINVAL, "memory kind %d: got %d (%s)", (int)kinds[k], rc[k],
                     msg[k]);
        cr_expect(strstr(msg[k], "not a device's primary context"), "memory kind %d: %s",
                  (int)kinds[k], msg[k]);
    }
    cr_expect_eq(M.calls("cudaMemcpyAsync"), copies);
    int64_t *steps = NULL;
    size_t n = 9;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_OK);
    cr_expect_eq(n, 0, "a refused save committed");
    ckpt_free(steps);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* Managed memory is every device's; the runtime's `device` for it is
 * the one current when it was allocated (GPU 0 here), the training runs
 * on GPU 1.  It was taken to live on GPU 0: a save with a GPU 1 tensor
 * was refused ("one save takes the device tensors of one device"), one on
 * GPU 1's stream failed (EDEVICE), a restore on it too (EINVAL), and a
 * save on the legacy stream did not wait for GPU 1's queued write (the
 * snapshot held the bytes from before it).  It now goes with the store's
 * device and the caller's stream there. */
static void slow_fill_7(void *p)
{
    usleep(100000);
    pattern_fill(p, N, 7);
}

Test(semantics, managed_memory_goes_with_the_device_it_is_used_on)
{
    M.set_device_count(2);
    void *m = NULL, *s1 = NULL;
    cr_assert_eq(M.SetDevice(0), 0);
    cr_assert_eq(M.MallocManaged(&m, N, 1 /* cudaMemAttachGlobal */), 0);
    pattern_fill(m, N, 5);
    void *d1 = dmalloc_on(1, N); /* GPU 1 current from here on */
    pattern_fill(d1, N, 6);
    cr_assert_eq(M.StreamCreate(&s1), 0);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s1;
    ckpt_tensor t[2] = {tensor("managed", m, N, CKPT_MEM_AUTO),
                        tensor("w", d1, N, CKPT_MEM_AUTO)};
    cr_assert_eq(ckpt_save_sync(st, 1, t, 2, &so), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 1, "managed", N, 5);
    expect_saved(st, 1, "w", N, 6);
    cr_assert_eq(ckpt_save_sync(st, 2, t, 1, &so), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 2, "managed", N, 5);
    cr_assert_eq(M.LaunchHostFunc(NULL, slow_fill_7, m), 0); /* GPU 1's legacy stream */
    cr_assert_eq(ckpt_save_sync(st, 3, t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 3, "managed", N, 7);
    memset(m, 0, N);
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s1;
    cr_assert_eq(ckpt_restore(st, 1, t, 1, &ro, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.StreamSynchronize(s1), 0);
    cr_expect_eq(pattern_check(m, N, 5), -1, "restore landed wrong bytes");
    int cur = -1;
    cr_expect_eq(M.GetDevice(&cur), 0);
    cr_expect_eq(cur, 1, "the caller's device was changed to %d", cur);
    ckpt_store_free(st);
    cr_assert_eq(M.StreamDestroy(s1), 0);
    M.Free(d1);
    M.Free(m);
    expect_no_leaks(&M);
}

/* A thread that chose GPU 1 (cudaSetDevice) but has not used it yet
 * saves a host buffer declared AUTO and a tensor of GPU 0: it keeps the
 * device it chose.  On a CUDA 11 runtime (cuda-semantics-cuda11), whose
 * cudaSetDevice makes no context, "GPU 1 has no context" was read as "the
 * thread never chose a device", and the thread was left on GPU 0: its
 * next cudaMalloc landed there. */
Test(semantics, a_thread_keeps_the_device_it_chose)
{
    M.set_device_count(2);
    void *d0 = dmalloc_on(0, N);
    pattern_fill(d0, N, 3);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    M.forget_contexts();
    cr_assert_eq(M.SetDevice(0), 0); /* GPU 0 in use (a context there) ... */
    cr_assert_eq(M.DeviceSynchronize(), 0);
    cr_assert_eq(M.SetDevice(1), 0); /* ... and GPU 1 chosen, not used yet */
    unsigned char host[4096];
    memset(host, 9, sizeof host);
    ckpt_tensor h = tensor("h", host, sizeof host, CKPT_MEM_AUTO);
    cr_assert_eq(ckpt_save_sync(st, 1, &h, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    int cur = -1;
    cr_assert_eq(M.GetDevice(&cur), 0);
    cr_expect_eq(cur, 1, "after a host save the thread is on GPU %d, not the GPU 1 it chose",
                 cur);
    cr_assert_eq(M.SetDevice(1), 0);
    ckpt_tensor t = tensor("w", d0, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.GetDevice(&cur), 0);
    cr_expect_eq(cur, 1, "after a GPU 0 save the thread is on GPU %d, not the GPU 1 it "
                 "chose", cur);
    expect_saved(st, 2, "w", N, 3);
    ckpt_store_free(st);
    M.Free(d0);
    expect_no_leaks(&M);
}

/* A child made by fork() after the parent started CUDA cannot use it
 * (every call fails with cudaErrorInitializationError on a GPU):
 * ckpt_cuda_available() said CKPT_OK there.  It says CKPT_ENODEVICE,
 * naming fork, and so does a save of device memory; host saves work. */
Test(semantics, a_forked_child_is_told_cuda_did_not_come_along)
{
    cr_assert_eq(ckpt_cuda_available(), CKPT_OK, "%s", ckpt_error_last());
    void *d = dmalloc_on(0, N);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int bad = 0;
        if (ckpt_cuda_available() != CKPT_ENODEVICE || !strstr(ckpt_error_last(), "fork()"))
            bad |= 1;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/child", root);
        ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
        o.fsync = 0;
        ckpt_store *st = NULL;
        if (ckpt_store_open(&st, sub, &o) != CKPT_OK)
            _exit(8);
        ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
        if (ckpt_save_sync(st, 1, &t, 1, NULL) != CKPT_ENODEVICE ||
            !strstr(ckpt_error_last(), "fork()"))
            bad |= 2;
        unsigned char host[64] = {1};
        ckpt_tensor h = tensor("h", host, sizeof host, CKPT_MEM_HOST);
        if (ckpt_save_sync(st, 2, &h, 1, NULL) != CKPT_OK)
            bad |= 4;
        ckpt_store_free(st);
        _exit(bad);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died: status 0x%x", status);
    cr_expect_eq(WEXITSTATUS(status), 0, "child: %s%s%s%s", WEXITSTATUS(status) & 1 ?
                 "ckpt_cuda_available did not refuse; " : "", WEXITSTATUS(status) & 2 ?
                 "a device save was not refused naming fork; " : "", WEXITSTATUS(status) & 4 ?
                 "a host save failed; " : "", WEXITSTATUS(status) == 8 ? "no store" : "");
    M.Free(d);
}

/* The store's device moved to GPU 0 (a save of a GPU 0 tensor), then a
 * managed tensor is restored on the caller's stream on GPU 1, the caller
 * on GPU 1: it goes with the caller's device, not the store's (it was
 * refused: "the CUDA stream is not on device 0, where the tensor lives"). */
Test(semantics, managed_memory_goes_with_the_callers_device_not_the_stores)
{
    M.set_device_count(2);
    void *d0 = dmalloc_on(0, N), *m = NULL, *s1 = NULL;
    pattern_fill(d0, N, 2);
    cr_assert_eq(M.SetDevice(1), 0);
    cr_assert_eq(M.MallocManaged(&m, N, 1), 0);
    pattern_fill(m, N, 5);
    cr_assert_eq(M.StreamCreate(&s1), 0);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor tm = tensor("m", m, N, CKPT_MEM_AUTO);
    ckpt_tensor td = tensor("d", d0, N, CKPT_MEM_AUTO);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s1;
    cr_assert_eq(ckpt_save_sync(st, 1, &tm, 1, &so), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_sync(st, 2, &td, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.SetDevice(1), 0);
    memset(m, 0, N);
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s1;
    cr_assert_eq(ckpt_restore(st, 1, &tm, 1, &ro, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.StreamSynchronize(s1), 0);
    cr_expect_eq(pattern_check(m, N, 5), -1, "restore landed wrong bytes");
    cr_assert_eq(ckpt_save_sync(st, 3, &tm, 1, &so), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 3, "m", N, 5);
    ckpt_store_free(st);
    cr_assert_eq(M.StreamDestroy(s1), 0);
    M.Free(d0);
    M.Free(m);
    expect_no_leaks(&M);
}

Test(semantics, thread_without_a_device_gets_no_context_on_gpu0)
{
    M.set_device_count(2);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 9);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    M.forget_contexts();
    struct fresh_thread f = { .st = st, .d = d, .device_after = -1 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, fresh_thread_run, &f), 0);
    pthread_join(th, NULL);
    cr_assert_eq(f.rc_save, CKPT_OK, "%s", f.err);
    cr_assert_eq(f.rc_restore, CKPT_OK, "%s", f.err);
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0x2u, "contexts created on devices 0x%x, want only "
                 "GPU 1 (0x2)", c.context_mask);
    cr_expect_eq(f.device_after, 1, "the thread was left on device %d", f.device_after);
    cr_expect_eq(pattern_check(d, N, 9), -1, "restore landed wrong bytes");

    /* the main thread has used GPU 0: it gets GPU 0 back */
    M.SetDevice(0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    int cur = -1;
    M.GetDevice(&cur);
    cr_expect_eq(cur, 0, "the caller's device changed to %d", cur);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* A restore given cudaStreamPerThread: the handle means the calling
 * thread's own stream, so the library's workers must not use it as theirs
 * (their copies would race the application's queued work).  Here the
 * application's last "kernel" on its per-thread stream is still writing
 * the tensor when restore starts: the restored bytes must land after it. */
Test(semantics, restore_on_the_per_thread_stream_follows_the_callers_work)
{
    void *d = dmalloc_on(0, N);
    pattern_fill(d, N, 21);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    fill_kernel k = { d, N, 22, 50000 };
    void *per_thread = (void *)(uintptr_t)2; /* cudaStreamPerThread */
    cr_assert_eq(M.LaunchHostFunc(per_thread, kernel_fill, &k), 0);
    ckpt_restore_options o = CKPT_RESTORE_OPTIONS_INIT;
    o.cuda_stream = per_thread;
    cr_assert_eq(ckpt_restore(st, 1, &t, 1, &o, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.StreamSynchronize(per_thread), 0);
    long at = pattern_check(d, N, 21);
    cr_expect_eq(at, -1, "the restored bytes were overwritten by the application's "
                 "earlier work (differs at byte %ld)", at);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* The application captures a CUDA graph (global mode, torch.cuda.graph's
 * default) on its own stream while a save of device tensors persists: the
 * library's threads wait on events and free memory meanwhile, calls a
 * global capture forbids to every thread in the default mode, which would
 * break the application's capture.  They run in relaxed mode. */
Test(semantics, library_threads_leave_an_application_capture_alone)
{
    void *d = dmalloc_on(0, N);
    pattern_fill(d, N, 11);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    void *s, *graph = NULL;
    cr_assert_eq(M.StreamCreate(&s), 0);
    M.set_copy_delay_us(20000); /* the save's copies outlast the capture's start */
    ckpt_save *save;
    cr_assert_eq(ckpt_save_begin(&save, st, 1, &t, 1, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    mock_cuda_counters before, after;
    M.get_counters(&before);
    cr_assert_eq(M.StreamBeginCapture(s, 0 /* cudaStreamCaptureModeGlobal */), 0);
    cr_assert_eq(ckpt_save_wait(save), CKPT_OK, "%s", ckpt_error_last());
    M.get_counters(&after);
    cr_expect_eq(M.StreamEndCapture(s, &graph), 0, "the application's capture broke "
                 "(%ld calls refused)", after.capture_breaks - before.capture_breaks);
    M.GraphDestroy(graph);
    ckpt_save_free(save);
    M.set_copy_delay_us(0);
    expect_saved(st, 1, "w", N, 11);
    M.StreamDestroy(s);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* Another thread of the application captures a CUDA graph in global mode
 * (torch.cuda.graph's default) while this one closes a store holding
 * pinned memory: the store's waits and frees on this thread were refused
 * in the default mode and broke that capture (cudaStreamEndCapture gave
 * cudaErrorStreamCaptureInvalidated), and the pinned buffers stayed
 * page-locked.  Closing runs in relaxed mode, and gives the mode back. */
struct capturer {
    void *s, *graph;
    int end_rc;
    pthread_barrier_t begun, go;
};

static void *capture_on_its_stream(void *arg)
{
    struct capturer *c = arg;
    c->end_rc = M.StreamBeginCapture(c->s, 0 /* cudaStreamCaptureModeGlobal */);
    pthread_barrier_wait(&c->begun);
    pthread_barrier_wait(&c->go);
    if (c->end_rc == 0)
        c->end_rc = M.StreamEndCapture(c->s, &c->graph);
    return NULL;
}

Test(semantics, closing_a_store_leaves_another_threads_capture_alone)
{
    void *d = dmalloc_on(0, N);
    pattern_fill(d, N, 12);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_gt(ckpt_store_pinned_bytes(st), 0, "no pinned memory to free");
    struct capturer c = {0};
    cr_assert_eq(M.StreamCreate(&c.s), 0);
    pthread_barrier_init(&c.begun, NULL, 2);
    pthread_barrier_init(&c.go, NULL, 2);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, capture_on_its_stream, &c), 0);
    pthread_barrier_wait(&c.begun);
    ckpt_store_free(st);
    pthread_barrier_wait(&c.go);
    pthread_join(th, NULL);
    cr_expect_eq(c.end_rc, 0, "the other thread's capture broke: %d", c.end_rc);
    mock_cuda_counters k;
    M.get_counters(&k);
    cr_expect_eq(k.pinned_allocs, 0, "%ld pinned buffers left page-locked", k.pinned_allocs);
    int mode = 1;
    cr_assert(M.ThreadExchangeStreamCaptureMode, "mock lacks the call");
    cr_assert_eq(M.ThreadExchangeStreamCaptureMode(&mode), 0);
    cr_expect_eq(mode, 0, "this thread was left in capture mode %d, not its global mode", mode);
    M.GraphDestroy(c.graph);
    M.StreamDestroy(c.s);
    pthread_barrier_destroy(&c.begun);
    pthread_barrier_destroy(&c.go);
    M.Free(d);
    expect_no_leaks(&M);
}

/* A pinned buffer that cudaFreeHost refuses to free (a dead context) is
 * still page-locked: it stays counted, so the pinned cap still bounds
 * what is locked (it was subtracted: with a 3 MiB cap, 4 MiB ended up
 * locked while the store reported 3). */
Test(semantics, a_pinned_buffer_cuda_cannot_free_stays_counted)
{
    const size_t MIB = (size_t)1 << 20;
    void *d = dmalloc_on(0, 3 * MIB);
    pattern_fill(d, 3 * MIB, 13);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 3 * MIB);
    mock_cuda_counters k;
    for (size_t mib = 1; mib <= 3; mib++) {
        if (mib == 2)
            M.fault("cudaFreeHost", 1, 900 /* cudaErrorStreamCaptureUnsupported */, 0);
        ckpt_tensor t = tensor("w", d, mib * MIB, CKPT_MEM_DEVICE);
        cr_assert_eq(ckpt_save_sync(st, (int64_t)mib, &t, 1, NULL), CKPT_OK, "%s",
                     ckpt_error_last());
        M.get_counters(&k);
        cr_expect_eq(ckpt_store_pinned_bytes(st), k.pinned_bytes, "after the %zu MiB save "
                     "the store counts %llu pinned bytes, the runtime holds %zu", mib,
                     (unsigned long long)ckpt_store_pinned_bytes(st), k.pinned_bytes);
        cr_expect_leq(k.pinned_bytes, 3 * MIB, "%zu bytes locked over the 3 MiB cap",
                      k.pinned_bytes);
    }
    cr_expect_eq(M.fault_fired("cudaFreeHost"), 1, "the failure was not injected");
    ckpt_store_free(st);
    M.Free(d);
}

/* DEVICE mode, a device state larger than pinned_limit (1 GiB by default):
 * staged on the GPU, its drains to a pageable buffer would be synchronous,
 * and the caller issues a batch of them every 64 MiB. */
Test(semantics, device_mode_state_over_the_pinned_cap)
{
    size_t big = (size_t)48 << 20;
    void *a = dmalloc_on(0, big), *b = dmalloc_on(0, big);
    pattern_fill(a, big, 1);
    pattern_fill(b, big, 2);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_DEVICE, (uint64_t)16 << 20);
    ckpt_tensor t[2] = {tensor("a", a, big, CKPT_MEM_DEVICE),
                        tensor("b", b, big, CKPT_MEM_DEVICE)};
    mock_cuda_thread_counters before, after;
    M.get_thread_counters(&before);
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.get_thread_counters(&after);
    cr_expect_eq(after.pageable_copies - before.pageable_copies, 0,
                 "begin ran %ld device copies through pageable memory on the caller",
                 after.pageable_copies - before.pageable_copies);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    expect_saved(st, 1, "a", big, 1);
    expect_saved(st, 1, "b", big, 2);
    ckpt_store_free(st);
    M.Free(a);
    M.Free(b);
    expect_no_leaks(&M);
}

/* A state that grows (an optimizer's moments appear after the first step)
 * needs a larger pinned snapshot buffer.  cudaFreeHost, like cudaFree,
 * waits for the whole device, so begin must not free the old one on the
 * caller's thread: it is retired and freed by the persist thread.  Under
 * a pinned cap too small for both, begin frees it itself rather than fall
 * back to pageable memory, and stays under the cap. */
static void growing_state(uint64_t pinned_limit, long frees_allowed)
{
    M.set_device_count(1);
    void *d[3];
    char names[3][8];
    ckpt_tensor t[3];
    for (int i = 0; i < 3; i++) {
        d[i] = dmalloc_on(0, N);
        pattern_fill(d[i], N, 50 + (unsigned)i);
        snprintf(names[i], sizeof names[i], "m%d", i);
        t[i] = tensor(names[i], d[i], N, CKPT_MEM_DEVICE);
    }
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, pinned_limit);
    for (int64_t step = 1; step <= 3; step++) {
        size_t count = (size_t)step; /* 1, 2, then 3 tensors */
        mock_cuda_thread_counters before, after;
        M.get_thread_counters(&before);
        ckpt_save *s;
        cr_assert_eq(ckpt_save_begin(&s, st, step, t, count, NULL), CKPT_OK, "%s",
                     ckpt_error_last());
        M.get_thread_counters(&after);
        cr_expect_leq(after.frees - before.frees, frees_allowed,
                      "begin of step %lld called cudaFreeHost %ld times",
                      (long long)step, after.frees - before.frees);
        cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
        ckpt_save_free(s);
        cr_expect_leq(ckpt_store_pinned_bytes(st), pinned_limit ? pinned_limit : UINT64_MAX,
                      "pinned bytes %llu", (unsigned long long)ckpt_store_pinned_bytes(st));
        for (size_t i = 0; i < count; i++)
            expect_saved(st, step, names[i], N, 50 + (unsigned)i);
    }
    ckpt_store_free(st);
    for (int i = 0; i < 3; i++)
        M.Free(d[i]);
    expect_no_leaks(&M);
}

Test(semantics, growing_state_never_frees_pinned_memory_in_begin)
{
    growing_state(0, 0);
}

Test(semantics, growing_state_under_a_tight_pinned_cap_stays_under_it)
{
    growing_state(3 * N + N / 2, 1);
}

/* ckpt_save_wait_snapshot from a thread that never made a CUDA call: its
 * event waits must not create a context on GPU 0 (the runtime binds such
 * a thread to device 0 on its first call) when the tensors are on GPU 1. */
struct waiter {
    ckpt_save *s;
    int rc;
    char err[512];
};

static void *waiter_run(void *arg)
{
    struct waiter *w = arg;
    w->rc = ckpt_save_wait_snapshot(w->s);
    snprintf(w->err, sizeof w->err, "%s", ckpt_error_last());
    return NULL;
}

Test(semantics, waiting_from_a_fresh_thread_creates_no_context_on_gpu0)
{
    M.set_device_count(2);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 60);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    M.forget_contexts();
    M.set_copy_delay_us(2000);
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    struct waiter w = { .s = s, .rc = -1 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, waiter_run, &w), 0);
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, CKPT_OK, "%s", w.err);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    M.set_copy_delay_us(0);
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0x2u, "contexts created on devices 0x%x, want only "
                 "GPU 1 (0x2)", c.context_mask);
    expect_saved(st, 1, "w", N, 60);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* A process that has the runtime loaded but never used CUDA (a framework
 * imported, no GPU work yet) saving host buffers declared CKPT_MEM_AUTO:
 * with no context on any device no device memory can exist, so libckpt
 * must not ask (cudaPointerGetAttributes would create a context on GPU 0:
 * hundreds of MiB there, and a failure in exclusive-process mode). */
Test(semantics, auto_host_buffers_create_no_context_when_none_exists)
{
    M.set_device_count(2);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    M.forget_contexts();
    char *h = malloc(N);
    pattern_fill(h, N, 4);
    long asked = M.calls("cudaPointerGetAttributes");
    ckpt_tensor t = tensor("h", h, N, CKPT_MEM_AUTO);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    memset(h, 0, N);
    cr_assert_eq(ckpt_restore(st, 1, &t, 1, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(pattern_check(h, N, 4), -1, "restore landed wrong bytes");
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0u, "contexts created on devices 0x%x", c.context_mask);
    cr_expect_eq(M.calls("cudaPointerGetAttributes"), asked, "CUDA was asked about a "
                 "host buffer with no context anywhere");
    /* once a device has a context, AUTO asks CUDA again (device memory may exist) */
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 5);
    t.data = d;
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_gt(M.calls("cudaPointerGetAttributes"), asked);
    ckpt_store_free(st);
    M.Free(d);
    free(h);
    expect_no_leaks(&M);
}

/* ckpt_save_fence with an explicit stream of GPU 1, from a thread that
 * never made a CUDA call: the wait may be enqueued from any device, but
 * the runtime would first give the thread a context on GPU 0. */
struct fencer {
    ckpt_save *s;
    void *stream;
    int rc;
    char err[512];
};

static void *fencer_run(void *arg)
{
    struct fencer *f = arg;
    f->rc = ckpt_save_fence(f->s, f->stream);
    snprintf(f->err, sizeof f->err, "%s", ckpt_error_last());
    return NULL;
}

Test(semantics, fencing_from_a_fresh_thread_creates_no_context_on_gpu0)
{
    M.set_device_count(2);
    cr_assert_eq(M.SetDevice(1), 0);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 61);
    void *s1;
    cr_assert_eq(M.StreamCreate(&s1), 0);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    ckpt_tensor t = tensor("w", d, N, CKPT_MEM_DEVICE);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s1;
    M.forget_contexts();
    ckpt_save *s;
    cr_assert_eq(ckpt_save_begin(&s, st, 1, &t, 1, &so), CKPT_OK, "%s", ckpt_error_last());
    struct fencer f = { .s = s, .stream = s1, .rc = -1 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, fencer_run, &f), 0);
    pthread_join(th, NULL);
    cr_assert_eq(f.rc, CKPT_OK, "%s", f.err);
    cr_assert_eq(ckpt_save_wait(s), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(s);
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0x2u, "contexts created on devices 0x%x, want only "
                 "GPU 1 (0x2)", c.context_mask);
    expect_saved(st, 1, "w", N, 61);
    ckpt_store_free(st);
    cr_assert_eq(M.StreamSynchronize(s1), 0);
    M.StreamDestroy(s1);
    M.Free(d);
    M.SetDevice(0);
    expect_no_leaks(&M);
}

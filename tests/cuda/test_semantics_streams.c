/* The device path under the real runtime's rules, enforced by the strict
 * mock (mock_cudart.h), part 2: streams and memory.  Pageable copies that
 * block, bounded stream queues, cudaFree that synchronizes, pinned
 * memory under its cap, graph capture on the application's streams.
 * Part 1, test_semantics_gpus.c, holds devices and contexts.  Each test
 * failed against the device code before it followed these rules. */
#include "semantics_util.h"

TestSuite(semantics, .init = setup, .fini = teardown, .timeout = 120);

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

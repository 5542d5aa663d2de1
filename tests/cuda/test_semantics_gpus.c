/* The device path under the real runtime's rules, enforced by the strict
 * mock (mock_cudart.h), part 1: devices and contexts.  Several devices,
 * device-bound streams and events, a caller's device and contexts left as
 * they were (no context created by a stray call, on a fresh thread or a
 * library one), driver-API contexts, managed memory, fork.  Part 2,
 * test_semantics_streams.c, holds streams, pinned memory and graph
 * capture.  Each test failed against the device code before it followed
 * these rules. */
#include "semantics_util.h"

TestSuite(semantics, .init = setup, .fini = teardown, .timeout = 120);

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
    void *stream;   /* the caller's stream for both, or NULL */
    int free_store; /* only ckpt_store_free, from this thread */
    int rc_save, rc_restore, device_after;
    char err[512];
};

static void *fresh_thread_run(void *arg)
{
    struct fresh_thread *f = arg;
    if (f->free_store) {
        ckpt_store_free(f->st);
        return NULL;
    }
    ckpt_tensor t = tensor("w", f->d, N, CKPT_MEM_DEVICE);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    so.cuda_stream = ro.cuda_stream = f->stream;
    f->rc_save = ckpt_save_sync(f->st, 1, &t, 1, &so);
    if (f->rc_save == CKPT_OK)
        f->rc_restore = ckpt_restore(f->st, 1, &t, 1, &ro, NULL);
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

/* The same with the caller's stream (on GPU 1) given to the save and the
 * restore: the check that it is not capturing a graph is asked from GPU 1
 * too.  Then the store freed from a fresh thread: switching its capture
 * mode is done from GPU 1 as well.  On a CUDA 11 runtime (run again by
 * cuda-semantics-cuda11-threads) both made a context on GPU 0 before. */
Test(semantics, fresh_threads_with_a_stream_or_a_free_make_no_context_on_gpu0)
{
    M.set_device_count(2);
    void *d = dmalloc_on(1, N);
    pattern_fill(d, N, 6);
    void *s1 = NULL;
    cr_assert_eq(M.SetDevice(1), 0);
    cr_assert_eq(M.StreamCreate(&s1), 0);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0);
    cr_assert_eq(M.SetDevice(0), 0); /* CUDA 11: no context from this alone */
    M.forget_contexts();
    struct fresh_thread f = { .st = st, .d = d, .stream = s1, .device_after = -1 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, fresh_thread_run, &f), 0);
    pthread_join(th, NULL);
    cr_assert_eq(f.rc_save, CKPT_OK, "%s", f.err);
    cr_assert_eq(f.rc_restore, CKPT_OK, "%s", f.err);
    cr_expect_eq(pattern_check(d, N, 6), -1, "restore landed wrong bytes"); /* complete */
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0x2u, "save and restore with a stream: contexts on devices "
                 "0x%x, want only GPU 1 (0x2)", c.context_mask);
    M.forget_contexts();
    struct fresh_thread g = { .st = st, .free_store = 1 };
    cr_assert_eq(pthread_create(&th, NULL, fresh_thread_run, &g), 0);
    pthread_join(th, NULL);
    M.get_counters(&c);
    cr_expect_eq(c.context_mask, 0x2u, "ckpt_store_free: contexts on devices 0x%x, want only "
                 "GPU 1 (0x2)", c.context_mask);
    cr_assert_eq(M.SetDevice(1), 0);
    cr_assert_eq(M.StreamDestroy(s1), 0);
    M.Free(d);
    expect_no_leaks(&M);
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

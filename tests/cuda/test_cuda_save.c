/* Saves and restores of device tensors through the public API, with the
 * real cuda backend running against the mock runtime (CKPT_CUDART_LIBRARY).
 *
 * The mock's "kernels" are host functions run in stream order
 * (cudaLaunchHostFunc): a slow one that writes state A before the save and
 * one that writes state B after it lets us check exactly which state the
 * checkpoint captured. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "cuda_test_util.h"

#define N ((size_t)1 << 20)   /* bytes per device tensor */
#define CHUNK ((uint64_t)64 << 10)
#define CU_OOM 2
#define CU_UNAVAILABLE 46
#define CU_ILLEGAL_ADDRESS 700
#define CU_UNKNOWN 999

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

TestSuite(cuda_save, .init = setup, .fini = teardown, .timeout = 120);

static ckpt_store *open_store(ckpt_snapshot_mode mode, uint64_t pinned_limit,
                              uint64_t host_limit)
{
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    o.threads = 2;
    o.chunk_bytes = CHUNK;
    o.snapshot_mode = mode;
    o.pinned_limit = pinned_limit;
    o.host_memory_limit = host_limit;
    cr_assert_eq(ckpt_store_open(&st, root, &o), CKPT_OK, "%s", ckpt_error_last());
    return st;
}

static int64_t g_shape[1] = { (int64_t)(N / 4) };

static ckpt_tensor dtensor(const char *name, void *p, ckpt_memory mem)
{
    return (ckpt_tensor){ name, p, N, CKPT_F32, 1, g_shape, mem };
}

static void *dmalloc(void)
{
    void *p = NULL;
    cr_assert_eq(M.Malloc(&p, N), 0);
    return p;
}

/* Load tensor `name` of `step` into host memory and compare with `seed`. */
static void expect_saved(ckpt_store *st, int64_t step, const char *name, unsigned seed)
{
    void *data = NULL;
    uint64_t bytes = 0;
    cr_assert_eq(ckpt_load(st, step, name, &data, &bytes, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(bytes, N);
    long at = pattern_check(data, N, seed);
    cr_expect_eq(at, -1, "step %lld tensor '%s' differs from state %u at byte %ld",
                 (long long)step, name, seed, at);
    ckpt_free(data);
}

static size_t nsteps(ckpt_store *st)
{
    int64_t *steps;
    size_t n;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_OK);
    ckpt_free(steps);
    return n;
}

/* The application's own cudaStreamSynchronize: the mock counts it as a
 * spinning wait (it is one); those are added to *spins so that a test can
 * tell them from the library's. */
static int app_sync(void *stream, long *spins)
{
    mock_cuda_counters a, b;
    M.get_counters(&a);
    int rc = M.StreamSynchronize(stream);
    M.get_counters(&b);
    *spins += b.spin_waits - a.spin_waits;
    return rc;
}

/* The caller's slow kernel writes state A on stream s, the save is ordered
 * after it, a fence orders state B after the snapshot: the checkpoint holds
 * A exactly; then the whole state restores into fresh device buffers. */
static void fenced_save(ckpt_snapshot_mode mode, uint64_t host_limit)
{
    ckpt_store *st = open_store(mode, 0, host_limit);
    long app_spins = 0;
    void *s, *d1 = dmalloc(), *d2 = dmalloc();
    cr_assert_eq(M.StreamCreate(&s), 0);
    char *h = malloc(N);
    pattern_fill(h, N, 9);

    M.set_copy_delay_us(1000); /* each 64 KiB copy takes 1 ms */
    fill_kernel a1 = { d1, N, 1, 150000 }, a2 = { d2, N, 2, 50000 };
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &a1), 0);
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &a2), 0);

    ckpt_tensor t[3] = { dtensor("layer1", d1, CKPT_MEM_DEVICE),
                         dtensor("layer2", d2, CKPT_MEM_AUTO),
                         dtensor("host", h, CKPT_MEM_AUTO) };
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save;
    cr_assert_eq(ckpt_save_begin(&save, st, 10, t, 3, &so), CKPT_OK, "%s",
                 ckpt_error_last());
    pattern_fill(h, N, 19); /* host tensors are free once begin returns */
    cr_assert_eq(ckpt_save_fence(save, s), CKPT_OK, "%s", ckpt_error_last());
    fill_kernel b1 = { d1, N, 11, 0 }, b2 = { d2, N, 12, 0 };
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &b1), 0);
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &b2), 0);
    cr_assert_eq(ckpt_save_wait(save), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(save);
    cr_assert_eq(app_sync(s, &app_spins), 0);
    cr_expect_eq(pattern_check(d1, N, 11), -1, "state B never reached the buffer");

    expect_saved(st, 10, "layer1", 1);
    expect_saved(st, 10, "layer2", 2);
    expect_saved(st, 10, "host", 9);

    /* restore into device buffers on another stream */
    void *r1 = dmalloc(), *r2 = dmalloc(), *rs;
    char *rh = calloc(1, N);
    cr_assert_eq(M.StreamCreate(&rs), 0);
    ckpt_tensor rt[3] = { dtensor("layer1", r1, CKPT_MEM_DEVICE),
                          dtensor("layer2", r2, CKPT_MEM_AUTO),
                          dtensor("host", rh, CKPT_MEM_AUTO) };
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = rs;
    ckpt_report *rep = NULL;
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, rt, 3, &ro, &rep), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_expect_eq(ckpt_report_step(rep), 10);
    ckpt_report_free(rep);
    cr_assert_eq(app_sync(rs, &app_spins), 0);
    cr_expect_eq(pattern_check(r1, N, 1), -1);
    cr_expect_eq(pattern_check(r2, N, 2), -1);
    cr_expect_eq(pattern_check(rh, N, 9), -1);
    cr_expect_gt(ckpt_store_pinned_bytes(st), 0, "no pinned memory was used");
    /* Workers wait for copies with cudaEventSynchronize: on events made
     * without cudaEventBlockingSync each such wait spins a core. */
    mock_cuda_counters cnt;
    M.get_counters(&cnt);
    cr_expect_eq(cnt.spin_waits - app_spins, 0, "%ld waits spun a CPU core (event created "
                 "without cudaEventBlockingSync, or cudaStreamSynchronize)",
                 cnt.spin_waits - app_spins);

    ckpt_store_free(st);
    M.StreamDestroy(s);
    M.StreamDestroy(rs);
    M.Free(d1);
    M.Free(d2);
    M.Free(r1);
    M.Free(r2);
    free(h);
    free(rh);
    expect_no_leaks(&M);
}

Test(cuda_save, host_mode_captures_the_stream_state) { fenced_save(CKPT_SNAPSHOT_HOST, 0); }
Test(cuda_save, device_mode_captures_the_stream_state) { fenced_save(CKPT_SNAPSHOT_DEVICE, 0); }
Test(cuda_save, stream_mode_captures_the_stream_state) { fenced_save(CKPT_SNAPSHOT_STREAM, 0); }
/* a state three times the snapshot buffer: saved in passes */
Test(cuda_save, passes_capture_the_stream_state) { fenced_save(CKPT_SNAPSHOT_HOST, N); }

/* ckpt_save_wait_snapshot: after it, the CPU may overwrite device buffers. */
static void wait_snapshot(ckpt_snapshot_mode mode)
{
    ckpt_store *st = open_store(mode, 0, 0);
    void *d = dmalloc();
    M.set_copy_delay_us(2000);
    fill_kernel a = { d, N, 3, 100000 };
    cr_assert_eq(M.LaunchHostFunc(NULL, kernel_fill, &a), 0); /* legacy stream */
    ckpt_tensor t = dtensor("w", d, CKPT_MEM_DEVICE);
    ckpt_save *save;
    cr_assert_eq(ckpt_save_begin(&save, st, 1, &t, 1, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_save_wait_snapshot(save), CKPT_OK, "%s", ckpt_error_last());
    pattern_fill(d, N, 4); /* the mock's device memory is host memory */
    cr_assert_eq(ckpt_save_wait(save), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(save);
    expect_saved(st, 1, "w", 3);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(cuda_save, wait_snapshot_host_mode) { wait_snapshot(CKPT_SNAPSHOT_HOST); }
Test(cuda_save, wait_snapshot_device_mode) { wait_snapshot(CKPT_SNAPSHOT_DEVICE); }
Test(cuda_save, wait_snapshot_stream_mode) { wait_snapshot(CKPT_SNAPSHOT_STREAM); }

/* A "kernel" that holds its stream until the test opens the gate. */
static volatile int gate_open;
static void gate_kernel(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE))
        usleep(200);
}

/* STREAM mode with a state eight times the pinned pool: the pool stays
 * within its cap, the passes run behind ckpt_save_begin (which returns while
 * the caller's stream is still held by a kernel, so no chunk can have been
 * copied yet), and once ckpt_save_wait_snapshot returns the buffers may
 * change. */
Test(cuda_save, stream_mode_passes_through_a_bounded_pool)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_STREAM, 2 * CHUNK, 0);
    void *s, *d1 = dmalloc(), *d2 = dmalloc();
    cr_assert_eq(M.StreamCreate(&s), 0);
    pattern_fill(d1, N, 21);
    pattern_fill(d2, N, 22);
    M.set_copy_delay_us(500);
    gate_open = 0;
    cr_assert_eq(M.LaunchHostFunc(s, gate_kernel, NULL), 0);
    ckpt_tensor t[2] = { dtensor("a", d1, CKPT_MEM_DEVICE), dtensor("b", d2, CKPT_MEM_DEVICE) };
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save;
    cr_assert_eq(ckpt_save_begin(&save, st, 4, t, 2, &so), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_done(save), 0);
    __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
    cr_assert_leq(ckpt_store_pinned_bytes(st), 2 * CHUNK, "pinned pool over its cap: %llu",
                  (unsigned long long)ckpt_store_pinned_bytes(st));
    cr_assert_eq(ckpt_save_wait_snapshot(save), CKPT_OK, "%s", ckpt_error_last());
    pattern_fill(d1, N, 31);
    pattern_fill(d2, N, 32);
    cr_assert_eq(ckpt_save_wait(save), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(save);
    cr_assert_leq(ckpt_store_pinned_bytes(st), 2 * CHUNK);
    expect_saved(st, 4, "a", 21);
    expect_saved(st, 4, "b", 22);
    ckpt_store_free(st);
    M.StreamDestroy(s);
    M.Free(d1);
    M.Free(d2);
    expect_no_leaks(&M);
}

/* Opens the gate after `arg` (a flag the test sets once ckpt_save_begin
 * has returned) or after ten seconds, whichever is first: a begin that
 * waited for the gated stream would otherwise never return. */
static void *gate_breaker(void *arg)
{
    volatile int *returned = arg;
    for (int i = 0; i < 10000 && !__atomic_load_n(returned, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    int by_timeout = !__atomic_load_n(returned, __ATOMIC_ACQUIRE);
    __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
    return (void *)(intptr_t)by_timeout;
}

/* A host_memory_limit below the device state (the snapshot buffer wraps):
 * the wrapping must happen on the persist thread, never in
 * ckpt_save_begin, which would wait there for the copies queued behind the
 * caller's GPU work.  Here the caller's stream is held by a kernel until
 * begin returns: begin must return while it is held. */
static void limit_below_state(ckpt_snapshot_mode mode)
{
    ckpt_store *st = open_store(mode, 64 * N, 2 * CHUNK);
    void *s, *d1 = dmalloc(), *d2 = dmalloc();
    cr_assert_eq(M.StreamCreate(&s), 0);
    pattern_fill(d1, N, 41);
    pattern_fill(d2, N, 42);
    gate_open = 0;
    cr_assert_eq(M.LaunchHostFunc(s, gate_kernel, NULL), 0);
    static volatile int returned;
    returned = 0;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, gate_breaker, (void *)&returned), 0);
    ckpt_tensor t[2] = { dtensor("a", d1, CKPT_MEM_DEVICE), dtensor("b", d2, CKPT_MEM_DEVICE) };
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    ckpt_save *save;
    int rc = ckpt_save_begin(&save, st, 5, t, 2, &so);
    __atomic_store_n(&returned, 1, __ATOMIC_RELEASE);
    void *by_timeout;
    pthread_join(th, &by_timeout);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq((intptr_t)by_timeout, 0, "ckpt_save_begin waited for the caller's stream");
    cr_assert_eq(ckpt_save_wait_snapshot(save), CKPT_OK, "%s", ckpt_error_last());
    pattern_fill(d1, N, 51);
    cr_assert_eq(ckpt_save_wait(save), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(save);
    expect_saved(st, 5, "a", 41);
    expect_saved(st, 5, "b", 42);
    ckpt_store_free(st);
    M.StreamDestroy(s);
    M.Free(d1);
    M.Free(d2);
    expect_no_leaks(&M);
}

Test(cuda_save, a_host_memory_limit_below_the_state_never_waits_in_begin)
{
    limit_below_state(CKPT_SNAPSHOT_HOST);
}

Test(cuda_save, a_host_memory_limit_below_the_state_never_waits_in_begin_device_mode)
{
    limit_below_state(CKPT_SNAPSHOT_DEVICE);
}

Test(cuda_save, a_host_memory_limit_below_the_state_never_waits_in_begin_stream_mode)
{
    limit_below_state(CKPT_SNAPSHOT_STREAM);
}

/* Separate cudaMalloc allocations often sit next to each other in the
 * address space (the mock places them so here).  Chunks of two tensors in
 * two such allocations are contiguous on both sides, yet one copy over
 * both would run out of its allocation (cudaErrorInvalidValue on a real
 * device): copies join across tensors only inside one allocation (the
 * driver's cuMemGetAddressRange says which), as for tensors that are
 * views of one block (a framework's caching allocator), which still go in
 * one copy. */
Test(cuda_save, copies_never_span_two_allocations)
{
    M.set_adjacent(8 * N);
    void *d1 = dmalloc(), *d2 = dmalloc(), *block = NULL;
    M.set_adjacent(0);
    cr_assert_eq((char *)d2, (char *)d1 + N, "the mock's allocations are not adjacent");
    cr_assert_eq(M.Malloc(&block, 2 * N), 0);
    pattern_fill(d1, N, 61);
    pattern_fill(d2, N, 62);
    pattern_fill(block, N, 63);
    pattern_fill((char *)block + N, N, 64);
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 64 * N, 0);
    ckpt_tensor t[2] = { dtensor("a", d1, CKPT_MEM_DEVICE), dtensor("b", d2, CKPT_MEM_DEVICE) };
    cr_assert_eq(ckpt_save_sync(st, 6, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 6, "a", 61);
    expect_saved(st, 6, "b", 62);
    long before = M.calls("cudaMemcpyAsync");
    ckpt_tensor v[2] = { dtensor("c", block, CKPT_MEM_DEVICE),
                         dtensor("d", (char *)block + N, CKPT_MEM_DEVICE) };
    cr_assert_eq(ckpt_save_sync(st, 7, v, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(M.calls("cudaMemcpyAsync") - before, 1,
                 "two views of one allocation: one copy, not %ld",
                 M.calls("cudaMemcpyAsync") - before);
    expect_saved(st, 7, "c", 63);
    expect_saved(st, 7, "d", 64);
    ckpt_store_free(st);
    M.Free(d1);
    M.Free(d2);
    M.Free(block);
    expect_no_leaks(&M);
}

Test(cuda_save, device_mode_uses_spare_device_memory)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_DEVICE, 0, 0);
    void *d = dmalloc();
    pattern_fill(d, N, 5);
    ckpt_tensor t = dtensor("w", d, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_geq(c.device_bytes_peak, 2 * N, "DEVICE mode did not stage in device memory "
                  "(peak %zu bytes)", c.device_bytes_peak);
    expect_saved(st, 1, "w", 5);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(cuda_save, environment_names_the_gpu)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *d = dmalloc();
    pattern_fill(d, N, 6);
    ckpt_tensor t = dtensor("w", d, CKPT_MEM_AUTO);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    ckpt_checkpoint *ck;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK, "%s", ckpt_error_last());
    json_error_t jerr;
    json_t *env = json_loads(ckpt_checkpoint_env(ck), 0, &jerr);
    cr_assert_not_null(env, "environment is not JSON: %s", jerr.text);
    json_t *cu = json_object_get(env, "cuda");
    cr_assert_not_null(cu, "no \"cuda\" in %s", ckpt_checkpoint_env(ck));
    cr_expect_str_eq(json_string_value(json_object_get(cu, "gpu_name")), "Mock CUDA Device 0");
    cr_expect_str_eq(json_string_value(json_object_get(cu, "driver_version")), "13.0");
    cr_expect_str_eq(json_string_value(json_object_get(cu, "runtime_version")), "13.0");
    json_decref(env);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(cuda_save, pinned_cap_is_respected)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, N / 2, 0);
    void *d = dmalloc();
    pattern_fill(d, N, 7);
    ckpt_tensor t = dtensor("w", d, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_leq(ckpt_store_pinned_bytes(st), N / 2);
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_leq(c.pinned_bytes, N / 2, "%zu pinned bytes in use", c.pinned_bytes);
    expect_saved(st, 1, "w", 7);
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

/* A CUDA fault ends the save with CKPT_EDEVICE naming the error and the
 * tensor; nothing is committed; the earlier checkpoint restores; the store
 * takes the next save. */
static void save_fault(const char *fn, int nth, int err, unsigned flags,
                       const char *err_name, const char *tensor)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *d1 = dmalloc(), *d2 = dmalloc();
    pattern_fill(d1, N, 1);
    pattern_fill(d2, N, 2);
    ckpt_tensor t[2] = { dtensor("layer1", d1, CKPT_MEM_DEVICE),
                         dtensor("layer2", d2, CKPT_MEM_DEVICE) };
    if (strcmp(fn, "cudaHostAlloc") != 0) /* that one must hit the first save */
        cr_assert_eq(ckpt_save_sync(st, 1, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());

    pattern_fill(d1, N, 3);
    pattern_fill(d2, N, 4);
    M.fault(fn, nth, err, flags);
    ckpt_save *save = NULL;
    int rc = ckpt_save_begin(&save, st, 2, t, 2, NULL);
    if (rc == CKPT_OK)
        rc = ckpt_save_wait(save);
    cr_assert_eq(rc, CKPT_EDEVICE, "got %d (%s): %s", rc, ckpt_strerror(rc),
                 ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), err_name), "no %s in: %s", err_name,
              ckpt_error_last());
    if (tensor)
        cr_expect(strstr(ckpt_error_last(), tensor), "no tensor %s in: %s", tensor,
                  ckpt_error_last());
    ckpt_save_free(save);
    cr_expect_eq(M.fault_fired(fn), 1);
    cr_expect_eq(nsteps(st), strcmp(fn, "cudaHostAlloc") ? 1 : 0, "step 2 was committed");
    if (strcmp(fn, "cudaHostAlloc") != 0) {
        expect_saved(st, 1, "layer1", 1);
        expect_saved(st, 1, "layer2", 2);
    }

    M.reset();
    cr_assert_eq(ckpt_save_sync(st, 3, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 3, "layer1", 3);
    expect_saved(st, 3, "layer2", 4);
    ckpt_store_free(st);
    M.Free(d1);
    M.Free(d2);
    expect_no_leaks(&M);
}

/* 16 chunks per tensor: the 20th copy is layer2's 4th chunk */
Test(cuda_save, illegal_address_at_enqueue)
{
    /* one cudaMemcpyAsync per tensor: chunks of a tensor are coalesced */
    save_fault("cudaMemcpyAsync", 2, CU_ILLEGAL_ADDRESS, 0, "cudaErrorIllegalAddress",
               "layer2");
}

Test(cuda_save, illegal_address_while_copying)
{
    /* Sticky: once the copy has faulted every call fails with it, also the
     * wait for layer1's copy, so the message may name either tensor. */
    save_fault("cudaMemcpyAsync", 2, CU_ILLEGAL_ADDRESS, MOCK_FAULT_ASYNC,
               "cudaErrorIllegalAddress", NULL);
}

Test(cuda_save, copy_fails_while_running_names_its_tensor)
{
    save_fault("cudaMemcpyAsync", 2, CU_UNKNOWN, MOCK_FAULT_ASYNC, "cudaErrorUnknown",
               "layer2");
}

Test(cuda_save, event_failure)
{
    save_fault("cudaEventSynchronize", 5, CU_ILLEGAL_ADDRESS, 0, "cudaErrorIllegalAddress",
               NULL);
}

/* Page-locked memory refused (ulimit -l, a container, other processes'
 * pinned buffers: it runs out long before pageable memory): the save goes
 * through pageable memory instead, slower but whole, and says so in the
 * step's environment record; any other cudaHostAlloc error is the
 * device's, and fails the save.  In every snapshot mode the copies into
 * pageable memory run on the persist thread: on the caller's, each would
 * be synchronous, waiting for the training's queued GPU work (they were,
 * until the buffer's kind was checked after its allocation). */
static void pinned_refused(ckpt_snapshot_mode mode)
{
    ckpt_store *st = open_store(mode, 0, 0);
    void *d1 = dmalloc(), *d2 = dmalloc();
    pattern_fill(d1, N, 71);
    pattern_fill(d2, N, 72);
    ckpt_tensor t[2] = { dtensor("layer1", d1, CKPT_MEM_DEVICE),
                         dtensor("layer2", d2, CKPT_MEM_DEVICE) };
    M.fault("cudaHostAlloc", 0, CU_OOM, 0);
    mock_cuda_thread_counters before, after;
    M.get_thread_counters(&before);
    ckpt_save *sv = NULL;
    cr_assert_eq(ckpt_save_begin(&sv, st, 1, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    M.get_thread_counters(&after);
    cr_assert_eq(after.pageable_copies, before.pageable_copies,
                 "mode %d: %ld synchronous copies into pageable memory on the caller's thread",
                 (int)mode, after.pageable_copies - before.pageable_copies);
    cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
    ckpt_save_free(sv);
    cr_assert_gt(M.fault_fired("cudaHostAlloc"), 0, "no pinned allocation was refused");
    cr_assert_eq(ckpt_store_pinned_bytes(st), 0);
    expect_saved(st, 1, "layer1", 71);
    expect_saved(st, 1, "layer2", 72);
    ckpt_checkpoint *ck;
    cr_assert_eq(ckpt_checkpoint_open(&ck, st, 1, CKPT_VERIFY_QUICK), CKPT_OK);
    cr_assert(strstr(ckpt_checkpoint_env(ck), "pageable instead"), "no note in %s",
              ckpt_checkpoint_env(ck));
    ckpt_checkpoint_free(ck);
    M.reset();
    ckpt_store_free(st);
    M.Free(d1);
    M.Free(d2);
    expect_no_leaks(&M);
}

Test(cuda_save, pinned_out_of_memory_falls_back_to_pageable)
{
    pinned_refused(CKPT_SNAPSHOT_HOST);
}

Test(cuda_save, pinned_out_of_memory_in_device_mode)
{
    pinned_refused(CKPT_SNAPSHOT_DEVICE);
}

Test(cuda_save, pinned_out_of_memory_in_stream_mode)
{
    pinned_refused(CKPT_SNAPSHOT_STREAM);
}

Test(cuda_save, pinned_allocation_failure)
{
    save_fault("cudaHostAlloc", 1, CU_UNKNOWN, 0, "cudaErrorUnknown", NULL);
}

/* A save whose begin fails while its first copies are still queued (the
 * second enqueue is refused) waits for them before its buffers go (no
 * copy may land in freed memory): that wait
 * sleeps on a blocking-sync event, not in cudaStreamSynchronize, which
 * spins a core for the rest of the copies under CUDA's default scheduling. */
Test(cuda_save, a_failed_save_waits_for_its_copies_without_spinning)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *d1 = dmalloc(), *d2 = dmalloc();
    pattern_fill(d1, N, 1);
    pattern_fill(d2, N, 2);
    ckpt_tensor t[2] = { dtensor("layer1", d1, CKPT_MEM_DEVICE),
                         dtensor("layer2", d2, CKPT_MEM_DEVICE) };
    cr_assert_eq(ckpt_save_sync(st, 1, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    mock_cuda_counters before, after;
    M.get_counters(&before);
    M.set_copy_delay_us(100000); /* the copies outlast the failed wait */
    M.fault("cudaMemcpyAsync", 2, CU_UNKNOWN, 0); /* layer2's, layer1's queued */
    ckpt_save *save = NULL;
    int rc = ckpt_save_begin(&save, st, 2, t, 2, NULL);
    if (rc == CKPT_OK)
        rc = ckpt_save_wait(save);
    cr_assert_eq(rc, CKPT_EDEVICE, "got %d: %s", rc, ckpt_error_last());
    ckpt_save_free(save);
    M.get_counters(&after);
    cr_expect_eq(M.fault_fired("cudaMemcpyAsync"), 1);
    cr_expect_eq(after.spin_waits, before.spin_waits, "%ld waits spun a CPU core",
                 after.spin_waits - before.spin_waits);
    M.reset();
    cr_assert_eq(ckpt_save_sync(st, 3, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 3, "layer2", 2);
    ckpt_store_free(st);
    M.Free(d1);
    M.Free(d2);
    expect_no_leaks(&M);
}

Test(cuda_save, device_lost_during_restore)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *d = dmalloc(), *r = dmalloc();
    pattern_fill(d, N, 8);
    ckpt_tensor t = dtensor("emb", d, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());

    M.fault("cudaMemcpyAsync", 3, CU_UNAVAILABLE, MOCK_FAULT_ASYNC | MOCK_FAULT_STICKY);
    ckpt_tensor rt = dtensor("emb", r, CKPT_MEM_DEVICE);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, &rt, 1, NULL, &rep);
    cr_assert_eq(rc, CKPT_EDEVICE, "got %d: %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "cudaErrorDevicesUnavailable"), "%s",
              ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "emb"), "%s", ckpt_error_last());
    /* a device error is not a damaged checkpoint: no fallback, no step claimed */
    cr_expect_eq(ckpt_report_step(rep), -1);
    ckpt_report_free(rep);

    M.reset(); /* the device comes back */
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, &rt, 1, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_expect_eq(pattern_check(r, N, 8), -1);
    ckpt_store_free(st);
    M.Free(d);
    M.Free(r);
    expect_no_leaks(&M);
}

Test(cuda_save, one_copy_stream_per_store)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *d = dmalloc();
    pattern_fill(d, N, 1);
    ckpt_tensor t = dtensor("w", d, CKPT_MEM_DEVICE);
    for (int64_t step = 1; step <= 4; step++)
        cr_assert_eq(ckpt_save_sync(st, step, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.streams_created, 1, "%ld streams created for 4 saves", c.streams_created);
    cr_expect_eq(M.calls("cudaHostAlloc"), 1, "pinned memory allocated %ld times",
                 M.calls("cudaHostAlloc"));
    ckpt_store_free(st);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(cuda_save, host_only_saves_load_no_cuda)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    char *h = malloc(N);
    pattern_fill(h, N, 2);
    ckpt_tensor t = dtensor("h", h, CKPT_MEM_HOST);
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(M.calls("cudaGetDeviceCount"), 0, "a host-only save loaded CUDA");
    cr_expect_eq(ckpt_store_pinned_bytes(st), 0);
    ckpt_store_free(st);
    free(h);
}

/* A save that fails after some device copies were enqueued must not let
 * those copies land in the snapshot buffer once the next save uses it
 * (the pipeline has to call device_quiesce on its error path). */
Test(cuda_save, failed_save_copies_do_not_reach_the_next_snapshot)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *dv[4];
    ckpt_tensor td[4];
    char names[4][8];
    for (int i = 0; i < 4; i++) { /* separate allocations: one copy each */
        dv[i] = dmalloc();
        pattern_fill(dv[i], N, 1);
        snprintf(names[i], sizeof names[i], "dev%d", i);
        td[i] = dtensor(names[i], dv[i], CKPT_MEM_DEVICE);
    }
    char *h = malloc(N);
    pattern_fill(h, N, 2);
    ckpt_tensor th = dtensor("host", h, CKPT_MEM_HOST);

    M.set_copy_delay_us(20000); /* 3 copies in flight take 60 ms */
    M.fault("cudaMemcpyAsync", 4, CU_OOM, 0); /* not sticky: the store goes on */
    ckpt_save *save = NULL;
    int rc = ckpt_save_begin(&save, st, 1, td, 4, NULL);
    if (rc == CKPT_OK)
        rc = ckpt_save_wait(save);
    cr_assert_eq(rc, CKPT_EDEVICE, "%s", ckpt_error_last());
    ckpt_save_free(save);

    cr_assert_eq(ckpt_save_sync(st, 2, &th, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 2, "host", 2);
    ckpt_store_free(st);
    for (int i = 0; i < 4; i++)
        M.Free(dv[i]);
    free(h);
    expect_no_leaks(&M);
}

/* An error the application had pending (here a failed cudaMalloc) is still
 * there for it to read after a save, a restore and closing the store:
 * libckpt clears only the errors of its own failed calls. */
Test(cuda_save, the_applications_pending_error_is_left_alone)
{
    for (int mode = CKPT_SNAPSHOT_HOST; mode <= CKPT_SNAPSHOT_STREAM; mode++) {
        ckpt_store *st = open_store((ckpt_snapshot_mode)mode, 0, 0);
        void *d = dmalloc();
        ckpt_tensor t = dtensor("w", d, CKPT_MEM_DEVICE);
        void *huge = NULL;
        cr_assert_neq(M.Malloc(&huge, (size_t)1 << 62), 0, "the mock allocated 4 EiB");
        ckpt_save *sv = NULL;
        cr_assert_eq(ckpt_save_begin(&sv, st, 1, &t, 1, NULL), CKPT_OK, "%s",
                     ckpt_error_last());
        cr_assert_eq(ckpt_save_wait(sv), CKPT_OK, "%s", ckpt_error_last());
        ckpt_save_free(sv);
        cr_assert_eq(ckpt_restore(st, 1, &t, 1, NULL, NULL), CKPT_OK, "%s",
                     ckpt_error_last());
        ckpt_store_free(st);
        cr_assert_eq(M.GetLastError(), 2, "mode %d: the application's pending "
                     "cudaErrorMemoryAllocation was cleared by libckpt", mode);
        M.Free(d);
        ct_rmtree(root);
        free(root);
        root = ct_mkdtemp();
    }
}

/* After a sticky CUDA error (an illegal address in the application's own
 * kernel, a lost device) every CUDA call fails until the process exits.
 * A job's last save of what it holds in host memory still works when the
 * tensors are declared host memory, on the store that saved device
 * tensors before; declared CKPT_MEM_AUTO, where CUDA must be asked, the
 * refusal says what to do. */
Test(cuda_save, host_tensors_save_after_a_sticky_error)
{
    ckpt_store *st = open_store(CKPT_SNAPSHOT_HOST, 0, 0);
    void *d = dmalloc();
    pattern_fill(d, N, 1);
    ckpt_tensor td = dtensor("w", d, CKPT_MEM_DEVICE);
    cr_assert_eq(ckpt_save_sync(st, 1, &td, 1, NULL), CKPT_OK, "%s", ckpt_error_last());

    /* the application's next call reports its kernel's fault, for good */
    M.fault("cudaStreamSynchronize", 1, CU_ILLEGAL_ADDRESS, MOCK_FAULT_STICKY);
    cr_assert_eq(M.StreamSynchronize(NULL), CU_ILLEGAL_ADDRESS);
    cr_assert_eq(M.DeviceSynchronize(), CU_ILLEGAL_ADDRESS, "the error is not sticky");

    char *h = malloc(N);
    pattern_fill(h, N, 2);
    ckpt_tensor th = dtensor("host", h, CKPT_MEM_HOST);
    cr_assert_eq(ckpt_save_sync(st, 2, &th, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    expect_saved(st, 2, "host", 2);

    th.memory = CKPT_MEM_AUTO;
    int rc = ckpt_save_sync(st, 3, &th, 1, NULL);
    cr_assert_eq(rc, CKPT_EDEVICE, "got %d: %s", rc, ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "cudaErrorIllegalAddress") &&
              strstr(ckpt_error_last(), "'host'") &&
              strstr(ckpt_error_last(), "CKPT_MEM_HOST"), "%s", ckpt_error_last());
    cr_expect_eq(nsteps(st), 2);

    /* and host memory restores, as a look at the last state would */
    memset(h, 0, N);
    th.memory = CKPT_MEM_HOST;
    cr_assert_eq(ckpt_restore(st, 2, &th, 1, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(pattern_check(h, N, 2), -1);

    M.reset();
    ckpt_store_free(st);
    M.Free(d);
    free(h);
    expect_no_leaks(&M);
}

/* The cuda device backend (lib/device.h) against the mock runtime: ordering
 * with the caller's stream, fences, the three snapshot modes, pinned memory,
 * faults, and no leaks.  End-to-end saves through the public API are in
 * test_cuda_save.c. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_loader.h"
#include "cuda_test_util.h"
#include "device.h"

#define N ((size_t)1 << 20)
#define CU_ILLEGAL_ADDRESS 700
#define CU_OOM 2
#define CU_UNAVAILABLE 46

static mock_api M;

static void setup(void)
{
    M = mock_api_open();
    M.reset();
}

TestSuite(device, .init = setup, .timeout = 60);

static device *open_dev(ckpt_snapshot_mode mode, uint64_t pinned_limit)
{
    device *dev = NULL;
    device_options o = { mode, pinned_limit };
    cr_assert_eq(device_open(&dev, &o), CKPT_OK);
    return dev;
}

/* DEVICE mode: stage the one tensor d of N bytes; returns *staged. */
static int reserve1(device *dev, void *d)
{
    int64_t shape[1] = { (int64_t)N };
    ckpt_tensor t = { "w", d, N, CKPT_U8, 1, shape, CKPT_MEM_DEVICE };
    ckpt_memory m = CKPT_MEM_DEVICE;
    int staged = -1;
    cr_assert_eq(device_snapshot_reserve(dev, &t, &m, 1, -1, &staged), CKPT_OK, "%s",
                 ckpt_error_last());
    return staged;
}

static void *dmalloc(size_t n)
{
    void *p = NULL;
    cr_assert_eq(M.Malloc(&p, n), 0);
    return p;
}

Test(device, loader_uses_the_named_library)
{
    const cuda_api *api;
    cr_assert_eq(cuda_loader_get(&api), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_str_eq(api->library, getenv("CKPT_CUDART_LIBRARY"));
    cr_expect_eq(api->device_count, 1);
    cr_expect_eq(device_cuda_available(), CKPT_OK);
}

Test(device, no_device_is_reported)
{
    M.set_device_count(0);
    int rc = device_cuda_available();
    cr_assert_eq(rc, CKPT_ENODEVICE);
    cr_expect(strstr(ckpt_error_last(), "CUDA runtime loaded"), "%s", ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "but no device"), "%s", ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "cudaErrorNoDevice"), "%s", ckpt_error_last());

    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    ckpt_memory m;
    char host[16];
    cr_expect_eq(device_classify(dev, host, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    cr_expect_eq(m, CKPT_MEM_HOST);
    cr_expect_eq(device_classify(dev, host, CKPT_MEM_DEVICE, &m, NULL), CKPT_ENODEVICE);
    device_free(dev);
}

Test(device, classify)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    ckpt_memory m = CKPT_MEM_AUTO;
    char *host = malloc(64);
    void *d = dmalloc(64), *pinned = NULL;
    cr_assert_eq(M.HostAlloc(&pinned, 64, 0), 0);

    cr_expect_eq(device_classify(dev, host, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    cr_expect_eq(m, CKPT_MEM_HOST);
    cr_expect_eq(device_classify(dev, pinned, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    cr_expect_eq(m, CKPT_MEM_HOST);
    cr_expect_eq(device_classify(dev, (char *)d + 8, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    cr_expect_eq(m, CKPT_MEM_DEVICE);
    cr_expect_eq(device_classify(dev, d, CKPT_MEM_DEVICE, &m, NULL), CKPT_OK);
    cr_expect_eq(m, CKPT_MEM_DEVICE);
    cr_expect_eq(device_classify(dev, host, CKPT_MEM_HOST, &m, NULL), CKPT_OK);
    cr_expect_eq(m, CKPT_MEM_HOST);
    cr_expect_eq(device_classify(dev, host, CKPT_MEM_DEVICE, &m, NULL), CKPT_EINVAL);
    cr_expect(strstr(ckpt_error_last(), "host memory"), "%s", ckpt_error_last());

    M.fault("cudaPointerGetAttributes", 1, CU_UNAVAILABLE, 0);
    cr_expect_eq(device_classify(dev, d, CKPT_MEM_AUTO, &m, NULL), CKPT_EDEVICE);
    cr_expect(strstr(ckpt_error_last(), "cudaErrorDevicesUnavailable"), "%s",
              ckpt_error_last());

    device_free(dev);
    M.Free(d);
    M.FreeHost(pinned);
    free(host);
    expect_no_leaks(&M);
}

/* Snapshot of `d` (N bytes) into a pinned buffer; returns the buffer. */
static void *snapshot(device *dev, void *stream, void *d, device_event **ev, size_t piece)
{
    void *dst;
    int pinned;
    cr_assert_eq(device_host_alloc(dev, N, 1, &dst, &pinned), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(device_snapshot_start(dev, stream), CKPT_OK, "%s", ckpt_error_last());
    for (size_t off = 0; off < N; off += piece) {
        cr_assert_eq(device_copy_d2h(dev, (char *)dst + off, (char *)d + off, piece, "w"),
                     CKPT_OK, "%s", ckpt_error_last());
        device_event *e;
        cr_assert_eq(device_record(dev, &e), CKPT_OK, "%s", ckpt_error_last());
        cr_assert_not_null(e);
        if (off + piece < N)
            device_event_free(dev, e);
        else
            *ev = e;
    }
    return dst;
}

static void ordering(ckpt_snapshot_mode mode)
{
    device *dev = open_dev(mode, 0);
    void *s, *d = dmalloc(N);
    cr_assert_eq(M.StreamCreate(&s), 0);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    cr_assert_eq(m, CKPT_MEM_DEVICE);
    if (mode == CKPT_SNAPSHOT_DEVICE)
        cr_assert_eq(reserve1(dev, d), 1, "not staged");

    /* The caller's slow kernel produces state A; the snapshot must see it. */
    M.set_copy_delay_us(2000);
    fill_kernel a = { d, N, 1, 200000 };
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &a), 0);
    device_event *ev;
    void *dst = snapshot(dev, s, d, &ev, N / 8);
    if (mode == CKPT_SNAPSHOT_DEVICE) {
        mock_cuda_counters c;
        M.get_counters(&c);
        cr_expect_geq(c.device_bytes, 2 * N, "no spare device memory was used");
    }
    /* Then the optimizer writes state B, ordered after the fence. */
    cr_assert_eq(device_fence(dev, ev, s), CKPT_OK);
    fill_kernel b = { d, N, 2, 0 };
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &b), 0);

    cr_assert_eq(device_snapshot_wait(dev, ev), CKPT_OK);
    cr_assert_eq(device_event_wait(dev, ev), CKPT_OK);
    cr_expect_eq(pattern_check(dst, N, 1), -1, "snapshot differs from state A at %ld",
                 pattern_check(dst, N, 1));
    cr_assert_eq(M.StreamSynchronize(s), 0);
    cr_expect_eq(pattern_check(d, N, 2), -1, "state B was not written");

    device_event_free(dev, ev);
    device_host_free(dev, dst, N, 1);
    cr_expect_eq(device_pinned_bytes(dev), 0);
    device_free(dev);
    M.Free(d);
    M.StreamDestroy(s);
    expect_no_leaks(&M);
}

Test(device, host_mode_orders_after_caller_stream) { ordering(CKPT_SNAPSHOT_HOST); }
Test(device, device_mode_orders_after_caller_stream) { ordering(CKPT_SNAPSHOT_DEVICE); }
Test(device, stream_mode_orders_after_caller_stream) { ordering(CKPT_SNAPSHOT_STREAM); }

Test(device, default_stream_is_accepted)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    void *d = dmalloc(N);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_DEVICE, &m, NULL), CKPT_OK);
    fill_kernel a = { d, N, 3, 100000 };
    cr_assert_eq(M.LaunchHostFunc(NULL, kernel_fill, &a), 0);
    device_event *ev;
    void *dst = snapshot(dev, NULL, d, &ev, N);
    cr_assert_eq(device_event_wait(dev, ev), CKPT_OK);
    cr_expect_eq(pattern_check(dst, N, 3), -1);
    device_event_free(dev, ev);
    device_host_free(dev, dst, N, 1);
    device_free(dev);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(device, device_mode_falls_back_when_memory_is_short)
{
    M.set_device_memory(N + ((size_t)64 << 20)); /* below N + 256 MiB headroom */
    device *dev = open_dev(CKPT_SNAPSHOT_DEVICE, 0);
    void *d = dmalloc(N);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_DEVICE, &m, NULL), CKPT_OK);
    cr_assert_eq(reserve1(dev, d), 0, "staged although it does not fit");
    pattern_fill(d, N, 4);
    device_event *ev;
    void *dst = snapshot(dev, NULL, d, &ev, N / 4);
    cr_assert_eq(device_event_wait(dev, ev), CKPT_OK);
    cr_expect_eq(pattern_check(dst, N, 4), -1);
    mock_cuda_counters c;
    M.get_counters(&c);
    cr_expect_eq(c.device_allocs, 1, "scratch was allocated although it does not fit");

    json_t *env = json_object();
    device_describe(dev, env);
    const char *note = json_string_value(json_object_get(json_object_get(env, "cuda"), "note"));
    cr_expect(note && strstr(note, "fell back to host"), "note: %s", note ? note : "(none)");
    json_decref(env);

    device_event_free(dev, ev);
    device_host_free(dev, dst, N, 1);
    device_free(dev);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(device, pinned_cap_falls_back_to_pageable)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, N + N / 2);
    void *d = dmalloc(N);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_DEVICE, &m, NULL), CKPT_OK);
    void *a, *b;
    int pa, pb;
    cr_assert_eq(device_host_alloc(dev, N, 1, &a, &pa), CKPT_OK);
    cr_expect_eq(pa, 1);
    cr_expect_eq(device_pinned_bytes(dev), N);
    cr_assert_eq(device_host_alloc(dev, N, 1, &b, &pb), CKPT_OK);
    cr_expect_eq(pb, 0, "the cap of 1.5 MiB was not enforced");
    cr_expect_eq(device_pinned_bytes(dev), N);

    /* a pageable destination still works */
    pattern_fill(d, N, 5);
    cr_assert_eq(device_snapshot_start(dev, NULL), CKPT_OK);
    cr_assert_eq(device_copy_d2h(dev, b, d, N, "w"), CKPT_OK);
    device_event *ev;
    cr_assert_eq(device_record(dev, &ev), CKPT_OK);
    cr_assert_eq(device_event_wait(dev, ev), CKPT_OK);
    cr_expect_eq(pattern_check(b, N, 5), -1);
    device_event_free(dev, ev);

    json_t *env = json_object();
    device_describe(dev, env);
    json_t *cu = json_object_get(env, "cuda");
    cr_assert_not_null(cu);
    cr_expect_str_eq(json_string_value(json_object_get(cu, "gpu_name")), "Mock CUDA Device 0");
    cr_expect_str_eq(json_string_value(json_object_get(cu, "runtime_version")), "13.0");
    cr_expect_str_eq(json_string_value(json_object_get(cu, "driver_version")), "13.0");
    cr_expect_eq(json_integer_value(json_object_get(cu, "pinned_bytes")), (json_int_t)N);
    const char *note = json_string_value(json_object_get(cu, "note"));
    cr_expect(note && strstr(note, "pinned memory cap"), "note: %s", note ? note : "(none)");
    json_decref(env);

    device_host_free(dev, a, N, pa);
    device_host_free(dev, b, N, pb);
    cr_expect_eq(device_pinned_bytes(dev), 0);
    device_free(dev);
    M.Free(d);
    expect_no_leaks(&M);
}

/* Page-locked memory refused: a pageable buffer instead (the save goes on,
 * slower); any other cudaHostAlloc error is the device's. */
Test(device, pinned_out_of_memory_falls_back_to_pageable)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    void *d = dmalloc(64);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_DEVICE, &m, NULL), CKPT_OK);
    M.fault("cudaHostAlloc", 1, CU_OOM, 0);
    void *p;
    int pinned = -1;
    cr_assert_eq(device_host_alloc(dev, N, 1, &p, &pinned), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(pinned, 0, "refused pinned memory reported as pinned");
    cr_expect_eq(device_pinned_bytes(dev), 0);
    memset(p, 1, N);
    device_host_free(dev, p, N, pinned);
    M.fault("cudaHostAlloc", 1, 999, 0);
    cr_assert_eq(device_host_alloc(dev, N, 1, &p, &pinned), CKPT_EDEVICE);
    cr_expect(strstr(ckpt_error_last(), "pinned"), "%s", ckpt_error_last());
    cr_expect_eq(device_pinned_bytes(dev), 0);
    M.reset();
    device_free(dev);
    M.Free(d);
    expect_no_leaks(&M);
}

static void copy_fault(unsigned flags, ckpt_snapshot_mode mode)
{
    device *dev = open_dev(mode, 0);
    void *d = dmalloc(N);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_DEVICE, &m, NULL), CKPT_OK);
    if (mode == CKPT_SNAPSHOT_DEVICE)
        cr_assert_eq(reserve1(dev, d), 1, "not staged");
    void *dst;
    int pinned;
    cr_assert_eq(device_host_alloc(dev, N, 1, &dst, &pinned), CKPT_OK);
    cr_assert_eq(device_snapshot_start(dev, NULL), CKPT_OK);
    cr_assert_eq(device_copy_d2h(dev, dst, d, N / 2, "layer1.weight"), CKPT_OK);
    device_event *e1, *e2 = NULL;
    cr_assert_eq(device_record(dev, &e1), CKPT_OK);
    /* (in DEVICE mode chunks drain in batches: a fault fails the whole batch,
     * so let the first one complete before arming it) */
    cr_assert_eq(device_event_wait(dev, e1), CKPT_OK, "%s", ckpt_error_last());
    M.fault("cudaMemcpyAsync", 1, CU_ILLEGAL_ADDRESS, flags);
    int rc = device_copy_d2h(dev, (char *)dst + N / 2, (char *)d + N / 2, N / 2,
                             "layer2.weight");
    if (!(flags & MOCK_FAULT_ASYNC)) {
        cr_assert_eq(rc, CKPT_EDEVICE);
    } else {
        cr_assert_eq(rc, CKPT_OK);
        /* The fault is sticky: once the stream has run the copy, the next
         * call (the record) may be the one that reports it. */
        rc = device_record(dev, &e2);
        if (rc == CKPT_OK)
            rc = device_event_wait(dev, e2);
        cr_assert_eq(rc, CKPT_EDEVICE);
    }
    cr_expect(strstr(ckpt_error_last(), "cudaErrorIllegalAddress"), "%s", ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "layer2.weight"), "%s", ckpt_error_last());
    device_quiesce(dev);
    device_event_free(dev, e1);
    device_event_free(dev, e2);

    /* An illegal address is sticky: real CUDA recovers only in a new
     * process.  The mock forgets it, standing in for that; the backend must
     * then work again (no state of ours stays poisoned). */
    M.reset();
    pattern_fill(d, N, 6);
    device_event *ev;
    cr_assert_eq(device_snapshot_start(dev, NULL), CKPT_OK);
    cr_assert_eq(device_copy_d2h(dev, dst, d, N, "w"), CKPT_OK);
    cr_assert_eq(device_record(dev, &ev), CKPT_OK);
    cr_assert_eq(device_event_wait(dev, ev), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(pattern_check(dst, N, 6), -1);
    device_event_free(dev, ev);

    device_host_free(dev, dst, N, pinned);
    device_free(dev);
    M.Free(d);
    expect_no_leaks(&M);
}

Test(device, copy_fault_at_enqueue) { copy_fault(0, CKPT_SNAPSHOT_HOST); }
Test(device, copy_fault_while_running) { copy_fault(MOCK_FAULT_ASYNC, CKPT_SNAPSHOT_HOST); }
Test(device, copy_fault_device_mode) { copy_fault(MOCK_FAULT_ASYNC, CKPT_SNAPSHOT_DEVICE); }

Test(device, restore_h2d_and_overlap_markers)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    void *s, *d = dmalloc(N);
    cr_assert_eq(M.StreamCreate(&s), 0);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    void *stage[2];
    int pinned[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(device_host_alloc(dev, N / 4, 1, &stage[i], &pinned[i]), CKPT_OK);
    M.set_copy_delay_us(5000);
    char *ref = malloc(N);
    pattern_fill(ref, N, 7);
    device_event *busy[2] = { NULL, NULL };
    for (size_t k = 0; k < 4; k++) {
        int i = (int)(k % 2);
        cr_assert_eq(device_event_wait(dev, busy[i]), CKPT_OK);
        device_event_free(dev, busy[i]);
        memcpy(stage[i], ref + k * (N / 4), N / 4); /* "decode" */
        cr_assert_eq(device_copy_h2d(dev, (char *)d + k * (N / 4), stage[i], N / 4, s, -1, "w"),
                     CKPT_OK);
        cr_assert_eq(device_record_stream(dev, s, -1, &busy[i]), CKPT_OK);
    }
    device_event *all;
    cr_assert_eq(device_record_stream(dev, s, -1, &all), CKPT_OK);
    cr_assert_eq(device_event_wait(dev, all), CKPT_OK, "%s", ckpt_error_last());
    device_event_free(dev, all);
    cr_expect_eq(memcmp(d, ref, N), 0);
    for (int i = 0; i < 2; i++) {
        device_event_free(dev, busy[i]);
        device_host_free(dev, stage[i], N / 4, pinned[i]);
    }
    free(ref);
    device_free(dev);
    M.Free(d);
    M.StreamDestroy(s);
    expect_no_leaks(&M);
}

Test(device, device_lost_during_restore)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    void *d = dmalloc(N);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    char *src = calloc(1, N);
    M.fault("cudaMemcpyAsync", 1, CU_UNAVAILABLE, MOCK_FAULT_ASYNC | MOCK_FAULT_STICKY);
    cr_assert_eq(device_copy_h2d(dev, d, src, N, NULL, -1, "emb"), CKPT_OK);
    /* The sticky error shows when queueing the marker or waiting on it. */
    device_event *all = NULL;
    int rc = device_record_stream(dev, NULL, -1, &all);
    if (rc == CKPT_OK)
        rc = device_event_wait(dev, all);
    device_event_free(dev, all);
    cr_assert_eq(rc, CKPT_EDEVICE);
    cr_expect(strstr(ckpt_error_last(), "cudaErrorDevicesUnavailable"), "%s",
              ckpt_error_last());
    cr_expect(strstr(ckpt_error_last(), "emb"), "%s", ckpt_error_last());
    cr_assert_eq(device_copy_h2d(dev, d, src, N, NULL, -1, "emb2"), CKPT_EDEVICE);
    device_free(dev); /* every call fails now: must still not crash */
    M.Free(d);
    free(src);
    expect_no_leaks(&M);
}

Test(device, host_only_backend_loads_nothing)
{
    device *dev = open_dev(CKPT_SNAPSHOT_HOST, 0);
    char buf[32] = "x";
    void *p;
    int pinned;
    cr_assert_eq(device_host_alloc(dev, 4096, 1, &p, &pinned), CKPT_OK);
    cr_expect_eq(pinned, 0, "pinned memory without any device tensor");
    ckpt_memory m;
    cr_expect_eq(device_classify(dev, buf, CKPT_MEM_HOST, &m, NULL), CKPT_OK);
    device_event *ev = (device_event *)1;
    cr_expect_eq(device_record(dev, &ev), CKPT_OK);
    cr_expect_null(ev);
    cr_expect_eq(device_snapshot_start(dev, NULL), CKPT_OK);
    json_t *env = json_object();
    device_describe(dev, env);
    cr_expect_null(json_object_get(env, "cuda"));
    json_decref(env);
    device_host_free(dev, p, 4096, pinned);
    device_free(dev);
    cr_expect_eq(M.calls("cudaStreamCreateWithFlags"), 0);
}

/* DEVICE mode: a record made right after device_snapshot_start marks the
 * staging copies, so the caller can fence before any chunk is drained;
 * memory that was not staged still goes straight to the host. */
Test(device, staged_marker_and_unstaged_memory)
{
    device *dev = open_dev(CKPT_SNAPSHOT_DEVICE, 0);
    void *s, *d = dmalloc(N), *other = dmalloc(N);
    cr_assert_eq(M.StreamCreate(&s), 0);
    ckpt_memory m;
    cr_assert_eq(device_classify(dev, d, CKPT_MEM_AUTO, &m, NULL), CKPT_OK);
    cr_assert_eq(reserve1(dev, d), 1);
    pattern_fill(other, N, 8);
    M.set_copy_delay_us(2000);
    fill_kernel a = { d, N, 1, 100000 };
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &a), 0);

    void *dst, *dst2;
    int p1, p2;
    cr_assert_eq(device_host_alloc(dev, N, 1, &dst, &p1), CKPT_OK);
    cr_assert_eq(device_host_alloc(dev, N, 1, &dst2, &p2), CKPT_OK);
    cr_assert_eq(device_snapshot_start(dev, s), CKPT_OK, "%s", ckpt_error_last());
    device_event *mark;
    cr_assert_eq(device_record(dev, &mark), CKPT_OK);
    cr_assert_eq(device_fence(dev, mark, s), CKPT_OK);
    fill_kernel b = { d, N, 2, 0 };
    cr_assert_eq(M.LaunchHostFunc(s, kernel_fill, &b), 0);

    device_event *evs[16];
    for (size_t k = 0; k < 8; k++) { /* staged: drains only */
        cr_assert_eq(device_copy_d2h(dev, (char *)dst + k * (N / 8), (char *)d + k * (N / 8),
                                     N / 8, "w"), CKPT_OK);
        cr_assert_eq(device_record(dev, &evs[k]), CKPT_OK);
    }
    for (size_t k = 0; k < 8; k++) { /* not staged: direct D2H */
        cr_assert_eq(device_copy_d2h(dev, (char *)dst2 + k * (N / 8),
                                     (char *)other + k * (N / 8), N / 8, "other"), CKPT_OK);
        cr_assert_eq(device_record(dev, &evs[8 + k]), CKPT_OK);
    }
    cr_assert_eq(device_snapshot_wait(dev, mark), CKPT_OK);
    for (size_t k = 0; k < 16; k++) {
        cr_assert_eq(device_event_wait(dev, evs[k]), CKPT_OK, "%s", ckpt_error_last());
        device_event_free(dev, evs[k]);
    }
    cr_expect_eq(pattern_check(dst, N, 1), -1, "staged snapshot differs from state A");
    cr_expect_eq(pattern_check(dst2, N, 8), -1, "direct copy differs");
    cr_assert_eq(M.StreamSynchronize(s), 0);
    cr_expect_eq(pattern_check(d, N, 2), -1, "state B was not written");
    device_event_free(dev, mark);
    device_host_free(dev, dst, N, p1);
    device_host_free(dev, dst2, N, p2);
    device_free(dev);
    M.Free(d);
    M.Free(other);
    M.StreamDestroy(s);
    expect_no_leaks(&M);
}

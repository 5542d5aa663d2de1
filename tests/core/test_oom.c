/* Out of memory at every allocation, one at a time: the k-th malloc,
 * calloc or realloc made (by the library, jansson, zstd or a worker thread)
 * during an operation fails, for k = 1, 2, ... until the operation makes
 * fewer than k.  Each run must either succeed with the right result, or
 * fail with a status and message and leave the store usable; no crash, no
 * descriptor of the caller's closed, nothing committed lost or hidden, and
 * (under valgrind) nothing leaked or read uninitialised.
 *
 * The allocator is replaced in this executable (the dynamic linker binds
 * every library's malloc to it).  AddressSanitizer replaces it too, so
 * under ASan these tests skip; the plain and valgrind runs cover them. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ckpt.h"
#include "helpers.h"

#if defined(__SANITIZE_ADDRESS__)
#define OOM_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OOM_SKIP 1
#endif
#endif

#ifndef OOM_SKIP
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

/* > 0: allocations left before the one that fails; 0: disarmed. */
static atomic_long countdown;
static atomic_int failed_one;

/* jansson is left out: its lexer ignores a failed append to the text it
 * saves and later asserts on that text (load.c: lex_scan_string), so out
 * of memory inside it can abort any program parsing JSON with it. */
static int from_jansson(const void *caller)
{
    Dl_info di;
    return dladdr(caller, &di) && di.dli_fname && strstr(di.dli_fname, "libjansson");
}

static int fail_now(const void *caller)
{
    long left = atomic_load(&countdown);
    if (left <= 0 || from_jansson(caller))
        return 0;
    while (left > 0 && !atomic_compare_exchange_weak(&countdown, &left, left - 1))
        ;
    if (left == 1) {
        atomic_store(&failed_one, 1);
        return 1;
    }
    return 0;
}

void *malloc(size_t n)
{
    if (fail_now(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (fail_now(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    if (fail_now(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, n);
}
#endif

TestSuite(oom, .init = tc_setup, .fini = tc_teardown, .timeout = 600);

/* Two tensors, one compressible and one not (both codec paths), few
 * allocations per save: the sweep runs once per allocation. */
static void small_state(tc_state *s, uint64_t seed)
{
    const int64_t a[2] = {64, 33}, b[1] = {4096};
    tc_state_init(s);
    tc_state_add(s, "w", CKPT_F32, 2, a, TC_RANDOM, seed);
    tc_state_add(s, "m", CKPT_F32, 1, b, TC_COMPRESSIBLE, seed + 1);
}

static void arm(long k)
{
#ifndef OOM_SKIP
    atomic_store(&failed_one, 0);
    atomic_store(&countdown, k);
#else
    (void)k;
#endif
}

/* Disarms; 1 when the armed allocation was reached (and failed). */
static int disarm(void)
{
#ifndef OOM_SKIP
    atomic_store(&countdown, 0);
    return atomic_load(&failed_one);
#else
    return 0;
#endif
}

static void skip_under_asan(void)
{
#ifdef OOM_SKIP
    cr_skip_test("the allocator cannot be replaced under AddressSanitizer");
#endif
}

/* A descriptor of the caller's, open through every run: a library that
 * closes leftover numbers from a half-built object would close it. */
static int victim(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    return fd;
}

static void assert_failure_reported(int rc, long k)
{
    cr_assert_neq(rc, CKPT_OK);
    const char *msg = ckpt_error_last();
    cr_assert(msg && *msg, "allocation %ld failed: status %d without a message", k, rc);
}

Test(oom, opening_and_restoring_a_step_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s1, s2;
    small_state(&s1, 1);
    small_state(&s2, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s1);
    tc_save_ok(w, 2, &s2);
    ckpt_store_free(w);
    int fd = victim();
    long k = 1;
    for (;; k++) {
        tc_state got;
        tc_state_init(&got);
        tc_state_like(&got, &s2, 0xee);
        ckpt_store *ro = NULL;
        ckpt_checkpoint *ck = NULL;
        ckpt_report *rep = NULL;
        arm(k);
        int rc = ckpt_store_open(&ro, tc_root, NULL);
        if (!rc)
            rc = ckpt_checkpoint_open(&ck, ro, CKPT_LATEST, CKPT_VERIFY_QUICK);
        if (!rc)
            rc = ckpt_restore(ro, CKPT_LATEST, got.t, got.count, NULL, &rep);
        int reached = disarm();
        cr_assert_geq(fcntl(fd, F_GETFD), 0, "allocation %ld: the caller's descriptor %d "
                      "was closed", k, fd);
        if (rc == CKPT_OK) {
            /* Out of memory while reading step 2 is not damage: never
             * step 1 in its place. */
            cr_assert_eq(ckpt_checkpoint_step(ck), 2, "allocation %ld: opened step %lld (%s)",
                         k, (long long)ckpt_checkpoint_step(ck), ckpt_error_last());
            cr_assert_eq(ckpt_report_step(rep), 2, "allocation %ld: restored step %lld", k,
                         (long long)ckpt_report_step(rep));
            tc_assert_state_eq(&got, &s2, "restored after a failed allocation");
        } else {
            assert_failure_reported(rc, k);
            cr_assert_neq(rc, CKPT_ENOCKPT, "allocation %ld: out of memory reported as no "
                          "checkpoint: %s", k, ckpt_error_last());
            cr_assert_neq(rc, CKPT_ECORRUPT, "allocation %ld: out of memory reported as "
                          "damage: %s", k, ckpt_error_last());
        }
        ckpt_report_free(rep);
        ckpt_checkpoint_free(ck);
        ckpt_store_free(ro);
        tc_state_free(&got);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations: the allocator is not the one replaced", k);
    close(fd);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

Test(oom, a_save_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s1, s2, s3;
    small_state(&s1, 1);
    small_state(&s2, 2);
    small_state(&s3, 3);
    int fd = victim();
    char root[4096];
    long k = 1;
    for (;; k++) {
        /* A root of its own each time: a root of many steps would make
         * each save list more (and allocate more) than the one before. */
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store *w = tc_open(root);
        tc_save_ok(w, 1, &s1);
        if (getenv("OOM_TRACE"))
            fprintf(stderr, "save: allocation %ld\n", k);
        arm(k);
        int rc = tc_save(w, 2, &s2, "{\"k\": 1}");
        int reached = disarm();
        cr_assert_geq(fcntl(fd, F_GETFD), 0, "allocation %ld: the caller's descriptor %d "
                      "was closed", k, fd);
        if (rc != CKPT_OK)
            assert_failure_reported(rc, k);
        /* Whatever happened, the store goes on: the next save commits, and
         * step 1, and step 2 when it was reported committed, restore. */
        tc_save_ok(w, 3, &s3);
        tc_restore_check(w, 1, &s1);
        if (rc == CKPT_OK)
            tc_restore_check(w, 2, &s2);
        tc_restore_check(w, 3, &s3);
        ckpt_store_free(w);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations: the allocator is not the one replaced", k);
    close(fd);
    tc_state_free(&s1);
    tc_state_free(&s2);
    tc_state_free(&s3);
}

Test(oom, opening_verifying_and_collecting_survive_any_failed_allocation)
{
    skip_under_asan();
    tc_state s[4];
    for (int i = 1; i <= 3; i++)
        small_state(&s[i], (uint64_t)i);
    int fd = victim();
    char root[4096];
    long k = 1;
    for (;; k++) {
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store *w = tc_open(root);
        for (int i = 1; i <= 3; i++)
            tc_save_ok(w, i, &s[i]);
        ckpt_store_free(w);
        w = NULL;
        int64_t latest = -1;
        ckpt_report *vr = NULL, *gr = NULL;
        arm(k);
        int rc = ckpt_store_open(&w, root, NULL);
        if (!rc)
            rc = ckpt_store_latest(w, CKPT_VERIFY_FULL, &latest);
        if (!rc)
            rc = ckpt_verify(w, CKPT_LATEST, CKPT_VERIFY_FULL, &vr);
        if (!rc)
            rc = ckpt_store_gc(w, 1, 0, &gr);
        int reached = disarm();
        cr_assert_geq(fcntl(fd, F_GETFD), 0, "allocation %ld: the caller's descriptor %d "
                      "was closed", k, fd);
        if (rc == CKPT_OK) {
            cr_assert_eq(latest, 3, "allocation %ld: latest %lld", k, (long long)latest);
            cr_assert_eq(ckpt_report_step(vr), 3, "allocation %ld", k);
        } else {
            assert_failure_reported(rc, k);
            cr_assert(rc != CKPT_ENOCKPT && rc != CKPT_ECORRUPT,
                      "allocation %ld: out of memory reported as %s: %s", k,
                      ckpt_strerror(rc), ckpt_error_last());
        }
        ckpt_report_free(vr);
        ckpt_report_free(gr);
        ckpt_store_free(w);
        /* The newest step is never what a failed allocation costs. */
        ckpt_store *ro = tc_open_ro(root);
        tc_restore_check(ro, 3, &s[3]);
        ckpt_store_free(ro);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations: the allocator is not the one replaced", k);
    close(fd);
    for (int i = 1; i <= 3; i++)
        tc_state_free(&s[i]);
}

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
#include <sys/stat.h>
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
    if (getenv("OOM_TRACE"))
        fprintf(stderr, "arming allocation %ld\n", k);
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

/* ------------------------------------------------------------------------
 * More of the API under the same sweep. */

/* A failure that is out of memory, not damage nor a missing step. */
static void assert_oom_failure(int rc, long k, const char *what)
{
    cr_assert_neq(rc, CKPT_OK);
    const char *msg = ckpt_error_last();
    cr_assert(msg && *msg, "%s, allocation %ld failed: status %d without a message", what, k,
              rc);
    cr_assert(rc != CKPT_ENOCKPT && rc != CKPT_ECORRUPT && rc != CKPT_EINCOMPLETE &&
                  rc != CKPT_ENOTFOUND,
              "%s, allocation %ld: out of memory reported as %s: %s", what, k,
              ckpt_strerror(rc), msg);
}

static void assert_victim_open(int fd, long k, const char *what)
{
    cr_assert_geq(fcntl(fd, F_GETFD), 0, "%s, allocation %ld: the caller's descriptor %d "
                  "was closed", what, k, fd);
}

/* The value of the first line of `text` starting "name{" (-1 if none). */
static double metric_value(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, name, n) == 0 && p[n] == '{') {
            const char *v = strchr(p, '}');
            return v ? strtod(v + 1, NULL) : -1;
        }
    }
    return -1;
}

static void save_opts_ok(ckpt_store *w, int64_t step, const tc_state *s,
                         const ckpt_save_options *so)
{
    int rc = ckpt_save_sync(w, step, s->t, s->count, so);
    cr_assert_eq(rc, CKPT_OK, "save of step %lld: %s", (long long)step, ckpt_error_last());
}

#define OOM_META "{\"epoch\": 3, \"lr\": 0.5, \"tags\": [\"a\", \"b\"], \"s\": \"x\\u00e9\"}"
#define OOM_FRAMEWORKS "{\"python\": \"3.11.2\", \"torch.cuda\": null}"

/* Reading one step's description, tensors and parts of tensors. */
Test(oom, reading_a_checkpoint_piece_by_piece_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s1, s2;
    small_state(&s1, 1);
    small_state(&s2, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s1);
    ckpt_save_options so;
    ckpt_save_options_init(&so, CKPT_SAVE_OPTIONS_VERSION);
    so.metadata_json = OOM_META;
    so.frameworks_json = OOM_FRAMEWORKS;
    save_opts_ok(w, 2, &s2, &so);
    ckpt_store_free(w);
    const ckpt_tensor *tw = &s2.t[0], *tm = &s2.t[1];
    int fd = victim();
    ckpt_store *ro = tc_open_ro(tc_root);
    /* what the metadata reads as without a failure */
    ckpt_checkpoint *ck0 = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck0, ro, 2, CKPT_VERIFY_QUICK), CKPT_OK);
    char *want_meta = strdup(ckpt_checkpoint_metadata(ck0));
    ckpt_checkpoint_free(ck0);
    ckpt_store_free(ro);
    cr_log_info("metadata %s", want_meta);
    long k = 1;
    for (;; k++) {
        /* a store of its own each time: its cache of decoded manifests
         * would spare the later runs the decoding */
        ro = tc_open_ro(tc_root);
        tc_state got;
        tc_state_like(&got, &s2, 0xee);
        unsigned char *part = malloc(1000);
        cr_assert(part);
        void *loaded = NULL;
        uint64_t loaded_bytes = 0;
        ckpt_checkpoint *ck = NULL;
        ckpt_tensor_info infos[2];
        ckpt_save_stats st;
        size_t idx = 99;
        const char *rmeta = NULL;
        const char *what = "checkpoint_open";
        arm(k);
        int rc = ckpt_checkpoint_open(&ck, ro, 2, CKPT_VERIFY_QUICK);
        if (!rc && (what = "tensors", 1))
            rc = ckpt_checkpoint_tensors(ck, 0, 2, infos);
        if (!rc && (what = "find", 1))
            rc = ckpt_checkpoint_find(ck, "m", &idx);
        if (!rc && (what = "stats", 1))
            rc = ckpt_checkpoint_stats(ck, &st);
        if (!rc && (what = "rank_metadata", 1))
            rc = ckpt_checkpoint_rank_metadata(ck, 0, &rmeta);
        if (!rc && (what = "read", 1))
            rc = ckpt_checkpoint_read(ck, "w", got.t[0].data, got.t[0].bytes);
        if (!rc && (what = "read_range", 1))
            rc = ckpt_checkpoint_read_range(ck, "m", 5000, part, 1000);
        if (!rc && (what = "checkpoint_restore", 1))
            rc = ckpt_checkpoint_restore(ck, &got.t[1], 1, NULL);
        if (!rc && (what = "load", 1))
            rc = ckpt_load(ro, 2, "m", &loaded, &loaded_bytes, NULL);
        int reached = disarm();
        assert_victim_open(fd, k, what);
        if (rc == CKPT_OK) {
            cr_assert_eq(ckpt_checkpoint_step(ck), 2);
            cr_assert_str_eq(infos[0].name, "w");
            cr_assert_eq(infos[0].bytes, tw->bytes);
            cr_assert_eq(infos[1].ndim, 1);
            cr_assert_eq(idx, 1);
            cr_assert_eq(st.step, 2);
            cr_assert_str_eq(ckpt_checkpoint_metadata(ck), want_meta,
                             "allocation %ld: metadata %s", k, ckpt_checkpoint_metadata(ck));
            cr_assert_str_eq(rmeta, ckpt_checkpoint_metadata(ck));
            cr_assert(strstr(ckpt_checkpoint_env(ck), "\"3.11.2\""), "allocation %ld: env %s",
                      k, ckpt_checkpoint_env(ck));
            cr_assert(strstr(ckpt_checkpoint_manifest(ck), "\"epoch\""));
            cr_assert_eq(memcmp(part, (const char *)tm->data + 5000, 1000), 0,
                         "allocation %ld: read_range gave other bytes", k);
            cr_assert_eq(loaded_bytes, tm->bytes);
            cr_assert_eq(memcmp(loaded, tm->data, tm->bytes), 0);
            tc_assert_state_eq(&got, &s2, "read and restored piece by piece");
        } else {
            assert_oom_failure(rc, k, what);
            cr_assert_null(loaded);
        }
        ckpt_free(loaded);
        free(part);
        ckpt_checkpoint_free(ck);
        tc_state_free(&got);
        if (!reached)
            break;
        ckpt_store_free(ro);
    }
    cr_assert_gt(k, 20, "only %ld allocations", k);
    free(want_meta);
    tc_restore_check(ro, CKPT_LATEST, &s2);
    ckpt_store_free(ro);
    close(fd);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* ckpt_restore_open: the restore, and the step handed out open. */
Test(oom, restore_open_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s1, s2;
    small_state(&s1, 1);
    small_state(&s2, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s1);
    tc_save(w, 2, &s2, "{\"n\": 2}");
    int fd = victim();
    long k = 1;
    for (;; k++) {
        tc_state got;
        tc_state_like(&got, &s2, 0xee);
        ckpt_report *rep = NULL;
        ckpt_checkpoint *ck = NULL;
        arm(k);
        int rc = ckpt_restore_open(w, CKPT_LATEST, got.t, got.count, NULL, &rep, &ck);
        int reached = disarm();
        assert_victim_open(fd, k, "restore_open");
        if (rc == CKPT_OK) {
            cr_assert_eq(ckpt_report_step(rep), 2, "allocation %ld: restored step %lld", k,
                         (long long)ckpt_report_step(rep));
            cr_assert_eq(ckpt_checkpoint_step(ck), 2);
            cr_assert_str_eq(ckpt_checkpoint_metadata(ck), "{\"n\":2}");
            cr_assert_eq(ckpt_checkpoint_tensor_count(ck), 2);
            tc_assert_state_eq(&got, &s2, "restore_open");
        } else {
            assert_oom_failure(rc, k, "restore_open");
            cr_assert_null(ck);
        }
        ckpt_checkpoint_free(ck);
        ckpt_report_free(rep);
        tc_state_free(&got);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations", k);
    /* the store goes on: the next save and restore */
    tc_save_ok(w, 3, &s1);
    tc_restore_check(w, CKPT_LATEST, &s1);
    ckpt_store_free(w);
    close(fd);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* The event log, the metrics text and the environment record. */
Test(oom, events_metrics_and_environment_survive_any_failed_allocation)
{
    skip_under_asan();
    tc_state s;
    small_state(&s, 1);
    ckpt_store *w = tc_open(tc_root);
    for (int i = 1; i <= 3; i++)
        tc_save_ok(w, i, &s);
    tc_restore_check(w, CKPT_LATEST, &s);
    int fd = victim();
    long k = 1;
    for (;; k++) {
        char *events = NULL, *metrics = NULL, *env = NULL;
        const char *what = "events";
        arm(k);
        int rc = ckpt_store_events(w, 0, &events);
        if (!rc && (what = "metrics", 1))
            rc = ckpt_store_metrics(w, &metrics);
        if (!rc && (what = "environment", 1))
            rc = ckpt_store_environment(w, &env);
        int reached = disarm();
        assert_victim_open(fd, k, what);
        if (rc == CKPT_OK) {
            cr_assert(strstr(events, "\"restored\""), "allocation %ld: events %s", k, events);
            size_t lines = 0;
            for (const char *p = events; (p = strchr(p, '\n')); p++)
                lines++;
            cr_assert_geq(lines, 7, "allocation %ld: %zu events", k, lines);
            cr_assert_eq(metric_value(metrics, "ckpt_valid_checkpoint"), 1,
                         "allocation %ld: %s", k, metrics);
            cr_assert_eq(metric_value(metrics, "ckpt_latest_step"), 3, "allocation %ld: %s", k,
                         metrics);
            cr_assert_eq(metric_value(metrics, "ckpt_steps"), 3, "allocation %ld: %s", k,
                         metrics);
            cr_assert_eq(metric_value(metrics, "ckpt_event_log_readable"), 1,
                         "allocation %ld: out of memory reported as an unreadable log: %s", k,
                         metrics);
            cr_assert_eq(metric_value(metrics, "ckpt_saves_total"), 3, "allocation %ld: %s", k,
                         metrics);
            cr_assert(env && env[0] == '{' && strstr(env, "libckpt"), "allocation %ld: %s", k,
                      env);
        } else {
            assert_oom_failure(rc, k, what);
        }
        ckpt_free(events);
        ckpt_free(metrics);
        ckpt_free(env);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 5, "only %ld allocations", k);
    tc_save_ok(w, 4, &s);
    ckpt_store_free(w);
    close(fd);
    tc_state_free(&s);
}

/* A writer's open that finds a dead writer's leftovers: a temporary
 * directory to remove and step 2 moved aside to put back. */
Test(oom, an_open_that_recovers_leftovers_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s1, s2;
    small_state(&s1, 1);
    small_state(&s2, 2);
    int fd = victim();
    char root[4096], step[4200], aside[4200], tmp[4200];
    long k = 1;
    for (;; k++) {
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store *w = tc_open(root);
        tc_save_ok(w, 1, &s1);
        tc_save_ok(w, 2, &s2);
        ckpt_store_free(w);
        snprintf(step, sizeof step, "%s/step-000000000002", root);
        snprintf(aside, sizeof aside, "%s/.replaced-step-000000000002-99999-1", root);
        snprintf(tmp, sizeof tmp, "%s/.tmp-step-000000000003-99999-1", root);
        cr_assert_eq(rename(step, aside), 0);
        cr_assert_eq(mkdir(tmp, 0750), 0);
        w = NULL;
        ckpt_store_options o;
        tc_opts(&o);
        arm(k);
        int rc = ckpt_store_open(&w, root, &o);
        int reached = disarm();
        assert_victim_open(fd, k, "open");
        if (rc == CKPT_OK) {
            /* Open said it recovered: step 2 is back, or LATEST would
             * silently be step 1. */
            cr_assert(tc_exists(step), "allocation %ld: the open succeeded and left step 2 "
                      "aside", k);
            cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &s2), 2);
        } else {
            assert_oom_failure(rc, k, "open");
            cr_assert_null(w);
            w = tc_open(root);
            cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &s2), 2);
        }
        cr_assert(!tc_exists(aside) && !tc_exists(tmp), "allocation %ld: leftovers stay", k);
        tc_save_ok(w, 3, &s1);
        tc_restore_check(w, 2, &s2);
        ckpt_store_free(w);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 10, "only %ld allocations", k);
    close(fd);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* Saving a step that exists: the old one is moved aside, the new one
 * renamed in. */
Test(oom, replacing_a_step_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s1, s2, s2b;
    small_state(&s1, 1);
    small_state(&s2, 2);
    small_state(&s2b, 22);
    int fd = victim();
    char root[4096];
    long k = 1;
    for (;; k++) {
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store *w = tc_open(root);
        tc_save_ok(w, 1, &s1);
        tc_save_ok(w, 2, &s2);
        arm(k);
        int rc = tc_save(w, 2, &s2b, NULL);
        int reached = disarm();
        assert_victim_open(fd, k, "replacing save");
        if (rc != CKPT_OK)
            assert_failure_reported(rc, k);
        int64_t two[2] = {1, 2};
        tc_assert_steps(w, two, 2);
        tc_restore_check(w, 2, rc == CKPT_OK ? &s2b : &s2);
        tc_restore_check(w, 1, &s1);
        ckpt_store_free(w);
        /* and after reopening (nothing left aside to put back wrongly) */
        w = tc_open(root);
        tc_assert_steps(w, two, 2);
        cr_assert_eq(tc_restore_check(w, CKPT_LATEST, rc == CKPT_OK ? &s2b : &s2), 2);
        tc_save_ok(w, 2, &s1);
        tc_restore_check(w, 2, &s1);
        ckpt_store_free(w);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations", k);
    close(fd);
    tc_state_free(&s1);
    tc_state_free(&s2);
    tc_state_free(&s2b);
}

/* keep_last = 1: each save retires the step before. */
Test(oom, a_save_with_retention_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s[5];
    for (int i = 1; i <= 4; i++)
        small_state(&s[i], (uint64_t)i);
    int fd = victim();
    char root[4096];
    long k = 1;
    for (;; k++) {
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store_options o;
        tc_opts(&o);
        o.keep_last = 1;
        ckpt_store *w = NULL;
        cr_assert_eq(ckpt_store_open(&w, root, &o), CKPT_OK);
        tc_save_ok(w, 1, &s[1]);
        tc_save_ok(w, 2, &s[2]);
        arm(k);
        int rc = tc_save(w, 3, &s[3], NULL);
        int reached = disarm();
        assert_victim_open(fd, k, "save with retention");
        if (rc != CKPT_OK)
            assert_failure_reported(rc, k);
        /* the newest committed step always restores: 3, or 2 when 3 failed */
        cr_assert_eq(tc_restore_check(w, CKPT_LATEST, rc == CKPT_OK ? &s[3] : &s[2]),
                     rc == CKPT_OK ? 3 : 2, "allocation %ld", k);
        tc_save_ok(w, 4, &s[4]);
        cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &s[4]), 4);
        ckpt_store_free(w);
        /* retention is best effort; whatever it left, the next save's cleans */
        cr_assert_eq(ckpt_store_open(&w, root, &o), CKPT_OK);
        tc_save_ok(w, 5, &s[1]);
        int64_t five[1] = {5};
        tc_assert_steps(w, five, 1);
        ckpt_store_free(w);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations", k);
    close(fd);
    for (int i = 1; i <= 4; i++)
        tc_state_free(&s[i]);
}

/* CKPT_OPEN_REWIND: a save below the newest step retires those above. */
Test(oom, a_rewinding_save_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s[4], sb;
    for (int i = 1; i <= 3; i++)
        small_state(&s[i], (uint64_t)i);
    small_state(&sb, 99);
    int fd = victim();
    char root[4096];
    long k = 1;
    for (;; k++) {
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store_options o;
        tc_opts(&o);
        o.flags |= CKPT_OPEN_REWIND;
        ckpt_store *w = NULL;
        cr_assert_eq(ckpt_store_open(&w, root, &o), CKPT_OK);
        for (int i = 1; i <= 3; i++)
            tc_save_ok(w, i * 10, &s[i]);
        arm(k);
        int rc = tc_save(w, 15, &sb, NULL);
        int reached = disarm();
        assert_victim_open(fd, k, "rewinding save");
        if (rc == CKPT_OK) {
            /* committed: 20 and 30 are retired (best effort), LATEST is 15 */
            cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &sb), 15, "allocation %ld", k);
        } else {
            assert_failure_reported(rc, k);
            cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &s[3]), 30, "allocation %ld", k);
        }
        tc_restore_check(w, 10, &s[1]);
        ckpt_store_free(w);
        /* the store goes on: a rewind to 15 again commits and is LATEST */
        cr_assert_eq(ckpt_store_open(&w, root, &o), CKPT_OK);
        tc_save_ok(w, 15, &s[2]);
        cr_assert_eq(tc_restore_check(w, CKPT_LATEST, &s[2]), 15, "allocation %ld", k);
        ckpt_store_free(w);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations", k);
    close(fd);
    for (int i = 1; i <= 3; i++)
        tc_state_free(&s[i]);
    tc_state_free(&sb);
}

/* gc with dry_run: lists, removes nothing. */
Test(oom, a_dry_run_gc_survives_any_failed_allocation)
{
    skip_under_asan();
    tc_state s;
    small_state(&s, 1);
    ckpt_store *w = tc_open(tc_root);
    for (int i = 1; i <= 3; i++)
        tc_save_ok(w, i, &s);
    char *tmp = tc_join(tc_root, ".tmp-step-000000000009-99999-1");
    cr_assert_eq(mkdir(tmp, 0750), 0);
    char *before = tc_tree_snapshot(tc_root);
    int fd = victim();
    long k = 1;
    for (;; k++) {
        ckpt_report *rep = NULL;
        arm(k);
        int rc = ckpt_store_gc(w, 1, 1, &rep);
        int reached = disarm();
        assert_victim_open(fd, k, "gc dry run");
        if (rc == CKPT_OK) {
            /* steps 1 and 2 would go (3 is kept) and the temporary directory */
            cr_assert_eq(ckpt_report_count(rep), 3, "allocation %ld: %zu entries", k,
                         ckpt_report_count(rep));
        } else {
            assert_oom_failure(rc, k, "gc dry run");
        }
        ckpt_report_free(rep);
        char *after = tc_tree_snapshot(tc_root);
        cr_assert_str_eq(after, before, "allocation %ld: a dry run changed the root", k);
        free(after);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 10, "only %ld allocations", k);
    free(before);
    free(tmp);
    tc_save_ok(w, 4, &s);
    ckpt_store_free(w);
    close(fd);
    tc_state_free(&s);
}

/* gc never removes the newest fully valid step (a newer one may pass the
 * quick check, its index, with damaged chunks).  When finding that step
 * ran out of memory, gc went on without it, and with keep_last 1 retired
 * the only step that could be restored. */
Test(oom, gc_keeps_the_newest_valid_step_whatever_allocation_fails)
{
    skip_under_asan();
    tc_state s[4];
    for (int i = 1; i <= 3; i++)
        small_state(&s[i], (uint64_t)i);
    char root[4096], shard[4200];
    long k = 1;
    for (;; k++) {
        snprintf(root, sizeof root, "%s/k%ld", tc_root, k);
        ckpt_store *w = tc_open(root);
        for (int i = 1; i <= 3; i++)
            tc_save_ok(w, i, &s[i]);
        snprintf(shard, sizeof shard, "%s/step-000000000003/rank-00000.shard", root);
        tc_flip_byte(shard, 200); /* step 3: sound index, a damaged chunk */
        ckpt_report *r = NULL;
        arm(k);
        int rc = ckpt_store_gc(w, 1, 0, &r);
        int reached = disarm();
        if (rc != CKPT_OK)
            assert_failure_reported(rc, k);
        ckpt_report_free(r);
        ckpt_store_free(w);
        ckpt_store *ro = tc_open_ro(root);
        cr_assert_eq(tc_restore_check(ro, CKPT_LATEST, &s[2]), 2,
                     "allocation %ld: gc (status %d) removed the newest valid step", k, rc);
        ckpt_store_free(ro);
        tc_rmtree(root);
        if (!reached)
            break;
    }
    cr_assert_gt(k, 20, "only %ld allocations: the allocator is not the one replaced", k);
    for (int i = 1; i <= 3; i++)
        tc_state_free(&s[i]);
}

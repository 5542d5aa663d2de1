/* What the tests of the device path under the real runtime's rules
 * (test_semantics_gpus.c, test_semantics_streams.c) share: the mock, a
 * fresh root per test, a store, tensors, device memory and the check of
 * a saved tensor.  Each file includes it once, for its own copies. */
#ifndef SEMANTICS_UTIL_H
#define SEMANTICS_UTIL_H

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

static inline void setup(void)
{
    M = mock_api_open();
    M.reset();
    root = ct_mkdtemp();
}

static inline void teardown(void)
{
    ct_rmtree(root);
    free(root);
}


static inline ckpt_store *open_store(ckpt_snapshot_mode mode, uint64_t pinned_limit)
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

static inline ckpt_tensor tensor(const char *name, void *p, size_t bytes, ckpt_memory mem)
{
    static int64_t shapes[512][1];
    static int next;
    int64_t *shape = bytes == N ? g_shape : shapes[next++ % 512];
    shape[0] = (int64_t)(bytes / 4);
    return (ckpt_tensor){ name, p, bytes, CKPT_F32, 1, shape, mem };
}

static inline void *dmalloc_on(int dev, size_t n)
{
    void *p = NULL;
    cr_assert_eq(M.SetDevice(dev), 0);
    cr_assert_eq(M.Malloc(&p, n), 0);
    return p;
}

/* Read tensor `name` of `step` back and compare it with `seed`. */
static inline void expect_saved(ckpt_store *st, int64_t step, const char *name, size_t n,
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
#endif

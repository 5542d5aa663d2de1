/* A CUDA runtime loaded after libckpt first looked for one (an application
 * that imports its GPU framework late).  CKPT_MEM_AUTO asks whether a
 * runtime is in the process once per tensor; the answer "none" is
 * remembered only until another library is loaded, so a save after the
 * load must classify through the runtime.  Run with no
 * CKPT_CUDART_LIBRARY (empty) and the mock's path in MOCK_CUDART; the mock
 * is loaded RTLD_GLOBAL, as a statically linked or global runtime is found
 * (its cudaGetDeviceCount visible to dlsym(RTLD_DEFAULT)). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test_util.h"
#include "ckpt.h"

TestSuite(late_runtime, .init = ct_root_setup, .fini = ct_root_teardown, .timeout = 60);

Test(late_runtime, auto_pointers_see_a_runtime_loaded_after_a_save)
{
    const char *path = getenv("MOCK_CUDART");
    cr_assert(path, "MOCK_CUDART is not set (run through meson test)");
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    cr_assert_eq(ckpt_store_open(&st, ct_root, &o), CKPT_OK, "%s", ckpt_error_last());
    float w[256];
    for (int i = 0; i < 256; i++)
        w[i] = (float)i;
    int64_t shape[1] = { 256 };
    ckpt_tensor t = { "w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_AUTO };
    /* twice: the second save finds "no runtime" remembered */
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());

    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    cr_assert(h, "cannot load %s: %s", path, dlerror());
    int (*cuda_malloc)(void **, size_t);
    int (*cuda_free)(void *);
    long (*calls)(const char *);
    *(void **)&cuda_malloc = dlsym(h, "cudaMalloc");
    *(void **)&cuda_free = dlsym(h, "cudaFree");
    *(void **)&calls = dlsym(h, "mock_cuda_calls");
    cr_assert(cuda_malloc && cuda_free && calls);
    void *d = NULL;
    cr_assert_eq(cuda_malloc(&d, sizeof w), 0);
    memcpy(d, w, sizeof w); /* the mock's device memory is host memory */
    long asked = calls("cudaPointerGetAttributes");
    t.data = d;
    cr_assert_eq(ckpt_save_sync(st, 3, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_gt(calls("cudaPointerGetAttributes"), asked,
                 "the AUTO tensor was not classified through the runtime loaded "
                 "after the first saves");
    cr_expect_gt(calls("cudaMemcpyAsync"), 0, "the device tensor was not copied "
                 "through the runtime");

    float back[256];
    memset(back, 0, sizeof back);
    ckpt_tensor r = { "w", back, sizeof back, CKPT_F32, 1, shape, CKPT_MEM_HOST };
    cr_assert_eq(ckpt_restore(st, 3, &r, 1, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(memcmp(back, w, sizeof w), 0);
    ckpt_store_free(st);
    cuda_free(d);
}

/* Asked before the runtime is in the process (libckpt.cuda_available()
 * before `import torch`, whose runtime sits outside the default search
 * path): the failed look must not stand once a runtime is loaded, or
 * device tensors would be refused for the rest of the process, and
 * CKPT_MEM_AUTO would take device pointers for host memory. */
Test(late_runtime, a_failed_first_look_is_made_again_once_a_runtime_is_loaded)
{
    const char *path = getenv("MOCK_CUDART");
    cr_assert(path, "MOCK_CUDART is not set (run through meson test)");
    cr_assert_eq(ckpt_cuda_available(), CKPT_ENODEVICE, "a runtime before the load?");
    cr_assert_eq(ckpt_cuda_available(), CKPT_ENODEVICE); /* nothing loaded since */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    cr_assert(h, "cannot load %s: %s", path, dlerror());
    cr_assert_eq(ckpt_cuda_available(), CKPT_OK, "%s", ckpt_error_last());

    int (*cuda_malloc)(void **, size_t);
    int (*cuda_free)(void *);
    long (*calls)(const char *);
    *(void **)&cuda_malloc = dlsym(h, "cudaMalloc");
    *(void **)&cuda_free = dlsym(h, "cudaFree");
    *(void **)&calls = dlsym(h, "mock_cuda_calls");
    cr_assert(cuda_malloc && cuda_free && calls);
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (float)i;
    void *d = NULL;
    cr_assert_eq(cuda_malloc(&d, sizeof w), 0);
    memcpy(d, w, sizeof w);
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    cr_assert_eq(ckpt_store_open(&st, ct_root, &o), CKPT_OK, "%s", ckpt_error_last());
    int64_t shape[1] = { 64 };
    ckpt_tensor t = { "w", d, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_DEVICE };
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    long copies = calls("cudaMemcpyAsync");
    t.memory = CKPT_MEM_AUTO;
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_gt(calls("cudaMemcpyAsync"), copies, "the AUTO device tensor was not "
                 "copied through the runtime");
    ckpt_store_free(st);
    cuda_free(d);
}

/* The application's own runtime on a node without a GPU (or with
 * CUDA_VISIBLE_DEVICES=""): a host save that asks about an AUTO pointer
 * made libckpt load it and count the devices, and the count's
 * cudaErrorNoDevice stayed in the application's last-error slot, where
 * its next cudaGetLastError() found an error it never caused. */
Test(late_runtime, no_device_leaves_no_error_in_the_applications_runtime)
{
    const char *path = getenv("MOCK_CUDART");
    cr_assert(path, "MOCK_CUDART is not set (run through meson test)");
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    cr_assert(h, "cannot load %s: %s", path, dlerror());
    void (*set_count)(int);
    int (*last)(void);
    *(void **)&set_count = dlsym(h, "mock_cuda_set_device_count");
    *(void **)&last = dlsym(h, "cudaGetLastError");
    cr_assert(set_count && last);
    set_count(0);
    cr_assert_eq(last(), 0);
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    cr_assert_eq(ckpt_store_open(&st, ct_root, &o), CKPT_OK, "%s", ckpt_error_last());
    float w[64] = {1};
    int64_t shape[1] = {64};
    ckpt_tensor t = {"w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_AUTO};
    cr_assert_eq(ckpt_save_sync(st, 1, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(ckpt_cuda_available(), CKPT_ENODEVICE);
    int left = last();
    cr_expect_eq(left, 0, "libckpt left error %d in the application's runtime", left);
    ckpt_store_free(st);
}

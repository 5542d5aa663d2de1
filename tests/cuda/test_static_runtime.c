/* A program with its CUDA runtime linked statically (nvcc's default
 * -cudart static) exports no runtime symbol libckpt could find: the CUDA
 * driver, libcuda.so.1, is the only sign of CUDA in the process.  A
 * CKPT_MEM_AUTO pointer to device memory must then never be memcpy'd (on a
 * GPU: a fault, or a silent read without stream order).  Here the driver is
 * a stand-in (mock_libcuda.c, path in MOCK_LIBCUDA) and "device memory" a
 * mapping no host code may touch (PROT_NONE: a memcpy would fault), and no
 * runtime can be loaded (CKPT_CUDART_LIBRARY names a missing file): the save
 * is refused, naming the pointer and the remedy; host AUTO buffers still
 * save. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda_test_util.h"
#include "ckpt.h"

TestSuite(static_runtime, .init = ct_root_setup, .fini = ct_root_teardown, .timeout = 60);

#define DEV_BYTES 4096
static char *g_dev;

static int is_device(const void *p)
{
    return (const char *)p >= g_dev && (const char *)p < g_dev + DEV_BYTES;
}

Test(static_runtime, an_auto_device_pointer_is_refused_not_copied)
{
    const char *path = getenv("MOCK_LIBCUDA");
    cr_assert(path, "MOCK_LIBCUDA is not set (run through meson test)");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "cannot load %s: %s", path, dlerror());
    void (*set)(int (*)(const void *));
    *(void **)&set = dlsym(h, "mock_libcuda_set_classifier");
    cr_assert(set);
    g_dev = mmap(NULL, DEV_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(g_dev != MAP_FAILED);
    set(is_device);

    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    cr_assert_eq(ckpt_store_open(&st, ct_root, &o), CKPT_OK, "%s", ckpt_error_last());
    float host[256];
    for (int i = 0; i < 256; i++)
        host[i] = (float)i;
    int64_t shape[1] = { 256 };
    ckpt_tensor t[2] = { { "h", host, sizeof host, CKPT_F32, 1, shape, CKPT_MEM_AUTO },
                         { "d", g_dev, sizeof host, CKPT_F32, 1, shape, CKPT_MEM_AUTO } };
    cr_assert_eq(ckpt_save_sync(st, 1, t, 2, NULL), CKPT_ENODEVICE, "%s", ckpt_error_last());
    const char *msg = ckpt_error_last();
    cr_assert(strstr(msg, "'d'") && strstr(msg, "is device memory") &&
              strstr(msg, "-cudart shared"), "%s", msg);
    cr_assert_eq(ckpt_save_sync(st, 1, t, 1, NULL), CKPT_OK, "host AUTO: %s",
                 ckpt_error_last());
    float back[256];
    memset(back, 0, sizeof back);
    ckpt_tensor r = { "h", back, sizeof back, CKPT_F32, 1, shape, CKPT_MEM_HOST };
    cr_assert_eq(ckpt_restore(st, 1, &r, 1, NULL, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_arr_eq(back, host, sizeof host);
    ckpt_store_free(st);
    munmap(g_dev, DEV_BYTES);
    dlclose(h);
}

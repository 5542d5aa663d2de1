/* No CUDA runtime at all: CKPT_CUDART_LIBRARY (set by meson) names a file
 * that does not exist, and when it is set nothing else is tried.  Device
 * tensors must get CKPT_ENODEVICE with a message saying what was tried;
 * host tensors (declared or AUTO) must work as usual. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test_util.h"
#include "ckpt.h"

TestSuite(noruntime, .init = ct_root_setup, .fini = ct_root_teardown, .timeout = 60);

Test(noruntime, cuda_available_says_what_was_tried)
{
    const char *lib = getenv("CKPT_CUDART_LIBRARY");
    cr_assert(lib);
    cr_assert_eq(ckpt_cuda_available(), CKPT_ENODEVICE);
    const char *msg = ckpt_error_last();
    cr_expect(strstr(msg, "no CUDA runtime found"), "%s", msg);
    cr_expect(strstr(msg, lib), "message does not name %s: %s", lib, msg);
    /* decided once: the same answer again */
    cr_assert_eq(ckpt_cuda_available(), CKPT_ENODEVICE);
}

Test(noruntime, device_tensor_is_enodevice_host_tensors_work)
{
    ckpt_store *st;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    cr_assert_eq(ckpt_store_open(&st, ct_root, &o), CKPT_OK, "%s", ckpt_error_last());

    float w[256], back[256];
    for (int i = 0; i < 256; i++)
        w[i] = (float)i * 0.5f;
    int64_t shape[1] = { 256 };
    ckpt_tensor t = { "w", w, sizeof w, CKPT_F32, 1, shape, CKPT_MEM_DEVICE };
    int rc = ckpt_save_sync(st, 1, &t, 1, NULL);
    cr_assert_eq(rc, CKPT_ENODEVICE, "got %d: %s", rc, ckpt_error_last());
    const char *msg = ckpt_error_last();
    cr_expect(strstr(msg, "tensor 'w': device tensors need CUDA: no CUDA runtime found"),
              "message garbled or not naming the tensor: %s", msg);

    int64_t *steps;
    size_t n;
    cr_assert_eq(ckpt_store_steps(st, &steps, &n), CKPT_OK);
    cr_expect_eq(n, 0, "a failed save left a checkpoint");
    ckpt_free(steps);

    t.memory = CKPT_MEM_AUTO; /* no runtime: AUTO is host */
    cr_assert_eq(ckpt_save_sync(st, 2, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    t.memory = CKPT_MEM_HOST;
    cr_assert_eq(ckpt_save_sync(st, 3, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    cr_expect_eq(ckpt_store_pinned_bytes(st), 0);

    ckpt_tensor r = { "w", back, sizeof back, CKPT_F32, 1, shape, CKPT_MEM_AUTO };
    memset(back, 0, sizeof back);
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, &r, 1, NULL, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_expect_eq(memcmp(back, w, sizeof w), 0);

    r.memory = CKPT_MEM_DEVICE;
    cr_expect_eq(ckpt_restore(st, CKPT_LATEST, &r, 1, NULL, NULL), CKPT_ENODEVICE);
    ckpt_store_free(st);
}

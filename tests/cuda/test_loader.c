/* The runtime loader across CUDA versions.  $CKPT_CUDART_LIBRARY lists
 * candidates newest first, as the built-in names are (libcudart.so.13, .12,
 * .11.0).  With CKPT_TEST_EXPECT=fallback the first candidate is too new for
 * the driver (cudaErrorInsufficientDriver) and the second works: it must be
 * chosen and a device save must work.  With CKPT_TEST_EXPECT=insufficient
 * the only candidate is too new: CKPT_ENODEVICE naming the error and what
 * to do.  With CKPT_TEST_EXPECT=nodriver the runtime finds no driver at all
 * (the same error, but a driver version of 0): the message must say so,
 * not blame the driver's age.  With CKPT_TEST_EXPECT=tooold the first
 * candidate is a CUDA 10.2 runtime (refused: its structures differ) and the
 * second finds no driver: both named. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

Test(loader, falls_back_or_says_why)
{
    const char *expect = getenv("CKPT_TEST_EXPECT");
    const char *libs = getenv("CKPT_CUDART_LIBRARY");
    cr_assert(expect && libs);
    int rc = ckpt_cuda_available();
    if (strcmp(expect, "fallback") == 0) {
        cr_assert_eq(rc, CKPT_OK, "no runtime chosen: %s", ckpt_error_last());
        return;
    }
    cr_assert_eq(rc, CKPT_ENODEVICE);
    const char *msg = ckpt_error_last();
    if (strcmp(expect, "nodriver") == 0 || strcmp(expect, "tooold") == 0) {
        cr_assert(strstr(msg, "no NVIDIA driver is installed"), "%s", msg);
        cr_assert(!strstr(msg, "driver is older"), "%s", msg);
        cr_assert(strstr(msg, "libcudart_mock_nodriver"), "%s", msg);
        if (strcmp(expect, "tooold") == 0)
            cr_assert(strstr(msg, "libcudart_mock_cuda10.so: version 10.2, before 11.0"),
                      "%s", msg);
        return;
    }
    cr_assert(strstr(msg, "cudaErrorInsufficientDriver"), "%s", msg);
    cr_assert(strstr(msg, "driver is older"), "%s", msg);
    cr_assert(strstr(msg, "libcudart_mock_olddriver"), "%s", msg);
}

/* fsio_preadv (lib/io/fsio.h): one read scattered over several buffers,
 * in file order, the last one short at the end of the file; an injected
 * fault fails it like a pread; the trace sees one read of all its bytes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fsio.h"
#include "helpers.h"

TestSuite(fsio, .init = tc_setup, .fini = tc_teardown, .timeout = 60);

static int fail_reads(void *ctx, fsio_op op, const char *path)
{
    (void)path;
    return op == FSIO_PREAD ? *(int *)ctx : 0;
}

static size_t traced;

static void trace_reads(void *ctx, const fsio_event *ev)
{
    (void)ctx;
    if (ev->op == FSIO_PREAD)
        traced += ev->len;
}

Test(fsio, preadv_scatters_in_file_order)
{
    char path[4096], file[100];
    snprintf(path, sizeof path, "%s/data", tc_root);
    for (int i = 0; i < 100; i++)
        file[i] = (char)i;
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    cr_assert(fd >= 0 && write(fd, file, 100) == 100 && close(fd) == 0);
    fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);

    char a[30], b[1], c[50], d[40];
    memset(d, 0x7f, sizeof d);
    struct iovec iov[] = {{a, 30}, {b, 0}, {c, 50}, {d, 40}};
    fsio fs = {.trace = trace_reads};
    traced = 0;
    cr_assert_eq(fsio_preadv(&fs, fd, iov, 4, 0), 100, "the file has 100 bytes");
    cr_assert_eq(traced, 100);
    cr_assert(memcmp(a, file, 30) == 0 && memcmp(c, file + 30, 50) == 0);
    cr_assert(memcmp(d, file + 80, 20) == 0);
    cr_assert_eq(d[20], 0x7f, "nothing past the end of the file");

    struct iovec mid[] = {{a, 5}, {c, 5}};
    cr_assert_eq(fsio_preadv(&fs, fd, mid, 2, 42), 10, "from an offset");
    cr_assert(memcmp(a, file + 42, 5) == 0 && memcmp(c, file + 47, 5) == 0);

    int err = EIO;
    fsio faulty = {.fault = fail_reads, .ctx = &err};
    struct iovec one[] = {{a, 30}};
    cr_assert_eq(fsio_preadv(&faulty, fd, one, 1, 0), -EIO);
    close(fd);
}

/* xxh3 (lib/format/xxh3.c): the hash every build of XXH3 gives, whatever
 * vector unit this CPU lends it, equals libxxhash's own XXH3_64bits (the
 * shared library, an independent build), one-shot and streamed in any
 * pieces, at every size around the block boundaries and at odd addresses.
 * Each vector build is also called directly where the CPU has its unit. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "xxh3.h"
#include "xxh3_isa.h"

#define MAX (3u << 20)

static unsigned char *data(void)
{
    unsigned char *p = malloc(MAX + 64);
    cr_assert_not_null(p);
    uint64_t x = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < MAX + 64; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
    return p;
}

/* Sizes where XXH3 changes paths: 0-16, 17-128, 129-240, stripes of 64,
 * blocks of 1,024, the streaming buffer of 256, and large inputs. */
static const size_t SIZES[] = {0, 1, 3, 4, 8, 9, 16, 17, 64, 128, 129, 200, 240, 241,
                               255, 256, 257, 511, 1023, 1024, 1025, 4095, 4096, 65536,
                               65537, 262144 + 7, 1u << 20, MAX};
#define NSIZES (sizeof SIZES / sizeof *SIZES)

Test(xxh3, one_shot_matches_libxxhash)
{
    unsigned char *p = data();
    for (size_t k = 0; k < NSIZES; k++)
        for (size_t off = 0; off < 64; off += 13)
            cr_assert_eq(xxh3_64(p + off, SIZES[k]), XXH3_64bits(p + off, SIZES[k]),
                         "size %zu offset %zu", SIZES[k], off);
    free(p);
}

Test(xxh3, streamed_in_pieces_matches_one_shot)
{
    unsigned char *p = data();
    xxh3_stream *s = xxh3_stream_new();
    cr_assert_not_null(s);
    static const size_t pieces[] = {1, 7, 64, 255, 256, 1000, 4096, 262144};
    for (size_t k = 0; k < NSIZES; k++)
        for (size_t q = 0; q < sizeof pieces / sizeof *pieces; q++) {
            size_t n = SIZES[k];
            if (n / pieces[q] > 5000)
                continue; /* enough pieces */
            xxh3_stream_reset(s);
            for (size_t at = 0; at < n; at += pieces[q])
                xxh3_stream_update(s, p + at + 3, n - at < pieces[q] ? n - at : pieces[q]);
            cr_assert_eq(xxh3_stream_digest(s), XXH3_64bits(p + 3, n), "size %zu pieces %zu",
                         n, pieces[q]);
        }
    xxh3_stream_free(s);
    free(p);
}

#if defined(__x86_64__) && defined(CKPT_XXH3_DISPATCH)
static void unit_matches(uint64_t (*f)(const void *, size_t),
                         void (*upd)(void *, const void *, size_t))
{
    unsigned char *p = data();
    XXH3_state_t *st = XXH3_createState();
    for (size_t k = 0; k < NSIZES; k++) {
        cr_assert_eq(f(p + 5, SIZES[k]), XXH3_64bits(p + 5, SIZES[k]), "size %zu", SIZES[k]);
        XXH3_64bits_reset(st);
        size_t half = SIZES[k] / 2;
        upd(st, p, half);
        upd(st, p + half, SIZES[k] - half);
        cr_assert_eq(XXH3_64bits_digest(st), XXH3_64bits(p, SIZES[k]), "size %zu streamed",
                     SIZES[k]);
    }
    XXH3_freeState(st);
    free(p);
}

Test(xxh3, avx2_build)
{
    if (!__builtin_cpu_supports("avx2"))
        cr_skip_test("this CPU has no AVX2");
    unit_matches(xxh3_64_avx2, xxh3_update_avx2);
}

Test(xxh3, avx512_build)
{
    if (!__builtin_cpu_supports("avx512f"))
        cr_skip_test("this CPU has no AVX-512 (or runs under valgrind)");
    unit_matches(xxh3_64_avx512, xxh3_update_avx512);
}
#endif

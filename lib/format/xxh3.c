/* xxh3: XXH3-64 through the vector unit the CPU has (see xxh3.h). */
#include "xxh3.h"

#define XXH_INLINE_ALL /* several times faster than calls into libxxhash */
#include <xxhash.h>

#include "xxh3_isa.h"

/* Inputs up to this size take XXH3's scalar paths in every build. */
#define VECTOR_MIN 240

#ifdef CKPT_XXH3_DISPATCH
/* The unit to use: 2 AVX-512, 1 AVX2, 0 the default build.  The CPU's
 * features are read by libgcc once at load (and say whether the kernel
 * saves the wider registers); valgrind's CPU reports no AVX-512. */
static int unit(void)
{
    if (__builtin_cpu_supports("avx512f"))
        return 2;
    if (__builtin_cpu_supports("avx2"))
        return 1;
    return 0;
}
#endif

uint64_t xxh3_64(const void *p, size_t n)
{
#ifdef CKPT_XXH3_DISPATCH
    if (n > VECTOR_MIN) {
        switch (unit()) {
        case 2:
            return xxh3_64_avx512(p, n);
        case 1:
            return xxh3_64_avx2(p, n);
        }
    }
#endif
    return XXH3_64bits(p, n);
}

/* An xxh3_stream is an XXH3_state_t, allocated by xxHash (aligned as it
 * needs). */
xxh3_stream *xxh3_stream_new(void)
{
    return (xxh3_stream *)XXH3_createState();
}

void xxh3_stream_free(xxh3_stream *s)
{
    XXH3_freeState((XXH3_state_t *)s);
}

void xxh3_stream_reset(xxh3_stream *s)
{
    XXH3_64bits_reset((XXH3_state_t *)s);
}

void xxh3_stream_update(xxh3_stream *s, const void *p, size_t n)
{
#ifdef CKPT_XXH3_DISPATCH
    switch (unit()) {
    case 2:
        xxh3_update_avx512(s, p, n);
        return;
    case 1:
        xxh3_update_avx2(s, p, n);
        return;
    }
#endif
    XXH3_64bits_update((XXH3_state_t *)s, p, n);
}

uint64_t xxh3_stream_digest(const xxh3_stream *s)
{
    return XXH3_64bits_digest((const XXH3_state_t *)s);
}

/* xxh3_isa: xxHash's XXH3 compiled for one vector unit (the build compiles
 * this file once per unit, with its -m flag and XXH3_ISA naming the
 * functions; lib/format/xxh3.c calls them only on a CPU that has it). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "xxh3_isa.h"

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

uint64_t CAT(xxh3_64, XXH3_ISA)(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

void CAT(xxh3_update, XXH3_ISA)(void *state, const void *p, size_t n)
{
    XXH3_64bits_update((XXH3_state_t *)state, p, n);
}

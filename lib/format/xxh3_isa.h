/* xxh3_isa: the per-vector-unit builds of XXH3 that lib/format/xxh3.c
 * chooses from (see xxh3.h).  `state` is an XXH3_state_t. */
#ifndef CKPT_XXH3_ISA_H
#define CKPT_XXH3_ISA_H

#include <stddef.h>
#include <stdint.h>

uint64_t xxh3_64_avx2(const void *p, size_t n);
void xxh3_update_avx2(void *state, const void *p, size_t n);
uint64_t xxh3_64_avx512(const void *p, size_t n);
void xxh3_update_avx512(void *state, const void *p, size_t n);

#endif

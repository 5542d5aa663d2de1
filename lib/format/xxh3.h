/* xxh3: XXH3-64 with the widest vector unit this CPU has.
 *
 * xxHash picks its vector code when it is compiled, and a library built
 * for any x86-64 gets SSE2, which hashes cached data at less than half the
 * speed of AVX2 (a third of AVX-512).  Hashing runs over every byte of a
 * save, its read-back and every restore, so the AVX2 and AVX-512 builds of
 * the same code are compiled too (lib/format/xxh3_isa.c) and chosen per
 * call from the CPU's features.  XXH3 is defined independently of the
 * vector unit: every build gives the same hashes. */
#ifndef CKPT_XXH3_H
#define CKPT_XXH3_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 of n bytes. */
uint64_t xxh3_64(const void *p, size_t n);

/* The streaming form: an opaque state, malloc'd (NULL when out of memory),
 * reset before use, fed any number of times, digested (the same value as
 * xxh3_64 over everything fed since the reset). */
typedef struct xxh3_stream xxh3_stream;
xxh3_stream *xxh3_stream_new(void);
void xxh3_stream_free(xxh3_stream *s);
void xxh3_stream_reset(xxh3_stream *s);
void xxh3_stream_update(xxh3_stream *s, const void *p, size_t n);
uint64_t xxh3_stream_digest(const xxh3_stream *s);

#endif

/* util: small helpers shared by the modules (time, paths, hex, checked math). */
#ifndef CKPT_UTIL_H
#define CKPT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

double util_now(void);      /* monotonic seconds */
double util_wall_time(void); /* Unix time, seconds */
/* Memory the kernel has free right now (Linux MemFree: not counting the
 * page cache it could reclaim), bytes; 0 where unknown. */
uint64_t util_mem_free(void);

/* malloc'd "a/b"; NULL on out of memory. */
char *util_join(const char *a, const char *b);
char *util_strdup(const char *s);
char *util_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 16 lowercase hex digits of the canonical (big-endian) form of h. */
void util_hex64(uint64_t h, char out[17]);
/* Parse exactly 16 hex digits; false if malformed. */
bool util_parse_hex64(const char *s, uint64_t *h);

/* Overflow-checked arithmetic: false on overflow. */
static inline bool util_add_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}
static inline bool util_mul_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

/* The bytes of a tensor of `ndim` dimensions `shape` and `es`-byte
 * elements into *bytes: false when a dimension is negative or the product
 * of the nonzero dimensions times `es` exceeds INT64_MAX.  Zeros are left
 * out of that check so that a shape is valid or not in any order of its
 * dimensions ([0, 2^62, 4] as [2^62, 4, 0]), and only what NumPy and torch
 * can describe is valid. */
static inline bool util_shape_bytes(const int64_t *shape, int ndim, uint64_t es,
                                    uint64_t *bytes)
{
    uint64_t nz = es;
    bool zero = false;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return false;
        if (shape[d] == 0)
            zero = true;
        else if (!util_mul_u64(nz, (uint64_t)shape[d], &nz) || nz > (uint64_t)INT64_MAX)
            return false;
    }
    *bytes = zero ? 0 : nz;
    return true;
}

/* Little-endian field access for the on-disk structures. */
static inline void util_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline void util_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t util_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t util_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
/* Big-endian (xxHash canonical form) for stored hashes. */
static inline void util_put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}
static inline uint64_t util_get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

#endif

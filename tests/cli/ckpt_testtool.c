/* ckpt_testtool: make deterministic checkpoints and read tensors back, for
 * the CLI tests.  Public API only.
 *
 *   ckpt_testtool make  DIR STEP [SEED [CHUNK_BYTES]]   save the test state
 *   ckpt_testtool bytes SEED NAME OUT                   expected bytes of NAME
 *   ckpt_testtool names                                 "name dtype shape" lines
 *   ckpt_testtool dump  DIR STEP NAME OUT               ckpt_restore NAME to OUT
 *   ckpt_testtool rehash MANIFEST                       set its checksum to its
 *                                                       content's (an edited one)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "ckpt.h"

typedef struct spec {
    const char *name;
    ckpt_dtype dtype;
    int ndim;
    int64_t shape[4];
} spec;

static const spec specs[] = {
    {"model/layer0/weight", CKPT_F32, 2, {64, 33}},
    {"model/layer0/bias", CKPT_F32, 1, {33}},
    {"model/layer1/weight", CKPT_BF16, 2, {16, 8}},
    {"model/embed", CKPT_F16, 2, {10, 4}},
    {"optim/step", CKPT_I64, 0, {0}},
    {"optim/mask", CKPT_BOOL, 1, {17}},
    {"stats/hist", CKPT_U32, 3, {3, 4, 5}},
    {"stats/delta", CKPT_I16, 1, {7}},
    {"misc/u8", CKPT_U8, 1, {300}},
    {"misc/i8", CKPT_I8, 1, {9}},
    {"misc/u16", CKPT_U16, 1, {6}},
    {"misc/i32", CKPT_I32, 2, {2, 2}},
    {"misc/u64", CKPT_U64, 1, {3}},
    {"misc/f64", CKPT_F64, 2, {5, 2}},
    {"misc/c64", CKPT_C64, 1, {4}},
    {"misc/c128", CKPT_C128, 2, {2, 2}},
    {"misc/f8a", CKPT_F8_E4M3, 1, {8}},
    {"misc/f8b", CKPT_F8_E5M2, 1, {8}},
    {"misc/blob", CKPT_BYTES, 1, {100}},
    {"misc/empty", CKPT_F32, 2, {0, 3}},
    {"rng", CKPT_U8, 1, {2049}},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t spec_bytes(const spec *sp)
{
    uint64_t n = ckpt_dtype_size(sp->dtype);
    for (int d = 0; d < sp->ndim; d++)
        n *= (uint64_t)sp->shape[d];
    return n;
}

/* Deterministic contents: finite floats, 0/1 bools, random bits elsewhere. */
static void fill(const spec *sp, uint64_t seed, size_t idx, unsigned char *buf)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + idx * 0xBF58476D1CE4E5B9ull + 1;
    uint64_t n = spec_bytes(sp);
    size_t es = ckpt_dtype_size(sp->dtype);
    for (uint64_t i = 0; i < n / es; i++) {
        uint64_t r = next(&s);
        unsigned char *p = buf + i * es;
        switch (sp->dtype) {
        case CKPT_BOOL:
            p[0] = (unsigned char)(r & 1);
            break;
        case CKPT_F32: {
            float f = (float)((double)(r % 20001) / 1000.0 - 10.0);
            memcpy(p, &f, 4);
            break;
        }
        case CKPT_F64:
        case CKPT_C128: {
            double f = (double)(r % 2000001) / 1000.0 - 1000.0;
            memcpy(p, &f, 8);
            if (es == 16) {
                f = (double)(next(&s) % 2001) / 100.0;
                memcpy(p + 8, &f, 8);
            }
            break;
        }
        case CKPT_C64: {
            float f[2] = {(float)(r % 1000) / 8.0f, -(float)(r >> 32 & 1023) / 4.0f};
            memcpy(p, f, 8);
            break;
        }
        case CKPT_F16:
        case CKPT_BF16: {
            /* keep the exponent below all-ones: no inf or NaN */
            uint16_t v = (uint16_t)r;
            uint16_t emask = sp->dtype == CKPT_F16 ? 0x7C00 : 0x7F80;
            if ((v & emask) == emask)
                v ^= sp->dtype == CKPT_F16 ? 0x0400 : 0x0080;
            memcpy(p, &v, 2);
            break;
        }
        default:
            for (size_t b = 0; b < es; b++)
                p[b] = (unsigned char)(r >> (8 * (b % 8)));
        }
    }
}

static int write_file(const char *path, const void *data, uint64_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

static int cmd_make(const char *dir, int64_t step, uint64_t seed, uint64_t chunk)
{
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    ckpt_store *store = NULL;
    ckpt_tensor t[NSPECS];
    unsigned char *bufs[NSPECS];
    char meta[128];
    so.keep_last = 0;
    so.fsync = 0;
    so.chunk_bytes = chunk;
    so.threads = 2;
    int st = ckpt_store_open(&store, dir, &so);
    if (st) {
        fprintf(stderr, "open %s: %s\n", dir, ckpt_error_last());
        return 3;
    }
    for (size_t i = 0; i < NSPECS; i++) {
        uint64_t n = spec_bytes(&specs[i]);
        bufs[i] = malloc(n ? n : 1);
        fill(&specs[i], seed, i, bufs[i]);
        t[i] = (ckpt_tensor){specs[i].name, bufs[i], n, specs[i].dtype, specs[i].ndim,
                             specs[i].shape, CKPT_MEM_HOST};
    }
    snprintf(meta, sizeof meta, "{\"lr\": 0.001, \"epoch\": 3, \"seed\": %" PRIu64 "}", seed);
    ckpt_save_options o = CKPT_SAVE_OPTIONS_INIT;
    o.metadata_json = meta;
    st = ckpt_save_sync(store, step, t, NSPECS, &o);
    if (st)
        fprintf(stderr, "save: %s\n", ckpt_error_last());
    for (size_t i = 0; i < NSPECS; i++)
        free(bufs[i]);
    ckpt_store_free(store);
    return st ? 3 : 0;
}

static int cmd_bytes(uint64_t seed, const char *name, const char *out)
{
    for (size_t i = 0; i < NSPECS; i++) {
        if (strcmp(specs[i].name, name) == 0) {
            uint64_t n = spec_bytes(&specs[i]);
            unsigned char *b = malloc(n ? n : 1);
            fill(&specs[i], seed, i, b);
            int r = write_file(out, b, n);
            free(b);
            return r;
        }
    }
    fprintf(stderr, "no tensor %s\n", name);
    return 1;
}

static int cmd_names(void)
{
    for (size_t i = 0; i < NSPECS; i++) {
        printf("%s %s", specs[i].name, ckpt_dtype_name(specs[i].dtype));
        for (int d = 0; d < specs[i].ndim; d++)
            printf("%s%" PRId64, d ? "," : " ", specs[i].shape[d]);
        printf(specs[i].ndim ? "\n" : " -\n");
    }
    return 0;
}

/* Restore one tensor through ckpt_restore (every chunk verified). */
static int cmd_dump(const char *dir, int64_t step, const char *name, const char *out)
{
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    ckpt_store *store = NULL;
    ckpt_checkpoint *c = NULL;
    ckpt_tensor_info ti;
    size_t idx;
    int rc = 3;
    void *buf = NULL;
    so.flags = CKPT_OPEN_READONLY;
    if (ckpt_store_open(&store, dir, &so) || ckpt_checkpoint_open(&c, store, step, CKPT_VERIFY_QUICK) ||
        ckpt_checkpoint_find(c, name, &idx) || ckpt_checkpoint_tensor(c, idx, &ti)) {
        fprintf(stderr, "dump %s: %s\n", name, ckpt_error_last());
        goto done;
    }
    buf = malloc(ti.bytes ? ti.bytes : 1);
    ckpt_tensor t = {name, buf, ti.bytes, ti.dtype, ti.ndim, ti.shape, CKPT_MEM_HOST};
    int st = ckpt_restore(store, ckpt_checkpoint_step(c), &t, 1, NULL, NULL);
    if (st) {
        fprintf(stderr, "restore %s: %s\n", name, ckpt_error_last());
        goto done;
    }
    printf("%s", ckpt_dtype_name(ti.dtype));
    for (int d = 0; d < ti.ndim; d++)
        printf("%s%" PRId64, d ? "," : " ", ti.shape[d]);
    printf(ti.ndim ? "\n" : " -\n");
    rc = write_file(out, buf, ti.bytes) ? 3 : 0;
done:
    free(buf);
    ckpt_checkpoint_free(c);
    ckpt_store_free(store);
    return rc;
}

/* docs/FORMAT.md, "File format and checksum": B, then `,\n  "checksum":
 * "H"\n}\n` with H the XXH3-64 of B in 16 lowercase hex digits. */
static int cmd_rehash(const char *path)
{
    FILE *f = fopen(path, "rb");
    static char text[1 << 20];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = '\0';
    char *tail = strstr(text, ",\n  \"checksum\": \"");
    if (!tail || strlen(tail) != strlen(",\n  \"checksum\": \"\"\n}\n") + 16) {
        fprintf(stderr, "%s: not a manifest\n", path);
        return 1;
    }
    unsigned long long h = (unsigned long long)XXH3_64bits(text, (size_t)(tail - text));
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx\"\n}\n", h);
    memcpy(tail + strlen(",\n  \"checksum\": \""), hex, strlen(hex)); /* as long */
    f = fopen(path, "wb");
    if (!f || fwrite(text, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "rehash") == 0)
        return cmd_rehash(argv[2]);
    if (argc >= 4 && strcmp(argv[1], "make") == 0)
        return cmd_make(argv[2], strtoll(argv[3], NULL, 10),
                        argc > 4 ? strtoull(argv[4], NULL, 10) : 1,
                        argc > 5 ? strtoull(argv[5], NULL, 10) : 4096);
    if (argc == 5 && strcmp(argv[1], "bytes") == 0)
        return cmd_bytes(strtoull(argv[2], NULL, 10), argv[3], argv[4]);
    if (argc == 2 && strcmp(argv[1], "names") == 0)
        return cmd_names();
    if (argc == 6 && strcmp(argv[1], "dump") == 0)
        return cmd_dump(argv[2], strtoll(argv[3], NULL, 10), argv[4], argv[5]);
    fprintf(stderr, "usage: see the comment at the top of ckpt_testtool.c\n");
    return 2;
}

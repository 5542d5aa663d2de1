/* bench_limits: what the cores can do on one state's bytes, for
 * bench_persist.py's "limit" rows.  Reads FILE (the raw bytes) into
 * pre-faulted memory once, then times, on THREADS threads taking 4 MiB
 * chunks from a shared counter (as libckpt's workers do):
 *
 *   xxh3      XXH3-64 of every chunk (libckpt's codec_hash, inlined xxHash)
 *   zstd      ZSTD_compressCCtx at LEVEL of every chunk, as is
 *   codec     libckpt's chunk codec: byte shuffle by ELEM + zstd + both hashes
 *   decode    decoding the codec's output back (unzstd + unshuffle + hashes)
 *             into a second pre-faulted buffer the size of the state, as a
 *             restore decodes into its targets
 *   memcpy    copying every chunk into that second buffer, as a snapshot
 *             copies into its staging (a 4 MiB scratch buffer would stay
 *             in cache and make both limits faster than any real target)
 *
 * Prints one JSON object: bytes, threads, seconds and GB/s of each, and the
 * codec's stored/raw ratio.  Usage: bench_limits FILE THREADS ELEM [LEVEL] */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "codec.h"

#define CHUNK ((size_t)4 << 20)

typedef struct job {
    const unsigned char *src;
    unsigned char *dst;       /* encoded frames (bound of CHUNK each) */
    unsigned char *back;      /* decode / memcpy target, `bytes` long */
    size_t bytes, nchunks, slot;
    unsigned elem;
    int level;
    int what;                 /* 0 xxh3, 1 zstd, 2 codec, 3 decode, 4 memcpy */
    chunk_meta *meta;         /* codec output per chunk (for decode) */
    atomic_size_t next;
    atomic_ullong stored;
} job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker(void *arg)
{
    job *j = arg;
    codec *c = NULL;
    ZSTD_CCtx *z = ZSTD_createCCtx();
    unsigned char *tmp = malloc(j->slot);
    if (codec_create(&c, j->level) != CKPT_OK || !z || !tmp) {
        fprintf(stderr, "bench_limits: out of memory\n");
        exit(1);
    }
    volatile uint64_t sink = 0;
    for (;;) {
        size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->nchunks)
            break;
        size_t off = k * CHUNK, n = j->bytes - off < CHUNK ? j->bytes - off : CHUNK;
        const unsigned char *p = j->src + off;
        unsigned char *frame = j->dst + k * j->slot;
        if (j->what == 0) {
            sink += codec_hash(p, n);
        } else if (j->what == 1) {
            size_t r = ZSTD_compressCCtx(z, tmp, j->slot, p, n, j->level);
            atomic_fetch_add(&j->stored, ZSTD_isError(r) ? n : r);
        } else if (j->what == 2) {
            const void *stored;
            if (codec_encode(c, p, n, j->elem, &stored, &j->meta[k]) != CKPT_OK)
                exit(1);
            memcpy(frame, stored, (size_t)j->meta[k].stored_len);
            atomic_fetch_add(&j->stored, j->meta[k].stored_len);
        } else if (j->what == 3) {
            if (codec_decode_checked(c, frame, &j->meta[k], j->back + off) != CKPT_OK) {
                fprintf(stderr, "bench_limits: decode failed: %s\n", ckpt_error_last());
                exit(1);
            }
        } else {
            memcpy(j->back + off, p, n);
        }
    }
    (void)sink;
    codec_free(c);
    ZSTD_freeCCtx(z);
    free(tmp);
    return NULL;
}

static double run(job *j, int threads, int what)
{
    j->what = what;
    atomic_store(&j->next, 0);
    atomic_store(&j->stored, 0);
    pthread_t t[256];
    double t0 = now();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, j);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return now() - t0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_limits FILE THREADS ELEM [LEVEL]\n");
        return 2;
    }
    int threads = atoi(argv[2]);
    unsigned elem = (unsigned)atoi(argv[3]);
    int level = argc > 4 ? atoi(argv[4]) : 1;
    if (threads < 1 || threads > 256)
        threads = 1;
    int fd = open(argv[1], O_RDONLY);
    off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    if (size <= 0) {
        perror(argv[1]);
        return 1;
    }
    job j = {0};
    j.bytes = (size_t)size;
    j.nchunks = (j.bytes + CHUNK - 1) / CHUNK;
    j.slot = ZSTD_compressBound(CHUNK);
    j.elem = elem;
    j.level = level;
    unsigned char *src = malloc(j.bytes);
    j.dst = malloc(j.nchunks * j.slot);
    j.meta = calloc(j.nchunks, sizeof *j.meta);
    j.back = malloc(j.bytes);
    if (!src || !j.dst || !j.meta || !j.back)
        return 1;
    memset(j.dst, 0, j.nchunks * j.slot); /* pre-fault */
    memset(j.back, 0, j.bytes);
    for (size_t got = 0; got < j.bytes;) {
        ssize_t r = pread(fd, src + got, j.bytes - got, (off_t)got);
        if (r <= 0)
            return 1;
        got += (size_t)r;
    }
    close(fd);
    j.src = src;
    const char *names[] = {"xxh3", "zstd", "codec", "decode", "memcpy"};
    double best[5];
    unsigned long long stored[5] = {0};
    for (int w = 0; w < 5; w++) {
        best[w] = 1e30;
        for (int rep = 0; rep < 2; rep++) { /* best of two: the machine is shared */
            double s = run(&j, threads, w);
            best[w] = s < best[w] ? s : best[w];
            stored[w] = atomic_load(&j.stored);
        }
    }
    printf("{\"bytes\": %zu, \"threads\": %d, \"elem\": %u, \"level\": %d", j.bytes, threads,
           elem, level);
    for (int w = 0; w < 5; w++)
        printf(", \"%s_s\": %.6f, \"%s_gbs\": %.4f", names[w], best[w], names[w],
               j.bytes / best[w] / 1e9);
    printf(", \"zstd_ratio\": %.5f, \"codec_ratio\": %.5f}\n", (double)stored[1] / j.bytes,
           (double)stored[2] / j.bytes);
    free(src);
    free(j.dst);
    free(j.back);
    free(j.meta);
    return 0;
}

/* adapt: compress or store raw, per chunk, from measured rates (adapt.h). */
#include "adapt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "util.h"

/* Write-back rounds cover at least this much: smaller ones would time the
 * disk's latency rather than its rate. */
#define WRITEBACK_MIN (8u << 20)
/* Weight of a new sample in the compression ratio's running average. */
#define ALPHA 0.3
/* Decoding a chunk costs about this share of compressing it (zstd -1
 * with the byte shuffle: 5.6 against 1.8 GB/s on two cores in benchmark
 * run W, a third; a quarter errs toward compressing). */
#define DECODE_SHARE 0.25
/* A rate is the fastest of its last RATE_WINDOW samples: sharing the
 * machine only ever makes a sample slower (a preempted pwrite looks like a
 * slow disk for one chunk), and one such sample must not flip choices. */
#define RATE_WINDOW 8

typedef struct rate {
    double s[RATE_WINDOW]; /* seconds per byte */
    unsigned n;            /* samples taken (ring position) */
} rate;

static void rate_add(rate *r, double sample)
{
    r->s[r->n++ % RATE_WINDOW] = sample;
}

/* Seconds per byte, or -1 before the first sample. */
static double rate_get(const rate *r)
{
    if (r->n == 0)
        return -1;
    unsigned k = r->n < RATE_WINDOW ? r->n : RATE_WINDOW;
    double m = r->s[0];
    for (unsigned i = 1; i < k; i++)
        m = r->s[i] < m ? r->s[i] : m;
    return m;
}

/* The disk's rate is bytes over seconds summed across its last rounds,
 * not the fastest round: a disk's write cache (or a throttle's allowance)
 * takes the first megabytes at once, and that burst is not its rate. */
#define FLOW_WINDOW 8

typedef struct flow {
    double bytes[FLOW_WINDOW], secs[FLOW_WINDOW];
    unsigned n;
} flow;

static void flow_add(flow *f, double bytes, double secs)
{
    f->bytes[f->n % FLOW_WINDOW] = bytes;
    f->secs[f->n % FLOW_WINDOW] = secs;
    f->n++;
}

/* Seconds per byte, or -1 before the first round. */
static double flow_get(const flow *f)
{
    double b = 0, t = 0;
    for (unsigned i = 0; i < FLOW_WINDOW && i < f->n; i++) {
        b += f->bytes[i];
        t += f->secs[i];
    }
    return b > 0 ? t / b : -1;
}

struct adapt {
    pthread_mutex_t lock; /* protects everything below */
    int workers;
    int compress_all;
    /* Rates, seconds per byte (< 0: not measured yet); they outlive a save. */
    rate zstd;            /* worker: shuffle + zstd + hashes, per raw byte */
    rate hash;            /* worker: hash only (raw chunk), per raw byte */
    rate write;           /* worker: pwrite (+ read-back), per stored byte */
    flow disk;            /* disk: write-back, per stored byte */
    double ratio;         /* stored / raw of compressed chunks (< 0: unknown) */
    /* The save in flight: projected-then-measured totals. */
    double work_s;        /* worker seconds */
    double stored;        /* stored bytes */
    int probes;           /* samples taken to measure zstd this save */
    double t_begin;       /* the save's first choice (0: none yet) */
    double written;       /* stored bytes written so far */
};

int adapt_create(adapt **out, int workers, int compress_all)
{
    adapt *a = calloc(1, sizeof *a);
    if (!a)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_init(&a->lock, NULL);
    a->workers = workers > 0 ? workers : 1;
    a->compress_all = compress_all;
    a->ratio = -1;
    *out = a;
    return CKPT_OK;
}

void adapt_free(adapt *a)
{
    if (!a)
        return;
    pthread_mutex_destroy(&a->lock);
    free(a);
}

void adapt_save_begin(adapt *a)
{
    pthread_mutex_lock(&a->lock);
    a->work_s = a->stored = 0;
    a->probes = 0;
    a->t_begin = 0;
    a->written = 0;
    pthread_mutex_unlock(&a->lock);
}

static double known(double secs)
{
    return secs > 0 ? secs : 0;
}

static double max2(double x, double y)
{
    return x > y ? x : y;
}

void adapt_choose(adapt *a, size_t n, adapt_ticket *t)
{
    pthread_mutex_lock(&a->lock);
    double W = a->workers, disk = known(flow_get(&a->disk));
    double wr = known(rate_get(&a->write)), z = rate_get(&a->zstd);
    double r = a->ratio >= 0 ? a->ratio : 1;
    double zw = n * (known(z) + r * wr), zs = r * n;                 /* compressed */
    double rw = n * (known(rate_get(&a->hash)) + wr), rs = (double)n; /* raw */
    int compress;
    if (a->compress_all || z < 0 || rate_get(&a->write) < 0) {
        /* Forced, or a rate never measured yet (the first chunks a store
         * saves): compress, as slow storage wants, and measure. */
        compress = 1;
    } else {
        double tz = max2((a->work_s + zw) / W, (a->stored + zs) * disk);
        double tr = max2((a->work_s + rw) / W, (a->stored + rs) * disk);
        /* Where compressing costs the workers time (writes cheaper than
         * zstd), it must also save the disk at least the time a restore
         * will spend decoding the chunk (DECODE_SHARE of zstd's): on two
         * cores the kernel's own writing competes for the CPU the model
         * counts as spare, and a disk that fast gains less than restores
         * lose.  And it pays only while the disk has other bytes to write
         * meanwhile: at a save's start, or with a disk that keeps up with
         * the workers, the disk would wait for this chunk (and at the
         * save's end nothing hides the wait), so those chunks go raw.  The
         * backlog assumes the disk busy since the first choice. */
        double now = util_now();
        if (a->t_begin == 0)
            a->t_begin = now;
        double backlog = a->written * disk - (now - a->t_begin);
        int worth = (1 - r) * disk >= DECODE_SHARE * known(z) && backlog >= n * z;
        compress = tz <= tr && (zw <= rw || worth);
    }
    *t = (adapt_ticket){compress, n, compress ? zw : rw, compress ? zs : rs};
    a->work_s += t->work_s;
    a->stored += t->stored;
    pthread_mutex_unlock(&a->lock);
}

static void average(double *avg, double sample)
{
    *avg = *avg < 0 ? sample : (1 - ALPHA) * *avg + ALPHA * sample;
}

int adapt_probe_wanted(adapt *a)
{
    pthread_mutex_lock(&a->lock);
    int wanted = !a->compress_all && a->probes < a->workers;
    a->probes += wanted;
    pthread_mutex_unlock(&a->lock);
    return wanted;
}

void adapt_record_probe(adapt *a, size_t n, size_t stored, double secs)
{
    if (n == 0)
        return;
    pthread_mutex_lock(&a->lock);
    rate_add(&a->zstd, secs / (double)n);
    average(&a->ratio, (double)stored / (double)n);
    a->work_s += secs;
    pthread_mutex_unlock(&a->lock);
}

void adapt_record(adapt *a, const adapt_ticket *t, size_t stored, double encode_s,
                  double write_s)
{
    pthread_mutex_lock(&a->lock);
    a->work_s += encode_s + write_s - t->work_s;
    a->stored += (double)stored - t->stored;
    a->written += (double)stored;
    if (t->n > 0) {
        if (t->compress) {
            rate_add(&a->zstd, encode_s / t->n);
            average(&a->ratio, (double)stored / t->n);
        } else {
            rate_add(&a->hash, encode_s / t->n);
        }
    }
    if (stored > 0)
        rate_add(&a->write, write_s / stored);
    pthread_mutex_unlock(&a->lock);
}

void adapt_record_disk(adapt *a, uint64_t bytes, double secs)
{
    if (bytes == 0 || secs <= 0)
        return;
    pthread_mutex_lock(&a->lock);
    flow_add(&a->disk, (double)bytes, secs);
    pthread_mutex_unlock(&a->lock);
}

static void describe_secs(char *buf, size_t n, const char *name, double v)
{
    size_t used = strlen(buf);
    if (used + 1 >= n)
        return;
    if (v < 0)
        snprintf(buf + used, n - used, "%s%s -", used ? ", " : "", name);
    else
        snprintf(buf + used, n - used, "%s%s %.3g", used ? ", " : "", name, v * 1e9);
}

void adapt_describe(adapt *a, char *buf, size_t n)
{
    if (!n)
        return;
    buf[0] = '\0';
    pthread_mutex_lock(&a->lock);
    describe_secs(buf, n, "zstd", rate_get(&a->zstd));
    describe_secs(buf, n, "hash", rate_get(&a->hash));
    describe_secs(buf, n, "write", rate_get(&a->write));
    describe_secs(buf, n, "disk", flow_get(&a->disk));
    size_t used = strlen(buf);
    if (used + 1 < n)
        snprintf(buf + used, n - used, " ns/B; ratio %.3f", a->ratio);
    pthread_mutex_unlock(&a->lock);
}

/* Wait on the group's condition for at most `ms` milliseconds; 1 when jobs
 * are still pending after it. */
static int jobs_pending(pool_group *g, long ms)
{
    pthread_mutex_lock(&g->lock);
    if (g->pending > 0 && ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts); /* the condition's default clock */
        ts.tv_nsec += ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->done, &g->lock, &ts);
    }
    int pending = g->pending > 0;
    pthread_mutex_unlock(&g->lock);
    return pending;
}

int adapt_drop_wanted(adapt_cache policy, uint64_t raw, uint64_t mem_free)
{
    if (policy != ADAPT_CACHE_AUTO)
        return policy == ADAPT_CACHE_DROP;
    return raw >= ADAPT_DROP_MIN || (mem_free > 0 && raw > mem_free / 2);
}

int adapt_wait_jobs(adapt *a, pool_group *g, shard_writer *w, int writeback, int drop)
{
    uint64_t flushed = 0, dropped = 0;
    while (writeback && jobs_pending(g, 5)) {
        uint64_t written = shard_writer_written(w);
        if (written - flushed < WRITEBACK_MIN)
            continue;
        /* Below `settled` every frame was written (and checked) before the
         * write-back starts, so it is clean once the write-back returns. */
        uint64_t settled = drop ? shard_writer_settled(w) : 0;
        uint64_t bytes;
        double secs;
        if (shard_writer_writeback(w, &bytes, &secs) != 0) {
            writeback = 0; /* not supported here: the final fsync does it all */
            break;
        }
        adapt_record_disk(a, bytes, secs);
        flushed = written;
        if (settled > dropped) {
            shard_writer_drop_cache(w, dropped, settled); /* a hint: errors ignored */
            dropped = settled;
        }
    }
    return pool_group_wait(g);
}

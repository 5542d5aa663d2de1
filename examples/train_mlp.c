/*
 * train_mlp -- a small, deterministic training loop that checkpoints with
 * libckpt and resumes after a crash.
 *
 * A two-layer MLP (ReLU, softmax cross-entropy) learns to classify points
 * labelled by a fixed random "teacher".  Every batch is drawn from a seeded
 * xoshiro256** generator whose state is part of the checkpoint, so a run
 * that is killed and resumed computes exactly the same floats as one that
 * never stopped: the final weights are bitwise identical.
 *
 * Every --every steps the loop calls ckpt_save_begin(), which returns as
 * soon as the tensors are copied; compression, hashing and the fsynced
 * commit run in the background while training goes on.  The save is
 * collected with ckpt_save_wait() once it is done, before the next save,
 * and at exit.  On start the loop calls ckpt_restore(CKPT_LATEST), which
 * restores the newest checkpoint that verifies and reports those it skipped.
 *
 * Without --dir nothing is checkpointed (a reference run).
 *
 * Single-threaded float32 arithmetic in a fixed order; build without
 * -ffast-math.
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

#define N_IN 64
#define N_OUT 10
#define BATCH 32

typedef struct options {
    const char *dir;     /* checkpoint root; NULL: no checkpoints */
    const char *out;     /* final state goes here; NULL: not written */
    const char *metrics; /* Prometheus metrics file; NULL: none */
    int64_t steps;
    int64_t every;
    int64_t log_every;
    long sleep_ms;
    int hidden;
    uint64_t seed;
    int keep;            /* keep_last; -1: library default */
    int threads;
    int fsync;
    float lr;
    float momentum;
} options;

/* Everything that must survive a restart, and nothing else. */
typedef struct model {
    int d, h, c;
    float *w1, *b1, *w2, *b2;     /* parameters */
    float *vw1, *vb1, *vw2, *vb2; /* momentum buffers */
    int64_t step;                 /* optimizer steps taken */
    uint64_t rng[4];              /* data generator state */
    int64_t shape_w1[2], shape_b1[1], shape_w2[2], shape_b2[1], shape_rng[1];
} model;

/* Scratch space and the fixed teacher: rebuilt identically on every start. */
typedef struct work {
    float *teacher;               /* N_OUT x N_IN */
    float *gw1, *gb1, *gw2, *gb2; /* gradients */
    float *x, *hpre, *hid, *logit, *dlogit, *dh;
} work;

/* ------------------------------------------------------------ generator */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static void xoshiro_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

/* Uniform in [-1, 1): 24 random bits, exact in float. */
static float uniform_pm1(uint64_t s[4])
{
    return (float)(xoshiro_next(s) >> 40) * 0x1.0p-23f - 1.0f;
}

/* ---------------------------------------------------------------- model */

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "train_mlp: out of memory\n");
        exit(1);
    }
    return p;
}

static void model_alloc(model *m, int hidden)
{
    m->d = N_IN;
    m->h = hidden;
    m->c = N_OUT;
    size_t n1 = (size_t)m->h * m->d, n2 = (size_t)m->c * m->h;
    m->w1 = falloc(n1);  m->vw1 = falloc(n1);
    m->b1 = falloc(m->h); m->vb1 = falloc(m->h);
    m->w2 = falloc(n2);  m->vw2 = falloc(n2);
    m->b2 = falloc(m->c); m->vb2 = falloc(m->c);
    m->shape_w1[0] = m->h; m->shape_w1[1] = m->d;
    m->shape_b1[0] = m->h;
    m->shape_w2[0] = m->c; m->shape_w2[1] = m->h;
    m->shape_b2[0] = m->c;
    m->shape_rng[0] = 4;
}

static void model_release(model *m)
{
    free(m->w1); free(m->vw1); free(m->b1); free(m->vb1);
    free(m->w2); free(m->vw2); free(m->b2); free(m->vb2);
}

/* Fresh start: uniform (Glorot) weights, zero biases and momentum. */
static void model_init(model *m, uint64_t seed)
{
    uint64_t s[4];
    xoshiro_seed(s, seed ^ 0x1717171717171717ULL);
    size_t n1 = (size_t)m->h * m->d, n2 = (size_t)m->c * m->h;
    float a1 = sqrtf(6.0f / (float)(m->d + m->h));
    float a2 = sqrtf(6.0f / (float)(m->h + m->c));
    for (size_t i = 0; i < n1; i++) m->w1[i] = a1 * uniform_pm1(s);
    for (size_t i = 0; i < n2; i++) m->w2[i] = a2 * uniform_pm1(s);
    memset(m->b1, 0, sizeof(float) * (size_t)m->h);
    memset(m->b2, 0, sizeof(float) * (size_t)m->c);
    memset(m->vw1, 0, sizeof(float) * n1);
    memset(m->vw2, 0, sizeof(float) * n2);
    memset(m->vb1, 0, sizeof(float) * (size_t)m->h);
    memset(m->vb2, 0, sizeof(float) * (size_t)m->c);
    m->step = 0;
    xoshiro_seed(m->rng, seed);
}

/* The tensors of a checkpoint, pointing at the live buffers.  A save reads
 * them, a restore writes them. */
enum { N_TENSORS = 10 };

static void set_tensor(ckpt_tensor *t, const char *name, void *data,
                       ckpt_dtype dtype, int ndim, const int64_t *shape)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (uint64_t)shape[i];
    t->name = name;
    t->data = data;
    t->bytes = n * ckpt_dtype_size(dtype);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape = shape;
    t->memory = CKPT_MEM_HOST;
}

static void model_tensors(model *m, ckpt_tensor t[N_TENSORS])
{
    set_tensor(&t[0], "step", &m->step, CKPT_I64, 0, NULL);
    set_tensor(&t[1], "rng", m->rng, CKPT_U64, 1, m->shape_rng);
    set_tensor(&t[2], "fc1.weight", m->w1, CKPT_F32, 2, m->shape_w1);
    set_tensor(&t[3], "fc1.bias", m->b1, CKPT_F32, 1, m->shape_b1);
    set_tensor(&t[4], "fc2.weight", m->w2, CKPT_F32, 2, m->shape_w2);
    set_tensor(&t[5], "fc2.bias", m->b2, CKPT_F32, 1, m->shape_b2);
    set_tensor(&t[6], "fc1.weight.momentum", m->vw1, CKPT_F32, 2, m->shape_w1);
    set_tensor(&t[7], "fc1.bias.momentum", m->vb1, CKPT_F32, 1, m->shape_b1);
    set_tensor(&t[8], "fc2.weight.momentum", m->vw2, CKPT_F32, 2, m->shape_w2);
    set_tensor(&t[9], "fc2.bias.momentum", m->vb2, CKPT_F32, 1, m->shape_b2);
}

static void work_init(work *w, const model *m, uint64_t seed)
{
    uint64_t s[4];
    xoshiro_seed(s, seed ^ 0x7e7e7e7e7e7e7e7eULL);
    w->teacher = falloc((size_t)N_OUT * N_IN);
    for (size_t i = 0; i < (size_t)N_OUT * N_IN; i++)
        w->teacher[i] = uniform_pm1(s);
    w->gw1 = falloc((size_t)m->h * m->d);
    w->gb1 = falloc((size_t)m->h);
    w->gw2 = falloc((size_t)m->c * m->h);
    w->gb2 = falloc((size_t)m->c);
    w->x = falloc((size_t)m->d);
    w->hpre = falloc((size_t)m->h);
    w->hid = falloc((size_t)m->h);
    w->logit = falloc((size_t)m->c);
    w->dlogit = falloc((size_t)m->c);
    w->dh = falloc((size_t)m->h);
}

static void work_release(work *w)
{
    free(w->teacher); free(w->gw1); free(w->gb1); free(w->gw2); free(w->gb2);
    free(w->x); free(w->hpre); free(w->hid); free(w->logit); free(w->dlogit);
    free(w->dh);
}

/* One SGD-with-momentum step on a fresh batch; returns the mean loss. */
static float train_step(model *m, work *w, float lr, float mu)
{
    const int d = m->d, h = m->h, c = m->c;
    size_t n1 = (size_t)h * d, n2 = (size_t)c * h;
    memset(w->gw1, 0, sizeof(float) * n1);
    memset(w->gb1, 0, sizeof(float) * (size_t)h);
    memset(w->gw2, 0, sizeof(float) * n2);
    memset(w->gb2, 0, sizeof(float) * (size_t)c);
    float loss = 0.0f;

    for (int b = 0; b < BATCH; b++) {
        for (int i = 0; i < d; i++)
            w->x[i] = uniform_pm1(m->rng);
        /* Label: the teacher's arg-max class. */
        int y = 0;
        float best = -INFINITY;
        for (int k = 0; k < c; k++) {
            float z = 0.0f;
            for (int i = 0; i < d; i++)
                z += w->teacher[(size_t)k * d + i] * w->x[i];
            if (z > best) {
                best = z;
                y = k;
            }
        }
        /* Forward. */
        for (int j = 0; j < h; j++) {
            float z = m->b1[j];
            const float *row = m->w1 + (size_t)j * d;
            for (int i = 0; i < d; i++)
                z += row[i] * w->x[i];
            w->hpre[j] = z;
            w->hid[j] = z > 0.0f ? z : 0.0f;
        }
        float mx = -INFINITY;
        for (int k = 0; k < c; k++) {
            float z = m->b2[k];
            const float *row = m->w2 + (size_t)k * h;
            for (int j = 0; j < h; j++)
                z += row[j] * w->hid[j];
            w->logit[k] = z;
            if (z > mx)
                mx = z;
        }
        float sum = 0.0f;
        for (int k = 0; k < c; k++) {
            w->dlogit[k] = expf(w->logit[k] - mx);
            sum += w->dlogit[k];
        }
        loss += logf(sum) - (w->logit[y] - mx);
        /* Backward: d loss / d logit = softmax - onehot, averaged. */
        for (int k = 0; k < c; k++) {
            float p = w->dlogit[k] / sum;
            w->dlogit[k] = (p - (k == y ? 1.0f : 0.0f)) / (float)BATCH;
        }
        for (int j = 0; j < h; j++)
            w->dh[j] = 0.0f;
        for (int k = 0; k < c; k++) {
            float g = w->dlogit[k];
            float *grow = w->gw2 + (size_t)k * h;
            const float *row = m->w2 + (size_t)k * h;
            for (int j = 0; j < h; j++) {
                grow[j] += g * w->hid[j];
                w->dh[j] += row[j] * g;
            }
            w->gb2[k] += g;
        }
        for (int j = 0; j < h; j++) {
            float g = w->hpre[j] > 0.0f ? w->dh[j] : 0.0f;
            float *grow = w->gw1 + (size_t)j * d;
            for (int i = 0; i < d; i++)
                grow[i] += g * w->x[i];
            w->gb1[j] += g;
        }
    }

    /* v = mu * v + g;  w -= lr * v */
    for (size_t i = 0; i < n1; i++) {
        m->vw1[i] = mu * m->vw1[i] + w->gw1[i];
        m->w1[i] -= lr * m->vw1[i];
    }
    for (int j = 0; j < h; j++) {
        m->vb1[j] = mu * m->vb1[j] + w->gb1[j];
        m->b1[j] -= lr * m->vb1[j];
    }
    for (size_t i = 0; i < n2; i++) {
        m->vw2[i] = mu * m->vw2[i] + w->gw2[i];
        m->w2[i] -= lr * m->vw2[i];
    }
    for (int k = 0; k < c; k++) {
        m->vb2[k] = mu * m->vb2[k] + w->gb2[k];
        m->b2[k] -= lr * m->vb2[k];
    }
    m->step++;
    return loss / (float)BATCH;
}

/* ---------------------------------------------------------- checkpoints */

typedef struct saver {
    ckpt_store *store;
    ckpt_save *pending;    /* save in flight, or NULL */
    int64_t pending_step;
    int64_t last_saved;    /* newest step begun, -1 if none */
    int committed;
    int failed;
    double stall_s;        /* total time spent in ckpt_save_begin */
} saver;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_error(const char *what, int rc)
{
    const char *msg = ckpt_error_last();
    fprintf(stderr, "train_mlp: %s: %s%s%s\n", what, ckpt_strerror(rc),
            *msg ? ": " : "", msg);
}

/* Collect the save in flight (waiting if needed) and report it. */
static void saver_finish(saver *sv)
{
    if (!sv->pending)
        return;
    int rc = ckpt_save_wait(sv->pending);
    if (rc == CKPT_OK) {
        ckpt_save_stats st;
        memset(&st, 0, sizeof st);
        ckpt_save_stats_get(sv->pending, &st);
        printf("checkpoint step %" PRId64 " committed: %.1f KiB -> %.1f KiB in "
               "%" PRIu64 " chunk(s), stall %.2f ms, persist %.1f ms\n",
               sv->pending_step, (double)st.raw_bytes / 1024.0,
               (double)st.stored_bytes / 1024.0, st.chunks, st.stall_s * 1e3,
               st.persist_s * 1e3);
        sv->committed++;
    } else {
        char what[64];
        snprintf(what, sizeof what, "checkpoint step %" PRId64 " failed",
                 sv->pending_step);
        print_error(what, rc);
        printf("checkpoint step %" PRId64 " FAILED: %s\n", sv->pending_step,
               ckpt_strerror(rc));
        sv->failed++;
    }
    ckpt_save_free(sv->pending);
    sv->pending = NULL;
}

/* Start an asynchronous save of the current state; returns once the
 * tensors have been copied, so training can go on at once. */
static void saver_begin(saver *sv, model *m, const options *o, float loss)
{
    saver_finish(sv); /* at most one in flight; collect the previous one */

    char meta[256];
    snprintf(meta, sizeof meta,
             "{\"lr\":%.9g,\"momentum\":%.9g,\"loss\":%.9g,\"hidden\":%d,"
             "\"seed\":%" PRIu64 ",\"batch\":%d}",
             (double)o->lr, (double)o->momentum, (double)loss, m->h, o->seed,
             BATCH);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.metadata_json = meta;

    ckpt_tensor t[N_TENSORS];
    model_tensors(m, t);
    double t0 = now_s();
    int rc = ckpt_save_begin(&sv->pending, sv->store, m->step, t, N_TENSORS, &so);
    double dt = now_s() - t0;
    sv->stall_s += dt;
    if (rc != CKPT_OK) {
        char what[64];
        snprintf(what, sizeof what, "checkpoint step %" PRId64 " not begun",
                 m->step);
        print_error(what, rc);
        printf("checkpoint step %" PRId64 " FAILED: %s\n", m->step,
               ckpt_strerror(rc));
        ckpt_save_free(sv->pending);
        sv->pending = NULL;
        sv->failed++;
        return;
    }
    sv->pending_step = m->step;
    sv->last_saved = m->step;
    printf("checkpoint step %" PRId64 " begun: snapshot took %.2f ms, "
           "persisting in the background\n", m->step, dt * 1e3);
}

static void print_report(const ckpt_report *rep)
{
    size_t n = rep ? ckpt_report_count(rep) : 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        if (!p)
            continue;
        printf("skipped checkpoint step %" PRId64 ": %s (%s)\n", p->step,
               p->message ? p->message : "", ckpt_strerror(p->status));
    }
}

/* Restore the newest checkpoint that verifies.  Returns 1 when resumed,
 * 0 for a fresh start, -1 on error. */
static int resume(ckpt_store *store, model *m, const options *o)
{
    ckpt_tensor t[N_TENSORS];
    model_tensors(m, t);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(store, CKPT_LATEST, t, N_TENSORS, NULL, &rep);
    print_report(rep);
    if (rc == CKPT_ENOCKPT) {
        /* The buffers are unspecified after a failed restore. */
        model_init(m, o->seed);
        printf("no valid checkpoint in %s: starting fresh\n", o->dir);
        ckpt_report_free(rep);
        return 0;
    }
    if (rc != CKPT_OK) {
        print_error("restore failed", rc);
        ckpt_report_free(rep);
        return -1;
    }
    int64_t restored = rep ? ckpt_report_step(rep) : m->step;
    ckpt_report_free(rep);
    if (restored != m->step) {
        fprintf(stderr, "train_mlp: checkpoint step-%012" PRId64 " holds "
                "step %" PRId64 "\n", restored, m->step);
        return -1;
    }
    printf("resumed from step %" PRId64 "\n", m->step);

    /* Show what was saved with it (read-only API; not needed to resume). */
    ckpt_checkpoint *ck = NULL;
    if (ckpt_checkpoint_open(&ck, store, restored, CKPT_VERIFY_QUICK) == CKPT_OK) {
        printf("checkpoint metadata: %s\n", ckpt_checkpoint_metadata(ck));
        ckpt_checkpoint_free(ck);
    }
    return 1;
}

/* ------------------------------------------------------------------ main */

/* The final state goes into a new file of ours (mkstemp: never a file or
 * link someone placed at that name in a shared directory), renamed over
 * `path` once written. */
static int write_state(const char *path, const model *m)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return -1;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp-XXXXXX", 12);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        fprintf(stderr, "train_mlp: %s: %s\n", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        free(tmp);
        return -1;
    }
    size_t n1 = (size_t)m->h * m->d, n2 = (size_t)m->c * m->h;
    int ok = fwrite(m->w1, sizeof(float), n1, f) == n1
          && fwrite(m->b1, sizeof(float), (size_t)m->h, f) == (size_t)m->h
          && fwrite(m->w2, sizeof(float), n2, f) == n2
          && fwrite(m->b2, sizeof(float), (size_t)m->c, f) == (size_t)m->c
          && fwrite(m->vw1, sizeof(float), n1, f) == n1
          && fwrite(m->vb1, sizeof(float), (size_t)m->h, f) == (size_t)m->h
          && fwrite(m->vw2, sizeof(float), n2, f) == n2
          && fwrite(m->vb2, sizeof(float), (size_t)m->c, f) == (size_t)m->c
          && fwrite(&m->step, sizeof m->step, 1, f) == 1
          && fwrite(m->rng, sizeof m->rng, 1, f) == 1;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "train_mlp: writing %s failed: %s\n", path,
                ok ? strerror(errno) : "short write");
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

static void usage(FILE *f)
{
    fputs("usage: train_mlp [--dir DIR] [--steps N] [--every K] [--out FILE]\n"
          "                 [--sleep-ms MS] [--log-every N] [--hidden H]\n"
          "                 [--seed S] [--lr LR] [--momentum MU] [--keep N]\n"
          "                 [--threads N] [--no-fsync] [--metrics FILE]\n"
          "\n"
          "Trains a small MLP deterministically.  With --dir it resumes from\n"
          "the newest checkpoint in DIR that verifies and saves one every K\n"
          "steps (asynchronously) and at the end; without --dir it saves\n"
          "nothing.  --out writes the final weights, momentum buffers, step\n"
          "and generator state as raw bytes (compare runs with cmp).\n"
          "--metrics FILE: the checkpoint root's Prometheus metrics, replaced\n"
          "atomically after each commit (node_exporter's textfile collector).\n"
          "SIGTERM or SIGUSR1: save now, exit 75.\n", f);
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

static int parse_f(const char *s, float *v)
{
    char *end;
    errno = 0;
    float x = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(x))
        return -1;
    *v = x;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--no-fsync")) {
            o->fsync = 0;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "train_mlp: %s: unknown option or missing value\n", a);
            return -1;
        }
        const char *v = argv[++i];
        int64_t n = 0;
        int bad = 0;
        if (!strcmp(a, "--dir"))
            o->dir = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--metrics"))
            o->metrics = v;
        else if (!strcmp(a, "--steps"))
            bad = parse_i64(v, 0, INT64_MAX / 2, &o->steps);
        else if (!strcmp(a, "--every"))
            bad = parse_i64(v, 1, INT64_MAX / 2, &o->every);
        else if (!strcmp(a, "--log-every"))
            bad = parse_i64(v, 1, INT64_MAX / 2, &o->log_every);
        else if (!strcmp(a, "--sleep-ms"))
            bad = parse_i64(v, 0, 60000, &n), o->sleep_ms = (long)n;
        else if (!strcmp(a, "--hidden"))
            bad = parse_i64(v, 1, 1 << 16, &n), o->hidden = (int)n;
        else if (!strcmp(a, "--seed"))
            bad = parse_i64(v, 0, INT64_MAX, &n), o->seed = (uint64_t)n;
        else if (!strcmp(a, "--keep"))
            bad = parse_i64(v, 0, INT_MAX, &n), o->keep = (int)n;
        else if (!strcmp(a, "--threads"))
            bad = parse_i64(v, 0, 1024, &n), o->threads = (int)n;
        else if (!strcmp(a, "--lr"))
            bad = parse_f(v, &o->lr);
        else if (!strcmp(a, "--momentum"))
            bad = parse_f(v, &o->momentum);
        else {
            fprintf(stderr, "train_mlp: unknown option %s\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "train_mlp: bad value for %s: %s\n", a, v);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    options o = {
        .dir = NULL, .out = NULL, .metrics = NULL, .steps = 1000, .every = 100, .log_every = 0,
        .sleep_ms = 0, .hidden = 256, .seed = 1, .keep = -1, .threads = 0,
        .fsync = 1, .lr = 0.05f, .momentum = 0.9f,
    };
    if (parse_args(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    if (o.log_every == 0)
        o.log_every = o.every;
    /* One line at a time, even into a pipe or file, so that a watcher sees
     * each checkpoint as it happens. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    model m;
    work w;
    memset(&m, 0, sizeof m);
    model_alloc(&m, o.hidden);
    model_init(&m, o.seed);
    work_init(&w, &m, o.seed);

    saver sv = { .store = NULL, .pending = NULL, .pending_step = -1,
                 .last_saved = -1, .committed = 0, .failed = 0, .stall_s = 0 };
    int status = 0;
    if (o.dir) {
        ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
        so.keep_last = o.keep;
        so.metrics_path = o.metrics;
        so.threads = o.threads;
        so.fsync = o.fsync;
        int rc = ckpt_store_open(&sv.store, o.dir, &so);
        if (rc != CKPT_OK) {
            print_error("cannot open checkpoint store", rc);
            status = 1;
            goto done;
        }
        int r = resume(sv.store, &m, &o);
        if (r < 0) {
            status = 1;
            goto done;
        }
        if (r > 0)
            sv.last_saved = m.step;
        rc = ckpt_preempt_watch(NULL, 0);
        if (rc != CKPT_OK)
            print_error("preemption signals not watched", rc);
    } else {
        printf("no --dir: reference run without checkpoints\n");
    }

    printf("training %" PRId64 " steps from step %" PRId64 " (libckpt %s, "
           "hidden %d, batch %d)\n", o.steps, m.step, ckpt_version_string(),
           m.h, BATCH);
    float loss = NAN;
    struct timespec nap = { o.sleep_ms / 1000, (o.sleep_ms % 1000) * 1000000L };
    while (m.step < o.steps) {
        loss = train_step(&m, &w, o.lr, o.momentum);
        if (m.step % o.log_every == 0 || m.step == o.steps)
            printf("step %" PRId64 "/%" PRId64 " loss %.6f\n", m.step, o.steps,
                   (double)loss);
        if (sv.store) {
            /* Report a save as soon as it is committed. */
            if (sv.pending && ckpt_save_done(sv.pending))
                saver_finish(&sv);
            if (m.step % o.every == 0)
                saver_begin(&sv, &m, &o, loss);
            int sig = ckpt_preempt_requested();
            if (sig) {
                printf("signal %d: saving step %" PRId64 " and exiting\n", sig,
                       m.step);
                if (sv.last_saved != m.step)
                    saver_begin(&sv, &m, &o, loss);
                saver_finish(&sv);
                status = sv.failed ? 1 : CKPT_EXIT_PREEMPTED;
                goto done;
            }
        }
        if (o.sleep_ms > 0)
            nanosleep(&nap, NULL);
    }
    if (sv.store) {
        /* The final state, unless the loop just saved it. */
        if (sv.last_saved != m.step)
            saver_begin(&sv, &m, &o, loss);
        saver_finish(&sv);
    }
    if (o.out && write_state(o.out, &m) != 0)
        status = 1;
    if (sv.failed)
        status = 1;
    char loss_text[32] = "n/a (no step run)";
    if (!isnan(loss))
        snprintf(loss_text, sizeof loss_text, "%.6f", (double)loss);
    printf("done: step %" PRId64 ", loss %s, %d checkpoint(s) committed, "
           "%d failed, %.2f ms total stall%s%s\n", m.step, loss_text,
           sv.committed, sv.failed, sv.stall_s * 1e3,
           o.out ? "; final state written to " : "", o.out ? o.out : "");

done:
    saver_finish(&sv);
    if (sv.store) {
        ckpt_preempt_unwatch();
        ckpt_store_free(sv.store);
    }
    work_release(&w);
    model_release(&m);
    return status;
}

/*
 * train_cuda -- a small CUDA training loop that checkpoints its device
 * buffers with libckpt's fence API and resumes after a crash.
 *
 * A two-layer MLP (ReLU, softmax cross-entropy) learns to classify points
 * labelled by a fixed random linear "teacher".  Batches come from a
 * counter-based hash of (seed, step), every kernel sums in a fixed order and
 * no kernel uses atomics, so a run that is killed and resumed computes the
 * same floats as one that never stopped: the final weights are bitwise
 * identical (examples/cuda/demo.sh checks that).
 *
 * How a step uses libckpt when a checkpoint is due:
 *
 *     ckpt_save_begin(..., stream)   the state after `step` steps; returns
 *                                    at once, the copy runs on libckpt's
 *                                    stream, ordered after our work
 *     forward + backward kernels     only read the weights: they overlap
 *                                    with the snapshot copy
 *     ckpt_save_fence(save, stream)  the GPU (not the CPU) waits for the
 *                                    snapshot copy ...
 *     optimizer kernels              ... before these overwrite the weights
 *
 * Compression, hashing, writing and the commit run on the CPU in the
 * background; the loop polls ckpt_save_done() to report each commit.  On
 * start it restores the newest checkpoint that verifies straight into the
 * device buffers (CKPT_MEM_DEVICE, H2D on our stream).
 *
 * Options (same as examples/train_mlp, so examples/demo.sh drives both):
 *   --steps N --every N --log-every N --dir DIR --out FILE --sleep-ms MS
 *   --seed N --keep N --threads N --no-fsync --mode host|device|stream
 * Exits 77 with "SKIP: no CUDA device" when there is no usable GPU.
 */
#include <cuda_runtime.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"

#define D_IN 64
#define HID 128
#define N_CLS 10
#define BATCH 256

#define CUDA_CHECK(call)                                                        \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "train_cuda: %s failed: %s (%s)\n", #call,         \
                    cudaGetErrorName(e_), cudaGetErrorString(e_));              \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

struct options {
    const char *dir = nullptr;
    const char *out = nullptr;
    int64_t steps = 600;
    int64_t every = 50;
    int64_t log_every = 0;
    long sleep_ms = 0;
    uint64_t seed = 1;
    int keep = -1;
    int threads = 0;
    int fsync = 1;
    ckpt_snapshot_mode mode = CKPT_SNAPSHOT_HOST;
    float lr = 0.05f;
    float momentum = 0.9f;
};

/* ------------------------------------------------------------------ model */

enum { W1, B1, W2, B2, MW1, MB1, MW2, MB2, N_PARAMS };
static const char *const k_names[N_PARAMS] = {
    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
    "opt.fc1.weight.momentum", "opt.fc1.bias.momentum",
    "opt.fc2.weight.momentum", "opt.fc2.bias.momentum",
};
static const int64_t k_shape[N_PARAMS][2] = {
    { HID, D_IN }, { HID, 0 }, { N_CLS, HID }, { N_CLS, 0 },
    { HID, D_IN }, { HID, 0 }, { N_CLS, HID }, { N_CLS, 0 },
};

static size_t numel(int i)
{
    return (size_t)k_shape[i][0] * (size_t)(k_shape[i][1] ? k_shape[i][1] : 1);
}

struct model {
    float *p[N_PARAMS]; /* device */
    int64_t step;       /* host */
};

struct work {
    float *x, *h, *dlog, *dh, *g[4], *loss;
    int *y;
};

/* ---------------------------------------------------------------- kernels */

__device__ __host__ static inline uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* uniform in [-1, 1) from a key */
__device__ static inline float unif(uint64_t key)
{
    return (float)(mix(key) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void k_init(float *w, size_t n, uint64_t key, float scale)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        w[i] = scale * unif(key ^ mix(i));
}

/* One thread per sample: features from (seed, step, b), label from the
 * teacher T[c][d] = unif(seed, c, d). */
__global__ void k_batch(float *x, int *y, uint64_t seed, int64_t step)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= BATCH)
        return;
    uint64_t base = mix(seed ^ mix((uint64_t)step * BATCH + (uint64_t)b));
    for (int d = 0; d < D_IN; d++)
        x[b * D_IN + d] = unif(base + (uint64_t)d);
    int best = 0;
    float best_v = -INFINITY;
    for (int c = 0; c < N_CLS; c++) {
        float v = 0.0f;
        for (int d = 0; d < D_IN; d++)
            v += unif(mix(seed + 7) ^ mix((uint64_t)(c * D_IN + d))) * x[b * D_IN + d];
        if (v > best_v) {
            best_v = v;
            best = c;
        }
    }
    y[b] = best;
}

/* h[b][j] = relu(sum_d W1[j][d] x[b][d] + b1[j]) */
__global__ void k_fc1(const float *w1, const float *b1, const float *x, float *h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BATCH * HID)
        return;
    int b = i / HID, j = i % HID;
    float v = b1[j];
    for (int d = 0; d < D_IN; d++)
        v += w1[j * D_IN + d] * x[b * D_IN + d];
    h[i] = v > 0.0f ? v : 0.0f;
}

/* One thread per sample: logits, softmax, loss, dlogits = (p - onehot)/B. */
__global__ void k_fc2_softmax(const float *w2, const float *b2, const float *h,
                              const int *y, float *dlog, float *loss)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= BATCH)
        return;
    float z[N_CLS], m = -INFINITY, s = 0.0f;
    for (int c = 0; c < N_CLS; c++) {
        float v = b2[c];
        for (int j = 0; j < HID; j++)
            v += w2[c * HID + j] * h[b * HID + j];
        z[c] = v;
        m = fmaxf(m, v);
    }
    for (int c = 0; c < N_CLS; c++) {
        z[c] = expf(z[c] - m);
        s += z[c];
    }
    for (int c = 0; c < N_CLS; c++)
        dlog[b * N_CLS + c] = (z[c] / s - (c == y[b] ? 1.0f : 0.0f)) / BATCH;
    loss[1 + b] = -logf(z[y[b]] / s);
}

/* Serial sum: a fixed order, so the logged loss is reproducible too. */
__global__ void k_loss(float *loss)
{
    float s = 0.0f;
    for (int b = 0; b < BATCH; b++)
        s += loss[1 + b];
    loss[0] = s / BATCH;
}

/* gW2[c][j] = sum_b dlog[b][c] h[b][j];  gb2[c] = sum_b dlog[b][c] */
__global__ void k_grad2(const float *dlog, const float *h, float *gw2, float *gb2)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N_CLS * HID)
        return;
    int c = i / HID, j = i % HID;
    float v = 0.0f;
    for (int b = 0; b < BATCH; b++)
        v += dlog[b * N_CLS + c] * h[b * HID + j];
    gw2[i] = v;
    if (j == 0) {
        float g = 0.0f;
        for (int b = 0; b < BATCH; b++)
            g += dlog[b * N_CLS + c];
        gb2[c] = g;
    }
}

/* dh[b][j] = relu'(h) * sum_c dlog[b][c] W2[c][j] */
__global__ void k_dh(const float *dlog, const float *w2, const float *h, float *dh)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BATCH * HID)
        return;
    int b = i / HID, j = i % HID;
    float v = 0.0f;
    for (int c = 0; c < N_CLS; c++)
        v += dlog[b * N_CLS + c] * w2[c * HID + j];
    dh[i] = h[i] > 0.0f ? v : 0.0f;
}

/* gW1[j][d] = sum_b dh[b][j] x[b][d];  gb1[j] = sum_b dh[b][j] */
__global__ void k_grad1(const float *dh, const float *x, float *gw1, float *gb1)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= HID * D_IN)
        return;
    int j = i / D_IN, d = i % D_IN;
    float v = 0.0f;
    for (int b = 0; b < BATCH; b++)
        v += dh[b * HID + j] * x[b * D_IN + d];
    gw1[i] = v;
    if (d == 0) {
        float g = 0.0f;
        for (int b = 0; b < BATCH; b++)
            g += dh[b * HID + j];
        gb1[j] = g;
    }
}

/* SGD with momentum: m = mu m + g; p -= lr m.  The only writer of state. */
__global__ void k_sgd(float *p, float *m, const float *g, size_t n, float lr, float mu)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = mu * m[i] + g[i];
        m[i] = v;
        p[i] -= lr * v;
    }
}

static unsigned blocks(size_t n)
{
    return (unsigned)((n + 255) / 256);
}

/* ------------------------------------------------------------ train step */

static void model_init(model *m, cudaStream_t s, uint64_t seed)
{
    for (int i = 0; i < N_PARAMS; i++) {
        size_t n = numel(i);
        if (i < MW1) {
            float scale = i == W1 ? 1.0f / sqrtf((float)D_IN)
                        : i == W2 ? 1.0f / sqrtf((float)HID) : 0.0f;
            k_init<<<blocks(n), 256, 0, s>>>(m->p[i], n, mix(seed * 31 + (uint64_t)i), scale);
        } else {
            CUDA_CHECK(cudaMemsetAsync(m->p[i], 0, n * sizeof(float), s));
        }
    }
    CUDA_CHECK(cudaGetLastError());
    m->step = 0;
}

/* Forward and backward: reads the weights, writes only scratch. */
static void forward_backward(model *m, work *w, cudaStream_t s, uint64_t seed)
{
    k_batch<<<blocks(BATCH), 256, 0, s>>>(w->x, w->y, seed, m->step);
    k_fc1<<<blocks(BATCH * HID), 256, 0, s>>>(m->p[W1], m->p[B1], w->x, w->h);
    k_fc2_softmax<<<blocks(BATCH), 256, 0, s>>>(m->p[W2], m->p[B2], w->h, w->y, w->dlog,
                                                w->loss);
    k_loss<<<1, 1, 0, s>>>(w->loss);
    k_grad2<<<blocks(N_CLS * HID), 256, 0, s>>>(w->dlog, w->h, w->g[2], w->g[3]);
    k_dh<<<blocks(BATCH * HID), 256, 0, s>>>(w->dlog, m->p[W2], w->h, w->dh);
    k_grad1<<<blocks(HID * D_IN), 256, 0, s>>>(w->dh, w->x, w->g[0], w->g[1]);
    CUDA_CHECK(cudaGetLastError());
}

static void optimizer(model *m, work *w, cudaStream_t s, const options *o)
{
    for (int i = 0; i < 4; i++)
        k_sgd<<<blocks(numel(i)), 256, 0, s>>>(m->p[i], m->p[MW1 + i], w->g[i], numel(i),
                                               o->lr, o->momentum);
    CUDA_CHECK(cudaGetLastError());
    m->step++;
}

/* ------------------------------------------------------------ checkpoints */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_error(const char *what, int rc)
{
    const char *msg = ckpt_error_last();
    fprintf(stderr, "train_cuda: %s: %s%s%s\n", what, ckpt_strerror(rc), *msg ? ": " : "",
            msg);
}

static void model_tensors(model *m, ckpt_tensor *t)
{
    for (int i = 0; i < N_PARAMS; i++)
        t[i] = ckpt_tensor{ k_names[i], m->p[i], numel(i) * sizeof(float), CKPT_F32,
                            k_shape[i][1] ? 2 : 1, k_shape[i], CKPT_MEM_DEVICE };
    t[N_PARAMS] = ckpt_tensor{ "step", &m->step, sizeof m->step, CKPT_I64, 0, nullptr,
                               CKPT_MEM_HOST };
}

struct saver {
    ckpt_store *store = nullptr;
    ckpt_save *pending = nullptr;
    int64_t pending_step = -1;
    int64_t last_saved = -1;
    int committed = 0, failed = 0;
    double stall_s = 0;
};

static void saver_finish(saver *sv)
{
    if (!sv->pending)
        return;
    int rc = ckpt_save_wait(sv->pending);
    if (rc == CKPT_OK) {
        ckpt_save_stats st;
        memset(&st, 0, sizeof st);
        ckpt_save_stats_get(sv->pending, &st);
        printf("checkpoint step %" PRId64 " committed: %.1f KiB -> %.1f KiB in %" PRIu64
               " chunk(s), stall %.2f ms, persist %.1f ms\n", sv->pending_step,
               (double)st.raw_bytes / 1024.0, (double)st.stored_bytes / 1024.0, st.chunks,
               st.stall_s * 1e3, st.persist_s * 1e3);
        sv->committed++;
    } else {
        char what[64];
        snprintf(what, sizeof what, "checkpoint step %" PRId64 " failed", sv->pending_step);
        print_error(what, rc);
        printf("checkpoint step %" PRId64 " FAILED: %s\n", sv->pending_step,
               ckpt_strerror(rc));
        sv->failed++;
    }
    ckpt_save_free(sv->pending);
    sv->pending = nullptr;
}

/* Begin saving the state after m->step steps.  The copy is ordered after
 * everything already on `s`; the caller fences `s` before it next writes
 * the weights. */
static int saver_begin(saver *sv, model *m, cudaStream_t s)
{
    saver_finish(sv);
    ckpt_tensor t[N_PARAMS + 1];
    model_tensors(m, t);
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.cuda_stream = s;
    char meta[128];
    snprintf(meta, sizeof meta, "{\"example\":\"train_cuda\",\"batch\":%d,\"hidden\":%d}",
             BATCH, HID);
    so.metadata_json = meta;
    double t0 = now_s();
    int rc = ckpt_save_begin(&sv->pending, sv->store, m->step, t, N_PARAMS + 1, &so);
    double dt = now_s() - t0;
    sv->stall_s += dt;
    if (rc != CKPT_OK) {
        char what[64];
        snprintf(what, sizeof what, "checkpoint step %" PRId64 " not begun", m->step);
        print_error(what, rc);
        printf("checkpoint step %" PRId64 " FAILED: %s\n", m->step, ckpt_strerror(rc));
        ckpt_save_free(sv->pending);
        sv->pending = nullptr;
        sv->failed++;
        return 0;
    }
    sv->pending_step = m->step;
    sv->last_saved = m->step;
    printf("checkpoint step %" PRId64 " begun: %.2f ms on the CPU, the copy runs on "
           "the GPU\n", m->step, dt * 1e3);
    return 1;
}

static int resume(ckpt_store *store, model *m, cudaStream_t s, const options *o)
{
    ckpt_tensor t[N_PARAMS + 1];
    model_tensors(m, t);
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    ro.cuda_stream = s;
    ckpt_report *rep = nullptr;
    int rc = ckpt_restore(store, CKPT_LATEST, t, N_PARAMS + 1, &ro, &rep);
    for (size_t i = 0; rep && i < ckpt_report_count(rep); i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        printf("skipped checkpoint step %" PRId64 ": %s (%s)\n", p->step, p->message,
               ckpt_strerror(p->status));
    }
    int64_t restored = rep ? ckpt_report_step(rep) : -1;
    ckpt_report_free(rep);
    if (rc == CKPT_ENOCKPT) {
        model_init(m, s, o->seed);
        printf("no valid checkpoint in %s: starting fresh\n", o->dir);
        return 0;
    }
    if (rc != CKPT_OK) {
        print_error("restore failed", rc);
        return -1;
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    if (restored != m->step) {
        fprintf(stderr, "train_cuda: checkpoint step %" PRId64 " holds step %" PRId64 "\n",
                restored, m->step);
        return -1;
    }
    printf("resumed from step %" PRId64 "\n", m->step);
    return 1;
}

static int write_state(const char *path, model *m)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "train_cuda: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < N_PARAMS && ok; i++) {
        size_t n = numel(i);
        float *h = (float *)malloc(n * sizeof(float));
        CUDA_CHECK(cudaMemcpy(h, m->p[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        ok = fwrite(h, sizeof(float), n, f) == n;
        free(h);
    }
    ok = ok && fwrite(&m->step, sizeof m->step, 1, f) == 1;
    if (fclose(f) != 0 || !ok) {
        fprintf(stderr, "train_cuda: writing %s failed\n", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ main */

static int parse(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-fsync")) {
            o->fsync = 0;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: train_cuda [--steps N] [--every N] [--log-every N] [--dir DIR]\n"
                   "                  [--out FILE] [--sleep-ms MS] [--seed N] [--keep N]\n"
                   "                  [--threads N] [--no-fsync] [--mode host|device|stream]\n");
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "train_cuda: %s: unknown option or missing value\n", a);
            return -1;
        }
        const char *v = argv[++i];
        char *end = nullptr;
        long long n = strtoll(v, &end, 10);
        int num_ok = *v && end && !*end;
        if (!strcmp(a, "--dir")) o->dir = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "host")) o->mode = CKPT_SNAPSHOT_HOST;
            else if (!strcmp(v, "device")) o->mode = CKPT_SNAPSHOT_DEVICE;
            else if (!strcmp(v, "stream")) o->mode = CKPT_SNAPSHOT_STREAM;
            else num_ok = 0, n = -1;
            if (n == -1) {
                fprintf(stderr, "train_cuda: bad --mode %s\n", v);
                return -1;
            }
        } else if (!num_ok || n < 0) {
            fprintf(stderr, "train_cuda: bad value for %s: %s\n", a, v);
            return -1;
        } else if (!strcmp(a, "--steps")) o->steps = n;
        else if (!strcmp(a, "--every")) o->every = n;
        else if (!strcmp(a, "--log-every")) o->log_every = n;
        else if (!strcmp(a, "--sleep-ms")) o->sleep_ms = (long)n;
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)n;
        else if (!strcmp(a, "--keep")) o->keep = (int)n;
        else if (!strcmp(a, "--threads")) o->threads = (int)n;
        else {
            fprintf(stderr, "train_cuda: unknown option %s\n", a);
            return -1;
        }
    }
    if (o->every <= 0)
        o->every = 1;
    if (o->log_every <= 0)
        o->log_every = o->every;
    return 0;
}

int main(int argc, char **argv)
{
    options o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    setvbuf(stdout, nullptr, _IOLBF, 0);

    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        return 77;
    }
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    model m;
    work w;
    for (int i = 0; i < N_PARAMS; i++)
        CUDA_CHECK(cudaMalloc(&m.p[i], numel(i) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&w.x, BATCH * D_IN * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&w.h, BATCH * HID * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&w.dh, BATCH * HID * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&w.dlog, BATCH * N_CLS * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&w.loss, (BATCH + 1) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&w.y, BATCH * sizeof(int)));
    for (int i = 0; i < 4; i++)
        CUDA_CHECK(cudaMalloc(&w.g[i], numel(i) * sizeof(float)));
    model_init(&m, s, o.seed);

    saver sv;
    int status = 0;
    if (o.dir) {
        ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
        so.keep_last = o.keep;
        so.threads = o.threads;
        so.fsync = o.fsync;
        so.snapshot_mode = o.mode;
        int rc = ckpt_store_open(&sv.store, o.dir, &so);
        if (rc != CKPT_OK) {
            print_error("cannot open checkpoint store", rc);
            return 1;
        }
        int r = resume(sv.store, &m, s, &o);
        if (r < 0) {
            ckpt_store_free(sv.store);
            return 1;
        }
        if (r > 0)
            sv.last_saved = m.step;
        if ((rc = ckpt_preempt_watch(nullptr, 0)) != CKPT_OK)
            print_error("preemption signals not watched", rc);
    } else {
        printf("no --dir: reference run without checkpoints\n");
    }
    int dev = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    printf("training %" PRId64 " steps from step %" PRId64 " on %s (libckpt %s, hidden %d, "
           "batch %d)\n", o.steps, m.step, prop.name, ckpt_version_string(), HID, BATCH);

    float loss = NAN;
    struct timespec nap = { o.sleep_ms / 1000, (o.sleep_ms % 1000) * 1000000L };
    while (m.step < o.steps) {
        ckpt_save *fresh = nullptr;
        if (sv.store && m.step % o.every == 0 && m.step != sv.last_saved &&
            saver_begin(&sv, &m, s))
            fresh = sv.pending;
        forward_backward(&m, &w, s, o.seed);
        if (fresh) {
            /* The optimizer below overwrites the weights: the GPU waits
             * here for the snapshot copy; the CPU does not. */
            int rc = ckpt_save_fence(fresh, s);
            if (rc != CKPT_OK) {
                print_error("fence", rc);
                CUDA_CHECK(cudaStreamSynchronize(s));
                ckpt_save_wait_snapshot(fresh);
            }
        }
        optimizer(&m, &w, s, &o);
        if (m.step % o.log_every == 0 || m.step == o.steps) {
            CUDA_CHECK(cudaMemcpyAsync(&loss, w.loss, sizeof loss, cudaMemcpyDeviceToHost, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            printf("step %" PRId64 "/%" PRId64 " loss %.6f\n", m.step, o.steps, (double)loss);
        }
        if (sv.store) {
            if (sv.pending && ckpt_save_done(sv.pending))
                saver_finish(&sv);
            int sig = ckpt_preempt_requested();
            if (sig) {
                printf("signal %d: saving step %" PRId64 " and exiting\n", sig, m.step);
                if (sv.last_saved != m.step)
                    saver_begin(&sv, &m, s);
                saver_finish(&sv);
                status = sv.failed ? 1 : CKPT_EXIT_PREEMPTED;
                goto done;
            }
        }
        if (o.sleep_ms > 0)
            nanosleep(&nap, nullptr);
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    if (sv.store) {
        if (sv.last_saved != m.step)
            saver_begin(&sv, &m, s);
        saver_finish(&sv);
    }
    if (o.out && write_state(o.out, &m) != 0)
        status = 1;
    if (sv.failed)
        status = 1;
    printf("done: step %" PRId64 ", loss %.6f, %d checkpoint(s) committed, %d failed, "
           "%.2f ms total CPU stall%s%s\n", m.step, (double)loss, sv.committed, sv.failed,
           sv.stall_s * 1e3, o.out ? "; final state written to " : "", o.out ? o.out : "");
done:
    saver_finish(&sv);
    if (sv.store) {
        ckpt_preempt_unwatch();
        ckpt_store_free(sv.store);
    }
    for (int i = 0; i < N_PARAMS; i++)
        cudaFree(m.p[i]);
    cudaFree(w.x);
    cudaFree(w.h);
    cudaFree(w.dh);
    cudaFree(w.dlog);
    cudaFree(w.loss);
    cudaFree(w.y);
    for (int i = 0; i < 4; i++)
        cudaFree(w.g[i]);
    cudaStreamDestroy(s);
    return status;
}

/* toy_train: a training loop in miniature for the resume tests.
 *
 *   toy_train DIR --steps N [--save-every K] [--sleep-ms M]
 *             [--crash-once FILE --crash-at S] [--out FILE]
 *
 * Resumes from the newest valid checkpoint in DIR (or starts fresh), runs
 * to step N, saving every K steps.  On SIGTERM or SIGUSR1 it saves the
 * current step, waits for the commit and exits CKPT_EXIT_PREEMPTED (75).
 * With --crash-at S it aborts after step S; with --crash-once FILE too, only
 * when FILE does not exist (it creates FILE first, so a restart goes through).  --out writes the final
 * state, whose bytes must not depend on how often the run was interrupted.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

#define NW 256

typedef struct state {
    float w[NW];
    int64_t step;
    uint64_t rng;
} state;

static void tensors(state *s, ckpt_tensor t[3])
{
    static const int64_t wshape[1] = {NW};
    t[0] = (ckpt_tensor){"model/w", s->w, sizeof s->w, CKPT_F32, 1, wshape, CKPT_MEM_HOST};
    t[1] = (ckpt_tensor){"step", &s->step, sizeof s->step, CKPT_I64, 0, NULL, CKPT_MEM_HOST};
    t[2] = (ckpt_tensor){"rng", &s->rng, sizeof s->rng, CKPT_U64, 0, NULL, CKPT_MEM_HOST};
}

/* One deterministic "optimizer step". */
static void train_step(state *s)
{
    for (int i = 0; i < NW; i++) {
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        float g = (float)(s->rng % 2001) / 1000.0f - 1.0f;
        s->w[i] = s->w[i] * 0.999f - 0.01f * g + 1e-4f * (float)sin((double)(s->step + i));
    }
    s->step++;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0) {
    }
}

static int save(ckpt_store *store, state *s, ckpt_save **prev)
{
    ckpt_tensor t[3];
    tensors(s, t);
    /* The previous save must be collected: its status matters too. */
    if (*prev) {
        int st = ckpt_save_wait(*prev);
        ckpt_save_free(*prev);
        *prev = NULL;
        if (st) {
            fprintf(stderr, "toy_train: save failed: %s\n", ckpt_error_last());
            return st;
        }
    }
    int st = ckpt_save_begin(prev, store, s->step, t, 3, NULL);
    if (st)
        fprintf(stderr, "toy_train: save_begin: %s\n", ckpt_error_last());
    return st;
}

static int finish(ckpt_save **prev)
{
    int st = 0;
    if (*prev) {
        st = ckpt_save_wait(*prev);
        if (st)
            fprintf(stderr, "toy_train: save failed: %s\n", ckpt_error_last());
        ckpt_save_free(*prev);
        *prev = NULL;
    }
    return st;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *crash_file = NULL;
    int64_t steps = 100, every = 10, crash_at = -1;
    long sleep = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--save-every") == 0 && i + 1 < argc)
            every = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--sleep-ms") == 0 && i + 1 < argc)
            sleep = strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--crash-at") == 0 && i + 1 < argc)
            crash_at = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--crash-once") == 0 && i + 1 < argc)
            crash_file = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else {
            fprintf(stderr, "toy_train: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!dir || every < 1)
        return 2;

    if (ckpt_preempt_watch(NULL, 0) != CKPT_OK) {
        fprintf(stderr, "toy_train: %s\n", ckpt_error_last());
        return 3;
    }
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    so.fsync = 0;
    so.threads = 2;
    ckpt_store *store = NULL;
    if (ckpt_store_open(&store, dir, &so) != CKPT_OK) {
        fprintf(stderr, "toy_train: open %s: %s\n", dir, ckpt_error_last());
        return 3;
    }

    printf("pid %ld\n", (long)getpid());
    state s;
    ckpt_tensor t[3];
    memset(&s, 0, sizeof s);
    tensors(&s, t);
    int st = ckpt_restore(store, CKPT_LATEST, t, 3, NULL, NULL);
    if (st == CKPT_OK) {
        printf("resumed at step %" PRId64 "\n", s.step);
    } else if (st == CKPT_ENOCKPT) {
        memset(&s, 0, sizeof s);
        s.rng = 0x853c49e6748fea9bull;
        for (int i = 0; i < NW; i++)
            s.w[i] = (float)i / NW;
        printf("fresh start\n");
    } else {
        fprintf(stderr, "toy_train: restore: %s\n", ckpt_error_last());
        ckpt_store_free(store);
        return 3;
    }
    fflush(stdout);

    ckpt_save *prev = NULL;
    while (s.step < steps) {
        train_step(&s);
        if (s.step % every == 0 && save(store, &s, &prev) != CKPT_OK)
            goto fail;
        printf("step %" PRId64 "\n", s.step);
        fflush(stdout);
        if (crash_at == s.step) {
            FILE *f = crash_file ? fopen(crash_file, "r") : NULL;
            if (!f) {
                f = crash_file ? fopen(crash_file, "w") : NULL;
                if (f)
                    fclose(f);
                fprintf(stderr, "toy_train: crashing at step %" PRId64 "\n", s.step);
                abort();
            }
            fclose(f);
        }
        int sig = ckpt_preempt_requested();
        if (sig) {
            if ((s.step % every != 0 && save(store, &s, &prev) != CKPT_OK) ||
                finish(&prev) != CKPT_OK)
                goto fail;
            printf("preempted by signal %d at step %" PRId64 "\n", sig, s.step);
            fflush(stdout);
            ckpt_store_free(store);
            return CKPT_EXIT_PREEMPTED;
        }
        sleep_ms(sleep);
    }
    if ((s.step % every != 0 && save(store, &s, &prev) != CKPT_OK) || finish(&prev) != CKPT_OK)
        goto fail;
    if (out) {
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(&s, sizeof s, 1, f) != 1 || fclose(f) != 0) {
            perror(out);
            goto fail;
        }
    }
    printf("done at step %" PRId64 "\n", s.step);
    ckpt_store_free(store);
    return 0;
fail:
    finish(&prev);
    ckpt_store_free(store);
    return 3;
}

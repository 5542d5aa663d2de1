/* Steps whose index is sound but whose chunk bytes are not: gc must keep
 * the newest step that fully verifies, and ckpt_load(CKPT_LATEST) must load
 * from it, not from the damaged newer one. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "helpers.h"

#define N 20000
static char root[64];
static float data[5][N];

static void flip_frame_byte(int64_t step)
{
    char path[256];
    snprintf(path, sizeof path, "%s/step-%012lld/rank-00000.shard", root, (long long)step);
    tc_flip_byte(path, 200); /* inside the first frame */
}

static ckpt_store *setup_steps(void)
{
    strcpy(root, "/tmp/ckpt-latest-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    ckpt_store *s;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    o.keep_last = 0;
    cr_assert_eq(ckpt_store_open(&s, root, &o), CKPT_OK);
    int64_t shape[1] = {N};
    for (int k = 1; k <= 4; k++) {
        for (int i = 0; i < N; i++)
            data[k][i] = (float)(k * 100000 + i);
        ckpt_tensor t = {"w", data[k], sizeof data[k], CKPT_F32, 1, shape, CKPT_MEM_HOST};
        cr_assert_eq(ckpt_save_sync(s, k, &t, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    }
    flip_frame_byte(4);
    cr_assert_eq(ckpt_verify(s, 4, CKPT_VERIFY_QUICK, NULL), CKPT_OK, "index still sound");
    cr_assert_eq(ckpt_verify(s, 4, CKPT_VERIFY_FULL, NULL), CKPT_ECORRUPT);
    return s;
}

static void cleanup(ckpt_store *s)
{
    ckpt_store_free(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_assert_eq(system(cmd), 0);
}

Test(latest_full, gc_keeps_the_newest_fully_valid_step)
{
    ckpt_store *s = setup_steps();
    ckpt_report *r;
    cr_assert_eq(ckpt_store_gc(s, 1, 0, &r), CKPT_OK, "%s", ckpt_error_last());
    ckpt_report_free(r);
    int64_t *steps;
    size_t n;
    cr_assert_eq(ckpt_store_steps(s, &steps, &n), CKPT_OK);
    cr_assert_eq(n, 2, "kept %zu steps", n);
    cr_assert_eq(steps[0], 3, "the newest fully valid step must survive gc");
    cr_assert_eq(steps[1], 4);
    ckpt_free(steps);
    static float out[N];
    int64_t shape[1] = {N};
    ckpt_tensor t = {"w", out, sizeof out, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    ckpt_report *rr;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &t, 1, NULL, &rr), CKPT_OK);
    cr_assert_eq(ckpt_report_step(rr), 3);
    ckpt_report_free(rr);
    cr_assert_arr_eq(out, data[3], sizeof out);
    cleanup(s);
}

Test(latest_full, load_latest_skips_a_step_with_bad_chunks)
{
    ckpt_store *s = setup_steps();
    void *buf;
    uint64_t bytes;
    cr_assert_eq(ckpt_load(s, CKPT_LATEST, "w", &buf, &bytes, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(bytes, sizeof data[3]);
    cr_assert_arr_eq(buf, data[3], sizeof data[3]);
    ckpt_free(buf);
    int64_t latest;
    cr_assert_eq(ckpt_store_latest(s, CKPT_VERIFY_FULL, &latest), CKPT_OK);
    cr_assert_eq(latest, 3);
    cr_assert_eq(ckpt_load(s, 4, "w", &buf, &bytes, NULL), CKPT_ECORRUPT);
    cleanup(s);
}

/* Step 5 holds "w" at half the size.  A restore of CKPT_LATEST into the
 * full-size buffer: while step 5 is sound, the mismatch is the caller's
 * error (no older step is tried); once its chunks are damaged, no restore
 * could use it, so it is skipped for its damage like any other and step 3
 * (4 is damaged too) restored.  A buffer that fits no step fails at once. */
Test(latest_full, a_damaged_newest_step_of_other_shapes_is_skipped_not_a_mismatch)
{
    ckpt_store *s = setup_steps();
    int64_t half[1] = {N / 2};
    for (int i = 0; i < N / 2; i++) /* not all zeros: a frame of some size */
        data[0][i] = (float)(i % 1009) * 0.37f;
    ckpt_tensor small = {"w", data[0], sizeof data[0] / 2, CKPT_F32, 1, half, CKPT_MEM_HOST};
    cr_assert_eq(ckpt_save_sync(s, 5, &small, 1, NULL), CKPT_OK, "%s", ckpt_error_last());
    static float out[N];
    int64_t shape[1] = {N};
    ckpt_tensor t = {"w", out, sizeof out, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &t, 1, NULL, &r), CKPT_EMISMATCH);
    cr_assert(strstr(ckpt_error_last(), "holds shape [10000]"), "%s", ckpt_error_last());
    ckpt_report_free(r);
    flip_frame_byte(5);
    r = NULL;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &t, 1, NULL, &r), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_report_step(r), 3);
    cr_assert_eq(ckpt_report_count(r), 2, "steps 5 and 4 skipped");
    const ckpt_problem *p = ckpt_report_get(r, 0);
    cr_assert_eq(p->step, 5);
    cr_assert_eq(p->status, CKPT_ECORRUPT, "step 5 skipped for its damage: %s", p->message);
    ckpt_report_free(r);
    cr_assert_arr_eq(out, data[3], sizeof out);
    /* twice the size: no step fits, the caller's error */
    static float big[2 * N];
    int64_t twice[1] = {2 * N};
    ckpt_tensor b = {"w", big, sizeof big, CKPT_F32, 1, twice, CKPT_MEM_HOST};
    r = NULL;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &b, 1, NULL, &r), CKPT_EMISMATCH);
    ckpt_report_free(r);
    cleanup(s);
}

/* A job restores its model in place and reads the rest of the step (an
 * optimizer's state) next.  Step 2's "w" is damaged; "s" is not.  A
 * restore of "s" alone takes step 2 by default (it verifies what it
 * reads); with verify CKPT_VERIFY_FULL it verifies the whole step first
 * and takes step 1, saying why, so that the rest reads back too.  A
 * version-1 options struct (no `verify`) still works; an unknown level is
 * refused. */
Test(latest_full, full_verification_skips_a_step_whose_other_tensors_are_damaged)
{
    strcpy(root, "/tmp/ckpt-latest-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    ckpt_store *s;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.fsync = 0;
    o.keep_last = 0;
    cr_assert_eq(ckpt_store_open(&s, root, &o), CKPT_OK);
    int64_t shape[1] = {N};
    int64_t small[2];
    for (int k = 1; k <= 2; k++) {
        for (int i = 0; i < N; i++)
            data[k][i] = (float)(k * 100000 + i);
        small[k - 1] = k;
        ckpt_tensor t[2] = {
            {"w", data[k], sizeof data[k], CKPT_F32, 1, shape, CKPT_MEM_HOST},
            {"s", &small[k - 1], sizeof small[0], CKPT_I64, 0, NULL, CKPT_MEM_HOST}};
        cr_assert_eq(ckpt_save_sync(s, k, t, 2, NULL), CKPT_OK, "%s", ckpt_error_last());
    }
    flip_frame_byte(2); /* the first frame: "w" */
    int64_t got = -1;
    ckpt_tensor ts = {"s", &got, sizeof got, CKPT_I64, 0, NULL, CKPT_MEM_HOST};
    ckpt_restore_options ro;
    cr_assert_eq(ckpt_restore_options_init(&ro, CKPT_RESTORE_OPTIONS_VERSION), CKPT_OK);
    cr_assert_eq(ro.verify, CKPT_VERIFY_STORED);
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &ts, 1, &ro, &r), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_report_step(r), 2);
    cr_assert_eq(got, 2);
    ckpt_report_free(r);

    ro.verify = CKPT_VERIFY_FULL;
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_restore_open(s, CKPT_LATEST, &ts, 1, &ro, &r, &ck), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_report_step(r), 1);
    cr_assert_eq(got, 1);
    cr_assert_eq(ckpt_report_count(r), 1);
    cr_assert_eq(ckpt_report_get(r, 0)->step, 2);
    cr_assert_eq(ckpt_report_get(r, 0)->status, CKPT_ECORRUPT, "%s",
                 ckpt_report_get(r, 0)->message);
    ckpt_report_free(r);
    static float out[N];
    ckpt_tensor tw = {"w", out, sizeof out, CKPT_F32, 1, shape, CKPT_MEM_HOST};
    cr_assert_eq(ckpt_checkpoint_restore(ck, &tw, 1, NULL), CKPT_OK, "the rest of step 1");
    cr_assert_arr_eq(out, data[1], sizeof out);
    ckpt_checkpoint_free(ck);
    /* a step given by number fails with the damage instead */
    cr_assert_eq(ckpt_restore(s, 2, &ts, 1, &ro, NULL), CKPT_ECORRUPT);

    ckpt_restore_options v1;
    cr_assert_eq(ckpt_restore_options_init(&v1, 1), CKPT_OK);
    v1.verify = (ckpt_verify_level)77; /* beyond a v1 struct: never read */
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &ts, 1, &v1, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(got, 2);
    ro.verify = CKPT_VERIFY_QUICK;
    cr_assert_eq(ckpt_restore(s, CKPT_LATEST, &ts, 1, &ro, NULL), CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), "verify"), "%s", ckpt_error_last());
    cleanup(s);
}

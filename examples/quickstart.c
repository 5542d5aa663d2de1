/*
 * quickstart -- the smallest complete use of libckpt (the README's example).
 *
 *   cc -std=c11 quickstart.c $(pkg-config --cflags --libs libckpt) -o quickstart
 *   ./quickstart /tmp/ckpt-quickstart
 *
 * Saves two tensors asynchronously as step 100, waits for the commit, then
 * restores the newest checkpoint that verifies into fresh buffers.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ckpt.h"

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", what, ckpt_strerror(rc), ckpt_error_last());
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "quickstart-ckpt";
    float weights[4][8];
    int64_t step = 100;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            weights[i][j] = (float)(i * 8 + j) * 0.5f;

    /* Open (create and lock) the checkpoint root. */
    ckpt_store_options so = CKPT_STORE_OPTIONS_INIT;
    so.keep_last = 2; /* retire all but the two newest steps */
    ckpt_store *store = NULL;
    int rc = ckpt_store_open(&store, dir, &so);
    if (rc != CKPT_OK)
        return fail("open", rc);

    /* Describe the buffers: name, data, size, dtype, shape. */
    const int64_t wshape[2] = {4, 8};
    ckpt_tensor t[2] = {
        {"weights", weights, sizeof weights, CKPT_F32, 2, wshape, CKPT_MEM_HOST},
        {"step", &step, sizeof step, CKPT_I64, 0, NULL, CKPT_MEM_HOST},
    };

    /* Save: returns once the buffers are copied; the rest runs in the
     * background while the caller goes on working. */
    ckpt_save_options opts = CKPT_SAVE_OPTIONS_INIT;
    opts.metadata_json = "{\"lr\": 0.01}";
    ckpt_save *save = NULL;
    rc = ckpt_save_begin(&save, store, step, t, 2, &opts);
    if (rc != CKPT_OK) {
        ckpt_store_free(store);
        return fail("save", rc);
    }
    weights[0][0] = -1.0f; /* safe: the snapshot is already taken */
    rc = ckpt_save_wait(save); /* durable and committed */
    ckpt_save_stats st;
    if (rc == CKPT_OK && ckpt_save_stats_get(save, &st) == CKPT_OK)
        printf("saved step %" PRId64 ": %" PRIu64 " bytes -> %" PRIu64
               " stored\n", st.step, st.raw_bytes, st.stored_bytes);
    ckpt_save_free(save);
    if (rc != CKPT_OK) {
        ckpt_store_free(store);
        return fail("save", rc);
    }

    /* Restore the newest checkpoint that verifies; older ones are tried if
     * newer ones are damaged, and the report says which were skipped. */
    memset(weights, 0, sizeof weights);
    step = 0;
    ckpt_report *report = NULL;
    rc = ckpt_restore(store, CKPT_LATEST, t, 2, NULL, &report);
    for (size_t i = 0; report && i < ckpt_report_count(report); i++)
        printf("skipped: %s\n", ckpt_report_get(report, i)->message);
    ckpt_report_free(report);
    ckpt_store_free(store);
    if (rc != CKPT_OK)
        return fail("restore", rc);
    printf("restored step %" PRId64 ", weights[3][7] = %g\n", step,
           (double)weights[3][7]);
    return weights[3][7] == 15.5f && step == 100 ? 0 : 1;
}

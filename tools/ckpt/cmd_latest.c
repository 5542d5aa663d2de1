/* ckpt latest: the newest checkpoint that verifies, for job scripts. */
#include <inttypes.h>
#include <stdlib.h>

#include "cli.h"

const cli_cmd cli_cmd_latest = {
    "latest", "Print the path (or step) of the newest checkpoint that verifies",
    "Uses quick verification unless --full is given (quick reads no chunk, so it\n"
    "may name a step whose data is damaged; --full names the step a restore\n"
    "takes).  Prints nothing on stdout and exits 1 when no checkpoint verifies,\n"
    "so a job script can write:\n"
    "  if step=$(ckpt latest DIR --full --step); then resume \"$step\"; fi",
    1, cmd_latest};

/* The problems of the committed steps newer than `found` (a job script
 * that resumes from an older step than the newest should be told why):
 * each such step verified again at `level`, newest first.  NULL when out
 * of memory or the root cannot be listed (then nothing is said). */
static ckpt_report **skipped_newer(ckpt_store *store, int64_t found, ckpt_verify_level level,
                                   size_t *n)
{
    int64_t *steps = NULL;
    size_t count = 0;
    *n = 0;
    if (ckpt_store_steps(store, &steps, &count) != CKPT_OK)
        return NULL;
    ckpt_report **v = calloc(count ? count : 1, sizeof *v);
    for (size_t i = count; v && i-- > 0 && steps[i] > found;) {
        ckpt_report *r = NULL;
        if (ckpt_verify(store, steps[i], level, &r) != CKPT_OK && r && ckpt_report_count(r))
            v[(*n)++] = r;
        else
            ckpt_report_free(r); /* verifies now: a save committed since */
    }
    ckpt_free(steps);
    return v;
}

int cmd_latest(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL;
    int full = 0, only_step = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_FLAG, "full", NULL, "require full verification (every chunk's hashes)",
         &full, 0, 0, NULL},
        {CLI_OPT_FLAG, "step", NULL, "print the step number instead of the path", &only_step,
         0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_latest, opts, argc, argv, &ret))
        return ret;

    ckpt_store *store = NULL;
    ckpt_checkpoint *ckpt = NULL;
    int64_t step = -1;
    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    /* One call: the step found is the one opened (no window in between). */
    int st = ckpt_checkpoint_open(&ckpt, store, CKPT_LATEST,
                                  full ? CKPT_VERIFY_FULL : CKPT_VERIFY_QUICK);
    if (st == CKPT_ENOCKPT || st == CKPT_ENOTFOUND) {
        if (ctx->json) {
            cli_json_print(json_pack("{s:s, s:s, s:n, s:n}", "root", ckpt_store_path(store),
                                     "level", full ? "full" : "quick", "step", "path"));
        } else {
            /* the library's message says why the newest step was passed over */
            const char *why = ckpt_error_last();
            if (st == CKPT_ENOCKPT && why && *why) {
                fputs("ckpt latest: ", stderr);
                cli_put_oneline(stderr, why);
                fputc('\n', stderr);
            } else
                cli_note("ckpt latest: no valid checkpoint in %s", dir);
            int64_t *steps = NULL;
            size_t nsteps = 0;
            if (ckpt_store_steps(store, &steps, &nsteps) == CKPT_OK && nsteps == 0)
                cli_hint_roots_below(dir);
            ckpt_free(steps);
        }
        ret = CLI_EXIT_INVALID;
        goto done;
    }
    if (st != CKPT_OK) {
        ret = cli_fail_lib(ctx, st, "cannot find the latest checkpoint in %s", dir);
        goto done;
    }
    step = ckpt_checkpoint_step(ckpt);
    size_t nskipped = 0;
    ckpt_report **skipped = skipped_newer(store, step, full ? CKPT_VERIFY_FULL
                                                          : CKPT_VERIFY_QUICK, &nskipped);
    if (ctx->json) {
        json_t *doc = json_pack("{s:s, s:s, s:I, s:s}", "root", ckpt_store_path(store),
                                "level", full ? "full" : "quick", "step", (json_int_t)step,
                                "path", ckpt_checkpoint_path(ckpt));
        json_t *a = json_array();
        for (size_t i = 0; i < nskipped; i++)
            json_array_append_new(a, cli_problem_json(ckpt_report_get(skipped[i], 0)));
        json_object_set_new(doc, "skipped", a);
        cli_json_print(doc);
    } else {
        /* stdout stays the one line a script reads; the note goes to stderr */
        for (size_t i = 0; i < nskipped; i++) {
            const ckpt_problem *p = ckpt_report_get(skipped[i], 0);
            fprintf(stderr, "ckpt latest: skipped newer step %" PRId64 ": ", p->step);
            cli_put_oneline(stderr, p->message ? p->message : "");
            fputc('\n', stderr);
        }
        if (only_step)
            printf("%" PRId64 "\n", step);
        else
            printf("%s\n", ckpt_checkpoint_path(ckpt));
    }
    for (size_t i = 0; i < nskipped; i++)
        ckpt_report_free(skipped[i]);
    free(skipped);
    ret = CLI_EXIT_OK;
done:
    ckpt_checkpoint_free(ckpt);
    ckpt_store_free(store);
    return ret;
}

/* ckpt latest: the newest checkpoint that verifies, for job scripts. */
#include <inttypes.h>

#include "cli.h"

const cli_cmd cli_cmd_latest = {
    "latest", "Print the path (or step) of the newest checkpoint that verifies",
    "Uses quick verification unless --full is given.  Prints nothing on stdout\n"
    "and exits 1 when no checkpoint verifies, so a job script can write:\n"
    "  if step=$(ckpt latest DIR --step); then resume \"$step\"; fi",
    1, cmd_latest};

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
            if (st == CKPT_ENOCKPT && why && *why)
                fprintf(stderr, "ckpt latest: %s\n", why);
            else
                fprintf(stderr, "ckpt latest: no valid checkpoint in %s\n", dir);
        }
        ret = CLI_EXIT_INVALID;
        goto done;
    }
    if (st != CKPT_OK) {
        ret = cli_fail_lib(ctx, st, "cannot find the latest checkpoint in %s", dir);
        goto done;
    }
    step = ckpt_checkpoint_step(ckpt);
    if (ctx->json)
        cli_json_print(json_pack("{s:s, s:s, s:I, s:s}", "root", ckpt_store_path(store),
                                 "level", full ? "full" : "quick", "step", (json_int_t)step,
                                 "path", ckpt_checkpoint_path(ckpt)));
    else if (only_step)
        printf("%" PRId64 "\n", step);
    else
        printf("%s\n", ckpt_checkpoint_path(ckpt));
    ret = CLI_EXIT_OK;
done:
    ckpt_checkpoint_free(ckpt);
    ckpt_store_free(store);
    return ret;
}

/* ckpt verify: check steps chunk by chunk and name every problem. */
#include <inttypes.h>
#include <stdlib.h>

#include "cli.h"

const cli_cmd cli_cmd_verify = {
    "verify", "Verify checkpoints and name the file, tensor and offset of each problem",
    "Checks the newest committed step unless --step or --all is given.  Full\n"
    "verification (every chunk's stored and raw hashes) is the default; --quick\n"
    "checks structure, sizes and the index and manifest checksums only.\n"
    "Exits 0 when every checked step is valid, 1 when one is not (or there is\n"
    "no step to check).",
    1, cmd_verify};

int cmd_verify(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL;
    int64_t step = -1;
    int all = 0, quick = 0, have_step = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_INT, "step", "N", "verify step N", &step, 0, 0, &have_step},
        {CLI_OPT_FLAG, "all", NULL, "verify every committed step", &all, 0, 0, NULL},
        {CLI_OPT_FLAG, "quick", NULL, "structure and checksums of index and manifest only",
         &quick, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_verify, opts, argc, argv, &ret))
        return ret;
    if (have_step && all)
        return cli_usage(ctx, "--step and --all exclude each other");

    ckpt_store *store = NULL;
    int64_t *steps = NULL;
    size_t count = 0, first = 0, bad = 0;
    json_t *doc = NULL, *arr = NULL;
    ckpt_verify_level level = quick ? CKPT_VERIFY_QUICK : CKPT_VERIFY_FULL;
    cli_progress prog = {0};

    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    if (ctx->json) {
        doc = json_object();
        arr = json_array();
        json_object_set_new(doc, "root", json_string(ckpt_store_path(store)));
        json_object_set_new(doc, "level", json_string(quick ? "quick" : "full"));
    }
    size_t checked = 0, seen = 0; /* seen: listed in any round */
    int rounds = 0;
    /* Next to a running job, a step listed may be retired before it is
     * checked (keep_last): it is left out, and when that leaves nothing
     * checked, the root is listed again (the newest step is then a newer
     * one).  So it is when the listing was empty: reading a directory while
     * entries are renamed in it may see neither the step just committed nor
     * the one retired after it. */
    for (int round = 0; round <= CLI_RELISTS && !checked; round++) {
        ckpt_free(steps);
        steps = NULL;
        int st = ckpt_store_steps(store, &steps, &count);
        if (st != CKPT_OK) {
            ret = cli_fail_lib(ctx, st == CKPT_ENOTFOUND ? CKPT_EIO : st, "cannot list %s", dir);
            goto done;
        }
        first = 0;
        rounds = round + 1;
        if (have_step) {
            size_t i = 0;
            while (i < count && steps[i] != step)
                i++;
            if (i == count) {
                ret = cli_fail(ctx, CLI_EXIT_INVALID, CKPT_ENOTFOUND,
                               "no step %" PRId64 " in %s", step, ckpt_store_path(store));
                goto done;
            }
            first = i;
            count = i + 1;
        } else if (!all && count) {
            first = count - 1;
        }
        if (!quick && !round)
            cli_progress_start(&prog, "verify",
                               cli_progress_wanted()
                                   ? cli_steps_stored_bytes(store, steps + first, count - first)
                                   : 0);
        size_t gone = 0;
        for (size_t i = first; i < count; i++) {
            cli_step s;
            cli_step_check(store, steps[i], level, &s);
            if (s.state == CLI_STEP_GONE && !have_step) {
                gone++;
                cli_step_clear(&s);
                continue;
            }
            if (s.state == CLI_STEP_GONE) /* the step asked for: "no step N" */
                s.state = CLI_STEP_ERROR;
            checked++;
            if (s.state != CLI_STEP_VALID)
                bad++;
            if (ctx->json) {
                json_array_append_new(arr, cli_step_json(&s));
            } else {
                cli_progress_hide(&prog);
                printf("step %" PRId64 ": %s\n", s.step, cli_step_state_name(s.state));
                cli_step_print_problems(stdout, &s);
                fflush(stdout);
            }
            if (s.have_stats)
                cli_progress_add(&prog, s.stats.stored_bytes);
            cli_step_clear(&s);
        }
        seen += gone;
        if (count && !gone)
            break; /* all checked, or the one asked for is not there */
    }
    cli_progress_end(&prog);
    if (ctx->json) {
        json_object_set_new(doc, "ok", json_boolean(checked && !bad));
        json_object_set_new(doc, "checked", json_integer((json_int_t)checked));
        json_object_set_new(doc, "failed", json_integer((json_int_t)bad));
        json_object_set_new(doc, "steps", arr);
        cli_json_print(doc); /* frees it */
        doc = arr = NULL;
    } else if (!checked) {
        if (seen)
            cli_note("ckpt verify: every step listed in %s was retired by a running job "
                     "before it could be checked (%d listings): run again", dir, rounds);
        else
            cli_note("ckpt verify: no checkpoints in %s", dir);
        if (!seen)
            cli_hint_roots_below(dir);
    } else if (bad) {
        printf("%zu of %zu step%s failed %s verification\n", bad, checked,
               checked == 1 ? "" : "s", quick ? "quick" : "full");
    }
    ret = checked && !bad ? CLI_EXIT_OK : CLI_EXIT_INVALID;
done:
    json_decref(arr); /* left when a later listing failed: made before it */
    json_decref(doc);
    ckpt_free(steps);
    ckpt_store_free(store);
    return ret;
}

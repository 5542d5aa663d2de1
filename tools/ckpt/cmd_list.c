/* ckpt list: every committed step with its status and statistics. */
#include <inttypes.h>
#include <stdlib.h>

#include "cli.h"

const cli_cmd cli_cmd_list = {
    "list", "List every committed step: status, time, sizes, ratio, tensors, save time",
    "Status is 'valid', 'incomplete' (a file is missing or truncated), 'corrupt'\n"
    "(data failed verification) or 'error' (could not be read).  Quick\n"
    "verification (structure, sizes, index and manifest checksums) is used\n"
    "unless --full is given, which also checks every chunk's hashes.\n"
    "Exits 1 when no step is valid (an empty directory included).",
    1, cmd_list};

int cmd_list(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL;
    int full = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_FLAG, "full", NULL, "verify every chunk, not only the structure", &full, 0,
         0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_list, opts, argc, argv, &ret))
        return ret;

    ckpt_store *store = NULL;
    int64_t *steps = NULL;
    size_t count = 0;
    json_t *doc = NULL, *arr = NULL;
    int64_t latest_valid = -1;
    ckpt_verify_level level = full ? CKPT_VERIFY_FULL : CKPT_VERIFY_QUICK;
    cli_progress prog = {0};

    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    /* Next to a running job, steps listed may be retired before they are
     * checked (keep_last): those are left out, and when they were all the
     * root held, it is listed again.  So it is when the listing was empty:
     * reading a directory while entries are renamed in it may see neither
     * the step just committed nor the one retired after it. */
    int st, round = 0;
    size_t shown = 0, seen = 0; /* seen: listed in any round */
relist:
    st = ckpt_store_steps(store, &steps, &count);
    if (st != CKPT_OK) {
        ret = cli_fail_lib(ctx, st == CKPT_ENOTFOUND ? CKPT_EIO : st, "cannot list %s", dir);
        goto done;
    }
    if (round) {
        /* header, progress and document already made */
    } else if (ctx->json) {
        doc = json_object();
        arr = json_array();
        json_object_set_new(doc, "root", json_string(ckpt_store_path(store)));
        json_object_set_new(doc, "verify", json_string(full ? "full" : "quick"));
    } else if (count) {
        printf("%-12s  %-10s  %-20s  %10s  %10s  %6s  %7s  %8s\n", "STEP", "STATUS", "TIME",
               "RAW", "STORED", "RATIO", "TENSORS", "SAVE");
    }
    if (full && !round)
        cli_progress_start(&prog, "verify",
                           cli_progress_wanted() ? cli_steps_stored_bytes(store, steps, count)
                                                 : 0);
    for (size_t i = 0; i < count; i++) {
        cli_step s;
        cli_step_check(store, steps[i], level, &s);
        if (s.state == CLI_STEP_GONE) {
            cli_step_clear(&s);
            continue;
        }
        shown++;
        if (s.state == CLI_STEP_VALID)
            latest_valid = steps[i];
        if (ctx->json) {
            json_array_append_new(arr, cli_step_json(&s));
        } else {
            char t[32], raw[32], stored[32], ratio[16], tensors[16], save[32];
            if (s.ckpt) {
                cli_fmt_time(ckpt_checkpoint_time(s.ckpt), t);
                snprintf(tensors, sizeof tensors, "%zu", ckpt_checkpoint_tensor_count(s.ckpt));
            } else {
                snprintf(t, sizeof t, "-");
                snprintf(tensors, sizeof tensors, "-");
            }
            if (s.have_stats) {
                cli_fmt_bytes(s.stats.raw_bytes, raw);
                cli_fmt_bytes(s.stats.stored_bytes, stored);
                if (s.stats.stored_bytes)
                    snprintf(ratio, sizeof ratio, "%.2f",
                             (double)s.stats.raw_bytes / (double)s.stats.stored_bytes);
                else
                    snprintf(ratio, sizeof ratio, "-");
                cli_fmt_duration(s.stats.stall_s + s.stats.persist_s, save);
            } else {
                snprintf(raw, sizeof raw, "-");
                snprintf(stored, sizeof stored, "-");
                snprintf(ratio, sizeof ratio, "-");
                snprintf(save, sizeof save, "-");
            }
            cli_progress_hide(&prog);
            printf("%-12" PRId64 "  %-10s  %-20s  %10s  %10s  %6s  %7s  %8s\n", s.step,
                   cli_step_state_name(s.state), t, raw, stored, ratio, tensors, save);
            fflush(stdout);
        }
        if (s.have_stats)
            cli_progress_add(&prog, s.stats.stored_bytes);
        cli_step_clear(&s);
    }
    seen += count;
    if (!shown && round++ < CLI_RELISTS) {
        ckpt_free(steps);
        steps = NULL;
        goto relist;
    }
    cli_progress_end(&prog);
    if (ctx->json) {
        json_object_set_new(doc, "steps", arr);
        json_object_set_new(doc, "latest_valid", cli_json_int_or_null(latest_valid));
        cli_json_print(doc); /* frees it */
        doc = arr = NULL;
    } else if (!shown) {
        if (seen)
            cli_note("ckpt list: every step listed in %s was retired by a running job "
                     "before it could be checked (%d listings): run again", dir, round);
        else
            cli_note("ckpt list: no checkpoints in %s", dir);
        if (!seen)
            cli_hint_roots_below(dir);
    } else if (latest_valid < 0) {
        cli_note("ckpt list: no valid checkpoint in %s", dir);
    }
    ret = latest_valid >= 0 ? CLI_EXIT_OK : CLI_EXIT_INVALID;
done:
    json_decref(arr); /* left when a later listing failed: made before it */
    json_decref(doc);
    ckpt_free(steps);
    ckpt_store_free(store);
    return ret;
}

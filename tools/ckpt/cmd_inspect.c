/* ckpt inspect: tensors, environment record and metadata of one step. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const cli_cmd cli_cmd_inspect = {
    "inspect", "Show a step's tensors, environment record and metadata",
    "Shows the newest step that passes quick verification unless --step is\n"
    "given.  Exits 1 when that step does not exist or fails quick verification.",
    1, cmd_inspect};

static void shape_text(const ckpt_tensor_info *ti, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ti->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, d ? ", " : "", ti->shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

static void print_json_text(const char *title, const char *text)
{
    json_t *v = cli_json_from_text(text);
    char *s = cli_json_dumps(v);
    printf("\n%s:\n%s\n", title, s ? s : "null");
    free(s);
    json_decref(v);
}

/* The rank that saved tensor i (docs/SCALING.md), from the library's
 * decoding of the manifest (parsing it again here took nine times its
 * size for a manifest of millions of tensors). */
static int64_t tensor_rank(const ckpt_checkpoint *ckpt, size_t i)
{
    int rank = 0;
    return ckpt_checkpoint_tensor_rank(ckpt, i, &rank) == CKPT_OK ? rank : 0;
}

int cmd_inspect(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL;
    int64_t step = CKPT_LATEST;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_INT, "step", "N", "inspect step N (default: newest valid)", &step, 0, 0,
         NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_inspect, opts, argc, argv, &ret))
        return ret;

    ckpt_store *store = NULL;
    ckpt_checkpoint *ckpt = NULL;
    ckpt_save_stats stats;
    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    int st = ckpt_checkpoint_open(&ckpt, store, step, CKPT_VERIFY_QUICK);
    if (st != CKPT_OK) {
        if (step == CKPT_LATEST)
            ret = cli_fail_lib(ctx, st == CKPT_ENOTFOUND ? CKPT_ENOCKPT : st,
                               "cannot open the latest checkpoint");
        else
            ret = cli_fail_lib(ctx, st, "cannot open step %" PRId64, step);
        goto done;
    }
    int64_t world = ckpt_checkpoint_world_size(ckpt);
    int have_stats = ckpt_checkpoint_stats(ckpt, &stats) == CKPT_OK;
    size_t n = ckpt_checkpoint_tensor_count(ckpt);
    double t = ckpt_checkpoint_time(ckpt);
    char tbuf[32], b1[32], b2[32], b3[32];

    if (ctx->json) {
        json_t *doc = json_object(), *tensors = json_array();
        json_object_set_new(doc, "root", json_string(ckpt_store_path(store)));
        json_object_set_new(doc, "step", json_integer(ckpt_checkpoint_step(ckpt)));
        json_object_set_new(doc, "path", json_string(ckpt_checkpoint_path(ckpt)));
        json_object_set_new(doc, "time", json_real(t));
        json_object_set_new(doc, "time_iso", json_string(cli_fmt_time(t, tbuf)));
        json_object_set_new(doc, "world_size", json_integer(world));
        if (have_stats) {
            json_object_set_new(doc, "raw_bytes", json_integer((json_int_t)stats.raw_bytes));
            json_object_set_new(doc, "stored_bytes",
                                json_integer((json_int_t)stats.stored_bytes));
            json_object_set_new(doc, "ratio",
                                stats.stored_bytes ? json_real((double)stats.raw_bytes /
                                                               (double)stats.stored_bytes)
                                                   : json_null());
            json_object_set_new(doc, "chunks", json_integer((json_int_t)stats.chunks));
            json_object_set_new(doc, "stall_seconds", json_real(stats.stall_s));
            json_object_set_new(doc, "persist_seconds", json_real(stats.persist_s));
        } else {
            static const char *const keys[] = {"raw_bytes", "stored_bytes", "ratio", "chunks",
                                               "stall_seconds", "persist_seconds"};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                json_object_set_new(doc, keys[k], json_null());
        }
        for (size_t i = 0; i < n; i++) {
            ckpt_tensor_info ti;
            if ((st = ckpt_checkpoint_tensor(ckpt, i, &ti)) != CKPT_OK) {
                json_decref(tensors);
                json_decref(doc);
                ret = cli_fail_lib(ctx, st, "cannot describe tensor %zu", i);
                goto done;
            }
            json_t *shape = json_array();
            for (int d = 0; d < ti.ndim; d++)
                json_array_append_new(shape, json_integer(ti.shape[d]));
            const char *dn = ckpt_dtype_name(ti.dtype);
            json_array_append_new(
                tensors,
                json_pack("{s:s, s:s, s:o, s:I, s:I, s:o, s:I, s:I}", "name", ti.name,
                          "dtype", dn ? dn : "unknown", "shape", shape, "bytes",
                          (json_int_t)ti.bytes, "stored_bytes", (json_int_t)ti.stored_bytes,
                          "ratio",
                          ti.stored_bytes ? json_real((double)ti.bytes / (double)ti.stored_bytes)
                                          : json_null(),
                          "chunks", (json_int_t)ti.chunks, "rank",
                          (json_int_t)tensor_rank(ckpt, i)));
        }
        json_object_set_new(doc, "tensors", tensors);
        json_object_set_new(doc, "environment",
                            cli_json_from_text(ckpt_checkpoint_env(ckpt)));
        json_object_set_new(doc, "metadata", cli_json_from_text(ckpt_checkpoint_metadata(ckpt)));
        cli_json_print(doc);
        ret = CLI_EXIT_OK;
        goto done;
    }

    printf("step %" PRId64 "  %s\n", ckpt_checkpoint_step(ckpt), ckpt_checkpoint_path(ckpt));
    printf("time      %s\n", cli_fmt_time(t, tbuf));
    if (have_stats) {
        printf("raw       %s\nstored    %s", cli_fmt_bytes(stats.raw_bytes, b1),
               cli_fmt_bytes(stats.stored_bytes, b2));
        if (stats.stored_bytes)
            printf(" (ratio %.2f)", (double)stats.raw_bytes / (double)stats.stored_bytes);
        printf("\nchunks    %" PRIu64 "\nsave      stall %s, persist %s\n", stats.chunks,
               cli_fmt_duration(stats.stall_s, b1), cli_fmt_duration(stats.persist_s, b2));
    }
    if (world > 1)
        printf("ranks     %" PRId64 " (a shard each; RANK says whose)\n", world);
    /* Columns as wide as the longest name and shape shown (a transformer's
     * names pass 40 characters), within reason: one absurd name does not
     * push every row off the screen. */
    int name_w = 6, shape_w = 5;
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor_info ti;
        char shape[256];
        if (ckpt_checkpoint_tensor(ckpt, i, &ti) != CKPT_OK)
            continue; /* reported below */
        shape_text(&ti, shape, sizeof shape);
        int w = cli_shown_width(ti.name), sw = (int)strlen(shape);
        name_w = w > name_w ? (w < 96 ? w : 96) : name_w;
        shape_w = sw > shape_w ? (sw < 48 ? sw : 48) : shape_w;
    }
    printf("\n");
    cli_print_column("TENSOR", name_w);
    printf("  %-13s  %-*s  %10s  %6s%s\n", "DTYPE", shape_w, "SHAPE", "BYTES", "RATIO",
           world > 1 ? "   RANK" : "");
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor_info ti;
        char shape[256], ratio[16];
        if ((st = ckpt_checkpoint_tensor(ckpt, i, &ti)) != CKPT_OK) {
            ret = cli_fail_lib(ctx, st, "cannot describe tensor %zu", i);
            goto done;
        }
        shape_text(&ti, shape, sizeof shape);
        if (ti.stored_bytes)
            snprintf(ratio, sizeof ratio, "%.2f", (double)ti.bytes / (double)ti.stored_bytes);
        else
            snprintf(ratio, sizeof ratio, "-");
        const char *dn = ckpt_dtype_name(ti.dtype);
        cli_print_column(ti.name, name_w);
        printf("  %-13s  %-*s  %10s  %6s", dn ? dn : "unknown", shape_w, shape,
               cli_fmt_bytes(ti.bytes, b3), ratio);
        if (world > 1)
            printf("  %5" PRId64, tensor_rank(ckpt, i));
        printf("\n");
    }
    print_json_text("environment", ckpt_checkpoint_env(ckpt));
    print_json_text("metadata", ckpt_checkpoint_metadata(ckpt));
    ret = CLI_EXIT_OK;
done:
    ckpt_checkpoint_free(ckpt);
    ckpt_store_free(store);
    return ret;
}

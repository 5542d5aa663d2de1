/* args: option tables, parsing and --help text generated from them. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const cli_opt *find_long(const cli_opt *opts, const char *name, size_t len)
{
    for (const cli_opt *o = opts; o->kind != CLI_OPT_END; o++)
        if (o->kind != CLI_OPT_ARG && strlen(o->name) == len &&
            strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

static int parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int set_value(cli_ctx *ctx, const cli_opt *o, const char *val)
{
    if (o->seen)
        *o->seen = 1;
    switch (o->kind) {
    case CLI_OPT_FLAG:
        *(int *)o->value = 1;
        return 0;
    case CLI_OPT_INT: {
        int64_t v;
        if (parse_int(val, &v) < 0)
            return cli_usage(ctx, "--%s expects an integer, not '%s'", o->name, val);
        if (v < o->min)
            return cli_usage(ctx, "--%s must be at least %" PRId64 ", not %" PRId64,
                             o->name, o->min, v);
        *(int64_t *)o->value = v;
        return 0;
    }
    case CLI_OPT_STRING:
    case CLI_OPT_ARG:
        *(const char **)o->value = val;
        return 0;
    default:
        return 0;
    }
}

int cli_parse(cli_ctx *ctx, const cli_cmd *cmd, const cli_opt *opts, int argc,
              char **argv, int *ret)
{
    int only_args = 0;
    const cli_opt *next_arg = opts;
    int help = 0;

    /* --json anywhere on the line (before "--") applies to every message,
     * usage errors included, even those about arguments before it.  The
     * value of an option that takes one is skipped: `--out --json` names a
     * file. */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            ctx->json = 1;
            break;
        }
        if (a[0] == '-' && a[1] == '-' && !strchr(a, '=')) {
            const cli_opt *o = find_long(opts, a + 2, strlen(a + 2));
            if (o && o->kind != CLI_OPT_FLAG)
                i++;
        }
    }

    /* --help wins over any other problem on the line. */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            help = 1;
    if (help) {
        cli_print_help(stdout, cmd, opts);
        *ret = CLI_EXIT_OK;
        return 1;
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_args && strcmp(a, "--") == 0) {
            only_args = 1;
            continue;
        }
        if (!only_args && a[0] == '-' && a[1] != '\0') {
            if (a[1] != '-') {
                *ret = cli_usage(ctx, "unknown option '%s'", a);
                return 1;
            }
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            if (len == 4 && strncmp(name, "json", 4) == 0 && !eq) {
                ctx->json = 1;
                continue;
            }
            if (len == 11 && strncmp(name, "trust-group", 11) == 0 && !eq) {
                ctx->trust_group = 1; /* every command opens a root */
                continue;
            }
            const cli_opt *o = find_long(opts, name, len);
            if (!o) {
                *ret = cli_usage(ctx, "unknown option '--%.*s'", (int)len, name);
                return 1;
            }
            const char *val = NULL;
            if (o->kind == CLI_OPT_FLAG) {
                if (eq) {
                    *ret = cli_usage(ctx, "--%s takes no value", o->name);
                    return 1;
                }
            } else if (eq) {
                val = eq + 1;
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                *ret = cli_usage(ctx, "--%s needs a value (%s)", o->name,
                                 o->metavar ? o->metavar : "VALUE");
                return 1;
            }
            int r = set_value(ctx, o, val);
            if (r) {
                *ret = r;
                return 1;
            }
            continue;
        }
        while (next_arg->kind != CLI_OPT_END && next_arg->kind != CLI_OPT_ARG)
            next_arg++;
        if (next_arg->kind == CLI_OPT_END) {
            *ret = cli_usage(ctx, "unexpected argument '%s'", a);
            return 1;
        }
        set_value(ctx, next_arg, a);
        next_arg++;
    }
    for (const cli_opt *o = opts; o->kind != CLI_OPT_END; o++) {
        if (o->kind == CLI_OPT_ARG && o->required && !*(const char **)o->value) {
            *ret = cli_usage(ctx, "missing %s", o->name);
            return 1;
        }
    }
    return 0;
}

void cli_print_exit_codes(FILE *f)
{
    fprintf(f, "Exit codes:\n"
               "  0  success\n"
               "  1  verification failed, or no valid checkpoint\n"
               "  2  usage error\n"
               "  3  I/O or other error\n");
}

void cli_print_help(FILE *f, const cli_cmd *cmd, const cli_opt *opts)
{
    fprintf(f, "Usage: ckpt %s", cmd->name);
    for (const cli_opt *o = opts; o->kind != CLI_OPT_END; o++) {
        if (o->kind == CLI_OPT_ARG)
            fprintf(f, o->required ? " %s" : " [%s]", o->name);
    }
    fprintf(f, " [OPTIONS]\n\n%s\n", cmd->summary);
    if (cmd->description)
        fprintf(f, "\n%s\n", cmd->description);
    fprintf(f, "\nOptions:\n");
    for (const cli_opt *o = opts; o->kind != CLI_OPT_END; o++) {
        char left[64];
        if (o->kind == CLI_OPT_ARG)
            snprintf(left, sizeof left, "%s", o->name);
        else if (o->kind == CLI_OPT_FLAG)
            snprintf(left, sizeof left, "--%s", o->name);
        else
            snprintf(left, sizeof left, "--%s %s", o->name, o->metavar ? o->metavar : "VALUE");
        fprintf(f, "  %-22s %s\n", left, o->help);
    }
    fprintf(f, "  %-22s %s\n", "--trust-group",
            "accept a root shared by your group (also CKPT_TRUST_GROUP=1)");
    if (cmd->json)
        fprintf(f, "  %-22s %s\n", "--json",
                "print one JSON document on stdout (errors too); its schema is in "
                "CLI.md (ckpt --help says where)");
    else /* a format of its own (metrics: Prometheus text) */
        fprintf(f, "  %-22s %s\n", "--json",
                "print an error as one JSON document on stdout; the output itself "
                "keeps its format");
    fprintf(f, "  %-22s %s\n\n", "--help", "show this help");
    cli_print_exit_codes(f);
}

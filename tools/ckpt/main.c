/* ckpt: inspect, verify and maintain libckpt checkpoint directories. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const cli_cmd *const commands[] = {
    &cli_cmd_list, &cli_cmd_verify, &cli_cmd_latest, &cli_cmd_inspect,
    &cli_cmd_gc,   &cli_cmd_doctor, &cli_cmd_export, &cli_cmd_import,
    &cli_cmd_log,  &cli_cmd_metrics, &cli_cmd_health,
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const cli_cmd *find_command(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i]->name, name) == 0)
            return commands[i];
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: ckpt [--json] COMMAND [OPTIONS] [ARGS]\n"
               "       ckpt COMMAND --help\n"
               "       ckpt --version\n\n"
               "Inspect, verify and maintain libckpt checkpoint directories.\n\n"
               "Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-8s  %s\n", commands[i]->name, commands[i]->summary);
    fprintf(f, "\nGlobal options:\n"
               "  --json      print one JSON document on stdout (every command);\n"
               "              errors too, as {\"error\": ...}; metrics keeps its\n"
               "              Prometheus text, its errors are JSON\n"
               "  --help      show this help, or a command's with `ckpt COMMAND --help`\n"
               "  --version   show the versions of ckpt and of the loaded libckpt\n\n");
    cli_print_exit_codes(f);
    fprintf(f, "\nThe JSON schemas and the exit codes are described in %s.\n", CKPT_CLI_DOC);
}

int main(int argc, char **argv)
{
    cli_ctx ctx = {"ckpt", 0, 0, 0};
    const char *trust = getenv("CKPT_TRUST_GROUP");
    ctx.trust_group = trust && strcmp(trust, "1") == 0;
    int i = 1;

    /* Every command accepts --json: with it anywhere on the line (before
     * "--"), the errors found here are JSON documents too, also those about
     * an argument before it.  The command's own parser looks again, knowing
     * which of its options take a value. */
    int json_before = 0;
    for (int j = 1; j < argc && strcmp(argv[j], "--") != 0; j++)
        if (strcmp(argv[j], "--json") == 0)
            ctx.json = 1;
    cli_guard_terminal(ctx.json);

    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json_before = 1;
        } else if (strcmp(argv[i], "--trust-group") == 0) { /* "anywhere on the line" */
            ctx.trust_group = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("ckpt %s (libckpt %s)\n", CKPT_VERSION_STRING, ckpt_version_string());
            return CLI_EXIT_OK;
        } else {
            return cli_usage(&ctx, "unknown option '%s'", argv[i]);
        }
    }
    if (i >= argc) {
        if (ctx.json)
            return cli_usage(&ctx, "no command given");
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0) {
        const cli_cmd *cmd = i + 1 < argc ? find_command(argv[i + 1]) : NULL;
        if (i + 1 < argc && !cmd)
            return cli_usage(&ctx, "unknown command '%s'", argv[i + 1]);
        if (!cmd) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        char *hargv[] = {argv[i + 1], (char *)"--help", NULL};
        ctx.cmd = cmd->name;
        ctx.json = json_before;
        return cmd->run(&ctx, 2, hargv);
    }
    const cli_cmd *cmd = find_command(argv[i]);
    if (!cmd)
        return cli_usage(&ctx, "unknown command '%s'", argv[i]);
    ctx.cmd = cmd->name;
    ctx.json = json_before; /* cli_parse() finds a later --json itself */
    return cmd->run(&ctx, argc - i, argv + i);
}

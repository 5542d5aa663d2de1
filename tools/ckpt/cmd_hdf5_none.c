/* export / import when ckpt was built without HDF5. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifdef CKPT_CLI_WHEEL /* the Python package's copy (tools/meson.build) */
static const char *const why =
    "the ckpt of the Python package has no HDF5 support: use the ckpt of a meson "
    "install (README, \"Build and install\")";
#else
static const char *const why =
    "this ckpt was built without HDF5 support (install libhdf5-dev and rebuild)";
#endif

const cli_cmd cli_cmd_export = {"export", "Write a checkpoint step as an HDF5 file (needs HDF5)",
                                NULL, 1, cmd_export};
const cli_cmd cli_cmd_import = {"import",
                                "Store an HDF5 file's datasets as a checkpoint step (needs HDF5)",
                                NULL, 1, cmd_import};

/* --help still answers (exit 0), saying what the command would do. */
static int unavailable(cli_ctx *ctx, const cli_cmd *cmd, const char *usage, int argc,
                       char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ckpt %s %s\n%s.\nNot available: %s.\n", cmd->name, usage,
                   cmd->summary, why);
            return CLI_EXIT_OK;
        }
    return cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s", why);
}

int cmd_export(cli_ctx *ctx, int argc, char **argv)
{
    return unavailable(ctx, &cli_cmd_export, "DIR OUT.h5 [--step N] [--codec none|deflate|zstd]",
                       argc, argv);
}

int cmd_import(cli_ctx *ctx, int argc, char **argv)
{
    return unavailable(ctx, &cli_cmd_import, "IN.h5 DIR [--step N]", argc, argv);
}

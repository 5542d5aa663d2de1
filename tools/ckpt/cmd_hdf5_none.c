/* export / import when ckpt was built without HDF5. */
#include "cli.h"

static const char *const why =
    "this ckpt was built without HDF5 support (install libhdf5-dev and rebuild)";

const cli_cmd cli_cmd_export = {"export", "Write a checkpoint step as an HDF5 file (needs HDF5)",
                                NULL, 1, cmd_export};
const cli_cmd cli_cmd_import = {"import",
                                "Store an HDF5 file's datasets as a checkpoint step (needs HDF5)",
                                NULL, 1, cmd_import};

int cmd_export(cli_ctx *ctx, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s", why);
}

int cmd_import(cli_ctx *ctx, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s", why);
}

/* env: the environment record written into every manifest, so that drift
 * between steps (library, codec, driver, GPU, host) can be seen later. */
#ifndef CKPT_ENV_H
#define CKPT_ENV_H

#include <jansson.h>

#include "device.h"

/* A new JSON object; NULL on out of memory.  The process's command line is
 * recorded only when `with_command_line` (it may hold secrets: tokens and
 * paths passed as arguments). */
json_t *env_record(device *dev, int with_command_line);

/* Parse `json` (ckpt_save_options.frameworks_json: an object of names of
 * 1..64 bytes to version strings or null) and set it as env["frameworks"].
 * Returns CKPT_OK; CKPT_EINVAL naming what is wrong (env unchanged);
 * CKPT_ENOMEM. */
int env_add_frameworks(json_t *env, const char *json);

#endif

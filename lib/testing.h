/* Entry points for libckpt's own tests only.  Not installed, not exported
 * from the shared library: tests link the static build (ckpt_internal_dep). */
#ifndef CKPT_TESTING_H
#define CKPT_TESTING_H

#include "ckpt.h"
#include "fsio.h"

/* ckpt_store_open with every file-system call routed through `fs` (copied).
 * The hook stays in force for the store's whole life, saves included. */
int ckpt_store_open_with_fsio(ckpt_store **out, const char *path,
                              const ckpt_store_options *opts, const fsio *fs);

#endif

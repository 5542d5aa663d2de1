/* validate: checks of caller-supplied tensor descriptors shared by save and
 * restore (names, dtypes, shapes against byte sizes, duplicates). */
#ifndef CKPT_VALIDATE_H
#define CKPT_VALIDATE_H

#include <stddef.h>

#include "ckpt.h"

/* CKPT_EINVAL naming the first bad tensor; `for_restore` only words the
 * message. */
int validate_tensors(const ckpt_tensor *t, size_t count, int for_restore);

#endif

/* jsontext: JSON text from jansson with every real in its shortest exact
 * form.
 *
 * jansson prints all reals of a document with one precision (17 digits by
 * default), so a caller's 0.1 comes back as 0.10000000000000001; a lower
 * precision would change values.  This prints each real with the fewest
 * digits that read back as the same double, as Python's repr() does.
 *
 * A leaf helper (jansson and libc only): the library and the `ckpt` command
 * both compile it in. */
#ifndef CKPT_JSONTEXT_H
#define CKPT_JSONTEXT_H

#include <jansson.h>
#include <stddef.h>

/* json_dumps(v, flags) (any JSON_REAL_PRECISION in flags is ignored) with
 * shortest reals; malloc'd, NULL when out of memory. */
char *jsontext_dumps(const json_t *v, size_t flags);

#endif

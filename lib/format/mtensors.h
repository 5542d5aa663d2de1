/* mtensors: the manifest's tensors array as text.
 *
 * The writer prints the array by hand, one tensor per line without spaces
 * (the rest of the manifest is jansson's JSON_INDENT(2)).  A reader that
 * finds exactly that layout, or the field-per-line layout of JSON_INDENT(2)
 * that earlier versions wrote, scans it back by hand, because jansson takes
 * most of a restart's restore of thousands of tiny tensors to parse it (a
 * value allocated per field); anything else is left to jansson.  The scan
 * accepts a strict subset of what jansson accepts (ASCII names without
 * escapes, canonical integers, every checked field valid), so it never
 * accepts a text that the jansson route refuses or reads differently. */
#ifndef CKPT_MTENSORS_H
#define CKPT_MTENSORS_H

#include <stddef.h>

#include "manifest.h"

/* The array's text, from '[' to ']', for the n tensors `t`.  Returns
 * malloc'd text, NULL when out of memory. */
char *mtensors_text(const manifest_tensor *t, size_t n);

/* Find the root's "tensors" array in the manifest text `text` (len bytes)
 * and read it if it is in the writer's layout.  Returns 1 with *open and
 * *close the offsets of its '[' and ']', *out a malloc'd array of *n
 * tensors (their names in one malloc'd block that starts at the first
 * name; free both with mtensors_free) whose fields passed
 * every check of one tensor except that its shard exists (the caller knows
 * the shards); 0 when the text is not in that layout or a field fails a
 * check (the caller parses the whole text with jansson, which reports it);
 * -1 when out of memory. */
int mtensors_scan(const char *text, size_t len, size_t *open, size_t *close,
                  manifest_tensor **out, size_t *n);

/* Free n tensors from mtensors_scan and the array. */
void mtensors_free(manifest_tensor *t, size_t n);

#endif

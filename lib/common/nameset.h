/* nameset: does a list of names hold one twice?
 *
 * Tensor names must be unique in a save, a restore and a manifest.  A sort
 * of 10,000 names (about 140,000 strcmp) cost a restart's restore more
 * than reading its manifest; a hash set looks at each name about once.
 * The hash is not keyed, so a list built to collide (a hostile manifest)
 * would make probing quadratic: past a bound on the probe length the set
 * gives up and sorts instead, so the worst case stays n log n. */
#ifndef CKPT_NAMESET_H
#define CKPT_NAMESET_H

#include <stddef.h>

/* Looks for a repeat among the n NUL-terminated `names` (none NULL).
 * Returns 0 when all differ; 1 with *repeat set to the index of a name
 * that equals another one (the later of the two when found by hashing,
 * either when found by sorting); -1 when out of memory.  Nothing is
 * copied or kept. */
int nameset_find_repeat(const char *const *names, size_t n, size_t *repeat);

#endif

/* nameset: repeated names by hashing, sorting as the fallback (nameset.h). */
#include "nameset.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_MAX 64 /* a longer run of taken slots: hostile or very unlucky */

/* FNV-1a: names are short, and any spread is enough with the fallback. */
static uint64_t hash_name(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        h = (h ^ *c) * 1099511628211ULL;
    return h ^ (h >> 29);
}


static int cmp_index(const void *a, const void *b, void *arg)
{
    const char *const *names = arg;
    return strcmp(names[*(const size_t *)a], names[*(const size_t *)b]);
}

static int find_by_sorting(const char *const *names, size_t n, size_t *repeat)
{
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return -1;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof *order, cmp_index, (void *)names);
    int found = 0;
    for (size_t i = 1; i < n && !found; i++)
        if (strcmp(names[order[i - 1]], names[order[i]]) == 0) {
            *repeat = order[i];
            found = 1;
        }
    free(order);
    return found;
}

int nameset_find_repeat(const char *const *names, size_t n, size_t *repeat)
{
    if (n < 2)
        return 0;
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    /* slot: index + 1 of the name there (0: free) */
    size_t *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return find_by_sorting(names, n, repeat);
    int found = 0, crowded = 0;
    for (size_t i = 0; i < n && !found && !crowded; i++) {
        size_t at = (size_t)hash_name(names[i]) & (cap - 1);
        for (size_t probes = 0;; probes++, at = (at + 1) & (cap - 1)) {
            if (slot[at] == 0) {
                slot[at] = i + 1;
                break;
            }
            if (strcmp(names[slot[at] - 1], names[i]) == 0) {
                *repeat = i;
                found = 1;
                break;
            }
            if (probes == PROBE_MAX) {
                crowded = 1;
                break;
            }
        }
    }
    free(slot);
    return crowded ? find_by_sorting(names, n, repeat) : found;
}

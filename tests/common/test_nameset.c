/* nameset (lib/common/nameset.h): a repeat is found wherever it lies, by
 * hashing and by the sorting fallback, and none is made up. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nameset.h"

/* n distinct names "p<i>.w" in one block, pointers in *names. */
static char *make(size_t n, const char ***names)
{
    char *block = malloc(n * 24);
    *names = malloc(n * sizeof **names);
    cr_assert(block && *names);
    for (size_t i = 0; i < n; i++) {
        snprintf(block + i * 24, 24, "p%zu.w", i);
        (*names)[i] = block + i * 24;
    }
    return block;
}

Test(nameset, distinct_names_have_no_repeat)
{
    size_t at = 12345;
    cr_assert_eq(nameset_find_repeat(NULL, 0, &at), 0);
    const char *one[] = {"a"};
    cr_assert_eq(nameset_find_repeat(one, 1, &at), 0);
    const char *prefixes[] = {"a", "ab", "abc", "b", "a.b", "a.b.c", "ab.c"};
    cr_assert_eq(nameset_find_repeat(prefixes, 7, &at), 0);
    const char **names;
    char *block = make(20000, &names);
    cr_assert_eq(nameset_find_repeat(names, 20000, &at), 0);
    cr_assert_eq(at, 12345, "untouched when there is none");
    free(names);
    free(block);
}

Test(nameset, a_repeat_anywhere_is_found)
{
    const char **names;
    size_t n = 5000;
    char *block = make(n, &names);
    size_t pairs[][2] = {{0, 1}, {0, 4999}, {2500, 2501}, {4998, 4999}, {17, 3000}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        const char *keep = names[pairs[k][1]];
        char copy[24]; /* the same text at another address */
        strcpy(copy, names[pairs[k][0]]);
        names[pairs[k][1]] = copy;
        size_t at = 0;
        cr_assert_eq(nameset_find_repeat(names, n, &at), 1, "pair %zu", k);
        cr_assert_eq(at, pairs[k][1], "the later of the two (pair %zu)", k);
        names[pairs[k][1]] = keep;
    }
    free(names);
    free(block);
}

/* Names whose hashes all fall on a few slots would make probing quadratic:
 * a long run sends the set to sorting, which still finds the repeat or
 * says there is none. */
Test(nameset, crowded_table_falls_back_to_sorting)
{
    /* The same name in many pointers gives one hash: the first repeat is
     * seen at once.  To crowd the table without a repeat, give every name
     * the same hash by trying candidates until 200 share their slot bits. */
    size_t want = 200, n = 0;
    const char **names = malloc(want * sizeof *names);
    char *block = malloc(want * 24);
    cr_assert(names && block);
    /* the set's hash, as nameset.c computes it (FNV-1a, folded) */
    for (unsigned long long c = 0; n < want; c++) {
        char buf[24];
        snprintf(buf, sizeof buf, "x%llu", c);
        unsigned long long h = 14695981039346656037ULL;
        for (const unsigned char *p = (const unsigned char *)buf; *p; p++)
            h = (h ^ *p) * 1099511628211ULL;
        h ^= h >> 29;
        if ((h & 511) != 7) /* 2 x 200 rounds up to a table of 512 slots */
            continue;
        strcpy(block + n * 24, buf);
        names[n] = block + n * 24;
        n++;
    }
    size_t at = 99999;
    cr_assert_eq(nameset_find_repeat(names, n, &at), 0);
    char copy[24];
    strcpy(copy, names[150]);
    names[3] = copy; /* names[150] and names[3] now equal */
    cr_assert_eq(nameset_find_repeat(names, n, &at), 1);
    cr_assert(at == 3 || at == 150, "at = %zu", at);
    free(names);
    free(block);
}

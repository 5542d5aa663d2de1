/* jsontext: jansson output with every real in its shortest exact form. */
#include "jsontext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_MASK ((size_t)0x1F << 11) /* JSON_REAL_PRECISION's bits */

/* The fewest %g digits that read back as `x`, written as jansson writes
 * reals: always with a '.' or an exponent, exponent without '+' or leading
 * zeros.  Returns the length written. */
static size_t shortest(double x, char out[40])
{
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    size_t n = 0;
    const char *e = strchr(buf, 'e');
    size_t mant = e ? (size_t)(e - buf) : strlen(buf);
    memcpy(out, buf, mant);
    n = mant;
    if (!e) {
        if (!memchr(buf, '.', mant)) {
            memcpy(out + n, ".0", 2);
            n += 2;
        }
    } else {
        out[n++] = 'e';
        const char *q = e + 1;
        if (*q == '+')
            q++;
        else if (*q == '-')
            out[n++] = *q++;
        while (*q == '0' && q[1])
            q++;
        size_t rest = strlen(q);
        memcpy(out + n, q, rest);
        n += rest;
    }
    out[n] = 0;
    return n;
}

static int is_num_char(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' ||
           c == 'E';
}

char *jsontext_dumps(const json_t *v, size_t flags)
{
    char *text = json_dumps(v, (flags & ~PRECISION_MASK) | JSON_REAL_PRECISION(17));
    if (!text)
        return NULL;
    size_t len = strlen(text);
    /* A shortest real is never longer than jansson's 17-digit one, except
     * for the ".0" both append: the output fits in len + 1. */
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    size_t i = 0, o = 0;
    while (i < len) {
        char c = text[i];
        if (c == '"') { /* copy the string, escapes included */
            out[o++] = text[i++];
            while (i < len && text[i] != '"') {
                if (text[i] == '\\' && i + 1 < len)
                    out[o++] = text[i++];
                out[o++] = text[i++];
            }
            if (i < len)
                out[o++] = text[i++];
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            while (j < len && is_num_char(text[j]))
                j++;
            size_t n = j - i;
            int real = 0; /* look within the number only: strcspn would scan on to
                           * the end of the text, quadratic in a large manifest */
            for (size_t k = i; k < j && !real; k++)
                real = text[k] == '.' || text[k] == 'e' || text[k] == 'E';
            if (real) {
                char num[40], s[40];
                if (n < sizeof num) {
                    memcpy(num, text + i, n);
                    num[n] = 0;
                    size_t k = shortest(strtod(num, NULL), s);
                    if (k <= n) {
                        memcpy(out + o, s, k);
                        o += k;
                        i = j;
                        continue;
                    }
                }
            }
            memcpy(out + o, text + i, n);
            o += n;
            i = j;
        } else {
            out[o++] = text[i++];
        }
    }
    out[o] = 0;
    free(text);
    return out;
}

/* jsonscan: a quick check of JSON text that builds no tree (jsonscan.h). */
#include "jsonscan.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct key {
    const unsigned char *s;
    size_t n;
} key;

/* Marks an open array in `open` (an object holds the index of its first
 * key in `keys`). */
#define ARRAY SIZE_MAX

typedef struct scan {
    const unsigned char *p, *end;
    char *out;          /* the compact form, or NULL */
    size_t n;           /* its length so far */
    key *keys;          /* the keys of the open objects, innermost last */
    size_t nkeys, kcap;
    size_t *open;       /* one entry per open container */
    size_t depth, ocap;
} scan;

static int is_ws(unsigned c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_digit(unsigned c)
{
    return c >= '0' && c <= '9';
}

static void skip_ws(scan *s)
{
    while (s->p < s->end && is_ws(*s->p))
        s->p++;
}

/* Copy the bytes from `from` up to s->p into the compact form. */
static void emit_to_here(scan *s, const unsigned char *from)
{
    size_t n = (size_t)(s->p - from);
    if (s->out)
        memcpy(s->out + s->n, from, n);
    s->n += n;
}

static void emit_byte(scan *s)
{
    if (s->out)
        s->out[s->n] = (char)*s->p;
    s->n++;
    s->p++;
}

static int hex_digit(unsigned c)
{
    return is_digit(c) ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
                                        : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
}

/* The length of the valid UTF-8 sequence (2 to 4 bytes) at q, or 0: no
 * overlong forms, no surrogates, nothing above U+10FFFF (what jansson
 * refuses). */
static size_t utf8_len(const unsigned char *q, const unsigned char *end)
{
    unsigned c = q[0], v;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - q) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((q[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (q[i] & 0x3Fu);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    return n;
}

/* The string at s->p (its opening quote).  *escaped: it holds a '\'. */
static int string(scan *s, int *escaped)
{
    const unsigned char *from = s->p, *q = s->p + 1, *end = s->end;
    *escaped = 0;
    while (q < end) {
        unsigned c = *q;
        if (c == '"') {
            s->p = q + 1;
            emit_to_here(s, from);
            return 1;
        }
        if (c < 0x20) {
            return 0; /* a raw control character */
        } else if (c < 0x80 && c != '\\') {
            q++;
        } else if (c >= 0x80) {
            size_t k = utf8_len(q, end);
            if (!k)
                return 0;
            q += k;
        } else {
            *escaped = 1;
            if (end - q < 2)
                return 0;
            c = q[1];
            if (c == 'u') {
                unsigned v = 0;
                if (end - q < 6)
                    return 0;
                for (int i = 2; i < 6; i++) {
                    int h = hex_digit(q[i]);
                    if (h < 0)
                        return 0;
                    v = v * 16 + (unsigned)h;
                }
                /* \u0000 (jansson refuses it) and surrogates (a pair must
                 * be checked as one): left to jansson */
                if (v == 0 || (v >= 0xD800 && v <= 0xDFFF))
                    return 0;
                q += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' ||
                       c == 'n' || c == 'r' || c == 't') {
                q += 2;
            } else {
                return 0;
            }
        }
    }
    return 0;
}

/* The number at s->p.  Integers of at most 18 digits always fit jansson's
 * json_int_t (64 bits); a real below 10^307 never overflows (underflow
 * jansson accepts). */
static int number(scan *s)
{
    const unsigned char *from = s->p, *q = s->p, *end = s->end;
    if (q < end && *q == '-')
        q++;
    if (q >= end || !is_digit(*q))
        return 0;
    long digits = 0, exp = 0;
    if (*q == '0') {
        q++;
        digits = 1;
    } else {
        while (q < end && is_digit(*q)) {
            q++;
            digits++;
        }
    }
    int real = 0;
    if (q < end && *q == '.') {
        real = 1;
        if (++q >= end || !is_digit(*q))
            return 0;
        while (q < end && is_digit(*q))
            q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        real = 1;
        int neg = 0;
        if (++q < end && (*q == '+' || *q == '-'))
            neg = *q++ == '-';
        if (q >= end || !is_digit(*q))
            return 0;
        while (q < end && is_digit(*q)) {
            if (exp < 100000)
                exp = exp * 10 + (*q - '0');
            q++;
        }
        if (neg)
            exp = -exp;
    }
    if (real ? digits + (exp > 0 ? exp : 0) > 307 : digits > 18)
        return 0;
    s->p = q;
    emit_to_here(s, from);
    return 1;
}

static int literal(scan *s)
{
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(s->end - s->p) >= n && memcmp(s->p, words[i], n) == 0) {
            const unsigned char *from = s->p;
            s->p += n;
            emit_to_here(s, from);
            return 1;
        }
    }
    return 0;
}

static int grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *g = realloc(*arr, c * size);
    if (!g)
        return -1;
    *arr = g;
    *cap = c;
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    const key *x = a, *y = b;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return memcmp(x->s, y->s, x->n);
}

/* Whether two of the n keys are the same (jansson refuses that). */
static int repeated(key *k, size_t n)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (!cmp_key(&k[i], &k[j]))
                    return 1;
        return 0;
    }
    qsort(k, n, sizeof *k, cmp_key); /* the keys are dropped next */
    for (size_t i = 1; i < n; i++)
        if (!cmp_key(&k[i], &k[i - 1]))
            return 1;
    return 0;
}

/* One value, iteratively (a deep document must not use deep C stack). */
static int run(scan *s, size_t max_depth)
{
    int escaped;
value:
    skip_ws(s);
    if (s->p >= s->end || s->depth + 1 > max_depth)
        return 0;
    switch (*s->p) {
    case '{':
    case '[': {
        int obj = *s->p == '{';
        if (grow((void **)&s->open, &s->ocap, s->depth + 1, sizeof *s->open))
            return -1;
        s->open[s->depth++] = obj ? s->nkeys : ARRAY;
        emit_byte(s);
        skip_ws(s);
        if (s->p < s->end && *s->p == (obj ? '}' : ']')) {
            emit_byte(s);
            s->depth--;
            goto after;
        }
        if (obj)
            goto key;
        goto value;
    }
    case '"':
        if (!string(s, &escaped))
            return 0;
        goto after;
    case 't':
    case 'f':
    case 'n':
        if (!literal(s))
            return 0;
        goto after;
    default:
        if (!number(s))
            return 0;
        goto after;
    }
key:
    skip_ws(s);
    if (s->p >= s->end || *s->p != '"')
        return 0;
    {
        const unsigned char *k = s->p;
        /* A key with an escape could equal another written otherwise. */
        if (!string(s, &escaped) || escaped)
            return 0;
        if (grow((void **)&s->keys, &s->kcap, s->nkeys + 1, sizeof *s->keys))
            return -1;
        s->keys[s->nkeys++] = (key){k + 1, (size_t)(s->p - k) - 2};
    }
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':')
        return 0;
    emit_byte(s);
    goto value;
after:
    if (s->depth == 0)
        return 1;
    skip_ws(s);
    if (s->p >= s->end)
        return 0;
    {
        size_t first = s->open[s->depth - 1];
        if (*s->p == ',') {
            emit_byte(s);
            if (first == ARRAY)
                goto value;
            goto key;
        }
        if (*s->p != (first == ARRAY ? ']' : '}'))
            return 0;
        if (first != ARRAY) {
            if (repeated(s->keys + first, s->nkeys - first))
                return 0;
            s->nkeys = first;
        }
        emit_byte(s);
        s->depth--;
        goto after;
    }
}

int jsonscan_value(const char *text, size_t len, size_t max_depth, char *out,
                   size_t *out_len, size_t *end)
{
    scan s = {.p = (const unsigned char *)text, .end = (const unsigned char *)text + len,
              .out = out};
    int rc = run(&s, max_depth);
    free(s.keys);
    free(s.open);
    if (rc == 1) {
        *end = (size_t)((const char *)s.p - text);
        if (out_len)
            *out_len = s.n;
    }
    return rc;
}

int jsonscan_whole(const char *text, size_t len, size_t max_depth, char **out)
{
    *out = malloc(len + 1);
    if (!*out)
        return -1;
    size_t n = 0, end = 0;
    int rc = jsonscan_value(text, len, max_depth, *out, &n, &end);
    while (rc == 1 && end < len && is_ws((unsigned char)text[end]))
        end++;
    if (rc == 1 && end != len)
        rc = 0; /* more than one value: jansson says so */
    if (rc != 1) {
        free(*out);
        *out = NULL;
        return rc;
    }
    (*out)[n] = '\0';
    return 1;
}

long jsonscan_depth_at(const char *text, size_t len)
{
    long depth = 0;
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (in_string) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_string = 0;
        } else if (ch == '"') {
            in_string = 1;
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            depth--;
        }
    }
    return in_string ? -1 : depth;
}

size_t jsonscan_tally(const char *text, size_t len, size_t *containers)
{
    size_t commas = 0, opened = 0, empty = 0;
    char last = 0; /* the previous character outside strings and whitespace */
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r')
            continue;
        if ((ch == ']' && last == '[') || (ch == '}' && last == '{'))
            empty++; /* "[]" holds no value, though one was counted for it */
        last = ch;
        if (ch == '"') { /* skip the string: its bytes are no values */
            for (;;) { /* to the next quote not escaped (memchr: names are most of it) */
                const char *q = memchr(text + i + 1, '"', len - i - 1);
                if (!q) {
                    i = len;
                    break;
                }
                i = (size_t)(q - text);
                size_t slashes = 0;
                while (text[i - 1 - slashes] == '\\')
                    slashes++;
                if (slashes % 2 == 0)
                    break;
            }
        } else if (ch == ',') {
            commas++;
        } else if (ch == '[' || ch == '{') {
            opened++;
        }
    }
    *containers = opened;
    return commas + opened + 1 - empty;
}

/* mtensors: the manifest's tensors array, printed and scanned by hand (see
 * mtensors.h for why, and for what the scan promises). */
#include "mtensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsonscan.h"
#include "util.h"

/* ------------------------------------------------------------- printing */

/* A growing text buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} textbuf;

static int tb_put(textbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static int tb_str(textbuf *b, const char *s)
{
    return tb_put(b, s, strlen(s));
}

/* A decimal integer, as "%lld" prints it (printf per field made the
 * tensors array most of the cost of encoding the manifest). */
static int tb_int(textbuf *b, long long v)
{
    char tmp[24], *p = tmp + sizeof tmp;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do
        *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0)
        *--p = '-';
    return tb_put(b, p, (size_t)(tmp + sizeof tmp - p));
}

/* A JSON string as jansson prints it: plain names as they are, the rare
 * ones that need escapes through jansson itself. */
static int tb_json_string(textbuf *b, const char *s)
{
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c == '"' || *c == '\\' || *c < 0x20) {
            json_t *v = json_string(s);
            char *t = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
            json_decref(v);
            int rc = t ? tb_str(b, t) : -1;
            free(t);
            return rc;
        }
    return tb_put(b, "\"", 1) || tb_str(b, s) || tb_put(b, "\"", 1) ? -1 : 0;
}

/* The layouts, shared by the printer and the scanner.  The writer prints
 * one tensor per line without spaces (LINE); checkpoints written before
 * did as jansson's JSON_INDENT(2) (INDENT), a field per line, which made
 * the manifest of 10,000 tiny tensors 1.9 MB instead of 1.0 MB. */
typedef struct {
    const char *s;
    size_t n;
} piece;
#define PIECE(text) {text, sizeof(text) - 1}

typedef struct {
    piece elem_head, after_name, after_dtype, dim_sep, shape_end, bytes_key, shard_key,
        chunks_key, stored_key, elem_end;
} layout;

static const layout LINE = {
    PIECE("\n    {\"name\":"), PIECE(",\"dtype\":\""), PIECE("\",\"shape\":"), PIECE(""),
    PIECE("]"), PIECE(",\"bytes\":"), PIECE(",\"shard\":"), PIECE(",\"chunks\":"),
    PIECE(",\"stored_bytes\":"), PIECE("}")};
static const layout INDENT = {
    PIECE("\n    {\n      \"name\": "), PIECE(",\n      \"dtype\": \""),
    PIECE("\",\n      \"shape\": "), PIECE("\n        "), PIECE("\n      ]"),
    PIECE(",\n      \"bytes\": "), PIECE(",\n      \"shard\": "),
    PIECE(",\n      \"chunks\": "), PIECE(",\n      \"stored_bytes\": "),
    PIECE("\n    }")};
#define ARRAY_END "\n  ]"
/* The root's member, as the root object is printed (two spaces in). */
#define ROOT_KEY "\n  \"tensors\": ["

static int tb_piece(textbuf *b, piece p)
{
    return tb_put(b, p.s, p.n);
}

char *mtensors_text(const manifest_tensor *tensors, size_t n)
{
    const layout *L = &LINE;
    textbuf b = {0};
    int bad = tb_str(&b, "[");
    for (size_t i = 0; i < n && !bad; i++) {
        const manifest_tensor *t = &tensors[i];
        bad |= (i && tb_str(&b, ",")) || tb_piece(&b, L->elem_head) ||
               tb_json_string(&b, t->name) || tb_piece(&b, L->after_name) ||
               tb_str(&b, ckpt_dtype_name(t->dtype)) || tb_piece(&b, L->after_dtype) ||
               tb_str(&b, t->ndim ? "[" : "[]");
        for (int d = 0; d < t->ndim && !bad; d++)
            bad |= (d && tb_str(&b, ",")) || tb_piece(&b, L->dim_sep) ||
                   tb_int(&b, (long long)t->shape[d]);
        if (t->ndim && !bad)
            bad |= tb_piece(&b, L->shape_end);
        bad |= tb_piece(&b, L->bytes_key) || tb_int(&b, (long long)t->bytes) ||
               tb_piece(&b, L->shard_key) || tb_int(&b, (long long)t->shard) ||
               tb_piece(&b, L->chunks_key) || tb_int(&b, (long long)t->chunks) ||
               tb_piece(&b, L->stored_key) || tb_int(&b, (long long)t->stored_bytes) ||
               tb_piece(&b, L->elem_end);
    }
    bad = bad || tb_str(&b, n ? ARRAY_END : "]");
    if (bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------- scanning */

typedef struct {
    const char *p, *end;
} cursor;

/* Consume the literal `s` (n bytes) if it is next. */
static int lit(cursor *c, const char *s, size_t n)
{
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0)
        return 0;
    c->p += n;
    return 1;
}
#define LIT(c, s) lit((c), (s), sizeof(s) - 1)
#define PUT(c, p) lit((c), (p).s, (p).n)

/* A non-negative integer as jansson reads one: no leading zero, within
 * json_int_t (what follows must be a literal of the layout, so "1.5" or
 * "1e3", which jansson reads as reals, never match). */
static int num(cursor *c, uint64_t *v)
{
    const char *s = c->p;
    if (s == c->end || *s < '0' || *s > '9' ||
        (*s == '0' && s + 1 < c->end && s[1] >= '0' && s[1] <= '9'))
        return 0;
    uint64_t x = 0;
    int digits = 0;
    for (; s < c->end && *s >= '0' && *s <= '9'; s++) {
        if (++digits > 19) /* 19 nines still fit in 64 bits */
            return 0;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    if (x > (uint64_t)INT64_MAX)
        return 0;
    *v = x;
    c->p = s;
    return 1;
}

/* A quoted string of printable ASCII without escapes, 1..max bytes, into
 * buf (max + 1 bytes).  Returns its length, 0 if it is anything else. */
static size_t plain_string(cursor *c, char *buf, size_t max)
{
    if (!LIT(c, "\""))
        return 0;
    const char *s = c->p;
    size_t n = 0;
    for (; s < c->end && *s != '"'; s++, n++)
        if (n == max || *s < 0x20 || *s > 0x7e || *s == '\\')
            return 0;
    if (s == c->end || n == 0)
        return 0;
    memcpy(buf, c->p, n);
    buf[n] = '\0';
    c->p = s + 1;
    return n;
}

/* Every name of a scan in one block (10,000 allocations of a few bytes
 * cost a restart's restore more than its manifest's checks), and where
 * each starts: t->name is set once the block stops moving. */
typedef struct name_block {
    char *block;
    size_t used, cap;
    size_t *at; /* per tensor */
} name_block;

/* Append `name` (and its NUL) as the next tensor's; 0 when out of memory. */
static int names_add(name_block *nm, const char *name)
{
    size_t n = strlen(name) + 1;
    if (nm->used + n > nm->cap) {
        size_t cap = nm->cap ? 2 * nm->cap : 4096;
        while (cap < nm->used + n)
            cap *= 2;
        char *g = realloc(nm->block, cap);
        if (!g)
            return 0;
        nm->block = g;
        nm->cap = cap;
    }
    memcpy(nm->block + nm->used, name, n);
    nm->used += n;
    return 1;
}

/* One element, checked as decode_tensor checks it (but for its shard); its
 * name goes into `names`. */
static int scan_one(cursor *c, const layout *L, manifest_tensor *t, name_block *names)
{
    char name[CKPT_NAME_MAX + 1], dtype[16];
    uint64_t v, bytes;
    if (!PUT(c, L->elem_head) || !plain_string(c, name, CKPT_NAME_MAX) ||
        !PUT(c, L->after_name))
        return 0;
    /* AFTER_NAME ends with the dtype's opening quote, AFTER_DTYPE starts
     * with its closing one. */
    const char *q = c->p;
    size_t dn = 0;
    while (q < c->end && dn < sizeof dtype - 1 &&
           ((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '_'))
        dtype[dn++] = *q++;
    dtype[dn] = '\0';
    c->p = q;
    if (!dn || (t->dtype = ckpt_dtype_from_name(dtype)) == CKPT_DTYPE_INVALID ||
        !PUT(c, L->after_dtype))
        return 0;
    t->ndim = 0;
    if (!LIT(c, "[]")) {
        if (!LIT(c, "["))
            return 0;
        do {
            if (t->ndim == CKPT_MAX_DIMS || !PUT(c, L->dim_sep) || !num(c, &v) ||
                v > (uint64_t)INT64_MAX)
                return 0;
            t->shape[t->ndim++] = (int64_t)v;
        } while (LIT(c, ","));
        if (!PUT(c, L->shape_end))
            return 0;
    }
    if (!PUT(c, L->bytes_key) || !num(c, &t->bytes) ||
        !util_shape_bytes(t->shape, t->ndim, ckpt_dtype_size(t->dtype), &bytes) ||
        bytes != t->bytes ||
        !PUT(c, L->shard_key) || !num(c, &v) || v >= 65536 || !PUT(c, L->chunks_key) ||
        !num(c, &t->chunks) || !PUT(c, L->stored_key) || !num(c, &t->stored_bytes) ||
        !PUT(c, L->elem_end))
        return 0;
    t->shard = (uint32_t)v;
    return names_add(names, name) ? 1 : -1;
}

void mtensors_free(manifest_tensor *t, size_t n)
{
    if (t && n > 0)
        free(t[0].name); /* the block of all names */
    free(t);
}

int mtensors_scan(const char *text, size_t len, size_t *open, size_t *close,
                  manifest_tensor **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    const char *at = memmem(text, len, ROOT_KEY, sizeof ROOT_KEY - 1);
    /* The key must be the root object's own: one level down. */
    if (!at || jsonscan_depth_at(text, (size_t)(at - text)) != 1)
        return 0;
    cursor c = {at + sizeof ROOT_KEY - 1, text + len};
    size_t cap = 0, cnt = 0;
    manifest_tensor *t = NULL;
    name_block nm = {0};
    /* The first element tells the layout: an old checkpoint's, or ours. */
    const layout *L = lit(&(cursor){c.p, c.end}, INDENT.elem_head.s, INDENT.elem_head.n)
                          ? &INDENT : &LINE;
    int rc = 1;
    do {
        if (cnt == cap) {
            cap = cap ? 2 * cap : 256;
            manifest_tensor *g = realloc(t, cap * sizeof *t);
            size_t *a = g ? realloc(nm.at, cap * sizeof *nm.at) : NULL;
            if (g)
                t = g;
            if (!a) {
                rc = -1;
                break;
            }
            nm.at = a;
        }
        memset(&t[cnt], 0, sizeof t[cnt]);
        nm.at[cnt] = nm.used;
        rc = scan_one(&c, L, &t[cnt], &nm);
        if (rc == 1)
            cnt++;
    } while (rc == 1 && LIT(&c, ","));
    if (rc == 1 && !LIT(&c, ARRAY_END))
        rc = 0;
    for (size_t i = 0; rc == 1 && i < cnt; i++)
        t[i].name = nm.block + nm.at[i]; /* the first is the block itself */
    free(nm.at);
    if (rc != 1 || cnt == 0)
        free(nm.block);
    if (rc != 1) {
        free(t);
        return rc;
    }
    *open = (size_t)(at - text) + sizeof ROOT_KEY - 2;
    *close = (size_t)(c.p - text) - 1;
    *out = t;
    *n = cnt;
    return 1;
}

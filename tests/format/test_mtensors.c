/* mtensors (lib/format/mtensors.c): a manifest's tensors array in the
 * writer's layout (a tensor per line), or in the layout of checkpoints
 * written before (a field per line), is scanned by hand instead of by
 * jansson.  The decode
 * must give exactly what jansson alone gives (manifest_decode_reference):
 * the same manifest, or the same status and message, for the writer's
 * texts, for hand-made hostile ones, and for many thousands of random
 * edits of a valid one (re-sealed with a valid checksum, as a hostile
 * co-tenant could). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "codec.h"
#include "manifest.h"
#include "mtensors.h"
#include "util.h"

#define SEAL_HEAD ",\n  \"checksum\": \""
#define SEAL_TAIL "\"\n}\n"

/* A manifest of n tensors with ASCII names and up to 3 dimensions. */
static void fill(manifest *m, size_t n)
{
    memset(m, 0, sizeof *m);
    m->step = 12;
    memcpy(m->id, "fedcba9876543210", SHARD_ID_SIZE);
    m->chunk_bytes = 1u << 20;
    m->level = 1;
    m->tensors = calloc(n ? n : 1, sizeof *m->tensors);
    m->ntensors = n;
    for (size_t i = 0; i < n; i++) {
        manifest_tensor *t = &m->tensors[i];
        char name[32];
        snprintf(name, sizeof name, "layer.%zu.w", i);
        t->name = strdup(name);
        t->dtype = i % 3 ? CKPT_F32 : CKPT_BF16;
        t->ndim = (int)(i % 4);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (uint64_t)(t->shape[d] = (int64_t)(d + 3 + i));
        t->bytes = numel * ckpt_dtype_size(t->dtype);
        t->shard = (uint32_t)(i % 2);
        t->chunks = 1 + i % 2;
        t->stored_bytes = t->bytes / 2 + i;
    }
    m->shards = calloc(2, sizeof *m->shards);
    m->nshards = 2;
    m->shards[0].file = strdup("rank-00000.shard");
    m->shards[1].file = strdup("rank-00001.shard");
    m->world_size = 2;
    m->env = json_pack("{s:s}", "host", "h");
    m->metadata = strdup("{\"tensors\":[\"layer.0.w\"]}");
}

/* text without its seal (the body), sealed again: a valid checksum. */
static char *reseal(const char *body, size_t blen, size_t *len)
{
    const size_t head = sizeof SEAL_HEAD - 1, tail = sizeof SEAL_TAIL - 1;
    char *out = malloc(blen + head + 16 + tail + 1);
    cr_assert_not_null(out);
    memcpy(out, body, blen);
    memcpy(out + blen, SEAL_HEAD, head);
    util_hex64(codec_hash(body, blen), out + blen + head);
    memcpy(out + blen + head + 16, SEAL_TAIL, tail + 1);
    *len = blen + head + 16 + tail;
    return out;
}

static size_t body_len(size_t len)
{
    return len - (sizeof SEAL_HEAD - 1) - 16 - (sizeof SEAL_TAIL - 1);
}

/* Two metadata texts of the same JSON value (NULL: null). */
static void same_json_text(const char *a, const char *b)
{
    json_t *x = json_loads(a ? a : "null", JSON_DECODE_ANY, NULL);
    json_t *y = json_loads(b ? b : "null", JSON_DECODE_ANY, NULL);
    cr_assert(x && y && json_equal(x, y), "metadata %s and %s differ", a, b);
    json_decref(x);
    json_decref(y);
}

static void same_manifest(const manifest *a, const manifest *b)
{
    cr_assert_eq(a->step, b->step);
    cr_assert_eq(memcmp(a->id, b->id, SHARD_ID_SIZE), 0);
    cr_assert_eq(a->ntensors, b->ntensors);
    cr_assert_eq(a->nshards, b->nshards);
    cr_assert_eq(a->world_size, b->world_size);
    cr_assert(json_equal(a->env, b->env));
    same_json_text(a->metadata, b->metadata);
    for (size_t i = 0; i < a->ntensors; i++) {
        const manifest_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        cr_assert_str_eq(x->name, y->name);
        cr_assert(x->dtype == y->dtype && x->ndim == y->ndim && x->bytes == y->bytes &&
                  x->shard == y->shard && x->chunks == y->chunks &&
                  x->stored_bytes == y->stored_bytes, "tensor %zu differs", i);
        for (int d = 0; d < x->ndim; d++)
            cr_assert_eq(x->shape[d], y->shape[d]);
    }
}

/* Decode both ways; they must agree.  Returns the status. */
static int agree(const char *text, size_t len)
{
    manifest q, r;
    int rq = manifest_decode(text, len, "t", &q);
    char mq[1100];
    snprintf(mq, sizeof mq, "%s", ckpt_error_last());
    int rr = manifest_decode_reference(text, len, "t", &r);
    cr_assert_eq(rq, rr, "quick %d (%s), jansson %d (%s) for:\n%.*s", rq, mq, rr,
                 ckpt_error_last(), (int)len, text);
    if (rq == CKPT_OK)
        same_manifest(&q, &r);
    else
        cr_assert_str_eq(mq, ckpt_error_last());
    manifest_clear(&q);
    manifest_clear(&r);
    return rq;
}

static char *encode(const manifest *m, size_t *len)
{
    char *text;
    cr_assert_eq(manifest_encode(m, &text, len), CKPT_OK, "%s", ckpt_error_last());
    return text;
}

/* The same manifest in the layout checkpoints were written in before:
 * all of it as jansson's JSON_INDENT(2), a field per line. */
static char *legacy(const char *text, size_t len, size_t *out_len)
{
    json_t *root = json_loadb(text, len, 0, NULL);
    cr_assert_not_null(root);
    json_object_del(root, "checksum");
    char *body = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    size_t blen = body ? strlen(body) : 0;
    cr_assert(blen > 2 && strcmp(body + blen - 2, "\n}") == 0);
    char *out = reseal(body, blen - 2, out_len); /* the seal closes the root */
    free(body);
    json_decref(root);
    return out;
}

Test(mtensors, writer_text_is_scanned_and_agrees)
{
    for (size_t n = 1; n <= 9; n += 4) {
        manifest m;
        fill(&m, n);
        size_t len, open, close, got;
        char *text = encode(&m, &len);
        cr_assert(strstr(text, "\n    {\"name\":\"layer.0.w\",\"dtype\":"),
                  "not a tensor per line:\n%s", text);
        for (int old = 0; old < 2; old++) {
            size_t olen;
            char *o = old ? legacy(text, len, &olen) : NULL;
            const char *x = old ? o : text;
            size_t xlen = old ? olen : len;
            manifest_tensor *t;
            cr_assert_eq(mtensors_scan(x, xlen, &open, &close, &t, &got), 1,
                         "the %s layout is not scanned", old ? "old" : "writer's");
            cr_assert_eq(got, n);
            cr_assert(x[open] == '[' && x[close] == ']');
            for (size_t i = 0; i < n; i++)
                cr_assert_str_eq(t[i].name, m.tensors[i].name);
            manifest back;
            cr_assert_eq(manifest_decode(x, xlen, "t", &back), CKPT_OK, "%s",
                         ckpt_error_last());
            same_manifest(&back, &m);
            cr_assert_eq(agree(x, xlen), CKPT_OK);
            mtensors_free(t, got);
            manifest_clear(&back);
            free(o);
        }
        manifest_clear(&m);
        free(text);
    }
}

/* Names that need escapes or are not ASCII go the jansson route. */
Test(mtensors, other_names_go_to_jansson)
{
    const char *names[] = {"a\"b", "back\\slash", "nl\nx", "\xc3\xa9t\xc3\xa9", "del\x7f"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        manifest m;
        fill(&m, 3);
        free(m.tensors[1].name);
        m.tensors[1].name = strdup(names[k]);
        size_t len, open, close, got;
        char *text = encode(&m, &len);
        manifest_tensor *t;
        cr_assert_eq(mtensors_scan(text, len, &open, &close, &t, &got), 0, "name %zu", k);
        size_t olen;
        char *o = legacy(text, len, &olen);
        cr_assert_eq(mtensors_scan(o, olen, &open, &close, &t, &got), 0, "old, name %zu", k);
        agree(o, olen);
        free(o);
        manifest back;
        cr_assert_eq(manifest_decode(text, len, "t", &back), CKPT_OK, "%s", ckpt_error_last());
        same_manifest(&back, &m);
        agree(text, len);
        manifest_clear(&back);
        manifest_clear(&m);
        free(text);
    }
}

/* The body of text with `from` replaced by `to` (the first occurrence at
 * or after `after`), sealed again. */
static char *edit(const char *text, size_t len, const char *from, const char *to,
                  const char *after, size_t *out_len)
{
    size_t blen = body_len(len);
    const char *start = after ? strstr(text, after) : text;
    cr_assert_not_null(start, "no '%s'", after);
    const char *at = strstr(start, from);
    cr_assert(at && (size_t)(at - text) < blen, "no '%s'", from);
    size_t a = (size_t)(at - text), fl = strlen(from), tl = strlen(to);
    char *body = malloc(blen - fl + tl + 1);
    memcpy(body, text, a);
    memcpy(body + a, to, tl);
    memcpy(body + a + tl, text + a + fl, blen - a - fl);
    char *out = reseal(body, blen - fl + tl, out_len);
    free(body);
    return out;
}

/* `s` without the space after each ':' and ',' (the writer's spacing of
 * a tensor's fields). */
static char *compact(const char *s)
{
    char *out = strdup(s), *w = out;
    for (const char *r = s; *r; r++) {
        *w++ = *r;
        if ((*r == ':' || *r == ',') && r[1] == ' ')
            r++;
    }
    *w = '\0';
    return out;
}

Test(mtensors, hostile_edits_agree_with_jansson)
{
    manifest m;
    fill(&m, 5);
    size_t len;
    char *text = encode(&m, &len);
    static const struct {
        const char *from, *to, *after;
        int ok; /* what both routes must say */
    } cases[] = {
        {"\"bytes\": 16", "\"bytes\": 016", "layer.1", CKPT_ECORRUPT},     /* leading zero */
        {"\"chunks\": 1", "\"chunks\": 99999999999999999999", NULL, CKPT_ECORRUPT},
        {"\"chunks\": 1", "\"chunks\": 9223372036854775807", NULL, CKPT_OK},
        {"\"chunks\": 1", "\"chunks\": 9223372036854775808", NULL, CKPT_ECORRUPT},
        {"\"chunks\": 1", "\"chunks\": 9999999999999999999", NULL, CKPT_ECORRUPT},
        {"\"chunks\": 1", "\"chunks\": 1.0", NULL, CKPT_ECORRUPT},         /* a real */
        {"\"chunks\": 1", "\"chunks\": -1", NULL, CKPT_ECORRUPT},
        {"\"shard\": 1", "\"shard\": 2", NULL, CKPT_ECORRUPT},             /* no shard 2 */
        {"\"shard\": 1", "\"shard\": 4294967297", NULL, CKPT_ECORRUPT},
        {"\"dtype\": \"float32\"", "\"dtype\": \"float33\"", NULL, CKPT_ECORRUPT},
        {"\"bytes\": 16", "\"bytes\": 17", "layer.1", CKPT_ECORRUPT},      /* not its shape */
        {"\"name\": \"layer.2.w\"", "\"name\": \"layer.1.w\"", NULL, CKPT_ECORRUPT}, /* twice */
        {"\"name\": \"layer.2.w\"", "\"name\": \"\"", NULL, CKPT_ECORRUPT},
        {"\"name\": \"layer.2.w\"", "\"name\": \"la\xffyer\"", NULL, CKPT_ECORRUPT}, /* UTF-8 */
        {"\"name\": \"layer.2.w\"", "\"name\": \"l\\u0061yer\"", NULL, CKPT_OK},
        {"\"name\": \"layer.2.w\"", "\"name\": \"x\", \"name\": \"y\"", NULL, CKPT_ECORRUPT},
        {"\"stored_bytes\"", "\"stored\"", NULL, CKPT_ECORRUPT},
        {"\"chunks\"", " \"chunks\"", NULL, CKPT_OK},                    /* other spacing */
        {"\n  ],\n  \"shards\"", "\n  ],\n  \"tensors\": [],\n  \"shards\"", NULL,
         CKPT_ECORRUPT},                                                  /* key twice */
        /* a "tensors" key one level down first: the root's is the empty one */
        {"\n  \"save\": {", "\n  \"save\": {\n  \"tensors\": [\n    {\n      \"name\": "
         "\"ghost\",\n      \"dtype\": \"uint8\",\n      \"shape\": [],\n      \"bytes\": 1,"
         "\n      \"shard\": 0,\n      \"chunks\": 1,\n      \"stored_bytes\": 1\n    }\n  ],",
         NULL, CKPT_OK},
        /* ...and inside a string (escaped, so not a key at all) */
        {"\"format\": \"libckpt\"", "\"format\": \"libckpt\", \"x\": \"\\n  \\\"tensors\\\": [\"",
         NULL, CKPT_OK},
    };
    size_t olen;
    char *old = legacy(text, len, &olen);
    for (size_t k = 0; k < 2 * (sizeof cases / sizeof *cases); k++) {
        size_t c = k / 2, elen;
        char *e;
        if (k % 2) { /* the old layout: the cases as written */
            e = edit(old, olen, cases[c].from, cases[c].to, cases[c].after, &elen);
        } else { /* the writer's: in its spacing where a tensor's field is meant */
            char *from = compact(cases[c].from), *to = compact(cases[c].to);
            int inside = strstr(text, from) != NULL;
            e = edit(text, len, inside ? from : cases[c].from, inside ? to : cases[c].to,
                     cases[c].after, &elen);
            free(from);
            free(to);
        }
        int rc = agree(e, elen);
        cr_assert_eq(rc, cases[c].ok, "case %zu (%s layout): status %d (%s)", c,
                     k % 2 ? "old" : "writer's", rc, ckpt_error_last());
        free(e);
    }
    free(old);
    manifest_clear(&m);
    free(text);
}

/* A "tensors" array one level down first, the root's own array empty:
 * the decode must find no tensors (the root's), not the nested ones. */
Test(mtensors, nested_key_is_not_the_roots)
{
    manifest m;
    fill(&m, 2);
    size_t len, l1, l2;
    char *text = encode(&m, &len);
    const char *open = strstr(text, "\n  \"tensors\": [");
    const char *close = strstr(open, "\n  ],\n  \"shards\"");
    cr_assert(open && close);
    char *arr = strndup(open, (size_t)(close + 4 - open)); /* up to the ']' */
    char *empty = edit(text, len, arr, "\n  \"tensors\": []", NULL, &l1);
    char *ins = malloc(strlen(arr) + 32);
    sprintf(ins, "\n  \"save\": {%s,", arr);
    char *final = edit(empty, l1, "\n  \"save\": {", ins, NULL, &l2);
    size_t o, c, got;
    manifest_tensor *t;
    cr_assert_eq(mtensors_scan(final, l2, &o, &c, &t, &got), 0, "scanned a nested array");
    manifest back;
    cr_assert_eq(manifest_decode(final, l2, "t", &back), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(back.ntensors, 0, "took the nested array for the root's");
    manifest_clear(&back);
    agree(final, l2);
    free(final);
    free(ins);
    free(empty);
    free(arr);
    manifest_clear(&m);
    free(text);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random edits of `text`, mostly inside its tensors array: both routes
 * agree on every one, and enough of them stay valid to exercise
 * acceptance. */
static void random_edits(const char *text, size_t len, const char *which)
{
    size_t blen = body_len(len);
    const char *arr = strstr(text, "\n  \"tensors\": [");
    size_t a0 = (size_t)(arr - text), a1 = (size_t)(strstr(arr, "\n  ]") - text) + 4;
    static const char alphabet[] = "0123456789\"\\,:[]{} \n.-eaz\x7f\x80\xc3\x01";
    size_t ok = 0, scanned = 0, runs = 10000;
    char *body = malloc(blen + 8);
    for (size_t r = 0; r < runs; r++) {
        memcpy(body, text, blen);
        size_t bl = blen;
        int edits = 1 + (int)(next() % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = next() % 8 ? a0 + next() % (a1 - a0) : next() % bl;
            at = at < bl ? at : bl - 1;
            char ch = alphabet[next() % (sizeof alphabet - 1)];
            switch (next() % 3) {
            case 0: body[at] = ch; break;
            case 1: /* insert */
                memmove(body + at + 1, body + at, bl - at);
                body[at] = ch;
                bl++;
                break;
            default: /* delete */
                memmove(body + at, body + at + 1, bl - at - 1);
                bl--;
            }
            if (bl > blen + 4 || bl < blen - 4)
                break;
        }
        size_t elen;
        char *e = reseal(body, bl, &elen);
        size_t o, c, got;
        manifest_tensor *t;
        if (mtensors_scan(e, elen, &o, &c, &t, &got) == 1) {
            scanned++;
            mtensors_free(t, got);
        }
        if (agree(e, elen) == CKPT_OK)
            ok++;
        free(e);
    }
    /* Edits of a digit keep the layout: some must be scanned and accepted. */
    cr_assert(scanned > runs / 50, "%s layout: only %zu of %zu edited texts were scanned",
              which, scanned, runs);
    cr_assert(ok > runs / 100, "%s layout: only %zu of %zu edited texts were valid", which,
              ok, runs);
    free(body);
}

/* In the writer's layout and in the old one. */
Test(mtensors, random_edits_agree_with_jansson, .timeout = 240)
{
    manifest m;
    fill(&m, 6);
    size_t len, olen;
    char *text = encode(&m, &len);
    char *old = legacy(text, len, &olen);
    random_edits(text, len, "writer's");
    random_edits(old, olen, "old");
    free(old);
    manifest_clear(&m);
    free(text);
}

/* "[[],[],...]" of `containers` arrays in all (the outer one included). */
static char *empty_arrays(size_t containers)
{
    char *s = malloc(3 * containers + 1), *o = s;
    *o++ = '[';
    for (size_t i = 1; i < containers; i++)
        o += sprintf(o, "[]%s", i + 1 < containers ? "," : "");
    strcpy(o, "]");
    return s;
}

/* A tree costs a reader far more than its bytes ("[[],[],...]": ~280 bytes
 * of jansson's per 3 of text): a manifest holding more values or arrays
 * than any writer makes is refused on both routes before a tree is built,
 * wherever they are (the caller's metadata, or the environment, which
 * jansson reads on every route); what a writer may store still reads. */
Test(mtensors, values_beyond_what_a_writer_makes_are_refused)
{
    for (int where = 0; where < 3; where++) {
        manifest m;
        fill(&m, 5);
        size_t n = where == 2 ? MANIFEST_META_MAX_CONTAINERS : MANIFEST_MAX_CONTAINERS + 1;
        char *junk = empty_arrays(n);
        if (where == 1) {
            json_t *v = json_loads(junk, 0, NULL);
            cr_assert_not_null(v);
            json_object_set_new(m.env, "junk", v);
            free(junk);
        } else {
            free(m.metadata);
            m.metadata = junk;
        }
        size_t len;
        char *text = encode(&m, &len);
        int rc = agree(text, len);
        if (where == 2) {
            cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
        } else {
            cr_assert_eq(rc, CKPT_ECORRUPT);
            cr_assert(strstr(ckpt_error_last(), "more JSON values than a reader builds"), "%s",
                      ckpt_error_last());
        }
        manifest_clear(&m);
        free(text);
    }
    /* values: scalars, not arrays */
    manifest m;
    fill(&m, 1);
    free(m.metadata);
    m.metadata = malloc(2 * (size_t)MANIFEST_MAX_VALUES + 2);
    char *o = m.metadata;
    *o++ = '[';
    for (size_t i = 0; i < MANIFEST_MAX_VALUES; i++) {
        *o++ = '0';
        *o++ = ',';
    }
    strcpy(o - 1, "]");
    size_t len;
    char *text = encode(&m, &len);
    cr_assert_eq(agree(text, len), CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "JSON values"), "%s", ckpt_error_last());
    manifest_clear(&m);
    free(text);
}

/* A zero-element shape is valid or not whatever the order of its
 * dimensions: the nonzero ones times the element size must stay within
 * 2^63-1 bytes, on both routes (a [0, 2^63-1, 2^63-1] tensor verified
 * while [2^63-1, 2^63-1, 0] did not, and NumPy could not make it). */
Test(mtensors, a_shape_is_valid_in_any_order_of_its_dimensions)
{
    const int64_t M = INT64_MAX;
    static const struct {
        int64_t shape[3];
        uint64_t bytes;
        int ok;
    } cases[] = {
        {{0, M, M}, 0, CKPT_ECORRUPT},
        {{M, M, 0}, 0, CKPT_ECORRUPT},
        {{M, 0, M}, 0, CKPT_ECORRUPT},
        {{0, (int64_t)1 << 61, 4}, 0, CKPT_ECORRUPT},  /* 2^63 bytes of float32 */
        {{(int64_t)1 << 61, 4, 0}, 0, CKPT_ECORRUPT},
        {{0, (int64_t)1 << 60, 1}, 0, CKPT_OK},        /* 2^62 bytes: fine, empty */
        {{7, 0, 5}, 0, CKPT_OK},
        {{(int64_t)1 << 62, 1, 1}, 0, CKPT_ECORRUPT},  /* 4 x 2^62 wraps to 0 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        manifest m;
        fill(&m, 1);
        m.tensors[0].dtype = CKPT_F32;
        m.tensors[0].ndim = 3;
        memcpy(m.tensors[0].shape, cases[c].shape, sizeof cases[c].shape);
        m.tensors[0].bytes = cases[c].bytes;
        size_t len;
        char *text = encode(&m, &len);
        int rc = agree(text, len);
        cr_assert_eq(rc, cases[c].ok, "case %zu: %d (%s)", c, rc, ckpt_error_last());
        if (rc)
            cr_assert(strstr(ckpt_error_last(), "invalid shape (its nonzero dimensions "
                                                "times the float32 element size exceed"),
                      "case %zu: %s", c, ckpt_error_last());
        manifest_clear(&m);
        free(text);
    }
}

/* manifest: encode/decode with checksum, and schema validation. */
#include "manifest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "error.h"
#include "jsonscan.h"
#include "jsontext.h"
#include "mtensors.h"
#include "nameset.h"
#include "util.h"

/* The file is B + SUFFIX_HEAD + 16 hex digits + SUFFIX_TAIL, where B is the
 * JSON object without its closing brace and the digits are XXH3-64(B).  The
 * result is plain JSON, and an editor's or a torn write's change shows. */
#define SUFFIX_HEAD ",\n  \"checksum\": \""
#define SUFFIX_TAIL "\"\n}\n"
/* The root's metadata member as the writer lays it out, up to its value. */
#define META_LINE "\n  \"metadata\": "

void manifest_clear(manifest *m)
{
    for (size_t i = 0; i < m->ntensors && !m->names; i++)
        free(m->tensors[i].name);
    free(m->names);
    for (size_t i = 0; i < m->nshards; i++)
        free(m->shards[i].file);
    free(m->tensors);
    free(m->shards);
    json_decref(m->env);
    free(m->metadata);
    memset(m, 0, sizeof *m);
}

char *manifest_json_text(const json_t *v)
{
    if (!v)
        return util_strdup("null");
    return jsontext_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
}

static json_t *u64(uint64_t v)
{
    return json_integer((json_int_t)v);
}

static json_t *hex(uint64_t v)
{
    char h[17];
    util_hex64(v, h);
    return json_string(h);
}

/* x rounded to a multiple of 1/per_unit: the nearest double to a short
 * decimal, which prints back exactly in few digits. */
static double quantize(double x, double per_unit)
{
    return nearbyint(x * per_unit) / per_unit;
}

static json_t *build(const manifest *m)
{
    char id[2 * SHARD_ID_SIZE + 1];
    for (unsigned i = 0; i < SHARD_ID_SIZE; i++)
        snprintf(id + 2 * i, 3, "%02x", m->id[i]);
    /* The tensors are spliced into the text by manifest_encode. */
    json_t *tensors = json_array(), *shards = json_array();
    for (size_t i = 0; i < m->nshards; i++) {
        const manifest_shard *s = &m->shards[i];
        json_array_append_new(shards, json_pack("{s:s, s:o, s:o, s:o}", "file", s->file,
            "bytes", u64(s->size), "index_xxh3", hex(s->index_hash),
            "chunks", u64(s->chunks)));
    }
    /* Nanoseconds and milliseconds: enough, and short to print. */
    json_t *save = json_pack("{s:o, s:o, s:o, s:f, s:f, s:o, s:i}",
        "raw_bytes", u64(m->stats.raw_bytes), "stored_bytes", u64(m->stats.stored_bytes),
        "chunks", u64(m->stats.chunks), "stall_s", quantize(m->stats.stall_s, 1e9),
        "persist_s", quantize(m->stats.persist_s, 1e9), "chunk_bytes", u64(m->chunk_bytes),
        "zstd_level", m->level);
    json_t *root = json_pack("{s:s, s:i, s:I, s:s, s:f, s:o, s:o, s:o, s:O, s:O}",
        "format", MANIFEST_FORMAT, "format_version", MANIFEST_VERSION,
        "step", (json_int_t)m->step, "checkpoint_id", id, "time", quantize(m->time, 1e3),
        "save", save, "tensors", tensors, "shards", shards,
        "env", m->env ? m->env : json_object(), "metadata", json_null());
    /* Only multi-rank steps carry it: one process's manifest is unchanged. */
    if (root && m->world_size > 1 &&
        json_object_set_new(root, "world_size", json_integer(m->world_size))) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* `body` with its first `line` (a member of the root on one line, ending in
 * a placeholder value of `old_len` bytes) given `value` instead.  `body`
 * and `value` are freed; NULL when either is NULL, when out of memory, or
 * (never for jansson's printing) when the line is missing.
 *
 * The line is the root's member: a raw line feed occurs in JSON text only
 * between tokens, and two spaces in is the root's level.  "save" holds no
 * array and the metadata is spliced before the tensors, so neither can
 * show another such line first. */
static char *splice_member(char *body, const char *line, size_t old_len, char *value)
{
    char *out = NULL, *at = body && value ? strstr(body, line) : NULL;
    if (at) {
        size_t llen = strlen(line), head = (size_t)(at - body) + llen - old_len;
        const char *rest = at + llen;
        size_t vlen = strlen(value), rlen = strlen(rest);
        out = malloc(head + vlen + rlen + 1);
        if (out) {
            memcpy(out, body, head);
            memcpy(out + head, value, vlen);
            memcpy(out + head + vlen, rest, rlen + 1);
        }
    }
    free(body);
    free(value);
    return out;
}

void manifest_part_name(uint32_t rank, char name[MANIFEST_PART_NAME_SIZE])
{
    snprintf(name, MANIFEST_PART_NAME_SIZE, "rank-%05u.json", rank);
}

int manifest_encode(const manifest *m, char **text, size_t *len)
{
    json_t *root = build(m);
    char *body = root ? jsontext_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    /* The caller's metadata on one line: a Python state's structure is
     * tens of thousands of small nodes, which indented would make the
     * manifest several times larger and slower to write, read and parse. */
    if (body && m->metadata && strcmp(m->metadata, "null") != 0)
        body = splice_member(body, META_LINE "null", 4, util_strdup(m->metadata));
    /* The tensors array is printed by hand (mtensors.h says why). */
    if (body && m->ntensors)
        body = splice_member(body, "\n  \"tensors\": []", 2,
                             mtensors_text(m->tensors, m->ntensors));
    if (!body)
        return ckpt_seterr(CKPT_ENOMEM, "cannot encode the manifest of step %lld",
                           (long long)m->step);
    size_t blen = strlen(body);
    /* jansson ends an indented object with "\n}". */
    if (blen < 2 || body[blen - 1] != '}' || body[blen - 2] != '\n') {
        free(body);
        return ckpt_seterr(CKPT_EINTERNAL, "unexpected JSON layout from jansson");
    }
    blen -= 2;
    char h[17];
    util_hex64(codec_hash(body, blen), h);
    const size_t head = sizeof SUFFIX_HEAD - 1, tail = sizeof SUFFIX_TAIL - 1;
    char *out = realloc(body, blen + head + 16 + tail + 1); /* body stays on failure */
    if (!out) {
        free(body);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory encoding the manifest");
    }
    memcpy(out + blen, SUFFIX_HEAD, head);
    memcpy(out + blen + head, h, 16);
    memcpy(out + blen + head + 16, SUFFIX_TAIL, tail + 1);
    *text = out;
    *len = blen + head + 16 + tail;
    return CKPT_OK;
}

#define BAD(...) ckpt_seterr(CKPT_ECORRUPT, __VA_ARGS__)

static int get_u64(json_t *o, const char *key, uint64_t *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return -1;
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

static int get_hex(json_t *o, const char *key, uint64_t *v)
{
    json_t *x = json_object_get(o, key);
    return json_is_string(x) && util_parse_hex64(json_string_value(x), v) ? 0 : -1;
}

/* The members a manifest object must have, and what each must be: a
 * damaged or forged manifest is named by its first member at fault. */
typedef enum field_kind {
    F_ANY, F_STRING, F_NUMBER, F_INTEGER, F_U64, F_OBJECT, F_ARRAY
} field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
} field;

static int field_fits(json_t *x, field_kind k)
{
    switch (k) {
    case F_STRING: return json_is_string(x);
    case F_NUMBER: return json_is_number(x);
    case F_INTEGER: return json_is_integer(x);
    case F_U64: return json_is_integer(x) && json_integer_value(x) >= 0;
    case F_OBJECT: return json_is_object(x);
    case F_ARRAY: return json_is_array(x);
    case F_ANY: return x != NULL;
    }
    return 0;
}

static const char *field_kind_text(field_kind k)
{
    static const char *const text[] = {"present", "a string", "a number", "an integer",
                                       "an integer >= 0", "an object", "an array"};
    return text[k];
}

/* CKPT_OK when object `o` has each of the n fields, of its kind; else
 * CKPT_ECORRUPT naming `what` ("the save record") and the first member
 * missing or of the wrong type. */
static int check_fields(json_t *o, const field *f, size_t n, const char *where,
                        const char *what)
{
    if (!json_is_object(o))
        return BAD("%s: %s is not a JSON object", where, what);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_object_get(o, f[i].key);
        if (!x)
            return BAD("%s: %s lacks its '%s' member", where, what, f[i].key);
        if (!field_fits(x, f[i].kind))
            return BAD("%s: %s has '%s' that is not %s", where, what, f[i].key,
                       field_kind_text(f[i].kind));
    }
    return CKPT_OK;
}

#define NFIELDS(a) (sizeof(a) / sizeof(a)[0])

/* A shard file name: plain, inside the step directory. */
static int safe_file_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 128 || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* The first name given twice among n (nameset.h) into *repeat: 1; none: 0;
 * out of memory: CKPT_ENOMEM, said. */
static int find_repeat(const char **names, size_t n, const char *where, size_t *repeat)
{
    int found = names ? nameset_find_repeat(names, n, repeat) : -1;
    free(names);
    if (found < 0)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    return found;
}

static int unique_shard_files(const manifest *m, const char *where)
{
    const char **names = malloc((m->nshards ? m->nshards : 1) * sizeof *names);
    for (size_t i = 0; names && i < m->nshards; i++)
        names[i] = m->shards[i].file;
    size_t at;
    int found = find_repeat(names, m->nshards, where, &at);
    if (found == 1)
        return BAD("%s: shard file '%s' is listed twice", where, m->shards[at].file);
    return found; /* CKPT_OK or CKPT_ENOMEM */
}

static int decode_tensor(json_t *jt, size_t i, const char *where, manifest_tensor *t,
                         size_t nshards)
{
    static const field want[] = {{"name", F_STRING},  {"dtype", F_STRING},
                                 {"shape", F_ARRAY},  {"shard", F_INTEGER},
                                 {"bytes", F_U64},    {"chunks", F_U64},
                                 {"stored_bytes", F_U64}};
    char what[48];
    snprintf(what, sizeof what, "tensor %zu", i);
    int rc = check_fields(jt, want, NFIELDS(want), where, what);
    if (rc)
        return rc;
    json_t *name = json_object_get(jt, "name"), *dtype = json_object_get(jt, "dtype");
    json_t *shape = json_object_get(jt, "shape"), *shard = json_object_get(jt, "shard");
    get_u64(jt, "bytes", &t->bytes);
    get_u64(jt, "chunks", &t->chunks);
    get_u64(jt, "stored_bytes", &t->stored_bytes);
    size_t nlen = json_string_length(name);
    if (nlen == 0 || nlen > CKPT_NAME_MAX || strlen(json_string_value(name)) != nlen)
        return BAD("%s: tensor %zu has an invalid name", where, i);
    if (!(t->name = util_strdup(json_string_value(name))))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    t->dtype = ckpt_dtype_from_name(json_string_value(dtype));
    if (t->dtype == CKPT_DTYPE_INVALID)
        return BAD("%s: tensor '%s' has unknown dtype '%s'", where, t->name,
                   json_string_value(dtype));
    if (json_array_size(shape) > CKPT_MAX_DIMS)
        return BAD("%s: tensor '%s' has too many dimensions", where, t->name);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return BAD("%s: tensor '%s' has an invalid shape (dimension %d is not an "
                       "integer >= 0)", where, t->name, d);
        t->shape[d] = json_integer_value(x);
    }
    uint64_t bytes;
    if (!util_shape_bytes(t->shape, t->ndim, ckpt_dtype_size(t->dtype), &bytes))
        return BAD("%s: tensor '%s' has an invalid shape (its nonzero dimensions times "
                   "the %s element size exceed 2^63-1 bytes)", where, t->name,
                   ckpt_dtype_name(t->dtype));
    if (bytes != t->bytes)
        return BAD("%s: tensor '%s' declares %llu bytes, its shape and dtype make %llu",
                   where, t->name, (unsigned long long)t->bytes, (unsigned long long)bytes);
    if (json_integer_value(shard) < 0 || (size_t)json_integer_value(shard) >= nshards)
        return BAD("%s: tensor '%s' is in shard %lld of %zu", where, t->name,
                   (long long)json_integer_value(shard), nshards);
    t->shard = (uint32_t)json_integer_value(shard);
    return CKPT_OK;
}

/* Names must be unique, or a restore could match the wrong bytes. */
static int unique_tensor_names(const manifest *m, const char *where)
{
    size_t nt = m->ntensors;
    const char **names = malloc((nt ? nt : 1) * sizeof *names);
    for (size_t i = 0; names && i < nt; i++)
        names[i] = m->tensors[i].name;
    size_t at;
    int found = find_repeat(names, nt, where, &at);
    if (found == 1 && m->nshards > 1) { /* several ranks (shard i is rank i): name both */
        size_t other = at;
        for (size_t i = 0; i < nt && other == at; i++)
            if (i != at && strcmp(m->tensors[i].name, m->tensors[at].name) == 0)
                other = i;
        uint32_t a = m->tensors[other].shard, b = m->tensors[at].shard;
        if (a != b)
            return BAD("%s: tensor name '%s' appears twice, saved by rank %u and by rank %u: "
                       "tensor names must be unique across the ranks (prefix them with the "
                       "rank or the parallel coordinates, docs/SCALING.md)", where,
                       m->tensors[at].name, a < b ? a : b, a < b ? b : a);
    }
    if (found == 1)
        return BAD("%s: tensor name '%s' appears twice", where, m->tensors[at].name);
    return found;
}

/* The root object into *m.  `pre` (npre tensors, or NULL): the tensors
 * mtensors_scan read, whose place in the root holds an empty array; m takes
 * them over, on failure too. */
/* `pre` (npre tensors) and `meta` (the metadata's text): what the quick
 * route read by hand, or NULL; m takes both, whatever the outcome. */
static int decode_root(json_t *root, const char *where, manifest *m, manifest_tensor *pre,
                       size_t npre, char *meta_text)
{
    json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "format_version");
    m->metadata = meta_text;
    if (pre) {
        m->tensors = pre; /* m frees them, from here on */
        m->ntensors = npre;
        m->names = npre ? pre[0].name : NULL; /* mtensors_scan's block */
    }
    if (!json_is_object(root) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), MANIFEST_FORMAT) != 0)
        return BAD("%s: not a libckpt manifest", where);
    if (!json_is_integer(ver) || json_integer_value(ver) != MANIFEST_VERSION)
        return ckpt_seterr(CKPT_EVERSION, "%s: manifest format version %lld, this library "
                           "reads %d", where, json_is_integer(ver) ?
                           (long long)json_integer_value(ver) : -1LL, MANIFEST_VERSION);
    json_t *step = json_object_get(root, "step"), *id = json_object_get(root, "checkpoint_id");
    json_t *time = json_object_get(root, "time"), *save = json_object_get(root, "save");
    json_t *tensors = json_object_get(root, "tensors"), *shards = json_object_get(root, "shards");
    json_t *env = json_object_get(root, "env"), *meta = json_object_get(root, "metadata");
    static const field top[] = {{"step", F_U64},      {"checkpoint_id", F_STRING},
                                {"time", F_NUMBER},   {"save", F_OBJECT},
                                {"tensors", F_ARRAY}, {"shards", F_ARRAY},
                                {"env", F_OBJECT},    {"metadata", F_ANY}};
    int rc = check_fields(root, top, NFIELDS(top), where, "the manifest");
    if (rc)
        return rc;
    if (pre && json_array_size(tensors))
        return BAD("%s: the manifest's tensors are listed twice", where);
    m->step = json_integer_value(step);
    const char *hx = json_string_value(id);
    for (unsigned i = 0; i < 2 * SHARD_ID_SIZE; i++) {
        char c = hx[i]; /* exactly 32 lowercase hex digits, as written */
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0 || json_string_length(id) != 2 * SHARD_ID_SIZE) /* a NUL ends a short one */
            return BAD("%s: checkpoint_id is not %d lowercase hex digits", where,
                       2 * SHARD_ID_SIZE);
        m->id[i / 2] = (unsigned char)(i % 2 ? (m->id[i / 2] << 4) | d : d);
    }
    m->time = json_number_value(time);
    static const field record[] = {{"raw_bytes", F_U64},   {"stored_bytes", F_U64},
                                   {"chunks", F_U64},      {"chunk_bytes", F_U64},
                                   {"stall_s", F_NUMBER},  {"persist_s", F_NUMBER},
                                   {"zstd_level", F_INTEGER}};
    if ((rc = check_fields(save, record, NFIELDS(record), where, "the save record")))
        return rc;
    json_t *lvl = json_object_get(save, "zstd_level");
    get_u64(save, "raw_bytes", &m->stats.raw_bytes);
    get_u64(save, "stored_bytes", &m->stats.stored_bytes);
    get_u64(save, "chunks", &m->stats.chunks);
    get_u64(save, "chunk_bytes", &m->chunk_bytes);
    if (m->chunk_bytes < SHARD_CHUNK_MIN || m->chunk_bytes > SHARD_CHUNK_MAX ||
        m->chunk_bytes % 16)
        return BAD("%s: the save record's chunk_bytes %llu is not a multiple of 16 from "
                   "%llu to %llu", where, (unsigned long long)m->chunk_bytes,
                   (unsigned long long)SHARD_CHUNK_MIN, (unsigned long long)SHARD_CHUNK_MAX);
    m->level = (int)json_integer_value(lvl);
    m->stats.step = m->step;
    m->stats.stall_s = json_number_value(json_object_get(save, "stall_s"));
    m->stats.persist_s = json_number_value(json_object_get(save, "persist_s"));

    size_t ns = json_array_size(shards), nt = json_array_size(tensors);
    if (ns == 0 || ns > 65536)
        return BAD("%s: %zu shards listed", where, ns);
    m->shards = calloc(ns, sizeof *m->shards);
    if (!pre)
        m->tensors = calloc(nt ? nt : 1, sizeof *m->tensors);
    if (!m->shards || !m->tensors)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    for (size_t i = 0; i < ns; i++, m->nshards++) {
        json_t *js = json_array_get(shards, i), *file = json_object_get(js, "file");
        manifest_shard *s = &m->shards[i];
        static const field want[] = {{"file", F_STRING}, {"bytes", F_U64},
                                     {"index_xxh3", F_STRING}, {"chunks", F_U64}};
        char what[48];
        snprintf(what, sizeof what, "shard %zu", i);
        if ((rc = check_fields(js, want, NFIELDS(want), where, what)))
            return rc;
        if (!safe_file_name(json_string_value(file)))
            return BAD("%s: shard %zu's file name is not a plain name of letters, digits, "
                       "'-', '_' and '.' (not starting with '.'; up to 128)", where, i);
        if (get_hex(js, "index_xxh3", &s->index_hash))
            return BAD("%s: shard %zu's index_xxh3 is not 16 hex digits", where, i);
        get_u64(js, "bytes", &s->size);
        get_u64(js, "chunks", &s->chunks);
        if (!(s->file = util_strdup(json_string_value(file))))
            return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    }
    rc = unique_shard_files(m, where); /* two entries for one file would alias it */
    if (rc)
        return rc;
    for (size_t i = 0; i < nt && !pre; i++) {
        rc = decode_tensor(json_array_get(tensors, i), i, where, &m->tensors[i], ns);
        m->ntensors++;
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < npre && pre; i++) /* the one check the scan left */
        if (m->tensors[i].shard >= ns)
            return BAD("%s: tensor '%s' is in shard %u of %zu", where, m->tensors[i].name,
                       m->tensors[i].shard, ns);
    if ((rc = unique_tensor_names(m, where)))
        return rc;
    json_t *world = json_object_get(root, "world_size");
    if (world) {
        /* Rank i wrote shard i, numbering its chunks' tensors among the
         * tensors of that shard (docs/FORMAT.md). */
        if (!json_is_integer(world) || json_integer_value(world) < 2 ||
            (size_t)json_integer_value(world) != ns)
            return BAD("%s: world_size must be the number of shards (%zu), at least 2",
                       where, ns);
        m->world_size = (uint32_t)json_integer_value(world);
    }
    m->env = json_incref(env);
    if (!m->metadata && !(m->metadata = manifest_json_text(meta)))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    return CKPT_OK;
}

/* The checksum suffix: present and matching the rest. */
static int check_sum(const char *text, size_t len, const char *where)
{
    const size_t head = sizeof SUFFIX_HEAD - 1, tail = sizeof SUFFIX_TAIL - 1;
    /* Cut short (a copy that stopped, a file system that lost its tail):
     * CKPT_EINCOMPLETE, as a truncated shard; anything else is damage. */
    if (len < head + 16 + tail + 2)
        return ckpt_seterr(CKPT_EINCOMPLETE, "%s: manifest of %zu bytes is truncated", where,
                           len);
    size_t blen = len - head - 16 - tail;
    if (memcmp(text + blen, SUFFIX_HEAD, head) != 0 ||
        memcmp(text + len - tail, SUFFIX_TAIL, tail) != 0)
        return ckpt_seterr(memmem(text, len, SUFFIX_HEAD, head) ? CKPT_ECORRUPT
                                                                : CKPT_EINCOMPLETE,
                           "%s: manifest does not end with its checksum (truncated or "
                           "edited)", where);
    char hx[17];
    memcpy(hx, text + blen + head, 16);
    hx[16] = '\0';
    uint64_t want, have = codec_hash(text, blen);
    if (!util_parse_hex64(hx, &want))
        return BAD("%s: malformed manifest checksum", where);
    if (want != have)
        return BAD("%s: manifest checksum %016llx does not match its content (%016llx)",
                   where, (unsigned long long)want, (unsigned long long)have);
    return CKPT_OK;
}

int manifest_decode(const char *text, size_t len, const char *where, manifest *m)
{
    json_t *tree;
    int rc = manifest_decode_keep(text, len, where, m, &tree);
    json_decref(tree);
    return rc;
}

/* A stretch of the text the quick route read by hand, replaced by `with`
 * for jansson. */
typedef struct cut {
    size_t from, to;
    const char *with;
} cut;

/* Whether jansson's (or load_cut's) failure was out of memory. */
static int json_out_of_memory(const json_error_t *err)
{
    if (err->line == -1 && strcmp(err->text, "out of memory") == 0)
        return 1; /* load_cut's own */
#if JANSSON_VERSION_HEX >= 0x020b00
    return json_error_code(err) == json_error_out_of_memory;
#else
    return 0;
#endif
}

/* The text with its n cuts (in order, apart) replaced, parsed as the
 * whole is. */
static json_t *load_cut(const char *text, size_t len, const cut *c, size_t n,
                        json_error_t *err)
{
    size_t rlen = len;
    for (size_t i = 0; i < n; i++)
        rlen = rlen - (c[i].to - c[i].from) + strlen(c[i].with);
    char *rest = malloc(rlen ? rlen : 1), *o = rest;
    if (!rest) {
        memset(err, 0, sizeof *err); /* json_error_code reads its last byte */
        snprintf(err->text, sizeof err->text, "out of memory");
        err->line = -1;
        return NULL;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(o, text + at, c[i].from - at);
        o += c[i].from - at;
        memcpy(o, c[i].with, strlen(c[i].with));
        o += strlen(c[i].with);
        at = c[i].to;
    }
    memcpy(o, text + at, len - at);
    json_t *root = json_loadb(rest, rlen, JSON_REJECT_DUPLICATES, err);
    free(rest);
    return root;
}

/* Find the root's metadata member in the writer's layout and scan its
 * value (jsonscan.h).  Returns 1 with [*from, *to) the value's bytes and
 * *out its compact text (malloc'd); 0 when not found or unsure (jansson
 * reads it); -1 when out of memory. */
static int meta_scan(const char *text, size_t len, size_t *from, size_t *to, char **out)
{
    const char *at = memmem(text, len, META_LINE, sizeof META_LINE - 1);
    /* The key must be the root object's own: one level down. */
    if (!at || jsonscan_depth_at(text, (size_t)(at - text)) != 1)
        return 0;
    size_t start = (size_t)(at - text) + sizeof META_LINE - 1, end, n;
    char *buf = malloc(len - start + 1);
    if (!buf)
        return -1;
    int rc = jsonscan_value(text + start, len - start, MANIFEST_META_MAX_DEPTH, buf, &n, &end);
    if (rc != 1) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *from = start;
    *to = start + end;
    *out = buf;
    return 1;
}

/* Refuse text that would make a tree too large for what its bytes say
 * (manifest.h): `a` and `b`, two pieces between values, counted as one. */
static int check_tally(const char *a, size_t alen, const char *b, size_t blen,
                       const char *where)
{
    size_t ca, cb, values = jsonscan_tally(a, alen, &ca) + jsonscan_tally(b, blen, &cb);
    if (values <= MANIFEST_MAX_VALUES && ca + cb <= MANIFEST_MAX_CONTAINERS)
        return CKPT_OK;
    /* No counts in the message: the routes count different parts of the
     * text (the quick one skips the tensors), and they must say the same. */
    return BAD("%s: manifest holds more JSON values than a reader builds (at most %u, "
               "%u of them arrays or objects): no libckpt writer makes that (hostile or "
               "damaged file)", where, MANIFEST_MAX_VALUES, MANIFEST_MAX_CONTAINERS);
}

static int decode(const char *text, size_t len, const char *where, manifest *m,
                  json_t **tree, int quick)
{
    memset(m, 0, sizeof *m);
    *tree = NULL;
    int rc = check_sum(text, len, where);
    if (rc)
        return rc;
    /* JSON has no raw NUL anywhere, and jansson skips one after a number
     * or keyword (an unget drops it) but not after a bracket: refused
     * here, so that both routes, and every other JSON reader, agree. */
    const char *nul = memchr(text, '\0', len);
    if (nul)
        return BAD("%s: manifest holds a NUL byte at offset %zu: not JSON (hostile or "
                   "damaged file)", where, (size_t)(nul - text));
    json_t *root = NULL;
    json_error_t err;
    /* The quick route: the tensors and the metadata scanned by hand, the
     * rest by jansson.  On any failure the whole text goes the jansson
     * route, which reports it in its own words. */
    size_t open = 0, close = 0, npre = 0, mfrom = 0, mto = 0;
    manifest_tensor *pre = NULL;
    char *meta = NULL;
    int ts = quick ? mtensors_scan(text, len, &open, &close, &pre, &npre) : 0;
    int ms = quick && ts >= 0 ? meta_scan(text, len, &mfrom, &mto, &meta) : 0;
    if (ts < 0 || ms < 0) {
        mtensors_free(pre, npre);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    }
    cut cuts[2];
    size_t ncut = 0;
    if (ms == 1)
        cuts[ncut++] = (cut){mfrom, mto, "null"};
    if (ts == 1)
        cuts[ncut++] = (cut){open + 1, close, ""};
    if (ncut == 2 && cuts[0].from > cuts[1].from) { /* not the writer's order */
        cut c = cuts[0];
        cuts[0] = cuts[1];
        cuts[1] = c;
    }
    if (ncut == 2 && cuts[0].to > cuts[1].from)
        ncut = 0; /* one inside the other: not the writer's layout */
    if (ncut && (rc = ts == 1 ? check_tally(text, open + 1, text + close, len - close, where)
                              : check_tally(text, len, "", 0, where))) {
        mtensors_free(pre, npre);
        free(meta);
        return rc;
    }
    if (ncut) {
        ckpt_error_state before;
        ckpt_error_capture(&before, CKPT_OK);
        root = load_cut(text, len, cuts, ncut, &err);
        int drc = root ? decode_root(root, where, m, pre, npre, meta) : CKPT_OK;
        if (root && drc == CKPT_OK)
            goto decoded;
        if (root) { /* decode_root gave them to m */
            pre = NULL;
            meta = NULL;
        }
        json_decref(root);
        manifest_clear(m);
        /* Out of memory is no reason to take the other route: that one
         * gives the metadata as jansson prints it (other text than the
         * quick route's for the same manifest), and would itself fail
         * to parse and call the manifest damaged. */
        if (drc == CKPT_ENOMEM || (!root && json_out_of_memory(&err))) {
            mtensors_free(pre, npre);
            free(meta);
            return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
        }
        ckpt_error_restore(&before);
    }
    mtensors_free(pre, npre);
    free(meta);
    if ((rc = check_tally(text, len, "", 0, where)))
        return rc;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root && json_out_of_memory(&err)) /* not damage */
        return ckpt_seterr(CKPT_ENOMEM, "out of memory reading %s", where);
    if (!root)
        return BAD("%s: manifest is not valid JSON (line %d: %s)", where, err.line, err.text);
    rc = decode_root(root, where, m, NULL, 0, NULL);
    if (rc) {
        json_decref(root);
        manifest_clear(m);
        return rc;
    }
decoded:
    /* m holds env and metadata: the tree keeps nothing m uses. */
    json_object_del(root, "env");
    json_object_del(root, "metadata");
    *tree = root;
    return CKPT_OK;
}

int manifest_decode_keep(const char *text, size_t len, const char *where, manifest *m,
                         json_t **tree)
{
    return decode(text, len, where, m, tree, 1);
}

int manifest_decode_reference(const char *text, size_t len, const char *where, manifest *m)
{
    json_t *tree;
    int rc = decode(text, len, where, m, &tree, 0);
    json_decref(tree);
    return rc;
}


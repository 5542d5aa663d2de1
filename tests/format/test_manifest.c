/* manifest (lib/format/manifest.c): the tensors array is written by hand,
 * not through jansson (speed); its text must be exactly what jansson prints
 * for the same document, one tensor per line as jansson prints it
 * compact, and decode back to the same tensors, whatever the names hold
 * (quotes, backslashes, control characters, non-ASCII).  The caller's
 * metadata is printed on a single line too. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "codec.h"
#include "jsontext.h"
#include "manifest.h"
#include "util.h"

static const char *NAMES[] = {"w", "a\"b", "back\\slash", "nl\nx", "ctl\x01\x1f", "sl/ash",
                              "del\x7f", "\xc3\xa9\xe6\xbc\xa2/x", "model.fc1.weight"};
#define N (sizeof NAMES / sizeof *NAMES)

static void fill(manifest *m, size_t n)
{
    memset(m, 0, sizeof *m);
    m->step = 7;
    memcpy(m->id, "0123456789abcdef", SHARD_ID_SIZE);
    m->chunk_bytes = 1u << 22;
    m->level = 1;
    m->tensors = calloc(n ? n : 1, sizeof *m->tensors);
    m->ntensors = n;
    for (size_t i = 0; i < n; i++) {
        manifest_tensor *t = &m->tensors[i];
        t->name = strdup(NAMES[i]);
        t->dtype = CKPT_F32;
        t->ndim = (int)(i % 4); /* 0-d tensors too: "shape": [] */
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (uint64_t)(t->shape[d] = d + 2);
        t->bytes = numel * 4;
        t->chunks = 1;
        t->stored_bytes = t->bytes + i;
    }
    m->shards = calloc(1, sizeof *m->shards);
    m->nshards = 1;
    m->shards[0].file = strdup("rank-00000.shard");
    m->shards[0].size = 123;
    m->env = json_pack("{s:s}", "host", "h");
    m->metadata = strdup("{\"tensors\":[1]}"); /* a decoy "tensors" key */
}

/* `text` with its first `marker` replaced by `with` (both freed). */
static char *splice(char *text, const char *marker, char *with)
{
    char *at = strstr(text, marker);
    cr_assert_not_null(at, "no %s", marker);
    size_t a = (size_t)(at - text), m = strlen(marker);
    char *out = malloc(strlen(text) - m + strlen(with) + 1);
    sprintf(out, "%.*s%s%s", (int)a, text, with, at + m);
    free(text);
    free(with);
    return out;
}

/* "\n  \"tensors\": [\n    {...},\n    {...}\n  ]", each element as jansson
 * prints it compact. */
static char *lines_of(const json_t *array)
{
    size_t n = json_array_size(array), cap = 64, len = 0;
    char *out = malloc(cap);
    len = (size_t)sprintf(out, "\n  \"tensors\": [");
    for (size_t i = 0; i < n; i++) {
        char *e = jsontext_dumps(json_array_get(array, i), JSON_COMPACT | JSON_PRESERVE_ORDER);
        cr_assert(e && !strchr(e, '\n'));
        out = realloc(out, cap += strlen(e) + 16);
        len += (size_t)sprintf(out + len, "%s\n    %s", i ? "," : "", e);
        free(e);
    }
    sprintf(out + len, n ? "\n  ]" : "]");
    return out;
}

/* Encode, then compare with jansson's own printing of the parsed text. */
static void check(size_t n)
{
    manifest m, back;
    fill(&m, n);
    char *text;
    size_t len;
    cr_assert_eq(manifest_encode(&m, &text, &len), CKPT_OK, "%s", ckpt_error_last());
    json_t *root = json_loadb(text, len, 0, NULL);
    cr_assert_not_null(root);
    json_object_del(root, "checksum");
    /* jansson's indented printing, but for the metadata and each tensor:
     * compact. */
    char *meta = jsontext_dumps(json_object_get(root, "metadata"),
                                JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert(meta && !strchr(meta, '\n'));
    json_object_set_new(root, "metadata", json_null());
    char *tensors = lines_of(json_object_get(root, "tensors"));
    json_object_set_new(root, "tensors", json_array());
    char *ref = jsontext_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    ref = splice(ref, "\n  \"metadata\": null", util_printf("\n  \"metadata\": %s", meta));
    ref = splice(ref, "\n  \"tensors\": []", tensors);
    free(meta);
    size_t rlen = strlen(ref);
    cr_assert(rlen > 2 && len > rlen);
    cr_assert(memcmp(text, ref, rlen - 2) == 0, "differs from jansson:\n%s\n---\n%s", text,
              ref);
    cr_assert_eq(manifest_decode(text, len, "t", &back), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(back.ntensors, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(back.tensors[i].name, NAMES[i]);
        cr_assert_eq(back.tensors[i].ndim, m.tensors[i].ndim);
        cr_assert_eq(back.tensors[i].stored_bytes, m.tensors[i].stored_bytes);
        for (int d = 0; d < back.tensors[i].ndim; d++)
            cr_assert_eq(back.tensors[i].shape[d], m.tensors[i].shape[d]);
    }
    manifest_clear(&back);
    manifest_clear(&m);
    json_decref(root);
    free(ref);
    free(text);
}

Test(manifest, tensors_text_is_jansson_s) { check(N); }
Test(manifest, one_tensor) { check(1); }
Test(manifest, no_tensors) { check(0); }

/* The encoded manifest of fill(m, 2) after `mutate` changed its tree,
 * checksummed again, as whoever can write the root could: decoding it
 * (both routes) fails with CKPT_ECORRUPT and a message containing `want`,
 * the member at fault. */
static void refused(void (*mutate)(json_t *root), const char *want)
{
    manifest m, back;
    fill(&m, 2);
    char *text;
    size_t len;
    cr_assert_eq(manifest_encode(&m, &text, &len), CKPT_OK, "%s", ckpt_error_last());
    json_t *root = json_loadb(text, len, 0, NULL);
    cr_assert_not_null(root);
    json_object_del(root, "checksum");
    mutate(root);
    char *body = jsontext_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    size_t blen = strlen(body) - 2; /* the body ends before "\n}" */
    char *forged = util_printf("%.*s,\n  \"checksum\": \"%016llx\"\n}\n", (int)blen, body,
                               (unsigned long long)codec_hash(body, blen));
    for (int route = 0; route < 2; route++) {
        int rc = route ? manifest_decode_reference(forged, strlen(forged), "m.json", &back)
                       : manifest_decode(forged, strlen(forged), "m.json", &back);
        cr_assert_eq(rc, CKPT_ECORRUPT, "route %d: %d %s", route, rc, ckpt_error_last());
        cr_assert(strstr(ckpt_error_last(), want), "route %d: '%s' lacks '%s'", route,
                  ckpt_error_last(), want);
        manifest_clear(&back);
    }
    free(forged);
    free(body);
    json_decref(root);
    free(text);
    manifest_clear(&m);
}

static json_t *at(json_t *root, const char *array, size_t i)
{
    return json_array_get(json_object_get(root, array), i);
}

static void no_time(json_t *r) { json_object_del(r, "time"); }
static void text_step(json_t *r) { json_object_set_new(r, "step", json_string("7")); }
static void tensors_object(json_t *r) { json_object_set_new(r, "tensors", json_object()); }
static void short_id(json_t *r) { json_object_set_new(r, "checkpoint_id", json_string("ab")); }
static void stall_text(json_t *r)
{
    json_object_set_new(json_object_get(r, "save"), "stall_s", json_string("x"));
}
static void odd_chunk(json_t *r)
{
    json_object_set_new(json_object_get(r, "save"), "chunk_bytes", json_integer(4097));
}
static void no_level(json_t *r) { json_object_del(json_object_get(r, "save"), "zstd_level"); }
static void index_number(json_t *r)
{
    json_object_set_new(at(r, "shards", 0), "index_xxh3", json_integer(5));
}
static void index_short(json_t *r)
{
    json_object_set_new(at(r, "shards", 0), "index_xxh3", json_string("abc"));
}
static void shard_path(json_t *r)
{
    json_object_set_new(at(r, "shards", 0), "file", json_string("../x"));
}
static void shard_list(json_t *r)
{
    json_array_set_new(json_object_get(r, "shards"), 0, json_array());
}
static void no_dtype(json_t *r) { json_object_del(at(r, "tensors", 1), "dtype"); }
static void negative_bytes(json_t *r)
{
    json_object_set_new(at(r, "tensors", 1), "bytes", json_integer(-1));
}
static void real_shard(json_t *r)
{
    json_object_set_new(at(r, "tensors", 0), "shard", json_real(0.0));
}
static void tensor_number(json_t *r)
{
    json_array_set_new(json_object_get(r, "tensors"), 1, json_integer(3));
}

/* A damaged or forged manifest is named by the member at fault (a fuzzing
 * audit found "a top-level field is missing or of the wrong type", "the
 * save record is malformed" and the like, which left a user to diff JSON). */
Test(manifest, a_bad_member_is_named)
{
    refused(no_time, "the manifest lacks its 'time' member");
    refused(text_step, "the manifest has 'step' that is not an integer >= 0");
    refused(tensors_object, "the manifest has 'tensors' that is not an array");
    refused(short_id, "checkpoint_id is not 32 lowercase hex digits");
    refused(stall_text, "the save record has 'stall_s' that is not a number");
    refused(odd_chunk, "chunk_bytes 4097 is not a multiple of 16");
    refused(no_level, "the save record lacks its 'zstd_level' member");
    refused(index_number, "shard 0 has 'index_xxh3' that is not a string");
    refused(index_short, "shard 0's index_xxh3 is not 16 hex digits");
    refused(shard_path, "shard 0's file name is not a plain name");
    refused(shard_list, "shard 0 is not a JSON object");
    refused(no_dtype, "tensor 1 lacks its 'dtype' member");
    refused(negative_bytes, "tensor 1 has 'bytes' that is not an integer >= 0");
    refused(real_shard, "tensor 0 has 'shard' that is not an integer");
    refused(tensor_number, "tensor 1 is not a JSON object");
}

/* A raw NUL byte is no JSON anywhere, but jansson skips one that follows a
 * number or keyword (its unget drops it) and refuses one after a bracket,
 * so the quick route (the metadata read by hand, "null" in its place) and
 * the reference route disagreed, and both passed a NUL after a null
 * metadata (found by fuzz_manifest).  Both refuse it now, naming it. */
Test(manifest, a_nul_byte_is_refused_by_both_routes)
{
    manifest m, back;
    fill(&m, 2);
    char *text;
    size_t len;
    cr_assert_eq(manifest_encode(&m, &text, &len), CKPT_OK, "%s", ckpt_error_last());
    json_t *root = json_loadb(text, len, 0, NULL);
    cr_assert_not_null(root);
    json_object_del(root, "checksum");
    json_object_del(root, "metadata");
    json_object_set_new(root, "metadata", json_null()); /* last, then a NUL */
    char *body = jsontext_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    size_t blen = strlen(body) - 2; /* the body ends before "\n}" */
    body[blen] = '\0';                /* the NUL, inside what the checksum covers */
    char *tail = util_printf(",\n  \"checksum\": \"%016llx\"\n}\n",
                             (unsigned long long)codec_hash(body, blen + 1));
    size_t flen = blen + 1 + strlen(tail);
    char *forged = malloc(flen);
    memcpy(forged, body, blen + 1);
    memcpy(forged + blen + 1, tail, strlen(tail));
    for (int route = 0; route < 2; route++) {
        int rc = route ? manifest_decode_reference(forged, flen, "m.json", &back)
                       : manifest_decode(forged, flen, "m.json", &back);
        cr_assert_eq(rc, CKPT_ECORRUPT, "route %d: %d %s", route, rc, ckpt_error_last());
        cr_assert(strstr(ckpt_error_last(), "NUL byte"), "route %d: %s", route,
                  ckpt_error_last());
        manifest_clear(&back);
    }
    free(forged);
    free(tail);
    free(body);
    json_decref(root);
    free(text);
    manifest_clear(&m);
}

/* libFuzzer harness: manifest_decode (lib/manifest.c) on hostile text.
 *
 * The input is the body B of a manifest (docs/FORMAT.md: the JSON object
 * without its closing brace).  A random B practically never carries a valid
 * checksum, so the harness appends the suffix ",\n  \"checksum\": \"H\"\n}\n"
 * with H = XXH3-64(B): every input gets past the checksum and exercises the
 * JSON parse and the schema validation.  Inputs whose first byte is 0x01
 * are passed through unchanged instead (minus that byte), which keeps the
 * suffix/checksum checks themselves covered.
 *
 * Oracles: the sanitizers; a round trip: whatever manifest_decode
 * accepts must encode (manifest_encode) and decode again to the same
 * values; and the two routes: manifest_decode (the tensors scanned by
 * hand when they are in the writer's layout, lib/format/mtensors.c, and
 * the metadata by lib/common/jsonscan.c) must
 * give what jansson alone gives (manifest_decode_reference), the same
 * status and message, or the same values. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "manifest.h"
#include "util.h"

#define SUFFIX_HEAD ",\n  \"checksum\": \""
#define SUFFIX_TAIL "\"\n}\n"

static void same_or_die(const manifest *a, const manifest *b, const char *what)
{
    int ok = a->step == b->step && !memcmp(a->id, b->id, sizeof a->id) &&
             a->chunk_bytes == b->chunk_bytes && a->level == b->level &&
             a->ntensors == b->ntensors && a->nshards == b->nshards &&
             a->stats.raw_bytes == b->stats.raw_bytes &&
             a->stats.stored_bytes == b->stats.stored_bytes &&
             a->stats.chunks == b->stats.chunks;
    for (size_t i = 0; ok && i < a->ntensors; i++) {
        const manifest_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        ok = !strcmp(x->name, y->name) && x->dtype == y->dtype && x->ndim == y->ndim &&
             !memcmp(x->shape, y->shape, sizeof x->shape) && x->bytes == y->bytes &&
             x->shard == y->shard && x->chunks == y->chunks &&
             x->stored_bytes == y->stored_bytes;
    }
    if (ok) { /* the metadata: the same value, however printed */
        json_t *x = json_loads(a->metadata ? a->metadata : "null", JSON_DECODE_ANY, NULL);
        json_t *y = json_loads(b->metadata ? b->metadata : "null", JSON_DECODE_ANY, NULL);
        ok = x && y && json_equal(x, y) && json_equal(a->env, b->env);
        json_decref(x);
        json_decref(y);
    }
    for (size_t i = 0; ok && i < a->nshards; i++) {
        const manifest_shard *x = &a->shards[i], *y = &b->shards[i];
        ok = !strcmp(x->file, y->file) && x->size == y->size &&
             x->index_hash == y->index_hash && x->chunks == y->chunks;
    }
    if (!ok) {
        fprintf(stderr, "fuzz_manifest: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    char *text;
    size_t len;
    if (size > 0 && data[0] == 0x01) {
        len = size - 1;
        text = malloc(len ? len : 1);
        if (!text)
            return 0;
        memcpy(text, data + 1, len);
    } else {
        char hex[17];
        util_hex64(codec_hash(data, size), hex);
        len = size + strlen(SUFFIX_HEAD) + 16 + strlen(SUFFIX_TAIL);
        text = malloc(len);
        if (!text)
            return 0;
        memcpy(text, data, size);
        memcpy(text + size, SUFFIX_HEAD, strlen(SUFFIX_HEAD));
        memcpy(text + size + strlen(SUFFIX_HEAD), hex, 16);
        memcpy(text + size + strlen(SUFFIX_HEAD) + 16, SUFFIX_TAIL, strlen(SUFFIX_TAIL));
    }
    manifest m, ref;
    int rc = manifest_decode(text, len, "fuzz/manifest.json", &m);
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", rc ? ckpt_error_last() : "");
    int rref = manifest_decode_reference(text, len, "fuzz/manifest.json", &ref);
    if (rc != rref || (rc && strcmp(msg, ckpt_error_last()) != 0)) {
        fprintf(stderr, "fuzz_manifest: the quick route says %d (%s), jansson %d (%s)\n", rc,
                msg, rref, ckpt_error_last());
        abort();
    }
    if (rc == CKPT_OK) {
        same_or_die(&m, &ref, "the quick route and jansson decode different values");
        manifest_clear(&ref);
    }
    if (rc == CKPT_OK) {
        /* Whatever was accepted must be usable: walk it, then round-trip. */
        for (size_t i = 0; i < m.ntensors; i++)
            if (m.tensors[i].shard >= m.nshards || !m.tensors[i].name[0] ||
                m.tensors[i].ndim < 0 || m.tensors[i].ndim > CKPT_MAX_DIMS)
                abort();
        char *again;
        size_t alen;
        if (manifest_encode(&m, &again, &alen) == CKPT_OK) {
            manifest m2;
            if (manifest_decode(again, alen, "fuzz/re-encoded", &m2) != CKPT_OK) {
                fprintf(stderr, "fuzz_manifest: re-encoded manifest refused: %s\n",
                        ckpt_error_last());
                abort();
            }
            same_or_die(&m, &m2, "decode(encode(decode(x))) differs from decode(x)");
            manifest_clear(&m2);
            free(again);
        }
        manifest_clear(&m);
    }
    free(text);
    return 0;
}

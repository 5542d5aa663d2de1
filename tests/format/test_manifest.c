/* manifest (lib/format/manifest.c): the tensors array is written by hand,
 * not through jansson (speed); its text must be exactly what jansson prints
 * for the same document, and decode back to the same tensors, whatever
 * the names hold (quotes, backslashes, control characters, non-ASCII). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "jsontext.h"
#include "manifest.h"

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
    m->metadata = json_pack("{s:[i]}", "tensors", 1); /* a decoy "tensors" key */
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
    char *ref = jsontext_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
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

/* ------------------------------------------------------------ split decode */

/* The writer decodes its manifest back in pieces (the document without the
 * tensors, runs of tensors): the result must be manifest_decode's, however
 * the tensors are cut into runs. */
static void decode_split(const char *text, size_t len, const manifest_split *sp,
                         const size_t *bounds, size_t nb, manifest *out, int *rc)
{
    *rc = manifest_decode_head(text, len, sp, "t", out);
    if (*rc)
        return;
    manifest_tensor *t = calloc(sp->n, sizeof *t);
    cr_assert_not_null(t);
    for (size_t i = 0; i + 1 < nb && !*rc; i++)
        *rc = manifest_decode_piece(text, sp, bounds[i], bounds[i + 1], "t", t);
    free(out->tensors);
    out->tensors = t;
    out->ntensors = sp->n;
    if (!*rc)
        *rc = manifest_decode_finish(out, "t");
}

static void same_manifest(const manifest *a, const manifest *b)
{
    cr_assert_eq(a->step, b->step);
    cr_assert_eq(a->ntensors, b->ntensors);
    cr_assert_eq(a->nshards, b->nshards);
    cr_assert(json_equal(a->env, b->env));
    cr_assert(json_equal(a->metadata, b->metadata));
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

Test(manifest, split_decode_is_decode)
{
    manifest m, whole;
    fill(&m, N);
    char *text, *plain;
    size_t len, plen;
    manifest_split sp;
    cr_assert_eq(manifest_encode_split(&m, &text, &len, &sp), CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(manifest_encode(&m, &plain, &plen), CKPT_OK);
    cr_assert(plen == len && memcmp(plain, text, len) == 0, "the split text differs");
    cr_assert_eq(sp.n, N);
    cr_assert_eq(manifest_decode(text, len, "t", &whole), CKPT_OK, "%s", ckpt_error_last());
    /* every tensor alone, all at once, and a cut in the middle */
    size_t each[N + 1], all[] = {0, N}, mid[] = {0, N / 2, N};
    for (size_t i = 0; i <= N; i++)
        each[i] = i;
    const size_t *cuts[] = {each, all, mid};
    size_t ncuts[] = {N + 1, 2, 3};
    for (int c = 0; c < 3; c++) {
        manifest back;
        int rc;
        decode_split(text, len, &sp, cuts[c], ncuts[c], &back, &rc);
        cr_assert_eq(rc, CKPT_OK, "cuts %d: %s", c, ckpt_error_last());
        same_manifest(&whole, &back);
        manifest_clear(&back);
    }
    manifest_clear(&whole);
    manifest_split_free(&sp);
    manifest_clear(&m);
    free(text);
    free(plain);
}

/* What the whole decode rejects, the split one rejects too. */
Test(manifest, split_decode_rejects_what_decode_does)
{
    manifest m, back;
    fill(&m, N);
    free(m.tensors[N - 1].name);
    m.tensors[N - 1].name = strdup(NAMES[0]); /* a name twice, in different runs */
    char *text;
    size_t len;
    manifest_split sp;
    cr_assert_eq(manifest_encode_split(&m, &text, &len, &sp), CKPT_OK);
    cr_assert_eq(manifest_decode(text, len, "t", &back), CKPT_ECORRUPT);
    size_t mid[] = {0, N / 2, N};
    int rc;
    decode_split(text, len, &sp, mid, 3, &back, &rc);
    cr_assert_eq(rc, CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "appears twice"), "%s", ckpt_error_last());
    manifest_clear(&back);

    /* a shard the document does not list */
    m.tensors[N - 1].name[0] = 'z';
    m.tensors[1].shard = 1;
    manifest_split_free(&sp);
    free(text);
    cr_assert_eq(manifest_encode_split(&m, &text, &len, &sp), CKPT_OK);
    decode_split(text, len, &sp, mid, 3, &back, &rc);
    cr_assert_eq(rc, CKPT_ECORRUPT);
    cr_assert(strstr(ckpt_error_last(), "in shard 1 of 1"), "%s", ckpt_error_last());
    manifest_clear(&back);

    /* an edited text fails its checksum, whatever the cuts */
    text[sp.cut[1] + 8] ^= 1;
    cr_assert_eq(manifest_decode_head(text, len, &sp, "t", &back), CKPT_ECORRUPT);
    /* and cuts that are not the encoder's are refused */
    manifest_split bad = sp;
    bad.open += 1;
    text[sp.cut[1] + 8] ^= 1;
    cr_assert_eq(manifest_decode_head(text, len, &bad, "t", &back), CKPT_EINTERNAL);
    manifest_tensor t[N] = {0};
    size_t cut1 = sp.cut[1];
    sp.cut[1] += 8; /* inside the element: its "{" left out */
    cr_assert_neq(manifest_decode_piece(text, &sp, 1, 2, "t", t), CKPT_OK);
    sp.cut[1] = cut1;
    for (size_t i = 0; i < N; i++)
        free(t[i].name);
    manifest_split_free(&sp);
    manifest_clear(&m);
    free(text);
}

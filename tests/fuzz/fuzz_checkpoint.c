/* libFuzzer harness: a real checkpoint with a hostile shard file.
 *
 * Once per process: save a small checkpoint (two tensors, chunk_bytes 4096,
 * fsync 0) into a temporary root (under /dev/shm when it exists) and keep a
 * copy of its pristine shard and manifest.  For each input: start from the
 * pristine shard, apply the input as a patch list, make the checksums that
 * guard the index match again (as tests/unit/test_hostile.c does), write the
 * shard and manifest back, then run ckpt_verify(FULL) and ckpt_restore.
 *
 * Input layout:
 *   byte 0          flags
 *                     0x01  recompute every in-bounds entry's stored-bytes
 *                           hash after patching (mutated frames reach zstd
 *                           and the un-shuffle; the raw hash still guards)
 *                     0x02  rewrite the manifest's chunk accounting (shard
 *                           "chunks", each tensor's "chunks"/"stored_bytes")
 *                           from the patched index, so structural index
 *                           mutations reach the tiling/bounds checks
 *                     0x04  resize the shard: bytes 1..2 are a signed LE
 *                           delta (the manifest's "bytes" follows)
 *   then            records of 3 bytes: u16 LE position, u8 value.  A
 *                   position with bit 15 set counts back from the file's
 *                   end (bit 15 clear: from its start), modulo the size.
 * The index checksum is always recomputed into the trailer and the
 * manifest when the (patched) trailer locates an index inside the file;
 * the manifest checksum is always recomputed.
 *
 * Bugs (abort): any sanitizer report or crash; restore returning CKPT_OK
 * with bytes that differ from what was saved (silent corruption); verify
 * FULL returning CKPT_OK while restore fails; a status other than OK,
 * ECORRUPT, EINCOMPLETE or EVERSION from either call. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "codec.h"
#include "shard.h"
#include "util.h"

#define NA 2000  /* float32: compressible, zstd with shuffle width 4 */
#define NB 6000  /* uint8: a random chunk stored raw, then a zero run (zstd, width 1) */

static float data_a[NA];
static unsigned char data_b[NB];
static char root[256], spath[512], mpath[512];
static unsigned char *pristine;
static size_t pristine_len;
static json_t *mtemplate; /* pristine manifest without "checksum" */
static ckpt_store *rstore;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_checkpoint: setup failed: %s: %s\n", what, ckpt_error_last());
    abort();
}

static void cleanup(void)
{
    ckpt_store_free(rstore);
    if (root[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "fuzz_checkpoint: cannot remove %s\n", root);
    }
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n)
        die(path);
    p[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void put_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
        die(path);
}

static void setup(void)
{
    struct stat st;
    snprintf(root, sizeof root, "%s/ckpt-fuzz-XXXXXX",
             stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(root))
        die("mkdtemp");
    atexit(cleanup);
    for (int i = 0; i < NA; i++)
        data_a[i] = (float)i * 0.5f;
    uint32_t x = 12345;
    for (int i = 0; i < NB; i++) {
        x = x * 1103515245u + 12345u;
        data_b[i] = i < 4096 ? (unsigned char)(x >> 24) : (unsigned char)(i % 3 == 0);
    }
    ckpt_store *s;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.chunk_bytes = 4096;
    o.fsync = 0;
    o.threads = 1;
    if (ckpt_store_open(&s, root, &o) != CKPT_OK)
        die("ckpt_store_open");
    int64_t sa[1] = {NA}, sb[2] = {NB / 100, 100};
    ckpt_tensor t[2] = {{"a", data_a, sizeof data_a, CKPT_F32, 1, sa, CKPT_MEM_HOST},
                        {"b", data_b, sizeof data_b, CKPT_U8, 2, sb, CKPT_MEM_HOST}};
    if (ckpt_save_sync(s, 1, t, 2, NULL) != CKPT_OK)
        die("ckpt_save_sync");
    ckpt_store_free(s);
    snprintf(spath, sizeof spath, "%s/step-000000000001/rank-00000.shard", root);
    snprintf(mpath, sizeof mpath, "%s/step-000000000001/manifest.json", root);
    pristine = slurp(spath, &pristine_len);
    size_t mlen;
    unsigned char *mtext = slurp(mpath, &mlen);
    json_error_t e;
    mtemplate = json_loadb((const char *)mtext, mlen, 0, &e);
    if (!mtemplate)
        die("manifest parse");
    json_object_del(mtemplate, "checksum");
    free(mtext);
    o.flags = CKPT_OPEN_READONLY;
    if (ckpt_store_open(&rstore, root, &o) != CKPT_OK)
        die("read-only open");
    if (ckpt_verify(rstore, 1, CKPT_VERIFY_FULL, NULL) != CKPT_OK)
        die("pristine verify");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setup();
    return 0;
}

/* Manifest with a correct checksum (docs/FORMAT.md). */
static void store_manifest(json_t *m)
{
    char *body = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!body)
        die("json_dumps");
    size_t blen = strlen(body) - 2; /* drop "\n}" */
    char hex[17];
    util_hex64(codec_hash(body, blen), hex);
    FILE *f = fopen(mpath, "wb");
    if (!f)
        die(mpath);
    fprintf(f, "%.*s,\n  \"checksum\": \"%s\"\n}\n", (int)blen, body, hex);
    fclose(f);
    free(body);
}

static int acceptable(int rc)
{
    return rc == CKPT_OK || rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE ||
           rc == CKPT_EVERSION;
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t n)
{
    if (n < 1 || n > 3 + 3 * 512)
        return 0;
    unsigned flags = in[0];
    size_t pos = 1;
    size_t size = pristine_len;
    if ((flags & 0x04) && n >= 3) {
        int delta = (int16_t)(in[1] | in[2] << 8);
        delta %= 4096;
        if ((long)size + delta < 0)
            delta = -(int)size;
        size = (size_t)((long)size + delta);
        pos = 3;
    }
    unsigned char *buf = calloc(size ? size : 1, 1);
    if (!buf)
        abort();
    memcpy(buf, pristine, size < pristine_len ? size : pristine_len);
    for (; size && pos + 3 <= n; pos += 3) {
        unsigned p = in[pos] | in[pos + 1] << 8;
        size_t off = (p & 0x8000) ? size - 1 - (p & 0x7fff) % size : p % size;
        buf[off] = in[pos + 2];
    }

    json_t *m = json_deep_copy(mtemplate);
    json_t *sh = json_array_get(json_object_get(m, "shards"), 0);
    json_object_set_new(sh, "bytes", json_integer((json_int_t)size));
    if (size >= SHARD_HEADER_SIZE + SHARD_TRAILER_SIZE) {
        unsigned char *t = buf + size - SHARD_TRAILER_SIZE;
        uint64_t ioff = util_get_u64(t), count = util_get_u64(t + 8), ilen, iend;
        int located = util_mul_u64(count, SHARD_ENTRY_SIZE, &ilen) &&
                      util_add_u64(ioff, ilen, &iend) && iend <= size - SHARD_TRAILER_SIZE;
        if (located) {
            unsigned char *ix = buf + ioff;
            json_t *ts = json_object_get(m, "tensors");
            size_t nt = json_array_size(ts);
            uint64_t chunks[2] = {0, 0}, stored[2] = {0, 0};
            int started[2] = {0, 0}, ended[2] = {0, 0};
            for (uint64_t i = 0; i < count; i++) {
                unsigned char *e = ix + i * SHARD_ENTRY_SIZE;
                uint64_t slen = util_get_u64(e + 24), foff = util_get_u64(e + 32), fend;
                if ((flags & 0x01) && util_add_u64(foff, slen, &fend) && fend <= size)
                    util_put_be64(e + 40, codec_hash(buf + foff, (size_t)slen));
                /* Accounting as lib/reader.c counts it: the run of entries
                 * starting at a tensor's first one. */
                uint32_t ti = util_get_u32(e);
                for (uint32_t k = 0; k < 2; k++) {
                    if (ti == k && !ended[k]) {
                        started[k] = 1;
                        chunks[k]++;
                        stored[k] += slen;
                    } else if (started[k]) {
                        ended[k] = 1;
                    }
                }
            }
            uint64_t h = codec_hash(ix, (size_t)ilen);
            util_put_be64(t + 16, h);
            if ((flags & 0x02) && count <= (1ull << 40)) {
                json_object_set_new(sh, "chunks", json_integer((json_int_t)count));
                for (size_t k = 0; k < nt && k < 2; k++) {
                    json_t *jt = json_array_get(ts, k);
                    json_object_set_new(jt, "chunks", json_integer((json_int_t)chunks[k]));
                    json_object_set_new(jt, "stored_bytes",
                                        json_integer((json_int_t)(stored[k] & INT64_MAX)));
                }
            }
        }
        char hex[17];
        util_hex64(util_get_be64(t + 16), hex);
        json_object_set_new(sh, "index_xxh3", json_string(hex));
    }
    put_file(spath, buf, size);
    store_manifest(m);
    json_decref(m);
    free(buf);

    int vrc = ckpt_verify(rstore, 1, CKPT_VERIFY_FULL, NULL);
    char vmsg[512];
    snprintf(vmsg, sizeof vmsg, "%s", ckpt_error_last());
    static float out_a[NA];
    static unsigned char out_b[NB];
    memset(out_a, 0xA5, sizeof out_a);
    memset(out_b, 0x5A, sizeof out_b);
    int64_t sa[1] = {NA}, sb[2] = {NB / 100, 100};
    ckpt_tensor t[2] = {{"a", out_a, sizeof out_a, CKPT_F32, 1, sa, CKPT_MEM_HOST},
                        {"b", out_b, sizeof out_b, CKPT_U8, 2, sb, CKPT_MEM_HOST}};
    int rrc = ckpt_restore(rstore, 1, t, 2, NULL, NULL);
    if (!acceptable(vrc) || !acceptable(rrc)) {
        fprintf(stderr, "fuzz_checkpoint: unexpected status: verify %d (%s), restore %d (%s)\n",
                vrc, vmsg, rrc, ckpt_error_last());
        abort();
    }
    if (rrc == CKPT_OK && (memcmp(out_a, data_a, sizeof data_a) ||
                           memcmp(out_b, data_b, sizeof data_b))) {
        fprintf(stderr, "fuzz_checkpoint: SILENT CORRUPTION: restore returned CKPT_OK with "
                "wrong bytes (verify %d: %s)\n", vrc, vmsg);
        abort();
    }
    if (vrc == CKPT_OK && rrc != CKPT_OK) {
        fprintf(stderr, "fuzz_checkpoint: verify FULL passed but restore failed: %d (%s)\n",
                rrc, ckpt_error_last());
        abort();
    }
    return 0;
}

/* Every single-bit change anywhere in a checkpoint is detected by full
 * verification, and the checkpoint verifies again once it is undone. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "helpers.h"


static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

Test(flip, every_byte_of_every_file_is_covered, .timeout = 600)
{
    char root[] = "/tmp/ckpt-flip-XXXXXX";
    cr_assert_not_null(mkdtemp(root));
    ckpt_store *s;
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    o.chunk_bytes = 4096;
    o.fsync = 0;
    o.threads = 1;
    o.flags = CKPT_OPEN_COMPRESS_ALL; /* zstd frames too, not only raw ones */
    cr_assert_eq(ckpt_store_open(&s, root, &o), CKPT_OK, "%s", ckpt_error_last());
    float w[1500];
    unsigned char b[700];
    for (int i = 0; i < 1500; i++)
        w[i] = (float)i * 0.25f;
    for (int i = 0; i < 700; i++)
        b[i] = (unsigned char)((i * 7919) >> 3);
    int64_t sw[2] = {30, 50}, sb[1] = {700};
    ckpt_tensor t[2] = {{"w", w, sizeof w, CKPT_F32, 2, sw, CKPT_MEM_HOST},
                        {"b", b, sizeof b, CKPT_U8, 1, sb, CKPT_MEM_HOST}};
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.metadata_json = "{\"epoch\": 3}";
    cr_assert_eq(ckpt_save_sync(s, 5, t, 2, &so), CKPT_OK, "%s", ckpt_error_last());

    const char *names[2] = {"rank-00000.shard", "manifest.json"};
    for (int f = 0; f < 2; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/step-000000000005/%s", root, names[f]);
        long n = file_size(path);
        cr_assert_gt(n, 100);
        for (long off = 0; off < n; off++) {
            tc_flip_byte(path, off);
            int rc = ckpt_verify(s, 5, CKPT_VERIFY_FULL, NULL);
            cr_assert(rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE || rc == CKPT_EVERSION,
                      "%s: a flipped bit at offset %ld went unnoticed (rc %d)", names[f], off, rc);
            tc_flip_byte(path, off);
        }
    }
    cr_assert_eq(ckpt_verify(s, 5, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    memset(w, 0, sizeof w);
    cr_assert_eq(ckpt_restore(s, 5, t, 2, NULL, NULL), CKPT_OK);
    cr_assert_eq(w[1499], 1499 * 0.25f);
    ckpt_store_free(s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_assert_eq(system(cmd), 0);
}

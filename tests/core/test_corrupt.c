/* Damaged checkpoints: a restore of CKPT_LATEST skips the damaged newest
 * step for the one before it and says why; verify finds the damage; an
 * explicit restore of the damaged step fails; with every step damaged there
 * is nothing to restore. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <xxhash.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "shard.h"
#include "testing.h"

TestSuite(corrupt, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

enum damage {
    FLIP_FRAME,     /* one byte in the middle of the shard (inside a frame) */
    FLIP_MANIFEST,  /* one byte in the middle of manifest.json */
    FLIP_INDEX,     /* one byte in the shard's index, before the trailer */
    FLIP_TRAILER,   /* the last byte of the shard */
    FLIP_HEADER,    /* the first byte of the shard (magic) */
    TRUNCATE_SHARD, /* shard cut in half */
    TRUNCATE_TAIL,  /* shard loses its last byte */
    EMPTY_SHARD,    /* shard of zero bytes */
    DELETE_SHARD,
    DELETE_MANIFEST,
    EMPTY_MANIFEST,
    TRUNCATE_MANIFEST,
};

static const char *damage_name[] = {
    "flip a frame byte", "flip a manifest byte", "flip an index byte",
    "flip the last trailer byte", "flip the first header byte",
    "truncate the shard to half", "truncate the shard's last byte",
    "empty the shard", "delete the shard", "delete the manifest",
    "empty the manifest", "truncate the manifest",
};

/* Steps 1..3 hold states seeded 1..3.  Chunks are small so that a shard
 * holds many frames and an index of many entries. */
static tc_state states[4];

static void save_three(void)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 16 * 1024;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    for (int i = 1; i <= 3; i++) {
        tc_state_standard(&states[i], (uint64_t)i);
        tc_save_ok(st, i, &states[i]);
    }
    ckpt_store_free(st);
}

static void free_three(void)
{
    for (int i = 1; i <= 3; i++)
        tc_state_free(&states[i]);
}

static void damage_step(int64_t step, enum damage d)
{
    char *dir = tc_step_dir(tc_root, step);
    char *man = tc_join(dir, "manifest.json");
    char *shard = tc_find_suffix(dir, ".shard");
    cr_assert(tc_exists(man), "no %s", man);
    cr_assert(shard, "no *.shard in %s", dir);
    int64_t ssize = tc_file_size(shard), msize = tc_file_size(man);
    /* The standard state makes ~14 chunks of up to 16 KiB, 36 KiB of them
     * random: the middle of the shard is inside a frame, the index is far
     * larger than 300 bytes and the trailer far smaller. */
    cr_assert_gt(ssize, 30 * 1024, "shard of %" PRId64 " bytes", ssize);
    switch (d) {
    case FLIP_FRAME: tc_flip_byte(shard, ssize / 2); break;
    case FLIP_MANIFEST: tc_flip_byte(man, msize / 2); break;
    case FLIP_INDEX: tc_flip_byte(shard, -300); break;
    case FLIP_TRAILER: tc_flip_byte(shard, -1); break;
    case FLIP_HEADER: tc_flip_byte(shard, 0); break;
    case TRUNCATE_SHARD: tc_truncate(shard, ssize / 2); break;
    case TRUNCATE_TAIL: tc_truncate(shard, ssize - 1); break;
    case EMPTY_SHARD: tc_truncate(shard, 0); break;
    case DELETE_SHARD: cr_assert_eq(unlink(shard), 0); break;
    case DELETE_MANIFEST: cr_assert_eq(unlink(man), 0); break;
    case EMPTY_MANIFEST: tc_truncate(man, 0); break;
    case TRUNCATE_MANIFEST: tc_truncate(man, msize - 2); break;
    }
    free(shard);
    free(man);
    free(dir);
}

static int is_damage_status(int rc)
{
    return rc == CKPT_ECORRUPT || rc == CKPT_EINCOMPLETE;
}

/* Does quick verification (structure, sizes, index, manifest) see it? */
static int quick_sees(enum damage d)
{
    return d != FLIP_FRAME;
}

static void check_fallback(enum damage d, int readonly)
{
    const char *dn = damage_name[d];
    save_three();
    damage_step(3, d);
    ckpt_store *st = readonly ? tc_open_ro(tc_root) : tc_open(tc_root);

    /* restore(LATEST) falls back to step 2 and reports step 3 */
    tc_state got;
    tc_state_like(&got, &states[2], 0x11);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep);
    cr_assert_eq(rc, CKPT_OK, "%s: restore(LATEST) = %d (%s): %s", dn, rc,
                 ckpt_strerror(rc), ckpt_error_last());
    cr_assert(rep);
    cr_assert_eq(ckpt_report_step(rep), 2, "%s: restored step %" PRId64, dn,
                 ckpt_report_step(rep));
    tc_assert_state_eq(&got, &states[2], dn);
    size_t n = ckpt_report_count(rep);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        cr_assert(p);
        cr_assert(tc_nonempty(p->message), "%s: problem %zu has no message", dn, i);
        cr_assert(p->file && p->tensor, "%s: NULL file/tensor in problem", dn);
        cr_assert_neq(p->step, 2, "%s: the restored step is listed as a problem", dn);
        if (p->step == 3) {
            found = 1;
            cr_assert(is_damage_status(p->status), "%s: problem status %d (%s)", dn,
                      p->status, ckpt_strerror(p->status));
        }
    }
    cr_assert(found, "%s: report (%zu problems) does not list step 3", dn, n);
    ckpt_report_free(rep);

    /* ckpt_restore_open falls back the same way (the whole state is read,
     * so every damage is met) and hands back step 2, open. */
    ckpt_checkpoint *kept = (ckpt_checkpoint *)&rc; /* must be reset */
    tc_state_free(&got);
    tc_state_like(&got, &states[2], 0x22);
    rc = ckpt_restore_open(st, CKPT_LATEST, got.t, got.count, NULL, NULL, &kept);
    cr_assert_eq(rc, CKPT_OK, "%s: restore_open(LATEST) = %d: %s", dn, rc, ckpt_error_last());
    cr_assert_not_null(kept);
    cr_assert_eq(ckpt_checkpoint_step(kept), 2, "%s: restore_open gave step %lld", dn,
                 (long long)ckpt_checkpoint_step(kept));
    cr_assert_eq(ckpt_checkpoint_tensor_count(kept), states[2].count);
    tc_assert_state_eq(&got, &states[2], dn);
    ckpt_checkpoint_free(kept);
    /* The damaged step asked for by number: the error, and no handle. */
    kept = (ckpt_checkpoint *)&rc;
    rc = ckpt_restore_open(st, 3, got.t, got.count, NULL, NULL, &kept);
    cr_assert(is_damage_status(rc), "%s: restore_open(3) = %d", dn, rc);
    cr_assert_null(kept, "%s: restore_open(3) failed but handed out a checkpoint", dn);
    cr_assert_eq(ckpt_restore_open(st, CKPT_LATEST, got.t, got.count, NULL, NULL, NULL),
                 CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), "ckpt_restore_open"), "%s", ckpt_error_last());
    tc_state_free(&got);

    /* verify finds the damage */
    rep = NULL;
    rc = ckpt_verify(st, 3, CKPT_VERIFY_FULL, &rep);
    cr_assert(is_damage_status(rc), "%s: verify(3, FULL) = %d (%s)", dn, rc,
              ckpt_strerror(rc));
    cr_assert(tc_nonempty(ckpt_error_last()), "%s: verify failed without a message", dn);
    cr_assert(rep, "%s: verify gave no report", dn);
    cr_assert_geq(ckpt_report_count(rep), 1, "%s: verify report is empty", dn);
    for (size_t i = 0; i < ckpt_report_count(rep); i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        cr_assert(tc_nonempty(p->message));
        cr_assert_eq(p->step, 3);
        cr_assert(is_damage_status(p->status), "%s: verify problem status %d", dn,
                  p->status);
    }
    ckpt_report_free(rep);

    rc = ckpt_verify(st, 3, CKPT_VERIFY_QUICK, NULL);
    if (quick_sees(d))
        cr_assert(is_damage_status(rc), "%s: verify(3, QUICK) = %d", dn, rc);
    else
        cr_assert_eq(rc, CKPT_OK, "%s: verify(3, QUICK) = %d: %s", dn, rc,
                     ckpt_error_last());
    /* CKPT_NEWEST is the newest committed step: the damaged step 3 */
    rc = ckpt_verify(st, CKPT_NEWEST, CKPT_VERIFY_FULL, NULL);
    cr_assert(is_damage_status(rc), "%s: verify(NEWEST) = %d", dn, rc);
    /* CKPT_LATEST is the newest step that passes: step 2, as for restore */
    rep = NULL;
    rc = ckpt_verify(st, CKPT_LATEST, CKPT_VERIFY_FULL, &rep);
    cr_assert_eq(rc, CKPT_OK, "%s: verify(LATEST) = %d: %s", dn, rc, ckpt_error_last());
    cr_assert_eq(ckpt_report_step(rep), 2, "%s: verify(LATEST) checked step %lld", dn,
                 (long long)ckpt_report_step(rep));
    ckpt_report_free(rep);
    for (int64_t s = 1; s <= 2; s++) {
        rep = NULL;
        rc = ckpt_verify(st, s, CKPT_VERIFY_FULL, &rep);
        cr_assert_eq(rc, CKPT_OK, "%s: verify(%" PRId64 ") = %d: %s", dn, s, rc,
                     ckpt_error_last());
        cr_assert_eq(ckpt_report_count(rep), 0);
        cr_assert_eq(ckpt_report_step(rep), s);
        ckpt_report_free(rep);
    }

    /* explicit restore of the damaged step fails; of older ones works */
    tc_state_like(&got, &states[3], 0x22);
    rep = NULL;
    ckpt_error_clear();
    rc = ckpt_restore(st, 3, got.t, got.count, NULL, &rep);
    cr_assert(is_damage_status(rc), "%s: restore(3) = %d (%s)", dn, rc, ckpt_strerror(rc));
    cr_assert(tc_nonempty(ckpt_error_last()), "%s: restore(3) failed without message", dn);
    cr_assert_eq(ckpt_error_last_status(), rc);
    ckpt_report_free(rep);
    tc_state_free(&got);
    tc_restore_check(st, 1, &states[1]);
    tc_restore_check(st, 2, &states[2]);

    /* ckpt_load(3) fails unless the damage misses that tensor: check all */
    int load_failed = 0;
    for (size_t i = 0; i < states[3].count; i++) {
        void *data = NULL;
        uint64_t bytes = 0;
        rc = ckpt_load(st, 3, states[3].t[i].name, &data, &bytes, NULL);
        if (rc == CKPT_OK)
            cr_assert(memcmp(data, states[3].t[i].data, bytes) == 0,
                      "%s: ckpt_load(3, %s) returned wrong data with CKPT_OK", dn,
                      states[3].t[i].name);
        else
            load_failed++;
        ckpt_free(data);
    }
    cr_assert_gt(load_failed, 0, "%s: every tensor of step 3 loaded", dn);

    /* latest */
    int64_t latest = -7;
    rc = ckpt_store_latest(st, CKPT_VERIFY_FULL, &latest);
    cr_assert_eq(rc, CKPT_OK, "%s: %s", dn, ckpt_error_last());
    cr_assert_eq(latest, 2, "%s: latest(FULL) = %" PRId64, dn, latest);
    rc = ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest);
    cr_assert_eq(rc, CKPT_OK, "%s: %s", dn, ckpt_error_last());
    cr_assert_eq(latest, quick_sees(d) ? 2 : 3, "%s: latest(QUICK) = %" PRId64, dn,
                 latest);

    /* checkpoint_open(LATEST) is the newest passing quick verification */
    ckpt_checkpoint *ck = NULL;
    rc = ckpt_checkpoint_open(&ck, st, CKPT_LATEST, CKPT_VERIFY_QUICK);
    cr_assert_eq(rc, CKPT_OK, "%s: checkpoint_open(LATEST): %s", dn, ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_step(ck), quick_sees(d) ? 2 : 3);
    ckpt_checkpoint_free(ck);
    if (quick_sees(d)) {
        ck = NULL;
        rc = ckpt_checkpoint_open(&ck, st, 3, CKPT_VERIFY_QUICK);
        cr_assert(is_damage_status(rc), "%s: checkpoint_open(3) = %d", dn, rc);
        cr_assert_null(ck);
    } else {
        /* quick checks pass; reading the damaged frame does not */
        cr_assert_eq(ckpt_checkpoint_open(&ck, st, 3, CKPT_VERIFY_QUICK), CKPT_OK, "%s", ckpt_error_last());
        int bad = 0;
        for (size_t i = 0; i < states[3].count; i++) {
            void *buf = malloc(states[3].t[i].bytes + 1);
            rc = ckpt_checkpoint_read(ck, states[3].t[i].name, buf, states[3].t[i].bytes);
            if (rc != CKPT_OK) {
                cr_assert_eq(rc, CKPT_ECORRUPT, "%s: read = %d", dn, rc);
                bad++;
            } else {
                cr_assert(memcmp(buf, states[3].t[i].data, states[3].t[i].bytes) == 0);
            }
            free(buf);
        }
        cr_assert_geq(bad, 1, "%s: every tensor of step 3 read back", dn);
        ckpt_checkpoint_free(ck);
    }

    ckpt_store_free(st);
    free_three();
}

Test(corrupt, flip_frame_byte) { check_fallback(FLIP_FRAME, 0); }
Test(corrupt, flip_manifest_byte) { check_fallback(FLIP_MANIFEST, 0); }
Test(corrupt, flip_index_byte) { check_fallback(FLIP_INDEX, 0); }
Test(corrupt, flip_trailer_byte) { check_fallback(FLIP_TRAILER, 0); }
Test(corrupt, flip_header_byte) { check_fallback(FLIP_HEADER, 0); }
Test(corrupt, truncate_shard) { check_fallback(TRUNCATE_SHARD, 0); }
Test(corrupt, truncate_shard_tail) { check_fallback(TRUNCATE_TAIL, 0); }
Test(corrupt, empty_shard) { check_fallback(EMPTY_SHARD, 0); }
Test(corrupt, delete_shard) { check_fallback(DELETE_SHARD, 0); }
Test(corrupt, delete_manifest) { check_fallback(DELETE_MANIFEST, 0); }
Test(corrupt, empty_manifest) { check_fallback(EMPTY_MANIFEST, 0); }
Test(corrupt, truncate_manifest) { check_fallback(TRUNCATE_MANIFEST, 0); }

/* A manifest cut short is incomplete, as a shard cut short is (ckpt.h:
 * CKPT_EINCOMPLETE "a checkpoint file is missing or truncated"); one whose
 * checksum is there but wrong is damage. */
Test(corrupt, a_truncated_manifest_is_incomplete)
{
    save_three();
    char *dir = tc_step_dir(tc_root, 3);
    char *man = tc_join(dir, "manifest.json");
    int64_t size = tc_file_size(man);
    ckpt_store *st = tc_open_ro(tc_root);
    tc_truncate(man, size / 2);
    int rc = ckpt_verify(st, 3, CKPT_VERIFY_QUICK, NULL);
    cr_assert_eq(rc, CKPT_EINCOMPLETE, "half: %s: %s", ckpt_status_name(rc), ckpt_error_last());
    tc_truncate(man, 10);
    rc = ckpt_verify(st, 3, CKPT_VERIFY_QUICK, NULL);
    cr_assert_eq(rc, CKPT_EINCOMPLETE, "10 bytes: %s: %s", ckpt_status_name(rc),
                 ckpt_error_last());
    ckpt_store_free(st);
    free(man);
    free(dir);
}
Test(corrupt, flip_frame_byte_readonly) { check_fallback(FLIP_FRAME, 1); }
Test(corrupt, delete_shard_readonly) { check_fallback(DELETE_SHARD, 1); }

/* Each byte of a small manifest, flipped in turn, is caught. */
Test(corrupt, every_manifest_byte)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state s;
    tc_state_init(&s);
    int64_t n[1] = {3};
    tc_state_add(&s, "w", CKPT_F32, 1, n, TC_RANDOM, 1);
    tc_save_ok(st, 1, &s);
    char *dir = tc_step_dir(tc_root, 1);
    char *man = tc_join(dir, "manifest.json");
    int64_t size = tc_file_size(man);
    int missed = 0;
    char missed_at[256] = "";
    for (int64_t off = 0; off < size; off++) {
        tc_flip_byte(man, off);
        int rc = ckpt_verify(st, 1, CKPT_VERIFY_QUICK, NULL);
        if (rc == CKPT_OK) {
            /* Flipping a byte may leave an equivalent JSON document only if
             * the manifest checksum does not cover it: report the offsets. */
            missed++;
            if (strlen(missed_at) < 200)
                snprintf(missed_at + strlen(missed_at), sizeof missed_at - strlen(missed_at),
                         " %" PRId64, off);
        } else {
            cr_assert(is_damage_status(rc), "flip at %" PRId64 ": verify = %d", off, rc);
        }
        tc_flip_byte(man, off);
    }
    cr_assert_eq(missed, 0, "%d of %" PRId64 " manifest byte flips not detected, at:%s",
                 missed, size, missed_at);
    cr_assert_eq(ckpt_verify(st, 1, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    free(man);
    free(dir);
    tc_state_free(&s);
    ckpt_store_free(st);
}

/* Flip one byte at a time over the whole shard of a small checkpoint (every
 * 7th byte to bound the run time): full verification catches each flip and
 * restore never returns CKPT_OK with wrong data. */
Test(corrupt, sweep_shard_bytes, .timeout = 600)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 4096;
    o.flags |= CKPT_OPEN_COMPRESS_ALL; /* zstd frames too, not only raw ones */
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_init(&s);
    int64_t a[1] = {1500}, b[1] = {300};
    tc_state_add(&s, "a", CKPT_F32, 1, a, TC_RANDOM, 1);
    tc_state_add(&s, "b", CKPT_U16, 1, b, TC_COMPRESSIBLE, 2);
    tc_save_ok(st, 1, &s);
    char *dir = tc_step_dir(tc_root, 1);
    char *shard = tc_find_suffix(dir, ".shard");
    cr_assert(shard);
    int64_t size = tc_file_size(shard);
    for (int64_t off = 0; off < size; off += 7) {
        tc_flip_byte(shard, off);
        int rc = ckpt_verify(st, 1, CKPT_VERIFY_FULL, NULL);
        cr_assert(is_damage_status(rc), "flip at %" PRId64 "/%" PRId64
                  ": verify(FULL) = %d (%s)", off, size, rc, ckpt_strerror(rc));
        tc_state got;
        tc_state_like(&got, &s, 0);
        rc = ckpt_restore(st, 1, got.t, got.count, NULL, NULL);
        cr_assert(is_damage_status(rc), "flip at %" PRId64 ": restore = %d", off, rc);
        tc_state_free(&got);
        tc_flip_byte(shard, off);
    }
    cr_assert_eq(ckpt_verify(st, 1, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    tc_restore_check(st, 1, &s);
    free(shard);
    free(dir);
    tc_state_free(&s);
    ckpt_store_free(st);
}

/* Only the step 1 is good: the report lists both newer ones. */
Test(corrupt, falls_back_two_steps)
{
    save_three();
    damage_step(3, FLIP_FRAME);
    damage_step(2, DELETE_SHARD);
    ckpt_store *st = tc_open(tc_root);
    tc_state got;
    tc_state_like(&got, &states[1], 0);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep);
    cr_assert_eq(rc, CKPT_OK, "%s", ckpt_error_last());
    cr_assert_eq(ckpt_report_step(rep), 1);
    tc_assert_state_eq(&got, &states[1], "restore");
    int seen2 = 0, seen3 = 0;
    for (size_t i = 0; i < ckpt_report_count(rep); i++) {
        const ckpt_problem *p = ckpt_report_get(rep, i);
        seen2 |= p->step == 2;
        seen3 |= p->step == 3;
    }
    cr_assert(seen2 && seen3, "report must list steps 2 and 3 (has %zu problems)",
              ckpt_report_count(rep));
    ckpt_report_free(rep);
    int64_t latest = -1;
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_FULL, &latest), CKPT_OK);
    cr_assert_eq(latest, 1);
    tc_state_free(&got);
    ckpt_store_free(st);
    free_three();
}

Test(corrupt, all_steps_damaged)
{
    save_three();
    damage_step(1, FLIP_FRAME);
    damage_step(2, FLIP_MANIFEST);
    damage_step(3, TRUNCATE_SHARD);
    ckpt_store *st = tc_open(tc_root);
    tc_state got;
    tc_state_like(&got, &states[1], 0);
    ckpt_report *rep = NULL;
    ckpt_error_clear();
    int rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep);
    cr_assert_eq(rc, CKPT_ENOCKPT, "restore = %d (%s)", rc, ckpt_strerror(rc));
    cr_assert(tc_nonempty(ckpt_error_last()));
    if (rep) {
        cr_assert_eq(ckpt_report_step(rep), -1);
        cr_assert_geq(ckpt_report_count(rep), 3, "every damaged step is reported");
    }
    ckpt_report_free(rep);
    int64_t latest = 42;
    rc = ckpt_store_latest(st, CKPT_VERIFY_FULL, &latest);
    cr_assert_eq(rc, CKPT_ENOCKPT, "latest(FULL) = %d, step %" PRId64, rc, latest);
    rc = ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest);
    cr_assert_eq(rc, CKPT_OK, "step 1 passes quick verification: %s", ckpt_error_last());
    cr_assert_eq(latest, 1);
    /* all three are still listed as committed */
    int64_t want[3] = {1, 2, 3};
    tc_assert_steps(st, want, 3);
    tc_state_free(&got);
    ckpt_store_free(st);
    free_three();
}

/* An empty root has nothing to restore. */
Test(corrupt, empty_root)
{
    ckpt_store *st = tc_open(tc_root);
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, s.t, s.count, NULL, &rep);
    cr_assert_eq(rc, CKPT_ENOCKPT, "restore = %d", rc);
    cr_assert(tc_nonempty(ckpt_error_last()));
    ckpt_report_free(rep);
    int64_t latest;
    cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest), CKPT_ENOCKPT);
    ckpt_checkpoint *ck = NULL;
    rc = ckpt_checkpoint_open(&ck, st, CKPT_LATEST, CKPT_VERIFY_QUICK);
    cr_assert(rc == CKPT_ENOCKPT || rc == CKPT_ENOTFOUND, "checkpoint_open = %d", rc);
    cr_assert_null(ck);
    size_t n;
    int64_t *steps = tc_steps(st, &n);
    cr_assert_eq(n, 0);
    ckpt_free(steps);
    tc_state_free(&s);
    ckpt_store_free(st);
}

/* Hostile names in the root are not checkpoints. */
Test(corrupt, junk_in_root_is_ignored)
{
    save_three();
    const char *junk_dirs[] = {"step-abc", "step-", "step-00000000000x",
                               "step--00000000001", "steps", "step-000000000009.old"};
    for (size_t i = 0; i < sizeof junk_dirs / sizeof junk_dirs[0]; i++) {
        char *p = tc_join(tc_root, junk_dirs[i]);
        cr_assert_eq(mkdir(p, 0755), 0);
        free(p);
    }
    /* a file where a step directory would be */
    char *f = tc_join(tc_root, "step-000000000010");
    tc_write_file(f, "not a directory", 15);
    free(f);
    ckpt_store *st = tc_open_ro(tc_root);
    size_t n;
    int64_t *steps = tc_steps(st, &n);
    for (size_t i = 0; i < n; i++)
        cr_assert(steps[i] >= 1 && steps[i] <= 3 ? 1 : steps[i] == 10,
                  "junk listed as step %" PRId64, steps[i]);
    ckpt_free(steps);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &states[3]), 3);
    ckpt_store_free(st);
    free_three();
}

/* ------------------------------------------------- hostile manifests */

/* Edit step 3's manifest as JSON and write it back with a correct checksum
 * (docs/FORMAT.md), so that only the schema checks can catch the edit. */
typedef void (*edit_fn)(json_t *m);

static void rewrite_manifest(int64_t step, edit_fn edit)
{
    char *dir = tc_step_dir(tc_root, step);
    char *path = tc_join(dir, "manifest.json");
    json_error_t err;
    json_t *m = json_load_file(path, 0, &err);
    cr_assert(m, "%s: %s", path, err.text);
    cr_assert(json_object_get(m, "checksum"), "manifest without checksum");
    json_object_del(m, "checksum");
    edit(m);
    char *text = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    cr_assert(text);
    size_t len = strlen(text);
    cr_assert(len > 2 && strcmp(text + len - 2, "\n}") == 0);
    len -= 2; /* B: the object without its closing brace */
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    fprintf(f, ",\n  \"checksum\": \"%016llx\"\n}\n",
            (unsigned long long)XXH3_64bits(text, len));
    cr_assert_eq(fclose(f), 0);
    free(text);
    json_decref(m);
    free(path);
    free(dir);
}

static json_t *tensor0(json_t *m)
{
    return json_array_get(json_object_get(m, "tensors"), 0);
}
static json_t *shard0(json_t *m)
{
    return json_array_get(json_object_get(m, "shards"), 0);
}

static void ed_none(json_t *m) { (void)m; }
static void ed_bytes(json_t *m)
{
    json_t *t = tensor0(m);
    json_object_set_new(t, "bytes",
                        json_integer(json_integer_value(json_object_get(t, "bytes")) + 4));
}
static void ed_shape_overflow(json_t *m)
{
    json_t *sh = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(sh, json_integer((json_int_t)1 << 40));
    json_object_set_new(tensor0(m), "shape", sh);
}
static void ed_shape_negative(json_t *m)
{
    json_t *sh = json_pack("[I,I]", (json_int_t)-64, (json_int_t)-128);
    json_object_set_new(tensor0(m), "shape", sh);
}
static void ed_too_many_dims(json_t *m)
{
    json_t *sh = json_array();
    for (int i = 0; i < CKPT_MAX_DIMS + 1; i++)
        json_array_append_new(sh, json_integer(1));
    json_object_set_new(tensor0(m), "shape", sh);
}
static void ed_dtype(json_t *m) { json_object_set_new(tensor0(m), "dtype", json_string("float128")); }
static void ed_dtype_type(json_t *m) { json_object_set_new(tensor0(m), "dtype", json_integer(12)); }
static void ed_dup_name(json_t *m)
{
    json_t *t1 = json_array_get(json_object_get(m, "tensors"), 1);
    json_object_set(tensor0(m), "name", json_object_get(t1, "name"));
}
static void ed_empty_name(json_t *m) { json_object_set_new(tensor0(m), "name", json_string("")); }
static void ed_shard_index(json_t *m) { json_object_set_new(tensor0(m), "shard", json_integer(5)); }
static void ed_chunks(json_t *m) { json_object_set_new(tensor0(m), "chunks", json_integer(1000000)); }
static void ed_traversal(json_t *m)
{
    json_object_set_new(shard0(m), "file",
                        json_string("../step-000000000002/rank-00000.shard"));
}
static void ed_absolute(json_t *m) { json_object_set_new(shard0(m), "file", json_string("/etc/passwd")); }
static void ed_shard_bytes(json_t *m)
{
    json_object_set_new(shard0(m), "bytes", json_integer((json_int_t)1 << 62));
}
static void ed_no_shards(json_t *m) { json_object_set_new(m, "shards", json_array()); }
static void ed_no_tensors(json_t *m) { json_object_del(m, "tensors"); }
static void ed_step(json_t *m) { json_object_set_new(m, "step", json_integer(2)); }
static void ed_not_array(json_t *m) { json_object_set_new(m, "tensors", json_string("x")); }
static void ed_raw_bytes(json_t *m)
{
    json_object_set_new(json_object_get(m, "save"), "chunk_bytes", json_integer(0));
}

static const struct {
    const char *what;
    edit_fn edit;
} edits[] = {
    {"tensor bytes do not match its shape", ed_bytes},
    {"shape whose product overflows", ed_shape_overflow},
    {"negative dimensions", ed_shape_negative},
    {"17 dimensions", ed_too_many_dims},
    {"unknown dtype", ed_dtype},
    {"dtype of the wrong JSON type", ed_dtype_type},
    {"two tensors with one name", ed_dup_name},
    {"empty tensor name", ed_empty_name},
    {"shard index out of range", ed_shard_index},
    {"chunk count off", ed_chunks},
    {"shard file outside the step directory", ed_traversal},
    {"absolute shard file", ed_absolute},
    {"shard size wrong", ed_shard_bytes},
    {"no shards", ed_no_shards},
    {"no tensors member", ed_no_tensors},
    {"step differs from the directory", ed_step},
    {"tensors is not an array", ed_not_array},
    {"chunk_bytes 0", ed_raw_bytes},
};

/* The rewrite itself is faithful: with no edit the step still verifies. */
Test(corrupt, manifest_rewrite_control)
{
    save_three();
    rewrite_manifest(3, ed_none);
    ckpt_store *st = tc_open_ro(tc_root);
    cr_assert_eq(ckpt_verify(st, 3, CKPT_VERIFY_FULL, NULL), CKPT_OK,
                 "a re-checksummed, unedited manifest fails: %s", ckpt_error_last());
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &states[3]), 3);
    ckpt_store_free(st);
    free_three();
}

/* Each edit, with a valid checksum, is rejected by the schema checks. */
Test(corrupt, hostile_manifests)
{
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char *dn = edits[i].what;
        tc_rmtree(tc_root);
        cr_assert_eq(mkdir(tc_root, 0700), 0);
        save_three();
        rewrite_manifest(3, edits[i].edit);
        ckpt_store *st = tc_open_ro(tc_root);
        ckpt_report *rep = NULL;
        int rc = ckpt_verify(st, 3, CKPT_VERIFY_QUICK, &rep);
        cr_assert(is_damage_status(rc), "%s: verify(3, QUICK) = %d (%s)", dn, rc,
                  ckpt_strerror(rc));
        cr_assert_geq(ckpt_report_count(rep), 1, "%s: empty report", dn);
        ckpt_report_free(rep);

        tc_state got;
        tc_state_like(&got, &states[2], 0);
        rep = NULL;
        rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &rep);
        cr_assert_eq(rc, CKPT_OK, "%s: restore(LATEST) = %d (%s): %s", dn, rc,
                     ckpt_strerror(rc), ckpt_error_last());
        cr_assert_eq(ckpt_report_step(rep), 2, "%s: restored step %" PRId64, dn,
                     ckpt_report_step(rep));
        tc_assert_state_eq(&got, &states[2], dn);
        ckpt_report_free(rep);
        tc_state_free(&got);

        for (size_t k = 0; k < states[3].count; k++) {
            void *data = NULL;
            uint64_t bytes = 0;
            rc = ckpt_load(st, 3, states[3].t[k].name, &data, &bytes, NULL);
            cr_assert_neq(rc, CKPT_OK, "%s: ckpt_load(3, %s) succeeded", dn,
                          states[3].t[k].name);
            ckpt_free(data);
        }
        int64_t latest = -1;
        cr_assert_eq(ckpt_store_latest(st, CKPT_VERIFY_QUICK, &latest), CKPT_OK);
        cr_assert_eq(latest, 2, "%s: latest(QUICK) = %" PRId64, dn, latest);
        ckpt_store_free(st);
        free_three();
    }
}

/* A raw chunk larger than the reader's piece (256 KiB) is read and hashed
 * piece by piece: a flipped byte in any piece, the last one included, and
 * a shard cut inside the chunk are still caught, naming the hash or the
 * short file; the untouched step restores bit-exactly. */
Test(corrupt, large_raw_chunk_read_in_pieces)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.chunk_bytes = 4 << 20;
    o.flags |= CKPT_OPEN_COMPRESS_ALL; /* random bytes end up raw anyway */
    tc_state s;
    tc_state_init(&s);
    int64_t n[1] = {(3 << 20) / 4 + 77}; /* 12 pieces and a partial one */
    tc_state_add(&s, "w", CKPT_F32, 1, n, TC_RANDOM, 5);
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_save_ok(st, 1, &s);
    tc_restore_check(st, 1, &s);
    char *dir = tc_step_dir(tc_root, 1);
    char *shard = tc_find_suffix(dir, ".shard");
    char *copy = tc_join(tc_root, "shard.orig");
    tc_copy_file(shard, copy);
    int64_t size = tc_file_size(shard);
    /* The chunk is raw: the shard holds at least the tensor's bytes. */
    cr_assert_geq((uint64_t)size, s.t[0].bytes, "shard of %lld bytes", (long long)size);
    tc_state got;
    const int64_t where[] = {4096, (int64_t)(1 << 20) + 3, (int64_t)s.t[0].bytes - 1};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        tc_copy_file(copy, shard);
        /* the one frame follows the shard's header: byte k of the tensor */
        tc_flip_byte(shard, where[i] + SHARD_HEADER_SIZE);
        tc_state_like(&got, &s, 0x33);
        int rc = ckpt_restore(st, 1, got.t, got.count, NULL, NULL);
        cr_assert_eq(rc, CKPT_ECORRUPT, "flip at %lld: restore = %d: %s", (long long)where[i],
                     rc, ckpt_error_last());
        cr_assert(strstr(ckpt_error_last(), "hash"), "%s", ckpt_error_last());
        tc_state_free(&got);
    }
    tc_copy_file(copy, shard);
    tc_restore_check(st, 1, &s);
    ckpt_store_free(st);
    free(copy);
    free(shard);
    free(dir);
    tc_state_free(&s);
}

/* A model that gained a tensor between steps: step 1 holds "a", step 2
 * "b" and "a", and step 2 is damaged.  The attempt at step 2 writes into
 * the caller's buffers before its damage is found; step 1 then restores
 * "a" but lacks "b", whose buffer holds step 2's unverified bytes.  With
 * allow_missing "b" would pass for untouched: the restore fails naming it
 * and how to go on; restoring step 1 by number leaves "b" untouched.
 * Without allow_missing, the "not in step 1" error says why step 2 was
 * not the one. */
Test(corrupt, fallback_never_leaves_a_missing_tensor_holding_a_damaged_step)
{
    int64_t na = 64 * 1024, nb = 16 * 1024;
    tc_state s1, s2;
    tc_state_init(&s1);
    tc_state_init(&s2);
    tc_state_add(&s1, "a", CKPT_F32, 1, &na, TC_RANDOM, 1);
    tc_state_add(&s2, "b", CKPT_F32, 1, &nb, TC_RANDOM, 2);
    tc_state_add(&s2, "a", CKPT_F32, 1, &na, TC_RANDOM, 3);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s1);
    tc_save_ok(st, 2, &s2);
    ckpt_store_free(st);
    char *dir = tc_step_dir(tc_root, 2), *shard = tc_join(dir, "rank-00000.shard");
    tc_flip_byte(shard, 4096 + (int64_t)nb * 4 / 2); /* inside b's frame */
    st = tc_open(tc_root);

    tc_state got;
    tc_state_like(&got, &s2, 0x07);
    ckpt_restore_options o;
    ckpt_restore_options_init(&o, CKPT_RESTORE_OPTIONS_VERSION);
    o.allow_missing = 1;
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, &o, &rep);
    cr_assert_eq(rc, CKPT_ECORRUPT, "restore: %d %s", rc, ckpt_error_last());
    const char *msg = ckpt_error_last();
    cr_assert(strstr(msg, "'b'") && strstr(msg, "restore step 1 by number"), "%s", msg);
    cr_assert_eq(ckpt_report_count(rep), 1, "step 2 listed as skipped");
    cr_assert_eq(ckpt_report_get(rep, 0)->step, 2);
    ckpt_report_free(rep);

    /* As told: set b again, restore step 1 by number. */
    memset(got.t[0].data, 0x07, got.t[0].bytes);
    cr_assert_eq(ckpt_restore(st, 1, got.t, got.count, &o, NULL), CKPT_OK, "%s",
                 ckpt_error_last());
    for (size_t i = 0; i < got.t[0].bytes; i++)
        cr_assert_eq(((unsigned char *)got.t[0].data)[i], 0x07, "b changed at byte %zu", i);
    cr_assert_eq(memcmp(got.t[1].data, s1.t[0].data, s1.t[0].bytes), 0, "a is step 1's");

    /* Strict: step 1 lacks b; the error says step 2 was skipped, and why. */
    rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, NULL);
    cr_assert_eq(rc, CKPT_ENOTFOUND, "%d %s", rc, ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "newer step 2 skipped"), "%s", ckpt_error_last());

    /* A state both steps hold whole restores as before: from step 2 when
     * the flip missed a's chunks (a restore reads only the chunks it
     * needs; where the flip lands depends on how adaptive compression
     * stored b), else from step 1. */
    tc_state one;
    tc_state_like(&one, &s1, 0);
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, one.t, one.count, &o, &rep), CKPT_OK);
    const tc_state *from = ckpt_report_step(rep) == 2 ? &s2 : &s1;
    cr_assert_eq(memcmp(one.t[0].data, from->t[from->count - 1].data, s1.t[0].bytes), 0);
    ckpt_report_free(rep);
    ckpt_store_free(st);
    tc_state_free(&one);
    tc_state_free(&got);
    tc_state_free(&s1);
    tc_state_free(&s2);
    free(shard);
    free(dir);
}

/* A job resumes below a damaged newest step (restore skipped step 4 for
 * step 2) and saves on: step 3 is accepted, since restore never takes the
 * damaged step, which stays for verify to name until replaced.  A store
 * that did not restore finds the damage by verifying the step above.  A
 * step above that is intact still refuses a save below it. */
Test(corrupt, a_job_resumed_below_a_damaged_step_saves_on)
{
    tc_state s[5];
    for (int i = 1; i <= 4; i++)
        tc_state_standard(&s[i], (uint64_t)i);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s[1]);
    tc_save_ok(st, 2, &s[2]);
    tc_save_ok(st, 4, &s[4]);
    ckpt_store_free(st);
    char *dir = tc_step_dir(tc_root, 4), *shard = tc_join(dir, "rank-00000.shard");
    struct stat sb;
    cr_assert_eq(stat(shard, &sb), 0);
    tc_flip_byte(shard, sb.st_size / 2);

    st = tc_open(tc_root);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s[2]), 2);
    cr_assert_eq(tc_save(st, 3, &s[3], NULL), CKPT_OK, "%s", ckpt_error_last());
    int64_t all[] = {1, 2, 3, 4};
    tc_assert_steps(st, all, 4);
    cr_assert_eq(tc_restore_check(st, CKPT_LATEST, &s[3]), 3);
    ckpt_store_free(st);

    /* No restore first: the save verifies step 4. */
    st = tc_open(tc_root);
    cr_assert_eq(tc_save(st, 3, &s[1], NULL), CKPT_OK, "%s", ckpt_error_last());
    /* Step 3 is intact: a save below it is refused, naming it. */
    cr_assert_eq(tc_save(st, 2, &s[1], NULL), CKPT_EINVAL);
    cr_assert(strstr(ckpt_error_last(), "below step 3"), "%s", ckpt_error_last());
    ckpt_store_free(st);
    for (int i = 1; i <= 4; i++)
        tc_state_free(&s[i]);
    free(shard);
    free(dir);
}

/* A step whose shard is another checkpoint's (copied in by a co-tenant, or
 * left by a botched copy) in a directory nobody is changing: opening it
 * fails once.  A mixed manifest and shard is also what a writer replacing
 * the step leaves a reader, so such a failure is retried, but not once the
 * same manifest and shard fail again in a directory that did not change:
 * it was retried 100 times, each reading the whole manifest again (a 20 MB
 * manifest made `ckpt latest` take 11 s, a 217 MB one over a minute).
 * The message names the checkpoint the shard came from. */
static int count_manifest_opens(void *ctx, fsio_op op, const char *path)
{
    if (op == FSIO_OPEN && path && strstr(path, "step-000000000002/manifest.json"))
        ++*(int *)ctx;
    return 0;
}

Test(corrupt, a_shard_of_another_checkpoint_is_read_few_times)
{
    /* random bytes, stored raw: two shards of one size, so that what
     * tells them apart is the checkpoint id, not the length */
    tc_state s1, s2;
    int64_t shape[1] = {1 << 14};
    tc_state_init(&s1);
    tc_state_init(&s2);
    tc_state_add(&s1, "w", CKPT_F32, 1, shape, TC_RANDOM, 1);
    tc_state_add(&s2, "w", CKPT_F32, 1, shape, TC_RANDOM, 2);
    ckpt_store *w = tc_open(tc_root);
    tc_save_ok(w, 1, &s1);
    tc_save_ok(w, 2, &s2);
    ckpt_store_free(w);
    char *d1 = tc_step_dir(tc_root, 1), *d2 = tc_step_dir(tc_root, 2);
    char *from = tc_find_suffix(d1, ".shard"), *to = tc_find_suffix(d2, ".shard");
    tc_copy_file(from, to);

    int opens = 0;
    fsio fs = {.fault = count_manifest_opens, .ctx = &opens};
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = CKPT_OPEN_READONLY;
    ckpt_store *r = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&r, tc_root, &o, &fs), CKPT_OK, "%s",
                 ckpt_error_last());
    int64_t step = -1;
    cr_assert_eq(ckpt_store_latest(r, CKPT_VERIFY_QUICK, &step), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(step, 1);
    cr_assert(opens >= 1 && opens <= 4, "step 2's manifest was opened %d times", opens);
    opens = 0;
    ckpt_report *rep = NULL;
    cr_assert_eq(ckpt_verify(r, 2, CKPT_VERIFY_QUICK, &rep), CKPT_ECORRUPT, "%s",
                 ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "another checkpoint (offset 16: step 1, id "),
              "%s", ckpt_error_last());
    cr_assert(opens >= 1 && opens <= 4, "verify opened step 2's manifest %d times", opens);
    ckpt_report_free(rep);
    ckpt_store_free(r);
    free(from);
    free(to);
    free(d1);
    free(d2);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* Several ranks, one checkpoint, in one process: each rank is a thread
 * with its own store handle on the same root, coordinated by an in-memory
 * coordinator (threads meeting at a barrier).  The same protocol runs
 * under mpirun in tests/dist; here it runs under valgrind and the
 * sanitizers too.  Here the agreement (save, commit, restore, gc, damaged
 * parts, metadata, names); test_ranks_faults.c: ranks and coordinators
 * that fail, hang or lag, and two threads of one rank. */
#include "ranks_util.h"

TestSuite(ranks, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

static int save_two(job *j, ckpt_store *st)
{
    int rc = save_range(j, st, 1, 2, rank_state);
    return rc ? rc : restore_latest(j, st);
}

Test(ranks, save_commit_restore_agreed)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 2);
    }
    char *dir = tc_step_dir(tc_root, 2);
    for (int r = 0; r < WORLD; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank-%05d.shard", r);
        char *p = tc_join(dir, name);
        cr_assert(tc_exists(p), "%s missing", p);
        free(p);
    }
    free(dir);
    /* One process, read-only, reads every rank's tensors by name. */
    ckpt_store *ro = tc_open_ro(tc_root);
    for (int r = 0; r < WORLD; r++) {
        tc_state want;
        rank_state(&want, r, 2);
        cr_assert_eq(tc_restore_check(ro, CKPT_LATEST, &want), 2);
        tc_state_free(&want);
    }
    cr_assert_eq(ckpt_verify(ro, CKPT_NEWEST, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    ckpt_store_free(ro);
}

/* The event log holds one line per event of the job, rank 0's, with the
 * step's sums: two saves are two save_committed lines (not one per rank),
 * each with every rank's bytes, and one restore line for the agreed
 * restore. */
Test(ranks, the_event_log_counts_each_save_of_the_job_once)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    uint64_t raw = 0;
    for (int r = 0; r < WORLD; r++) {
        tc_state st;
        rank_state(&st, r, 2);
        raw += tc_state_bytes(&st);
        tc_state_free(&st);
    }
    ckpt_store *ro = tc_open_ro(tc_root);
    char *text = NULL;
    cr_assert_eq(ckpt_store_events(ro, 0, &text), CKPT_OK, "%s", ckpt_error_last());
    size_t committed = 0, begun = 0, restored = 0;
    for (char *line = text, *end; *line; line = end + 1) { /* JSON lines */
        cr_assert_not_null(end = strchr(line, '\n'));
        json_error_t err;
        json_t *ev = json_loadb(line, (size_t)(end - line), 0, &err);
        cr_assert_not_null(ev, "%s", err.text);
        const char *name = json_string_value(json_object_get(ev, "event"));
        cr_assert_not_null(name);
        begun += strcmp(name, "save_begun") == 0;
        restored += strcmp(name, "restored") == 0;
        if (strcmp(name, "save_committed") == 0) {
            committed++;
            json_int_t bytes = json_integer_value(json_object_get(ev, "raw_bytes"));
            cr_assert_eq((uint64_t)bytes, raw, "save_committed raw_bytes %lld, the job's %llu",
                         (long long)bytes, (unsigned long long)raw);
        }
        json_decref(ev);
    }
    cr_assert_eq(begun, 2, "%zu save_begun lines", begun);
    cr_assert_eq(committed, 2, "%zu save_committed lines", committed);
    cr_assert_eq(restored, 1, "%zu restored lines", restored);
    ckpt_free(text);
    ckpt_store_free(ro);
}

static int restore_only(job *j, ckpt_store *st)
{
    return restore_latest(j, st);
}

/* gc is rank 0's, the lock holder's; a dry run is anyone's. */
static int gc_where(job *j, ckpt_store *st)
{
    ckpt_report *rep = NULL;
    int rc = ckpt_store_gc(st, 1, 0, &rep);
    ckpt_report_free(rep);
    if (j->u.rank == 0)
        return rc;
    cr_assert_eq(rc, CKPT_EINVAL, "rank %d gc: %d", j->u.rank, rc);
    rep = NULL;
    rc = ckpt_store_gc(st, 1, 1, &rep);
    ckpt_report_free(rep);
    return rc;
}

Test(ranks, gc_runs_on_rank_0)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, gc_where);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    ckpt_store *ro = tc_open_ro(tc_root);
    int64_t want[] = {2};
    tc_assert_steps(ro, want, 1); /* rank 0 retired step 1 */
    ckpt_store_free(ro);
}

/* A rank whose tensors are all its own reads its part and its shard only,
 * never the global manifest or another rank's shard: its restore costs the
 * same at any world size (docs/SCALING.md). */
Test(ranks, a_rank_restores_from_its_own_part)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    fstrace *t = ft_new(tc_root);
    fsio fs = {0};
    ft_hook(t, &fs);
    ft_record(t, 1);
    memset(jobs, 0, sizeof jobs);
    jobs[1].fs = &fs;
    run_ranks(jobs, restore_only);
    int own = 0;
    for (size_t i = 0; i < ft_count(t); i++) {
        const ft_event *e = ft_get(t, i);
        if (e->op != FSIO_OPEN || !e->path)
            continue;
        cr_assert_null(strstr(e->path, "manifest.json"), "rank 1 opened %s", e->path);
        cr_assert_null(strstr(e->path, "rank-00000"), "rank 1 opened %s", e->path);
        own += strstr(e->path, "step-000000000002/rank-00001.shard") != NULL;
    }
    cr_assert_gt(own, 0, "rank 1 did not read its own shard");
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 2);
    }
    ft_free(t);
}

Test(ranks, damaged_shard_of_one_rank_makes_all_fall_back)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    char *dir = tc_step_dir(tc_root, 2), *shard = tc_join(dir, "rank-00001.shard");
    tc_flip_byte(shard, 80); /* a frame: the index still checks out */
    free(shard);
    free(dir);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_only);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 1, "rank %d restored %lld", r,
                     (long long)jobs[r].restored);
        cr_assert_eq(jobs[r].skipped, 1, "rank %d: every rank says why", r);
    }
}

/* Restore the newest step into this rank's ".step" tensor alone (as a
 * job restores its model in place and reads its optimizer's state next),
 * verifying `verify`. */
static int restore_step_tensor(job *j, ckpt_store *st, ckpt_verify_level verify)
{
    tc_state want, got;
    rank_state(&want, j->u.rank, 0);
    tc_state_init(&got);
    tc_state_like(&got, &want, 0xee);
    ckpt_restore_options o;
    cr_assert_eq(ckpt_restore_options_init(&o, CKPT_RESTORE_OPTIONS_VERSION), CKPT_OK);
    o.verify = verify;
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, CKPT_LATEST, &got.t[1], 1, &o, &rep);
    j->restored = ckpt_report_step(rep);
    j->skipped = ckpt_report_count(rep);
    if (j->skipped)
        snprintf(j->message, sizeof j->message, "%s", ckpt_report_get(rep, 0)->message);
    ckpt_report_free(rep);
    tc_state_free(&got);
    tc_state_free(&want);
    return rc;
}

static int restore_step_tensor_stored(job *j, ckpt_store *st)
{
    return restore_step_tensor(j, st, CKPT_VERIFY_STORED);
}

static int restore_step_tensor_full(job *j, ckpt_store *st)
{
    return restore_step_tensor(j, st, CKPT_VERIFY_FULL);
}

/* Rank 1's tensor that nobody restores is damaged in step 2.  The agreed
 * restore of the other tensors takes step 2 by default (it verifies what
 * it reads); with verify CKPT_VERIFY_FULL each rank verifies its own part
 * in full, so every rank falls back to step 1, and each says why: the
 * step a job then reads the rest of its state from (an optimizer's
 * moments, `Checkpoint.state("rank1")` in Python) is intact. */
Test(ranks, full_verification_agrees_on_a_step_whose_unrestored_tensors_are_intact)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    char *dir = tc_step_dir(tc_root, 2), *shard = tc_join(dir, "rank-00001.shard");
    tc_flip_byte(shard, 80); /* in rank1.w's frame */
    free(shard);
    free(dir);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_step_tensor_stored);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 2, "rank %d restored %lld", r,
                     (long long)jobs[r].restored);
    }
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_step_tensor_full);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 1, "rank %d restored %lld", r,
                     (long long)jobs[r].restored);
        cr_assert_eq(jobs[r].skipped, 1, "rank %d: every rank says why", r);
        cr_assert(strstr(jobs[r].message, "rank-00001.shard"), "rank %d: %s", r,
                  jobs[r].message);
    }
}

/* Step 3 after save_two: rank 1's tensor grew (the model changed), rank
 * 0's did not. */
static int save_two_then_grown(job *j, ckpt_store *st)
{
    int rc = save_two(j, st);
    if (rc)
        return rc;
    tc_state s;
    rank_state(&s, j->u.rank, 3);
    if (j->u.rank == 1) {
        tc_state_free(&s);
        int64_t shape[1] = {5000};
        tc_state_init(&s);
        tc_state_add(&s, "rank1.w", CKPT_F32, 1, shape, TC_RANDOM, 1003);
        tc_state_add(&s, "rank1.step", CKPT_I64, 0, NULL, TC_RANDOM, 1010);
    }
    rc = tc_save(st, 3, &s, NULL);
    tc_state_free(&s);
    return rc;
}

/* As in one process (latest_full): a newest step whose shapes rank 1's
 * buffers do not fit, while an older one's do, is the caller's mistake
 * while it is sound (every rank fails with the mismatch), but once it is
 * damaged no restore could use it, so every rank falls back past it. */
Test(ranks, a_damaged_newest_step_of_other_shapes_is_skipped_on_every_rank)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two_then_grown);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_only);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_EMISMATCH, "rank %d: %s", r, jobs[r].message);
    char *dir = tc_step_dir(tc_root, 3), *shard = tc_join(dir, "rank-00001.shard");
    tc_flip_byte(shard, 80);
    free(shard);
    free(dir);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_only);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 2, "rank %d restored %lld", r,
                     (long long)jobs[r].restored);
        cr_assert_eq(jobs[r].skipped, 1, "rank %d: step 3 skipped, saying why", r);
    }
}

/* A damaged part manifest does not make the step invalid (restore passes
 * over it to the global manifest), but verification names it, at quick and
 * full level, as a warning that leaves the status CKPT_OK. */
Test(ranks, verify_names_a_damaged_part_and_keeps_the_step_valid)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two);
    char *dir = tc_step_dir(tc_root, 2), *part = tc_join(dir, "rank-00001.json");
    tc_flip_byte(part, 20);
    ckpt_store *ro = tc_open_ro(tc_root);
    for (int level = CKPT_VERIFY_QUICK; level <= CKPT_VERIFY_FULL; level++) {
        ckpt_report *rep = NULL;
        cr_assert_eq(ckpt_verify(ro, 2, (ckpt_verify_level)level, &rep), CKPT_OK, "%s",
                     ckpt_error_last());
        cr_assert_eq(ckpt_report_count(rep), 1, "level %d: one warning", level);
        const ckpt_problem *p = ckpt_report_get(rep, 0);
        cr_assert_eq(p->status, CKPT_ECORRUPT);
        cr_assert_str_eq(p->file, "rank-00001.json");
        cr_assert(strstr(p->message, "warning") && strstr(p->message, "stays valid"), "%s",
                  p->message);
        ckpt_report_free(rep);
    }
    /* An intact part of the wrong save is named too. */
    char *first = tc_step_dir(tc_root, 1), *old = tc_join(first, "rank-00001.json");
    tc_copy_file(old, part);
    ckpt_report *rep = NULL;
    cr_assert_eq(ckpt_verify(ro, 2, CKPT_VERIFY_QUICK, &rep), CKPT_OK);
    cr_assert_eq(ckpt_report_count(rep), 1);
    cr_assert(strstr(ckpt_report_get(rep, 0)->message, "rank-00001.json"));
    ckpt_report_free(rep);
    /* An intact step has nothing to say. */
    cr_assert_eq(ckpt_verify(ro, 1, CKPT_VERIFY_FULL, &rep), CKPT_OK);
    cr_assert_eq(ckpt_report_count(rep), 0, "%s",
                 ckpt_report_count(rep) ? ckpt_report_get(rep, 0)->message : "");
    ckpt_report_free(rep);
    ckpt_store_free(ro);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_only);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
        cr_assert_eq(jobs[r].restored, 2);
    }
    free(old), free(first), free(part), free(dir);
}

/* Rank 1's model gained a head at step 2. */
static void head_state(tc_state *s, int r, int64_t step)
{
    rank_state(s, r, step);
    int64_t shape[1] = {512};
    if (r == 1 && step >= 2)
        tc_state_add(s, "rank1.head", CKPT_F32, 1, shape, TC_RANDOM, (uint64_t)step);
}

static int save_two_with_head(job *j, ckpt_store *st)
{
    return save_range(j, st, 1, 2, head_state);
}

static int restore_head_allow_missing(job *j, ckpt_store *st)
{
    tc_state want, got;
    head_state(&want, j->u.rank, 2);
    tc_state_like(&got, &want, 0xee);
    ckpt_restore_options o;
    ckpt_restore_options_init(&o, CKPT_RESTORE_OPTIONS_VERSION);
    o.allow_missing = 1;
    int rc = ckpt_restore(st, CKPT_LATEST, got.t, got.count, &o, NULL);
    tc_state_free(&got);
    tc_state_free(&want);
    return rc;
}

/* Step 2 damaged in rank 0's shard: rank 1 restores step 2 through its
 * own part, then every rank goes down to step 1, which lacks rank 1's
 * head.  Its buffer holds step 2's bytes, not what the caller had: every
 * rank's restore fails, rank 1's naming the tensor (with allow_missing it
 * passed for untouched). */
Test(ranks, a_rank_gone_down_never_leaves_a_missing_tensor_holding_the_newer_step)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_two_with_head);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    char *dir = tc_step_dir(tc_root, 2), *shard = tc_join(dir, "rank-00000.shard");
    tc_flip_byte(shard, 80);
    memset(jobs, 0, sizeof jobs);
    run_ranks(jobs, restore_head_allow_missing);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_ECORRUPT, "rank %d: %d %s", r, jobs[r].status,
                     jobs[r].message);
    cr_assert(strstr(jobs[1].message, "'rank1.head'"), "%s", jobs[1].message);
    free(shard);
    free(dir);
}

/* Each rank's metadata: rank 0's is the global manifest's, rank 1's is
 * read from its part manifest; a part that is gone is named. */
static int save_with_metadata(job *j, ckpt_store *st)
{
    tc_state s;
    rank_state(&s, j->u.rank, 3);
    char meta[64];
    snprintf(meta, sizeof meta, "{\"mine\":%d}", 100 + j->u.rank);
    int rc = tc_save(st, 3, &s, meta);
    tc_state_free(&s);
    return rc;
}

Test(ranks, each_ranks_metadata_is_read_back)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_with_metadata);
    for (int r = 0; r < WORLD; r++)
        cr_assert_eq(jobs[r].status, CKPT_OK, "rank %d: %s", r, jobs[r].message);
    ckpt_store *ro = tc_open_ro(tc_root);
    ckpt_checkpoint *ck = NULL;
    cr_assert_eq(ckpt_checkpoint_open(&ck, ro, 3, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    const char *json = NULL;
    for (int r = 0; r < WORLD; r++) {
        char want[64];
        snprintf(want, sizeof want, "{\"mine\":%d}", 100 + r);
        cr_assert_eq(ckpt_checkpoint_rank_metadata(ck, r, &json), CKPT_OK, "rank %d: %s", r,
                     ckpt_error_last());
        cr_assert_str_eq(json, want, "rank %d", r);
    }
    cr_assert_str_eq(ckpt_checkpoint_metadata(ck), "{\"mine\":100}");
    /* Each tensor's rank and the world size, without the manifest's text
     * (rank r saves "rank<r>.w" and "rank<r>.step"). */
    cr_assert_eq(ckpt_checkpoint_world_size(ck), WORLD);
    size_t n = ckpt_checkpoint_tensor_count(ck);
    cr_assert_eq(n, 2 * WORLD);
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor_info info;
        int rank = -1, named = -1;
        cr_assert_eq(ckpt_checkpoint_tensor(ck, i, &info), CKPT_OK);
        cr_assert_eq(sscanf(info.name, "rank%d.", &named), 1, "%s", info.name);
        cr_assert_eq(ckpt_checkpoint_tensor_rank(ck, i, &rank), CKPT_OK);
        cr_assert_eq(rank, named, "%s: rank %d", info.name, rank);
    }
    int rank = -1;
    cr_assert_eq(ckpt_checkpoint_tensor_rank(ck, n, &rank), CKPT_EINVAL);
    cr_assert_eq(ckpt_checkpoint_tensor_rank(ck, 0, NULL), CKPT_EINVAL);
    cr_assert_eq(ckpt_checkpoint_world_size(NULL), 1);
    cr_assert_eq(ckpt_checkpoint_rank_metadata(ck, WORLD, &json), CKPT_ENOTFOUND);
    cr_assert_null(json);
    cr_assert_eq(ckpt_checkpoint_rank_metadata(ck, -1, &json), CKPT_ENOTFOUND);
    ckpt_checkpoint_free(ck);
    /* rank 1's part removed: its metadata is named as lost, the tensors
     * still open through the global manifest */
    char path[4096];
    snprintf(path, sizeof path, "%s/step-000000000003/rank-00001.json", tc_root);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(ckpt_checkpoint_open(&ck, ro, 3, CKPT_VERIFY_QUICK), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_rank_metadata(ck, 1, &json), CKPT_EINCOMPLETE, "%s",
                 ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), "rank-00001.json"), "%s", ckpt_error_last());
    cr_assert_eq(ckpt_checkpoint_rank_metadata(ck, 0, &json), CKPT_OK);
    ckpt_checkpoint_free(ck);
    ckpt_store_free(ro);
}

/* Every rank saving the same names (a DDP job's natural first try): the
 * commit refuses the step, naming the name, both ranks and the rule. */
static void same_names(tc_state *s, int r, int64_t step)
{
    int64_t shape[1] = {100};
    tc_state_init(s);
    tc_state_add(s, "model.w", CKPT_F32, 1, shape, TC_RANDOM, (uint64_t)(r * 1000 + step));
}

static int save_same_names(job *j, ckpt_store *st)
{
    return save_range(j, st, 1, 1, same_names);
}

Test(ranks, the_same_name_on_two_ranks_is_named_with_both)
{
    job jobs[WORLD] = {0};
    run_ranks(jobs, save_same_names);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(jobs[r].status, CKPT_EINVAL, "rank %d: %s", r, jobs[r].message);
        cr_assert(strstr(jobs[r].message, "'model.w' appears twice, saved by rank 0 and by "
                                          "rank 1: tensor names must be unique across the "
                                          "ranks"), "rank %d: %s", r, jobs[r].message);
    }
}

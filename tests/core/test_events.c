/* The event log and the metrics of a root: what each call records, a line
 * cut short by a crash, rotation, links refused, the metrics file written
 * after each commit, and version-1 options still accepted. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context.h"
#include "error.h"
#include "eventlog.h"
#include "helpers.h"
#include "layout.h"
#include "testing.h"

TestSuite(events, .init = tc_setup, .fini = tc_teardown, .timeout = 240);

/* The events of `st` as a JSON array (each line parsed). */
static json_t *events_of(ckpt_store *st, double since)
{
    char *text = NULL;
    int rc = ckpt_store_events(st, since, &text);
    cr_assert_eq(rc, CKPT_OK, "ckpt_store_events: %s", ckpt_error_last());
    json_t *a = json_array();
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t err;
        json_t *ev = json_loads(line, 0, &err);
        cr_assert(json_is_object(ev), "not a JSON object: %s (%s)", line, err.text);
        cr_assert_eq(json_integer_value(json_object_get(ev, "v")), EVENTLOG_SCHEMA);
        json_array_append_new(a, ev);
    }
    ckpt_free(text);
    return a;
}

static const char *name_of(json_t *a, size_t i)
{
    return json_string_value(json_object_get(json_array_get(a, i), "event"));
}

static json_int_t int_of(json_t *a, size_t i, const char *key)
{
    json_t *v = json_object_get(json_array_get(a, i), key);
    cr_assert(json_is_integer(v), "event %zu has no integer %s", i, key);
    return json_integer_value(v);
}

static char *log_path(void)
{
    return tc_join(tc_root, EVENTLOG_NAME);
}

Test(events, every_call_is_recorded)
{
    tc_state s1, s2, got;
    tc_state_standard(&s1, 1);
    tc_state_standard(&s2, 2);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s1);
    tc_save_ok(st, 2, &s2);
    /* a save refused: recorded with its error */
    cr_assert_eq(tc_save(st, 3, &s1, "{not json"), CKPT_EINVAL);
    /* damage step 2: restore falls back to 1 and says why */
    char *dir = tc_step_dir(tc_root, 2);
    char *shard = tc_find_suffix(dir, ".shard");
    tc_flip_byte(shard, 200);
    tc_state_like(&got, &s1, 0);
    ckpt_report *r = NULL;
    cr_assert_eq(ckpt_restore(st, CKPT_LATEST, got.t, got.count, NULL, &r), CKPT_OK);
    ckpt_report_free(r);
    cr_assert_eq(ckpt_verify(st, 2, CKPT_VERIFY_FULL, NULL), CKPT_ECORRUPT);
    cr_assert_eq(ckpt_verify(st, 1, CKPT_VERIFY_FULL, NULL), CKPT_OK);
    cr_assert_eq(ckpt_store_gc(st, 1, 0, NULL), CKPT_OK);

    json_t *a = events_of(st, 0);
    const char *want[] = {"save_begun", "save_committed", "save_begun", "save_committed",
                          "save_begun", "save_failed", "restored", "verify_failed",
                          "verified", "gc"};
    size_t n = sizeof want / sizeof want[0];
    cr_assert_eq(json_array_size(a), n, "%zu events, want %zu", json_array_size(a), n);
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(name_of(a, i), want[i], "event %zu", i);
    cr_assert_eq(int_of(a, 1, "step"), 1);
    cr_assert_eq((uint64_t)int_of(a, 3, "raw_bytes"), tc_state_bytes(&s2));
    cr_assert_gt(int_of(a, 3, "stored_bytes"), 0);
    cr_assert(json_is_number(json_object_get(json_array_get(a, 3), "persist_s")));
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(a, 5), "status")),
                     "invalid_argument");
    cr_assert(tc_nonempty(json_string_value(json_object_get(json_array_get(a, 5), "error"))));
    cr_assert_eq(int_of(a, 6, "step"), 1, "restored step 1");
    json_t *skipped = json_object_get(json_array_get(a, 6), "skipped");
    cr_assert_eq(json_array_size(skipped), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(skipped, 0), "step")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(skipped, 0), "status")),
                     "corrupt");
    cr_assert_eq(int_of(a, 7, "step"), 2);
    /* gc kept step 1 (the newest valid one) and step 2 (the newest): nothing
     * to remove but what it lists */
    cr_assert(json_is_array(json_object_get(json_array_get(a, 9), "removed")));

    /* --since: only what came after a given time */
    double t = json_number_value(json_object_get(json_array_get(a, 7), "time"));
    json_t *late = events_of(st, t);
    cr_assert_eq(json_array_size(late), 3);
    cr_assert_str_eq(name_of(late, 0), "verify_failed");
    json_decref(late);

    /* private like a step's files */
    struct stat sb;
    char *log = log_path();
    cr_assert_eq(lstat(log, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0640, "mode %o", sb.st_mode & 07777);
    /* a read-only store reads it but writes nothing */
    ckpt_store_free(st);
    int64_t size = tc_file_size(log);
    ckpt_store *ro = tc_open_ro(tc_root);
    cr_assert_eq(ckpt_verify(ro, 1, CKPT_VERIFY_QUICK, NULL), CKPT_OK);
    json_t *again = events_of(ro, 0);
    cr_assert_eq(json_array_size(again), n);
    cr_assert_eq(tc_file_size(log), size, "a read-only store wrote the log");
    ckpt_store_free(ro);
    json_decref(again);
    json_decref(a);
    free(log);
    free(shard);
    free(dir);
    tc_state_free(&got);
    tc_state_free(&s1);
    tc_state_free(&s2);
}

/* A binding that loads a step tensor by tensor (Python's Store.load)
 * records its restore as ckpt_restore does: the step, the newer steps it
 * passed over and why, or its failure; the caller's last error stays. */
Test(events, a_restore_made_through_reads_is_recorded)
{
    tc_state s1;
    tc_state_standard(&s1, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s1);
    ckpt_problem p = {.step = 2, .status = CKPT_ECORRUPT, .message = "bad chunk",
                      .file = "rank-00000.shard", .tensor = "w", .offset = 0};
    ckpt_seterr(CKPT_EIO, "the caller's own error");
    cr_assert_eq(ckpt_store_record_restore(st, 1, CKPT_OK, NULL, &p, 1), CKPT_OK, "%s",
                 ckpt_error_last());
    cr_assert_str_eq(ckpt_error_last(), "the caller's own error");
    cr_assert_eq(ckpt_error_last_status(), CKPT_EIO);
    cr_assert_eq(ckpt_store_record_restore(st, -1, CKPT_ENOCKPT, "none verified", NULL, 0),
                 CKPT_OK);
    /* text that is not UTF-8 (a path) stays, escaped */
    ckpt_problem q = {.step = 5, .status = CKPT_EIO, .message = "bad \xff path",
                      .file = "f\xfe", .tensor = "", .offset = -1};
    cr_assert_eq(ckpt_store_record_restore(st, -1, CKPT_EIO, "root r_\xff", &q, 1), CKPT_OK);
    /* refused: what it could not record says why */
    cr_assert_eq(ckpt_store_record_restore(st, -1, CKPT_OK, NULL, NULL, 0), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_record_restore(st, 1, CKPT_OK, NULL, NULL, 1), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_record_restore(NULL, 1, CKPT_OK, NULL, NULL, 0), CKPT_EINVAL);
    cr_assert_eq(ckpt_store_record_restore(st, 1, -999, NULL, NULL, 0), CKPT_EINVAL);

    json_t *a = events_of(st, 0);
    cr_assert_eq(json_array_size(a), 5, "%zu events", json_array_size(a));
    cr_assert_str_eq(name_of(a, 2), "restored");
    cr_assert_eq(int_of(a, 2, "step"), 1);
    json_t *skipped = json_object_get(json_array_get(a, 2), "skipped");
    cr_assert_eq(json_array_size(skipped), 1);
    json_t *p0 = json_array_get(skipped, 0);
    cr_assert_eq(json_integer_value(json_object_get(p0, "step")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(p0, "status")), "corrupt");
    cr_assert_str_eq(json_string_value(json_object_get(p0, "message")), "bad chunk");
    cr_assert_str_eq(json_string_value(json_object_get(p0, "file")), "rank-00000.shard");
    cr_assert_str_eq(name_of(a, 3), "restore_failed");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(a, 3), "error")),
                     "none verified");
    json_t *e4 = json_array_get(a, 4);
    cr_assert_str_eq(json_string_value(json_object_get(e4, "error")), "root r_\\xff");
    json_t *q0 = json_array_get(json_object_get(e4, "skipped"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(q0, "message")), "bad \\xff path");
    cr_assert_str_eq(json_string_value(json_object_get(q0, "file")), "f\\xfe");
    json_decref(a);
    ckpt_store_free(st);
    /* a read-only store records nothing */
    char *log = log_path();
    int64_t size = tc_file_size(log);
    ckpt_store *ro = tc_open_ro(tc_root);
    cr_assert_eq(ckpt_store_record_restore(ro, 1, CKPT_OK, NULL, NULL, 0), CKPT_OK);
    ckpt_store_free(ro);
    cr_assert_eq(tc_file_size(log), size, "a read-only store wrote the log");
    free(log);
    tc_state_free(&s1);
}

/* A root whose path is not UTF-8: the metrics' root label stays valid
 * text (Prometheus' format is UTF-8), its bytes above 0x7f as \\xNN. */
Test(events, a_root_path_that_is_not_utf8_makes_a_valid_label)
{
    char *root = tc_join(tc_root, "r_\xff");
    ckpt_store *st = tc_open(root);
    char *text = NULL;
    cr_assert_eq(ckpt_store_metrics(st, &text), CKPT_OK, "%s", ckpt_error_last());
    cr_assert(strstr(text, "r_\\\\xff\"}"), "%s", text);
    cr_assert_null(strchr(text, '\xff'), "a raw byte in the metrics");
    ckpt_free(text);
    ckpt_store_free(st);
    free(root);
}

Test(events, stale_temporaries_removed_on_open_are_recorded)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    ckpt_store_free(st);
    /* what a save killed mid-way and an interrupted deletion leave */
    char *tmp = tc_join(tc_root, LAYOUT_TMP_PREFIX "00000002-dead");
    char *trash = tc_join(tc_root, LAYOUT_TRASH_PREFIX "00000000-dead");
    cr_assert_eq(mkdir(tmp, 0700), 0);
    cr_assert_eq(mkdir(trash, 0700), 0);
    /* a reader neither removes nor records them */
    ckpt_store *ro = tc_open_ro(tc_root);
    ckpt_store_free(ro);
    struct stat sb;
    cr_assert_eq(stat(tmp, &sb), 0);

    st = tc_open(tc_root);
    cr_assert_neq(stat(tmp, &sb), 0, "the stale save directory is still there");
    cr_assert_neq(stat(trash, &sb), 0, "the stale trash directory is still there");
    json_t *a = events_of(st, 0);
    size_t n = json_array_size(a);
    cr_assert_str_eq(name_of(a, n - 1), "stale_removed");
    json_t *removed = json_object_get(json_array_get(a, n - 1), "removed");
    cr_assert_eq(json_array_size(removed), 2);
    int seen_tmp = 0, seen_trash = 0;
    for (size_t i = 0; i < 2; i++) {
        const char *name = json_string_value(json_array_get(removed, i));
        seen_tmp |= strcmp(name, LAYOUT_TMP_PREFIX "00000002-dead") == 0;
        seen_trash |= strcmp(name, LAYOUT_TRASH_PREFIX "00000000-dead") == 0;
    }
    cr_assert(seen_tmp && seen_trash, "removed lists both directories");
    json_decref(a);
    /* nothing left: a second open logs nothing more */
    ckpt_store_free(st);
    st = tc_open(tc_root);
    a = events_of(st, 0);
    cr_assert_eq(json_array_size(a), n);
    json_decref(a);
    ckpt_store_free(st);
    free(tmp);
    free(trash);
    tc_state_free(&s);
}

Test(events, a_torn_line_never_breaks_readers)
{
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s);
    /* a crash in the middle of a write: half a line, no newline */
    char *log = log_path();
    const char torn[] = "{\"v\":1,\"time\":17,\"event\":\"save_comm";
    int fd = open(log, O_WRONLY | O_APPEND);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, torn, sizeof torn - 1), (ssize_t)(sizeof torn - 1));
    close(fd);
    json_t *a = events_of(st, 0);
    cr_assert_eq(json_array_size(a), 2, "the torn line is not an event");
    json_decref(a);
    tc_save_ok(st, 2, &s);
    a = events_of(st, 0);
    cr_assert_eq(json_array_size(a), 4, "the events after the torn line are whole");
    cr_assert_str_eq(name_of(a, 3), "save_committed");
    cr_assert_eq(int_of(a, 3, "step"), 2);
    /* the fragment is a line of its own, every other line is JSON */
    char *text;
    size_t len;
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    text = malloc(1 << 16);
    len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    text[len] = '\0';
    cr_assert_eq(text[len - 1], '\n');
    int bad = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *v = json_loads(line, 0, NULL);
        bad += v == NULL;
        json_decref(v);
    }
    cr_assert_eq(bad, 1, "%d lines are not JSON", bad);
    free(text);
    json_decref(a);
    free(log);
    ckpt_store_free(st);
    tc_state_free(&s);
}

Test(events, rotation_bounds_the_log)
{
    ckpt_store *st = tc_open(tc_root);
    eventlog *el = eventlog_new(&st->lay, 2048, NULL);
    cr_assert_not_null(el);
    for (int i = 0; i < 200; i++) {
        json_t *ev = json_pack("{si ss si}", "v", EVENTLOG_SCHEMA, "event", "test", "i", i);
        eventlog_append(el, ev);
    }
    eventlog_free(el);
    char *log = log_path(), *old = tc_join(tc_root, EVENTLOG_OLD_NAME);
    cr_assert(tc_exists(old), "rotated");
    cr_assert_leq(tc_file_size(log), 2048);
    cr_assert_leq(tc_file_size(old), 2048);
    /* what is kept is the newest events, in order, none torn */
    json_t *a = events_of(st, 0);
    size_t n = json_array_size(a);
    cr_assert_gt(n, 10);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(int_of(a, i, "i"), (json_int_t)(200 - n + i), "event %zu", i);
    json_decref(a);
    free(log);
    free(old);
    ckpt_store_free(st);
}

/* An event log far over what a writer leaves (another user's 64 MiB of
 * tiny events in a root the caller reads: ckpt log, ckpt metrics) was read
 * whole, each event a JSON tree: about 80 times the file in memory.  One
 * over EVENTLOG_READ_MAX is refused, named, and the metrics say the log is
 * unreadable instead. */
Test(events, an_event_log_far_over_the_rotation_size_is_not_read)
{
    ckpt_store *st = tc_open(tc_root);
    char *log = log_path();
    FILE *f = fopen(log, "w");
    cr_assert(f);
    const char line[] = "{\"v\":1,\"event\":\"x\",\"time\":1}\n";
    for (uint64_t n = 0; n <= EVENTLOG_READ_MAX; n += sizeof line - 1)
        fputs(line, f);
    cr_assert_eq(fclose(f), 0);
    char *text = NULL;
    cr_assert_eq(ckpt_store_events(st, 0, &text), CKPT_EIO);
    cr_assert_null(text);
    cr_assert(strstr(ckpt_error_last(), "far over what a writer leaves"), "%s",
              ckpt_error_last());
    cr_assert_eq(ckpt_store_metrics(st, &text), CKPT_OK, "%s", ckpt_error_last());
    const char *readable = strstr(text, "\nckpt_event_log_readable{");
    cr_assert(readable, "%s", text);
    const char *eol = strchr(readable + 1, '\n');
    cr_assert(eol && eol - readable > 2 && strncmp(eol - 2, " 0", 2) == 0, "%s", text);
    ckpt_free(text);
    ckpt_store_free(st);
    free(log);
}

/* Two files each under the size limit whose lines are arrays of 20,000
 * empty objects (a co-tenant's planted log): well-formed events whose
 * JSON trees cost some 90 times their text (1.3 GB for 16 MB, in root's
 * cron `ckpt metrics`).  The values read back are bounded: refused as no
 * writer's log, the metrics saying the log is unreadable. */
Test(events, an_event_log_of_too_many_json_values_is_not_read)
{
    ckpt_store *st = tc_open(tc_root);
    char *log = log_path(), *old = tc_join(tc_root, "ckpt-events.jsonl.1");
    const char *paths[2] = {old, log};
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(paths[k], "w");
        cr_assert(f);
        fputs("\"a torn line whose string never closes\n", f); /* hides nothing */
        for (int line = 0; line < 40; line++) { /* 40 x 20,000 values: 2.4 MB */
            fputs("{\"v\":1,\"event\":\"x\",\"time\":1,\"pad\":[{}", f);
            for (int i = 1; i < 20000; i++)
                fputs(",{}", f);
            fputs("]}\n", f);
        }
        cr_assert_eq(fclose(f), 0);
    }
    char *text = NULL;
    cr_assert_eq(ckpt_store_events(st, 0, &text), CKPT_EIO);
    cr_assert_null(text);
    cr_assert(strstr(ckpt_error_last(), "JSON values"), "%s", ckpt_error_last());
    cr_assert_eq(ckpt_store_metrics(st, &text), CKPT_OK, "%s", ckpt_error_last());
    const char *readable = strstr(text, "\nckpt_event_log_readable{");
    cr_assert(readable, "%s", text);
    const char *eol = strchr(readable + 1, '\n');
    cr_assert(eol && strncmp(eol - 2, " 0", 2) == 0, "%s", text);
    ckpt_free(text);
    /* a log of ordinary size and events is read as before */
    cr_assert_eq(unlink(old), 0);
    FILE *f = fopen(log, "w");
    cr_assert(f);
    fputs("{\"v\":1,\"event\":\"x\",\"time\":1,\"pad\":[{},{}]}\n", f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(ckpt_store_events(st, 0, &text), CKPT_OK, "%s", ckpt_error_last());
    ckpt_free(text);
    ckpt_store_free(st);
    free(log);
    free(old);
}

Test(events, links_and_fifos_are_refused)
{
    char *elsewhere = tc_mkdtemp();
    char *target = tc_join(elsewhere, "victim");
    tc_write_file(target, "x", 1);
    char *log = log_path();
    cr_assert_eq(mkdir(tc_root, 0750) == 0 || tc_exists(tc_root), 1);
    cr_assert_eq(symlink(target, log), 0);
    tc_state s;
    tc_state_standard(&s, 1);
    ckpt_store *st = tc_open(tc_root);
    tc_save_ok(st, 1, &s); /* logging fails, the save does not */
    cr_assert_eq(tc_file_size(target), 1, "wrote through a link");
    char *text = NULL;
    cr_assert_eq(ckpt_store_events(st, 0, &text), CKPT_EACCES);
    cr_assert_null(text);
    cr_assert(strstr(ckpt_error_last(), EVENTLOG_NAME), "%s", ckpt_error_last());
    cr_assert_eq(unlink(log), 0);
    cr_assert_eq(mkfifo(log, 0600), 0);
    tc_save_ok(st, 2, &s); /* no hang on a FIFO without a reader */
    cr_assert_eq(ckpt_store_events(st, 0, &text), CKPT_EACCES);
    ckpt_store_free(st);
    tc_rmtree(elsewhere);
    free(elsewhere);
    free(target);
    free(log);
    tc_state_free(&s);
}

Test(events, metrics_file_after_each_commit)
{
    char *dir = tc_mkdtemp();
    char *prom = tc_join(dir, "ckpt.prom");
    ckpt_store_options o;
    tc_opts(&o);
    o.metrics_path = prom;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_standard(&s, 1);
    cr_assert(!tc_exists(prom));
    for (int64_t step = 10; step <= 20; step += 10) {
        tc_save_ok(st, step, &s);
        FILE *f = fopen(prom, "r");
        cr_assert_not_null(f, "no metrics file after step %lld", (long long)step);
        char text[8192];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        char want[256];
        snprintf(want, sizeof want, "ckpt_latest_step{root=\"%s\"} %lld\n", tc_root,
                 (long long)step);
        cr_assert(strstr(text, want), "no %s in:\n%s", want, text);
        snprintf(want, sizeof want, "ckpt_saves_total{root=\"%s\"} %lld\n", tc_root,
                 (long long)step / 10);
        cr_assert(strstr(text, want), "no %s in:\n%s", want, text);
    }
    cr_assert_eq(tc_count_prefix(dir, "ckpt.prom.tmp"), 0, "temporary file left");
    json_t *a = events_of(st, 0);
    for (size_t i = 0; i < json_array_size(a); i++)
        cr_assert_str_neq(name_of(a, i), "metrics_failed");
    json_decref(a);
    /* the same text (but for the age) from the call */
    char *text = NULL;
    cr_assert_eq(ckpt_store_metrics(st, &text), CKPT_OK);
    cr_assert(strstr(text, "ckpt_valid_checkpoint{"));
    cr_assert(strstr(text, "ckpt_free_saves{"));
    ckpt_free(text);
    ckpt_store_free(st);
    tc_rmtree(dir);
    free(dir);
    free(prom);
    tc_state_free(&s);
}

Test(events, version_1_options_are_accepted)
{
    /* a caller built against version 1: its struct ends before metrics_path */
    size_t v1 = offsetof(ckpt_store_options, metrics_path);
    ckpt_store_options full;
    memset(&full, 0xab, sizeof full);
    cr_assert_eq(ckpt_store_options_init(&full, 1), CKPT_OK);
    cr_assert_eq(full.version, 1);
    unsigned char after[sizeof full - offsetof(ckpt_store_options, metrics_path)];
    memset(after, 0xab, sizeof after);
    cr_assert_eq(memcmp((unsigned char *)&full + v1, after, sizeof after), 0,
                 "init of version 1 wrote past its struct");
    full.fsync = 0;
    /* exactly v1 bytes on the heap: ASan reports a read past them */
    unsigned char *raw = malloc(v1);
    memcpy(raw, &full, v1);
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, (const ckpt_store_options *)(void *)raw),
                 CKPT_OK, "%s", ckpt_error_last());
    ckpt_store_free(st);
    free(raw);
    ckpt_store_options bad;
    cr_assert_eq(ckpt_store_options_init(&bad, 3), CKPT_EVERSION);
}

Test(events, a_metrics_file_that_cannot_be_written_is_logged)
{
    char *dir = tc_mkdtemp();
    char *prom = tc_join(dir, "no-such-dir/ckpt.prom");
    ckpt_store_options o;
    tc_opts(&o);
    o.metrics_path = prom;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open(&st, tc_root, &o), CKPT_OK, "%s", ckpt_error_last());
    tc_state s;
    tc_state_standard(&s, 1);
    tc_save_ok(st, 5, &s); /* the save succeeds */
    json_t *a = events_of(st, 0);
    size_t n = json_array_size(a);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(name_of(a, 2), "metrics_failed");
    cr_assert_eq(int_of(a, 2, "step"), 5);
    const char *err = json_string_value(json_object_get(json_array_get(a, 2), "error"));
    cr_assert(err && strstr(err, "no-such-dir"), "%s", err ? err : "(none)");
    json_decref(a);
    ckpt_store_free(st);
    tc_rmtree(dir);
    free(dir);
    free(prom);
    tc_state_free(&s);
}

/* Retiring a step (keep_last) renames it out of the way; a rename refused
 * here (EPERM: an immutable directory, a file system gone read-only) left
 * every old step in place with no trace in the log, filling the disk
 * unseen.  The save stands; the log now has a retire_failed event. */
static int refuse_retiring_step_1(void *ctx, fsio_op op, const char *path)
{
    (void)ctx;
    const char *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : path;
    return op == FSIO_RENAME && base && strcmp(base, "step-000000000001") == 0 ? EPERM : 0;
}

Test(events, a_step_that_cannot_be_retired_is_logged)
{
    fsio fs = {.fault = refuse_retiring_step_1};
    ckpt_store_options o;
    tc_opts(&o);
    o.keep_last = 1;
    ckpt_store *st = NULL;
    cr_assert_eq(ckpt_store_open_with_fsio(&st, tc_root, &o, &fs), CKPT_OK, "%s",
                 ckpt_error_last());
    tc_state s;
    tc_state_standard(&s, 1);
    tc_save_ok(st, 1, &s);
    tc_save_ok(st, 2, &s); /* the save succeeds; step 1 stays */
    const int64_t both[] = {1, 2};
    tc_assert_steps(st, both, 2);
    json_t *a = events_of(st, 0);
    size_t n = json_array_size(a), found = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(name_of(a, i), "retire_failed") != 0)
            continue;
        found++;
        cr_assert_eq(int_of(a, i, "step"), 2);
        const char *err = json_string_value(json_object_get(json_array_get(a, i), "error"));
        cr_assert(err && strstr(err, "cannot retire step 1"), "%s", err ? err : "(none)");
    }
    cr_assert_eq(found, 1, "%zu retire_failed events", found);
    json_decref(a);
    ckpt_store_free(st);
    tc_state_free(&s);
}

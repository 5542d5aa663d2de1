/* ckpt doctor: disk space, stale temporaries, bad steps, environment drift. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "cli.h"

const cli_cmd cli_cmd_doctor = {
    "doctor", "Check a checkpoint root: disk space, stale temporaries, bad steps, drift",
    "Checks, each reported as ok, warning or error:\n"
    "  disk    free space against the size of the newest checkpoints (a save\n"
    "          needs room for one more before the oldest is retired)\n"
    "  temp    temporary directories (.tmp-*, .trash-*) left by writers that died\n"
    "  strays  entries named like a step that are not one (a file, a link): each\n"
    "          makes saving its step fail\n"
    "  verify  steps that fail verification (quick unless --full)\n"
    "  drift   environment changes between consecutive steps (libckpt and\n"
    "          zstd versions, CUDA driver and runtime, GPU, host, ...)\n"
    "  machine the newest readable step's environment against this machine's\n"
    "          (the fields both have; CUDA only where a runtime is in use)\n"
    "  frameworks the framework versions the newest readable step recorded\n"
    "          (python, numpy, torch, torch.cuda: saves from Python) against\n"
    "          those of $CKPT_PYTHON (default python3) here\n"
    "Exits 1 when any check is an error (a step fails verification, no valid\n"
    "step, or too little free space), 0 otherwise.",
    1, cmd_doctor};

#define RECENT_STEPS 3

/* Environment fields that differ on every run and so are not drift. */
static int volatile_key(const char *key)
{
    static const char *const skip[] = {"pid", "ppid", "tid", "time", "timestamp", "start_time",
                                       "argv", "cmdline", "command", "command_line", "cwd",
                                       "date", "uptime"};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (strcmp(key, skip[i]) == 0)
            return 1;
    return 0;
}

/* Flatten JSON into {"a.b.c": scalar} so records of any shape compare. */
/* Fields of one environment record compared at most: a real one has a
 * few dozen; a record of millions of values (within the manifest's limits)
 * flattened into keys of up to 511 bytes, two steps at once, took 2.6 GB. */
#define ENV_FIELDS_MAX 4096 /* also in flatten's marker */

static void flatten(json_t *out, const char *prefix, json_t *v, size_t *left)
{
    char path[512];
    if (*left == 0) {
        json_object_set_new(out, "(fields past the first 4096, not compared)", json_true());
        return;
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (volatile_key(k))
                continue;
            snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", k);
            flatten(out, path, x, left);
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            snprintf(path, sizeof path, "%s[%zu]", prefix, i);
            flatten(out, path, x, left);
        }
    } else {
        json_object_set(out, *prefix ? prefix : "(value)", v);
        (*left)--;
    }
}

static json_t *env_flat(const char *text)
{
    json_t *v = cli_json_from_text(text), *flat = json_object();
    size_t left = ENV_FIELDS_MAX;
    flatten(flat, "", v, &left);
    json_decref(v);
    return flat;
}

/* Append to `drift` every field that differs between `a` and `b`. */
static void env_diff(json_t *drift, int64_t from, int64_t to, json_t *a, json_t *b)
{
    const char *k;
    json_t *x;
    json_object_foreach(a, k, x) {
        json_t *y = json_object_get(b, k);
        if (!y || !json_equal(x, y))
            json_array_append_new(drift,
                                  json_pack("{s:I, s:I, s:s, s:O, s:O}", "from_step",
                                            (json_int_t)from, "to_step", (json_int_t)to,
                                            "field", k, "old", x, "new",
                                            y ? y : json_null()));
    }
    json_object_foreach(b, k, x) {
        if (!json_object_get(a, k))
            json_array_append_new(drift,
                                  json_pack("{s:I, s:I, s:s, s:n, s:O}", "from_step",
                                            (json_int_t)from, "to_step", (json_int_t)to,
                                            "field", k, "old", "new", x));
    }
}

static void finding(json_t *findings, const char *check, const char *severity,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void finding(json_t *findings, const char *check, const char *severity,
                    const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_array_append_new(findings, json_pack("{s:s, s:s, s:s}", "check", check, "severity",
                                              severity, "message", msg));
}

/* The stale temporary directories, as the library's gc dry run lists them
 * (it owns the root's naming), with their age and size. */
static json_t *scan_temps(ckpt_store *store, const char *root, uint64_t *bytes)
{
    json_t *arr = json_array();
    ckpt_report *r = NULL;
    *bytes = 0;
    if (ckpt_store_gc(store, INT_MAX, 1, &r) != CKPT_OK) {
        ckpt_report_free(r);
        ckpt_error_clear();
        return arr;
    }
    time_t now = time(NULL);
    for (size_t i = 0; i < ckpt_report_count(r); i++) {
        const ckpt_problem *p = ckpt_report_get(r, i);
        if (p->step != -1)
            continue; /* a step gc would retire: none with keep_last INT_MAX */
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", root, p->file);
        if (lstat(path, &sb) != 0)
            continue;
        uint64_t b = S_ISDIR(sb.st_mode) ? cli_dir_bytes(path) : (uint64_t)sb.st_size;
        *bytes += b;
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "name", p->file,
                                             "age_seconds",
                                             (json_int_t)(now > sb.st_mtime ? now - sb.st_mtime
                                                                            : 0),
                                             "bytes", (json_int_t)b));
    }
    ckpt_report_free(r);
    return arr;
}

/* Whether `name` is the name a writer gives step N (step-%012lld, N an
 * int64): only such an entry stands where a step goes. */
static int step_name(const char *name)
{
    const char *d = name + 5;
    size_t n = strlen(name) > 5 ? strlen(d) : 0;
    if (strncmp(name, "step-", 5) != 0 || n < 12 || n > 19 || strspn(d, "0123456789") != n)
        return 0;
    errno = 0;
    long long v = strtoll(d, NULL, 10);
    char canon[32];
    snprintf(canon, sizeof canon, "step-%012lld", v);
    return errno == 0 && strcmp(canon, name) == 0;
}

/* Entries of the root named like a step that are not directories (a
 * file, link, FIFO...): no writer makes one, and each makes every save of
 * its step fail.  One finding naming up to three (none when the root cannot
 * be read: the other checks say so); returns 1 when there are some. */
static int check_strays(json_t *findings, const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return 0;
    char names[512] = "";
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!step_name(e->d_name))
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(sb.st_mode))
            continue;
        if (n++ < 3) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%s (%s)", used ? ", " : "",
                     e->d_name, S_ISREG(sb.st_mode) ? "a file"
                                : S_ISLNK(sb.st_mode) ? "a symbolic link" : "a special file");
        }
    }
    closedir(d);
    if (!n) {
        finding(findings, "strays", "ok", "no entries named like a step that are not one");
        return 0;
    }
    finding(findings, "strays", "error",
            "%zu entr%s named like a step but not a checkpoint: %s%s; saving such a step "
            "fails until it is removed", n, n == 1 ? "y" : "ies", names, n > 3 ? ", ..." : "");
    return 1;
}

/* The framework versions recorded by step `step` (`rec`: its environment
 * record's "frameworks", NULL when it has none) against this machine's:
 * one entry per framework in `out`, and one finding. */
static void check_frameworks(json_t *findings, json_t *out, json_t *rec, int64_t step)
{
    if (!json_is_object(rec) || !json_object_size(rec)) {
        finding(findings, "frameworks", "ok",
                "step %" PRId64 " recorded no framework versions (saved from C, or by an "
                "older libckpt)", step);
        return;
    }
    char why[256] = "", names[512] = "";
    json_t *now = cli_framework_versions(rec, why, sizeof why);
    int asked = now != NULL;
    const char *k;
    json_t *x;
    size_t differ = 0;
    json_object_foreach(rec, k, x) {
        json_t *y = now ? json_object_get(now, k) : NULL;
        int drift = !y || !json_equal(x, y);
        json_array_append_new(out, json_pack("{s:I, s:s, s:O, s:O, s:b, s:b}", "step",
                                             (json_int_t)step, "name", k,
                                             "checkpoint", x, "now", y ? y : json_null(),
                                             "installed", y != NULL, "drift", drift));
        if (!drift)
            continue;
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s%s", used ? ", " : "", k,
                 y ? "" : " (not installed here)");
        differ++;
    }
    json_decref(now);
    if (differ)
        finding(findings, "frameworks", "warning",
                "this machine's frameworks differ from those of step %" PRId64 " in: %s%s%s",
                step, names, asked ? "" : "; ", asked ? "" : why);
    else
        finding(findings, "frameworks", "ok",
                "this machine's frameworks match those of step %" PRId64 " (%zu compared)",
                step, json_object_size(rec));
}

/* The detail lines of one check, under its finding (text mode). */
static void print_details(const char *check, json_t *temps, json_t *unverifiable,
                          json_t *drift, json_t *frameworks, json_t *machine,
                          int64_t prev_step)
{
    size_t i;
    json_t *f;
    char b1[32], b2[32];
    if (strcmp(check, "temp") == 0) {
        json_array_foreach(temps, i, f) {
            cli_line("    temp %s: %s, %s old", json_string_value(json_object_get(f, "name")),
                   cli_fmt_bytes((uint64_t)json_integer_value(json_object_get(f, "bytes")), b1),
                   cli_fmt_duration((double)json_integer_value(json_object_get(f, "age_seconds")),
                                    b2));
        }
    } else if (strcmp(check, "verify") == 0) {
        json_array_foreach(unverifiable, i, f) {
            cli_line("    step %" PRId64 ": %s",
                   (int64_t)json_integer_value(json_object_get(f, "step")),
                   json_string_value(json_object_get(f, "status")));
            size_t j;
            json_t *p;
            json_array_foreach(json_object_get(f, "problems"), j, p)
                cli_line("      %s", json_string_value(json_object_get(p, "message")));
        }
    } else if (strcmp(check, "drift") == 0) {
        json_array_foreach(drift, i, f) {
            char *o = json_dumps(json_object_get(f, "old"), JSON_ENCODE_ANY | JSON_COMPACT);
            char *n = json_dumps(json_object_get(f, "new"), JSON_ENCODE_ANY | JSON_COMPACT);
            cli_line("    drift %" PRId64 " -> %" PRId64 ": %s: %s -> %s",
                   (int64_t)json_integer_value(json_object_get(f, "from_step")),
                   (int64_t)json_integer_value(json_object_get(f, "to_step")),
                   json_string_value(json_object_get(f, "field")), o ? o : "?", n ? n : "?");
            free(o);
            free(n);
        }
    } else if (strcmp(check, "frameworks") == 0) {
        json_array_foreach(frameworks, i, f) {
            if (!json_is_true(json_object_get(f, "drift")))
                continue;
            char *o = json_dumps(json_object_get(f, "checkpoint"), JSON_ENCODE_ANY | JSON_COMPACT);
            char *n = json_dumps(json_object_get(f, "now"), JSON_ENCODE_ANY | JSON_COMPACT);
            cli_line("    framework: %s: step %" PRId64 " has %s, this machine %s",
                   json_string_value(json_object_get(f, "name")), prev_step, o ? o : "?",
                   json_is_true(json_object_get(f, "installed")) ? (n ? n : "?")
                                                                  : "(not installed here)");
            free(o);
            free(n);
        }
    } else if (strcmp(check, "machine") == 0) {
        json_array_foreach(machine, i, f) {
            char *o = json_dumps(json_object_get(f, "checkpoint"), JSON_ENCODE_ANY | JSON_COMPACT);
            char *n = json_dumps(json_object_get(f, "now"), JSON_ENCODE_ANY | JSON_COMPACT);
            cli_line("    machine: %s: step %" PRId64 " has %s, this machine %s",
                   json_string_value(json_object_get(f, "field")),
                   (int64_t)json_integer_value(json_object_get(f, "step")), o ? o : "?",
                   n ? n : "?");
            free(o);
            free(n);
        }
    }
}

int cmd_doctor(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL;
    int full = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_FLAG, "full", NULL, "verify every chunk of every step (slower)", &full, 0, 0,
         NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_doctor, opts, argc, argv, &ret))
        return ret;

    ckpt_store *store = NULL;
    int64_t *steps = NULL;
    size_t count = 0, checked = 0, nvalid = 0, nrecent = 0; /* checked: not retired meanwhile */
    size_t seen = 0; /* steps listed in any round */
    json_t *findings = json_array(), *unverifiable = json_array(), *drift = json_array();
    json_t *recent = json_array(), *prev_env = NULL, *temps = NULL, *disk = NULL;
    json_t *machine = json_array(), *fw_rec = NULL, *frameworks = json_array();
    int64_t prev_step = -1;
    uint64_t recent_max = 0, recent_total = 0;
    int errors = 0;
    cli_progress prog = {0};

    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    const char *root = ckpt_store_path(store);
    /* verify + drift, oldest first; sizes of the newest valid steps.
     * Steps a running job retires meanwhile (keep_last) are left out; when
     * that leaves none, the root is listed again. */
    for (int round = 0; round <= CLI_RELISTS; round++) {
        ckpt_free(steps);
        steps = NULL;
        int st = ckpt_store_steps(store, &steps, &count);
        if (st != CKPT_OK) {
            ret = cli_fail_lib(ctx, st == CKPT_ENOTFOUND ? CKPT_EIO : st, "cannot list %s",
                               dir);
            goto done;
        }
        if (full && !round)
            cli_progress_start(&prog, "verify",
                               cli_progress_wanted() ? cli_steps_stored_bytes(store, steps, count)
                                                     : 0);
        for (size_t i = 0; i < count; i++) {
            cli_step s;
            cli_step_check(store, steps[i], full ? CKPT_VERIFY_FULL : CKPT_VERIFY_QUICK, &s);
            if (s.state == CLI_STEP_GONE) { /* retired by a running job meanwhile */
                cli_step_clear(&s);
                continue;
            }
            checked++;
            if (s.have_stats)
                cli_progress_add(&prog, s.stats.stored_bytes);
            if (s.state == CLI_STEP_VALID)
                nvalid++;
            else
                json_array_append_new(unverifiable, cli_step_json(&s));
            if (s.ckpt) {
                json_t *env = env_flat(ckpt_checkpoint_env(s.ckpt));
                if (prev_env)
                    env_diff(drift, prev_step, s.step, prev_env, env);
                json_decref(prev_env);
                prev_env = env;
                prev_step = s.step;
                json_t *raw = cli_json_from_text(ckpt_checkpoint_env(s.ckpt));
                json_decref(fw_rec);
                fw_rec = json_incref(json_object_get(raw, "frameworks"));
                json_decref(raw);
            }
            cli_step_clear(&s);
        }
        seen += count;
        if (checked) /* else all retired, or none seen: an empty listing may be */
            break;    /* one read while entries were renamed (cmd_list.c) */
    }
    cli_progress_end(&prog);
    for (size_t i = count; i-- > 0 && nrecent < RECENT_STEPS;) {
        ckpt_checkpoint *c = NULL;
        if (ckpt_checkpoint_open(&c, store, steps[i], CKPT_VERIFY_QUICK) != CKPT_OK)
            continue;
        uint64_t b = cli_dir_bytes(ckpt_checkpoint_path(c));
        ckpt_save_stats ss;
        if (!b && ckpt_checkpoint_stats(c, &ss) == CKPT_OK)
            b = ss.stored_bytes;
        ckpt_checkpoint_free(c);
        json_array_append_new(recent, json_pack("{s:I, s:I}", "step", (json_int_t)steps[i],
                                                "bytes", (json_int_t)b));
        recent_max = b > recent_max ? b : recent_max;
        recent_total += b;
        nrecent++;
    }
    ckpt_error_clear();

    /* disk */
    struct statvfs vfs;
    char b1[32], b2[32], b3[32];
    if (statvfs(root, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
        disk = json_pack("{s:I, s:I, s:I, s:I, s:o}", "free_bytes", (json_int_t)avail,
                         "total_bytes", (json_int_t)total, "recent_max_bytes",
                         (json_int_t)recent_max, "recent_total_bytes",
                         (json_int_t)recent_total, "recent_steps", recent);
        recent = NULL;
        if (cli_refuses_writes(root, &vfs)) /* an archive may be so on purpose: a warning */
            finding(findings, "disk", "warning", "the file system of %s is mounted read-only: "
                    "its checkpoints can be read, but no save can be written there", root);
        else if (!nrecent)
            finding(findings, "disk", "ok", "%s free; no readable checkpoint to compare with",
                    cli_fmt_bytes(avail, b1));
        else if (avail < recent_max) {
            errors++;
            finding(findings, "disk", "error",
                    "%s free, less than the largest recent checkpoint (%s): the next save "
                    "will fail",
                    cli_fmt_bytes(avail, b1), cli_fmt_bytes(recent_max, b2));
        } else if (avail < 2 * recent_max)
            finding(findings, "disk", "warning",
                    "%s free: room for only one more checkpoint of %s",
                    cli_fmt_bytes(avail, b1), cli_fmt_bytes(recent_max, b2));
        else
            finding(findings, "disk", "ok", "%s free; recent checkpoints up to %s (%s for %zu)",
                    cli_fmt_bytes(avail, b1), cli_fmt_bytes(recent_max, b2),
                    cli_fmt_bytes(recent_total, b3), nrecent);
    } else {
        disk = json_null();
        finding(findings, "disk", "warning", "cannot read free space of %s", root);
    }

    /* temp */
    uint64_t temp_bytes;
    temps = scan_temps(store, root, &temp_bytes);
    if (json_array_size(temps))
        finding(findings, "temp", "warning",
                "%zu temporary director%s (%s) left by writers that died, unless a save is "
                "running now; 'ckpt gc' removes them",
                json_array_size(temps), json_array_size(temps) == 1 ? "y" : "ies",
                cli_fmt_bytes(temp_bytes, b1));
    else
        finding(findings, "temp", "ok", "no temporary directories");

    /* strays */
    errors += check_strays(findings, root);

    /* verify */
    if (!checked) {
        errors++;
        finding(findings, "verify", "error", seen ? "every step listed in %s was retired "
                "by a running job before it could be checked: run again"
                : "no checkpoints in %s", root);
    } else if (json_array_size(unverifiable)) {
        errors++;
        finding(findings, "verify", "error", "%zu of %zu steps fail %s verification%s",
                json_array_size(unverifiable), checked, full ? "full" : "quick",
                nvalid ? "" : "; no valid checkpoint");
    } else {
        finding(findings, "verify", "ok", "all %zu steps pass %s verification", checked,
                full ? "full" : "quick");
    }

    /* drift */
    if (json_array_size(drift)) {
        json_t *d0 = json_array_get(drift, 0);
        finding(findings, "drift", "warning",
                "environment changed %zu time%s between steps (first: %s at step %" PRId64 ")",
                json_array_size(drift), json_array_size(drift) == 1 ? "" : "s",
                json_string_value(json_object_get(d0, "field")),
                (int64_t)json_integer_value(json_object_get(d0, "to_step")));
    } else {
        finding(findings, "drift", "ok", "no environment change between steps");
    }

    /* machine: the newest readable step's record against this machine's
     * (the fields both have: CUDA only where a runtime is in use here) */
    char *now_text = NULL;
    if (prev_env && ckpt_store_environment(store, &now_text) == CKPT_OK) {
        json_t *now = env_flat(now_text), *x;
        const char *k;
        char fields[512] = "";
        json_object_foreach(prev_env, k, x) {
            json_t *y = json_object_get(now, k);
            if (!y || json_equal(x, y))
                continue;
            json_array_append_new(machine, json_pack("{s:I, s:s, s:O, s:O}", "step",
                                                     (json_int_t)prev_step, "field", k,
                                                     "checkpoint", x, "now", y));
            size_t used = strlen(fields);
            snprintf(fields + used, sizeof fields - used, "%s%s", used ? ", " : "", k);
        }
        json_decref(now);
        if (json_array_size(machine))
            finding(findings, "machine", "warning",
                    "this machine differs from the environment of step %" PRId64 " in: %s",
                    prev_step, fields);
        else
            finding(findings, "machine", "ok",
                    "this machine matches the environment of step %" PRId64
                    " (library, codec and CUDA versions that it has in use)", prev_step);
    } else {
        finding(findings, "machine", "ok", "no readable checkpoint to compare with");
    }
    ckpt_free(now_text);
    ckpt_error_clear();
    if (prev_env)
        check_frameworks(findings, frameworks, fw_rec, prev_step);

    if (ctx->json) {
        cli_json_print(json_pack("{s:s, s:s, s:b, s:{s:I, s:I}, s:O, s:O, s:O, s:O, s:O, s:O, s:O}",
                                 "root", root, "level", full ? "full" : "quick", "ok",
                                 errors == 0, "steps", "total", (json_int_t)checked, "valid",
                                 (json_int_t)nvalid, "findings", findings, "disk", disk,
                                 "temp_dirs", temps, "unverifiable", unverifiable, "drift",
                                 drift, "machine", machine, "frameworks", frameworks));
    } else {
        size_t i;
        json_t *f;
        cli_line("ckpt doctor %s (%zu step%s, %zu valid)", root, checked, checked == 1 ? "" : "s",
               nvalid);
        json_array_foreach(findings, i, f) {
            char tag[16];
            snprintf(tag, sizeof tag, "[%s]", json_string_value(json_object_get(f, "severity")));
            const char *check = json_string_value(json_object_get(f, "check"));
            cli_line("  %-10s %-7s %s", tag, check,
                   json_string_value(json_object_get(f, "message")));
            print_details(check, temps, unverifiable, drift, frameworks, machine, prev_step);
        }
    }
    ret = errors ? CLI_EXIT_INVALID : CLI_EXIT_OK;
done:
    json_decref(findings);
    json_decref(unverifiable);
    json_decref(drift);
    json_decref(machine);
    json_decref(fw_rec);
    json_decref(frameworks);
    json_decref(recent);
    json_decref(prev_env);
    json_decref(temps);
    json_decref(disk);
    ckpt_free(steps);
    ckpt_store_free(store);
    return ret;
}

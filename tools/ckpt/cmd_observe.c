/* ckpt log, ckpt metrics, ckpt health: what happened to a root, its health
 * for Prometheus, and a pass/fail check for cron (docs/OPERATIONS.md). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <sys/random.h>
#include <unistd.h>

#include "cli.h"

const cli_cmd cli_cmd_log = {
    "log", "Print the event log of a checkpoint root (saves, restores, verify, gc)",
    "Every save (begun, committed with its statistics, failed with its error),\n"
    "restore (the step restored, the steps skipped and why), verify and gc of a\n"
    "store opened for writing is one JSON line in ROOT/ckpt-events.jsonl\n"
    "(docs/OPERATIONS.md gives the schema).  Prints them oldest first, one per\n"
    "line; --json prints {\"root\", \"events\": [...]}.  --since DURATION keeps\n"
    "the events of the last DURATION (90s, 15m, 2h, 7d) or, as @UNIXTIME, those\n"
    "from that time on.",
    1, cmd_log};

const cli_cmd cli_cmd_metrics = {
    "metrics", "Print the health of a checkpoint root as Prometheus metrics",
    "The newest step that passes quick verification, its age and its save's\n"
    "statistics, save, failure and restore counts from the event log, free\n"
    "space and how many more checkpoints of the newest one's size fit, in the\n"
    "Prometheus text format (docs/OPERATIONS.md lists them).  --output FILE\n"
    "replaces FILE atomically (for node_exporter's textfile collector, from\n"
    "cron: name it *.prom).",
    0, cmd_metrics};

const cli_cmd cli_cmd_health = {
    "health", "Exit 0 when a root has a recent valid checkpoint and room for more",
    "Healthy when the newest checkpoint that passes full verification is younger\n"
    "than --max-age (default 24h; 90s, 15m, 2h, 7d) and the file system holds\n"
    "--min-free-saves more checkpoints of its size (default 1).  Prints one line\n"
    "(\"ok: ...\" or \"unhealthy: reason\"), or a JSON object with --json; exits 0\n"
    "when healthy, 1 when not, 3 when the root cannot be read.",
    1, cmd_health};

/* "90s", "15m", "2h", "7d", "3600" (seconds) -> seconds; -1 if malformed. */
static double parse_duration(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || !isfinite(v))
        return -1;
    double unit = 1;
    if (*end == 's')
        end++;
    else if (*end == 'm')
        unit = 60, end++;
    else if (*end == 'h')
        unit = 3600, end++;
    else if (*end == 'd')
        unit = 86400, end++;
    return *end ? -1 : v * unit;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --------------------------------------------------------------------- log */

static json_t *get(json_t *ev, const char *key)
{
    return json_object_get(ev, key);
}

/* The details of one event on one line, its detail lines below: each
 * written with cli_put_oneline (the log's writer chose the text). */
static void print_event(json_t *ev)
{
    char t[32], a[32], b[32], c[32], d[32];
    const char *name = json_string_value(get(ev, "event"));
    char *line = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&line, &len);
    if (!m)
        return;
    fprintf(m, "%s  %-15s", cli_fmt_time(json_number_value(get(ev, "time")), t), name);
    if (json_is_integer(get(ev, "step")))
        fprintf(m, "  step %" JSON_INTEGER_FORMAT, json_integer_value(get(ev, "step")));
    if (!strcmp(name, "save_committed"))
        fprintf(m, "  %s -> %s, stall %s, persist %s",
               cli_fmt_bytes((uint64_t)json_integer_value(get(ev, "raw_bytes")), a),
               cli_fmt_bytes((uint64_t)json_integer_value(get(ev, "stored_bytes")), b),
               cli_fmt_duration(json_number_value(get(ev, "stall_s")), c),
               cli_fmt_duration(json_number_value(get(ev, "persist_s")), d));
    if (json_is_string(get(ev, "level")))
        fprintf(m, "  (%s)", json_string_value(get(ev, "level")));
    if (json_is_string(get(ev, "error")))
        fprintf(m, "  %s: %s", json_string_value(get(ev, "status")),
               json_string_value(get(ev, "error")));
    json_t *removed = get(ev, "removed");
    if (json_is_array(removed))
        fprintf(m, "  removed %zu", json_array_size(removed));
    fprintf(m, "  [pid %" JSON_INTEGER_FORMAT " on %s]", json_integer_value(get(ev, "pid")),
           json_string_value(get(ev, "host")) ? json_string_value(get(ev, "host")) : "?");
    fclose(m);
    cli_put_oneline(stdout, line);
    fputc('\n', stdout);
    free(line);
    json_t *list = json_is_array(get(ev, "skipped")) ? get(ev, "skipped") : get(ev, "problems");
    size_t i;
    json_t *p;
    json_array_foreach(list, i, p)
        cli_line("    step %" JSON_INTEGER_FORMAT " %s: %s", json_integer_value(get(p, "step")),
               json_string_value(get(p, "status")), json_string_value(get(p, "message")));
}

int cmd_log(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL, *since_arg = NULL;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_STRING, "since", "DURATION", "only the events of the last DURATION "
         "(90s, 15m, 2h, 7d), or from @UNIXTIME on", &since_arg, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_log, opts, argc, argv, &ret))
        return ret;
    double since = 0;
    if (since_arg) {
        double v = parse_duration(since_arg + (since_arg[0] == '@'));
        if (v < 0)
            return cli_usage(ctx, "--since expects a duration (90s, 15m, 2h, 7d) or "
                             "@UNIXTIME, not '%s'", since_arg);
        since = since_arg[0] == '@' ? v : wall_now() - v;
    }
    ckpt_store *store = NULL;
    char *text = NULL;
    json_t *events = json_array();
    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    int st = ckpt_store_events(store, since, &text);
    if (st) {
        ret = cli_fail_lib(ctx, st, "cannot read the event log of %s", dir);
        goto done;
    }
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *ev = json_loads(line, 0, NULL);
        if (json_is_object(ev))
            json_array_append(events, ev);
        json_decref(ev);
    }
    if (ctx->json) {
        cli_json_print(json_pack("{s:s, s:O}", "root", ckpt_store_path(store), "events",
                                 events));
    } else {
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev)
            print_event(ev);
    }
    ret = CLI_EXIT_OK;
done:
    json_decref(events);
    ckpt_free(text);
    ckpt_store_free(store);
    return ret;
}

/* ----------------------------------------------------------------- metrics */

/* Replace `path` by `text` atomically: a reader sees the old or new file. */
static int write_atomically(cli_ctx *ctx, const char *path, const char *text)
{
    size_t n = strlen(path) + 48;
    char *tmp = malloc(n);
    if (!tmp)
        return cli_fail(ctx, CLI_EXIT_ERROR, CKPT_ENOMEM, "out of memory");
    /* A name nobody can guess (as the library's metrics_path file): in a
     * directory others may write, names of the pid alone could all be
     * taken beforehand, and the file would never be written. */
    int ret = CLI_EXIT_OK, fd = -1;
    errno = EEXIST;
    for (int attempt = 0; attempt < 16 && fd < 0 && errno == EEXIST; attempt++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
            r = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + (uint64_t)attempt;
        snprintf(tmp, n, "%s.tmp-%ld-%016llx", path, (long)getpid(), (unsigned long long)r);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    }
    size_t len = strlen(text);
    /* 0644 whatever the umask: the collector's user must read it (as the
     * library's metrics_path file). */
    if (fd < 0 || fchmod(fd, 0644) != 0 || write(fd, text, len) != (ssize_t)len ||
        fsync(fd) != 0 ||
        close(fd) != 0 || rename(tmp, path) != 0) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, CKPT_EIO, "cannot write %s: %s", path,
                       strerror(errno));
        if (fd >= 0)
            unlink(tmp);
    }
    free(tmp);
    return ret;
}

int cmd_metrics(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL, *output = NULL;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_STRING, "output", "FILE", "replace FILE atomically instead of printing",
         &output, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_metrics, opts, argc, argv, &ret))
        return ret;
    ckpt_store *store = NULL;
    char *text = NULL;
    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    int st = ckpt_store_metrics(store, &text);
    if (st) {
        ret = cli_fail_lib(ctx, st, "cannot measure %s", dir);
        goto done;
    }
    if (output) {
        ret = write_atomically(ctx, output, text);
    } else {
        fputs(text, stdout);
        ret = CLI_EXIT_OK;
    }
done:
    ckpt_free(text);
    ckpt_store_free(store);
    return ret;
}

/* ------------------------------------------------------------------ health */

int cmd_health(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL, *max_age_arg = "24h";
    int64_t min_saves = 1;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_STRING, "max-age", "DURATION", "oldest acceptable newest valid checkpoint "
         "(default 24h)", &max_age_arg, 0, 0, NULL},
        {CLI_OPT_INT, "min-free-saves", "N", "checkpoints of the newest one's size that must "
         "still fit (default 1)", &min_saves, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_health, opts, argc, argv, &ret))
        return ret;
    double max_age = parse_duration(max_age_arg);
    if (max_age < 0)
        return cli_usage(ctx, "--max-age expects a duration (90s, 15m, 2h, 7d), not '%s'",
                         max_age_arg);
    ckpt_store *store = NULL;
    ckpt_checkpoint *ck = NULL;
    if ((ret = cli_open_readonly(ctx, dir, &store)))
        return ret;
    char reason[512] = "", a[32], b[32], c[32];
    int64_t step = -1;
    double age = -1;
    uint64_t free_bytes = 0, size = 0, fits = 0;
    int have_free = 0, read_only = 0;
    struct statvfs v;
    if (statvfs(ckpt_store_path(store), &v) == 0) {
        have_free = 1;
        /* Mounted read-only (a full or failing disk remounted so): free
         * blocks, but room for no checkpoint at all. */
        read_only = cli_refuses_writes(ckpt_store_path(store), &v);
        free_bytes = read_only ? 0 : (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    }
    int st = ckpt_checkpoint_open(&ck, store, CKPT_LATEST, CKPT_VERIFY_FULL);
    if (st == CKPT_ENOCKPT) {
        snprintf(reason, sizeof reason, "no checkpoint in %s passes full verification", dir);
    } else if (st) {
        ret = cli_fail_lib(ctx, st, "cannot check %s", dir);
        goto done;
    } else {
        step = ckpt_checkpoint_step(ck);
        age = wall_now() - ckpt_checkpoint_time(ck);
        ckpt_save_stats stats;
        if (ckpt_checkpoint_stats(ck, &stats) == CKPT_OK)
            size = stats.stored_bytes;
        fits = size ? free_bytes / size : 0;
        if (age > max_age)
            snprintf(reason, sizeof reason, "the newest valid checkpoint (step %" PRId64
                     ") is %s old, more than %s", step, cli_fmt_duration(age, a),
                     cli_fmt_duration(max_age, b));
        else if (read_only)
            snprintf(reason, sizeof reason, "the file system of %s is mounted read-only: "
                     "no checkpoint can be written there", dir);
        else if (have_free && size && fits < (uint64_t)min_saves)
            snprintf(reason, sizeof reason, "%s free on the file system of %s holds %" PRIu64
                     " more checkpoint%s of %s (step %" PRId64 "), fewer than %" PRId64,
                     cli_fmt_bytes(free_bytes, a), dir, fits, fits == 1 ? "" : "s",
                     cli_fmt_bytes(size, c), step, min_saves);
    }
    int healthy = reason[0] == '\0';
    if (ctx->json) {
        cli_json_print(json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:I, s:f, s:I}", "root",
                                 ckpt_store_path(store), "healthy", healthy, "reason",
                                 healthy ? json_null() : json_string(reason), "step",
                                 cli_json_int_or_null(step), "age_s",
                                 age >= 0 ? json_real(age) : json_null(), "free_bytes",
                                 have_free ? json_integer((json_int_t)free_bytes) : json_null(),
                                 "free_saves",
                                 size && have_free ? json_integer((json_int_t)fits)
                                                   : json_null(),
                                 "stored_bytes", (json_int_t)size, "max_age_s", max_age,
                                 "min_free_saves", (json_int_t)min_saves));
    } else if (healthy) {
        printf("ok: step %" PRId64 " is %s old, room for %" PRIu64 " more checkpoint%s "
               "of %s\n", step, cli_fmt_duration(age, a), fits, fits == 1 ? "" : "s",
               cli_fmt_bytes(size, b));
    } else {
        cli_line("unhealthy: %s", reason);
    }
    ret = healthy ? CLI_EXIT_OK : CLI_EXIT_INVALID;
done:
    ckpt_checkpoint_free(ck);
    ckpt_store_free(store);
    return ret;
}

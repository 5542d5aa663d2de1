/* store: opening checkpoint roots and naming verification outcomes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* The first symbolic link on the way to `dir` that belongs to neither the
 * caller nor root, walked one component at a time as the kernel resolves
 * it: 1 with the link's path in `link` (its target in `target`, its owner
 * in *uid), else 0.  A reader may follow such a link (a writer refuses
 * it); a job script is told, since it may lead to another run. */
static int foreign_link(const char *dir, char *link, size_t llen, char *target, size_t tlen,
                        unsigned *uid)
{
    char cur[PATH_MAX], rest[PATH_MAX];
    if (dir[0] == '/')
        snprintf(cur, sizeof cur, "/");
    else if (!getcwd(cur, sizeof cur))
        return 0;
    snprintf(rest, sizeof rest, "%s", dir);
    for (int hops = 0; rest[0] && hops < 40;) {
        char *p = rest;
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        if (n == 0)
            break;
        char name[NAME_MAX + 1];
        if (n > NAME_MAX)
            return 0;
        memcpy(name, p, n);
        name[n] = 0;
        memmove(rest, p + n, strlen(p + n) + 1);
        if (!strcmp(name, "."))
            continue;
        if (!strcmp(name, "..")) {
            char *slash = strrchr(cur, '/');
            if (slash && slash != cur)
                *slash = 0;
            else
                snprintf(cur, sizeof cur, "/");
            continue;
        }
        char next[PATH_MAX];
        if (snprintf(next, sizeof next, "%s%s%s", cur, strcmp(cur, "/") ? "/" : "", name) >=
            (int)sizeof next)
            return 0;
        struct stat sb;
        if (lstat(next, &sb) != 0)
            return 0;
        if (!S_ISLNK(sb.st_mode)) {
            snprintf(cur, sizeof cur, "%s", next);
            continue;
        }
        char to[PATH_MAX];
        ssize_t k = readlink(next, to, sizeof to - 1);
        if (k < 0)
            return 0;
        to[k] = 0;
        if (sb.st_uid != geteuid() && sb.st_uid != 0) {
            snprintf(link, llen, "%s", next);
            snprintf(target, tlen, "%s", to);
            *uid = (unsigned)sb.st_uid;
            return 1;
        }
        char joined[2 * PATH_MAX];
        snprintf(joined, sizeof joined, "%s/%s", to, rest);
        if (strlen(joined) >= sizeof rest)
            return 0;
        snprintf(rest, sizeof rest, "%s", joined);
        if (to[0] == '/')
            snprintf(cur, sizeof cur, "/");
        hops++;
    }
    return 0;
}

static void user_label(unsigned uid, char *buf, size_t len)
{
    struct passwd *pw = getpwuid(uid);
    snprintf(buf, len, "uid %u%s%s%s", uid, pw ? " (" : "", pw ? pw->pw_name : "",
             pw ? ")" : "");
}

/* Roots are handed to the library as the user gave them, never resolved
 * here first: the library checks the symbolic links on the way (a writer
 * refuses one planted by another user, docs/RELIABILITY.md), which a
 * realpath() in front of it would hide.  What the commands print names
 * the absolute path the library resolved (job scripts cd around). */
int cli_open_readonly(cli_ctx *ctx, const char *dir, ckpt_store **out)
{
    ckpt_store_options opts = CKPT_STORE_OPTIONS_INIT;
    opts.flags = CKPT_OPEN_READONLY | (ctx->trust_group ? CKPT_OPEN_TRUST_GROUP : 0u);
    int st = ckpt_store_open(out, dir, &opts);
    if (st != CKPT_OK) {
        /* A root that cannot be opened is an I/O problem, never "invalid". */
        int code = cli_exit_for(st);
        return cli_fail(ctx, code == CLI_EXIT_INVALID ? CLI_EXIT_ERROR : code, st,
                        "cannot open %s: %s", dir,
                        *ckpt_error_last() ? ckpt_error_last() : ckpt_strerror(st));
    }
    /* Reading another user's root is allowed (a colleague's run), but on a
     * shared server a root at the expected path may have been made by
     * someone else before the job ran: say whose it is, on stderr, so a job
     * script that reads first does not take it silently for its own. */
    struct stat sb;
    const char *abs = ckpt_store_path(*out);
    char who[300], link[PATH_MAX], target[PATH_MAX];
    unsigned luid;
    if (stat(abs, &sb) == 0 && sb.st_uid != geteuid() && sb.st_uid != 0) {
        user_label((unsigned)sb.st_uid, who, sizeof who);
        cli_note("ckpt %s: note: %s belongs to %s, not to you: its "
                 "checkpoints are that user's (checksums prove integrity, not origin)",
                 ctx->cmd, abs, who);
    } else if (foreign_link(dir, link, sizeof link, target, sizeof target, &luid)) {
        /* one's own root reached through a stranger's link: maybe not the
         * run the script means (a writer would refuse this path) */
        user_label(luid, who, sizeof who);
        cli_note("ckpt %s: note: %s goes through the symbolic link %s (-> %s), "
                 "which belongs to %s: it leads to %s, which may be another run than "
                 "this path names (a writer refuses such a link)", ctx->cmd, dir, link,
                 target, who, abs);
    }
    return 0;
}

int cli_open_writer(cli_ctx *ctx, const char *dir, ckpt_store **out)
{
    ckpt_store_options opts = CKPT_STORE_OPTIONS_INIT;
    opts.keep_last = 0; /* the CLI never retires steps as a side effect */
    opts.flags = (ctx->trust_group ? CKPT_OPEN_TRUST_GROUP : 0u) |
                 (ctx->rewind ? CKPT_OPEN_REWIND : 0u);
    int st = ckpt_store_open(out, dir, &opts);
    if (st != CKPT_OK) {
        int code = cli_exit_for(st);
        return cli_fail(ctx, code == CLI_EXIT_INVALID ? CLI_EXIT_ERROR : code, st,
                        "cannot open %s for writing: %s", dir,
                        *ckpt_error_last() ? ckpt_error_last() : ckpt_strerror(st));
    }
    return 0;
}

int cli_refuses_writes(const char *root, const struct statvfs *v)
{
    if (v->f_flag & ST_RDONLY)
        return 1;
    if (access(root, W_OK) != 0)
        return 0; /* cannot tell without writing: taken as mounted */
    int fd = open(root, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    return errno == EROFS;
}

const char *cli_step_state_name(cli_step_state s)
{
    switch (s) {
    case CLI_STEP_VALID: return "valid";
    case CLI_STEP_INCOMPLETE: return "incomplete";
    case CLI_STEP_CORRUPT: return "corrupt";
    case CLI_STEP_GONE: return "retired";
    default: return "error";
    }
}

cli_step_state cli_classify(int status, const ckpt_report *report)
{
    if (status == CKPT_OK)
        return CLI_STEP_VALID;
    if (status == CKPT_EINCOMPLETE)
        return CLI_STEP_INCOMPLETE;
    size_t n = report ? ckpt_report_count(report) : 0;
    for (size_t i = 0; i < n; i++)
        if (ckpt_report_get(report, i)->status == CKPT_EINCOMPLETE)
            return CLI_STEP_INCOMPLETE;
    if (status == CKPT_ECORRUPT)
        return CLI_STEP_CORRUPT;
    return CLI_STEP_ERROR;
}

uint64_t cli_dir_bytes(const char *dir)
{
    uint64_t total = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat sb;
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            total += (uint64_t)sb.st_size;
    }
    closedir(d);
    return total;
}

/* Was the checkpoint saved by several ranks?  Its step directory then
 * holds rank 0's part manifest beside the global one. */
static int has_parts(const ckpt_checkpoint *c)
{
    char path[4096];
    struct stat sb;
    int n = snprintf(path, sizeof path, "%s/rank-00000.json", ckpt_checkpoint_path(c));
    return n > 0 && (size_t)n < sizeof path && lstat(path, &sb) == 0;
}

/* Whether `step` is (still) among the store's committed steps; 1 when it
 * cannot be told. */
static int still_listed(ckpt_store *store, int64_t step)
{
    int64_t *steps = NULL;
    size_t n = 0;
    int listed = 1;
    if (ckpt_store_steps(store, &steps, &n) == CKPT_OK) {
        listed = 0;
        for (size_t i = 0; i < n && !listed; i++)
            listed = steps[i] == step;
    }
    ckpt_free(steps);
    return listed;
}

int cli_step_check(ckpt_store *store, int64_t step, ckpt_verify_level level,
                   cli_step *out)
{
    memset(out, 0, sizeof *out);
    out->step = step;
    /* Opening checks what quick verification checks; ckpt_verify() is only
     * needed for a full check or to learn why the open failed. */
    int st = ckpt_checkpoint_open(&out->ckpt, store, step, CKPT_VERIFY_QUICK);
    if (st == CKPT_OK) {
        out->have_stats = ckpt_checkpoint_stats(out->ckpt, &out->stats) == CKPT_OK;
        /* A step of several ranks has part manifests, which only
         * ckpt_verify() looks at (a damaged one is a warning there). */
        if (level == CKPT_VERIFY_QUICK && !has_parts(out->ckpt)) {
            out->status = CKPT_OK;
            out->state = CLI_STEP_VALID;
            return CKPT_OK;
        }
    } else {
        out->ckpt = NULL;
    }
    ckpt_error_clear();
    out->status = ckpt_verify(store, step, level, &out->report);
    if (out->status != CKPT_OK && (!out->report || ckpt_report_count(out->report) == 0)) {
        /* Keep the reason even when the library filed no problem. */
        snprintf(out->message, sizeof out->message, "%s",
                 *ckpt_error_last() ? ckpt_error_last() : ckpt_strerror(out->status));
    }
    out->state = cli_classify(out->status, out->report);
    if (out->state != CLI_STEP_VALID && !still_listed(store, step))
        out->state = CLI_STEP_GONE; /* retired since the listing: not damage */
    return out->status;
}

void cli_step_clear(cli_step *s)
{
    ckpt_report_free(s->report);
    ckpt_checkpoint_free(s->ckpt);
    memset(s, 0, sizeof *s);
}

json_t *cli_step_json(const cli_step *s)
{
    char tbuf[32];
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(s->step));
    json_object_set_new(o, "status", json_string(cli_step_state_name(s->state)));
    if (s->ckpt) {
        double t = ckpt_checkpoint_time(s->ckpt);
        json_object_set_new(o, "path", json_string(ckpt_checkpoint_path(s->ckpt)));
        json_object_set_new(o, "time", json_real(t));
        json_object_set_new(o, "time_iso", json_string(cli_fmt_time(t, tbuf)));
        json_object_set_new(o, "tensors",
                            json_integer((json_int_t)ckpt_checkpoint_tensor_count(s->ckpt)));
    } else {
        json_object_set_new(o, "path", json_null());
        json_object_set_new(o, "time", json_null());
        json_object_set_new(o, "time_iso", json_null());
        json_object_set_new(o, "tensors", json_null());
    }
    if (s->have_stats) {
        const ckpt_save_stats *st = &s->stats;
        json_object_set_new(o, "raw_bytes", json_integer((json_int_t)st->raw_bytes));
        json_object_set_new(o, "stored_bytes", json_integer((json_int_t)st->stored_bytes));
        json_object_set_new(o, "ratio", st->stored_bytes
                                            ? json_real((double)st->raw_bytes /
                                                        (double)st->stored_bytes)
                                            : json_null());
        json_object_set_new(o, "chunks", json_integer((json_int_t)st->chunks));
        json_object_set_new(o, "stall_seconds", json_real(st->stall_s));
        json_object_set_new(o, "persist_seconds", json_real(st->persist_s));
        json_object_set_new(o, "save_seconds", json_real(st->stall_s + st->persist_s));
    } else {
        static const char *const keys[] = {"raw_bytes", "stored_bytes", "ratio", "chunks",
                                           "stall_seconds", "persist_seconds",
                                           "save_seconds"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            json_object_set_new(o, keys[i], json_null());
    }
    json_t *problems = cli_report_json(s->report);
    if (s->status != CKPT_OK && json_array_size(problems) == 0) {
        ckpt_problem p = {s->step, s->status, s->message, "", "", -1};
        json_array_append_new(problems, cli_problem_json(&p));
    }
    json_object_set_new(o, "problems", problems);
    return o;
}

void cli_step_print_problems(FILE *f, const cli_step *s)
{
    if (s->report && ckpt_report_count(s->report)) {
        cli_report_print(f, s->report);
    } else if (s->status != CKPT_OK) {
        fprintf(f, "  step %lld: ", (long long)s->step);
        cli_put_oneline(f, s->message);
        fputc('\n', f);
    }
}

uint64_t cli_steps_stored_bytes(ckpt_store *store, const int64_t *steps, size_t count)
{
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        ckpt_checkpoint *c = NULL;
        ckpt_save_stats st;
        if (ckpt_checkpoint_open(&c, store, steps[i], CKPT_VERIFY_QUICK) == CKPT_OK &&
            ckpt_checkpoint_stats(c, &st) == CKPT_OK)
            total += st.stored_bytes;
        ckpt_checkpoint_free(c);
    }
    ckpt_error_clear();
    return total;
}

/* 1 when directory `dir` (opened without following a link) holds an entry
 * named like a committed step (step-NNNNNNNNNNNN), looking at no more than
 * `budget` entries. */
static int holds_steps(int at, const char *name, int budget)
{
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    int found = 0;
    for (struct dirent *e; !found && budget-- > 0 && (e = readdir(d));)
        found = strncmp(e->d_name, "step-", 5) == 0 && strlen(e->d_name) == 17 &&
                strspn(e->d_name + 5, "0123456789") == 12;
    closedir(d);
    return found;
}

void cli_hint_roots_below(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    int shown = 0, looked = 0;
    for (struct dirent *e; shown < 3 && looked++ < 256 && (e = readdir(d));) {
        if (e->d_name[0] == '.' || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN))
            continue;
        if (holds_steps(dirfd(d), e->d_name, 4096)) {
            char shown_path[PATH_MAX + 256];
            snprintf(shown_path, sizeof shown_path, "%s%s%s", dir,
                     dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name);
            cli_note("ckpt: %s holds checkpoints: a root is the directory that holds the "
                     "step-* directories", shown_path);
            shown++;
        }
    }
    closedir(d);
}

/* ckpt gc: retire old steps and stale temporary directories. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

const cli_cmd cli_cmd_gc = {
    "gc", "Retire old steps beyond --keep-last N and remove stale temporary directories",
    "Temporary directories are .tmp-* (saves that died) and .trash-* (steps\n"
    "whose deletion was interrupted).  The newest step that passes full\n"
    "verification (every chunk's hashes checked) is never removed, even when\n"
    "it is older than the N newest.\n"
    "Needs write access and the writer lock: exits 3 while a job holds the\n"
    "root.  --dry-run opens the root read-only and only lists what would go.",
    1, cmd_gc};

typedef struct gc_entry {
    char *name;
    int64_t step; /* -1 for a temporary directory */
} gc_entry;

typedef struct gc_plan {
    gc_entry *v;
    size_t n, cap;
} gc_plan;

static int plan_add(gc_plan *p, const char *name, int64_t step)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        gc_entry *v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n].name = strdup(name);
    p->v[p->n].step = step;
    return p->v[p->n++].name ? 0 : -1;
}

static void plan_free(gc_plan *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i].name);
    free(p->v);
}

static int plan_from_report(gc_plan *p, const ckpt_report *r)
{
    size_t n = r ? ckpt_report_count(r) : 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_problem *e = ckpt_report_get(r, i);
        if (plan_add(p, e->file ? e->file : "", e->step) < 0)
            return -1;
    }
    return 0;
}

/* The temporary directories of `before` (a dry run's plan) that are gone
 * from `root` now, added to `p` unless there: opening the root as its
 * writer removes stale ones before gc plans, and they were removed all
 * the same. */
static int add_removed_temps(gc_plan *p, const gc_plan *before, const char *root)
{
    int dfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return 0; /* then nothing can be told gone */
    int rc = 0;
    for (size_t i = 0; i < before->n && !rc; i++) {
        struct stat sb;
        if (before->v[i].step >= 0 || fstatat(dfd, before->v[i].name, &sb,
                                               AT_SYMLINK_NOFOLLOW) == 0)
            continue;
        int listed = 0;
        for (size_t j = 0; j < p->n && !listed; j++)
            listed = strcmp(p->v[j].name, before->v[i].name) == 0;
        if (!listed)
            rc = plan_add(p, before->v[i].name, -1);
    }
    close(dfd);
    return rc;
}

/* A dry run reads any root it may read; the gc it plans needs a writer,
 * which libckpt refuses in a root another user owns (unless told to trust
 * the group).  Said on stderr, so the plan is not taken for what will
 * happen. */
static void note_foreign_root(const cli_ctx *ctx, const char *root)
{
    struct stat sb;
    if (ctx->trust_group || stat(root, &sb) != 0 || sb.st_uid == geteuid())
        return;
    cli_note("ckpt gc: note: gc without --dry-run will be refused here: %s belongs "
             "to uid %u, not to you (uid %u); a group's shared root needs --trust-group",
             root, (unsigned)sb.st_uid, (unsigned)geteuid());
}

int cmd_gc(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL;
    int64_t keep = -1;
    int dry = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_INT, "keep-last", "N", "keep the N newest steps (N >= 1; required)", &keep, 0,
         1, NULL},
        {CLI_OPT_FLAG, "dry-run", NULL, "only list what would be removed", &dry, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_gc, opts, argc, argv, &ret))
        return ret;
    if (keep < 1)
        return cli_usage(ctx, "--keep-last N is required");
    if (keep > 0x7fffffff)
        return cli_usage(ctx, "--keep-last is too large");

    ckpt_store *store = NULL;
    ckpt_report *report = NULL;
    gc_plan plan = {0};
    int st;

    if (dry) {
        if ((ret = cli_open_readonly(ctx, dir, &store)))
            goto done;
        /* The library plans a dry run on a read-only store, so a job
         * holding the root does not stop it. */
        st = ckpt_store_gc(store, (int)keep, 1, &report);
        if (st == CKPT_OK && plan_from_report(&plan, report) < 0)
            st = CKPT_ENOMEM;
    } else {
        /* Read-only first: a root that does not exist is an error, not
         * one to create (a typo in a script), and the plan names the
         * stale temporary directories that opening it as writer removes. */
        gc_plan before = {0};
        if ((ret = cli_open_readonly(ctx, dir, &store)))
            goto done;
        st = ckpt_store_gc(store, (int)keep, 1, &report);
        if (st == CKPT_OK && plan_from_report(&before, report) < 0)
            st = CKPT_ENOMEM;
        ckpt_report_free(report);
        report = NULL;
        ckpt_store_free(store);
        store = NULL;
        if (st == CKPT_OK && (ret = cli_open_writer(ctx, dir, &store))) {
            plan_free(&before);
            goto done;
        }
        if (st == CKPT_OK)
            st = ckpt_store_gc(store, (int)keep, 0, &report);
        if (st == CKPT_OK && (plan_from_report(&plan, report) < 0 ||
                              add_removed_temps(&plan, &before, ckpt_store_path(store)) < 0))
            st = CKPT_ENOMEM;
        plan_free(&before);
    }
    if (st != CKPT_OK) {
        /* Whatever the status, a failed gc is an error, not "invalid". */
        ret = cli_fail(ctx, CLI_EXIT_ERROR, st, "gc of %s failed: %s", dir,
                       *ckpt_error_last() ? ckpt_error_last() : ckpt_strerror(st));
        goto done;
    }
    if (ctx->json) {
        json_t *removed = json_array();
        for (size_t i = 0; i < plan.n; i++)
            json_array_append_new(removed,
                                  json_pack("{s:s, s:o, s:s}", "name", plan.v[i].name, "step",
                                            cli_json_int_or_null(plan.v[i].step), "kind",
                                            plan.v[i].step < 0 ? "temp" : "step"));
        cli_json_print(json_pack("{s:s, s:I, s:b, s:o}", "root", ckpt_store_path(store),
                                 "keep_last", (json_int_t)keep, "dry_run", dry, "removed",
                                 removed));
    } else {
        for (size_t i = 0; i < plan.n; i++)
            cli_line("%s %s", dry ? "would remove" : "removed", plan.v[i].name);
        if (!plan.n)
            printf("nothing to remove\n");
    }
    if (dry)
        note_foreign_root(ctx, ckpt_store_path(store));
    ret = CLI_EXIT_OK;
done:
    plan_free(&plan);
    ckpt_report_free(report);
    ckpt_store_free(store);
    return ret;
}

/* metrics: Prometheus text format of a root's health (metrics.h). */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <unistd.h>

#include <jansson.h>

#include "error.h"
#include "util.h"

typedef struct out {
    char *buf;
    size_t len, cap;
    int failed;
    const char *label; /* escaped root="..." */
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
    for (int pass = 0; pass < 2 && !o->failed; pass++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
        } else if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        } else {
            size_t cap = (o->cap + (size_t)n) * 2;
            char *b = realloc(o->buf, cap);
            if (!b)
                o->failed = 1;
            else {
                o->buf = b;
                o->cap = cap;
            }
        }
    }
}

/* One metric: HELP, TYPE and its sample, %.17g for doubles. */
static void metric(out *o, const char *name, const char *type, const char *help, double v)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %.17g\n", name, help, name, type, name,
        o->label, v);
}

/* A label value: backslash, double quote and newline escaped.  The text
 * format is UTF-8: a root path that is not has each byte above 0x7f
 * written as the text \xNN (an escaped backslash), as the event log does. */
static char *escape_label(const char *s)
{
    size_t n = strlen(s);
    json_t *probe = json_string(s); /* NULL unless valid UTF-8 */
    int utf8 = probe != NULL;
    json_decref(probe);
    char *e = malloc(5 * n + 1), *p = e;
    if (!e)
        return NULL;
    for (; *s; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n') {
            *p++ = '\\';
            *p++ = *s == '\n' ? 'n' : *s;
        } else if (!utf8 && (unsigned char)*s >= 0x80) {
            p += sprintf(p, "\\\\x%02x", (unsigned char)*s);
        } else {
            *p++ = *s;
        }
    }
    *p = '\0';
    return e;
}

/* The counters taken from the event log. */
static void counters(out *o, const eventlog_counts *c)
{
    metric(o, "ckpt_saves_total", "counter",
           "Saves committed, over the events the log holds.", (double)c->saves);
    metric(o, "ckpt_save_failures_total", "counter",
           "Saves that failed, over the events the log holds.",
           (double)c->save_failures);
    metric(o, "ckpt_restores_total", "counter",
           "Restores that succeeded, over the events the log holds.",
           (double)c->restores);
    metric(o, "ckpt_restore_fallbacks_total", "counter",
           "Restores that skipped newer, damaged checkpoints for an older one.",
           (double)c->restore_fallbacks);
    metric(o, "ckpt_restore_skipped_steps_total", "counter",
           "Checkpoints skipped by restores, over the events the log holds.",
           (double)c->steps_skipped);
    metric(o, "ckpt_verify_failures_total", "counter",
           "Verifications that failed, over the events the log holds.",
           (double)c->verify_failures);
    metric(o, "ckpt_event_log_bad_lines", "gauge",
           "Lines of the event log that are not events (cut short by a crash).",
           (double)c->bad_lines);
}

int metrics_render(const metrics_data *d, char **text)
{
    *text = NULL;
    char *root = escape_label(d->root ? d->root : "");
    char *label = root ? malloc(strlen(root) + 16) : NULL;
    if (!label) {
        free(root);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    sprintf(label, "root=\"%s\"", root);
    free(root);
    out o = {.buf = malloc(4096), .cap = 4096, .label = label};
    if (!o.buf)
        o.failed = 1;
    else
        o.buf[0] = '\0';
    metric(&o, "ckpt_valid_checkpoint", "gauge",
           "1 when the root holds a valid checkpoint, else 0.", d->have_latest ? 1 : 0);
    if (d->have_latest) {
        metric(&o, "ckpt_latest_step", "gauge", "Step of the newest valid checkpoint.",
               (double)d->latest_step);
        metric(&o, "ckpt_latest_timestamp_seconds", "gauge",
               "Unix time at which the save of the newest valid checkpoint began.",
               d->latest_time);
        metric(&o, "ckpt_latest_age_seconds", "gauge",
               "Age of the newest valid checkpoint when measured (alert on time() - "
               "ckpt_latest_timestamp_seconds instead when read from a file).",
               d->now > d->latest_time ? d->now - d->latest_time : 0);
        metric(&o, "ckpt_last_save_stall_seconds", "gauge",
               "Time the training loop waited in the save of the newest checkpoint.",
               d->last.stall_s);
        metric(&o, "ckpt_last_save_persist_seconds", "gauge",
               "Time from the save call returning to the commit of the newest checkpoint.",
               d->last.persist_s);
        metric(&o, "ckpt_last_save_raw_bytes", "gauge",
               "Bytes handed to the save of the newest checkpoint.",
               (double)d->last.raw_bytes);
        metric(&o, "ckpt_last_save_stored_bytes", "gauge",
               "Bytes on disk of the newest checkpoint's shard files.",
               (double)d->last.stored_bytes);
    }
    metric(&o, "ckpt_steps", "gauge", "Committed steps in the root, valid or not.",
           (double)d->steps);
    metric(&o, "ckpt_event_log_readable", "gauge",
           "1 when the event log was read (or there is none yet); 0 when it could not be, "
           "and the counters are left out.", d->have_counts ? 1 : 0);
    if (d->have_counts)
        counters(&o, &d->counts);
    if (d->have_fs) {
        metric(&o, "ckpt_filesystem_free_bytes", "gauge",
               "Bytes available to the job on the root's file system.",
               (double)d->free_bytes);
        if (d->have_latest && d->last.stored_bytes > 0)
            metric(&o, "ckpt_free_saves", "gauge",
                   "Checkpoints of the newest one's size that still fit on the file system.",
                   (double)(d->free_bytes / d->last.stored_bytes));
    }
    free(label);
    if (o.failed) {
        free(o.buf);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    *text = o.buf;
    return CKPT_OK;
}

int metrics_write_file(const fsio *fs, const char *path, const char *text, int durable)
{
    size_t n = strlen(path) + 48;
    char *tmp = malloc(n);
    if (!tmp)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    /* Not ending in .prom: the textfile collector ignores it meanwhile.
     * A name nobody can guess: in a directory others may write (a shared
     * collector directory), a name of the pid alone could be taken for
     * every pid beforehand, and no metrics file would ever be written. */
    int rc = CKPT_OK, fd = -EEXIST;
    for (int attempt = 0; attempt < 16 && fd == -EEXIST; attempt++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
            r = (uint64_t)(util_now() * 1e9) * 0x9e3779b97f4a7c15ull + (uint64_t)attempt;
        snprintf(tmp, n, "%s.tmp-%ld-%016llx", path, (long)getpid(), (unsigned long long)r);
        /* Readable by the collector's user: metrics are no checkpoint data. */
        fd = fsio_open(fs, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        rc = ckpt_seterr_errno(-fd, "cannot create the metrics file %s", tmp);
        goto done;
    }
    /* 0644 whatever the umask: a job's umask 077 left it unreadable to the
     * collector, whose node_exporter then reported nothing, and alerts on
     * the checkpoint's age went silent instead of firing. */
    (void)fchmod(fd, 0644);
    int e = fsio_pwrite(fs, fd, text, strlen(text), 0);
    if (!e && durable)
        e = fsio_fsync(fs, fd);
    int c = fsio_close(fs, fd);
    if (!e)
        e = c;
    if (!e)
        e = fsio_rename(fs, tmp, path);
    if (e) {
        rc = ckpt_seterr_errno(-e, "cannot write the metrics file %s", path);
        fsio_unlink(fs, tmp);
    }
done:
    free(tmp);
    return rc;
}

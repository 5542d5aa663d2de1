/* eventlog: one JSON line per event in the checkpoint root (eventlog.h). */
#include "eventlog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "jsonscan.h"
#include "metrics.h"
#include "util.h"

/* The log's own calls go through fsio without the store's test hooks: a
 * fault injected into a save, or a trace of its calls for the power-loss
 * simulation, is about the save's files, and the log is best effort. */
static const fsio plain_fs;

struct eventlog {
    layout *lay;            /* the store's; outlives the log */
    uint64_t max_bytes;
    char *metrics_path;     /* or NULL */
    pthread_mutex_t lock;   /* one append (or rotation) at a time: the
                               persist thread and API calls both log */
    char host[256];
};

eventlog *eventlog_new(layout *lay, uint64_t max_bytes, const char *metrics_path)
{
    eventlog *el = calloc(1, sizeof *el);
    if (!el)
        return NULL;
    el->lay = lay;
    el->max_bytes = max_bytes ? max_bytes : EVENTLOG_MAX_BYTES;
    if (metrics_path && !(el->metrics_path = strdup(metrics_path))) {
        free(el);
        return NULL;
    }
    if (gethostname(el->host, sizeof el->host - 1) != 0)
        strcpy(el->host, "?");
    pthread_mutex_init(&el->lock, NULL);
    return el;
}

void eventlog_free(eventlog *el)
{
    if (!el)
        return;
    pthread_mutex_destroy(&el->lock);
    free(el->metrics_path);
    free(el);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Open the log for appending; a negative errno (FSIO_ENOTREG for a link or
 * not a regular file, EACCES for a file not trusted). */
static int open_log(eventlog *el, const char *path, uint64_t *size)
{
    const fsio *fs = &plain_fs;
    /* In a root shared with a trusted group every member's writer appends:
     * group-writable, whatever the umask (as the lock file). */
    int shared = (el->lay->dir_mode & 0020) != 0;
    int flags = O_RDWR | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    /* Made here, or there before (whose owner layout_adopt_file checks). */
    int fd = fsio_open(fs, path, flags | O_CREAT | O_EXCL, shared ? 0660 : el->lay->file_mode);
    int made = fd >= 0;
    if (fd == -EEXIST)
        fd = fsio_open(fs, path, flags, 0);
    if (fd < 0)
        return fd == -ELOOP ? -FSIO_ENOTREG : fd;
    fsio_info in;
    int rc = fsio_info_of(fs, NULL, fd, &in);
    if (!rc && in.kind != FSIO_KIND_FILE)
        rc = -FSIO_ENOTREG;
    /* Several names: a hard link to a file elsewhere, which appending
     * would write into. */
    if (!rc && in.nlink > 1)
        rc = -EACCES;
    if (!rc && trust_check_entry(&el->lay->tr, path, &in) != CKPT_OK)
        rc = -EACCES;
    if (!rc)
        rc = fsio_fstat(fs, fd, size);
    if (rc) {
        fsio_close(fs, fd);
        return rc;
    }
    /* Only once it is known to be a plain file of this root alone (a FIFO
     * or a hard link's target would have taken the mode or the owner). */
    if (layout_adopt_file(el->lay, fd, shared, made) != 0) {
        fsio_close(fs, fd); /* root's file, moved in: not ours to append to */
        return -EACCES;
    }
    return fd;
}

/* Write `line` (ending in '\n') as one write; rotate first if needed. */
static void append_line(eventlog *el, const char *line, size_t len)
{
    const fsio *fs = &plain_fs;
    char *path = layout_pinned_path(el->lay, EVENTLOG_NAME); /* a writer's own root */
    char *old = layout_pinned_path(el->lay, EVENTLOG_OLD_NAME);
    char *buf = malloc(len + 1);
    uint64_t size = 0;
    int fd = path && old && buf ? open_log(el, path, &size) : -ENOMEM;
    if (fd >= 0 && size > 0 && size + len + 1 > el->max_bytes) {
        fsio_close(fs, fd);
        fd = fsio_rename(fs, path, old);
        if (fd == 0)
            fd = open_log(el, path, &size);
    }
    if (fd < 0)
        goto done;
    /* A line cut short by a crash: end it, so ours stays whole. */
    size_t off = 0;
    char last = '\n';
    if (size > 0 && fsio_pread(fs, fd, &last, 1, size - 1) == 1 && last != '\n')
        buf[off++] = '\n';
    memcpy(buf + off, line, len);
    fsio_pwrite(fs, fd, buf, off + len, size); /* O_APPEND: lands at the end */
    fsio_close(fs, fd);
done:
    free(buf);
    free(old);
    free(path);
}

void eventlog_append(eventlog *el, json_t *ev)
{
    if (!el || !ev) {
        json_decref(ev);
        return;
    }
    ckpt_error_state e; /* logging never changes the caller's error */
    ckpt_error_capture(&e, ckpt_error_last_status());
    if (!json_object_get(ev, "time"))
        json_object_set_new(ev, "time", json_real(wall_now()));
    json_object_set_new(ev, "pid", json_integer((json_int_t)getpid()));
    json_object_set_new(ev, "host", json_string(el->host));
    /* JSON_COMPACT never emits a newline inside the value. */
    char *text = json_dumps(ev, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(17));
    json_decref(ev);
    if (text) {
        size_t n = strlen(text);
        char *line = realloc(text, n + 2);
        if (line) {
            line[n] = '\n';
            line[n + 1] = '\0';
            pthread_mutex_lock(&el->lock);
            append_line(el, line, n + 1);
            pthread_mutex_unlock(&el->lock);
            text = line;
        }
        free(text);
    }
    ckpt_error_restore(&e);
}

static json_t *event(const char *name)
{
    /* Schema version, time and name first: easy to read in a terminal. */
    return json_pack("{si sf ss}", "v", EVENTLOG_SCHEMA, "time", wall_now(), "event", name);
}

/* {"status": name, "error": message} of a failure. */
/* `s` as a JSON string: as it is when it is UTF-8, else with every byte
 * at or above 0x80 written as the text \xNN.  A message naming a path
 * that is not UTF-8 (json_string refuses it: NULL) would otherwise leave
 * the event without its error, or a skipped step out of a restore. */
static json_t *text(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j || !s)
        return j;
    size_t n = strlen(s);
    char *buf = malloc(4 * n + 1), *o = buf;
    if (!buf)
        return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        o += *p < 0x80 ? sprintf(o, "%c", *p) : sprintf(o, "\\x%02x", *p);
    j = json_string(buf);
    free(buf);
    return j;
}

static void add_error(json_t *ev, int rc)
{
    const char *name = ckpt_status_name(rc);
    json_object_set_new(ev, "status", json_string(name ? name : "unknown"));
    json_object_set_new(ev, "error", text(ckpt_error_last()));
}

/* [{"step", "status", "message", "file"}] of a report's problems. */
static json_t *problems(const ckpt_report *r)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < ckpt_report_count(r); i++) {
        const ckpt_problem *p = ckpt_report_get(r, i);
        const char *name = ckpt_status_name(p->status);
        json_array_append_new(a, json_pack("{sI ss so? so?}", "step", (json_int_t)p->step,
                                           "status", name ? name : "unknown", "message",
                                           text(p->message), "file", text(p->file)));
    }
    return a;
}

void eventlog_save_begun(eventlog *el, int64_t step)
{
    if (!el)
        return;
    json_t *ev = event("save_begun");
    json_object_set_new(ev, "step", json_integer((json_int_t)step));
    eventlog_append(el, ev);
}

void eventlog_save_end(eventlog *el, int64_t step, int rc, const ckpt_save_stats *stats,
                       double time, double persist_s)
{
    if (!el)
        return;
    ckpt_save_stats copy = {0};
    if (stats)
        copy = *stats;
    copy.persist_s = persist_s;
    const ckpt_save_stats *st = &copy;
    json_t *ev = event(rc ? "save_failed" : "save_committed");
    json_object_set_new(ev, "step", json_integer((json_int_t)step));
    if (rc) {
        add_error(ev, rc);
    } else {
        json_object_set_new(ev, "raw_bytes", json_integer((json_int_t)st->raw_bytes));
        json_object_set_new(ev, "stored_bytes", json_integer((json_int_t)st->stored_bytes));
        json_object_set_new(ev, "chunks", json_integer((json_int_t)st->chunks));
        json_object_set_new(ev, "stall_s", json_real(st->stall_s));
        json_object_set_new(ev, "persist_s", json_real(st->persist_s));
    }
    eventlog_append(el, ev);
    if (rc || !el->metrics_path)
        return;
    /* The step just committed passed verify_after_save: it is the newest. */
    ckpt_error_state e;
    ckpt_error_capture(&e, ckpt_error_last_status());
    metrics_data d = {.root = el->lay->root, .have_latest = 1, .latest_step = step,
                      .latest_time = time, .last = *st, .now = wall_now()};
    int64_t *steps = NULL;
    if (layout_scan(el->lay, &steps, &d.steps) != CKPT_OK)
        d.steps = 0;
    free(steps);
    json_t *all = NULL;
    d.have_counts = eventlog_read(el->lay, 0, &all, &d.counts) == CKPT_OK;
    json_decref(all);
    d.have_fs = fsio_free_bytes(&plain_fs, el->lay->root, &d.free_bytes) == 0;
    char *text = NULL;
    int mrc = metrics_render(&d, &text);
    if (!mrc)
        mrc = metrics_write_file(&plain_fs, el->metrics_path, text, el->lay->fsync);
    free(text);
    if (mrc) { /* not the save's failure: said in the log instead */
        json_t *fail = event("metrics_failed");
        json_object_set_new(fail, "step", json_integer((json_int_t)step));
        add_error(fail, mrc);
        eventlog_append(el, fail);
    }
    ckpt_error_restore(&e);
}

void eventlog_restore(eventlog *el, int rc, const ckpt_report *r)
{
    if (!el)
        return;
    json_t *ev = event(rc ? "restore_failed" : "restored");
    if (!rc)
        json_object_set_new(ev, "step", json_integer((json_int_t)ckpt_report_step(r)));
    else
        add_error(ev, rc);
    json_object_set_new(ev, "skipped", problems(r));
    eventlog_append(el, ev);
}

void eventlog_verify(eventlog *el, int64_t step, ckpt_verify_level level, int rc,
                     const ckpt_report *r)
{
    if (!el)
        return;
    json_t *ev = event(rc ? "verify_failed" : "verified");
    int64_t checked = ckpt_report_step(r);
    json_object_set_new(ev, "step", json_integer((json_int_t)(checked >= 0 ? checked : step)));
    json_object_set_new(ev, "level", json_string(level == CKPT_VERIFY_FULL ? "full" : "quick"));
    if (rc)
        add_error(ev, rc);
    json_object_set_new(ev, "problems", problems(r));
    eventlog_append(el, ev);
}

void eventlog_gc(eventlog *el, int keep_last, int dry_run, int rc, const ckpt_report *r)
{
    if (!el || dry_run)
        return; /* a dry run changes nothing: nothing to record */
    json_t *ev = event(rc ? "gc_failed" : "gc");
    json_object_set_new(ev, "keep_last", json_integer(keep_last));
    json_t *removed = json_array();
    for (size_t i = 0; removed && i < ckpt_report_count(r); i++)
        json_array_append_new(removed, text(ckpt_report_get(r, i)->file));
    json_object_set_new(ev, "removed", removed);
    if (rc)
        add_error(ev, rc);
    eventlog_append(el, ev);
}

void eventlog_retire_failed(eventlog *el, int64_t step, int rc)
{
    if (!el || !rc)
        return;
    json_t *ev = event("retire_failed");
    json_object_set_new(ev, "step", json_integer(step));
    add_error(ev, rc);
    eventlog_append(el, ev);
}

void eventlog_cleaned(eventlog *el, const ckpt_report *r)
{
    if (!el || !r || !ckpt_report_count(r))
        return;
    json_t *ev = event("stale_removed");
    json_t *removed = json_array();
    for (size_t i = 0; removed && i < ckpt_report_count(r); i++)
        json_array_append_new(removed, text(ckpt_report_get(r, i)->file));
    json_object_set_new(ev, "removed", removed);
    eventlog_append(el, ev);
}

/* ---------------------------------------------------------------- reading */

static void count(eventlog_counts *c, json_t *ev)
{
    const char *name = json_string_value(json_object_get(ev, "event"));
    size_t skipped = json_array_size(json_object_get(ev, "skipped"));
    if (!strcmp(name, "save_committed"))
        c->saves++;
    else if (!strcmp(name, "save_failed"))
        c->save_failures++;
    else if (!strcmp(name, "restored")) {
        c->restores++;
        c->restore_fallbacks += skipped > 0;
    } else if (!strcmp(name, "verify_failed"))
        c->verify_failures++;
    else if (!strcmp(name, "gc"))
        c->gc_removed += json_array_size(json_object_get(ev, "removed"));
    c->steps_skipped += skipped;
}

/* Add the events of one file to `out`.  A missing file is no event. */
static int read_one(layout *lay, const char *name, double since, json_t *out,
                    eventlog_counts *c, size_t *values)
{
    char *path = util_join(lay->root, name), *text = NULL;
    char *io = layout_pinned_path(lay, name); /* a writer's: in the root it pinned */
    size_t len = 0;
    if (!path || !io) {
        free(path);
        free(io);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    /* A file grows while we read it only by whole lines at its end.  A
     * writer rotates at EVENTLOG_MAX_BYTES (a line more at most); anything
     * far larger is no log of libckpt's, and reading it whole, every event
     * a JSON tree, would take some 80 times its size in memory. */
    int e = fsio_read_file(&plain_fs, io, EVENTLOG_READ_MAX, &text, &len);
    int rc = CKPT_OK;
    if (e == -ENOENT)
        goto done;
    if (e == -EFBIG) {
        rc = ckpt_seterr(CKPT_EIO, "%s is larger than %u MiB, far over what a writer "
                         "leaves (it rotates at %u MiB): not read as an event log", path,
                         (unsigned)(EVENTLOG_READ_MAX >> 20),
                         (unsigned)(EVENTLOG_MAX_BYTES >> 20));
        goto done;
    }
    if (e == -FSIO_ENOTREG) {
        rc = ckpt_seterr(CKPT_EACCES, "%s is not a regular file (a link, FIFO or "
                         "directory): not read as an event log", path);
        goto done;
    }
    if (e) {
        rc = ckpt_seterr_errno(-e, "cannot read %s", path);
        goto done;
    }
    if ((rc = trust_check_path(&lay->tr, &plain_fs, io))) {
        rc = layout_shown_error(lay, rc);
        goto done;
    }
    /* Counted before any tree is built, line by line (a line's unclosed
     * string must not hide the lines after it from the count). */
    for (char *q = text, *qend = text + len; q < qend;) {
        char *qnl = memchr(q, '\n', (size_t)(qend - q));
        size_t qn = qnl ? (size_t)(qnl - q) : (size_t)(qend - q), containers;
        *values += jsonscan_tally(q, qn, &containers);
        q += qn + 1;
    }
    if (*values > EVENTLOG_READ_MAX_VALUES) {
        rc = ckpt_seterr(CKPT_EIO, "%s (with the older file) holds more than %u JSON values, "
                         "far over what a writer leaves: not read as an event log", path,
                         EVENTLOG_READ_MAX_VALUES);
        goto done;
    }
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) { /* a line cut short: not (yet) an event */
            c->bad_lines++;
            break;
        }
        size_t n = (size_t)(nl - p);
        json_t *ev = n ? json_loadb(p, n, JSON_REJECT_DUPLICATES, NULL) : NULL;
        p = nl + 1;
        if (!n)
            continue; /* an empty line is nothing */
        if (!json_is_object(ev) || !json_is_string(json_object_get(ev, "event")) ||
            !json_is_number(json_object_get(ev, "time"))) {
            c->bad_lines++;
            json_decref(ev);
            continue;
        }
        count(c, ev);
        if (json_number_value(json_object_get(ev, "time")) >= since)
            json_array_append(out, ev);
        json_decref(ev);
    }
done:
    free(text);
    free(path);
    free(io);
    return rc;
}

int eventlog_read(layout *lay, double since, json_t **events, eventlog_counts *counts)
{
    eventlog_counts c;
    memset(&c, 0, sizeof c);
    *events = NULL;
    json_t *out = json_array();
    if (!out)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    size_t values = 0;
    int rc = read_one(lay, EVENTLOG_OLD_NAME, since, out, &c, &values);
    if (!rc)
        rc = read_one(lay, EVENTLOG_NAME, since, out, &c, &values);
    if (rc) {
        json_decref(out);
        return rc;
    }
    if (counts)
        *counts = c;
    *events = out;
    return CKPT_OK;
}

/* eventlog: what happened to a checkpoint root, one JSON object per line in
 * ROOT/ckpt-events.jsonl (docs/OPERATIONS.md gives the schema).
 *
 * Written by a store opened for writing only (a read-only store never
 * writes to the root), under the writer lock, so one process appends at a
 * time.  Each event is one write() of one whole line to a file opened
 * O_APPEND; when the file does not end in a newline (a crash cut the last
 * line short) the new line starts with one, so a torn fragment stays a line
 * of its own that readers skip.  When a line would take the file past
 * max_bytes it is renamed to ckpt-events.jsonl.1 (replacing the older one)
 * and a new file begun: the log holds at most about 2 x max_bytes.
 *
 * Logging is best effort: a failure to log never fails the call that is
 * logged, and never changes the calling thread's last error.  The log is
 * not fsynced: a power loss may lose the newest lines, never a committed
 * step.  Files are created with the store's file mode (0640; 0660 in a
 * root shared with a trusted group, whose members append in turn) and checked
 * like a step's files (trust.h): a symbolic link, FIFO or a file another
 * user owns or may write is not written to. */
#ifndef CKPT_EVENTLOG_H
#define CKPT_EVENTLOG_H

#include <jansson.h>
#include <stdint.h>

#include "ckpt.h"
#include "layout.h"

#define EVENTLOG_NAME "ckpt-events.jsonl"
#define EVENTLOG_OLD_NAME "ckpt-events.jsonl.1"
#define EVENTLOG_MAX_BYTES (1u << 20) /* per file */
/* Largest file read back as a log: a writer's, however it was rotated,
 * stays far below (a bigger one is refused, bounding a reader's memory). */
#define EVENTLOG_READ_MAX (8ull * EVENTLOG_MAX_BYTES)
/* Most JSON values read back from both files together: a writer's two
 * files hold some 150,000 (a few dozen per event); bytes alone do not
 * bound the trees, a line of "[{},{},...]" costs some 90 times its text. */
#define EVENTLOG_READ_MAX_VALUES (1u << 19)
#define EVENTLOG_SCHEMA 1             /* the "v" member of every line */

typedef struct eventlog eventlog;

/* A log for the root of `lay` (borrowed: must outlive the log), rotated at
 * `max_bytes` (0: EVENTLOG_MAX_BYTES).  `metrics_path` (may be NULL; copied):
 * after each commit the metrics (metrics.h) are written there atomically.
 * NULL when out of memory (then nothing is logged). */
eventlog *eventlog_new(layout *lay, uint64_t max_bytes, const char *metrics_path);
void eventlog_free(eventlog *el);

/* Append `ev` (an object; this takes the reference) with "pid", "host" and,
 * unless present, "time" added.  NULL `el` or `ev`: nothing. */
void eventlog_append(eventlog *el, json_t *ev);

/* The hooks: one call at each place an event happens.  NULL `el`: nothing.
 * `rc` is the call's status; on failure this thread's last error is its
 * message. */
void eventlog_save_begun(eventlog *el, int64_t step);
/* After the commit (then writes the metrics file when one is set) or the
 * failure of the save of `step`: `stats` (may be NULL on failure) with
 * persist_s replaced by `persist_s` (the handle sets its own later); `time`
 * is the save's begin time (Unix seconds). */
void eventlog_save_end(eventlog *el, int64_t step, int rc, const ckpt_save_stats *stats,
                       double time, double persist_s);
void eventlog_restore(eventlog *el, int rc, const ckpt_report *report);
void eventlog_verify(eventlog *el, int64_t step, ckpt_verify_level level, int rc,
                     const ckpt_report *report);
void eventlog_gc(eventlog *el, int keep_last, int dry_run, int rc, const ckpt_report *report);
/* Retiring old steps (keep_last) after the commit of `step` failed with
 * `rc`: the save stands, but old steps stay and fill the disk. */
void eventlog_retire_failed(eventlog *el, int64_t step, int rc);
/* Opening the root as its writer removed the stale temporary directories
 * listed in `report` (NULL or empty: nothing is logged). */
void eventlog_cleaned(eventlog *el, const ckpt_report *report);

/* Counts over the events the log holds (both files). */
typedef struct eventlog_counts {
    uint64_t saves, save_failures;     /* save_committed, save_failed */
    uint64_t restores, restore_fallbacks; /* restored; of them with steps skipped */
    uint64_t steps_skipped;            /* steps skipped by restores */
    uint64_t verify_failures, gc_removed;
    uint64_t bad_lines;                /* lines that are not events (torn) */
} eventlog_counts;

/* Read the events of the root `root` whose time is >= `since`, oldest
 * first, into a new JSON array (*events, caller json_decref's), counting
 * what it finds in *counts (may be NULL; over all events, not only those
 * since `since`).  Lines that are not complete JSON objects with an
 * "event" string and a numeric "time" are skipped (counted in bad_lines),
 * as is a last line without its newline.  No log yet: an empty array.
 * Returns CKPT_OK; CKPT_EACCES (a file not trusted, or a link or FIFO in
 * its place); CKPT_EIO (also for files larger, or holding more JSON values,
 * than a writer's: not read as a log), CKPT_ENOMEM. */
int eventlog_read(layout *lay, double since, json_t **events, eventlog_counts *counts);

#endif

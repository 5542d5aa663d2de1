/* metrics: the health of a checkpoint root in the Prometheus text
 * exposition format (version 0.0.4), the format node_exporter's textfile
 * collector reads.  docs/OPERATIONS.md lists the metrics. */
#ifndef CKPT_METRICS_H
#define CKPT_METRICS_H

#include <stdint.h>

#include "ckpt.h"
#include "eventlog.h"
#include "fsio.h"

typedef struct metrics_data {
    const char *root;        /* label value of every metric */
    int have_latest;         /* 0: no valid step; the latest_* are left out */
    int64_t latest_step;     /* newest valid step */
    double latest_time;      /* its save's begin time, Unix seconds */
    ckpt_save_stats last;    /* the newest step's save statistics */
    uint64_t steps;          /* committed steps in the root */
    int have_counts;         /* 0: the event log could not be read (a link or
                                FIFO planted in its place, say): the counters
                                are left out, the rest still reported */
    eventlog_counts counts;  /* from the event log */
    int have_fs;             /* 0: free space unknown; left out */
    uint64_t free_bytes;     /* available to the caller on the root's fs */
    double now;              /* when measured, Unix seconds */
} metrics_data;

/* The exposition text, malloc'd and NUL-terminated. */
int metrics_render(const metrics_data *d, char **text);
/* Write `text` to `path` atomically: a temporary file in the same
 * directory (created exclusively, never through a link), fsynced when
 * `durable`, renamed over `path`.  A reader (node_exporter) sees the old or
 * the new file, never a part.  CKPT_OK, or a status with a message naming
 * the path. */
int metrics_write_file(const fsio *fs, const char *path, const char *text, int durable);

#endif

/* report: the list of problems handed to callers of restore and verify. */
#ifndef CKPT_REPORT_H
#define CKPT_REPORT_H

#include <pthread.h>

#include "ckpt.h"

struct ckpt_report {
    int64_t step;
    ckpt_problem *items;
    size_t count, cap;
    pthread_mutex_t lock; /* jobs add problems from worker threads */
};

ckpt_report *report_new(void);
/* Copies the strings.  Thread-safe.  Out of memory drops the problem
 * (the status returned to the caller still says what happened) and
 * returns CKPT_ENOMEM, without setting the thread's error; else CKPT_OK
 * (also for a NULL report).  A report whose entries are the result (a
 * gc's) must fail then: a short list would pass for the whole. */
int report_add(ckpt_report *r, int64_t step, int status, const char *message,
                const char *file, const char *tensor, int64_t offset);

#endif

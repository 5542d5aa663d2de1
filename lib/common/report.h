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
 * (the status returned to the caller still says what happened). */
void report_add(ckpt_report *r, int64_t step, int status, const char *message,
                const char *file, const char *tensor, int64_t offset);

#endif

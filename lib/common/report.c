#include "report.h"

#include <stdlib.h>

#include "util.h"

ckpt_report *report_new(void)
{
    ckpt_report *r = calloc(1, sizeof *r);
    if (r) {
        r->step = -1;
        pthread_mutex_init(&r->lock, NULL);
    }
    return r;
}

int report_add(ckpt_report *r, int64_t step, int status, const char *message,
                const char *file, const char *tensor, int64_t offset)
{
    if (!r)
        return CKPT_OK;
    int rc = CKPT_ENOMEM;
    pthread_mutex_lock(&r->lock);
    if (r->count == r->cap) {
        size_t ncap = r->cap ? 2 * r->cap : 8;
        ckpt_problem *n = realloc(r->items, ncap * sizeof *n);
        if (!n)
            goto out;
        r->items = n;
        r->cap = ncap;
    }
    ckpt_problem *p = &r->items[r->count];
    p->step = step;
    p->status = status;
    p->offset = offset;
    p->message = util_strdup(message ? message : "");
    p->file = util_strdup(file ? file : "");
    p->tensor = util_strdup(tensor ? tensor : "");
    if (!p->message || !p->file || !p->tensor) {
        free((char *)p->message);
        free((char *)p->file);
        free((char *)p->tensor);
        goto out;
    }
    r->count++;
    rc = CKPT_OK;
out:
    pthread_mutex_unlock(&r->lock);
    return rc;
}

CKPT_API int64_t ckpt_report_step(const ckpt_report *r)
{
    return r ? r->step : -1;
}

CKPT_API size_t ckpt_report_count(const ckpt_report *r)
{
    return r ? r->count : 0;
}

CKPT_API const ckpt_problem *ckpt_report_get(const ckpt_report *r, size_t i)
{
    return r && i < r->count ? &r->items[i] : NULL;
}

CKPT_API void ckpt_report_free(ckpt_report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->count; i++) {
        free((char *)r->items[i].message);
        free((char *)r->items[i].file);
        free((char *)r->items[i].tensor);
    }
    free(r->items);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* observe: the public faces of the event log and the metrics of a root
 * (ckpt_store_events, ckpt_store_metrics); the work is lib/obs/. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "env.h"
#include "error.h"
#include "eventlog.h"
#include "metrics.h"
#include "reader.h"
#include "save.h"

CKPT_API int ckpt_store_events(ckpt_store *s, double since, char **text)
{
    if (!s || !text)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_events: NULL argument");
    if (context_usable(s, "ckpt_store_events"))
        return CKPT_EINVAL;
    *text = NULL;
    json_t *events;
    pthread_mutex_lock(&s->api_lock); /* the layout is shared with saves */
    int rc = eventlog_read(&s->lay, since, &events, NULL);
    pthread_mutex_unlock(&s->api_lock);
    if (rc)
        return rc;
    size_t cap = 1, len = 0, i;
    char *out = malloc(cap);
    json_t *ev;
    json_array_foreach(events, i, ev) {
        char *line = out ? json_dumps(ev, JSON_COMPACT | JSON_ENSURE_ASCII |
                                              JSON_REAL_PRECISION(17))
                         : NULL;
        size_t n = line ? strlen(line) : 0;
        char *grown = line ? realloc(out, cap + n + 1) : NULL;
        if (!grown) {
            free(line);
            free(out);
            out = NULL;
            break;
        }
        out = grown;
        cap += n + 1;
        memcpy(out + len, line, n);
        out[len + n] = '\n';
        len += n + 1;
        free(line);
    }
    json_decref(events);
    if (!out)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    out[len] = '\0';
    *text = out;
    return CKPT_OK;
}

/* The manifest's persist_s stops before the manifest is written (it cannot
 * hold its own fsync, the check after saving and the commit); the event
 * log's save_committed record holds the whole of it, as the metrics file
 * written at the end of each save does.  Take the newest record of `step`
 * when the log has one, so that both sources give one figure. */
static void logged_persist(json_t *events, int64_t step, double *persist_s)
{
    for (size_t i = json_array_size(events); i-- > 0;) {
        json_t *ev = json_array_get(events, i);
        json_t *n = json_object_get(ev, "step"), *p = json_object_get(ev, "persist_s");
        if (json_is_string(json_object_get(ev, "event")) &&
            strcmp(json_string_value(json_object_get(ev, "event")), "save_committed") == 0 &&
            json_is_integer(n) && json_integer_value(n) == step && json_is_number(p) &&
            json_number_value(p) >= 0) {
            *persist_s = json_number_value(p);
            return;
        }
    }
}

CKPT_API int ckpt_store_metrics(ckpt_store *s, char **text)
{
    if (!s || !text)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_metrics: NULL argument");
    if (context_usable(s, "ckpt_store_metrics"))
        return CKPT_EINVAL;
    *text = NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    metrics_data d;
    memset(&d, 0, sizeof d);
    d.root = s->lay.root;
    d.now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    ckpt_checkpoint *ck;
    int rc = reader_open_newest(s, CKPT_VERIFY_QUICK, &ck);
    if (rc == CKPT_OK) {
        d.have_latest = 1;
        d.latest_step = ck->m.step;
        d.latest_time = ck->m.time;
        d.last = ck->m.stats;
        reader_close(ck);
    } else if (rc == CKPT_ENOCKPT) {
        rc = CKPT_OK;
    }
    int64_t *steps = NULL;
    if (!rc)
        rc = layout_scan(&s->lay, &steps, &d.steps);
    free(steps);
    json_t *events = NULL;
    if (!rc) {
        /* A log that cannot be read (a link or FIFO another user planted in
         * its place, a damaged disk) costs its counters, not the root's
         * health: the rest is still reported, and ckpt_event_log_readable
         * says so. */
        int lrc = eventlog_read(&s->lay, 0, &events, &d.counts);
        d.have_counts = lrc == CKPT_OK;
        if (lrc == CKPT_ENOMEM)
            rc = lrc;
    }
    if (!rc && d.have_latest)
        logged_persist(events, d.latest_step, &d.last.persist_s);
    json_decref(events);
    pthread_mutex_unlock(&s->api_lock);
    d.have_fs = fsio_free_bytes(&s->lay.fs, s->lay.root, &d.free_bytes) == 0;
    return rc ? rc : metrics_render(&d, text);
}

CKPT_API int ckpt_store_environment(ckpt_store *s, char **json)
{
    if (!s || !json)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_store_environment: NULL argument");
    if (context_usable(s, "ckpt_store_environment"))
        return CKPT_EINVAL;
    *json = NULL;
    pthread_mutex_lock(&s->api_lock); /* the device is the store's */
    json_t *env = env_record(s->dev, 0);
    pthread_mutex_unlock(&s->api_lock);
    char *text = env ? json_dumps(env, JSON_COMPACT) : NULL;
    json_decref(env);
    if (!text)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    *json = text; /* jansson allocates with malloc: ckpt_free releases it */
    return CKPT_OK;
}

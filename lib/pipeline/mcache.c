/* mcache: decoded manifests keyed by their bytes (mcache.h). */
#include "mcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "util.h"

typedef struct mcache_entry {
    char *text; /* NULL: free slot */
    size_t len;
    manifest m;       /* env and metadata NULL: */
    char *meta_text;  /* their texts */
    char *env_text;
    unsigned long long used; /* the clock at the last put or hit */
} mcache_entry;

struct mcache {
    pthread_mutex_t lock; /* protects everything below */
    mcache_entry *e;
    size_t n;     /* slots */
    size_t bytes; /* text bytes held */
    unsigned long long clock;
};

int mcache_create(mcache **out, size_t entries)
{
    mcache *c = calloc(1, sizeof *c);
    if (c)
        c->e = calloc(entries ? entries : 1, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    }
    c->n = entries ? entries : 1;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return CKPT_OK;
}

static void entry_clear(mcache_entry *e)
{
    free(e->text);
    free(e->meta_text);
    free(e->env_text);
    manifest_clear(&e->m);
    memset(e, 0, sizeof *e);
}

void mcache_free(mcache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        entry_clear(&c->e[i]);
    free(c->e);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static mcache_entry *find(mcache *c, const char *text, size_t len)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].text && c->e[i].len == len && memcmp(c->e[i].text, text, len) == 0)
            return &c->e[i];
    return NULL;
}

int mcache_get(mcache *c, const char *text, size_t len, manifest *m, char **meta_text,
               char **env_text)
{
    memset(m, 0, sizeof *m);
    *meta_text = *env_text = NULL;
    if (!c || len > MCACHE_MAX_BYTES)
        return 0;
    pthread_mutex_lock(&c->lock);
    mcache_entry *e = find(c, text, len);
    int hit = 0;
    if (e) {
        ckpt_error_state keep; /* a failed copy is a miss, not an error */
        ckpt_error_capture(&keep, CKPT_OK);
        hit = manifest_copy_bare(m, &e->m) == CKPT_OK &&
              (*meta_text = util_strdup(e->meta_text)) &&
              (*env_text = util_strdup(e->env_text));
        ckpt_error_restore(&keep);
        if (hit) {
            e->used = ++c->clock;
        } else {
            manifest_clear(m);
            free(*meta_text);
            *meta_text = NULL;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

/* The entry to give up: the lowest step, the least recently used of its
 * manifests (two texts of one step: a re-save). */
static mcache_entry *victim(mcache *c)
{
    mcache_entry *v = NULL;
    for (size_t i = 0; i < c->n; i++) {
        mcache_entry *e = &c->e[i];
        if (e->text && (!v || e->m.step < v->m.step ||
                        (e->m.step == v->m.step && e->used < v->used)))
            v = e;
    }
    return v;
}

/* Keep `fresh` (its text, len and decoding set), or free it when the cache
 * holds those bytes already. */
static void insert(mcache *c, mcache_entry *fresh)
{
    pthread_mutex_lock(&c->lock);
    mcache_entry *slot = find(c, fresh->text, fresh->len);
    if (slot) { /* already there (another thread, or a step opened twice) */
        slot->used = ++c->clock;
        entry_clear(fresh);
    } else {
        /* Make room: a free slot, and the bytes (len fits the budget). */
        for (;;) {
            slot = NULL;
            for (size_t i = 0; i < c->n && !slot; i++)
                if (!c->e[i].text)
                    slot = &c->e[i];
            if (slot && c->bytes + fresh->len <= MCACHE_MAX_BYTES)
                break;
            mcache_entry *v = victim(c); /* not NULL: something is held */
            c->bytes -= v->len;
            entry_clear(v);
        }
        fresh->used = ++c->clock;
        *slot = *fresh;
        c->bytes += fresh->len;
    }
    pthread_mutex_unlock(&c->lock);
}

void mcache_put(mcache *c, const char *text, size_t len, const manifest *m,
                const char *meta_text, const char *env_text)
{
    if (!c || len > MCACHE_MAX_BYTES)
        return;
    ckpt_error_state keep; /* best effort: the caller's error stays */
    ckpt_error_capture(&keep, CKPT_OK);
    mcache_entry fresh = {0};
    fresh.meta_text = meta_text ? util_strdup(meta_text) : manifest_json_text(m->metadata);
    fresh.env_text = env_text ? util_strdup(env_text) : manifest_json_text(m->env);
    if (!fresh.meta_text || !fresh.env_text || !(fresh.text = malloc(len ? len : 1)) ||
        manifest_copy_bare(&fresh.m, m)) {
        free(fresh.text);
        free(fresh.meta_text);
        free(fresh.env_text);
        ckpt_error_restore(&keep);
        return;
    }
    memcpy(fresh.text, text, len);
    fresh.len = len;
    insert(c, &fresh);
    ckpt_error_restore(&keep);
}

void mcache_put_owned(mcache *c, char *text, size_t len, manifest *m, char *meta_text,
                      char *env_text)
{
    mcache_entry fresh = {text, len, *m, meta_text, env_text, 0};
    memset(m, 0, sizeof *m);
    json_decref(fresh.m.env); /* entries keep the texts only */
    json_decref(fresh.m.metadata);
    fresh.m.env = fresh.m.metadata = NULL;
    if (!c || !text || !meta_text || !env_text || len > MCACHE_MAX_BYTES) {
        entry_clear(&fresh);
        return;
    }
    insert(c, &fresh);
}

/* mcache: decoded manifests keyed by their bytes, shared by reference
 * (mcache.h). */
#include "mcache.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "util.h"

/* ---------------------------------------------------------------- mdecoded */

int mdecoded_make(mdecoded **out, manifest *m, char *meta_text, char *env_text)
{
    *out = NULL;
    mdecoded *d = calloc(1, sizeof *d);
    if (d && !meta_text)
        meta_text = m->metadata ? m->metadata : util_strdup("null");
    else
        free(m->metadata);
    m->metadata = NULL;
    if (d && !env_text)
        env_text = manifest_json_text(m->env);
    json_decref(m->env);
    m->env = NULL;
    if (!d || !meta_text || !env_text) {
        free(d);
        free(meta_text);
        free(env_text);
        manifest_clear(m);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory keeping a decoded manifest");
    }
    d->m = *m;
    memset(m, 0, sizeof *m);
    d->meta_text = meta_text;
    d->env_text = env_text;
    atomic_init(&d->refs, 1);
    pthread_mutex_init(&d->lock, NULL);
    *out = d;
    return CKPT_OK;
}

mdecoded *mdecoded_ref(mdecoded *d)
{
    atomic_fetch_add_explicit(&d->refs, 1, memory_order_relaxed);
    return d;
}

void mdecoded_release(mdecoded *d)
{
    /* acq_rel: every holder's reads happen before the free */
    if (!d || atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1)
        return;
    manifest_clear(&d->m);
    free(d->meta_text);
    free(d->env_text);
    free(d->by_name);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const manifest_tensor *const *)a)->name,
                  (*(const manifest_tensor *const *)b)->name);
}

long mdecoded_find(mdecoded *d, const char *name)
{
    size_t nt = d->m.ntensors;
    pthread_mutex_lock(&d->lock);
    if (!d->by_name && (d->by_name = malloc((nt ? nt : 1) * sizeof *d->by_name))) {
        for (size_t i = 0; i < nt; i++)
            d->by_name[i] = &d->m.tensors[i];
        qsort(d->by_name, nt, sizeof *d->by_name, cmp_tensor_name); /* unique names */
    }
    const manifest_tensor **by_name = d->by_name; /* set once, never changed */
    pthread_mutex_unlock(&d->lock);
    if (!by_name) { /* no memory for it: slowly */
        for (size_t i = 0; i < nt; i++)
            if (strcmp(d->m.tensors[i].name, name) == 0)
                return (long)i;
        return -1;
    }
    size_t lo = 0, hi = nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(by_name[mid]->name, name);
        if (c == 0)
            return (long)(by_name[mid] - d->m.tensors);
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* ------------------------------------------------------------------ mcache */

typedef struct mcache_entry {
    char *text; /* NULL: free slot */
    size_t len;
    mdecoded *d;             /* the cache's reference */
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
    mdecoded_release(e->d);
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

mdecoded *mcache_get(mcache *c, const char *text, size_t len)
{
    if (!c || len > MCACHE_MAX_BYTES)
        return NULL;
    pthread_mutex_lock(&c->lock);
    mcache_entry *e = find(c, text, len);
    mdecoded *d = NULL;
    if (e) {
        d = mdecoded_ref(e->d);
        e->used = ++c->clock;
    }
    pthread_mutex_unlock(&c->lock);
    return d;
}

/* The entry to give up: the lowest step, the least recently used of its
 * manifests (two texts of one step: a re-save). */
static mcache_entry *victim(mcache *c)
{
    mcache_entry *v = NULL;
    for (size_t i = 0; i < c->n; i++) {
        mcache_entry *e = &c->e[i];
        if (e->text && (!v || e->d->m.step < v->d->m.step ||
                        (e->d->m.step == v->d->m.step && e->used < v->used)))
            v = e;
    }
    return v;
}

void mcache_put_owned(mcache *c, char *text, size_t len, mdecoded *d)
{
    if (!c || !text || !d || len > MCACHE_MAX_BYTES) {
        free(text);
        return;
    }
    /* Entries released here are freed after the lock (a decoding of 10,000
     * tensors takes a while to free). */
    mcache_entry gone[2] = {{0}};
    size_t ngone = 0;
    pthread_mutex_lock(&c->lock);
    mcache_entry *slot = find(c, text, len);
    if (slot) { /* already there (another thread, or a step opened twice) */
        slot->used = ++c->clock;
        free(text);
    } else {
        /* Make room: a free slot, and the bytes (len fits the budget). */
        for (;;) {
            slot = NULL;
            for (size_t i = 0; i < c->n && !slot; i++)
                if (!c->e[i].text)
                    slot = &c->e[i];
            if (slot && c->bytes + len <= MCACHE_MAX_BYTES)
                break;
            mcache_entry *v = victim(c); /* not NULL: something is held */
            c->bytes -= v->len;
            if (ngone < 2)
                gone[ngone++] = *v;
            else
                entry_clear(v);
            memset(v, 0, sizeof *v);
        }
        *slot = (mcache_entry){text, len, mdecoded_ref(d), ++c->clock};
        c->bytes += len;
    }
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < ngone; i++)
        entry_clear(&gone[i]);
}

void mcache_put(mcache *c, const char *text, size_t len, mdecoded *d)
{
    if (!c || len > MCACHE_MAX_BYTES)
        return;
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return; /* best effort */
    memcpy(copy, text, len);
    mcache_put_owned(c, copy, len, d);
}

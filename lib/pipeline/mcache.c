/* mcache: decoded manifests keyed by their bytes (mcache.h). */
#include "mcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef struct mcache_entry {
    char *text; /* NULL: free slot */
    size_t len;
    manifest m;
    unsigned long long used; /* the clock at the last put or hit */
} mcache_entry;

struct mcache {
    pthread_mutex_t lock; /* protects everything below */
    mcache_entry e[MCACHE_ENTRIES];
    unsigned long long clock;
};

int mcache_create(mcache **out)
{
    mcache *c = calloc(1, sizeof *c);
    if (!c)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return CKPT_OK;
}

static void entry_clear(mcache_entry *e)
{
    free(e->text);
    manifest_clear(&e->m);
    memset(e, 0, sizeof *e);
}

void mcache_free(mcache *c)
{
    if (!c)
        return;
    for (int i = 0; i < MCACHE_ENTRIES; i++)
        entry_clear(&c->e[i]);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static mcache_entry *find(mcache *c, const char *text, size_t len)
{
    for (int i = 0; i < MCACHE_ENTRIES; i++)
        if (c->e[i].text && c->e[i].len == len && memcmp(c->e[i].text, text, len) == 0)
            return &c->e[i];
    return NULL;
}

int mcache_get(mcache *c, const char *text, size_t len, manifest *m)
{
    memset(m, 0, sizeof *m);
    if (!c || len > MCACHE_MAX_TEXT)
        return 0;
    pthread_mutex_lock(&c->lock);
    mcache_entry *e = find(c, text, len);
    int hit = 0;
    if (e) {
        ckpt_error_state keep; /* a failed copy is a miss, not an error */
        ckpt_error_capture(&keep, CKPT_OK);
        hit = manifest_copy(m, &e->m) == CKPT_OK;
        ckpt_error_restore(&keep);
        if (hit)
            e->used = ++c->clock;
    }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

void mcache_put(mcache *c, const char *text, size_t len, const manifest *m)
{
    if (!c || len > MCACHE_MAX_TEXT)
        return;
    ckpt_error_state keep; /* best effort: the caller's error stays */
    ckpt_error_capture(&keep, CKPT_OK);
    mcache_entry fresh = {0};
    if (!(fresh.text = malloc(len ? len : 1)) || manifest_copy(&fresh.m, m)) {
        free(fresh.text);
        ckpt_error_restore(&keep);
        return;
    }
    memcpy(fresh.text, text, len);
    fresh.len = len;
    pthread_mutex_lock(&c->lock);
    mcache_entry *slot = find(c, text, len);
    if (slot) { /* already there (another thread): keep that one */
        slot->used = ++c->clock;
        pthread_mutex_unlock(&c->lock);
        entry_clear(&fresh);
        ckpt_error_restore(&keep);
        return;
    }
    for (int i = 0; i < MCACHE_ENTRIES; i++) { /* a free slot, else the oldest */
        if (!c->e[i].text) {
            slot = &c->e[i];
            break;
        }
        if (!slot || c->e[i].used < slot->used)
            slot = &c->e[i];
    }
    mcache_entry old = *slot;
    fresh.used = ++c->clock;
    *slot = fresh;
    pthread_mutex_unlock(&c->lock);
    entry_clear(&old); /* freed outside the lock */
    ckpt_error_restore(&keep);
}

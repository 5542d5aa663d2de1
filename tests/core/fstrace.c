/* fstrace: record of file-system calls and the power-loss model (fstrace.h). */
#include "fstrace.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FT_MAX_FD 4096

/* One name in a namespace: "" is the root, "a/b" below it. */
typedef struct ft_name {
    char *path;
    int node;
} ft_name;

typedef struct ft_ns {
    ft_name *v;
    size_t n, cap;
} ft_ns;

struct fstrace {
    pthread_mutex_t mu;
    char *root;
    size_t root_len;
    int recording;
    ft_event *ev;
    size_t n, cap;
    int *is_dir; /* per node */
    int nodes, nodes_cap;
    ft_ns live;  /* the namespace as it is now, to resolve opens */
    int fd_node[FT_MAX_FD];
};

static char *xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    cr_assert(d);
    return d;
}

/* ----------------------------------------------------------- namespace */

static int ns_find(const ft_ns *ns, const char *path)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i].path, path) == 0)
            return (int)i;
    return -1;
}

static int ns_lookup(const ft_ns *ns, const char *path)
{
    int i = ns_find(ns, path);
    return i < 0 ? -1 : ns->v[i].node;
}

static void ns_add(ft_ns *ns, const char *path, int node)
{
    if (ns->n == ns->cap) {
        ns->cap = ns->cap ? ns->cap * 2 : 64;
        ns->v = realloc(ns->v, ns->cap * sizeof *ns->v);
        cr_assert(ns->v);
    }
    ns->v[ns->n].path = xstrdup(path);
    ns->v[ns->n].node = node;
    ns->n++;
}

static void ns_remove_at(ft_ns *ns, size_t i)
{
    free(ns->v[i].path);
    ns->v[i] = ns->v[--ns->n];
}

static void ns_free(ft_ns *ns)
{
    for (size_t i = 0; i < ns->n; i++)
        free(ns->v[i].path);
    free(ns->v);
    memset(ns, 0, sizeof *ns);
}

/* 1 when `path` is `dir` or below it. */
static int under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static char *parent_of(const char *path)
{
    char *p = xstrdup(path);
    char *slash = strrchr(p, '/');
    if (slash)
        *slash = '\0';
    else
        p[0] = '\0';
    return p;
}

/* Move everything at or below `from` to `to` (which must be free). */
static void ns_move(ft_ns *ns, const char *from, const char *to, const char *skip_mark)
{
    size_t fl = strlen(from);
    for (size_t i = 0; i < ns->n; i++) {
        if (!under(ns->v[i].path, from) || ns->v[i].path[0] == '\x01')
            continue;
        char *np = malloc(strlen(to) + strlen(ns->v[i].path) - fl + 2);
        cr_assert(np);
        sprintf(np, "%s%s%s", skip_mark, to, ns->v[i].path + fl);
        free(ns->v[i].path);
        ns->v[i].path = np;
    }
}

/* Apply a directory change; 0 when its preconditions do not hold (a
 * parent or source that did not survive), and then nothing changes. */
static int ns_apply(ft_ns *ns, const ft_event *e)
{
    char *par = e->path ? parent_of(e->path) : NULL;
    int ok = par && ns_lookup(ns, par) >= 0;
    free(par);
    if (!ok)
        return 0;
    int i = ns_find(ns, e->path);
    switch (e->op) {
    case FSIO_OPEN:
    case FSIO_MKDIR:
        if (i >= 0)
            return 0;
        ns_add(ns, e->path, e->node);
        return 1;
    case FSIO_UNLINK:
    case FSIO_RMDIR:
        if (i < 0)
            return 0;
        for (size_t j = ns->n; j-- > 0;) /* an rmdir'd directory is empty */
            if (under(ns->v[j].path, e->path))
                ns_remove_at(ns, j);
        return 1;
    case FSIO_RENAME: {
        char *par2 = parent_of(e->path2);
        int ok2 = i >= 0 && ns_lookup(ns, par2) >= 0;
        free(par2);
        if (!ok2)
            return 0;
        int j = ns_find(ns, e->path2);
        if (e->flags) { /* exchange: both must exist */
            if (j < 0)
                return 0;
            ns_move(ns, e->path, e->path2, "\x01");
            ns_move(ns, e->path2, e->path, "");
            for (size_t k = 0; k < ns->n; k++)
                if (ns->v[k].path[0] == '\x01')
                    memmove(ns->v[k].path, ns->v[k].path + 1, strlen(ns->v[k].path));
            return 1;
        }
        for (size_t k = ns->n; j >= 0 && k-- > 0;) /* replaced: gone */
            if (under(ns->v[k].path, e->path2))
                ns_remove_at(ns, k);
        ns_move(ns, e->path, e->path2, "");
        return 1;
    }
    default:
        return 0;
    }
}

/* --------------------------------------------------------------- record */

static int new_node(fstrace *t, int dir)
{
    if (t->nodes == t->nodes_cap) {
        t->nodes_cap = t->nodes_cap ? t->nodes_cap * 2 : 64;
        t->is_dir = realloc(t->is_dir, (size_t)t->nodes_cap * sizeof *t->is_dir);
        cr_assert(t->is_dir);
    }
    t->is_dir[t->nodes] = dir;
    return t->nodes++;
}

static ft_event *push(fstrace *t)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1024;
        t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
        cr_assert(t->ev);
    }
    ft_event *e = &t->ev[t->n++];
    memset(e, 0, sizeof *e);
    e->node = e->parent = e->parent2 = -1;
    return e;
}

/* `abs` relative to the root, or NULL when outside it. */
static const char *rel(const fstrace *t, const char *abs)
{
    if (!abs || strncmp(abs, t->root, t->root_len) != 0)
        return NULL;
    if (abs[t->root_len] == '\0')
        return "";
    return abs[t->root_len] == '/' ? abs + t->root_len + 1 : NULL;
}

static int parent_node(const fstrace *t, const char *relpath)
{
    char *p = parent_of(relpath);
    int n = ns_lookup(&t->live, p);
    free(p);
    return n;
}

static int fd_node(const fstrace *t, int fd)
{
    return fd >= 0 && fd < FT_MAX_FD ? t->fd_node[fd] : -1;
}

/* A writer renames and removes in its root through the pinned
 * "/proc/self/fd/N/..." (lib/io/layout.h): the path of the directory that
 * descriptor holds, in `buf`, so the model sees the root's names. */
static const char *unpin(const char *path, char *buf, size_t size)
{
    const char *pre = "/proc/self/fd/";
    size_t n = strlen(pre);
    if (!path || strncmp(path, pre, n) != 0)
        return path;
    const char *rest = path + n + strspn(path + n, "0123456789");
    char link[64];
    snprintf(link, sizeof link, "%.*s", (int)(rest - path), path);
    ssize_t len = readlink(link, buf, size - 1);
    if (len <= 0 || (size_t)len + strlen(rest) >= size)
        return path;
    snprintf(buf + len, size - (size_t)len, "%s", rest);
    return buf;
}

void ft_on_event(void *ctx, const fsio_event *ev)
{
    fstrace *t = ctx;
    pthread_mutex_lock(&t->mu);
    if (!t->recording)
        goto out;
    char b1[4096], b2[4096];
    const char *p = rel(t, unpin(ev->path, b1, sizeof b1));
    const char *p2 = rel(t, unpin(ev->path2, b2, sizeof b2));
    if (ev->path && !p)
        goto out; /* outside the root */
    ft_event *e;
    switch (ev->op) {
    case FSIO_OPEN: {
        int node = ns_lookup(&t->live, p);
        e = push(t);
        if (node < 0) { /* new, or there before the record began */
            node = new_node(t, 0);
            if (ev->flags & O_CREAT) {
                e->ns = e->created = 1;
                e->parent = parent_node(t, p);
            }
        }
        e->op = FSIO_OPEN;
        e->path = xstrdup(p);
        e->node = node;
        e->flags = ev->flags;
        if (e->created)
            ns_apply(&t->live, e);
        if (ev->fd >= 0 && ev->fd < FT_MAX_FD)
            t->fd_node[ev->fd] = node;
        break;
    }
    case FSIO_CLOSE:
        if (ev->fd >= 0 && ev->fd < FT_MAX_FD)
            t->fd_node[ev->fd] = -1;
        break;
    case FSIO_PWRITE:
    case FSIO_PREAD:
    case FSIO_FSYNC:
        e = push(t);
        e->op = (int)ev->op;
        e->node = fd_node(t, ev->fd);
        e->len = ev->len;
        e->off = ev->off;
        if (ev->op == FSIO_PWRITE) {
            e->data = malloc(ev->len ? ev->len : 1);
            cr_assert(e->data);
            memcpy(e->data, ev->buf, ev->len);
        }
        break;
    case FSIO_MKDIR:
    case FSIO_UNLINK:
    case FSIO_RMDIR:
    case FSIO_RENAME:
        if (ev->op == FSIO_RENAME && !p2)
            goto out;
        e = push(t);
        e->op = (int)ev->op;
        e->ns = 1;
        e->path = xstrdup(p);
        e->path2 = p2 ? xstrdup(p2) : NULL;
        e->flags = ev->flags;
        e->parent = parent_node(t, p);
        if (p2)
            e->parent2 = parent_node(t, p2);
        e->node = ev->op == FSIO_MKDIR ? new_node(t, 1) : ns_lookup(&t->live, p);
        ns_apply(&t->live, e);
        break;
    default:
        break;
    }
out:
    pthread_mutex_unlock(&t->mu);
}

fstrace *ft_new(const char *root)
{
    fstrace *t = calloc(1, sizeof *t);
    cr_assert(t);
    pthread_mutex_init(&t->mu, NULL);
    t->root = realpath(root, NULL);
    cr_assert(t->root, "cannot resolve %s", root);
    t->root_len = strlen(t->root);
    for (int i = 0; i < FT_MAX_FD; i++)
        t->fd_node[i] = -1;
    ns_add(&t->live, "", new_node(t, 1));
    return t;
}

void ft_free(fstrace *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->ev[i].path);
        free(t->ev[i].path2);
        free(t->ev[i].data);
    }
    free(t->ev);
    free(t->is_dir);
    ns_free(&t->live);
    free(t->root);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void ft_hook(fstrace *t, fsio *fs)
{
    fs->trace = ft_on_event;
    fs->ctx = t;
}

void ft_record(fstrace *t, int on)
{
    pthread_mutex_lock(&t->mu);
    t->recording = on;
    pthread_mutex_unlock(&t->mu);
}

void ft_ack(fstrace *t, int64_t step, int tag)
{
    pthread_mutex_lock(&t->mu);
    ft_event *e = push(t);
    e->op = FT_ACK;
    e->step = step;
    e->tag = tag;
    pthread_mutex_unlock(&t->mu);
}

size_t ft_count(const fstrace *t) { return t->n; }
const ft_event *ft_get(const fstrace *t, size_t i) { return &t->ev[i]; }
int ft_is_dir(const fstrace *t, int node) { return node >= 0 && node < t->nodes && t->is_dir[node]; }

int ft_is_crash_point(const fstrace *t, size_t i)
{
    return t->ev[i].op == FSIO_FSYNC || t->ev[i].op == FSIO_RENAME;
}

/* ------------------------------------------------------------- the model */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* 1 when `node` is fsynced by an event in (i, k). */
static int synced_after(const fstrace *t, int node, size_t i, size_t k)
{
    if (node < 0)
        return 0;
    for (size_t j = i + 1; j < k; j++)
        if (t->ev[j].op == FSIO_FSYNC && t->ev[j].node == node)
            return 1;
    return 0;
}

static int ns_durable(const fstrace *t, size_t i, size_t k)
{
    const ft_event *e = &t->ev[i];
    return synced_after(t, e->parent, i, k) &&
           (e->op != FSIO_RENAME || synced_after(t, e->parent2, i, k));
}

static void write_node(const fstrace *t, int node, size_t k, enum ft_fate fate,
                       uint64_t *rs, const char *path, size_t *changed)
{
    unsigned char *buf = NULL;
    size_t size = 0;
    for (size_t i = 0; i < k; i++) {
        const ft_event *e = &t->ev[i];
        if (e->op != FSIO_PWRITE || e->node != node)
            continue;
        int keep = 1, garble = 0;
        if (!synced_after(t, node, i, k)) {
            uint64_t r = fate == FT_RANDOM ? rnd(rs) % 10 : 0;
            keep = fate == FT_KEEP_ALL || (fate == FT_RANDOM && r < 7);
            garble = fate == FT_RANDOM && r >= 5 && r < 7;
            *changed += !keep || garble;
        }
        if (!keep)
            continue;
        size_t end = (size_t)e->off + e->len;
        if (end > size) {
            buf = realloc(buf, end);
            cr_assert(buf);
            memset(buf + size, 0, end - size);
            size = end;
        }
        memcpy(buf + e->off, e->data, e->len);
        if (garble && e->len) /* a torn sector: some bytes of it changed */
            for (int g = 0; g < 4; g++)
                buf[e->off + rnd(rs) % e->len] ^= (unsigned char)(1 + rnd(rs) % 255);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    cr_assert(fd >= 0, "cannot create %s", path);
    cr_assert_eq(size ? write(fd, buf, size) : 0, (ssize_t)size);
    close(fd);
    free(buf);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(((const ft_name *)a)->path, ((const ft_name *)b)->path);
}

size_t ft_materialize(const fstrace *t, size_t k, enum ft_fate fate, uint64_t seed,
                      const char *out)
{
    uint64_t rs = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    rnd(&rs);
    /* The cut: directory changes before it survive, after it only the
     * durable ones.  KEEP_ALL keeps all, DROP_ALL only the durable ones. */
    size_t first = k, nondurable = 0;
    for (size_t i = 0; i < k; i++)
        if (t->ev[i].ns && !ns_durable(t, i, k)) {
            if (first == k)
                first = i;
            nondurable++;
        }
    size_t cut = fate == FT_KEEP_ALL ? k : first;
    if (fate == FT_RANDOM && nondurable)
        cut = first + (size_t)(rnd(&rs) % (k - first + 1));
    size_t changed = 0;
    ft_ns ns = {0};
    ns_add(&ns, "", 0);
    for (size_t i = 0; i < k; i++) {
        if (!t->ev[i].ns)
            continue;
        int applied = (i < cut || ns_durable(t, i, k)) && ns_apply(&ns, &t->ev[i]);
        changed += !applied && i >= cut;
    }
    qsort(ns.v, ns.n, sizeof *ns.v, cmp_names); /* parents before children */
    cr_assert_eq(mkdir(out, 0755), 0, "cannot create %s", out);
    for (size_t i = 1; i < ns.n; i++) {
        char *p = malloc(strlen(out) + strlen(ns.v[i].path) + 2);
        cr_assert(p);
        sprintf(p, "%s/%s", out, ns.v[i].path);
        if (t->is_dir[ns.v[i].node])
            cr_assert_eq(mkdir(p, 0755), 0, "cannot create %s", p);
        else
            write_node(t, ns.v[i].node, k, fate, &rs, p, &changed);
        free(p);
    }
    ns_free(&ns);
    return changed;
}

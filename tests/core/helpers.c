#include "helpers.h"
#include "fsio.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <linux/fs.h>

char *tc_root;

/* ------------------------------------------------------------ temp roots */

char *tc_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    size_t n = strlen(base) + 32;
    char *path = malloc(n);
    cr_assert(path);
    snprintf(path, n, "%s/ckpt-tcore-XXXXXX", base);
    cr_assert(mkdtemp(path), "mkdtemp(%s): %s", path, strerror(errno));
    return path;
}

static int immutable_on, immutable_failed;

static int set_immutable_one(const char *path, const struct stat *sb, int type,
                             struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (type != FTW_F && type != FTW_D && type != FTW_DP)
        return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        immutable_failed = 1;
        return 0;
    }
    int flags = 0;
    if (ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
        int nf = immutable_on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
        if (nf != flags && ioctl(fd, FS_IOC_SETFLAGS, &nf) != 0)
            immutable_failed = 1;
    } else {
        immutable_failed = 1;
    }
    close(fd);
    return 0;
}

int tc_set_immutable(const char *path, int on)
{
    immutable_on = on;
    immutable_failed = 0;
    /* files first, directories last when setting (FTW_DEPTH) */
    nftw(path, set_immutable_one, 16, FTW_PHYS | FTW_DEPTH);
    return immutable_failed ? -1 : 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char **snap_lines;
static size_t snap_n, snap_cap;
static size_t snap_root_len;

static int snap_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)type;
    (void)ftw;
    char line[4200];
    snprintf(line, sizeof line, "%s %o %lld %lld.%09ld\n", path + snap_root_len,
             (unsigned)sb->st_mode, (long long)sb->st_size, (long long)sb->st_mtim.tv_sec,
             sb->st_mtim.tv_nsec);
    if (snap_n == snap_cap) {
        snap_cap = snap_cap ? snap_cap * 2 : 64;
        snap_lines = realloc(snap_lines, snap_cap * sizeof *snap_lines);
        cr_assert(snap_lines);
    }
    snap_lines[snap_n++] = strdup(line);
    return 0;
}

char *tc_tree_snapshot(const char *path)
{
    snap_lines = NULL;
    snap_n = snap_cap = 0;
    snap_root_len = strlen(path);
    nftw(path, snap_one, 16, FTW_PHYS);
    qsort(snap_lines, snap_n, sizeof *snap_lines, cmp_str);
    size_t total = 1;
    for (size_t i = 0; i < snap_n; i++)
        total += strlen(snap_lines[i]);
    char *out = malloc(total);
    cr_assert(out);
    out[0] = 0;
    char *p = out;
    for (size_t i = 0; i < snap_n; i++) {
        size_t l = strlen(snap_lines[i]);
        memcpy(p, snap_lines[i], l + 1);
        p += l;
        free(snap_lines[i]);
    }
    free(snap_lines);
    snap_lines = NULL;
    return out;
}

static int make_writable(const char *path, const struct stat *sb, int type,
                         struct FTW *ftw)
{
    (void)ftw;
    if (type == FTW_D || type == FTW_DNR)
        chmod(path, (sb->st_mode & 07777) | 0700);
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int type,
                        struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (type == FTW_DP || type == FTW_D || type == FTW_DNR)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

void tc_rmtree(const char *path)
{
    if (!path)
        return;
    if (geteuid() == 0)
        tc_set_immutable(path, 0);
    nftw(path, make_writable, 16, FTW_PHYS);
    nftw(path, remove_entry, 16, FTW_PHYS | FTW_DEPTH);
}

void tc_setup(void)
{
    tc_root = tc_mkdtemp();
    ckpt_error_clear();
}

void tc_teardown(void)
{
    tc_rmtree(tc_root);
    free(tc_root);
    tc_root = NULL;
}

/* ------------------------------------------------------------------ files */

char *tc_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    cr_assert(p);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

char *tc_step_dir(const char *root, int64_t step)
{
    char name[64];
    snprintf(name, sizeof name, "step-%012lld", (long long)step);
    return tc_join(root, name);
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

char *tc_find_suffix(const char *dir, const char *suffix)
{
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, by_name);
    char *found = NULL;
    size_t sl = strlen(suffix);
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        size_t l = strlen(nm);
        if (!found && l >= sl && strcmp(nm + l - sl, suffix) == 0 &&
            strcmp(nm, ".") != 0 && strcmp(nm, "..") != 0)
            found = tc_join(dir, nm);
        free(ents[i]);
    }
    free(ents);
    return found;
}

int tc_count_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    size_t pl = strlen(prefix);
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (strncmp(e->d_name, prefix, pl) == 0)
            n++;
    }
    closedir(d);
    return n;
}

int tc_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

int64_t tc_file_size(const char *path)
{
    struct stat sb;
    cr_assert(stat(path, &sb) == 0, "stat(%s): %s", path, strerror(errno));
    return (int64_t)sb.st_size;
}

const char *tc_fsio_op_name(int op)
{
    static const char *const names[FSIO_OP_COUNT] = {
        "open", "close", "pread", "pwrite", "fsync", "rename", "unlink",
        "mkdir", "rmdir", "readdir", "stat", "lock",
    };
    return op >= 0 && op < FSIO_OP_COUNT ? names[op] : "?";
}

void tc_flip_byte(const char *path, int64_t offset)
{
    int64_t size = tc_file_size(path);
    int64_t off = offset < 0 ? size + offset : offset;
    cr_assert(off >= 0 && off < size, "flip offset %" PRId64 " outside %s (%" PRId64 " bytes)",
              off, path, size);
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0, "open(%s): %s", path, strerror(errno));
    unsigned char c;
    cr_assert(pread(fd, &c, 1, off) == 1);
    c ^= 0x01;
    cr_assert(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

void tc_truncate(const char *path, int64_t size)
{
    cr_assert(truncate(path, size) == 0, "truncate(%s): %s", path, strerror(errno));
}

void tc_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "fopen(%s): %s", path, strerror(errno));
    cr_assert(fwrite(data, 1, len, f) == len);
    cr_assert(fclose(f) == 0);
}

void tc_copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    cr_assert(in, "fopen(%s): %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    cr_assert(out, "fopen(%s): %s", to, strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        cr_assert(fwrite(buf, 1, n, out) == n);
    fclose(in);
    cr_assert(fclose(out) == 0);
}

void tc_copy_tree(const char *from, const char *to)
{
    struct stat sb;
    cr_assert(lstat(from, &sb) == 0, "lstat(%s): %s", from, strerror(errno));
    if (S_ISREG(sb.st_mode)) {
        tc_copy_file(from, to);
        return;
    }
    if (!S_ISDIR(sb.st_mode))
        return;
    cr_assert(mkdir(to, 0755) == 0, "mkdir(%s): %s", to, strerror(errno));
    DIR *d = opendir(from);
    cr_assert(d, "opendir(%s): %s", from, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *a = tc_join(from, e->d_name), *b = tc_join(to, e->d_name);
        tc_copy_tree(a, b);
        free(a);
        free(b);
    }
    closedir(d);
}

/* ------------------------------------------------------------------- data */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tc_fill_random(void *buf, size_t n, uint64_t seed)
{
    unsigned char *p = buf;
    uint64_t x = seed * 0x2545f4914f6cdd1dull + 1;
    while (n >= 8) {
        uint64_t v = splitmix(&x);
        memcpy(p, &v, 8);
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = splitmix(&x);
        memcpy(p, &v, n);
    }
}

void tc_fill_compressible(void *buf, size_t n, uint64_t seed)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i / 64 + seed) & 0x0f);
}

void tc_state_init(tc_state *s)
{
    memset(s, 0, sizeof *s);
}

void tc_state_free(tc_state *s)
{
    for (size_t i = 0; i < s->count; i++) {
        free((void *)s->t[i].name);
        free((void *)s->t[i].shape);
        free(s->t[i].data);
    }
    free(s->t);
    memset(s, 0, sizeof *s);
}

ckpt_tensor *tc_state_add(tc_state *s, const char *name, ckpt_dtype dtype,
                          int ndim, const int64_t *shape, enum tc_fill fill,
                          uint64_t seed)
{
    if (s->count == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->t = realloc(s->t, s->cap * sizeof *s->t);
        cr_assert(s->t);
    }
    uint64_t elems = 1;
    for (int i = 0; i < ndim; i++)
        elems *= (uint64_t)shape[i];
    uint64_t bytes = elems * ckpt_dtype_size(dtype);
    cr_assert(ckpt_dtype_size(dtype) > 0, "helper: dtype %d has no size", (int)dtype);

    ckpt_tensor *t = &s->t[s->count++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    cr_assert(t->name);
    int64_t *sh = malloc(sizeof(int64_t) * (size_t)(ndim > 0 ? ndim : 1));
    cr_assert(sh);
    for (int i = 0; i < ndim; i++)
        sh[i] = shape[i];
    t->shape = sh;
    t->ndim = ndim;
    t->dtype = dtype;
    t->bytes = bytes;
    t->memory = CKPT_MEM_HOST;
    /* Never malloc(0): a distinct non-NULL pointer even for empty tensors. */
    t->data = malloc(bytes ? bytes : 1);
    cr_assert(t->data);
    switch (fill) {
    case TC_RANDOM:
        tc_fill_random(t->data, bytes, seed);
        break;
    case TC_COMPRESSIBLE:
        tc_fill_compressible(t->data, bytes, seed);
        break;
    case TC_CONST:
        memset(t->data, (int)(seed & 0xff), bytes);
        break;
    }
    if (dtype == CKPT_BOOL) {
        unsigned char *p = t->data;
        for (uint64_t i = 0; i < bytes; i++)
            p[i] &= 1;
    }
    return t;
}

void tc_state_like(tc_state *dst, const tc_state *src, unsigned char byte)
{
    tc_state_init(dst);
    for (size_t i = 0; i < src->count; i++) {
        const ckpt_tensor *t = &src->t[i];
        ckpt_tensor *n = tc_state_add(dst, t->name, t->dtype, t->ndim, t->shape,
                                      TC_CONST, byte);
        memset(n->data, byte, n->bytes); /* bool masking must not apply */
    }
}

void tc_state_copy(tc_state *dst, const tc_state *src)
{
    tc_state_like(dst, src, 0);
    for (size_t i = 0; i < src->count; i++)
        memcpy(dst->t[i].data, src->t[i].data, src->t[i].bytes);
}

void tc_state_standard(tc_state *s, uint64_t seed)
{
    tc_state_init(s);
    int64_t w[2] = {64, 128}, b[1] = {128}, m[2] = {256, 256}, r[1] = {4096},
            f[3] = {3, 5, 7};
    tc_state_add(s, "model.weight", CKPT_F32, 2, w, TC_RANDOM, seed * 10 + 1);
    tc_state_add(s, "model.bias", CKPT_F32, 1, b, TC_RANDOM, seed * 10 + 2);
    tc_state_add(s, "optim.momentum", CKPT_F16, 2, m, TC_COMPRESSIBLE, seed);
    tc_state_add(s, "rng.state", CKPT_BYTES, 1, r, TC_RANDOM, seed * 10 + 3);
    tc_state_add(s, "step", CKPT_I64, 0, NULL, TC_RANDOM, seed * 10 + 4);
    tc_state_add(s, "odd.f64", CKPT_F64, 3, f, TC_RANDOM, seed * 10 + 5);
}

uint64_t tc_state_bytes(const tc_state *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->count; i++)
        n += s->t[i].bytes;
    return n;
}

void tc_assert_state_eq(const tc_state *got, const tc_state *want, const char *what)
{
    cr_assert_eq(got->count, want->count, "%s: %zu tensors, want %zu", what,
                 got->count, want->count);
    for (size_t i = 0; i < want->count; i++) {
        const ckpt_tensor *g = &got->t[i], *w = &want->t[i];
        cr_assert_str_eq(g->name, w->name, "%s: tensor %zu", what, i);
        cr_assert_eq(g->bytes, w->bytes, "%s: tensor %s size", what, w->name);
        if (w->bytes && memcmp(g->data, w->data, w->bytes) != 0) {
            const unsigned char *a = g->data, *b = w->data;
            uint64_t off = 0;
            while (a[off] == b[off])
                off++;
            cr_assert_fail("%s: tensor %s differs at byte %" PRIu64
                           " (got 0x%02x, want 0x%02x)", what, w->name, off,
                           a[off], b[off]);
        }
    }
}

/* ------------------------------------------------------------ store usage */

void tc_opts(ckpt_store_options *o)
{
    cr_assert_eq(ckpt_store_options_init(o, CKPT_STORE_OPTIONS_VERSION), CKPT_OK);
    o->fsync = 0;
    o->keep_last = 0;
    o->threads = 2;
}

ckpt_store *tc_open(const char *root)
{
    ckpt_store_options o;
    tc_opts(&o);
    ckpt_store *st = NULL;
    int rc = ckpt_store_open(&st, root, &o);
    cr_assert_eq(rc, CKPT_OK, "ckpt_store_open(%s) = %d: %s", root, rc,
                 ckpt_error_last());
    cr_assert(st);
    return st;
}

ckpt_store *tc_open_ro(const char *root)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = CKPT_OPEN_READONLY;
    ckpt_store *st = NULL;
    int rc = ckpt_store_open(&st, root, &o);
    cr_assert_eq(rc, CKPT_OK, "ckpt_store_open(%s, READONLY) = %d: %s", root, rc,
                 ckpt_error_last());
    cr_assert(st);
    return st;
}

int tc_save(ckpt_store *st, int64_t step, const tc_state *s, const char *metadata_json)
{
    ckpt_save_options so;
    cr_assert_eq(ckpt_save_options_init(&so, CKPT_SAVE_OPTIONS_VERSION), CKPT_OK);
    so.metadata_json = metadata_json;
    ckpt_save *sv = NULL;
    int rc = ckpt_save_begin(&sv, st, step, s->t, s->count, &so);
    if (rc == CKPT_OK) {
        cr_assert(sv, "ckpt_save_begin returned OK without a handle");
        rc = ckpt_save_wait(sv);
    }
    ckpt_save_free(sv);
    return rc;
}

void tc_save_ok(ckpt_store *st, int64_t step, const tc_state *s)
{
    int rc = tc_save(st, step, s, NULL);
    cr_assert_eq(rc, CKPT_OK, "save of step %" PRId64 " = %d (%s): %s", step, rc,
                 ckpt_strerror(rc), ckpt_error_last());
}

int64_t tc_restore_check(ckpt_store *st, int64_t step, const tc_state *want)
{
    tc_state got;
    tc_state_like(&got, want, 0xA5);
    ckpt_report *rep = NULL;
    int rc = ckpt_restore(st, step, got.t, got.count, NULL, &rep);
    cr_assert_eq(rc, CKPT_OK, "restore of step %" PRId64 " = %d (%s): %s", step,
                 rc, ckpt_strerror(rc), ckpt_error_last());
    cr_assert(rep, "restore returned no report");
    int64_t s = ckpt_report_step(rep);
    if (step != CKPT_LATEST)
        cr_assert_eq(s, step, "report step %" PRId64 ", restored %" PRId64, s, step);
    char what[64];
    snprintf(what, sizeof what, "restore of step %" PRId64, s);
    tc_assert_state_eq(&got, want, what);
    ckpt_report_free(rep);
    tc_state_free(&got);
    return s;
}

int64_t *tc_steps(const ckpt_store *st, size_t *count)
{
    int64_t *steps = NULL;
    *count = 99999;
    int rc = ckpt_store_steps(st, &steps, count);
    cr_assert_eq(rc, CKPT_OK, "ckpt_store_steps = %d: %s", rc, ckpt_error_last());
    cr_assert(*count == 0 || steps);
    return steps;
}

void tc_assert_steps(const ckpt_store *st, const int64_t *want, size_t n)
{
    size_t count;
    int64_t *steps = tc_steps(st, &count);
    char got[256] = "", tmp[32];
    for (size_t i = 0; i < count && strlen(got) < 200; i++) {
        snprintf(tmp, sizeof tmp, "%s%" PRId64, i ? "," : "", steps[i]);
        strcat(got, tmp);
    }
    int same = count == n;
    for (size_t i = 0; same && i < n; i++)
        same = steps[i] == want[i];
    ckpt_free(steps);
    cr_assert(same, "steps are [%s], want %zu steps from %" PRId64 " to %" PRId64,
              got, n, n ? want[0] : -1, n ? want[n - 1] : -1);
}

int tc_nonempty(const char *s)
{
    return s && *s;
}

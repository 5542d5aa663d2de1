/* store: root namespace, lock, commit protocol, retention, cleanup. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "util.h"

void store_step_name(int64_t step, char *buf, size_t size)
{
    snprintf(buf, size, "step-%012lld", (long long)step);
}

int store_parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0)
        return 0;
    const char *d = name + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 18)
        return 0;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9')
            return 0;
        v = v * 10 + (d[i] - '0');
    }
    *step = v;
    return 1;
}

char *store_step_path(const ckpt_store *s, int64_t step)
{
    char name[32];
    store_step_name(step, name, sizeof name);
    return util_join(s->root, name);
}

int store_lock(ckpt_store *s)
{
    char *path = util_join(s->root, STORE_LOCK_NAME);
    if (!path)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int fd = fsio_open(&s->fs, path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        int rc = ckpt_seterr_errno(-fd, "cannot open the lock file %s", path);
        free(path);
        return rc;
    }
    int rc = fsio_lock(&s->fs, fd);
    if (rc) {
        fsio_close(&s->fs, fd);
        if (rc == -EWOULDBLOCK)
            rc = ckpt_seterr(CKPT_EBUSY, "%s is locked by another writer (lock file %s); "
                             "open it with CKPT_OPEN_READONLY to read", s->root, path);
        else
            rc = ckpt_seterr_errno(-rc, "cannot lock %s", path);
        free(path);
        return rc;
    }
    free(path);
    s->lock_fd = fd;
    return CKPT_OK;
}

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* `.replaced-step-N-...`: the committed step-N, moved aside by a writer that
 * died before its replacement was renamed in.  It is still the checkpoint. */
static void recover_replaced(ckpt_store *s, const char *name)
{
    int64_t step;
    char stepname[32];
    const char *rest = name + strlen(STORE_REPLACED_PREFIX);
    const char *dash = strchr(rest + 5, '-');
    if (!dash || (size_t)(dash - rest) >= sizeof stepname)
        return;
    memcpy(stepname, rest, (size_t)(dash - rest));
    stepname[dash - rest] = '\0';
    if (!store_parse_step_name(stepname, &step))
        return;
    char *from = util_join(s->root, name), *to = store_step_path(s, step);
    if (from && to) {
        int is_dir;
        if (fsio_stat(&s->fs, to, NULL, &is_dir) == -ENOENT) {
            if (fsio_rename(&s->fs, from, to) == 0 && s->opts.fsync)
                fsio_fsync_path(&s->fs, s->root);
        } else {
            fsio_remove_tree(&s->fs, from); /* its replacement made it */
        }
    }
    free(from);
    free(to);
}

void store_clean_stale(ckpt_store *s)
{
    char **names;
    size_t n;
    if (fsio_list(&s->fs, s->root, &names, &n))
        return;
    for (size_t i = 0; i < n; i++) {
        if (has_prefix(names[i], STORE_REPLACED_PREFIX)) {
            recover_replaced(s, names[i]);
            continue;
        }
        if (strncmp(names[i], STORE_TMP_PREFIX, strlen(STORE_TMP_PREFIX)) != 0 &&
            strncmp(names[i], STORE_TRASH_PREFIX, strlen(STORE_TRASH_PREFIX)) != 0)
            continue;
        char *p = util_join(s->root, names[i]);
        if (p)
            fsio_remove_tree(&s->fs, p); /* we hold the lock: its writer is dead */
        free(p);
    }
    fsio_list_free(names, n);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int store_scan(ckpt_store *s, int64_t **steps, size_t *count)
{
    *steps = NULL;
    *count = 0;
    char **names;
    size_t n;
    int rc = fsio_list(&s->fs, s->root, &names, &n);
    if (rc)
        return ckpt_seterr_errno(-rc, "cannot list the checkpoint root %s", s->root);
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) {
        fsio_list_free(names, n);
        return ckpt_seterr(CKPT_ENOMEM, "out of memory listing %s", s->root);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (store_parse_step_name(names[i], &v[k]))
            k++;
    fsio_list_free(names, n);
    qsort(v, k, sizeof *v, cmp_i64);
    *steps = v;
    *count = k;
    return CKPT_OK;
}

static char *unique_name(ckpt_store *s, const char *prefix, int64_t step)
{
    char name[128];
    snprintf(name, sizeof name, "%sstep-%012lld-%ld-%u", prefix, (long long)step,
             (long)getpid(), ++s->seq);
    return util_join(s->root, name);
}

int store_make_temp(ckpt_store *s, int64_t step, char **path)
{
    char *p = unique_name(s, STORE_TMP_PREFIX, step);
    if (!p)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = fsio_mkdir(&s->fs, p, 0755);
    if (rc) {
        rc = ckpt_seterr_errno(-rc, "cannot create the temporary directory %s", p);
        free(p);
        return rc;
    }
    *path = p;
    return CKPT_OK;
}

int store_commit(ckpt_store *s, const char *tmp, int64_t step)
{
    char *final = store_step_path(s, step);
    if (!final)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    int rc = fsio_rename(&s->fs, tmp, final);
    if (rc == -ENOTEMPTY || rc == -EEXIST) {
        /* Replace an existing step-N atomically: swap, then delete the old
         * one, which now sits under the temporary name. */
        rc = fsio_exchange(&s->fs, tmp, final);
        if (rc == 0) {
            fsio_remove_tree(&s->fs, tmp);
        } else if (rc == -EINVAL || rc == -ENOSYS || rc == -ENOTSUP) {
            /* No atomic swap on this file system: move the old one aside
             * under a name the next open puts back if we die in between,
             * and put it back ourselves if the second rename fails. */
            char *aside = unique_name(s, STORE_REPLACED_PREFIX, step);
            rc = aside ? fsio_rename(&s->fs, final, aside) : -ENOMEM;
            if (rc == 0) {
                rc = fsio_rename(&s->fs, tmp, final);
                if (rc == 0)
                    fsio_remove_tree(&s->fs, aside);
                else
                    fsio_rename(&s->fs, aside, final);
            }
            free(aside);
        }
    }
    if (rc) {
        rc = ckpt_seterr_errno(-rc, "cannot commit %s as %s", tmp, final);
        free(final);
        return rc;
    }
    free(final);
    if (s->opts.fsync && (rc = fsio_fsync_path(&s->fs, s->root)))
        return ckpt_seterr_errno(-rc, "cannot fsync the checkpoint root %s", s->root);
    return CKPT_OK;
}

int store_retire(ckpt_store *s, int64_t step)
{
    char *path = store_step_path(s, step), *trash = unique_name(s, STORE_TRASH_PREFIX, step);
    int rc = path && trash ? fsio_rename(&s->fs, path, trash) : -ENOMEM;
    if (rc == 0) {
        if (s->opts.fsync)
            fsio_fsync_path(&s->fs, s->root);
        fsio_remove_tree(&s->fs, trash); /* leftovers are cleaned next open */
    }
    if (rc)
        rc = ckpt_seterr_errno(-rc, "cannot retire step %lld", (long long)step);
    free(path);
    free(trash);
    return rc;
}

void store_apply_retention(ckpt_store *s, int64_t just)
{
    if (s->opts.keep_last <= 0)
        return;
    int64_t *steps;
    size_t n;
    if (store_scan(s, &steps, &n))
        return;
    size_t keep = (size_t)s->opts.keep_last;
    for (size_t i = 0; i + keep < n; i++)
        if (steps[i] != just)
            store_retire(s, steps[i]);
    free(steps);
}

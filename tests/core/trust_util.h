/* What the tests of whose checkpoints are used (test_trust.c,
 * test_trust_groups.c) share: another user, a shared group, opening with
 * flags, and the check of a refusal.  Each file includes it once, for its
 * own copies. */
#ifndef TRUST_UTIL_H
#define TRUST_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "helpers.h"
#include "testing.h"
#include "trust.h"

#define OTHER_UID 65534 /* nobody */

static inline void need_root(void)
{
    if (geteuid() != 0)
        cr_skip_test("changing a file's owner needs root");
}

/* chown -R */
static inline void chown_tree(const char *path, uid_t uid, gid_t gid)
{
    char cmd[4200 + 64];
    snprintf(cmd, sizeof cmd, "chown -R %u:%u '%s'", (unsigned)uid, (unsigned)gid, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static inline int open_flags(const char *root, unsigned flags, ckpt_store **st)
{
    ckpt_store_options o;
    tc_opts(&o);
    o.flags = flags;
    *st = NULL;
    return ckpt_store_open(st, root, &o);
}

static inline void assert_refused(int rc, const char *what, const char *word)
{
    cr_assert_eq(rc, CKPT_EACCES, "%s: %s, want CKPT_EACCES (%s)", what, ckpt_status_name(rc),
                 ckpt_error_last());
    cr_assert(strstr(ckpt_error_last(), word), "%s: message lacks '%s': %s", what, word,
              ckpt_error_last());
}

/* A group that is nobody's private group: not the caller's own. */
static inline gid_t shared_gid(void)
{
    struct group *g = getgrnam("users");
    return g ? g->gr_gid : 100;
}

#endif

/* settle.h: wait for a store's background deletion of retired steps.
 *
 * A save renames the steps keep_last lets go before it returns and deletes
 * their files in the background after it (docs/FORMAT.md, commit protocol
 * step 8).  A benchmark that times the next save, restore or raw write
 * right away would time that deletion too, on whichever operation it
 * happened to overlap; so it waits here first, until no `.trash-` entry is
 * left in the root (at most 60 s). */
#ifndef CKPT_BENCH_SETTLE_H
#define CKPT_BENCH_SETTLE_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* 0 once `root` holds no `.trash-` entry; -1 after 60 s, or when it
 * cannot be listed. */
static inline int bench_settle(const char *root)
{
    for (int waited_ms = 0; waited_ms < 60000; waited_ms += 2) {
        DIR *d = opendir(root);
        if (!d)
            return -1;
        int busy = 0;
        for (struct dirent *e; !busy && (e = readdir(d));)
            busy = strncmp(e->d_name, ".trash-", 7) == 0;
        closedir(d);
        if (!busy)
            return 0;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "%s: a retired step is still being deleted after 60 s\n", root);
    return -1;
}

#endif

/* Shared helpers of the core test suite: a fresh temporary root per test,
 * deterministic tensor states, file damage, and restore-and-compare checks
 * that fail the current Criterion test with a message saying what differed. */
#ifndef TCORE_HELPERS_H
#define TCORE_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

/* ------------------------------------------------------------ temp roots */

/* The current test's root directory (fresh, empty), made by tc_setup and
 * removed with everything in it by tc_teardown.  Use as .init / .fini. */
extern char *tc_root;
void tc_setup(void);
void tc_teardown(void);

/* A new empty directory under $TMPDIR (or /tmp); malloc'd path. */
char *tc_mkdtemp(void);
/* rm -rf, making directories writable (and mutable) first. */
void tc_rmtree(const char *path);
/* Set or clear the immutable attribute (chattr +i) on `path` and everything
 * under it; needs CAP_LINUX_IMMUTABLE.  0 if every entry took it, else -1. */
int tc_set_immutable(const char *path, int on);
/* A sorted listing of everything under `path` (name, type, mode, size,
 * mtime): equal listings mean nothing was created, removed or written. */
char *tc_tree_snapshot(const char *path);

/* ------------------------------------------------------------------ files */

/* malloc'd "dir/name". */
char *tc_join(const char *dir, const char *name);
/* malloc'd "root/step-%012lld". */
char *tc_step_dir(const char *root, int64_t step);
/* malloc'd full path of the first entry of `dir` (by name) whose name ends
 * with `suffix`, or NULL. */
char *tc_find_suffix(const char *dir, const char *suffix);
/* Number of entries of `dir` whose name starts with `prefix` (-1 if the
 * directory cannot be read). */
int tc_count_prefix(const char *dir, const char *prefix);
int tc_exists(const char *path);
int64_t tc_file_size(const char *path);
/* XOR the byte at `offset` (from the end when negative) with 0x01. */
void tc_flip_byte(const char *path, int64_t offset);
/* "open", "pwrite", ... for messages about the fsio seam's operations. */
const char *tc_fsio_op_name(int op);
void tc_truncate(const char *path, int64_t size);
void tc_write_file(const char *path, const void *data, size_t len);
void tc_copy_file(const char *from, const char *to);
/* cp -r of directories and regular files (`to` must not exist). */
void tc_copy_tree(const char *from, const char *to);

/* ------------------------------------------------------------------- data */

void tc_fill_random(void *buf, size_t n, uint64_t seed);
/* Smooth, highly compressible bytes. */
void tc_fill_compressible(void *buf, size_t n, uint64_t seed);

enum tc_fill { TC_RANDOM, TC_COMPRESSIBLE, TC_CONST };

/* A set of named tensors owning their names, shapes and buffers. */
typedef struct tc_state {
    size_t count, cap;
    ckpt_tensor *t;
} tc_state;

void tc_state_init(tc_state *s);
void tc_state_free(tc_state *s);
/* Add a tensor; `shape` is copied (may be NULL when ndim is 0).  The data
 * is filled per `fill` from `seed` (CKPT_BOOL gets 0/1 values; TC_CONST
 * fills every byte with `seed & 0xff`).  Returns the new tensor. */
ckpt_tensor *tc_state_add(tc_state *s, const char *name, ckpt_dtype dtype,
                          int ndim, const int64_t *shape, enum tc_fill fill,
                          uint64_t seed);
/* Same names, dtypes and shapes as `src`, every byte set to `byte`. */
void tc_state_like(tc_state *dst, const tc_state *src, unsigned char byte);
/* Deep copy. */
void tc_state_copy(tc_state *dst, const tc_state *src);
/* A small mixed state (a few dtypes, some scalar, ~200 KiB) whose contents
 * depend on `seed`. */
void tc_state_standard(tc_state *s, uint64_t seed);
uint64_t tc_state_bytes(const tc_state *s);
/* Fails the test naming the first tensor and byte offset that differ. */
void tc_assert_state_eq(const tc_state *got, const tc_state *want,
                        const char *what);

/* ------------------------------------------------------------ store usage */

/* Options for tests: version 1 defaults, fsync off, keep_last 0 (keep all),
 * two worker threads. */
void tc_opts(ckpt_store_options *o);
/* Open a writer on `root` with tc_opts; fails the test on error. */
ckpt_store *tc_open(const char *root);
ckpt_store *tc_open_ro(const char *root);
/* ckpt_save_begin + wait + free; returns the status (no assertion). */
int tc_save(ckpt_store *st, int64_t step, const tc_state *s,
            const char *metadata_json);
/* tc_save that must succeed. */
void tc_save_ok(ckpt_store *st, int64_t step, const tc_state *s);
/* Restore `want`'s tensors from `step` into fresh buffers and compare;
 * returns the step the report names. */
int64_t tc_restore_check(ckpt_store *st, int64_t step, const tc_state *want);
/* ckpt_store_steps as a malloc'd array the caller frees with ckpt_free. */
int64_t *tc_steps(const ckpt_store *st, size_t *count);
/* Fails unless the store's steps are exactly `want[0..n)`. */
void tc_assert_steps(const ckpt_store *st, const int64_t *want, size_t n);

/* Non-empty and not NULL. */
int tc_nonempty(const char *s);

#endif

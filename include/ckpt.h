/*
 * libckpt -- asynchronous, verified checkpoints of host and device buffers.
 *
 * This header is the whole public API and its specification.
 *
 * Model
 * -----
 * A *store* is a directory (the checkpoint root).  Each committed checkpoint
 * is a sub-directory `step-NNNNNNNNNNNN/` holding a JSON manifest and shard
 * files of independently compressed, checksummed chunks (docs/FORMAT.md).
 * A save copies the caller's tensors into a snapshot buffer and returns; the
 * chunks are compressed, hashed, written, fsynced and committed in the
 * background.  A restore walks the checkpoints from the newest down and
 * restores the first one whose every chunk verifies, reporting the ones it
 * skipped and why.
 *
 * Errors
 * ------
 * Every function that can fail returns a `ckpt_status` (0 on success, a
 * negative CKPT_E* code otherwise) and leaves a message naming what was wrong
 * (file, tensor, byte offset) in a per-thread slot read by ckpt_error_last().
 *
 * Threads
 * -------
 * A store handle may be used from several threads; calls on one store are
 * serialised internally.  At most one save per store is in flight: a new
 * save waits until the previous one is committed (or failed), so memory
 * stays bounded.  Only one process may open a root for writing; a second
 * gets CKPT_EBUSY.  Readers (CKPT_OPEN_READONLY) take no lock.
 *
 * Ownership
 * ---------
 * Whatever a function returns through a `**` out-parameter belongs to the
 * caller and is released with that type's `_free` function, which accepts
 * NULL.  `const char *` results are owned by the object they came from.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(CKPT_BUILDING)
#define CKPT_API __attribute__((visibility("default")))
#else
#define CKPT_API
#endif

/* ---------------------------------------------------------------- version */

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0
#define CKPT_VERSION_NUMBER \
    (CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH)
#define CKPT_VERSION_STRING "0.1.0"

/** Version of the library actually loaded (compare with CKPT_VERSION_NUMBER). */
CKPT_API int ckpt_version_number(void);
/** "MAJOR.MINOR.PATCH" of the loaded library. */
CKPT_API const char *ckpt_version_string(void);

/* ----------------------------------------------------------------- errors */

typedef enum ckpt_status {
    CKPT_OK = 0,
    CKPT_EINVAL = -1,     /* bad argument or option                      */
    CKPT_ENOMEM = -2,     /* out of host memory                          */
    CKPT_EIO = -3,        /* a file-system call failed                   */
    CKPT_ENOSPC = -4,     /* no space left on the device                 */
    CKPT_EBUSY = -5,      /* another writer holds the root               */
    CKPT_ECORRUPT = -6,   /* data failed verification                    */
    CKPT_ENOTFOUND = -7,  /* no such step or tensor                      */
    CKPT_ENOCKPT = -8,    /* no valid checkpoint to restore              */
    CKPT_EMISMATCH = -9,  /* dtype, shape or size differs from the data  */
    CKPT_EVERSION = -10,  /* unknown options version or format version   */
    CKPT_EDEVICE = -11,   /* the device (CUDA) reported an error         */
    CKPT_ENODEVICE = -12, /* no CUDA runtime or no device                */
    CKPT_EACCES = -13,    /* permission denied (e.g. read-only root)     */
    CKPT_EINTERNAL = -14, /* a bug in libckpt                            */
    CKPT_EINCOMPLETE = -15 /* a checkpoint file is missing or truncated  */
} ckpt_status;

/** Short, static description of a status code ("checkpoint is corrupt");
 *  "unknown status" for a value not in ckpt_status. */
CKPT_API const char *ckpt_strerror(int status);
/**
 * Stable machine name of a status code, the word the `ckpt` command and the
 * Python binding print: "ok", "invalid_argument", "no_memory", "io",
 * "no_space", "busy", "corrupt", "not_found", "no_checkpoint", "mismatch",
 * "version", "device", "no_device", "access", "internal", "incomplete".
 * NULL for a value not in ckpt_status.  Static storage; thread-safe.
 */
CKPT_API const char *ckpt_status_name(int status);

/**
 * The message left by the last failing call on this thread.  Never NULL:
 * returns "" when there was none.  Valid until the next libckpt call on the
 * same thread.
 */
CKPT_API const char *ckpt_error_last(void);
/** The status of the last failing call on this thread (CKPT_OK if none). */
CKPT_API int ckpt_error_last_status(void);
/** Forget the last error of this thread. */
CKPT_API void ckpt_error_clear(void);

/* ----------------------------------------------------------------- dtypes */

typedef enum ckpt_dtype {
    CKPT_DTYPE_INVALID = 0,
    CKPT_BOOL = 1,
    CKPT_U8, CKPT_I8, CKPT_U16, CKPT_I16, CKPT_U32, CKPT_I32, CKPT_U64, CKPT_I64,
    CKPT_F16, CKPT_BF16, CKPT_F32, CKPT_F64,
    CKPT_C64,          /* complex of two float32 */
    CKPT_C128,         /* complex of two float64 */
    CKPT_F8_E4M3,
    CKPT_F8_E5M2,
    CKPT_BYTES,        /* opaque bytes; shape counts bytes */
    CKPT_DTYPE_COUNT_
} ckpt_dtype;

/** Bytes per element (0 for CKPT_DTYPE_INVALID or unknown values). */
CKPT_API size_t ckpt_dtype_size(ckpt_dtype dtype);
/** NumPy-style name ("float32", "bfloat16", "bool"), or NULL if unknown. */
CKPT_API const char *ckpt_dtype_name(ckpt_dtype dtype);
/** Inverse of ckpt_dtype_name; CKPT_DTYPE_INVALID if unknown. */
CKPT_API ckpt_dtype ckpt_dtype_from_name(const char *name);

/* ----------------------------------------------------------------- limits */

#define CKPT_MAX_DIMS 16                 /* dimensions of a tensor            */
#define CKPT_NAME_MAX 255                /* bytes of a tensor name (no NUL)   */
#define CKPT_STEP_MAX INT64_MAX          /* largest step number               */
#define CKPT_LEVEL_MIN (-7)              /* zstd levels a store accepts       */
#define CKPT_LEVEL_MAX 22
#define CKPT_LEVEL_DEFAULT 1
#define CKPT_CHUNK_MIN 4096u             /* raw bytes per chunk               */
#define CKPT_CHUNK_MAX (1ull << 30)
#define CKPT_CHUNK_DEFAULT (4u << 20)
#define CKPT_THREADS_MAX 256             /* worker threads of a store         */
#define CKPT_KEEP_LAST_DEFAULT 3         /* committed steps kept by default   */
#define CKPT_PINNED_LIMIT_DEFAULT (1ull << 30) /* pinned host bytes           */

/* ---------------------------------------------------------------- tensors */

/** Where a tensor's memory lives. */
typedef enum ckpt_memory {
    CKPT_MEM_HOST = 0,   /* ordinary (or pinned) host memory              */
    CKPT_MEM_DEVICE = 1, /* CUDA device memory                            */
    CKPT_MEM_AUTO = 2    /* ask the CUDA runtime, if one is loaded        */
} ckpt_memory;

/**
 * One named tensor handed to a save or a restore.  `bytes` must equal the
 * product of `shape` times the dtype size (ndim == 0 is a scalar: one
 * element).  For a save `data` is read; for a restore it is written.
 */
typedef struct ckpt_tensor {
    const char *name;      /* unique in the checkpoint, 1..255 bytes, UTF-8 */
    void *data;
    uint64_t bytes;
    ckpt_dtype dtype;
    int ndim;              /* 0..CKPT_MAX_DIMS                              */
    const int64_t *shape;  /* ndim entries, each >= 0; may be NULL if ndim 0 */
    ckpt_memory memory;
} ckpt_tensor;

/* ------------------------------------------------------------------ store */

typedef struct ckpt_store ckpt_store;

/*
 * Steps: a step is a number in 0..CKPT_STEP_MAX.  Where a call takes a
 * step it also accepts one of these, each with one meaning everywhere:
 *   CKPT_LATEST  the newest committed step that passes the verification
 *                the call performs (ckpt_restore, ckpt_load: full; others
 *                take the level as an argument);
 *   CKPT_NEWEST  the newest committed step, whatever its state (to verify
 *                or inspect it, e.g. `ckpt verify` in CI).
 */
#define CKPT_LATEST ((int64_t)-1)
#define CKPT_NEWEST ((int64_t)-2)
typedef struct ckpt_report ckpt_report; /* see "reports" below */

/** Open flags. */
#define CKPT_OPEN_READONLY 0x1u  /* no lock, no writes, root must exist     */

/** What to check after a save is committed, before retention runs. */
typedef enum ckpt_verify_level {
    CKPT_VERIFY_NONE = 0,
    CKPT_VERIFY_QUICK = 1,  /* structure, sizes, index and manifest checksums */
    CKPT_VERIFY_FULL = 2    /* plus every chunk's stored and raw hashes       */
} ckpt_verify_level;

/** How device tensors are snapshotted (host tensors are always memcpy'd). */
typedef enum ckpt_snapshot_mode {
    CKPT_SNAPSHOT_HOST = 0,   /* D2H into a pinned host snapshot buffer        */
    CKPT_SNAPSHOT_DEVICE = 1, /* D2D into spare device memory, drained to host
                                 in the background; falls back to HOST when
                                 the state does not fit                       */
    CKPT_SNAPSHOT_STREAM = 2  /* through a bounded pinned pool: least memory;
                                 buffers must stay untouched until
                                 ckpt_save_wait_snapshot() returns            */
} ckpt_snapshot_mode;

#define CKPT_STORE_OPTIONS_VERSION 1
typedef struct ckpt_store_options {
    unsigned int version;       /* CKPT_STORE_OPTIONS_VERSION                  */
    unsigned int flags;         /* CKPT_OPEN_*                                 */
    int level;                  /* zstd level; 0 means the default (1)         */
    int threads;                /* worker threads; 0 means online CPUs         */
    uint64_t chunk_bytes;       /* raw bytes per chunk; 0 means 4 MiB; else a
                                   multiple of 16 in 4 KiB..1 GiB (lowered to
                                   host_memory_limit when that is smaller)    */
    uint64_t host_memory_limit; /* snapshot buffer cap in bytes; 0 means half
                                   of physical memory.  A state larger than
                                   this is saved in passes: the save call
                                   then waits for earlier chunks to drain.   */
    int keep_last;              /* committed steps to keep; 0 keeps all;
                                   default (-1) means 3.  The step just
                                   committed is never retired, so saves out
                                   of step order may leave keep_last + 1.     */
    int fsync;                  /* 1 (default) or 0: skip fsync (tests, tmpfs) */
    ckpt_verify_level verify_after_save; /* default CKPT_VERIFY_FULL           */
    ckpt_snapshot_mode snapshot_mode;    /* device tensors; default HOST       */
    uint64_t pinned_limit;      /* cap on pinned host memory for device
                                   snapshots and restores; 0: 1 GiB           */
} ckpt_store_options;

#define CKPT_STORE_OPTIONS_INIT \
    { CKPT_STORE_OPTIONS_VERSION, 0u, 0, 0, 0u, 0u, -1, 1, CKPT_VERIFY_FULL, \
      CKPT_SNAPSHOT_HOST, 0u }

/** Fill `opts` with defaults for `version`; CKPT_EVERSION if unknown. */
CKPT_API int ckpt_store_options_init(ckpt_store_options *opts, unsigned int version);

/**
 * Open (and, unless read-only, create and lock) the checkpoint root `path`.
 * `opts` may be NULL for the defaults.  A writer removes the stale
 * temporary directories of writers that died.
 * Errors: CKPT_EBUSY (another writer), CKPT_EACCES, CKPT_EIO, CKPT_EVERSION.
 */
CKPT_API int ckpt_store_open(ckpt_store **out, const char *path,
                             const ckpt_store_options *opts);

/** Wait for any save in flight, release the lock and free.  NULL is fine. */
CKPT_API void ckpt_store_free(ckpt_store *store);

/** The root path the store was opened on. */
CKPT_API const char *ckpt_store_path(const ckpt_store *store);

/**
 * Committed steps, ascending, whether or not they verify.  `*steps` is
 * allocated with malloc-compatible ckpt_free(); `*count` may be 0.
 */
CKPT_API int ckpt_store_steps(const ckpt_store *store, int64_t **steps,
                              size_t *count);

/**
 * The newest step that verifies at `level` (QUICK or FULL).
 * CKPT_ENOCKPT if none does.
 */
CKPT_API int ckpt_store_latest(ckpt_store *store, ckpt_verify_level level,
                               int64_t *step);

/** Pinned host bytes the store holds now (0 without CUDA). */
CKPT_API uint64_t ckpt_store_pinned_bytes(const ckpt_store *store);

/**
 * CKPT_OK when a CUDA runtime could be loaded and reports a device, else
 * CKPT_ENODEVICE with a message saying what was missing.  The runtime is
 * taken from the process if already loaded, else from $CKPT_CUDART_LIBRARY,
 * else libcudart.so.13, then libcudart.so.12.
 */
CKPT_API int ckpt_cuda_available(void);

/**
 * Garbage-collect the root (writer only): retire committed steps beyond the
 * newest `keep_last` (never the newest one that passes full verification)
 * and remove stale temporary directories.  With `dry_run` nothing is
 * removed, and a read-only store may be used (its temporary directories
 * are listed although a live writer may still own them).  Each (would-be) removal is listed in `*report` (may be NULL) as
 * an entry with status CKPT_OK, its step (-1 for a temporary directory) and
 * its directory name in `file`.
 */
/* keep_last must be >= 1 here (CKPT_EINVAL otherwise). */
CKPT_API int ckpt_store_gc(ckpt_store *store, int keep_last, int dry_run,
                           ckpt_report **report);

/** Free memory returned by libckpt (buffers from ckpt_load, step lists). */
CKPT_API void ckpt_free(void *ptr);

/* ------------------------------------------------------------------- save */

typedef struct ckpt_save ckpt_save;

#define CKPT_SAVE_OPTIONS_VERSION 1
typedef struct ckpt_save_options {
    unsigned int version;       /* CKPT_SAVE_OPTIONS_VERSION                   */
    const char *metadata_json;  /* caller's JSON value stored in the manifest;
                                   NULL for none                               */
    void *cuda_stream;          /* cudaStream_t the device tensors were
                                   written on (NULL: legacy default stream)    */
} ckpt_save_options;

#define CKPT_SAVE_OPTIONS_INIT { CKPT_SAVE_OPTIONS_VERSION, NULL, NULL }

CKPT_API int ckpt_save_options_init(ckpt_save_options *opts, unsigned int version);

/**
 * Begin saving `count` tensors as checkpoint `step` (>= 0).  Returns once
 * every tensor has been copied into the snapshot buffer: from then on the
 * caller may change its buffers.  Compression, hashing, writing and the
 * commit run in the background; collect the result with ckpt_save_wait().
 * If a previous save is still in flight this first waits for it.
 * A step that already exists is replaced atomically when this one commits.
 * `opts` may be NULL.
 */
CKPT_API int ckpt_save_begin(ckpt_save **out, ckpt_store *store, int64_t step,
                             const ckpt_tensor *tensors, size_t count,
                             const ckpt_save_options *opts);

/**
 * Wait until the save is durable and committed (CKPT_OK) or has failed (its
 * status and message).  May be called more than once and from any thread.
 */
CKPT_API int ckpt_save_wait(ckpt_save *save);

/**
 * Block the CPU until the snapshot copy is complete: from then on the
 * caller may overwrite its tensors (host ones are already free when
 * ckpt_save_begin returns; device ones are copied asynchronously).
 */
CKPT_API int ckpt_save_wait_snapshot(ckpt_save *save);

/**
 * Make the CUDA stream `stream` wait, on the GPU, until the snapshot copy is
 * complete, without blocking the CPU: enqueue work that overwrites the saved
 * device tensors after this.  A no-op for saves of host tensors only.
 * Exception: a CKPT_SNAPSHOT_STREAM save of a state larger than the pinned
 * pool copies in passes on a background thread, and this blocks the CPU
 * until the last pass is queued.
 */
CKPT_API int ckpt_save_fence(ckpt_save *save, void *cuda_stream);

/** Non-blocking: 1 when the save has finished (either way), else 0. */
CKPT_API int ckpt_save_done(ckpt_save *save);

typedef struct ckpt_save_stats {
    int64_t step;
    uint64_t raw_bytes;     /* bytes handed in                                */
    uint64_t stored_bytes;  /* bytes in shard files (frames + index)          */
    uint64_t chunks;
    double stall_s;         /* time the caller spent in ckpt_save_begin       */
    double persist_s;       /* from begin returning to commit (incl. verify)  */
} ckpt_save_stats;

/** Statistics; final once ckpt_save_wait() has returned. */
CKPT_API int ckpt_save_stats_get(const ckpt_save *save, ckpt_save_stats *stats);

/** Wait for the save (if still running) and free the handle.  NULL is fine. */
CKPT_API void ckpt_save_free(ckpt_save *save);

/** ckpt_save_begin + ckpt_save_wait + ckpt_save_free. */
CKPT_API int ckpt_save_sync(ckpt_store *store, int64_t step, const ckpt_tensor *tensors,
                       size_t count, const ckpt_save_options *opts);

/* ---------------------------------------------------------------- reports */

/**
 * A report lists problems: for a restore, the newer checkpoints that were
 * skipped and why; for a verify, every problem found.
 */
typedef struct ckpt_problem {
    int64_t step;        /* checkpoint the problem is in                   */
    int status;          /* CKPT_E* classifying it                          */
    const char *message; /* full sentence naming what was wrong             */
    const char *file;    /* file name inside the step directory, or ""      */
    const char *tensor;  /* tensor name, or ""                              */
    int64_t offset;      /* byte offset in `file`, or -1                    */
} ckpt_problem;

/** Step restored or verified (-1 if none). */
CKPT_API int64_t ckpt_report_step(const ckpt_report *report);
CKPT_API size_t ckpt_report_count(const ckpt_report *report);
/** Problem `i` (< count), owned by the report. */
CKPT_API const ckpt_problem *ckpt_report_get(const ckpt_report *report, size_t i);
CKPT_API void ckpt_report_free(ckpt_report *report);

/* ---------------------------------------------------------------- restore */


#define CKPT_RESTORE_OPTIONS_VERSION 1
typedef struct ckpt_restore_options {
    unsigned int version;     /* CKPT_RESTORE_OPTIONS_VERSION                  */
    int allow_missing;        /* 1: tensors absent from the checkpoint are
                                 left untouched instead of CKPT_ENOTFOUND      */
    void *cuda_stream;        /* stream for H2D copies into device tensors    */
} ckpt_restore_options;

#define CKPT_RESTORE_OPTIONS_INIT { CKPT_RESTORE_OPTIONS_VERSION, 0, NULL }

CKPT_API int ckpt_restore_options_init(ckpt_restore_options *opts,
                                       unsigned int version);

/**
 * Restore `count` caller buffers, matched by name, from checkpoint `step`, or
 * with CKPT_LATEST from the newest one that fully verifies.  Every chunk is
 * verified.  With CKPT_LATEST a corrupt or incomplete checkpoint is skipped
 * for the next older one and recorded in `*report` (may be NULL).  A dtype,
 * shape or size that differs from the checkpoint is CKPT_EMISMATCH and an
 * unknown name CKPT_ENOTFOUND: those are the caller's errors, not reasons to
 * fall back.  On failure the buffers' contents are unspecified.
 * Returns CKPT_ENOCKPT when no checkpoint could be restored.
 */
CKPT_API int ckpt_restore(ckpt_store *store, int64_t step, const ckpt_tensor *tensors,
                          size_t count, const ckpt_restore_options *opts,
                          ckpt_report **report);

/* ----------------------------------------------------------------- verify */

/**
 * Verify checkpoint `step` (CKPT_LATEST: the newest committed one) at
 * `level`.  CKPT_OK if it is good; CKPT_ECORRUPT if a byte is wrong,
 * CKPT_EINCOMPLETE if a file is missing or truncated, CKPT_EVERSION if it
 * was written by a newer format, CKPT_ENOTFOUND if there is no such step.
 * Every problem found goes to `*report` (may be NULL).
 */
CKPT_API int ckpt_verify(ckpt_store *store, int64_t step, ckpt_verify_level level,
                         ckpt_report **report);

/* ------------------------------------------------------------- checkpoint */

/** One committed checkpoint opened for reading. */
typedef struct ckpt_checkpoint ckpt_checkpoint;

/**
 * Open checkpoint `step` for reading, verified at `level`.
 *
 * `step` is a step number, CKPT_LATEST (the newest step that passes
 * `level`, skipping damaged newer ones) or CKPT_NEWEST (the newest
 * committed step; an error if it does not pass `level`).  `level` is
 * CKPT_VERIFY_QUICK (manifest checksum and schema, every shard's header,
 * trailer and index) or CKPT_VERIFY_FULL (also every chunk's hashes: reads
 * the whole step once).
 *
 * Returns CKPT_OK and `*out` (free with ckpt_checkpoint_free() before the
 * store is freed); CKPT_EINVAL (NULL argument, bad level or step),
 * CKPT_ENOTFOUND (no such step), CKPT_ENOCKPT (no step, or none passes,
 * for CKPT_LATEST / CKPT_NEWEST), CKPT_ECORRUPT, CKPT_EINCOMPLETE,
 * CKPT_EVERSION (the step failed `level`), CKPT_EIO, CKPT_EACCES,
 * CKPT_ENOMEM.  Waits for a save in flight first.  Thread-safe.
 */
CKPT_API int ckpt_checkpoint_open(ckpt_checkpoint **out, ckpt_store *store,
                                  int64_t step, ckpt_verify_level level);
CKPT_API void ckpt_checkpoint_free(ckpt_checkpoint *ckpt);

CKPT_API int64_t ckpt_checkpoint_step(const ckpt_checkpoint *ckpt);
/** Absolute path of the step directory. */
CKPT_API const char *ckpt_checkpoint_path(const ckpt_checkpoint *ckpt);
CKPT_API size_t ckpt_checkpoint_tensor_count(const ckpt_checkpoint *ckpt);

typedef struct ckpt_tensor_info {
    const char *name;
    ckpt_dtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    uint64_t bytes;         /* raw bytes                                   */
    uint64_t stored_bytes;  /* bytes of its frames in the shard            */
    uint64_t chunks;
} ckpt_tensor_info;

/** Describe tensor `i` (< count).  Strings are owned by the checkpoint. */
CKPT_API int ckpt_checkpoint_tensor(const ckpt_checkpoint *ckpt, size_t i,
                                    ckpt_tensor_info *info);
/** Find a tensor by name; CKPT_ENOTFOUND if absent. */
CKPT_API int ckpt_checkpoint_find(const ckpt_checkpoint *ckpt, const char *name,
                                  size_t *index);

/** The caller's metadata as JSON text ("null" when none was given). */
CKPT_API const char *ckpt_checkpoint_metadata(const ckpt_checkpoint *ckpt);
/** The environment record as JSON text. */
CKPT_API const char *ckpt_checkpoint_env(const ckpt_checkpoint *ckpt);
/** The whole manifest as JSON text, as stored. */
CKPT_API const char *ckpt_checkpoint_manifest(const ckpt_checkpoint *ckpt);
/** Unix time (seconds) at which the save began. */
CKPT_API double ckpt_checkpoint_time(const ckpt_checkpoint *ckpt);
/**
 * Statistics recorded by the save: raw, stored bytes, chunks, stall_s, and
 * persist_s measured up to writing the manifest (fsync and rename follow).
 */
CKPT_API int ckpt_checkpoint_stats(const ckpt_checkpoint *ckpt, ckpt_save_stats *stats);

/**
 * Read tensor `name` into `dst` (exactly `bytes` bytes of host memory),
 * verifying every chunk.
 */
CKPT_API int ckpt_checkpoint_read(ckpt_checkpoint *ckpt, const char *name, void *dst,
                                  uint64_t bytes);

/**
 * Load tensor `name` of checkpoint `step` into a new host buffer released
 * with ckpt_free().  CKPT_LATEST means the newest step that passes full
 * verification (so that tensors loaded one at a time come from one valid
 * step; this reads the whole step once).  `info` (may be NULL) receives its
 * description; its name points into nothing after return, so it is set NULL.
 */
CKPT_API int ckpt_load(ckpt_store *store, int64_t step, const char *name,
                       void **data, uint64_t *bytes, ckpt_tensor_info *info);

/* ------------------------------------------------------------- preemption */

/**
 * Exit code a job should use after saving because of a preemption signal, so
 * that wrappers (examples/resume.sh, Slurm requeue) know to restart it.
 * 75 is EX_TEMPFAIL from sysexits.h.
 */
#define CKPT_EXIT_PREEMPTED 75

/**
 * Watch `signals` (`count` of them; NULL/0 means SIGTERM and SIGUSR1): each
 * arrival sets a flag, in an async-signal-safe way, that the training loop
 * polls with ckpt_preempt_requested(), then saves, waits and exits with
 * CKPT_EXIT_PREEMPTED.  Process-wide: the one piece of global state besides
 * the CUDA runtime loader, since signals are.
 */
CKPT_API int ckpt_preempt_watch(const int *signals, size_t count);
/** The number of the first watched signal received since the last reset, or 0. */
CKPT_API int ckpt_preempt_requested(void);
/** Clear the flag. */
CKPT_API void ckpt_preempt_reset(void);
/** Restore the signal dispositions in force before ckpt_preempt_watch(). */
CKPT_API void ckpt_preempt_unwatch(void);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_H */

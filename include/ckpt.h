/*
 * libckpt -- asynchronous, verified checkpoints of host and device buffers.
 *
 * This header is the whole public API and its specification.
 *
 * Model
 * -----
 * A *store* (ckpt_store) is a directory, the checkpoint root.  Each committed
 * checkpoint is a sub-directory `step-NNNNNNNNNNNN/` holding a JSON manifest
 * and shard files of independently compressed, checksummed chunks
 * (docs/FORMAT.md).  A save (ckpt_save) copies the caller's tensors into a
 * snapshot buffer and returns; the chunks are compressed, hashed, written,
 * fsynced, verified and committed in the background, after which the
 * oldest steps beyond the store's keep_last are retired (renamed away before
 * the save is over; their files deleted by a store worker after it).  A
 * restore walks
 * the checkpoints from the newest down and restores the first one whose
 * every chunk it reads verifies, reporting the ones it skipped and why (a
 * ckpt_report).  A checkpoint handle (ckpt_checkpoint) reads one committed
 * step tensor by tensor; ckpt_verify checks one; ckpt_store_gc retires old
 * steps and removes what dead writers left behind.
 *
 * Errors
 * ------
 * Every function that can fail returns a `ckpt_status` (0 on success, a
 * negative CKPT_E* code otherwise) and leaves a message naming what was wrong
 * (file, tensor, byte offset) in a per-thread slot read by ckpt_error_last().
 * A successful call need not clear that slot.  Each function's comment lists
 * the statuses it returns.  A failed file-system call is mapped from errno:
 * ENOSPC, EDQUOT -> CKPT_ENOSPC; EACCES, EPERM, EROFS -> CKPT_EACCES;
 * ENOMEM -> CKPT_ENOMEM; ENOENT -> CKPT_ENOTFOUND (a file missing from a
 * step is CKPT_EINCOMPLETE instead); any other -> CKPT_EIO.
 *
 * Threads
 * -------
 * A store handle may be used from several threads; calls on one store are
 * serialised by an internal mutex, so a long call (a restore, a full verify,
 * a gc) delays the others on that store.  The calls that read committed
 * steps (ckpt_store_latest, ckpt_store_gc, ckpt_restore, ckpt_verify,
 * ckpt_checkpoint_open, ckpt_load) first wait for the save in flight;
 * ckpt_store_steps and ckpt_checkpoint_read do not (ckpt_store_wait does
 * only that).  At most one save per
 * store is in flight: a new save waits until the previous one is committed
 * (or failed), so memory stays bounded.  Only one store handle at a time, in
 * this or any other process, may open a root for writing; a second gets
 * CKPT_EBUSY.  Readers (CKPT_OPEN_READONLY) take no lock.
 *
 * Safe from any thread at any time: the version, status, dtype and
 * preemption functions, ckpt_free() and ckpt_cuda_available(); the error
 * functions act on the calling thread's own slot.  The functions of one
 * save handle, of one checkpoint and of one report may be called from
 * several threads at once.  A `_free` function must not run concurrently
 * with any other call on the object it frees.
 *
 * A child made by fork() (a data-loading worker) inherits the bytes of
 * its parent's stores, saves and checkpoints but not their threads, nor
 * the locks their threads held: there every call on them that returns a
 * status returns CKPT_EINVAL at once, with a message saying so (the
 * accessors that return a value, such as ckpt_checkpoint_step or
 * ckpt_checkpoint_metadata, read the inherited bytes; ckpt_save_done
 * returns 1: nothing is in flight in the child), and their `_free` functions let
 * go of nothing (ckpt_store_free closes the child's copy of the write
 * lock).  The child opens a store of its own; the parent's go on working.
 *
 * Ownership
 * ---------
 * Whatever a function returns through a `**` out-parameter belongs to the
 * caller and is released with that type's `_free` function (ckpt_free() for
 * the step list of ckpt_store_steps and the buffer of ckpt_load), which
 * accepts NULL.  On failure the caller owns nothing, except the report that
 * ckpt_restore, ckpt_verify and ckpt_store_gc hand out also when they fail.
 * A call that rejects its arguments with CKPT_EINVAL may leave its
 * out-parameters unchanged: initialise them to NULL.  `const char *` results
 * are owned by the object they came from and live as long as it; those of
 * the version, status and dtype functions are static; ckpt_error_last()'s
 * lives until the next libckpt call on the thread.
 *
 * Lifetimes: a checkpoint handle borrows its store and must be freed before
 * the store.  A save handle may outlive its store: ckpt_store_free() waits
 * for the save in flight, after which the handle's functions (wait, done,
 * wait_snapshot, fence, stats_get, free) still work without the store.  A
 * report refers to nothing else.  The tensor descriptors, names, options
 * and metadata passed to a call need only live during that call; the
 * tensors' buffers, see ckpt_save_begin().
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions libckpt exports. */
#if defined(__GNUC__) && defined(CKPT_BUILDING)
#define CKPT_API __attribute__((visibility("default")))
#else
#define CKPT_API
#endif

/* ---------------------------------------------------------------- version */

/* Version of this header. */
#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0
#define CKPT_VERSION_NUMBER \
    (CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH)
#define CKPT_VERSION_STRING "0.1.0"

/** Version of the library actually loaded (compare with CKPT_VERSION_NUMBER).
 *  Thread-safe. */
CKPT_API int ckpt_version_number(void);
/** "MAJOR.MINOR.PATCH" of the loaded library.  Static storage; thread-safe. */
CKPT_API const char *ckpt_version_string(void);

/* ----------------------------------------------------------------- errors */

/** What a call returns: CKPT_OK, or why it failed (see "Errors" above). */
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
    CKPT_EINCOMPLETE = -15, /* a checkpoint file is missing or truncated */
    CKPT_EPEER = -16      /* another rank failed, died or did not answer
                             within the store's timeout_ms (multi-rank) */
} ckpt_status;

/** Short, static description of a status code ("checkpoint is corrupt");
 *  "unknown status" for a value not in ckpt_status.  Thread-safe. */
CKPT_API const char *ckpt_strerror(int status);
/**
 * Stable machine name of a status code, the word the `ckpt` command and the
 * Python binding print: "ok", "invalid_argument", "no_memory", "io",
 * "no_space", "busy", "corrupt", "not_found", "no_checkpoint", "mismatch",
 * "version", "device", "no_device", "access", "internal", "incomplete",
 * "peer".
 * NULL for a value not in ckpt_status.  Static storage; thread-safe.
 */
CKPT_API const char *ckpt_status_name(int status);

/**
 * The message left by the last failing call on this thread.  Never NULL:
 * returns "" when there was none or after ckpt_error_clear().  Valid until
 * the next libckpt call on the same thread.  Read it right after a call
 * failed: a successful call may leave an older message in place or clear it.
 */
CKPT_API const char *ckpt_error_last(void);
/** The status of the last failing call on this thread (CKPT_OK if none);
 *  the same caveat as for ckpt_error_last() applies. */
CKPT_API int ckpt_error_last_status(void);
/** Forget the last error of this thread (status CKPT_OK, message ""). */
CKPT_API void ckpt_error_clear(void);

/* ----------------------------------------------------------------- dtypes */

/** Element type of a tensor.  The values are stored in manifests by name
 *  (ckpt_dtype_name), not by number. */
typedef enum ckpt_dtype {
    CKPT_DTYPE_INVALID = 0, /* no dtype: rejected wherever one is needed */
    CKPT_BOOL = 1,
    CKPT_U8, CKPT_I8, CKPT_U16, CKPT_I16, CKPT_U32, CKPT_I32, CKPT_U64, CKPT_I64,
    CKPT_F16, CKPT_BF16, CKPT_F32, CKPT_F64,
    CKPT_C64,          /* complex of two float32 */
    CKPT_C128,         /* complex of two float64 */
    CKPT_F8_E4M3,
    CKPT_F8_E5M2,
    CKPT_BYTES,        /* opaque bytes; shape counts bytes */
    CKPT_DTYPE_COUNT_  /* number of values above; not a dtype */
} ckpt_dtype;

/** Bytes per element (0 for CKPT_DTYPE_INVALID or unknown values).
 *  Thread-safe, as are the two functions below. */
CKPT_API size_t ckpt_dtype_size(ckpt_dtype dtype);
/**
 * NumPy-style name, or NULL if unknown: "bool", "uint8", "int8", "uint16",
 * "int16", "uint32", "int32", "uint64", "int64", "float16", "bfloat16",
 * "float32", "float64", "complex64", "complex128", "float8_e4m3fn",
 * "float8_e5m2", "bytes".  Static storage.
 */
CKPT_API const char *ckpt_dtype_name(ckpt_dtype dtype);
/** Inverse of ckpt_dtype_name (exact, case-sensitive match);
 *  CKPT_DTYPE_INVALID if unknown or NULL. */
CKPT_API ckpt_dtype ckpt_dtype_from_name(const char *name);

/* ----------------------------------------------------------------- limits */

/*
 * Named limits.  Tensor descriptors are checked against them by
 * ckpt_save_begin and ckpt_restore, store options by ckpt_store_open
 * (CKPT_EINVAL when out of range).  A _DEFAULT is what 0 stands for in
 * ckpt_store_options (-1 for keep_last).
 */
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

/**
 * Where a tensor's memory lives.  CKPT_MEM_DEVICE needs a CUDA runtime
 * (CKPT_ENODEVICE without one); a pointer the runtime reports as pinned host
 * memory is then handled as host memory, one it reports as ordinary host
 * memory is CKPT_EINVAL.  CKPT_MEM_AUTO asks the runtime only when one is
 * already in the process or named by $CKPT_CUDART_LIBRARY; otherwise it
 * means CKPT_MEM_HOST.  A tensor of 0 bytes is always host memory.
 * After a sticky CUDA error (a fault in any kernel of the process, a lost
 * device) every CUDA call fails until the process exits, asking too:
 * tensors declared CKPT_MEM_HOST still save and restore then, those
 * declared CKPT_MEM_AUTO fail with CKPT_EDEVICE saying so.
 */
typedef enum ckpt_memory {
    CKPT_MEM_HOST = 0,   /* ordinary (or pinned) host memory              */
    CKPT_MEM_DEVICE = 1, /* CUDA device memory                            */
    CKPT_MEM_AUTO = 2    /* ask the CUDA runtime, if one is loaded        */
} ckpt_memory;

/**
 * One named tensor handed to a save or a restore.  `bytes` must equal the
 * product of `shape` times the dtype size (ndim == 0 is a scalar: one
 * element).  For a save `data` is read; for a restore it is written.  Every
 * rule in the field comments is checked (CKPT_EINVAL), and names must be
 * unique among the tensors of one call.  libckpt sees the data as `bytes`
 * contiguous bytes and stores them as they are.
 */
typedef struct ckpt_tensor {
    const char *name;      /* unique in the checkpoint, 1..255 bytes, UTF-8 */
    void *data;            /* the bytes; may be NULL only if `bytes` is 0   */
    uint64_t bytes;        /* size of `data` in bytes                       */
    ckpt_dtype dtype;      /* element type; not CKPT_DTYPE_INVALID          */
    int ndim;              /* 0..CKPT_MAX_DIMS                              */
    const int64_t *shape;  /* ndim entries, each >= 0, whose nonzero ones times
                              the dtype size stay within 2^63-1 bytes (as
                              docs/FORMAT.md, also when one is 0); may be
                              NULL if ndim 0 */
    ckpt_memory memory;    /* where `data` lives                            */
} ckpt_tensor;

/* ------------------------------------------------------------------ store */

/** An open checkpoint root (see "Model" above). */
typedef struct ckpt_store ckpt_store;

/*
 * Steps: a step is a number in 0..CKPT_STEP_MAX.  Where a call takes a
 * step it also accepts one of these, each with one meaning everywhere:
 *   CKPT_LATEST  the newest committed step that passes the verification
 *                the call performs (ckpt_load: full; ckpt_restore: quick,
 *                plus every chunk it restores; others take the level as
 *                an argument);
 *   CKPT_NEWEST  the newest committed step, whatever its state (to verify
 *                or inspect it, e.g. `ckpt verify` in CI).
 * ckpt_verify, ckpt_checkpoint_open and ckpt_load accept both, ckpt_restore
 * only CKPT_LATEST, ckpt_save_begin neither.
 */
#define CKPT_LATEST ((int64_t)-1)
#define CKPT_NEWEST ((int64_t)-2)
typedef struct ckpt_report ckpt_report; /* see "reports" below */
typedef struct ckpt_checkpoint ckpt_checkpoint; /* see "checkpoint" below */

/** Open flags.  A read-only store never writes to the root: ckpt_save_begin
 *  and ckpt_store_gc without dry_run fail with CKPT_EACCES. */
#define CKPT_OPEN_READONLY 0x1u  /* no lock, no writes, root must exist     */
/* Accept a root shared by a group: owned by another member or writable by
 * the group, and steps written by its members.  The groups trusted are the
 * root's own group and those its POSIX ACL lets write (a project shared by
 * an ACL), for a writer only those it is a member of (a reader trusts the
 * root's owner anyway); their members are the users the system's group
 * databases give them (getgrouplist); a POSIX ACL may let only members
 * and those groups write.  A directory above the root may be writable by
 * a group the caller is a member of.  (The superuser trusts every user
 * and group with it: an admin's `ckpt gc --trust-group`.)  Without it, a writer
 * refuses a root it does not own or that others may write, and every call
 * refuses (restore: skips, reporting why) a step directory or file owned
 * by anyone but the caller, the root's owner or root, or writable by
 * others: CKPT_EACCES.  A world-writable root or step is never accepted.
 * A writer also refuses a path to its root that goes through a symbolic
 * link owned by anyone but the caller or root, unless its owner alone may
 * write the directory holding it (with this flag: unless that directory is
 * not writable by every user, as /tmp is). */
#define CKPT_OPEN_TRUST_GROUP 0x2u
/* Leave the process's command line out of each manifest's environment
 * record: its `command_line` member says "(not recorded)" (it is recorded
 * by default; files are created 0640, directories
 * 0750, or 0600 and 0700 when the root's group is not the owner's private
 * group: never readable by other users unless the group is trusted). */
#define CKPT_OPEN_NO_CMDLINE 0x4u
/* Allow saving a step lower than the newest committed one (going back to
 * an earlier point of the same run): once it commits, every committed step
 * above it is retired.  Without it such a save fails with CKPT_EINVAL,
 * because restore(LATEST) would go on choosing the higher, older steps. */
#define CKPT_OPEN_REWIND 0x8u
/* Compress every chunk (zstd at `level`, stored raw only where that would
 * not shrink it): the smallest files.  Without it each chunk is compressed
 * or stored raw, whichever lets the save commit sooner from the rates
 * measured so far (the cores' and the disk's; zstd's rate and ratio on a
 * sample of each save's first chunks): slow storage gets every chunk
 * compressed, storage faster than the cores gets some or all raw. */
#define CKPT_OPEN_COMPRESS_ALL 0x10u
/* Page cache.  By default a save of 512 MiB or more, or one whose bytes
 * exceed half the memory the kernel has free, drops its pages from the
 * page cache as they reach the disk (written back, read back and
 * checked): the kernel would otherwise evict other pages (the job's data,
 * other users') to keep a checkpoint that is only read again after a
 * crash, and allocating that much page cache slows a save several times
 * over under memory pressure, and on VMs whose free memory the host takes
 * back (1 GiB: 2.6-4.3 s kept, 1.0-1.1 s dropped).  Smaller saves stay
 * cached, so a restore soon after reads from the cache.  KEEP_CACHE always keeps them; DROP_CACHE
 * always drops them (a polite tenant of a shared server).  Setting both is
 * CKPT_EINVAL.  Saves with verify_after_save CKPT_VERIFY_FULL keep them
 * (they read everything back at once). */
#define CKPT_OPEN_KEEP_CACHE 0x20u
#define CKPT_OPEN_DROP_CACHE 0x40u

/**
 * How much of a checkpoint is checked (ckpt_verify, ckpt_store_latest,
 * ckpt_checkpoint_open).  As the store option verify_after_save: what a save
 * checks in its temporary directory once written, before the commit (a
 * failure aborts the save, committing nothing) and so before retention.
 */
typedef enum ckpt_verify_level {
    CKPT_VERIFY_NONE = 0,   /* nothing (verify_after_save only)               */
    CKPT_VERIFY_QUICK = 1,  /* structure, sizes, index and manifest checksums */
    CKPT_VERIFY_FULL = 2,   /* plus every chunk's stored and raw hashes       */
    CKPT_VERIFY_STORED = 3  /* verify_after_save only (the default): QUICK,
                               and every chunk read back from the shard as
                               it is written and checked against its stored
                               hash; no decompression (docs/FORMAT.md)     */
} ckpt_verify_level;

/** How device tensors are snapshotted (host tensors are always memcpy'd). */
typedef enum ckpt_snapshot_mode {
    CKPT_SNAPSHOT_HOST = 0,   /* D2H into a pinned host snapshot buffer; device
                                 tensors beyond pinned_limit (or more than
                                 about a hundred) go through a pinned pool
                                 in passes on a background thread (see
                                 ckpt_save_begin)                             */
    CKPT_SNAPSHOT_DEVICE = 1, /* D2D into spare device memory, drained to host
                                 in the background; falls back to HOST when
                                 the state does not fit (in device memory,
                                 or in host_memory_limit)                     */
    CKPT_SNAPSHOT_STREAM = 2  /* as HOST: the pinned pool is at most
                                 pinned_limit; kept for compatibility         */
} ckpt_snapshot_mode;

/* ------------------------------------------------------------------ ranks */

/*
 * Several processes ("ranks"), one checkpoint (docs/SCALING.md).  Every
 * rank opens the same root (a shared file system, or a local one when all
 * ranks run on one node) with its rank, the world size and a coordinator:
 * the job's own distributed runtime, reached through the callbacks below
 * (libckpt has no network layer of its own).  include/ckpt_mpi.h makes one
 * from an MPI communicator; the Python binding has one for
 * torch.distributed.
 *
 * Collective calls: on a store with world_size > 1, ckpt_store_open,
 * ckpt_save_begin (and ckpt_save_sync) and ckpt_restore with CKPT_LATEST
 * must be called by every rank, in the same order, with the same step.
 * A rank that refuses its part before the call (a binding that cannot
 * describe its state) calls ckpt_save_refuse or ckpt_restore_refuse in its
 * place, so the others fail at once with its reason and stay in step.
 * Each rank saves its own tensors (names unique across the job) into its
 * own shard file, rank-RRRRR.shard, in the step's shared temporary
 * directory, and writes and fsyncs its part manifest; when every rank has
 * reported its part durable, rank 0 writes the global manifest covering
 * every rank, fsyncs it and renames the directory into place (the commit),
 * then tells every rank the outcome: every rank's ckpt_save_wait returns
 * the same status.  A rank that fails makes every rank's save fail (its
 * status, with a message naming the rank); a rank that dies or hangs makes
 * the others fail with CKPT_EPEER once a collective has waited timeout_ms.
 * A rank that is only slow (a larger shard, a slower disk) is waited for:
 * while they write their shards and parts (and read on restore), the ranks
 * meet every timeout_ms / 4 to say whether they are done (an extra
 * allreduce_min each time, from a thread of libckpt's), so timeout_ms
 * bounds how long a rank that died or stopped goes unnoticed, not how much
 * longer one rank may take than another; a rank whose disk hangs for good
 * keeps the others waiting, as its own save waits.  The meetings start in
 * ckpt_save_begin (which writes when a state exceeds host_memory_limit),
 * so the ranks' calls to it must come within timeout_ms of each other.
 * A rank that dies before its part is durable, or a late one, leaves the
 * step uncommitted, and the next writer's open removes the temporary
 * directory; but when rank 0 dies (or its answer is lost) after the
 * rename, the step is committed although the other ranks' waits returned
 * CKPT_EPEER: after CKPT_EPEER the outcome is unknown to that rank (its
 * message says so; rank 0's says when it did commit, as when another rank
 * died before the answer reached it), and ckpt_store_latest or the next
 * restore tells.  After a timeout the coordinator is out of step
 * (a collective may still be pending): every later collective call on the
 * store fails with CKPT_EPEER; open a new store with a fresh coordinator.
 *
 * Rank 0 takes the writer lock (one per job, not per process) and tells
 * the others; they check that ROOT/.lock names rank 0 (so the root is the
 * same directory for all) and take no lock themselves.  A second job on
 * the same root gets CKPT_EBUSY on every rank.  Retention and gc run on
 * rank 0 only.
 *
 * ckpt_restore(CKPT_LATEST) agrees: every rank restores the newest step
 * that every rank could restore (each verifies the chunks of the tensors
 * it restores; a rank other than 0 whose tensors are all in its own part
 * reads only that part and its shard), found with all-reduces (minimum); a rank that had to skip
 * a newer step for a reason found on another rank lists it in its report
 * with that rank's reason.  Tensors are looked up by name in the global
 * manifest, so a rank may restore or load (ckpt_load, ckpt_checkpoint_read)
 * tensors that another rank saved, also with another world size:
 * resharding (docs/SCALING.md has the recipe).  Other reading calls are
 * local to the rank.
 */

#define CKPT_COORDINATOR_VERSION 1
/**
 * The collectives libckpt needs, supplied by the job's runtime.  Each
 * callback is a collective on a channel reserved for libckpt (a duplicated
 * communicator, a separate process group): every rank calls it in the same
 * order.  libckpt calls them from the caller's thread in ckpt_store_open,
 * ckpt_save_begin and ckpt_restore, and from the store's background thread
 * that finishes a save, never two at once for one store.  Stores may share
 * a channel only if their collective calls never overlap: a save's
 * background thread runs collectives until it commits, so wait for it
 * (ckpt_store_wait) before another store's collective call, or a rank may
 * match one store's collective with the other's on another rank (the
 * Python binding waits so for the stores of one coordinator).  Each returns 0
 * on success and anything else on failure, and must give up and fail after
 * `timeout_ms` milliseconds (a rank that died must not hang the others):
 * libckpt cannot interrupt a callback, and treats one that returns late as
 * failed.  Buffers are small (at most a few hundred bytes per rank).
 */
typedef struct ckpt_coordinator {
    unsigned int version;   /* CKPT_COORDINATOR_VERSION                      */
    void *user;             /* passed to every callback                      */
    /* Wait until every rank has called it. */
    int (*barrier)(void *user, int timeout_ms);
    /* Copy `bytes` bytes of `buf` on rank `root` into `buf` on every rank. */
    int (*broadcast)(void *user, void *buf, size_t bytes, int root, int timeout_ms);
    /* Replace `*value` on every rank by the minimum over all ranks. */
    int (*allreduce_min)(void *user, int64_t *value, int timeout_ms);
    /* Rank `root` receives every rank's `bytes` bytes of `send`, in rank
     * order, in `recv` (world_size * bytes); `recv` is NULL elsewhere. */
    int (*gather)(void *user, const void *send, size_t bytes, void *recv, int root,
                  int timeout_ms);
} ckpt_coordinator;

#define CKPT_TIMEOUT_MS_DEFAULT 600000 /* per collective: 10 minutes       */

#define CKPT_STORE_OPTIONS_VERSION 2
/** Options of ckpt_store_open(); start from CKPT_STORE_OPTIONS_INIT or
 *  ckpt_store_options_init().  A value out of range is CKPT_EINVAL.
 *  Version 1 (without the fields from `rank` on) is still accepted. */
typedef struct ckpt_store_options {
    unsigned int version;       /* CKPT_STORE_OPTIONS_VERSION                  */
    unsigned int flags;         /* CKPT_OPEN_*; no other bits                  */
    int level;                  /* zstd level in CKPT_LEVEL_MIN..CKPT_LEVEL_MAX;
                                   0 means the default (1)                     */
    int threads;                /* worker threads, 1..CKPT_THREADS_MAX; 0 means
                                   online CPUs (at most CKPT_THREADS_MAX)      */
    uint64_t chunk_bytes;       /* raw bytes per chunk; 0 means 4 MiB; else a
                                   multiple of 16 in 4 KiB..1 GiB (lowered to
                                   host_memory_limit when that is smaller)    */
    uint64_t host_memory_limit; /* snapshot buffer cap in bytes; 0 means half
                                   of physical memory.  A state larger than
                                   this is saved in passes: the save call
                                   then waits for earlier chunks to drain.   */
    int keep_last;              /* committed steps to keep; 0 keeps all;
                                   default (-1) means 3; < -1 is invalid.
                                   Applied after each commit, best effort:
                                   the newest keep_last steps that open
                                   (quick verification) are kept, counting
                                   the one just committed; damaged steps
                                   newer than the oldest kept one stay,
                                   uncounted; older ones are retired.  A
                                   step of another user is never touched.
                                   A retired step is renamed away (root
                                   fsynced) before the save is over; its
                                   files are deleted in the background
                                   afterwards (ckpt_store_free and
                                   ckpt_store_gc wait for that). */
    int fsync;                  /* 1 (default) or 0: skip fsync (tests, tmpfs) */
    ckpt_verify_level verify_after_save; /* default CKPT_VERIFY_STORED         */
    ckpt_snapshot_mode snapshot_mode;    /* device tensors; default HOST       */
    uint64_t pinned_limit;      /* cap on pinned host memory for device
                                   snapshots and restores; 0: 1 GiB           */
    /* Version 2: several ranks (see "ranks" above). */
    int rank;                   /* this process, 0..world_size-1 (0 with one):
                                   its rank in the coordinator              */
    int world_size;             /* processes saving one checkpoint, at most
                                   65536; 0 or 1: this one only (then the
                                   two fields below are ignored).  Open
                                   checks both against the coordinator (its
                                   processes, their order): a mismatch is
                                   CKPT_EINVAL on every rank, naming it     */
    const ckpt_coordinator *coordinator; /* needed when world_size > 1; copied
                                   at open (`user` must live as long as the
                                   store)                                      */
    int timeout_ms;             /* how long one collective may wait; 0 means
                                   CKPT_TIMEOUT_MS_DEFAULT                    */
    const char *metrics_path;   /* NULL, or a file that, after each commit,
                                   is replaced atomically by the root's
                                   metrics (ckpt_store_metrics; for
                                   node_exporter's textfile collector: name
                                   it *.prom).  Created 0644, never through
                                   a link; a failure to write it is not the
                                   save's (it is a "metrics_failed" event in
                                   the log).  Copied at open.                */
} ckpt_store_options;

#define CKPT_STORE_OPTIONS_INIT \
    { CKPT_STORE_OPTIONS_VERSION, 0u, 0, 0, 0u, 0u, -1, 1, CKPT_VERIFY_STORED, \
      CKPT_SNAPSHOT_HOST, 0u, 0, 1, NULL, 0, NULL }

/**
 * Fill `opts` with the defaults of CKPT_STORE_OPTIONS_INIT for `version`
 * (pass CKPT_STORE_OPTIONS_VERSION).  Returns CKPT_OK; CKPT_EINVAL if
 * `opts` is NULL; CKPT_EVERSION if `version` is unknown (`opts` is left
 * unchanged).  Thread-safe.
 */
CKPT_API int ckpt_store_options_init(ckpt_store_options *opts, unsigned int version);

/**
 * Open the checkpoint root `path` (a directory, or a symbolic link to one).
 * Unless CKPT_OPEN_READONLY is set, create it if it is missing (not its
 * parents), take the writer lock (the file `.lock` in it), remove the
 * temporary directories of writers that died and put back a step one of
 * them had moved aside while replacing it.  `opts` may be NULL for the
 * defaults.  On success `*out` is a store released with ckpt_store_free().
 * A new root is created 0750 (0770 with CKPT_OPEN_TRUST_GROUP); a writer
 * refuses a root another user owns, and a reader or writer one that every
 * user may write, or that its group may write unless the group is trusted
 * (CKPT_OPEN_TRUST_GROUP) or is the owner's private group.
 *
 * With world_size > 1 this is collective (see "ranks"): rank 0 locks and
 * cleans, then every rank learns the outcome, and all fail together.
 *
 * Returns CKPT_OK; CKPT_EINVAL (NULL `out` or `path`, empty `path`, a bad
 * option, `path` is not a directory, or it is a committed step directory
 * `step-N` holding a manifest: the message names its root); CKPT_EVERSION (unknown
 * `opts->version` or coordinator version); CKPT_EPEER (another rank failed
 * to open, or a collective failed); CKPT_ENOTFOUND (a read-only root, or the parent of a
 * new root, does not exist); CKPT_EBUSY (another store handle holds the
 * writer lock); CKPT_EACCES (the root's owner or permissions, or a link
 * on the way to it, above, with a message naming them and the fix; or
 * permission denied); CKPT_ENOSPC,
 * CKPT_EIO (creating, resolving or locking the root); CKPT_ENOMEM.
 * Thread-safe.
 */
CKPT_API int ckpt_store_open(ckpt_store **out, const char *path,
                             const ckpt_store_options *opts);

/**
 * Wait for any save in flight (its outcome stays with its handle and is not
 * reported here), for the store's device copies and for the deletion of
 * steps its saves retired, release the lock and free.  NULL is fine.  Every checkpoint opened on the store must have been
 * freed before; save handles may be freed before or after.  Must not run
 * concurrently with any other call on the store.  In a child made by
 * fork() from the process that opened the store it only closes the
 * child's copy of the lock's descriptor (ckpt_store_release_after_fork)
 * and frees nothing: the store's threads did not survive fork(), and
 * waiting for them would never return.
 */
CKPT_API void ckpt_store_free(ckpt_store *store);

/**
 * In a child process made by fork() while `store` was open for writing,
 * before anything else uses it there: close the child's copy of the write
 * lock's descriptor without unlocking.  The lock (a flock, held while any
 * process holds a descriptor of it) is then the parent's alone, so a
 * data-loading worker forked from a training process does not keep the
 * root locked after the parent frees its store.  Afterwards the child
 * cannot use `store` (see Threads: calls return CKPT_EINVAL, freeing lets
 * go of nothing), whether it was open for writing or reading (then there
 * is no lock to close); the Python binding calls this for every open
 * Store, reading ones too (os.register_at_fork).
 * Only closes a descriptor: safe in a child of a multithreaded process.
 * Returns CKPT_OK; CKPT_EINVAL (NULL).
 */
CKPT_API int ckpt_store_release_after_fork(ckpt_store *store);

/** The absolute path of the root, resolved when the store was opened (NULL
 *  for a NULL store).  Owned by the store: valid until ckpt_store_free().
 *  Thread-safe. */
CKPT_API const char *ckpt_store_path(const ckpt_store *store);

/**
 * Committed steps, ascending, whether or not they verify: the directories
 * of the root named as docs/FORMAT.md says.  `*steps` is allocated with
 * malloc-compatible ckpt_free(); `*count` may be 0.  Does not wait for a
 * save in flight.  Returns CKPT_OK; CKPT_EINVAL (a NULL argument);
 * CKPT_EACCES, CKPT_ENOTFOUND (the root is gone), CKPT_EIO, CKPT_ENOMEM
 * (listing the root).  Thread-safe.
 */
CKPT_API int ckpt_store_steps(const ckpt_store *store, int64_t **steps,
                              size_t *count);

/**
 * Wait until the save in flight on `store`, if any, is committed or has
 * failed (its outcome stays with its handle and is not reported here), as
 * the calls that read committed steps do first: then ckpt_store_steps
 * lists the save a caller began.  Returns CKPT_OK; CKPT_EINVAL (NULL).
 * Thread-safe.
 */
CKPT_API int ckpt_store_wait(ckpt_store *store);

/**
 * The newest step that verifies at `level` (QUICK or FULL), in `*step`.
 * Newer steps that do not, or cannot be read for any reason, are skipped
 * silently; FULL reads each step it tries in full.  Waits for a save in
 * flight first.  Returns CKPT_OK; CKPT_ENOCKPT if none verifies (or there
 * is no step); CKPT_EINVAL (NULL `store` or `step`, another level);
 * CKPT_EACCES, CKPT_ENOTFOUND, CKPT_EIO, CKPT_ENOMEM (listing the root).
 * Thread-safe.
 */
CKPT_API int ckpt_store_latest(ckpt_store *store, ckpt_verify_level level,
                               int64_t *step);

/** Pinned host bytes the store holds now for snapshot and staging buffers
 *  (0 without CUDA, and for a NULL store).  Thread-safe. */
CKPT_API uint64_t ckpt_store_pinned_bytes(const ckpt_store *store);

/**
 * CKPT_OK when a CUDA runtime could be loaded and reports a device, else
 * CKPT_ENODEVICE with a message saying what was missing.  The runtime is
 * taken from the process if already loaded (libcudart.so.13, .12, .11.0, or
 * linked in), else from $CKPT_CUDART_LIBRARY (one path, or several
 * separated by ':'), else libcudart.so.13, .12, .11.0, newest first: a
 * runtime too new for the driver (cudaErrorInsufficientDriver) is passed
 * over for the next.  The answer is decided once
 * per process, on the first call that needs it.  Thread-safe.  In a child
 * made by fork() after the answer was CKPT_OK, CKPT_ENODEVICE (CUDA does
 * not survive fork; every device call there fails the same way).
 */
CKPT_API int ckpt_cuda_available(void);

/**
 * Garbage-collect the root: retire the committed steps older than the newest
 * `keep_last` that open (quick verification; damaged steps are not counted,
 * as for the store's keep_last option), never the newest one that passes
 * full verification (so keep_last + 1 may remain) nor a step another user
 * owns, and remove the temporary and trash directories
 * of writers that died.  Independent of the store's keep_last option.
 * Waits for a save in flight first; finding the newest valid step reads
 * steps in full, newest first.  Without `dry_run` a step that a dead writer
 * had moved aside is put back, as ckpt_store_open does (not listed).
 *
 * With `dry_run` nothing is removed, and a read-only store may be used (its
 * temporary directories are listed although a live writer may still own
 * them).  Each (would-be) removal is listed in `*report` (may be NULL) as
 * an entry with status CKPT_OK, its step (-1 for a temporary directory) and
 * its directory name in `file`.  The report is handed out also on failure,
 * listing what was removed before it.
 *
 * Returns CKPT_OK; CKPT_EINVAL (NULL `store`, `keep_last` < 1, or without
 * `dry_run` on a rank other than 0 of several, which holds no lock);
 * CKPT_EACCES (a read-only store without `dry_run`, or permission denied);
 * CKPT_EBUSY (without `dry_run`: the lock file was removed or replaced
 * while this store held it; nothing is removed); CKPT_ENOTFOUND,
 * CKPT_ENOSPC, CKPT_EIO, CKPT_ENOMEM (listing, renaming or removing; also
 * finding the newest valid step, and then nothing is removed).
 * Thread-safe.
 */
CKPT_API int ckpt_store_gc(ckpt_store *store, int keep_last, int dry_run,
                           ckpt_report **report);

/**
 * The root's event log (docs/OPERATIONS.md): a store opened for writing
 * appends one JSON object per line to ROOT/ckpt-events.jsonl for every save
 * begun, committed (with its statistics) or failed (with its error), every
 * restore (the step restored, the steps skipped and why), verify and gc;
 * the file is rotated to ckpt-events.jsonl.1 at 1 MiB.  A read-only store
 * writes nothing.  This returns the events whose "time" (Unix seconds) is
 * >= `since` (0: all), oldest first, as JSON lines text in `*text` (free
 * with ckpt_free; "" when none); lines cut short by a crash are left out.
 * Returns CKPT_OK; CKPT_EINVAL (a NULL argument); CKPT_EACCES (a log file
 * that is a link, not a regular file, or not trusted); CKPT_EIO,
 * CKPT_ENOMEM.  Thread-safe.
 */
CKPT_API int ckpt_store_events(ckpt_store *store, double since, char **text);

/**
 * The root's health in the Prometheus text format (docs/OPERATIONS.md
 * lists the metrics): the newest step that passes quick verification, its
 * age and its save's statistics, save, failure and restore counts from the
 * event log, free space and how many more checkpoints of the newest one's
 * size fit.  An event log that cannot be read (a link or FIFO in its
 * place) leaves the counters out and sets ckpt_event_log_readable to 0;
 * the rest is still reported.  `*text` is freed with ckpt_free.  Waits for
 * a save in flight first.  Returns CKPT_OK; CKPT_EINVAL (a NULL argument);
 * CKPT_EACCES, CKPT_ENOTFOUND, CKPT_EIO (reading the root), CKPT_ENOMEM.
 * Thread-safe.
 */
CKPT_API int ckpt_store_metrics(ckpt_store *store, char **text);

/**
 * The environment record a save through `store` would write into its
 * manifest now (libckpt, zstd, xxHash and jansson versions, OS, host, and
 * with a CUDA runtime in use its driver and runtime versions and GPU), as
 * compact JSON text in `*json` (free with ckpt_free), without the command
 * line.  For comparing a checkpoint's record with the current machine
 * (`ckpt doctor`).  Returns CKPT_OK; CKPT_EINVAL (a NULL argument);
 * CKPT_ENOMEM.  Thread-safe.
 */
CKPT_API int ckpt_store_environment(ckpt_store *store, char **json);

/** Free memory returned by libckpt (buffers from ckpt_load, step lists).
 *  NULL is fine.  Thread-safe. */
CKPT_API void ckpt_free(void *ptr);

/* ------------------------------------------------------------------- save */

/** One save: from ckpt_save_begin() to its commit or failure. */
typedef struct ckpt_save ckpt_save;

#define CKPT_SAVE_OPTIONS_VERSION 2
/** Options of one save; start from CKPT_SAVE_OPTIONS_INIT or
 *  ckpt_save_options_init().  Version 1 (without `frameworks_json`) is
 *  still accepted. */
typedef struct ckpt_save_options {
    unsigned int version;       /* CKPT_SAVE_OPTIONS_VERSION                   */
    const char *metadata_json;  /* caller's JSON value stored in the manifest;
                                   NULL for none; parsed during the call      */
    void *cuda_stream;          /* cudaStream_t the device tensors were
                                   written on (NULL: legacy default stream)    */
    /* Version 2.  The versions of the frameworks the caller saves from, as
     * a JSON object {name: version}, each version a string or null (a
     * component the framework lacks, e.g. a CPU-only torch's CUDA), names
     * 1..64 bytes: recorded as "frameworks" in the manifest's environment
     * record, which `ckpt doctor` compares with the current machine.  The
     * Python binding records "python", "numpy" and, when the program has
     * imported torch, "torch" and "torch.cuda" (torch.version.cuda).  NULL
     * for none; parsed during the call; anything else is CKPT_EINVAL. */
    const char *frameworks_json;
} ckpt_save_options;

#define CKPT_SAVE_OPTIONS_INIT { CKPT_SAVE_OPTIONS_VERSION, NULL, NULL, NULL }

/**
 * Fill `opts` with the defaults of CKPT_SAVE_OPTIONS_INIT for `version`
 * (CKPT_SAVE_OPTIONS_VERSION, or 1: then only the version 1 fields are
 * written).  Returns CKPT_OK; CKPT_EINVAL if `opts` is NULL; CKPT_EVERSION
 * if `version` is unknown (`opts` is left unchanged).  Thread-safe.
 */
CKPT_API int ckpt_save_options_init(ckpt_save_options *opts, unsigned int version);

/**
 * Begin saving `count` tensors (`tensors` may be NULL if `count` is 0) as
 * checkpoint `step` (0..CKPT_STEP_MAX).  If a previous save is still in
 * flight this first waits for it (its outcome stays with its handle).
 * Returns once every host tensor has been copied into the snapshot buffer
 * and every device copy is queued: from then on the caller may change its
 * host buffers.  Host tensors, pinned ones included, are copied at once,
 * not ordered after the work on `opts->cuda_stream`: a non_blocking copy
 * into a pinned host tensor must be synchronized before the save; for device buffers use ckpt_save_fence() or
 * ckpt_save_wait_snapshot().  Device tensors of one save must all be on
 * one CUDA device (the store follows it from save to save), and
 * `opts->cuda_stream` must belong to that device and must not be capturing
 * a CUDA graph.  Device tensors larger in total than pinned_limit (or
 * whose snapshot buffer, host tensors included, does not fit under it
 * beside the pinned memory the store holds already), or more
 * than about a hundred separate ones (HOST and STREAM modes), are copied
 * by a background thread through a pinned pool: the caller's thread then
 * queues no copy at all, ckpt_save_fence() blocks the CPU until the last
 * copy is queued, and the device buffers must stay untouched until then;
 * host buffers are still free when this returns.  Compression, hashing,
 * writing, verify_after_save, the commit and retention run in the
 * background; collect the result with ckpt_save_wait().  A step that
 * already exists is replaced atomically when this one commits (see
 * docs/FORMAT.md for file systems without an atomic swap).  A step below
 * the newest committed one is refused unless the store was opened with
 * CKPT_OPEN_REWIND (restore would otherwise go on choosing the higher,
 * older step: a new run belongs in a new directory).  Damaged steps above
 * do not count, since restore never takes them: a job that resumed below
 * one saves on (whether a step above is damaged comes from this store's
 * restores, else from verifying it in full, once).  On a store with
 * world_size > 1 this is collective, and a rank whose call fails still
 * tells the others (whose saves then fail with its status).  `opts` may
 * be NULL.  On success `*out` is a handle released with ckpt_save_free();
 * a failed call leaves nothing in the root.
 *
 * Returns CKPT_OK; CKPT_EINVAL (NULL `out` or `store`, a negative step, a
 * step below the newest committed one without CKPT_OPEN_REWIND, a
 * tensor breaking a rule of ckpt_tensor, a name given twice, metadata that
 * is not JSON or holds what a checkpoint cannot (an integer beyond 64 bits,
 * a real beyond a double, U+0000), a device pointer the runtime calls host memory, device
 * tensors on several CUDA devices, a capturing cuda_stream);
 * CKPT_EACCES (a read-only store, or permission denied); CKPT_EVERSION
 * (unknown `opts->version`); CKPT_ENODEVICE (device tensors and no CUDA
 * runtime); CKPT_EDEVICE; CKPT_ENOSPC, CKPT_ENOTFOUND, CKPT_EIO (creating
 * the temporary directory or shard file); CKPT_ENOMEM.  Thread-safe.
 */
CKPT_API int ckpt_save_begin(ckpt_save **out, ckpt_store *store, int64_t step,
                             const ckpt_tensor *tensors, size_t count,
                             const ckpt_save_options *opts);

/**
 * Wait until the save is durable and committed (CKPT_OK) or has failed (its
 * status, and its message as this thread's last error).  A failed save
 * committed nothing and left the earlier checkpoints as they were.  May be
 * called more than once (same result) and from any thread.  Retention after
 * the commit is best effort: its failures are not reported.
 *
 * Returns CKPT_OK; CKPT_EINVAL (NULL `save`); or the save's failure:
 * CKPT_ENOSPC, CKPT_EACCES, CKPT_ENOTFOUND, CKPT_EIO (writing, fsync or
 * commit); CKPT_EBUSY (the lock file was removed or replaced while this
 * store held it); CKPT_EPEER (multi-rank: another rank died or did not
 * answer in time; a status another rank failed with is returned as is); CKPT_EINVAL (the manifest would not be readable, e.g.
 * metadata too large); CKPT_ECORRUPT, CKPT_EINCOMPLETE (verify_after_save
 * failed); CKPT_EDEVICE (a device copy failed); CKPT_ENOMEM;
 * CKPT_EINTERNAL.
 */
CKPT_API int ckpt_save_wait(ckpt_save *save);

/**
 * Block the CPU until the snapshot copy is complete: from then on the
 * caller may overwrite its tensors (host ones are already free when
 * ckpt_save_begin returns, but for the STREAM exception there; device ones
 * are copied asynchronously; in CKPT_SNAPSHOT_DEVICE mode this waits for
 * the device-to-device copy only).  Returns at once after the save has
 * finished.  Returns CKPT_OK; CKPT_EINVAL (NULL `save`); CKPT_EDEVICE (a
 * copy failed; ckpt_save_wait reports it too, and may be the only one to).
 * Thread-safe.
 */
CKPT_API int ckpt_save_wait_snapshot(ckpt_save *save);

/**
 * Make the CUDA stream `stream` wait, on the GPU, until the snapshot copy is
 * complete, without blocking the CPU: enqueue work that overwrites the saved
 * device tensors after this.  A no-op for saves of host tensors only, and
 * once the save has finished.  NULL is the legacy default stream of the
 * device the saved tensors are on, whichever device the calling thread has
 * current (the thread's current device is left as it was, unless it has no
 * context yet: then the thread stays on the tensors' device, docs/CUDA.md).
 * Exception: a save whose device tensors go through the pinned pool (see
 * ckpt_save_begin) copies on a background thread, and this blocks the CPU
 * until the last copy is queued.  Returns CKPT_OK; CKPT_EINVAL (NULL
 * `save`); CKPT_EDEVICE (the stream cannot be made to wait).  Thread-safe.
 */
CKPT_API int ckpt_save_fence(ckpt_save *save, void *cuda_stream);

/** Non-blocking: 1 when the save has finished (either way; ckpt_save_wait
 *  then returns at once), else 0.  1 for NULL, and in a child made by
 *  fork() (see Threads).  Thread-safe. */
CKPT_API int ckpt_save_done(ckpt_save *save);

/** Statistics of a save (ckpt_save_stats_get) or, as recorded in its
 *  manifest, of a committed checkpoint (ckpt_checkpoint_stats). */
typedef struct ckpt_save_stats {
    int64_t step;           /* the step saved                                 */
    uint64_t raw_bytes;     /* bytes handed in                                */
    uint64_t stored_bytes;  /* size of the shard files (header, frames, index,
                               trailer)                                       */
    uint64_t chunks;        /* chunks written                                 */
    double stall_s;         /* time the caller spent in ckpt_save_begin, after
                               waiting for any previous save                  */
    double persist_s;       /* from begin returning until the save finished
                               (verify, commit and retention included; not
                               the deletion of retired steps' files, which
                               runs after it)                                 */
} ckpt_save_stats;

/**
 * Copy the save's statistics into `*stats`: step, raw_bytes and stall_s
 * are set when ckpt_save_begin returns, the rest is final once
 * ckpt_save_wait() has returned.  Returns CKPT_OK; CKPT_EINVAL (a NULL
 * argument).  Thread-safe.
 */
CKPT_API int ckpt_save_stats_get(const ckpt_save *save, ckpt_save_stats *stats);

/**
 * Wait for the save (if still running) and free the handle.  NULL is fine.
 * The save's status is not returned (call ckpt_save_wait() for it), but a
 * failure does become this thread's last error.  May be called after
 * ckpt_store_free() of its store.
 */
CKPT_API void ckpt_save_free(ckpt_save *save);

/** ckpt_save_begin + ckpt_save_wait + ckpt_save_free: returns a status of
 *  ckpt_save_begin or of ckpt_save_wait.  Thread-safe. */
CKPT_API int ckpt_save_sync(ckpt_store *store, int64_t step, const ckpt_tensor *tensors,
                       size_t count, const ckpt_save_options *opts);

/**
 * In place of ckpt_save_begin of `step`, on a rank that refused the save
 * before it (a binding's own checks of the caller's state or metadata
 * failed, with error `status` < 0 and `message`): with several ranks it
 * takes part in the save's collectives as a failed begin does, so every
 * other rank's save of `step` fails at once with this rank's reason
 * (instead of pairing its next save with their collectives, which fails
 * every later save); with one process it does nothing else.  Returns
 * `status`, with `message` (or ckpt_strerror's text when NULL) as the
 * error; CKPT_EINVAL for a NULL store or a `status` that is not an error
 * of ckpt_status (ckpt_status_name knows it).
 */
CKPT_API int ckpt_save_refuse(ckpt_store *store, int64_t step, int status,
                              const char *message);

/* ---------------------------------------------------------------- reports */

/**
 * A report lists problems: for a restore, the newer checkpoints that were
 * skipped and why; for a verify, every problem found; for a gc, each
 * (would-be) removal, with status CKPT_OK.  A report is read-only once
 * handed out (its functions are thread-safe) and does not refer to the
 * store: it may outlive it.
 */
typedef struct ckpt_problem {
    int64_t step;        /* checkpoint the problem is in (-1: none)         */
    int status;          /* CKPT_E* classifying it (CKPT_OK in a gc report) */
    const char *message; /* full sentence naming what was wrong             */
    const char *file;    /* file name inside the step directory (gc: entry
                            name in the root), or ""                        */
    const char *tensor;  /* tensor name, or ""                              */
    int64_t offset;      /* byte offset in `file`, or -1                    */
} ckpt_problem;

/** Step restored or verified (ckpt_verify: also when it failed; with
 *  CKPT_LATEST, the step chosen); -1 if none, for a gc report and for NULL. */
CKPT_API int64_t ckpt_report_step(const ckpt_report *report);
/** Number of problems (0 for NULL). */
CKPT_API size_t ckpt_report_count(const ckpt_report *report);
/** Problem `i` (< count), owned by the report: it and its strings are valid
 *  until ckpt_report_free().  NULL if `i` is out of range or for NULL. */
CKPT_API const ckpt_problem *ckpt_report_get(const ckpt_report *report, size_t i);
/** Free the report and its problems.  NULL is fine. */
CKPT_API void ckpt_report_free(ckpt_report *report);

/* ---------------------------------------------------------------- restore */


#define CKPT_RESTORE_OPTIONS_VERSION 2
/** Options of ckpt_restore(); start from CKPT_RESTORE_OPTIONS_INIT or
 *  ckpt_restore_options_init().  Version 1 (without `verify`) is still
 *  accepted. */
typedef struct ckpt_restore_options {
    unsigned int version;     /* CKPT_RESTORE_OPTIONS_VERSION                  */
    int allow_missing;        /* non-zero: tensors absent from the checkpoint
                                 are left untouched instead of CKPT_ENOTFOUND  */
    void *cuda_stream;        /* stream for H2D copies into device tensors
                                 (NULL: legacy default stream;
                                 cudaStreamPerThread: the legacy one, which
                                 CUDA orders with the caller's); they are
                                 complete when ckpt_restore returns           */
    /* Version 2. */
    ckpt_verify_level verify; /* CKPT_VERIFY_STORED (default; 0 too): the
                                 chunks restored are verified.
                                 CKPT_VERIFY_FULL: so is every other chunk
                                 this process saved in the step (one
                                 process: the whole step; rank r of W: the
                                 shards of ranks r, r+W, ...), before the
                                 step is taken: with CKPT_LATEST a step
                                 whose other tensors (an optimizer's state,
                                 read next) are damaged is skipped, and with
                                 several ranks no rank agrees on it.
                                 ckpt_checkpoint_restore ignores it.        */
} ckpt_restore_options;

#define CKPT_RESTORE_OPTIONS_INIT \
    { CKPT_RESTORE_OPTIONS_VERSION, 0, NULL, CKPT_VERIFY_STORED }

/**
 * Fill `opts` with the defaults of CKPT_RESTORE_OPTIONS_INIT for `version`
 * (pass CKPT_RESTORE_OPTIONS_VERSION).  Returns CKPT_OK; CKPT_EINVAL if
 * `opts` is NULL; CKPT_EVERSION if `version` is unknown (`opts` is left
 * unchanged).  Thread-safe.
 */
CKPT_API int ckpt_restore_options_init(ckpt_restore_options *opts,
                                       unsigned int version);

/**
 * Restore `count` caller buffers (`tensors` may be NULL if `count` is 0),
 * matched by name, from checkpoint `step`, or with CKPT_LATEST from the
 * newest one that can be restored.  The checkpoint is opened with quick
 * verification and every chunk restored is verified; chunks of tensors not
 * asked for are not read, unless opts->verify is CKPT_VERIFY_FULL (then
 * those this process saved are verified too, before the step is taken).
 * With CKPT_LATEST a checkpoint that fails this
 * (corrupt, incomplete, unreadable, of a newer format, or gone) is skipped
 * for the next older one and recorded in `*report` (may be NULL; handed
 * out also on failure; its step is the one restored).  A dtype, shape or
 * size that differs from the checkpoint is CKPT_EMISMATCH and a name not in
 * it CKPT_ENOTFOUND (unless allow_missing): those are the caller's errors,
 * not reasons to fall back, except with CKPT_LATEST for a step that an
 * older one fits and that is itself damaged (read in full to tell: the
 * shapes changed between the two and the newer one is torn), which is
 * skipped as damaged.  One buffer may be given under several names
 * (the same `data` and `bytes`: tied weights): the name given last is
 * written into it and the others are still read and verified; buffers
 * that overlap otherwise are CKPT_EINVAL, among the tensors the step
 * holds (a tensor it lacks is not written: with allow_missing its buffer
 * may overlap another's; without, the restore is CKPT_ENOTFOUND, or
 * CKPT_EMISMATCH, before overlap is looked at).  A newer step found damaged
 * while it was being read may already have written into the buffers it
 * holds: when the step restored instead lacks one of those tensors
 * (allow_missing), the restore fails with CKPT_ECORRUPT naming it rather
 * than pass it off as untouched (set it again and restore that step by
 * number).  On failure the buffers' contents are unspecified.  Waits for a
 * save in flight first.  `opts` may be NULL.
 *
 * Returns CKPT_OK; CKPT_ENOCKPT (CKPT_LATEST and no checkpoint could be
 * restored); CKPT_EMISMATCH; CKPT_ENOTFOUND (no such step or tensor);
 * CKPT_ECORRUPT, CKPT_EINCOMPLETE, CKPT_EVERSION (the `step` given failed
 * verification or is of a newer format; CKPT_ECORRUPT also for the
 * buffers of a damaged newer step above); CKPT_EVERSION also for an unknown
 * `opts->version`; CKPT_EIO, CKPT_EACCES (reading a step given by number;
 * with CKPT_LATEST a step that cannot be read, CKPT_EIO or CKPT_EACCES,
 * is skipped like a damaged one and listed in the report); CKPT_EINVAL
 * (NULL `store`, a step that is neither >= 0 nor CKPT_LATEST, a tensor
 * breaking a rule of ckpt_tensor, a name given twice, buffers overlapping,
 * a device pointer the runtime calls host memory, a cuda_stream capturing a
 * CUDA graph: refused before any copy, and no older step is tried);
 * CKPT_ENODEVICE, CKPT_EDEVICE (device buffers); CKPT_ENOMEM.  Thread-safe.
 */
CKPT_API int ckpt_restore(ckpt_store *store, int64_t step, const ckpt_tensor *tensors,
                          size_t count, const ckpt_restore_options *opts,
                          ckpt_report **report);

/**
 * ckpt_restore, and on success `*out` is the checkpoint the tensors were
 * restored from, open as by ckpt_checkpoint_open at CKPT_VERIFY_QUICK (its
 * metadata, its other tensors), to be freed with ckpt_checkpoint_free.  A
 * caller that restores and then reads the step's metadata needs no second
 * open (which would decode the manifest again and could find a step
 * replaced in between).  `*out` is NULL on failure.  With several ranks
 * and CKPT_LATEST it is collective, as ckpt_restore is, and each rank gets
 * the agreed step opened through the global manifest.  Same returns as
 * ckpt_restore, and CKPT_EINVAL for a NULL `out`.  Thread-safe.
 */
CKPT_API int ckpt_restore_open(ckpt_store *store, int64_t step, const ckpt_tensor *tensors,
                               size_t count, const ckpt_restore_options *opts,
                               ckpt_report **report, ckpt_checkpoint **out);

/**
 * In place of ckpt_restore(store, CKPT_LATEST, ...), on a rank that refused
 * the restore before it (as for ckpt_save_refuse): with several ranks it
 * takes part in the agreement as a failed restore does, so the other
 * ranks fail at once with its reason and stay in step; with one process
 * it does nothing else.  `*report` (may be NULL) is handed out as by
 * ckpt_restore.  Returns `status` with `message` as the error (or the
 * agreement's failure, CKPT_EPEER); CKPT_EINVAL for a NULL store or a
 * `status` that is not an error of ckpt_status.
 */
CKPT_API int ckpt_restore_refuse(ckpt_store *store, int status, const char *message,
                                 ckpt_report **report);

/**
 * Record a restore the caller made by reading a checkpoint through
 * ckpt_checkpoint_open and ckpt_checkpoint_read (a binding that loads a
 * whole state tensor by tensor: Python's Store.load) in the root's event
 * log and metrics, as ckpt_restore records its own: "restored" with `step`
 * when `status` is CKPT_OK, else "restore_failed" with `status` and
 * `message` (NULL or "": ckpt_strerror's); `skipped[0..nskipped)` (NULL
 * when 0) are the newer steps passed over, one problem each, as a restore
 * report lists them (the strings are copied).  Nothing is read or checked
 * on disk: the caller vouches for what it says.  A read-only store, or a
 * rank other than 0, records nothing and returns CKPT_OK.  The thread's
 * last error is left as it was.  Returns CKPT_OK; CKPT_EINVAL for a NULL
 * store, a step < 0 with CKPT_OK, a `status` that ckpt_status_name does not
 * know, or a NULL `skipped`
 * with `nskipped` > 0; CKPT_ENOMEM.  Thread-safe.
 */
CKPT_API int ckpt_store_record_restore(ckpt_store *store, int64_t step, int status,
                                       const char *message, const ckpt_problem *skipped,
                                       size_t nskipped);

/* ----------------------------------------------------------------- verify */

/**
 * Verify checkpoint `step` at `level` (CKPT_VERIFY_QUICK or
 * CKPT_VERIFY_FULL).  `step` is a step number, CKPT_NEWEST (the newest
 * committed step, e.g. to check the last save) or CKPT_LATEST (find the
 * newest step that passes `level`; the newer ones skipped are not listed).
 * Every problem found goes to `*report` (may be NULL; handed out also on
 * failure, with the step checked): with FULL each bad chunk, naming its
 * file, tensor and offset; a step that fails quick verification gives one
 * problem.  A step saved by several ranks also has its part manifests
 * checked: one that is damaged or disagrees with the global manifest is
 * listed (status of the damage, message starting "warning:") without
 * failing the step, since restore passes over it.  Waits for a save in
 * flight first.
 *
 * Returns CKPT_OK if it is good; CKPT_ECORRUPT if a byte is wrong,
 * CKPT_EINCOMPLETE if a file is missing or truncated, CKPT_EVERSION if it
 * was written by a newer format (with several problems, the status of the
 * first found); CKPT_ENOTFOUND if there is no such step; CKPT_ENOCKPT
 * (CKPT_NEWEST: the root has no step; CKPT_LATEST: no step passes);
 * CKPT_EIO, CKPT_EACCES, CKPT_ENOMEM (reading); CKPT_EINVAL (NULL `store`,
 * another level, another negative step).  Thread-safe.
 */
CKPT_API int ckpt_verify(ckpt_store *store, int64_t step, ckpt_verify_level level,
                         ckpt_report **report);

/* ------------------------------------------------------------- checkpoint */

/**
 * One committed checkpoint opened for reading.  It borrows its store: free
 * it before the store.  It keeps its shard files open, so it stays readable
 * when a later save or gc retires its step.  (The type, ckpt_checkpoint,
 * is declared above with ckpt_report: ckpt_restore_open hands one out.)
 */

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
 * CKPT_ENOTFOUND (no such step), CKPT_ENOCKPT (CKPT_LATEST: no step passes
 * `level`; CKPT_NEWEST: the root has no step), CKPT_ECORRUPT,
 * CKPT_EINCOMPLETE, CKPT_EVERSION (the step failed `level`), CKPT_EIO,
 * CKPT_EACCES, CKPT_ENOMEM.  Waits for a save in flight first.  Thread-safe.
 */
CKPT_API int ckpt_checkpoint_open(ckpt_checkpoint **out, ckpt_store *store,
                                  int64_t step, ckpt_verify_level level);
/** Close the checkpoint and free it.  NULL is fine.  Call it before
 *  ckpt_store_free() of its store. */
CKPT_API void ckpt_checkpoint_free(ckpt_checkpoint *ckpt);

/** Its step (-1 for NULL). */
CKPT_API int64_t ckpt_checkpoint_step(const ckpt_checkpoint *ckpt);
/** Absolute path of the step directory (NULL for NULL), owned by the
 *  checkpoint. */
CKPT_API const char *ckpt_checkpoint_path(const ckpt_checkpoint *ckpt);
/** Number of tensors (0 for NULL); they are numbered 0..count-1 in the order
 *  the save was given them. */
CKPT_API size_t ckpt_checkpoint_tensor_count(const ckpt_checkpoint *ckpt);

/** Description of one tensor of a checkpoint. */
typedef struct ckpt_tensor_info {
    const char *name;       /* owned by the checkpoint                     */
    ckpt_dtype dtype;       /* as saved                                    */
    int ndim;               /* 0..CKPT_MAX_DIMS                            */
    int64_t shape[CKPT_MAX_DIMS]; /* the first ndim are used, the rest 0  */
    uint64_t bytes;         /* raw bytes                                   */
    uint64_t stored_bytes;  /* bytes of its frames in the shard            */
    uint64_t chunks;        /* frames it is stored in                      */
} ckpt_tensor_info;

/** Describe tensor `i` (< count).  Strings are owned by the checkpoint.
 *  Returns CKPT_OK; CKPT_EINVAL (a NULL argument, or `i` out of range). */
CKPT_API int ckpt_checkpoint_tensor(const ckpt_checkpoint *ckpt, size_t i,
                                    ckpt_tensor_info *info);
/** Describe tensors `first` .. `first`+`count`-1 into `infos[0..count)`,
 *  each as ckpt_checkpoint_tensor would, in one call (a binding listing
 *  10,000 tensors otherwise makes 10,000 calls).  Returns CKPT_OK;
 *  CKPT_EINVAL (NULL `ckpt`, NULL `infos` with `count` > 0, or a range
 *  beyond the tensor count). */
CKPT_API int ckpt_checkpoint_tensors(const ckpt_checkpoint *ckpt, size_t first, size_t count,
                                     ckpt_tensor_info *infos);
/** Find a tensor by name and put its number in `*index`.  Returns CKPT_OK;
 *  CKPT_ENOTFOUND if absent; CKPT_EINVAL (a NULL argument). */
CKPT_API int ckpt_checkpoint_find(const ckpt_checkpoint *ckpt, const char *name,
                                  size_t *index);

/* The strings below are owned by the checkpoint (NULL for NULL). */
/** The caller's metadata as compact JSON text ("null" when none was given):
 *  as the caller wrote it less the whitespace between tokens, or, for text
 *  the quick check is not sure of, as jansson prints it (docs/FORMAT.md). */
CKPT_API const char *ckpt_checkpoint_metadata(const ckpt_checkpoint *ckpt);
/** How many ranks saved this step (docs/SCALING.md): 1 for a step saved
 *  by one process, and for a NULL `ckpt`.  Thread-safe. */
CKPT_API int ckpt_checkpoint_world_size(const ckpt_checkpoint *ckpt);
/** The rank that saved tensor `i` (< count) in `*rank`: the rank whose
 *  shard holds it; 0 on a step saved by one process.  Returns CKPT_OK;
 *  CKPT_EINVAL (a NULL argument, or `i` out of range).  Thread-safe. */
CKPT_API int ckpt_checkpoint_tensor_rank(const ckpt_checkpoint *ckpt, size_t i, int *rank);
/** The metadata rank `rank` gave when it saved this step, in `*json`
 *  (owned by the checkpoint, as the strings below).  Several ranks save
 *  one step, each with its own metadata: ckpt_checkpoint_metadata is rank
 *  0's (the global manifest's), rank r's is kept in its part manifest
 *  (docs/FORMAT.md), read and checked against the global manifest the
 *  first time it is asked for.  Rank 0 of any step, and of a step saved by
 *  one process, is ckpt_checkpoint_metadata.  Returns CKPT_OK; CKPT_EINVAL
 *  (a NULL argument); CKPT_ENOTFOUND (`rank` not in 0..world_size-1);
 *  CKPT_EINCOMPLETE, CKPT_ECORRUPT, CKPT_EVERSION (the part manifest is
 *  missing, damaged or does not match the global manifest: the step's
 *  tensors still restore, through the global manifest); CKPT_EIO,
 *  CKPT_EACCES, CKPT_ENOMEM.  Thread-safe. */
CKPT_API int ckpt_checkpoint_rank_metadata(const ckpt_checkpoint *ckpt, int rank,
                                           const char **json);
/** The environment record as compact JSON text. */
CKPT_API const char *ckpt_checkpoint_env(const ckpt_checkpoint *ckpt);
/** The whole manifest as JSON text, as stored. */
CKPT_API const char *ckpt_checkpoint_manifest(const ckpt_checkpoint *ckpt);
/** Unix time (seconds) at which the save began (0.0 for NULL). */
CKPT_API double ckpt_checkpoint_time(const ckpt_checkpoint *ckpt);
/**
 * Statistics recorded by the save: raw, stored bytes, chunks, stall_s, and
 * persist_s measured up to writing the manifest (fsync, verify_after_save
 * and rename follow).  Returns CKPT_OK; CKPT_EINVAL (a NULL argument).
 */
CKPT_API int ckpt_checkpoint_stats(const ckpt_checkpoint *ckpt, ckpt_save_stats *stats);

/**
 * Read tensor `name` into `dst` (exactly `bytes` bytes of host memory),
 * verifying every chunk whatever level the checkpoint was opened at.  Does
 * not wait for a save in flight.  On failure `dst`'s contents are
 * unspecified.  Returns CKPT_OK; CKPT_EINVAL (NULL `ckpt` or `name`, NULL
 * `dst` with `bytes` > 0); CKPT_ENOTFOUND (no such tensor); CKPT_EMISMATCH
 * (`bytes` is not its size); CKPT_ECORRUPT, CKPT_EINCOMPLETE (a chunk is
 * damaged or cut short); CKPT_EIO, CKPT_ENOMEM.  Thread-safe: serialised
 * with the other calls on its store.
 */
CKPT_API int ckpt_checkpoint_read(ckpt_checkpoint *ckpt, const char *name, void *dst,
                                  uint64_t bytes);

/**
 * Read bytes [`offset`, `offset` + `bytes`) of tensor `name` (its raw,
 * row-major bytes) into `dst` (host memory): a part of a tensor too large
 * to hold whole, read piece by piece (`ckpt export` does).  Only the
 * chunks holding those bytes are read, and each of them is verified whole
 * (its stored and raw hashes) whatever level the checkpoint was opened
 * at; a chunk only partly in the range costs a buffer of its raw size
 * (at most two such: the first and the last).  `bytes` may be 0.  Does
 * not wait for a save in flight.  On failure `dst`'s contents are
 * unspecified.  Returns CKPT_OK; CKPT_EINVAL (NULL `ckpt` or `name`, NULL
 * `dst` with `bytes` > 0, a range that ends past the tensor's size);
 * CKPT_ENOTFOUND (no such tensor); CKPT_ECORRUPT, CKPT_EINCOMPLETE (a
 * chunk read is damaged or cut short); CKPT_EIO, CKPT_ENOMEM.
 * Thread-safe: serialised with the other calls on its store.
 */
CKPT_API int ckpt_checkpoint_read_range(ckpt_checkpoint *ckpt, const char *name,
                                        uint64_t offset, void *dst, uint64_t bytes);

/**
 * Restore `count` caller buffers (`tensors` may be NULL if `count` is 0),
 * matched by name, from this checkpoint in one call: ckpt_restore's
 * matching and errors (a dtype, shape or size that differs is
 * CKPT_EMISMATCH naming the tensor, a name not in it CKPT_ENOTFOUND unless
 * `opts->allow_missing`), its parallel decoding, and every chunk verified,
 * without opening the step again (reading 10,000 tiny tensors one
 * ckpt_checkpoint_read at a time costs more than the reading).  No other
 * step is tried and no restore event is logged (as ckpt_checkpoint_read).
 * Does not wait for a save in flight.  On failure the buffers' contents are
 * unspecified.  `opts` may be NULL.  Returns CKPT_OK; CKPT_EMISMATCH;
 * CKPT_ENOTFOUND; CKPT_ECORRUPT, CKPT_EINCOMPLETE (a chunk is damaged or
 * cut short); CKPT_EIO; CKPT_EVERSION (unknown `opts->version`);
 * CKPT_EINVAL (NULL `ckpt`, a tensor breaking a rule of ckpt_tensor, a
 * name given twice); CKPT_ENODEVICE, CKPT_EDEVICE (device buffers);
 * CKPT_ENOMEM.  Thread-safe: serialised with the other calls on its store.
 */
CKPT_API int ckpt_checkpoint_restore(ckpt_checkpoint *ckpt, const ckpt_tensor *tensors,
                                     size_t count, const ckpt_restore_options *opts);

/**
 * Load tensor `name` of checkpoint `step` into a new host buffer released
 * with ckpt_free() (not NULL, also for 0 bytes).  `step` is a step number
 * or CKPT_NEWEST, opened with quick verification, or CKPT_LATEST: the
 * newest step that passes full verification (so that tensors loaded one at
 * a time come from one valid step; this reads the whole step once per
 * call).  Every chunk of the tensor is verified.  `bytes` (may be NULL)
 * receives its size and `info` (may be NULL) its description; the name
 * would point into nothing after return, so it is set NULL.  Waits for a
 * save in flight first.
 *
 * Returns CKPT_OK; CKPT_ENOTFOUND (no such step or tensor); CKPT_ENOCKPT
 * (CKPT_LATEST: no step passes; CKPT_NEWEST: the root has no step);
 * CKPT_ECORRUPT, CKPT_EINCOMPLETE, CKPT_EVERSION; CKPT_EIO, CKPT_EACCES,
 * CKPT_ENOMEM; CKPT_EINVAL (NULL `store`, `name` or `data`, another
 * negative step).  On failure `*data` is NULL.  Thread-safe.
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
 * the CUDA runtime loader, since signals are.  The handler replaces the
 * signals' dispositions (earlier handlers are not called; SA_RESTART is
 * set); a second call replaces the first watch.
 *
 * Returns CKPT_OK; CKPT_EINVAL (NULL `signals` with `count` > 0, or a signal
 * that cannot be caught: nothing changed; or sigaction() failed: then no
 * signal is watched).  Thread-safe.
 */
CKPT_API int ckpt_preempt_watch(const int *signals, size_t count);
/** The number of the first watched signal received since the last reset, or 0.
 *  Async-signal-safe. */
CKPT_API int ckpt_preempt_requested(void);
/** Clear the flag.  Async-signal-safe. */
CKPT_API void ckpt_preempt_reset(void);
/** Restore the signal dispositions in force before ckpt_preempt_watch(); a
 *  no-op when nothing is watched.  The flag is kept.  Thread-safe. */
CKPT_API void ckpt_preempt_unwatch(void);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_H */

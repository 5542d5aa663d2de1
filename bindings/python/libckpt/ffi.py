"""Every ctypes declaration of the binding: loading libckpt, the C structs,
enums and function prototypes of include/ckpt.h.

Functions returning a ``ckpt_status`` get an ``errcheck`` that turns a
negative status into an :class:`libckpt.Error` subclass carrying
``ckpt_error_last()``.  The message slot is per thread; errcheck runs in the
calling thread right after the foreign call returns, before any other
libckpt call can overwrite it.

The library is loaded with ``ctypes.CDLL``, which releases the GIL for the
duration of every foreign call, so a blocking wait lets other Python threads
run.  Search order: ``$LIBCKPT_LIBRARY`` (only that file when set), a
``libckpt.so*`` next to this package (``pip install`` bundles
``libckpt.so`` there), the library directory ``meson
install`` put it in, the directory ``pkg-config --variable=libdir libckpt``
names, then ``ctypes.util.find_library("ckpt")`` and the dynamic loader's
search for ``libckpt.so.0``.
"""

import ctypes
import ctypes.util
import glob
import os
import subprocess
import sysconfig

from . import errors
from ._version import VERSION_MAJOR, VERSION_MINOR, __version__

# ------------------------------------------------------------------ enums

CKPT_OK = 0
CKPT_LATEST = -1  # newest step passing the call's verification
CKPT_NEWEST = -2  # newest committed step, whatever its state
CKPT_MAX_DIMS = 16
CKPT_STEP_MAX = 2**63 - 1
CKPT_OPEN_READONLY = 0x1
CKPT_OPEN_TRUST_GROUP = 0x2
CKPT_OPEN_NO_CMDLINE = 0x4
CKPT_OPEN_REWIND = 0x8
CKPT_OPEN_COMPRESS_ALL = 0x10
CKPT_OPEN_KEEP_CACHE = 0x20
CKPT_OPEN_DROP_CACHE = 0x40

# ckpt_dtype
CKPT_DTYPE_INVALID = 0
(CKPT_BOOL, CKPT_U8, CKPT_I8, CKPT_U16, CKPT_I16, CKPT_U32, CKPT_I32,
 CKPT_U64, CKPT_I64, CKPT_F16, CKPT_BF16, CKPT_F32, CKPT_F64, CKPT_C64,
 CKPT_C128, CKPT_F8_E4M3, CKPT_F8_E5M2, CKPT_BYTES) = range(1, 19)

# ckpt_memory
CKPT_MEM_HOST, CKPT_MEM_DEVICE, CKPT_MEM_AUTO = 0, 1, 2

# ckpt_verify_level
CKPT_VERIFY_NONE, CKPT_VERIFY_QUICK, CKPT_VERIFY_FULL, CKPT_VERIFY_STORED = 0, 1, 2, 3

# ckpt_snapshot_mode
CKPT_SNAPSHOT_HOST, CKPT_SNAPSHOT_DEVICE, CKPT_SNAPSHOT_STREAM = 0, 1, 2

CKPT_STORE_OPTIONS_VERSION = 2
CKPT_COORDINATOR_VERSION = 1
CKPT_SAVE_OPTIONS_VERSION = 2
CKPT_RESTORE_OPTIONS_VERSION = 2

# ---------------------------------------------------------------- structs

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class ckpt_tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("bytes", ctypes.c_uint64),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", c_int64_p),
        ("memory", ctypes.c_int),
    ]


# The collectives of ckpt_coordinator (include/ckpt.h, "ranks").
BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_int, ctypes.c_int)
ALLREDUCE_MIN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, c_int64_p,
                                    ctypes.c_int)
GATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int,
                             ctypes.c_int)


class ckpt_coordinator(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("user", ctypes.c_void_p),
        ("barrier", BARRIER_FN),
        ("broadcast", BROADCAST_FN),
        ("allreduce_min", ALLREDUCE_MIN_FN),
        ("gather", GATHER_FN),
    ]


class ckpt_store_options(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("flags", ctypes.c_uint),
        ("level", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("chunk_bytes", ctypes.c_uint64),
        ("host_memory_limit", ctypes.c_uint64),
        ("keep_last", ctypes.c_int),
        ("fsync", ctypes.c_int),
        ("verify_after_save", ctypes.c_int),
        ("snapshot_mode", ctypes.c_int),
        ("pinned_limit", ctypes.c_uint64),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("coordinator", ctypes.POINTER(ckpt_coordinator)),
        ("timeout_ms", ctypes.c_int),
        ("metrics_path", ctypes.c_char_p),  # version 2
    ]


class ckpt_save_options(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("metadata_json", ctypes.c_char_p),
        ("cuda_stream", ctypes.c_void_p),
        ("frameworks_json", ctypes.c_char_p),  # version 2
    ]


class ckpt_save_stats(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("raw_bytes", ctypes.c_uint64),
        ("stored_bytes", ctypes.c_uint64),
        ("chunks", ctypes.c_uint64),
        ("stall_s", ctypes.c_double),
        ("persist_s", ctypes.c_double),
    ]


class ckpt_problem(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("status", ctypes.c_int),
        ("message", ctypes.c_char_p),
        ("file", ctypes.c_char_p),
        ("tensor", ctypes.c_char_p),
        ("offset", ctypes.c_int64),
    ]


class ckpt_restore_options(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("allow_missing", ctypes.c_int),
        ("cuda_stream", ctypes.c_void_p),
        ("verify", ctypes.c_int),  # version 2
    ]


class ckpt_tensor_info(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * CKPT_MAX_DIMS),
        ("bytes", ctypes.c_uint64),
        ("stored_bytes", ctypes.c_uint64),
        ("chunks", ctypes.c_uint64),
    ]


# Opaque handles are plain void pointers.
store_p = ctypes.c_void_p
save_p = ctypes.c_void_p
report_p = ctypes.c_void_p
checkpoint_p = ctypes.c_void_p

# ----------------------------------------------------------------- loading


def _pkgconfig_libdir():
    """``pkg-config --variable=libdir libckpt``, or None (no pkg-config, no
    libckpt.pc on its path)."""
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "libckpt"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.decode("utf-8", "replace").strip()
    return out if r.returncode == 0 and out else None


def _candidates():
    """Paths or names to try, in order (computed as they are needed)."""
    env = os.environ.get("LIBCKPT_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "libckpt.so*"))):
        yield path
    try:
        from ._install import LIBDIR  # written by meson install
        yield os.path.join(LIBDIR, "libckpt.so.0")
    except ImportError:
        pass
    libdir = _pkgconfig_libdir()
    if libdir:
        yield os.path.join(libdir, "libckpt.so.0")
    name = ctypes.util.find_library("ckpt")
    if name:
        yield name
    yield "libckpt.so.0"


def _recorded(path):
    """Whether `path` is the library a meson install recorded (_install.py)."""
    try:
        from ._install import LIBDIR
    except ImportError:
        return False
    return path == os.path.join(LIBDIR, "libckpt.so.0")


def _libdir_example():
    """Where `meson setup --prefix PREFIX` puts the library on this system:
    PREFIX/lib/<multiarch triplet> on Debian and Ubuntu."""
    arch = sysconfig.get_config_var("MULTIARCH")
    return "lib/" + arch if arch else "lib"


def _load():
    tried = []
    installed = None  # the library a meson install recorded, gone since
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            why = "no such file"
            if cand.startswith("~"):
                why += ": a '~' the shell did not expand (it was quoted): write $HOME"
            elif installed is None and _recorded(cand):
                installed = cand
            tried.append("%s (%s)" % (cand, why))
            continue
        try:
            return ctypes.CDLL(cand), cand
        except OSError as e:
            tried.append("%s (%s)" % (cand, e))
    if os.environ.get("LIBCKPT_LIBRARY"):
        raise ImportError(
            "libckpt: cannot load the C library that LIBCKPT_LIBRARY names: %s.  "
            "Point it at the installed libckpt.so.0 (PREFIX/%s/libckpt.so.0 for "
            "`meson setup --prefix PREFIX`) or unset it."
            % ("; ".join(tried), _libdir_example()))
    if installed:
        raise ImportError(
            "libckpt: the C library this package was installed with, %s, is gone "
            "(uninstalled or moved; tried: %s): install libckpt again (meson "
            "install from its build directory), or point LIBCKPT_LIBRARY at "
            "another libckpt.so.0" % (installed, "; ".join(tried)))
    libdir = _libdir_example()
    raise ImportError(
        "libckpt: cannot load the C library; tried: %s.  Set LIBCKPT_LIBRARY to "
        "the installed library: LIBCKPT_LIBRARY=PREFIX/%s/libckpt.so.0 for "
        "`meson setup --prefix PREFIX` (e.g. LIBCKPT_LIBRARY=%s/%s/libckpt.so.0 "
        "for --prefix ~/.local), or PKG_CONFIG_PATH=PREFIX/%s/pkgconfig so that "
        "`pkg-config --variable=libdir libckpt` names its directory."
        % ("; ".join(tried), libdir, os.path.expanduser("~/.local"), libdir, libdir))


lib, library_path = _load()

# --------------------------------------------------------------- prototypes


def _errcheck(result, func, args):
    if result < 0:
        msg = lib.ckpt_error_last()
        msg = msg.decode("utf-8", "replace") if msg else ""
        if not msg:
            msg = (lib.ckpt_strerror(result) or b"").decode("utf-8", "replace")
        raise errors.error_for_status(result, msg, func.__name__)
    return result


def _fn(name, restype, argtypes, check=None, optional=False):
    try:
        f = getattr(lib, name)
    except AttributeError:
        if not optional:
            raise ImportError("libckpt: %s lacks the symbol %s"
                              % (library_path, name)) from None

        def missing(*args):
            raise errors.Error("this libckpt was built without %s" % name,
                               function=name)
        missing.__name__ = name
        setattr(lib, name, missing)
        return False
    f.restype = restype
    f.argtypes = argtypes
    if check is None:
        check = restype is ctypes.c_int
    if check:
        f.errcheck = _errcheck
    return True


_int, _u64, _i64 = ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
_P, _ref = ctypes.POINTER, ctypes.byref
_str, _vp, _size = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t

# version and errors
_fn("ckpt_version_number", _int, [], check=False)
_fn("ckpt_version_string", _str, [])
_fn("ckpt_strerror", _str, [_int])
_fn("ckpt_status_name", _str, [_int], check=False)
_fn("ckpt_error_last", _str, [])
_fn("ckpt_error_last_status", _int, [], check=False)
_fn("ckpt_error_clear", None, [])

# dtypes
_fn("ckpt_dtype_size", _size, [_int])
_fn("ckpt_dtype_name", _str, [_int])
_fn("ckpt_dtype_from_name", _int, [_str], check=False)

# store
_fn("ckpt_store_options_init", _int, [_P(ckpt_store_options), ctypes.c_uint])
_fn("ckpt_store_open", _int, [_P(store_p), _str, _P(ckpt_store_options)])
_fn("ckpt_store_free", None, [store_p])
_fn("ckpt_store_path", _str, [store_p])
_fn("ckpt_store_steps", _int, [store_p, _P(c_int64_p), _P(_size)])
_fn("ckpt_store_wait", _int, [store_p])
_fn("ckpt_store_release_after_fork", _int, [store_p])
_fn("ckpt_store_latest", _int, [store_p, _int, _P(_i64)])
_fn("ckpt_store_pinned_bytes", _u64, [store_p])
_fn("ckpt_store_gc", _int, [store_p, _int, _int, _P(report_p)])
_fn("ckpt_cuda_available", _int, [], check=False, optional=True)
_fn("ckpt_free", None, [_vp])
_fn("ckpt_store_events", _int, [store_p, ctypes.c_double, _P(_vp)], optional=True)
_fn("ckpt_store_metrics", _int, [store_p, _P(_vp)], optional=True)

# save
_fn("ckpt_save_options_init", _int, [_P(ckpt_save_options), ctypes.c_uint])
_fn("ckpt_save_begin", _int, [_P(save_p), store_p, _i64, _P(ckpt_tensor),
                              _size, _P(ckpt_save_options)])
_fn("ckpt_save_wait", _int, [save_p])
_fn("ckpt_save_wait_snapshot", _int, [save_p])
_fn("ckpt_save_fence", _int, [save_p, _vp])
_fn("ckpt_save_done", _int, [save_p], check=False)
_fn("ckpt_save_stats_get", _int, [save_p, _P(ckpt_save_stats)])
_fn("ckpt_save_free", None, [save_p])

# reports
_fn("ckpt_report_step", _i64, [report_p])
_fn("ckpt_report_count", _size, [report_p])
_fn("ckpt_report_get", _P(ckpt_problem), [report_p, _size])
_fn("ckpt_report_free", None, [report_p])

# restore and verify
_fn("ckpt_restore_options_init", _int,
    [_P(ckpt_restore_options), ctypes.c_uint])
_fn("ckpt_restore", _int, [store_p, _i64, _P(ckpt_tensor), _size,
                           _P(ckpt_restore_options), _P(report_p)])
_fn("ckpt_verify", _int, [store_p, _i64, _int, _P(report_p)])

# checkpoints
_fn("ckpt_checkpoint_open", _int, [_P(checkpoint_p), store_p, _i64, _int])
_fn("ckpt_checkpoint_free", None, [checkpoint_p])
_fn("ckpt_checkpoint_step", _i64, [checkpoint_p])
_fn("ckpt_checkpoint_path", _str, [checkpoint_p])
_fn("ckpt_checkpoint_tensor_count", _size, [checkpoint_p])
_fn("ckpt_checkpoint_tensor", _int,
    [checkpoint_p, _size, _P(ckpt_tensor_info)])
# Whether this library describes many tensors of a checkpoint in one call.
HAVE_CHECKPOINT_TENSORS = _fn("ckpt_checkpoint_tensors", _int,
                              [checkpoint_p, _size, _size,
                               _P(ckpt_tensor_info)], optional=True)
_fn("ckpt_checkpoint_find", _int, [checkpoint_p, _str, _P(_size)])
_fn("ckpt_checkpoint_metadata", _str, [checkpoint_p])
# Whether this library says a step's world size without the manifest's text.
HAVE_WORLD_SIZE = _fn("ckpt_checkpoint_world_size", _int, [checkpoint_p],
                      check=False, optional=True)
# Whether this library reads a rank's own metadata (several ranks).
HAVE_RANK_METADATA = _fn("ckpt_checkpoint_rank_metadata", _int,
                         [checkpoint_p, _int, _P(_str)], optional=True)
_fn("ckpt_checkpoint_env", _str, [checkpoint_p])
_fn("ckpt_checkpoint_manifest", _str, [checkpoint_p])
_fn("ckpt_checkpoint_time", ctypes.c_double, [checkpoint_p])
_fn("ckpt_checkpoint_stats", _int, [checkpoint_p, _P(ckpt_save_stats)])
_fn("ckpt_checkpoint_read", _int, [checkpoint_p, _str, _vp, _u64])
# Whether this library reads a byte range of a tensor (Checkpoint.get_rows).
HAVE_READ_RANGE = _fn("ckpt_checkpoint_read_range", _int,
                      [checkpoint_p, _str, _u64, _vp, _u64], optional=True)
# Whether this library reads many tensors of a checkpoint in one call.
HAVE_CHECKPOINT_RESTORE = _fn(
    "ckpt_checkpoint_restore", _int,
    [checkpoint_p, _P(ckpt_tensor), _size, _P(ckpt_restore_options)],
    optional=True)
# Whether this library hands back the step a restore came from, open.
HAVE_RESTORE_OPEN = _fn(
    "ckpt_restore_open", _int,
    [store_p, _i64, _P(ckpt_tensor), _size, _P(ckpt_restore_options),
     _P(report_p), _P(checkpoint_p)], optional=True)
_fn("ckpt_load", _int, [store_p, _i64, _str, _P(_vp), _P(_u64),
                        _P(ckpt_tensor_info)])
# a rank's refusal of a collective call, in its place (several ranks)
HAVE_REFUSE = _fn("ckpt_save_refuse", _int, [store_p, _i64, _int, _str],
                  optional=True)
_fn("ckpt_restore_refuse", _int, [store_p, _int, _str, _P(report_p)],
    optional=True)
# Store.load's restore, recorded in the event log as ckpt_restore's is
_fn("ckpt_store_record_restore", _int,
    [store_p, _i64, _int, _str, _P(ckpt_problem), _size], optional=True)

# preemption (process-wide; Python programs usually prefer the signal module)
_fn("ckpt_preempt_watch", _int, [_P(_int), _size], optional=True)
_fn("ckpt_preempt_requested", _int, [], check=False, optional=True)
_fn("ckpt_preempt_reset", None, [], optional=True)
_fn("ckpt_preempt_unwatch", None, [], optional=True)

# --------------------------------------------------------------- version

LIBRARY_VERSION_NUMBER = lib.ckpt_version_number()
LIBRARY_VERSION = lib.ckpt_version_string().decode()
if LIBRARY_VERSION_NUMBER // 100 != VERSION_MAJOR * 100 + VERSION_MINOR:
    raise ImportError(
        "libckpt: the binding %s needs a %d.%d.x C library, but %s is %s"
        % (__version__, VERSION_MAJOR, VERSION_MINOR, library_path,
           LIBRARY_VERSION))


def _restore_options_version():
    """The newest ckpt_restore_options version this library takes: 2 (with
    `verify`), or 1 for a library built before it (its restores then
    verify only the chunks they restore)."""
    probe = ckpt_restore_options()
    try:
        lib.ckpt_restore_options_init(ctypes.byref(probe), CKPT_RESTORE_OPTIONS_VERSION)
    except errors.Error:
        return 1
    return CKPT_RESTORE_OPTIONS_VERSION


RESTORE_OPTIONS_VERSION = _restore_options_version()
HAVE_RESTORE_VERIFY = RESTORE_OPTIONS_VERSION >= 2

"""Store and SaveHandle: the Python face of ckpt_store and ckpt_save."""

import collections
import contextlib
import ctypes
import json
import math
import operator
import os
import threading
import time
import warnings
import weakref

import numpy as np

from . import ffi
from . import tensors as _tensors
from .errors import (CorruptError, Error, IncompleteError, InternalError,
                     InvalidArgumentError,
                     NoCheckpointError, NotFoundError, SkippedCheckpointWarning,
                     code_name)

C = ffi.lib
_byref = ctypes.byref

_VERIFY = {"none": ffi.CKPT_VERIFY_NONE, "quick": ffi.CKPT_VERIFY_QUICK,
           "full": ffi.CKPT_VERIFY_FULL}
_SNAPSHOT = {"host": ffi.CKPT_SNAPSHOT_HOST, "device": ffi.CKPT_SNAPSHOT_DEVICE,
             "stream": ffi.CKPT_SNAPSHOT_STREAM}


class _Closed(ValueError):
    """Raised when a closed Store or SaveHandle is used."""


class _Handle:
    """A C handle shared by threads.  Calls run inside use(); close() stops
    new calls, waits for running ones, then frees the handle exactly once."""

    def __init__(self, ptr, free, what):
        self._ptr = ptr
        self._free = free
        self._what = what
        self._cond = threading.Condition()
        self._users = 0

    @contextlib.contextmanager
    def use(self):
        with self._cond:
            if self._ptr is None:
                raise _Closed("%s is closed" % self._what)
            self._users += 1
        try:
            yield self._ptr
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()

    @property
    def closed(self):
        return self._ptr is None

    def close(self):
        with self._cond:
            ptr, self._ptr = self._ptr, None
            while self._users:
                self._cond.wait()
        if ptr is not None:
            self._free(ptr)


def _problems(report):
    """The problems of a ckpt_report as a list of dicts."""
    out = []
    if not report:
        return out
    for i in range(C.ckpt_report_count(report)):
        p = C.ckpt_report_get(report, i).contents
        out.append({
            "step": p.step,
            "status": p.status,
            "code": code_name(p.status),
            "message": (p.message or b"").decode("utf-8", "replace"),
            "file": (p.file or b"").decode("utf-8", "replace") or None,
            "tensor": (p.tensor or b"").decode("utf-8", "replace") or None,
            "offset": p.offset if p.offset >= 0 else None,
        })
    return out


def _warn_skipped(problems):
    for p in problems:
        warnings.warn("libckpt: skipped step %d: %s" % (p["step"], p["message"]),
                      SkippedCheckpointWarning, stacklevel=3)


def _step_number(step, function):
    """`step` as the int64 the library takes: ctypes would wrap 2**64 + 5
    to 5 silently."""
    step = operator.index(step)
    if not 0 <= step <= ffi.CKPT_STEP_MAX:
        raise InvalidArgumentError(
            "step %d is out of range (0..%d)" % (step, ffi.CKPT_STEP_MAX),
            function=function)
    return step


def _step_arg(step):
    return ffi.CKPT_LATEST if step is None else _step_number(step, "step")


class SaveHandle:
    """An asynchronous save started by :meth:`Store.save`.

    The save has taken its snapshot of host tensors when ``save`` returns;
    compression, hashing, writing and the commit run in the background.
    The handle keeps references to the saved objects until the library no
    longer reads them (device tensors are copied asynchronously).

    Use as a context manager, or call :meth:`close`: leaving the ``with``
    block waits for the save (raising its error if it failed).  A handle
    dropped before its save finished does not block: the store takes the
    save over, frees it once done, and reports a failure with a
    RuntimeWarning and from :meth:`Store.close`.
    """

    def __init__(self, store, ptr, step, keep):
        self.step = step
        self._store = store        # the store must outlive the handle
        self._keep = keep          # objects the library may still read
        self._h = _Handle(ptr, C.ckpt_save_free, "save handle")
        self._error = None         # the save's failure, once known
        self._waited = False       # the caller has seen the outcome
        self._stats = None         # final statistics, once known

    def wait(self):
        """Block until the save is durable and committed; raise its
        :class:`libckpt.Error` if it failed.  The GIL is released while
        waiting.  May be called again, also after close()."""
        if not self._h.closed:
            self._settle()
        self._waited = True
        if self._error is not None:
            raise self._error

    def _settle(self):
        try:
            with self._h.use() as ptr:
                try:
                    C.ckpt_save_wait(ptr)
                except Error as e:
                    self._error = e
                self._stats = self._read_stats(ptr)
        except _Closed:  # closed by another thread meanwhile
            pass
        self._keep = None

    def wait_snapshot(self):
        """Block until the snapshot copy is complete: from then on the saved
        buffers may be overwritten (already true on return from save for
        host tensors; device tensors are fenced on their stream, see
        Store.save)."""
        with self._h.use() as ptr:
            C.ckpt_save_wait_snapshot(ptr)
        self._keep = None

    def fence(self, cuda_stream):
        """Make `cuda_stream` (a cudaStream_t as an int) wait on the GPU for
        the snapshot copy, without blocking the CPU."""
        with self._h.use() as ptr:
            C.ckpt_save_fence(ptr, cuda_stream or None)

    def done(self):
        """True when the save has finished, successfully or not."""
        if self._h.closed:
            return True
        with self._h.use() as ptr:
            return bool(C.ckpt_save_done(ptr))

    @staticmethod
    def _read_stats(ptr):
        s = ffi.ckpt_save_stats()
        C.ckpt_save_stats_get(ptr, _byref(s))
        return {"step": s.step, "raw_bytes": s.raw_bytes,
                "stored_bytes": s.stored_bytes, "chunks": s.chunks,
                "stall_s": s.stall_s, "persist_s": s.persist_s}

    @property
    def stats(self):
        """dict: raw_bytes, stored_bytes, stall_s, persist_s (and step,
        chunks); final once wait() has returned."""
        if self._stats is not None:
            return dict(self._stats)
        with self._h.use() as ptr:
            return self._read_stats(ptr)

    def close(self):
        """Wait for the save and free the handle (idempotent).  Does not
        raise the save's error: wait() does."""
        if not self._h.closed:
            self._settle()
            self._h.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.wait()
        finally:
            self.close()

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is None or h.closed or C is None:
            return
        try:
            store = self._store
            if not self.done() and not store.closed:
                store._adopt(h, self._keep, self.step)  # don't block here
                return
            self.close()
            if self._error is not None and not self._waited:
                store._lost(self._error, self.step)
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        state = ("closed" if self._h.closed else
                 "failed" if self._error else "open")
        return "<libckpt.SaveHandle step=%d %s>" % (self.step, state)


class Store:
    """A checkpoint root directory opened for writing (or, with
    ``readonly=True``, for reading).

    ``keep_last`` committed steps are kept (0 keeps all), ``level`` is the
    zstd level (None: the library's default, 1), ``threads`` the number of
    worker threads (None: online CPUs).  Keyword-only options:
    ``fsync`` (False skips fsync: tests, tmpfs), ``readonly``,
    ``chunk_bytes``, ``host_memory_limit`` (snapshot buffer cap in bytes),
    ``verify_after_save`` ("full", "quick" or "none") and ``snapshot``
    ("host", "device" or "stream": how device tensors are snapshotted).

    Only one process may open a root for writing: a second gets
    :class:`libckpt.BusyError`.  A store may be used from several threads.
    Close it with ``with`` or :meth:`close`; that waits for saves in flight.
    """

    def __init__(self, path, keep_last=3, level=None, threads=None, *,
                 fsync=True, readonly=False, chunk_bytes=None,
                 host_memory_limit=None, verify_after_save="full",
                 snapshot="host"):
        opts = ffi.ckpt_store_options()
        C.ckpt_store_options_init(_byref(opts), ffi.CKPT_STORE_OPTIONS_VERSION)
        if readonly:
            opts.flags |= ffi.CKPT_OPEN_READONLY
        opts.keep_last = operator.index(keep_last)
        if level is not None:
            opts.level = operator.index(level)
        if threads is not None:
            opts.threads = operator.index(threads)
        if chunk_bytes is not None:
            opts.chunk_bytes = operator.index(chunk_bytes)
        if host_memory_limit is not None:
            opts.host_memory_limit = operator.index(host_memory_limit)
        opts.fsync = 1 if fsync else 0
        opts.verify_after_save = _choice("verify_after_save", _VERIFY,
                                         verify_after_save)
        opts.snapshot_mode = _choice("snapshot", _SNAPSHOT, snapshot)
        ptr = ffi.store_p()
        C.ckpt_store_open(_byref(ptr), os.fsencode(path), _byref(opts))
        self._h = _Handle(ptr, C.ckpt_store_free, "store")
        self._saves = weakref.WeakSet()  # live SaveHandles
        # Saves whose handles were dropped unfinished: (handle, keep, step).
        # A deque: appended from __del__ (any thread, any time) without a
        # lock that the interrupted thread might hold.
        self._orphans = collections.deque()
        self._unreported = None  # first failure of a save nobody waited on
        self.readonly = bool(readonly)

    # -- lifetime

    def close(self):
        """Wait for saves in flight, release the lock and free the store
        (idempotent).  Raises the error of a save that failed and whose
        handle nobody waited on."""
        if self._h.closed:
            return
        for h in list(self._saves):
            h.close()
            if h._error is not None and not h._waited:
                self._lost(h._error, h.step, warn=False)
        self._reap(block=True)
        self._h.close()
        failed, self._unreported = self._unreported, None
        if failed is not None:
            raise failed

    def _adopt(self, handle, keep, step):
        self._orphans.append((handle, keep, step))

    def _reap(self, block):
        """Free the adopted saves that have finished (all, with block)."""
        for _ in range(len(self._orphans)):
            try:
                item = self._orphans.popleft()
            except IndexError:
                break
            handle, _, step = item
            try:
                with handle.use() as ptr:
                    if not block and not C.ckpt_save_done(ptr):
                        self._orphans.append(item)
                        continue
                    C.ckpt_save_wait(ptr)
            except Error as e:
                self._lost(e, step)
            handle.close()

    def _lost(self, error, step, warn=True):
        """A save failed and nobody waited for it: say so now, and raise it
        from close()."""
        if warn:
            warnings.warn("libckpt: the save of step %d failed and its handle "
                          "was dropped without wait(): %s" % (step, error),
                          RuntimeWarning, stacklevel=2)
        if self._unreported is None:
            self._unreported = error

    @property
    def closed(self):
        return self._h.closed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # do not mask the exception in flight
            try:
                self.close()
            except Error:
                pass

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is not None and not h.closed and C is not None:
            try:
                self.close()
            except Exception:  # reported by warnings already, or shutdown
                pass

    def __repr__(self):
        return "<libckpt.Store %r%s>" % (
            self.path if not self.closed else "?",
            " closed" if self.closed else "")

    @property
    def path(self):
        """The root path the store was opened on."""
        with self._h.use() as s:
            return os.fsdecode(C.ckpt_store_path(s))

    @property
    def pinned_bytes(self):
        """Pinned host bytes the store holds now (0 without CUDA)."""
        with self._h.use() as s:
            return C.ckpt_store_pinned_bytes(s)

    @contextlib.contextmanager
    def _checkpoint(self, step, level=ffi.CKPT_VERIFY_QUICK):
        """Step `step` (a number, or CKPT_LATEST: the newest that passes
        `level`) opened, as the library finds it."""
        ck = ffi.checkpoint_p()
        with self._h.use() as s:
            C.ckpt_checkpoint_open(_byref(ck), s, step, level)
            try:
                yield ck
            finally:
                C.ckpt_checkpoint_free(ck)

    # -- saving

    def save(self, step, tensors, metadata=None):
        """Begin saving ``tensors`` (a dict of names to arrays) as checkpoint
        ``step``; returns a :class:`SaveHandle` once the snapshot is taken.

        Accepts NumPy arrays, PyTorch CPU and CUDA tensors, and objects with
        ``__array_interface__`` or ``__cuda_array_interface__``; they must be
        contiguous.  ``metadata`` is any JSON-serialisable value, read back
        with :meth:`metadata`.  If the previous save is still persisting this
        first waits for it.  Device tensors are read on their framework's
        current stream (torch.cuda.current_stream(), or the interface's
        'stream'), and that stream is fenced so later work enqueued on it
        cannot overwrite them before the snapshot copy is done.
        """
        step = _step_number(step, "Store.save")
        self._reap(block=False)
        described = _tensors.describe_all(tensors)
        stream = _tensors.one_stream(described)
        arr, keep = _tensors.c_array(described)
        opts = ffi.ckpt_save_options()
        C.ckpt_save_options_init(_byref(opts), ffi.CKPT_SAVE_OPTIONS_VERSION)
        if metadata is not None:
            text = json.dumps(metadata, allow_nan=False).encode("utf-8")
            keep.append(text)
            opts.metadata_json = text
        opts.cuda_stream = stream
        device = any(t.memory == ffi.CKPT_MEM_DEVICE for t in described)
        ptr = ffi.save_p()
        with self._h.use() as s:
            C.ckpt_save_begin(_byref(ptr), s, step, arr, len(described),
                              _byref(opts))
        h = SaveHandle(self, ptr, step, keep if device else None)
        self._saves.add(h)
        if device:
            h.fence(stream)
        return h

    # -- reading

    def steps(self, full=False):
        """Every committed step, ascending, as dicts with the keys and value
        types of a step of ``ckpt list --json`` (docs/CLI.md): step, status
        ("valid", "incomplete", "corrupt" or "error"), path, time (Unix
        seconds), time_iso, tensors (count), raw_bytes, stored_bytes, ratio
        (raw/stored), chunks, stall_seconds, persist_seconds, save_seconds
        (stall + persist) and problems (dicts: step, status (in words:
        "corrupt", "incomplete", "io", ...), code (the CKPT_E* value),
        message, file, tensor, offset).  Fields other than step, status and
        problems are None when the step fails quick verification.  Steps
        are checked with quick verification (structure, sizes, index and
        manifest checksums), or with ``full=True`` by reading every
        chunk."""
        level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
        out = []
        for step in self._step_numbers():
            e = self._list_entry(step, level)
            if e is not None:
                out.append(e)
        return out

    def _list_entry(self, step, level):
        """One step as ``ckpt list --json`` shows it (tools/ckpt/store.c,
        cli_step_check and cli_step_json); None if it was retired
        meanwhile."""
        e = dict.fromkeys(_LIST_KEYS)
        e["step"] = step
        opened = False
        with self._h.use() as s:
            ck = ffi.checkpoint_p()
            try:
                C.ckpt_checkpoint_open(_byref(ck), s, step,
                                       ffi.CKPT_VERIFY_QUICK)
                opened = True
            except Error:
                pass  # ckpt_verify() below says why
            if opened:
                try:
                    t = C.ckpt_checkpoint_time(ck)
                    e.update(path=os.fsdecode(C.ckpt_checkpoint_path(ck)),
                             time=float(t), time_iso=_iso_time(t),
                             tensors=int(C.ckpt_checkpoint_tensor_count(ck)))
                    st = ffi.ckpt_save_stats()
                    try:
                        C.ckpt_checkpoint_stats(ck, _byref(st))
                    except Error:
                        pass
                    else:
                        e.update(raw_bytes=st.raw_bytes,
                                 stored_bytes=st.stored_bytes,
                                 ratio=(st.raw_bytes / st.stored_bytes
                                        if st.stored_bytes else None),
                                 chunks=st.chunks,
                                 stall_seconds=float(st.stall_s),
                                 persist_seconds=float(st.persist_s),
                                 save_seconds=float(st.stall_s + st.persist_s))
                finally:
                    C.ckpt_checkpoint_free(ck)
                if level == ffi.CKPT_VERIFY_QUICK:  # opening checked that
                    e.update(status="valid", problems=[])
                    return e
            status, message = 0, None
            report = ffi.report_p()
            C.ckpt_error_clear()
            try:
                C.ckpt_verify(s, step, level, _byref(report))
            except Error as err:
                status = (err.status if err.status is not None
                          else InternalError.status)
                message = err.message
            try:
                problems = [_list_problem(p) for p in _problems(report)]
            finally:
                C.ckpt_report_free(report)
        if (status == NotFoundError.status
                and step not in self._step_numbers()):
            return None  # retired meanwhile
        if status and not problems:
            problems = [_list_problem({
                "step": step, "status": status, "message": message or "",
                "file": None, "tensor": None, "offset": None})]
        e["status"] = _list_status(status, problems)
        e["problems"] = problems
        return e

    def _step_numbers(self):
        arr = ffi.c_int64_p()
        n = ctypes.c_size_t()
        with self._h.use() as s:
            C.ckpt_store_steps(s, _byref(arr), _byref(n))
        try:
            return [arr[i] for i in range(n.value)]
        finally:
            C.ckpt_free(arr)

    def latest(self, full=True):
        """The newest step that passes full verification (every chunk's
        hashes: the step :meth:`load` and :meth:`restore` pick), or None
        when there is none.  ``full=False`` asks for the newest step that
        passes quick verification (structure, sizes, index and manifest
        checksums) instead, which is cheaper but may name a step whose data
        is damaged."""
        step = ctypes.c_int64()
        level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
        try:
            with self._h.use() as s:
                C.ckpt_store_latest(s, level, _byref(step))
        except NoCheckpointError:
            return None
        return step.value

    def metadata(self, step=None):
        """The metadata saved with ``step``, or None if it had none.  With
        ``step=None``: that of the newest step that passes full
        verification, the one :meth:`latest` names and :meth:`load`
        loads (:class:`NoCheckpointError` when there is none)."""
        if step is None:
            opened = self._checkpoint(ffi.CKPT_LATEST, ffi.CKPT_VERIFY_FULL)
        else:
            opened = self._checkpoint(_step_number(step, "Store.metadata"))
        with opened as ck:
            return json.loads(C.ckpt_checkpoint_metadata(ck).decode("utf-8"))

    def load(self, step=None):
        """Read every tensor of ``step`` into new NumPy arrays; returns
        ``(step, {name: array})``.  Every chunk is verified.  With
        ``step=None`` the newest checkpoint that verifies is loaded: newer
        corrupt or incomplete ones are skipped with a
        :class:`SkippedCheckpointWarning`.

        bfloat16 tensors come back as ``ml_dtypes.bfloat16`` arrays when
        ml_dtypes is installed, else as uint16 arrays holding the bit
        patterns (``torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)``
        turns them into torch tensors); float8 likewise (uint8), and bool as bool.
        """
        if step is not None:
            step = _step_number(step, "Store.load")
            with self._checkpoint(step) as ck:
                return step, self._read_all(ck)
        # The library's newest-valid search (every chunk verified); then
        # the newer steps it passed over are reported with their reasons.
        try:
            with self._checkpoint(ffi.CKPT_LATEST, ffi.CKPT_VERIFY_FULL) as ck:
                found = C.ckpt_checkpoint_step(ck)
                arrays = self._read_all(ck)
        except NoCheckpointError as err:
            err.skipped = self._skipped_after(-1)
            raise
        _warn_skipped(self._skipped_after(found))
        return found, arrays

    def _skipped_after(self, found):
        """Problems of the committed steps newer than `found` (the ones a
        newest-valid search passed over), newest first."""
        skipped = []
        for s in reversed(self._step_numbers()):
            if s <= found:
                break
            report = ffi.report_p()
            try:
                with self._h.use() as h:
                    C.ckpt_verify(h, s, ffi.CKPT_VERIFY_FULL, _byref(report))
            except NotFoundError:
                continue  # retired meanwhile
            except Error as e:
                problems = _problems(report)
                skipped.append(problems[0] if problems else {
                    "step": s, "status": e.status, "code": e.code,
                    "message": e.message, "file": None, "tensor": None,
                    "offset": None})
            finally:
                C.ckpt_report_free(report)
        return skipped

    def _read_all(self, ck):
        out = {}
        info = ffi.ckpt_tensor_info()
        for i in range(C.ckpt_checkpoint_tensor_count(ck)):
            C.ckpt_checkpoint_tensor(ck, i, _byref(info))
            name = info.name
            a = np.empty(tuple(info.shape[:info.ndim]),
                         _tensors.numpy_dtype(info.dtype))
            if a.nbytes != info.bytes:
                raise CorruptError(
                    "tensor %r: %d bytes for shape %s and dtype %s"
                    % (name.decode("utf-8", "replace"), info.bytes,
                       a.shape, a.dtype), function="Store.load")
            C.ckpt_checkpoint_read(ck, name, a.ctypes.data, a.nbytes)
            out[name.decode("utf-8")] = a
        return out

    def restore(self, tensors, step=None, allow_missing=False):
        """Restore into the caller's arrays/tensors (a dict of names to
        them), in place, from ``step`` or, with None, from the newest
        checkpoint that fully verifies; returns the step restored.

        Names, dtypes and shapes must match the checkpoint
        (:class:`MismatchError`, :class:`NotFoundError`; with
        ``allow_missing`` absent names are left untouched).  Newer
        checkpoints skipped as corrupt or incomplete are reported with a
        :class:`SkippedCheckpointWarning`; when none can be restored,
        :class:`NoCheckpointError` lists them in ``.skipped``.  On failure
        the buffers' contents are unspecified.
        """
        described = _tensors.describe_all(tensors, writable=True)
        stream = _tensors.one_stream(described)
        arr, keep = _tensors.c_array(described)
        opts = ffi.ckpt_restore_options()
        C.ckpt_restore_options_init(_byref(opts),
                                    ffi.CKPT_RESTORE_OPTIONS_VERSION)
        opts.allow_missing = 1 if allow_missing else 0
        opts.cuda_stream = stream
        report = ffi.report_p()
        try:
            with self._h.use() as s:
                C.ckpt_restore(s, _step_arg(step), arr, len(described),
                               _byref(opts), _byref(report))
            restored = C.ckpt_report_step(report) if report else step
            problems = _problems(report)
        except NoCheckpointError as e:
            e.skipped = _problems(report)
            raise
        finally:
            C.ckpt_report_free(report)
        _warn_skipped(problems)
        return restored

    def verify(self, step=None, full=True):
        """Verify ``step`` (None: the newest committed one) by reading every
        chunk (``full=False``: structure, sizes and checksums of the index
        and manifest only).  Returns a report dict: step, ok (bool), status
        ("valid", "corrupt" or "incomplete"), level, error (None or the
        library's message) and problems (dicts: step, status, code,
        message, file, tensor, offset).  A damaged checkpoint raises
        nothing; a missing step or an I/O failure does."""
        level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
        report = ffi.report_p()
        error = None
        try:
            with self._h.use() as s:
                C.ckpt_verify(s, ffi.CKPT_NEWEST if step is None
                              else _step_number(step, "Store.verify"),
                              level, _byref(report))
        except CorruptError as e:
            error = e
        try:
            checked = C.ckpt_report_step(report) if report else -1
            problems = _problems(report)
        finally:
            C.ckpt_report_free(report)
        if checked < 0:
            checked = step
        if error is None:
            status = "valid"
        else:
            status = ("incomplete" if isinstance(error, IncompleteError)
                      else "corrupt")
        return {"step": checked, "ok": error is None, "status": status,
                "level": "full" if full else "quick",
                "error": error.message if error else None,
                "problems": problems}


def _choice(what, table, value):
    try:
        return table[value]
    except KeyError:
        raise ValueError("%s must be one of %s, not %r"
                         % (what, ", ".join(sorted(table)), value)) from None


# The keys of a step of `ckpt list --json` (docs/CLI.md, $defs/step).
_LIST_KEYS = ("step", "status", "path", "time", "time_iso", "tensors",
              "raw_bytes", "stored_bytes", "ratio", "chunks", "stall_seconds",
              "persist_seconds", "save_seconds", "problems")

def _status_word(status):
    """A status code in words, as the library names it for the CLI
    (ckpt_status_name)."""
    name = C.ckpt_status_name(status)
    return name.decode("ascii") if name else "unknown"


def _list_problem(p):
    """A problem dict of _problems() as ``ckpt list --json`` shows it."""
    step = p["step"]
    offset = p["offset"]
    return {"step": step if step is not None and step >= 0 else None,
            "status": _status_word(p["status"]),
            "code": p["status"],
            "message": p["message"],
            "file": p["file"] or None,
            "tensor": p["tensor"] or None,
            "offset": offset if offset is not None and offset >= 0 else None}


def _list_status(status, problems):
    """valid, incomplete, corrupt or error, as the CLI classifies a step."""
    if status == 0:
        return "valid"
    incomplete = IncompleteError.status
    if status == incomplete or any(p["code"] == incomplete for p in problems):
        return "incomplete"
    if status == CorruptError.status:
        return "corrupt"
    return "error"


def _iso_time(t):
    """Unix seconds as "2024-05-01T12:00:00Z" (UTC), "-" when unknown."""
    if not (t > 0) or not math.isfinite(t):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))

"""Store: the Python face of ckpt_store (saving, loading, restoring,
verifying and listing checkpoints of nested training state)."""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import json
import operator
import os
import pathlib
import platform
import sys
import warnings
import weakref
from typing import (Any, Callable, Dict, Iterator, List, Optional, Tuple,
                    Union)

from . import dist, ffi, nested, reports, roots
from . import tensors as _tensors
from .checkpoint import Checkpoint, check_framework
from .errors import (BusyError, Error, InvalidArgumentError, NoCheckpointError,
                     NotFoundError)
from .handles import SaveHandle, _Handle, interruptible
from .results import LoadResult, RestoreResult, restore_result

_no_gc = nested.no_gc

C = ffi.lib
_byref = ctypes.byref

_VERIFY = {"none": ffi.CKPT_VERIFY_NONE, "quick": ffi.CKPT_VERIFY_QUICK,
           "full": ffi.CKPT_VERIFY_FULL, "stored": ffi.CKPT_VERIFY_STORED}
_SNAPSHOT = {"host": ffi.CKPT_SNAPSHOT_HOST, "device": ffi.CKPT_SNAPSHOT_DEVICE,
             "stream": ffi.CKPT_SNAPSHOT_STREAM}

PathType = Union[str, bytes, os.PathLike]


def framework_versions() -> Dict[str, Optional[str]]:
    """The versions every save from Python records in its manifest's
    environment record ("frameworks", see ckpt_save_options in ckpt.h), for
    `ckpt doctor` to compare with the machine that restores: python and
    numpy, and torch with torch.version.cuda (None for a CPU-only build)
    only when the program has imported torch (never imported here)."""
    found: Dict[str, Optional[str]] = {"python": platform.python_version()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        found["numpy"] = str(numpy.__version__)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        found["torch"] = str(torch.__version__)
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        found["torch.cuda"] = None if cuda is None else str(cuda)
    return found


def _step_number(step: int, function: str) -> int:
    """`step` as the int64 the library takes: ctypes would wrap 2**64 + 5
    to 5 silently."""
    if isinstance(step, bool):  # an int subclass, but never a step
        raise TypeError("%s: step must be an integer, not bool" % function)
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError("%s: step must be an integer, not %s"
                        % (function, type(step).__name__)) from None
    if not 0 <= step <= ffi.CKPT_STEP_MAX:
        raise InvalidArgumentError(
            "step %d is out of range (0..%d)" % (step, ffi.CKPT_STEP_MAX),
            function=function)
    return step


def _check_names(flat: Any) -> None:
    """Refuse, naming the state's path, a tensor name the library would
    refuse by its position only (empty, or over CKPT_NAME_MAX (255) bytes
    of UTF-8), or one that is not UTF-8 at all (a lone surrogate).  Cheap when all are short (one pass in C over the lengths)."""
    names = flat.names
    if not names:
        return
    if "" in flat._names:
        i = flat._names[""]
        raise InvalidArgumentError(
            "%s flattens to an empty tensor name; give it a non-empty key"
            % nested.path_str(flat.path_of(i)))
    if not "\0".join(names).isascii():  # cheap for the usual ASCII names
        for i, name in enumerate(names):
            try:
                name.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate (from a
                # file name decoded with surrogateescape, say)
                raise InvalidArgumentError(
                    "%s flattens to a tensor name that is not valid UTF-8 "
                    "(%r at position %d); tensor names are UTF-8 text: "
                    "use another key" % (nested.path_str(flat.path_of(i)),
                                         name[e.start], e.start)) from None
    if max(map(len, names)) * 4 <= 255:  # 4 bytes per character at most
        return
    for i, name in enumerate(names):
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > 255:
            raise InvalidArgumentError(
                "%s flattens to a tensor name of %d bytes (%r...): names are "
                "1..255 bytes of UTF-8; use shorter keys"
                % (nested.path_str(flat.path_of(i)), size, name[:40]))


class Store:
    """A checkpoint root directory opened for writing (or, with
    ``readonly=True``, for reading).  A writer creates the root when it is
    missing, not its parents (:class:`libckpt.NotFoundError` names the
    missing one).

    ``keep_last`` committed steps are kept (0 keeps all), ``level`` is the
    zstd level (None: the library's default, 1), ``threads`` the number of
    worker threads (None: online CPUs).  Keyword-only options:
    ``fsync`` (False skips fsync: tests, tmpfs), ``readonly``,
    ``chunk_bytes``, ``host_memory_limit`` (snapshot buffer cap in bytes),
    ``pinned_limit`` (pinned host memory cap for device tensors in bytes;
    None or 0: 1 GiB),
    ``verify_after_save`` ("stored": every chunk read back and checked
    against its stored hash, the default; "full": also decompressed and
    checked; "quick" or "none"), ``snapshot`` ("host", "device" or
    "stream": how device tensors are snapshotted) and ``compress_all``
    (True: compress every chunk, the smallest files; by default each chunk
    is compressed or stored raw, whichever commits sooner), ``page_cache``
    ("auto": a save of 512 MiB or more, or larger than half the free
    memory, leaves the page cache as it reaches the disk, so it evicts
    nothing else; "keep"; "drop":
    always, polite on a shared server),
    ``metrics_path`` (a file replaced atomically after each commit by the
    root's Prometheus metrics, :meth:`metrics`; docs/OPERATIONS.md).

    Several ranks, one checkpoint: ``coordinator`` (a
    :class:`libckpt.dist.Coordinator`, e.g. ``TorchCoordinator()``) with
    ``rank`` and ``world_size`` (default: the coordinator's) and
    ``timeout`` (seconds each collective may wait; default the
    coordinator's own ``timeout`` when it has one, which it may not
    exceed, else 600) make opening, saving and restoring the newest step
    collective (docs/SCALING.md).

    Only one process (one job, with a coordinator) may open a root for
    writing: a second gets :class:`libckpt.BusyError`.  A store may be used from several threads.
    Close it with ``with`` or :meth:`close`; that waits for saves in flight.
    """

    def __init__(self, path: PathType, keep_last: int = 3,
                 level: Optional[int] = None, threads: Optional[int] = None,
                 *, fsync: bool = True, readonly: bool = False,
                 chunk_bytes: Optional[int] = None,
                 host_memory_limit: Optional[int] = None,
                 pinned_limit: Optional[int] = None,
                 verify_after_save: str = "stored",
                 snapshot: str = "host", trust_group: bool = False,
                 rewind: bool = False, record_command_line: bool = True,
                 coordinator: Any = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None,
                 timeout: Optional[float] = None,
                 metrics_path: Optional[PathType] = None,
                 compress_all: bool = False,
                 page_cache: str = "auto") -> None:
        opts = ffi.ckpt_store_options()
        C.ckpt_store_options_init(_byref(opts), ffi.CKPT_STORE_OPTIONS_VERSION)
        self._coordinator = coordinator  # its callbacks must outlive the store
        if coordinator is not None:  # opening is collective too
            dist.quiet_coordinator(coordinator, None)
        if coordinator is not None:
            opts.rank = operator.index(coordinator.rank if rank is None else rank)
            opts.world_size = operator.index(coordinator.world_size
                                             if world_size is None else world_size)
            opts.coordinator = ctypes.pointer(coordinator._c())
        elif world_size is not None:
            opts.world_size = operator.index(world_size)
            opts.rank = operator.index(rank or 0)
        self._ranks = (opts.rank, max(opts.world_size, 1))  # restore_result
        timeout = dist.timeout_within(coordinator, timeout)
        if timeout is not None:
            opts.timeout_ms = max(1, int(timeout * 1000))
        # for the collectives the binding runs itself (dist.load_resharded)
        self._timeout = (opts.timeout_ms or 600000) / 1000.0
        if readonly:
            opts.flags |= ffi.CKPT_OPEN_READONLY
        if trust_group:  # a project root shared by a group (RELIABILITY.md)
            opts.flags |= ffi.CKPT_OPEN_TRUST_GROUP
        if rewind:  # saving below the newest step retires the steps above
            opts.flags |= ffi.CKPT_OPEN_REWIND
        if not record_command_line:
            opts.flags |= ffi.CKPT_OPEN_NO_CMDLINE
        if compress_all:  # smallest files rather than the soonest commit
            opts.flags |= ffi.CKPT_OPEN_COMPRESS_ALL
        cache_flags = {"auto": 0, "keep": ffi.CKPT_OPEN_KEEP_CACHE,
                       "drop": ffi.CKPT_OPEN_DROP_CACHE}
        if not isinstance(page_cache, str) or page_cache not in cache_flags:
            raise ValueError("page_cache must be 'auto', 'keep' or 'drop', not %r"
                             % (page_cache,))
        opts.flags |= cache_flags[page_cache]
        # ctypes would wrap a value outside its C field (keep_last=2**32+1
        # became 1, and deleted steps): checked here, named as passed.
        opts.keep_last = _in_range("keep_last", keep_last, 0, 2**31 - 1)
        if level is not None:
            opts.level = _in_range("level", level, -2**31, 2**31 - 1)
        if threads is not None:
            opts.threads = _in_range("threads", threads, 0, 2**31 - 1)
        if chunk_bytes is not None:
            opts.chunk_bytes = _in_range("chunk_bytes", chunk_bytes, 0, 2**64 - 1)
        if host_memory_limit is not None:
            opts.host_memory_limit = _in_range("host_memory_limit",
                                               host_memory_limit, 0, 2**64 - 1)
        if pinned_limit is not None:
            opts.pinned_limit = _in_range("pinned_limit", pinned_limit, 0,
                                          2**64 - 1)
        opts.fsync = 1 if fsync else 0
        opts.verify_after_save = _choice("verify_after_save", _VERIFY,
                                         verify_after_save)
        opts.snapshot_mode = _choice("snapshot", _SNAPSHOT, snapshot)
        if metrics_path is not None:  # copied by ckpt_store_open
            opts.metrics_path = os.fsencode(metrics_path)
        ptr = ffi.store_p()
        try:
            C.ckpt_store_open(_byref(ptr), os.fsencode(path), _byref(opts))
        except BusyError as e:  # the C flag's name, in Python's words
            e.message = e.message.replace("with CKPT_OPEN_READONLY",
                                          "with readonly=True")
            e.args = (str(e),)
            raise
        self._h = _Handle(ptr, C.ckpt_store_free, "store")
        _OPEN.add(self)
        self._readers: set = set()  # _Handles of open Checkpoints
        self._saves = weakref.WeakSet()  # live SaveHandles
        # Saves whose handles were dropped unfinished: (handle, keep, step).
        # A deque: appended from __del__ (any thread, any time) without a
        # lock that the interrupted thread might hold.
        self._orphans = collections.deque()
        self._unreported = None  # first failure of a save nobody waited on
        self.readonly = bool(readonly)
        if self.readonly:
            roots.note_foreign_root(path)
        # Store.path gives back the kind of path it was given.
        self._path_type = (bytes if isinstance(path, bytes) else
                           str if isinstance(path, str) else pathlib.Path)
        if coordinator is not None:
            dist.register_with_coordinator(coordinator, self)

    # -- lifetime

    def close(self) -> None:
        """Wait for saves in flight, close the checkpoints opened with
        :meth:`open`, release the lock and free the store (idempotent).
        Raises the error of a save that failed and whose handle nobody
        waited on."""
        if self._h.closed:
            return
        for r in list(self._readers):  # they borrow the C store
            r.close()
        self._readers.clear()
        for h in list(self._saves):
            h.close()
            if h._error is not None and not h._waited:
                self._lost(h._error, h.step, warn=False)
        self._reap(block=True)
        self._h.close()
        failed, self._unreported = self._unreported, None
        if failed is not None:
            raise failed

    def _adopt(self, handle: Any, keep: Any, step: int) -> None:
        self._orphans.append((handle, keep, step))

    def _in_flight(self) -> bool:
        """Whether a save of this store may still be running."""
        return bool(self._orphans) or any(not h.done() for h in list(self._saves))

    def _quiet_others(self) -> None:
        """Before a collective call: the saves in flight of the other
        stores sharing this store's coordinator are done (see
        dist.quiet_coordinator)."""
        if self._coordinator is not None and self._ranks[1] > 1:
            dist.quiet_coordinator(self._coordinator, self)

    def _wait_in_flight(self) -> None:
        with self._h.use() as s:  # on the thread that makes the call
            C.ckpt_store_wait(s)

    def _reap(self, block: bool, stacklevel: int = 4) -> None:
        """Free the adopted saves that have finished (all, with block);
        a failure is warned of `stacklevel` frames up (see _lost)."""
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
                self._lost(e, step, stacklevel=stacklevel)
            handle.close()

    def _lost(self, error: Error, step: int, warn: bool = True,
              stacklevel: int = 4) -> None:
        """A save failed and nobody waited for it: say so now, and raise it
        from close().  The warning points `stacklevel` frames up: by
        default the caller of the save() or close() that reaped it."""
        if warn:
            warnings.warn("libckpt: the save of step %d failed and its handle "
                          "was dropped without wait(): %s" % (step, error),
                          RuntimeWarning, stacklevel=stacklevel)
        if self._unreported is None:
            self._unreported = error

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __reduce__(self) -> Any:
        raise TypeError(
            "a Store cannot be pickled or sent to another process (it holds "
            "C handles and, writing, the root's lock): pass its path and open "
            "a Store there (readonly=True to read while this one writes)")

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # do not mask the exception in flight
            try:
                self.close()
            except Error:
                pass

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.closed and C is not None:
            try:
                self.close()
            except Exception:  # reported by warnings already, or shutdown
                pass

    def __repr__(self) -> str:
        return "<libckpt.Store %r%s>" % (
            self.path if not self.closed else "?",
            " closed" if self.closed else "")

    @property
    def path(self) -> Union[str, bytes, pathlib.Path]:
        """The root path, of the type given to the constructor (str, bytes,
        or a pathlib.Path for any os.PathLike)."""
        with self._h.use() as s:
            raw = C.ckpt_store_path(s)
        if self._path_type is bytes:
            return raw
        text = os.fsdecode(raw)
        return text if self._path_type is str else pathlib.Path(text)

    @property
    def pinned_bytes(self) -> int:
        """Pinned host bytes the store holds now (0 without CUDA)."""
        with self._h.use() as s:
            return C.ckpt_store_pinned_bytes(s)

    @contextlib.contextmanager
    def _checkpoint(self, step: int,
                    level: int = ffi.CKPT_VERIFY_QUICK) -> Iterator[Any]:
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

    def save(self, step: int, state: Any, metadata: Any = None
             ) -> SaveHandle:
        """Begin saving ``state`` as checkpoint ``step``; returns a
        :class:`SaveHandle` once the snapshot is taken (host tensors are
        copied: the caller may change them right away).

        ``state`` is any nesting of dicts, lists and tuples (a flat
        ``{name: array}`` as well as ``{"model": model.state_dict(),
        "optim": opt.state_dict(), "epoch": 3}``) whose leaves are
        tensors (NumPy arrays and scalars, torch CPU and CUDA tensors,
        objects with ``__array_interface__``, ``__cuda_array_interface__``
        or ``__dlpack__``; any strided layout, read through a row-major copy
        when it is not one) or plain values (None, bool, int,
        float, str, bytes).  Tensors are stored under their key paths
        joined with dots (``model.fc1.weight``); the structure and the
        plain values go into the checkpoint's metadata (see
        libckpt.nested).  ``metadata`` is any JSON value, read back with
        :meth:`metadata`.  If the previous save is still persisting this
        first waits for it.  Device tensors are read on their framework's
        current stream (or the interface's 'stream'), which is then
        fenced, so later work enqueued on it cannot overwrite them before
        the snapshot copy is done.
        """
        number = -1  # for the other ranks when the step itself is refused
        self._quiet_others()  # a collective call follows, refused or not
        try:
            number = step = _step_number(step, "Store.save")
            arr, n, keep, opts, stream, device = self._save_args(state,
                                                                 metadata)
        except Exception as e:  # refused here: tell the other ranks
            self._refuse(e, lambda s, status, why: C.ckpt_save_refuse(
                s, number, status, why))
            raise
        ptr = ffi.save_p()
        with self._h.use() as s:
            C.ckpt_save_begin(_byref(ptr), s, step, arr, n, _byref(opts))
        h = SaveHandle(self, ptr, step, keep if device else None)
        self._saves.add(h)
        if device:
            h.fence(stream)
        return h

    def _save_args(self, state: Any, metadata: Any) -> Tuple[Any, ...]:
        """What ckpt_save_begin takes for ``state`` and ``metadata``, once
        the save in flight is done: (tensor array, count, objects to keep
        alive, options, CUDA stream, whether a tensor is on a device)."""
        # The metadata goes one level inside the text the library parses.
        if isinstance(metadata, (dict, list, tuple)) and nested.json_deeper_than(
                metadata, nested.JSON_MAX_DEPTH - 1):
            raise InvalidArgumentError(
                "metadata nests deeper than a checkpoint holds (its JSON "
                "may nest %d levels, the metadata going one inside)"
                % nested.JSON_MAX_DEPTH)
        if isinstance(metadata, (dict, list, tuple, int)):
            where = nested.json_int_beyond_64_bits(metadata)
            if where is not None:
                raise InvalidArgumentError(
                    "metadata%s: an integer beyond 64 bits, which a "
                    "checkpoint's metadata cannot hold (JSON integers are "
                    "stored as signed 64-bit numbers); put it in the state, "
                    "which keeps any int, or store it as a string" % where)
        # The library waits for the save in flight before a new one: wait
        # here first, where Ctrl-C still interrupts (handles.interruptible),
        # then report a dropped save that failed, at this save as promised.
        interruptible(self._wait_in_flight, lambda: not self._in_flight())
        self._reap(block=False, stacklevel=5)  # save() -> here -> _reap
        with _no_gc():
            flat = nested.flatten(state)
            _check_names(flat)
            arr, keep, stream, device = _tensors.prepare(flat.names, flat.objs)
            n = len(flat.names)
            # Compact: the library parses it (and keeps its own compact form).
            try:
                text = json.dumps(nested.wrap(flat.tree, metadata,
                                              version=flat.version),
                                  allow_nan=False,
                                  separators=(",", ":")).encode("utf-8")
            except RecursionError:  # the state itself passed flatten
                raise InvalidArgumentError(
                    "metadata nests deeper than Python can walk (its "
                    "recursion limit is %d)" % sys.getrecursionlimit()
                ) from None
            # The tree is JSON-ready (flatten encoded every plain value):
            # what json refuses is in the metadata, stored as plain JSON.
            except ValueError as e:
                raise InvalidArgumentError(
                    "metadata: %s; metadata is stored as plain JSON, without "
                    "NaN or infinities: put such values in the state, which "
                    "keeps them" % e) from None
            except TypeError as e:
                raise TypeError(
                    "metadata: %s; metadata is stored as plain JSON (dicts "
                    "with str keys, lists, str, int, float, bool, None): put "
                    "tensors and other values in the state" % e) from None
            # Freed while the collector is paused, so that a collection
            # started when it resumes finds almost nothing young alive
            # instead of the whole flattened state (a 12,000-tensor model
            # and Adam state: 30 collections taking 57 ms over ten saves
            # and restores before, none after).
            del flat
        opts = ffi.ckpt_save_options()
        C.ckpt_save_options_init(_byref(opts), ffi.CKPT_SAVE_OPTIONS_VERSION)
        keep.append(text)
        opts.metadata_json = text
        opts.cuda_stream = stream
        frameworks = json.dumps(framework_versions()).encode("utf-8")
        keep.append(frameworks)
        opts.frameworks_json = frameworks
        return arr, n, keep, opts, stream, device

    def _refuse(self, error: Exception, call: Callable[..., Any]) -> None:
        """On a store of several ranks, tell the others that this rank
        refused its part of a collective call before reaching the library
        (``error``, about to be raised here), through ``call(store,
        status, message)``: ckpt_save_refuse or ckpt_restore_refuse.  They
        fail that call at once with this rank's reason, and every rank
        stays in step; otherwise this rank's next call would meet their
        collectives of this one, and every later save would fail."""
        if self._ranks[1] <= 1 or not ffi.HAVE_REFUSE:
            return
        status = getattr(error, "status", None)
        if not isinstance(status, int) or status >= 0:
            status = InvalidArgumentError.status
        why = ("rank %d: %s: %s" % (self._ranks[0], type(error).__name__,
                                    error)).encode("utf-8", "replace")
        try:
            with self._h.use() as s:
                call(s, status, why)
        except Exception:  # the refusal's own outcome is no news here
            pass

    # -- reading

    def open(self, step: Optional[int] = None, *, framework: str = "auto",
             device: Any = None, full: bool = False) -> Checkpoint:
        """Open ``step`` for lazy reading: a :class:`Checkpoint` listing its
        tensors and reading them one at a time (only their chunks, each
        verified).  With ``step=None``: the newest step that passes quick
        verification (``full=True``: full verification, which reads the
        whole step once), newer ones being skipped and reported in
        ``.skipped``.  Close it, or use ``with``."""
        check_framework(framework, device)
        level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
        if step is not None:
            return self._open(_step_number(step, "Store.open"), level,
                              framework, device)
        return self._open_latest(level, framework, device)

    def _open(self, step: int, level: int, framework: str, device: Any,
              skipped: Optional[List[dict]] = None) -> Checkpoint:
        ck = ffi.checkpoint_p()
        with self._h.use() as s:
            C.ckpt_checkpoint_open(_byref(ck), s, step, level)
            return Checkpoint(self, ck, framework, device, skipped)

    def _open_latest(self, level: int, framework: str,
                     device: Any) -> Checkpoint:
        """The library's newest-valid search; then the newer steps it
        passed over are reported with their reasons."""
        try:
            ck = self._open(ffi.CKPT_LATEST, level, framework, device)
        except NoCheckpointError as err:  # each step it passed over, reported
            reports.no_checkpoint(err, reports.skipped_after(self, -1, level),
                                  self.path, stacklevel=4)
            raise
        try:
            ck.skipped = reports.skipped_after(self, ck.step, level)
        except BaseException:
            ck.close()
            raise
        reports.report_skipped(ck.skipped, stacklevel=4)
        return ck

    def load(self, step: Optional[int] = None, *, framework: str = "auto",
             device: Any = None) -> LoadResult:
        """Read the whole state of ``step``; returns ``(step, state)`` (a
        :class:`LoadResult`), ``state`` nested as it was saved.  Every
        chunk is verified.  With ``step=None`` the newest checkpoint that
        fully verifies is loaded: newer corrupt or incomplete ones are
        skipped with a :class:`SkippedCheckpointWarning`, a log record and
        an entry in ``.skipped``.

        ``framework``: "auto" (default) gives each tensor as it was saved
        (torch for torch tensors, NumPy for the rest; NumPy for all where
        torch is not installed, and for a dtype this torch lacks), "np"
        NumPy arrays, "pt" torch tensors (bfloat16 stays bfloat16).
        ``device`` ("cuda:0", a torch.device) moves torch tensors there."""
        check_framework(framework, device)
        number = None if step is None else _step_number(step, "Store.load")
        try:
            if number is not None:
                with self._open(number, ffi.CKPT_VERIFY_QUICK, framework,
                                device) as ck:
                    result = LoadResult(ck.step, ck.state(), [])
            else:
                result = self._load_newest(framework, device)
        except Error as err:
            if err.status is not None:  # the library's, not the caller's
                reports.record_restore(self, -1, err, list(err.skipped))
            raise
        reports.record_restore(self, result.step, None, result.skipped)
        return result

    def _load_newest(self, framework: str, device: Any) -> LoadResult:
        """load() of the newest step that fully verifies, reading its data
        once: each committed step, newest first, is opened (quick
        verification) and read whole, which checks the hashes of every
        chunk of every tensor it reads; a step whose state leaves a tensor
        unread is verified fully as well.  (A full verification and then
        the read would read every byte twice.)  Steps that fail are
        skipped and reported as a full verification reports them.  A step
        retired by a writer since the listing, or at its end, has newer
        ones after it: the root is listed again (as the C search does)."""
        skipped: List[dict] = []
        for step in self._newest_first():
            try:
                ck = self._open(step, ffi.CKPT_VERIFY_QUICK, framework, device)
            except NotFoundError:
                continue  # retired meanwhile: the walk lists again
            except Error as err:
                if not reports.is_damage(err):
                    if skipped:  # those passed over are said all the same
                        reports.no_checkpoint(err, skipped, self.path,
                                              stacklevel=4)
                    raise
                skipped.append(reports.first_problem(self, step, err))
                continue
            try:
                with ck:
                    state = ck.state()
                    if not ck._read_every:
                        reports.verify_full(self, step)
            except Error as err:
                if not reports.is_damage(err):
                    if skipped:
                        reports.no_checkpoint(err, skipped, self.path,
                                              stacklevel=4)
                    raise
                if (isinstance(err, NotFoundError)
                        and step not in self._step_numbers()):
                    continue  # retired while read: the walk lists again
                skipped.append(reports.first_problem(self, step, err))
                continue
            reports.report_skipped(skipped, stacklevel=4)
            return LoadResult(step, state, skipped)
        err = NoCheckpointError("no checkpoint in %s" % (self.path,),
                                function="Store.load")
        # Every step damaged: each one is warned about and logged, as when
        # an older step is loaded, and the message says so (a job that
        # catches NoCheckpointError to start afresh must not lose its
        # progress silently).
        reports.no_checkpoint(err, skipped, self.path, stacklevel=4)
        raise err

    def _newest_first(self) -> Iterator[int]:
        """The committed steps, newest first, each once; when the listing
        runs out, or a step yielded is gone by the time the next is asked
        for, the root is listed again for steps not yet yielded (at most
        16 times: a reader racing a writer that keeps one step)."""
        tried: set = set()
        steps, relists = self._step_numbers(), 0
        while True:
            fresh = [s for s in reversed(steps) if s not in tried]
            if not fresh:
                if relists == _RELISTS:
                    return
                relists += 1
                steps = self._step_numbers()
                if all(s in tried for s in steps):
                    return
                continue
            step = fresh[0]
            tried.add(step)
            yield step  # resumed only when that step could not be used
            if relists < _RELISTS:
                now = self._step_numbers()
                if step not in now:  # retired under us: newer steps came
                    relists += 1
                    steps = now

    def metadata(self, step: Optional[int] = None) -> Any:
        """The ``metadata=`` saved with ``step``, or None if it had none.
        With ``step=None``: that of the newest step that passes full
        verification, the one :meth:`latest` names and :meth:`load`
        loads (:class:`NoCheckpointError` when there is none)."""
        if step is None:
            opened = self._checkpoint(ffi.CKPT_LATEST, ffi.CKPT_VERIFY_FULL)
        else:
            opened = self._checkpoint(_step_number(step, "Store.metadata"))
        with opened as ck:
            meta = nested.load_metadata(C.ckpt_checkpoint_metadata(ck))
        return nested.unwrap(meta)[1]

    def restore(self, state: Any, step: Optional[int] = None, *,
                strict: bool = True, allow_missing: Optional[bool] = None,
                full: bool = True) -> RestoreResult:
        """Restore into the tensors of ``state`` (nested as for
        :meth:`save`; writable; one tensor may stand under several names,
        as tied weights do, and is then filled from the last of them, as
        ``load_state_dict`` would; tensors must not overlap otherwise), in
        place, matched by their flattened names, from ``step`` or, with
        None, the newest
        checkpoint that can be restored.  Returns the step as a
        :class:`RestoreResult`, whose ``.state`` holds the plain values
        from the checkpoint (they cannot be filled in place).

        dtypes and shapes must match (:class:`MismatchError`).  With
        ``strict`` (the default) a tensor of ``state`` that the checkpoint
        lacks is a :class:`NotFoundError`; ``strict=False`` leaves it
        untouched and lists it in ``.missing_keys`` (``allow_missing=True``
        is the older spelling of ``strict=False``).  Newer checkpoints
        skipped as damaged are reported as by :meth:`load`; when the
        restore fails (none can be restored: :class:`NoCheckpointError`)
        the error lists them in ``.skipped``.  A newer checkpoint found
        damaged while it was being read may already have written into
        the buffers: when the older one restored instead lacks such a
        tensor (``strict=False``), the restore fails with
        :class:`CorruptError` naming it rather than pass it off as
        untouched; set it again and restore that step by number.  On
        failure the buffers' contents are unspecified.

        ``full`` (the default): the rest of what this process saved in the
        step (the whole step; with several ranks, this rank's part) is
        verified too before the step is taken, so that what is read from
        it next (an optimizer's state, with ``open(step).state(...)``)
        reads back; a step whose other tensors are damaged is skipped like
        one whose restored tensors are.  ``full=False`` verifies only the
        chunks restored (cheaper when the step holds much more than
        ``state``)."""
        if allow_missing is not None:
            strict = not allow_missing
        # The collector stays paused until the state's flattened form is
        # gone (see save); the C restore allocates no Python objects.
        with _no_gc():
            return self._restore(state, step, strict, bool(full))

    def _restore(self, state: Any, step: Optional[int], strict: bool,
                 full: bool = True) -> RestoreResult:
        number = (ffi.CKPT_LATEST if step is None
                  else _step_number(step, "Store.restore"))
        if number == ffi.CKPT_LATEST:  # collective, refused or not
            self._quiet_others()
        try:
            flat = nested.flatten(state)
            _check_names(flat)
            arr, keep, stream, _ = _tensors.prepare(flat.names, flat.objs,
                                                    writable=True)
        except Exception as e:  # refused here: tell the other ranks
            if number == ffi.CKPT_LATEST:  # the collective restore
                self._refuse(e, lambda s, status, why: C.ckpt_restore_refuse(
                    s, status, why, None))
            raise
        n = len(flat.names)
        opts = ffi.ckpt_restore_options()
        C.ckpt_restore_options_init(_byref(opts), ffi.RESTORE_OPTIONS_VERSION)
        opts.allow_missing = 0 if strict else 1
        opts.cuda_stream = stream
        if ffi.HAVE_RESTORE_VERIFY:  # an older library verifies what it restores
            opts.verify = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_STORED
        report = ffi.report_p()
        # The step restored from comes back open: its metadata and names
        # are read from it, not from a second open of the step.
        ck = ffi.checkpoint_p()
        with self._h.use() as s:
            try:
                try:
                    if ffi.HAVE_RESTORE_OPEN:
                        C.ckpt_restore_open(s, number, arr, n,
                                            _byref(opts), _byref(report),
                                            _byref(ck))
                    else:
                        C.ckpt_restore(s, number, arr, n,
                                       _byref(opts), _byref(report))
                    restored = C.ckpt_report_step(report) if report else step
                    skipped = reports.from_report(report)
                    _tensors.copy_back(keep)  # tensors not laid out row-major
                except Error as e:  # which newer steps were passed over:
                    # in e.skipped, warned about and logged as when an
                    # older step is restored (all of them damaged, the
                    # NoCheckpointError says so)
                    reports.no_checkpoint(
                        e, reports.from_report(report), self.path,
                        stacklevel=4, head=_search_head(e))
                    raise
                finally:
                    C.ckpt_report_free(report)
                reports.report_skipped(skipped, stacklevel=4)  # restore's caller
                if not ck:
                    C.ckpt_checkpoint_open(_byref(ck), s, restored,
                                           ffi.CKPT_VERIFY_QUICK)
                return restore_result(ck, state, flat, skipped, strict,
                                      self._ranks)
            finally:
                if ck:
                    C.ckpt_checkpoint_free(ck)

    def latest(self, full: bool = True) -> Optional[int]:
        """The newest step that passes full verification (every chunk's
        hashes: the step :meth:`load` picks), or None when there is none.
        ``full=False`` asks for the newest step that passes quick
        verification (structure, sizes, index and manifest checksums)
        instead, which is cheaper but may name a step whose data is
        damaged."""
        step = ctypes.c_int64()
        level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
        try:
            with self._h.use() as s:
                C.ckpt_store_latest(s, level, _byref(step))
        except NoCheckpointError:
            return None
        return step.value

    def verify(self, step: Optional[int] = None, full: bool = True
               ) -> Dict[str, Any]:
        """Verify ``step`` (None: the newest committed one) by reading every
        chunk (``full=False``: structure, sizes and checksums of the index
        and manifest only).  Returns a report dict: step, ok (bool), status
        ("valid", "corrupt" or "incomplete"), level ("full" or "quick"),
        error (None or the library's message) and problems (problem
        records, see libckpt.reports).  A damaged checkpoint raises
        nothing; a missing step or an I/O failure does."""
        if step is not None:
            step = _step_number(step, "Store.verify")
        return reports.verify(self, step, full)

    def steps(self, full: bool = False) -> List[Dict[str, Any]]:
        """Every committed step, ascending, as dicts with the keys and value
        types of a step of ``ckpt list --json`` (docs/CLI.md): step, status
        ("valid", "incomplete", "corrupt" or "error"), path, time (Unix
        seconds), time_iso, tensors (count), raw_bytes, stored_bytes, ratio
        (raw/stored), chunks, stall_seconds, persist_seconds, save_seconds
        (stall + persist) and problems (problem records).  Fields other than
        step, status and problems are None when the step fails quick
        verification.  Steps are checked with quick verification, or with
        ``full=True`` by reading every chunk."""
        level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
        out = []
        for step in self._step_numbers():
            e = reports.list_entry(self, step, level)
            if e is not None:
                out.append(e)
        return out

    def events(self, since: float = 0.0) -> List[Dict[str, Any]]:
        """The root's event log (docs/OPERATIONS.md): one dict per save
        begun, committed or failed, restore, verify and gc of a writer,
        oldest first, those whose "time" (Unix seconds) is >= ``since``."""
        text = self._text_call(C.ckpt_store_events, ctypes.c_double(since))
        return [json.loads(line) for line in text.splitlines() if line]

    def metrics(self) -> str:
        """The root's health in the Prometheus text format (what
        ``ckpt metrics`` prints; docs/OPERATIONS.md lists the metrics)."""
        return self._text_call(C.ckpt_store_metrics)

    def _text_call(self, fn, *args) -> str:
        out = ctypes.c_void_p()
        with self._h.use() as s:
            fn(s, *args, _byref(out))
        try:
            return ctypes.string_at(out.value).decode() if out.value else ""
        finally:
            C.ckpt_free(out)

    def _step_numbers(self) -> List[int]:
        """The committed steps, ascending, once the save in flight (if any)
        is committed or failed: load(), verify() and steps() see the save
        this store began, as the C calls that read steps do."""
        arr = ffi.c_int64_p()
        n = ctypes.c_size_t()
        with self._h.use() as s:
            C.ckpt_store_wait(s)
            C.ckpt_store_steps(s, _byref(arr), _byref(n))
        try:
            return [arr[i] for i in range(n.value)]
        finally:
            C.ckpt_free(arr)


# How many times a search for the newest step lists the root again (as
# lib/pipeline/walk.c's WALK_MAX_RELISTS).
_RELISTS = 16

# Open stores, for _after_fork_in_child.
_OPEN: "weakref.WeakSet[Store]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a process made by fork() (a DataLoader worker): give up its copy
    of every store.  A writer's lock would otherwise keep the root locked
    after the parent closes its store, until the worker exits; and freeing
    any store, reading ones too, would join worker threads that did not
    survive fork() and hang the child for ever.  The child's copies are
    left unusable and never freed.  Takes no lock that a thread of the
    parent might have held.  Its checkpoints and save handles go the same
    way: reading one, or waiting for a save, would wait for those threads
    too (the C library refuses them in a child as well)."""
    forked = " (its process was forked from the one that made it)"
    for store in list(_OPEN):
        for r in list(store._readers):
            r.forget_after_fork("checkpoint" + forked)
        store._readers.clear()
        for s in list(store._saves):
            s._h.forget_after_fork("save handle" + forked)
        store._saves = weakref.WeakSet()  # none in flight here
        for handle, _, _ in list(store._orphans):
            handle.forget_after_fork("save handle" + forked)
        store._orphans.clear()
        h = store._h
        ptr = h._ptr
        if ptr is not None:
            C.ckpt_store_release_after_fork(ptr)
        h.forget_after_fork("store" + forked)
    _OPEN.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_at_exit() -> None:
    """At interpreter exit, before finalization: close every open store,
    so that the saves in flight that nobody waited for (a dropped handle, a
    rank leaving on an uncaught exception) still commit.  Later, when
    finalization collects the stores, a coordinator's Python callbacks no
    longer run: the collectives of a save of several ranks then failed
    after the store's timeout and the step was lost.  A failure is printed,
    not raised (nobody is left to catch it)."""
    for store in list(_OPEN):
        try:
            where = repr(store)
            store.close()
        except Exception as e:  # noqa: BLE001 - at exit, say it and go on
            print("libckpt: at exit, closing %s: %s" % (where, e), file=sys.stderr)


atexit.register(_close_at_exit)


def _search_head(err: Error) -> str:
    """The start of a NoCheckpointError's message about the steps it
    skipped, before the root: a collective restore (several ranks) says
    that no step is one every rank can restore."""
    every = "no step that every rank can restore in"
    return every if str(err.message).startswith(every) else \
        "no valid checkpoint in"


def _in_range(what: str, value: Any, low: int, high: int) -> int:
    """`value` as an int (TypeError for a non-integer, bool included)
    when low <= value <= high, else ValueError naming it as passed."""
    if isinstance(value, bool):
        raise TypeError("%s must be an integer, not bool" % what)
    n = operator.index(value)
    if not low <= n <= high:
        raise ValueError("%s=%d is out of range (%d .. %d)" % (what, n, low, high))
    return n


def _choice(what: str, table: Dict[str, int], value: str) -> int:
    try:
        return table[value]
    except KeyError:
        raise ValueError("%s must be one of %s, not %r"
                         % (what, ", ".join(sorted(table)), value)) from None

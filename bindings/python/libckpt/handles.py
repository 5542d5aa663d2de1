"""SaveHandle, and the thread-safe wrapper of a C handle shared by Store,
SaveHandle and Checkpoint."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any, Callable, Dict, Iterator, Optional

from . import ffi
from .errors import Error

C = ffi.lib
_byref = ctypes.byref


class _Closed(ValueError):
    """Raised when a closed Store or SaveHandle is used."""


class _Handle:
    """A C handle shared by threads.  Calls run inside use(); close() stops
    new calls, waits for running ones, then frees the handle exactly once."""

    def __init__(self, ptr: Any, free: Callable[[Any], None],
                 what: str) -> None:
        self._ptr = ptr
        self._free = free
        self._what = what
        self._cond = threading.Condition()
        self._users = 0
        self.forked = False  # given up in a child made by fork()

    def forget_after_fork(self, what: str) -> None:
        """In a child made by fork(): drop the pointer unfreed (the C
        library's threads stayed in the parent, see ckpt.h), so that every
        later use raises ValueError naming `what`.  Takes no lock: a thread
        of the parent may have held this one at the fork.  A handle closed
        before the fork stays as it was: its outcome was known."""
        self._cond = threading.Condition()
        self._users = 0
        self.forked = self._ptr is not None
        self._ptr = None
        self._what = what

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
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
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        with self._cond:
            ptr, self._ptr = self._ptr, None
            while self._users:
                self._cond.wait()
        if ptr is not None:
            self._free(ptr)



def interruptible(block: Callable[[], None], done: Callable[[], bool]) -> None:
    """Run `block`, a call into the library that may wait long (for a
    save on slow storage), so that Ctrl-C still interrupts the caller.
    Python runs signal handlers only in the main thread, between bytecodes:
    a C call there defers KeyboardInterrupt until it returns.  So on the
    main thread, unless `done()` says there is nothing to wait for, `block`
    runs on a helper thread while this one waits on an Event, which a
    signal interrupts.  An interrupted caller leaves the helper waiting:
    the save goes on, and a later wait() or close() finds its outcome."""
    if threading.current_thread() is not threading.main_thread() or done():
        block()
        return
    finished = threading.Event()
    failure: list = []

    def run() -> None:
        try:
            block()
        except BaseException as e:  # given to the caller below
            failure.append(e)
        finally:
            finished.set()
    threading.Thread(target=run, name="libckpt-wait", daemon=True).start()
    finished.wait()
    if failure:
        raise failure[0]


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

    def __init__(self, store: Any, ptr: Any, step: int, keep: Any) -> None:
        self.step = step
        self._store = store        # the store must outlive the handle
        self._keep = keep          # objects the library may still read
        self._h = _Handle(ptr, C.ckpt_save_free, "save handle")
        self._error = None         # the save's failure, once known
        self._waited = False       # the caller has seen the outcome
        self._stats = None         # final statistics, once known

    def wait(self) -> None:
        """Block until the save is durable and committed; raise its
        :class:`libckpt.Error` if it failed.  The GIL is released while
        waiting.  May be called again, also after close()."""
        self._refuse_if_forked()
        if not self._h.closed:
            self._settle()
        self._waited = True
        if self._error is not None:
            raise self._error

    def _refuse_if_forked(self) -> None:
        # The child of a fork() cannot know how the parent's save ends.
        if self._h.forked:
            raise _Closed("%s is closed" % self._h._what)

    def _settle(self) -> None:
        def settle() -> None:
            try:
                with self._h.use() as ptr:
                    try:
                        C.ckpt_save_wait(ptr)
                    except Error as e:
                        self._error = e
                    self._stats = self._read_stats(ptr)
            except _Closed:  # closed by another thread meanwhile
                pass
            self._keep = None  # only once the library reads them no more
        interruptible(settle, self.done)

    def wait_snapshot(self) -> None:
        """Block until the snapshot copy is complete: from then on the saved
        buffers may be overwritten (already true on return from save for
        host tensors; device tensors are fenced on their stream, see
        Store.save)."""
        with self._h.use() as ptr:
            C.ckpt_save_wait_snapshot(ptr)
        self._keep = None

    def fence(self, cuda_stream: Optional[int]) -> None:
        """Make `cuda_stream` (a cudaStream_t as an int) wait on the GPU for
        the snapshot copy, without blocking the CPU."""
        with self._h.use() as ptr:
            C.ckpt_save_fence(ptr, cuda_stream or None)

    def done(self) -> bool:
        """True when the save has finished, successfully or not."""
        self._refuse_if_forked()
        if self._h.closed:
            return True
        with self._h.use() as ptr:
            return bool(C.ckpt_save_done(ptr))

    @staticmethod
    def _read_stats(ptr: Any) -> Dict[str, Any]:
        s = ffi.ckpt_save_stats()
        C.ckpt_save_stats_get(ptr, _byref(s))
        return {"step": s.step, "raw_bytes": s.raw_bytes,
                "stored_bytes": s.stored_bytes, "chunks": s.chunks,
                "stall_s": s.stall_s, "persist_s": s.persist_s}

    @property
    def stats(self) -> Dict[str, Any]:
        """dict: raw_bytes, stored_bytes, stall_s, persist_s (and step,
        chunks); final once wait() has returned."""
        if self._stats is not None:
            return dict(self._stats)
        with self._h.use() as ptr:
            return self._read_stats(ptr)

    def close(self) -> None:
        """Wait for the save and free the handle (idempotent).  Does not
        raise the save's error: wait() does."""
        if not self._h.closed:
            self._settle()
            self._h.close()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a SaveHandle cannot be pickled or sent to another process: wait "
            "for it in the process that saved, and pass the step number")

    def __enter__(self) -> "SaveHandle":
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
                store._lost(self._error, self.step, stacklevel=3)
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = ("closed" if self._h.closed else
                 "failed" if self._error else "open")
        return "<libckpt.SaveHandle step=%d %s>" % (self.step, state)


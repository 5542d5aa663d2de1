"""Several ranks, one checkpoint (docs/SCALING.md): coordinators that let
libckpt's ranks agree through the job's own runtime, and the resharding
helper.

    import torch.distributed as dist, libckpt
    from libckpt.dist import TorchCoordinator, load_resharded
    dist.init_process_group("gloo")            # or "nccl"
    coord = TorchCoordinator(timeout=60)       # collective: its own gloo group
    with libckpt.Store("ckpt", coordinator=coord) as store:
        store.save(step, {"rank%d" % coord.rank: shard}).wait()   # collective
        store.restore(state)                   # collective: agreed step

Any rank can read any tensor by name (the global manifest lists every
rank's), so a job restarted with another number of ranks reshards with
:func:`load_resharded`.

A :class:`Coordinator` subclass supplies four collectives; libckpt calls
them from its own threads (the binding takes the GIL), never two at once
for one store, in the same order on every rank.  Each must give up after
``timeout`` seconds and raise: libckpt then fails the save or restore on
that rank with :class:`libckpt.PeerError`, whose message names the
exception and whose ``__cause__`` it is.
"""

from __future__ import annotations

import ctypes
import datetime
import sys
import traceback
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from . import errors as _errors
from . import ffi
from . import reports as _reports
from .errors import Error, InvalidArgumentError
from .handles import interruptible

__all__ = ["Coordinator", "TorchCoordinator", "load_resharded"]


class Coordinator:
    """Base of the coordinators handed to :class:`libckpt.Store`
    (``coordinator=``).  Subclasses set ``rank`` and ``world_size`` and
    implement the four methods below; buffers are bytes of a few hundred
    per rank."""

    rank: int = 0
    world_size: int = 1
    #: Seconds a collective of this coordinator can wait at most, when it
    #: bounds them itself (TorchCoordinator's gloo group), else None.  A
    #: Store's ``timeout`` defaults to it and may not exceed it: libckpt
    #: paces a slow rank's work with a collective every timeout / 4, which
    #: must come before the coordinator gives up.
    timeout: Optional[float] = None

    def barrier(self, timeout: float) -> None:
        raise NotImplementedError

    def broadcast(self, data: bytes, root: int, timeout: float) -> bytes:
        """`data` of rank `root`, on every rank (same length)."""
        raise NotImplementedError

    def allreduce_min(self, value: int, timeout: float) -> int:
        raise NotImplementedError

    def gather(self, data: bytes, root: int, timeout: float
               ) -> Optional[List[bytes]]:
        """Every rank's `data` in rank order on `root`; None elsewhere."""
        raise NotImplementedError

    # -- the C side: built once, kept alive as long as this object

    def _c(self) -> ffi.ckpt_coordinator:
        c = getattr(self, "_c_struct", None)
        if c is not None:
            return c

        def guard(fn: Callable[..., None]) -> Callable[..., int]:
            def call(*args: Any) -> int:
                try:
                    fn(*args)
                    return 0
                except BaseException as exc:  # never unwind through C
                    self.last_error = traceback.format_exc()
                    _errors.note_coordinator_failure(self.rank, exc)
                    print("libckpt coordinator (rank %d): %s" %
                          (self.rank, self.last_error.strip().splitlines()[-1]),
                          file=sys.stderr)
                    return -1
            return call

        def barrier(user: Any, timeout_ms: int) -> None:
            self.barrier(timeout_ms / 1000.0)

        def broadcast(user: Any, buf: int, n: int, root: int,
                      timeout_ms: int) -> None:
            data = ctypes.string_at(buf, n)
            out = self.broadcast(data, root, timeout_ms / 1000.0)
            if len(out) != n:
                raise ValueError("broadcast returned %d bytes, not %d"
                                 % (len(out), n))
            ctypes.memmove(buf, out, n)

        def allreduce_min(user: Any, value: Any, timeout_ms: int) -> None:
            value[0] = int(self.allreduce_min(int(value[0]),
                                              timeout_ms / 1000.0))

        def gather(user: Any, send: int, n: int, recv: int, root: int,
                   timeout_ms: int) -> None:
            parts = self.gather(ctypes.string_at(send, n), root,
                                timeout_ms / 1000.0)
            if self.rank == root:
                if parts is None or len(parts) != self.world_size or any(
                        len(p) != n for p in parts):
                    raise ValueError("gather returned the wrong parts")
                ctypes.memmove(recv, b"".join(parts), n * self.world_size)

        keep = [ffi.BARRIER_FN(guard(barrier)),
                ffi.BROADCAST_FN(guard(broadcast)),
                ffi.ALLREDUCE_MIN_FN(guard(allreduce_min)),
                ffi.GATHER_FN(guard(gather))]
        c = ffi.ckpt_coordinator(ffi.CKPT_COORDINATOR_VERSION, None, *keep)
        self._c_keep = keep  # ctypes callbacks must outlive every call
        self._c_struct = c
        return c


class TorchCoordinator(Coordinator):
    """A coordinator over torch.distributed.  Collective: every rank
    constructs it (after ``init_process_group``).  It makes a gloo process
    group of its own over every rank, whatever the training's backend
    (gloo or NCCL), so libckpt's small CPU collectives never mix with the
    training's.  ``timeout`` (seconds) bounds each collective: a rank that
    died makes the others' calls fail after it."""

    def __init__(self, timeout: float = 600.0) -> None:
        import torch
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("TorchCoordinator needs torch.distributed."
                               "init_process_group() first")
        self._torch, self._dist = torch, dist
        self.timeout = float(timeout)
        self.group = dist.new_group(
            backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def _wait(self, work: Any, timeout: float) -> None:
        # gloo's work.wait honours a timeout: a dead peer cannot hang us.
        ok = work.wait(datetime.timedelta(seconds=timeout))
        if ok is False:
            raise TimeoutError("collective did not complete in %.1f s"
                               % timeout)

    def _bytes(self, data: bytes) -> Any:
        return self._torch.tensor(list(data), dtype=self._torch.uint8)

    def barrier(self, timeout: float) -> None:
        self._wait(self._dist.barrier(group=self.group, async_op=True),
                   timeout)

    def broadcast(self, data: bytes, root: int, timeout: float) -> bytes:
        t = self._bytes(data)
        self._wait(self._dist.broadcast(t, src=root, group=self.group,
                                        async_op=True), timeout)
        return bytes(t.tolist())

    def allreduce_min(self, value: int, timeout: float) -> int:
        t = self._torch.tensor([value], dtype=self._torch.int64)
        self._wait(self._dist.all_reduce(t, op=self._dist.ReduceOp.MIN,
                                         group=self.group, async_op=True),
                   timeout)
        return int(t.item())

    def gather(self, data: bytes, root: int, timeout: float
               ) -> Optional[List[bytes]]:
        t = self._bytes(data)
        out = ([self._torch.empty_like(t) for _ in range(self.world_size)]
               if self.rank == root else None)
        self._wait(self._dist.gather(t, gather_list=out, dst=root,
                                     group=self.group, async_op=True),
                   timeout)
        return [bytes(x.tolist()) for x in out] if out is not None else None


def load_resharded(store: Any, select: Union[Callable[[str], bool],
                                             Iterable[str]],
                   framework: str = "auto") -> Tuple[int, Dict[str, Any]]:
    """Load the tensors ``select`` names (a list of names, or a predicate
    on a name), whichever ranks saved them, from the newest checkpoint
    that holds them intact: the resharding recipe of docs/SCALING.md.
    Returns ``(step, {name: tensor})``.  On a store with several ranks
    this is collective (every rank calls it, each with its own selection)
    and every rank gets the same step, the newest that every rank could
    read in full; on a one-process store (``Store(path, readonly=True)``)
    it loads from the newest step that restores.  Each step tried is
    sized from its own manifest (a step skipped for damage may hold other
    shapes than an older one), and skipped steps are warned about
    (:class:`libckpt.SkippedCheckpointWarning`); a step retired by a
    writer's retention while it is tried is not damage: the root is
    listed again for the newer one (as :meth:`Store.load` does).  A name
    of a list that the step tried does not hold raises :class:`libckpt.NotFoundError`.
    ``framework``: "auto" (as each tensor was saved), "np" or "pt", on
    the CPU, as for Store.load."""
    from .checkpoint import check_framework
    from .errors import (AccessError, CorruptError, IoError,
                         NoCheckpointError, NotFoundError, PeerError,
                         VersionError)
    from .store import _RELISTS
    damage = (CorruptError, IoError, VersionError, NotFoundError, AccessError)
    coord = getattr(store, "_coordinator", None)
    timeout = getattr(store, "_timeout", 600.0)
    together = coord is not None and coord.world_size > 1
    early = None  # a failure before the first collective: told, then raised
    try:
        # First: it waits for this rank's save in flight, whose persist
        # thread may still be in a collective (none may run two at once).
        mine = store._step_numbers()
        store._quiet_others()  # other stores' saves on this coordinator
        check_framework(framework, None)
        # Taken once: a generator of names would be used up by the first
        # step tried, and an older one then "hold" none of them.
        if not callable(select):
            select = frozenset(select)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it
        early, mine = e, []
    skipped = []
    tried: set = set()  # the steps tried so far, the same on every rank
    relists = 0  # the root is listed again (a writer's retention) at most
    while True:  # _RELISTS times, as Store.load and the C search do
        if early is None and relists < _RELISTS and all(n in tried for n in mine):
            relists += 1  # the listing ran out: newer steps may have come
            mine, early = _listing(store, mine)
        step = (-2 if early is not None else
                max((n for n in mine if n not in tried), default=-1))
        if together:  # the same step on every rank, tried in the same order
            step = coord.allreduce_min(step, timeout)
        if early is not None:
            raise early
        if step == -2:
            raise PeerError("load_resharded: another rank failed before "
                            "choosing a step (its own error says why)")
        if step < 0:
            break
        tried.add(step)
        state, failure, fatal = None, None, None
        try:
            state = _load_step(store, step, select, framework)
        except _MissingNames as e:
            fatal = e.error
        except damage as e:
            failure = e
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            fatal = e
        if failure is not None and relists < _RELISTS:
            # A step gone from the root was retired by a writer under us:
            # no damage; the listing is taken again for the newer steps.
            relists += 1
            mine, early = _listing(store, mine)
            gone = (early is None and isinstance(failure, NotFoundError)
                    and step not in mine)
        else:
            gone = False
        # fatal < damaged < gone < loaded: the worst outcome on any rank wins
        outcome = (-1 if fatal is not None or early is not None else
                   0 if failure is not None and not gone else
                   1 if gone else 2)
        if together:
            outcome = coord.allreduce_min(outcome, timeout)
        if fatal is not None:
            raise fatal
        if early is not None:
            raise early
        if outcome < 0:
            raise PeerError("load_resharded: another rank failed on step %d "
                            "(its own error says why)" % step)
        if outcome == 2:
            _report_skipped(skipped)
            return step, state
        if outcome == 0:
            skipped.append((step, failure if failure is not None and not gone
                            else "another rank could not load its tensors"))
    # None could be read: each step passed over is warned about all the
    # same (a job that starts afresh on NoCheckpointError must not lose
    # them silently)
    _report_skipped(skipped)
    err = NoCheckpointError(
        "load_resharded: no step in %s holds the selection intact%s"
        % (store.path, "".join("; step %d: %s" % w for w in skipped)))
    err.skipped = [{"step": n, "status": "", "message": why, "file": ""}
                   for n, why in skipped]
    raise err


def _report_skipped(skipped: List[Tuple[int, str]]) -> None:
    """Each step load_resharded passed over, as Store.load reports them: a
    warning pointing at load_resharded's caller and a record of the
    "libckpt" logger."""
    import warnings
    from .errors import SkippedCheckpointWarning
    for n, why in skipped:
        text = "load_resharded skipped step %d: %s" % (n, why)
        _reports.logger.warning(text)
        warnings.warn(text, SkippedCheckpointWarning, stacklevel=3)


def _listing(store: Any, old: List[int]) -> Tuple[List[int], Any]:
    """(the root's committed steps, None), or (old, the error) when listing
    fails: the caller tells the other ranks before raising it."""
    try:
        return store._step_numbers(), None
    except Exception as e:  # noqa: BLE001 - every rank must hear of it
        return old, e


class _MissingNames(Exception):
    """A listed name not in the step tried: the caller's mistake."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _load_step(store: Any, step: int, select: Any, framework: str
               ) -> Dict[str, Any]:
    """The selected tensors of `step`, allocated from its manifest and
    read in one call (every chunk checked).  Read through the step's
    Checkpoint rather than restored as a state: the buffers are then
    described with the stored dtypes, and a bfloat16 tensor comes back
    to NumPy as its bit pattern (uint16), as Store.load gives it."""
    from .checkpoint import _auto_kind
    from .errors import NotFoundError
    with store.open(step) as ck:
        infos = ck.tensors()
        origin = ck._origin if framework == "auto" else {}
        wanted = select if not callable(select) else None
        chosen = [i for i in infos
                  if (select(i.name) if wanted is None else i.name in wanted)]
        if wanted is not None and len(chosen) != len(wanted):
            missing = wanted - {i.name for i in chosen}
            raise _MissingNames(NotFoundError(
                "not in step %d: %s" % (step, ", ".join(sorted(missing)))))
        kinds = []
        for i in chosen:
            code = ffi.lib.ckpt_dtype_from_name(i.dtype.encode("ascii"))
            kinds.append(framework if framework != "auto"
                         else _auto_kind(origin.get(i.name, "np"), code, True))
        return ck._read_infos(chosen, kinds)


# ------------------------------------------ a Store's side of its coordinator

def quiet_coordinator(coordinator: Any, me: Any) -> None:
    """Wait for the saves in flight of the coordinator's other open stores
    (a "last" and a "best" root of one job).  A save's persist thread runs
    collectives until it commits; a collective of another store on the
    same channel meanwhile would meet them in whatever order each rank's
    threads reach it, one store's matched with the other's on another
    rank: both would fail with PeerError and stay unusable.  Every rank
    makes the same calls, so every rank waits alike."""
    for other in list(getattr(coordinator, "_libckpt_stores", ())):
        if other is not me and not other.closed:
            try:
                interruptible(other._wait_in_flight,
                              lambda: not other._in_flight())
            except Error:  # closed meanwhile: nothing in flight
                pass


def register_with_coordinator(coordinator: Any, store: Any) -> None:
    stores = getattr(coordinator, "_libckpt_stores", None)
    if stores is None:
        try:
            stores = coordinator._libckpt_stores = weakref.WeakSet()
        except AttributeError:  # __slots__: one store per coordinator, as before
            return
    stores.add(store)


def timeout_within(coordinator: Any, timeout: Optional[float]
                    ) -> Optional[float]:
    """The store's timeout given the coordinator's own bound on its
    collectives (Coordinator.timeout, e.g. TorchCoordinator's gloo
    group): the bound when none is given; one beyond it is refused, as
    the coordinator would fail the collectives that pace a slow rank
    first, with a message blaming the store's timeout."""
    bound = getattr(coordinator, "timeout", None) if coordinator is not None \
        else None
    if not isinstance(bound, (int, float)) or isinstance(bound, bool) \
            or not bound > 0:
        return timeout
    if timeout is None:
        return float(bound)
    if timeout > bound:
        raise InvalidArgumentError(
            "timeout=%g s is longer than the coordinator's own timeout "
            "(%g s), which bounds each of its collectives: libckpt's would "
            "fail at %g s whatever the store's timeout. Pass timeout=%g or "
            "less, or make the coordinator with a longer timeout "
            "(TorchCoordinator(timeout=%g))"
            % (timeout, bound, bound, bound, timeout))
    return timeout

"""What Store.load and Store.restore return."""

from __future__ import annotations

import json
import math
import operator
import warnings
from typing import Any, List, Tuple

from . import ffi, nested
from .checkpoint import rank_metadata, tensor_names, world_of
from .errors import Error, NotFoundError

C = ffi.lib

_EXACT = frozenset((int, str, bytes, bool, type(None)))


def _same(a: Any, b: Any) -> bool:
    """Whether a and b are one plain value: same type and value, a float
    bit for bit but for NaN payloads (1 and 1.0, True and 1, 0.0 and -0.0
    are not; NaN never is).  Anything else is never the same."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind in _EXACT:
        return a == b
    return kind is float and a == b and \
        math.copysign(1.0, a) == math.copysign(1.0, b)


class LoadResult(tuple):
    """``(step, state)`` as returned by :meth:`Store.load`; also
    ``.step``, ``.state`` and ``.skipped`` (problem records of the newer
    checkpoints passed over, newest first)."""

    def __new__(cls, step: int, state: Any,
                skipped: List[dict]) -> "LoadResult":
        self = super().__new__(cls, (step, state))
        self.skipped = skipped
        return self

    def __getnewargs__(self) -> tuple:  # copy and pickle
        return (self[0], self[1], self.skipped)

    step = property(operator.itemgetter(0))
    state = property(operator.itemgetter(1))


class RestoreResult(int):
    """The step :meth:`Store.restore` restored (an int, as before), with:
    ``state`` (the given state, its plain values replaced by the
    checkpoint's; its tensors are the caller's own, filled in place),
    ``missing_keys`` (flattened names of leaves of the state that the
    checkpoint lacks: left as they were), ``unexpected_keys`` (those of the
    checkpoint that the state lacks) and ``skipped`` (newer checkpoints
    passed over)."""

    def __new__(cls, step: int, **attrs: Any) -> "RestoreResult":
        self = super().__new__(cls, step)
        self.__dict__.update(attrs)
        return self

    @property
    def step(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return ("RestoreResult(step=%d, missing_keys=%r, unexpected_keys=%r)"
                % (self, self.missing_keys, self.unexpected_keys))


def _this_ranks(ck: Any, unexpected: List[str], rank: int,
                world: int) -> List[str]:
    """Of the step's tensors that rank `rank` of a `world`-rank store did
    not restore, those unexpected there: the ones it saved itself, and
    those of a rank this world lacks (a job restarted with fewer ranks:
    no rank restores them, which is warned about, as retention would
    delete them for good).  Other ranks' tensors are theirs to restore."""
    manifest = json.loads(C.ckpt_checkpoint_manifest(ck))
    shard = {t.get("name"): t.get("shard") for t in manifest.get("tensors", [])
             if isinstance(t, dict)}
    mine = [n for n in unexpected if type(shard.get(n)) is not int
            or shard[n] == rank or shard[n] >= world]
    orphans = sorted({shard[n] for n in mine if type(shard.get(n)) is int
                      and shard[n] >= world})
    if orphans and rank == 0:
        count = sum(1 for n in mine if shard.get(n) in orphans)
        warnings.warn(
            "step %d was saved by %s ranks and is restored by %d: the %d "
            "tensors of rank%s %s are restored by none (listed in "
            "unexpected_keys); read them with libckpt.dist.load_resharded "
            "(docs/SCALING.md, Resharding) before newer steps retire this one"
            % (int(C.ckpt_checkpoint_step(ck)), manifest.get("world_size", "?"),
               world, count, "s" if len(orphans) > 1 else "",
               ", ".join(map(str, orphans))), UserWarning, stacklevel=5)
    return mine


def _rank_tree(ck: Any, rank: int, strict: bool) -> Any:
    """The structure rank `rank` saved in the step open as `ck`: on a step
    of several ranks each rank's is its own (its part manifest's), the
    global manifest carrying rank 0's.  A rank the step does not have
    saved none (None).  A part that cannot be read loses that rank's plain
    values: an error when `strict`, else a warning (they are then listed
    in missing_keys)."""
    if rank == 0 or world_of(ck) <= 1:
        return nested.unwrap(nested.load_metadata(
            C.ckpt_checkpoint_metadata(ck)))[0]
    if not ffi.HAVE_RANK_METADATA:
        raise Error("this libckpt cannot read rank %d's own metadata "
                    "(ckpt_checkpoint_rank_metadata): its plain values "
                    "(optimizer settings, counters) would be rank 0's; "
                    "install the C library of this binding" % rank)
    try:
        text = rank_metadata(ck, rank)
    except NotFoundError:
        return None
    except Error as e:
        if strict:
            raise type(e)("%s; the tensors were restored, the plain values "
                          "of this rank's state were not (restore with "
                          "strict=False to go on without them)" % e.message,
                          e.status, e.function) from None
        warnings.warn("%s; this rank's plain values are not restored (see "
                      "missing_keys)" % e, UserWarning, stacklevel=5)
        return None
    return nested.unwrap(nested.load_metadata(text))[0]


def restore_result(ck: Any, state: Any, flat: nested.Flat,
                   skipped: List[dict], strict: bool,
                   ranks: Tuple[int, int] = (0, 1)) -> RestoreResult:
    """The result of restoring `state` (taken apart as `flat`) from the
    step open as `ck` (a ckpt_checkpoint handle): its plain values, and
    the keys each side lacks.

    Only the metadata is decoded: the tensors' names are asked of the
    library only when they can differ from the state's, since a strict
    restore that succeeded found every tensor of the state in the step,
    so when the counts agree the names do too (one call per tensor is
    most of the cost of a restore of 10,000 tiny tensors otherwise)."""
    tree = _rank_tree(ck, ranks[0], strict)
    if strict and C.ckpt_checkpoint_tensor_count(ck) == len(flat.names):
        missing, unexpected = [], []
    else:
        mine = flat.names
        names = tensor_names(ck)
        have, want = set(names), set(mine)
        missing = [n for n in mine if n not in have]
        unexpected = [n for n in names if n not in want]
        if unexpected:  # only when some are: it reads the manifest
            unexpected = _this_ranks(ck, unexpected, *ranks)
    plain = nested.plain_leaves(tree) if tree is not None else {}
    missing += [nested.dotted(p) for p in flat.plain if p not in plain]
    unexpected += [nested.dotted(p) for p in plain if p not in flat.plain]
    own = flat.plain
    # A value equal to the state's own, bit for bit, is left in place: a
    # restore into a live state (an optimizer's 3,000 parameter numbers)
    # then copies no container for it.
    values = {p: v for p, v in plain.items()
              if p in own and not _same(v, own[p])}
    return RestoreResult(int(C.ckpt_checkpoint_step(ck)),
                         state=nested.replace(state, values),
                         missing_keys=missing, unexpected_keys=unexpected,
                         skipped=skipped)

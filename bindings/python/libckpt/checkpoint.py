"""Checkpoint: one committed step opened for reading, tensor by tensor (the
counterpart of safetensors' ``safe_open``), and the conversion of stored
tensors to NumPy arrays or torch tensors."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from . import ffi, nested
from . import tensors as _tensors
from .errors import (CorruptError, Error, InvalidArgumentError,
                     NoDeviceError, NotFoundError)
from .handles import _Handle

C = ffi.lib
_byref = ctypes.byref

FRAMEWORKS = ("np", "pt", "auto")


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor, described without reading it."""
    name: str
    dtype: str                 # "float32", "bfloat16", ... (libckpt's names)
    shape: Tuple[int, ...]
    bytes: int                 # raw size
    stored_bytes: int          # compressed size in the shard
    chunks: int


def _torch_importable() -> bool:
    """Whether torch can be imported (imports it once if so)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _is_cpu(device: Any) -> bool:
    """Whether `device` ("cpu", "cpu:0", torch.device("cpu")) names the host."""
    kind = getattr(device, "type", device)
    return isinstance(kind, str) and kind.partition(":")[0] == "cpu"


def check_framework(framework: str, device: Any) -> None:
    if framework not in FRAMEWORKS:
        raise ValueError("framework must be one of %s, not %r"
                         % (", ".join(map(repr, FRAMEWORKS)), framework))
    if framework == "np" and device is not None and not _is_cpu(device):
        raise ValueError("device=%r needs framework='pt' or 'auto' (NumPy "
                         "arrays live in host memory)" % (device,))
    if device is not None and not _is_cpu(device):
        _check_device(device)


def _check_device(device: Any) -> None:
    """Refuse a device torch cannot allocate on before anything is read
    (torch's own error, an AssertionError without CUDA, came after the
    whole checkpoint had been read)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None:
            import torch
        torch.empty(0, device=device)
    except Exception as e:
        raise NoDeviceError(
            "device=%r: torch cannot place tensors there (%s: %s); load to "
            "the host instead (device=None or 'cpu')"
            % (device, type(e).__name__, e)) from None


def _info_record() -> Any:
    """ckpt_tensor_info as a NumPy record type (same offsets), to read an
    array of them column by column."""
    f = ffi.ckpt_tensor_info
    kinds = {"name": np.uint64, "dtype": np.int32, "ndim": np.int32,
             "shape": (np.int64, ffi.CKPT_MAX_DIMS), "bytes": np.uint64,
             "stored_bytes": np.uint64, "chunks": np.uint64}
    for field, ctype in f._fields_:  # the widths must be the C ones
        assert ctypes.sizeof(ctype) == np.dtype(kinds[field]).itemsize
    return np.dtype({"names": list(kinds), "formats": list(kinds.values()),
                     "offsets": [getattr(f, k).offset for k in kinds],
                     "itemsize": ctypes.sizeof(f)})


_INFO_RECORD = _info_record()


class Checkpoint:
    """A committed step opened for reading: list its tensors, read one or
    some of them (only their chunks are read and verified), or rebuild the
    saved state.  Get one from :meth:`libckpt.Store.open`; close it, or
    use ``with`` (closing the store closes it too).

    ``framework`` ("np", "pt" or "auto") and ``device`` say what tensors
    come back as, as for :meth:`libckpt.Store.load`.
    """

    def __init__(self, store: Any, ptr: Any, framework: str = "auto",
                 device: Any = None, skipped: Optional[List[dict]] = None
                 ) -> None:
        self._store = store  # the store must outlive the checkpoint
        self._h = _Handle(ptr, C.ckpt_checkpoint_free, "checkpoint")
        store._readers.add(self._h)  # closed before the store is freed
        self.framework = framework
        self.device = device
        #: Newer steps passed over to open this one (problem records).
        self.skipped: List[dict] = list(skipped or [])
        try:
            check_framework(framework, device)
            # Thousands of objects that all live on: no collection passes.
            with self._h.use() as ck, nested.no_gc():
                self.step: int = int(C.ckpt_checkpoint_step(ck))
                self.path: str = os.fsdecode(C.ckpt_checkpoint_path(ck))
                meta = nested.load_metadata(C.ckpt_checkpoint_metadata(ck))
                self._codes: Dict[str, int] = {}
                self._infos_built: Optional[Dict[str, TensorInfo]] = None
                self._describe(ck)
            self._tree, self._metadata = nested.unwrap(meta)
        except BaseException:
            self.close()
            raise
        self._origins: Optional[Dict[str, str]] = None  # see _origin
        self._all_trees: Optional[List[Any]] = None  # see _trees
        #: Set by a whole-state read that read (so verified) every tensor.
        self._read_every = False

    @property
    def _origin(self) -> Dict[str, str]:
        """What each tensor comes back as under framework="auto": what it
        was saved from ("np" or "pt"), found in the tree when first
        needed; NumPy for all when torch cannot be imported here (a torch
        checkpoint inspected where torch is not installed)."""
        if self._origins is None:
            found: Dict[str, str] = {}
            if self._tree is not None:
                with nested.no_gc():
                    for tree in self._trees():  # every rank's tensors
                        nested.unflatten(tree, lambda name, origin, p:
                                         found.__setitem__(name, origin))
            # torch is imported only for a state with torch tensors: a NumPy
            # program does not pay for it (nor take in a CUDA build's runtime)
            if "pt" in found.values() and not _torch_importable():
                found = {}
            self._origins = found
        return self._origins

    def _trees(self) -> List[Any]:
        """The structure of each rank that saved the step, rank 0's (the
        global manifest's, self._tree) first; one for a step of one
        process.  Another rank's is read from its part manifest when first
        needed; a rank whose part cannot be read is left out (its tensors
        then come back as NumPy arrays under framework="auto")."""
        if self._all_trees is None:
            trees = [self._tree]
            with self._h.use() as ck:
                world = world_of(ck) if ffi.HAVE_RANK_METADATA else 1
                for rank in range(1, world):
                    try:
                        text = rank_metadata(ck, rank)
                    except Error:
                        continue
                    tree = nested.unwrap(nested.load_metadata(text))[0]
                    if tree is not None:
                        trees.append(tree)
            self._all_trees = trees
        return self._all_trees

    # -- lifetime

    def close(self) -> None:
        """Close the checkpoint (idempotent)."""
        self._h.close()
        self._store._readers.discard(self._h)

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __reduce__(self) -> Any:
        raise TypeError(
            "a Checkpoint cannot be pickled or sent to another process: pass "
            "the root's path and the step, and open it there")

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and C is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self) -> str:
        return "<libckpt.Checkpoint step=%d %d tensors%s>" % (
            self.step, len(self._names), " closed" if self.closed else "")

    # -- describing

    def _describe(self, ck: Any) -> None:
        """Every tensor's description as columns (_names, _codes, _shapes,
        _sizes, _stored, _chunks, and _at: name -> index), asked of the
        library in one call where it can.  The TensorInfo objects are made
        when first asked for (_infos): reading a whole state of 16,000
        tensors needs only the columns."""
        n = C.ckpt_checkpoint_tensor_count(ck)
        if not ffi.HAVE_CHECKPOINT_TENSORS or n == 0:
            c = ffi.ckpt_tensor_info()  # one buffer, refilled per tensor
            infos = [self._info(ck, i, c) for i in range(n)]
            self._names = [i.name for i in infos]
            self._shapes = [i.shape for i in infos]
            self._sizes = [i.bytes for i in infos]
            self._stored = [i.stored_bytes for i in infos]
            self._chunks = [i.chunks for i in infos]
        else:
            arr = (ffi.ckpt_tensor_info * n)()
            C.ckpt_checkpoint_tensors(ck, 0, n, arr)
            rec = np.frombuffer(arr, _INFO_RECORD)  # column by column
            self._names = [ctypes.string_at(p).decode("utf-8")
                           for p in rec["name"].tolist()]
            self._codes = dict(zip(self._names, rec["dtype"].tolist()))
            self._shapes = _shape_tuples(rec["shape"], rec["ndim"])
            self._sizes = rec["bytes"].tolist()
            self._stored = rec["stored_bytes"].tolist()
            self._chunks = rec["chunks"].tolist()
        self._at = dict(zip(self._names, range(n)))

    @property
    def _infos(self) -> Dict[str, TensorInfo]:
        """{name: TensorInfo} in saved order, made on first use."""
        if self._infos_built is None:
            codes, name_of = self._codes, _tensors.dtype_name
            self._infos_built = {
                name: TensorInfo(name, name_of(codes[name]), shape, size,
                                 stored, chunks)
                for name, shape, size, stored, chunks in zip(
                    self._names, self._shapes, self._sizes, self._stored,
                    self._chunks)}
        return self._infos_built

    def _info(self, ck: Any, i: int, c: Any) -> TensorInfo:
        C.ckpt_checkpoint_tensor(ck, i, _byref(c))
        name, dtype = c.name.decode("utf-8"), c.dtype
        self._codes[name] = dtype
        return TensorInfo(name, _tensors.dtype_name(dtype),
                          tuple(c.shape[:c.ndim]), c.bytes, c.stored_bytes,
                          c.chunks)

    def keys(self) -> List[str]:
        """The tensor names, in the order they were saved."""
        return list(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._at

    def tensors(self) -> List[TensorInfo]:
        """Every tensor's name, dtype, shape and sizes, without reading."""
        return list(self._infos.values())

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise NotFoundError("step %d has no tensor %r"
                                % (self.step, name)) from None

    def metadata(self) -> Any:
        """The ``metadata=`` given to save (None if none)."""
        return self._metadata

    def structure(self) -> Any:
        """The saved state with a :class:`TensorInfo` in place of each
        tensor (nothing is read).  A checkpoint written without structure
        (the C API, older bindings) is a flat dict of its tensors."""
        return self._rebuild(lambda name, origin, path: self.info(name))

    # -- reading

    def get_tensor(self, name: str) -> Any:
        """Read tensor `name`: only its chunks are read, every one verified
        (:class:`CorruptError` if damaged)."""
        info = self.info(name)
        kind = self.framework
        if kind == "auto":
            kind = _auto_kind(self._origin.get(name, "np"),
                              self._codes[name], True)
        with self._h.use() as ck:
            return read_tensor(ck, info, self._codes[name], kind,
                               self.device)

    def get_rows(self, name: str, start: Optional[int] = None,
                 stop: Optional[int] = None) -> Any:
        """Rows ``start:stop`` of tensor `name` along its first dimension
        (Python slice bounds, negative ones counting from the end): a
        slice of an embedding table, or a rank's shard of a tensor saved
        whole.  Only the chunks holding those rows are read, each verified
        whole (:class:`CorruptError` if damaged); the rest of the tensor
        is never in memory."""
        info = self.info(name)
        if not info.shape:
            raise InvalidArgumentError("tensor %r is 0-d: it has no rows"
                                       % name)
        if not ffi.HAVE_READ_RANGE:
            raise NotImplementedError(
                "get_rows needs libckpt with ckpt_checkpoint_read_range; %s "
                "is %s" % (ffi.library_path, ffi.LIBRARY_VERSION))
        for bound in (start, stop):
            if bound is not None and (not isinstance(bound, (int, np.integer))
                                      or isinstance(bound, bool)):
                raise TypeError("get_rows: start and stop are ints or None, "
                                "not %s" % type(bound).__name__)
        lo, hi, _ = slice(start, stop).indices(info.shape[0])
        hi = max(lo, hi)
        row = info.bytes // info.shape[0] if info.shape[0] else 0
        part = TensorInfo(info.name, info.dtype, (hi - lo,) + info.shape[1:],
                          (hi - lo) * row, 0, 0)
        kind = self.framework
        if kind == "auto":
            kind = _auto_kind(self._origin.get(name, "np"),
                              self._codes[name], True)
        out, ptr = _allocate(part, self._codes[name], kind)
        with self._h.use() as ck:
            C.ckpt_checkpoint_read_range(ck, name.encode("utf-8"), lo * row,
                                         ptr or None, part.bytes)
        if kind == "pt" and self.device is not None:
            out = out.to(self.device)
        return out

    def get_tensors(self, names: Optional[Iterable[str]] = None, *,
                    prefix: Optional[str] = None) -> Dict[str, Any]:
        """Read several tensors into {name: tensor}: those named, or those
        whose name starts with `prefix` (``"model."``), or all."""
        if names is None:
            names = [n for n in self._names
                     if prefix is None or n.startswith(prefix)]
        elif prefix is not None:
            raise ValueError("give names or prefix, not both")
        return {n: self.get_tensor(n) for n in names}

    def state(self, *path: Any) -> Any:
        """The saved state (or, with a key path such as ``"model"`` or
        ``"optim", "state", 0``, the part of it there), reading only the
        tensors in that part."""
        if not path:  # the whole state: every tensor in one call
            with nested.no_gc():
                return self._read_whole()
        # a key of a subclass of str or int (a (str, Enum) member) as
        # it was saved: its base value
        path = tuple(map(nested.base_value, path))
        # Several ranks: rank 0's structure first, then each other rank's
        # (state("rank1") is in rank 1's only).
        trees = self._trees() if self._tree is not None else [None]
        deepest = 0
        for tree in trees:
            part = (nested.unflatten(tree, lambda name, origin, p: _Lazy(name))
                    if tree is not None else
                    self._rebuild(lambda name, origin, p: _Lazy(name)))
            for i, key in enumerate(path):
                try:
                    part = part[key]
                except (KeyError, IndexError, TypeError):
                    deepest = max(deepest, i)
                    break
            else:
                break
        else:
            raise NotFoundError("step %d has no %s" % (
                self.step, nested.path_str(path[:deepest + 1])))
        found = {p: self.get_tensor(leaf.name)
                 for p, leaf in nested.leaves(part) if isinstance(leaf, _Lazy)}
        return nested.replace(part, found)

    def _read_whole(self) -> Any:
        """The whole saved state, its tensors allocated as the tree is
        rebuilt and then read by one ckpt_checkpoint_restore (all chunks
        decoded in parallel, one call instead of one per tensor).  A tree
        naming a tensor twice gets one tensor in both places; a library
        without that call reads them one by one as get_tensor does."""
        if not ffi.HAVE_CHECKPOINT_RESTORE:
            with self._h.use() as ck:
                return self._rebuild(self._reader(ck))
        codes, at = self._codes, self._at
        shapes, sizes = self._shapes, self._sizes
        framework = self.framework
        # "auto": each tensor as the tree says it was saved (_auto_kind);
        # torch is imported at the first tensor saved from torch only
        pt_codes = None

        def torch_has(code: int) -> bool:
            nonlocal pt_codes
            if pt_codes is None:
                pt_codes = _torch_codes(codes.values(), framework)
            return code in pt_codes
        make = _Makers()
        # one entry per tensor read, column by column
        names: List[str] = []
        outs: List[Any] = []
        kinds: List[bool] = []  # torch tensor (True) or NumPy array
        # A tensor the tree names twice is one tensor, read once, in both
        # places (as torch.load keeps tied weights tied); a crafted tree
        # naming one tensor a thousand times costs one tensor, not 1000.
        seen: Dict[str, Any] = {}

        def leaf(name: str, origin: str, _path: Any) -> Any:
            if name in seen:
                return seen[name]
            i = at.get(name)
            if i is None:
                self.info(name)  # raises NotFoundError
            code = codes[name]
            pt = (framework == "pt" or framework == "auto"
                  and origin == "pt" and torch_has(code))
            new = make.get(code, pt)
            if new is None:  # refused, or a width that differs: as ever
                out = _allocate(self.info(name), code, "pt" if pt else "np")[0]
            else:
                out = new(shapes[i])
            names.append(name)
            outs.append(out)
            kinds.append(pt)
            seen[name] = out
            return out

        def many(prefix: str, keys: List[str], origin: str) -> Any:
            """leaf for a whole compact node (a state_dict, an optimizer's
            state of one parameter): one pass per column instead of a
            Python call per tensor; None (leaf then makes them, and says
            what is wrong) for a name the step lacks, or a dtype _Makers
            leaves to _allocate."""
            here = [prefix + k for k in keys] if prefix else list(keys)
            if seen and not seen.keys().isdisjoint(here):
                return None  # leaf gives those read already again
            try:
                rows = list(map(at.__getitem__, here))
            except KeyError:
                return None
            codes_here = list(map(codes.__getitem__, here))
            first = codes_here[0] if codes_here else None
            if codes_here.count(first) == len(codes_here):  # one dtype
                pt = (framework == "pt" or framework == "auto"
                      and origin == "pt" and torch_has(first))
                new = make.get(first, pt) if codes_here else None
                if new is None:
                    return None
                made = list(map(new, map(shapes.__getitem__, rows)))
                kinds.extend([pt] * len(made))
            else:
                pts = {c: (framework == "pt" or framework == "auto"
                           and origin == "pt" and torch_has(c))
                       for c in set(codes_here)}
                news = {c: make.get(c, pt) for c, pt in pts.items()}
                if None in news.values():
                    return None
                made = [news[c](shapes[r]) for c, r in zip(codes_here, rows)]
                kinds.extend(map(pts.__getitem__, codes_here))
            names.extend(here)
            outs.extend(made)
            seen.update(zip(here, made))
            return made
        state = self._rebuild(leaf, many)
        if len(names) < len(self._names):  # names: each once (seen)
            self._check_whole_tree(len(names))
        rows = list(map(at.__getitem__, names))
        if outs and all(kinds):  # torch tensors only
            ptrs = list(map(_data_ptr_of(outs), outs))
        else:
            ptrs = [o.data_ptr() if pt else o.ctypes.data
                    for o, pt in zip(outs, kinds)]
        arr, keep = _tensors._c_array_columns(
            names, ptrs, list(map(sizes.__getitem__, rows)),
            list(map(codes.__getitem__, names)),
            list(map(shapes.__getitem__, rows)),
            np.full(len(names), ffi.CKPT_MEM_HOST, np.int32), outs)
        with self._h.use() as ck:
            C.ckpt_checkpoint_restore(ck, arr, len(names), None)
        del keep
        self._read_every = len(names) == len(self._names)  # names are unique
        if self.device is None or not any(kinds):
            return state
        # Moved to the device once read: the same tree again, each tensor
        # moved once.
        moved = {n: o.to(self.device) if pt else o
                 for n, o, pt in zip(names, outs, kinds)}
        return self._rebuild(lambda name, origin, p: moved[name])

    def _read_infos(self, infos: List[TensorInfo], kinds: List[str]
                    ) -> Dict[str, Any]:
        """{name: tensor} for the stored tensors `infos` (each read as
        kinds' "np" or "pt", on the CPU), allocated from the manifest and
        read by one ckpt_checkpoint_restore, every chunk verified.  The
        buffers are described with the manifest's dtypes, so a bfloat16
        or float8 tensor read into NumPy (its bit pattern, uint16 or
        uint8) is not refused as a dtype mismatch."""
        codes = [self._codes[i.name] for i in infos]
        made = [_allocate(i, c, k) for i, c, k in zip(infos, codes, kinds)]
        outs = [m[0] for m in made]
        if not ffi.HAVE_CHECKPOINT_RESTORE or not infos:
            with self._h.use() as ck:
                for i, (out, ptr) in zip(infos, made):
                    C.ckpt_checkpoint_read(ck, i.name.encode("utf-8"),
                                           ptr or None, i.bytes)
        else:
            arr, keep = _tensors._c_array_columns(
                [i.name for i in infos], [m[1] or 0 for m in made],
                [i.bytes for i in infos], codes, [i.shape for i in infos],
                np.full(len(infos), ffi.CKPT_MEM_HOST, np.int32), outs)
            with self._h.use() as ck:
                C.ckpt_checkpoint_restore(ck, arr, len(infos), None)
            del keep
        return {i.name: out for i, out in zip(infos, outs)}

    def _check_whole_tree(self, named: int) -> None:
        """Refuse a whole-state read of a step saved by several ranks whose
        structure (rank 0's: the global manifest carries rank 0's metadata)
        names `named` of its tensors only: the state built from it would
        leave every other rank's tensors out without a word."""
        with self._h.use() as ck:
            world = world_of(ck)
        if world <= 1:
            return
        raise InvalidArgumentError(
            "step %d was saved by %d ranks and its structure is rank 0's "
            "state only (%d of its %d tensors): a whole-state read would "
            "leave the other ranks' tensors out. Restore each rank's own "
            "state in place with Store.restore(state) on every rank "
            "(collective), or read tensors by name from any number of "
            "ranks with libckpt.dist.load_resharded(store, select) or "
            "Store.open(%d).get_tensors(), or one rank's part by its path, "
            "Store.open(%d).state(\"rank1\") say"
            % (self.step, world, named, len(self._names), self.step,
               self.step))

    def _reader(self, ck: Any) -> Any:
        """leaf(name, origin, path) for _rebuild that reads each tensor
        as get_tensor does, through the handle `ck` in use."""
        infos, codes = self._infos, self._codes
        framework, device = self.framework, self.device
        pt_codes: Optional[frozenset] = None  # _auto_kind, at the first torch leaf

        def leaf(name: str, origin: str, _path: Any) -> Any:
            nonlocal pt_codes
            info = infos.get(name)
            if info is None:
                info = self.info(name)  # raises NotFoundError
            kind = framework
            if kind == "auto":
                if origin == "pt" and pt_codes is None:
                    pt_codes = _torch_codes(codes.values(), framework)
                kind = ("pt" if origin == "pt" and codes[name] in pt_codes
                        else "np")
            return read_tensor(ck, info, codes[name], kind, device)
        return leaf

    def _rebuild(self, leaf: Any, many: Any = None) -> Any:
        if self._tree is not None:
            return nested.unflatten(self._tree, leaf, many=many)
        names = self._names
        made = many("", names, "np") if many is not None else None
        if made is None:
            return {n: leaf(n, "np", (n,)) for n in names}
        return dict(zip(names, made))


class _Lazy:
    """A tensor not read yet (a placeholder inside state())."""
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def world_of(ck: Any) -> int:
    """How many ranks saved the step open as `ck` (1: one process)."""
    if ffi.HAVE_WORLD_SIZE:  # not by parsing the whole manifest again
        return max(int(C.ckpt_checkpoint_world_size(ck)), 1)
    world = json.loads(C.ckpt_checkpoint_manifest(ck)).get("world_size", 1)
    return world if type(world) is int and world > 1 else 1


def rank_metadata(ck: Any, rank: int) -> bytes:
    """The metadata text rank `rank` saved with the step open as `ck`:
    rank 0's is the global manifest's; another rank's comes from its part
    manifest (the library's errors raised: NotFoundError for a rank the
    step does not have, CorruptError or IncompleteError for a damaged or
    missing part)."""
    if rank == 0:
        return C.ckpt_checkpoint_metadata(ck)
    out = ctypes.c_char_p()
    C.ckpt_checkpoint_rank_metadata(ck, rank, ctypes.byref(out))
    return out.value


def tensor_names(ck: Any) -> List[str]:
    """The tensor names of an open ckpt_checkpoint, in saved order."""
    n = C.ckpt_checkpoint_tensor_count(ck)
    if ffi.HAVE_CHECKPOINT_TENSORS and n:
        arr = (ffi.ckpt_tensor_info * n)()
        C.ckpt_checkpoint_tensors(ck, 0, n, arr)
        return [ctypes.string_at(p).decode("utf-8") for p in
                np.frombuffer(arr, _INFO_RECORD)["name"].tolist()]
    c = ffi.ckpt_tensor_info()
    out = []
    for i in range(n):
        C.ckpt_checkpoint_tensor(ck, i, _byref(c))
        out.append(c.name.decode("utf-8"))
    return out


def read_tensor(ck: Any, info: TensorInfo, code: int, kind: str,
                device: Any = None) -> Any:
    """Read one tensor (of dtype `code`) of an open ckpt_checkpoint as a
    NumPy array (kind "np") or a torch tensor ("pt", then moved to
    `device`)."""
    out, ptr = _allocate(info, code, kind)
    C.ckpt_checkpoint_read(ck, info.name.encode("utf-8"), ptr or None,
                           info.bytes)
    if kind == "pt" and device is not None:
        out = out.to(device)
    return out


def _torch_codes(codes: Iterable[int], framework: str) -> frozenset:
    """Of the dtype codes `codes`, those that framework="auto" may give as
    torch tensors: the ones this torch has, none where torch cannot be
    imported or for another framework (_auto_kind, asked once per dtype
    rather than once per tensor)."""
    if framework != "auto" or not _torch_importable():
        return frozenset()
    torch = sys.modules["torch"]
    return frozenset(c for c in set(codes)
                     if _tensors.torch_dtype(c, torch) is not None)


def _auto_kind(saved_from: str, code: int, torch_ok: bool) -> str:
    """framework="auto"'s kind for a tensor of dtype `code` saved from
    `saved_from` ("np" or "pt"): as it was saved, except NumPy where torch
    cannot be imported (`torch_ok` false: _torch_importable()) and for a
    torch tensor whose dtype this torch lacks (saved by a newer torch),
    which "pt" refuses."""
    if saved_from != "pt" or not torch_ok:
        return "np"
    if _tensors.torch_dtype(code, sys.modules["torch"]) is None:
        return "np"
    return "pt"


def _shape_tuples(dims: Any, ndims: Any) -> List[Tuple[int, ...]]:
    """Each row's first ndim dims as a tuple (dims: n x CKPT_MAX_DIMS
    int64, ndims: n ints), made per distinct ndim: converting only the
    dims in use, not all 16 of every row, takes a fifth of the time."""
    n = len(ndims)
    out: List[Any] = [()] * n
    kinds = np.unique(ndims).tolist()
    if len(kinds) == 1:  # one ndim for all (a flat list of weights)
        nd = kinds[0]
        return list(map(tuple, dims[:, :nd].tolist())) if nd else out
    for nd in kinds:
        rows = np.flatnonzero(ndims == nd)
        made = (list(map(tuple, dims[rows, :nd].tolist())) if nd
                else [()] * len(rows))
        if len(rows) == n:
            return made
        for i, shape in zip(rows.tolist(), made):
            out[i] = shape
    return out


def _data_ptr_of(outs: List[Any]) -> Any:
    """The unbound data_ptr of torch tensors (outs is not empty)."""
    return type(outs[0]).data_ptr


class _Makers:
    """For a whole-state read: per (dtype code, torch or not), a function
    of a shape giving an empty host tensor of that dtype, or None where
    _allocate must decide (torch lacks the dtype, or its element size is
    not the library's: _allocate then says what is wrong)."""

    def __init__(self) -> None:
        self._made: Dict[Tuple[int, bool], Any] = {}

    def get(self, code: int, pt: bool) -> Any:
        key = (code, pt)
        if key not in self._made:
            self._made[key] = self._maker(code, pt)
        return self._made[key]

    @staticmethod
    def _maker(code: int, pt: bool) -> Any:
        size = C.ckpt_dtype_size(code)
        if pt:
            import torch
            tdt = _tensors.torch_dtype(code, torch)
            if tdt is None or torch.empty(0, dtype=tdt).element_size() != size:
                return None
            # A bound method of a prototype, called straight from map():
            # no Python frame and no keyword parsing per tensor (a lambda
            # around torch.empty(shape, dtype=) cost about twice as much,
            # which 10,000 tiny tensors feel).
            return torch.empty(0, dtype=tdt).new_empty
        try:
            ndt = _tensors.numpy_dtype(code)
        except InvalidArgumentError:
            return None
        if np.dtype(ndt).itemsize != size:
            return None
        return functools.partial(np.empty, dtype=ndt)  # no Python frame either


def _allocate(info: TensorInfo, code: int, kind: str) -> Tuple[Any, int]:
    """(a host NumPy array or torch tensor for `info`, its address)."""
    if kind == "pt":
        import torch
        tdt = _tensors.torch_dtype(code, torch)
        if tdt is None:
            raise TypeError(
                "tensor %r: torch %s has no %s dtype; load it with "
                "framework='np' or 'auto' (NumPy arrays)"
                % (info.name, torch.__version__, info.dtype))
        out = torch.empty(info.shape, dtype=tdt)
        ptr, size = out.data_ptr(), out.numel() * out.element_size()
    else:
        out = np.empty(info.shape, _tensors.numpy_dtype(code))
        ptr, size = out.ctypes.data, out.nbytes
    if size != info.bytes:
        raise CorruptError("tensor %r: %d bytes for shape %s and dtype %s"
                           % (info.name, info.bytes, info.shape, info.dtype),
                           function="Checkpoint.get_tensor")
    return out, ptr


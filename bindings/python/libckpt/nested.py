"""Nested training state <-> named tensors plus a JSON description.

``Store.save`` accepts any nesting of dicts (OrderedDict kept apart),
lists and tuples whose leaves are tensors/arrays or plain values.  The
tensors become C-level tensors named by their key path joined with dots,
as in a PyTorch ``state_dict`` (``model.fc1.weight``,
``optim.state.0.exp_avg``), so ``ckpt inspect`` and the C API see them by
name.  Everything else, the shape of the structure and the plain values,
is written into the checkpoint's metadata as below, so that a load gives
back exactly what was saved: ints of any size, floats bit for bit, key
types (optimizer state keys stay ints).

Format (version 4; version 1 is the same without the "tensors" and
"otensors" nodes, version 2 without the "torch" nodes, version 3 without
the "numpy" nodes, and a tree is written with the oldest version that
holds it), the whole metadata JSON of the checkpoint::

    {"format": "libckpt-python-state", "version": 1 | 2 | 3 | 4,
     "tree": NODE, "metadata": <the caller's metadata=, or null>}

    NODE = null | true | false
         | integer in -2**63 .. 2**63-1 | finite number with . or e (float)
         | string (UTF-8 without U+0000)
         | {"int": "<decimal>"}             an int outside the int64 range
         | {"float": "nan" | "inf" | "-inf" | "nan:<16 hex digits>"}
         | {"str": "<base64 of UTF-8>"}     a str JSON cannot carry as is
         | {"bytes": "<base64>"}
         | {"torch": "dtype", "value": "float32"}   (version 3) a torch.dtype
         | {"torch": "device", "value": "cuda:0"}   (version 3) a torch.device
         | {"torch": "size", "value": [INT, ...]}   (version 3) a torch.Size
         | {"numpy": "<f8", "value": "<base64>"}  (version 4) a NumPy scalar:
                                            its dtype.str and its bytes
         | {"tensor": NAME, "from": "np" | "pt"}   a C-level tensor
         | {"list": [NODE, ...]} | {"tuple": [NODE, ...]}
         | {"tuple": [NODE, ...], "namedtuple": ["<module>:<qualname>",
                                   [FIELD, ...]]}  a namedtuple (readers
                                            that ignore the member read a
                                            plain tuple)
         | {"dict": [[KEY, NODE], ...]}
         | {"dict": [[KEY, NODE], ...], "counter": true}  a
                                            collections.Counter (readers
                                            that ignore the member read a
                                            plain dict)
         | {"odict": [[KEY, NODE], ...]}    OrderedDict; may carry
                                            "_metadata": NODE (state_dict)
         | {"tensors": [STR, ...], "from": "np" | "pt"}   (version 2) a dict
                                            whose every value is a C-level
                                            tensor named by its path, keys
                                            plain strings, one origin
         | {"otensors": [STR, ...], "from": ..., "_metadata": NODE}  the
                                            same for an OrderedDict
    KEY  = string | integer | {"int": ...} | {"str": ...}

(values.py encodes and checks the plain values' nodes; this module the
containers and tensors.)

Every JSON object in the tree is a tagged node, so the caller's dicts can
never be mistaken for one.  A dict of tensors (a state_dict, an optimizer's
per-parameter state) takes one node instead of one per tensor, which keeps
the manifest small and quick to check with thousands of tensors.  Keys must be str or int (not bool); two tensors
whose paths flatten to the same name ({"a.b": x} and {"a": {"b": y}}) are
refused with an error naming both paths, never overwritten.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import gc
import inspect
import json
import math
import sys
import types
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .errors import CorruptError, InvalidArgumentError, VersionError
from .values import (INT64, Path, base_value, decode_tagged, encode_key,
                     encode_numpy, encode_plain, encode_torch, path_str)

FORMAT = "libckpt-python-state"
VERSION = 4    # the newest version this module reads
_COMPACT = 2   # the version that added "tensors"/"otensors" nodes
_TORCH = 3     # the version that added "torch" nodes (dtype, device)
_NUMPY = 4     # the version that added "numpy" nodes (NumPy scalars)


def is_tensor(obj: Any) -> bool:
    """True for what save() stores as a C-level tensor: torch tensors,
    NumPy arrays and scalars, and objects with an array protocol."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (np.ndarray, np.generic)):
        return True
    return any(hasattr(obj, a) for a in ("__array_interface__",
                                         "__cuda_array_interface__",
                                         "__dlpack__"))


def dotted(path: Path) -> str:
    """A key path as a flattened name: model.fc1.weight (a key of a
    subclass of str or int by its base value, as _encode_items names it)."""
    return ".".join(k if type(k) is str else str(base_value(k)) for k in path)


def _too_deep(what: str, error: type) -> Exception:
    return error("%s nests deeper than Python can walk (its recursion "
                 "limit is %d)" % (what, sys.getrecursionlimit()))


def _guard_depth(what: str, error: type) -> Callable[[Callable], Callable]:
    """The decorated function raises `error` naming `what` instead of a
    bare RecursionError: a state (or a checkpoint's structure, written by
    anyone) nested hundreds of levels deep is refused with a message, not
    a traceback through the recursion."""
    def wrap(f: Callable) -> Callable:
        @functools.wraps(f)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return f(*args, **kwargs)
            except RecursionError:
                raise _too_deep(what, error) from None
        return guarded
    return wrap


# The deepest JSON the C library reads (jansson's parser limit): deeper
# metadata is refused when saved, whatever Python's own encoder manages.
JSON_MAX_DEPTH = 2048


def json_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` (dicts, lists and tuples of plain values) nests more
    than `limit` containers deep, found without recursion (Python 3.13's
    JSON encoder no longer stops at the recursion limit, so json.dumps
    alone cannot be relied on to refuse such a value)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in items
                     if isinstance(x, (dict, list, tuple)))
    return False


def json_int_beyond_64_bits(value: Any) -> Optional[str]:
    """Where in `value` (dicts, lists and tuples of plain values) an int
    lies outside the signed 64 bits a checkpoint's JSON integers hold, as
    a subscript path ("['seed'][0]"), or None.  The library refuses such
    metadata too, but names only a column of the text it was given."""
    stack: List[Tuple[Any, str]] = [(value, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, "%s[%r]" % (where, k)) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, "%s[%d]" % (where, i)) for i, x in enumerate(v))
        elif (isinstance(v, int) and not isinstance(v, bool)
              and not -(1 << 63) <= v < (1 << 63)):
            return where
    return None


def load_metadata(text: bytes) -> Any:
    """A checkpoint's metadata text decoded (json.loads), a document
    nested deeper than Python's JSON decoder goes being CorruptError."""
    try:
        return json.loads(text.decode("utf-8"))
    except RecursionError:
        raise _too_deep("the checkpoint's metadata", CorruptError) from None


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while a state is taken apart or rebuilt:
    every node allocated there is live until the call returns, yet with
    10,000 tensors the collector would scan them again and again (more
    than half the time of flattening).  Nothing is lost: collection
    resumes, as it was, on the way out."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------- encode

class Flat:
    """A state taken apart: the JSON tree, the tensor leaves in order (their
    names and objects as two columns, `names` and `objs`; `tensors` gives
    them as (name, object, path)), and the plain leaves as {path: value}.

    The tensors' paths are made only when asked for (an error naming one,
    or `tensors`): a state_dict of 10,000 tensors would otherwise spend
    more on building paths and triples than on the rest of flattening."""

    def __init__(self) -> None:
        self.tree: Any = None
        self.names: List[str] = []
        self.objs: List[Any] = []
        # Runs of tensors: the first one's number, and (path, prefix): a
        # compact node's tensors are at path + (key,), the key being the
        # name without its first `prefix` characters; a lone tensor's is
        # `path` (prefix -1)
        self._firsts: List[int] = []
        self._blocks: List[Tuple[Path, int]] = []
        self.plain: Dict[Path, Any] = {}
        self._names: Dict[str, int] = {}  # tensor name -> its number
        self._active: set = set()
        self._torch: Any = None  # torch.Tensor, when torch is loaded
        # {torch.Tensor, torch.nn.Parameter} then: the exact types that are
        # torch tensors without asking isinstance of each value
        self._torch_classes: frozenset = frozenset()
        self._size: Any = None  # torch.Size, when torch is loaded: a leaf
        self.version = 1  # the tree's format version (2: compact nodes)
        self._row_keys: set = set()  # see _encode_items

    def _add_one(self, name: str, obj: Any, path: Path) -> None:
        self._firsts.append(len(self.names))
        self._blocks.append((path, -1))
        self.names.append(name)
        self.objs.append(obj)

    def _add_block(self, names: List[str], objs: List[Any], path: Path,
                   prefix: int) -> None:
        """Tensors `names` (each `prefix` characters then its key under
        `path`), none of them taken before."""
        first = len(self.names)
        self._firsts.append(first)
        self._blocks.append((path, prefix))
        self._names.update(zip(names, range(first, first + len(names))))
        self.names.extend(names)
        self.objs.extend(objs)

    def path_of(self, i: int) -> Path:
        """The path of tensor number `i`."""
        path, prefix = self._blocks[bisect.bisect_right(self._firsts, i) - 1]
        return path if prefix < 0 else path + (self.names[i][prefix:],)

    @property
    def tensors(self) -> List[Tuple[str, Any, Path]]:
        """The tensor leaves as (name, object, path), in order."""
        return [(n, o, self.path_of(i))
                for i, (n, o) in enumerate(zip(self.names, self.objs))]


@_guard_depth("the state", InvalidArgumentError)
def flatten(state: Any) -> Flat:
    """Take a nested state apart (see the module docstring)."""
    if not isinstance(state, (Mapping, list, tuple)):
        raise TypeError("the state must be a dict, list or tuple (of "
                        "tensors, plain values or more of those), not %s"
                        % type(state).__name__)
    flat = Flat()
    torch = sys.modules.get("torch")
    if torch is not None:
        flat._torch = torch.Tensor
        param = getattr(getattr(torch, "nn", None), "Parameter", torch.Tensor)
        flat._torch_classes = frozenset((torch.Tensor, param))
        flat._size = getattr(torch, "Size", None)  # absent from stand-ins
    flat.tree = _encode(state, (), flat, "")
    return flat


# Containers that are never tensors themselves (is_tensor would ask each of
# them for the array protocols).
_PLAIN_CONTAINERS = frozenset((dict, list, tuple, collections.OrderedDict))
# Plain values that are never tensors: asking an int (an optimizer's
# parameter index) for three array protocols that it lacks costs more than
# encoding it.  Their subclasses (an IntEnum) still take is_tensor.
_PLAIN_SCALARS = frozenset((int, float, str, bytes, bool, type(None)))


def _encode(obj: Any, path: Path, flat: Flat, name: str) -> Any:
    """The node of `obj`, found at `path`, whose tensor name (the path
    dotted) is `name`."""
    kind = type(obj)
    if kind in _PLAIN_SCALARS:
        value = encode_plain(obj, path)
        flat.plain[path] = obj
        return value
    if isinstance(obj, (str, bytes)) and isinstance(obj, np.generic):
        # np.str_, np.bytes_: array-like, but plain text (a label): a str
        # or bytes, as other subclasses of them
        value = encode_plain(obj, path)
        flat.plain[path] = obj
        return value
    if kind not in _PLAIN_CONTAINERS and is_tensor(obj):
        pt = flat._torch is not None and isinstance(obj, flat._torch)
        if not pt and isinstance(obj, np.generic):
            value = encode_numpy(obj)
            if value is not None:  # a NumPy scalar: a plain value
                if flat.version < _NUMPY:
                    flat.version = _NUMPY
                flat.plain[path] = obj
                return value
        other = flat._names.setdefault(name, len(flat.names))
        if other != len(flat.names):
            raise InvalidArgumentError(
                "%s and %s both flatten to the tensor name %r; rename one "
                "(a '.' in a key flattens like nesting)"
                % (path_str(flat.path_of(other)), path_str(path), name))
        flat._add_one(name, obj, path)
        return {"tensor": name, "from": "pt" if pt else "np"}
    if kind not in _PLAIN_CONTAINERS and (
            kind is flat._size or not isinstance(obj, (Mapping, list, tuple))):
        value = None
        if flat._torch is not None:
            value = encode_torch(obj, sys.modules["torch"])
            if value is not None and flat.version < _TORCH:
                flat.version = _TORCH
        if value is None:
            value = encode_plain(obj, path)
        flat.plain[path] = obj
        return value
    if id(obj) in flat._active:  # would recurse forever
        raise TypeError("%s contains itself" % path_str(path))
    flat._active.add(id(obj))
    try:
        if kind is dict or kind is collections.OrderedDict or (
                kind is not list and kind is not tuple
                and isinstance(obj, Mapping)):
            prefix = name + "." if path else ""
            # A Counter (MultiStepLR's milestones) keeps its type: its
            # methods (elements(), most_common()) are what the owner calls.
            counter = isinstance(obj, collections.Counter)
            node = _encode_tensor_dict(obj, path, flat, prefix) \
                if obj and not counter else None
            if node is not None:
                return node
            pairs = _encode_items(obj, path, flat, prefix)
            if counter:
                return {"dict": pairs, "counter": True}
            if not isinstance(obj, collections.OrderedDict):
                return {"dict": pairs}
            node = {"odict": pairs}
            # torch's state_dict() carries module versions here, which
            # load_state_dict passes on to the modules.
            extra = getattr(obj, "_metadata", None)
            if extra is not None:
                side = Flat()
                side._torch = flat._torch
                side._torch_classes = flat._torch_classes
                side._size = flat._size
                node["_metadata"] = _encode(extra, path + ("_metadata",),
                                            side, dotted(path + ("_metadata",)))
                if side.names:
                    raise TypeError("%s: OrderedDict._metadata may not hold "
                                    "tensors" % path_str(path))
                flat.version = max(flat.version, side.version)
            return node
        items = _encode_ints(obj, path, flat)
        if items is None:
            prefix = name + "." if path else ""
            items = [_encode(v, path + (i,), flat, prefix + str(i))
                     for i, v in enumerate(obj)]
        if not isinstance(obj, tuple):
            return {"list": items}
        node = {"tuple": items}
        named = _namedtuple_spec(obj) if kind is not tuple else None
        if named is not None:
            node["namedtuple"] = named
        return node
    finally:
        flat._active.discard(id(obj))


def _namedtuple_spec(obj: tuple) -> Optional[list]:
    """["module:qualname", [field, ...]] of a namedtuple (a tuple whose
    class has str _fields, one per item), or None for other tuples."""
    kind = type(obj)
    fields = getattr(kind, "_fields", None)
    module = getattr(kind, "__module__", None)
    qualname = getattr(kind, "__qualname__", None)
    if (not isinstance(fields, tuple) or len(fields) != len(obj)
            or not all(type(f) is str for f in fields)
            or type(module) is not str or type(qualname) is not str):
        return None
    return [module + ":" + qualname, list(fields)]


@functools.lru_cache(maxsize=256)
def _namedtuple_type(spec: str, fields: Tuple[str, ...]) -> Optional[type]:
    """The class a namedtuple node names, found without importing or
    running anything: in a module already imported, by static attribute
    lookup, a tuple subclass with exactly these _fields.  Else a stand-in
    made by collections.namedtuple of the same name and fields (so
    attribute access works), or None when the names cannot make one."""
    module, _, qualname = spec.partition(":")
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if found is None or part == "<locals>":
            found = None
            break
        try:
            found = inspect.getattr_static(found, part)
        except AttributeError:
            found = None
    if (isinstance(found, type) and issubclass(found, tuple)
            and inspect.getattr_static(found, "_fields", None) == fields):
        return found
    try:
        return collections.namedtuple(qualname.rpartition(".")[2], fields,
                                      module=module or None)
    except (TypeError, ValueError):  # not identifiers, keywords, repeated
        return None


def _decode_namedtuple(named: Any, items: list, path: Path) -> tuple:
    """The tuple of a node with a "namedtuple" member (see the format)."""
    if not (isinstance(named, list) and len(named) == 2
            and type(named[0]) is str and isinstance(named[1], list)
            and len(named[1]) == len(items)
            and all(type(f) is str for f in named[1])):
        raise CorruptError("%s: malformed namedtuple node" % path_str(path))
    kind = _namedtuple_type(named[0], tuple(named[1]))
    # tuple.__new__, not the class's own _make or __new__: no code of the
    # class runs, and defaults or checks it adds do not apply to stored
    # items.
    return tuple.__new__(kind, items) if kind is not None else tuple(items)


def _encode_items(obj: Any, path: Path, flat: Flat, prefix: str) -> list:
    """The [key, node] pairs of a mapping's items, as _encode makes them.

    A value that is a small plain dict of tensors (an optimizer's state
    for one parameter) or of plain scalars (a module's version entry in
    state_dict()._metadata) is encoded here, in a few operations on the
    whole row: such rows come by the thousand, and the general route
    costs several microseconds for each.  Anything else, and any row
    these checks are unsure of, takes the general route (_encode), which
    gives the same node or the error."""
    pairs = []
    classes = flat._torch_classes
    known = flat._row_keys  # key lists already found plain ASCII
    checked = False  # whether _check_base_keys has run on obj
    for k, v in obj.items():
        kind = type(k)
        if kind is str and k.isascii() and "\0" not in k:
            key = k
        elif kind is int and INT64[0] <= k <= INT64[1]:
            key = k
        else:
            key = encode_key(k, path)
            if kind is not str and kind is not int:
                # A subclass of str or int (a (str, Enum) member, an
                # IntEnum): stored, named and found (the path) by its
                # base value, never by its own __str__ or __repr__.
                if not checked:
                    _check_base_keys(obj, path)
                    checked = True
                k = base_value(k)
                kind = type(k)
        if type(v) in _METHODS and _scheduler_method(v):
            continue
        sub = path + (k,)
        name = prefix + (k if kind is str else str(k))
        node = None
        if type(v) is dict and v:
            keys = list(v)
            shape = tuple(keys)
            if shape not in known:
                if (set(map(type, keys)) == {str}
                        and "\0".join(keys).isascii()
                        and not any("\0" in key_ for key_ in keys)):
                    known.add(shape)
            if shape in known:
                node = _encode_row(v, keys, sub, flat, name + ".", classes)
        if node is None:
            node = _encode(v, sub, flat, name)
        pairs.append([key, node])
    return pairs


def _check_base_keys(obj: Any, path: Path) -> None:
    """InvalidArgumentError when two keys of `obj` (one of them of a
    subclass of str or int) are one key once stored by their base values
    (a subclass whose own __eq__ or __hash__ tells it from "train"): the
    later would overwrite the earlier on load."""
    seen: Dict[Any, Any] = {}
    for k in obj:
        if isinstance(k, bool) or not isinstance(k, (str, int)):
            continue  # refused by encode_key in its turn
        other = seen.setdefault(base_value(k), k)
        if other is not k:
            raise InvalidArgumentError(
                "%s: the keys %r and %r are both saved as %r (a key of a "
                "subclass of str or int is saved as its base value); "
                "rename one" % (path_str(path), other, k, base_value(k)))


_METHODS = frozenset((types.MethodType, weakref.WeakMethod))


def _scheduler_method(v: Any) -> bool:
    """Whether `v` is a method (or a WeakMethod to one) bound to a torch LR
    scheduler.  Before torch 2.2, OneCycleLR.state_dict() holds its
    annealing method and CyclicLR's a WeakMethod to its scale function,
    code that later versions leave out of state_dict(); the dict loads
    back without them, and load_state_dict() keeps the scheduler's own.
    Any other callable is refused by name (encode_plain)."""
    if type(v) is weakref.WeakMethod:
        v = v()
        if type(v) is not types.MethodType:
            return False
    return any(c.__module__ == "torch.optim.lr_scheduler"
               for c in type(v.__self__).__mro__)


def _encode_ints(seq: Any, path: Path, flat: Flat) -> Optional[list]:
    """The items of a non-empty list or tuple of ints that all encode as
    themselves (an optimizer's parameter indices, by the thousand),
    registered as plain values with no call per item; None for any other
    sequence (the general route)."""
    if not seq or set(map(type, seq)) != {int} or \
            not INT64[0] <= min(seq) <= max(seq) <= INT64[1]:
        return None
    items = list(seq)
    flat.plain.update(zip([path + (i,) for i in range(len(items))], items))
    return items


# The value types a row of plain scalars may hold for _encode_row: those
# whose usual values encode as themselves (the rest go the general way).
_ROW_SCALARS = frozenset((int, float, str, bool, type(None)))


def _encode_row(row: dict, keys: List[str], path: Path, flat: Flat,
                prefix: str, classes: frozenset) -> Optional[dict]:
    """The node of a non-empty plain dict under plain ASCII str `keys`
    whose values are all torch tensors (the compact node) or all plain
    scalars that encode as themselves, with the leaves registered as
    _encode would; None for any other row."""
    values = list(row.values())
    kinds = set(map(type, values))
    if classes and kinds <= classes:
        names = list(map(prefix.__add__, keys))
        if not flat._names.keys().isdisjoint(names):
            return None  # the general route names both paths
        flat._add_block(names, values, path, len(prefix))
        if flat.version < _COMPACT:
            flat.version = _COMPACT
        return {"tensors": keys, "from": "pt"}
    if not kinds <= _ROW_SCALARS:
        return None
    for v in values:
        kind = type(v)
        if kind is int:
            if not INT64[0] <= v <= INT64[1]:
                return None
        elif kind is float:
            if not math.isfinite(v):
                return None
        elif kind is str:
            if not v.isascii() or "\0" in v:
                return None
    plain = flat.plain
    for k, v in zip(keys, values):
        plain[path + (k,)] = v
    return {"dict": [[k, v] for k, v in zip(keys, values)]}


def _encode_tensor_dict(obj: Any, path: Path, flat: Flat,
                        prefix: str) -> Optional[dict]:
    """The compact node of a mapping whose every value is a tensor of one
    origin under a plain ASCII str key, or None (the caller then writes the
    general node).  Tensors are registered as _encode would."""
    torch_t = flat._torch
    keys = list(obj)
    # Each property asked of all keys, then all values, at once: a pass in
    # Python per tensor would cost more than the rest of flattening.
    if set(map(type, keys)) != {str}:
        return None
    joined = "\0".join(keys)
    if not joined.isascii() or joined.count("\0") != len(keys) - 1:
        return None  # a key holds a NUL or non-ASCII: the general node
    values = list(obj.values())
    kinds = set(map(type, values))
    if torch_t is not None and kinds <= flat._torch_classes:
        origin = "pt"
    elif torch_t is not None and any(isinstance(v, torch_t) for v in values):
        # torch subclasses, alone or with arrays of another origin
        if not all(isinstance(v, torch_t) for v in values):
            return None
        origin = "pt"
    elif kinds & _PLAIN_CONTAINERS or kinds & _PLAIN_SCALARS or \
            not all(map(is_tensor, values)) or \
            any(issubclass(k, np.generic) for k in kinds):
        return None  # NumPy scalars are plain values: the general node
    else:
        origin = "np"
    odict = isinstance(obj, collections.OrderedDict)
    extra = getattr(obj, "_metadata", None) if odict else None
    node: dict = {}
    if extra is not None:
        side = Flat()
        side._torch = flat._torch
        side._torch_classes = flat._torch_classes
        side._size = flat._size
        node["_metadata"] = _encode(extra, path + ("_metadata",), side,
                                    dotted(path + ("_metadata",)))
        if side.names:
            raise TypeError("%s: OrderedDict._metadata may not hold "
                            "tensors" % path_str(path))
        flat.version = max(flat.version, side.version)
    names = list(map(prefix.__add__, keys)) if prefix else keys
    if not flat._names.keys().isdisjoint(names):
        for name, k in zip(names, keys):  # the first name taken before
            other = flat._names.get(name)
            if other is not None:
                raise InvalidArgumentError(
                    "%s and %s both flatten to the tensor name %r; rename "
                    "one (a '.' in a key flattens like nesting)"
                    % (path_str(flat.path_of(other)), path_str(path + (k,)),
                       name))
    # the keys are unique: so are these
    flat._add_block(names, values, path, len(prefix))
    node["otensors" if odict else "tensors"] = keys
    node["from"] = origin
    if flat.version < _COMPACT:
        flat.version = _COMPACT
    return node


def _items(tree: dict, path: Path) -> list:
    """The items of a list or tuple node, checked."""
    items = tree.get("list", tree.get("tuple"))
    if not isinstance(items, list):
        raise CorruptError("%s: malformed state structure node"
                           % path_str(path))
    return items


def _pairs(tree: dict, path: Path) -> Iterator[Tuple[Any, Any]]:
    """(key, node) of a dict or odict node, each key decoded and checked:
    a str, an int or a tagged one (never a bool, list or float)."""
    pairs = tree.get("dict", tree.get("odict"))
    if not isinstance(pairs, list):
        raise CorruptError("%s: malformed state structure node"
                           % path_str(path))
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise CorruptError("%s: malformed key and value pair %.80r in "
                               "the state structure" % (path_str(path), pair))
        k, v = pair
        if isinstance(k, dict):
            k = decode_tagged(k)
        if type(k) not in (str, int):
            raise CorruptError("%s: malformed key %.80r in the state "
                               "structure" % (path_str(path), k))
        yield k, v


def _tensor_keys(tree: dict, path: Path) -> Tuple[List[str], str]:
    """(keys, origin) of a compact node, checked."""
    keys = tree.get("tensors", tree.get("otensors"))
    origin = tree.get("from", "np")
    if not isinstance(keys, list) or origin not in ("np", "pt") or \
            not set(map(type, keys)) <= {str}:
        raise CorruptError("%s: malformed state structure node"
                           % path_str(path))
    return keys, origin


def wrap(tree: Any, metadata: Any, version: int = 1) -> dict:
    """The checkpoint metadata for a state's tree (of format `version`:
    Flat.version) and the caller's metadata."""
    return {"format": FORMAT, "version": version, "tree": tree,
            "metadata": metadata}


def unwrap(meta: Any) -> Tuple[Optional[Any], Any]:
    """(tree, caller's metadata) from a checkpoint's metadata; tree is None
    for checkpoints not written by this binding's nested save."""
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT):
        return None, meta
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptError("state structure without a version")
    if version > VERSION:
        raise VersionError(
            "the checkpoint's state structure has version %d; this libckpt "
            "binding reads version %d: upgrade it" % (version, VERSION))
    return meta.get("tree"), meta.get("metadata")


# ---------------------------------------------------------------- decode

Leaf = Callable[[str, str, Path], Any]
# many(prefix, keys, origin): the tensors prefix + key of one compact node
# (a flat dict of tensors, such as a state_dict), in the order of keys, as
# leaf would make them one by one; or None to leave them to leaf.
Many = Callable[[str, List[str], str], Optional[List[Any]]]


@_guard_depth("the checkpoint's state structure", CorruptError)
def unflatten(tree: Any, leaf: Leaf, path: Path = (),
              many: Optional[Many] = None) -> Any:
    """Rebuild a state from its tree; leaf(name, origin, path) makes each
    tensor ("np" or "pt" for origin: what was saved).  With `many`, the
    tensors of each compact node are asked of it first, all at once (a
    flat dict of 10,000 tensors costs a Python call per tensor less)."""
    return _unflatten(tree, leaf, path, many)


def _unflatten(tree: Any, leaf: Leaf, path: Path,
               many: Optional[Many] = None) -> Any:
    if not isinstance(tree, (dict, list)):
        return tree  # null, bool, int, float, str
    if isinstance(tree, list):
        raise CorruptError("%s: malformed state structure node"
                           % path_str(path))
    _metadata_on_odict(tree, path)
    if "tensor" in tree:
        if type(tree["tensor"]) is not str or tree.get("from", "np") not in ("np", "pt"):
            raise CorruptError("%s: malformed tensor node" % path_str(path))
        return leaf(tree["tensor"], tree.get("from", "np"), path)
    if "tensors" in tree or "otensors" in tree:
        keys, origin = _tensor_keys(tree, path)
        prefix = dotted(path) + "." if path else ""
        values = many(prefix, keys, origin) if many is not None else None
        if values is None:
            values = [leaf(prefix + k, origin, path + (k,)) for k in keys]
        # a key given twice: the later one wins, as assigning one by one
        out = (dict(zip(keys, values)) if "tensors" in tree
               else collections.OrderedDict(zip(keys, values)))
        if "_metadata" in tree:
            out._metadata = _unflatten(tree["_metadata"], leaf, path, many)
        return out
    if "list" in tree or "tuple" in tree:
        items = [_unflatten(v, leaf, path + (i,), many)
                 for i, v in enumerate(_items(tree, path))]
        if "list" in tree:
            return items
        if "namedtuple" in tree:
            return _decode_namedtuple(tree["namedtuple"], items, path)
        return tuple(items)
    if "dict" in tree or "odict" in tree:
        if "dict" in tree:
            out = collections.Counter() if tree.get("counter") is True else {}
        else:
            out = collections.OrderedDict()
        for k, v in _pairs(tree, path):
            out[k] = _unflatten(v, leaf, path + (k,), many)
        if "_metadata" in tree:
            out._metadata = _unflatten(tree["_metadata"], leaf, path, many)
        return out
    return decode_tagged(tree)


def _metadata_on_odict(tree: dict, path: Path) -> None:
    """CorruptError unless a node's "_metadata", if any, is an
    OrderedDict's (a state_dict's), the only ones written with one: a
    plain dict cannot carry the attribute."""
    if "_metadata" in tree and "odict" not in tree and "otensors" not in tree:
        raise CorruptError("%s: malformed state structure node (_metadata "
                           "on a node that is not an OrderedDict)"
                           % path_str(path))


def tensor_paths(tree: Any) -> Dict[str, Path]:
    """{tensor name: key path} of a tree, without reading anything."""
    found: Dict[str, Path] = {}

    def note(name: str, origin: str, path: Path) -> None:
        found[name] = path
    unflatten(tree, note)
    return found


@_guard_depth("the structure", InvalidArgumentError)
def leaves(obj: Any, path: Path = ()) -> List[Tuple[Path, Any]]:
    """(path, leaf) of a nested Python structure, tensors being leaves."""
    return _leaves(obj, path)


def _leaves(obj: Any, path: Path) -> List[Tuple[Path, Any]]:
    if is_tensor(obj) or not isinstance(obj, (Mapping, list, tuple)):
        return [(path, obj)]
    items = obj.items() if isinstance(obj, Mapping) else enumerate(obj)
    out: List[Tuple[Path, Any]] = []
    for k, v in items:
        out += _leaves(v, path + (k,))
    return out


@_guard_depth("the checkpoint's state structure", CorruptError)
def plain_leaves(tree: Any, path: Path = ()) -> Dict[Path, Any]:
    """{path: value} of the plain leaves of a tree: what
    leaves(unflatten(tree, leaf)) gives for the leaves that are not
    tensors, without rebuilding the containers or touching the tensors."""
    out: Dict[Path, Any] = {}
    _plain_leaves(tree, path, out, set())
    return out


def _plain_leaves(tree: Any, path: Path, out: Dict[Path, Any],
                  parents: set) -> None:
    """Into `out`; `parents` holds the path of every container a value in
    `out` was found directly in."""
    if not isinstance(tree, (dict, list)):
        out[path] = tree
        parents.add(path[:-1])
        return
    if isinstance(tree, list):
        raise CorruptError("%s: malformed state structure node"
                           % path_str(path))
    _metadata_on_odict(tree, path)
    if "tensor" in tree:
        if type(tree["tensor"]) is not str or tree.get("from", "np") not in ("np", "pt"):
            raise CorruptError("%s: malformed tensor node" % path_str(path))
        out.pop(path, None)  # as unflatten: a later duplicate key wins
        return
    if "tensors" in tree or "otensors" in tree:
        keys = _tensor_keys(tree, path)[0]
        # Only a plain value found before directly under this path (a
        # crafted duplicate key) can be overwritten: without one, no pass
        # over 10,000 tensors' keys.
        if path in parents:
            for k in keys:
                out.pop(path + (k,), None)
        return
    if "list" in tree or "tuple" in tree:
        for i, v in enumerate(_items(tree, path)):
            _plain_leaves(v, path + (i,), out, parents)
        return
    if "dict" in tree or "odict" in tree:
        for k, v in _pairs(tree, path):
            _plain_leaves(v, path + (k,), out, parents)
        return
    out[path] = decode_tagged(tree)
    parents.add(path[:-1])


@_guard_depth("the state", InvalidArgumentError)
def replace(obj: Any, values: Dict[Path, Any], path: Path = ()) -> Any:
    """`obj` with the leaves at `values`' paths replaced.  Containers with
    nothing replaced below them are returned as they are (the same
    objects); the others are shallow copies."""
    # Every path above a replaced leaf: one set lookup per container
    # instead of a scan of `values` (quadratic for an optimizer state with
    # a plain "step" per parameter).
    above = {p[:i] for p in values for i in range(len(path), len(p))
             if p[:len(path)] == path}
    return _replace(obj, values, above, path)


def _replace(obj: Any, values: Dict[Path, Any], above: set,
             path: Path) -> Any:
    if path in values:
        return values[path]
    if path not in above:
        return obj
    if type(obj) not in _PLAIN_CONTAINERS and (
            is_tensor(obj) or not isinstance(obj, (Mapping, list, tuple))):
        return obj
    if isinstance(obj, Mapping):
        # keys as flatten() keeps them in paths: by base value (an IntEnum
        # or a (str, Enum) member as the int or str it is saved as)
        new = {k: _replace(v, values, above, path + (
                   k if type(k) is str or type(k) is int else base_value(k),))
               for k, v in obj.items()}
        if isinstance(obj, dict):
            out = obj.copy()  # keeps the type (OrderedDict) and order
            for k, v in new.items():  # not update(): a Counter's adds
                out[k] = v
            if hasattr(obj, "_metadata"):
                out._metadata = obj._metadata
            return out
        return new
    new = [_replace(v, values, above, path + (i,)) for i, v in enumerate(obj)]
    if isinstance(obj, list):
        return new
    return obj._make(new) if hasattr(obj, "_make") else type(obj)(new)

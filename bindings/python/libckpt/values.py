"""Plain values of a nested training state <-> the JSON nodes that hold
them in a checkpoint's metadata (the NODE forms of nested.py's format
other than containers and tensors): ints of any size, floats bit for bit
(NaN payloads too), str that JSON cannot carry as is, bytes, torch
dtypes, devices and sizes, NumPy scalars.  Decoding checks every node
and raises CorruptError for one the writer never makes: a checkpoint's
metadata is read from files anyone with access to the root could have
written, and nothing in it is evaluated."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any, Optional, Tuple

import numpy as np

from .errors import CorruptError, Error

Path = Tuple[Any, ...]

INT64 = (-2**63, 2**63 - 1)
# The kinds of NumPy scalar kept as plain values: bool, integers, floats,
# complex, datetime and timedelta (the rest, str, bytes and structured
# values, as before).
_NUMPY_KINDS = frozenset("biufcmM")
_CANONICAL_NAN = struct.pack("<d", float("nan"))


def path_str(path: Path) -> str:
    """A key path as Python subscripts, for messages: state['a'][0]."""
    return "state" + "".join("[%r]" % (k,) for k in path)


def base_value(v: Any) -> Any:
    """`v` as its base type holds it, for an instance of a subclass of str,
    int or float (a (str, Enum) member, an IntEnum, a str subclass with a
    __str__ of its own): the base type's own conversion (str.__str__,
    int.__index__, float.__float__), never the subclass's, so that an
    overriding __str__, __int__, __index__, __float__, __repr__ or
    __format__ cannot change what is stored: str(Mode.TRAIN) is
    "Mode.TRAIN", its value "train".  Exact str, int, float and bool, and
    anything else, are returned as they are."""
    kind = type(v)
    if kind is str or kind is int or kind is float or kind is bool:
        return v
    if isinstance(v, str):
        return str.__str__(v)  # a new exact str of the same text
    if isinstance(v, int):
        return int.__index__(v)  # an exact int of the same value
    if isinstance(v, float):
        return float.__float__(v)  # the same double, bit for bit
    if isinstance(v, np.integer):  # a key (np.unique's): the same int
        return int(v)
    return v


def encode_str(s: str) -> Any:
    try:
        s.encode("utf-8")  # lone surrogates cannot be stored as JSON text
    except UnicodeEncodeError:
        pass
    else:
        if "\0" not in s:  # the manifest reader refuses U+0000
            return s
    raw = s.encode("utf-8", "surrogatepass")
    return {"str": base64.b64encode(raw).decode("ascii")}


def encode_float(x: float) -> Any:
    if math.isfinite(x):
        return x  # the C writer keeps the shortest form that reads back
    if math.isinf(x):
        return {"float": "inf" if x > 0 else "-inf"}
    bits = struct.pack("<d", x)
    if bits == _CANONICAL_NAN:
        return {"float": "nan"}
    return {"float": "nan:%016x" % struct.unpack("<Q", bits)[0]}


def encode_plain(v: Any, path: Path) -> Any:
    if v is None or isinstance(v, bool):
        return v
    # A subclass's value is its base type's (base_value): neither its own
    # __str__ (a (str, Enum) member's is "Mode.TRAIN") nor __int__,
    # __float__ or __repr__ decide what is stored.
    if isinstance(v, int):
        v = int.__index__(v)
        return v if INT64[0] <= v <= INT64[1] else {"int": int.__repr__(v)}
    if isinstance(v, float):
        return encode_float(float.__float__(v))
    if isinstance(v, str):
        return encode_str(str.__str__(v))
    if isinstance(v, bytes):
        return {"bytes": base64.b64encode(v).decode("ascii")}
    if callable(getattr(v, "state_dict", None)) and not isinstance(v, type):
        # a torch module, optimizer or scheduler itself
        raise TypeError(
            "%s: cannot save a %s itself; save its state_dict() (plain "
            "values and tensors) and give it back with load_state_dict()"
            % (path_str(path), type(v).__name__))
    if callable(v) and not isinstance(v, type):
        # A checkpoint holds no code (loading one never runs any), so say
        # what to do instead (a torch LR scheduler's own methods in its
        # state_dict are left out before this: _scheduler_method).
        raise TypeError(
            "%s: cannot save a %s (%r): a checkpoint stores no code, and "
            "loading one runs none; leave it out of the state, e.g. "
            "{k: v for k, v in sched.state_dict().items() if not "
            "callable(v)} (the object it came from keeps its own, and "
            "load_state_dict leaves it in place)"
            % (path_str(path), type(v).__name__, getattr(
                v, "__qualname__", getattr(v, "__name__", type(v).__name__))))
    raise TypeError(
        "%s: cannot save a %s; leaves must be tensors/arrays or plain "
        "values (None, bool, int, float, str, bytes, NumPy scalars, "
        "torch.dtype, torch.device, torch.Size) inside dicts, lists and "
        "tuples"
        % (path_str(path), type(v).__name__))


def encode_key(k: Any, path: Path) -> Any:
    if isinstance(k, np.integer):  # stored as the int it is (torch.save
        return encode_plain(int(k), path)  # keeps such keys too)
    if isinstance(k, bool) or not isinstance(k, (str, int)):
        raise TypeError("%s: key %r is a %s; keys must be str or int "
                        "(or a NumPy integer, stored as int)"
                        % (path_str(path), k, type(k).__name__))
    return encode_plain(k, path)


def decode_tagged(node: dict) -> Any:
    """The value of a tagged plain node; CorruptError when its member is
    not what the writer makes (a forged manifest: '{"int": "abc"}')."""
    try:
        return decode_tagged_value(node)
    except Error:
        raise
    except (ValueError, TypeError, AttributeError) as e:  # binascii.Error too
        raise CorruptError("malformed %s node in the state structure: %s"
                           % ("/".join(map(repr, sorted(node))), e)) from None


def decode_tagged_value(node: dict) -> Any:
    if "int" in node:
        return int(node["int"])
    if "float" in node:
        text = node["float"]
        if text.startswith("nan:"):
            return struct.unpack("<d", struct.pack("<Q", int(text[4:], 16)))[0]
        return float(text)
    if "str" in node:
        return base64.b64decode(node["str"], validate=True).decode(
            "utf-8", "surrogatepass")
    if "bytes" in node:
        return base64.b64decode(node["bytes"], validate=True)
    if "torch" in node:
        return decode_torch(node)
    if "numpy" in node:
        return decode_numpy(node)
    raise CorruptError("unknown node %r in the state structure"
                       % sorted(node))


def encode_torch(v: Any, torch: Any) -> Optional[dict]:
    """The node of a torch.dtype or torch.device (plain values torch.save
    keeps: a mixed-precision setting, where a state was trained), or
    None for anything else."""
    if isinstance(v, torch.dtype):
        return {"torch": "dtype", "value": str(v).rpartition(".")[2]}
    if isinstance(v, torch.device):
        return {"torch": "device", "value": str(v)}
    size = getattr(torch, "Size", None)
    if size is not None and isinstance(v, size):
        return {"torch": "size", "value": [int(d) for d in v]}
    return None


def decode_torch(node: dict) -> Any:
    """A "torch" node's value: the torch.dtype, torch.device or
    torch.Size, checked (a name is looked up, never evaluated).  Where
    torch cannot be imported: a dtype's or device's text, "torch.float32"
    or "cuda:0", as str() of it gives, and a size's tuple."""
    kind, value = node.get("torch"), node.get("value")
    if kind == "size":
        if not isinstance(value, list) or not all(
                type(d) is int and 0 <= d < 2**63 for d in value):
            raise CorruptError("malformed torch size node %r in the state "
                               "structure" % (node,))
    elif kind not in ("dtype", "device") or not isinstance(value, str):
        raise CorruptError("malformed torch node %r in the state structure"
                           % (node,))
    try:
        import torch
    except ImportError:
        if kind == "size":
            return tuple(value)
        return "torch." + value if kind == "dtype" else value
    if kind == "size":
        return torch.Size(value)
    if kind == "dtype":
        found = getattr(torch, value, None) if value.isidentifier() else None
        if not isinstance(found, torch.dtype):
            raise CorruptError("the state structure names a torch dtype %r "
                               "that torch %s lacks" % (value, torch.__version__))
        return found
    try:
        return torch.device(value)
    except (RuntimeError, ValueError) as err:
        raise CorruptError("the state structure holds a torch device %r "
                           "that torch cannot parse: %s" % (value, err)) from None


def encode_numpy(v: Any) -> Optional[dict]:
    """The node of a NumPy scalar of a kind in _NUMPY_KINDS (a metric kept
    as np.float64, a counter as np.int64: a value, not a tensor, so that
    it loads back as the same scalar and a restore gives it back), or
    None for anything else."""
    dtype = v.dtype
    if dtype.kind not in _NUMPY_KINDS:
        return None
    return {"numpy": dtype.str,
            "value": base64.b64encode(v.tobytes()).decode("ascii")}


def decode_numpy(node: dict) -> Any:
    """A "numpy" node's scalar, checked: the dtype text is parsed by NumPy
    (which evaluates nothing) and must be of a kind encode_numpy writes,
    the bytes exactly one value of it."""
    text, value = node.get("numpy"), node.get("value")
    try:
        if not isinstance(text, str) or not isinstance(value, str):
            raise TypeError("not text")
        dtype = np.dtype(text)
        raw = base64.b64decode(value, validate=True)
    except (TypeError, ValueError) as err:
        raise CorruptError("malformed numpy node %r in the state structure: "
                           "%s" % (node, err)) from None
    if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or \
            dtype.subdtype is not None or len(raw) != dtype.itemsize:
        raise CorruptError("malformed numpy node %r in the state structure: "
                           "not one %s value of its bytes" % (node, text))
    return np.frombuffer(raw, dtype)[0]

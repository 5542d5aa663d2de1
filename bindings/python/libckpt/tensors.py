"""Turning NumPy arrays, PyTorch tensors and objects exposing
``__array_interface__`` / ``__cuda_array_interface__`` into ``ckpt_tensor``
descriptions, and checkpoint dtypes back into NumPy dtypes.

Nothing is copied: a description points at the caller's memory, so the
caller's object must stay alive while the C library reads or writes it (the
save handle and restore keep references).  Non-contiguous inputs are refused
with a clear error rather than copied behind the caller's back.
"""

import ctypes
import itertools
import operator
import sys

import numpy as np

from . import ffi
from .errors import InvalidArgumentError

try:  # NumPy has no bfloat16 / float8; ml_dtypes provides them.
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the installation
    ml_dtypes = None

_NUMPY = {
    np.dtype(np.bool_): ffi.CKPT_BOOL,
    np.dtype(np.uint8): ffi.CKPT_U8,
    np.dtype(np.int8): ffi.CKPT_I8,
    np.dtype(np.uint16): ffi.CKPT_U16,
    np.dtype(np.int16): ffi.CKPT_I16,
    np.dtype(np.uint32): ffi.CKPT_U32,
    np.dtype(np.int32): ffi.CKPT_I32,
    np.dtype(np.uint64): ffi.CKPT_U64,
    np.dtype(np.int64): ffi.CKPT_I64,
    np.dtype(np.float16): ffi.CKPT_F16,
    np.dtype(np.float32): ffi.CKPT_F32,
    np.dtype(np.float64): ffi.CKPT_F64,
    np.dtype(np.complex64): ffi.CKPT_C64,
    np.dtype(np.complex128): ffi.CKPT_C128,
}
if ml_dtypes is not None:  # pragma: no cover - depends on the installation
    _NUMPY[np.dtype(ml_dtypes.bfloat16)] = ffi.CKPT_BF16
    _NUMPY[np.dtype(ml_dtypes.float8_e4m3fn)] = ffi.CKPT_F8_E4M3
    _NUMPY[np.dtype(ml_dtypes.float8_e5m2)] = ffi.CKPT_F8_E5M2

# What load() returns for each checkpoint dtype.  Without ml_dtypes,
# bfloat16 comes back as its bit pattern in uint16 and float8 in uint8.
_TO_NUMPY = {v: k for k, v in _NUMPY.items()}
_TO_NUMPY.setdefault(ffi.CKPT_BF16, np.dtype(np.uint16))
_TO_NUMPY.setdefault(ffi.CKPT_F8_E4M3, np.dtype(np.uint8))
_TO_NUMPY.setdefault(ffi.CKPT_F8_E5M2, np.dtype(np.uint8))
_TO_NUMPY[ffi.CKPT_BYTES] = np.dtype(np.uint8)

_TORCH_NAMES = {
    "bool": ffi.CKPT_BOOL, "uint8": ffi.CKPT_U8, "int8": ffi.CKPT_I8,
    "int16": ffi.CKPT_I16, "int32": ffi.CKPT_I32, "int64": ffi.CKPT_I64,
    "uint16": ffi.CKPT_U16, "uint32": ffi.CKPT_U32, "uint64": ffi.CKPT_U64,
    "float16": ffi.CKPT_F16, "bfloat16": ffi.CKPT_BF16,
    "float32": ffi.CKPT_F32, "float64": ffi.CKPT_F64,
    "complex64": ffi.CKPT_C64, "complex128": ffi.CKPT_C128,
    "float8_e4m3fn": ffi.CKPT_F8_E4M3, "float8_e5m2": ffi.CKPT_F8_E5M2,
}
_torch_map = None


def torch_dtype(ckpt_dtype, torch):
    """The torch dtype for a checkpoint dtype (None if this torch has
    none: uint16/32/64 before torch 2.3, float8 before 2.1)."""
    global _torch_inverse
    if _torch_inverse is None:
        _torch_inverse = {code: tdt for tdt, code in
                          _torch_dtypes(torch).items()}
    return _torch_inverse.get(ckpt_dtype)


_torch_inverse = None


_DTYPE_NAMES = {}  # the library's names never change: ask it once each


def dtype_name(ckpt_dtype):
    """"float32", "bfloat16", ... as the C library names a dtype."""
    text = _DTYPE_NAMES.get(ckpt_dtype)
    if text is None:
        name = ffi.lib.ckpt_dtype_name(ckpt_dtype)
        text = name.decode("ascii") if name else str(ckpt_dtype)
        _DTYPE_NAMES[ckpt_dtype] = text
    return text


def numpy_dtype(ckpt_dtype):
    """The NumPy dtype load() uses for a checkpoint dtype."""
    try:
        return _TO_NUMPY[ckpt_dtype]
    except KeyError:
        raise InvalidArgumentError("checkpoint dtype %d has no NumPy "
                                   "equivalent" % ckpt_dtype) from None


class Tensor:
    """One described buffer: where it is, what it holds, who owns it."""

    __slots__ = ("name", "ptr", "nbytes", "dtype", "shape", "memory",
                 "stream", "owner", "device")

    def __init__(self, name, ptr, nbytes, dtype, shape, memory, stream,
                 owner, device=None):
        self.name = name
        self.ptr = ptr
        self.nbytes = nbytes
        self.dtype = dtype
        self.shape = shape
        self.memory = memory
        self.stream = stream  # CUDA stream handle (int) or None
        self.owner = owner    # keeps the memory alive
        self.device = device  # CUDA device index when known (torch), else None

    def _replace_owner(self, owner):
        self.owner = owner
        return self


def _torch_dtypes(torch):
    global _torch_map
    if _torch_map is None:
        _torch_map = {getattr(torch, n): v for n, v in _TORCH_NAMES.items()
                      if isinstance(getattr(torch, n, None), torch.dtype)}
    return _torch_map


def _not_contiguous(name, how):
    return InvalidArgumentError(
        "tensor %r is not contiguous; libckpt reads and writes dense "
        "row-major buffers only: %s" % (name, how))


def _from_torch(name, t, torch, writable):
    is_lazy = getattr(getattr(getattr(torch, "nn", None), "parameter", None),
                      "is_lazy", None)
    if is_lazy is not None and is_lazy(t):  # torch's own error names no key
        raise TypeError(
            "tensor %r is an uninitialized parameter of a lazy module "
            "(torch.nn.LazyLinear and the like): it has no shape or data "
            "until the module's first forward pass; run one before saving "
            "or restoring, or leave it out of the state" % name)
    if getattr(t, "is_nested", False):  # torch's own error is "Internal error"
        raise TypeError(
            "tensor %r is a nested tensor (torch.nested): its pieces differ "
            "in shape, and a checkpoint tensor has one shape; save its "
            "pieces (list(t.unbind())) or a padded copy "
            "(t.to_padded_tensor(0))" % name)
    dtype = _torch_dtypes(torch).get(t.dtype)
    if dtype is None:
        raise TypeError("tensor %r: torch dtype %s is not supported"
                        % (name, t.dtype))
    if t.layout != torch.strided:
        raise TypeError("tensor %r: layout %s is not supported (dense "
                        "tensors are)" % (name, t.layout))
    if not t.is_contiguous() and writable and not _no_overlap(
            t.shape, t.stride(), 1):
        raise _overlapping(name, t.stride(), "t.clone()")
    if t.is_conj() or t.is_neg():
        # A lazy conjugate or negative view (x.conj(), x.conj().imag): the
        # bytes in memory are not its values.  As torch.save keeps the
        # values, a save reads a resolved copy, and a restore writes one
        # that copy_back() copies in (copy_ honours the bits).
        buffer = t.resolve_conj().resolve_neg().contiguous()
        return _from_torch(name, buffer, torch, writable)._replace_owner(
            Relayout(t, buffer))
    if not t.is_contiguous():
        return _relayout(name, t, torch, writable)
    device = None
    if t.device.type == "cpu":
        memory, stream = ffi.CKPT_MEM_HOST, None
    elif t.device.type == "cuda":
        memory, device = ffi.CKPT_MEM_DEVICE, t.device.index
        stream = torch_stream(torch, t.device)
    else:
        raise TypeError("tensor %r: device %s is not supported (cpu and "
                        "cuda are)" % (name, t.device))
    ptr = t.data_ptr()
    if ptr == 0 and t.numel():
        # A wrapper subclass (DTensor, a fake or functional tensor) stands
        # for data held elsewhere: there is nothing at its address to copy.
        raise TypeError(
            "tensor %r (%s.%s) has no storage of its own; save the tensor "
            "it stands for: a DTensor's local shard on each rank "
            "(t.to_local(), with libckpt.dist for several ranks) or the "
            "whole tensor (t.full_tensor())"
            % (name, type(t).__module__, type(t).__qualname__))
    return Tensor(name, ptr, t.numel() * t.element_size(), dtype,
                  tuple(t.shape), memory, stream, t, device)


def _no_overlap(shape, strides, unit):
    """True when no two elements of a strided layout share memory, so a
    restore can write every one: taken dimension by dimension from the
    smallest stride, each must step past everything the smaller ones
    span.  `unit` is one element in the strides' unit (1 for torch's
    element strides, the item size for NumPy's byte strides, whose signs
    do not matter here).  Expanded tensors (stride 0) and other
    self-overlapping views fail it; dense layouts in any order and slices
    with gaps pass."""
    span = unit
    for stride, size in sorted((abs(st), sz) for sz, st in zip(shape, strides)
                               if sz > 1):
        if stride < span:
            return False
        span += stride * (size - 1)
    return True


def _overlapping(name, strides, fix):
    return InvalidArgumentError(
        "tensor %r has elements that share memory (strides %s, an expanded "
        "view): a restore cannot write into it; restore into %s and copy, "
        "or use load()" % (name, tuple(strides), fix))


class Relayout:
    """A tensor or array not laid out row-major (a channels_last
    convolution weight and its optimizer state, a transpose, a slice with
    gaps, an expanded view): libckpt stores row-major bytes, so a save
    reads them from a row-major copy (`buffer`, made with the description)
    and a restore writes them into one, which copy_back() then copies into
    `target` (a torch tensor: with copy_, on its current stream as any
    torch copy; a NumPy array: with numpy.copyto)."""

    __slots__ = ("target", "buffer")

    def __init__(self, target, buffer):
        self.target = target
        self.buffer = buffer

    def copy_back(self):
        if isinstance(self.target, np.ndarray):
            np.copyto(self.target, self.buffer)
            return
        # As the library writes any other tensor: behind autograd (a
        # Parameter is a leaf that requires grad, which copy_ refuses).
        with sys.modules["torch"].no_grad():
            self.target.copy_(self.buffer)


def _relayout(name, t, torch, writable):
    """_from_torch of a tensor not laid out row-major, through a row-major
    copy that the description owns (see Relayout)."""
    if writable and getattr(t, "is_inference", None) and t.is_inference() and \
            not torch.is_inference_mode_enabled():
        # Said before anything is written: copy_back's copy_ would fail
        # after the other tensors of the restore were written.
        raise InvalidArgumentError(
            "tensor %r is an inference tensor (made under "
            "torch.inference_mode()) not laid out row-major: torch lets it "
            "be written only inside inference_mode; restore inside "
            "`with torch.inference_mode():`, or into a clone" % name)
    # A restore's buffer starts as a copy too: a tensor that a restore with
    # strict=False finds missing from the step is copied back unchanged.
    buffer = t.contiguous()
    return _from_torch(name, buffer, torch, writable)._replace_owner(
        Relayout(t, buffer))


def copy_back(keep):
    """After a restore into the descriptions whose owners are `keep`: copy
    each row-major buffer into the tensor it stands for."""
    if Relayout not in set(map(type, keep)):
        return  # the usual case: no pass in Python over 10,000 tensors
    for owner in keep:
        if type(owner) is Relayout:
            owner.copy_back()


def torch_stream(torch, device):
    """torch's current CUDA stream on `device` (the tensor's device, not the
    caller's current one) as a cudaStream_t int, or None for the legacy
    default stream (cuda_stream 0).  The save is ordered after the work
    queued there and fenced on it; a restore copies on it."""
    return torch.cuda.current_stream(device).cuda_stream or None


def _c_contiguous(shape, strides, itemsize):
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expect:
            return False
        expect *= dim
    return True


def _from_cuda_interface(name, obj, writable):
    cai = obj.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    npdt = np.dtype(cai["typestr"])
    dtype = _numpy_to_ckpt(name, npdt)
    strides = cai.get("strides")
    if strides is not None and not _c_contiguous(shape, strides,
                                                 npdt.itemsize):
        raise _not_contiguous(name, "strides %r" % (tuple(strides),))
    if cai.get("mask") is not None:
        raise TypeError("tensor %r: masked CUDA arrays are not supported"
                        % name)
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise InvalidArgumentError("tensor %r is read-only" % name)
    # Per the interface (v3): None means no synchronisation is needed, 1 is
    # the legacy default stream (NULL), 2 the per-thread default stream.
    stream = cai.get("stream")
    if stream in (None, 0, 1):
        stream = None
    count = 1
    for d in shape:
        count *= d
    return Tensor(name, ptr, count * npdt.itemsize, dtype, shape,
                  ffi.CKPT_MEM_DEVICE, stream, obj)


def _numpy_to_ckpt(name, npdt):
    if not npdt.isnative:
        raise TypeError("tensor %r: dtype %s is not in native byte order; "
                        "use a.astype(a.dtype.newbyteorder('='))"
                        % (name, npdt.str))
    dtype = _NUMPY.get(npdt)
    if dtype is None:
        raise TypeError("tensor %r: dtype %s is not supported" % (name, npdt))
    return dtype


def describe(name, obj, writable=False):
    """Describe `obj` as tensor `name` for a save (or, with `writable`, for a
    restore into it)."""
    if not isinstance(name, str):
        raise TypeError("tensor names must be str, not %s"
                        % type(name).__name__)
    if "\0" in name:  # C would cut the name there
        raise InvalidArgumentError("tensor name %r contains a NUL character"
                                   % name)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(name, obj, torch, writable)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_interface(name, obj, writable)
    if isinstance(obj, np.generic):
        if writable:
            raise TypeError("tensor %r: a NumPy scalar cannot be restored "
                            "into (it is immutable); use a 0-d array" % name)
        obj = np.asarray(obj)
    if not (isinstance(obj, np.ndarray) or
            hasattr(obj, "__array_interface__")):
        if hasattr(obj, "__dlpack__"):
            return _from_dlpack(name, obj, writable)
        raise TypeError(
            "tensor %r: %s is not an array (NumPy arrays, torch tensors and "
            "objects with __array_interface__, __cuda_array_interface__ or "
            "__dlpack__ are)" % (name, type(obj).__name__))
    a = np.asarray(obj)
    dtype = _numpy_to_ckpt(name, a.dtype)
    if writable and not a.flags.writeable:
        raise InvalidArgumentError("tensor %r is read-only" % name)
    if not a.flags.c_contiguous:  # through a row-major copy (Relayout)
        if writable and not _no_overlap(a.shape, a.strides, a.itemsize):
            raise _overlapping(name, a.strides, "a.copy()")
        buffer = np.ascontiguousarray(a)
        return describe(name, buffer, writable)._replace_owner(
            Relayout(a, buffer))
    return Tensor(name, a.ctypes.data, a.nbytes, dtype, a.shape,
                  ffi.CKPT_MEM_HOST, None, a if a is obj else (a, obj))


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def _from_dlpack(name, obj, writable):
    """A DLPack producer (JAX, TensorFlow, ...): host memory through NumPy,
    CUDA memory through torch, both without a copy."""
    device = obj.__dlpack_device__()[0] if hasattr(
        obj, "__dlpack_device__") else _DL_CPU
    if device in (_DL_CPU, _DL_CUDA_HOST):
        a = np.from_dlpack(obj)  # read-only in NumPy 1.x: refused below
        d = describe(name, a, writable)
        # A Relayout stays the owner (it holds the copy the pointer is in).
        return d._replace_owner((a, obj)) if d.owner is a else d
    if device in (_DL_CUDA, _DL_CUDA_MANAGED):
        try:
            import torch.utils.dlpack
        except ImportError:
            raise TypeError("tensor %r: a CUDA DLPack object needs torch to "
                            "be read; pass a torch tensor or an object with "
                            "__cuda_array_interface__" % name) from None
        t = torch.utils.dlpack.from_dlpack(obj)
        d = _from_torch(name, t, torch, writable)
        # A Relayout stays the owner (restore copies back through it); t
        # keeps the producer's memory alive either way.
        return d._replace_owner((t, obj)) if d.owner is t else d
    raise TypeError("tensor %r: DLPack device type %d is not supported "
                    "(CPU and CUDA are)" % (name, device))


def describe_many(pairs, writable=False):
    """[describe(name, obj, writable) for name, obj in pairs], the common
    case quicker: a dense, contiguous torch CPU tensor of a supported dtype
    is described here with a few attribute reads (10,000 tiny tensors would
    otherwise spend more time in the general path than the library spends
    saving them).  Anything else, and anything this path would refuse, goes
    through describe(), which gives the same description or the same
    error."""
    torch = sys.modules.get("torch")
    fast = _fast_torch(torch)
    if fast is None:
        return [describe(name, obj, writable) for name, obj in pairs]
    classes, kinds, strided = fast
    host = ffi.CKPT_MEM_HOST
    out = []
    append = out.append
    for name, t in pairs:
        if type(t) in classes and type(name) is str and "\0" not in name:
            kind = kinds.get(t.dtype)
            # (code, bytes per element, complex): only a complex tensor
            # can carry the lazy conjugate bit.
            if (kind is not None and t.layout is strided and t.is_cpu
                    and not t.is_neg() and not (kind[2] and t.is_conj())
                    and t.is_contiguous() and not getattr(t, "is_nested", 0)):
                append(Tensor(name, t.data_ptr(), t.numel() * kind[1],
                              kind[0], t.shape, host, None, t))
                continue
        append(describe(name, t, writable))
    return out


def _fast_torch(torch):
    """(tensor classes, {torch dtype: (code, element size, complex)},
    torch.strided) for describe_many, or None when the torch in
    sys.modules is not one it knows (absent, or a stand-in without these
    attributes)."""
    if torch is None:
        return None
    global _fast_cache
    if _fast_cache[0] is not torch:
        _fast_cache = (torch, _fast_torch_of(torch))
    return _fast_cache[1]


_fast_cache = (None, None)  # (the torch module, _fast_torch_of(it))


def _fast_torch_of(torch):
    try:
        classes = {torch.Tensor, torch.nn.Parameter}
        probe = torch.empty(0)
        probe.is_cpu, probe.is_neg, probe.is_conj  # torch >= 1.10
        kinds = {dt: (code, torch.empty(0, dtype=dt).element_size(),
                      dt.is_complex)
                 for dt, code in _torch_dtypes(torch).items()}
        return classes, kinds, torch.strided
    except Exception:
        return None


def describe_all(tensors, writable=False):
    """Describe a mapping of names to arrays; returns a list of Tensor."""
    if not hasattr(tensors, "items"):
        raise TypeError("tensors must be a mapping of names to arrays, not %s"
                        % type(tensors).__name__)
    return [describe(n, a, writable) for n, a in tensors.items()]


def _record_dtype():
    """ckpt_tensor as a NumPy record type (same offsets), so c_array fills
    every field of every tensor with one vectorised assignment."""
    f = ffi.ckpt_tensor
    kinds = {"name": np.uint64, "data": np.uint64, "bytes": np.uint64,
             "dtype": np.int32, "ndim": np.int32, "shape": np.uint64,
             "memory": np.int32}
    for field, ctype in f._fields_:  # the widths must be the C ones
        assert ctypes.sizeof(ctype) == np.dtype(kinds[field]).itemsize
    return np.dtype({"names": list(kinds),
                     "formats": list(kinds.values()),
                     "offsets": [getattr(f, k).offset for k in kinds],
                     "itemsize": ctypes.sizeof(f)})


_RECORD = _record_dtype()


def c_array(described):
    """A ctypes ckpt_tensor[] for the described tensors, and the objects it
    points into (keep them alive while the array is in use)."""
    return _c_array_columns(
        [t.name for t in described], [t.ptr or 0 for t in described],
        [t.nbytes for t in described], [t.dtype for t in described],
        [t.shape for t in described], [t.memory for t in described],
        [t.owner for t in described])


def _c_array_columns(names, ptrs, nbytes, dtypes, shapes, memory, owners,
                     sizes=None, joined=None):
    """c_array from one list per field (n entries each; `memory` and
    `dtypes` may also be int arrays).  With `sizes` (element sizes, a
    uint64 array) `nbytes` is None: each tensor's bytes are its size times
    the product of its shape.  `joined`: "\\0".join(names), if made.

    Built in one pass for any number of tensors: the names live in one
    NUL-separated buffer and the shapes in one int64 array, and each
    column of the array is assigned at once (10,000 tiny tensors would
    otherwise spend more time here than the library spends saving them)."""
    n = len(names)
    arr = (ffi.ckpt_tensor * max(n, 1))()
    if n == 0:
        return arr, [arr]
    if joined is None:
        joined = "\0".join(names)
    if joined.isascii():  # one byte per character: no encoding one by one
        blob = joined.encode("ascii") + b"\0"
    else:
        blob = b"\0".join([name.encode("utf-8") for name in names]) + b"\0"
    ndims = np.fromiter(map(len, shapes), np.int32, n)
    total = int(ndims.sum())
    # a 0-d tensor points here too
    dims = np.fromiter(itertools.chain.from_iterable(shapes), np.int64, total) \
        if total else np.zeros(1, np.int64)
    if nbytes is None:  # size x product of the dims (1 for a 0-d tensor)
        nbytes = sizes.copy()
        rows = np.flatnonzero(ndims)
        if total:
            first = np.zeros(n, np.int64)
            np.cumsum(ndims[:-1], out=first[1:])
            nbytes[rows] *= np.multiply.reduceat(dims[:total],
                                                 first[rows]).astype(np.uint64)
    # Each name starts after the NUL ending the one before (no name holds
    # a NUL: prepare and describe refuse them).
    text = np.frombuffer(blob, np.uint8)
    ends = np.flatnonzero(text == 0)
    if len(ends) != n:
        raise InvalidArgumentError("a tensor name contains a NUL character")
    starts = np.zeros(n, np.uint64)
    starts[1:] = ends[:-1] + 1
    rec = np.frombuffer(arr, _RECORD)
    rec["name"] = text.ctypes.data + starts
    starts = np.zeros(n, np.uint64)
    np.cumsum(ndims[:-1].astype(np.uint64), out=starts[1:])
    rec["shape"] = dims.ctypes.data + starts * np.uint64(8)
    rec["data"] = np.array(ptrs, np.uint64)  # 0 for an empty tensor (torch's)
    rec["bytes"] = np.array(nbytes, np.uint64)
    rec["dtype"] = np.array(dtypes, np.int32)
    rec["ndim"] = ndims
    rec["memory"] = memory
    return arr, [arr, blob, dims] + owners


def prepare(names, objs, writable=False):
    """describe_many, one_stream and c_array in one pass over the tensors
    `objs` named `names` (two lists of one length): (ckpt_tensor[],
    objects to keep alive, the CUDA stream, whether any tensor is on a
    device).  The common case, a dense, contiguous torch CPU tensor of a
    supported dtype, goes straight into columns without a Tensor object
    (what 10,000 tiny tensors spend most of their Python time on);
    anything else goes through describe(), with the same descriptions and
    errors as describe_many."""
    torch = sys.modules.get("torch")
    fast = _fast_torch(torch)
    if fast is None:
        described = [describe(name, obj, writable)
                     for name, obj in zip(names, objs)]
        return (c_array(described) + (one_stream(described),
                any(t.memory == ffi.CKPT_MEM_DEVICE for t in described)))
    whole = _all_plain_torch(names, objs, fast, torch.Tensor)
    if whole is not None:
        return whole
    pairs = zip(names, objs)  # `names` is the column built below from here
    classes, kinds, strided = fast
    names, ptrs, nbytes, dtypes, shapes, owners = [], [], [], [], [], []
    others = []  # (index, Tensor) of those described the general way
    for name, t in pairs:
        if type(t) in classes and type(name) is str and "\0" not in name:
            kind = kinds.get(t.dtype)
            # as describe_many's test
            if (kind is not None and t.layout is strided and t.is_cpu
                    and not t.is_neg() and not (kind[2] and t.is_conj())
                    and t.is_contiguous() and not getattr(t, "is_nested", 0)):
                names.append(name)
                ptrs.append(t.data_ptr())
                nbytes.append(t.numel() * kind[1])
                dtypes.append(kind[0])
                shapes.append(t.shape)
                owners.append(t)
                continue
        d = describe(name, t, writable)
        others.append((len(names), d))
        names.append(d.name)
        ptrs.append(d.ptr or 0)
        nbytes.append(d.nbytes)
        dtypes.append(d.dtype)
        shapes.append(d.shape)
        owners.append(d.owner)
    memory = np.full(len(names), ffi.CKPT_MEM_HOST, np.int32)
    for i, d in others:
        memory[i] = d.memory
    general = [d for _, d in others]
    arr, keep = _c_array_columns(names, ptrs, nbytes, dtypes, shapes, memory,
                                 owners)
    return (arr, keep, one_stream(general),
            any(d.memory == ffi.CKPT_MEM_DEVICE for d in general))


_DTYPE = operator.attrgetter("dtype")
_LAYOUT = operator.attrgetter("layout")
_IS_CPU = operator.attrgetter("is_cpu")
_SHAPE = operator.attrgetter("shape")


def _all_plain_torch(names, objs, fast, tensor):
    """prepare() for the usual state, every value a dense, contiguous torch
    CPU tensor of a supported dtype under a str name: each property asked
    of all tensors at once (map over the unbound methods runs no Python
    code per tensor, about half the cost of prepare's loop), and what
    depends on the dtype worked out once per distinct dtype.  None when
    any pair is otherwise; prepare's loop then sorts them one by one."""
    if not names:
        return None
    classes, kinds, strided = fast
    if not set(map(type, objs)) <= classes or set(map(type, names)) != {str}:
        return None
    joined = "\0".join(names)
    if joined.count("\0") != len(names) - 1:
        return None  # a name holds a NUL: describe() names it
    dtypes = list(map(_DTYPE, objs))
    found = {dt: kinds.get(dt) for dt in set(dtypes)}
    if None in found.values() or set(map(_LAYOUT, objs)) != {strided}:
        return None
    if (not all(map(_IS_CPU, objs)) or any(map(tensor.is_neg, objs))
            or not all(map(tensor.is_contiguous, objs))):
        return None
    if any(k[2] for k in found.values()) and any(
            t.is_conj() for t, dt in zip(objs, dtypes) if found[dt][2]):
        return None
    n = len(objs)
    if len(found) == 1:  # one dtype (the usual state): no pass per tensor
        code, size, _ = found[dtypes[0]]
        codes = np.full(n, code, np.int32)
        sizes = np.full(n, size, np.uint64)
    else:
        order = list(found)
        which = np.fromiter(map({dt: i for i, dt in enumerate(order)}
                                .__getitem__, dtypes), np.intp, n)
        codes = np.array([found[dt][0] for dt in order], np.int32)[which]
        sizes = np.array([found[dt][1] for dt in order], np.uint64)[which]
    try:
        shapes = list(map(_SHAPE, objs))
        ptrs = list(map(tensor.data_ptr, objs))
    except RuntimeError:  # a nested tensor has no shape: describe() names it
        return None
    memory = np.full(n, ffi.CKPT_MEM_HOST, np.int32)
    arr, keep = _c_array_columns(names, ptrs, None, codes, shapes, memory,
                                 list(objs), sizes=sizes, joined=joined)
    return arr, keep, None, False


def one_stream(described):
    """The single CUDA stream the device tensors were written on (None for
    the legacy default stream or host-only saves).  Device tensors on
    several GPUs are refused here, naming them, as the C library would."""
    device = [t for t in described if t.memory == ffi.CKPT_MEM_DEVICE]
    gpus = sorted({t.device for t in device if t.device is not None})
    if len(gpus) > 1:
        raise InvalidArgumentError(
            "device tensors of one save or restore are on several GPUs (%s); "
            "libckpt copies one device's tensors per call: use one store per "
            "GPU, or move the tensors to one device"
            % ", ".join("cuda:%d" % g for g in gpus))
    streams = {t.stream for t in device}
    if len(streams) > 1:
        raise InvalidArgumentError(
            "device tensors of one save or restore come from different CUDA "
            "streams %s; synchronise them and use one stream (or one device)"
            % sorted(s or 0 for s in streams))
    return streams.pop() if streams else None

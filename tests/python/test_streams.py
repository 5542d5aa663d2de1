"""Which CUDA stream the binding hands to the C library for torch tensors:
torch's current stream on the tensor's own device (not NULL, not the
caller's current device), None for the legacy default stream, none asked
for CPU tensors, and tensors on two GPUs refused by name.

A stand-in for torch (installed in sys.modules for each test) records which
device's stream was asked for, so this runs without a GPU and without
torch.  With CKPT_CUDART_LIBRARY naming tests/cuda's mock runtime (meson's
python-cuda-mock test), one more test saves such a tensor through the real
C device path and proves the copy was ordered after work on that stream."""

import ctypes
import os
import sys
import threading
import types

import numpy as np
import pytest

import libckpt
from libckpt import ffi
from libckpt import tensors as _tensors
from conftest import open_store


class FakeDevice:
    def __init__(self, spec):
        self.type, _, index = spec.partition(":")
        self.index = int(index) if index else None

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type,
                                                               self.index)


def fake_torch(streams):
    """A module with just what the binding reads of torch.  `streams` maps a
    device index to its current stream handle; asked devices are recorded
    in .asked."""
    torch = types.ModuleType("torch")

    class dtype:
        def __init__(self, name):
            self.name = name

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    class Tensor:
        def __init__(self, device, n=4, ptr=0x1000):
            self.device = FakeDevice(device)
            self.dtype = torch.float32
            self.layout = torch.strided
            self.shape = (n,)
            self._n, self._ptr = n, ptr

        def is_conj(self):
            return False

        def is_neg(self):
            return False

        def is_contiguous(self):
            return True

        def data_ptr(self):
            return self._ptr

        def numel(self):
            return self._n

        def element_size(self):
            return 4

    def current_stream(device=None):
        torch.asked.append(device)
        return Stream(streams[device.index])

    torch.dtype, torch.Tensor = dtype, Tensor
    for name in _tensors._TORCH_NAMES:
        setattr(torch, name, dtype(name))
    torch.strided = object()
    torch.cuda = types.SimpleNamespace(current_stream=current_stream)
    torch.asked = []
    return torch


@pytest.fixture
def torch(monkeypatch):
    t = fake_torch({0: 0, 1: 0xB1, 2: 0xB2})
    monkeypatch.setitem(sys.modules, "torch", t)
    monkeypatch.setattr(_tensors, "_torch_map", None)  # dtypes of this torch
    return t


def test_a_cuda_tensor_uses_torch_current_stream_on_its_own_device(torch):
    d = _tensors.describe("w", torch.Tensor("cuda:1"))
    assert d.memory == ffi.CKPT_MEM_DEVICE and d.device == 1
    assert d.stream == 0xB1
    assert [str(a) for a in torch.asked] == ["cuda:1"]
    # for a restore (writable) the same stream is used
    assert _tensors.describe("w", torch.Tensor("cuda:2"), writable=True).stream == 0xB2


def test_the_legacy_default_stream_is_null(torch):
    assert _tensors.describe("w", torch.Tensor("cuda:0")).stream is None


def test_a_cpu_tensor_asks_for_no_stream(torch):
    d = _tensors.describe("w", torch.Tensor("cpu"))
    assert d.memory == ffi.CKPT_MEM_HOST and d.stream is None
    assert torch.asked == []


def test_one_save_gets_the_stream_of_its_device(torch):
    ds = [_tensors.describe(n, torch.Tensor("cuda:1")) for n in "ab"]
    ds.append(_tensors.describe("h", np.ones(3)))
    assert _tensors.one_stream(ds) == 0xB1


def test_tensors_on_two_gpus_are_refused_by_name(torch):
    ds = [_tensors.describe("a", torch.Tensor("cuda:0")),
          _tensors.describe("b", torch.Tensor("cuda:1"))]
    with pytest.raises(libckpt.InvalidArgumentError,
                       match=r"several GPUs \(cuda:0, cuda:1\)"):
        _tensors.one_stream(ds)


def test_without_torch_arrays_still_describe(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    d = _tensors.describe("h", np.arange(3.0))
    assert d.memory == ffi.CKPT_MEM_HOST and d.stream is None


MOCK = os.environ.get("CKPT_CUDART_LIBRARY")
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@pytest.mark.skipif(not MOCK or not os.path.exists(MOCK),
                    reason="needs the mock CUDA runtime (meson's "
                           "python-cuda-mock test sets CKPT_CUDART_LIBRARY)")
def test_save_is_ordered_after_work_on_torch_current_stream(root):
    """The tensor's stream is held by a host function until save() has
    returned (and a little longer); the write that gives the tensor its
    content comes after the hold on that stream.  Only a save ordered after
    that stream (not after the NULL stream, which a non-blocking stream does
    not join) can hold the content."""
    rt = ctypes.CDLL(MOCK)  # the very runtime libckpt loads
    for name in ("cudaMalloc", "cudaFree", "cudaStreamCreateWithFlags",
                 "cudaStreamDestroy", "cudaStreamSynchronize",
                 "cudaLaunchHostFunc"):
        getattr(rt, name).restype = ctypes.c_int
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    rt.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.c_uint]
    rt.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    rt.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, HOSTFN, ctypes.c_void_p]
    if not libckpt.cuda_available():
        with open("/proc/self/maps") as maps:  # mocks: libcudart_mock*.so
            if any("libcudart.so" in l for l in maps):
                pytest.skip("a real CUDA runtime (a CUDA build of torch's) "
                            "was in the process first: libckpt uses it, not "
                            "the mock (docs/CUDA.md)")
    assert libckpt.cuda_available()

    n = 1 << 16
    want = np.arange(n, dtype=np.float32)
    s, p = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0  # non-blocking
    assert rt.cudaMalloc(ctypes.byref(p), want.nbytes) == 0
    ctypes.memset(p.value, 0, want.nbytes)  # mock device memory is host memory
    released, broke = threading.Event(), []

    def hold(_):
        if not released.wait(60):  # a deadlock breaker, not a timing check
            broke.append(True)

    def write(_):
        ctypes.memmove(p.value, want.ctypes.data, want.nbytes)

    hold_fn, write_fn = HOSTFN(hold), HOSTFN(write)
    torch = fake_torch({0: s.value})
    saved = sys.modules.get("torch")
    sys.modules["torch"] = torch
    _tensors._torch_map = None
    try:
        assert rt.cudaLaunchHostFunc(s, hold_fn, None) == 0
        assert rt.cudaLaunchHostFunc(s, write_fn, None) == 0
        x = torch.Tensor("cuda:0", n=n, ptr=p.value)
        with open_store(root) as store:
            h = store.save(1, {"x": x})
            # A save ordered on the wrong stream would copy now: give it the
            # time to (a right one cannot, and passes however long this is).
            t = threading.Thread(target=h.wait_snapshot)
            t.start()
            t.join(0.5)
            released.set()
            t.join()
            h.wait()
            assert not broke, "save() waited for the held stream"
            # NumPy: the stand-in torch module cannot allocate tensors.
            got = store.load(framework="np")[1]["x"]
        assert [str(a) for a in torch.asked] == ["cuda:0"]
        assert np.array_equal(got, want), \
            "the save did not wait for work on torch's current stream"
    finally:
        released.set()
        if saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = saved
        _tensors._torch_map = None
        rt.cudaStreamSynchronize(s)
        rt.cudaStreamDestroy(s)
        rt.cudaFree(p)

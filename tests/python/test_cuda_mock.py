"""Device arrays without a GPU: libckpt's real CUDA backend runs against the
host-memory CUDA runtime of tests/cuda/mock_cudart.c, which meson names in
CKPT_CUDART_LIBRARY for a separate run of this file.  Checks the binding's
device path: memory=DEVICE, the caller's stream, the fence that keeps later
work on that stream off the tensors until the snapshot copy is done, the
references kept until then, and device errors."""

import ctypes
import gc
import os
import weakref

import numpy as np
import pytest

import libckpt
from conftest import open_store

MOCK = os.environ.get("CKPT_CUDART_LIBRARY")
if not MOCK or not os.path.exists(MOCK):
    pytest.skip("runs in meson's python-cuda-mock test, which sets "
                "CKPT_CUDART_LIBRARY", allow_module_level=True)

H2D, D2H = 1, 2
COPY_DELAY_US = 150000  # each mock memcpy sleeps this long
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@pytest.fixture(scope="module")
def cuda():
    rt = ctypes.CDLL(MOCK)  # the very object libckpt loads
    for name in ("cudaMalloc", "cudaFree", "cudaMemcpy", "cudaStreamCreate",
                 "cudaStreamDestroy", "cudaStreamSynchronize",
                 "cudaLaunchHostFunc", "mock_cuda_fault"):
        getattr(rt, name).restype = ctypes.c_int
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int]
    rt.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    rt.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    rt.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, HOSTFN,
                                      ctypes.c_void_p]
    rt.mock_cuda_fault.argtypes = [ctypes.c_char_p, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_uint]
    rt.mock_cuda_set_copy_delay_us.argtypes = [ctypes.c_uint]
    assert libckpt.cuda_available()
    yield rt
    rt.mock_cuda_reset()


@pytest.fixture
def stream(cuda):
    s = ctypes.c_void_p()
    assert cuda.cudaStreamCreate(ctypes.byref(s)) == 0
    yield s.value
    cuda.cudaStreamSynchronize(s)
    cuda.cudaStreamDestroy(s)


class DeviceArray:
    """A minimal CuPy stand-in: mock device memory exposing
    __cuda_array_interface__ (v3) with a stream."""

    def __init__(self, cuda, host, stream=None):
        self.cuda, self.stream = cuda, stream
        self.shape, self.dtype = host.shape, host.dtype
        self.nbytes = host.nbytes
        p = ctypes.c_void_p()
        assert cuda.cudaMalloc(ctypes.byref(p), max(host.nbytes, 1)) == 0
        self.ptr = p.value
        host = np.ascontiguousarray(host)
        assert cuda.cudaMemcpy(self.ptr, host.ctypes.data, host.nbytes,
                               H2D) == 0

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (self.ptr, False), "version": 3, "strides": None,
                "stream": self.stream}

    def get(self):
        self.cuda.cudaStreamSynchronize(self.stream)
        out = np.empty(self.shape, self.dtype)
        assert self.cuda.cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes,
                                    D2H) == 0
        return out

    def __del__(self):
        self.cuda.cudaFree(self.ptr)


@pytest.mark.parametrize("mode", ["host", "device", "stream"])
def test_device_round_trip(cuda, stream, root, mode):
    host = {"f": np.arange(1000, dtype=np.float32),
            "b": np.array([True, False, True]),
            "s": np.array(7, np.int64), "e": np.zeros((0, 3), np.float64)}
    dev = {k: DeviceArray(cuda, v, stream) for k, v in host.items()}
    with open_store(root, snapshot=mode) as store:
        store.save(1, dev).wait()
        _, got = store.load()
        for k, v in host.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        back = {k: DeviceArray(cuda, np.zeros_like(v), stream)
                for k, v in host.items()}
        assert store.restore(back) == 1
        for k, v in host.items():
            assert np.array_equal(back[k].get(), v), k


def test_work_enqueued_after_save_cannot_reach_the_snapshot(cuda, stream,
                                                            root):
    cuda.mock_cuda_set_copy_delay_us(COPY_DELAY_US)
    try:
        want = np.arange(1 << 16, dtype=np.int32)
        x = DeviceArray(cuda, want, stream)
        clobber = HOSTFN(lambda _: ctypes.memset(x.ptr, 0xFF, x.nbytes))
        with open_store(root) as store:
            h = store.save(1, {"x": x})
            # A "kernel" overwriting x, enqueued right after save returned:
            # the binding fenced the stream, so it runs after the copy.
            assert cuda.cudaLaunchHostFunc(stream, clobber, None) == 0
            h.wait()
            assert np.array_equal(store.load()[1]["x"], want)
        assert (x.get() == -1).all()  # the kernel did run
    finally:
        cuda.mock_cuda_set_copy_delay_us(0)


def test_save_keeps_device_arrays_alive_until_the_snapshot(cuda, stream,
                                                           root):
    cuda.mock_cuda_set_copy_delay_us(COPY_DELAY_US)
    try:
        with open_store(root) as store:
            x = DeviceArray(cuda, np.ones(1000, np.float64), stream)
            ref = weakref.ref(x)
            h = store.save(1, {"x": x})
            del x
            gc.collect()
            assert ref() is not None  # the handle holds it
            h.wait_snapshot()
            gc.collect()
            assert ref() is None      # and lets go once copied
            h.wait()
            assert np.array_equal(store.load()[1]["x"], np.ones(1000))
    finally:
        cuda.mock_cuda_set_copy_delay_us(0)


def test_device_fault_is_a_device_error_and_the_store_goes_on(cuda, stream,
                                                             root):
    x = DeviceArray(cuda, np.arange(100.0), stream)
    with open_store(root) as store:
        # The copy is accepted and fails when the stream runs it (999:
        # cudaErrorUnknown; an illegal address, 700, would poison the
        # context for good, in the mock as on a GPU).
        cuda.mock_cuda_fault(b"cudaMemcpyAsync", 1, 999, 0x1)
        with pytest.raises(libckpt.DeviceError) as e:
            store.save(1, {"x": x}).wait()
        assert e.value.message
        cuda.mock_cuda_reset()
        assert store.latest() is None  # nothing was committed
        store.save(2, {"x": x}).wait()
        assert store.latest() == 2


def test_failed_save_nobody_waited_for_is_reported(cuda, stream, root):
    x = DeviceArray(cuda, np.arange(100.0), stream)
    store = open_store(root)
    # The warning comes when the dropped handle is collected if the save has
    # already failed by then, else from close(): either way exactly once.
    with pytest.warns(RuntimeWarning, match="step 1 failed") as seen:
        try:
            cuda.mock_cuda_fault(b"cudaMemcpyAsync", 1, 999, 0x1)
            store.save(1, {"x": x})  # handle dropped: the failure is not lost
            cuda.mock_cuda_reset()
        finally:
            with pytest.raises(libckpt.DeviceError):
                store.close()
    assert len([w for w in seen if "step 1 failed" in str(w.message)]) == 1
    assert store.closed


def test_failed_dropped_save_is_warned_at_the_next_save(cuda, stream, root):
    x = DeviceArray(cuda, np.arange(100.0), stream)
    store = open_store(root)
    try:
        cuda.mock_cuda_fault(b"cudaMemcpyAsync", 1, 999, 0x1)
        # The handle is dropped: reported once, where it is dropped when
        # the save has failed by then (the copy fails at once on a fast
        # machine), else by the next save, which waits for it first.
        with pytest.warns(RuntimeWarning, match="step 1 failed") as seen:
            store.save(1, {"x": x})
            cuda.mock_cuda_reset()
            store.save(2, {"y": np.ones(3)}).wait()
        seen = [w for w in seen if "step 1 failed" in str(w.message)]
        assert [w.filename for w in seen] == [__file__], "once, the caller's line"
        assert store.latest() == 2
    finally:
        with pytest.raises(libckpt.DeviceError):
            store.close()  # and close() still raises it


def test_one_stream_per_save(cuda, stream, root):
    other = ctypes.c_void_p()
    assert cuda.cudaStreamCreate(ctypes.byref(other)) == 0
    try:
        a = DeviceArray(cuda, np.ones(4), stream)
        b = DeviceArray(cuda, np.ones(4), other.value)
        with open_store(root) as store:
            with pytest.raises(libckpt.InvalidArgumentError, match="stream"):
                store.save(1, {"a": a, "b": b})
            # Host and device tensors mix freely.
            store.save(1, {"a": a, "h": np.ones(4)}).wait()
    finally:
        cuda.cudaStreamDestroy(other)


def test_default_streams(cuda, root):
    with open_store(root) as store:
        for s in (None, 1, 2):  # no sync needed, legacy, per-thread
            x = DeviceArray(cuda, np.full(8, s or 0, np.int16), s)
            store.save(10 + (s or 0), {"x": x}).wait()
            assert store.load()[1]["x"][0] == (s or 0)


def test_nested_state_of_device_arrays(cuda, stream, root):
    """A nested state mixing device arrays, host arrays and plain values:
    the device leaves are copied on their stream under dotted names, and
    restore() fills device arrays in a nested state in place."""
    w, m = np.arange(64, dtype=np.float32), np.full(64, 0.5, np.float32)
    state = {"model": {"fc.weight": DeviceArray(cuda, w, stream)},
             "optim": {"state": {0: {"exp_avg": DeviceArray(cuda, m, stream)}},
                       "param_groups": [{"lr": 0.1, "params": [0]}]},
             "host": [np.ones(3, np.int8)], "epoch": 2}
    with open_store(root) as store:
        store.save(1, state).wait()
        with store.open() as ck:
            assert ck.keys() == ["model.fc.weight", "optim.state.0.exp_avg",
                                 "host.0"]
        _, got = store.load()
        assert np.array_equal(got["model"]["fc.weight"], w)
        assert np.array_equal(got["optim"]["state"][0]["exp_avg"], m)
        assert got["optim"]["param_groups"] == [{"lr": 0.1, "params": [0]}]
        assert got["epoch"] == 2 and list(got["optim"]["state"]) == [0]
        back = {"model": {"fc.weight": DeviceArray(cuda, np.zeros_like(w),
                                                   stream)}, "epoch": 0}
        r = store.restore(back, strict=True)
        assert np.array_equal(back["model"]["fc.weight"].get(), w)
        assert r.state["epoch"] == 2 and "host.0" in r.unexpected_keys


def test_pinned_limit_caps_the_pinned_memory_a_store_holds(cuda, stream, root):
    """Store(pinned_limit=) reaches the library: a device state larger
    than the cap still saves and restores, through pinned memory that
    never exceeds it, where the default (1 GiB) pins the whole state."""
    host = {"w%d" % i: np.random.default_rng(i).random(64 * 1024)
            for i in range(4)}  # 4 x 512 KiB
    dev = {k: DeviceArray(cuda, v, stream) for k, v in host.items()}
    cap = 1 << 20
    with open_store(root, pinned_limit=cap, chunk_bytes=256 * 1024) as store:
        store.save(1, dev).wait()
        assert 0 < store.pinned_bytes <= cap
        back = {k: DeviceArray(cuda, np.zeros_like(v), stream)
                for k, v in host.items()}
        assert store.restore(back) == 1
        assert store.pinned_bytes <= cap
        for k, v in host.items():
            assert np.array_equal(back[k].get(), v), k
    with open_store(root / "default") as store:
        store.save(1, dev).wait()
        assert store.pinned_bytes > cap

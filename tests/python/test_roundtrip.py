"""Save, load, restore and metadata round trips of NumPy arrays."""

import numpy as np
import pytest

import libckpt
from conftest import open_store

RNG = np.random.default_rng(7)

DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32,
          np.int32, np.uint64, np.int64, np.float16, np.float32, np.float64,
          np.complex64, np.complex128]


def sample(dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.integers(0, 2, shape).astype(bool)
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, shape, dtype=dtype,
                            endpoint=True)
    if dtype.kind == "c":
        return (RNG.standard_normal(shape) +
                1j * RNG.standard_normal(shape)).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def assert_same(got, want):
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips(store, dtype):
    a = sample(dtype, (3, 5, 7))
    store.save(10, {"x": a}).wait()
    step, got = store.load()
    assert step == 10
    assert list(got) == ["x"]
    assert_same(got["x"], a)
    b = np.zeros_like(a)
    assert store.restore({"x": b}) == 10
    assert_same(b, a)


def test_all_dtypes_in_one_checkpoint(store):
    arrays = {np.dtype(d).name: sample(d, (33,)) for d in DTYPES}
    store.save(1, arrays).wait()
    _, got = store.load(step=1)
    assert sorted(got) == sorted(arrays)
    for k in arrays:
        assert_same(got[k], arrays[k])


def test_zero_dimensional_and_empty_arrays(store):
    arrays = {"scalar": np.array(3.25), "int0d": np.array(-7, np.int64),
              "bool0d": np.array(True), "empty": np.zeros((0,), np.float32),
              "empty3d": np.zeros((3, 0, 2), np.int32),
              "numpy_scalar": np.float32(1.5)}
    store.save(3, arrays).wait()
    _, got = store.load()
    for k, v in arrays.items():
        assert_same(got[k], np.asarray(v))
    out = {k: np.zeros_like(np.asarray(v)) for k, v in arrays.items()
           if k != "numpy_scalar"}
    store.restore(out)
    for k, v in out.items():
        assert_same(v, np.asarray(arrays[k]))


def test_large_array_spans_many_chunks(root):
    # 48 MiB: random (incompressible) and structured (compressible) halves.
    n = 6 << 20
    a = np.concatenate([RNG.standard_normal(n // 2),
                        np.arange(n // 2, dtype=np.float64)])
    with open_store(root, chunk_bytes=1 << 20) as store:
        h = store.save(1, {"big": a})
        h.wait()
        st = h.stats
        assert st["raw_bytes"] == a.nbytes
        assert 0 < st["stored_bytes"] < a.nbytes
        assert st["chunks"] >= a.nbytes // (1 << 20)
        b = np.empty_like(a)
        store.restore({"big": b})
        assert np.array_equal(a, b)


def test_many_tensors(store):
    arrays = {"layer%04d/w" % i: np.full((i % 5 + 1,), i, np.int32)
              for i in range(2000)}
    store.save(5, arrays).wait()
    step, got = store.load()
    assert step == 5 and len(got) == 2000
    for k, v in arrays.items():
        assert_same(got[k], v)
    assert store.steps()[-1]["tensors"] == 2000


def test_metadata_round_trip(store):
    meta = {"epoch": 3, "lr": 1e-3, "name": "r\u00e9sum\u00e9 \u2713",
            "betas": [0.9, 0.999], "nested": {"ok": True, "none": None}}
    store.save(1, {"x": np.ones(3)}, metadata=meta).wait()
    store.save(2, {"x": np.ones(3)}).wait()
    assert store.metadata(1) == meta
    assert store.metadata(2) is None
    assert store.metadata() is None  # newest: step 2
    store.save(3, {"x": np.ones(3)}, metadata=[1, "two"]).wait()
    assert store.metadata() == [1, "two"]


def test_metadata_must_be_json(store):
    with pytest.raises(ValueError):
        store.save(1, {"x": np.ones(3)}, metadata={"bad": float("nan")})
    with pytest.raises(TypeError):
        store.save(1, {"x": np.ones(3)}, metadata={"bad": object()})
    assert store.latest() is None


def test_snapshot_is_taken_when_save_returns(store):
    a = np.arange(1 << 20, dtype=np.int64)
    want = a.copy()
    h = store.save(1, {"a": a})
    a[:] = -1  # allowed as soon as save() returned
    h.wait()
    assert_same(store.load()[1]["a"], want)


def test_save_replaces_an_existing_step(store):
    store.save(4, {"x": np.zeros(8)}).wait()
    store.save(4, {"x": np.ones(8), "y": np.ones(2)}).wait()
    _, got = store.load(step=4)
    assert sorted(got) == ["x", "y"]
    assert_same(got["x"], np.ones(8))


def test_load_and_restore_a_given_step(store):
    for s in (10, 20, 30):
        store.save(s, {"x": np.full(4, s, np.int16)}).wait()
    assert store.load(step=20)[1]["x"][0] == 20
    x = np.zeros(4, np.int16)
    assert store.restore({"x": x}, step=10) == 10
    assert x[0] == 10
    assert store.restore({"x": x}) == 30
    assert x[0] == 30


def test_restore_allow_missing(store):
    store.save(1, {"x": np.ones(2)}).wait()
    x, extra = np.zeros(2), np.full(3, 5.0)
    with pytest.raises(libckpt.NotFoundError):
        store.restore({"x": x, "extra": extra})
    assert store.restore({"x": x, "extra": extra}, allow_missing=True) == 1
    assert_same(x, np.ones(2))
    assert_same(extra, np.full(3, 5.0))


def test_steps_latest_and_retention(root):
    with open_store(root, keep_last=2) as store:
        assert store.latest() is None
        assert store.steps() == []
        for s in (1, 2, 3):
            store.save(s, {"x": np.arange(1000.0)}).wait()
        assert store.latest() == 3
        assert store.latest(full=False) == 3
        listing = store.steps()
        assert [e["step"] for e in listing] == [2, 3]
        for e in listing:
            assert e["status"] == "valid" and e["problems"] == []
            assert e["raw_bytes"] == 8000 and e["tensors"] == 1
            assert e["ratio"] == pytest.approx(8000 / e["stored_bytes"])
            assert e["time"] > 1.6e9 and e["save_seconds"] >= 0
        assert [e["status"] for e in store.steps(full=True)] == ["valid"] * 2


def test_keep_last_zero_keeps_everything(root):
    with open_store(root, keep_last=0) as store:
        for s in range(6):
            store.save(s, {"x": np.ones(1)}).wait()
        assert [e["step"] for e in store.steps()] == list(range(6))


def test_verify_good_checkpoint(store):
    store.save(7, {"x": np.ones(100)}).wait()
    for full in (True, False):
        r = store.verify(full=full)
        assert r["ok"] and r["status"] == "valid" and r["step"] == 7
        assert r["problems"] == [] and r["error"] is None
    assert store.verify(7)["ok"]


def test_save_stats(store):
    a = np.zeros(1 << 16)
    h = store.save(1, {"a": a, "b": np.ones(10, np.int8)})
    h.wait()
    st = h.stats
    assert st["raw_bytes"] == a.nbytes + 10
    assert st["stored_bytes"] > 0 and st["step"] == 1
    assert st["stall_s"] >= 0 and st["persist_s"] >= 0
    assert h.done()


def test_save_handle_context_manager(store):
    with store.save(1, {"x": np.ones(4)}) as h:
        pass
    assert h.done() and h.stats["raw_bytes"] == 32
    h.wait()  # still answers after close
    assert store.latest() == 1


def test_readonly_store_reads_while_a_writer_holds_the_root(store, root):
    store.save(1, {"x": np.arange(5)}).wait()
    with open_store(root, readonly=True) as ro:
        assert ro.latest() == 1
        assert_same(ro.load()[1]["x"], np.arange(5))
        assert ro.metadata() is None
        with pytest.raises(libckpt.Error):
            ro.save(2, {"x": np.arange(5)}).wait()


def test_objects_with_array_interface(store):
    class Exposed:
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    store.save(1, {"x": Exposed(a)}).wait()
    assert_same(store.load()[1]["x"], a)
    b = np.zeros_like(a)
    store.restore({"x": Exposed(b)})
    assert_same(b, a)


def test_path_and_repr(store, root):
    assert store.path.rstrip("/").endswith("ckpt")
    assert "libckpt.Store" in repr(store)


@pytest.mark.parametrize("page_cache", ["keep", "drop"])
def test_page_cache_policy_round_trips(root, page_cache):
    # Durable saves (fsync) write frames back in rounds; "drop" then evicts
    # them from the page cache as they settle.  Either way the checkpoint
    # loads back bit for bit, in the same process and from a new store.
    a = RNG.standard_normal(3 << 20)  # 24 MiB
    with libckpt.Store(root, chunk_bytes=1 << 20, page_cache=page_cache) as store:
        store.save(1, {"a": a}).wait()
        b = np.empty_like(a)
        store.restore({"a": b})
        assert np.array_equal(a, b)
    with libckpt.Store(root, readonly=True) as store:
        step, state = store.load()
        assert step == 1 and np.array_equal(state["a"], a)


@pytest.mark.parametrize("bad", ["never", "", None, True, 1])
def test_page_cache_takes_auto_keep_or_drop(root, bad):
    with pytest.raises(ValueError, match="page_cache"):
        libckpt.Store(root, page_cache=bad)

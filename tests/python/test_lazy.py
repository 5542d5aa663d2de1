"""store.open(): a step's tensors listed without reading them, and read one
at a time (only that tensor's chunks, so damage elsewhere does not stop
it), by name, by prefix or by key path."""

import gc
import os
import warnings

import numpy as np
import pytest

import libckpt
from byteflip import flip_byte
from conftest import open_store, shard_files

RNG = np.random.default_rng(5)
SMALL = RNG.standard_normal(1000)
BIG = RNG.standard_normal(1 << 19)  # 4 MiB: most of the shard


def state():
    return {"model": {"fc.weight": SMALL.reshape(10, 100),
                      "fc.bias": np.arange(3, dtype=np.int16)},
            "optim": {"state": {0: {"exp_avg": BIG}}},
            "epoch": 4}


@pytest.fixture
def damaged(root):
    """Steps 1 (good) and 2, then one byte of step 2's
    optim.state.0.exp_avg flipped: quick verification still passes, that
    tensor does not."""
    # One worker: frames go to the file in tensor order (with two, their
    # order depends on timing), so the middle of the shard is inside BIG.
    with open_store(root, threads=1) as store:
        store.save(1, {"w": np.ones(2)}).wait()
        store.save(2, state()).wait()
        flip_byte(shard_files(root, 2)[0])  # the middle: inside BIG
        [p] = store.verify(2)["problems"]
        assert p["tensor"] == "optim.state.0.exp_avg"
    return root


def test_listing_describes_tensors_without_reading(store):
    store.save(1, state(), metadata={"run": "a"}).wait()
    with store.open() as ck:
        assert ck.step == 1 and len(ck) == 3
        assert ck.keys() == ["model.fc.weight", "model.fc.bias",
                             "optim.state.0.exp_avg"]
        info = ck.info("model.fc.weight")
        assert (info.dtype, info.shape, info.bytes) == ("float64", (10, 100),
                                                        8000)
        assert [t.dtype for t in ck.tensors()] == ["float64", "int16",
                                                   "float64"]
        assert "model.fc.bias" in ck and "nope" not in ck
        with pytest.raises(libckpt.NotFoundError, match="nope"):
            ck.get_tensor("nope")
        assert ck.metadata() == {"run": "a"}
        tree = ck.structure()
        assert tree["epoch"] == 4
        assert tree["optim"]["state"][0]["exp_avg"] == ck.info(
            "optim.state.0.exp_avg")


def test_one_tensor_reads_only_its_own_chunks(damaged):
    with open_store(damaged) as store:
        with store.open(2) as ck:  # quick verification: passes
            assert np.array_equal(ck.get_tensor("model.fc.weight"),
                                  SMALL.reshape(10, 100))
            with pytest.raises(libckpt.CorruptError, match="exp_avg"):
                ck.get_tensor("optim.state.0.exp_avg")
            part = ck.state("model")  # the model alone is intact
            assert list(part) == ["fc.weight", "fc.bias"]
            assert part["fc.bias"].tolist() == [0, 1, 2]
            assert ck.state("epoch") == 4
            with pytest.raises(libckpt.CorruptError):
                ck.state()  # everything: includes the damaged tensor
            with pytest.raises(libckpt.NotFoundError, match="'optim'"):
                ck.state("optim", "state", 1)
        with pytest.raises(libckpt.CorruptError):
            store.load(2)


def test_subsets_by_names_and_prefix(store):
    store.save(2, state()).wait()
    with store.open(2) as ck:
        got = ck.get_tensors(prefix="model.")
        assert list(got) == ["model.fc.weight", "model.fc.bias"]
        got = ck.get_tensors(["optim.state.0.exp_avg"])
        assert np.array_equal(got["optim.state.0.exp_avg"], BIG)
        assert list(ck.get_tensors()) == ck.keys()
        with pytest.raises(ValueError, match="not both"):
            ck.get_tensors(["a"], prefix="b")


def test_newest_step_damaged_open_quick_or_full(damaged):
    with open_store(damaged) as store:
        with store.open() as ck:  # quick: step 2 passes it
            assert ck.step == 2 and ck.skipped == []
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            ck = store.open(full=True)
        with ck:
            assert ck.step == 1
            assert [p["step"] for p in ck.skipped] == [2]
            assert ck.skipped[0]["status"] == "corrupt"


def test_open_with_torch_framework(store):
    torch = pytest.importorskip("torch")
    store.save(1, {"t": torch.arange(3, dtype=torch.bfloat16),
                   "n": np.arange(2)}).wait()
    with store.open(framework="pt") as ck:
        assert ck.get_tensor("t").dtype == torch.bfloat16
        assert isinstance(ck.get_tensor("n"), torch.Tensor)
    with store.open(framework="auto") as ck:
        assert isinstance(ck.get_tensor("n"), np.ndarray)


def test_closing_the_store_closes_its_checkpoints(root):
    store = open_store(root)
    store.save(1, {"w": np.ones(3)}).wait()
    ck = store.open()
    store.close()
    assert ck.closed
    with pytest.raises(ValueError, match="closed"):
        ck.get_tensor("w")
    ck.close()  # idempotent


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_dropped_checkpoints_release_their_files(store):
    store.save(1, {"w": np.ones(3)}).wait()
    store.open().close()
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        with store.open() as ck:
            ck.get_tensor("w")
        store.open()  # dropped without close
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.close()


def test_rows_of_a_tensor_read_alone(root):
    """get_rows: any rows of a tensor along its first dimension, with
    Python's slice bounds, whatever the chunk boundaries (rows of 1,200
    bytes in chunks of 4 KiB); a 0-d tensor has none."""
    table = RNG.standard_normal((1000, 300)).astype(np.float32)
    with open_store(root, chunk_bytes=4096) as store:
        store.save(1, {"table": table, "flat": BIG[:5000], "n": 7.5,
                       "scalar": np.array(2.0)}).wait()
        with store.open() as ck:
            for lo, hi in [(None, None), (0, 1), (3, 17), (-5, None),
                           (999, 1000), (500, 400), (None, 2000), (-2000, 4),
                           (np.int64(10), np.int32(13))]:
                got = ck.get_rows("table", lo, hi)
                want = table[lo:hi]
                assert got.shape == want.shape and got.dtype == np.float32
                assert np.array_equal(got, want), (lo, hi)
            assert np.array_equal(ck.get_rows("flat", 4095, 4100),
                                  BIG[4095:4100])
            with pytest.raises(libckpt.InvalidArgumentError, match="0-d"):
                ck.get_rows("scalar")
            with pytest.raises(TypeError, match="not float"):
                ck.get_rows("table", 1.5)
            with pytest.raises(TypeError, match="not bool"):
                ck.get_rows("table", True)
            with pytest.raises(libckpt.NotFoundError, match="nope"):
                ck.get_rows("nope", 0, 1)


def test_rows_read_only_their_chunks(damaged):
    """get_rows reads the chunks holding its rows, each verified whole:
    rows in the damaged chunk of BIG (1 MiB chunks of 131,072 values)
    raise CorruptError, even a few of them, and the rows of the other
    chunks come back."""
    per = (1 << 20) // 8
    with open_store(damaged) as store:
        with store.open(2) as ck:
            bad = []
            for c in range(4):
                try:
                    got = ck.get_rows("optim.state.0.exp_avg", c * per,
                                      (c + 1) * per)
                except libckpt.CorruptError:
                    bad.append(c)
                    with pytest.raises(libckpt.CorruptError):
                        ck.get_rows("optim.state.0.exp_avg", c * per + 10,
                                    c * per + 12)
                    continue
                assert np.array_equal(got, BIG[c * per:(c + 1) * per])
            assert len(bad) == 1, bad


def test_rows_as_torch_tensors(store):
    torch = pytest.importorskip("torch")
    t = torch.arange(60, dtype=torch.float32).reshape(20, 3).to(torch.bfloat16)
    store.save(1, {"t": t}).wait()
    with store.open() as ck:  # "auto": saved from torch
        got = ck.get_rows("t", 5, 9)
        assert got.dtype == torch.bfloat16 and torch.equal(got, t[5:9])
    with store.open(framework="np") as ck:
        got = ck.get_rows("t", 5, 9)
        assert got.dtype == np.uint16 and got.shape == (4, 3)

"""Saves in flight, saves from several threads, and the GIL."""

import ctypes
import threading
import time

import numpy as np
import pytest

from libckpt import ffi
from conftest import open_store

RNG = np.random.default_rng(3)


def test_next_save_waits_for_the_one_in_flight(root):
    a = RNG.standard_normal(4 << 20)  # 32 MiB, incompressible
    b = a[::-1].copy()
    with open_store(root, keep_last=0) as store:
        h1 = store.save(1, {"x": a})
        h2 = store.save(2, {"x": b})  # asked for while 1 persists
        # At most one save in flight: 1 has finished before 2 began.
        assert h1.done()
        h1.wait()
        h2.wait()
        assert h2.done()
        assert np.array_equal(store.load(step=1)[1]["x"], a)
        assert np.array_equal(store.load(step=2)[1]["x"], b)
        assert store.latest() == 2


def test_saves_from_several_threads(root):
    errors = []
    with open_store(root, keep_last=0) as store:
        # Steps are taken and begun in order (a lower step than a committed
        # one is refused), the waits overlap.
        order = threading.Lock()
        todo = iter(sorted(k * 100 + i for k in range(4) for i in range(5)))

        def worker(k):
            try:
                while True:
                    with order:
                        step = next(todo, None)
                        if step is None:
                            return
                        h = store.save(step, {"x": np.full(1000, step)})
                    h.wait()
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,))
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        steps = [e["step"] for e in store.steps()]
        assert steps == sorted(k * 100 + i for k in range(4) for i in range(5))
        for s in (0, 104, 302):
            assert store.load(step=s)[1]["x"][0] == s


def test_restore_and_save_from_two_threads(root):
    with open_store(root, keep_last=0) as store:
        store.save(0, {"x": np.arange(100000.0)}).wait()
        stop, errors = threading.Event(), []

        def reader():
            x = np.empty(100000)
            try:
                while not stop.is_set():
                    store.restore({"x": x}, step=0)
                    assert x[-1] == 99999.0
            except Exception as e:
                errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        try:
            for s in range(1, 6):
                store.save(s, {"x": np.arange(100000.0) + s}).wait()
        finally:
            stop.set()
            t.join()
        assert errors == []


def test_ctypes_releases_the_gil_during_blocking_calls(root):
    # CDLL (unlike PyDLL) drops the GIL around every foreign call.
    assert isinstance(ffi.lib, ctypes.CDLL)
    assert not isinstance(ffi.lib, ctypes.PyDLL)
    a = RNG.standard_normal(8 << 20)  # 64 MiB: the wait takes a while
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    # Every chunk compressed: zstd over 64 MiB keeps the wait long enough
    # to watch (stored raw, a save into the page cache is over too soon).
    with open_store(root, compress_all=True) as store:
        h = store.save(1, {"x": a})
        t = threading.Thread(target=ticker)
        t.start()
        try:
            time.sleep(0.005)
            t0 = time.monotonic()
            h.wait()
            t1 = time.monotonic()
        finally:
            stop.set()
            t.join()
    if t1 - t0 < 0.05:
        pytest.skip("the save finished too fast (%.3f s) to observe"
                    % (t1 - t0))
    during = [x for x in ticks if t0 < x < t1]
    # With the GIL held through the wait the ticker could not run at all.
    assert len(during) >= 5, (len(during), t1 - t0)


def test_handles_dropped_without_wait_still_commit(root):
    with open_store(root, keep_last=0) as store:
        for s in range(3):
            store.save(s, {"x": np.full(10, s)})  # handle dropped at once
        h = store.save(3, {"x": np.full(10, 3)})
        h.wait()
        assert [e["step"] for e in store.steps()] == [0, 1, 2, 3]
    with open_store(root, readonly=True) as ro:
        assert [e["step"] for e in ro.steps(full=True)
                if e["status"] == "valid"] == [0, 1, 2, 3]


def test_dropping_a_handle_does_not_wait_for_the_save(root):
    big = RNG.standard_normal(8 << 20)  # 64 MiB, all compressed: a while
    with open_store(root, compress_all=True) as store:
        store.save(1, {"x": big})  # dropped unfinished: adopted, not waited
        if not store._orphans:
            pytest.skip("the save finished before its handle was dropped")
        store.close()  # waits for it
        assert not store._orphans
    with open_store(root, readonly=True) as ro:
        assert np.array_equal(ro.load(step=1)[1]["x"], big)


def test_load_passes_a_step_retired_under_it_for_the_new_one(tmp_path):
    """A reader's load() next to a writer that keeps one step: the step it
    listed as newest is retired by the writer's next save before the
    reader opens it.  load() used to end with NoCheckpointError ("no
    checkpoint") although step 2 was committed; it lists the root again."""
    root = tmp_path / "root"
    writer = open_store(root, keep_last=1)
    writer.save(1, {"x": np.full(8, 1.0)}).wait()
    reader = open_store(root, readonly=True)
    real = reader._open
    raced = []

    def open_after_the_writer(step, *args, **kwargs):
        if not raced:  # the writer saves step 2 and retires step 1
            raced.append(step)
            writer.save(2, {"x": np.full(8, 2.0)}).wait()
        return real(step, *args, **kwargs)
    reader._open = open_after_the_writer
    try:
        got = reader.load()
    finally:
        reader.close()
        writer.close()
    assert raced == [1]
    assert got.step == 2 and np.array_equal(got.state["x"], np.full(8, 2.0))
    assert got.skipped == []

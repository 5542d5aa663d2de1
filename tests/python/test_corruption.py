"""A damaged newest checkpoint: detected, reported, and skipped for the
previous one by load() and restore()."""

import os
import warnings

import numpy as np
import pytest

import libckpt
from byteflip import flip_byte
from conftest import open_store, shard_files, step_dir

OLD = np.arange(300000, dtype=np.float64)       # step 1
NEW = np.arange(300000, dtype=np.float64) * -1  # step 2


@pytest.fixture
def two_steps(root):
    with open_store(root) as store:
        store.save(1, {"w": OLD, "b": np.ones(3, np.int8)},
                   metadata={"step": 1}).wait()
        store.save(2, {"w": NEW, "b": np.zeros(3, np.int8)},
                   metadata={"step": 2}).wait()
    return root


def skipped_steps(record):
    return [w for w in record
            if issubclass(w.category, libckpt.SkippedCheckpointWarning)]


@pytest.mark.parametrize("where", ["middle", "first", "last"])
def test_flipped_shard_byte_falls_back_to_older_step(two_steps, where):
    shard = shard_files(two_steps, 2)[0]
    size = os.path.getsize(shard)
    offset = flip_byte(shard, {"middle": None, "first": 0,
                               "last": size - 1}[where])
    with open_store(two_steps) as store:
        report = store.verify(2)  # raises nothing on corruption
        assert report["ok"] is False
        assert report["status"] in ("corrupt", "incomplete")
        assert report["step"] == 2
        assert report["problems"], report
        p = report["problems"][0]
        assert p["step"] == 2 and p["message"]
        # The CLI's problem record: status in words, code the number.
        assert (p["status"], p["code"]) in (("corrupt", -6),
                                            ("incomplete", -15))
        assert store.verify(1)["ok"]
        assert store.latest(full=True) == 1

        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            step, got = store.load()
        assert step == 1
        assert np.array_equal(got["w"], OLD)

        w, b = np.zeros_like(OLD), np.zeros(3, np.int8)
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2") as seen:
            assert store.restore({"w": w, "b": b}) == 1
        # the warning points at the caller's line, not into the binding
        assert {x.filename for x in skipped_steps(seen)} == {__file__}
        assert np.array_equal(w, OLD) and np.array_equal(b, np.ones(3))

        with pytest.raises(libckpt.CorruptError) as e:
            store.restore({"w": w, "b": b}, step=2)
        assert e.value.message
        with pytest.raises(libckpt.CorruptError):
            store.load(step=2)

        listing = {e["step"]: e for e in store.steps(full=True)}
        assert listing[1]["status"] == "valid"
        assert listing[2]["status"] in ("corrupt", "incomplete")
        assert listing[2]["problems"] and listing[2]["problems"][0]["message"]
    assert offset >= 0


def test_problem_names_file_and_offset(two_steps):
    shard = shard_files(two_steps, 2)[0]
    flip_byte(shard)
    with open_store(two_steps) as store:
        p = store.verify(2)["problems"][0]
        assert p["file"] and p["file"] in os.path.basename(shard)
        assert p["offset"] is None or p["offset"] >= 0


def test_missing_shard_falls_back(two_steps):
    os.unlink(shard_files(two_steps, 2)[0])
    with open_store(two_steps) as store:
        r = store.verify(2)
        assert not r["ok"] and r["status"] in ("incomplete", "corrupt")
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            assert store.load()[0] == 1
        assert skipped_steps(rec)


def test_truncated_shard_falls_back(two_steps):
    shard = shard_files(two_steps, 2)[0]
    os.truncate(shard, os.path.getsize(shard) // 3)
    with open_store(two_steps) as store:
        assert not store.verify(2)["ok"]
        w = np.zeros_like(OLD)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert store.restore({"w": w}, allow_missing=True) == 1
        assert np.array_equal(w, OLD)


def test_corrupt_manifest_falls_back(two_steps):
    manifest = os.path.join(step_dir(two_steps, 2), "manifest.json")
    with open(manifest, "rb") as f:
        text = f.read()
    with open(manifest, "wb") as f:  # change a digit, keep valid JSON
        f.write(text.replace(b"300000", b"300001", 1))
    with open_store(two_steps) as store:
        assert not store.verify(2, full=False)["ok"]
        assert store.latest() == 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert store.load()[0] == 1
        assert store.metadata() == {"step": 1}


def test_every_checkpoint_corrupt_is_no_checkpoint(two_steps):
    for s in (1, 2):
        flip_byte(shard_files(two_steps, s)[0])
    with open_store(two_steps) as store:
        w = np.zeros_like(OLD)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(libckpt.NoCheckpointError) as e:
                store.restore({"w": w}, allow_missing=True)
        assert {p["step"] for p in e.value.skipped} == {1, 2}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(libckpt.NoCheckpointError) as e:
                store.load()
        assert [p["step"] for p in e.value.skipped] == [2, 1]
        assert store.latest(full=True) is None


def test_latest_metadata_and_load_agree_on_a_damaged_newest_step(root):
    """latest(), load() and metadata() all mean the newest step that FULLY
    verifies: a flipped byte in a chunk frame of the newest step (which
    quick verification does not read) moves all three to the older step."""
    rng = np.random.default_rng(7)
    with open_store(root) as store:
        for s in (1, 2, 3):
            store.save(s, {"w": rng.standard_normal(300000)},
                       metadata={"step": s, "tag": "meta-%d" % s}).wait()
    shard = os.path.join(step_dir(root, 3), "rank-00000.shard")
    flip_byte(shard)  # the middle: chunk data, not the index
    with open_store(root) as store:
        assert store.latest(full=False) == 3  # the quick check misses it
        assert store.latest() == 2
        assert store.latest(full=True) == 2
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 3"):
            step, _ = store.load()
        meta = store.metadata()
        assert step == store.latest() == 2
        assert meta == {"step": 2, "tag": "meta-2"}
        assert store.metadata(3) == {"step": 3, "tag": "meta-3"}  # explicit


def read_bytes():
    """Bytes this process has read through read()/pread() so far (page
    cache hits included): /proc/self/io's rchar, summed over threads."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    pytest.skip("no rchar in /proc/self/io")


def test_load_reads_the_data_once_and_reports_what_verification_finds(root):
    """load() of the newest step reads each stored byte once (the read
    checks every chunk's hashes; a full verification before it would read
    them all again), and a step damaged in its chunk data is skipped with
    the same problem a full verification names."""
    rng = np.random.default_rng(3)
    with open_store(root) as store:
        for s in (1, 2):
            store.save(s, {"w": rng.standard_normal(1 << 20)}).wait()
    stored = os.path.getsize(shard_files(root, 2)[0])
    with open_store(root) as store:
        before = read_bytes()
        step, got = store.load()
        used = read_bytes() - before
        assert step == 2 and got["w"].nbytes == 8 << 20
        assert stored <= used < 1.5 * stored, (used, stored)
    flip_byte(shard_files(root, 2)[0])  # the middle: chunk data
    with open_store(root) as store:
        want = store.verify(2)["problems"][0]
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            res = store.load()
        assert res.step == 1
        got = res.skipped[0]
        assert (got["step"], got["message"], got["file"], got["tensor"],
                got["offset"]) == (want["step"], want["message"],
                                   want["file"], want["tensor"],
                                   want["offset"])


def test_load_verifies_a_tensor_its_state_does_not_name(root, monkeypatch):
    """A step whose state tree leaves one of its tensors out (not written
    by this binding) is still loaded only if that tensor verifies too."""
    from libckpt import nested
    real = nested.wrap

    def drop(tree, metadata, version=1):
        tree = {"dict": [p for p in tree["dict"] if p[0] != "hidden"]}
        return real(tree, metadata, version)
    with open_store(root) as store:
        store.save(1, {"w": np.arange(4.0)}).wait()
        monkeypatch.setattr(nested, "wrap", drop)
        monkeypatch.setattr(nested, "_encode_tensor_dict", lambda *a: None)
        store.save(2, {"w": np.arange(4.0) * 2,
                       "hidden": np.ones(1 << 18)}).wait()
        monkeypatch.undo()
        step, got = store.load()
        assert step == 2 and list(got) == ["w"]
    shard = shard_files(root, 2)[0]
    flip_byte(shard, os.path.getsize(shard) // 2)  # inside "hidden"'s data
    with open_store(root) as store:
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            step, got = store.load()
        assert step == 1 and got["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_new_tensor_is_not_left_holding_a_damaged_step(root):
    """A model that gained a tensor: step 1 holds "w", step 2 "head" and
    "w", and step 2 is damaged.  The attempt at step 2 writes into the
    buffers before the damage is found; step 1 lacks "head", so with
    strict=False the restore fails naming it (it would otherwise pass for
    untouched while holding step 2's unverified bytes); step 1 by number
    leaves it untouched.  With strict=True the NotFoundError says step 2
    was skipped, and lists it in .skipped."""
    with open_store(root) as store:
        store.save(1, {"w": OLD}).wait()
        store.save(2, {"head": NEW[:50000], "w": NEW}).wait()
    flip_byte(shard_files(root, 2)[0], None)
    with open_store(root) as store:
        head, w = np.full(50000, 7.0), np.zeros_like(OLD)
        state = {"head": head, "w": w}
        # the step passed over is warned about, as every one is
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            with pytest.raises(libckpt.CorruptError, match="'head'") as err:
                store.restore(state, strict=False)
        assert "restore step 1 by number" in str(err.value)
        assert [s["step"] for s in err.value.skipped] == [2]
        head[:] = 7.0
        got = store.restore(state, step=1, strict=False)
        assert got == 1 and got.missing_keys == ["head"]
        assert (head == 7.0).all() and np.array_equal(w, OLD)
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            with pytest.raises(libckpt.NotFoundError,
                               match="newer step 2 skipped") as err:
                store.restore(state)
        assert [s["step"] for s in err.value.skipped] == [2]


def test_a_job_resumed_below_a_damaged_newest_step_saves_on(root):
    """Steps 10, 20, 30; step 30 damaged.  load() resumes from 20 and the
    job's next save, 25, is accepted (restore never takes step 30); the
    next resume takes 25."""
    with open_store(root) as store:
        for step in (10, 20, 30):
            store.save(step, {"w": OLD * step}).wait()
    flip_byte(shard_files(root, 30)[0], None)
    with open_store(root) as store:
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 30"):
            step, got = store.load()
        assert step == 20
        store.save(25, {"w": got["w"] + 1}).wait()
    with open_store(root) as store:
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 30"):
            step, got = store.load()
        assert step == 25 and np.array_equal(got["w"], OLD * 20 + 1)


def test_restore_skips_a_step_whose_other_tensors_are_damaged(root):
    """The documented resume restores the model in place and reads the
    optimizer's state next (``open(step).state("optim")``).  restore()
    verifies the rest of the step too (full=True, the default), so it
    skips a newest step whose optimizer state is damaged and the read that
    follows works; full=False verifies only what it restores and takes the
    damaged step, as it did before."""
    rng = np.random.default_rng(11)
    moments = {s: rng.standard_normal(1 << 18) for s in (1, 2)}
    with open_store(root) as store:
        for s in (1, 2):
            store.save(s, {"model": {"w": np.int64(s) * np.ones(1, np.int64)},
                           "optim": {"m": moments[s]}}).wait()
    flip_byte(shard_files(root, 2)[0])  # the middle: the moments' chunk
    with open_store(root) as store:
        w = np.zeros(1, np.int64)
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            got = store.restore({"model": {"w": w}})
        assert got == 1 and w[0] == 1
        assert [s["step"] for s in got.skipped] == [2]
        assert "tensor 'optim.m'" in got.skipped[0]["message"], got.skipped
        with store.open(got) as ck:
            assert np.array_equal(ck.state("optim")["m"], moments[1])
        assert store.restore({"model": {"w": w}}, full=False) == 2 and w[0] == 2
        with store.open(2) as ck:
            with pytest.raises(libckpt.CorruptError):
                ck.state("optim")


def test_restore_with_a_library_before_restore_verify(root, monkeypatch):
    """A 0.1 library built before ckpt_restore_options version 2 refuses
    it: the binding then passes version 1 (no `verify`) and restores as
    that library does, verifying what it restores."""
    from libckpt import ffi

    def refuse(opts, version):
        if version != 1:
            raise libckpt.Error("ckpt_restore_options version %d is not supported "
                                "(expected 1)" % version)
        return 0
    monkeypatch.setattr(ffi.lib, "ckpt_restore_options_init", refuse)
    assert ffi._restore_options_version() == 1
    monkeypatch.undo()
    monkeypatch.setattr(ffi, "RESTORE_OPTIONS_VERSION", 1)
    monkeypatch.setattr(ffi, "HAVE_RESTORE_VERIFY", False)
    rng = np.random.default_rng(12)
    with open_store(root) as store:
        for s in (1, 2):
            store.save(s, {"model": {"w": np.full(1, s, np.int64)},
                           "optim": {"m": rng.standard_normal(1 << 18)}}).wait()
    flip_byte(shard_files(root, 2)[0])  # the moments of step 2
    with open_store(root) as store:
        w = np.zeros(1, np.int64)
        assert store.restore({"model": {"w": w}}) == 2 and w[0] == 2

"""One problem-record scheme everywhere (verify, steps, the skipped lists
of load/restore/open and NoCheckpointError), skipped checkpoints reported
in results and to logging (when every step is damaged too), Store.path of
the type given, type hints."""

import inspect
import logging
import pathlib
import typing
import warnings

import numpy as np
import pytest

import libckpt
from byteflip import flip_byte
from libckpt.dist import load_resharded
from conftest import open_store, shard_files

PROBLEM_KEYS = {"step", "status", "code", "message", "file", "tensor",
                "offset"}


@pytest.fixture
def newest_damaged(root):
    rng = np.random.default_rng(1)
    with open_store(root) as store:
        for s in (1, 2):
            store.save(s, {"w": rng.standard_normal(200000),
                           "epoch": s}).wait()
    flip_byte(shard_files(root, 2)[0])  # chunk data: full checks see it
    return root


def test_every_problem_record_has_one_scheme(newest_damaged):
    with open_store(newest_damaged) as store:
        verified = store.verify(2)["problems"]
        listed = {e["step"]: e for e in store.steps(full=True)}[2]["problems"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = store.load().skipped
            restored = store.restore({"w": np.empty(200000)}).skipped
            opened = store.open(full=True)
        opened.close()
        for records in (verified, listed, loaded, opened.skipped):
            assert records, records
            p = records[0]
            assert set(p) == PROBLEM_KEYS
            assert (p["step"], p["status"], p["code"]) == (2, "corrupt", -6)
            assert p["tensor"] == "w" and p["file"] == "rank-00000.shard"
            assert isinstance(p["offset"], int)
        assert verified == listed
        # restore opens quickly and verifies the chunks it reads: it finds
        # the same damage, in the same form.
        assert [(p["step"], p["status"], p["code"]) for p in restored] == \
            [(2, "corrupt", -6)]


def test_no_checkpoint_error_lists_them_alike(newest_damaged):
    flip_byte(shard_files(newest_damaged, 1)[0])
    with open_store(newest_damaged) as store:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(libckpt.NoCheckpointError) as e:
                store.load()
        assert [(p["step"], p["status"], p["code"]) for p in
                e.value.skipped] == [(2, "corrupt", -6), (1, "corrupt", -6)]


def test_skipped_steps_are_logged_and_warned(newest_damaged, caplog):
    with open_store(newest_damaged) as store:
        with caplog.at_level(logging.WARNING, logger="libckpt"):
            with pytest.warns(libckpt.SkippedCheckpointWarning,
                              match="step 2"):
                step, state = store.load()
    assert step == 1 and state["epoch"] == 1
    records = [r for r in caplog.records if r.name == "libckpt"]
    assert len(records) == 1 and "skipped step 2" in records[0].getMessage()


SEARCHES = {  # the calls that take the newest step they can use
    "load": lambda store: store.load(),
    "restore": lambda store: store.restore({"w": np.empty(200000)}),
    "open": lambda store: store.open(full=True),
}


@pytest.mark.parametrize("call", list(SEARCHES))
def test_every_step_damaged_is_warned_logged_and_named(newest_damaged,
                                                       caplog, call):
    """With every step damaged, NoCheckpointError is not all there is:
    each step passed over is warned about (pointing at the caller) and
    logged, as when an older one is taken, and the error says they were
    found damaged, naming them, rather than reading as an empty root.  A
    job that catches NoCheckpointError to start afresh used to lose all
    its progress without a word."""
    flip_byte(shard_files(newest_damaged, 1)[0])
    with open_store(newest_damaged) as store:
        with caplog.at_level(logging.WARNING, logger="libckpt"):
            with pytest.warns(libckpt.SkippedCheckpointWarning) as seen:
                with pytest.raises(libckpt.NoCheckpointError) as e:
                    SEARCHES[call](store)
    warned = [w for w in seen
              if issubclass(w.category, libckpt.SkippedCheckpointWarning)]
    assert [str(w.message).split(":")[1] for w in warned] == \
        [" skipped step 2", " skipped step 1"]
    assert all(w.filename == __file__ for w in warned), \
        [w.filename for w in warned]
    records = [r.getMessage() for r in caplog.records if r.name == "libckpt"]
    assert len(records) == 2, records
    assert "skipped step 2" in records[0] and "skipped step 1" in records[1]
    assert [(p["step"], p["status"]) for p in e.value.skipped] == \
        [(2, "corrupt"), (1, "corrupt")]
    text = str(e.value)
    assert "2 checkpoints found damaged" in text, text
    assert "step 2 (corrupt), step 1 (corrupt)" in text, text
    assert e.value.args == (e.value.message,)


@pytest.mark.parametrize("call", list(SEARCHES))
def test_an_empty_store_is_no_checkpoint_without_a_warning(root, caplog,
                                                           call):
    with open_store(root) as store:
        with caplog.at_level(logging.WARNING, logger="libckpt"):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # any warning fails
                with pytest.raises(libckpt.NoCheckpointError,
                                   match="no checkpoint in") as e:
                    SEARCHES[call](store)
    assert not e.value.skipped
    assert "damaged" not in str(e.value)
    assert [r for r in caplog.records if r.name == "libckpt"] == []


def test_a_restore_failing_after_a_damaged_step_reports_it(root):
    """The step before the damaged one does not fit the state: the
    MismatchError carries the damaged step in .skipped, and it is warned
    about as when the restore succeeds."""
    with open_store(root) as store:
        store.save(1, {"w": np.arange(3.0)}).wait()
        store.save(2, {"w": np.arange(200000.0)}).wait()
    flip_byte(shard_files(root, 2)[0])
    with open_store(root) as store:
        with pytest.warns(libckpt.SkippedCheckpointWarning,
                          match="skipped step 2"):
            with pytest.raises(libckpt.MismatchError) as e:
                store.restore({"w": np.empty(200000)})
    assert [p["step"] for p in e.value.skipped] == [2]


def test_load_resharded_warns_of_every_step_when_none_can_be_read(
        newest_damaged, caplog):
    flip_byte(shard_files(newest_damaged, 1)[0])
    with open_store(newest_damaged, readonly=True) as store:
        with pytest.warns(libckpt.SkippedCheckpointWarning) as seen:
            with pytest.raises(libckpt.NoCheckpointError, match="step 1") as e:
                load_resharded(store, lambda name: True)
    warned = [str(w.message) for w in seen
              if issubclass(w.category, libckpt.SkippedCheckpointWarning)]
    assert len(warned) == 2, warned
    assert "skipped step 2" in warned[0] and "skipped step 1" in warned[1]
    # as Store.load: a log record each, and the steps in .skipped
    logged = [r.getMessage() for r in caplog.records if r.name == "libckpt"]
    assert logged == warned
    assert [p["step"] for p in e.value.skipped] == [2, 1]


@pytest.mark.parametrize("kind", [str, pathlib.Path, lambda p: str(p).encode()])
def test_store_path_keeps_the_type_given(tmp_path, kind):
    given = kind(tmp_path / "ckpt")
    with libckpt.Store(given, fsync=False) as store:
        assert type(store.path) is type(given)
        assert pathlib.Path(store.path if not isinstance(store.path, bytes)
                            else store.path.decode()) == tmp_path / "ckpt"


PUBLIC = [libckpt.Store, libckpt.SaveHandle, libckpt.Checkpoint]


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_public_methods_have_type_hints(cls):
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_") and name not in ("__init__", "__enter__"):
            continue
        hints = typing.get_type_hints(fn)  # resolvable, not just strings
        params = [p for p in inspect.signature(fn).parameters
                  if p not in ("self", "exc", "args", "kwargs")]
        assert "return" in hints, (cls.__name__, name)
        assert set(params) <= set(hints), (cls.__name__, name, params)

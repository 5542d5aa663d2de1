"""C status codes become libckpt.Error subclasses carrying the library's
message; the binding's own argument errors are clear."""

import subprocess
import sys
import threading

import numpy as np
import pytest

import libckpt
from libckpt import errors, ffi
from conftest import open_store, sub_env


def test_every_status_has_its_class_and_a_strerror():
    for status in range(-1, -16, -1):
        e = errors.error_for_status(status, "msg", "ckpt_x")
        assert isinstance(e, libckpt.Error)
        assert type(e) is not libckpt.Error
        assert e.status == status and e.code.startswith("CKPT_E")
        assert str(e) == "ckpt_x: msg"
        assert ffi.lib.ckpt_strerror(status)
    assert type(errors.error_for_status(-99, "m")) is libckpt.Error
    assert issubclass(libckpt.IncompleteError, libckpt.CorruptError)
    assert issubclass(libckpt.NoDeviceError, libckpt.DeviceError)
    assert issubclass(libckpt.InvalidArgumentError, ValueError)
    assert issubclass(libckpt.NotFoundError, KeyError)


def test_busy_when_another_process_writes(root):
    code = ("import sys, libckpt\n"
            "s = libckpt.Store(sys.argv[1], fsync=False)\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(root)],
                             env=sub_env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(libckpt.BusyError) as e:
            open_store(root)
        assert e.value.status == -5 and e.value.message
        assert e.value.function == "ckpt_store_open"
        assert "readonly=True" in str(e.value) and "CKPT_OPEN" not in str(e.value)
        with open_store(root, readonly=True) as ro:  # readers take no lock
            assert ro.latest() is None
    finally:
        child.stdin.close()
        child.wait(30)
        child.stdout.close()
    open_store(root).close()  # free again once the writer is gone


def test_busy_when_opened_twice_in_one_process(store):
    with pytest.raises(libckpt.BusyError):
        open_store(store.path)
    store.save(1, {"x": np.ones(1)}).wait()  # the first is unharmed


def test_mismatch_on_dtype_and_shape(store):
    store.save(1, {"w": np.ones((4, 4), np.float32)}).wait()
    with pytest.raises(libckpt.MismatchError) as e:
        store.restore({"w": np.ones((4, 4), np.float64)})
    assert "w" in e.value.message
    # the C call the binding made (it restores and keeps the step open)
    assert e.value.function == ("ckpt_restore_open" if ffi.HAVE_RESTORE_OPEN
                                else "ckpt_restore")
    with pytest.raises(libckpt.MismatchError):
        store.restore({"w": np.ones((2, 8), np.float32)})
    with pytest.raises(libckpt.MismatchError):
        store.restore({"w": np.ones((4,), np.float32)})


def test_not_found(store):
    store.save(1, {"w": np.ones(3)}).wait()
    with pytest.raises(libckpt.NotFoundError) as e:
        store.restore({"nope": np.ones(3)})
    assert "nope" in e.value.message
    with pytest.raises(libckpt.NotFoundError):
        store.load(step=999)
    with pytest.raises(libckpt.NotFoundError):
        store.metadata(step=999)
    with pytest.raises(libckpt.NotFoundError):
        store.verify(step=999)
    with pytest.raises(libckpt.NotFoundError):
        store.restore({"w": np.ones(3)}, step=999)


def test_no_checkpoint(store):
    assert store.latest() is None
    with pytest.raises(libckpt.NoCheckpointError) as e:
        store.restore({"w": np.ones(3)})
    assert e.value.message and e.value.status == -8
    with pytest.raises(libckpt.NoCheckpointError):
        store.load()
    with pytest.raises((libckpt.NoCheckpointError, libckpt.NotFoundError)):
        store.metadata()


def test_invalid_arguments(store):
    with pytest.raises(libckpt.InvalidArgumentError):
        store.save(-5, {"w": np.ones(3)})
    with pytest.raises(libckpt.InvalidArgumentError):
        store.save(1, {"": np.ones(3)})
    with pytest.raises(libckpt.InvalidArgumentError):
        store.save(1, {"x" * 300: np.ones(3)})
    with pytest.raises(ValueError):
        open_store(store.path + "-2", verify_after_save="sometimes")
    assert store.latest() is None


def test_readonly_root_must_exist(tmp_path):
    with pytest.raises(libckpt.Error) as e:
        open_store(tmp_path / "missing", readonly=True)
    assert e.value.message


def test_binding_refuses_what_it_cannot_describe(store):
    a = np.arange(20.0).reshape(4, 5)
    # Not row-major: through a row-major copy (an expanded view can be
    # saved, not restored into: one element would be several).
    store.save(1, {"t": a[:, ::2], "u": a.T[::-1],
                   "w": np.broadcast_to(a[0], (3, 5))}).wait()
    into = {"t": np.zeros((4, 6))[:, ::2], "u": np.zeros((4, 5)).T[::-1],
            "w": np.zeros((3, 5))}
    assert store.restore(into) == 1
    assert (into["t"] == a[:, ::2]).all() and (into["u"] == a.T[::-1]).all()
    assert (into["w"] == a[0]).all()
    w = np.lib.stride_tricks.as_strided(np.zeros(5), (3, 5), (0, 8))
    with pytest.raises(libckpt.InvalidArgumentError,
                       match="'w' has elements that share memory"):
        store.restore({"w": w})
    # Lists, int keys and plain values are state (tests/python/
    # test_nested.py); what is neither a tensor nor plain is refused.
    with pytest.raises(TypeError, match=r"state\['s'\]: cannot save a set"):
        store.save(1, {"s": {1, 2, 3}})
    with pytest.raises(TypeError, match="not supported"):
        store.save(1, {"o": np.array([None, 1], dtype=object)})
    with pytest.raises(TypeError, match="byte order"):
        store.save(1, {"be": np.arange(3, dtype=">f4")})
    with pytest.raises(TypeError, match="keys must be str or int"):
        store.save(1, {(1, 2): np.ones(2)})
    with pytest.raises(TypeError, match="dict, list or tuple"):
        store.save(1, np.ones(2))
    store.save(1, {"w": np.ones(2)}).wait()
    ro = np.ones(2)
    ro.flags.writeable = False
    with pytest.raises(libckpt.InvalidArgumentError, match="read-only"):
        store.restore({"w": ro})
    # A NumPy scalar is a plain value, not a tensor to fill: where the
    # checkpoint has a tensor, each side lacks the other's.
    r = store.restore({"w": np.float64(1.0)})
    assert r.missing_keys == ["w"] and r.unexpected_keys == ["w"]
    assert r.state["w"] == 1.0


def test_device_array_without_cuda_is_a_device_error(store):
    if libckpt.cuda_available():
        pytest.skip("a CUDA device is present")

    class FakeDeviceArray:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4",
                                    "data": (0x7F0000001000, False),
                                    "version": 3, "strides": None,
                                    "stream": None}

    with pytest.raises(libckpt.DeviceError) as e:
        store.save(1, {"d": FakeDeviceArray()}).wait()
    assert e.value.message
    assert store.latest() is None


def test_error_message_is_per_thread(store):
    store.save(1, {"w": np.ones(3, np.float32)}).wait()
    caught = {}

    def worker():
        try:
            store.restore({"w": np.ones(3, np.int64)})
        except libckpt.Error as e:
            caught["worker"] = e

    t = threading.Thread(target=worker)
    with pytest.raises(libckpt.NotFoundError) as main:
        store.load(step=12345)
    t.start()
    t.join()
    assert isinstance(caught["worker"], libckpt.MismatchError)
    # Each thread's exception carries its own call's message.
    assert "12345" in main.value.message
    assert "'w'" in caught["worker"].message
    assert "12345" not in caught["worker"].message


def test_closed_store_and_handle(root):
    s = open_store(root)
    h = s.save(1, {"x": np.ones(1)})
    s.close()
    s.close()  # idempotent
    assert s.closed and h.done()
    h.wait()
    with pytest.raises(ValueError, match="closed"):
        s.latest()


def test_steps_beyond_int64_are_refused_not_wrapped(tmp_path):
    """ctypes would turn 2**64 + 5 into step 5 silently."""
    with libckpt.Store(tmp_path / "r", fsync=False) as st:
        a = np.arange(4, dtype=np.float32)
        for bad in (2**64 + 5, 2**63, -1):
            with pytest.raises(libckpt.InvalidArgumentError, match="out of range"):
                st.save(bad, {"a": a})
        st.save(1_700_000_000_123_456_789, {"a": a}).wait()
        st.save(2**63 - 1, {"a": a}).wait()
        assert [e["step"] for e in st.steps()] == [1_700_000_000_123_456_789, 2**63 - 1]
        assert st.load()[0] == 2**63 - 1
        with pytest.raises(libckpt.InvalidArgumentError):
            st.load(2**64 + 5)


def test_a_nul_in_a_tensor_name_is_refused(tmp_path):
    with libckpt.Store(tmp_path / "r", fsync=False) as st:
        with pytest.raises(libckpt.InvalidArgumentError, match="NUL"):
            st.save(1, {"a\0b": np.zeros(2, np.float32)})
        assert st.steps() == []


def test_bad_tensor_names_are_refused_by_their_path(store):
    """The library refuses an empty or over-255-byte name by its position
    only: the binding names the state's path first, in save and restore."""
    long_key = "m" * 300
    for state, path in (({long_key: np.zeros(2)}, "state[%r]" % long_key),
                        ({"a": {"é" * 130: np.zeros(2)}}, "state['a']")):
        with pytest.raises(libckpt.InvalidArgumentError,
                           match=r"flattens to a tensor name of \d+ bytes"
                           ) as e:
            store.save(1, state)
        assert path[:40] in str(e.value)
        with pytest.raises(libckpt.InvalidArgumentError, match="255 bytes"):
            store.restore(state)
    with pytest.raises(libckpt.InvalidArgumentError,
                       match=r"state\[''\] flattens to an empty tensor name"):
        store.save(1, {"": np.zeros(2)})
    # a lone surrogate (os.fsdecode of a non-UTF-8 file name) is no UTF-8:
    # named by its path and the character, before anything is written
    for state in ({"model": {"w\udc80": np.zeros(2)}},
                  {"model": {"w\udc80": np.zeros(2), "b": np.ones(1)}},
                  {"model": [{"\ud800": np.zeros(2)}]}):
        for call in (lambda s: store.save(1, s), store.restore):
            with pytest.raises(libckpt.InvalidArgumentError,
                               match=r"^state\['model'\].* flattens to a "
                               r"tensor name that is not valid UTF-8 "
                               r"\('\\ud[8c]\d\d' at position \d\)"):
                call(state)
    assert store.steps() == []
    # 255 bytes exactly is a name
    store.save(1, {"é" * 127 + "x": np.ones(2)}).wait()
    assert store.load()[1]["é" * 127 + "x"].tolist() == [1.0, 1.0]


def test_metadata_errors_say_metadata(store):
    with pytest.raises(libckpt.InvalidArgumentError, match="^metadata: .*NaN"):
        store.save(1, {"w": np.zeros(2)}, metadata={"x": float("nan")})
    with pytest.raises(TypeError, match="^metadata: .*ndarray.*put tensors"):
        store.save(1, {"w": np.zeros(2)}, metadata={"x": np.zeros(1)})
    # an int beyond 64 bits: named by its place, not by a column of JSON
    for big, where in ((2**64 - 1, r"\['seed'\]\[1\]"), (-2**63 - 1, r"")):
        meta = {"seed": [0, big]} if where else big
        with pytest.raises(libckpt.InvalidArgumentError,
                           match="^metadata%s: an integer beyond 64 bits.*"
                           "put it in the state" % where):
            store.save(1, {"w": np.zeros(2)}, metadata=meta)
    assert store.steps() == []
    # the state keeps what metadata cannot
    store.save(1, {"w": np.zeros(2), "x": float("nan"), "s": 2**64 - 1},
               metadata={"edge": [2**63 - 1, -2**63]}).wait()
    assert store.metadata(1) == {"edge": [2**63 - 1, -2**63]}
    assert store.load()[1]["s"] == 2**64 - 1


def test_handles_refuse_pickling_saying_what_to_do(store):
    import pickle
    h = store.save(1, {"w": np.zeros(2)})
    h.wait()
    with store.open() as ck:
        for obj, what in ((store, "pass its path"), (h, "step number"),
                          (ck, "open it there")):
            with pytest.raises(TypeError, match="cannot be pickled.*" + what):
                pickle.dumps(obj)


def test_a_step_that_is_not_an_integer_names_the_call(store):
    with pytest.raises(TypeError, match=r"Store\.save: step must be an "
                                        r"integer, not float"):
        store.save(2.0, {"w": np.zeros(2)})


def test_a_state_that_contains_itself_is_a_type_error(store):
    state = {"w": np.zeros(2)}
    state["me"] = state
    with pytest.raises(TypeError, match=r"state\['me'\] contains itself"):
        store.save(1, state)


def test_an_empty_root_path_is_named_and_the_function_said_once():
    # The library's message begins with its function already; str() must
    # not say it twice, and an empty path is not "not given".
    for path in ("", b""):
        with pytest.raises(libckpt.InvalidArgumentError) as info:
            libckpt.Store(path)
        assert str(info.value) == "ckpt_store_open: the checkpoint root path is empty"
    assert str(errors.error_for_status(-1, "ckpt_x: m", "ckpt_x")) == "ckpt_x: m"

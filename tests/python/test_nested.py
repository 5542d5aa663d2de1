"""Nested state (dicts, OrderedDicts, lists, tuples; tensors and plain
values) saved in one call and loaded back exactly; flattened tensor names;
collisions and unsupported keys refused; the metadata format."""

import collections
import enum
import json
import math
import struct

import numpy as np
import pytest

import libckpt
from libckpt import ffi, nested


def same(got, want, where="state"):
    """Equal with types: OrderedDict is not dict, tuple is not list, 0 is
    not "0" nor False, floats equal bit for bit."""
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for (gk, gv), (wk, wv) in zip(got.items(), want.items()):
            assert type(gk) is type(wk), (where, gk, wk)
            same(gv, wv, "%s[%r]" % (where, wk))
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, "%s[%d]" % (where, i))
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert got.tobytes() == want.tobytes(), where
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want), where
    else:
        assert got == want, where


def odd_nan():
    return struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000123))[0]


PLAIN = {
    "none": None, "t": True, "f": False, "zero": 0, "neg": -7,
    "int64": [2**63 - 1, -2**63], "huge": [2**64, -2**200, 10**40],
    "floats": [0.1, -0.0, 1.0, 5e-324, 1.7976931348623157e308, 1e22,
               math.inf, -math.inf, math.nan, odd_nan()],
    "str": ["", "plain", "r\u00e9sum\u00e9 \u2713 \U0001F600",
            "nul\0inside", "lone \udc80 surrogate", "{\"tensor\": 1}"],
    "bytes": [b"", b"\0\xff raw"],
}


def test_plain_values_round_trip_exactly(store):
    store.save(1, PLAIN).wait()
    step, got = store.load()
    assert step == 1
    same(got, PLAIN)


def test_containers_and_key_types_are_kept(store):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    state = collections.OrderedDict([
        ("model", collections.OrderedDict([("fc1.weight", w),
                                           ("fc1.bias", np.zeros(3))])),
        ("optim", {"state": {0: {"step": np.array(3.0),
                                 "exp_avg": np.ones(2)},
                             1: {"exp_avg": np.full(2, 2.0)}},
                   "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999),
                                     "params": [0, 1]}]}),
        ("mixed", {0: "int zero", "0": "str zero", -1: None,
                   2**70: "big key"}),
        ("tuple", (1, [2, (3,)], {})),
        ("empty", {"d": {}, "l": [], "t": (), "o": collections.OrderedDict()}),
    ])
    store.save(5, state).wait()
    _, got = store.load(step=5)
    same(got, state)


def test_a_counter_comes_back_a_counter(store):
    """collections.Counter (MultiStepLR's milestones) keeps its type, its
    counts and key types, including one holding arrays; a plain dict
    beside it stays a dict; a reader that ignores the node's "counter"
    member (an older libckpt) still reads a dict of the same items."""
    miles = collections.Counter({30: 1, 80: 2, "x": -1})
    state = {"sched": {"milestones": miles, "plain": {30: 1}},
             "arrays": collections.Counter(w=np.arange(3.0)),
             "empty": collections.Counter()}
    store.save(1, state).wait()
    _, got = store.load()
    same(got, state)
    assert sorted(got["sched"]["milestones"].elements(),
                  key=str) == [30, 80, 80]
    with store._checkpoint(1) as ck:
        raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
    node = raw["tree"]["dict"][0][1]["dict"][0][1]
    assert node["counter"] is True
    del node["counter"]
    assert nested.unflatten(node, None) == {30: 1, 80: 2, "x": -1}
    assert type(nested.unflatten(node, None)) is dict



def test_restore_into_a_counter_replaces_its_counts(store):
    """restore() into a state holding a Counter gives the checkpoint's
    counts, not the sum of the two (Counter.update adds): a count that
    changed, one that did not, and one the caller added since."""
    store.save(1, {"w": np.ones(2),
                   "seen": collections.Counter({"cat": 10, "dog": 4})}).wait()
    mine = {"w": np.zeros(2),
            "seen": collections.Counter({"cat": 15, "dog": 4, "eel": 1})}
    got = store.restore(mine).state["seen"]
    assert type(got) is collections.Counter
    assert dict(got) == {"cat": 10, "dog": 4, "eel": 1}
    assert mine["seen"] == collections.Counter({"cat": 15, "dog": 4, "eel": 1})

def test_tensors_are_stored_under_dotted_state_dict_names(store):
    state = {"model": {"fc1.weight": np.ones((2, 2)), "fc1.bias": np.ones(2)},
             "optim": {"state": {0: {"exp_avg": np.zeros(2)}}},
             "layers": [np.arange(2), {"w": np.arange(3)}],
             "epoch": 3}
    store.save(1, state).wait()
    with store.open(1) as ck:  # names as the C API lists them
        assert ck.keys() == ["model.fc1.weight", "model.fc1.bias",
                             "optim.state.0.exp_avg", "layers.0",
                             "layers.1.w"]
    # ...so a flat restore by name, as from C, finds them.
    buf = np.empty(3, np.int64)
    assert store.restore({"layers.1.w": buf}, strict=False) == 1
    assert buf.tolist() == [0, 1, 2]


def test_flat_dict_of_arrays_works_as_before(store):
    arrays = {"w": np.arange(4.0), "b": np.ones(2, np.int8),
              "s": np.float32(1.5)}
    store.save(1, arrays).wait()
    step, got = store.load()
    assert type(got) is dict and list(got) == ["w", "b", "s"]
    same(got["w"], arrays["w"])
    # a NumPy scalar is a plain value: the same scalar type back
    assert type(got["s"]) is np.float32 and got["s"] == arrays["s"]
    out = {"w": np.zeros(4), "b": np.zeros(2, np.int8)}
    assert store.restore(out) == 1
    same(out["w"], arrays["w"])


def test_numpy_scalars_are_plain_values(store):
    """A NumPy scalar (a metric from np.mean, a counter) is a plain value:
    load gives back the same scalar type and value bit for bit, a restore
    puts the checkpoint's into the state (a scalar cannot be filled in
    place), and a crafted node is CorruptError naming it."""
    nan = np.frombuffer(np.uint64(0x7FF8_0000_0000_0ABC).tobytes(), np.float64)[0]
    values = {"f64": np.float64(0.1), "f32": np.float32(1.5),
              "f16": np.float16(-0.0), "nan": nan, "i8": np.int8(-7),
              "u64": np.uint64(2**64 - 1), "b": np.bool_(True),
              "c": np.complex64(1 - 2j), "t": np.datetime64("2026-12-01T10:00"),
              "dt": np.timedelta64(3, "s"), "ld": np.longdouble(1) / 3}
    store.save(1, {"w": np.ones(2), "m": values}).wait()
    with store.open() as ck:
        assert ck.keys() == ["w"]  # not C-level tensors
    got = store.load()[1]["m"]
    for k, v in values.items():
        assert type(got[k]) is type(v), k
        assert got[k].tobytes() == v.tobytes(), k
    blank = {k: np.float64(0) for k in values}
    r = store.restore({"w": np.zeros(2), "m": blank})
    assert not r.missing_keys and not r.unexpected_keys
    assert all(r.state["m"][k].tobytes() == v.tobytes() for k, v in values.items())
    assert libckpt.nested.flatten({"x": np.int64(1)}).version == 4
    assert libckpt.nested.flatten({"x": np.ones(1)}).version < 4
    tree = libckpt.nested.flatten({"x": np.int64(1)}).tree
    for node in ({"numpy": "O", "value": ""},                # an object dtype
                 {"numpy": "<f8", "value": "AAAA"},          # 3 bytes, not 8
                 {"numpy": "[('a','<f4')]", "value": ""},    # not a dtype
                 {"numpy": "<U1", "value": "AAAAAA=="},      # a str kind
                 {"numpy": "<f8", "value": "!!"},            # not base64
                 {"numpy": 8, "value": ""}):
        tree["dict"][0][1] = node
        with pytest.raises(libckpt.CorruptError, match="numpy node"):
            libckpt.nested.unflatten(tree, None)


@pytest.mark.parametrize("state, paths", [
    ({"a.b": np.ones(1), "a": {"b": np.ones(1)}},
     ("state['a.b']", "state['a']['b']")),
    ({"x": {0: np.ones(1), "0": np.ones(1)}},
     ("state['x'][0]", "state['x']['0']")),
    ({"l": [np.ones(1)], "l.0": np.ones(1)},
     ("state['l'][0]", "state['l.0']")),
])
def test_names_colliding_after_flattening_are_refused(store, state, paths):
    with pytest.raises(libckpt.InvalidArgumentError) as e:
        store.save(1, state)
    for p in paths:
        assert p in str(e.value)
    assert store.latest() is None  # nothing was written


def test_a_dotted_key_beside_nesting_is_fine_without_collision(store):
    state = {"a.b": np.ones(1), "a": {"c": np.zeros(1), "b": "plain"}}
    store.save(1, state).wait()
    same(store.load()[1], state)


@pytest.mark.parametrize("state, match", [
    ({(1, 2): np.ones(1)}, r"state: key \(1, 2\) is a tuple"),
    ({"a": {True: 1}}, r"state\['a'\]: key True is a bool"),
    ({"a": {None: 1}}, r"key None is a NoneType"),
    ({"a": [1, {2.5: "x"}]}, r"state\['a'\]\[1\]: key 2.5 is a float"),
    ({"a": {"s": {1, 2}}}, r"state\['a'\]\['s'\]: cannot save a set"),
    ({"a": [object()]}, r"state\['a'\]\[0\]: cannot save a object"),
    ({"a": bytearray(b"x")}, r"cannot save a bytearray"),
    # torch < 2.2's OneCycleLR.state_dict() holds a bound method
    ({"sched": {"anneal_func": collections.OrderedDict().copy}},
     r"state\['sched'\]\['anneal_func'\]: cannot save a builtin_function_or_method "
     r"\('OrderedDict.copy'\): a checkpoint stores no code.*if not callable"),
    ({"f": [len]}, r"state\['f'\]\[0\]: cannot save a .*stores no code"),
])
def test_unsupported_keys_and_leaves_are_refused_by_path(store, state, match):
    with pytest.raises(TypeError, match=match):
        store.save(1, state)
    assert store.latest() is None


def test_a_state_containing_itself_is_refused(store):
    loop = {"w": np.ones(1)}
    loop["again"] = [loop]
    with pytest.raises(TypeError, match=r"state\['again'\]\[0\] contains"):
        store.save(1, loop)
    shared = np.ones(2)  # the same object twice is no cycle
    store.save(1, {"a": shared, "b": [shared]}).wait()
    assert sorted(store.load()[1]) == ["a", "b"]


def test_metadata_is_the_callers_and_the_manifest_holds_the_format(store):
    store.save(1, {"w": np.ones(2), "epoch": 3}, metadata={"lr": 0.5}).wait()
    store.save(2, {"w": np.ones(2)}).wait()
    assert store.metadata(1) == {"lr": 0.5}
    assert store.metadata(2) is None
    with store._checkpoint(1) as ck:
        raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
    assert raw == {"format": "libckpt-python-state", "version": 1,
                   "metadata": {"lr": 0.5},
                   "tree": {"dict": [["w", {"tensor": "w", "from": "np"}],
                                     ["epoch", 3]]}}


def without_structure(tree, metadata, version=1):
    return metadata  # what the C API or an older binding wrote


def test_checkpoints_without_structure_load_flat(store, monkeypatch):
    monkeypatch.setattr(nested, "wrap", without_structure)
    store.save(1, {"a": {"w": np.arange(3)}}, metadata={"k": 1}).wait()
    monkeypatch.undo()
    step, got = store.load()
    assert list(got) == ["a.w"] and got["a.w"].tolist() == [0, 1, 2]
    assert store.metadata() == {"k": 1}
    with store.open() as ck:
        assert ck.structure()["a.w"].shape == (3,)


def test_a_newer_structure_version_is_a_version_error(store, monkeypatch):
    newer = nested.VERSION + 1
    real_wrap = nested.wrap
    monkeypatch.setattr(nested, "wrap", lambda tree, metadata, version=1:
                        real_wrap(tree, metadata, newer))
    store.save(1, {"w": np.ones(1)}).wait()
    monkeypatch.undo()
    with pytest.raises(libckpt.VersionError, match="version %d" % newer):
        store.load()
    with pytest.raises(libckpt.VersionError):
        store.metadata(1)


def test_plain_only_state_has_no_tensors(store):
    state = {"epoch": 3, "history": [0.5, 0.25], "done": False}
    store.save(1, state).wait()
    same(store.load()[1], state)
    assert store.steps()[0]["tensors"] == 0


class DLPackOnly:
    """An array exposing nothing but DLPack (as JAX arrays do)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_objects_are_tensors(store):
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    store.save(1, {"x": [DLPackOnly(a)]}).wait()
    same(store.load()[1], {"x": [a]})


def test_restore_fills_nested_tensors_and_returns_plain_values(store):
    saved = {"net": {"w": np.arange(4.0), "b": np.ones(2)},
             "epoch": 7, "lrs": (0.1, 0.01)}
    store.save(3, saved).wait()
    net = {"w": np.zeros(4), "b": np.zeros(2)}
    mine = {"net": net, "epoch": 0, "lrs": (0.0, 0.0)}
    r = store.restore(mine)
    assert r == 3 and r.step == 3 and isinstance(r, int)
    same(net["w"], saved["net"]["w"])          # in place
    assert r.state["net"] is net                 # nothing to replace there
    assert r.state["epoch"] == 7 and r.state["lrs"] == (0.1, 0.01)
    assert mine["epoch"] == 0                    # the caller's is untouched
    assert r.missing_keys == [] and r.unexpected_keys == []


def test_restore_gives_the_checkpoints_values_type_and_bits_included(store):
    """A plain value is replaced unless the state's is the checkpoint's own,
    type and bits included: 1 is not 1.0, True is not 1, -0.0 is not 0.0,
    NaN never equals; containers holding only equal values stay the
    caller's objects."""
    saved = {"w": np.arange(3.0), "a": 1.0, "b": 0.0, "c": True, "n": None,
             "s": "x", "nan": float("nan"), "params": [0, 1, 2],
             "group": {"lr": 0.1, "betas": (0.9, 0.999)}}
    store.save(1, saved).wait()
    params = [0, 1, 2]
    group = {"lr": 0.1, "betas": (0.9, 0.999)}
    mine = {"w": np.zeros(3), "a": 1, "b": -0.0, "c": 1, "n": None, "s": "x",
            "nan": float("nan"), "params": params, "group": group}
    r = store.restore(mine)
    got = r.state
    assert type(got["a"]) is float and got["a"] == 1.0
    assert math.copysign(1.0, got["b"]) == 1.0
    assert got["c"] is True
    assert got["n"] is None and got["s"] == "x" and math.isnan(got["nan"])
    assert got["params"] is params and got["group"] is group  # all equal
    assert mine["a"] == 1 and type(mine["a"]) is int  # the caller's stays
    assert got["w"].tolist() == [0.0, 1.0, 2.0]


def test_restore_strict_and_the_keys_each_side_lacks(store):
    store.save(1, {"w": np.ones(2), "extra": np.ones(1), "n": 1}).wait()
    state = {"w": np.zeros(2), "absent": np.zeros(3), "m": 5}
    with pytest.raises(libckpt.NotFoundError, match="absent"):
        store.restore(state)
    r = store.restore(state, strict=False)
    assert state["w"].tolist() == [1.0, 1.0]
    assert state["absent"].tolist() == [0.0] * 3  # left as it was
    assert r.missing_keys == ["absent", "m"]
    assert r.unexpected_keys == ["extra", "n"]
    assert r.state["m"] == 5
    assert store.restore(state, allow_missing=True) == 1  # older spelling


def test_a_dict_of_tensors_is_one_compact_node(store):
    """Version 2: a dict (or OrderedDict) whose values are all tensors of
    one origin under plain str keys is one node listing its keys."""
    inner = collections.OrderedDict([("w", np.arange(3.0)), ("b", np.ones(2))])
    inner._metadata = {"": {"version": 1}}
    state = {"model": inner, "opt": {"0": {"m": np.zeros(2), "v": np.ones(2)}},
             "step": 7}
    store.save(1, state).wait()
    with store._checkpoint(1) as ck:
        raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
    assert raw["version"] == 2
    assert raw["tree"] == {"dict": [
        ["model", {"_metadata": {"dict": [["", {"dict": [["version", 1]]}]]},
                   "otensors": ["w", "b"], "from": "np"}],
        ["opt", {"dict": [["0", {"tensors": ["m", "v"], "from": "np"}]]}],
        ["step", 7]]}
    step, got = store.load()
    same(got, state)
    assert isinstance(got["model"], collections.OrderedDict)
    assert got["model"]._metadata == {"": {"version": 1}}
    assert list(got["model"]) == ["w", "b"]
    # restore in place fills them and gives back the plain values
    into = {"model": collections.OrderedDict([("w", np.zeros(3)), ("b", np.zeros(2))]),
            "opt": {"0": {"m": np.ones(2), "v": np.zeros(2)}}, "step": 0}
    r = store.restore(into)
    assert r.state["step"] == 7 and into["model"]["w"].tolist() == [0.0, 1.0, 2.0]
    assert into["opt"]["0"]["v"].tolist() == [1.0, 1.0]


def test_mixed_dicts_keep_the_general_node(store):
    """Not compact: a plain value beside the tensors, an int key, a key
    that is not ASCII, tensors of two origins."""
    torch = pytest.importorskip("torch")
    for state in ({"a": {"w": np.ones(1), "n": 1}}, {"a": {0: np.ones(1)}},
                  {"a": {"\u00e9": np.ones(1)}},
                  {"a": {"x": np.ones(1), "y": torch.ones(1)}}):
        store.save(1, state).wait()
        with store._checkpoint(1) as ck:
            raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
        assert raw["version"] == 1, state
        assert "dict" in raw["tree"]["dict"][0][1], state
        got = store.load(framework="auto")[1]
        assert list(got["a"]) == list(state["a"])


def test_torch_parameters_and_subclasses_share_a_compact_node(store):
    """Parameters, plain tensors and tensor subclasses in one dict are all
    torch's: one compact node; an int beside them is not."""
    torch = pytest.importorskip("torch")

    class Tagged(torch.Tensor):
        pass

    inner = {"p": torch.nn.Parameter(torch.ones(2)), "t": torch.zeros(3),
             "s": torch.full((2,), 5.0).as_subclass(Tagged)}
    store.save(1, {"a": inner, "b": {"t": torch.ones(1), "n": 2}}).wait()
    with store._checkpoint(1) as ck:
        raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
    assert raw["tree"]["dict"][0][1] == {"tensors": ["p", "t", "s"],
                                         "from": "pt"}
    assert "dict" in raw["tree"]["dict"][1][1]
    got = store.load(framework="pt")[1]
    assert got["a"]["s"].tolist() == [5.0, 5.0] and got["b"]["n"] == 2


def test_version_1_trees_of_many_tensors_still_load(store, monkeypatch):
    """What a binding before version 2 wrote: one node per tensor."""
    monkeypatch.setattr(nested, "_encode_tensor_dict", lambda *a: None)
    state = {"layers": {"l%d" % i: np.full(2, float(i)) for i in range(50)}}
    store.save(1, state).wait()
    monkeypatch.undo()
    with store._checkpoint(1) as ck:
        raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
    assert raw["version"] == 1
    assert raw["tree"]["dict"][0][1]["dict"][0] == [
        "l0", {"tensor": "layers.l0", "from": "np"}]
    same(store.load()[1], state)


@pytest.mark.parametrize("node", [
    {"tensors": "w", "from": "np"}, {"tensors": [1], "from": "np"},
    {"tensors": ["w"], "from": "jax"}, {"otensors": None}])
def test_a_malformed_compact_node_is_corrupt(store, monkeypatch, node):
    real_wrap = nested.wrap
    monkeypatch.setattr(nested, "wrap", lambda tree, metadata, version=1:
                        real_wrap({"dict": [["a", node]]}, metadata, 2))
    store.save(1, {"a": {"w": np.ones(1)}}).wait()
    monkeypatch.undo()
    with pytest.raises(libckpt.CorruptError, match="malformed"):
        store.load()


@pytest.mark.parametrize("tree, what", [
    ({"dict": [["x", {"int": "abc"}]]}, r"malformed 'int' node.*invalid literal"),
    ({"dict": [["x", {"int": "9" * 5000}]]}, "malformed 'int' node"),
    ({"dict": [["x", {"float": []}]]}, "malformed 'float' node"),
    ({"dict": [["x", {"float": "nan:zz"}]]}, "malformed 'float' node"),
    ({"dict": [["x", {"str": 5}]]}, "malformed 'str' node"),
    ({"dict": [["x", {"str": "!!!"}]]}, "malformed 'str' node"),
    ({"dict": [["x", {"bytes": "a"}]]}, "malformed 'bytes' node"),
    ({"dict": 5}, "state: malformed state structure node"),
    ({"dict": [["w"]]}, "malformed key and value pair"),
    ({"dict": [[[1, 2], 1]]}, r"malformed key \[1, 2\]"),
    ({"dict": [[True, 1]]}, "malformed key True"),
    ({"dict": [[{"list": [1]}, 1]]}, "unknown node"),
    ({"dict": [["x", {"list": 5}]]}, r"state\['x'\]: malformed state"),
    ({"dict": [["x", {"tuple": "abc"}]]}, "malformed state structure node"),
    ({"dict": [["x", {"tensor": 5}]]}, r"state\['x'\]: malformed tensor node"),
    ({"dict": [["w", {"tensor": "w", "from": "zz"}]]}, r"state\['w'\]: malformed tensor node"),
    ({"dict": [["w", {"tensor": "w", "from": ["pt"]}]]}, r"state\['w'\]: malformed tensor"),
    ({"dict": [], "_metadata": None}, "_metadata on a node that is not an OrderedDict"),
    ({"dict": [["x", {"tensors": ["w"], "from": "np", "_metadata": None}]]},
     r"state\['x'\]: malformed state structure node \(_metadata")])
def test_a_forged_plain_node_is_corrupt_not_a_python_error(store, monkeypatch,
                                                          tree, what):
    """A structure that passes the manifest's checksum (its writer forged
    it) but holds nodes the binding never writes: CorruptError naming the
    node, from load and from restore (which reads the plain values), not
    ValueError / TypeError / binascii.Error from inside the binding, nor a
    garbled value (non-base64 text decoded as "")."""
    real_wrap = nested.wrap
    monkeypatch.setattr(nested, "wrap", lambda t, metadata, version=1:
                        real_wrap(tree, metadata, 4))
    store.save(1, {"w": np.ones(1)}).wait()
    monkeypatch.undo()
    with pytest.raises(libckpt.CorruptError, match=what):
        store.load()
    with pytest.raises(libckpt.CorruptError, match=what):
        store.restore({"w": np.zeros(1)}, strict=False)


def test_a_tensor_the_structure_names_twice_is_read_once(store, monkeypatch):
    """A structure naming one tensor in many places (forged: a few bytes of
    manifest each) gets that one tensor in every place, read once, not one
    copy per reference (60 references to 100 MB took 6 GB); also for
    framework="pt" and compact nodes."""
    try:
        import torch
    except ImportError:  # the suite run against the newest NumPy, without torch
        torch = None
    real_wrap = nested.wrap
    tree = {"dict": [["a", {"list": [{"tensor": "w"}] * 50}],
                     ["m", {"dict": [["w", {"tensor": "w"}], ["v", {"tensor": "v"}]]}],
                     ["n", {"dict": [["v", {"tensor": "v"}], ["w", {"tensor": "w"}]]}]]}
    monkeypatch.setattr(nested, "wrap", lambda t, metadata, version=1:
                        real_wrap(tree, metadata, 4))
    store.save(1, {"w": np.arange(4.0), "v": np.ones(3)}).wait()
    monkeypatch.undo()
    for framework in ("auto", "np") + (("pt",) if torch else ()):
        state = store.load(framework=framework).state
        w = state["a"][0]
        assert all(x is w for x in state["a"]), framework
        assert state["m"]["w"] is w and state["n"]["w"] is w, framework
        assert state["m"]["v"] is state["n"]["v"], framework
        assert np.array_equal(np.asarray(w), np.arange(4.0)), framework
        if framework == "pt":
            assert isinstance(w, torch.Tensor)


def test_numpy_text_scalars_are_plain_text(store):
    # np.str_ and np.bytes_ (a label taken from an array) have the array
    # protocols, but are text: stored as str and bytes, not as tensors
    label = np.array(["cat", "dog"])[1]
    raw = np.array([b"\x00ab"])[0]
    store.save(1, {"label": label, "raw": raw, "w": np.ones(2)}).wait()
    got = store.load()[1]
    assert type(got["label"]) is str and got["label"] == "dog"
    assert type(got["raw"]) is bytes and got["raw"] == b"\x00ab"


class Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Loud(str):
    """A str subclass whose own conversions, equality and hash all say
    something else than its text."""
    def __str__(self):
        return "loud:" + str.__str__(self)

    def __repr__(self):
        return "Loud(%s)" % str.__repr__(self)

    def __format__(self, spec):
        return "LOUD"

    def __eq__(self, other):
        return type(other) is Loud and str.__eq__(self, other)

    def __hash__(self):
        return hash(("loud", str.__str__(self)))


class Odd(int):
    def __int__(self):
        return 99

    def __index__(self):
        return 98

    def __str__(self):
        return "ODD"

    def __repr__(self):
        return "Odd()"

    def __format__(self, spec):
        return "ODD"


class Weird(float):
    def __float__(self):
        return 9.5

    def __str__(self):
        return "WEIRD"

    def __repr__(self):
        return "WEIRD"

    def __format__(self, spec):
        return "WEIRD"


def subclass_state(arrays):
    """A state of values and keys of subclasses of str, int and float
    (their own __str__, __int__, __index__, __float__, __repr__ and
    __format__ overridden), the keys holding tensors `arrays` (three) and
    plain values."""
    a, b, c = arrays
    return {"mode": Mode.TRAIN, Mode.EVAL: 1, "level": Level.HIGH,
            Level.LOW: "low", "loud": Loud("quiet"), Loud("lr"): 0.5,
            "odd": Odd(7), "big": Odd(2**70), Odd(5): "five",
            "weird": Weird(0.25), "nan": Weird(odd_nan()),
            "all": [Mode.EVAL, Loud("x"), Odd(-3), Weird(-0.0)],
            "heads": {Mode.TRAIN: a, Loud("head"): b, Odd(3): c}}


def test_subclasses_of_str_int_and_float_are_saved_as_their_base_value(store):
    """A subclass's value and key are stored as the str, int or float they
    are, not as what their own __str__ (a (str, Enum) member's is
    "Mode.TRAIN"), __int__, __float__ or __repr__ say; a key's tensor is
    named by it (heads.train, not heads.Mode.TRAIN).  They load back as
    the base types (docs/PYTHON.md)."""
    arrays = [np.arange(2.0), np.ones(3, np.int32), np.full(2, 7.0)]
    store.save(1, subclass_state(arrays)).wait()
    want = {"mode": "train", "eval": 1, "level": 2, 1: "low",
            "loud": "quiet", "lr": 0.5, "odd": 7, "big": 2**70, 5: "five",
            "weird": 0.25, "nan": odd_nan(),
            "all": ["eval", "x", -3, -0.0],
            "heads": {"train": arrays[0], "head": arrays[1], 3: arrays[2]}}
    step, got = store.load()
    same(got, want)
    with store.open(1) as ck:
        assert sorted(ck.keys()) == ["heads.3", "heads.head", "heads.train"]
        assert np.array_equal(ck.state("heads", Mode.TRAIN), arrays[0])
        assert np.array_equal(ck.state("heads", Loud("head")), arrays[1])
        assert ck.state("heads", Odd(3)).tolist() == [7.0, 7.0]
        same(ck.state(), want)
    with store._checkpoint(1) as ck:
        text = ffi.lib.ckpt_checkpoint_metadata(ck).decode()
    for wrong in ("Mode.", "loud:", "Loud(", "LOUD", "ODD", "Odd(", "99",
                  "98", "WEIRD", "9.5"):
        assert wrong not in text, (wrong, text)


def test_restore_matches_keys_of_subclasses_by_their_base_value(store):
    arrays = [np.arange(2.0), np.ones(3, np.int32), np.full(2, 7.0)]
    store.save(1, subclass_state(arrays)).wait()
    into = [np.zeros(2), np.zeros(3, np.int32), np.zeros(2)]
    state = subclass_state(into)
    state.update({"mode": Mode.EVAL, Mode.EVAL: 2, Loud("lr"): 0.1,
                  "odd": Odd(8), Odd(5): "six"})
    result = store.restore(state)
    assert result == 1
    assert result.missing_keys == [] and result.unexpected_keys == []
    for a, b in zip(into, arrays):
        assert np.array_equal(a, b)
    got = result.state
    # the state's own keys, the checkpoint's values (their base types)
    assert got[Mode.EVAL] == 1 and got[Loud("lr")] == 0.5
    assert type(got["mode"]) is str and got["mode"] == "train"
    assert type(got["odd"]) is int and got["odd"] == 7
    assert got[Odd(5)] == "five" and got[Level.LOW] == "low"
    assert type(got["big"]) is int and got["big"] == 2**70
    assert type(got["weird"]) is float and got["weird"] == 0.25
    assert got["heads"][Mode.TRAIN] is into[0]


def test_numpy_integer_keys_are_stored_as_ints(store):
    """Keys from np.unique are np.int64: refused as "a int64" before
    (torch.save keeps them); now stored as the ints they are, as values
    and as keys holding tensors, and found again by restore."""
    classes = np.unique(np.array([3, 1, 3], dtype=np.int64))
    state = {"counts": {c: int(c) * 10 for c in classes},
             "heads": {c: np.full(2, float(c)) for c in classes}}
    store.save(1, state).wait()
    got = store.load().state
    assert got["counts"] == {1: 10, 3: 30}
    assert all(type(k) is int for k in got["counts"])
    with store.open() as ck:
        assert sorted(ck.keys()) == ["heads.1", "heads.3"]
    into = {"heads": {np.int32(1): np.zeros(2), np.int32(3): np.zeros(2)}}
    result = store.restore(into, strict=False)
    assert result.missing_keys == []
    assert into["heads"][np.int32(3)].tolist() == [3.0, 3.0]


def test_a_key_of_a_subclass_equal_to_another_once_saved_is_refused(store):
    # Loud("a") is not "a" to a dict, but both are saved as "a": the later
    # would overwrite the earlier on load
    with pytest.raises(libckpt.InvalidArgumentError,
                       match=r"keys .*Loud\('a'\).* both saved as 'a'"):
        store.save(1, {"d": {"a": 1, Loud("a"): 2}})
    with pytest.raises(libckpt.InvalidArgumentError, match="both saved as 'w'"):
        store.save(1, {Loud("w"): np.ones(2), "w": np.zeros(2)})


def test_a_bool_step_is_refused(store):
    with pytest.raises(TypeError, match="step must be an integer, not bool"):
        store.save(True, {"w": np.ones(2)})


Point = collections.namedtuple("Point", "x y")


def test_a_namedtuple_loads_back_as_its_class(store):
    # The class is looked up (never imported) where it was defined; the
    # tensors inside are named by index, as in a tuple.
    state = {"p": Point(np.arange(3.0), 7), "ps": [Point(1, (2, 3))]}
    store.save(1, state).wait()
    with store._checkpoint(1) as ck:
        raw = json.loads(ffi.lib.ckpt_checkpoint_metadata(ck))
    assert raw["version"] == 1, "readers that ignore the member still read it"
    step, got = store.load()
    same(got, state)
    assert got["p"].y == 7 and np.array_equal(got["p"].x, np.arange(3.0))
    with store.open(1) as ck:
        assert "p.x" not in ck and "p.0" in ck.keys()
        assert ck.state("p").y == 7


def test_a_namedtuple_of_an_unknown_class_gets_a_stand_in(store):
    Local = collections.namedtuple("Local", ["a", "b"])  # not reachable by name
    store.save(1, {"v": Local(1, "two")}).wait()
    got = store.load()[1]["v"]
    assert type(got) is not Local and isinstance(got, tuple)
    assert type(got).__name__ == "Local" and type(got)._fields == ("a", "b")
    assert (got.a, got.b) == (1, "two") and got == (1, "two")


@pytest.mark.parametrize("named, want", [
    (["builtins:dict", ["a", "b"]], "stand-in"),   # a class, but no tuple
    (["os:system", ["a", "b"]], "stand-in"),       # no class at all
    (["m:T", ["class", "a"]], "tuple"),            # not identifiers
    (["m:T", ["a", "a"]], "tuple"),                # repeated
    (["m:T", ["a"]], "corrupt"),                   # one field for two items
    ("m:T", "corrupt"), (["m:T", [1, 2]], "corrupt")])
def test_a_crafted_namedtuple_node_runs_nothing(store, monkeypatch, named, want):
    real_wrap = nested.wrap
    monkeypatch.setattr(nested, "wrap", lambda tree, metadata, version=1: real_wrap(
        {"dict": [["v", {"tuple": [1, 2], "namedtuple": named}]]}, metadata, 1))
    store.save(1, {"v": (1, 2)}).wait()
    monkeypatch.undo()
    if want == "corrupt":
        with pytest.raises(libckpt.CorruptError, match="malformed namedtuple"):
            store.load()
        return
    got = store.load()[1]["v"]
    assert got == (1, 2)
    if want == "tuple":
        assert type(got) is tuple
    else:
        assert type(got).__bases__ == (tuple,) and hasattr(type(got), "_fields")


def deep(levels, leaf):
    for _ in range(levels):
        leaf = [leaf]
    return leaf


def test_a_state_nested_beyond_the_recursion_limit_is_refused(store):
    """Named errors, not a RecursionError: a state (or metadata) nested
    too deep to walk is refused before anything is written."""
    with pytest.raises(libckpt.InvalidArgumentError, match="the state nests deeper"):
        store.save(1, {"a": deep(5000, 1), "t": np.ones(2)})
    with pytest.raises(libckpt.InvalidArgumentError, match="metadata nests deeper"):
        store.save(1, {"t": np.ones(2)}, metadata=deep(5000, 1))
    # deeper than the library reads, if not deeper than Python walks
    with pytest.raises(libckpt.InvalidArgumentError,
                       match="metadata nests deeper than a checkpoint holds"):
        store.save(1, {"t": np.ones(2)}, metadata=deep(nested.JSON_MAX_DEPTH, 1))
    assert store.latest() is None
    shallow = {"a": deep(50, 1), "t": np.ones(2)}
    store.save(1, shallow).wait()
    same(store.load()[1], shallow)


def test_a_checkpoint_structure_too_deep_to_walk_is_corrupt(store, monkeypatch):
    """What another writer may have committed (the library accepts JSON
    nested up to 2048 deep): reading it back is CorruptError naming it,
    from load and restore alike, and the tensors stay readable by name.
    The binding's own walks of a decoded structure give up the same way."""
    import libckpt.store as store_module
    real = json.dumps
    # A valid structure 2,000 JSON levels deep: within what the library
    # reads (2048), beyond what Python walks.  Before 3.13 Python's JSON
    # decoder gives up on it (the metadata); from 3.13 it decodes it, and
    # the walk of the structure gives up.
    node = '{"list":[' * 1000 + "1" + "]}" * 1000

    def crafted(obj, **kw):  # the save's metadata text, made by hand
        if isinstance(obj, dict) and obj.get("format") == nested.FORMAT:
            tree = '{"dict":[["t",{"tensor":"t","from":"np"}],["x",%s]]}' % node
            return '{"format":"%s","version":2,"tree":%s}' % (nested.FORMAT, tree)
        return real(obj, **kw)
    monkeypatch.setattr(store_module.json, "dumps", crafted)
    store.save(1, {"t": np.ones(2)}).wait()
    monkeypatch.undo()
    deeper = r"(metadata|structure) nests deeper"
    with pytest.raises(libckpt.CorruptError, match=deeper):
        store.load(1)
    with pytest.raises(libckpt.CorruptError, match=deeper):
        store.restore({"t": np.zeros(2)}, step=1)
    with store._checkpoint(1) as ck:
        out = np.zeros(2)
        ffi.lib.ckpt_checkpoint_read(ck, b"t", out.ctypes.data, out.nbytes)
        assert out.tolist() == [1.0, 1.0]

    tree = 1  # decoded already (built without recursion): 5000 levels
    for _ in range(5000):
        tree = {"list": [tree]}
    for walk in (lambda: nested.unflatten(tree, None),
                 lambda: nested.plain_leaves(tree),
                 lambda: nested.tensor_paths(tree)):
        with pytest.raises(libckpt.CorruptError, match="structure nests deeper"):
            walk()



@pytest.mark.parametrize("tree", [
    # a plain value, then the same key again as a compact tensor node
    {"dict": [["m", {"dict": [["w", 5]]}],
              ["m", {"tensors": ["w"], "from": "np"}]]},
    # the other way round: the plain value wins
    {"dict": [["m", {"tensors": ["w"], "from": "np"}],
              ["m", {"dict": [["w", 5]]}]]},
    # a key named twice, plain then tensor
    {"dict": [["m", {"dict": [["w", 5], ["w", {"tensor": "m.w"}]]}]]},
    # the same key below another path is not a duplicate
    {"dict": [["w", 1], ["m", {"tensors": ["w"], "from": "np"}],
              ["n", {"dict": [["w", 2]]}]]},
])
def test_plain_leaves_agree_with_unflatten_on_duplicate_keys(tree):
    """A crafted structure naming a key twice: the later node wins in
    plain_leaves (the plain values restore reports and fills) as in
    unflatten (the state load builds)."""
    built = nested.unflatten(tree, lambda name, origin, path: np.ones(1))
    want = {p: v for p, v in nested.leaves(built)
            if not isinstance(v, np.ndarray)}
    assert nested.plain_leaves(tree) == want


def _row_states(torch):
    """States whose dicts hold rows: an optimizer's and a state_dict's as
    torch makes them, and rows the quick route must hand on."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(),
                                torch.nn.Linear(2, 1))
    adam = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    adam.step()
    t = torch.ones(2)
    odd_rows = {
        "ok": {"a": t, "b": torch.nn.Parameter(torch.zeros(1))},
        "plain": {"lr": 0.5, "n": 3, "on": True, "off": None, "s": "x"},
        "big int": {"n": 2**70}, "nan": {"x": math.nan}, "inf": {"x": -math.inf},
        "nul": {"s": "a\0b"}, "accent": {"s": "\u00e9"}, "bytes": {"b": b"x"},
        "mixed": {"w": t, "n": 1}, "numpy": {"w": np.ones(2)},
        "int key": {0: t}, "accent key": {"\u00e9": t}, "nul key": {"a\0": 1},
        "nested": {"d": {"w": t}}, "ordered": collections.OrderedDict(w=t),
        "empty": {}, "enum": {"n": struct.calcsize.__class__},
        0: {"w": t}, 1: {"w": t},
        "ints": list(range(-3, 40)), "int tuple": (7, 2**63 - 1, -2**63),
        "huge ints": [1, 2**64], "bools": [1, True], "no ints": [],
    }
    del odd_rows["enum"]
    return [{"model": model.state_dict(), "optim": adam.state_dict(), "epoch": 2},
            odd_rows, {"rows": [odd_rows, {"x": odd_rows["ok"]}]}]


def _flat_view(flat):
    return (json.dumps(flat.tree), [(n, id(o), p) for n, o, p in flat.tensors],
            list(flat.plain.items()), flat.version)


def _count_quick(monkeypatch, name):
    """Wrap nested.<name>, a quick route that returns None to hand a value
    on, so that each call records whether it took the value."""
    taken = []
    real = getattr(nested, name)

    def counted(*args):
        out = real(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(nested, name, counted)
    return taken


def test_rows_take_the_quick_route_with_the_same_result(monkeypatch):
    """_encode_row (rows of tensors or plain scalars, by the thousand in
    an optimizer's state) and _encode_ints (lists of ints, its parameter
    indices) give the tree, tensors, paths, plain values and version of
    the general route, and hand everything else on to it."""
    torch = pytest.importorskip("torch")
    states = _row_states(torch)
    taken = _count_quick(monkeypatch, "_encode_row")
    quick = [_flat_view(nested.flatten(s)) for s in states]
    # the optimizer's rows, the module versions, "ok", "plain", 0 and 1
    # take it; the odd rows are handed on
    assert 12 <= sum(taken) < len(taken), (sum(taken), len(taken))
    monkeypatch.setattr(nested, "_encode_row", lambda *a: None)
    ints = _count_quick(monkeypatch, "_encode_ints")
    assert [_flat_view(nested.flatten(s)) for s in states] == quick
    # the optimizer's "params"; "ints" and "int tuple", twice (odd_rows
    # is in the last state as well)
    assert sum(ints) == 1 + 2 * 2 and len(ints) > sum(ints)
    monkeypatch.setattr(nested, "_encode_ints", lambda *a: None)
    general = [_flat_view(nested.flatten(s)) for s in states]
    assert quick == general


def test_rows_colliding_by_name_are_refused_by_the_general_route():
    """A row whose tensor names another path already took (a dotted key)
    is refused naming both paths, as it is without rows."""
    torch = pytest.importorskip("torch")
    state = {"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}
    with pytest.raises(libckpt.InvalidArgumentError,
                       match=r"state\['x'\]\['a.b'\] and state\['x'\]\['a'\]\['b'\] "
                       r"both flatten to the tensor name 'x.a.b'"):
        nested.flatten({"x": state})


def test_collisions_name_both_paths_in_either_order():
    """The path of the tensor that took a name first is named whether it
    came alone or from a dict of tensors, before or after the other."""
    torch = pytest.importorskip("torch")
    t = torch.ones(1)
    for state, first, second in [
            ({"p": [t], "x": {"a.b": t, "c": t}, "x.a": {"b": t}},
             "state['x']['a.b']", "state['x.a']['b']"),
            ({"x": {"c": t, "a": {"b": t, "z": t}}, "r": [t], "x.a": {"b": t}},
             "state['x']['a']['b']", "state['x.a']['b']"),
            ({"a": {"x": t, "b": t}, "a.b": t, "c": 1},
             "state['a']['b']", "state['a.b']"),
            ({"a.b": t, "a": {"b": t, "x": t}, "c": 1},
             "state['a.b']", "state['a']['b']")]:
        with pytest.raises(libckpt.InvalidArgumentError) as got:
            nested.flatten(state)
        assert "%s and %s both flatten" % (first, second) in str(got.value)


def test_json_depth_is_counted_without_recursion():
    """Containers of every kind count one level each; 100,000 levels take
    no recursion (the check runs before json.dumps)."""
    assert not nested.json_deeper_than(1, 0)
    assert not nested.json_deeper_than(deep(10, 1), 10)
    assert nested.json_deeper_than(deep(10, 1), 9)
    mixed = {"a": [1, (2, {"b": [3]})], "c": {}}  # dict, list, tuple, dict, list
    assert not nested.json_deeper_than(mixed, 5)
    assert nested.json_deeper_than(mixed, 4)
    assert nested.json_deeper_than(deep(100000, None), nested.JSON_MAX_DEPTH)

"""States of thousands of tensors through the binding's quick paths (torch
CPU tensors described in one loop, the whole state read by one
ckpt_checkpoint_restore, restore reading only the metadata back): every
byte, type, key and plain value comes back, and what they refuse is
refused as before, naming the tensor."""

import collections

import numpy as np
import pytest

import libckpt
from libckpt import nested
from libckpt import tensors as _tensors

torch = pytest.importorskip("torch")

N = 3000  # parameters: enough that a slip in any column shows


def big_state(seed=0):
    """A model of N parameters of several dtypes and shapes (0-d and empty
    included), an Adam-like state with a plain "step" for each, and plain
    values around them, as training saves it."""
    g = torch.Generator().manual_seed(seed)
    model = collections.OrderedDict()
    model._metadata = {"": {"version": 1}}
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float16,
              torch.bool, torch.uint8, torch.float64]
    for i in range(N):
        shape = [(), (0,), (3,), (2, 5), (1, 1, 4)][i % 5]
        t = torch.randn(shape, generator=g) * 100
        dt = dtypes[i % len(dtypes)]
        model["layer%d.p" % i] = t > 0 if dt == torch.bool else t.to(dt)
    optim = {"state": {i: {"step": i + 1, "exp_avg": torch.randn(2, generator=g)}
                       for i in range(0, N, 3)},
             "param_groups": [{"lr": 1e-3, "params": list(range(N))}]}
    return {"model": model, "optim": optim, "epoch": 4,
            "extra": (np.arange(5, dtype=np.int32), "note", None)}


def same(a, b, path="state"):
    """a == b bit for bit: types, keys in order, tensor dtypes and bytes."""
    assert type(a) is type(b), "%s: %s vs %s" % (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.reshape(-1).view(torch.uint8),
                           b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None)
        for k in a:
            same(a[k], b[k], "%s[%r]" % (path, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (path, i))
    else:
        assert a == b, path


def zeroed(state):
    """The same structure, every tensor a zeroed clone, plain values
    changed."""
    def leaf(x):
        if isinstance(x, torch.Tensor):
            return torch.zeros_like(x)
        if isinstance(x, np.ndarray):
            return np.zeros_like(x)
        return x
    out = nested.replace(state, {p: leaf(v) for p, v in nested.leaves(state)})
    out["epoch"] = 0
    return out


def test_many_tensors_load_bit_exactly_as_saved(store):
    state = big_state()
    store.save(1, state).wait()
    step, got = store.load(framework="auto")
    assert step == 1
    same(got, state)
    _, as_np = store.load(framework="np")  # NumPy arrays, same bytes
    assert as_np["model"]["layer2.p"].dtype == np.int64
    assert as_np["model"]["layer2.p"].tobytes() == \
        state["model"]["layer2.p"].numpy().tobytes()
    with store.open(framework="pt") as ck:  # the lazy path, part of it
        optim = ck.state("optim")
        same(optim, state["optim"])


def test_many_tensors_restore_in_place_bit_exactly(store):
    state = big_state()
    store.save(2, state).wait()
    mine = zeroed(state)
    r = store.restore(mine)
    assert r == 2 and r.missing_keys == [] and r.unexpected_keys == []
    same(mine["model"], state["model"])            # filled in place
    assert mine["epoch"] == 0 and r.state["epoch"] == 4
    same(r.state, state)
    assert r.state["model"] is mine["model"]       # nothing replaced there


def test_restore_names_what_the_step_has_beyond_a_strict_state(store):
    state = big_state()
    store.save(1, state).wait()
    mine = zeroed(state)
    del mine["optim"]["state"][3]
    del mine["model"]["layer7.p"]
    r = store.restore(mine)  # strict: every tensor of mine is in the step
    assert r.missing_keys == []
    assert r.unexpected_keys == ["model.layer7.p", "optim.state.3.exp_avg",
                                 "optim.state.3.step"]
    same(mine["model"]["layer8.p"], state["model"]["layer8.p"])


def test_restore_refuses_a_wrong_dtype_or_shape_naming_the_tensor(store):
    state = big_state()
    store.save(1, state).wait()
    mine = zeroed(state)
    mine["model"]["layer2000.p"] = torch.zeros(3, dtype=torch.float32)
    with pytest.raises(libckpt.MismatchError, match="model.layer2000.p"):
        store.restore(mine)
    mine = zeroed(state)
    mine["model"]["layer2001.p"] = torch.zeros(1, 3, dtype=torch.float16)
    with pytest.raises(libckpt.MismatchError, match="model.layer2001.p"):
        store.restore(mine)


def test_what_the_quick_description_skips_goes_the_general_way(store):
    state = {"w%d" % i: torch.ones(4) for i in range(100)}
    state["w50"] = torch.ones(4, 4)[:, ::2]  # through a copy, as alone
    store.save(1, state).wait()
    assert store.load(framework="pt")[1]["w50"].tolist() == [[1.0, 1.0]] * 4
    state["w50"] = torch.ones(4, 1).expand(4, 2)
    with pytest.raises(libckpt.InvalidArgumentError,
                       match="'w50' has elements that share memory"):
        store.restore(state)
    # a lazy conjugate view: its values are saved, as torch.save does, and
    # a restore into it writes values, not the bytes underneath
    base = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    state["w50"] = base.conj()
    store.save(2, state).wait()
    got = store.load(framework="pt")[1]["w50"]
    assert not got.is_conj() and got.tolist() == [1 - 2j, 3 + 4j]
    base.zero_()
    store.restore(state)
    assert base.tolist() == [1 + 2j, 3 - 4j] and state["w50"].is_conj()
    # and a lazy negative one (the imaginary part of a conjugate view)
    base2 = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    state["w50"] = base2.conj().imag
    store.save(3, state).wait()
    assert store.load(framework="pt")[1]["w50"].tolist() == [-2.0, 4.0]
    base2.imag.zero_()
    store.restore(state)
    assert base2.tolist() == [1 + 2j, 3 - 4j]
    state["w50"] = torch.ones(4).to_sparse()
    with pytest.raises(TypeError, match="'w50': layout"):
        store.save(1, state)


def test_a_tree_naming_a_tensor_twice_still_loads(store, monkeypatch):
    """One ckpt_checkpoint_restore refuses a name given twice: such a tree
    (not written by this binding) reads the tensor once, and both places
    hold it (test_nested: a forged tree naming one tensor many times)."""
    real = nested.wrap

    def twice(tree, metadata, version=1):
        pairs = tree["dict"]
        pairs.append(["again", pairs[0][1]])
        return real(tree, metadata, version)
    monkeypatch.setattr(nested, "wrap", twice)
    # one node per tensor, as version 1 writes (version 2 lists the keys)
    monkeypatch.setattr(nested, "_encode_tensor_dict", lambda *a: None)
    store.save(1, {"a": torch.arange(3), "b": torch.ones(2)}).wait()
    monkeypatch.undo()
    _, got = store.load(framework="pt")
    assert list(got) == ["a", "b", "again"]
    assert got["again"].tolist() == [0, 1, 2]
    assert got["again"] is got["a"]


def test_a_compact_node_naming_a_tensor_the_step_lacks_names_it(store,
                                                                 monkeypatch):
    """A whole-state read makes a compact node's tensors in one pass; a
    key the step has no tensor for (a tree not written by this binding)
    still fails as a read of that tensor does, naming it."""
    real = nested.wrap

    def extra(tree, metadata, version=1):
        tree["dict"][0][1]["tensors"].append("ghost")
        return real(tree, metadata, version)
    monkeypatch.setattr(nested, "wrap", extra)
    store.save(1, {"m": {"a": torch.arange(3), "b": torch.ones(2)}}).wait()
    monkeypatch.undo()
    with pytest.raises(libckpt.NotFoundError, match="'m.ghost'"):
        store.load(1)
    with store.open(1) as ck:  # the rest of the node reads
        assert ck.state("m", "a").tolist() == [0, 1, 2]


def test_replace_with_many_plain_values_replaces_exactly_those():
    state = {"optim": {"state": {i: {"step": 0, "m": i} for i in range(2000)}},
             "keep": {"x": 1}}
    values = {("optim", "state", i, "step"): i + 1 for i in range(0, 2000, 2)}
    out = nested.replace(state, values)
    assert out["keep"] is state["keep"]
    assert out["optim"]["state"][1] is state["optim"]["state"][1]
    assert [out["optim"]["state"][i]["step"] for i in range(4)] == [1, 0, 3, 0]
    assert state["optim"]["state"][0]["step"] == 0  # the input is untouched


def c_fields(arr, n):
    """Every field of the first n entries of a ckpt_tensor[], shapes read
    through their pointers."""
    return [(t.name, t.data or 0, t.bytes, t.dtype, t.ndim,
             [t.shape[d] for d in range(t.ndim)], t.memory)
            for t in arr[:n]]


def general_fields(pairs):
    """The same fields from describe(), one tensor at a time (the route
    every other input takes)."""
    described = [_tensors.describe(name, obj) for name, obj in pairs]
    arr, _ = _tensors.c_array(described)
    return c_fields(arr, len(described))


def columns(pairs):
    """prepare()'s two arguments: the names, then the tensors."""
    return [name for name, _ in pairs], [obj for _, obj in pairs]


def test_the_whole_state_route_describes_as_describe_does():
    """prepare() asks all tensors of an all-torch state at once; each
    field equals describe()'s: dtypes of every width, 0-d, empty and
    multi-dimensional shapes, Parameters, non-ASCII names."""
    g = torch.Generator().manual_seed(3)
    pairs = []
    for i, dt in enumerate([torch.float32, torch.bfloat16, torch.int64,
                            torch.float16, torch.bool, torch.uint8,
                            torch.float64, torch.complex64, torch.int8]):
        for j, shape in enumerate([(), (0,), (3,), (2, 5), (1, 0, 4),
                                   (2, 3, 1, 2)]):
            t = (torch.randn(shape, generator=g) * 9).to(dt)
            pairs.append(("layer%d.p%d" % (i, j), t))
    pairs.append(("w\u00e9ight.\u4e2d", torch.nn.Parameter(torch.ones(7))))
    assert _tensors._all_plain_torch(
        *columns(pairs), _tensors._fast_torch(torch), torch.Tensor) is not None
    arr, keep, stream, device = _tensors.prepare(*columns(pairs))
    assert stream is None and device is False
    assert c_fields(arr, len(pairs)) == general_fields(pairs)
    assert all(any(k is t for k in keep) for _, t in pairs)


@pytest.mark.parametrize("odd", ["sliced", "negative", "conjugate",
                                 "numpy", "int name"])
def test_one_odd_value_sends_the_state_the_general_way(odd):
    """One value the whole-state route cannot take: it declines (None),
    and prepare() still describes every other tensor, or refuses the odd
    one by name as describe() does."""
    pairs = [("w%d" % i, torch.full((3,), float(i))) for i in range(50)]
    value = {"sliced": torch.ones(4, 4)[:, ::2],
             "negative": torch.ones(3, dtype=torch.complex64).conj().imag,
             "conjugate": torch.ones(3, dtype=torch.complex64).conj(),
             "numpy": np.arange(3.0), "int name": torch.ones(2)}[odd]
    pairs.insert(20, (7 if odd == "int name" else "odd", value))
    fast = _tensors._fast_torch(torch)
    assert _tensors._all_plain_torch(*columns(pairs), fast, torch.Tensor) is None
    if odd != "int name":  # a slice or a lazy view: through its own copy
        arr, keep, _, _ = _tensors.prepare(*columns(pairs))
        got, want = c_fields(arr, len(pairs)), general_fields(pairs)
        if odd != "numpy":
            copy = keep[3 + 20].buffer  # [array, names, shapes] + owners
            assert got[20][1] == copy.data_ptr() != value.data_ptr()
            got[20], want[20] = got[20][:1] + got[20][2:], want[20][:1] + want[20][2:]
        assert got == want
        return
    with pytest.raises((libckpt.InvalidArgumentError, TypeError)) as got:
        _tensors.prepare(*columns(pairs))
    with pytest.raises(type(got.value)) as want:
        general_fields(pairs)
    assert str(got.value) == str(want.value)

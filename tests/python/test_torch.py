"""PyTorch tensors: every dtype (bfloat16 and bool included), state_dict
round trips, and CUDA tensors where a device exists."""

import enum

import numpy as np
import pytest

import libckpt
from libckpt import tensors as _tensors

torch = pytest.importorskip("torch")

TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16,
                torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64, torch.complex64,
                torch.complex128]


def sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point and not dtype.is_complex:
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, generator=g,
                             dtype=dtype)
    return torch.randn(shape, generator=g, dtype=dtype)


def as_torch(a, dtype):
    """A loaded NumPy array as a torch tensor of `dtype`."""
    # bfloat16 as its bits (no ml_dtypes) or as ml_dtypes.bfloat16, which
    # torch.from_numpy does not take; older torch has no uint16 either
    if a.dtype == np.uint16 or a.dtype.name == "bfloat16":
        a = a.view(np.int16)
    t = torch.from_numpy(a)
    return t.view(dtype) if t.dtype != dtype else t


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_dtype_round_trips(store, dtype):
    t = sample(dtype, (4, 6))
    store.save(1, {"t": t}).wait()
    _, got = store.load(framework="np")
    assert got["t"].shape == (4, 6)
    assert torch.equal(as_torch(got["t"], dtype), t)
    back = torch.zeros_like(t)
    assert store.restore({"t": back}) == 1
    assert torch.equal(back, t)


def test_bfloat16_loads_as_documented(store):
    t = torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16)
    store.save(1, {"t": t}).wait()
    a = store.load(framework="np")[1]["t"]
    if _tensors.ml_dtypes is None:
        assert a.dtype == np.uint16  # the bit patterns
        assert np.array_equal(a, t.view(torch.int16).numpy().view(np.uint16))
    else:
        assert a.dtype.name == "bfloat16"
        assert np.array_equal(a.astype(np.float32), t.float().numpy())
    # A uint16 buffer is not a bfloat16 one: restore checks dtypes.
    with pytest.raises(libckpt.MismatchError):
        store.restore({"t": np.zeros(3, np.uint16)})


def test_bool_is_one_byte_per_element(store):
    t = torch.tensor([True, False, True])
    h = store.save(1, {"t": t})
    h.wait()
    assert h.stats["raw_bytes"] == 3
    a = store.load(framework="np")[1]["t"]
    assert a.dtype == np.bool_ and a.tolist() == [True, False, True]


def test_zero_d_and_empty_tensors(store):
    ts = {"s": torch.tensor(2.5), "i": torch.tensor(7),
          "e": torch.zeros(0), "e2": torch.zeros(2, 0, dtype=torch.int16)}
    store.save(1, ts).wait()
    _, got = store.load(framework="np")
    for k, t in ts.items():
        assert tuple(got[k].shape) == tuple(t.shape)
        assert torch.equal(torch.from_numpy(got[k]), t)
    out = {k: torch.ones_like(t) for k, t in ts.items()}
    store.restore(out)
    for k in ts:
        assert torch.equal(out[k], ts[k])


def test_slices_with_gaps_and_expanded_views_are_saved_and_restored(store):
    """A slice with gaps and an expanded (stride 0) view are saved as their
    .contiguous() would be, as torch.save would take them; a restore writes
    into a slice, leaving the gaps alone, and refuses an expanded view (one
    element is several), naming it, before reading anything."""
    base = torch.arange(12.0).reshape(3, 4)
    wide = torch.tensor([[1.0], [2.0], [3.0]]).expand(3, 4)
    state = {"gaps": base[:, ::2], "wide": wide, "step": base[::2, 1:3]}
    store.save(1, state).wait()
    got = store.load(framework="pt")[1]
    for k, v in state.items():
        assert got[k].is_contiguous() and torch.equal(got[k], v), k

    holes = torch.full((3, 4), -1.0)
    into = {"gaps": holes[:, ::2], "wide": torch.zeros(3, 4),
            "step": torch.zeros(5, 6)[::4, 1:5:2]}
    assert int(store.restore(into)) == 1
    assert torch.equal(into["gaps"], base[:, ::2])
    assert holes[:, 1::2].eq(-1).all(), "the gaps were written"
    assert torch.equal(into["step"], base[::2, 1:3])
    assert torch.equal(into["wide"], wide)

    with pytest.raises(libckpt.InvalidArgumentError,
                       match="'wide' has elements that share memory"):
        store.restore({"wide": torch.zeros(3, 1).expand(3, 4)})



def test_an_inference_tensor_not_row_major_is_named_before_anything_is_written(store):
    """A transposed tensor made under torch.inference_mode() can be
    written only inside it (the row-major copy's copy_ fails outside): a
    restore outside says so, naming it, before writing any tensor; inside
    inference_mode the same restore fills both."""
    saved = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(6.0).reshape(3, 2)}
    store.save(1, saved).wait()
    with torch.inference_mode():
        a, b = torch.zeros(2, 3), torch.zeros(2, 3).t()
    with pytest.raises(libckpt.InvalidArgumentError, match="'b' is an inference tensor"):
        store.restore({"a": a, "b": b})
    assert a.eq(0).all() and b.eq(0).all(), "written before the refusal"
    with torch.inference_mode():
        store.restore({"a": a, "b": b})
    assert torch.equal(a, saved["a"]) and torch.equal(b, saved["b"])

def test_dense_tensors_in_another_order_go_through_a_row_major_copy(store):
    """A transpose and a channels_last convolution (its weights and their
    optimizer state are channels_last too) are stored row-major, as their
    .contiguous() would be; restore in place fills them, keeping their
    layout, and a fresh model loads them."""
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 4, 3)).to(
            memory_format=torch.channels_last)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)).sum().backward()
    opt.step()
    t = torch.arange(12.0).reshape(3, 4).t()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "t": t}
    assert not state["model"]["0.weight"].is_contiguous()
    assert not state["optim"]["state"][0]["momentum_buffer"].is_contiguous()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    store.save(1, state).wait()
    with store.open(1, framework="np") as ck:  # stored row-major
        assert ck.get_tensor("t").tolist() == t.tolist()
        assert ck.get_tensor("model.0.weight").tobytes() == \
            want["0.weight"].contiguous().numpy().tobytes()

    other = make()  # restore in place: values in, layout kept
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other(torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)).sum().backward()
    other_opt.step()
    into = {"model": other.state_dict(), "optim": other_opt.state_dict(),
            "t": torch.zeros(3, 4).t()}
    assert int(store.restore(into)) == 1
    for k, v in other.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert other.state_dict()["0.weight"].is_contiguous(
        memory_format=torch.channels_last)
    assert torch.equal(into["t"], t)
    mom = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(other_opt.state_dict()["state"][0]["momentum_buffer"], mom)

    fresh = make()
    fresh.load_state_dict(store.load(framework="pt")[1]["model"])
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, want[k]), k

    leaves = make()  # into the Parameters themselves: leaves needing grad
    store.restore({"model": leaves.state_dict(keep_vars=True)})
    for k, v in leaves.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert leaves[0].weight.requires_grad and leaves[0].weight.grad_fn is None

    extra = torch.arange(6.0).reshape(2, 3).t()  # not in the step
    got = store.restore({"model": make().state_dict(), "extra": extra},
                        strict=False)
    assert got.missing_keys == ["extra"]
    assert extra.tolist() == torch.arange(6.0).reshape(2, 3).t().tolist()


def test_model_and_optimizer_state_round_trip(store):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    state = {"model/" + k: v for k, v in model.state_dict().items()}
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            state["opt/%d/%s" % (pid, k)] = v
    # Parameters require grad; their memory is saved all the same.
    state["param0"] = next(model.parameters())
    store.save(3, state, metadata={"lr": 1e-2}).wait()

    _, got = store.load(framework="np")
    assert sorted(got) == sorted(state)
    for k, v in state.items():
        assert torch.equal(torch.from_numpy(got[k]), v.detach()), k

    fresh = {k: torch.zeros_like(v).detach() for k, v in state.items()}
    assert store.restore(fresh) == 3
    for k, v in state.items():
        assert torch.equal(fresh[k], v.detach()), k


def test_restore_into_parameters_in_place(store):
    lin = torch.nn.Linear(3, 3)
    saved = {k: v.clone() for k, v in lin.state_dict().items()}
    store.save(1, lin.state_dict()).wait()
    with torch.no_grad():
        for p in lin.parameters():
            p.zero_()
    store.restore(lin.state_dict())
    for k, v in lin.state_dict().items():
        assert torch.equal(v, saved[k])


def test_tied_weights_restore_from_the_newest_step(store):
    """A model whose output layer shares its embedding's weight lists one
    tensor under two names.  Restoring into it takes the newest step
    (before, two workers wrote and hashed the one buffer at once, which
    read as damage and fell back to an older step) and fills it from the
    last name, as load_state_dict would."""
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(512, 256)
            self.out = torch.nn.Linear(256, 512, bias=False)
            self.out.weight = self.emb.weight

    torch.manual_seed(0)
    m = Tied()
    assert m.state_dict()["emb.weight"].data_ptr() == \
        m.state_dict()["out.weight"].data_ptr()
    store.save(1, m.state_dict()).wait()
    with torch.no_grad():
        m.emb.weight.copy_(torch.randn(512, 256))  # random: stored raw
    want = m.emb.weight.detach().clone()
    store.save(2, m.state_dict()).wait()
    with torch.no_grad():
        m.emb.weight.zero_()
    for _ in range(3):
        r = store.restore(m.state_dict())
        assert int(r) == 2 and not r.skipped
        assert torch.equal(m.emb.weight, want)
    # two distinct tensors saved, restored into one buffer: the last wins
    a, b = torch.randn(1000), torch.randn(1000)
    store.save(3, {"a": a, "b": b}).wait()
    w = torch.zeros(1000)
    r = store.restore({"a": w, "b": w})
    assert int(r) == 3 and not r.skipped and torch.equal(w, b)
    # overlapping otherwise: refused by name before anything is written
    big = torch.zeros(1500)
    with pytest.raises(libckpt.InvalidArgumentError,
                       match="'a' and 'b' overlap in memory"):
        store.restore({"a": big[:1000], "b": big[500:]}, step=3)
    assert not big.any()


def test_mixed_numpy_and_torch(store):
    store.save(1, {"np": np.arange(4), "pt": torch.arange(4)}).wait()
    _, got = store.load(framework="np")
    assert np.array_equal(got["np"], got["pt"])


class Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


def test_str_enum_values_and_keys_of_torch_tensors_are_their_values(store):
    """A (str, Enum) member is saved as its value ("train"), not as str()
    of it ("Mode.TRAIN"), as a plain value and as the key of a torch
    tensor (named heads.train), and restored into by that name."""
    state = {"mode": Mode.TRAIN, Mode.EVAL: 1,
             "heads": {Mode.TRAIN: torch.ones(2), Mode.EVAL: torch.arange(3)}}
    store.save(1, state).wait()
    got = store.load().state
    assert got["mode"] == "train" and type(got["mode"]) is str
    assert list(got) == ["mode", "eval", "heads"] and got["eval"] == 1
    assert list(got["heads"]) == ["train", "eval"]
    assert all(type(k) is str for k in got["heads"])
    assert torch.equal(got["heads"]["train"], torch.ones(2))
    assert torch.equal(got["heads"]["eval"], torch.arange(3))
    with store.open(1) as ck:
        assert sorted(ck.keys()) == ["heads.eval", "heads.train"]
    into = {"mode": Mode.EVAL, Mode.EVAL: 2,
            "heads": {Mode.TRAIN: torch.zeros(2),
                      Mode.EVAL: torch.zeros(3, dtype=torch.int64)}}
    result = store.restore(into)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(into["heads"][Mode.TRAIN], torch.ones(2))
    assert torch.equal(into["heads"][Mode.EVAL], torch.arange(3))
    assert result.state["mode"] == "train" and result.state[Mode.EVAL] == 1


cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and libckpt.cuda_available()),
    reason="needs a CUDA device, a CUDA build of torch and libckpt's CUDA "
           "support")


@cuda
def test_cuda_tensors_round_trip(store):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(1 << 20, device="cuda", generator=g)
    b = torch.ones(7, dtype=torch.bfloat16, device="cuda")
    want_w, want_b = w.cpu(), b.cpu()
    h = store.save(1, {"w": w, "b": b})
    w.mul_(-1)  # enqueued after the fence: cannot reach the snapshot
    h.wait()
    _, got = store.load(framework="np")
    assert torch.equal(torch.from_numpy(got["w"]), want_w)
    assert torch.equal(as_torch(got["b"], torch.bfloat16), want_b)
    store.restore({"w": w, "b": b})
    torch.cuda.current_stream().synchronize()
    assert torch.equal(w.cpu(), want_w) and torch.equal(b.cpu(), want_b)


@cuda
def test_cuda_tensor_on_a_side_stream(store):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.arange(1 << 16, device="cuda", dtype=torch.float32) * 2
        h = store.save(1, {"x": x})  # ordered after the fill on stream s
        x.zero_()
    h.wait()
    assert np.array_equal(store.load(framework="np")[1]["x"],
                          np.arange(1 << 16, dtype=np.float32) * 2)


@cuda
def test_cuda_array_interface_objects(store):
    x = torch.arange(100, device="cuda", dtype=torch.int32)

    class Exposed:
        __cuda_array_interface__ = x.__cuda_array_interface__

    store.save(1, {"x": Exposed()}).wait()
    assert np.array_equal(store.load(framework="np")[1]["x"], np.arange(100, dtype=np.int32))


class _Wrapper(torch.Tensor):
    """A wrapper subclass, as DTensor and fake tensors are: it describes a
    tensor (shape, dtype, device) whose data lives elsewhere."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            return x.inner if isinstance(x, _Wrapper) else x
        return func(*[unwrap(a) for a in args], **(kwargs or {}))


def test_a_tensor_without_storage_of_its_own_is_refused_by_name(store):
    """Such a tensor's data pointer is NULL: save and restore name it and
    say what to save instead, and nothing is written."""
    w = _Wrapper(torch.arange(6.0))
    assert w.data_ptr() == 0 and w.numel() == 6
    for state in ({"w": w}, {"m": {"a": torch.ones(2), "w": w}}):
        with pytest.raises(TypeError, match=r"'(m\.)?w' .*_Wrapper\) has no "
                           r"storage of its own.*to_local\(\)"):
            store.save(1, state)
    assert store.steps() == []
    store.save(1, {"w": torch.zeros(6)}).wait()
    with pytest.raises(TypeError, match="has no storage of its own"):
        store.restore({"w": w})


@pytest.mark.filterwarnings("ignore:Lazy modules are a new feature")
def test_an_uninitialized_lazy_parameter_is_refused_by_name(store):
    """A lazy module before its first forward pass: torch's own error (from
    is_contiguous) named no key; the refusal names it and says what to do."""
    model = torch.nn.Sequential(torch.nn.LazyLinear(4))
    with pytest.raises(TypeError, match=r"'0\.weight' is an uninitialized "
                       r"parameter.*first forward pass"):
        store.save(1, model.state_dict())
    assert store.steps() == []
    model(torch.ones(2, 3))  # now it has a shape
    store.save(1, model.state_dict()).wait()
    assert store.restore(model.state_dict()) == 1


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.skipif(not hasattr(torch, "nested"), reason="needs torch.nested")
@pytest.mark.parametrize("others", [{}, {"a": torch.ones(2)},
                                    {"a": np.ones(2)}])
def test_a_nested_tensor_is_refused_by_name(store, others):
    """torch.nested tensors have no one shape: torch's own error ("Internal
    error: NestedTensorImpl doesn't support sizes") named no key, on the
    fast path of all-torch states and on the general one alike."""
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    state = dict(others, x=nt)
    for call in (lambda: store.save(1, state), lambda: store.restore(state)):
        with pytest.raises(TypeError, match=r"'x' is a nested tensor.*unbind"):
            call()
    assert store.steps() == []
    store.save(1, dict(others, x=list(nt.unbind()))).wait()
    assert store.load(framework="pt")[1]["x"][1].tolist() == [1.0] * 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_loading_to_a_device_torch_lacks_fails_before_reading(store):
    """torch's bare AssertionError ("Torch not compiled with CUDA enabled")
    came after the whole checkpoint was read; now a NoDeviceError first."""
    store.save(1, {"w": torch.ones(3)}).wait()
    with pytest.raises(libckpt.NoDeviceError, match="device='cuda'.*host"):
        store.load(device="cuda")
    with pytest.raises(libckpt.NoDeviceError):
        store.open(device="cuda")
    assert torch.equal(store.load(device="cpu")[1]["w"], torch.ones(3))

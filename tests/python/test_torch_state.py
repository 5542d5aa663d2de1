"""PyTorch training state in one call: model + Adam + StepLR saved nested,
brought back through load(framework="pt"), restore() and open(), and
training continues bit for bit; torch tensors come back as torch (bf16
included), on the device asked for."""

import collections

import numpy as np
import pytest

import libckpt

torch = pytest.importorskip("torch")


def make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, steps):
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 6)  # from the global RNG: restored too
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def full_state(model, opt, sched, epoch=3):
    return {"model": model.state_dict(), "optim": opt.state_dict(),
            "sched": sched.state_dict(), "epoch": epoch,
            "rng": torch.get_rng_state(), "note": None}


def assert_same_training(a, b, rng_a, rng_b):
    """Two (model, opt, sched), each starting from its RNG state, go on
    identically for 3 steps."""
    torch.set_rng_state(rng_a)
    la = train(*a, 3)
    torch.set_rng_state(rng_b)
    lb = train(*b, 3)
    assert la == lb
    for (ka, va), (kb, vb) in zip(a[0].state_dict().items(),
                                  b[0].state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    sa, sb = a[1].state_dict()["state"], b[1].state_dict()["state"]
    assert sorted(sa) == sorted(sb)
    for k in sa:
        for name in sa[k]:
            assert torch.equal(sa[k][name], sb[k][name]), (k, name)
    assert a[2].get_last_lr() == b[2].get_last_lr()


@pytest.fixture
def trained(store):
    """A trained (model, opt, sched) saved as step 3, and the RNG state it
    goes on from."""
    old = make()
    train(*old, 3)  # lr decayed once, Adam state populated
    store.save(3, full_state(*old)).wait()
    return old, torch.get_rng_state()


def test_load_into_fresh_objects_continues_bit_exactly(store, trained):
    step, state = store.load(framework="pt")
    assert step == 3 and state["epoch"] == 3 and state["note"] is None
    assert type(state["model"]) is collections.OrderedDict
    assert all(type(k) is int for k in state["optim"]["state"])
    assert state["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert all(isinstance(v, torch.Tensor) for v in state["model"].values())
    fresh = make(seed=1)
    fresh[0].load_state_dict(state["model"])   # strict: every key matches
    fresh[1].load_state_dict(state["optim"])
    fresh[2].load_state_dict(state["sched"])
    old, rng = trained
    assert_same_training(old, fresh, rng, state["rng"])


def test_restore_in_place_and_open_for_the_optimizer(store, trained):
    fresh = make(seed=1)
    r = store.restore({"model": fresh[0].state_dict(), "epoch": 0})
    assert r == 3 and r.state["epoch"] == 3
    assert any(k.startswith("optim.") for k in r.unexpected_keys)
    with store.open(framework="pt") as ck:
        fresh[1].load_state_dict(ck.state("optim"))
        fresh[2].load_state_dict(ck.state("sched"))
        rng = ck.get_tensor("rng")
    assert_same_training(trained[0], fresh, trained[1], rng)


def test_model_metadata_of_state_dict_is_kept(store):
    model = make()[0]
    store.save(1, {"model": model.state_dict()}).wait()
    got = store.load(framework="pt")[1]["model"]
    assert got._metadata == model.state_dict()._metadata
    assert got._metadata["1"] == {"version": 2}  # BatchNorm's version


def test_bfloat16_comes_back_as_torch_bfloat16(store):
    t = torch.tensor([1.0, -2.5, 3.140625, float("inf")], dtype=torch.bfloat16)
    store.save(1, {"t": t, "n": np.arange(3, dtype=np.int32)}).wait()
    pt = store.load(framework="pt")[1]
    assert pt["t"].dtype == torch.bfloat16 and torch.equal(pt["t"], t)
    assert pt["n"].dtype == torch.int32        # NumPy saved, torch asked for
    auto = store.load(framework="auto")[1]
    assert auto["t"].dtype == torch.bfloat16   # saved from torch
    assert isinstance(auto["n"], np.ndarray)   # saved from NumPy
    assert isinstance(store.load()[1]["t"], np.ndarray)  # default "np"


def test_every_torch_dtype_and_shape_comes_back_as_torch(store):
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.float16, torch.bfloat16, torch.float32,
              torch.float64, torch.complex64, torch.complex128]
    state = {str(d): torch.arange(6).reshape(2, 3).to(d) for d in dtypes}
    state.update(scalar=torch.tensor(2.5), empty=torch.zeros(2, 0))
    store.save(1, state).wait()
    got = store.load(framework="pt")[1]
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_device_moves_torch_tensors(store):
    store.save(1, {"w": torch.arange(4.0)}).wait()
    got = store.load(framework="pt", device=torch.device("cpu"))[1]["w"]
    assert got.device.type == "cpu" and torch.equal(got, torch.arange(4.0))
    with pytest.raises(ValueError, match="framework='pt'"):
        store.load(device="cuda:0")  # NumPy arrays live on the host
    with pytest.raises(ValueError, match="framework must be one of"):
        store.load(framework="torch")


@pytest.mark.skipif(hasattr(torch, "uint16"), reason="this torch has uint16")
def test_a_dtype_torch_lacks_is_a_clear_error(store):
    store.save(1, {"u": np.arange(3, dtype=np.uint16)}).wait()
    with pytest.raises(TypeError, match="framework='np' or 'auto'"):
        store.load(framework="pt")
    assert store.load(framework="auto")[1]["u"].dtype == np.uint16


cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and libckpt.cuda_available()),
    reason="needs a CUDA device, a CUDA build of torch and libckpt's CUDA "
           "support")


@cuda
def test_cuda_state_round_trips_onto_the_device(store):
    model = make()[0].cuda()
    state = {"model": model.state_dict(), "step": 1}
    store.save(1, state).wait()
    got = store.load(framework="pt", device="cuda:0")[1]
    for k, v in model.state_dict().items():
        assert got["model"][k].device == v.device and torch.equal(
            got["model"][k], v), k
    target = {"model": {k: torch.zeros_like(v)
                        for k, v in model.state_dict().items()}}
    store.restore(target)
    torch.cuda.synchronize()
    for k, v in model.state_dict().items():
        assert torch.equal(target["model"][k], v), k


def test_a_transformer_with_onecycle_and_every_rng_resumes_bit_exactly(store):
    """What a training script saves beside the model: AdamW, a OneCycleLR
    (whose state_dict holds a bound method before torch 2.2: refused by
    name, so it is left out), and the Python, NumPy and torch generators
    (NumPy's is a uint32 array, so framework="auto" gives it back as
    NumPy).  Killed at step 5 of 10 and resumed in fresh objects, training
    ends on the very same weights."""
    import random

    def build():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 2),
                                    torch.nn.Flatten(), torch.nn.Linear(48, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2,
                                                    total_steps=20)
        return model, opt, sched

    def train(model, opt, sched):  # dropout, data and noise all drawn
        x = torch.randn(4, 3, 16) * (1 + random.random() + np.random.rand())
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 4, (4,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()

    def state(model, opt, sched, step):
        sd = sched.state_dict()
        if any(callable(v) for v in sd.values()):
            with pytest.raises(TypeError, match="stores no code"):
                store.save(step, {"sched": sd})
        return {"model": model.state_dict(), "optim": opt.state_dict(),
                "sched": {k: v for k, v in sd.items() if not callable(v)},
                "rng": {"torch": torch.get_rng_state(), "py": random.getstate(),
                        "np": np.random.get_state()}, "step": step}

    random.seed(1)
    np.random.seed(1)
    model, opt, sched = build()
    for step in range(1, 11):
        train(model, opt, sched)
        if step == 5:
            store.save(step, state(model, opt, sched, step)).wait()
    want = [p.detach().clone() for p in model.parameters()]

    random.seed(2)  # a new process: other generator states, fresh objects
    np.random.seed(2)
    model, opt, sched = build()
    step, got = store.load(framework="auto")
    model.load_state_dict(got["model"])
    opt.load_state_dict(got["optim"])
    sched.load_state_dict(got["sched"])
    torch.set_rng_state(got["rng"]["torch"])
    random.setstate(got["rng"]["py"])
    np.random.set_state(got["rng"]["np"])
    assert step == got["step"] == 5
    for _ in range(step + 1, 11):
        train(model, opt, sched)
    for a, b in zip(want, model.parameters()):
        assert torch.equal(a, b.detach())


def test_a_module_or_optimizer_itself_is_refused_naming_state_dict(store):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for obj, kind in ((model, "Linear"), (opt, "SGD")):
        with pytest.raises(TypeError, match=r"state\['x'\]: cannot save a %s "
                           r"itself; save its state_dict\(\)" % kind):
            store.save(1, {"x": obj})
    assert store.latest() is None

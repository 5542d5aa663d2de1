"""PyTorch training state in one call: model + Adam + StepLR saved nested,
brought back through load() (torch tensors by default), restore() and
open(), and
training continues bit for bit; torch tensors come back as torch (bf16
included), on the device asked for."""

import collections
import warnings

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
    default = store.load()[1]                  # default "auto"
    assert default["t"].dtype == torch.bfloat16 and torch.equal(default["t"], t)
    assert isinstance(default["n"], np.ndarray)
    as_np = store.load(framework="np")[1]
    assert isinstance(as_np["t"], np.ndarray) and as_np["t"].itemsize == 2


def _python_child(code, *args):
    """The output of `code` run by this Python in a child process with
    `args` (which must succeed): a program that may lack torch."""
    import subprocess
    import sys
    from conftest import sub_env
    out = subprocess.run([sys.executable, "-c", code, *args],
                         env=sub_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def test_resharded_load_of_bfloat16_into_numpy(store, tmp_path):
    """load_resharded with framework="np", and with the default where
    torch cannot be imported, gives a bfloat16 tensor as its bit pattern,
    as Store.load does (it refused it as "holds bfloat16, the buffer is
    uint16")."""
    from libckpt.dist import load_resharded
    t = torch.tensor([1.0, -2.5, 3.140625, float("inf")], dtype=torch.bfloat16)
    store.save(1, {"t": t, "f": torch.arange(3.0)}).wait()
    bits = t.view(torch.int16).numpy().view(np.uint16)
    step, got = load_resharded(store, ["t", "f"], framework="np")
    assert step == 1 and got["t"].dtype == np.uint16
    assert np.array_equal(got["t"], bits)
    assert np.array_equal(got["f"], np.arange(3.0, dtype=np.float32))
    step, got = load_resharded(store, lambda n: n == "t")  # "auto": torch
    assert got["t"].dtype == torch.bfloat16 and torch.equal(got["t"], t)
    path = store.path
    store.close()
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import libckpt\n"
        "from libckpt.dist import load_resharded\n"
        "s = libckpt.Store(sys.argv[1], readonly=True)\n"
        "step, st = load_resharded(s, ['t'])\n"
        "print(step, st['t'].dtype, st['t'].tolist())\n")
    out = _python_child(code, path)
    assert out.stdout.strip() == "1 uint16 %s" % bits.tolist()


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
        store.load(framework="np", device="cuda:0")  # arrays live on the host
    for cpu in ("cpu", "cpu:0", torch.device("cpu")):  # the host, however named
        assert np.array_equal(store.load(framework="np", device=cpu)[1]["w"],
                              np.arange(4.0))
    with pytest.raises(ValueError, match="framework must be one of"):
        store.load(framework="torch")


def test_default_load_gives_torch_tensors_a_model_takes(store, trained):
    """The default framework ("auto"): a torch state comes back as torch
    tensors, so load_state_dict takes it as torch.load's result would be
    taken; open() and load_resharded() default the same way."""
    (old, _), state = trained, store.load()[1]
    assert all(isinstance(v, torch.Tensor) for v in state["model"].values())
    fresh = make(seed=1)
    fresh[0].load_state_dict(state["model"])
    fresh[1].load_state_dict(state["optim"])
    for a, b in zip(old[0].state_dict().values(), fresh[0].state_dict().values()):
        assert torch.equal(a, b)
    with store.open() as ck:
        assert isinstance(ck.get_tensor("model.0.weight"), torch.Tensor)
    from libckpt.dist import load_resharded
    _, part = load_resharded(store, ["model.0.weight"])
    assert torch.equal(part["model.0.weight"], old[0].state_dict()["0.weight"])


def test_default_load_without_torch_gives_numpy(store, tmp_path):
    """Where torch cannot be imported, the default gives every tensor as
    a NumPy array of the same bytes (inspecting a torch checkpoint in an
    environment without torch); asking for "pt" fails naming torch."""
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    store.save(1, {"w": t, "n": 3}).wait()
    path = store.path
    store.close()
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import libckpt, numpy as np\n"
        "s = libckpt.Store(sys.argv[1], readonly=True)\n"
        "step, st = s.load()\n"
        "assert isinstance(st['w'], np.ndarray), type(st['w'])\n"
        "print(step, st['n'], st['w'].dtype, st['w'].tolist())\n"
        "try:\n"
        "    s.load(framework='pt')\n"
        "except ImportError as e:\n"
        "    print('pt: ImportError', 'torch' in str(e))\n")
    out = _python_child(code, path)
    assert out.stdout.splitlines() == [
        "1 3 float32 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]", "pt: ImportError True"]


def test_loading_numpy_state_does_not_import_torch(tmp_path):
    """A NumPy program reading its own checkpoints does not import torch
    because it is installed: seconds per process, and a CUDA build of torch
    brings its CUDA runtime into the process, which libckpt would then take
    before CKPT_CUDART_LIBRARY (docs/CUDA.md)."""
    code = (
        "import sys, numpy as np, libckpt\n"
        "s = libckpt.Store(sys.argv[1])\n"
        "s.save(1, {'w': np.arange(6, dtype=np.float32), 'opt': {'lr': 0.1}}).wait()\n"
        "step, st = s.load()\n"
        "w = s.open(1).get_tensor('w')\n"
        "s.close()\n"
        "print(step, st['w'].tolist(), st['opt']['lr'], w.dtype, 'torch' in sys.modules)\n")
    out = _python_child(code, str(tmp_path / "ck"))
    assert out.stdout.split() == ["1", "[0.0,", "1.0,", "2.0,", "3.0,", "4.0,", "5.0]",
                                  "0.1", "float32", "False"]


def test_auto_gives_numpy_for_a_torch_dtype_this_torch_lacks(store, monkeypatch):
    """A tensor saved from a newer torch in a dtype this torch lacks
    (uint16 from torch 2.3 read by 2.2) comes back under "auto" as a NumPy
    array of its bytes, not as the TypeError "pt" gives. Simulated by
    hiding float16 from the binding's dtype table."""
    t = torch.tensor([1.5, -2.0], dtype=torch.float16)
    store.save(1, {"h": t, "f": torch.ones(2)}).wait()
    import libckpt.tensors as tensors
    real = tensors.torch_dtype
    f16 = libckpt.ffi.lib.ckpt_dtype_from_name(b"float16")
    monkeypatch.setattr(tensors, "torch_dtype",
                        lambda code, th: None if code == f16 else real(code, th))
    got = store.load()[1]
    assert isinstance(got["h"], np.ndarray) and got["h"].dtype == np.float16
    assert got["h"].tolist() == [1.5, -2.0]
    assert isinstance(got["f"], torch.Tensor)
    with pytest.raises(TypeError, match="has no float16 dtype"):
        store.load(framework="pt")


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
    (whose state_dict holds its bound annealing method before torch 2.2:
    left out, as torch 2.2 leaves it out, load_state_dict keeping the new
    scheduler's own), and the Python, NumPy and torch generators
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
        return {"model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(),
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
    assert not any(callable(v) for v in got["sched"].values())
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


def test_scheduler_methods_are_left_out_and_other_code_refused(store):
    """A scheduler's own methods in its state_dict (torch < 2.2: OneCycleLR's
    annealing method, CyclicLR's WeakMethod) are left out; a restore into
    a state holding them leaves them be; any other callable is refused by
    name (a checkpoint stores no code)."""
    import weakref
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    sd = dict(sched.state_dict(), fn=sched.get_lr,
              ref=weakref.WeakMethod(sched.get_last_lr))
    store.save(1, {"sched": sd, "w": torch.ones(2)}).wait()
    got = store.load()[1]["sched"]
    assert "fn" not in got and "ref" not in got
    assert got == {k: v for k, v in sd.items() if k not in ("fn", "ref")}
    r = store.restore({"sched": sd, "w": torch.zeros(2)})
    assert r.step == 1
    for bad in (lambda: 0, len, opt.step):  # not a scheduler's method
        with pytest.raises(TypeError, match="stores no code"):
            store.save(2, {"sched": dict(sd, fn=bad)})
    assert store.latest() == 1


def test_a_module_or_optimizer_itself_is_refused_naming_state_dict(store):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for obj, kind in ((model, "Linear"), (opt, "SGD")):
        with pytest.raises(TypeError, match=r"state\['x'\]: cannot save a %s "
                           r"itself; save its state_dict\(\)" % kind):
            store.save(1, {"x": obj})
    assert store.latest() is None


def test_torch_dtypes_and_devices_are_plain_values(store):
    """torch.dtype, torch.device and torch.Size values (a mixed-precision
    setting, where a state was trained, a recorded shape) save as plain
    values, as torch.save keeps them, and come back as the same objects
    (a torch.Size, not a tuple) from load, restore and open;
    the structure is written as version 3 only when it holds one, so an
    older binding still reads every other checkpoint."""
    cfg = {"amp": torch.bfloat16, "param": torch.float32, "on": torch.device("cpu"),
           "ran_on": torch.device("cuda", 1), "groups": [torch.int64, None],
           "shape": torch.ones(3, 0, 2).shape, "scalar": torch.Size([]),
           "tup": (3, 0, 2)}
    store.save(1, {"w": torch.ones(2), "cfg": cfg}).wait()
    got = store.load()[1]["cfg"]
    assert got == cfg and type(got["amp"]) is torch.dtype
    assert type(got["ran_on"]) is torch.device and got["ran_on"].index == 1
    assert type(got["shape"]) is torch.Size and got["shape"] == (3, 0, 2)
    assert type(got["scalar"]) is torch.Size and got["scalar"] == ()
    assert type(got["tup"]) is tuple
    blank = {k: [None, None] if k == "groups" else None for k in cfg}
    blank["shape"] = torch.Size([1])  # a leaf, as a dtype is
    blank["tup"] = (None, None, None)
    r = store.restore({"w": torch.zeros(2), "cfg": blank})
    assert r.state["cfg"] == cfg and not r.missing_keys and not r.unexpected_keys
    assert type(r.state["cfg"]["shape"]) is torch.Size
    with store.open() as ck:
        assert ck.structure()["cfg"] == cfg
        assert type(ck.structure()["cfg"]["shape"]) is torch.Size
    for value in (torch.float16, torch.device("cpu"), torch.Size([2])):
        assert libckpt.nested.flatten({"v": value}).version == 3
    assert libckpt.nested.flatten({"w": torch.ones(1), "n": 1}).version < 3
    with pytest.raises(TypeError, match="torch.dtype, torch.device"):
        store.save(2, {"x": torch.finfo(torch.float32)})


def test_torch_nodes_are_looked_up_never_evaluated(store, monkeypatch):
    """A structure another writer committed naming something that is not a
    dtype of torch (a function, an attribute) or a device torch cannot
    parse is CorruptError naming it; nothing is called."""
    import json
    import libckpt.store as store_module
    real = json.dumps
    for step, node, match in [
            (1, '{"torch":"dtype","value":"load"}', "dtype 'load'"),
            (2, '{"torch":"dtype","value":"__class__"}', "dtype '__class__'"),
            (3, '{"torch":"dtype","value":"float32; x"}', "dtype 'float32; x'"),
            (4, '{"torch":"device","value":"gpu:0"}', "device 'gpu:0'"),
            (5, '{"torch":"module","value":"os"}', "malformed torch node"),
            (6, '{"torch":"size","value":[2,-1]}', "malformed torch size"),
            (7, '{"torch":"size","value":"os"}', "malformed torch size"),
            (8, '{"torch":"size","value":[1.5]}', "malformed torch size")]:
        def crafted(obj, node=node, **kw):
            if isinstance(obj, dict) and obj.get("format") == libckpt.nested.FORMAT:
                tree = '{"dict":[["t",{"tensor":"t","from":"pt"}],["x",%s]]}' % node
                return '{"format":"%s","version":3,"tree":%s}' % (
                    libckpt.nested.FORMAT, tree)
            return real(obj, **kw)
        monkeypatch.setattr(store_module.json, "dumps", crafted)
        store.save(step, {"t": torch.ones(2)}).wait()
        monkeypatch.undo()
        with pytest.raises(libckpt.CorruptError, match=match):
            store.load(step)


def test_torch_values_load_as_text_without_torch(store):
    """Where torch cannot be imported, a dtype or device value comes back
    as its text (str() of it), a torch.Size as a tuple, the tensors as
    NumPy arrays."""
    store.save(1, {"w": torch.ones(2), "amp": torch.float16,
                   "on": torch.device("cuda", 0),
                   "shape": torch.Size([4, 5])}).wait()
    path = store.path
    store.close()
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import libckpt\n"
        "st = libckpt.Store(sys.argv[1], readonly=True).load()[1]\n"
        "print(st['amp'], st['on'], type(st['w']).__name__,\n"
        "      type(st['shape']).__name__, *st['shape'])\n")
    out = _python_child(code, path)
    assert out.stdout.split() == ["torch.float16", "cuda:0", "ndarray",
                                  "tuple", "4", "5"]


def test_multisteplr_resumes_with_its_counter_of_milestones(store):
    """MultiStepLR keeps its milestones in a collections.Counter and calls
    its methods (elements() when stepped to an epoch); the loaded state
    gives a scheduler that behaves as the one saved."""
    def make():
        opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        return opt, torch.optim.lr_scheduler.MultiStepLR(opt, [3, 6, 6], 0.5)
    opt, sched = make()
    for _ in range(4):
        opt.step()
        sched.step()
    store.save(1, {"sched": sched.state_dict()}).wait()
    got = store.load()[1]["sched"]
    assert type(got["milestones"]) is type(sched.state_dict()["milestones"])
    opt2, sched2 = make()
    sched2.load_state_dict(got)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # step(epoch) is deprecated
        sched.step(7)
        sched2.step(7)
    assert sched2.get_last_lr() == sched.get_last_lr() == [0.125]


def test_multisteplr_restored_in_place_takes_the_saved_milestones(store):
    """restore() into a fresh scheduler built with other milestone counts
    gives the saved Counter ({2: 2}), not the two summed, and so the
    saved learning rates."""
    def make(miles):
        opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        return opt, torch.optim.lr_scheduler.MultiStepLR(opt, miles, 0.1)
    opt, sched = make([2, 2])
    store.save(1, {"sched": sched.state_dict()}).wait()
    opt2, sched2 = make([2])
    got = store.restore({"sched": sched2.state_dict()}).state["sched"]
    assert dict(got["milestones"]) == {2: 2}
    sched2.load_state_dict(got)
    for _ in range(2):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
    assert sched2.get_last_lr() == sched.get_last_lr()

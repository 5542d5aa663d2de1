#!/usr/bin/env python3
"""bench_tiny.py: the per-tensor cost of the Python binding (issue 12, item
5: "10,000 tiny tensors cost under 2x one tensor of the same total bytes,
in stall, persist and restore").

    LIBCKPT_LIBRARY=BUILD/lib/libckpt.so PYTHONPATH=bindings/python \\
        /usr/bin/python3 benchmarks/bench_tiny.py DIR [--n 10000]
        [--bytes 4096] [--reps 3] [--rounds 1]
        [--binding NAME=PYTHONPATH ...] [--model LAYERS]

The same float32 bytes are saved and read back twice in one run: as N
torch CPU tensors of --bytes each in a flat dict, and as one tensor (a
root of its own for each layout, so retention never mixes them).  Each
figure is the best of --reps repetitions after a warm-up one:

  stall    Store.save until it returns (the snapshot is taken)
  persist  SaveHandle.wait until it returns (committed, durable)
  restore  Store.restore(state) into the existing tensors (newest step)
  load     Store.load(framework="pt") (newest step that fully verifies)

and the ratio tiny / one of each.  With --model LAYERS the many tensors
are a PyTorch training state instead: {"model": model.state_dict(),
"optim": adam.state_dict(), "epoch": 1} of LAYERS Linear(32, 32) layers
after one Adam step (6 tensors per layer, nested as torch makes them,
with the module versions and the optimizer's plain values), "one" being
one tensor of all their bytes; torch.save + fsync and torch.load of the
same state are measured beside it (best of --reps).  One more repetition runs with every
libckpt C function wrapped in a timer: it prints, for each operation, the
seconds spent inside C calls, the rest (Python), the number of C calls and
the C functions that took the most, so the split between the library and
the binding is visible.  (The wrappers cost about a microsecond per call:
that repetition is slower than the others and is not part of the best.)

With --binding (given twice or more, e.g. main=../main/bindings/python
new=bindings/python) each binding is measured in a child process of its
own with that PYTHONPATH, --rounds times, the bindings interleaved (A B A
B ...) so that a shared, noisy machine weighs on them alike; a table of
every round follows.  The C library is whatever LIBCKPT_LIBRARY names,
the same for all.  Compare ratios within a round, and the tiny seconds
across bindings of one round.
"""

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

OPS = ("stall", "persist", "restore", "load")


def make_states(torch, n, each):
    """(tiny, one): n tensors of `each` bytes, and one of all their bytes,
    holding the same small random values (full mantissas, as
    bench_tiny.c)."""
    g = torch.Generator().manual_seed(1)
    k = each // 4
    big = torch.randn(n * k, generator=g) * 1e-3
    tiny = {"t%d" % i: big[i * k:(i + 1) * k].clone() for i in range(n)}
    return tiny, {"t": big}


def make_model_state(torch, layers):
    """(state, one): a training state of `layers` Linear(32, 32) layers
    after one Adam step, and one float32 tensor holding all its bytes."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32)
                                  for _ in range(layers)])
    adam = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 32)).square().sum().backward()
    adam.step()
    state = {"model": model.state_dict(), "optim": adam.state_dict(),
             "epoch": 1}
    flat = [t for t in state["model"].values()] + [
        t for per in state["optim"]["state"].values() for t in per.values()]
    assert all(t.dtype == torch.float32 for t in flat)
    return state, {"t": torch.cat([t.reshape(-1) for t in flat])}


def state_tensors(state):
    """The tensors of a state made by make_states or make_model_state."""
    if "model" not in state:
        return list(state.values())
    return list(state["model"].values()) + [
        t for per in state["optim"]["state"].values() for t in per.values()]


def torch_peer(torch, root, state, reps):
    """Best torch.save + fsync and torch.load of `state` into `root`."""
    path = os.path.join(root, "state.pt")
    save = load = float("inf")
    for r in range(reps + 1):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        t1 = time.perf_counter()
        torch.load(path)
        t2 = time.perf_counter()
        if r:
            save, load = min(save, t1 - t0), min(load, t2 - t1)
    os.unlink(path)
    return {"torch.save+fsync": save, "torch.load": load}


class CTimer:
    """Every ctypes function of the loaded library wrapped to add its
    seconds and calls to per-function totals while `on`."""

    def __init__(self, lib):
        self.lib = lib
        self.orig = {name: f for name, f in vars(lib).items()
                     if name.startswith("ckpt_")
                     and isinstance(f, ctypes._CFuncPtr)}
        self.seconds = {}
        self.calls = {}

    def __enter__(self):
        clock = time.perf_counter
        seconds, calls = self.seconds, self.calls

        def wrap(name, f):
            def timed(*args):
                t0 = clock()
                try:
                    return f(*args)
                finally:
                    seconds[name] = seconds.get(name, 0.0) + clock() - t0
                    calls[name] = calls.get(name, 0) + 1
            return timed
        for name, f in self.orig.items():
            setattr(self.lib, name, wrap(name, f))
        return self

    def __exit__(self, *exc):
        for name, f in self.orig.items():
            setattr(self.lib, name, f)

    def reset(self):
        self.seconds.clear()
        self.calls.clear()

    def split(self, total):
        c = sum(self.seconds.values())
        top = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:3]
        return {"total": total, "c": c, "python": total - c,
                "calls": sum(self.calls.values()),
                "top": [[k, v, self.calls[k]] for k, v in top]}


def settle(root):
    """Wait until the store's background deletion of the steps its saves
    retired (keep_last) is over, so that it weighs on no timed call."""
    deadline = time.perf_counter() + 60
    while any(n.startswith(".trash-") for n in os.listdir(root)):
        if time.perf_counter() > deadline:
            raise SystemExit("bench_tiny: %s: a retired step is still being "
                             "deleted after 60 s" % root)
        time.sleep(0.002)


def one_rep(libckpt, st, step, state, timer=None):
    """stall, persist, restore and load of `state` as step `step`."""
    clock = time.perf_counter
    out, split = {}, {}
    root = st.path
    settle(root)

    def mark(op, t0):
        out[op] = clock() - t0
        if timer is not None:
            split[op] = timer.split(out[op])
            timer.reset()
    t0 = clock()
    h = st.save(step, state)
    mark("stall", t0)
    t0 = clock()
    h.wait()
    mark("persist", t0)
    h.close()
    settle(root)
    t0 = clock()
    got = st.restore(state)
    mark("restore", t0)
    assert int(got) == step, (got, step)
    t0 = clock()
    loaded = st.load(framework="pt")
    mark("load", t0)
    assert loaded.step == step and len(loaded.state) == len(state)
    return out, split


def measure(root, reps, n, each, layers=0):
    """The figures of both layouts in this process, as a dict."""
    import torch
    import libckpt
    from libckpt import ffi
    if layers:
        tiny, one = make_model_state(torch, layers)
        n = len(state_tensors(tiny))
        each = one["t"].numel() * 4 // n
    else:
        tiny, one = make_states(torch, n, each)
    before = [t.clone() for t in state_tensors(tiny)]
    result = {"binding": os.path.dirname(os.path.dirname(
        os.path.abspath(libckpt.__file__))), "n": n, "bytes": each,
        "layers": layers, "reps": reps, "best": {}, "split": {},
        "peer": torch_peer(torch, root, tiny, reps) if layers else {}}
    step = 0
    for layout, state in (("one", one), ("tiny", tiny)):
        path = os.path.join(root, layout)
        best = dict.fromkeys(OPS, float("inf"))
        with libckpt.Store(path, keep_last=2) as st:
            for r in range(reps + 1):  # the first warms files and caches
                step += 1
                figs, _ = one_rep(libckpt, st, step, state)
                if r:
                    best = {op: min(best[op], figs[op]) for op in OPS}
            with CTimer(ffi.lib) as timer:
                step += 1
                _, split = one_rep(libckpt, st, step, state, timer)
        # The restore wrote the checkpoint back into the tensors: still
        # the very bytes saved.
        if state is tiny:
            assert all(torch.equal(a, b) for a, b in
                       zip(before, state_tensors(tiny))), \
                "restore changed the data"
        shutil.rmtree(path)
        result["best"][layout] = best
        result["split"][layout] = split
    return result


def print_result(r):
    what = ("a state_dict + Adam state of %d layers (%d tensors, %d B "
            "each on average)" % (r["layers"], r["n"], r["bytes"])
            if r.get("layers") else "%d x %d B" % (r["n"], r["bytes"]))
    print("binding %s: %s vs 1 x %d B (best of %d)"
          % (r["binding"], what, r["n"] * r["bytes"], r["reps"]))
    one, tiny = r["best"]["one"], r["best"]["tiny"]
    for op in OPS:
        print("  %-8s one %8.4f s  tiny %8.4f s  ratio %6.2fx"
              % (op, one[op], tiny[op], tiny[op] / one[op]))
    peer = r.get("peer") or {}
    for name, mine in (("torch.save+fsync", "persist"),
                       ("torch.load", "restore")):
        if name in peer:
            print("  %-17s %8.4f s  (libckpt stall %.2fx, %s %.2fx of it)"
                  % (name, peer[name], tiny["stall"] / peer[name], mine,
                     (tiny[mine] + (tiny["stall"] if mine == "persist"
                                    else 0)) / peer[name]))
    print("  one timed repetition, tiny (C calls vs the rest, in Python):")
    for op in OPS:
        s = r["split"]["tiny"][op]
        top = ", ".join("%s %.4f s/%d" % (k[5:], v, c) for k, v, c in s["top"])
        print("  %-8s total %7.4f s  C %7.4f s  Python %7.4f s  %6d calls  (%s)"
              % (op, s["total"], s["c"], s["python"], s["calls"], top))


def compare(args, bindings):
    """Each binding in a child process, interleaved, --rounds times."""
    rows = []
    for rnd in range(args.rounds):
        for name, path in bindings:
            env = dict(os.environ, PYTHONPATH=path,
                       PYTHONDONTWRITEBYTECODE="1")
            with tempfile.TemporaryDirectory(dir=args.dir) as root:
                cmd = [sys.executable, os.path.abspath(__file__), root,
                       "--n", str(args.n), "--bytes", str(args.bytes),
                       "--reps", str(args.reps), "--model", str(args.model),
                       "--json"]
                out = subprocess.run(cmd, env=env, check=True,
                                     stdout=subprocess.PIPE).stdout
            r = json.loads(out)
            load = os.getloadavg()[0]
            print("round %d, %s (load %.1f)" % (rnd + 1, name, load))
            print_result(r)
            sys.stdout.flush()
            rows.append((rnd + 1, name, r, load))
    print()
    print("| round | binding | load | " + " | ".join(
        "%s tiny (s) | %s ratio" % (op, op) for op in OPS) + " |")
    print("| --- | --- | ---: | " + " | ".join(
        "---: | ---:" for _ in OPS) + " |")
    for rnd, name, r, load in rows:
        one, tiny = r["best"]["one"], r["best"]["tiny"]
        print("| %d | %s | %.1f | " % (rnd, name, load) + " | ".join(
            "%.4f | %.2fx" % (tiny[op], tiny[op] / one[op]) for op in OPS)
            + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="a directory on the disk to measure")
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--binding", action="append", default=[],
                   metavar="NAME=PYTHONPATH")
    p.add_argument("--model", type=int, default=0, metavar="LAYERS",
                   help="a state_dict + Adam state of LAYERS layers "
                   "instead of --n tensors of --bytes")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.n < 1 or args.bytes < 4 or args.bytes % 4 or args.reps < 1 \
            or args.model < 0:
        p.error("--n >= 1, --bytes a multiple of 4, --reps >= 1, "
                "--model >= 0")
    os.makedirs(args.dir, exist_ok=True)
    if args.binding:
        bindings = [b.split("=", 1) if "=" in b else (b, b)
                    for b in args.binding]
        compare(args, [(n, os.path.abspath(path)) for n, path in bindings])
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        r = measure(root, args.reps, args.n, args.bytes, args.model)
    if args.json:
        json.dump(r, sys.stdout)
    else:
        print_result(r)


if __name__ == "__main__":
    main()

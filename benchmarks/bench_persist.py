#!/usr/bin/env python3
"""bench_persist: libckpt against the machine's limits and its peers, in one
run, on the same data.

    /usr/bin/python3 benchmarks/bench_persist.py DIR [--build BUILD] [--out OUT]
                                                     [--large] [--reps N]

DIR is a directory on the disk to measure (files are created and removed
there); BUILD is the meson build directory (default: build); OUT the
results folder (default: bench-results), which gets results.md (the table
and the machine) and results.png (matplotlib, when installed).

Data, made honestly: a small MLP trained a few steps with Adam on CPU, its
state as training saves it (fp32 weights, both Adam moments, a bf16 copy of
the weights) at 256 MiB and 1 GiB (and 4 GiB with --large); random bytes
and all-zero bytes as the extremes (256 MiB); 10,000 tensors of 4 KiB next
to one tensor of the same bytes.

Every figure is the best of --reps repetitions (default 3) after a warm-up
(h5py gzip: of 1), or of three times as many for the states under 64 MiB
(the 40 MB ones), whose tens of milliseconds a shared disk's hiccup can
double: their best of 3 moved 0.94-1.71x between runs.  The machine may be shared: compare the ratios, which
come from the same run, not the seconds; persist's baseline is a raw write
+ fsync of the same bytes made next to each save (before it in one
repetition, after it in the next).  A save retires the step keep_last=2
lets go before it returns, but deletes its files in the background after
it: that deletion is waited for before each timed save and raw write, so
it weighs on neither (the raw baseline deletes its previous file untimed,
too).  Rows:

  limit    (on the state's bytes gathered into one buffer when its
           tensors average under 1 MiB: the bytes, not 10,000 calls)
           memcpy on 1 and all threads; raw write + fsync of the same bytes
           (first write of the run into a fresh file; a new file replacing
           the previous one, as every save does: the baseline; overwriting
           in place); read back warm and cold (posix_fadvise DONTNEED);
           XXH3, zstd -1, libckpt's codec (shuffle + zstd + hashes) and its
           decoder on all threads (bench_limits)
  libckpt  stall (the caller blocked in save), persist (from the save call
           to committed and durable, seen by the caller: the stall
           included), stored / raw, restore warm and cold (into existing,
           faulted-in tensors; every chunk verified), load warm and cold
           (Store.load: allocates the tensors it returns, as torch.load
           and np.load do: the figure to compare with them); on the 256 MiB Adam state also a
           sweep of options (forced compression, full verification, zstd
           level 3, 1 thread, 1 and 16 MiB chunks)
  peers    torch.save + fsync / torch.load, numpy.save + fsync / np.load,
           h5py plain and gzip (level 1) + fsync / read, and the shell
           pipeline zstd -T0 -1 | file, xxhsum -H3 of it, fsync / xxhsum -c +
           zstd -d

Ratios: persist / raw write + fsync (the faster of the one paired with the
saves and the one in the limits); restore / (read of the stored bytes
+ decoding the compressed share on all threads); stall / memcpy on all
threads; and libckpt / each peer, save and load.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20
GiB = 1 << 30


def now():
    return time.perf_counter()


# ---------------------------------------------------------------- data

# Layers of one trained block: the 256 MiB state's whole model.
BLOCK_LAYERS = 18


def adam_state(torch, nbytes, seed):
    """Blocks of an MLP of width 1024 and BLOCK_LAYERS layers, each trained
    with Adam for 3 steps from a seed of its own: weights, both moments and
    a bf16 copy of the weights (14 bytes a parameter), named as one model's
    layers.  Every size is made of blocks of the same kind, so that its
    bytes are alike (compress alike) and time per GiB compares across
    sizes.  Before run P one model as deep as the size asked for was
    trained, its moments the more compressible the deeper it was
    (vanishing gradients): zstd -1 stored 0.90 of 256 MiB, 0.70 of 1 GiB
    and 0.45 of 4 GiB, so larger states were also easier ones."""
    width = 1024
    per_layer = width * width + width
    layers = max(1, round(nbytes / 14 / per_layer))
    state = {}
    for block, first in enumerate(range(0, layers, BLOCK_LAYERS)):
        n = min(BLOCK_LAYERS, layers - first)
        torch.manual_seed(seed + 7919 * block)  # block 0: as before run P
        model = torch.nn.Sequential(*[m for _ in range(n)
                                      for m in (torch.nn.Linear(width, width),
                                                torch.nn.GELU())])
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(16, width)
        y = torch.randn(16, width)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        for name, p in model.named_parameters():
            index, kind = name.split(".")  # "<module>.weight": Linear at even
            name = "%d.%s" % (int(index) + 2 * first, kind)
            st = opt.state[p]
            state["model." + name] = p.detach()
            state["optim.%s.exp_avg" % name] = st["exp_avg"]
            state["optim.%s.exp_avg_sq" % name] = st["exp_avg_sq"]
            state["bf16." + name] = p.detach().to(torch.bfloat16)
        del opt, model
    return state


def raw_view(torch, t):
    """The tensor's bytes as a flat uint8 tensor (no copy)."""
    flat = t.reshape(-1)
    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)


def raw_buffers(torch, state):
    """The state's bytes for the limits and the raw baselines, as libckpt
    stores them: its tensors' views, or, for a state of many small tensors
    (under 1 MiB on average), one buffer gathering them (untimed), so that
    a raw write, read or memcpy of the same bytes is measured, not 10,000
    Python calls (which made the limits of the 10,000-tensor state up to
    10x slower than those of one tensor of the same bytes)."""
    views = [raw_view(torch, t) for t in state.values()]
    n = sum(v.numel() for v in views)
    if len(views) > 1 and n < len(views) * MiB:
        return [torch.cat(views)]
    return views


def numpy_views(torch, state):
    """For numpy and h5py: the same bytes (bf16 as int16)."""
    return {k: (v.view(torch.int16) if v.dtype == torch.bfloat16 else v).numpy()
            for k, v in state.items()}


def nbytes_of(state):
    return sum(t.numel() * t.element_size() for t in state.values())


def empty_like(torch, state):
    """Pre-faulted targets for restores (first touch is slow)."""
    out = {}
    for k, v in state.items():
        e = torch.empty_like(v)
        raw_view(torch, e).fill_(0)
        out[k] = e
    return out


# ------------------------------------------------------------ file helpers

def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_cache(path):
    """Evict a file's (or a tree's) clean pages: cold reads without root."""
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def settle(root):
    """Wait until the store's background deletion of retired steps is over
    (no .trash- entry left in the root), so that it slows no timed write."""
    deadline = now() + 60
    while any(n.startswith(".trash-") for n in os.listdir(root)):
        if now() > deadline:
            raise SystemExit("bench_persist: %s: a retired step is still being "
                             "deleted after 60 s" % root)
        time.sleep(0.002)


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def write_raw(path, views, in_place=False):
    flags = os.O_WRONLY | os.O_CREAT | (0 if in_place else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        for v in views:
            mv = memoryview(v.numpy())
            while len(mv):
                n = os.write(fd, mv[:GiB])
                mv = mv[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_raw(path, views):
    with open(path, "rb", buffering=0) as f:
        for v in views:
            mv = memoryview(v.numpy())
            while len(mv):
                n = f.readinto(mv)
                if not n:
                    raise IOError("short read of " + path)
                mv = mv[n:]


def best(reps, fn, before=None):
    """Best time of fn() over reps runs after one warm-up."""
    t = []
    for r in range(reps + 1):
        if before:
            before()
        t0 = now()
        fn()
        if r:
            t.append(now() - t0)
    return min(t)


def best_pair(reps, fa, fb, before=None):
    """Best times of fa() and fb(), each run once per repetition (the
    order swapped every other one), after one warm-up of each."""
    ta, tb = [], []
    for r in range(reps + 1):
        for which in ((fa, ta), (fb, tb)) if r % 2 == 0 else ((fb, tb), (fa, ta)):
            if before:
                before()
            t0 = now()
            x = which[0]()
            dt = now() - t0
            del x  # freed before the other runs: both meet the same heap
            if r:
                which[1].append(dt)
    return min(ta), min(tb)


# ----------------------------------------------------------------- runs

class Bench:
    def __init__(self, args, torch, libckpt):
        self.a = args
        self.torch = torch
        self.libckpt = libckpt
        self.dir = os.path.join(args.dir, "bench-persist-%d" % os.getpid())
        os.makedirs(self.dir)
        self.rows = []  # dicts: data, kind, what, s, gbs, stored, vs_limit, vs_peers
        self.results = {}  # (data, what) -> seconds
        self.skipped = []
        self.step = 0
        self.kept = {}  # data -> (root, step dir) of its default-options run

    def row(self, data, kind, what, s, nbytes, stored=None, limit=None, note=""):
        self.results[(data, what)] = s
        self.rows.append(dict(data=data, kind=kind, what=what, s=s,
                              gbs=nbytes / s / 1e9 if s else 0.0,
                              stored=stored, limit=limit, peers="", note=note))
        print("  %-28s %-34s %8.3f s %7.2f GB/s%s" % (
            data, what, s, nbytes / s / 1e9 if s else 0,
            "" if stored is None else "  stored/raw %.3f" % stored), flush=True)

    def reps_for(self, n):
        """Repetitions for a state of n bytes (see the module docstring)."""
        return self.a.reps * 3 if n < 64 * MiB else self.a.reps

    # -- limits
    def limits(self, name, state, elem):
        torch = self.torch
        n = nbytes_of(state)
        reps = self.reps_for(n)
        views = raw_buffers(torch, state)
        dst = [torch.zeros_like(v) for v in views]
        threads = os.cpu_count() or 1

        def memcpy():
            for d, v in zip(dst, views):
                d.copy_(v)
        torch.set_num_threads(1)
        self.row(name, "limit", "memcpy, 1 thread", best(reps, memcpy), n)
        torch.set_num_threads(threads)
        self.row(name, "limit", "memcpy, %d threads" % threads, best(reps, memcpy), n)
        raw = os.path.join(self.dir, "raw.bin")
        remove(raw)
        t0 = now()
        write_raw(raw, views)
        self.row(name, "limit", "write+fsync, fresh file (first)", now() - t0, n)
        self.row(name, "limit", "write+fsync", best(reps, lambda: write_raw(raw, views),
                                                    lambda: remove(raw)), n)
        write_raw(raw, views)
        self.row(name, "limit", "write+fsync, in place",
                 best(reps, lambda: write_raw(raw, views, in_place=True)), n)
        self.row(name, "limit", "read, warm", best(reps, lambda: read_raw(raw, dst)), n)
        self.row(name, "limit", "read, cold",
                 best(reps, lambda: read_raw(raw, dst), lambda: drop_cache(raw)), n)
        exe = os.path.join(self.a.build, "benchmarks", "bench_limits")
        out = subprocess.run([exe, raw, str(threads), str(elem)], check=True,
                             capture_output=True, text=True).stdout
        lim = json.loads(out)
        for key, what in (("xxh3", "XXH3"), ("zstd", "zstd -1"),
                          ("codec", "codec: shuffle+zstd+hashes"),
                          ("decode", "decode: unzstd+unshuffle+hashes")):
            ratio = lim["codec_ratio"] if key == "codec" else (
                lim["zstd_ratio"] if key == "zstd" else None)
            self.row(name, "limit", "%s, %d threads" % (what, threads),
                     lim[key + "_s"], n, stored=ratio)
        remove(raw)
        del dst
        gc.collect()
        return lim

    # -- libckpt
    def libckpt_run(self, name, state, label="libckpt", store_kw=None, cold=True,
                    lim=None):
        torch = self.torch
        n = nbytes_of(state)
        reps = self.reps_for(n)
        root = os.path.join(self.dir, "root")
        remove(root)
        kw = dict(keep_last=2)
        kw.update(store_kw or {})
        stall, persist, stored, paired = [], [], 0, []
        raw = os.path.join(self.dir, "paired.bin")
        views = raw_buffers(torch, state)
        with self.libckpt.Store(root, **kw) as st:
            def paired_write():
                settle(root)
                remove(raw)
                t0 = now()
                write_raw(raw, views)
                paired.append(now() - t0)
                remove(raw)
            for r in range(reps + 1):
                self.step += 1
                # The raw write + fsync right next to each save, so both see
                # the same load on a shared machine: persist's baseline.
                # Before the save in one repetition, after it in the next:
                # the disk's write-back of whatever ran just before (the
                # files of the previous run being deleted, its last save)
                # weighs on neither alone.
                if r % 2 == 0:
                    paired_write()
                settle(root)
                t0 = now()
                h = st.save(self.step, state)
                t1 = now()
                h.wait()
                t2 = now()
                stored = h.stats["stored_bytes"]
                h.close()
                if r % 2 == 1:
                    paired_write()
                if r:
                    stall.append(t1 - t0)
                    persist.append(t2 - t0)  # from the save call, as labelled
            target = empty_like(torch, state)
            step_dir = os.path.join(root, "step-%012d" % self.step)
            warm = best(reps, lambda: st.restore(target))
            cold_s = best(reps, lambda: st.restore(target),
                          lambda: drop_cache(step_dir)) if cold else None
            for k in state:  # the benchmark checks what it restored
                if not torch.equal(raw_view(torch, target[k]), raw_view(torch, state[k])):
                    raise SystemExit("bench_persist: %s restored differently" % k)
        ratio = stored / n
        self.row(name, "limit", "write+fsync, paired with " + label, min(paired[1:]), n)
        self.row(name, "libckpt", label + ": stall", min(stall), n)
        self.row(name, "libckpt", label + ": persist", min(persist), n, stored=ratio)
        self.row(name, "libckpt", label + ": restore, warm", warm, n)
        if cold_s is not None:
            self.row(name, "libckpt", label + ": restore, cold", cold_s, n)
        if label == "libckpt" and cold:
            # load() allocates what it returns, as torch.load does: timed
            # in peers(), alternating with torch.load in one loop, so that
            # both meet the same heap (reused freed pages run at memory
            # speed, fresh ones at first-touch speed: either alone moved
            # 4x with what ran before).
            # under a name of its own: the next run's root is "root" again
            kept = "%s-kept-%d" % (root, len(self.kept))
            os.rename(root, kept)
            self.kept[name] = (kept, os.path.join(kept, os.path.basename(step_dir)))
        else:
            remove(root)
        del target
        gc.collect()
        return ratio

    # -- peers
    def peers(self, name, state, gzip=True):
        torch = self.torch
        n = nbytes_of(state)
        reps = self.reps_for(n)
        path = os.path.join(self.dir, "peer")

        def torch_save():
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        twin = None
        if name in self.kept:
            root, step_dir = self.kept.pop(name)
            reader = self.libckpt.Store(root, readonly=True)
            twin = (lambda: reader.load(framework="pt"), step_dir)
        try:
            self.peer_pair(name, "torch.save+fsync", "torch.load", torch_save,
                           lambda: torch.load(path), path, n, twin=twin)
        finally:
            if twin:
                reader.close()
                remove(root)
        arrays = numpy_views(torch, state)
        try:
            import numpy as np

            def np_save():
                with open(path, "wb") as f:
                    for a in arrays.values():
                        np.save(f, a, allow_pickle=False)
                    f.flush()
                    os.fsync(f.fileno())

            def np_load():
                with open(path, "rb") as f:
                    return [np.load(f, allow_pickle=False) for _ in arrays]
            self.peer_pair(name, "numpy.save+fsync", "np.load", np_save, np_load, path, n)
        except ImportError:
            self.skipped.append("numpy")
        try:
            import h5py
            for label, kw in (("h5py", {}), ("h5py gzip-1", dict(compression="gzip",
                                                                 compression_opts=1))):
                if kw and not gzip:
                    continue

                def h5_save(kw=kw):
                    with h5py.File(path, "w") as f:
                        for k, a in arrays.items():
                            f.create_dataset(k, data=a, **kw)
                    fsync_path(path)

                def h5_load():
                    with h5py.File(path, "r") as f:
                        return [f[k][()] for k in arrays]
                self.peer_pair(name, label + " save+fsync", label + " read", h5_save,
                               h5_load, path, n, reps=1 if kw else None)
        except ImportError:
            self.skipped.append("h5py (python3-h5py)")
        self.zstd_pipeline(name, state, path, n)
        remove(path)

    def peer_pair(self, name, save_label, load_label, save, load, path, n, reps=None,
                  twin=None):
        """With `twin` (libckpt's load, its step directory): timed in the
        same loops as `load`, one after the other each repetition."""
        reps = reps or self.reps_for(n)
        s = best(reps, save, lambda: remove(path))
        stored = os.path.getsize(path) / n
        self.row(name, "peer", save_label, s, n, stored=stored)
        if twin is None:
            self.row(name, "peer", load_label + ", warm", best(reps, load), n)
            self.row(name, "peer", load_label + ", cold", best(reps, load,
                                                               lambda: drop_cache(path)), n)
            return
        fn, step_dir = twin
        warm = best_pair(reps, load, fn)
        cold = best_pair(reps, load, fn, lambda: (drop_cache(path), drop_cache(step_dir)))
        self.row(name, "peer", load_label + ", warm", warm[0], n)
        self.row(name, "peer", load_label + ", cold", cold[0], n)
        self.row(name, "libckpt", "libckpt: load, warm", warm[1], n)
        self.row(name, "libckpt", "libckpt: load, cold", cold[1], n)

    def zstd_pipeline(self, name, state, path, n):
        if not shutil.which("zstd"):
            self.skipped.append("zstd pipeline (zstd not installed)")
            return
        xxhsum = shutil.which("xxhsum")
        views = raw_buffers(self.torch, state)
        dst = [self.torch.zeros_like(v) for v in views]
        sums = path + ".xxh3"

        def save():
            with open(path, "wb") as out:
                p = subprocess.Popen(["zstd", "-T0", "-1", "-q", "-c"],
                                     stdin=subprocess.PIPE, stdout=out)
                for v in views:
                    p.stdin.write(memoryview(v.numpy()))
                p.stdin.close()
                if p.wait():
                    raise SystemExit("zstd failed")
            if xxhsum:
                with open(sums, "w") as f:
                    subprocess.run([xxhsum, "-H3", path], stdout=f, check=True)
                fsync_path(sums)
            fsync_path(path)

        def load():
            if xxhsum:
                subprocess.run([xxhsum, "-c", "-q", sums], check=True,
                               stdout=subprocess.DEVNULL)
            p = subprocess.Popen(["zstd", "-d", "-T0", "-q", "-c", path],
                                 stdout=subprocess.PIPE)
            for v in dst:
                mv = memoryview(v.numpy())
                while len(mv):
                    k = p.stdout.readinto(mv)
                    if not k:
                        raise SystemExit("zstd -d: short output")
                    mv = mv[k:]
            p.stdout.close()
            p.wait()
        label = "zstd -T0 -1 | xxhsum -H3" if xxhsum else "zstd -T0 -1 (no xxhsum)"
        if not xxhsum:
            self.skipped.append("xxhsum (package xxhash): the zstd pipeline ran without it")
        self.peer_pair(name, label, "xxhsum -c + zstd -d" if xxhsum else "zstd -d",
                       save, load, path, n)
        remove(sums)
        del dst


# ------------------------------------------------------------- reporting

def fmt_ratio(x):
    return "%.2f×" % x if x is not None else ""


def annotate(b, datasets, ratios_all):
    """Fill each libckpt row's ratio to its limit and to the peers."""
    res = b.results
    for r in b.rows:
        if r["kind"] != "libckpt":
            continue
        d, what = r["data"], r["what"]
        label, _, part = what.partition(": ")
        threads = os.cpu_count() or 1
        lim = None
        peers = []
        if part == "stall":
            lim = res.get((d, "memcpy, %d threads" % threads))
            r["limit_name"] = "memcpy ×%d" % threads
        elif part == "persist":
            # The faster of the raw write + fsync next to each save and the
            # one that replaced its file in the limits: on a file system
            # mounted with online discard, a write into blocks just freed
            # (and discarded) can run at a quarter of the speed, so either
            # can be slowed by where its blocks land; the faster keeps the
            # ratio from ever flattering libckpt.
            found = [s for s in (res.get((d, "write+fsync, paired with " + label)),
                                 res.get((d, "write+fsync"))) if s]
            lim = min(found) if found else None
            r["limit_name"] = "write+fsync, the faster of paired and alone"
            peers = [(w, s) for (dd, w), s in res.items() if dd == d and (
                "save" in w or w.startswith("zstd -T0"))]
        elif part.startswith(("restore", "load")):
            temp = part.split(", ")[1]
            read = res.get((d, "read, " + temp))
            dec = res.get((d, "decode: unzstd+unshuffle+hashes, %d threads" % threads))
            stored, all_ratio = ratios_all.get((d, label), (None, None))
            if read is not None and dec is not None and stored is not None:
                # read the stored bytes + decode the compressed share
                share = 0.0
                if all_ratio is not None and all_ratio < 0.999:
                    share = min(1.0, max(0.0, (1 - stored) / (1 - all_ratio)))
                lim = read * stored + dec * share
            r["limit_name"] = "read (%s) + decode" % temp
            peers = [(w, s) for (dd, w), s in res.items() if dd == d and w.endswith(
                ", " + temp) and not w.startswith("libckpt") and (
                    w.split(", ")[0].endswith(("load", "read", "zstd -d")))]
        if lim:
            r["limit"] = r["s"] / lim
        r["peers"] = ", ".join("%s %s" % (w.split(",")[0], fmt_ratio(r["s"] / s))
                               for w, s in peers if s)


def markdown(b, extra):
    lines = ["| data | kind | what | seconds | GB/s | stored/raw | ÷ limit | ÷ peers |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in b.rows:
        lim = ""
        if r.get("limit") is not None:
            lim = "%s (%s)" % (fmt_ratio(r["limit"]), r.get("limit_name", ""))
        lines.append("| %s | %s | %s | %.3f | %.2f | %s | %s | %s |" % (
            r["data"], r["kind"], r["what"], r["s"], r["gbs"],
            "" if r["stored"] is None else "%.3f" % r["stored"], lim, r["peers"]))
    for r in extra:
        lines.append("| %s | derived | %s | | | | %s | |" % r)
    return "\n".join(lines)


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                       "")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return dict(cpu=cpu, cores=os.cpu_count(), memory_gib=round(mem, 1),
                kernel=platform.release(), commit=commit + (" (modified)" if dirty else ""),
                python=platform.python_version(), load=os.getloadavg())


def plot(b, path):
    """One PNG: first libckpt's figures (default options) as ratios to
    their limits and to torch, one group per data set, with the 1.1x line of
    issue 12; then every row's seconds, one panel per data set."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (package python3-matplotlib): no plot"
    datasets = list(dict.fromkeys(r["data"] for r in b.rows))
    fig, axes = plt.subplots(len(datasets) + 1, 1,
                             figsize=(11, 4 + 3.2 * len(datasets)), squeeze=False)
    # Ratios: what the targets are about.
    ax = axes[0, 0]
    series = [("stall", "stall ÷ memcpy", None),
              ("persist", "persist ÷ write+fsync", None),
              ("restore, warm", "restore warm ÷ read+decode", None),
              ("restore, cold", "restore cold ÷ read+decode", None),
              ("persist", "persist ÷ torch.save+fsync", "torch.save+fsync"),
              ("load, warm", "load warm ÷ torch.load", "torch.load, warm"),
              ("load, cold", "load cold ÷ torch.load", "torch.load, cold")]
    by = {(r["data"], r["what"]): r for r in b.rows}
    width = 0.8 / len(series)
    for k, (part, label, peer) in enumerate(series):
        xs, ys = [], []
        for i, d in enumerate(datasets):
            r = by.get((d, "libckpt: " + part))
            if r is None:
                continue
            if peer is None:
                y = r.get("limit")
            else:
                p = by.get((d, peer))
                y = r["s"] / p["s"] if p and p["s"] else None
            if y is not None:
                xs.append(i + (k - len(series) / 2 + 0.5) * width)
                ys.append(y)
        ax.bar(xs, ys, width=width, label=label)
    ax.axhline(1.1, color="red", linewidth=0.8, linestyle="--", label="1.1×")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_yscale("log")
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels(datasets, fontsize=8)
    ax.set_ylabel("ratio (log; lower is better)", fontsize=8)
    ax.set_title("libckpt, default options: ratio to its limit and to torch "
                 "(same run)", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    colors = {"limit": "#999999", "libckpt": "#1f77b4", "peer": "#ff7f0e"}
    for ax, d in zip(axes[1:, 0], datasets):
        rows = [r for r in b.rows if r["data"] == d]
        ax.barh([r["what"] for r in rows], [r["s"] for r in rows],
                color=[colors[r["kind"]] for r in rows])
        ax.set_xscale("log")
        ax.set_title(d, fontsize=9)
        ax.tick_params(axis="y", labelsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("seconds (log): grey limit, blue libckpt, orange peer", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="directory on the disk to measure")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--large", action="store_true", help="add the 4 GiB Adam state")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="64 MiB states, no sweep (a smoke test of this script)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    lib = os.path.join(a.build, "lib", "libckpt.so")
    if not os.path.exists(lib):
        sys.exit("bench_persist: %s is missing: build first (meson setup %s && ninja -C %s)"
                 % (lib, a.build, a.build))
    os.environ["LIBCKPT_LIBRARY"] = lib
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    try:
        import torch
        import libckpt
    except ImportError as e:
        sys.exit("bench_persist: %s (run with the Python that has torch and numpy, "
                 "e.g. /usr/bin/python3)" % e)
    torch.set_num_threads(os.cpu_count() or 1)
    info = machine()
    b = Bench(a, torch, libckpt)
    t_start = now()
    small = 64 * MiB if a.quick else 256 * MiB
    sizes = [small] + ([] if a.quick else [GiB]) + ([4 * GiB] if a.large else [])
    ratios_all = {}  # (data, libckpt label) -> (stored/raw, stored/raw forced)
    scaling = []
    try:
        for i, size in enumerate(sizes):
            name = "adam %s" % ("%d MiB" % (size // MiB) if size < GiB else
                                "%d GiB" % (size // GiB))
            print("== %s: training the model" % name, flush=True)
            state = adam_state(torch, size, seed=i + 1)
            lim = b.limits(name, state, elem=4)
            forced = b.libckpt_run(name, state, "libckpt compress_all",
                                   dict(compress_all=True), cold=False)
            r = b.libckpt_run(name, state)
            ratios_all[(name, "libckpt")] = (r, forced)
            ratios_all[(name, "libckpt compress_all")] = (forced, forced)
            b.row(name, "limit", "zstd -1 stored/raw (for ratio targets)", lim["zstd_s"],
                  nbytes_of(state), stored=lim["zstd_ratio"])
            scaling.append((name, nbytes_of(state)))
            if i == 0 and not a.quick:
                for label, kw in (("libckpt verify full", dict(verify_after_save="full")),
                                  ("libckpt level 3", dict(level=3)),
                                  ("libckpt 1 thread", dict(threads=1)),
                                  ("libckpt 1 MiB chunks", dict(chunk_bytes=MiB)),
                                  ("libckpt 16 MiB chunks", dict(chunk_bytes=16 * MiB))):
                    b.libckpt_run(name, state, label, kw, cold=False)
            b.peers(name, state, gzip=size <= 256 * MiB)
            del state
            gc.collect()
        for name, fill in (("random", "random"), ("zeros", "zeros")):
            n = small
            if fill == "random":
                t = torch.randint(-2**31, 2**31 - 1, (n // 4,), dtype=torch.int32).view(
                    torch.float32)
            else:
                t = torch.zeros(n // 4, dtype=torch.float32)
            state = {"x": t}
            name = "%s %d MiB" % (name, n // MiB)
            b.limits(name, state, elem=4)
            forced = b.libckpt_run(name, state, "libckpt compress_all",
                                   dict(compress_all=True), cold=False)
            r = b.libckpt_run(name, state)
            ratios_all[(name, "libckpt")] = (r, forced)
            ratios_all[(name, "libckpt compress_all")] = (forced, forced)
            del state, t
            gc.collect()
        base = torch.randn(10000 * 1024) * 0.02
        for name, state in (("10,000 × 4 KiB", {"t%05d" % i: base[i * 1024:(i + 1) * 1024]
                                                 .clone() for i in range(10000)}),
                            ("1 × 40 MB", {"t": base})):
            b.limits(name, state, elem=4)
            forced = b.libckpt_run(name, state, "libckpt compress_all",
                                   dict(compress_all=True), cold=False)
            r = b.libckpt_run(name, state)
            ratios_all[(name, "libckpt")] = (r, forced)
            ratios_all[(name, "libckpt compress_all")] = (forced, forced)
            b.peers(name, state)
    finally:
        shutil.rmtree(b.dir, ignore_errors=True)
    annotate(b, sizes, ratios_all)
    extra = []
    res = b.results
    for part in ("stall", "persist", "restore, warm", "load, warm"):
        per = [(d, res[(d, "libckpt: " + part)] / (n / GiB)) for d, n in scaling
               if (d, "libckpt: " + part) in res]
        if len(per) > 1:
            lo, hi = min(p for _, p in per), max(p for _, p in per)
            extra.append(("adam", "libckpt %s, s/GiB: %s" % (part, ", ".join(
                "%s %.3f" % x for x in per)), "spread %.2f×" % (hi / lo)))
        t1 = res.get(("10,000 × 4 KiB", "libckpt: " + part))
        t0 = res.get(("1 × 40 MB", "libckpt: " + part))
        if t0 and t1:
            extra.append(("10,000 × 4 KiB", "libckpt %s ÷ one tensor" % part,
                          fmt_ratio(t1 / t0)))
    table = markdown(b, extra)
    info["load_end"] = os.getloadavg()
    info["minutes"] = round((now() - t_start) / 60, 1)
    info["date"] = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
    print()
    print(table)
    os.makedirs(a.out, exist_ok=True)
    note = plot(b, os.path.join(a.out, "results.png"))
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("# bench_persist results\n\n")
        f.write("Machine: %s\n\n" % json.dumps(info))
        f.write("Directory measured: %s\n\n" % os.path.abspath(a.dir))
        if b.skipped:
            f.write("Not measured: %s\n\n" % "; ".join(dict.fromkeys(b.skipped)))
        f.write(table + "\n")
        if not note:
            f.write("\n![results](results.png)\n")
    print()
    print("machine:", json.dumps(info))
    for s in list(dict.fromkeys(b.skipped)) + ([note] if note else []):
        print("not measured:", s)
    print("written:", os.path.join(a.out, "results.md"),
          "" if note else "and " + os.path.join(a.out, "results.png"))


if __name__ == "__main__":
    main()

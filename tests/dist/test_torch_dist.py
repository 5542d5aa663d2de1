"""Several ranks through torch.distributed (gloo) and the Python binding:
real processes, one per rank (torch_rank.py), on one machine."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import libckpt  # noqa: E402
from libckpt.dist import load_resharded  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def job(world, mode, root, *args, timeout=None, expect_ok=True):
    """Run one job of `world` ranks; the ranks' output lines."""
    port = free_port()
    env = dict(os.environ)
    if timeout is not None:
        env["DIST_TIMEOUT"] = str(timeout)
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "torch_rank.py"), str(r), str(world),
         port, mode, str(root)] + [str(a) for a in args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        for r in range(world)]
    out, codes = [], []
    for p in procs:
        text, _ = p.communicate(timeout=300)
        out += text.splitlines()
        codes.append(p.returncode)
    print("\n".join(out))
    if expect_ok:
        assert codes == [0] * world, (codes, out)
    return codes, out


def flip(path, offset):
    b = bytearray(open(path, "rb").read())
    b[offset] ^= 0x40
    open(path, "wb").write(b)


def test_save_kill_corrupt_reshard(tmp_path):
    root = tmp_path / "root"
    codes, out = job(4, "save", root, 1, 2)
    assert sum("restored step 2" in line for line in out) == 4
    step2 = root / "step-000000000002"
    assert sorted(os.listdir(step2)) == sorted(
        ["manifest.json"] + ["rank-%05d.%s" % (r, e) for r in range(4)
                             for e in ("json", "shard")])

    # Rank 1 killed mid-save: the others' waits fail (PeerError) within the
    # timeout, nothing is committed, step 2 restores on every rank.
    codes, out = job(4, "kill", root, 3, 1, timeout=5, expect_ok=False)
    assert codes[1] == -9
    assert [codes[r] for r in (0, 2, 3)] == [0, 0, 0], out
    assert sum("save returned peer" in line for line in out) == 3
    assert not (root / "step-000000000003").exists()
    job(4, "restore", root, 2, 0)

    # Rank 3's shard of step 2 damaged: every rank falls back to step 1 and
    # says why.
    good = tmp_path / "good"
    subprocess.run(["cp", "-a", str(root), str(good)], check=True)
    flip(step2 / "rank-00003.shard", 80)
    codes, out = job(4, "restore", root, 1, 1)
    assert sum(line.startswith("rank %d: skipped step 2" % r) and
               "rank-00003.shard" in line for r in range(4) for line in out) == 4

    # The intact 4-rank checkpoint into 2 ranks, and into one process.
    job(2, "reshard", good, 2, 4)
    with libckpt.Store(good, readonly=True) as store:
        step, state = load_resharded(store, lambda name: True, framework="pt")
    assert step == 2 and len(state) == 4
    for r in range(4):
        want = torch.arange(3000 + 700 * r, dtype=torch.int32) + r * 100003 + 2 * 7919
        assert torch.equal(state["rank%d.w" % r], want)


def test_a_save_in_flight_at_exit_commits(tmp_path):
    """Ranks that leave the script with a save in flight (its handle
    dropped, no close; one rank on an uncaught exception) commit it as
    they exit, without waiting for the timeout: the package closes its
    stores at exit, while the coordinator's Python callbacks still run.
    Before, the stores were closed during finalization, where the
    callbacks no longer ran: each rank waited the whole timeout and the
    step was lost."""
    import time
    for raiser in (-1, 1):
        root = tmp_path / ("root%d" % raiser)
        t0 = time.monotonic()
        codes, out = job(2, "drop", root, 5, raiser, timeout=60, expect_ok=False)
        took = time.monotonic() - t0
        assert codes == [0, 1 if raiser == 1 else 0], (codes, out)
        assert took < 30, "the ranks waited %.1f s: the timeout, not the save" % took
        with libckpt.Store(str(root), readonly=True) as st:
            assert st.latest() == 5, out
            step, got = load_resharded(st, ["rank1.w", "big1"], framework="pt")
        want = torch.arange(3000 + 700, dtype=torch.int32) + 100003 + 5 * 7919
        assert step == 5 and torch.equal(got["rank1.w"], want)
        assert torch.equal(got["big1"], torch.arange(1 << 20, dtype=torch.float32) + 1)

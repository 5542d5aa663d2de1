"""Store.steps() describes each step exactly as `ckpt list --json` does:
the same keys, value types and (for the fields that do not depend on how
the root was spelled) the same values."""

import json
import os
import subprocess

import numpy as np
import pytest

import libckpt
from byteflip import flip_byte
from conftest import open_store, shard_files

# The step object of docs/CLI.md ($defs/step).
KEYS = {"step", "status", "path", "time", "time_iso", "tensors", "raw_bytes",
        "stored_bytes", "ratio", "chunks", "stall_seconds", "persist_seconds",
        "save_seconds", "problems"}
PROBLEM_KEYS = {"step", "status", "code", "message", "file", "tensor",
                "offset"}


def ckpt_cli():
    """The `ckpt` built next to the library under test ($CKPT overrides):
    build/tools/ckpt for build/lib/libckpt.so."""
    exe = os.environ.get("CKPT")
    if not exe:
        lib_dir = os.path.dirname(os.path.abspath(libckpt.library_path))
        tools = os.path.join(os.path.dirname(lib_dir), "tools")
        candidates = [os.path.join(tools, "ckpt"),
                      os.path.join(tools, "ckpt", "ckpt")]
        exe = next((c for c in candidates
                    if os.path.isfile(c) and os.access(c, os.X_OK)),
                   candidates[0])
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        pytest.skip("the ckpt CLI was not built (no %s)" % exe)
    return exe


def cli_list(root, full):
    argv = [ckpt_cli(), "list", str(root), "--json"] + (["--full"] if full else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p
    return json.loads(p.stdout)["steps"]


def kinds(v):
    """JSON type of a value (int and float apart, as jansson writes them)."""
    return type(v).__name__


@pytest.fixture
def listed_root(root):
    rng = np.random.default_rng(3)
    with open_store(root) as store:
        for s in (1, 2, 3):
            store.save(s, {"w": rng.standard_normal(200000),
                           "b": np.arange(s + 1, dtype=np.int32)},
                       metadata={"step": s}).wait()
    flip_byte(shard_files(root, 3)[0])            # chunk data: full check
    os.truncate(shard_files(root, 2)[0], 100)     # quick check fails too
    return root


@pytest.mark.parametrize("full", [False, True])
def test_steps_match_ckpt_list_json(listed_root, full):
    want = cli_list(listed_root, full)
    with open_store(listed_root, readonly=True) as store:
        got = store.steps(full=full)
    assert [e["step"] for e in got] == [e["step"] for e in want] == [1, 2, 3]
    for g, w in zip(got, want):
        assert set(g) == set(w) == KEYS, g["step"]
        for k in ("step", "status", "tensors", "raw_bytes", "stored_bytes",
                  "chunks", "time_iso"):
            assert g[k] == w[k], (g["step"], k)
        for k in KEYS - {"problems"}:
            assert kinds(g[k]) == kinds(w[k]), (g["step"], k, g[k], w[k])
        if w["path"] is not None:
            assert os.path.realpath(g["path"]) == os.path.realpath(w["path"])
        if w["time"] is not None:
            assert g["time"] == pytest.approx(w["time"])
            assert g["ratio"] == pytest.approx(w["ratio"])
            assert g["save_seconds"] == pytest.approx(w["save_seconds"], abs=1e-6)
        assert len(g["problems"]) == len(w["problems"])
        for gp, wp in zip(g["problems"], w["problems"]):
            assert set(gp) == set(wp) == PROBLEM_KEYS
            assert {k: gp[k] for k in PROBLEM_KEYS - {"message"}} == \
                {k: wp[k] for k in PROBLEM_KEYS - {"message"}}
    statuses = [e["status"] for e in got]
    assert statuses[0] == "valid" and statuses[1] in ("incomplete", "corrupt")
    assert statuses[2] == ("corrupt" if full else "valid")

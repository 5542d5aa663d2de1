"""examples/python/train_torch.py: killed with SIGKILL and restarted, it
ends with the loss curve and parameters of an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TOP, sub_env

pytest.importorskip("torch")

TRAIN = os.path.join(TOP, "examples", "python", "train_torch.py")
ARGS = ["--steps", "120", "--every", "10", "--no-fsync"]


def train(tmp, name, *extra, **popen):
    cmd = [sys.executable, TRAIN, "--ckpt", str(tmp / (name + "-ckpt")),
           "--log", str(tmp / (name + ".log"))] + ARGS + list(extra)
    return subprocess.Popen(cmd, env=sub_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def finish(proc):
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path):
    finish(train(tmp_path, "ref"))
    ref = lines(tmp_path / "ref.log")
    assert len(ref) == 121 and ref[-1].startswith("params-sha256 ")

    proc = train(tmp_path, "run", "--step-delay", "0.02")
    log = tmp_path / "run.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(lines(log)) >= 65):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    killed_at = len(lines(log))
    assert killed_at < 120

    out = finish(train(tmp_path, "run"))
    assert "resumed from step" in out
    resumed = int(out.split("resumed from step")[1].split()[0])
    assert 0 < resumed <= killed_at and resumed % 10 == 0
    assert lines(log) == ref


def test_preemption_signal_saves_and_exits_75(tmp_path):
    proc = train(tmp_path, "pre", "--step-delay", "0.02")
    log = tmp_path / "pre.log"
    while not (log.exists() and len(lines(log)) >= 15):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    saved = int(out.split("saved step")[1].split()[0])
    assert saved == len(lines(log))  # the step it stopped after
    out = finish(train(tmp_path, "pre"))
    assert "resumed from step %d" % saved in out

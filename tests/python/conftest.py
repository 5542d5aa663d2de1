"""Shared fixtures.  The binding under test is this checkout's
(bindings/python), and the C library the one $LIBCKPT_LIBRARY names (meson
test sets it to the freshly built lib/libckpt.so)."""

import glob
import os
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINDING = os.path.join(TOP, "bindings", "python")
sys.path.insert(0, BINDING)
# tests/pyhelpers (byteflip.flip_byte ...): shared with tests/cli; meson
# puts it on PYTHONPATH too.
sys.path.insert(0, os.path.join(TOP, "tests", "pyhelpers"))

np = pytest.importorskip("numpy")
import libckpt  # noqa: E402  (a library that fails to load is an error)


def open_store(path, **kw):
    """A store tuned for tests: no fsync, two workers, small chunks."""
    kw.setdefault("fsync", False)
    kw.setdefault("threads", 2)
    kw.setdefault("chunk_bytes", 1 << 20)
    return libckpt.Store(str(path), **kw)


@pytest.fixture
def root(tmp_path):
    return tmp_path / "ckpt"


@pytest.fixture
def store(root):
    s = open_store(root)
    yield s
    s.close()


def step_dir(root, step):
    """The directory of committed step `step`."""
    dirs = [d for d in glob.glob(os.path.join(str(root), "step-*"))
            if int(d.rsplit("-", 1)[1]) == step]
    assert len(dirs) == 1, "no single directory for step %d in %s" % (
        step, os.listdir(str(root)))
    return dirs[0]


def shard_files(root, step):
    files = sorted(glob.glob(os.path.join(step_dir(root, step), "*.shard")))
    assert files, "step %d has no shard file" % step
    return files


def sub_env():
    """Environment for child Python processes using this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = BINDING + os.pathsep + env.get("PYTHONPATH", "")
    env["LIBCKPT_LIBRARY"] = libckpt.library_path
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env

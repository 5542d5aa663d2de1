"""Handles, file descriptors and threads are released; the library is found
and its version and ABI match the binding."""

import ctypes
import gc
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import libckpt
from libckpt import ffi, tensors
from conftest import BINDING, TOP, open_store, sub_env


def fds():
    return len(os.listdir("/proc/self/fd"))


def threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_no_leaked_fds_or_threads_after_many_stores(tmp_path):
    def cycle(i):
        with open_store(tmp_path / ("r%d" % (i % 3)), keep_last=2) as s:
            s.save(i, {"x": np.full(1000, i)}).wait()
            s.load()
            s.restore({"x": np.empty(1000, np.int64)})
            s.verify()
            s.steps()
        with open_store(tmp_path / ("r%d" % (i % 3)), readonly=True) as ro:
            ro.latest()

    cycle(0)  # first-use allocations (loader, caches) happen here
    gc.collect()
    before_fds, before_threads = fds(), threads()
    for i in range(1, 150):
        cycle(i)
    gc.collect()
    assert fds() == before_fds
    assert threads() == before_threads


def test_garbage_collected_store_releases_its_lock(root):
    s = open_store(root)
    s.save(1, {"x": np.ones(3)})  # handle dropped, save in flight
    del s
    gc.collect()
    with open_store(root) as again:  # not BusyError
        assert again.latest() == 1


def test_store_close_waits_for_saves_in_flight(root):
    s = open_store(root)
    h = s.save(1, {"x": np.random.default_rng(0).standard_normal(1 << 21)})
    s.close()
    assert h.done()
    with open_store(root, readonly=True) as ro:
        assert ro.latest() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_keep_the_root_locked(root):
    # A DataLoader worker is forked while the training process holds the
    # write lock (a flock: held while any process has its descriptor).
    # Once the parent closes its store, another writer may open the root
    # while the child still runs; the child's copy of the store is unusable.
    s = open_store(root)
    s.save(1, {"x": np.ones(4)}).wait()
    go_r, go_w = os.pipe()
    said_r, said_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then wait until the parent is done
        try:
            try:
                s.save(2, {"x": np.ones(4)})
                verdict = b"used"
            except ValueError as e:
                verdict = b"refused" if "forked" in str(e) else b"other"
            os.write(said_w, verdict)
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(said_r, 16) == b"refused"
        s.close()
        with open_store(root) as again:  # BusyError while the child lived
            again.save(3, {"x": np.zeros(4)}).wait()
            assert again.latest() == 3
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        for fd in (go_r, go_w, said_r, said_w):
            os.close(fd)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("how", ["close", "ckpt_store_free"])
def test_a_forked_child_can_drop_a_reading_store(root, how):
    # A store opened to read (a restore started its worker threads) is still
    # referenced when a DataLoader worker is forked; if the child closes or
    # drops its copy, freeing it would join threads that do not exist in
    # the child and hang there for ever.  The binding gives the child's copy
    # up at fork, as a writer's; and ckpt_store_free itself, called in the
    # child on the parent's pointer (C code that forks), only lets go of it.
    # The parent's store goes on working.
    with open_store(root) as w:
        w.save(1, {"x": np.arange(1 << 20, dtype=np.float32)}).wait()
    ro = open_store(root, readonly=True)
    step, state = ro.load()
    assert step == 1
    ptr = ro._h._ptr
    said_r, said_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            if how == "close":
                ro.close()
            else:
                ffi.lib.ckpt_store_free(ptr)
            gc.collect()
            os.write(said_w, b"closed")
        finally:
            os._exit(0)
    os.close(said_w)
    try:
        import select
        ready, _, _ = select.select([said_r], [], [], 60)
        verdict = os.read(said_r, 16) if ready else b""
        if not ready:
            os.kill(pid, 9)
        assert verdict == b"closed", "the child hung closing its copy of a reading store"
        step, again = ro.load()  # the parent's store is untouched
        assert step == 1 and np.array_equal(again["x"], state["x"])
    finally:
        os.waitpid(pid, 0)
        os.close(said_r)
        ro.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_is_refused_the_parents_checkpoints_and_saves(root):
    # A Dataset that opens a checkpoint in __init__ (as safetensors'
    # safe_open is used) is copied into DataLoader workers by fork(); a
    # save may be in flight then.  In the child, reading that checkpoint
    # waited for the parent's threads for ever, and so did wait(), done()
    # and the exit of a child holding the SaveHandle (its __del__).  Each
    # must raise ValueError at once naming the fork, never report a save
    # as committed, and let the child exit.  The parent's go on working.
    with open_store(root) as w:
        w.save(1, {"x": np.arange(1 << 16, dtype=np.float32)}).wait()
    ro = open_store(root, readonly=True)
    ck = ro.open()
    writer = open_store(str(root) + "-w")
    h0 = writer.save(1, {"y": np.ones(4)})  # done and closed before the fork:
    h0.wait()                                # its outcome is known there too
    h0.close()
    big = {"y": np.random.default_rng(0).standard_normal(1 << 22)}
    h = writer.save(2, big)
    said_r, said_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            verdicts = []
            for name, call in (("read", lambda: ck.get_tensor("x")),
                               ("wait", h.wait), ("done", h.done),
                               ("stats", lambda: h.stats),
                               ("save", lambda: writer.save(3, big))):
                try:
                    call()
                    verdicts.append("%s:returned" % name)
                except ValueError as e:
                    verdicts.append("%s:%s" % (
                        name, "refused" if "fork" in str(e) else repr(e)))
                    if name == "save" and not str(e).startswith("store"):
                        verdicts.append("(not the store's error: %s)" % e)
            h0.wait()
            verdicts.append("done0:%s" % h0.done())
            h.__del__()  # what the child's exit runs
            ck.close()
            os.write(said_w, " ".join(verdicts).encode())
        finally:
            os._exit(0)
    os.close(said_w)
    try:
        import select
        ready, _, _ = select.select([said_r], [], [], 60)
        verdict = os.read(said_r, 4096).decode() if ready else ""
        if not ready:
            os.kill(pid, 9)
        assert verdict == ("read:refused wait:refused done:refused "
                           "stats:refused save:refused done0:True"), \
            verdict or "the child hung"
        h.wait()  # the parent's save and checkpoint are untouched
        assert np.array_equal(ck.get_tensor("x"),
                              np.arange(1 << 16, dtype=np.float32))
        assert writer.latest() == 2
    finally:
        os.waitpid(pid, 0)
        os.close(said_r)
        ck.close()
        ro.close()
        writer.close()
        shutil.rmtree(str(root) + "-w", ignore_errors=True)


@pytest.mark.parametrize("reader", ["load", "verify", "steps"])
def test_readers_see_the_save_this_store_began(root, reader):
    # save() returns at the snapshot; the calls that read steps wait for
    # the save in flight (a slow one: every chunk compressed at level 9),
    # as the C calls do, instead of finding no checkpoint yet.
    x = np.random.default_rng(1).standard_normal(1 << 23).astype(np.float32)
    with open_store(root, level=9, compress_all=True) as s:
        s.save(5, {"x": x}, metadata={"n": 1})
        if reader == "load":
            step, state = s.load()
            assert step == 5 and np.array_equal(state["x"], x)
        elif reader == "verify":
            report = s.verify()
            assert report["step"] == 5 and report["ok"], report
        else:
            assert [e["step"] for e in s.steps()] == [5]


def test_versions_agree():
    major, minor, _ = (int(x) for x in libckpt.__version__.split("."))
    assert ffi.LIBRARY_VERSION_NUMBER // 100 == major * 100 + minor
    assert libckpt.library_version().startswith("%d.%d." % (major, minor))
    # The wheel's version is that of bindings/python/meson.build (pip,
    # meson-python: pyproject.toml's version is dynamic); it and the C
    # library's project version must both be the binding's.
    with open(os.path.join(BINDING, "pyproject.toml")) as f:
        assert re.search(r'^dynamic\s*=\s*\["version"\]', f.read(), re.M)
    for build in (os.path.join(TOP, "meson.build"), os.path.join(BINDING, "meson.build")):
        with open(build) as f:
            m = re.search(r"version\s*:\s*'([^']+)'", f.read())
        assert m and m.group(1) == libckpt.__version__, (build, m and m.group(1))


def test_dtype_table_agrees_with_the_library():
    for npdt, code in tensors._NUMPY.items():
        assert ffi.lib.ckpt_dtype_size(code) == npdt.itemsize, npdt
        assert ffi.lib.ckpt_dtype_name(code).decode() == npdt.name, npdt
        assert ffi.lib.ckpt_dtype_from_name(npdt.name.encode()) == code
    for code, name, size in ((ffi.CKPT_BF16, "bfloat16", 2),
                             (ffi.CKPT_F8_E4M3, None, 1),
                             (ffi.CKPT_F8_E5M2, None, 1),
                             (ffi.CKPT_BYTES, None, 1)):
        assert ffi.lib.ckpt_dtype_size(code) == size
        if name:
            assert ffi.lib.ckpt_dtype_name(code).decode() == name
    assert ffi.lib.ckpt_dtype_size(ffi.CKPT_BYTES + 1) == 0


STRUCTS = {
    "ckpt_tensor": ["name", "data", "bytes", "dtype", "ndim", "shape",
                    "memory"],
    "ckpt_store_options": ["version", "flags", "level", "threads",
                           "chunk_bytes", "host_memory_limit", "keep_last",
                           "fsync", "verify_after_save", "snapshot_mode",
                           "pinned_limit", "metrics_path"],
    "ckpt_save_options": ["version", "metadata_json", "cuda_stream"],
    "ckpt_save_stats": ["step", "raw_bytes", "stored_bytes", "chunks",
                        "stall_s", "persist_s"],
    "ckpt_problem": ["step", "status", "message", "file", "tensor", "offset"],
    "ckpt_restore_options": ["version", "allow_missing", "cuda_stream"],
    "ckpt_tensor_info": ["name", "dtype", "ndim", "shape", "bytes",
                         "stored_bytes", "chunks"],
}


def test_ctypes_structs_match_the_header(tmp_path):
    """Compile a probe against include/ckpt.h and compare every struct's
    size and field offsets with the ctypes declarations."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "ckpt.h"',
             "int main(void) {"]
    for s, fields in STRUCTS.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (s, s))
        for f in fields:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));'
                         % (s, f, s, f))
    lines.append("return 0; }")
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(TOP, "include"),
                    str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    want = dict(line.split() for line in out if line)
    for s, fields in STRUCTS.items():
        cls = getattr(ffi, s)
        assert ctypes.sizeof(cls) == int(want[s]), s
        for f in fields:
            assert getattr(cls, f).offset == int(want["%s.%s" % (s, f)]), \
                (s, f)


def run_import(env, cwd=None):
    return subprocess.run(
        [sys.executable, "-c",
         "import libckpt; print(libckpt.library_path)"],
        env=env, cwd=cwd, capture_output=True, text=True)


def test_library_from_environment_variable_only():
    env = sub_env()
    env["LIBCKPT_LIBRARY"] = "/nonexistent/libckpt.so"
    r = run_import(env)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "/nonexistent/libckpt.so" in r.stderr
    # a quoted '~' reaches Python unexpanded: said so
    env["LIBCKPT_LIBRARY"] = "~/nonexistent/libckpt.so.0"
    r = run_import(env)
    assert r.returncode != 0
    assert "the shell did not expand" in r.stderr and "$HOME" in r.stderr, r.stderr


def test_library_next_to_the_package(tmp_path):
    pkg = tmp_path / "site" / "libckpt"
    shutil.copytree(os.path.join(BINDING, "libckpt"), str(pkg),
                    ignore=shutil.ignore_patterns("__pycache__", "*.in",
                                                  "_install.py"))
    shutil.copy(os.path.realpath(libckpt.library_path),
                str(pkg / "libckpt.so.0"))
    env = sub_env()
    del env["LIBCKPT_LIBRARY"]
    env["PYTHONPATH"] = str(tmp_path / "site")
    r = run_import(env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(pkg / "libckpt.so.0")


@pytest.mark.parametrize("option, value", [
    ("keep_last", 2**32 + 1), ("keep_last", -1), ("level", 2**32 + 1),
    ("threads", 2**32 + 2), ("chunk_bytes", -1), ("host_memory_limit", -1),
    ("pinned_limit", -1)])
def test_integer_options_out_of_range_are_refused_as_passed(root, option, value):
    # ctypes would store them wrapped (keep_last=2**32+1 kept one step)
    with pytest.raises(ValueError, match=r"%s=%d is out of range" % (option, value)):
        libckpt.Store(str(root), **{option: value})
    assert not root.exists() or not any(root.iterdir())


@pytest.mark.parametrize("blocked_in", ["wait", "next save"])
def test_ctrl_c_interrupts_a_wait_for_a_save(root, blocked_in):
    # A save at zstd level 19 of 8 MiB of random bytes takes seconds on
    # one thread; SIGINT comes 50 ms into the wait.  Before, the C wait
    # held KeyboardInterrupt back until the save had committed.
    import signal
    import threading
    x = np.random.default_rng(3).integers(0, 255, 8 << 20, np.uint8)
    with open_store(root, level=19, compress_all=True, threads=1) as s:
        h = s.save(1, {"x": x})
        sent_while_running = []

        def interrupt():
            sent_while_running.append(not h.done())
            os.kill(os.getpid(), signal.SIGINT)
        timer = threading.Timer(0.05, interrupt)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                if blocked_in == "wait":
                    h.wait()
                else:
                    s.save(2, {"x": x[:8]})
            running_when_raised = not h.done()
        finally:
            timer.join()
        if not sent_while_running[0]:
            pytest.skip("the save ended before the signal was sent")
        # raised while the save still ran, not once the wait returned
        assert running_when_raised
        h.wait()  # the save went on, and its outcome is still there
        assert s.latest() == 1

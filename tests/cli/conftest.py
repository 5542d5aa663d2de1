"""pytest set-up of the CLI tests: the shared helpers on sys.path, the `tmp`
fixture, and exit status 77 (meson's SKIP) when every test skipped."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# clitest.py, and tests/pyhelpers (shared with tests/python; meson puts it on
# PYTHONPATH as well).
for _d in (os.path.join(os.path.dirname(HERE), "pyhelpers"), HERE):
    if _d not in sys.path:
        sys.path.insert(0, _d)


@pytest.fixture
def tmp(request):
    """A fresh directory (a str) under $TMPDIR, removed afterwards even when a
    test left parts of it read-only.  Not pytest's tmp_path: that lies in a
    0700 directory, which readonly_root's fall-back (running ckpt as user
    nobody) could not enter."""
    d = tempfile.mkdtemp(prefix="ckpt-%s-" % request.node.name)
    try:
        yield d
    finally:
        subprocess.run(["chmod", "-R", "u+w", d], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


_passed = _skipped = 0


def pytest_runtest_logreport(report):
    global _passed, _skipped
    if report.when == "call" and report.passed:
        _passed += 1
    elif report.skipped:
        _skipped += 1


def pytest_sessionfinish(session, exitstatus):
    # Nothing ran but skips (no HDF5 in this build, say): exit 77, which
    # `meson test` shows as SKIP rather than OK.
    if exitstatus == 0 and _passed == 0 and _skipped:
        session.exitstatus = 77

"""The store options for shared servers, from Python: a lower step is
refused unless rewinding, a group-writable root needs trust_group, the
command line can be left out of the manifest."""
import json
import os

import numpy as np
import pytest

import libckpt


def test_lower_step_is_refused_and_rewind_goes_back(tmp_path):
    a = {"w": np.arange(8, dtype=np.float32)}
    with libckpt.Store(tmp_path / "r", fsync=False) as st:
        st.save(10, a).wait()
        st.save(30, a).wait()
        with pytest.raises(libckpt.InvalidArgumentError, match="below step 30"):
            st.save(20, a)
        assert [e["step"] for e in st.steps()] == [10, 30]
    with libckpt.Store(tmp_path / "r", fsync=False, rewind=True) as st:
        st.save(20, {"w": np.ones(8, dtype=np.float32)}).wait()
        assert [e["step"] for e in st.steps()] == [10, 20]
        step, state = st.load()
        assert step == 20 and state["w"][0] == 1


def test_group_writable_root_needs_trust_group(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(libckpt.AccessError, match="o-w"):
        libckpt.Store(root, fsync=False, trust_group=True)
    os.chmod(root, 0o750)
    with libckpt.Store(root, fsync=False, trust_group=True) as st:
        st.save(1, {"w": np.zeros(4, np.float32)}).wait()


def test_command_line_can_be_left_out(tmp_path):
    with libckpt.Store(tmp_path / "r", fsync=False, record_command_line=False) as st:
        st.save(1, {"w": np.zeros(4, np.float32)}).wait()
    manifest = tmp_path / "r" / "step-000000000001" / "manifest.json"
    env = json.loads(manifest.read_text())["env"]
    assert env["command_line"] == "(not recorded)"
    assert manifest.stat().st_mode & 0o007 == 0


def test_reading_another_users_root_warns_whose_it_is(tmp_path):
    """Reading a root another user owns is allowed (a colleague's run), but
    on a shared server a root at a job's expected path may have been made by
    someone else before the job ran: Store(readonly=True) warns, naming the
    owner, and still reads; one's own root gets no warning."""
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    import warnings
    root = tmp_path / "r"
    with libckpt.Store(root, fsync=False) as st:
        st.save(1, {"w": np.arange(4, dtype=np.float32)}).wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with libckpt.Store(root, readonly=True) as st:
            assert st.load().step == 1
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), 65534, -1)
    os.lchown(root, 65534, -1)
    with pytest.warns(libckpt.ForeignRootWarning, match="belongs to uid 65534"):
        st = libckpt.Store(root, readonly=True)
    with st:
        assert st.load().step == 1


def test_reading_through_another_users_link_warns(tmp_path):
    """Store(readonly=True) through a link another user planted (a writer
    refuses it) still reads, and warns naming the link and its owner; a
    link of one's own gets no warning."""
    if os.geteuid() != 0:
        pytest.skip("making a link owned by another user needs root")
    import warnings
    root = tmp_path / "r"
    with libckpt.Store(root, fsync=False) as st:
        st.save(1, {"w": np.arange(4, dtype=np.float32)}).wait()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "mine").symlink_to(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        libckpt.Store(shared / "mine", readonly=True).close()
    planted = shared / "job"
    planted.symlink_to(root)
    os.lchown(planted, 65534, 65534)
    with pytest.warns(libckpt.ForeignRootWarning,
                      match="goes through the symbolic link .*job.*uid 65534"):
        with libckpt.Store(planted, readonly=True) as st:
            assert st.load()[0] == 1
    with pytest.raises(libckpt.AccessError, match="symbolic link"):
        libckpt.Store(planted, fsync=False)

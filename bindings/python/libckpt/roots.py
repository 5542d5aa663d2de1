"""A checkpoint root that is not plainly the caller's: owned by another
user, or reached through another user's symbolic link.  Reading one is
allowed (a colleague's run) but warned about (ForeignRootWarning), since
on a shared server a root at a job's expected path may have been made by
someone else before the job ran; writers are refused by the C library."""

from __future__ import annotations

import os
import stat
import warnings
from typing import Any, Optional, Tuple

from .errors import ForeignRootWarning


def _user_label(uid: int) -> str:
    try:
        import pwd
        return "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except (ImportError, KeyError):
        return "uid %d" % uid


def _foreign_link(path: str) -> Optional[Tuple[str, str, int]]:
    """(link, target, owner) of the first symbolic link on the way to
    `path` that belongs to neither the caller nor root, resolved one
    component at a time as the kernel does; None when there is none."""
    cur = "/" if path.startswith("/") else os.getcwd()
    rest = [c for c in path.split("/") if c]
    hops = 0
    while rest and hops < 40:
        name = rest.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur) or "/"
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError:
            return None
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        try:
            to = os.readlink(nxt)
        except OSError:
            return None
        if st.st_uid not in (os.geteuid(), 0):
            return nxt, to, st.st_uid
        rest = [c for c in to.split("/") if c] + rest
        if to.startswith("/"):
            cur = "/"
        hops += 1
    return None


def note_foreign_root(path: Any) -> None:
    """Warn (ForeignRootWarning) when a root opened for reading belongs to
    another user: allowed (a colleague's run), but on a shared server a root
    at a job's expected path may have been made by someone else before the
    job ran, and its checkpoints are theirs; or when one's own root is
    reached through another user's symbolic link (which a writer refuses),
    which may lead to another run than the path names (ckpt's reading
    commands say the same on stderr)."""
    name = os.fsdecode(os.fspath(path))
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return
    if uid not in (os.geteuid(), 0):
        warnings.warn("%s belongs to %s, not to you: its checkpoints are that "
                      "user's (checksums prove integrity, not origin)"
                      % (name, _user_label(uid)), ForeignRootWarning,
                      stacklevel=3)
        return
    found = _foreign_link(name)
    if found:
        link, to, owner = found
        warnings.warn("%s goes through the symbolic link %s (-> %s), which "
                      "belongs to %s: it leads to %s, which may be another "
                      "run than this path names (a writer refuses such a link)"
                      % (name, link, to, _user_label(owner),
                         os.path.realpath(name)), ForeignRootWarning,
                      stacklevel=3)

"""Problem records and step listings, in one scheme everywhere.

A problem (Store.verify()["problems"], Store.steps()[i]["problems"],
NoCheckpointError.skipped, the ``skipped`` of load/restore/open results)
is the ``problem`` object of ``ckpt list --json`` / ``ckpt verify --json``
(docs/CLI.md): ``status`` is the status in words as ckpt_status_name()
gives it ("corrupt", "incomplete", "io"...), ``code`` the CKPT_E* number
(-6...), plus step, message, file, tensor and offset (None when unknown).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import time
import warnings
from typing import Any, Dict, List, Optional

from . import ffi
from .errors import (AccessError, CorruptError, Error, IncompleteError,
                     InternalError, IoError, NoCheckpointError, NotFoundError,
                     SkippedCheckpointWarning, VersionError)

C = ffi.lib
_byref = ctypes.byref

#: Skipped checkpoints are logged here (as well as warned about).
logger = logging.getLogger("libckpt")
logger.addHandler(logging.NullHandler())  # a library does not print

# The keys of a step of `ckpt list --json` (docs/CLI.md, $defs/step).
LIST_KEYS = ("step", "status", "path", "time", "time_iso", "tensors",
             "raw_bytes", "stored_bytes", "ratio", "chunks", "stall_seconds",
             "persist_seconds", "save_seconds", "problems")

Problem = Dict[str, Any]


def status_word(status: int) -> str:
    """A status code in words, as the library names it for the CLI
    (ckpt_status_name): "corrupt" for -6."""
    name = C.ckpt_status_name(status)
    return name.decode("ascii") if name else "unknown"


def problem(step: Optional[int], code: int, message: str,
            file: Optional[str] = None, tensor: Optional[str] = None,
            offset: Optional[int] = None) -> Problem:
    """One problem record (the CLI's ``problem``)."""
    return {"step": step if step is not None and step >= 0 else None,
            "status": status_word(code), "code": code,
            "message": message or "", "file": file or None,
            "tensor": tensor or None,
            "offset": offset if offset is not None and offset >= 0 else None}


def from_report(report: Any) -> List[Problem]:
    """The problems of a ckpt_report."""
    out = []
    if not report:
        return out
    for i in range(C.ckpt_report_count(report)):
        p = C.ckpt_report_get(report, i).contents

        def text(b: Optional[bytes]) -> str:
            return (b or b"").decode("utf-8", "replace")
        out.append(problem(p.step, p.status, text(p.message), text(p.file),
                           text(p.tensor), p.offset))
    return out


def from_error(step: int, err: Error) -> Problem:
    code = err.status if err.status is not None else InternalError.status
    return problem(step, code, err.message)


def report_skipped(problems: List[Problem], stacklevel: int = 3) -> None:
    """Say that newer checkpoints were passed over: a warning for people
    (pointing `stacklevel` frames up: the caller of the Store method), a
    log record (logger "libckpt") for programs."""
    for p in problems:
        text = "libckpt: skipped step %s: %s" % (p["step"], p["message"])
        logger.warning(text)
        warnings.warn(text, SkippedCheckpointWarning, stacklevel=stacklevel)


def no_checkpoint(err: Error, skipped: List[Problem], root: Any,
                  stacklevel: int = 3,
                  head: str = "no valid checkpoint in") -> None:
    """Before `err` is raised by a search for the newest step that found
    none it could use: `skipped` (the steps it passed over, newest first)
    become err.skipped and are reported as report_skipped reports those
    passed over before an older step is taken (a warning pointing
    `stacklevel` frames up from the caller, a log record): a job that
    catches NoCheckpointError and starts afresh must not lose every
    step silently.  A NoCheckpointError's message then says that they
    were found damaged, naming them, so that it does not read as a root
    with no checkpoint in it ("`head` `root`: ...")."""
    err.skipped = skipped
    report_skipped(skipped, stacklevel=stacklevel + 1)
    if not skipped or not isinstance(err, NoCheckpointError):
        return
    n = len(skipped)
    err.message = (
        "%s %s: %d checkpoint%s found damaged, each skipped: %s; the "
        "newest because: %s"
        % (head, os.fsdecode(root) if isinstance(root, bytes) else root, n,
           "" if n == 1 else "s",
           ", ".join("step %s (%s)" % (p["step"], p["status"])
                     for p in skipped), skipped[0]["message"]))
    err.args = (err.message,)


def skipped_after(store: Any, found: int,
                  level: int = ffi.CKPT_VERIFY_FULL) -> List[Problem]:
    """The committed steps newer than `found` (those a newest-valid search
    passed over), newest first, each with its first problem."""
    skipped = []
    for s in reversed(store._step_numbers()):
        if s <= found:
            break
        report = ffi.report_p()
        try:
            with store._h.use() as h:
                C.ckpt_verify(h, s, level, _byref(report))
        except NotFoundError:
            continue  # retired meanwhile
        except Error as e:
            problems = from_report(report)
            skipped.append(problems[0] if problems else from_error(s, e))
        finally:
            C.ckpt_report_free(report)
    return skipped


def is_damage(err: Error) -> bool:
    """Whether `err` is the library saying a step is damaged (one of the
    statuses its newest-valid search passes over), not a wrong call, nor
    an error the binding found in what the library handed it (a state
    structure of a newer version: raised, as before)."""
    return (str(err.function or "").startswith("ckpt_")
            and err.status in (CorruptError.status, IncompleteError.status,
                               IoError.status, VersionError.status,
                               NotFoundError.status, AccessError.status))


def first_problem(store: Any, step: int, err: Error) -> Problem:
    """Why `step` cannot be loaded, as skipped_after says it: the first
    problem a full verification finds (with file, tensor and offset), or
    `err` itself when verification finds none."""
    report = ffi.report_p()
    try:
        with store._h.use() as h:
            C.ckpt_verify(h, step, ffi.CKPT_VERIFY_FULL, _byref(report))
        problems = []
    except Error:
        problems = from_report(report)
    finally:
        C.ckpt_report_free(report)
    return problems[0] if problems else from_error(step, err)


def verify_full(store: Any, step: int) -> None:
    """Full verification of `step`: raises what the library raises."""
    with store._h.use() as h:
        C.ckpt_verify(h, step, ffi.CKPT_VERIFY_FULL, None)


def verify(store: Any, step: Optional[int], full: bool) -> Dict[str, Any]:
    """Store.verify's report of `step` (None: the newest committed)."""
    level = ffi.CKPT_VERIFY_FULL if full else ffi.CKPT_VERIFY_QUICK
    report = ffi.report_p()
    error = None
    try:
        with store._h.use() as s:
            C.ckpt_verify(s, ffi.CKPT_NEWEST if step is None else step,
                          level, _byref(report))
    except CorruptError as e:
        error = e
    try:
        checked = C.ckpt_report_step(report) if report else -1
        problems = from_report(report)
    finally:
        C.ckpt_report_free(report)
    if checked < 0:
        checked = step
    if error is None:
        status = "valid"
    else:
        status = ("incomplete" if isinstance(error, IncompleteError)
                  else "corrupt")
    return {"step": checked, "ok": error is None, "status": status,
            "level": "full" if full else "quick",
            "error": error.message if error else None,
            "problems": problems}


def list_entry(store: Any, step: int, level: int) -> Optional[Dict[str, Any]]:
    """One step as ``ckpt list --json`` shows it (tools/ckpt/store.c,
    cli_step_check and cli_step_json); None if it was retired
    meanwhile."""
    e: Dict[str, Any] = dict.fromkeys(LIST_KEYS)
    e["step"] = step
    opened = False
    with store._h.use() as s:
        ck = ffi.checkpoint_p()
        try:
            C.ckpt_checkpoint_open(_byref(ck), s, step, ffi.CKPT_VERIFY_QUICK)
            opened = True
        except Error:
            pass  # ckpt_verify() below says why
        if opened:
            try:
                _describe(ck, e)
            finally:
                C.ckpt_checkpoint_free(ck)
            if level == ffi.CKPT_VERIFY_QUICK:  # opening checked that
                e.update(status="valid", problems=[])
                return e
        status, message = 0, None
        report = ffi.report_p()
        C.ckpt_error_clear()
        try:
            C.ckpt_verify(s, step, level, _byref(report))
        except Error as err:
            status = (err.status if err.status is not None
                      else InternalError.status)
            message = err.message
        try:
            problems = from_report(report)
        finally:
            C.ckpt_report_free(report)
    if status == NotFoundError.status and step not in store._step_numbers():
        return None  # retired meanwhile
    if status and not problems:
        problems = [problem(step, status, message or "")]
    e["status"] = _list_status(status, problems)
    e["problems"] = problems
    return e


def _describe(ck: Any, e: Dict[str, Any]) -> None:
    t = C.ckpt_checkpoint_time(ck)
    e.update(path=os.fsdecode(C.ckpt_checkpoint_path(ck)), time=float(t),
             time_iso=_iso_time(t),
             tensors=int(C.ckpt_checkpoint_tensor_count(ck)))
    st = ffi.ckpt_save_stats()
    try:
        C.ckpt_checkpoint_stats(ck, _byref(st))
    except Error:
        return
    e.update(raw_bytes=st.raw_bytes, stored_bytes=st.stored_bytes,
             ratio=(st.raw_bytes / st.stored_bytes
                    if st.stored_bytes else None),
             chunks=st.chunks, stall_seconds=float(st.stall_s),
             persist_seconds=float(st.persist_s),
             save_seconds=float(st.stall_s + st.persist_s))


def _list_status(status: int, problems: List[Problem]) -> str:
    """valid, incomplete, corrupt or error, as the CLI classifies a step."""
    if status == 0:
        return "valid"
    incomplete = IncompleteError.status
    if status == incomplete or any(p["code"] == incomplete for p in problems):
        return "incomplete"
    if status == CorruptError.status:
        return "corrupt"
    return "error"


def _iso_time(t: float) -> str:
    """Unix seconds as "2024-05-01T12:00:00Z" (UTC), "-" when unknown."""
    if not (t > 0) or not math.isfinite(t):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))


def record_restore(store: Any, step: int, err: Optional[Error],
                   skipped: List[Problem]) -> None:
    """Say in the root's event log (and so its metrics) that Store.load
    restored ``step`` passing over ``skipped``, or failed with ``err``, as
    ckpt_restore says of its own restores.  Best effort: a log that cannot
    take it (or a library without the call) never fails the load."""
    keep = []  # the encoded strings, alive until the call returns

    def text(v: Any) -> Optional[bytes]:
        b = None if v is None else os.fsencode(str(v))
        keep.append(b)
        return b
    arr = (ffi.ckpt_problem * max(len(skipped), 1))()
    for i, p in enumerate(skipped):
        arr[i] = ffi.ckpt_problem(
            -1 if p.get("step") is None else p["step"], p.get("code") or 0,
            text(p.get("message") or ""), text(p.get("file") or ""),
            text(p.get("tensor") or ""),
            -1 if p.get("offset") is None else p["offset"])
    status = 0 if err is None else err.status
    try:
        with store._h.use() as s:
            C.ckpt_store_record_restore(
                s, step if err is None else -1, status,
                None if err is None else text(err.message), arr, len(skipped))
    except Error:
        pass

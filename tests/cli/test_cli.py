"""Every `ckpt` subcommand and exit code, text and --json (validated against
the schemas in docs/CLI.md), on valid, corrupt, incomplete, empty, missing
and read-only roots."""

import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import jsonschema
import pytest

from byteflip import flip_byte
from clitest import (CKPT, check, ckpt, ckpt_json, data_files, expect_rc, full_schema,
                     make_step, names, python_env, run, schema_errors, schemas, step_dir,
                     validate)

STEPS = (10, 20, 30)


def valid_root(tmp, steps=STEPS):
    root = os.path.join(tmp, "root")
    for s in steps:
        make_step(root, s)
    return root


def statuses(doc):
    return {s["step"]: s["status"] for s in doc["steps"]}


# ---------------------------------------------------------------- schemas

def test_docs_schemas_are_draft_2020_12(tmp):
    """docs/CLI.md has a valid draft 2020-12 schema for every command and the
    error document, and the validator the tests use rejects what they must."""
    check(set(schemas()) == {"$defs", "error", "list", "verify", "latest", "inspect", "gc",
                             "doctor", "export", "import", "log", "health"},
          "schema blocks %s" % sorted(schemas()))
    for name in schemas():
        if name != "$defs":
            jsonschema.Draft202012Validator.check_schema(full_schema(name))
    # a real document passes; an unknown field, a missing one, a wrong type,
    # a value out of an enum or under a minimum, a float for an integer and
    # a bad item behind a $ref do not
    root = valid_root(tmp, (10,))
    _, doc = ckpt_json("list", "list", root, rc=0)
    check(schema_errors(doc, "list") == [], "list document rejected")
    step = doc["steps"][0]
    problem = {"step": 10, "status": "corrupt", "code": -1, "message": "m", "file": None,
               "tensor": None, "offset": "5"}
    for bad, where in (({**doc, "extra": 1}, "$"),
                       ({k: v for k, v in doc.items() if k != "root"}, "$"),
                       ({**doc, "latest_valid": "10"}, "$.latest_valid"),
                       ({**doc, "verify": "fast"}, "$.verify"),
                       ({**doc, "latest_valid": 10.0}, "$.latest_valid"),
                       ({**doc, "steps": [{**step, "step": -1}]}, "$.steps[0].step"),
                       ({**doc, "steps": [{**step, "problems": [problem]}]},
                        "$.steps[0].problems[0].offset")):
        errors = schema_errors(bad, "list")
        check(len(errors) == 1 and errors[0].startswith(where + ": "),
              "expected one error at %s, got %s" % (where, errors))
    check(schema_errors({"error": {"message": "m", "status": None, "exit_code": 4}}, "error"),
          "exit_code 4 accepted")


# ------------------------------------------------------------------ usage

def test_help_and_usage_errors(tmp):
    root = valid_root(tmp, (10,))
    r = expect_rc(ckpt("--help"), 0)
    for cmd in ("list", "verify", "latest", "inspect", "gc", "doctor", "export", "import"):
        check(cmd in r.out, "ckpt --help does not mention " + cmd, r)
        h = expect_rc(ckpt(cmd, "--help"), 0)
        check("Exit codes" in h.out and "Usage: ckpt " + cmd in h.out,
              "ckpt %s --help lacks usage or exit codes" % cmd, h)
        expect_rc(ckpt("help", cmd), 0)
    expect_rc(ckpt("--version"), 0)
    expect_rc(ckpt(), 2)
    for argv in (["bogus"], ["list"], ["list", root, "extra"], ["list", root, "--bogus"],
                 ["verify", root, "--step", "10", "--all"], ["verify", root, "--step", "x"],
                 ["verify", root, "--step", "-5"], ["gc", root], ["gc", root, "--keep-last", "0"],
                 ["latest", root, "--full=1"], ["inspect", root, "--step"],
                 ["export", root, os.path.join(tmp, "o.h5"), "--codec", "lz4"],
                 ["-x"]):
        r = expect_rc(ckpt(*argv), 2)
        check(r.out == "", "usage error printed on stdout", r)
        check(r.err.strip(), "usage error without a message", r)
        # --json: the error is a JSON document on stdout
        ckpt_json(None, *argv, rc=2)


def test_json_after_a_bad_argument(tmp):
    """--json anywhere on the line makes a usage error a JSON document, also
    when the bad argument comes first."""
    root = valid_root(tmp, (10,))
    for argv in (["list", root, "--bogus", "--json"], ["list", "--bogus", root, "--json"],
                 ["verify", root, "--step", "x", "--json"], ["list", root, "extra", "--json"],
                 ["bogus", "--json"], ["-x", "list", root, "--json"],
                 ["gc", root, "--keep-last", "0", "--json"]):
        r = expect_rc(ckpt(*argv), 2)
        doc = r.json()
        check(set(doc) == {"error"} and doc["error"]["exit_code"] == 2
              and doc["error"]["status"] is None, "not the JSON error document", r)
        validate(doc, "error")
        check(r.err == "", "text usage error on stderr besides the JSON", r)
    # A value that looks like --json is the option's value, not the flag.
    r = expect_rc(ckpt("verify", root, "--step", "--json"), 2)
    check(r.out == "" and "--json" in r.err, "--step's value taken as --json", r)


def test_usage_error_prefix(tmp):
    """main()'s own errors say "ckpt: ...", a command's "ckpt CMD: ..."."""
    for argv, want in ((["bogus"], "ckpt: unknown command 'bogus'"),
                       (["-x"], "ckpt: unknown option '-x'"),
                       (["help", "bogus"], "ckpt: unknown command 'bogus'"),
                       (["list", "--bogus"], "ckpt list: unknown option '--bogus'")):
        r = expect_rc(ckpt(*argv), 2)
        first = r.err.splitlines()[0] if r.err else ""
        check(first == want, "expected %r first on stderr" % want, r)
        check("ckpt ckpt" not in r.err, "doubled prefix", r)


def test_gc_help_says_full_verification(tmp):
    h = expect_rc(ckpt("gc", "--help"), 0)
    text = " ".join(h.out.split())
    check("newest step that passes full verification" in text and
          "passes quick" not in text, "gc --help: which step is never removed", h)


# ------------------------------------------------------------------- list

def test_list_valid(tmp):
    root = valid_root(tmp)
    r = expect_rc(ckpt("list", root), 0)
    lines = r.out.strip().splitlines()
    check(lines[0].split()[:2] == ["STEP", "STATUS"], "no header", r)
    check([l.split()[:2] for l in lines[1:]] == [[str(s), "valid"] for s in STEPS],
          "list rows", r)
    check(r.err == "", "stderr not empty without a terminal", r)
    _, doc = ckpt_json("list", "list", root, rc=0)
    check(statuses(doc) == {s: "valid" for s in STEPS}, "statuses %s" % doc)
    check(doc["latest_valid"] == 30 and doc["verify"] == "quick", "latest_valid/verify")
    raw = 0
    for n, dt, sh in names():
        size = {"bool": 1, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4,
                "int32": 4, "uint64": 8, "int64": 8, "float16": 2, "bfloat16": 2,
                "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}.get(dt, 1)
        for d in sh:
            size *= d
        raw += size
    for s in doc["steps"]:
        check(s["tensors"] == len(names()), "tensor count %s" % s)
        check(s["raw_bytes"] == raw, "raw_bytes %s != %d" % (s["raw_bytes"], raw))
        check(s["stored_bytes"] > 0 and s["ratio"] > 0 and s["chunks"] > 0, "sizes %s" % s)
        check(s["path"] == os.path.realpath(step_dir(root, s["step"])) or
              s["path"] == step_dir(root, s["step"]), "path %s" % s["path"])
        check(s["problems"] == [], "problems on a valid step")
    _, doc = ckpt_json("list", "list", root, "--full", rc=0)
    check(doc["verify"] == "full" and statuses(doc) == {s: "valid" for s in STEPS}, "full")


def test_list_corrupt_incomplete(tmp):
    root = valid_root(tmp)
    # a byte flipped inside chunk data: only full verification sees it
    flip_byte(data_files(root, 30)[0])
    _, doc = ckpt_json("list", "list", root, rc=0)
    check(statuses(doc)[30] == "valid", "quick list flags data corruption? %s" % doc)
    _, doc = ckpt_json("list", "list", root, "--full", rc=0)
    check(statuses(doc) == {10: "valid", 20: "valid", 30: "corrupt"}, "full %s" % doc)
    check(doc["latest_valid"] == 20, "latest_valid")
    check(doc["steps"][2]["problems"], "no problem listed for the corrupt step")
    r = expect_rc(ckpt("list", root, "--full"), 0)
    check("corrupt" in r.out, "text list lacks corrupt", r)
    # a damaged manifest fails quick verification
    flip_byte(os.path.join(step_dir(root, 20), "manifest.json"), 40)
    _, doc = ckpt_json("list", "list", root, rc=0)
    check(statuses(doc)[20] == "corrupt", "manifest damage: %s" % statuses(doc))
    check(doc["steps"][1]["path"] is None and doc["steps"][1]["raw_bytes"] is None,
          "fields of an unreadable step must be null")
    # a missing shard: incomplete
    for f in data_files(root, 10):
        os.unlink(f)
    _, doc = ckpt_json("list", "list", root, rc=0)
    check(statuses(doc)[10] == "incomplete", "missing shard: %s" % statuses(doc))
    check(any(p["status"] == "incomplete" for p in doc["steps"][0]["problems"]) or
          doc["steps"][0]["problems"], "no problem for the incomplete step")
    # nothing valid left at quick level? 30 still passes quick
    for f in data_files(root, 30):
        os.unlink(f)
    _, doc = ckpt_json("list", "list", root, rc=1)
    check(doc["latest_valid"] is None, "latest_valid should be null")
    r = expect_rc(ckpt("list", root), 1)
    check("no valid checkpoint" in r.err, "message for no valid checkpoint", r)


def test_list_empty_and_missing(tmp):
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    _, doc = ckpt_json("list", "list", empty, rc=1)
    check(doc["steps"] == [] and doc["latest_valid"] is None, "empty list %s" % doc)
    r = expect_rc(ckpt("list", empty), 1)
    check(r.out == "" and "no checkpoints" in r.err, "empty text", r)
    missing = os.path.join(tmp, "missing")
    r = expect_rc(ckpt("list", missing), 3)
    check(missing in r.err, "error does not name the directory", r)
    _, doc = ckpt_json(None, "list", missing, rc=3)
    check("error" in doc and missing in doc["error"]["message"], "json error %s" % doc)
    check(not os.path.exists(missing), "a read-only command created the root")
    notdir = os.path.join(tmp, "file")
    open(notdir, "w").close()
    expect_rc(ckpt("list", notdir), 3)


# ----------------------------------------------------------------- verify

def test_verify_valid(tmp):
    root = valid_root(tmp)
    r = expect_rc(ckpt("verify", root), 0)
    check(r.out.strip() == "step 30: valid", "default verifies the newest step", r)
    _, doc = ckpt_json("verify", "verify", root, "--all", rc=0)
    check(doc["ok"] and doc["checked"] == 3 and doc["failed"] == 0 and doc["level"] == "full",
          "verify --all %s" % doc)
    _, doc = ckpt_json("verify", "verify", root, "--step", "20", "--quick", rc=0)
    check([s["step"] for s in doc["steps"]] == [20] and doc["level"] == "quick", "step 20")
    _, doc = ckpt_json(None, "verify", root, "--step", "25", rc=1)
    check(doc["error"]["status"] == "not_found", "missing step %s" % doc)


def test_verify_names_the_file_of_step_level_problems(tmp):
    root = valid_root(tmp)
    flip_byte(os.path.join(step_dir(root, 20), "manifest.json"), 40)
    shard = data_files(root, 30)[0]
    os.truncate(shard, os.path.getsize(shard) // 2)
    _, doc = ckpt_json("verify", "verify", root, "--all", rc=1)
    files = {s["step"]: [p["file"] for p in s["problems"]] for s in doc["steps"]}
    check(files[20] == ["manifest.json"] and files[30] == [os.path.basename(shard)],
          "problem files %s" % files)


def test_verify_corrupt(tmp):
    root = valid_root(tmp)
    shard = data_files(root, 30)[0]
    off = flip_byte(shard)
    r = expect_rc(ckpt("verify", root), 1)
    check("step 30: corrupt" in r.out, "verify text", r)
    check(os.path.basename(shard) in r.out, "verify does not name the file", r)
    _, doc = ckpt_json("verify", "verify", root, "--all", rc=1)
    check(not doc["ok"] and doc["failed"] == 1, "verify --all %s" % doc)
    st = statuses(doc)
    check(st == {10: "valid", 20: "valid", 30: "corrupt"}, "statuses %s" % st)
    probs = doc["steps"][2]["problems"]
    check(probs, "no problems listed")
    p = probs[0]
    check(p["file"] == os.path.basename(shard), "problem file %s" % p)
    check(p["offset"] is not None and p["offset"] <= off, "problem offset %s (flipped %d)"
          % (p["offset"], off))
    check(p["tensor"], "problem names no tensor: %s" % p)
    check(p["status"] == "corrupt" and p["step"] == 30, "problem status %s" % p)
    # quick verification does not read chunk data
    ckpt_json("verify", "verify", root, "--quick", rc=0)
    ckpt_json("verify", "verify", root, "--step", "20", rc=0)


def test_verify_incomplete_and_empty(tmp):
    root = valid_root(tmp)
    os.unlink(data_files(root, 30)[0])
    _, doc = ckpt_json("verify", "verify", root, rc=1)
    check(statuses(doc) == {30: "incomplete"}, "incomplete %s" % doc)
    r = expect_rc(ckpt("verify", root, "--quick"), 1)
    check("incomplete" in r.out, "text", r)
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    _, doc = ckpt_json("verify", "verify", empty, rc=1)
    check(doc["checked"] == 0 and not doc["ok"], "empty verify %s" % doc)
    expect_rc(ckpt("verify", empty, "--all"), 1)
    expect_rc(ckpt("verify", os.path.join(tmp, "missing")), 3)


# ----------------------------------------------------------------- latest

# A job checkpointing every 20 ms with keep_last=1: each step is retired
# 20 ms (plus a save) after it commits.  Saving back to back instead, a
# check slower than a save (full verification under ASan) finds every step
# it lists retired, round after round: no job retires that fast.
WRITER = """
import sys, time, numpy as np, libckpt
s = libckpt.Store(sys.argv[1], keep_last=1, fsync=False)
i = 0
while True:
    i += 1
    s.save(i, {"w": np.full(20000, i, np.float32)}).wait()
    time.sleep(0.02)
"""


def test_reading_commands_next_to_a_writer_that_retires_steps(tmp):
    """CLI.md: list, verify and doctor work next to a running job.  With
    keep_last=1 the job retires each step as soon as the next commits: a
    step listed, then retired before it was checked, was reported as a
    failure ("no step N", "no valid checkpoint", exit 1: 1 run in 5 of
    verify).  Such a step is left out, and when nothing is left, the root
    is listed again."""
    root = os.path.join(tmp, "root")
    e = dict(os.environ)
    e.update(python_env() or {})
    w = subprocess.Popen([sys.executable, "-c", WRITER, root], env=e,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (os.path.isdir(root) and any(n.startswith("step-") for n in os.listdir(root))):
            check(w.poll() is None, "writer died: %s" % (w.stderr.read() if w.poll() else ""))
            check(time.monotonic() < deadline, "no step after 60 s")
            time.sleep(0.01)
        for i in range(40):
            for args in (("verify", root), ("verify", "--all", root), ("verify", "--quick", root),
                         ("list", root), ("list", "--full", root), ("doctor", root)):
                r = ckpt(*args)
                check(r.rc == 0, "round %d: ckpt %s next to the writer" % (i, " ".join(args)), r)
                check("error" not in r.out.split() and "no valid" not in r.out + r.err,
                      "round %d: ckpt %s" % (i, " ".join(args)), r)
            doc = ckpt_json("list", "list", root, rc=0)[1]
            check(doc["latest_valid"] is not None and
                  all(st["status"] == "valid" for st in doc["steps"]), "list --json %s" % doc)
        check(w.poll() is None, "the writer stopped: %s" % (w.stderr.read() if w.poll() else ""))
    finally:
        w.kill()
        w.wait()


def test_latest(tmp):
    root = valid_root(tmp)
    r = expect_rc(ckpt("latest", root), 0)
    check(os.path.realpath(r.out.strip()) == os.path.realpath(step_dir(root, 30)),
          "latest path", r)
    r = expect_rc(ckpt("latest", root, "--step"), 0)
    check(r.out == "30\n", "latest --step", r)
    _, doc = ckpt_json("latest", "latest", root, rc=0)
    check(doc["step"] == 30 and doc["level"] == "quick", "latest json %s" % doc)
    check(r.err == "" and doc["skipped"] == [], "nothing skipped: %s" % doc)
    flip_byte(data_files(root, 30)[0])
    check(ckpt("latest", root, "--step").out == "30\n", "quick latest skips data damage?")
    r = expect_rc(ckpt("latest", root, "--full", "--step"), 0)
    check(r.out == "20\n", "latest --full must skip the corrupt step", r)
    # the step passed over is named, with why, apart from the one line read
    check(re.search(r"^ckpt latest: skipped newer step 30: .*rank-00000\.shard", r.err),
          "the skipped step is named on stderr", r)
    _, doc = ckpt_json("latest", "latest", root, "--full", rc=0)
    check([(p["step"], p["status"]) for p in doc["skipped"]] == [(30, "corrupt")],
          "latest --full --json names the skipped step: %s" % doc)
    flip_byte(os.path.join(step_dir(root, 20), "manifest.json"), 40)
    check(ckpt("latest", root, "--full", "--step").out == "10\n", "skip corrupt manifest")
    os.unlink(data_files(root, 30)[0])
    check(ckpt("latest", root, "--step").out == "10\n", "skip incomplete")
    os.unlink(data_files(root, 10)[0])
    r = expect_rc(ckpt("latest", root), 1)
    check(r.out == "" and "no valid checkpoint" in r.err, "none valid", r)
    _, doc = ckpt_json("latest", "latest", root, "--full", rc=1)
    check(doc["step"] is None and doc["path"] is None, "none valid json %s" % doc)
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    expect_rc(ckpt("latest", empty, "--step"), 1)
    ckpt_json("latest", "latest", empty, rc=1)
    ckpt_json(None, "latest", os.path.join(tmp, "missing"), rc=3)


# ---------------------------------------------------------------- inspect

def test_inspect(tmp):
    root = valid_root(tmp)
    _, doc = ckpt_json("inspect", "inspect", root, rc=0)
    check(doc["step"] == 30, "default step")
    got = [(t["name"], t["dtype"], t["shape"]) for t in doc["tensors"]]
    check(got == [tuple(x) for x in names()], "tensors %s" % got)
    check(doc["metadata"] == {"lr": 0.001, "epoch": 3, "seed": 30}, "metadata %s"
          % doc["metadata"])
    check(doc["environment"].get("libckpt"), "environment %s" % doc["environment"])
    for t in doc["tensors"]:
        if t["bytes"]:
            check(t["stored_bytes"] > 0 and t["chunks"] > 0, "tensor sizes %s" % t)
    _, doc = ckpt_json("inspect", "inspect", root, "--step", "10", rc=0)
    check(doc["metadata"]["seed"] == 10, "step 10 metadata")
    r = expect_rc(ckpt("inspect", root), 0)
    for n, dt, _ in names():
        check(n in r.out, "inspect text lacks " + n, r)
    check("environment:" in r.out and "metadata:" in r.out and '"epoch": 3' in r.out,
          "inspect text lacks env/metadata", r)
    # reals print as saved: shortest exact form, no 17-digit noise
    check('"lr": 0.001,' in r.out, "inspect text shows lr as saved", r)
    raw = expect_rc(ckpt("inspect", root, "--json"), 0).out
    check('"lr": 0.001,' in raw, "inspect --json shows lr as saved", raw)
    ckpt_json(None, "inspect", root, "--step", "99", rc=1)
    flip_byte(os.path.join(step_dir(root, 30), "manifest.json"), 40)
    _, doc = ckpt_json(None, "inspect", root, "--step", "30", rc=1)
    check(doc["error"]["status"] == "corrupt", "corrupt manifest %s" % doc)
    _, doc = ckpt_json("inspect", "inspect", root, rc=0)
    check(doc["step"] == 20, "inspect falls back to the newest valid step")
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    expect_rc(ckpt("inspect", empty), 1)
    ckpt_json(None, "inspect", empty, rc=1)


# --------------------------------------------------------------------- gc

def tree(root):
    return sorted(os.listdir(root))


def test_gc(tmp):
    root = valid_root(tmp, (10, 20, 30, 40, 50))
    tmpdir = os.path.join(root, ".tmp-step-000000000060-99999-1")
    os.mkdir(tmpdir)
    with open(os.path.join(tmpdir, "rank-00000.shard"), "wb") as f:
        f.write(b"x" * 100)
    before = tree(root)
    _, doc = ckpt_json("gc", "gc", root, "--keep-last", "2", "--dry-run", rc=0)
    check(tree(root) == before, "dry run changed the root")
    got = sorted((e["kind"], e["step"]) for e in doc["removed"])
    check(got == [("step", 10), ("step", 20), ("step", 30), ("temp", None)],
          "dry run plan %s" % got)
    r = expect_rc(ckpt("gc", root, "--keep-last", "2", "--dry-run"), 0)
    check("would remove step-000000000010" in r.out, "dry-run text", r)
    _, doc = ckpt_json("gc", "gc", root, "--keep-last", "2", rc=0)
    check(not os.path.exists(tmpdir), "stale temporary directory kept")
    got = sorted((e["kind"], e["step"]) for e in doc["removed"])
    check(got == [("step", 10), ("step", 20), ("step", 30), ("temp", None)],
          "gc must report what it removed, the stale directory too: %s" % got)
    check([s for s in tree(root) if s.startswith("step-")] ==
          ["step-000000000040", "step-000000000050"], "after gc: %s" % tree(root))
    r = expect_rc(ckpt("gc", root, "--keep-last", "2"), 0)
    check("nothing to remove" in r.out, "second gc", r)
    # the event log has both: the stale directory (removed when gc opened
    # the root as its writer) and the steps gc retired
    _, doc = ckpt_json("log", "log", root, rc=0)
    events = [(e["event"], e.get("removed")) for e in doc["events"]
              if e["event"] in ("stale_removed", "gc")]
    check(events == [("stale_removed", [os.path.basename(tmpdir)]),
                     ("gc", ["step-000000000010", "step-000000000020",
                             "step-000000000030"]),
                     ("gc", [])], "event log after gc: %s" % events)


def test_gc_keeps_newest_valid(tmp):
    root = valid_root(tmp)
    flip_byte(os.path.join(step_dir(root, 30), "manifest.json"), 40)
    _, doc = ckpt_json("gc", "gc", root, "--keep-last", "1", "--dry-run", rc=0)
    check([e["step"] for e in doc["removed"]] == [10], "dry-run must keep 20: %s" % doc)
    _, doc = ckpt_json("gc", "gc", root, "--keep-last", "1", rc=0)
    check([e["step"] for e in doc["removed"]] == [10], "gc must keep 20: %s" % doc)
    check(os.path.isdir(step_dir(root, 20)) and os.path.isdir(step_dir(root, 30)), "kept")


def test_gc_busy_and_missing(tmp):
    root = valid_root(tmp, (10, 20))
    lock = os.path.join(root, ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = expect_rc(ckpt("gc", root, "--keep-last", "1"), 3)
        check(r.err.strip(), "no message when busy", r)
        _, doc = ckpt_json(None, "gc", root, "--keep-last", "1", rc=3)
        check(doc["error"]["status"] == "busy", "busy status %s" % doc)
        # the dry run needs no lock
        ckpt_json("gc", "gc", root, "--keep-last", "1", "--dry-run", rc=0)
    finally:
        os.close(fd)
    check(os.path.isdir(step_dir(root, 10)), "busy gc removed a step")
    expect_rc(ckpt("gc", os.path.join(tmp, "missing"), "--keep-last", "1", "--dry-run"), 3)
    # nor is a root made by gc: a typo in a script must not pass
    r = expect_rc(ckpt("gc", os.path.join(tmp, "missing"), "--keep-last", "1"), 3)
    check("does not exist" in r.err and r.out == "", "missing root", r)
    check(not os.path.exists(os.path.join(tmp, "missing")), "gc created the root")


# ----------------------------------------------------------------- doctor

def findings(doc):
    return {f["check"]: f["severity"] for f in doc["findings"]}


def test_doctor_healthy_and_problems(tmp):
    root = valid_root(tmp)
    _, doc = ckpt_json("doctor", "doctor", root, rc=0)
    check(doc["ok"] and findings(doc) == {"disk": "ok", "temp": "ok", "strays": "ok",
                                          "verify": "ok", "drift": "ok", "machine": "ok",
                                          "frameworks": "ok"}
          or findings(doc)["disk"] != "ok",
          "healthy doctor %s" % doc)
    check(doc["steps"] == {"total": 3, "valid": 3}, "steps %s" % doc["steps"])
    check(doc["disk"]["free_bytes"] > 0 and doc["disk"]["recent_max_bytes"] > 0 and
          len(doc["disk"]["recent_steps"]) == 3, "disk %s" % doc["disk"])
    r = expect_rc(ckpt("doctor", root), 0)
    check("[ok]" in r.out and "verify" in r.out, "doctor text", r)
    # a stale temporary directory: warning only
    os.mkdir(os.path.join(root, ".tmp-step-000000000040-1-1"))
    _, doc = ckpt_json("doctor", "doctor", root, rc=0)
    check(findings(doc)["temp"] == "warning" and len(doc["temp_dirs"]) == 1, "temp %s" % doc)
    # data damage: found with --full only
    flip_byte(data_files(root, 20)[0])
    ckpt_json("doctor", "doctor", root, rc=0)
    _, doc = ckpt_json("doctor", "doctor", root, "--full", rc=1)
    check(findings(doc)["verify"] == "error" and not doc["ok"], "verify error %s" % doc)
    check([s["step"] for s in doc["unverifiable"]] == [20], "unverifiable %s"
          % doc["unverifiable"])
    os.unlink(data_files(root, 30)[0])
    _, doc = ckpt_json("doctor", "doctor", root, rc=1)
    check([(s["step"], s["status"]) for s in doc["unverifiable"]] == [(30, "incomplete")],
          "incomplete %s" % doc["unverifiable"])
    r = expect_rc(ckpt("doctor", root), 1)
    check("[error]" in r.out and "step 30: incomplete" in r.out, "doctor text", r)
    # each finding's details right under it (they were all printed after
    # the last finding, away from theirs)
    lines = r.out.splitlines()
    for check_name, detail in (("temp", "    temp .tmp-step-000000000040"),
                               ("verify", "    step 30: incomplete")):
        at = [i for i, line in enumerate(lines) if line.startswith(detail)]
        heads = [i for i, line in enumerate(lines) if line.startswith("  [")]
        check(len(at) == 1, "one %r line" % detail, r)
        above = max(i for i in heads if i < at[0])
        check(lines[above].split()[1] == check_name,
              "%r is not under the %s finding" % (detail, check_name), r)


def test_doctor_names_entries_that_block_a_step(tmp):
    """A file or link named like a step (no writer makes one) makes every
    save of that step fail; list, gc and doctor ignored it.  doctor now
    names it as an error, and touches nothing."""
    root = valid_root(tmp)
    with open(os.path.join(root, "step-000000000040"), "w") as f:
        f.write("not a checkpoint\n")
    os.symlink("step-000000000030", os.path.join(root, "step-000000000050"))
    for other in ("step-5", "step-00000000000000000000099", "step-0000000000007x"):
        open(os.path.join(root, other), "w").close()  # names no writer gives: no step
    _, doc = ckpt_json("doctor", "doctor", root, rc=1)
    msg = [f["message"] for f in doc["findings"] if f["check"] == "strays"]
    check(findings(doc)["strays"] == "error" and not doc["ok"] and len(msg) == 1 and
          "step-000000000040 (a file)" in msg[0] and
          "step-000000000050 (a symbolic link)" in msg[0] and "2 entries" in msg[0] and
          "step-5" not in msg[0], "strays %s" % doc)
    check(findings(doc)["verify"] == "ok" and doc["steps"]["total"] == 3, "steps %s" % doc)
    r = expect_rc(ckpt("doctor", root), 1)
    check("[error]" in r.out and "step-000000000040" in r.out, "doctor text", r)
    check(os.path.isfile(os.path.join(root, "step-000000000040")) and
          os.path.islink(os.path.join(root, "step-000000000050")), "doctor removed an entry")


def test_doctor_empty_missing(tmp):
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    _, doc = ckpt_json("doctor", "doctor", empty, rc=1)
    check(findings(doc)["verify"] == "error" and doc["steps"]["total"] == 0, "empty %s" % doc)
    ckpt_json(None, "doctor", os.path.join(tmp, "missing"), rc=3)


def test_doctor_drift(tmp):
    root = valid_root(tmp, (10, 20))
    # step 30 saved on "another host": a UTS namespace with its own hostname
    r = run("unshare", "-u", "sh", "-c",
            'hostname ckpt-drift-host && exec "$0" make "$1" 30 30 4096',
            os.environ.get("CKPT_TESTTOOL", "ckpt_testtool"), root)
    if r.rc != 0:
        pytest.skip("cannot change the hostname in a UTS namespace: " + r.err.strip())
    _, doc = ckpt_json("doctor", "doctor", root, rc=0)
    check(findings(doc)["drift"] == "warning", "drift finding %s" % doc["findings"])
    d = [x for x in doc["drift"] if x["field"] == "host"]
    check(d and d[0]["from_step"] == 20 and d[0]["to_step"] == 30 and
          d[0]["new"] == "ckpt-drift-host", "host drift %s" % doc["drift"])
    check(not any(x["field"] in ("pid", "time", "command_line") for x in doc["drift"]),
          "volatile fields reported as drift: %s" % doc["drift"])
    r = expect_rc(ckpt("doctor", root), 0)
    check("drift" in r.out and "ckpt-drift-host" in r.out, "drift text", r)


def test_doctor_bounds_the_environment_it_compares(tmp):
    """An environment record of many values (a manifest within its limits,
    another user's): doctor compares its first 4096 fields and says the
    rest were not, rather than flattening millions (2.6 GB, 17 s)."""
    from clitest import TESTTOOL
    root = valid_root(tmp, (10, 20))
    manifest = os.path.join(root, "step-%012d" % 20, "manifest.json")
    with open(manifest) as f:
        m = json.load(f)
    m["env"]["extra"] = [0] * 100000
    del m["checksum"]
    with open(manifest, "w") as f:  # the form rehash takes
        f.write(json.dumps(m)[:-1] + ',\n  "checksum": "%s"\n}\n' % ("0" * 16))
    check(run(TESTTOOL, "rehash", manifest).rc == 0, "rehash")
    _, doc = ckpt_json("doctor", "doctor", root, rc=0)
    fields = [x["field"] for x in doc["drift"]]
    check(len(fields) <= 4097, "%d drift fields" % len(fields))
    check("(fields past the first 4096, not compared)" in fields, fields[-3:])


# ------------------------------------------------------------- read-only

def run_readonly(root, *args):
    """Run ckpt ARGS with `root` on a read-only bind mount (or, failing that,
    as user nobody on a directory without write permission)."""
    script = ('mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && '
              'exec "$@"')
    r = run("unshare", "-m", "sh", "-c", script, root, CKPT, *args)
    if r.rc not in (126, 127) and "mount" not in r.err:
        return r
    subprocess.run(["chmod", "-R", "a-w,a+rX", root], check=True)
    r = run("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", CKPT, *args)
    subprocess.run(["chmod", "-R", "u+w", root], check=True)
    if r.rc in (126, 127):
        pytest.skip("neither a read-only mount nor setpriv works here")
    return r


def test_readonly_root(tmp):
    os.chmod(tmp, 0o755)
    root = valid_root(tmp)
    os.chmod(root, 0o755)
    before = tree(root)
    expect_rc(run_readonly(root, "list", root), 0)
    expect_rc(run_readonly(root, "verify", root, "--all"), 0)
    r = expect_rc(run_readonly(root, "latest", root, "--step"), 0)
    check(r.out == "30\n", "latest on read-only", r)
    expect_rc(run_readonly(root, "inspect", root), 0)
    expect_rc(run_readonly(root, "doctor", root), 0)
    expect_rc(run_readonly(root, "gc", root, "--keep-last", "1", "--dry-run"), 0)
    r = expect_rc(run_readonly(root, "gc", root, "--keep-last", "1"), 3)
    check(r.err.strip(), "gc on a read-only root gives no message", r)
    check(tree(root) == before, "read-only commands changed the root: %s" % tree(root))


# --------------------------------------------------------------- progress

def run_with_pty_stderr(*args):
    master, slave = pty.openpty()
    env = dict(os.environ)
    env.pop("CKPT_NO_PROGRESS", None)
    p = subprocess.Popen([CKPT] + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=slave, env=env)
    os.close(slave)
    err = b""
    while True:
        rl, _, _ = select.select([master], [], [], 30)
        if not rl:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read()
    p.wait()
    os.close(master)
    return p.returncode, out.decode(), err.decode(errors="replace")


def test_progress_bar_only_on_a_terminal(tmp):
    root = valid_root(tmp)
    rc, out, err = run_with_pty_stderr("verify", root, "--all")
    check(rc == 0, "verify under a pty: rc %d" % rc)
    check("verify [" in err and "/s" in err and "%" in err, "no progress bar: %r" % err)
    check("[" not in out, "progress bar on stdout: %r" % out)
    r = expect_rc(ckpt("verify", root, "--all"), 0)
    check(r.err == "", "progress output without a terminal", r)
    rc, out, err = run_with_pty_stderr("--json", "list", root, "--full")
    check(rc == 0 and out.startswith("{"), "json stdout with a terminal stderr")



def test_reading_a_root_of_another_user_says_whose_it_is(tmp):
    """A reader may open another user's root, but on a shared server a root
    at the expected path may be someone else's, made before the job ran:
    `ckpt latest` still answers (stdout unchanged for job scripts) and says
    on stderr whose the root is; one's own root gets no note."""
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    root = valid_root(tmp)
    own = expect_rc(ckpt("latest", root), 0)
    check("belongs to" not in own.err, "a note on one's own root", own)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), 65534, -1)
    os.lchown(root, 65534, -1)
    r = expect_rc(ckpt("latest", root), 0)
    check(r.out == own.out, "stdout changed", r)
    check("belongs to uid 65534" in r.err and "not to you" in r.err, "no note", r)


def test_gc_dry_run_on_another_users_root_says_gc_will_be_refused(tmp):
    """A dry run reads any root; the gc it plans needs a writer, which is
    refused in another user's root: the plan comes with a note saying so."""
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    root = valid_root(tmp, (10, 20))
    own = expect_rc(ckpt("gc", root, "--keep-last", "1", "--dry-run"), 0)
    check("refused" not in own.err, "a note on one's own root", own)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), 65534, -1)
    os.lchown(root, 65534, -1)
    r = expect_rc(ckpt("gc", root, "--keep-last", "1", "--dry-run"), 0)
    check(r.out == own.out == "would remove step-000000000010\n", "plan changed", r)
    check("gc without --dry-run will be refused" in r.err and "uid 65534" in r.err,
          "no note that gc will be refused", r)
    r = expect_rc(ckpt("gc", root, "--keep-last", "1"), 3)
    check("belongs to uid 65534" in r.err, "the refusal", r)
    check(os.path.isdir(step_dir(root, 10)), "gc removed a step of another user's root")


def test_writing_commands_refuse_a_link_another_user_planted(tmp):
    """gc and import reach the library with the path as given: a link
    another user planted in a sticky shared directory, pointing at one of
    the caller's roots, is refused there as for any writer (resolving it
    first would hide it), and nothing is removed or written."""
    if os.geteuid() != 0:
        pytest.skip("making a link owned by another user needs root")
    root = valid_root(tmp, (10, 20))
    shared = os.path.join(tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    link = os.path.join(shared, "job")
    os.symlink(root, link)
    os.lchown(link, 65534, 65534)
    before = tree(root)
    r = expect_rc(ckpt("gc", link, "--keep-last", "1"), 3)
    check("symbolic link" in r.err and link in r.err, "gc through the planted link", r)
    check(tree(root) == before, "gc through a planted link changed the root")
    # the caller's own link is followed
    own = os.path.join(shared, "mine")
    os.symlink(root, own)
    r = expect_rc(ckpt("gc", own, "--keep-last", "1"), 0)
    check("removed step-000000000010" in r.out, "gc through one's own link", r)


def test_reading_through_a_link_another_user_planted_says_so(tmp):
    """A reader follows a link another user planted (a writer refuses it),
    but it may lead a job script to another run than its path names:
    `ckpt latest` still answers on stdout and names the link and its owner
    on stderr; one's own link gets no note."""
    if os.geteuid() != 0:
        pytest.skip("making a link owned by another user needs root")
    root = valid_root(tmp, (10,))
    shared = os.path.join(tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    mine = os.path.join(shared, "mine")
    os.symlink(root, mine)
    own = expect_rc(ckpt("latest", mine, "--step"), 0)
    check(own.out == "10\n" and "symbolic link" not in own.err, "one's own link", own)
    planted = os.path.join(shared, "job")
    os.symlink(root, planted)
    os.lchown(planted, 65534, 65534)
    r = expect_rc(ckpt("latest", planted, "--step"), 0)
    check(r.out == "10\n", "stdout changed", r)
    check("goes through the symbolic link %s" % planted in r.err and "uid 65534" in r.err,
          "no note naming the planted link", r)


RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\r")


def test_a_newline_in_a_name_forges_no_line(tmp):
    """A tensor name may hold a newline (the library keeps names as
    given), and job scripts pass `ckpt latest`'s stderr into the job's log:
    a damaged step whose tensor is named "w\\nresume.sh: start 1: resuming
    from step 2 ..." printed that as a line of its own.  Every message and
    listing shows such a newline as \\n; --json keeps the name as it is."""
    import sys
    root = os.path.join(tmp, "root")
    fake = "resume.sh: start 1: resuming from step 2 (newest fully valid)"
    name = "w\n" + fake + "\nx"
    code = ("import sys, numpy as np, libckpt\n"
            "with libckpt.Store(sys.argv[1], keep_last=0) as s:\n"
            "    s.save(1, {'w': np.ones(4096)}).wait()\n"
            "    x = np.random.default_rng(0).standard_normal(4096)\n"
            "    s.save(2, {sys.argv[2]: x}).wait()\n")
    r = run(sys.executable, "-c", code, root, name, env=python_env())
    check(r.rc == 0, "save from Python", r)
    shard = data_files(root, 2)[0]
    with open(shard, "r+b") as f:  # one data byte: quick verification passes
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 1]))

    def forged(text):
        return [line for line in text.splitlines() if line.startswith(fake[:9])]
    r = expect_rc(ckpt("latest", root, "--full", "--step"), 0)
    check(r.out.strip() == "1", "the step", r)
    check("w\\n" + fake in r.err and not forged(r.err), "stderr of latest", r)
    r = ckpt("verify", "--all", root)
    check(r.rc != 0 and "w\\n" + fake in r.out and not forged(r.out + r.err),
          "verify --all", r)
    r = expect_rc(ckpt("inspect", root, "--step", "2"), 0)
    check("w\\n" + fake in r.out and not forged(r.out), "inspect", r)
    _, doc = ckpt_json("inspect", "inspect", root, "--step", "2", rc=0)
    check([t["name"] for t in doc["tensors"]] == [name], "JSON name changed")
    # the command's own lines stay lines (usage is several in one write)
    r = ckpt()
    check("\n       ckpt COMMAND --help\n" in r.err and "\\n" not in r.err, "usage", r)



def test_a_newline_in_a_temporary_or_an_event_forges_no_line(tmp):
    """The root's owner (or a group member) names its temporary
    directories and writes its event log; whoever runs gc, doctor or log
    there (an admin's cleanup) printed a newline in those raw: a line of
    the writer's choosing in the admin's log.  Each shows it as \\n."""
    import sys
    root = os.path.join(tmp, "root")
    fake = "removed step-000000000042 (admin: all steps verified OK)"
    code = ("import sys, numpy as np, libckpt\n"
            "with libckpt.Store(sys.argv[1]) as s:\n"
            "    s.save(1, {'w': np.ones(64)}).wait()\n")
    r = run(sys.executable, "-c", code, root, env=python_env())
    check(r.rc == 0, "save from Python", r)
    os.mkdir(os.path.join(root, ".tmp-step-000000000009-1-x\n" + fake))
    with open(os.path.join(root, "ckpt-events.jsonl"), "a") as f:
        f.write(json.dumps({"v": 1, "time": time.time(), "event": "restore_failed\n" + fake,
                            "status": "io\n" + fake, "error": "e\n" + fake,
                            "level": "full\n" + fake, "pid": 1,
                            "host": "h\n" + fake}) + "\n")

    def forged(text):
        return [line for line in text.splitlines() if line.startswith(fake[:9])]
    for args in (("gc", "--keep-last", "1", "--dry-run", root), ("doctor", root),
                 ("log", root), ("gc", "--keep-last", "1", root)):
        r = ckpt(*args)
        check("\\n" + fake in r.out and not forged(r.out + r.err), " ".join(args[:-1]), r)


def test_a_directory_above_a_root_names_the_root(tmp):
    """`ckpt verify ~/run` where the root is ~/run/checkpoints said only
    "no checkpoints in ~/run"; the roots right below are named (list,
    verify and latest alike), a link below is not followed."""
    valid_root(tmp)  # tmp/root
    os.makedirs(os.path.join(tmp, "logs"))
    os.symlink(os.path.join(tmp, "root"), os.path.join(tmp, "via-link"))
    for args in (("list", tmp), ("verify", tmp), ("latest", tmp, "--full", "--step")):
        r = expect_rc(ckpt(*args), 1)
        check(os.path.join(tmp, "root") + " holds checkpoints" in r.err,
              "%s does not name the root below" % args[0], r)
        check("via-link" not in r.err and "logs" not in r.err,
              "%s names a link or a plain directory" % args[0], r)
        check(not r.out.strip() or args[0] != "latest", "latest printed a step", r)


def test_inspect_columns_fit_long_names(tmp):
    """A transformer's tensor names pass 40 characters
    (model.enc.layers.0.self_attn.in_proj_weight): the columns after them
    were pushed right on those rows only.  They are sized to the longest
    name and shape shown."""
    import sys
    root = os.path.join(tmp, "root")
    names = ["w", "model.enc.layers.0.linear1.weight",
             "model.enc.layers.0.self_attn.in_proj_weight",
             "model.encoder.layers.11.self_attn.out_proj.weight.extra_state"]
    code = ("import sys, numpy as np, libckpt\n"
            "with libckpt.Store(sys.argv[1]) as s:\n"
            "    s.save(1, {n: np.ones((2, 3) if i % 2 else (1, 2, 3, 4, 5, 6, 7, 8))\n"
            "               for i, n in enumerate(sys.argv[2:])}).wait()\n")
    r = run(sys.executable, "-c", code, root, *names, env=python_env())
    check(r.rc == 0, "save from Python", r)
    r = expect_rc(ckpt("inspect", root), 0)
    rows = [line for line in r.out.splitlines() if "float64" in line]
    check(len(rows) == len(names), "one row per tensor", r)
    for column in ("float64", "B  "):
        check(len({line.index(column) for line in rows}) == 1,
              "%r column misaligned:\n%s" % (column, "\n".join(rows)), r)
    head = [line for line in r.out.splitlines() if line.startswith("TENSOR")]
    check(len(head) == 1 and head[0].index("DTYPE") == rows[0].index("float64"),
          "header not over its column:\n%s" % "\n".join(head + rows), r)


def test_control_characters_from_a_root_reach_no_terminal(tmp):
    """Tensor names and paths are another user's words: a name carrying
    terminal escapes (a colour, a window title, the one-byte C1 CSI) is
    printed with them shown as text, on stdout and in messages on stderr;
    --json output carries them escaped by JSON, unchanged."""
    import sys
    root = os.path.join(tmp, "root")
    bad = ["w\x1b[31mRED\x1b]0;TITLE\x07", "c1\u009b2J", "cr\rX"]
    code = ("import sys, numpy as np, libckpt\n"
            "with libckpt.Store(sys.argv[1]) as s:\n"
            "    s.save(1, {n: np.ones(2) for n in sys.argv[2:]}).wait()\n")
    r = run(sys.executable, "-c", code, root, *bad, "caf\u00e9", env=python_env())
    check(r.rc == 0, "save from Python", r)
    r = expect_rc(ckpt("inspect", root), 0)
    for c in RAW_CONTROLS:
        check(c not in r.out, "raw %r in ckpt inspect's output" % c, r)
    check("w\\x1b[31mRED\\x1b]0;TITLE\\x07" in r.out and "c1\\u009b2J" in r.out and
          "cr\\x0dX" in r.out, "names not shown escaped", r)
    # the columns after a name line up as shown, escapes and UTF-8 counted
    # as the characters the terminal shows (printf's %-40s counts bytes)
    rows = [line for line in r.out.splitlines() if "float64" in line]
    check(len(rows) == len(bad) + 1, "one row per tensor", r)
    check(len({line.index("float64") for line in rows}) == 1,
          "DTYPE column misaligned:\n" + "\n".join(rows), r)
    _, doc = ckpt_json("inspect", "inspect", root, rc=0)
    check(sorted(t["name"] for t in doc["tensors"]) == sorted(bad + ["caf\u00e9"]),
          "JSON names changed")
    missing = os.path.join(tmp, "no\x1b[2Jroot")
    r = ckpt("list", missing)
    check(r.rc != 0 and "no\\x1b[2Jroot" in r.err, "path not shown escaped", r)
    check("\x1b" not in r.err, "raw escape in a message on stderr", r)


def test_a_manifest_time_beyond_the_calendar_prints_a_dash(tmp):
    """A manifest's time is a number another user may write (1e300, a
    consistent checksum): `list` and `inspect` printed stack bytes (a time
    past what time_t holds, converted anyway, then an unterminated
    buffer); any time that is no date of years 1..9999 is shown as -."""
    from clitest import TESTTOOL, run
    root = os.path.join(tmp, "root")
    make_step(root, 1)
    manifest = os.path.join(root, "step-000000000001", "manifest.json")
    for value in ("1e300", "253402300800", "-5"):
        with open(manifest) as f:
            text = f.read()
        text = re.sub(r'"time": [^,]+,', '"time": %s,' % value, text, count=1)
        with open(manifest, "w") as f:
            f.write(text)
        check(run(TESTTOOL, "rehash", manifest).rc == 0, "rehash")
        r = expect_rc(ckpt("list", root), 0)
        row = [line for line in r.out.splitlines() if line.startswith("1 ")]
        check(len(row) == 1 and row[0].split()[2] == "-", "time %s: %r" % (value, row), r)
        r = expect_rc(ckpt("inspect", root), 0)
        check(re.search(r"^time +-$", r.out, re.M), "time %s in inspect" % value, r)


def test_trust_group_is_taken_anywhere_on_the_line(tmp):
    """CLI.md: `--trust-group` is taken by any command, anywhere on the
    line; before the command it was an unknown option (exit 2)."""
    if os.geteuid() != 0:
        pytest.skip("giving the root another group needs root")
    root = os.path.join(tmp, "root")
    make_step(root, 10)
    os.chown(root, -1, 100)  # a shared group ("users"), writable by it
    os.chmod(root, 0o2770)
    r = ckpt("list", root)
    check(r.rc != 0 and "group" in r.err, "a group-writable root is refused untrusted", r)
    for argv in (("--trust-group", "list", root), ("list", "--trust-group", root),
                 ("list", root, "--trust-group")):
        expect_rc(ckpt(*argv), 0)

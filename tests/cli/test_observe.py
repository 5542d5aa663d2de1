"""ckpt log, ckpt metrics, ckpt health; the metrics file a job writes after
each commit; the example alert rules.  Metrics and rules are checked with
Prometheus's own promtool (Debian: prometheus); those tests skip without
it."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from clitest import CKPT, SOURCE_ROOT, ckpt, ckpt_json, data_files, expect_rc, python_env, run
from clitest import check as _check


def check(cond, msg, res=None):
    _check(cond, msg if isinstance(msg, str) else repr(msg), res)

TRAIN_MLP = os.environ.get("TRAIN_MLP", "train_mlp")
PROMTOOL = shutil.which("promtool")
RULES = os.path.join(SOURCE_ROOT, "examples", "prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool not installed (Debian: prometheus)")


def train(root, *extra, steps=60, every=10):
    r = run(TRAIN_MLP, "--dir", root, "--steps", steps, "--every", every, "--no-fsync",
            *extra)
    check(r.rc == 0, "train_mlp", r)
    return r


def samples(text):
    """{name: value} of the metric lines (one root: one sample each)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.match(r'^([a-z_]+)\{root="[^"]*"\} (\S+)$', line)
            check(m, "not a sample line: %r" % line)
            out[m.group(1)] = float(m.group(2))
    return out


def promtool_check_metrics(text):
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True)
    check(p.returncode == 0, "promtool check metrics: %s%s\n%s" % (p.stdout, p.stderr, text))


def test_log_records_saves_and_restores(tmp):
    root = os.path.join(tmp, "root")
    train(root, steps=30)
    train(root, steps=50)
    r = expect_rc(ckpt("log", root), 0)
    lines = r.out.splitlines()
    committed = [l for l in lines if "  save_committed " in l]
    check(len(committed) == 5, "5 commits (10..50)", r)
    check(re.search(r"save_committed +step 30  .* -> .*, stall .*, persist ", r.out), r.out)
    check(any(re.search(r"  restored +step 30 ", l) for l in lines), "restore of 30", r)
    check(any("restore_failed" in l and "no_checkpoint" in l for l in lines), "fresh start", r)
    _, doc = ckpt_json("log", "log", root, rc=0)
    check(doc["root"] == os.path.realpath(root), "root")
    names = [e["event"] for e in doc["events"]]
    check(names.count("save_begun") == 5 and names.count("save_committed") == 5, names)
    check(all(e["v"] == 1 and e["pid"] > 0 and e["host"] for e in doc["events"]), "fields")
    times = [e["time"] for e in doc["events"]]
    check(times == sorted(times), "oldest first")
    # --since
    late = expect_rc(ckpt("log", root, "--json", "--since", "@%r" % times[-2]), 0).json()
    check(len(late["events"]) == 2, "events since the second to last: %s" % late)
    check(len(expect_rc(ckpt("log", root, "--json", "--since", "1h"), 0).json()["events"])
          == len(times), "--since 1h")
    check(expect_rc(ckpt("log", root, "--since", "@%d" % (time.time() + 3600)), 0).out == "",
          "nothing in the future")
    expect_rc(ckpt("log", root, "--since", "yesterday"), 2)


def test_log_shows_skipped_steps(tmp):
    root = os.path.join(tmp, "root")
    train(root, steps=30)
    shard = data_files(root, 30)[0]
    with open(shard, "r+b") as f:  # a chunk of step 30
        f.seek(300)
        b = f.read(1)
        f.seek(300)
        f.write(bytes([b[0] ^ 1]))
    train(root, steps=40)
    doc = expect_rc(ckpt("log", root, "--json"), 0).json()
    restored = [e for e in doc["events"] if e["event"] == "restored"]
    check(restored and restored[-1]["step"] == 20, "fell back to 20: %s" % restored)
    sk = restored[-1]["skipped"]
    check(len(sk) == 1 and sk[0]["step"] == 30 and sk[0]["status"] == "corrupt", sk)
    out = expect_rc(ckpt("log", root), 0).out
    check(re.search(r"\n    step 30 corrupt: ", out), out)
    m = samples(expect_rc(ckpt("metrics", root), 0).out)
    check(m["ckpt_restore_fallbacks_total"] == 1 and m["ckpt_restore_skipped_steps_total"] == 1,
          m)


@needs_promtool
def test_metrics_pass_promtool_and_match_the_root(tmp):
    root = os.path.join(tmp, "root")
    empty = expect_rc(ckpt("metrics", tmp), 0).out  # a root without steps
    promtool_check_metrics(empty)
    check(samples(empty)["ckpt_valid_checkpoint"] == 0 and
          "ckpt_latest_step" not in samples(empty), empty)
    train(root, steps=50)
    text = expect_rc(ckpt("metrics", root), 0).out
    promtool_check_metrics(text)
    m = samples(text)
    check(m["ckpt_valid_checkpoint"] == 1 and m["ckpt_latest_step"] == 50, m)
    check(m["ckpt_saves_total"] == 5 and m["ckpt_save_failures_total"] == 0, m)
    check(m["ckpt_steps"] == 3, "keep_last 3: %s" % m)
    check(abs(m["ckpt_latest_timestamp_seconds"] - time.time()) < 600, m)
    check(0 <= m["ckpt_latest_age_seconds"] < 600, m)
    manifest = json.load(open(os.path.join(root, "step-%012d" % 50, "manifest.json")))
    size = sum(os.path.getsize(f) for f in data_files(root, 50))
    check(m["ckpt_last_save_stored_bytes"] == size, "stored bytes %s vs %d" % (m, size))
    st = os.statvfs(root)
    check(m["ckpt_free_saves"] == m["ckpt_filesystem_free_bytes"] // size, m)
    # other processes change free space at any time: within the file system
    check(0 < m["ckpt_filesystem_free_bytes"] <= st.f_blocks * st.f_frsize, m)
    del manifest
    # --output: the same metrics, replaced atomically
    out = os.path.join(tmp, "ckpt.prom")
    expect_rc(ckpt("metrics", root, "--output", out), 0)
    check(set(samples(open(out).read())) == set(m), "--output")
    check([f for f in os.listdir(tmp) if ".tmp-" in f] == [], "temporary file left")
    # --json, before the command or among its options as for every command:
    # the metrics stay Prometheus text, an error is a JSON document
    for argv in (("--json", "metrics", root), ("metrics", root, "--json")):
        res = expect_rc(ckpt(*argv), 0)
        check(set(samples(res.out)) == set(m), "ckpt %s" % " ".join(argv), res)
    for argv in (("--json", "metrics", tmp + "/none"), ("metrics", tmp + "/none", "--json")):
        res = ckpt(*argv)
        check(res.rc != 0 and "error" in json.loads(res.out), "ckpt %s" % " ".join(argv), res)


@needs_promtool
def test_metrics_survive_a_log_planted_as_a_fifo_or_link(tmp):
    """Another user who can write the root replaces the event log with a
    FIFO or a link: `ckpt log` refuses it, but the root's health (its
    newest valid step, free space) is still reported, without the
    counters, and ckpt_event_log_readable says why; the job's metrics
    file too."""
    root = os.path.join(tmp, "root")
    prom = os.path.join(tmp, "job.prom")
    train(root, steps=20)
    log = os.path.join(root, "ckpt-events.jsonl")
    for plant in ("fifo", "link"):
        os.unlink(log)
        if plant == "fifo":
            os.mkfifo(log)
        else:
            os.symlink("/etc/passwd", log)
        r = expect_rc(ckpt("log", root), 3)
        check("not a regular file" in r.err, r)
        text = expect_rc(ckpt("metrics", root), 0).out
        promtool_check_metrics(text)
        m = samples(text)
        check(m["ckpt_valid_checkpoint"] == 1 and m["ckpt_latest_step"] == 20, m)
        check(m["ckpt_event_log_readable"] == 0 and "ckpt_saves_total" not in m, m)
        check(m["ckpt_filesystem_free_bytes"] > 0, m)
    os.unlink(log)
    train(root, "--metrics", prom, steps=40)  # a log again, written by the job
    m = samples(open(prom).read())
    check(m["ckpt_event_log_readable"] == 1 and m["ckpt_saves_total"] == 2, m)
    os.unlink(log)
    os.mkfifo(log)  # the job's writer refuses it; its metrics file says so
    train(root, "--metrics", prom, steps=50)
    m = samples(open(prom).read())
    check(m["ckpt_latest_step"] == 50 and m["ckpt_event_log_readable"] == 0, m)
    check("ckpt_saves_total" not in m, "a counter of 0 would read as a reset: %s" % m)


def test_metrics_files_are_readable_by_the_collector_whatever_the_umask(tmp):
    """Under umask 077 the job's metrics file and `ckpt metrics --output`
    are still 0644: the collector's user must read them, or
    node_exporter exports nothing and alerts on the checkpoint's age go
    silent instead of firing."""
    root = os.path.join(tmp, "root")
    prom = os.path.join(tmp, "job.prom")
    cron = os.path.join(tmp, "cron.prom")
    old = os.umask(0o077)
    try:
        train(root, "--metrics", prom, steps=20)
        expect_rc(ckpt("metrics", root, "--output", cron), 0)
    finally:
        os.umask(old)
    for f in (prom, cron):
        check(oct(os.stat(f).st_mode & 0o777) == oct(0o644), "%s mode %o"
              % (f, os.stat(f).st_mode & 0o777))


@needs_promtool
def test_metrics_file_of_a_running_job(tmp):
    root = os.path.join(tmp, "root")
    prom = os.path.join(tmp, "job.prom")
    train(root, "--metrics", prom, steps=40)
    text = open(prom).read()
    promtool_check_metrics(text)
    m = samples(text)
    check(m["ckpt_latest_step"] == 40 and m["ckpt_saves_total"] == 4, m)
    check(oct(os.stat(prom).st_mode & 0o777) == oct(0o644), "readable by the collector")


def test_health(tmp):
    root = os.path.join(tmp, "root")
    train(root, steps=30)
    r = expect_rc(ckpt("health", root, "--max-age", "1h"), 0)
    check(r.out.startswith("ok: step 30 is "), r)
    r = expect_rc(ckpt("health", root, "--max-age", "0s"), 1)
    check(re.match(r"unhealthy: the newest valid checkpoint \(step 30\) is .* old, more than",
                   r.out), r)
    r = expect_rc(ckpt("health", root, "--min-free-saves", str(1 << 60)), 1)
    check("unhealthy: " in r.out and "fewer than %d" % (1 << 60) in r.out, r)
    _, doc = ckpt_json("health", "health", root, "--max-age", "2h", rc=0)
    check(doc["healthy"] is True and doc["step"] == 30 and doc["reason"] is None, doc)
    check(doc["free_saves"] >= 1 and doc["stored_bytes"] > 0 and doc["max_age_s"] == 7200, doc)
    # full verification: a damaged chunk in the newest step makes the one
    # before it the newest valid checkpoint
    shard = data_files(root, 30)[0]
    with open(shard, "r+b") as f:
        f.seek(300)
        b = f.read(1)
        f.seek(300)
        f.write(bytes([b[0] ^ 1]))
    doc = expect_rc(ckpt("health", root, "--json"), 0).json()
    check(doc["step"] == 20, "step 20 is the newest fully valid: %s" % doc)
    for s in (10, 20):
        shutil.rmtree(os.path.join(root, "step-%012d" % s))
    _, doc = ckpt_json("health", "health", root, rc=1)
    check(doc["step"] is None and doc["healthy"] is False, doc)
    r = expect_rc(ckpt("health", root), 1)
    check("no checkpoint in" in r.out and "passes full verification" in r.out, r)
    expect_rc(ckpt("health", os.path.join(tmp, "missing")), 3)
    expect_rc(ckpt("health", root, "--max-age", "soon"), 2)


@needs_promtool
def test_example_alert_rules(tmp):
    for args in (["check", "rules", "ckpt-alerts.yml"], ["test", "rules", "ckpt-alerts.test.yml"]):
        p = subprocess.run([PROMTOOL] + args, cwd=RULES, capture_output=True, text=True)
        check(p.returncode == 0, "promtool %s: %s%s" % (" ".join(args), p.stdout, p.stderr))


def test_a_read_only_file_system_is_unhealthy(tmp):
    """A root whose file system is mounted read-only (a failing disk is
    remounted so) has free blocks but room for no save: `ckpt health` says
    unhealthy and `ckpt doctor` warns about the disk; opening it for
    writing is refused at once, naming the cause."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a file system needs root")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    r = run("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", mnt)
    if r.rc != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % r.err.strip())
    try:
        root = os.path.join(mnt, "root")
        train(root, steps=20)
        expect_rc(ckpt("health", root), 0)
        check(run("mount", "-o", "remount,ro", mnt).rc == 0, "remount read-only")
        r = expect_rc(ckpt("health", root), 1)
        check("mounted read-only" in r.out, r)
        # an archive may be read-only on purpose: a warning, not an error
        doc = expect_rc(ckpt("doctor", root, "--json"), 0).json()
        disk = [f for f in doc["findings"] if f["check"] == "disk"]
        check(disk and disk[0]["severity"] == "warning" and "read-only" in disk[0]["message"],
              doc["findings"])
        r = run(TRAIN_MLP, "--dir", root, "--steps", 30, "--every", 10, "--no-fsync")
        check(r.rc != 0 and "read-only file system" in r.err, "writer on a read-only root", r)
    finally:
        run("umount", "-l", mnt)


def test_a_file_system_read_only_after_an_error_is_unhealthy(tmp):
    """ext4 with errors=remount-ro, after an error (the usual way a disk
    turns read-only under a job): every write fails with EROFS, but recent
    kernels no longer show ST_RDONLY in statvfs, and `ckpt health` said
    "ok" (exit 0).  It now tries an unnamed file where it may write."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("losetup"):
        pytest.skip("needs root, mkfs.ext4 and losetup")
    img, mnt = os.path.join(tmp, "fs.img"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(32 << 20)
    if run("mkfs.ext4", "-q", "-F", img).rc != 0:
        pytest.skip("mkfs.ext4 failed")
    r = run("mount", "-o", "loop,errors=remount-ro", img, mnt)
    if r.rc != 0:
        pytest.skip("cannot mount a loop device here: %s" % r.err.strip())
    try:
        dev = os.path.basename(run("findmnt", "-n", "-o", "SOURCE", mnt).out.strip())
        trigger = "/sys/fs/ext4/%s/trigger_fs_error" % dev
        if not os.path.exists(trigger):
            pytest.skip("no %s on this kernel" % trigger)
        root = os.path.join(mnt, "root")
        train(root, steps=20)
        expect_rc(ckpt("health", root), 0)
        with open(trigger, "w") as f:
            f.write("1")
        r = run(TRAIN_MLP, "--dir", root, "--steps", 30, "--every", 10, "--no-fsync")
        check(r.rc != 0, "a save succeeded on the file system after its error", r)
        r = expect_rc(ckpt("health", root), 1)
        check("read-only" in r.out, "health", r)
        doc = expect_rc(ckpt("doctor", root, "--json"), 0).json()
        disk = [f for f in doc["findings"] if f["check"] == "disk"]
        check(disk and "read-only" in disk[0]["message"], doc["findings"])
        check(not any(n.startswith("#") for n in os.listdir(root)), "a file left in the root")
    finally:
        run("umount", "-l", mnt)


def test_doctor_compares_the_newest_step_with_this_machine(tmp):
    root = os.path.join(tmp, "root")
    train(root, steps=20)
    doc = ckpt("doctor", root, "--json").json()
    check(doc["machine"] == [], "same machine: %s" % doc["machine"])
    f = [x for x in doc["findings"] if x["check"] == "machine"]
    check(len(f) == 1 and f[0]["severity"] == "ok", f)
    # a save from another host (a UTS namespace with its own host name)
    r = run("unshare", "--uts", "sh", "-c", 'hostname ckpt-other-node && exec "$@"', "sh",
            TRAIN_MLP, "--dir", root, "--steps", "30", "--every", "10", "--no-fsync")
    if r.rc != 0:
        pytest.skip("cannot make a UTS namespace here: %s" % r.err.strip())
    doc = ckpt("doctor", root, "--json").json()
    diffs = {d["field"]: d for d in doc["machine"]}
    check(set(diffs) == {"host"} and diffs["host"]["checkpoint"] == "ckpt-other-node" and
          diffs["host"]["step"] == 30, "machine: %s" % doc["machine"])
    f = [x for x in doc["findings"] if x["check"] == "machine"][0]
    check(f["severity"] == "warning" and "step 30 in: host" in f["message"], f)
    out = ckpt("doctor", root).out
    check('machine: host: step 30 has "ckpt-other-node", this machine "' in out, out)


# Saves from Python record the frameworks in use (ckpt_save_options
# .frameworks_json); doctor asks this interpreter for the same ones.
PY = sys.executable
SAVE_FROM_PYTHON = r"""
import sys
import numpy as np
if sys.argv[3] == "torch":
    import torch
import libckpt
import libckpt.store
if len(sys.argv) > 4:  # pretend the save ran with other versions
    real = libckpt.store.framework_versions
    libckpt.store.framework_versions = lambda: dict(real(), **{
        k: v for k, v in (a.split("=", 1) for a in sys.argv[4:])})
s = libckpt.Store(sys.argv[1], fsync=False)
s.save(int(sys.argv[2]), {"w": np.arange(8.0)}).wait()
s.close()
print(sorted(libckpt.store.framework_versions()))
"""


def save_from_python(root, step, framework, *fake):
    r = run(PY, "-c", SAVE_FROM_PYTHON, root, str(step), framework, *fake,
            env=python_env())
    check(r.rc == 0, "save from Python", r)
    return r


def here(expr, module):
    r = run(PY, "-c", "import %s; print(%s)" % (module, expr))
    check(r.rc == 0, expr, r)
    return r.out.strip()


def frameworks_finding(doc):
    f = [x for x in doc["findings"] if x["check"] == "frameworks"]
    check(len(f) == 1, doc["findings"])
    return f[0]


def test_doctor_runs_no_module_of_its_working_directory(tmp):
    """doctor asks a Python child for framework versions: modules that
    another user left in the directory doctor runs from (a shared scratch
    directory) must not be imported by it, as that would run their code as
    the user running doctor, root included."""
    pytest.importorskip("numpy")
    root = os.path.join(tmp, "root")
    save_from_python(root, 1, "numpy")
    planted = os.path.join(tmp, "planted")
    os.mkdir(planted)
    marker = os.path.join(tmp, "ran")
    for mod in ("json", "platform", "importlib", "numpy"):
        with open(os.path.join(planted, mod + ".py"), "w") as f:
            f.write("open(%r, 'a').write(%r)\n" % (marker, mod + " "))
    r = run(CKPT, "--json", "doctor", root, env={"CKPT_PYTHON": PY}, cwd=planted)
    check(not os.path.exists(marker), "doctor imported planted modules: %s"
          % (open(marker).read() if os.path.exists(marker) else ""), r)
    doc = r.json()
    got = {f["name"]: f for f in doc["frameworks"]}
    check(got["numpy"]["now"] == here("numpy.__version__", "numpy") and
          got["python"]["installed"], doc["frameworks"])


def test_doctor_compares_recorded_framework_versions(tmp):
    pytest.importorskip("numpy")
    pytest.importorskip("torch")
    root = os.path.join(tmp, "root")
    save_from_python(root, 1, "torch")
    _, doc = ckpt_json("doctor", "doctor", root, rc=0, env={"CKPT_PYTHON": PY})
    got = {f["name"]: f for f in doc["frameworks"]}
    check(set(got) == {"python", "numpy", "torch", "torch.cuda"}, doc["frameworks"])
    check(got["torch"]["checkpoint"] == here("torch.__version__", "torch") and
          got["numpy"]["checkpoint"] == here("numpy.__version__", "numpy") and
          got["python"]["checkpoint"] == here("platform.python_version()", "platform"),
          doc["frameworks"])
    check(all(f["now"] == f["checkpoint"] and f["installed"] and not f["drift"]
              for f in got.values()), doc["frameworks"])
    check(frameworks_finding(doc)["severity"] == "ok", doc["findings"])

    # a numpy-only program records no torch (and imports none)
    r = save_from_python(root, 2, "numpy")
    check("torch" not in r.out and "numpy" in r.out, "recorded without torch", r)

    # a save with other versions: drift, and a framework missing here
    save_from_python(root, 3, "torch", "torch=0.0.1+other", "jaxx_not_here=1.0")
    _, doc = ckpt_json("doctor", "doctor", root, rc=0, env={"CKPT_PYTHON": PY})
    got = {f["name"]: f for f in doc["frameworks"]}
    check(got["torch"]["checkpoint"] == "0.0.1+other" and got["torch"]["drift"] and
          got["torch"]["now"] == here("torch.__version__", "torch"), doc["frameworks"])
    check(not got["jaxx_not_here"]["installed"] and got["jaxx_not_here"]["drift"] and
          got["jaxx_not_here"]["now"] is None, doc["frameworks"])
    check(not got["numpy"]["drift"] and not got["python"]["drift"], doc["frameworks"])
    f = frameworks_finding(doc)
    check(f["severity"] == "warning" and
          f["message"].endswith("in: torch, jaxx_not_here (not installed here)"), f)
    # and between steps: step 2 recorded no torch, step 3 another torch
    torch_drift = {(d["from_step"], d["to_step"]): (d["old"], d["new"])
                   for d in doc["drift"] if d["field"] == "frameworks.torch"}
    check(torch_drift == {(1, 2): (got["torch"]["now"], None), (2, 3): (None, "0.0.1+other")},
          doc["drift"])
    out = ckpt("doctor", root, env={"CKPT_PYTHON": PY}).out
    check('framework: torch: step ' in out and 'has "0.0.1+other", this machine "' in out and
          "framework: jaxx_not_here: step" in out and "(not installed here)" in out, out)

    # no interpreter here: every framework is drift, with the reason
    doc = ckpt("doctor", root, "--json", env={"CKPT_PYTHON": os.path.join(tmp, "none")}).json()
    f = frameworks_finding(doc)
    check(f["severity"] == "warning" and "cannot be run" in f["message"] and
          all(x["drift"] and not x["installed"] for x in doc["frameworks"]), f)


def test_doctor_without_recorded_frameworks(tmp):
    root = os.path.join(tmp, "root")
    train(root, steps=10)
    _, doc = ckpt_json("doctor", "doctor", root, rc=0)
    check(doc["frameworks"] == [] and frameworks_finding(doc)["severity"] == "ok", doc)


def test_train_mlp_out_never_writes_through_a_planted_link(tmp):
    """examples/train_mlp --out wrote with fopen(path, "wb"): a link
    another user planted at that name in a shared directory sent the
    weights over the file it points at.  The state goes into a new file of
    its own, renamed over the name: the link is replaced, its target keeps
    its bytes."""
    precious = os.path.join(tmp, "precious")
    with open(precious, "wb") as f:
        f.write(b"keep me")
    out = os.path.join(tmp, "final.bin")
    os.symlink(precious, out)
    r = run(TRAIN_MLP, "--dir", os.path.join(tmp, "root"), "--steps", 4, "--every", 2,
            "--no-fsync", "--out", out)
    check(r.rc == 0, "train_mlp", r)
    with open(precious, "rb") as f:
        check(f.read() == b"keep me", "the link's target was overwritten", r)
    check(not os.path.islink(out) and os.path.getsize(out) > 0, "no state at --out", r)
    check(sorted(os.listdir(tmp)) == ["final.bin", "precious", "root"],
          "left behind: %s" % os.listdir(tmp), r)


def test_metrics_output_is_written_whatever_names_others_took(tmp):
    """`ckpt metrics --output FILE` wrote FILE.tmp-PID first: in a shared
    collector directory another user who took that name for the coming
    pids blocked it (exit 3, "File exists").  Its temporary name is one
    nobody can guess now.  The child's pid is known before it runs, so
    the old name is taken (by a directory: not even root unlinks it)."""
    root = os.path.join(tmp, "root")
    train(root, steps=10, every=5)
    out = os.path.join(tmp, "job.prom")
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # waits until the name is taken, then runs ckpt metrics
        os.close(go_w)
        os.read(go_r, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(CKPT, [CKPT, "metrics", root, "--output", out])
        os._exit(127)
    os.close(go_r)
    os.mkdir("%s.tmp-%d" % (out, pid))
    os.write(go_w, b"x")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    _check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
           "ckpt metrics --output with its old temporary name taken: status %d" % status)
    with open(out) as f:
        _check("ckpt_latest_step{" in f.read(), "no metrics written")

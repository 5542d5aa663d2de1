"""The resume hook: a running job receives SIGUSR1 (or SIGTERM), saves,
commits and exits 75; the restart resumes at the right step with exactly
the state an uninterrupted run has.  Also examples/resume.sh (crash and
preemption restarts, giving up after N) and examples/slurm/train.sbatch
(with stand-ins for srun and scontrol)."""

import os
import re
import select
import signal
import subprocess
import time

from clitest import (CKPT, SOURCE_ROOT, TOY_TRAIN, check, ckpt, data_files, expect_rc,
                     make_step, restored_bytes, run)

STEPS = 300
EVERY = 25
RESUME_SH = os.path.join(SOURCE_ROOT, "examples", "resume.sh")
SBATCH = os.path.join(SOURCE_ROOT, "examples", "slurm", "train.sbatch")
PREEMPT_API = os.environ.get("PREEMPT_API", "preempt_api")


def toy_args(root, out, *extra):
    return [TOY_TRAIN, root, "--steps", str(STEPS), "--save-every", str(EVERY),
            "--out", out] + list(extra)


def reference(tmp):
    out = os.path.join(tmp, "reference.bin")
    r = run(*toy_args(os.path.join(tmp, "ref-root"), out))
    check(r.rc == 0 and "fresh start" in r.out, "reference run", r)
    with open(out, "rb") as f:
        return f.read()


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


class Proc:
    """A process whose stdout is read line by line with a deadline."""

    def __init__(self, argv, tmp, env=None):
        self.errpath = os.path.join(tmp, "stderr-%d.txt" % time.monotonic_ns())
        self.err_f = open(self.errpath, "w")
        e = dict(os.environ)
        e["CKPT"] = CKPT
        if env:
            e.update(env)
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err_f, env=e,
                                  start_new_session=True)
        self.lines = []
        self.buf = b""

    def wait_for(self, pattern, timeout=60):
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            for line in self.lines:
                m = rx.search(line)
                if m:
                    return m
            left = deadline - time.monotonic()
            check(left > 0, "timed out waiting for %r; output so far:\n%s\n%s"
                  % (pattern, "\n".join(self.lines), self.stderr()))
            rl, _, _ = select.select([self.p.stdout], [], [], left)
            if rl:
                chunk = os.read(self.p.stdout.fileno(), 4096)
                if not chunk:
                    check(False, "process ended before %r:\n%s\n%s"
                          % (pattern, "\n".join(self.lines), self.stderr()))
                self.buf += chunk
                *done, self.buf = self.buf.split(b"\n")
                self.lines += [l.decode() for l in done]

    def finish(self, timeout=60):
        rest, _ = self.p.communicate(timeout=timeout)
        self.lines += (self.buf + rest).decode().splitlines()
        self.err_f.close()
        return self.p.returncode

    def stderr(self):
        if not self.err_f.closed:
            self.err_f.flush()
        return read_file(self.errpath).decode(errors="replace")

    def out(self):
        return "\n".join(self.lines)


def latest_step(root):
    r = expect_rc(ckpt("latest", root, "--step"), 0)
    return int(r.out)


def test_preempt_api_contract(tmp):
    r = run(PREEMPT_API)
    check(r.rc == 0, "preempt_api checks", r)


def preempt_and_resume(tmp, sig):
    ref = reference(tmp)
    root = os.path.join(tmp, "root")
    out = os.path.join(tmp, "out.bin")
    p = Proc(toy_args(root, out, "--sleep-ms", "10"), tmp)
    p.wait_for(r"^step 60$")
    os.kill(p.p.pid, sig)
    rc = p.finish()
    check(rc == 75, "exit status %d, want 75 (CKPT_EXIT_PREEMPTED)\n%s\n%s"
          % (rc, p.out(), p.stderr()))
    m = re.search(r"preempted by signal (\d+) at step (\d+)", p.out())
    check(m and int(m.group(1)) == sig, "no preemption line:\n" + p.out())
    stopped = int(m.group(2))
    check(60 <= stopped < STEPS, "stopped at step %d" % stopped)
    check(not os.path.exists(out), "a preempted run wrote its final state")
    # the save was committed before the exit, and it is the newest one
    check(latest_step(root) == stopped, "latest step is not the preemption step")
    expect_rc(ckpt("verify", root), 0)
    _, data = restored_bytes(root, stopped, "step", tmp)
    check(int.from_bytes(data, "little") == stopped, "saved step tensor")
    r = run(*toy_args(root, out))
    check(r.rc == 0, "restart", r)
    check("resumed at step %d" % stopped in r.out, "restart did not resume at %d" % stopped, r)
    check(read_file(out) == ref, "state after resume differs from an uninterrupted run")


def test_sigusr1_saves_and_resumes_exactly(tmp):
    preempt_and_resume(tmp, signal.SIGUSR1)


def test_sigterm_saves_and_resumes_exactly(tmp):
    preempt_and_resume(tmp, signal.SIGTERM)


def test_resume_sh_restarts_after_a_crash(tmp):
    ref = reference(tmp)
    root = os.path.join(tmp, "root")
    out = os.path.join(tmp, "out.bin")
    marker = os.path.join(tmp, "crashed-once")
    r = run("sh", RESUME_SH, "-n", "3", "-w", "0", "-d", root, "--",
            *toy_args(root, out, "--crash-at", "110", "--crash-once", marker),
            env={"CKPT": CKPT})
    check(r.rc == 0, "resume.sh", r)
    check("killed by signal 6" in r.err and "restart 1 of 3" in r.err, "restart log", r)
    m = re.search(r"resumed at step (\d+)", r.out)
    check(m and int(m.group(1)) in (75, 100), "resumed from the newest commit", r)
    check("resuming from step %s (newest fully valid)" % m.group(1) in r.err,
          "ckpt latest hook", r)
    check(read_file(out) == ref, "state after crash and resume differs")


def test_resume_sh_gives_up(tmp):
    root = os.path.join(tmp, "root")
    r = run("sh", RESUME_SH, "-n", "2", "-w", "0", "-d", root, "--",
            *toy_args(root, os.path.join(tmp, "out.bin"), "--crash-at", "30"),
            env={"CKPT": CKPT})
    check(r.rc == 134, "status of the last crash (134), got %d" % r.rc, r)
    check(r.out.count("pid ") == 3 and "giving up after 2 restarts" in r.err, "3 runs", r)
    # POSIX sh (dash): no bash-only arithmetic in the message
    r = run("sh", RESUME_SH, "-n", "1", "-w", "0", "-d", root, "--",
            *toy_args(root, os.path.join(tmp, "out.bin"), "--crash-at", "30"),
            env={"CKPT": CKPT})
    check("giving up after 1 restart\n" in r.err and "not found" not in r.err, "-n 1", r)
    r = run("sh", RESUME_SH, "-n", "x", "--", "true")
    check(r.rc == 2, "bad -n", r)


def test_resume_sh_restarts_a_preempted_job(tmp):
    ref = reference(tmp)
    root = os.path.join(tmp, "root")
    out = os.path.join(tmp, "out.bin")
    p = Proc(["sh", RESUME_SH, "-n", "2", "-w", "0", "-d", root, "--"] +
             toy_args(root, out, "--sleep-ms", "10"), tmp)
    pid = int(p.wait_for(r"^pid (\d+)$").group(1))
    p.wait_for(r"^step 50$")
    os.kill(pid, signal.SIGUSR1)  # to the job itself, not the wrapper
    rc = p.finish(timeout=120)
    check(rc == 0, "resume.sh after a preemption: %d\n%s\n%s" % (rc, p.out(), p.stderr()))
    m = re.search(r"preempted by signal \d+ at step (\d+)", p.out())
    check(m and "resumed at step %s" % m.group(1) in p.out(), "resume step:\n" + p.out())
    check("preempted (exit 75); restart 1 of 2" in p.stderr(), "log:\n" + p.stderr())
    check(read_file(out) == ref, "state differs")


def test_resume_sh_passes_signals_on(tmp):
    ref = reference(tmp)
    root = os.path.join(tmp, "root")
    out = os.path.join(tmp, "out.bin")
    p = Proc(["sh", RESUME_SH, "-n", "2", "-w", "0", "-d", root, "--"] +
             toy_args(root, out, "--sleep-ms", "10"), tmp)
    p.wait_for(r"^step 40$")
    os.kill(p.p.pid, signal.SIGUSR1)  # to the wrapper: forwarded, no restart
    rc = p.finish(timeout=120)
    check(rc == 75, "wrapper status %d\n%s\n%s" % (rc, p.out(), p.stderr()))
    check("not restarting" in p.stderr() and "resumed" not in p.out(), p.stderr())
    stopped = int(re.search(r"at step (\d+)", p.out().split("preempted")[1]).group(1))
    check(latest_step(root) == stopped, "committed before exit")
    r = run("sh", RESUME_SH, "-w", "0", "-d", root, "--", *toy_args(root, out),
            env={"CKPT": CKPT})
    check(r.rc == 0 and "resumed at step %d" % stopped in r.out, "second run", r)
    check(read_file(out) == ref, "state differs")


def test_slurm_script_requeues_and_resumes(tmp):
    ref = reference(tmp)
    bindir = os.path.join(tmp, "bin")
    os.mkdir(bindir)
    log = os.path.join(tmp, "scontrol.log")
    with open(os.path.join(bindir, "srun"), "w") as f:
        f.write('#!/bin/sh\nexec "$@"\n')
    with open(os.path.join(bindir, "scontrol"), "w") as f:
        f.write('#!/bin/sh\necho "$@" >> %s\n' % log)
    for n in ("srun", "scontrol"):
        os.chmod(os.path.join(bindir, n), 0o755)
    root = os.path.join(tmp, "root")
    out = os.path.join(tmp, "out.bin")
    env = {"PATH": bindir + ":" + os.environ["PATH"], "CKPT_DIR": root,
           "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": tmp, "SLURM_NTASKS": "2"}
    p = Proc(["bash", SBATCH] + toy_args(root, out, "--sleep-ms", "10"), tmp, env=env)
    p.wait_for(r"starting fresh")
    p.wait_for(r"^step 40$")
    os.kill(p.p.pid, signal.SIGUSR1)  # what --signal=B:USR1@120 does
    rc = p.finish(timeout=120)
    check(rc == 0, "batch script after preemption: %d\n%s\n%s" % (rc, p.out(), p.stderr()))
    check("requeue 4242" in read_file(log).decode().splitlines(), "scontrol requeue not called")
    stopped = latest_step(root)
    check("preempted by signal 10 at step %d" % stopped in p.out(), p.out())
    # the requeued job
    r = run("bash", SBATCH, *toy_args(root, out), env=env)
    check(r.rc == 0, "requeued run", r)
    check("resuming from step %d" % stopped in r.out and
          "resumed at step %d" % stopped in r.out, "requeued run resumes", r)
    check(read_file(out) == ref, "state differs")



def test_resume_sh_job_gets_default_sigint_and_sigquit(tmp):
    # A background job of a shell without job control starts with SIGINT and
    # SIGQUIT ignored, so Ctrl-C would not stop it.
    r = run("sh", RESUME_SH, "-n", "0", "--", "grep", "^SigIgn:", "/proc/self/status")
    check(r.rc == 0, "resume.sh", r)
    ignored = int(r.out.split()[1], 16)
    check(ignored & (1 << (signal.SIGINT - 1)) == 0, "the job ignores SIGINT: %x" % ignored, r)
    check(ignored & (1 << (signal.SIGQUIT - 1)) == 0, "the job ignores SIGQUIT: %x" % ignored, r)


def test_resume_sh_fails_loudly_without_ckpt(tmp):
    r = run("sh", RESUME_SH, "-n", "0", "-d", os.path.join(tmp, "root"), "--", "true",
            env={"CKPT": os.path.join(tmp, "no-such-ckpt")})
    check(r.rc == 127, "a missing ckpt command must fail, got %d" % r.rc, r)
    check("no-such-ckpt) was not found" in r.err and "starting fresh" not in r.err, r.err, r)
    r = run("bash", SBATCH, "true", env={"CKPT": os.path.join(tmp, "no-such-ckpt"),
                                         "CKPT_DIR": os.path.join(tmp, "root")})
    check(r.rc != 0 and "was not found" in r.err, "train.sbatch without ckpt", r)


def test_resume_sh_announces_the_step_a_full_restore_takes(tmp):
    root = os.path.join(tmp, "root")
    make_step(root, 1)
    make_step(root, 2)
    # one byte of step 2's data: its index still passes quick verification
    shard = data_files(root, 2)[0]
    with open(shard, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 1]))
    check(latest_step(root) == 2, "quick verification passes step 2")
    r = run("sh", RESUME_SH, "-n", "0", "-d", root, "--", "sh", "-c",
            'echo "step=$CKPT_RESUME_STEP"', env={"CKPT": CKPT})
    check(r.rc == 0 and "resuming from step 1 (newest fully valid)" in r.err and
          "step=1" in r.out, "resume.sh announces step 1", r)


def test_resume_sh_signal_before_the_job_starts(tmp):
    # A signal that arrives while resume.sh checks the root (a slow full
    # verification, the scheduler's warning before the time limit) used to
    # be lost: the job started unsignalled and was later killed without a
    # save.  Now the job is not started, and resume.sh exits 75.
    bindir = os.path.join(tmp, "bin")
    os.mkdir(bindir)
    started = os.path.join(tmp, "started")
    with open(os.path.join(bindir, "ckpt"), "w") as f:
        # the check during which the signal comes: to resume.sh, found
        # above this process (the $(...) subshell may stand between)
        f.write("#!/bin/sh\nfor p in $PPID $(ps -o ppid= -p $PPID); do "
                "grep -qF resume.sh /proc/$p/cmdline && kill -USR1 $p; done\n"
                "echo 5\n")
    os.chmod(os.path.join(bindir, "ckpt"), 0o755)
    root = os.path.join(tmp, "root")
    os.mkdir(root)
    r = run("sh", RESUME_SH, "-n", "2", "-w", "0", "-d", root, "--", "touch", started,
            env={"PATH": bindir + ":" + os.environ["PATH"], "CKPT": "ckpt"})
    check(r.rc == 75, "resume.sh signalled before the start: exit 75, got %d" % r.rc, r)
    check(not os.path.exists(started), "the job was started after the signal", r)
    check("got SIGUSR1 before start 1: not starting the job" in r.err, r.err, r)


def test_slurm_script_signal_before_the_step_starts(tmp):
    # A signal that arrives while the script checks the root is not lost:
    # the step is not started and the job is requeued.
    bindir = os.path.join(tmp, "bin")
    os.mkdir(bindir)
    log = os.path.join(tmp, "calls.log")
    for n, body in (("srun", 'echo "srun $*" >> %s; exec "$@"' % log),
                    ("scontrol", 'echo "scontrol $*" >> %s' % log),
                    # the slow check during which the signal comes
                    ("ckpt", 'for p in $PPID $(ps -o ppid= -p $PPID); do '
                             'grep -q train.sbatch /proc/$p/cmdline && kill -USR1 $p; '
                             'done; exit 1')):
        with open(os.path.join(bindir, n), "w") as f:
            f.write("#!/bin/sh\n%s\n" % body)
        os.chmod(os.path.join(bindir, n), 0o755)
    root = os.path.join(tmp, "root")
    os.mkdir(root)
    env = {"PATH": bindir + ":" + os.environ["PATH"], "CKPT": "ckpt", "CKPT_DIR": root,
           "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}
    r = run("bash", SBATCH, "true", env=env)
    check(r.rc == 0, "requeued", r)
    calls = open(log).read() if os.path.exists(log) else ""
    check("srun" not in calls and "scontrol requeue 77" in calls, "calls: " + calls, r)
    check("arrived before the job step started" in r.out, r.out, r)
    # the requeue cap
    env["SLURM_RESTART_COUNT"] = "20"
    os.unlink(log)
    r = run("bash", SBATCH, "true", env=env)
    check(r.rc == 75 and "not requeueing" in r.err, "requeue cap", r)
    check(not os.path.exists(log) or "requeue" not in open(log).read(), "requeued past cap")

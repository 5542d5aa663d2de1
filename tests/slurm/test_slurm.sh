#!/usr/bin/env bash
# A real single-node Slurm (Debian's slurmctld, slurmd, munge) started in a
# temporary directory, running examples/slurm/train.sbatch with the CPU
# training example (examples/train_mlp.c), stopped in each way a cluster
# stops a job:
#   usr1     `scancel --batch --signal=USR1` (what --signal=B:USR1@120 does
#            before the time limit): the script passes USR1 on, the job saves,
#            exits 75, the script requeues it, it resumes and finishes;
#   requeue  `scontrol requeue` (preemption by requeue, an operator): SIGTERM
#            to every process, the job saves within KillWait, Slurm requeues;
#   cancel   plain `scancel`: SIGTERM, the job saves and stops, Slurm does
#            not requeue it; a new submission resumes.
# Each run must end with exactly the weights of an uninterrupted run (no
# step lost, none torn: train_mlp is deterministic), at the step it saved,
# with every step on disk passing full verification.
#
# Needs root (slurmd runs jobs as their user) and the binaries; exits 77
# with the reason when they are missing or the daemons cannot start here.
# Environment: TRAIN_MLP, CKPT_CLI (built programs), SOURCE_ROOT.
set -uo pipefail

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; show_logs; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd (it runs jobs as their user)"
for b in slurmctld slurmd sbatch squeue scancel scontrol sinfo munged mungekey; do
    command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$b" >/dev/null 2>&1 ||
        skip "$b is not installed (Debian: slurmctld slurmd slurm-client munge)"
done
export PATH=$PATH:/usr/sbin
: "${TRAIN_MLP:?}" "${CKPT_CLI:?}" "${SOURCE_ROOT:?}"
SBATCH_SCRIPT=$SOURCE_ROOT/examples/slurm/train.sbatch

T=$(mktemp -d /tmp/ckpt-slurm-XXXXXX)
chmod 755 "$T"
pids=()
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
cleanup() {
    local p t0 jobs
    # Our jobs first, while the daemons run, so that no slurmstepd outlives
    # them (slurmd does not stop on SIGTERM while it has job steps).
    if [ -f "${SLURM_CONF:-}" ] && alive "${pids[1]:-0}"; then
        jobs=$(squeue -h -o %i 2>/dev/null)
        # shellcheck disable=SC2086 # one job id per word
        [ -z "$jobs" ] || scancel $jobs 2>/dev/null
        t0=$SECONDS
        while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $((SECONDS - t0)) -lt 60 ]; do
            sleep 0.5
        done
    fi
    # Then our daemons, by the pids we started: TERM, and KILL after 15 s.
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    t0=$SECONDS
    for p in "${pids[@]}"; do
        while alive "$p" && [ $((SECONDS - t0)) -lt 15 ]; do sleep 0.2; done
        alive "$p" && kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    [ -n "${KEEP_SLURM_TMP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM # (the EXIT trap then runs)
show_logs() {
    local f
    for f in "$T"/log/*.log "$T"/job-*.out; do
        [ -f "$f" ] && { echo "---- $f"; tail -n 40 "$f"; }
    done
}

# Bounded polling of real state: `what` is evaluated until it succeeds.
poll() { # seconds, description, command...
    local limit=$1 what=$2 t0=$SECONDS
    shift 2
    until "$@"; do
        [ $((SECONDS - t0)) -lt "$limit" ] || fail "timed out after ${limit}s waiting for $what"
        sleep 0.5
    done
}

free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---------------------------------------------------------------- munge
mkdir -p "$T"/munge "$T"/state "$T"/spool "$T"/log "$T"/work
chmod 700 "$T"/munge
mungekey -c -k "$T"/munge/munge.key >/dev/null 2>&1 ||
    skip "mungekey cannot create a key"
munged -F --key-file="$T"/munge/munge.key --socket="$T"/munge/sock \
    --pid-file="$T"/munge/munged.pid --log-file="$T"/log/munged.log \
    --seed-file="$T"/munge/seed --force >/dev/null 2>&1 &
pids+=($!)
t0=$SECONDS
until [ -S "$T"/munge/sock ]; do
    kill -0 "${pids[0]}" 2>/dev/null || skip "munged cannot run here: $(tail -n 3 "$T"/log/munged.log 2>/dev/null)"
    [ $((SECONDS - t0)) -lt 30 ] || skip "munged did not create its socket in 30 s"
    sleep 0.2
done

# ---------------------------------------------------------------- slurm
host=$(hostname -s)
cpus=$(nproc)
export SLURM_CONF=$T/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=ckpttest
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge/sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
PlugStackConfig=$T/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
JobRequeue=1
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=600
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
: >"$T"/plugstack.conf
slurmctld -D -i -f "$SLURM_CONF" >"$T"/log/slurmctld.out 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$T"/log/slurmd.out 2>&1 &
pids+=($!)
node_idle() {
    kill -0 "${pids[1]}" 2>/dev/null ||
        skip "slurmctld cannot run here: $(tail -n 3 "$T"/log/slurmctld.out "$T"/log/slurmctld.log 2>/dev/null)"
    kill -0 "${pids[2]}" 2>/dev/null ||
        skip "slurmd cannot run here: $(tail -n 3 "$T"/log/slurmd.out "$T"/log/slurmd.log 2>/dev/null)"
    [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]
}
poll 60 "the node to be idle" node_idle
echo "slurm is up: $(sinfo -h -o '%P %T %N')"

# ---------------------------------------------------------------- jobs
STEPS=400
EVERY=20
"$TRAIN_MLP" --steps "$STEPS" --every "$EVERY" --out "$T"/reference.bin >/dev/null ||
    fail "reference run"

job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_restarts() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p'; }
out_has() { grep -qE "$2" "$T/job-$1.out" 2>/dev/null; }
state_is() { [ "$(job_state "$1")" = "$2" ]; }

submit() { # name [VAR=VALUE for the job's environment]
    local root=$T/work/$1 extra=${2:+,$2}
    sbatch --parsable -D "$T"/work -o "$T/job-%j.out" --open-mode=append --gres=none \
        --export=ALL,CKPT="$CKPT_CLI",CKPT_DIR="$root""$extra" "$SBATCH_SCRIPT" \
        "$TRAIN_MLP" --dir "$root" --steps "$STEPS" --every "$EVERY" --log-every 10 \
        --sleep-ms 30 --out "$T/work/$1.bin"
}

# Slurm holds a requeued job back for about two minutes (its BeginTime).
# The test waits for that rather than releasing the job early: slurmd drops
# the launch of a job it is still cleaning up ("already killed, do not
# launch batch job"), and a job released at once then stayed pending until
# the test timed out on a loaded machine.
node_idle() { [ "$(sinfo -h -N -o %T | head -n 1)" = idle ]; }
wait_requeued() { # job
    poll 120 "job $1 to be pending again" state_is "$1" PENDING
    poll 120 "the node to finish the job's previous run" node_idle
}

# The step the job last said it saved on a signal.
saved_step() {
    sed -n 's/^signal [0-9]*: saving step \([0-9]*\) and exiting$/\1/p' "$T/job-$1.out" | tail -n 1
}

check_result() { # name, job, stopped-step
    local name=$1 job=$2 stopped=$3 root=$T/work/$1
    cmp -s "$T/work/$name.bin" "$T"/reference.bin ||
        fail "$name: final weights differ from an uninterrupted run (a step was lost or torn)"
    out_has "$job" "resumed from step $stopped\$" ||
        fail "$name: the resumed run did not restore step $stopped"
    out_has "$job" "train.sbatch: resuming from step $stopped in " ||
        fail "$name: train.sbatch did not announce step $stopped"
    "$CKPT_CLI" verify "$root" --all >/dev/null ||
        fail "$name: a step on disk fails full verification"
    "$CKPT_CLI" log "$root" | grep -qE "  save_committed +step $stopped  " ||
        fail "$name: the event log has no commit of step $stopped"
    echo "ok: $name (saved step $stopped, exit 75, resumed there, weights match)"
}

# --- usr1: the warning signal to the batch shell, passed on through srun
# (the path of jobs with several tasks); the script requeues.
job=$(submit usr1 CKPT_SRUN=srun) || fail "sbatch"
poll 120 "job $job to train past step 60" out_has "$job" '^step (6|7|8|9)[0-9]/'
scancel --batch --signal=USR1 "$job" || fail "scancel --signal"
poll 120 "job $job to requeue itself" out_has "$job" "train.sbatch: the job saved and stopped"
out_has "$job" "saved and stopped \(exit 75\) on SIGUSR1; requeued job $job" ||
    fail "usr1: train.sbatch did not requeue after exit 75"
stopped=$(saved_step "$job")
[ -n "$stopped" ] || fail "usr1: the job did not save on the signal"
wait_requeued "$job"
poll 300 "job $job to complete" state_is "$job" COMPLETED
[ "$(job_restarts "$job")" = 1 ] || fail "usr1: requeued $(job_restarts "$job") times, not once"
check_result usr1 "$job" "$stopped"

# --- requeue: SIGTERM to everything, Slurm requeues.
job=$(submit requeue) || fail "sbatch"
poll 120 "job $job to train past step 60" out_has "$job" '^step (6|7|8|9)[0-9]/'
scontrol requeue "$job" || fail "scontrol requeue"
poll 120 "job $job to stop" out_has "$job" "train.sbatch: the job saved and stopped"
out_has "$job" "saved and stopped \(exit 75\) on SIGTERM" ||
    fail "requeue: the job did not exit 75 on SIGTERM"
out_has "$job" "Slurm is requeueing job $job itself \(restart 1\)" ||
    fail "requeue: train.sbatch did not see that Slurm requeued the job"
stopped=$(saved_step "$job")
[ -n "$stopped" ] || fail "requeue: the job did not save on SIGTERM"
wait_requeued "$job"
poll 300 "job $job to complete" state_is "$job" COMPLETED
[ "$(job_restarts "$job")" = 1 ] || fail "requeue: requeued $(job_restarts "$job") times, not once"
check_result requeue "$job" "$stopped"

# --- cancel: SIGTERM, no requeue; a new submission resumes.
job=$(submit cancel) || fail "sbatch"
poll 120 "job $job to train past step 60" out_has "$job" '^step (6|7|8|9)[0-9]/'
scancel "$job" || fail "scancel"
poll 120 "job $job to end" state_is "$job" CANCELLED
poll 60 "job $job's last words" out_has "$job" "train.sbatch: the job saved and stopped"
out_has "$job" "saved and stopped \(exit 75\) on SIGTERM" ||
    fail "cancel: the job did not exit 75 on SIGTERM"
stopped=$(saved_step "$job")
[ -n "$stopped" ] || fail "cancel: the job did not save on SIGTERM"
[ "$(job_restarts "$job")" = 0 ] || fail "cancel: a cancelled job was requeued"
out_has "$job" "Slurm is ending job $job \(state COMPLETING\), it will not run again" ||
    fail "cancel: train.sbatch did not say the job ends"
job2=$(submit cancel) || fail "sbatch"
poll 300 "job $job2 to complete" state_is "$job2" COMPLETED
check_result cancel "$job2" "$stopped"
echo "all slurm scenarios passed"

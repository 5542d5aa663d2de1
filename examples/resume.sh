#!/bin/sh
# resume.sh -- run a training job and restart it from its newest valid
# checkpoint when it crashes or is preempted, up to N times.
#
# usage: resume.sh [-n MAX_RESTARTS] [-d CKPT_DIR] [-w SECONDS] -- COMMAND [ARG...]
#
#   -n N    restart at most N times (default 3); then exit with the job's status
#   -d DIR  the job's checkpoint root: before each start
#           `ckpt latest DIR --full --step` (the step the job's
#           ckpt_restore(CKPT_LATEST) will restore: the newest whose every
#           chunk verifies) is run and its result exported as
#           CKPT_RESUME_STEP (empty when there is no valid checkpoint yet)
#           and CKPT_RESUME_DIR; a missing `ckpt` command is an error (127)
#   -w S    wait S seconds before a restart (default 5)
#
# The job itself resumes: it calls ckpt_restore(store, CKPT_LATEST, ...),
# which restores the newest checkpoint that verifies and skips damaged ones.
#
# Exit status of the job:
#   0                      done: resume.sh exits 0
#   75 (CKPT_EXIT_PREEMPTED) it saved and stopped on a preemption signal: restart
#   anything else          a crash (or killed by a signal): restart
#
# SIGTERM, SIGUSR1, SIGUSR2, SIGINT and SIGHUP sent to resume.sh are passed on
# to the job (so `kill -USR1 <resume.sh>`, or Slurm's --signal=B:USR1, makes
# the job save and exit 75).  When resume.sh itself was signalled, it does
# not restart the job: whatever stops it (the scheduler, an operator) wants
# it gone, so it exits with the job's status (75 after a clean save) for the
# caller to requeue; a signal that comes before the job starts (while the
# root is checked, or between runs) stops resume.sh without starting it,
# with status 75.  A job that exits 75 on its own, because the signal was
# sent to the job directly, is restarted here.
#
# The job runs in the background of this shell (so that signals can be
# passed on) but with the default SIGINT and SIGQUIT handling a foreground
# job has (a shell without job control would start it with both ignored),
# through `env --default-signal` (GNU coreutils 8.31 or later).
#
# Environment: CKPT names the `ckpt` command (default: ckpt on PATH).
set -u

max=3
dir=
pause=5
while getopts n:d:w:h opt; do
    case $opt in
    n) max=$OPTARG ;;
    d) dir=$OPTARG ;;
    w) pause=$OPTARG ;;
    h) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//;/^set -u/d'; exit 0 ;;
    *) echo "usage: resume.sh [-n MAX_RESTARTS] [-d CKPT_DIR] [-w SECONDS] -- COMMAND [ARG...]" >&2
       exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1-}" = "--" ] && shift
if [ $# -eq 0 ]; then
    echo "resume.sh: no command given" >&2
    exit 2
fi
case $max in ''|*[!0-9]*) echo "resume.sh: -n needs a number" >&2; exit 2 ;; esac

CKPT=${CKPT:-ckpt}
EXIT_PREEMPTED=75
if [ -n "$dir" ] && ! command -v "$CKPT" >/dev/null 2>&1; then
    echo "resume.sh: the ckpt command ($CKPT) was not found: set CKPT or PATH" >&2
    exit 127
fi
# Undo the SIGINT/SIGQUIT ignoring of background jobs, where env can.
if env --default-signal=INT,QUIT true 2>/dev/null; then
    set -- env --default-signal=INT,QUIT "$@"
else
    echo "resume.sh: env has no --default-signal: the job ignores SIGINT and SIGQUIT" >&2
fi
child=
signalled=
pending=
unsent= # a signal that came while no job ran

log() { echo "resume.sh: $*" >&2; }

forward() {
    signalled=$1
    pending=1
    if [ -n "$child" ]; then
        log "got SIG$1: passing it to the job (pid $child)"
        kill -s "$1" "$child" 2>/dev/null
    else
        unsent=$1
    fi
}
for sig in TERM USR1 USR2 INT HUP; do
    trap "forward $sig" "$sig"
done

attempt=0
while :; do
    if [ -n "$dir" ]; then
        if [ ! -e "$dir" ]; then
            step=
            log "start $((attempt + 1)): no checkpoint root $dir yet, starting fresh"
        elif step=$("$CKPT" latest "$dir" --full --step); then
            log "start $((attempt + 1)): resuming from step $step (newest fully valid)"
        else
            rc=$?
            if [ "$rc" -ne 1 ]; then
                log "ckpt latest $dir failed (exit $rc): not starting the job"
                exit "$rc"
            fi
            step=
            log "start $((attempt + 1)): no valid checkpoint in $dir, starting fresh"
        fi
        CKPT_RESUME_STEP=$step
        CKPT_RESUME_DIR=$dir
        export CKPT_RESUME_STEP CKPT_RESUME_DIR
    fi

    # A signal that came while the root was checked or between runs (a
    # scheduler's warning before the time limit): the newest checkpoint is
    # what a start would resume from, so the job is not started, and the
    # caller may requeue (exit 75, as after a clean save).
    if [ -n "$signalled" ]; then
        log "got SIG$signalled before start $((attempt + 1)): not starting the job"
        exit "$EXIT_PREEMPTED"
    fi
    # In the background so that this shell can pass signals on.
    "$@" &
    child=$!
    # A signal between the check above and child=$! found no job: send it.
    if [ -n "$unsent" ]; then
        log "got SIG$unsent: passing it to the job (pid $child)"
        kill -s "$unsent" "$child" 2>/dev/null
        unsent=
    fi
    status=
    while :; do
        pending=
        wait "$child"
        st=$?
        # 127: the status was collected already (by the wait below).
        [ "$st" -eq 127 ] && [ -n "$status" ] && break
        status=$st
        # A trapped signal makes wait return early with a status > 128 while
        # the job still runs: wait again for its real status.
        [ -n "$pending" ] && [ "$st" -gt 128 ] && continue
        break
    done
    child=

    if [ "$status" -eq 0 ]; then
        log "job finished"
        exit 0
    fi
    if [ -n "$signalled" ]; then
        log "job stopped with status $status after SIG$signalled: not restarting"
        exit "$status"
    fi
    if [ "$status" -eq "$EXIT_PREEMPTED" ]; then
        why="preempted (exit $EXIT_PREEMPTED)"
    elif [ "$status" -gt 128 ]; then
        why="killed by signal $((status - 128))"
    else
        why="crashed (exit $status)"
    fi
    if [ "$attempt" -ge "$max" ]; then
        plural=s
        [ "$max" -eq 1 ] && plural=
        log "job $why; giving up after $max restart$plural"
        exit "$status"
    fi
    attempt=$((attempt + 1))
    log "job $why; restart $attempt of $max in ${pause}s"
    sleep "$pause" &
    wait $! 2>/dev/null
    if [ -n "$signalled" ]; then
        log "got SIG$signalled while waiting: not restarting"
        exit "$status"
    fi
done

#!/usr/bin/env bash
# Crash-and-resume demo for libckpt.
#
#   1. Train once without interruption (no checkpoints): the reference.
#   2. Train again with a checkpoint every EVERY steps, SIGKILL the process
#      partway through (after at least one checkpoint was committed, before
#      the end), start it again with the same command: it restores the
#      newest checkpoint and finishes.  Its final weights must be bitwise
#      identical to the reference.
#   3. Damage the newest checkpoint on disk and run once more: the restore
#      skips it, says why, falls back to the previous one, and the final
#      weights are again bitwise identical.
#
# Usage: examples/demo.sh [--no-corrupt] [--keep-dir]
# Environment: BUILD_DIR (default: build), TRAIN_MLP (path to the train_mlp
# binary; default BUILD_DIR/examples/train_mlp), CKPT_CLI (the `ckpt`
# command, shown where found; default BUILD_DIR/tools/ckpt), DEMO_DIR (work
# directory; default a fresh temporary one), STEPS, EVERY, SLEEP_MS,
# KILL_AFTER.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

corrupt=1
keep_dir=0
for arg in "$@"; do
    case $arg in
    --no-corrupt) corrupt=0 ;;
    --keep-dir) keep_dir=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "demo.sh: unknown argument $arg" >&2
        exit 2
        ;;
    esac
done

build_dir=${BUILD_DIR:-$root/build}
case $build_dir in /*) ;; *) build_dir=$root/$build_dir ;; esac
train=${TRAIN_MLP:-$build_dir/examples/train_mlp}
cli=${CKPT_CLI:-$build_dir/tools/ckpt}
[[ -x $cli ]] || cli=
steps=${STEPS:-600}
every=${EVERY:-50}
sleep_ms=${SLEEP_MS:-5}
kill_after=${KILL_AFTER:-150} # kill once a checkpoint at or after this step is committed
wait_limit=120                # seconds to wait for that checkpoint

if [[ ! -x $train ]]; then
    echo "demo.sh: $train not found; build first (bash scripts/setup.sh)" >&2
    exit 2
fi
if ((kill_after < every || kill_after + every >= steps)); then
    echo "demo.sh: need EVERY <= KILL_AFTER < STEPS - EVERY" >&2
    exit 2
fi

if [[ -n ${DEMO_DIR:-} ]]; then
    work=$DEMO_DIR
    rm -rf "$work"
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-demo.XXXXXX")
fi
pid=
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
    fi
    if ((keep_dir)) || [[ -n ${DEMO_DIR:-} ]]; then
        echo "demo.sh: files kept in $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

ckdir=$work/checkpoints
common=(--steps "$steps" --every "$every" --log-every "$every")

fail() {
    echo "FAIL: $*"
    exit 1
}
say() { printf '\n== %s\n' "$*"; }
show_dir() {
    echo "\$ ls -la $(basename "$ckdir")"
    ls -la "$ckdir"
}
# Show the `ckpt` command's view, when it was built; its exit status is
# printed, not checked (the demo's checks use train_mlp's output).
show_cli() {
    [[ -n $cli ]] || return 0
    echo "\$ ckpt $*"
    local rc=0
    (cd "$work" && "$cli" "$@") || rc=$?
    ((rc == 0)) || echo "(ckpt exited with status $rc)"
}
# Run train_mlp in the foreground, its output to the terminal and $1.
run() {
    local log=$1
    shift
    set +e
    "$train" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    ((rc == 0)) || fail "train_mlp $* exited with status $rc"
}
# The newest step for which the log says "checkpoint step N committed".
last_committed() {
    { sed -n 's/^checkpoint step \([0-9][0-9]*\) committed.*/\1/p' "$1" || true; } | tail -n 1
}
resumed_step() {
    { sed -n 's/^resumed from step \([0-9][0-9]*\).*/\1/p' "$1" || true; } | tail -n 1
}

t_start=$SECONDS
say "1. reference: $steps steps without interruption or checkpoints"
run "$work/reference.log" "${common[@]}" --out "$work/reference.bin"

say "2. checkpoint every $every steps into $(basename "$ckdir")/, SIGKILL after step $kill_after is committed"
: >"$work/run1.log" # exists before the first poll
"$train" "${common[@]}" --dir "$ckdir" --sleep-ms "$sleep_ms" \
    --out "$work/resumed.bin" >>"$work/run1.log" 2>&1 &
pid=$!
deadline=$((SECONDS + wait_limit))
while :; do
    c=$(last_committed "$work/run1.log")
    if [[ -n $c ]] && ((c >= kill_after)); then
        break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        cat "$work/run1.log"
        fail "train_mlp stopped before committing step $kill_after"
    fi
    ((SECONDS < deadline)) || fail "no checkpoint at step >= $kill_after within ${wait_limit}s"
    sleep 0.05
done
# A random extra 0-0.4 s, so that the kill lands anywhere: between saves or
# while one is being written (the run still has seconds to go).
sleep "0.$(printf '%03d' $((RANDOM % 400)))"
kill -9 "$pid" 2>/dev/null || true
set +e
wait "$pid"
rc=$?
set -e
pid=
cat "$work/run1.log"
((rc == 128 + 9)) || fail "train_mlp was not killed by SIGKILL (exit status $rc): it finished too early"
! grep -q '^done:' "$work/run1.log" || fail "train_mlp finished before the kill"
committed=$(last_committed "$work/run1.log")
last_line=$(grep '^step ' "$work/run1.log" | tail -n 1 || true)
echo ">>> killed with SIGKILL (last progress line: '${last_line}'), newest checkpoint reported committed: step $committed"
begun=$({ sed -n 's/^checkpoint step \([0-9][0-9]*\) begun.*/\1/p' "$work/run1.log" || true; } | tail -n 1)
if [[ -n $begun ]] && ((begun > committed)); then
    if [[ -d $ckdir/$(printf 'step-%012d' "$begun") ]]; then
        echo ">>> the save of step $begun had just been committed (not yet reported)"
    else
        echo ">>> the save of step $begun was in flight: the restart discards what it left"
    fi
fi
show_dir

say "restart with the same command"
run "$work/run2.log" "${common[@]}" --dir "$ckdir" --out "$work/resumed.bin"
resumed=$(resumed_step "$work/run2.log")
[[ -n $resumed ]] || fail "the restarted run did not resume from a checkpoint"
((resumed >= committed)) ||
    fail "resumed from step $resumed, older than step $committed, which was committed before the kill"
((resumed < steps)) || fail "resumed from step $resumed: the kill came after the end"
show_dir
show_cli list "$(basename "$ckdir")"
cmp "$work/reference.bin" "$work/resumed.bin" ||
    fail "resumed from step $resumed, but the final weights differ from the uninterrupted run"
result="PASS: resumed from step $resumed, final weights bitwise identical to the uninterrupted run"

if ((corrupt)); then
    newest=$(find "$ckdir" -mindepth 1 -maxdepth 1 -type d -name 'step-*' | sort | tail -n 1)
    [[ -n $newest ]] || fail "no checkpoint directory in $ckdir"
    # The largest file of the newest checkpoint (a shard, not the manifest).
    shard=$(find "$newest" -maxdepth 1 -type f ! -name '*.json' -printf '%s %p\n' |
        sort -n | tail -n 1 | cut -d' ' -f2-)
    [[ -n $shard ]] || fail "no shard file in $newest"
    size=$(stat -c %s "$shard")
    off=$((size / 2))
    byte=$(od -An -tu1 -j "$off" -N 1 "$shard" | tr -d ' ')
    say "3. flip one byte (offset $off of $size) in $(basename "$newest")/$(basename "$shard"), then run again"
    chmod u+w "$shard"
    printf '%b' "\\$(printf '%03o' $((byte ^ 0xff)))" |
        dd of="$shard" bs=1 seek="$off" count=1 conv=notrunc status=none
    show_cli verify "$(basename "$ckdir")"
    run "$work/run3.log" "${common[@]}" --dir "$ckdir" --out "$work/fallback.bin"
    bad=$((10#${newest##*step-}))
    grep -q "^skipped checkpoint step $bad:" "$work/run3.log" ||
        fail "the restore did not report the damaged checkpoint step $bad as skipped"
    fallback=$(resumed_step "$work/run3.log")
    [[ -n $fallback ]] || fail "no fallback to an older checkpoint"
    ((fallback < bad)) || fail "resumed from step $fallback, not older than the damaged step $bad"
    cmp "$work/reference.bin" "$work/fallback.bin" ||
        fail "after the fallback to step $fallback the final weights differ"
    show_dir
    echo "PASS: skipped damaged step $bad, resumed from step $fallback, final weights bitwise identical"
fi

echo
echo "demo took $((SECONDS - t_start)) s"
echo "$result"

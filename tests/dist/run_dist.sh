#!/bin/bash
# Multi-rank saves under real OpenMPI jobs (mpirun -np 4 --oversubscribe on
# one machine): save and agreed restore, a second job gets busy, a rank
# SIGKILLed mid-save (no commit, every survivor's wait fails within the
# timeout, the previous step restores on all ranks), one rank's shard
# corrupted (all ranks fall back together, each reporting why), and a
# 4-rank checkpoint loaded by name into 2 ranks and into 1 process, and a
# rank late by two timeouts (rank 0 under valgrind), and a rank late to
# ckpt_mpi_new.
# The ckpt command checks, lists, inspects and exports the multi-rank steps.
# Usage: run_dist.sh DIST_JOB CKPT   (tests/dist/dist_job.c, tools/ckpt)
set -u
job=$1
ckpt=$2
if ! command -v mpirun >/dev/null; then
    echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    exit 77
fi
if [ "$(id -u)" = 0 ]; then # Open MPI refuses root without both
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# One machine, no network needed: shared memory and loopback only.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
fail() { echo "FAIL: $*"; exit 1; }
run() { # NP ARGS...: one job; its output in $tmp/out
    local np=$1; shift
    echo "+ mpirun -np $np $*"
    timeout 300 mpirun -np "$np" --oversubscribe "$@" >"$tmp/out" 2>&1
    local rc=$?
    grep -v 'PMIX ERROR' "$tmp/out"
    return $rc
}
flip() { # FILE OFFSET: change one bit
    python3 -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read()); b[o] ^= 0x40; open(p, "wb").write(b)' "$1" "$2"
}

run 4 "$job" save "$root" 1 2 || fail "save and agreed restore with 4 ranks"
[ "$(grep -c 'restored step 2' "$tmp/out")" = 4 ] || fail "not every rank restored step 2"
[ -f "$root/step-000000000002/manifest.json" ] || fail "no global manifest"
for r in 0 1 2 3; do
    [ -f "$root/step-00000000000$((2))/rank-0000$r.shard" ] || fail "no shard of rank $r"
done

run 4 "$job" busy "$root" || fail "a second job on the same root was not refused"

"$ckpt" verify "$root" || fail "ckpt verify of a 4-rank step"
"$ckpt" --json list "$root" | python3 -c 'import json, sys; d = json.load(sys.stdin); s = d["steps"]; assert [x["step"] for x in s] == [1, 2] and all(x["status"] == "valid" for x in s), d' ||
    fail "ckpt list"
"$ckpt" --json inspect "$root" | python3 -c 'import json, sys; d = json.load(sys.stdin); assert d["world_size"] == 4 and sorted((t["name"], t["rank"]) for t in d["tensors"]) == sorted(("r%d.%s" % (r, k), r) for r in range(4) for k in "wb"), d' ||
    fail "ckpt inspect does not show the 4 ranks' tensors"
if "$ckpt" export "$root" "$tmp/x.h5" >/dev/null 2>&1; then
    if command -v h5ls >/dev/null; then
        [ "$(h5ls "$tmp/x.h5" | grep -c Dataset)" = 8 ] || fail "ckpt export lost tensors"
    fi
else
    "$ckpt" export "$root" "$tmp/x.h5"; [ $? = 3 ] || fail "ckpt export" # 3: built without HDF5
fi

# Rank 2 dies mid-save: with --enable-recovery mpirun lets the others run on,
# and each one's wait must fail (CKPT_EPEER) within the timeout.
DIST_TIMEOUT_MS=3000 run 4 --enable-recovery "$job" kill "$root" 3 2
[ "$(grep -c 'returned peer' "$tmp/out")" = 3 ] || fail "the survivors' waits did not all fail"
[ ! -e "$root/step-000000000003" ] || fail "step 3 was committed without rank 2"
run 4 "$job" restore "$root" 2 0 || fail "the previous step did not restore on all ranks"

# Rank 0 (the committer) dies: the others time out; its temporary directory
# is left for the next open to remove.
DIST_TIMEOUT_MS=3000 run 4 --enable-recovery "$job" kill "$root" 3 0
[ "$(grep -c 'returned peer' "$tmp/out")" = 3 ] || fail "the survivors of rank 0 did not fail"
[ ! -e "$root/step-000000000003" ] || fail "step 3 was committed without rank 0"
ls -a "$root" | grep -q '^\.tmp-' || fail "no temporary directory left by the dead rank 0"
run 4 "$job" restore "$root" 2 0 || fail "restore after rank 0 died"
! ls -a "$root" | grep -q '^\.tmp-' || fail "the next open did not clean the temporary directory"

# One rank's shard of step 2 damaged (a chunk, not its index): only rank 2
# notices, yet every rank restores step 1 and names the reason.
cp -a "$root" "$tmp/good"
flip "$root/step-000000000002/rank-00002.shard" 80
run 4 "$job" restore "$root" 1 1 || fail "the ranks did not fall back together"
[ "$(grep -c "skipped step 2 (corrupt).*rank-00002.shard" "$tmp/out")" = 4 ] ||
    fail "not every rank reported why step 2 was skipped"
"$ckpt" verify --step 2 "$root" >"$tmp/verify" 2>&1 && fail "ckpt verify passed a damaged step"
grep -q rank-00002.shard "$tmp/verify" || fail "ckpt verify did not name the damaged shard"

# Resharding: the intact 4-rank step 2 into 2 ranks, and into one process.
rm -rf "$root" && mv "$tmp/good" "$root"
run 2 "$job" reshard "$root" 2 4 || fail "2 ranks loading a 4-rank checkpoint"
"$job" single "$root" 2 4 || fail "one process loading a 4-rank checkpoint"

# Rank 1's part manifest of step 2 damaged (a tensor renamed: its checksum
# fails): the global manifest, the commit record that ckpt verify checks,
# is intact, so every rank restores step 2 (rank 1 through the global one).
sed -i '0,/"r1.b"/s//"r1.c"/' "$root/step-000000000002/rank-00001.json"
grep -q '"r1.c"' "$root/step-000000000002/rank-00001.json" || fail "the part manifest was not changed"
# ckpt verify passes the step and names the damaged part as a warning.
for level in --quick ""; do
    "$ckpt" verify $level --step 2 "$root" >"$tmp/verify" 2>&1 || fail "ckpt verify $level of step 2"
    grep -q 'warning: .*rank-00001.json.*stays valid' "$tmp/verify" ||
        { cat "$tmp/verify"; fail "ckpt verify $level did not name the damaged part"; }
done
run 4 "$job" restore "$root" 2 0 || fail "a damaged part manifest made the ranks skip step 2"
# Rank 2 saves step 6 while the others save step 5: every rank's save
# fails naming it, and no temporary directory stays behind (rank 2's of
# step 6 is its own to remove, as rank 0's of step 5 is rank 0's).
odd_root=$tmp/odd
DIST_ODD_RANK=2 run 4 -x DIST_ODD_RANK "$job" save "$odd_root" 5 && fail "saves of different steps committed"
[ "$(grep -c 'rank 2 saved step 6 while rank 0 saved step 5' "$tmp/out")" = 4 ] ||
    fail "not every rank named rank 2's step"
! ls -a "$odd_root" | grep -q '^\.tmp-' || fail "a temporary directory stayed: $(ls -a "$odd_root")"
[ ! -e "$odd_root/step-000000000005" ] && [ ! -e "$odd_root/step-000000000006" ] ||
    fail "a step was committed"

# A rank starts its save two timeouts late: the others' saves fail
# (CKPT_EPEER) and they live on while its data arrives.  MPI cannot cancel
# the collectives they gave up on, so those must not point into memory
# libckpt freed: rank 0 runs under valgrind (or every rank under
# AddressSanitizer in a sanitizer build), which would see the late rank's
# gather land in a freed buffer.
late_root=$tmp/late
late_check() { # what every run of the late case must show
    [ "$(grep -c 'returned peer' "$tmp/out")" = 4 ] || fail "the late rank's save did not fail everywhere"
    [ "$(grep -c ': done' "$tmp/out")" = 4 ] || fail "a rank did not outlive the late data"
}
if ldd "$job" 2>/dev/null | grep -q libasan; then
    # A sanitizer build (valgrind cannot run it): AddressSanitizer watches
    # every rank, MPI's copies included (it intercepts memmove).
    DIST_TIMEOUT_MS=3000 run 4 --enable-recovery -x DIST_TIMEOUT_MS "$job" late "$late_root" 1 3
    ! grep -q AddressSanitizer "$tmp/out" || fail "a late rank's data landed in freed memory"
    late_check
elif command -v valgrind >/dev/null; then
    DIST_TIMEOUT_MS=3000 run 4 --enable-recovery -x DIST_TIMEOUT_MS \
        -np 1 valgrind -q --log-file="$tmp/vg.%p" "$job" late "$late_root" 1 3 : \
        -np 3 "$job" late "$late_root" 1 3
    late_check
    if grep -q -E "Invalid (write|read)" "$tmp"/vg.*; then
        cat "$tmp"/vg.*
        fail "a late rank's data landed in memory rank 0 had freed"
    fi
else
    echo "valgrind not found: the late-rank check is skipped"
fi
[ ! -e "$late_root/step-000000000001" ] || fail "step 1 was committed with a late rank"

# A rank that never reaches ckpt_mpi_new (here: 2 s late) fails the others
# after their timeout (CKPT_EPEER) instead of hanging them in the
# duplication of the communicator; the late rank's own then completes.
run 3 --enable-recovery "$job" latenew "$tmp/latenew" 1 ||
    fail "ckpt_mpi_new_timeout with a late rank"
[ "$(grep -c 'returned peer after 0\.' "$tmp/out")" = 2 ] ||
    fail "the punctual ranks did not give up after 500 ms"

echo "dist: all passed"

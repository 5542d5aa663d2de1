#!/bin/sh
# Run a Criterion test executable under valgrind and fail on any memcheck
# error or definite leak in any of its processes.
#
# Criterion runs each test in a worker process and takes the test's verdict
# before the worker exits, so valgrind's --error-exitcode (and every leak,
# reported at exit) never reaches the runner's exit status: a plain
# `meson test --wrap=valgrind` passes with errors.  Here every process logs
# to its own file and the logs decide.
#
#   meson test -C BUILD --suite core --setup corevalgrind
set -u
# --vgdb=no: no gdbserver pipes in /tmp, which a test's child that drops
# privileges (test_trust_groups.c becomes another user) could not unlink at exit.
logdir=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-vg-XXXXXX") || exit 99
supp=$(dirname "$0")/valgrind.supp
# somalloc=nouserintercepts: a test's own malloc (test_oom.c, which fails
# allocations one by one) stays the one its program calls; memcheck still
# tracks the memory, through libc's __libc_malloc it calls.
valgrind -q --vgdb=no --trace-children=yes --child-silent-after-fork=no \
    --soname-synonyms=somalloc=nouserintercepts \
    --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --suppressions="$supp" \
    --log-file="$logdir/vg.%p.log" "$@"
status=$?
bad=0
for f in "$logdir"/vg.*.log; do
    [ -s "$f" ] || continue
    echo "---- valgrind: $f" >&2
    cat "$f" >&2
    bad=1
done
rm -rf "$logdir"
if [ "$bad" -ne 0 ]; then
    echo "valgrind reported errors (see above)" >&2
    exit 1
fi
exit "$status"

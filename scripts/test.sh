#!/usr/bin/env bash
# Set up and run every test of libckpt:
#   1. the whole meson test suite on a normal build (build/);
#   2. the same suite (but slurm: the job scripts, not the library, are what
#      it checks) on an AddressSanitizer + UndefinedBehaviorSanitizer
#      build (build-asan/), any report fatal;
#   3. the C test suites under valgrind memcheck (suite `memcheck`: core,
#      common, format, cuda against the mock, integrity but the SIGKILL
#      harness; errors and leaks fatal).
# Exits non-zero if anything failed; the last line is a summary.
#
# Usage: scripts/test.sh [--no-asan] [--no-valgrind]
# Environment: BUILD_DIR (default build), ASAN_BUILD_DIR (default
# build-asan), MESON_TEST_ARGS (extra `meson test` arguments, e.g.
# "--num-processes 1").
# shellcheck disable=SC2317 # (functions called through stage())
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2

do_asan=1
do_valgrind=1
for arg in "$@"; do
    case $arg in
    --no-asan) do_asan=0 ;;
    --no-valgrind) do_valgrind=0 ;;
    -h | --help)
        sed -n '2,/^set -uo/p' "$0" | sed '/^# shellcheck/d; $d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "test.sh: unknown argument $arg" >&2
        exit 2
        ;;
    esac
done

build=${BUILD_DIR:-build}
asan_build=${ASAN_BUILD_DIR:-build-asan}
read -r -a extra <<<"${MESON_TEST_ARGS:-}"
# The Debian interpreter has numpy, torch, h5py and pytest; a python3 found
# first on PATH (pyenv, venv) may not.
export PYTHON=/usr/bin/python3

start=$SECONDS
passed=()
failed=()
stage() { # name, command...
    local name=$1
    shift
    local t0=$SECONDS
    printf '\n==== %s\n' "$name"
    if "$@"; then
        passed+=("$name")
        printf '==== %s: ok (%ds)\n' "$name" $((SECONDS - t0))
    else
        failed+=("$name")
        printf '==== %s: FAILED (%ds)\n' "$name" $((SECONDS - t0))
    fi
}

# Suites defined in a build directory, one per line.
suites() {
    meson introspect --tests "$1" 2>/dev/null | /usr/bin/python3 -c '
import json, sys
names = set()
for t in json.load(sys.stdin):
    for s in t.get("suite", []):
        names.add(s.split(":")[-1])
print("\n".join(sorted(names)))'
}
# Not `suites | grep -q`: grep -q exits at the first match, the writer can
# then die of SIGPIPE, and under pipefail the match reads as a failure.
has_suite() {
    local all
    all=$(suites "$1")
    grep -qx -- "$2" <<<"$all"
}
passed_stage() {
    local s
    for s in "${passed[@]}"; do
        [[ $s == "$1" ]] && return 0
    done
    return 1
}

# Totals over every `meson test` run, for the closing "N passed, N failed".
n_passed=0
n_failed=0
n_skipped=0
run_tests() { # build dir, meson test args...
    local dir=$1 out rc
    shift
    out=$(mktemp)
    meson test -C "$dir" --print-errorlogs "${extra[@]}" "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    local ok fail skip timeout
    ok=$(awk '/^Ok:/ {print $2}' "$out" | tail -n 1)
    fail=$(awk '/^Fail:/ {print $2}' "$out" | tail -n 1)
    timeout=$(awk '/^Timeout:/ {print $2}' "$out" | tail -n 1)
    skip=$(awk '/^Skipped:/ {print $2}' "$out" | tail -n 1)
    n_passed=$((n_passed + ${ok:-0}))
    n_failed=$((n_failed + ${fail:-0} + ${timeout:-0}))
    n_skipped=$((n_skipped + ${skip:-0}))
    if ((rc != 0 && ${fail:-0} + ${timeout:-0} == 0)); then
        n_failed=$((n_failed + 1)) # meson itself failed (setup, build)
    fi
    rm -f "$out"
    return "$rc"
}

# ---------------------------------------------------------------- normal
stage "setup ($build)" bash scripts/setup.sh "$build"
if passed_stage "setup ($build)"; then
    stage "meson test ($build)" run_tests "$build"
fi

# ------------------------------------------------------------ sanitizers
# Every process writes its sanitizer reports to its own file under
# $asan_build/sanitizer-logs, and any report fails the stage: Criterion runs
# each test in a worker process whose leak report does not change the test's
# result.  Criterion's own runner leaks a little (scripts/lsan.supp; matching
# it needs full stack unwinding on malloc).
# An instrumented libckpt cannot be loaded into the (uninstrumented) Python
# interpreter unless the sanitizer runtimes are preloaded: the python and
# dist tests get them from their meson environment (tests/meson.build:
# sanitized_env), without leak checking (CPython and Open MPI keep memory
# until exit).
# 0 when the report file holds leaks only, each of exactly two frames:
# an allocator, then libcriterion.
criterion_runner_leak_only() {
    grep -q 'ERROR: LeakSanitizer' "$1" || return 1
    grep -q -E 'ERROR: AddressSanitizer|runtime error:' "$1" && return 1
    awk '
        /^(Direct|Indirect) leak/ { inleak = 1; frames = 0; next }
        inleak && /^ *#[0-9]+ / {
            frames++
            if (frames == 1 && $0 !~ /(calloc|malloc|realloc)/) bad = 1
            if (frames == 2 && $0 !~ /libcriterion\.so/) bad = 1
            if (frames > 2) bad = 1
            next
        }
        inleak && /^$/ { inleak = 0 }
        END { exit bad ? 1 : 0 }
    ' "$1"
}

asan_tests() {
    local logs=$root/$asan_build/sanitizer-logs rc=0
    rm -rf "$logs"
    mkdir -p "$logs"
    local asan=halt_on_error=1:abort_on_error=1:strict_string_checks=1
    asan+=:detect_stack_use_after_return=1:check_initialization_order=1
    asan+=:log_path=$logs/asan
    local ubsan=print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan
    # Leaks do not fail the test process (exitcode=0; other errors abort):
    # the report scan below decides, so that it can tell Criterion's own
    # runner leak apart.
    ASAN_OPTIONS=$asan:detect_leaks=1:fast_unwind_on_malloc=0:exitcode=0 \
    LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0 \
    UBSAN_OPTIONS=$ubsan \
        run_tests "$asan_build" --no-suite python --no-suite dist --no-suite slurm --timeout-multiplier 3 || rc=1
    if has_suite "$asan_build" python; then
        ASAN_OPTIONS=$asan:detect_leaks=0 UBSAN_OPTIONS=$ubsan \
            run_tests "$asan_build" --suite python --timeout-multiplier 3 || rc=1
    fi
    # Several ranks: mpirun (uninstrumented) and Python ranks load the
    # instrumented library, and Open MPI and CPython keep memory until exit,
    # so no leak checking there (libckpt's own leaks are the core suite's).
    if has_suite "$asan_build" dist; then
        ASAN_OPTIONS=$asan:detect_leaks=0 UBSAN_OPTIONS=$ubsan \
            run_tests "$asan_build" --suite dist --timeout-multiplier 3 || rc=1
    fi
    # A file holding only a "Suppressions used" table is no report, nor one
    # whose every leak is Criterion's runner block: allocated by calloc
    # straight from a static function of libcriterion, a two-frame stack
    # that no suppression can name (seen about once in ten runs).
    local f n=0
    for f in "$logs"/*; do
        [[ -e $f ]] || continue
        grep -q -E 'ERROR: [A-Za-z]*Sanitizer|runtime error:|SUMMARY: [A-Za-z]*Sanitizer' "$f" || continue
        if criterion_runner_leak_only "$f"; then
            echo "sanitizers: ignored Criterion's runner leak in $f"
            continue
        fi
        ((n == 0)) && echo "sanitizer reports:"
        n=$((n + 1))
        echo "---- $f"
        head -n 60 "$f"
    done
    echo "sanitizers: $n report(s)"
    ((n == 0)) || rc=1
    return "$rc"
}
if ((do_asan)); then
    stage "setup ($asan_build: address+undefined)" bash scripts/setup.sh "$asan_build" \
        -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized
    if passed_stage "setup ($asan_build: address+undefined)"; then
        stage "meson test ($asan_build)" asan_tests
    fi
fi

# --------------------------------------------------------------- valgrind
# Criterion runs each test in a child process, whose valgrind errors do not
# change the parent's exit status: every process logs to its own file and
# any file with errors fails the stage.  The core suite's own valgrind
# setup does the same; the fallback below is for a tree without it.
valgrind_tests() {
    if ! has_suite "$build" core; then
        echo "no 'core' suite in $build: nothing to run under valgrind"
        return 1
    fi
    # The core suite's own setup (tests/core/meson.build: valgrind-check.sh)
    # when it has one, over every C test that runs clean under it.
    if meson test -C "$build" --list --setup corevalgrind >/dev/null 2>&1; then
        if has_suite "$build" memcheck; then
            run_tests "$build" --suite memcheck --setup corevalgrind
        else
            run_tests "$build" --suite core --setup corevalgrind
        fi
        return
    fi
    local logs=$root/$build/valgrind-logs
    rm -rf "$logs"
    mkdir -p "$logs"
    local wrap="valgrind --quiet --error-exitcode=1 --leak-check=full"
    wrap+=" --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect"
    wrap+=" --trace-children=yes --track-origins=yes --num-callers=30"
    wrap+=" --log-file=$logs/vg-%p.log"
    local rc=0
    run_tests "$build" --suite core --wrap "$wrap" --timeout-multiplier 20 || rc=1
    local bad
    bad=$(grep -l -E 'ERROR SUMMARY: [1-9]' "$logs"/vg-*.log 2>/dev/null || true)
    if [[ -n $bad ]]; then
        rc=1
        echo "valgrind reported errors:"
        local f
        for f in $bad; do
            echo "---- $f"
            head -n 80 "$f"
        done
    fi
    echo "valgrind: $(find "$logs" -name 'vg-*.log' | wc -l) process log(s), $(echo -n "$bad" | grep -c . || true) with errors"
    return "$rc"
}
if ((do_valgrind)) && passed_stage "setup ($build)"; then
    if command -v valgrind >/dev/null 2>&1; then
        stage "valgrind (C suites of $build)" valgrind_tests
    else
        failed+=("valgrind (not installed)")
    fi
fi

# ---------------------------------------------------------------- summary
elapsed=$((SECONDS - start))
echo
join() { # separator, items...
    local sep=$1 out="" item
    shift
    for item in "$@"; do
        out+=${out:+$sep}$item
    done
    printf '%s' "$out"
}
if ((${#failed[@]} == 0)); then
    echo "test.sh: ALL PASSED (${#passed[@]} stages: $(join '; ' "${passed[@]}")) in ${elapsed}s"
    echo "tests: $n_passed passed, $n_failed failed, $n_skipped skipped"
    exit 0
fi
echo "test.sh: FAILED: $(join '; ' "${failed[@]}") (${#passed[@]} stages passed) in ${elapsed}s"
((n_failed > 0)) || n_failed=${#failed[@]} # a stage failed outside meson test
echo "tests: $n_passed passed, $n_failed failed, $n_skipped skipped"
exit 1

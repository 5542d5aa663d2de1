#!/usr/bin/env bash
# tests/gpu/run.sh -- everything that needs a real GPU, in one run of under
# five minutes on a fresh machine with one (or two) GPUs:
#
#   gpu        is there a GPU at all: a /dev/nvidiaN node, a GPU under
#              /proc/driver/nvidia/gpus, or one listed by nvidia-smi.  None of
#              them: "SKIP: no CUDA device" and exit 77, before building.
#   toolkit    the CUDA toolkit (cuda_runtime_api.h, libcudart) must already
#              be installed; nvcc is looked for on PATH, in $CUDA_HOME/bin and
#              /usr/local/cuda/bin.  No nvcc: the CUDA demo cannot be built,
#              which is reported (NOT RUN, and a warning at the end).
#   build      scripts/setup.sh: meson, ninja; packages are not installed
#              (CKPT_SKIP_PACKAGES defaults to 1 here: a lent GPU machine
#              reaches no package archive, and apt-get would spend the
#              budget failing); meson names what is missing.  Set
#              CKPT_SKIP_PACKAGES=0 to install the missing ones first.
#              PREBUILT=1 uses BUILD_DIR as it is, built elsewhere with nvcc
#              (tests/gpu/kit.sh: for a GPU machine without the -dev
#              packages); a folder BUILD_DIR/kit-libs is put first on
#              LD_LIBRARY_PATH (the shared libraries that build linked).
#              The toolkit's own library folder is added to LD_LIBRARY_PATH
#              when the loader does not find libcudart there already.
#   runtime    test_gpu --probe: cudaGetDeviceCount and each device's
#              properties.  A GPU that the runtime cannot use (an old driver:
#              "driver version is insufficient") is a failure, not a skip.
#   test_gpu   tests/gpu/test_gpu with CKPT_GPU_REQUIRED=1 (its header lists
#              the checks); the multi-GPU row is its device-1 part (run when
#              there are two GPUs or more).
#   demo       examples/cuda/demo.sh: SIGKILL a CUDA training loop, resume,
#              compare bitwise (required whenever nvcc exists).
#   bench      benchmarks/gpu/bench_gpu (its header lists the figures and
#              targets): ratios are reported; ENFORCE_TARGETS=1 makes a
#              missed target a failure.
#   torch      the torch tests of tests/python on the GPU, when a python3
#              ($PYTHON, python3 on PATH, /usr/bin/python3: the first) has a
#              torch with CUDA, numpy and pytest (else NOT RUN: the Debian
#              torch is CPU-only).
#   mock       MOCK=1 adds the mock-runtime suite (CI runs it anyway).
#
# DRY_RUN=mock runs this script's own logic without a GPU, for CI (meson
# test gpu-run-dry): test_gpu and bench_gpu as built against tests/cuda's
# mock runtime (test_gpu_on_mock, bench_gpu_on_mock) in BUILD_DIR as it is
# (no setup.sh), no demo, no torch; MOCK_CUDA_DEVICE_COUNT=2 also takes the
# multi-GPU path there.
# Every stage has its own time limit, shortened so that the whole run stays
# inside BUDGET seconds (default 285); a stage that runs out of time is a
# failure.  The results table is printed at the end and written as JSON to
# $OUT/gpu-results.json when OUT is set, else to BUILD_DIR/gpu-results.json;
# logs go next to it (OUT/logs or BUILD_DIR/gpu-run).
#
# Environment: BUILD_DIR (default build-gpu), OUT, BUDGET, SIZES (bench sizes
# in GiB, default 1,4), BIG_GIB (default 16), MANY (default 10000), MODES
# (default host,device,stream), ENFORCE_TARGETS, MOCK, CUDA_HOME.
# Exit status: 0 every stage passed (or was not applicable), 1 a stage
# failed or timed out, 77 no GPU on this machine.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
case $build in /*) ;; *) build=$root/$build ;; esac
budget=${BUDGET:-285}
t_start=$SECONDS

names=() states=() secs=() notes=() warnings=()
record() { # name status seconds note
    names+=("$1")
    states+=("$2")
    secs+=("$3")
    notes+=("$4")
    printf '== %-10s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4"
}
left() { echo $((budget - (SECONDS - t_start))); }

# run_stage NAME LIMIT LOG CMD...: runs CMD under min(LIMIT, time left),
# output in LOG; sets stage_rc (124: timed out) and stage_s.
run_stage() {
    local name=$1 limit=$2 log=$3
    shift 3
    local l
    l=$(left)
    ((l < limit)) && limit=$l
    stage_s=0
    if ((limit < 5)); then
        stage_rc=124
        echo "no time left for $name (budget ${budget}s)" >"$log"
        return
    fi
    printf '\n-- [%3ds] %s (limit %ss)\n' $((SECONDS - t_start)) "$name" "$limit"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" >"$log" 2>&1
    stage_rc=$?
    ((stage_rc == 137)) && stage_rc=124
    stage_s=$((SECONDS - t0))
}

json_str() { # a JSON string literal
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\t'/ }
    s=${s//$'\n'/ }
    printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\037')"
}

finish() {
    local failed=0 i
    printf '\n%-10s %-8s %6s  %s\n' stage status seconds note
    for i in "${!names[@]}"; do
        printf '%-10s %-8s %6s  %s\n' "${names[$i]}" "${states[$i]}" "${secs[$i]}" "${notes[$i]}"
        case ${states[$i]} in FAIL | TIMEOUT) failed=1 ;; esac
    done
    local dest=${OUT:-$build}
    mkdir -p "$dest" 2>/dev/null
    {
        printf '{"total_s":%d,"budget_s":%d,"dry_run":%s,"passed":%s,"stages":[' \
            $((SECONDS - t_start)) "$budget" "$([[ -n $dry ]] && echo true || echo false)" \
            "$( ((failed)) && echo false || echo true)"
        for i in "${!names[@]}"; do
            ((i)) && printf ','
            printf '{"name":%s,"status":%s,"seconds":%s,"note":%s}' "$(json_str "${names[$i]}")" \
                "$(json_str "${states[$i]}")" "${secs[$i]}" "$(json_str "${notes[$i]}")"
        done
        printf '],"warnings":['
        for i in "${!warnings[@]}"; do
            ((i)) && printf ','
            json_str "${warnings[$i]}"
        done
        printf '],"bench":'
        if [[ -s $logs/bench_gpu.json ]] && python3 -m json.tool "$logs/bench_gpu.json" \
            >/dev/null 2>&1; then
            cat "$logs/bench_gpu.json"
        else
            printf 'null'
        fi
        printf '}\n'
    } >"$dest/gpu-results.json" 2>/dev/null && echo "results: $dest/gpu-results.json"
    ((${#warnings[@]})) && printf 'WARNING: %s\n' "${warnings[@]}"
    echo "total $((SECONDS - t_start)) s; logs in $logs"
    if ((failed)); then
        echo "FAILED"
        exit 1
    fi
    echo "PASS"
    exit 0
}

not_run() { # every later stage, when an earlier one makes them pointless
    local s
    for s in "$@"; do record "$s" "NOT RUN" 0 "$reason"; done
    finish
}

dry=${DRY_RUN:-}
case $dry in "" | mock) ;; *) echo "run.sh: DRY_RUN=$dry: only DRY_RUN=mock exists"; exit 2 ;; esac

# ------------------------------------------------------------------ gpu
nodes=$(ls /dev/nvidia[0-9]* 2>/dev/null | tr '\n' ' ')
procs=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l)
smi="nvidia-smi not installed"
smi_gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    smi_out=$(timeout 30 nvidia-smi -L 2>&1)
    smi_gpus=$(grep -c '^GPU ' <<<"$smi_out")
    smi="nvidia-smi lists $smi_gpus GPU(s)"
    ((smi_gpus)) || smi="nvidia-smi: $(head -n 1 <<<"$smi_out")"
fi
if [[ -z $dry && -z $nodes ]] && ((procs == 0 && smi_gpus == 0)); then
    echo "SKIP: no CUDA device: no /dev/nvidiaN device node, no GPU under" \
        "/proc/driver/nvidia/gpus, $smi"
    exit 77
fi
logs=${OUT:+$OUT/logs}
logs=${logs:-$build/gpu-run}
mkdir -p "$logs" || { echo "FAIL: cannot create $logs"; exit 1; }
((smi_gpus)) && printf '%s\n' "$smi_out" | head -n 8
if [[ -n $dry ]]; then
    record gpu "DRY RUN" 0 "the mock CUDA runtime of tests/cuda stands in for a GPU"
else
    record gpu PASS 0 "device nodes: ${nodes:-none}; /proc/driver/nvidia/gpus: $procs; $smi"
fi

# -------------------------------------------------------------- toolkit
cuda_home=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
nvcc=$(command -v nvcc 2>/dev/null)
for c in "$cuda_home/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    [[ -z $nvcc && -x $c ]] && nvcc=$c
done
if [[ -n $nvcc ]]; then
    PATH="$(dirname "$nvcc"):$PATH" # meson finds nvcc (and the toolkit) on PATH
    export PATH
    cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
fi
if [[ ! -f $cuda_home/include/cuda_runtime_api.h ]] &&
    [[ ! -f /usr/include/cuda_runtime_api.h ]]; then
    record toolkit FAIL 0 "no CUDA toolkit (cuda_runtime_api.h not in $cuda_home/include or /usr/include): install it; test_gpu and bench_gpu need its headers and libcudart"
    reason="no CUDA toolkit"
    not_run build runtime test_gpu demo bench
fi
export CUDA_PATH=$cuda_home
# libcudart: test_gpu, bench_gpu and train_cuda link it, and meson's CUDA
# dependency sets no run path; a toolkit outside the loader's folders
# (/usr/local/cuda/lib64 is not in every ld.so.conf) would make each of them
# fail to start, which would read as "CUDA cannot use the GPU".
if ! ldconfig -p 2>/dev/null | grep -q 'libcudart\.so\.1[0-9]'; then
    for d in "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib"; do
        if compgen -G "$d/libcudart.so.1[0-9]*" >/dev/null; then
            export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            break
        fi
    done
fi
if [[ -n $dry ]]; then
    nvcc= # the demo needs a GPU
    record toolkit PASS 0 "$cuda_home (headers for the programs built on the mock)"
elif [[ -n $nvcc ]]; then
    record toolkit PASS 0 "$cuda_home; $("$nvcc" --version | grep -o 'release [0-9.]*')"
else
    record toolkit PASS 0 "$cuda_home; NO nvcc: the CUDA demo cannot be built"
    warnings+=("a GPU is present but nvcc is not (PATH, $cuda_home/bin): examples/cuda was not built or run")
fi

# ---------------------------------------------------------------- build
# What this run needs (g++: nvcc's host compiler); the rest of
# scripts/setup.sh's list (valgrind, HDF5, Python, torch) is for CI, and the
# torch stage checks for its own.
export CKPT_PACKAGES="meson ninja-build pkg-config gcc g++ libzstd-dev libxxhash-dev
    libjansson-dev libcriterion-dev"
prebuilt=${PREBUILT:-0}
[[ -n $dry ]] && prebuilt=1
if ((prebuilt)); then
    stage_rc=0 stage_s=0
    [[ -f $build/build.ninja ]] || { stage_rc=1; echo "PREBUILT: $build is not a build directory" >"$logs/build.log"; }
    if [[ -d $build/kit-libs ]]; then
        export LD_LIBRARY_PATH=$build/kit-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
else
    run_stage build 170 "$logs/build.log" env CKPT_SKIP_PACKAGES="${CKPT_SKIP_PACKAGES:-1}" \
        bash "$root/scripts/setup.sh" "$build" --buildtype=release
fi
if ((stage_rc)); then
    tail -n 30 "$logs/build.log"
    record build "$( ((stage_rc == 124)) && echo TIMEOUT || echo FAIL)" "$stage_s" \
        "scripts/setup.sh (status $stage_rc): see build.log"
    reason="the build failed"
    not_run runtime test_gpu demo bench
fi
test_gpu=$build/tests/gpu/test_gpu
bench_gpu=$build/benchmarks/gpu/bench_gpu
if [[ -n $dry ]]; then
    test_gpu=$build/tests/cuda/test_gpu_on_mock
    bench_gpu=$build/tests/cuda/bench_gpu_on_mock
fi
train_cuda=$build/examples/cuda/train_cuda
missing=()
[[ -x $test_gpu ]] || missing+=(test_gpu)
[[ -x $bench_gpu ]] || missing+=(bench_gpu)
if ((${#missing[@]})); then
    grep -iE "cuda|nvcc" "$logs/build.log" | tail -n 10
    record build FAIL "$stage_s" "built, but not: ${missing[*]} (meson found no CUDA?)"
    reason="the build lacks GPU programs"
    not_run runtime test_gpu demo bench
fi
# The demo alone needs nvcc to compile (meson's CUDA compiler check can
# fail where the host compiler is newer than nvcc accepts): without it the
# tests and the benchmark still run, and the demo is recorded as failed.
no_demo=
if [[ -n $nvcc && ! -x $train_cuda ]]; then
    grep -iE "cuda|nvcc" "$logs/build.log" | tail -n 10
    no_demo="examples/cuda/train_cuda was not built though nvcc is $nvcc (meson could not use it: see build.log)"
fi
record build "$([[ -n $dry ]] && echo "NOT RUN" || { [[ -n $no_demo ]] && echo FAIL || echo PASS; })" \
    "$stage_s" "$build$( ((prebuilt)) && echo " (used as built)")${no_demo:+; $no_demo}"

# -------------------------------------------------------------- runtime
run_stage runtime 30 "$logs/probe.log" "$test_gpu" --probe
cat "$logs/probe.log"
ndev=$(sed -n 's/^devices: //p' "$logs/probe.log")
if ((stage_rc)); then
    record runtime "$( ((stage_rc == 124)) && echo TIMEOUT || echo FAIL)" "$stage_s" \
        "a GPU is visible but CUDA cannot use it: $(grep -v '^devices' "$logs/probe.log" | tr '\n' ' ')"
    reason="CUDA cannot use the GPU"
    not_run test_gpu demo bench
fi
record runtime PASS "$stage_s" "$ndev device(s); $(head -n 1 "$logs/probe.log")"

# ------------------------------------------------------------- test_gpu
run_stage test_gpu 120 "$logs/test_gpu.log" env CKPT_GPU_REQUIRED=1 "$test_gpu"
rc=$stage_rc
grep -E "^(FAIL|PASS|FAILED|multi-GPU)|done$" "$logs/test_gpu.log"
case $rc in
0) record test_gpu PASS "$stage_s" "$(grep -E '^PASS' "$logs/test_gpu.log")" ;;
124) record test_gpu TIMEOUT "$stage_s" "stopped at its time limit" ;;
*)
    grep -E "FAIL|FATAL" "$logs/test_gpu.log" | head -n 20
    record test_gpu FAIL "$stage_s" "status $rc: $(grep -cE '^FAIL ' "$logs/test_gpu.log") failed check(s), see test_gpu.log"
    ;;
esac
multi=$(grep -E '^multi-GPU: ' "$logs/test_gpu.log" | tail -n 1)
case $multi in
"multi-GPU: done"*) record multi-gpu PASS 0 "$multi" ;;
"multi-GPU: skipped"*) record multi-gpu "NOT RUN" 0 "${multi#multi-GPU: } (needs 2 GPUs)" ;;
"") record multi-gpu "$( ((ndev >= 2)) && echo FAIL || echo "NOT RUN")" 0 "no multi-GPU line in test_gpu.log" ;;
*) record multi-gpu FAIL 0 "$multi" ;;
esac

# ----------------------------------------------------------------- demo
if [[ -n $no_demo ]]; then
    record demo FAIL 0 "$no_demo"
elif [[ -n $nvcc ]]; then
    run_stage demo 90 "$logs/demo.log" env BUILD_DIR="$build" TRAIN_CUDA="$train_cuda" \
        STEPS=400 EVERY=40 SLEEP_MS=5 KILL_AFTER=120 \
        bash "$root/examples/cuda/demo.sh"
    grep -E "^(PASS|FAIL|SKIP)" "$logs/demo.log"
    case $stage_rc in
    0) record demo PASS "$stage_s" "kill, resume, bitwise identical" ;;
    124) record demo TIMEOUT "$stage_s" "stopped at its time limit" ;;
    77) record demo FAIL "$stage_s" "skipped though a GPU is visible: $(grep -m1 SKIP "$logs/demo.log")" ;;
    *)
        tail -n 20 "$logs/demo.log"
        record demo FAIL "$stage_s" "status $stage_rc, see demo.log"
        ;;
    esac
elif [[ -n $dry ]]; then
    record demo "NOT RUN" 0 "dry run: the demo needs a GPU"
else
    record demo "NOT RUN" 0 "no nvcc: examples/cuda/train_cuda cannot be built"
fi

# ---------------------------------------------------------------- bench
bench_args=(--sizes "${SIZES:-1,4}" --modes "${MODES:-host,device,stream}"
    --big "${BIG_GIB:-16}" --many "${MANY:-10000}" --json "$logs/bench_gpu.json")
[[ ${ENFORCE_TARGETS:-0} == 1 ]] && bench_args+=(--enforce)
rm -f "$logs/bench_gpu.json"
# The torch stage (when it applies) keeps 40 s.
bench_limit=$(($(left) - 40))
run_stage bench "$bench_limit" "$logs/bench_gpu.log" env CKPT_GPU_REQUIRED=1 "$bench_gpu" \
    "${bench_args[@]}"
sed -n '/^summary/,$p' "$logs/bench_gpu.log"
missed=$(grep -o '"targets_missed":[0-9]*' "$logs/bench_gpu.json" 2>/dev/null | cut -d: -f2)
case $stage_rc in
0) record bench PASS "$stage_s" "targets missed: ${missed:-?} (reported; ENFORCE_TARGETS=1 enforces)" ;;
3) record bench FAIL "$stage_s" "targets missed: ${missed:-?} (ENFORCE_TARGETS=1)" ;;
124) record bench TIMEOUT "$stage_s" "stopped at its time limit" ;;
*)
    tail -n 15 "$logs/bench_gpu.log"
    record bench FAIL "$stage_s" "status $stage_rc, see bench_gpu.log"
    ;;
esac

# ---------------------------------------------------------------- torch
py=
for c in ${PYTHON:-} python3 /usr/bin/python3; do
    [[ -n $dry ]] && break
    if "$c" -c 'import sys, torch, numpy, pytest; sys.exit(0 if torch.cuda.is_available() else 1)' \
        >/dev/null 2>&1; then
        py=$c
        break
    fi
done
if [[ -n $dry ]]; then
    record torch "NOT RUN" 0 "dry run: needs a GPU"
elif [[ -n $py ]]; then
    run_stage torch 40 "$logs/torch.log" env LIBCKPT_LIBRARY="$build/lib/libckpt.so" \
        PYTHONPATH="$root/bindings/python:$root/tests/pyhelpers" PYTHONDONTWRITEBYTECODE=1 \
        "$py" -m pytest -q -rs -p no:cacheprovider "$root/tests/python/test_torch.py" \
        "$root/tests/python/test_torch_state.py" "$root/tests/python/test_streams.py"
    tail -n 3 "$logs/torch.log"
    case $stage_rc in
    0) record torch PASS "$stage_s" "$(tail -n 1 "$logs/torch.log")" ;;
    124) record torch TIMEOUT "$stage_s" "stopped at its time limit" ;;
    *) record torch FAIL "$stage_s" "status $stage_rc, see torch.log" ;;
    esac
else
    record torch "NOT RUN" 0 "no python3 with a CUDA-enabled torch, numpy and pytest"
fi

# ----------------------------------------------------------------- mock
if [[ ${MOCK:-0} == 1 ]]; then
    run_stage mock 90 "$logs/mock.log" meson test -C "$build" --suite cuda --print-errorlogs
    case $stage_rc in
    0) record mock PASS "$stage_s" "meson test --suite cuda" ;;
    124) record mock TIMEOUT "$stage_s" "stopped at its time limit" ;;
    *) record mock FAIL "$stage_s" "status $stage_rc, see mock.log" ;;
    esac
fi
finish

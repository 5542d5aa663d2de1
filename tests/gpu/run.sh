#!/usr/bin/env bash
# tests/gpu/run.sh -- everything that needs a real GPU, in under five minutes:
#
#   1. build libckpt, the GPU tests, the CUDA example and bench_gpu into
#      BUILD_DIR (meson + ninja; nvcc for the example when it is on PATH);
#   2. the mock-runtime suite (meson test --suite cuda), as a sanity check;
#   3. tests/gpu/test_gpu: fences, wait_snapshot, restore, AUTO, pinned cap,
#      in every snapshot mode, on the device;
#   4. examples/cuda/demo.sh: SIGKILL a CUDA training loop, resume, compare
#      bitwise with an uninterrupted run;
#   5. benchmarks/gpu/bench_gpu: pinned D2H/H2D and D2D bandwidth, then
#      libckpt's stall, save and restore throughput on 1, 4 and 16 GiB of
#      device buffers, as ratios to those bandwidths.
#
# Without a GPU it says "SKIP: no CUDA device" and exits 77.
# Environment: BUILD_DIR (default build-gpu), SIZES (bench sizes in GiB,
# default 1,4,16), MODES (default host,device,stream), OUT (a directory for
# bench_gpu.json and the logs; default BUILD_DIR/gpu-run), JOBS.
# Exit status: 0 all passed (benchmark targets are reported, not enforced),
# 1 a test failed, 77 no GPU.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
case $build in /*) ;; *) build=$root/$build ;; esac
out=${OUT:-$build/gpu-run}
jobs=${JOBS:-$(nproc)}
t_start=$SECONDS
mkdir -p "$out"

step() { printf '\n== [%3ds] %s\n' $((SECONDS - t_start)) "$*"; }
failed=()

# ------------------------------------------------------------------ build
step "build in $build"
if command -v meson >/dev/null && command -v ninja >/dev/null; then
    if [[ ! -f $build/build.ninja ]]; then
        meson setup "$build" "$root" --buildtype=release >"$out/configure.log" 2>&1 ||
            { tail -n 30 "$out/configure.log"; echo "FAIL: meson setup"; exit 1; }
    fi
    timeout 180 ninja -C "$build" -j "$jobs" >"$out/build.log" 2>&1 ||
        { tail -n 40 "$out/build.log"; echo "FAIL: build"; exit 1; }
    grep -E "^Message: tests/gpu" "$out/configure.log" 2>/dev/null || true
else
    echo "meson/ninja not found: using what $build already holds"
fi

# Without meson's tests (no Criterion there) or a CUDA dependency, compile
# the GPU test and benchmark directly against the library that was built.
cuda_home=${CUDA_HOME:-/usr/local/cuda}
direct() { # name source
    local exe=$build/direct/$1
    mkdir -p "$build/direct"
    cc -O2 -std=c11 -D_GNU_SOURCE -I"$root/include" -I"$cuda_home/include" "$2" \
        -L"$build/lib" -lckpt -L"$cuda_home/lib64" -lcudart \
        -Wl,-rpath,"$build/lib:$cuda_home/lib64" -o "$exe" >&2 && echo "$exe"
}
test_gpu=$build/tests/gpu/test_gpu
[[ -x $test_gpu ]] || test_gpu=$(direct test_gpu "$root/tests/gpu/test_gpu.c") || test_gpu=
bench_gpu=$build/benchmarks/gpu/bench_gpu
[[ -x $bench_gpu ]] || bench_gpu=$(direct bench_gpu "$root/benchmarks/gpu/bench_gpu.c") ||
    bench_gpu=
[[ -n $test_gpu ]] || { echo "FAIL: test_gpu could not be built"; exit 1; }

# --------------------------------------------------------------- is there a GPU
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | head -n 4

# ------------------------------------------------------------- mock suite
if [[ -f $build/build.ninja ]] && command -v meson >/dev/null; then
    step "mock CUDA runtime suite (meson test --suite cuda)"
    if timeout 240 meson test -C "$build" --suite cuda --num-processes "$jobs" \
        --print-errorlogs >"$out/mock.log" 2>&1; then
        grep -E "^ *[0-9]+/[0-9]+ " "$out/mock.log"
    else
        tail -n 40 "$out/mock.log"
        failed+=("mock suite")
    fi
fi

# -------------------------------------------------------------- GPU tests
step "tests/gpu/test_gpu"
timeout 180 "$test_gpu" 2>&1 | tee "$out/test_gpu.log"
rc=${PIPESTATUS[0]}
if ((rc == 77)); then
    echo "SKIP: no CUDA device: nothing else to run here"
    exit 77
fi
((rc == 0)) || failed+=("test_gpu (status $rc)")

# ------------------------------------------------------------- CUDA demo
step "examples/cuda/demo.sh (SIGKILL, resume, bitwise compare)"
if [[ -x $build/examples/cuda/train_cuda ]]; then
    BUILD_DIR=$build STEPS=${DEMO_STEPS:-400} EVERY=${DEMO_EVERY:-40} SLEEP_MS=5 \
        KILL_AFTER=${DEMO_KILL_AFTER:-120} DEMO_DIR=$out/demo \
        timeout 180 bash "$root/examples/cuda/demo.sh" >"$out/demo.log" 2>&1
    rc=$?
    grep -E "^(PASS|FAIL|SKIP)|^== |demo took" "$out/demo.log"
    ((rc == 0)) || { tail -n 30 "$out/demo.log"; failed+=("CUDA demo (status $rc)"); }
else
    echo "train_cuda was not built (no nvcc when $build was configured): demo skipped"
fi

# -------------------------------------------------------------- benchmark
step "benchmarks/gpu/bench_gpu"
if [[ -n $bench_gpu ]]; then
    left=$((290 - (SECONDS - t_start)))
    ((left > 30)) || left=30
    timeout "$left" "$bench_gpu" --sizes "${SIZES:-1,4,16}" --modes "${MODES:-host,device,stream}" \
        --json "$out/bench_gpu.json" --enforce 2>&1 | tee "$out/bench_gpu.log"
    rc=${PIPESTATUS[0]}
    case $rc in
    0) echo "benchmark: all targets met" ;;
    3) echo "benchmark: some targets missed (see the summary above)" ;;
    124) echo "benchmark: stopped at the time limit (${left}s)" ;;
    *) failed+=("bench_gpu (status $rc)") ;;
    esac
fi

step "done in $((SECONDS - t_start)) s; logs in $out"
if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "PASS"

#!/usr/bin/env bash
# Crash-and-resume demo on a GPU: examples/demo.sh driving train_cuda, the
# CUDA training loop that checkpoints its device buffers with the fence API.
#
#   1. a reference run without checkpoints;
#   2. a run checkpointing every EVERY steps, SIGKILLed after a commit, then
#      restarted: it restores the newest checkpoint into device memory and
#      must end with weights bitwise identical to the reference;
#   3. the newest checkpoint damaged on disk: the restart falls back to the
#      previous one, again bitwise identical.
#
# Without a usable GPU it prints "SKIP: no CUDA device (...)" and exits 77.
# Usage: examples/cuda/demo.sh [--no-corrupt] [--keep-dir]
# Environment: BUILD_DIR (default: build), TRAIN_CUDA (default
# BUILD_DIR/examples/cuda/train_cuda), MODE (host|device|stream, default
# host) and what examples/demo.sh reads (STEPS, EVERY, SLEEP_MS, ...).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
case $build_dir in /*) ;; *) build_dir=$root/$build_dir ;; esac
train=${TRAIN_CUDA:-$build_dir/examples/cuda/train_cuda}

if [[ ! -x $train ]]; then
    if ! command -v nvcc >/dev/null 2>&1; then
        echo "SKIP: no CUDA device (and no nvcc: train_cuda was not built)"
        exit 77
    fi
    echo "demo.sh: $train not found; build first (meson with nvcc on PATH)" >&2
    exit 2
fi

# train_cuda exits 77 with "SKIP: no CUDA device (...)" before doing anything.
set +e
probe=$("$train" --steps 0 2>&1)
rc=$?
set -e
if ((rc == 77)); then
    echo "$probe"
    exit 77
fi
((rc == 0)) || { echo "$probe"; echo "FAIL: train_cuda --steps 0 exited with $rc"; exit 1; }

# A wrapper so that the host demo passes our snapshot mode along.
wrap=$(mktemp "${TMPDIR:-/tmp}/train_cuda.XXXXXX")
trap 'rm -f "$wrap"' EXIT
printf '#!/usr/bin/env bash\nexec %q --mode %q "$@"\n' "$train" "${MODE:-host}" >"$wrap"
chmod +x "$wrap"
echo "== train_cuda, snapshot mode ${MODE:-host}"
TRAIN_MLP=$wrap bash "$root/examples/demo.sh" "$@"

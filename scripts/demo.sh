#!/usr/bin/env bash
# Set up (packages, configure, compile) and run the crash-and-resume demo.
# Usage: scripts/demo.sh [examples/demo.sh options]; BUILD_DIR defaults to build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export BUILD_DIR=${BUILD_DIR:-build}
# The demo needs only what builds the library and its examples: not the
# test suites' valgrind, HDF5, Python, MPI, Slurm or Prometheus (a user
# without root may lack them, and installing them costs minutes).
export CKPT_PACKAGES=${CKPT_PACKAGES:-"meson ninja-build pkg-config gcc libzstd-dev libxxhash-dev libjansson-dev"}
bash "$root/scripts/setup.sh" "$BUILD_DIR"
exec bash "$root/examples/demo.sh" "$@"

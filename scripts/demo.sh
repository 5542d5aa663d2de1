#!/usr/bin/env bash
# Set up (packages, configure, compile) and run the crash-and-resume demo.
# Usage: scripts/demo.sh [examples/demo.sh options]; BUILD_DIR defaults to build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export BUILD_DIR=${BUILD_DIR:-build}
bash "$root/scripts/setup.sh" "$BUILD_DIR"
exec bash "$root/examples/demo.sh" "$@"

#!/usr/bin/env bash
# Install what libckpt needs to build and test (Debian/Ubuntu packages, only
# those missing), then configure and compile a build directory.
#
# Usage: scripts/setup.sh [BUILD_DIR [MESON_SETUP_OPTION...]]
#   BUILD_DIR defaults to $BUILD_DIR, else "build" (relative to the repo).
#   Extra options go to `meson setup` (e.g. -Db_sanitize=address,undefined).
# Environment: CKPT_SKIP_PACKAGES=1 skips the package step; CKPT_PACKAGES
# (names separated by blanks) replaces the package list, for a run that
# needs less (tests/gpu/run.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

build=${1:-${BUILD_DIR:-build}}
(($# > 0)) && shift
options=("$@")

packages=(
    meson ninja-build pkg-config gcc g++ util-linux e2fsprogs
    libzstd-dev libxxhash-dev libjansson-dev libcriterion-dev
    libhdf5-dev hdf5-tools
    python3 python3-numpy python3-pytest python3-torch python3-h5py python3-jsonschema
    python3-mesonpy python3-venv
    python3-matplotlib zstd xxhash
    valgrind
    libopenmpi-dev openmpi-bin
    slurmctld slurmd slurm-client munge prometheus
)
if [[ -n ${CKPT_PACKAGES:-} ]]; then
    read -r -d '' -a packages <<<"$CKPT_PACKAGES" || true
fi

log() { printf 'setup: %s\n' "$*"; }

install_packages() {
    if [[ ${CKPT_SKIP_PACKAGES:-0} == 1 ]]; then
        log "CKPT_SKIP_PACKAGES=1: not checking packages"
        return
    fi
    if ! command -v dpkg-query >/dev/null 2>&1; then
        log "no dpkg-query (not Debian-based): install these yourself if missing: ${packages[*]}"
        return
    fi
    local missing=() p
    for p in "${packages[@]}"; do
        if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
            missing+=("$p")
        fi
    done
    if ((${#missing[@]} == 0)); then
        log "all ${#packages[@]} packages present"
        return
    fi
    log "installing: ${missing[*]}"
    local sudo=()
    if ((EUID != 0)); then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            log "not root and no sudo: these packages are missing: ${missing[*]}" >&2
            log "ask an administrator to install them, or run again with" \
                "CKPT_SKIP_PACKAGES=1 to build with what is there (meson then names" \
                "what the build needs; tests whose tools are absent skip)" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
}

configure_and_build() {
    if [[ -f $build/meson-private/coredata.dat ]]; then
        log "reconfiguring $build ${options[*]}"
        if ! meson setup --reconfigure "$build" "${options[@]}"; then
            log "reconfigure failed: wiping $build and configuring again"
            meson setup --wipe "$build" "${options[@]}"
        fi
    else
        log "configuring $build ${options[*]}"
        meson setup "$build" "${options[@]}"
    fi
    log "compiling $build"
    meson compile -C "$build"
}

install_packages
configure_and_build
log "done: $build"

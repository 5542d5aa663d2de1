#!/usr/bin/env bash
# tests/gpu/kit.sh -- what tests/gpu/run.sh needs, built here, for a GPU
# machine that has the driver and the CUDA toolkit but not libckpt's -dev
# packages and no package archive to fetch them from (a lent machine).
#
#   1. scripts/setup.sh BUILD_DIR --buildtype=release (nvcc must be on PATH
#      or in /usr/local/cuda/bin: without it there is no test_gpu);
#   2. copies into KIT only what run.sh runs, at the same relative paths so
#      that the programs' run paths ($ORIGIN/...) still find libckpt:
#      lib/libckpt.so*, tests/gpu/test_gpu, benchmarks/gpu/bench_gpu,
#      examples/cuda/train_cuda, and an empty build.ninja (run.sh's check that KIT is a build);
#   3. copies into KIT/kit-libs the shared libraries those link that are
#      not the C runtime, the C++ runtime or CUDA's own (zstd, xxHash,
#      jansson): run.sh puts that folder first on LD_LIBRARY_PATH.
#
# Then, on the GPU machine, from the repository root:
#   PREBUILT=1 BUILD_DIR=KIT bash tests/gpu/run.sh
# The machine's glibc must be as new as this one's (a newer one is fine).
#
# Usage: tests/gpu/kit.sh [KIT]   (KIT default: build-gpu-kit)
# Environment: BUILD_DIR (default build-gpu), CKPT_SKIP_PACKAGES (passed on).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
kit=${1:-build-gpu-kit}

if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
bash scripts/setup.sh "$build" --buildtype=release

# Not the ckpt command: the demo shows it only where it exists, and its HDF5
# would bring some thirty more libraries (TLS, Kerberos, LDAP).
programs=(tests/gpu/test_gpu benchmarks/gpu/bench_gpu examples/cuda/train_cuda)
for p in "${programs[@]}"; do
    [[ -x $build/$p ]] || { echo "kit.sh: $build/$p was not built (nvcc, CUDA toolkit?)" >&2; exit 1; }
done

rm -rf "$kit"
mkdir -p "$kit/lib" "$kit/kit-libs"
find "$build/lib" -maxdepth 1 -name 'libckpt.so*' ! -type d -exec cp -a {} "$kit/lib/" \;
for p in "${programs[@]}"; do
    mkdir -p "$kit/$(dirname "$p")"
    cp -a "$build/$p" "$kit/$p"
done
: >"$kit/build.ninja"

# The libraries to carry: whatever ldd resolves outside the kit, less the
# ones every CUDA machine has (glibc's, libstdc++, libgcc_s) or must supply
# itself (libcudart: the driver's match).
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libcudart)\.'
for f in "$kit/lib/libckpt.so" "${programs[@]/#/$kit/}"; do
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    [[ $path == "$root"/* ]] && continue
    cp -L "$path" "$kit/kit-libs/$name"
done
echo "kit.sh: $kit ($(du -sh "$kit" | cut -f1)): $(ls "$kit/kit-libs" | tr '\n' ' ')"

#!/bin/sh
# Build the libFuzzer harnesses of tests/fuzz/ with clang, straight from the
# library sources (no meson needed).  Usage, from anywhere:
#   tests/fuzz/build.sh [OUTDIR]        (default: build-fuzz/ in the repo root)
# Environment: CC (default clang), EXTRA_CFLAGS.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build-fuzz}
CC=${CC:-clang}
mkdir -p "$out"
inc=""
for d in "$root"/lib "$root"/lib/*/; do inc="$inc -I$d"; done
cflags="-std=c11 -D_GNU_SOURCE -DCKPT_BUILDING -g -O1 -fno-omit-frame-pointer \
 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
 -I$root/include $inc ${EXTRA_CFLAGS:-}"
libs="-lzstd -lxxhash -ljansson -lpthread -ldl -lm"
# Library objects once, instrumented for coverage and the sanitizers
# (-fsanitize=fuzzer-no-link: the harness supplies main()).  Every layer
# but lib/dist/mpi.c (its own library, needs MPI); XXH3 in its default
# build only (format/xxh3_isa.c is the per-vector-unit one).
objdir="$out/obj"
mkdir -p "$objdir"
objs=""
for src in "$root"/lib/*.c "$root"/lib/*/*.c; do
    case $src in */dist/mpi.c | */format/xxh3_isa.c) continue ;; esac
    o="$objdir/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
    # shellcheck disable=SC2086
    $CC $(echo "$cflags" | sed 's/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,/') \
        -c "$src" -o "$o"
    objs="$objs $o"
done
for h in fuzz_manifest fuzz_checkpoint fuzz_jsonscan; do
    # shellcheck disable=SC2086
    $CC $cflags "$here/$h.c" $objs $libs -o "$out/$h"
    echo "built $out/$h"
done

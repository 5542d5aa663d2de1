#!/bin/sh
# static_archive.sh IN.a OUT.a TMPDIR: link every object of IN.a into one
# relocatable object, make every hidden symbol local, and archive that
# object as OUT.a.  IN.a is a thin archive with meson 1.0 and a regular one
# with newer meson (whose members can share a name, e.g. one source built
# for two instruction sets): the linker reads either kind whole.
set -eu
in=$1 out=$2 tmp=$3
mkdir -p "$tmp"
rm -f "$tmp/libckpt.o" "$out"
ld -r -o "$tmp/libckpt.o" --whole-archive "$in" --no-whole-archive
objcopy --localize-hidden "$tmp/libckpt.o"
ar rcs "$out" "$tmp/libckpt.o"

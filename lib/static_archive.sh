#!/bin/sh
# static_archive.sh IN.a OUT.a TMPDIR: link the objects of IN.a (a thin
# archive: `ar t` names the object files) into one relocatable object, make
# every hidden symbol local, and archive that object as OUT.a.
set -eu
in=$1 out=$2 tmp=$3
mkdir -p "$tmp"
rm -f "$tmp/libckpt.o" "$out"
# shellcheck disable=SC2046 # object paths have no spaces (meson's own)
ld -r -o "$tmp/libckpt.o" $(ar t "$in")
objcopy --localize-hidden "$tmp/libckpt.o"
ar rcs "$out" "$tmp/libckpt.o"

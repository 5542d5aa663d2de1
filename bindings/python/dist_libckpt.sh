#!/bin/sh
# meson dist (meson-python's sdist): the C library's sources in place of the
# subprojects/libckpt link, so that the sdist builds alone (the link would
# point outside it).  Only what the wheel's build reads: the top-level
# meson.build and meson_options.txt, include/, lib/ and the `ckpt` command
# (tools/meson.build, tools/ckpt), as committed.
set -eu
src=$MESON_SOURCE_ROOT/subprojects/libckpt
dst=$MESON_DIST_ROOT/subprojects/libckpt
rm -f "$dst"
mkdir -p "$dst"
git -C "$src" archive --format=tar HEAD -- meson.build meson_options.txt include lib tools/meson.build tools/ckpt |
    tar -x -C "$dst"

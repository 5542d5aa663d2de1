#!/usr/bin/env bash
# test_install.sh again with the newest meson from the package index, as a
# user without the distribution's meson gets it (`pip install meson`):
# newer meson versions refuse or change what an older one accepted (files
# named across a subproject's sandbox, thin archives made regular), and the
# README's build must work with both.
#
# Usage: newest_meson.sh SOURCE_ROOT
# Environment: PYTHON (default /usr/bin/python3, with venv); the PIP_* and
# proxy variables reach pip.  Exit 77 (skip) when the index is unreachable
# or venv is missing.
set -euo pipefail

src=$(cd "${1:?usage: newest_meson.sh SOURCE_ROOT}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-/usr/bin/python3}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-meson.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT

# shellcheck source=SCRIPTDIR/index_venv.sh
. "$here/index_venv.sh"
index_venv "$python" "$tmp" meson
echo "meson $("$tmp/venv/bin/meson" --version) from the package index"
MESON=$tmp/venv/bin/meson bash "$here/test_install.sh" "$src"

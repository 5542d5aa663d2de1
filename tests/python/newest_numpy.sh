#!/usr/bin/env bash
# The binding's tests with the newest NumPy (2.x), ml_dtypes and h5py from
# the package index, in a fresh virtual environment without the system's
# packages, on the newest CPython the machine has: what a user who runs
# `pip install numpy` gets, against Debian's Python and NumPy 1.x in the
# `python` test.  torch is not installed here (gigabytes): its tests skip.
#
# Usage: newest_numpy.sh TESTS_DIR
# Environment: PYTHON (default /usr/bin/python3, with venv), LIBCKPT_LIBRARY
# and PYTHONPATH as for the `python` test; the PIP_* and proxy variables
# reach pip.  A newer CPython 3 than PYTHON, on PATH (python3.N) or among
# pyenv's versions, is used instead.  Exit 77 (skip) when the index is
# unreachable or venv missing.
set -euo pipefail

tests=$(cd "${1:?usage: newest_numpy.sh TESTS_DIR}" && pwd)
python=${PYTHON:-/usr/bin/python3}

# shellcheck source=SCRIPTDIR/../install/index_venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/../install/index_venv.sh"
# The newest interpreter that runs and has venv: Python 3.13's JSON
# encoder, for one, behaves unlike 3.11's.
python=$(newest_python "$python")
echo "python: $("$python" -c 'import sys; print(sys.version.split()[0])') ($python)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-numpy.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT

index_venv "$python" "$tmp" numpy pytest ml_dtypes h5py
"$tmp/venv/bin/python" -c 'import numpy, ml_dtypes, h5py
print("numpy", numpy.__version__, "ml_dtypes", ml_dtypes.__version__, "h5py", h5py.__version__)'
cd "$tmp"
# Not exec: the EXIT trap must outlive pytest to remove the environment
# (113 MB per run was left behind in TMPDIR when this line exec'd).
"$tmp/venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$tests"

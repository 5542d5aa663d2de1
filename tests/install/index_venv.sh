# shellcheck shell=bash
# index_venv.sh, sourced: index_venv PYTHON DIR PACKAGE...  makes a
# virtual environment DIR/venv of PYTHON (without the system's packages)
# holding the newest PACKAGEs from the package index, or exits 77 (skip)
# when venv is missing or the index cannot be reached.  The PIP_* and proxy
# variables reach pip.
index_venv() {
    local python=$1 dir=$2
    shift 2
    "$python" -m venv "$dir/venv" >/dev/null 2>&1 || {
        echo "SKIP: $python -m venv failed (Debian: python3-venv)"
        exit 77
    }
    if ! timeout 300 "$dir/venv/bin/python" -m pip install -q "$@" >"$dir/pip.log" 2>&1; then
        tail -n 5 "$dir/pip.log"
        echo "SKIP: $* could not be installed from the package index"
        exit 77
    fi
}

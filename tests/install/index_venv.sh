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

# newest_python PYTHON: prints the newest CPython 3 that runs and has venv
# (python3.N on PATH, or one of pyenv's versions), PYTHON itself when none
# is newer.
newest_python() {
    local python=$1 best cand m n
    local -a candidates=()
    best=$(_python_minor "$python" || echo 0)
    for n in $(seq 20 -1 8); do
        command -v "python3.$n" >/dev/null 2>&1 && candidates+=("$(command -v "python3.$n")")
    done
    if command -v pyenv >/dev/null 2>&1; then
        for cand in "$(pyenv root)"/versions/3.*/bin/python3; do
            [[ -x $cand ]] && candidates+=("$cand")
        done
    fi
    for cand in "${candidates[@]}"; do
        m=$(_python_minor "$cand") || continue
        if ((m > best)); then
            best=$m
            python=$cand
        fi
    done
    echo "$python"
}

_python_minor() { "$1" -c 'import sys, venv, ensurepip; print(sys.version_info[1])' 2>/dev/null; }

#!/usr/bin/env bash
# `pip install ./bindings/python` as a Python user does it (docs/PYTHON.md,
# "pip install"), offline, with the distribution's meson-python:
#
#   python3 -m venv --system-site-packages VENV
#   VENV/bin/python -m pip install --no-build-isolation --no-index ./bindings/python
#
# from a copy of the checkout's tracked files (what a fresh clone holds, the
# subprojects/libckpt link included), with no libckpt installed by meson
# anywhere the binding could look.  Then, from another directory and with
# only PATH and HOME in the environment (no LD_LIBRARY_PATH, LIBCKPT_LIBRARY,
# PYTHONPATH or PKG_CONFIG_PATH), it checks that:
#   - `import libckpt` loads the copy of the C library that the wheel
#     bundles inside the package (libckpt/libckpt.so), and no other;
#   - that copy exports only ckpt_* (the version script);
#   - the installed package holds every module of the source package, and
#     not meson's _install.py;
#   - a nested state saves and loads back (NumPy, ints of any size, None,
#     int keys) and verifies;
#   - the package's `ckpt` command (the library linked in, no HDF5) is in
#     the venv's bin directory and reads that state (`ckpt latest`,
#     `ckpt verify`);
#   - the wheel is tagged py3-none-<platform> (ctypes, no extension
#     module: one wheel serves every CPython 3 on the platform);
#   - `pip uninstall` removes the package, the library and the command;
#   - the sdist meson-python makes (PEP 517 build_sdist) carries the C
#     library's sources, and `pip wheel` of that file alone gives a wheel
#     that installs into a venv of another CPython (with ISOLATED=1, the
#     newest the machine has; NumPy then comes from the index) as the same
#     working package (needs git, which meson dist uses).
#
# With ISOLATED=1 the install is plain `pip install ./bindings/python`, as
# most users type it: pip builds in an isolated environment with the newest
# meson-python, meson and ninja from the package index (a newer meson than
# the distribution's, which refuses what an older one let pass), and the
# sdist is installed the same way.  Skipped when the index is unreachable.
#
# Usage: test_pip.sh SOURCE_ROOT
# Environment: PYTHON (default /usr/bin/python3; it needs meson-python and
# venv), MESON (the meson meson-python runs; its directory goes first on
# PATH), ISOLATED=1 (above), KEEP=1 keeps the temporary directory.
# Exit 77 (skip) when meson-python, venv, NumPy, ninja or a C compiler is
# missing.
set -euo pipefail

src=$(cd "${1:?usage: test_pip.sh SOURCE_ROOT}" && pwd)
python=${PYTHON:-/usr/bin/python3}
meson=${MESON:-$(command -v meson || true)}

skip() {
    echo "SKIP: $*"
    exit 77
}
[[ -n $meson && -x $meson ]] || skip "needs meson"
for tool in cc ninja pkg-config; do
    command -v "$tool" >/dev/null 2>&1 || skip "needs $tool"
done
"$python" -c 'import mesonpy' >/dev/null 2>&1 ||
    skip "needs meson-python for $python (Debian: python3-mesonpy)"
"$python" -c 'import venv, ensurepip' >/dev/null 2>&1 ||
    skip "needs venv with ensurepip for $python (Debian: python3-venv)"
"$python" -c 'import numpy' >/dev/null 2>&1 || skip "needs $python with numpy"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-pip.XXXXXX")
cleanup() {
    if [[ ${KEEP:-0} == 1 ]]; then
        echo "kept $tmp"
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT # meson test's timeout: clean up all the same

failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
step() { printf '\n---- %s\n' "$*"; }
t0=$SECONDS

# ------------------------------------------------------- a fresh checkout
# The tracked files as they are in the working tree (uncommitted edits
# included); a tree that is not a git checkout is copied whole.
step "copy of the checkout"
mkdir -p "$tmp/src" "$tmp/home" "$tmp/elsewhere"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # shellcheck disable=SC2016 # expanded by the inner sh
    (cd "$src" && git ls-files -z --cached | xargs -0 sh -c 'for f; do
        [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh |
        tar --null -T - -cf -) | tar -x -C "$tmp/src"
else
    cp -a "$src/." "$tmp/src/"
    find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
    # A .git left in the copy (a worktree's .git file, or a repository git
    # refused to use) would make the git commands below act on that
    # repository, not the copy.
    rm -rf "$tmp/src/.git"
fi
link=$tmp/src/bindings/python/subprojects/libckpt
[[ -L $link && -f $link/meson.build ]] ||
    fail "bindings/python/subprojects/libckpt is not a link to the repository root"

# The environment of the user's shell, minus anything that could point at
# another libckpt; meson and ninja on PATH for meson-python.
path="$(dirname "$meson"):/usr/local/bin:/usr/bin:/bin"
clean=(env -i "PATH=$path" "HOME=$tmp/home")

# What pip is given besides the package: offline with the distribution's
# meson-python, or (ISOLATED=1) nothing, as a user types it.  The user's
# configuration of pip (index, certificates, proxy: the PIP_* and proxy
# variables and ~/.config/pip) is all that is taken from this environment
# then.
if [[ ${ISOLATED:-0} == 1 ]]; then
    pip_opts=()
    while IFS= read -r var; do
        clean+=("$var")
    done < <(env | grep -E '^(PIP_|https?_proxy=|no_proxy=|HTTPS?_PROXY=|NO_PROXY=|SSL_CERT_)' || true)
    if [[ -f ${HOME:-/nonexistent}/.config/pip/pip.conf ]]; then
        mkdir -p "$tmp/home/.config/pip"
        cp "$HOME/.config/pip/pip.conf" "$tmp/home/.config/pip/"
    fi
    step "the package index (pip download meson-python)"
    timeout 120 "${clean[@]}" "$python" -m pip download -q --no-deps -d "$tmp/probe" \
        meson-python meson >/dev/null 2>&1 || skip "the package index is unreachable"
    ls "$tmp/probe"
else
    pip_opts=(--no-build-isolation --no-index --no-deps)
fi

step "venv and pip install ${pip_opts[*]} ./bindings/python"
"${clean[@]}" "$python" -m venv --system-site-packages "$tmp/venv" ||
    skip "$python -m venv failed (Debian: python3-venv)"
vpy=$tmp/venv/bin/python
if ! (cd "$tmp/src" && "${clean[@]}" "$vpy" -m pip install "${pip_opts[@]}" \
    ./bindings/python) >"$tmp/pip.log" 2>&1; then
    tail -n 60 "$tmp/pip.log"
    echo "FAIL: pip install ./bindings/python"
    exit 1
fi
grep -E 'Successfully|wheel for libckpt' "$tmp/pip.log" || true
echo "built and installed in $((SECONDS - t0))s"
# A ctypes binding without extension modules: any CPython 3 can use the
# wheel (cp311-cp311 would tie it to the Python that built it).
tag=$(sed -n 's/^Tag: //p' "$tmp"/venv/lib/python3*/site-packages/libckpt-*.dist-info/WHEEL)
echo "wheel tag: $tag"
[[ $tag == py3-none-linux_* ]] || fail "the wheel is tagged '$tag', not py3-none-linux_*"

# The sdist, from the copy made a git repository (meson dist archives HEAD).
sdist=
if command -v git >/dev/null 2>&1; then
    step "sdist (meson-python build_sdist)"
    git=(git -C "$tmp/src" -c user.name=test -c user.email=test@invalid)
    "${git[@]}" init -q && "${git[@]}" add -A && "${git[@]}" commit -qm copy
    mkdir -p "$tmp/dist"
    if (cd "$tmp/src/bindings/python" && "${clean[@]}" "$vpy" -c \
        'import sys, mesonpy; print(mesonpy.build_sdist(sys.argv[1]))' "$tmp/dist") \
        >"$tmp/sdist.log" 2>&1; then
        sdist=$(find "$tmp/dist" -name 'libckpt-*.tar.gz')
        echo "$sdist"
        tar -tzf "$sdist" >"$tmp/sdist.list"
        for f in subprojects/libckpt/meson.build subprojects/libckpt/include/ckpt.h \
            subprojects/libckpt/lib/libckpt.map subprojects/libckpt/lib/store.c \
            subprojects/libckpt/tools/meson.build subprojects/libckpt/tools/ckpt/main.c \
            libckpt/__init__.py; do
            grep -q "^libckpt-[0-9.]*/$f\$" "$tmp/sdist.list" || fail "sdist lacks $f"
        done
    else
        tail -n 40 "$tmp/sdist.log"
        fail "meson-python build_sdist"
    fi
else
    echo "no git: sdist not checked (meson dist needs it)"
fi
# Nothing may depend on the source copy from here on.
rm -rf "$tmp/src"

# ---------------------------------------------------- import and use it
step "import libckpt from another directory (env: PATH, HOME)"
cat >"$tmp/use.py" <<'EOF'
import ctypes, os, site, subprocess, sys
import numpy as np
import libckpt

src_modules, tmp = sys.argv[1], sys.argv[2]
pkg = os.path.dirname(libckpt.__file__)
print("libckpt", libckpt.__version__, "from", pkg, "library", libckpt.library_path)
sp = [os.path.realpath(p) for p in site.getsitepackages()]
assert os.path.realpath(os.path.dirname(pkg)) in sp, (pkg, sp)
assert sys.prefix != sys.base_prefix, "not the virtual environment's interpreter"
assert os.path.realpath(pkg).startswith(os.path.realpath(sys.prefix) + os.sep), pkg
# The bundled copy, by its path: the only libckpt this process mapped.
assert libckpt.library_path == os.path.join(pkg, "libckpt.so"), libckpt.library_path
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libckpt" in l.split()[-1]]
assert set(maps) == {os.path.join(pkg, "libckpt.so")}, set(maps)

# Every module of the source package, py.typed, the library; nothing else.
have = sorted(f for f in os.listdir(pkg) if f != "__pycache__")
want = sorted(src_modules.split() + ["libckpt.so"])
assert have == want, "installed %s, source has %s" % (have, want)

# Only the public API is exported.
out = subprocess.run(["nm", "-D", "--defined-only", libckpt.library_path],
                     capture_output=True, text=True)
if out.returncode == 0:
    syms = [l.split()[-1] for l in out.stdout.splitlines() if l.split()]
    other = [s for s in syms if not s.startswith("ckpt_") and s != "LIBCKPT_0"]
    assert not other and len(syms) > 20, other[:10]

w = np.arange(12, dtype=np.float32).reshape(3, 4)
state = {"model": {"w": w, "b": np.ones(4, np.float64)}, "epoch": 3,
         "big": 2**80 + 1, "note": None, "opt": {"state": {0: {"step": 5}}}}
root = os.path.join(tmp, "store")
with libckpt.Store(root) as s:
    s.save(7, state).wait()
    step, back = s.load()
    report = s.verify()
assert step == 7, step
assert np.array_equal(back["model"]["w"], w) and back["model"]["w"].dtype == np.float32
assert np.array_equal(back["model"]["b"], state["model"]["b"])
assert back["epoch"] == 3 and back["big"] == 2**80 + 1 and back["note"] is None, back
assert back["opt"]["state"][0]["step"] == 5, back["opt"]
assert report["ok"] and report["step"] == 7, report
print("pip-installed round trip ok")
EOF
modules=$(cd "$src/bindings/python/libckpt" && printf '%s ' *.py py.typed)
echo "source modules: $modules"
(cd "$tmp/elsewhere" && "${clean[@]}" "$vpy" "$tmp/use.py" "$modules" "$tmp") ||
    fail "import libckpt after pip install"

# The `ckpt` command comes with the package, in the environment's bin
# directory (on PATH once it is activated), for job scripts.
check_cli() { # venv, store: `ckpt latest` names step 7, verify passes
    local bin=$1/bin out
    [[ -x $bin/ckpt ]] || {
        fail "no ckpt command in $bin"
        return
    }
    out=$(cd "$tmp/elsewhere" && env -i "PATH=$bin:$path" "HOME=$tmp/home" ckpt --version 2>&1) ||
        fail "ckpt --version: $out"
    echo "$out"
    out=$(cd "$tmp/elsewhere" && env -i "PATH=$bin:$path" "HOME=$tmp/home" \
        ckpt latest "$2" --full --step 2>&1) || fail "ckpt latest: $out"
    [[ $out == 7 ]] || fail "ckpt latest --step printed '$out', not 7"
    (cd "$tmp/elsewhere" && env -i "PATH=$bin:$path" "HOME=$tmp/home" ckpt verify "$2") ||
        fail "ckpt verify $2"
    out=$(env -i "PATH=$bin:$path" ckpt export "$2" "$tmp/x.h5" 2>&1) &&
        fail "ckpt export of the package's ckpt succeeded, without HDF5"
    grep -q "Python package has no HDF5" <<<"$out" || fail "ckpt export said: $out"
    # the library is linked in: no libckpt is looked up
    if ldd "$bin/ckpt" 2>/dev/null | grep -q libckpt; then
        fail "the package's ckpt loads a libckpt: $(ldd "$bin/ckpt" | grep libckpt)"
    fi
}
step "the ckpt command of the package"
check_cli "$tmp/venv" "$tmp/store"

# ------------------------------------------------------ from the sdist
# Its wheel, on another CPython where the index can supply NumPy for it.
if [[ -n $sdist ]]; then
    py2=$python
    venv2_opts=(--system-site-packages)
    if [[ ${ISOLATED:-0} == 1 ]]; then
        # shellcheck source=SCRIPTDIR/index_venv.sh
        . "$(dirname "${BASH_SOURCE[0]}")/index_venv.sh"
        py2=$(newest_python "$python")
        [[ $py2 != "$python" ]] && venv2_opts=()
    fi
    step "pip wheel the sdist; install it into a venv of $py2"
    if ! (cd "$tmp/elsewhere" && "${clean[@]}" "$vpy" -m pip wheel "${pip_opts[@]}"         --no-deps -w "$tmp/wheels" "$sdist") >"$tmp/pip2.log" 2>&1; then
        tail -n 40 "$tmp/pip2.log"
        fail "pip wheel $sdist"
    fi
    whl=$(find "$tmp/wheels" -name 'libckpt-*.whl')
    echo "$whl"
    [[ $(basename "$whl") == libckpt-*-py3-none-linux_*.whl ]] ||
        fail "the sdist's wheel is $(basename "$whl"), not py3-none-linux_*"
    "${clean[@]}" "$py2" -m venv "${venv2_opts[@]}" "$tmp/venv2"
    extra=()
    [[ ${#venv2_opts[@]} == 0 ]] && extra=(numpy)
    if (cd "$tmp/elsewhere" && "${clean[@]}" "$tmp/venv2/bin/python" -m pip install \
        "${pip_opts[@]}" "$whl" "${extra[@]}") >>"$tmp/pip2.log" 2>&1; then
        rm -rf "$tmp/elsewhere/store"
        "$tmp/venv2/bin/python" --version
        (cd "$tmp/elsewhere" && "${clean[@]}" "$tmp/venv2/bin/python" "$tmp/use.py" \
            "$modules" "$tmp/elsewhere") || fail "import libckpt installed from the sdist's wheel"
        check_cli "$tmp/venv2" "$tmp/elsewhere/store"
    else
        tail -n 40 "$tmp/pip2.log"
        fail "pip install $whl into a venv of $py2"
    fi
fi

# ------------------------------------------------------------ uninstall
step "pip uninstall"
"${clean[@]}" "$vpy" -m pip uninstall -y libckpt >"$tmp/uninstall.log" 2>&1 ||
    fail "pip uninstall: $(cat "$tmp/uninstall.log")"
left=$(find "$tmp/venv" \( -name 'libckpt*' -o -name ckpt \) -print)
[[ -z $left ]] || fail "pip uninstall left: $left"

echo
if ((failures)); then
    echo "test_pip: $failures failure(s) in $((SECONDS - t0))s"
    exit 1
fi
echo "test_pip: ok in $((SECONDS - t0))s"

#!/usr/bin/env bash
# A non-root install, as a new user does it (README.md, "Build and install"):
#
#   meson setup build --prefix ~/.local && ninja -C build && meson install -C build
#
# with HOME set to a temporary directory, so ~/.local is a fresh per-user
# prefix.  This tree is configured a second time into a temporary build
# directory with that prefix (buildtype plain, no test suites; only what
# `meson install` installs is compiled), installed, and the build directory
# is deleted.  Then, each with only the environment the documentation gives
# (env -i: PATH, HOME, and PKG_CONFIG_PATH / HDF5_PLUGIN_PATH where it says
# so), it checks:
#   - the installed `ckpt` starts (RUNPATH: no LD_LIBRARY_PATH): --version,
#     list and verify of a store;
#   - examples/quickstart.c builds with pkg-config (whose --libs carry the
#     rpath for a user prefix), and runs;
#   - `import libckpt` in the configured interpreter finds the package in the
#     user site directory and the library meson installed: save/load round
#     trip, and the C program's checkpoint read back;
#   - the binding without meson's _install.py and without a bundled library
#     (a copy of the package on PYTHONPATH) names LIBCKPT_LIBRARY=<prefix>/<libdir>/
#     libckpt.so.0 when it cannot find the library, and finds it through
#     PKG_CONFIG_PATH or LIBCKPT_LIBRARY;
#   - the h5zstd plugin lands in <libdir>/hdf5/plugins under the prefix;
#     `ckpt export --codec zstd` names that directory (stderr and --json), and
#     h5dump and h5py read the file with HDF5_PLUGIN_PATH set to it;
#   - a configure for another prefix prints the PYTHONPATH to export and it is
#     where the package goes; -Dhdf5_plugin_dir=DIR moves the plugin there;
#   - a configure for the system prefix /usr/local puts the plugin into the
#     directory libhdf5 searches by default (H5PLget, asked by a small C
#     program), so HDF5 programs need no HDF5_PLUGIN_PATH.
#
# Usage: test_install.sh SOURCE_ROOT
# Environment: MESON (default meson), PYTHON (the interpreter the build's
# binding is for; default /usr/bin/python3), KEEP=1 keeps the directory.
# Exit 77 (skip) when cc, pkg-config, ninja or Python with NumPy is missing.
set -euo pipefail

src=$(cd "${1:?usage: test_install.sh SOURCE_ROOT}" && pwd)
meson=${MESON:-meson}
python=${PYTHON:-/usr/bin/python3}

skip() {
    echo "SKIP: $*"
    exit 77
}
for tool in cc pkg-config ninja "$meson"; do
    command -v "$tool" >/dev/null 2>&1 || skip "needs $tool"
done
"$python" -c 'import numpy' >/dev/null 2>&1 || skip "needs $python with numpy"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-install.XXXXXX")
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

home=$tmp/home
prefix=$home/.local
build=$tmp/build
mkdir -p "$home"

# The environment of the user's shell, minus anything that could point at
# another libckpt or another Python package directory.
clean=(env -u PYTHONPATH -u PYTHONHOME -u PYTHONUSERBASE -u PYTHONNOUSERSITE
    -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH -u LIBCKPT_LIBRARY -u HDF5_PLUGIN_PATH
    "HOME=$home")

# ------------------------------------------------------------ configure
step "meson setup --prefix $prefix"
"${clean[@]}" "$meson" setup "$build" "$src" --prefix "$prefix" \
    -Dbuildtype=plain -Dtests=disabled >"$tmp/setup.log" 2>&1 || {
    cat "$tmp/setup.log"
    exit 1
}
sed -n '/^libckpt/,$p' "$tmp/setup.log"

# libdir and the install locations, from meson itself.
"$meson" introspect "$build" --buildoptions --installed --targets >"$tmp/intro.json"
read -r libdir pydir plugindir < <("$python" - "$tmp/intro.json" "$build" <<'EOF'
import json, os, sys
doc = json.load(open(sys.argv[1]))
opts = {o["name"]: o["value"] for o in doc["buildoptions"]}
libdir = os.path.join(opts["prefix"], opts["libdir"])
pydir = plugin = "-"
for srcf, dest in doc["installed"].items():
    if dest.endswith("/libckpt/__init__.py"):
        pydir = os.path.dirname(os.path.dirname(dest))
    if os.path.basename(dest) == "libh5zstd.so":
        plugin = os.path.dirname(dest)
print(libdir, pydir, plugin)
EOF
)
echo "libdir $libdir; python package in $pydir; h5zstd plugin in $plugindir"

usersite=$("${clean[@]}" "$python" -m site --user-site)
pythonpath=()
if [[ $("${clean[@]}" "$python" -c 'import site; print(bool(site.ENABLE_USER_SITE))') == True ]]; then
    [[ $pydir == "$usersite" ]] ||
        fail "python package goes to $pydir, not the user site directory $usersite"
    grep -q "PYTHONPATH *: not needed" "$tmp/setup.log" ||
        fail "meson setup does not say PYTHONPATH is not needed for ~/.local"
else # a virtual environment's interpreter: no user site, PYTHONPATH printed
    usersite=$pydir
    pythonpath=("PYTHONPATH=$pydir")
    grep -q "PYTHONPATH *: export PYTHONPATH=$pydir\$" "$tmp/setup.log" ||
        fail "meson setup does not print PYTHONPATH=$pydir"
fi
grep -q "export PKG_CONFIG_PATH=$libdir/pkgconfig" "$tmp/setup.log" ||
    fail "meson setup does not print PKG_CONFIG_PATH=$libdir/pkgconfig"
grep -q "ckpt RUNPATH *: $libdir\$" "$tmp/setup.log" ||
    fail "meson setup does not print the RUNPATH $libdir"

# ------------------------------------------------------- build, install
# Only what `meson install` installs (no examples, benchmarks or tests).
step "build and install"
mapfile -t targets < <("$python" - "$tmp/intro.json" "$build" <<'EOF'
import json, os, sys
doc = json.load(open(sys.argv[1]))
for t in doc["targets"]:
    if t.get("installed"):
        for f in t["filename"]:
            print(os.path.relpath(f, sys.argv[2]))
EOF
)
echo "targets: ${targets[*]}"
ninja -C "$build" "${targets[@]}" >"$tmp/build.log" 2>&1 || {
    tail -n 60 "$tmp/build.log"
    exit 1
}
echo "built in $((SECONDS - t0))s"
"${clean[@]}" "$meson" install -C "$build" --no-rebuild >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log"
    exit 1
}
# Nothing may depend on the build directory from here on.
rm -rf "$build"

for f in "$prefix/bin/ckpt" "$libdir/libckpt.so.0" "$libdir/libckpt.a" \
    "$libdir/pkgconfig/libckpt.pc" "$prefix/include/ckpt.h" \
    "$pydir/libckpt/__init__.py" "$pydir/libckpt/_install.py" \
    "$prefix/share/doc/libckpt/docs/CLI.md" "$prefix/share/doc/libckpt/LICENSE" \
    "$prefix/share/doc/libckpt/examples/slurm/train.sbatch"; do
    [[ -e $f ]] || fail "not installed: $f"
done
# Every relative link of the installed documentation leads to an installed
# file (the README links docs/ pages and include/ckpt.h).
docdir=$prefix/share/doc/libckpt
while IFS= read -r -d '' page; do
    while IFS= read -r target; do
        target=${target%%#*}
        [[ -z $target ]] && continue
        [[ -e $(dirname "$page")/$target ]] ||
            fail "${page#"$docdir"/} links $target, which is not installed"
    done < <(grep -oE '\]\([^)]+\)' "$page" | sed 's/^](//; s/)$//' | grep -vE '^[a-z]+:')
done < <(find "$docdir" -name '*.md' -print0)
if [[ $plugindir != - ]]; then
    [[ $plugindir == "$libdir/hdf5/plugins" ]] ||
        fail "h5zstd plugin goes to $plugindir, not $libdir/hdf5/plugins"
    [[ -f $plugindir/libh5zstd.so ]] || fail "not installed: $plugindir/libh5zstd.so"
fi
if command -v readelf >/dev/null 2>&1; then
    runpath=$(readelf -d "$prefix/bin/ckpt" | sed -n 's/.*(\(RUN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')
    [[ $runpath == "$libdir" ]] || fail "RUNPATH of ckpt is '$runpath', not $libdir"
fi

# What the documentation says to have in the environment: PATH with
# ~/.local/bin (Debian's ~/.profile adds it once it exists), HOME.
user=(env -i "PATH=$prefix/bin:/usr/bin:/bin" "HOME=$home")
pc=("${user[@]}" "PKG_CONFIG_PATH=$libdir/pkgconfig")

# ------------------------------------------------------------ ckpt runs
step "installed ckpt"
out=$("${user[@]}" ckpt --version 2>&1) || fail "ckpt --version: $out"
echo "$out"
[[ $out == *0.* ]] || fail "ckpt --version printed '$out'"
# --help points at the JSON schemas where they were installed
out=$("${user[@]}" ckpt --help 2>&1) || fail "ckpt --help: $out"
[[ $out == *"$prefix/share/doc/libckpt/docs/CLI.md"* ]] ||
    fail "ckpt --help does not name the installed $prefix/share/doc/libckpt/docs/CLI.md"

# The job script, from where it was installed (docs/OPERATIONS.md): it
# finds the installed ckpt on PATH and hands the job the step to resume.
step "installed resume.sh"
resume=$prefix/share/doc/libckpt/examples/resume.sh
[[ -x $resume ]] || fail "not installed executable: $resume"
out=$("${user[@]}" "$resume" -n 0 -d "$tmp/resume-root" -- \
    sh -c 'echo "job: step=[$CKPT_RESUME_STEP] dir=$CKPT_RESUME_DIR"' 2>&1) ||
    fail "installed resume.sh: $out"
echo "$out"
[[ $out == *"job: step=[] dir=$tmp/resume-root"* ]] ||
    fail "installed resume.sh did not run the job with CKPT_RESUME_DIR"

# -------------------------------------------------- a C program, pkg-config
step "C program built with pkg-config"
cp "$src/examples/quickstart.c" "$tmp/app.c"
# The README's line, as it is: for a user prefix libckpt.pc carries the
# library's rpath, so the program runs without LD_LIBRARY_PATH.
# shellcheck disable=SC2016 # expanded by the inner shell
cmd='cc -std=c11 app.c $(pkg-config --cflags --libs libckpt) -o app'
if [[ $("${pc[@]}" pkg-config --libs libckpt) != *-rpath* ]]; then
    fail "pkg-config --libs libckpt has no -rpath for a user prefix"
fi
echo "$cmd"
if ! (cd "$tmp" && "${pc[@]}" sh -c "$cmd") >"$tmp/cc.log" 2>&1; then
    cat "$tmp/cc.log"
    fail "quickstart does not build with pkg-config"
fi
out=$("${user[@]}" "$tmp/app" "$tmp/store" 2>&1) || fail "quickstart failed: $out"
echo "$out"
[[ $out == *"restored step 100"* ]] || fail "quickstart did not restore step 100"

out=$("${user[@]}" ckpt list "$tmp/store" 2>&1) || fail "ckpt list: $out"
echo "$out"
grep -Eq '^ *100 +valid' <<<"$out" || fail "ckpt list does not show step 100 valid"
out=$("${user[@]}" ckpt verify "$tmp/store" 2>&1) || fail "ckpt verify: $out"

# ------------------------------------------------------ Python, user site
step "import libckpt (user site, no PYTHONPATH) ${pythonpath[*]}"
cat >"$tmp/roundtrip.py" <<'EOF'
import os, sys
import numpy as np
import libckpt
libdir, usersite, tmp = sys.argv[1:4]
print("libckpt", libckpt.__version__, "from", libckpt.__file__, "library", libckpt.library_path)
assert libckpt.__file__.startswith(usersite + os.sep), libckpt.__file__
assert libckpt.library_path == os.path.join(libdir, "libckpt.so.0"), libckpt.library_path
w = np.arange(12, dtype=np.float32).reshape(3, 4)
with libckpt.Store(os.path.join(tmp, "pystore")) as s:
    s.save(7, {"w": w, "epoch": 2}).wait()
    step, state = s.load()
assert step == 7 and state["epoch"] == 2 and np.array_equal(state["w"], w), (step, state)
# The C quickstart's checkpoint, read from Python.
with libckpt.Store(os.path.join(tmp, "store"), readonly=True) as s:
    step, state = s.load()
assert step == 100 and state["weights"].shape == (4, 8), (step, state)
print("python round trip ok")
EOF
"${user[@]}" "${pythonpath[@]}" "$python" "$tmp/roundtrip.py" "$libdir" "$usersite" "$tmp" ||
    fail "import libckpt from the user site"

# ------------------------------------ Python, binding without _install.py
# The package alone, copied elsewhere (`pip install ./bindings/python`
# bundles a library instead: test_pip.sh).
step "binding without _install.py or a bundled library"
mkdir -p "$tmp/pip"
cp -r "$pydir/libckpt" "$tmp/pip/"
rm -f "$tmp/pip/libckpt/_install.py"
rm -rf "$tmp/pip/libckpt/__pycache__"
pip=("${user[@]}" PYTHONPATH="$tmp/pip" PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1)
probe='import libckpt; print(libckpt.library_path)'
if out=$("${pip[@]}" "$python" -c "$probe" 2>&1); then
    # Another libckpt is installed system-wide: the message cannot be seen.
    echo "found $out without help (a system libckpt): message not checked"
else
    msg=$(tail -n 1 <<<"$out")
    echo "$msg"
    want="LIBCKPT_LIBRARY=PREFIX/${libdir#"$prefix"/}/libckpt.so.0"
    [[ $msg == *"$want"* ]] || fail "ImportError does not say $want"
    [[ $msg == *"PKG_CONFIG_PATH=PREFIX/${libdir#"$prefix"/}/pkgconfig"* ]] ||
        fail "ImportError does not name PKG_CONFIG_PATH"
fi
out=$("${pip[@]}" "PKG_CONFIG_PATH=$libdir/pkgconfig" "$python" -c "$probe" 2>&1) ||
    fail "binding with PKG_CONFIG_PATH: $out"
[[ $out == "$libdir/libckpt.so.0" ]] || fail "with PKG_CONFIG_PATH loaded '$out'"
out=$("${pip[@]}" "LIBCKPT_LIBRARY=$libdir/libckpt.so.0" "$python" -c "$probe" 2>&1) ||
    fail "binding with LIBCKPT_LIBRARY: $out"
[[ $out == "$libdir/libckpt.so.0" ]] || fail "with LIBCKPT_LIBRARY loaded '$out'"

# A meson install whose library was removed since (uninstalled, moved):
# the package says so and how to mend it, not to point LIBCKPT_LIBRARY at
# the very file that is gone.
step "binding whose installed library is gone"
mkdir -p "$tmp/gone"
cp -r "$pydir/libckpt" "$tmp/gone/"
rm -rf "$tmp/gone/libckpt/__pycache__"
printf 'LIBDIR = "%s"\n' "$tmp/no-such-libdir" >"$tmp/gone/libckpt/_install.py"
if out=$("${user[@]}" PYTHONPATH="$tmp/gone" PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 \
        "$python" -c "$probe" 2>&1); then
    echo "found $out without the recorded library (a system libckpt): message not checked"
else
    msg=$(tail -n 1 <<<"$out")
    echo "$msg"
    [[ $msg == *"$tmp/no-such-libdir/libckpt.so.0, is gone"* && $msg == *"install libckpt again"* ]] ||
        fail "ImportError does not say the installed library is gone: $msg"
fi

# --------------------------------------------------- HDF5 zstd plugin hint
step "ckpt export --codec zstd"
if [[ $plugindir == - ]]; then
    echo "built without HDF5: nothing to check"
else
    "${user[@]}" ckpt export "$tmp/store" "$tmp/out.h5" --codec zstd --json \
        >"$tmp/export.json" 2>"$tmp/export.err" || fail "ckpt export --codec zstd failed"
    cat "$tmp/export.json" "$tmp/export.err"
    got=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("hdf5_plugin_path"))' \
        "$tmp/export.json" 2>&1) || true
    [[ $got == "$plugindir" ]] || fail "export --json hdf5_plugin_path is '$got', not $plugindir"
    grep -qF "HDF5_PLUGIN_PATH=$plugindir" "$tmp/export.err" ||
        fail "export does not print HDF5_PLUGIN_PATH=$plugindir on stderr"
    out=$("${user[@]}" "HDF5_PLUGIN_PATH=$plugindir" ckpt export "$tmp/store" "$tmp/out2.h5" \
        --codec zstd 2>&1 >/dev/null) || fail "export with HDF5_PLUGIN_PATH set failed"
    [[ -z $out ]] || fail "export prints a note although HDF5_PLUGIN_PATH is set: $out"
    if command -v h5dump >/dev/null 2>&1; then
        out=$("${user[@]}" "HDF5_PLUGIN_PATH=$plugindir" h5dump -d /weights "$tmp/out.h5" 2>&1) ||
            fail "h5dump with HDF5_PLUGIN_PATH=$plugindir: $out"
        [[ $out == *"15.5"* ]] || fail "h5dump did not print the weights: $out"
    fi
    if "$python" -c 'import h5py' >/dev/null 2>&1; then
        # h5py (libhdf5 underneath) decodes the zstd chunks through the
        # installed plugin: the same values as the checkpoint.
        "${user[@]}" "${pythonpath[@]}" "HDF5_PLUGIN_PATH=$plugindir" "$python" - \
            "$tmp/out.h5" "$tmp/store" <<'EOF' || fail "h5py with HDF5_PLUGIN_PATH=$plugindir"
import sys
import h5py, numpy as np
import libckpt
with h5py.File(sys.argv[1], "r") as f:
    dset = f["weights"]
    dcpl = dset.id.get_create_plist()
    filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
    assert 32015 in filters, filters
    data = dset[()]
with libckpt.Store(sys.argv[2], readonly=True) as s:
    step, state = s.load()
assert np.array_equal(data, state["weights"]), (data, state["weights"])
print("h5py read", data.shape, data.dtype, "through the plugin: equal to step", step)
EOF
    fi
fi

# --------------------------------------------- another prefix: PYTHONPATH
# Where a configured tree installs the binding (python) or the plugin (h5zstd).
installed_dir() {
    "$meson" introspect "$1" --installed | "$python" -c '
import json, os, sys
for dest in json.load(sys.stdin).values():
    if sys.argv[1] == "python" and dest.endswith("/libckpt/__init__.py"):
        print(os.path.dirname(os.path.dirname(dest)))
    if sys.argv[1] == "h5zstd" and os.path.basename(dest) == "libh5zstd.so":
        print(os.path.dirname(dest))' "$2"
}

step "meson setup --prefix $tmp/opt -Dhdf5_plugin_dir=lib/h5plugins (configure only)"
"${clean[@]}" "$meson" setup "$tmp/build2" "$src" --prefix "$tmp/opt" -Dtests=disabled \
    -Dhdf5_plugin_dir=lib/h5plugins >"$tmp/setup2.log" 2>&1 || {
    cat "$tmp/setup2.log"
    exit 1
}
pydir2=$(installed_dir "$tmp/build2" python)
grep -E 'PYTHONPATH|pkg-config|RUNPATH|HDF5 zstd' "$tmp/setup2.log"
grep -q "PYTHONPATH *: export PYTHONPATH=$pydir2\$" "$tmp/setup2.log" ||
    fail "meson setup for $tmp/opt does not print PYTHONPATH=$pydir2"
if [[ $plugindir != - ]]; then
    got=$(installed_dir "$tmp/build2" h5zstd)
    [[ $got == "$tmp/opt/lib/h5plugins" ]] ||
        fail "-Dhdf5_plugin_dir=lib/h5plugins installs the plugin into '$got'"
    grep -q "HDF5 zstd plugin *: $tmp/opt/lib/h5plugins (export HDF5_PLUGIN_PATH=" \
        "$tmp/setup2.log" || fail "meson setup does not print HDF5_PLUGIN_PATH for lib/h5plugins"
fi
rm -rf "$tmp/build2"

# ------------------------------------- a system prefix: HDF5's own directory
if [[ $plugindir != - ]]; then
    step "meson setup --prefix /usr/local (configure only): the plugin directory"
    # What libhdf5 searches with HDF5_PLUGIN_PATH unset, from libhdf5 itself.
    cat >"$tmp/h5pl.c" <<'EOF'
#include <hdf5.h>
#include <stdio.h>
int main(void)
{
    unsigned int n = 0;
    char dir[4096];
    if (H5PLsize(&n) < 0)
        return 1;
    for (unsigned int i = 0; i < n; i++)
        if (H5PLget(i, dir, sizeof dir) > 0)
            printf("%s\n", dir);
    return 0;
}
EOF
    # shellcheck disable=SC2046 # pkg-config's flags are words
    if cc "$tmp/h5pl.c" -o "$tmp/h5pl" $(pkg-config --cflags --libs hdf5) >"$tmp/h5pl.log" 2>&1; then
        mapfile -t h5default < <(env -u HDF5_PLUGIN_PATH "$tmp/h5pl")
        echo "libhdf5's default plugin path: ${h5default[*]}"
        "${clean[@]}" "$meson" setup "$tmp/build3" "$src" --prefix /usr/local -Dtests=disabled \
            >"$tmp/setup3.log" 2>&1 || {
            cat "$tmp/setup3.log"
            exit 1
        }
        got=$(installed_dir "$tmp/build3" h5zstd)
        grep 'HDF5 zstd' "$tmp/setup3.log"
        if ((${#h5default[@]} == 0)) || [[ $got != "${h5default[0]}" ]]; then
            fail "prefix /usr/local installs the plugin into '$got', not libhdf5's default '${h5default[*]}'"
        fi
        grep -q "HDF5 zstd plugin *: $got (HDF5's default)" "$tmp/setup3.log" ||
            fail "meson setup for /usr/local does not call $got HDF5's default"
        rm -rf "$tmp/build3"
    else
        cat "$tmp/h5pl.log"
        fail "cannot build a program with pkg-config hdf5"
    fi
fi

echo
if ((failures)); then
    echo "test_install: $failures failure(s) in $((SECONDS - t0))s"
    exit 1
fi
echo "test_install: ok in $((SECONDS - t0))s"

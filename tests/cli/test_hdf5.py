"""ckpt export / import: every codec read back with h5py and h5dump (through
the h5zstd plugin) equals the checkpoint's bytes; import then restore
equals the HDF5 data; malformed files give clear errors."""

import ctypes
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from byteflip import flip_byte
from clitest import (CKPT, H5ZSTD_DIR, check, ckpt, ckpt_json, expect_rc, expected_bytes,
                     make_step, names, python_env, restored_bytes, run)

# The plugin must be on the path before libhdf5 initialises (h5py import).
if H5ZSTD_DIR:
    os.environ["HDF5_PLUGIN_PATH"] = H5ZSTD_DIR
try:
    import h5py
    import numpy as np
except ImportError:  # Debian: python3-h5py, python3-numpy
    h5py = np = None

SEED = 20
CODECS = [("none", []), ("deflate", []), ("zstd", []),
          ("deflate", ["--chunk-kib", "1"]), ("zstd", ["--chunk-kib", "1", "--level", "5"])]

NP_DTYPE = {
    "bool": "u1", "uint8": "u1", "int8": "i1", "uint16": "<u2", "int16": "<i2",
    "uint32": "<u4", "int32": "<i4", "uint64": "<u8", "int64": "<i8", "float16": "<f2",
    "bfloat16": "<u2", "float32": "<f4", "float64": "<f8", "complex64": "<f4",
    "complex128": "<f8", "float8_e4m3fn": "u1", "float8_e5m2": "u1", "bytes": "u1",
}


def need_hdf5():
    r = ckpt("export", "--help")
    if "needs HDF5" in r.out or r.rc != 0:
        pytest.skip("ckpt was built without HDF5")
    if not H5ZSTD_DIR:
        pytest.skip("CKPT_H5ZSTD_DIR not set (h5zstd plugin not built)")


def need_h5py():
    if h5py is None:
        pytest.skip("python3-h5py / numpy not installed")


def source_root(tmp):
    root = os.path.join(tmp, "root")
    make_step(root, 10, 10)
    make_step(root, SEED, SEED)
    return root


def export(root, out, codec, extra=(), step=SEED):
    _, doc = ckpt_json("export", "export", root, out, "--step", step, "--codec", codec,
                       *extra, rc=0)
    check(doc["codec"] == codec and doc["step"] == step and os.path.exists(out),
          "export doc %s" % doc)
    # The plugin other programs need: this build tree's, for a ckpt run from it.
    check(doc.get("hdf5_plugin_path") == (H5ZSTD_DIR if codec == "zstd" else None),
          "export doc: hdf5_plugin_path %r" % doc.get("hdf5_plugin_path"))
    return doc


def h5dump_bytes(path, name, dtype, env=None):
    """The dataset's values as printed by h5dump (floats with 17 digits),
    packed back into the bytes of `dtype`."""
    r = run("h5dump", "-y", "-A", "0", "-m", "%.17g", "-d", "/" + name, path, env=env)
    check(r.rc == 0, "h5dump -d /%s failed" % name, r)
    body = r.out.split("DATA {", 1)[1]
    toks = re.findall(r"TRUE|FALSE|[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", body)
    vals = [1 if t == "TRUE" else 0 if t == "FALSE" else
            (float(t) if re.search(r"[.eE]", t) or NP_DTYPE[dtype][1] == "f" else int(t))
            for t in toks]
    return np.array(vals, dtype=NP_DTYPE[dtype]).tobytes()


def test_export_every_codec_reads_back(tmp):
    need_hdf5()
    need_h5py()
    if not shutil.which("h5dump"):
        pytest.skip("h5dump not installed (Debian hdf5-tools)")
    root = source_root(tmp)
    tensors = names()
    expect = {n: expected_bytes(SEED, n, tmp) for n, _, _ in tensors}
    for codec, extra in CODECS:
        out = os.path.join(tmp, "out-%s-%d.h5" % (codec, len(extra)))
        doc = export(root, out, codec, extra)
        check(doc["datasets"] == len(tensors), "dataset count")
        with h5py.File(out, "r") as f:
            check(int(f.attrs["step"]) == SEED, "step attribute")
            check(json.loads(f.attrs["metadata"]) == {"lr": 0.001, "epoch": 3, "seed": SEED},
                  "metadata attribute %r" % f.attrs["metadata"])
            check(json.loads(f.attrs["environment"]).get("libckpt"), "environment attribute")
            check(f.attrs["codec"] == codec, "codec attribute")
            for n, dt, shape in tensors:
                ds = f[n]
                check(ds.attrs["dtype"] == dt, "%s: dtype attribute %r" % (n, ds.attrs["dtype"]))
                check(list(ds.shape) == shape, "%s: shape %s != %s" % (n, ds.shape, shape))
                got = ds[()].tobytes() if ds.size else b""
                check(got == expect[n], "%s (%s): h5py bytes differ" % (n, codec))
                want = {"bool": np.bool_, "float16": np.float16, "bfloat16": np.uint16,
                        "complex64": np.complex64, "complex128": np.complex128,
                        "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8,
                        "bytes": np.uint8}.get(dt, np.dtype(NP_DTYPE[dt]))
                check(ds.dtype == want, "%s: h5py dtype %s, want %s" % (n, ds.dtype, want))
                filters = ds.id.get_create_plist()
                ids = [filters.get_filter(i)[0] for i in range(filters.get_nfilters())]
                if codec == "zstd" and ds.size and ds.ndim:
                    check(ids == [32015], "%s: filters %s, want [32015]" % (n, ids))
                if codec == "deflate" and ds.size and ds.ndim:
                    check(ids == [1], "%s: filters %s" % (n, ids))
                if codec == "none":
                    check(ids == [] and ds.chunks is None, "%s: none is contiguous" % n)
            if extra:  # small chunks: several per dataset, edge chunks too
                w = f["model/layer0/weight"]
                check(w.chunks and w.chunks[0] < 64, "chunks %s" % (w.chunks,))
        for n, dt, shape in tensors:
            if expect[n]:
                check(h5dump_bytes(out, n, dt) == expect[n],
                      "%s (%s): h5dump values differ" % (n, codec))


def test_zstd_needs_the_plugin(tmp):
    need_hdf5()
    if not shutil.which("h5dump"):
        pytest.skip("h5dump not installed")
    root = source_root(tmp)
    out = os.path.join(tmp, "z.h5")
    export(root, out, "zstd")
    env = {"HDF5_PLUGIN_PATH": os.path.join(tmp, "no-plugins-here")}
    r = run("h5dump", "-d", "/model/layer0/weight", out, env=env)
    check(r.rc != 0, "h5dump read zstd chunks without the plugin", r)
    r = run("h5dump", "-d", "/model/layer0/weight", out)
    check(r.rc == 0 and "32015" not in r.err, "h5dump with the plugin", r)
    # ckpt registers the filter itself: import works without the plugin
    dest = os.path.join(tmp, "dest")
    _, doc = ckpt_json("import", "import", out, dest, env=env, rc=0)
    check(doc["step"] == SEED, "import takes the step attribute")


def hdf5_default_plugin_path():
    """HDF5's search path with HDF5_PLUGIN_PATH unset, as libhdf5 reports it
    (H5PLget through h5py in a fresh interpreter), ':'-joined; None without
    h5py."""
    if h5py is None:
        return None
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    code = ("import h5py; print(':'.join(h5py.h5pl.get(i).decode() "
            "for i in range(h5py.h5pl.size())))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=60, check=True)
    return r.stdout.strip()


def test_zstd_export_names_the_plugin_directory(tmp):
    """Without the plugin on HDF5's search path, export --codec zstd says what
    to export (stderr): the plugin's directory, then what HDF5 searched
    before (HDF5_PLUGIN_PATH replaces HDF5's default directory, so other
    plugins stay found); with it there, or another codec, it says nothing."""
    need_hdf5()
    root = source_root(tmp)
    out = os.path.join(tmp, "z.h5")
    note = "export HDF5_PLUGIN_PATH="
    for value, want in (("", H5ZSTD_DIR), ("/elsewhere:/else", H5ZSTD_DIR + ":/elsewhere:/else")):
        env = {"HDF5_PLUGIN_PATH": value}
        r = expect_rc(ckpt("export", root, out, "--codec", "zstd", "--force", env=env), 0)
        check(r.err.endswith(note + want + "\n") and r.out.startswith("exported step"),
              "no plugin note naming " + want, r)
        r = expect_rc(ckpt("--json", "export", root, out, "--codec", "zstd", "--force",
                           env=env), 0)
        check(r.err.endswith(note + want + "\n") and r.json()["hdf5_plugin_path"] == H5ZSTD_DIR,
              "no plugin note with --json", r)
    default = hdf5_default_plugin_path()
    if default is not None:  # HDF5_PLUGIN_PATH unset: HDF5's default kept after it
        env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
        p = subprocess.run([CKPT, "export", root, out, "--codec", "zstd", "--force"], env=env,
                           capture_output=True, text=True, timeout=120)
        want = H5ZSTD_DIR + (":" + default if default else "")
        check(p.returncode == 0 and p.stderr.endswith(note + want + "\n"),
              "no plugin note naming %s (HDF5_PLUGIN_PATH unset)" % want, p)
    for env in ({"HDF5_PLUGIN_PATH": H5ZSTD_DIR},
                {"HDF5_PLUGIN_PATH": "/elsewhere:" + H5ZSTD_DIR + "/"}):
        r = expect_rc(ckpt("export", root, out, "--codec", "zstd", "--force", env=env), 0)
        check(r.err == "", "a note although the plugin is on HDF5_PLUGIN_PATH", r)
    r = expect_rc(ckpt("export", root, out, "--codec", "deflate", "--force",
                       env={"HDF5_PLUGIN_PATH": ""}), 0)
    check(r.err == "", "a plugin note for deflate", r)


def test_export_import_round_trip(tmp):
    need_hdf5()
    root = source_root(tmp)
    tensors = names()
    for i, (codec, extra) in enumerate(CODECS):
        out = os.path.join(tmp, "rt-%d.h5" % i)
        export(root, out, codec, extra)
        dest = os.path.join(tmp, "dest-%d" % i)
        _, doc = ckpt_json("import", "import", out, dest, "--step", 7, rc=0)
        check(doc["tensors"] == len(tensors) and doc["step"] == 7, "import doc %s" % doc)
        _, insp = ckpt_json("inspect", "inspect", dest, rc=0)
        check([(t["name"], t["dtype"], t["shape"]) for t in insp["tensors"]] ==
              sorted(tuple(t) for t in tensors), "imported tensors %s" % insp["tensors"])
        check(insp["metadata"] == {"lr": 0.001, "epoch": 3, "seed": SEED},
              "metadata kept: %s" % insp["metadata"])
        for n, dt, shape in tensors:
            desc, data = restored_bytes(dest, 7, n, tmp)
            check(data == expected_bytes(SEED, n, tmp), "%s (%s): restored bytes differ"
                  % (n, codec))
        expect_rc(ckpt("verify", dest), 0)


def h5py_file(path):
    """A file made by h5py, as other tools write them."""
    rng = np.random.default_rng(5)
    arrays = {
        "a/b/c/deep": rng.standard_normal((5, 37, 29)),
        "wide": rng.standard_normal((3, 300)),
        "ints/i8": rng.integers(-128, 127, 11, dtype=np.int8),
        "ints/u16": rng.integers(0, 65535, (3, 3), dtype=np.uint16),
        "ints/i32be": rng.integers(-2**31, 2**31 - 1, 6, dtype=np.int32).astype(">i4"),
        "ints/u64": rng.integers(0, 2**63, 4, dtype=np.uint64),
        "f/half": rng.standard_normal(9).astype(np.float16),
        "f/single_be": rng.standard_normal((2, 5)).astype(">f4"),
        "flags": rng.integers(0, 2, 13).astype(bool),
        "cplx": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "cplx128": (rng.standard_normal(3) + 1j).astype(np.complex128),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            kw = {}
            if k in ("a/b/c/deep", "wide"):
                kw = {"chunks": True, "compression": "gzip", "shuffle": True}
            f.create_dataset(k, data=v, **kw)
        f.create_dataset("color", data=np.array([0, 2, 1], dtype=np.uint8),
                         dtype=h5py.enum_dtype({"R": 0, "G": 1, "B": 2}, basetype="u1"))
        f.create_dataset("raw", data=np.frombuffer(b"abcdefgh", dtype="V4"))
        f.attrs["step"] = 42
        f.attrs["metadata"] = '{"source": "h5py"}'
    arrays["color"] = np.array([0, 2, 1], dtype=np.uint8)
    return arrays


def test_import_h5py_file(tmp):
    need_hdf5()
    need_h5py()
    src = os.path.join(tmp, "h5py.h5")
    arrays = h5py_file(src)
    dest = os.path.join(tmp, "dest")
    _, doc = ckpt_json("import", "import", src, dest, rc=0)
    check(doc["step"] == 42 and doc["tensors"] == len(arrays) + 1, "import %s" % doc)
    _, insp = ckpt_json("inspect", "inspect", dest, "--step", 42, rc=0)
    got = {t["name"]: (t["dtype"], t["shape"]) for t in insp["tensors"]}
    want = {"a/b/c/deep": ("float64", [5, 37, 29]), "wide": ("float64", [3, 300]),
            "ints/i8": ("int8", [11]), "ints/u16": ("uint16", [3, 3]),
            "ints/i32be": ("int32", [6]), "ints/u64": ("uint64", [4]),
            "f/half": ("float16", [9]), "f/single_be": ("float32", [2, 5]),
            "flags": ("bool", [13]), "cplx": ("complex64", [4]),
            "cplx128": ("complex128", [3]), "scalar": ("float64", []),
            "empty": ("float32", [0, 4]), "color": ("uint8", [3]), "raw": ("bytes", [2, 4])}
    check(got == want, "imported dtypes/shapes:\n%s\nwant\n%s" % (got, want))
    check(insp["metadata"] == {"source": "h5py"}, "metadata %s" % insp["metadata"])
    for name, arr in arrays.items():
        _, data = restored_bytes(dest, 42, name, tmp)
        native = np.asarray(arr)
        native = native.astype(native.dtype.newbyteorder("="))
        check(data == native.tobytes(), "%s: restored bytes differ from HDF5 data" % name)
    _, data = restored_bytes(dest, 42, "raw", tmp)
    check(data == b"abcdefgh", "opaque bytes")
    # and back out with small zstd chunks: partial chunks in every dimension
    out = os.path.join(tmp, "again.h5")
    export(dest, out, "zstd", ["--chunk-kib", "1"], step=42)
    with h5py.File(out, "r") as f:
        check(f["a/b/c/deep"].chunks == (1, 4, 29), "chunks %s" % (f["a/b/c/deep"].chunks,))
        check(f["wide"].chunks == (1, 128), "chunks %s" % (f["wide"].chunks,))
        for name in ("a/b/c/deep", "wide", "ints/i32be", "f/half", "flags", "cplx"):
            a = np.asarray(arrays[name])
            check(np.array_equal(f[name][()], a), "%s differs after re-export" % name)


def test_import_reads_enums_and_bitfields_of_fewer_bits_than_bytes(tmp):
    """An HDF5 integer type may use fewer bits (its precision) than its
    size: HDF5's native type for an 8-byte bitfield of 8 bits is 1 byte, for
    an enum on an 8-byte base of 16 bits 2 bytes.  Read through those, the
    elements were packed into the front of a buffer sized for 8 bytes each:
    wrong values, and the rest uninitialised heap saved in the checkpoint."""
    need_hdf5()
    need_h5py()
    from h5py import h5d, h5s, h5t
    src = os.path.join(tmp, "narrow.h5")
    n = 64
    bits = np.arange(1, n + 1, dtype=np.uint64)
    codes = np.where(np.arange(n) % 2 == 1, 0x1111, -7).astype(np.int64)
    with h5py.File(src, "w") as f:
        space = h5s.create_simple((n,))
        bt = h5t.STD_B64LE.copy()
        # h5py has no set_precision for bitfields: HDF5's own, on its id
        hdf5 = ctypes.CDLL(next(line.split()[-1] for line in open("/proc/self/maps")
                                if re.search(r"/libhdf5(_serial)?\.so", line)))
        hdf5.H5Tset_precision.argtypes = [ctypes.c_int64, ctypes.c_size_t]
        check(hdf5.H5Tset_precision(bt.id, 8) >= 0, "H5Tset_precision")
        h5d.create(f.id, b"bits", bt, space).write(h5s.ALL, h5s.ALL, bits,
                                                  mtype=h5t.STD_B64LE)
        base = h5t.STD_I64LE.copy()
        base.set_precision(16)
        et = h5t.enum_create(base)
        mt = h5t.enum_create(h5t.NATIVE_INT64)
        for name, value in ((b"NEG", -7), (b"BIG", 0x1111)):
            et.enum_insert(name, value)
            mt.enum_insert(name, value)
        h5d.create(f.id, b"enum", et, space).write(h5s.ALL, h5s.ALL, codes, mtype=mt)
        f.attrs["step"] = 3
    dest = os.path.join(tmp, "dest")
    ckpt_json("import", "import", src, dest, rc=0)
    _, insp = ckpt_json("inspect", "inspect", dest, "--step", 3, rc=0)
    got = {t["name"]: (t["dtype"], t["shape"]) for t in insp["tensors"]}
    check(got == {"bits": ("uint64", [n]), "enum": ("int64", [n])}, "imported %s" % got)
    for name, want in (("bits", bits), ("enum", codes)):
        _, data = restored_bytes(dest, 3, name, tmp)
        check(data == want.tobytes(), "%s: restored %r, want %r"
              % (name, np.frombuffer(data, want.dtype)[:4], want[:4]))


def test_import_rewind_names_a_step_it_could_not_retire(tmp):
    """--rewind retires the steps above the imported one after its commit;
    one whose retirement fails (immutable here; another user's step in a
    shared root) stays, and restore goes on choosing it.  The import said
    it was retired, and exited 0."""
    need_hdf5()
    need_h5py()
    if not shutil.which("chattr"):
        pytest.skip("no chattr")
    src, dest = os.path.join(tmp, "x.h5"), os.path.join(tmp, "dest")
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(4, dtype=np.int32)
    for step in (3, 4, 5):
        expect_rc(ckpt("import", src, dest, "--step", step), 0)
    five = os.path.join(dest, "step-000000000005")
    if run("chattr", "+i", five).rc != 0:
        pytest.skip("chattr +i is refused here (not root, or the file system)")
    try:
        r = expect_rc(ckpt("import", src, dest, "--step", 2, "--rewind"), 3)
        check("retired the steps above it (--rewind): 3, 4" in r.out and
              "step 5 above it could not be retired" in r.err, "rewind output", r)
        r = ckpt("--json", "import", src, dest, "--step", 1, "--rewind")
        check(r.rc == 3 and r.json()["error"]["exit_code"] == 3 and
              "step 5 above it" in r.json()["error"]["message"], "json", r)
    finally:
        run("chattr", "-i", five)


def test_import_step_and_errors(tmp):
    need_hdf5()
    need_h5py()
    dest = os.path.join(tmp, "dest")
    # no step attribute and no --step: usage error
    nostep = os.path.join(tmp, "nostep.h5")
    with h5py.File(nostep, "w") as f:
        f["x"] = np.arange(4, dtype=np.int32)
    r = expect_rc(ckpt("import", nostep, dest), 2)
    check("--step" in r.err, "message should ask for --step", r)
    ckpt_json(None, "import", nostep, dest, rc=2)
    expect_rc(ckpt("import", nostep, dest, "--step", 3), 0)
    # importing again replaces the step; other steps stay
    expect_rc(ckpt("import", nostep, dest, "--step", 4), 0)
    expect_rc(ckpt("import", nostep, dest, "--step", 4), 0)
    # below the newest step: refused (restore would never choose it) ...
    r = expect_rc(ckpt("import", nostep, dest, "--step", 3), 3)
    check("below step 4" in r.err and "ckpt import --rewind" in r.err, "lower step message", r)
    r = expect_rc(ckpt("latest", dest, "--step"), 0)
    check(r.out == "4\n", "steps after re-import", r)
    _, doc = ckpt_json("list", "list", dest, rc=0)
    check([s["step"] for s in doc["steps"]] == [3, 4], "steps %s" % doc["steps"])
    # ... unless going back on purpose: the steps above it are retired, and
    # the output says which (nothing else tells the user they are gone)
    r = expect_rc(ckpt("import", nostep, dest, "--step", 3, "--rewind"), 0)
    check("retired the steps above it (--rewind): 4" in r.out, "rewind output", r)
    _, doc = ckpt_json("list", "list", dest, rc=0)
    check([s["step"] for s in doc["steps"]] == [3], "steps after rewind %s" % doc["steps"])
    expect_rc(ckpt("import", nostep, dest, "--step", 5), 0)
    expect_rc(ckpt("import", nostep, dest, "--step", 6), 0)
    _, doc = ckpt_json("import", "import", nostep, dest, "--step", 2, "--rewind", rc=0)
    check(doc["retired"] == [3, 5, 6], "retired %s" % doc)
    _, doc = ckpt_json("import", "import", nostep, dest, "--step", 2, rc=0)
    check(doc["retired"] == [], "retired without --rewind %s" % doc)
    # a job holds the root: busy, exit 3
    fd = os.open(os.path.join(dest, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _, doc = ckpt_json(None, "import", nostep, dest, "--step", 5, rc=3)
        check(doc["error"]["status"] == "busy", "busy %s" % doc)
    finally:
        os.close(fd)


def test_import_bounds_allocation(tmp):
    """A tiny file declaring a huge dataset is refused before any allocation:
    one never written (sparse, fill values only), and one whose stored bytes
    are far fewer than any codec could expand to its declared size."""
    need_hdf5()
    need_h5py()
    dest = os.path.join(tmp, "dest")
    sparse = os.path.join(tmp, "sparse.h5")
    with h5py.File(sparse, "w") as f:
        f.create_dataset("huge", shape=(1 << 31,), dtype="f4")  # 8 GiB, unwritten
        f.attrs["step"] = 1
    check(os.path.getsize(sparse) < 16384, "the file is small")
    r = expect_rc(ckpt("import", sparse, dest), 3)
    check("huge" in r.err and "stores none" in r.err, "sparse dataset message", r)
    check(not os.path.exists(os.path.join(dest, "step-000000000001")), "nothing saved")
    chunked = os.path.join(tmp, "chunked.h5")
    with h5py.File(chunked, "w") as f:
        d = f.create_dataset("big", shape=(1 << 30,), dtype="f4", chunks=(1 << 16,),
                             compression="gzip")
        d[0:4] = [1, 2, 3, 4]  # one chunk stored, the rest unallocated
        f.attrs["step"] = 1
    r = expect_rc(ckpt("import", chunked, dest), 3)
    check("big" in r.err and "stores only" in r.err, "ratio message", r)


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def test_import_survives_files_that_crash_or_hang_hdf5(tmp):
    """HDF5 crashes on some damaged files and loops on others: the import
    reads the file in a child under a CPU-time limit, so either is exit 3
    with a message naming the file, and nothing is saved."""
    need_hdf5()
    dest = os.path.join(tmp, "dest")
    # No plugin path: with the zstd plugin on it, HDF5 happens to fail the
    # first file cleanly instead of crashing.
    env = {"CKPT_IMPORT_CPU_LIMIT": "2", "HDF5_PLUGIN_PATH": ""}
    for name in ("hdf5-crashes.h5", "hdf5-loops.h5"):
        src = os.path.join(DATA, name)
        r = ckpt("import", src, dest, env=env, timeout=60)
        if r.rc == 2 and name == "hdf5-crashes.h5":
            # The crash reads memory that is not the file's: under another
            # memory layout (ASan) HDF5 reads no 'step' attribute instead.
            check("has no 'step' attribute holding one integer" in r.err, "message", r)
            continue
        expect_rc(r, 3)
        check(src in r.err and "nothing was saved" in r.err, name + ": message", r)
        check(not any(n.startswith("step-") for n in
                      (os.listdir(dest) if os.path.isdir(dest) else [])), "nothing saved")
    r = expect_rc(ckpt("import", os.path.join(DATA, "hdf5-loops.h5"), dest, "--step", "1",
                       env={"CKPT_IMPORT_CPU_LIMIT": "soon"}), 2)
    check("CKPT_IMPORT_CPU_LIMIT" in r.err, "a bad limit is named", r)


def test_killing_an_import_stops_its_reader(tmp):
    """A job script that kills `ckpt import` (SIGTERM) stops the child that
    reads the file too: nothing goes on importing, and committing, behind
    its back."""
    need_hdf5()
    import signal
    import time
    env = dict(os.environ, CKPT_IMPORT_CPU_LIMIT="60", HDF5_PLUGIN_PATH="")
    p = subprocess.Popen([CKPT, "import", os.path.join(DATA, "hdf5-loops.h5"),
                          os.path.join(tmp, "dest")], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = "/proc/%d/task/%d/children" % (p.pid, p.pid)
    child = None
    deadline = time.monotonic() + 30
    while child is None and time.monotonic() < deadline:
        try:
            with open(children) as f:
                pids = f.read().split()
        except OSError:
            pids = []
        if pids:
            child = int(pids[0])
        else:
            time.sleep(0.05)
    check(child is not None, "the import started its reader")
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    gone = False
    deadline = time.monotonic() + 20
    while not gone and time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % child) as f:
                gone = f.read().split(") ")[-1].startswith("Z")  # a zombie is gone
        except OSError:
            gone = True
        if not gone:
            time.sleep(0.05)
    if not gone:
        os.kill(child, signal.SIGKILL)
    check(gone, "the reader went on after its parent was killed")


def test_an_import_killed_from_outside_is_not_called_a_bad_file(tmp):
    """The OOM killer (or an administrator) killing the reading child is
    said as such, not blamed on the file; a child stopped by its CPU limit
    leaves no core file behind (it would be the size of its memory)."""
    need_hdf5()
    import resource
    import signal
    import time
    env = dict(os.environ, CKPT_IMPORT_CPU_LIMIT="60", HDF5_PLUGIN_PATH="")
    p = subprocess.Popen([CKPT, "import", os.path.join(DATA, "hdf5-loops.h5"),
                          os.path.join(tmp, "dest")], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    children = "/proc/%d/task/%d/children" % (p.pid, p.pid)
    pids = []
    deadline = time.monotonic() + 30
    while not pids and time.monotonic() < deadline:
        try:
            with open(children) as f:
                pids = f.read().split()
        except OSError:
            pass
        if not pids:
            time.sleep(0.05)
    check(bool(pids), "the import started its reader")
    os.kill(int(pids[0]), signal.SIGKILL)
    out, err = p.communicate(timeout=30)
    check(p.returncode == 3 and "was killed" in err and "damaged" not in err,
          "a kill is reported as a kill: %d %s" % (p.returncode, err))
    with open("/proc/sys/kernel/core_pattern") as f:
        if f.read().strip() != "core":
            return  # cores go elsewhere here: nothing to look for
    work = os.path.join(tmp, "cwd")
    os.mkdir(work)

    def cores_on():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,
                                                  resource.RLIM_INFINITY))
    r = subprocess.run([CKPT, "import", os.path.join(DATA, "hdf5-loops.h5"), "dest"],
                       env=dict(env, CKPT_IMPORT_CPU_LIMIT="1"), cwd=work,
                       capture_output=True, text=True, timeout=60, preexec_fn=cores_on)
    check(r.returncode == 3, "the CPU limit stops it: %s" % r.stderr)
    check(not [n for n in os.listdir(work) if n.startswith("core")], "no core file")


def test_import_bounds_links_to_one_dataset(tmp):
    """Many links to one well-compressed dataset declare far more bytes than
    the file could hold: refused before anything is allocated or inflated
    (each link would be read, and inflated, once)."""
    need_hdf5()
    need_h5py()
    src = os.path.join(tmp, "links.h5")
    with h5py.File(src, "w") as f:
        d = f.create_dataset("zeros", data=np.zeros(1 << 24, dtype="f4"), chunks=(1 << 20,),
                             compression="gzip", compression_opts=9)
        for i in range(150):
            f["alias%03d" % i] = d  # a hard link: the same dataset again
        f.attrs["step"] = 1
    dest = os.path.join(tmp, "dest")
    r = expect_rc(ckpt("import", src, dest, timeout=60), 3)
    check("declare" in r.err and "together" in r.err and "links" in r.err,
          "the whole file's bound is named", r)
    check(not os.path.exists(os.path.join(dest, "step-000000000001")), "nothing saved")


def test_import_reads_nothing_but_its_input(tmp):
    """A dataset whose data HDF5 keeps in other files (external storage: a
    list of raw files read by path; a virtual dataset mapped from another
    file) is refused: HDF5 would read them as whoever imports, so another
    user's file could copy the importer's private files (or /etc/shadow,
    for root) into a checkpoint, and an external FIFO would block."""
    need_hdf5()
    need_h5py()
    secret = os.path.join(tmp, "secret.txt")
    with open(secret, "wb") as f:
        f.write(b"AWS_SECRET=hunter2\n")
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    src = os.path.join(tmp, "other.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("plain", data=np.arange(8, dtype=np.float32))
    cases = {}
    for name, target in (("secret", secret), ("fifo", fifo)):
        path = os.path.join(tmp, name + ".h5")
        with h5py.File(path, "w") as f:
            f.attrs["step"] = 1
            f.create_dataset("model/w", data=np.ones(4, np.float32))
            f.create_dataset("model/b", shape=(19,), dtype="u1", external=[(target, 0, 19)])
        cases[name] = path
    vds = os.path.join(tmp, "vds.h5")
    layout = h5py.VirtualLayout(shape=(8,), dtype="f4")
    layout[:] = h5py.VirtualSource(src, "plain", shape=(8,))
    with h5py.File(vds, "w") as f:
        f.attrs["step"] = 1
        f.create_virtual_dataset("v", layout)
    cases["vds"] = vds
    for name, path in cases.items():
        dest = os.path.join(tmp, "dest-" + name)
        r = ckpt("import", path, dest, timeout=30)
        check(r.rc == 3, "%s: expected exit 3" % name, r)
        want = "virtual dataset" if name == "vds" else "external file"
        check(want in r.err and "refused" in r.err, "%s: message" % name, r)
        check(not os.path.exists(os.path.join(dest, "step-000000000001")),
              "%s: nothing saved" % name)


def test_malformed_inputs(tmp):
    need_hdf5()
    need_h5py()
    dest = os.path.join(tmp, "dest")

    def refused(path, words, *extra):
        r = expect_rc(ckpt("import", path, dest, "--step", 1, *extra), 3)
        for w in words:
            check(w in r.err, "message lacks %r" % w, r)
        check(r.out == "", "stdout on error", r)
        _, doc = ckpt_json(None, "import", path, dest, "--step", 1, rc=3)
        check(not os.path.exists(os.path.join(dest, "step-000000000001")),
              "a refused import wrote a step")
        return r

    txt = os.path.join(tmp, "notes.h5")
    with open(txt, "w") as f:
        f.write("this is not HDF5\n" * 100)
    refused(txt, ["not an HDF5 file", txt])
    refused(os.path.join(tmp, "missing.h5"), ["cannot read", "missing.h5"])

    good = os.path.join(tmp, "good.h5")
    with h5py.File(good, "w") as f:
        f["x"] = np.arange(100000, dtype=np.float64)
    trunc = os.path.join(tmp, "trunc.h5")
    with open(good, "rb") as f:
        data = f.read()
    with open(trunc, "wb") as f:
        f.write(data[:len(data) // 2])
    refused(trunc, [trunc])

    for label, make, words in (
        ("string", lambda f: f.create_dataset("s", data=np.array([b"ab", b"cd"])),
         ["'s'", "unsupported HDF5 type (string"]),
        ("vlen", lambda f: f.create_dataset("v", (2,), dtype=h5py.vlen_dtype(np.int32)),
         ["'v'", "variable-length"]),
        ("vlenstr", lambda f: f.create_dataset("g/name", data="text"),
         ["'g/name'", "string"]),
        ("array", lambda f: f.create_dataset("arr", (2,), dtype=np.dtype("(3,)f4")),
         ["'arr'", "array"]),
        ("nullspace", lambda f: f.create_dataset("n", data=h5py.Empty("f4")),
         ["'n'", "dataspace"]),
        ("longdouble", lambda f: f.create_dataset("ld", data=np.zeros(2, np.longdouble)),
         ["'ld'", "float"]),
        ("empty file", lambda f: f.create_group("only/groups"), ["no datasets"]),
    ):
        path = os.path.join(tmp, label.replace(" ", "_") + ".h5")
        with h5py.File(path, "w") as f:
            if label != "empty file":
                f["ok"] = np.arange(3)  # good datasets do not make it partial
            make(f)
        refused(path, words)


def test_export_errors(tmp):
    need_hdf5()
    root = source_root(tmp)
    out = os.path.join(tmp, "x.h5")
    ckpt_json(None, "export", root, out, "--step", 99, rc=1)
    check(not os.path.exists(out), "failed export left a file")
    expect_rc(ckpt("export", root, "--step", SEED, out), 0)  # the order
    r = expect_rc(ckpt("export", root, out), 3)
    check("--force" in r.err, "existing output", r)
    expect_rc(ckpt("export", root, out, "--force", "--codec", "zstd"), 0)
    expect_rc(ckpt("export", root, os.path.join(tmp, "no", "such", "dir.h5")), 3)
    check(not [f for f in os.listdir(tmp) if ".tmp-" in f], "temporary file left")
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    expect_rc(ckpt("export", empty, os.path.join(tmp, "e.h5")), 1)
    expect_rc(ckpt("export", root, out, "--level", "12", "--codec", "deflate"), 2)
    # a chunk that fails verification: exit 1, nothing written
    shard = sorted(f for f in os.listdir(os.path.join(root, "step-%012d" % SEED))
                   if f != "manifest.json")[0]
    path = os.path.join(root, "step-%012d" % SEED, shard)
    flip_byte(path)
    bad = os.path.join(tmp, "bad.h5")
    r = expect_rc(ckpt("export", root, bad, "--step", SEED), 1)
    check(shard in r.err and not os.path.exists(bad), "corrupt export", r)
    check(not [f for f in os.listdir(tmp) if ".tmp-" in f], "temporary file left")



def test_export_onto_a_full_disk_fails_cleanly(tmp):
    """A disk that fills while exporting: exit 3 naming the cause, no
    temporary file left, for every codec (a compressed one crashed in
    HDF5's teardown at exit, SIGSEGV, after reporting the error)."""
    need_hdf5()
    need_h5py()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a file system needs root")
    src = os.path.join(tmp, "src.h5")
    with h5py.File(src, "w") as f:
        f.attrs["step"] = 1
        f["a"] = np.random.default_rng(3).random(1 << 20).astype(np.float32)
    root = os.path.join(tmp, "root")
    expect_rc(ckpt("import", src, root), 0)
    mnt = os.path.join(tmp, "small")
    os.mkdir(mnt)
    r = run("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt)
    if r.rc != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % r.err.strip())
    try:
        for codec in ("none", "deflate", "zstd"):
            out = os.path.join(mnt, codec + ".h5")
            r = expect_rc(ckpt("export", root, out, "--codec", codec), 3)
            check("No space left on device" in r.err, codec, r)
            check(os.listdir(mnt) == [], "%s: left %s" % (codec, os.listdir(mnt)))
    finally:
        run("umount", "-l", mnt)


def test_export_names_tensors_hdf5_cannot_hold(tmp):
    """Tensor names are HDF5 paths: "a" beside "a/b" (in either order) and
    a ".." component are refused naming the tensor and why, not with
    HDF5's "name already exists" or "message type not found"; nothing is
    left behind."""
    need_hdf5()
    cases = [(["a/b", "a"], "tensor 'a' .*'a' is already taken"),
             (["a", "a/b"], "tensor 'a/b' .*'a' is already a dataset"),
             (["x/../../etc"], "'x/../../etc' cannot be an HDF5 dataset path")]
    for i, (tensor_names, words) in enumerate(cases):
        root = os.path.join(tmp, "names%d" % i)
        save_names(root, tensor_names)
        out = os.path.join(tmp, "names%d.h5" % i)
        r = ckpt("export", root, out)
        check(r.rc != 0 and re.search(words, r.err), "export of %s" % tensor_names, r)
        check("HDF5-DIAG" not in r.err and not os.path.exists(out), "HDF5 noise or file", r)
    check(not [f for f in os.listdir(tmp) if ".tmp-" in f], "temporary file left")
    # a group shared by several tensors is fine
    root = os.path.join(tmp, "group")
    save_names(root, ["g/x", "g/y"])
    expect_rc(ckpt("export", root, os.path.join(tmp, "group.h5")), 0)


def save_names(root, names):
    """Save step 1 of small arrays under `names` from Python, in a child
    (the sanitizer build's libckpt loads only with its runtimes preloaded:
    clitest.python_env)."""
    code = ("import sys, numpy as np, libckpt\n"
            "with libckpt.Store(sys.argv[1]) as s:\n"
            "    s.save(1, {n: np.ones(2) for n in sys.argv[2:]}).wait()\n")
    r = run(sys.executable, "-c", code, root, *names, env=python_env())
    check(r.rc == 0, "save from Python", r)


def test_export_is_as_private_as_the_checkpoint(tmp):
    """The export holds every tensor and the environment record (the
    command line too): created 0640 at most, like the step's own files,
    whatever the umask; a stricter umask stays in force."""
    need_hdf5()
    root = source_root(tmp)
    out = os.path.join(tmp, "open.h5")
    expect_rc(run("sh", "-c", 'umask 0 && exec "$@"', "sh", CKPT, "export", root, out), 0)
    mode = os.stat(out).st_mode & 0o777
    check(mode & 0o027 == 0, "export readable or writable by others: %o" % mode)
    strict = os.path.join(tmp, "strict.h5")
    expect_rc(run("sh", "-c", 'umask 077 && exec "$@"', "sh", CKPT, "export", root, strict), 0)
    check(os.stat(strict).st_mode & 0o777 == 0o600, "umask 077 not kept")
    # a root whose group is shared keeps its files 0600: so does the export
    for d, _, files in os.walk(root):
        for f in files:
            os.chmod(os.path.join(d, f), 0o600)
    private = os.path.join(tmp, "private.h5")
    expect_rc(run("sh", "-c", 'umask 0 && exec "$@"', "sh", CKPT, "export", root, private), 0)
    mode = os.stat(private).st_mode & 0o777
    check(mode == 0o600, "export of 0600 checkpoint files made %o" % mode)


def test_import_refuses_a_fifo_without_blocking(tmp):
    """A FIFO planted where the HDF5 file is expected: refused at once
    (HDF5 would block opening it), naming what it is."""
    need_hdf5()
    fifo = os.path.join(tmp, "in.h5")
    os.mkfifo(fifo)
    r = expect_rc(ckpt("import", fifo, os.path.join(tmp, "dest"), "--step", 1, timeout=20), 3)
    check("not a regular file" in r.err and "FIFO" in r.err, "FIFO refusal", r)
    check(not os.path.exists(os.path.join(tmp, "dest")), "a root was made")
    r = expect_rc(ckpt("import", tmp, os.path.join(tmp, "dest"), "--step", 1), 3)
    check("directory" in r.err, "directory refusal", r)


def test_export_never_writes_through_a_planted_link(tmp):
    """The temporary file export writes (OUT.tmp-PID-N) is created
    exclusively: a link planted at that name by another user, pointing at a
    file of the victim's, is neither followed nor truncated.  The child's
    pid is known before it runs `ckpt export`, so the link is planted at
    exactly the name it will try first."""
    need_hdf5()
    root = source_root(tmp)
    out = os.path.join(tmp, "x.h5")
    victim = os.path.join(tmp, "victim.txt")
    with open(victim, "w") as f:
        f.write("precious\n")
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child waits until the link is in place, then runs export
        os.close(go_w)
        os.read(go_r, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(CKPT, [CKPT, "export", root, out])
        os._exit(127)
    os.close(go_r)
    planted = "%s.tmp-%d-0" % (out, pid)
    os.symlink(victim, planted)
    os.write(go_w, b"x")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          "export with a planted link at its first temporary name: status %d" % status)
    with open(victim) as f:
        check(f.read() == "precious\n", "the link's target was written through")
    check(os.path.islink(planted), "the planted link was replaced or removed")
    check(os.path.isfile(out) and not os.path.islink(out), "no export written")


def test_export_into_a_directory_with_a_default_acl_stays_private(tmp):
    """A directory's default POSIX ACL replaces the umask: an export
    there was created 0666 (anyone could read every tensor and the
    command line, and write the file). It keeps at most the manifest's
    mode (0640), whatever the directory passes down."""
    import struct
    need_hdf5()
    root = source_root(tmp)
    where = os.path.join(tmp, "shared")
    os.mkdir(where)
    entries = [(0x01, 7), (0x04, 7), (0x10, 7), (0x20, 7)]  # u::rwx g::rwx m::rwx o::rwx
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, 0xffffffff)
                                          for t, p in entries)
    try:
        os.setxattr(where, "system.posix_acl_default", acl)
    except OSError:
        pytest.skip("this file system keeps no POSIX ACLs")
    out = os.path.join(where, "x.h5")
    expect_rc(ckpt("export", root, out), 0)
    mode = os.stat(out).st_mode & 0o777
    check(mode & ~0o640 == 0, "export mode %04o under a default ACL" % mode)


def test_export_of_tensors_larger_than_a_slab(tmp):
    """A tensor is read and written a slab of rows (64 MiB) at a time: with
    every codec, tensors of 160 MiB (rows that divide into neither slabs
    nor chunks) and 80 MiB (one dimension) read back with the checkpoint's
    values, and the export holds far less memory than the larger tensor
    (it read each tensor whole into memory before)."""
    need_hdf5()
    need_h5py()
    root = os.path.join(tmp, "big")
    code = ("import sys, numpy as np, libckpt\n"
            "with libckpt.Store(sys.argv[1]) as s:\n"
            "    s.save(1, {'w': np.arange(1000 * 41943, dtype=np.int32).reshape(1000, 41943),\n"
            "               'flat': np.arange(20000000, dtype=np.int32)[::-1].copy(),\n"
            "               'small': np.arange(7, dtype=np.float64)}).wait()\n")
    r = run(sys.executable, "-c", code, root, env=python_env())
    check(r.rc == 0, "save from Python", r)
    big = 1000 * 41943 * 4
    asan = "libasan" in run("ldd", CKPT).out  # its shadow memory is no measure
    peak = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:])\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
            "sys.exit(r.returncode)\n")
    for codec, extra in [("none", []), ("deflate", ["--level", "1"]),
                         ("zstd", ["--level", "1"])]:
        out = os.path.join(tmp, "big-%s.h5" % codec)
        r = run(sys.executable, "-c", peak, CKPT, "export", root, out, "--codec", codec,
                *extra, timeout=300)
        check(r.rc == 0, "export --codec %s" % codec, r)
        rss = int(r.out.strip().splitlines()[-1])
        if not asan:
            check(rss < big * 3 // 4, "export --codec %s took %d MB for a %d MB tensor"
                  % (codec, rss >> 20, big >> 20))
        with h5py.File(out, "r") as f:
            w = f["w"][()]
            check(w.shape == (1000, 41943) and w.dtype == np.int32, "%s: w %s" % (codec, w.shape))
            check(np.array_equal(w.ravel(), np.arange(1000 * 41943, dtype=np.int32)),
                  "%s: w differs at %s" % (codec, np.flatnonzero(
                      w.ravel() != np.arange(1000 * 41943, dtype=np.int32))[:5]))
            del w
            check(np.array_equal(f["flat"][()], np.arange(20000000, dtype=np.int32)[::-1]),
                  "%s: flat differs" % codec)
            check(f["small"][()].tolist() == list(range(7)), "%s: small" % codec)
        os.unlink(out)


# A file of another program's making, with h5py (run without the h5zstd
# plugin, so the filter records nothing of its own): zstd chunks whose
# frames decode to fewer or more bytes than a chunk holds.
_ZSTD_FRAMES = r'''
import ctypes, sys
import h5py, numpy as np
z = ctypes.CDLL("libzstd.so.1")
z.ZSTD_compress.restype = ctypes.c_size_t
z.ZSTD_compress.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                            ctypes.c_size_t, ctypes.c_int]
def zc(data):
    out = ctypes.create_string_buffer(len(data) + 1024)
    return out.raw[:z.ZSTD_compress(out, len(out), data, len(data), 3)]
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["step"] = 1
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((1000,))
    dcpl.set_filter(32015, h5py.h5z.FLAG_OPTIONAL, (3,))
    d = h5py.h5d.create(f.id, b"x", h5py.h5t.STD_I32LE, h5py.h5s.create_simple((1000,)),
                        dcpl=dcpl)
    d.write_direct_chunk((0,), zc(sys.argv[2].encode() * int(sys.argv[3])), filter_mask=0)
'''


def test_import_refuses_what_it_would_misread(tmp):
    """Files that HDF5 would read into wrong values, or past a buffer, are
    refused with a reason, and nothing is saved: a 'step' attribute that
    is an array (it was read over a stack variable) or above the largest
    step (HDF5 clamped it); a 16-bit float of another layout than IEEE half
    or bfloat16 (its bits were copied as if it were one); a compound of two
    floats not named r and i (read as complex); a zstd chunk whose frame
    decodes to less than the chunk (HDF5 handed out heap bytes past it) or
    more.  A compound of i and r, in that order, is complex all the same."""
    need_hdf5()
    need_h5py()
    dest = os.path.join(tmp, "dest")

    def refused(path, rc, *words):
        r = expect_rc(ckpt("import", path, dest), rc)
        for w in words:
            check(w in r.err, "%s: the message lacks %r" % (path, w), r)
        check(not os.path.exists(dest) or not [e for e in os.listdir(dest)
                                                if e.startswith("step-")],
              "%s: a step was saved" % path)

    steparr = os.path.join(tmp, "steparr.h5")
    with h5py.File(steparr, "w") as f:
        f.attrs["step"] = np.arange(1, 5001)
        f["x"] = np.arange(4, dtype=np.int32)
    refused(steparr, 2, "'step' attribute holding one integer", "--step")
    huge = os.path.join(tmp, "huge.h5")
    with h5py.File(huge, "w") as f:
        f.attrs["step"] = np.uint64(2**64 - 1)
        f["x"] = np.arange(4, dtype=np.int32)
    refused(huge, 2, "'step' attribute")

    # an opaque element adds a dimension (its bytes): 16 of HDF5's make 17
    deep = os.path.join(tmp, "deep_opaque.h5")
    with h5py.File(deep, "w") as f:
        f.attrs["step"] = 1
        f.create_dataset("blob", data=np.frombuffer(b"ab", dtype="V2").reshape((1,) * 16))
    refused(deep, 3, "blob", "17 dimensions with the opaque element's bytes, more than 16")

    odd = os.path.join(tmp, "odd.h5")
    with h5py.File(odd, "w") as f:
        f.attrs["step"] = 1
        t = h5py.h5t.IEEE_F32LE.copy()
        t.set_fields(15, 10, 5, 0, 10)
        t.set_size(2)
        t.set_ebias(7)
        d = h5py.h5d.create(f.id, b"odd_half", t, h5py.h5s.create_simple((4,)))
        d.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array([1, 2, 0.5, -3], dtype=np.float32))
    refused(odd, 3, "odd_half", "neither IEEE half nor bfloat16", "bias 7")

    xy = os.path.join(tmp, "xy.h5")
    with h5py.File(xy, "w") as f:
        f.attrs["step"] = 1
        f["p"] = np.array([(1.0, 2.0)], dtype=[("x", "<f4"), ("y", "<f4")])
    refused(xy, 3, "'p'", "not named")
    ir = os.path.join(tmp, "ir.h5")
    with h5py.File(ir, "w") as f:
        f.attrs["step"] = 1
        f["c"] = np.array([(1.0, 2.0), (3.0, 4.0)], dtype=[("i", "<f4"), ("r", "<f4")])
    expect_rc(ckpt("import", ir, dest), 0)
    _, got = restored_bytes(dest, 1, "c", tmp)
    check(got == np.array([2 + 1j, 4 + 3j], np.complex64).tobytes(), "i and r: %r" % got)
    shutil.rmtree(dest)

    # metadata text that is not UTF-8 (Latin-1): kept, escaped, and said
    latin = os.path.join(tmp, "latin.h5")
    with h5py.File(latin, "w") as f:
        f.attrs["step"] = 1
        f["x"] = np.arange(2, dtype=np.int32)
        tid = h5py.h5t.C_S1.copy()
        tid.set_size(8)
        a = h5py.h5a.create(f.id, b"metadata", tid, h5py.h5s.create(h5py.h5s.SCALAR))
        a.write(np.array(b"caf\xe9 ok", dtype="S8"))
    r = expect_rc(ckpt("import", latin, dest), 0)
    check("not UTF-8" in r.err, "no word of the metadata's bytes", r)
    _, doc = ckpt_json("inspect", "inspect", dest, rc=0)
    check(doc["metadata"] == "caf\\xe9 ok", "metadata %r" % doc.get("metadata"))
    shutil.rmtree(dest)

    # a filter this HDF5 lacks (LZF is h5py's own): named, not HDF5's
    # failed plugin search
    lzf = os.path.join(tmp, "lzf.h5")
    with h5py.File(lzf, "w") as f:
        f.attrs["step"] = 1
        f.create_dataset("z", data=np.arange(100, dtype=np.int32), compression="lzf")
    refused(lzf, 3, "dataset 'z' needs HDF5 filter 32000", "HDF5_PLUGIN_PATH")

    no_plugin = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    for name, byte, count in (("short", "A", 8), ("long", "B", 400000)):
        path = os.path.join(tmp, name + ".h5")
        r = subprocess.run([sys.executable, "-c", _ZSTD_FRAMES, path, byte, str(count)],
                           capture_output=True, text=True, env=no_plugin)
        check(r.returncode == 0, "making %s: %s" % (path, r.stderr))
        refused(path, 3, "dataset 'x'", "must decode to the chunk's 4000 bytes")

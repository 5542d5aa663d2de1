"""Shared pieces of the CLI test drivers: running commands, fixtures, the
JSON schemas from docs/CLI.md and a small JSON Schema checker (the subset
the docs use), and a runner that ends with the 'N passed, N failed' line."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

CKPT = os.environ.get("CKPT", "ckpt")
TESTTOOL = os.environ.get("CKPT_TESTTOOL", "ckpt_testtool")
TOY_TRAIN = os.environ.get("TOY_TRAIN", "toy_train")
SOURCE_ROOT = os.environ.get(
    "CKPT_SOURCE_ROOT",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
H5ZSTD_DIR = os.environ.get("CKPT_H5ZSTD_DIR", "")

SKIP = 77


class Skip(Exception):
    pass


class Result:
    def __init__(self, argv, proc):
        self.argv = argv
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self):
        try:
            return json.loads(self.out)
        except ValueError as e:
            raise AssertionError("stdout of %s is not one JSON document (%s):\n%s"
                                 % (" ".join(self.argv), e, self.out))

    def __repr__(self):
        return "rc=%d\nstdout:\n%s\nstderr:\n%s" % (self.rc, self.out, self.err)


def run(*args, env=None, timeout=120, input=None):
    argv = [str(a) for a in args]
    e = dict(os.environ)
    e.pop("CKPT_NO_PROGRESS", None)
    if env:
        e.update(env)
    p = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=timeout,
                       input=input)
    return Result(argv, p)


def ckpt(*args, **kw):
    return run(CKPT, *args, **kw)


def check(cond, msg, res=None):
    if not cond:
        raise AssertionError(msg + ("\n" + repr(res) if res is not None else ""))


def expect_rc(res, rc):
    check(res.rc == rc, "%s: expected exit %d, got %d" % (" ".join(res.argv), rc, res.rc), res)
    return res


# ------------------------------------------------------------- fixtures

def make_step(root, step, seed=None, chunk=4096):
    r = run(TESTTOOL, "make", root, step, seed if seed is not None else step, chunk)
    check(r.rc == 0, "ckpt_testtool make failed", r)


def names():
    """[(name, dtype, shape)] of the tensors ckpt_testtool writes."""
    r = run(TESTTOOL, "names")
    check(r.rc == 0, "ckpt_testtool names failed", r)
    out = []
    for line in r.out.splitlines():
        n, dt, sh = line.split(" ")
        out.append((n, dt, [] if sh == "-" else [int(x) for x in sh.split(",")]))
    return out


def expected_bytes(seed, name, tmp):
    path = os.path.join(tmp, "expect.bin")
    r = run(TESTTOOL, "bytes", seed, name, path)
    check(r.rc == 0, "ckpt_testtool bytes failed", r)
    with open(path, "rb") as f:
        return f.read()


def restored_bytes(root, step, name, tmp):
    path = os.path.join(tmp, "restored.bin")
    r = run(TESTTOOL, "dump", root, step, name, path)
    check(r.rc == 0, "ckpt_testtool dump %s failed" % name, r)
    with open(path, "rb") as f:
        return r.out.strip(), f.read()


def step_dir(root, step):
    return os.path.join(root, "step-%012d" % step)


def data_files(root, step):
    d = step_dir(root, step)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f != "manifest.json")


def flip_byte(path, offset=None):
    size = os.path.getsize(path)
    if offset is None:
        offset = size // 3
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    return offset


# -------------------------------------------------------------- schemas

_SCHEMAS = None


def schemas():
    """{name: schema} from the '<!-- schema: NAME -->' blocks of docs/CLI.md."""
    global _SCHEMAS
    if _SCHEMAS is None:
        with open(os.path.join(SOURCE_ROOT, "docs", "CLI.md"), encoding="utf-8") as f:
            text = f.read()
        found = re.findall(r"<!-- schema: (\S+) -->\s*```json\n(.*?)\n```", text, re.S)
        check(found, "docs/CLI.md has no schema blocks")
        _SCHEMAS = {name: json.loads(body) for name, body in found}
    return _SCHEMAS


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _validate(v, s, defs, path, errors):
    if "$ref" in s:
        m = re.match(r"#/\$defs/(\w+)$", s["$ref"])
        if not m or m.group(1) not in defs:
            errors.append("%s: unknown $ref %s" % (path, s["$ref"]))
            return
        s = defs[m.group(1)]
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_TYPES[t](v) for t in types):
            errors.append("%s: %r is not of type %s" % (path, v, types))
            return
    if "enum" in s and v not in s["enum"]:
        errors.append("%s: %r not in %s" % (path, v, s["enum"]))
    if "minimum" in s and _TYPES["number"](v) and v < s["minimum"]:
        errors.append("%s: %r < minimum %r" % (path, v, s["minimum"]))
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k in s.get("required", []):
            if k not in v:
                errors.append("%s: missing required %r" % (path, k))
        for k, x in v.items():
            if k in props:
                _validate(x, props[k], defs, path + "." + k, errors)
            elif s.get("additionalProperties") is False:
                errors.append("%s: unexpected property %r" % (path, k))
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            _validate(x, s["items"], defs, "%s[%d]" % (path, i), errors)


def validate(doc, name):
    """Check `doc` against schema `name` of docs/CLI.md (and with the
    jsonschema package too, when it is installed)."""
    sc = schemas()
    defs = sc.get("$defs", {})
    errors = []
    _validate(doc, sc[name], defs, "$", errors)
    check(not errors, "JSON does not match schema %r:\n  %s\n%s"
          % (name, "\n  ".join(errors), json.dumps(doc, indent=1)[:3000]))
    try:
        import jsonschema
    except ImportError:
        return doc
    full = dict(sc[name])
    full["$defs"] = defs
    jsonschema.validate(doc, full)
    return doc


def ckpt_json(schema, *args, rc=None, **kw):
    """Run `ckpt --json ARGS`, check the exit code, parse stdout as one JSON
    document and validate it (against 'error' when it is an error)."""
    r = ckpt("--json", *args, **kw)
    if rc is not None:
        expect_rc(r, rc)
    doc = r.json()
    if isinstance(doc, dict) and "error" in doc:
        validate(doc, "error")
        check(doc["error"]["exit_code"] == r.rc, "error.exit_code differs from the exit code",
              r)
    else:
        validate(doc, schema)
    return r, doc


# --------------------------------------------------------------- runner

_TESTS = []


def test(fn):
    _TESTS.append(fn)
    return fn


def main(name):
    only = sys.argv[1:]
    passed = failed = skipped = 0
    for fn in _TESTS:
        if only and fn.__name__ not in only:
            continue
        tmp = tempfile.mkdtemp(prefix="ckpt-%s-" % fn.__name__)
        try:
            fn(tmp)
        except Skip as e:
            skipped += 1
            print("SKIP %s: %s" % (fn.__name__, e))
        except Exception:
            failed += 1
            print("FAIL %s" % fn.__name__)
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print("ok   %s" % fn.__name__)
        finally:
            subprocess.run(["chmod", "-R", "u+w", tmp], capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush()
    print("%s: %d passed, %d failed, %d skipped" % (name, passed, failed, skipped))
    if failed:
        return 1
    if passed == 0 and skipped:
        return SKIP
    return 0

"""Shared pieces of the CLI tests (pytest, tests/cli/test_*.py): running
commands, checkpoint fixtures made by ckpt_testtool, and the JSON schemas of
docs/CLI.md, checked with the jsonschema package (draft 2020-12)."""

import json
import os
import re
import subprocess

import jsonschema

CKPT = os.environ.get("CKPT", "ckpt")
TESTTOOL = os.environ.get("CKPT_TESTTOOL", "ckpt_testtool")
TOY_TRAIN = os.environ.get("TOY_TRAIN", "toy_train")
SOURCE_ROOT = os.environ.get(
    "CKPT_SOURCE_ROOT",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
H5ZSTD_DIR = os.environ.get("CKPT_H5ZSTD_DIR", "")


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


def run(*args, env=None, timeout=120, input=None, cwd=None):
    argv = [str(a) for a in args]
    e = dict(os.environ)
    e.pop("CKPT_NO_PROGRESS", None)
    if env:
        e.update(env)
    p = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=timeout,
                       input=input, cwd=cwd)
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


# The schemas say draft 2020-12 (docs/CLI.md, "JSON output").  One deliberate
# tightening of the standard: there "integer" also admits a number with a
# zero fraction (1.0); the CLI writes integers as integers, so here an
# integer is a JSON number without a fraction or exponent (a Python int).
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)))

_VALIDATORS = {}


def full_schema(name):
    """Schema `name` of docs/CLI.md as one document: the shared $defs added
    so that its "#/$defs/..." references resolve."""
    sc = schemas()
    check(name in sc and name != "$defs", "docs/CLI.md has no schema %r" % name)
    full = dict(sc[name])
    full["$defs"] = sc.get("$defs", {})
    return full


def validator(name):
    if name not in _VALIDATORS:
        full = full_schema(name)
        jsonschema.Draft202012Validator.check_schema(full)
        _VALIDATORS[name] = Validator(full)
    return _VALIDATORS[name]


def schema_errors(doc, name):
    """Every way `doc` fails schema `name`, as 'path: message' lines."""
    errors = sorted(validator(name).iter_errors(doc),
                    key=lambda e: [str(p) for p in e.absolute_path])
    return ["%s: %s" % (e.json_path, e.message) for e in errors]


def validate(doc, name):
    """Check `doc` against schema `name` of docs/CLI.md."""
    errors = schema_errors(doc, name)
    check(not errors, "JSON does not match schema %r:\n  %s\n%s"
          % (name, "\n  ".join(errors), json.dumps(doc, indent=1)[:3000]))
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


def python_env():
    """An instrumented libckpt (the sanitizer build) loads into the plain
    interpreter only with the sanitizer runtimes preloaded, as
    scripts/test.sh does for the python suite; no leak checking there
    (CPython keeps memory until exit)."""
    lib = os.environ.get("LIBCKPT_LIBRARY", "")
    try:
        linked = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    except OSError:
        return None
    if "libasan" not in linked:
        return None
    rt = [subprocess.run(["gcc", "-print-file-name=" + n], capture_output=True,
                         text=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
    return {"LD_PRELOAD": " ".join(rt), "ASAN_OPTIONS": "detect_leaks=0"}

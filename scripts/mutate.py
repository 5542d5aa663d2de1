#!/usr/bin/env python3
"""Mutation testing: does the test suite notice realistic bugs?

Plants each bug of MUTANTS (below) alone in a copy of the working tree,
builds it, runs the test suites that guard lib/ and reports which bugs the
suite killed (some test failed) and which survived.  The working tree is
never touched.  Exit status 0 when at least --min percent are killed.

    python3 scripts/mutate.py                 # all mutants, ~30 minutes on 2 cores
    python3 scripts/mutate.py --only fsync    # those whose name contains "fsync"
    python3 scripts/mutate.py --only lock,trust
    python3 scripts/mutate.py --list

Each mutant is a bug someone could write: a dropped fsync, an off-by-one
in a bound, a check left out, a link followed.  A mutant whose text no
longer matches the source is reported as stale (update it with the code).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

# (name, file, the exact text, what it becomes)
MUTANTS = [
    ("fsync-shard-dropped", "lib/pipeline/shardfile.c",
     "if (do_fsync && (rc = fsio_fsync(w->fs, w->fd)))",
     "if (0 && (rc = fsio_fsync(w->fs, w->fd)))"),
    ("fsync-manifest-dropped", "lib/pipeline/persist.c",
     "if (!rc && st->lay.fsync && (e = fsio_fsync(&st->lay.fs, fd)))",
     "if (0 && (e = fsio_fsync(&st->lay.fs, fd)))"),
    ("fsync-tempdir-dropped", "lib/pipeline/persist.c",
     "if (!rc && st->lay.fsync && (e = fsio_fsync_path(&st->lay.fs, s->tmp)))",
     "if (0 && (e = fsio_fsync_path(&st->lay.fs, s->tmp)))"),
    ("fsync-root-after-commit-dropped", "lib/io/layout.c",
     "if (l->fsync && (rc = fsio_fsync_path(&l->fs, l->root)))\n        return ckpt_seterr_errno(-rc, \"cannot fsync the checkpoint root",
     "if (0 && (rc = fsio_fsync_path(&l->fs, l->root)))\n        return ckpt_seterr_errno(-rc, \"cannot fsync the checkpoint root"),
    ("verify-after-save-skipped", "lib/pipeline/persist.c",
     "if (st->opts.verify_after_save == CKPT_VERIFY_NONE)\n        return CKPT_OK;",
     "if (1)\n        return CKPT_OK;"),
    ("short-write-taken-as-complete", "lib/io/fsio.c",
     "        done += (size_t)r;\n    }\n    return 0;",
     "        done += (size_t)r;\n        break;\n    }\n    return 0;"),
    ("replaced-step-deleted-at-open", "lib/io/layout.c",
     "if (fsio_kind(&l->fs, to, 0, &kind) == -ENOENT) {", "if (0) {"),
    ("replaced-step-not-put-back-on-failure", "lib/io/layout.c",
     "                else\n                    fsio_rename(&l->fs, aside, final);",
     "                else\n                    (void)0;"),
    ("complex64-shuffled-by-8", "lib/format/codec.c",
     "case CKPT_C64: return 4;", "case CKPT_C64: return 8;"),
    ("frame-may-start-in-header", "lib/format/shard.c",
     "e->file_offset < SHARD_HEADER_SIZE", "e->file_offset < SHARD_HEADER_SIZE - 1"),
    ("frame-may-run-into-index", "lib/format/shard.c",
     "fend > index_offset)", "fend > index_offset + 1)"),
    ("compress-bound-off-by-one", "lib/format/codec.c",
     "m->stored_len > codec_stored_bound(m->codec, m->raw_len)",
     "m->stored_len > codec_stored_bound(m->codec, m->raw_len) + 1"),
    ("frames-may-alias", "lib/format/shard.c",
     "    return check_no_overlap(name, ix);", "    (void)check_no_overlap;\n    return CKPT_OK;"),
    ("non-canonical-step-names", "lib/io/layout.c",
     "    if (strcmp(canon, name) != 0)\n        return 0;",
     "    if (0)\n        return 0;"),
    ("link-listed-as-step", "lib/io/layout.c",
     "entry_kind(l, names[i]) == FSIO_KIND_DIR)", "entry_kind(l, names[i]) != FSIO_KIND_NONE)"),
    ("remove-tree-follows-links", "lib/io/fsio.c",
     "    int rc = fsio_kind(fs, dir, 0, &kind);\n    if (rc)\n        return rc == -ENOENT ? 0 : rc;",
     "    int rc = fsio_kind(fs, dir, 1, &kind);\n    if (rc)\n        return rc == -ENOENT ? 0 : rc;"),
    ("fifo-opened-blocking", "lib/io/fsio.c",
     "O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC", "O_RDONLY | O_NOFOLLOW | O_CLOEXEC"),
    ("unreadable-step-not-skipped", "lib/pipeline/reader.c",
     "rc == CKPT_ENOTFOUND || rc == CKPT_EACCES;", "rc == CKPT_ENOTFOUND;"),
    ("manifest-step-not-checked", "lib/pipeline/reader.c",
     "if (!rc && ck->m.step != step)", "if (0 && ck->m.step != step)"),
    ("removed-lock-not-noticed", "lib/io/layout.c",
     "    else if (rc || !same)", "    else if (0)"),
    ("lock-file-readable-by-all", "lib/io/layout.c",
     "O_RDWR | O_CREAT | O_NOFOLLOW, 0600)", "O_RDWR | O_CREAT | O_NOFOLLOW, 0644)"),
    ("retention-counts-damaged-steps", "lib/pipeline/retention.c",
     "if (kept < keep_last && c == 1)", "if (kept < keep_last && c >= 0)"),
    ("retention-retires-steps-above", "lib/pipeline/retention.c",
     "if (just >= 0 && s > just) {", "if (0) {"),
    ("lower-step-accepted", "lib/pipeline/retention.c",
     "    if (newest <= step)\n        return CKPT_OK;", "    if (1)\n        return CKPT_OK;"),
    ("world-writable-accepted", "lib/io/trust.c",
     "    if (in->mode & 0002)", "    if (0)"),
    ("foreign-owner-accepted", "lib/io/trust.c",
     "if (in->uid != t->self && in->uid != t->root_uid && in->uid != 0 && !t->group) {",
     "if (0) {"),
    ("foreign-root-written", "lib/io/trust.c",
     "if (writing && root->uid != t->self && !t->group) {", "if (0) {"),
    ("no-retry-when-replaced", "lib/pipeline/reader.c",
     "#define REPLACED_RETRIES 5", "#define REPLACED_RETRIES 0"),
    ("writer-skips-reader-limits", "lib/pipeline/persist.c",
     "    if (!rc)\n        rc = check_readable(s, text, len);", "    (void)check_readable;"),
    ("command-line-always-recorded", "lib/pipeline/env.c",
     "with_command_line ? command_line() : json_string(\"(not recorded)\")", "command_line()"),
    ("tensor-chunk-count-not-checked", "lib/pipeline/reader.c",
     "if ((t->bytes > 0 && n == 0) || n != t->chunks || stored != t->stored_bytes)",
     "if (t->bytes > 0 && n == 0)"),
    ("temp-dir-world-readable", "lib/io/layout.c",
     "int rc = fsio_mkdir(&l->fs, p, l->dir_mode);", "int rc = fsio_mkdir(&l->fs, p, 0755);"),
]

SUITES = ["format", "core", "integrity", "cli"]


def copy_tree(src, dst):
    """The working tree as it is (tracked and untracked, not ignored)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=src,
                           check=True, capture_output=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        rel = f.decode()
        s, d = os.path.join(src, rel), os.path.join(dst, rel)
        if not os.path.isfile(s):
            continue
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(s, d)


def run(cmd, cwd, timeout):
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return -1, "timed out"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="run the mutants whose name contains this "
                    "(several: separated by commas)")
    ap.add_argument("--list", action="store_true", help="list the mutants")
    ap.add_argument("--min", type=float, default=90.0, help="percent that must be killed")
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree")
    args = ap.parse_args()
    wanted = args.only.split(",") if args.only else []
    chosen = [m for m in MUTANTS if not wanted or any(w in m[0] for w in wanted)]
    if args.list:
        for name, path, _, _ in chosen:
            print("%-40s %s" % (name, path))
        return 0
    src = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                         capture_output=True, text=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix="ckpt-mutate-")
    tree, build = os.path.join(scratch, "src"), os.path.join(scratch, "build")
    copy_tree(src, tree)
    shared = os.path.join(os.path.dirname(src), "shared")
    if os.path.isdir(shared):  # a sibling the build may read
        shutil.copytree(shared, os.path.join(scratch, "shared"))
    rc, out = run(["meson", "setup", build, tree], tree, 600)
    if rc != 0:
        print(out)
        return 2
    rc, out = run(["ninja", "-C", build], tree, 1800)
    if rc != 0:
        print(out[-4000:])
        return 2
    test = ["meson", "test", "-C", build, "--timeout-multiplier", "0.25"]
    for s in SUITES:
        test += ["--suite", s]
    rc, out = run(test, tree, 3600)
    if rc != 0:
        print("the unmutated tree fails its tests:\n" + out[-4000:])
        return 2
    killed, survived, stale = [], [], []
    for name, path, old, new in chosen:
        f = os.path.join(tree, path)
        with open(f) as fh:
            text = fh.read()
        if text.count(old) != 1:
            stale.append(name)
            print("%-40s STALE (text not found once in %s)" % (name, path), flush=True)
            continue
        t0 = time.time()
        with open(f, "w") as fh:
            fh.write(text.replace(old, new))
        try:
            rc, out = run(["ninja", "-C", build], tree, 1800)
            if rc != 0:
                stale.append(name)
                print("%-40s STALE (does not build)" % name, flush=True)
                continue
            rc, out = run(test, tree, 3600)
            dead = rc != 0
            (killed if dead else survived).append(name)
            failing = [l.split()[3] for l in out.splitlines()
                       if " FAIL " in l or " TIMEOUT " in l][:3]
            print("%-40s %s %5.0fs %s" % (name, "killed  " if dead else "SURVIVED",
                                          time.time() - t0, " ".join(failing)), flush=True)
        finally:
            with open(f, "w") as fh:
                fh.write(text)
    run(["ninja", "-C", build], tree, 1800)
    total = len(killed) + len(survived)
    pct = 100.0 * len(killed) / total if total else 0.0
    print("\n%d of %d mutants killed (%.0f%%); %d stale" % (len(killed), total, pct,
                                                             len(stale)))
    if survived:
        print("survived: " + ", ".join(survived))
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if total and pct >= args.min and not stale else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Kill -9 a PyTorch training run (train_torch.py) part-way, restart it, and
# show that its loss curve and final parameters are identical to those of a
# run that was never interrupted.
#
#   examples/python/demo.sh [BUILD_DIR]      (default: build)
#
# Uses $LIBCKPT_LIBRARY if set, else BUILD_DIR/lib/libckpt.so, else the
# installed library; $PYTHON if set, else /usr/bin/python3 (Debian's, with
# python3-torch).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${1:-$top/build}
py=${PYTHON:-/usr/bin/python3}
# The binding from this tree goes with a library from this tree (or one
# named by LIBCKPT_LIBRARY); without either, the installed package (meson
# install or pip), which finds its own library: the tree's copy of the
# package would hide it and find none.
if [ -z "${LIBCKPT_LIBRARY:-}" ] && [ -e "$build/lib/libckpt.so" ]; then
  export LIBCKPT_LIBRARY="$build/lib/libckpt.so"
fi
if [ -n "${LIBCKPT_LIBRARY:-}" ]; then
  export PYTHONPATH="$top/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -c 'import torch, numpy, libckpt' || {
  echo "demo: needs torch, numpy and libckpt for $py (see docs/PYTHON.md)" >&2
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps=300 every=20 kill_at=170
# `exec` so that the pid of a backgrounded train is python's own.
train() { exec "$py" "$here/train_torch.py" --steps "$steps" --every "$every" "$@"; }

echo "== 1. uninterrupted run ($steps steps, a checkpoint every $every)"
(train --ckpt "$work/ref-ckpt" --log "$work/ref.log")

echo "== 2. the same run, killed with SIGKILL after step ~$kill_at"
(train --ckpt "$work/ckpt" --log "$work/run.log" --step-delay 0.01) &
pid=$!
until [ -s "$work/run.log" ] && [ "$(wc -l < "$work/run.log")" -ge "$kill_at" ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "demo: the run ended before it could be killed" >&2
    exit 1
  fi
  sleep 0.02
done
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
echo "killed at step $(tail -n 1 "$work/run.log" | cut -d' ' -f1);" \
     "checkpoints on disk: $(cd "$work/ckpt" && ls -d step-* 2>/dev/null | tr '\n' ' ')"

echo "== 3. restart: resume from the newest checkpoint that verifies"
(train --ckpt "$work/ckpt" --log "$work/run.log")

echo "== 4. compare"
if cmp -s "$work/ref.log" "$work/run.log"; then
  echo "IDENTICAL: $(grep -c '^[0-9]' "$work/run.log") losses and the final" \
       "parameters ($(tail -n 1 "$work/run.log" | cut -d' ' -f2 | cut -c1-16)...)" \
       "match the uninterrupted run bit for bit"
else
  echo "DIFFERENT: the resumed run diverged from the uninterrupted one:" >&2
  diff "$work/ref.log" "$work/run.log" | head -n 20 >&2
  exit 1
fi

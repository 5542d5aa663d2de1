#!/usr/bin/env python3
"""Train a small PyTorch model with Adam on CPU, checkpointing through libckpt.

Every --every steps the whole training state is saved asynchronously in one
call, nested as PyTorch users keep it: the model's, optimizer's and LR
scheduler's state_dicts, the global and the data sampler's RNG states, the
step and the epoch (training goes on while the checkpoint is compressed and
written).  Tensors are stored under their state_dict names
(`ckpt inspect` shows model.0.weight, optim.state.0.exp_avg, ...); the
rest (hyper-parameters, the step, int keys) is kept exactly in the
checkpoint's metadata.  Started again on the same --ckpt directory, the
script loads the newest checkpoint that verifies as torch tensors and hands
each part to its load_state_dict; because everything that influences the
next step is restored and the run is deterministic, the loss curve is
identical to that of a run that was never interrupted (demo.sh shows it
after a kill -9).

The log (--log) gets one line per step, "STEP LOSS" with the loss printed
exactly (repr of the float), and a last line with a SHA-256 of the final
parameters.  On resume, lines after the restored step are dropped: they
belong to work the crash threw away.

SIGTERM or SIGUSR1 (a scheduler's preemption notice) makes the loop save at
the end of the current step, wait for the commit and exit with 75
(EX_TEMPFAIL, CKPT_EXIT_PREEMPTED in ckpt.h) so a wrapper knows to restart.
"""

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
from torch import nn

import libckpt

EXIT_PREEMPTED = 75


def build(seed=0):
    """Model, optimizer, LR schedule, data and sampler, identical in every
    run."""
    torch.manual_seed(seed)
    data_gen = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 16, generator=data_gen)
    w = torch.randn(16, 1, generator=data_gen)
    y = torch.sin(x @ w) + 0.05 * torch.randn(1024, 1, generator=data_gen)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Dropout(0.1),
                          nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)
    sampler = torch.Generator().manual_seed(42)
    return model, opt, sched, x, y, sampler


def training_state(step, epoch, model, opt, sched, sampler):
    """Everything that decides the next step, as one nested state."""
    return {"model": model.state_dict(), "optim": opt.state_dict(),
            "sched": sched.state_dict(),
            "rng": {"torch": torch.get_rng_state(),
                    "sampler": sampler.get_state()},
            "step": step, "epoch": epoch}


def resume(state, model, opt, sched, sampler):
    """Put a loaded state back; returns the step and epoch it was at."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    sched.load_state_dict(state["sched"])
    torch.set_rng_state(state["rng"]["torch"])
    sampler.set_state(state["rng"]["sampler"])
    return state["step"], state["epoch"]


def params_digest(model):
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def truncate_log(path, last_step):
    """Keep the log lines of steps up to last_step (the resumed state)."""
    keep = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if (len(parts) == 2 and line.endswith("\n")
                        and parts[0].isdigit() and int(parts[0]) <= last_step):
                    keep.append(line)
    with open(path, "w") as f:
        f.writelines(keep)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint directory")
    ap.add_argument("--log", required=True, help="loss log file")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=20,
                    help="checkpoint every N steps")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--no-fsync", action="store_true",
                    help="skip fsync (faster; not crash-safe against power loss)")
    ap.add_argument("--step-delay", type=float, default=0.0,
                    help="sleep this long per step (to have time to kill it)")
    args = ap.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # same reduction order in every run
    model, opt, sched, x, y, sampler = build()
    batches_per_epoch = x.shape[0] // args.batch

    preempted = []
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: preempted.append(signum))

    with libckpt.Store(args.ckpt, keep_last=args.keep_last,
                       fsync=not args.no_fsync) as store:
        start, epoch = 0, 0
        try:
            # The newest step that verifies (every chunk), as torch tensors;
            # read and verified once (asking latest() first would verify
            # it twice).  Damaged newer steps are passed over with a warning.
            _, state = store.load(framework="pt")
        except libckpt.NoCheckpointError:
            state = None  # a fresh start (the error names damaged steps)
        if state is not None:
            start, epoch = resume(state, model, opt, sched, sampler)
            print("resumed from step %d (epoch %d)" % (start, epoch),
                  flush=True)
        truncate_log(args.log, start)

        pending = None
        with open(args.log, "a") as log:
            for step in range(start + 1, args.steps + 1):
                idx = torch.randint(0, x.shape[0], (args.batch,),
                                    generator=sampler)
                model.train()
                loss = nn.functional.mse_loss(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                if step % batches_per_epoch == 0:
                    epoch += 1
                log.write("%d %r\n" % (step, loss.item()))
                log.flush()

                if step % args.every == 0 or preempted or step == args.steps:
                    if pending is not None:
                        pending.wait()  # raise if the previous save failed
                    # Returns once the state is copied: training goes on
                    # while the checkpoint is compressed and written.
                    pending = store.save(step, training_state(
                        step, epoch, model, opt, sched, sampler))
                if preempted:
                    pending.wait()
                    print("preempted by signal %d: saved step %d"
                          % (preempted[0], step), flush=True)
                    return EXIT_PREEMPTED
                if args.step_delay:
                    time.sleep(args.step_delay)
            if pending is not None:
                pending.wait()
                st = pending.stats
                print("last checkpoint: step %d, %d -> %d bytes, stall %.3f ms"
                      % (pending.step, st["raw_bytes"], st["stored_bytes"],
                         st["stall_s"] * 1e3), flush=True)
            log.write("params-sha256 %s\n" % params_digest(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())

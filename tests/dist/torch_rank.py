"""One rank of a torch.distributed (gloo) job using libckpt through the
Python binding; test_torch_dist.py starts several and checks them.

    torch_rank.py RANK WORLD PORT MODE ROOT ARGS...
      save STEP...        save each step (collective), restore the newest
                          (agreed) into zeroed tensors and check it
      kill STEP VICTIM    every rank saves STEP; VICTIM SIGKILLs itself
      restore STEP SKIP   restore must give STEP, with SKIP steps skipped
      reshard STEP OLDW   load by name the tensors of old ranks r, r+W, ...
      drop STEP RAISER    save STEP, drop the handle and leave the script
                          (rank RAISER on an uncaught exception; -1: none),
                          neither waiting nor closing: the exit commits it
Prints one line per outcome; exit 0 when every check passed."""

import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist

import libckpt
from libckpt.dist import TorchCoordinator, load_resharded


def tensor(r, step):
    """Rank r's tensor at `step`: any rank can compute any rank's."""
    return torch.arange(3000 + 700 * r, dtype=torch.int32) + r * 100003 + step * 7919


def main():
    rank, world, port, mode, root = (int(sys.argv[1]), int(sys.argv[2]),
                                     sys.argv[3], sys.argv[4], sys.argv[5])
    args = sys.argv[6:]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port,
                            rank=rank, world_size=world)
    timeout = float(os.environ.get("DIST_TIMEOUT", "60"))
    coord = TorchCoordinator(timeout=timeout)
    store = libckpt.Store(root, keep_last=0, chunk_bytes=4096, threads=2,
                          coordinator=coord, timeout=timeout,
                          readonly=(mode == "reshard"))
    name = "rank%d.w" % rank
    if mode == "save":
        for step in map(int, args):
            t = tensor(rank, step)
            h = store.save(step, {name: t})
            t.zero_()  # the snapshot is taken: ours again
            h.wait()
            st = h.stats
            print("rank %d: saved step %d stall_s %.6f persist_s %.6f"
                  % (rank, step, st["stall_s"], st["persist_s"]), flush=True)
        t = torch.zeros_like(tensor(rank, 0))
        got = store.restore({name: t})
        assert got == int(args[-1]), got
        assert torch.equal(t, tensor(rank, got)), "restored data differ"
        print("rank %d: restored step %d" % (rank, got), flush=True)
    elif mode == "kill":
        step, victim = int(args[0]), int(args[1])
        h = store.save(step, {name: tensor(rank, step)})
        if rank == victim:
            print("rank %d: killing myself mid-save" % rank, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            h.wait()
            print("rank %d: FAIL: the save committed without rank %d"
                  % (rank, victim), flush=True)
            os._exit(1)
        except libckpt.PeerError as e:
            print("rank %d: save returned peer: %s" % (rank, e), flush=True)
            os._exit(0)  # a rank is dead: no clean shutdown of the group
    elif mode == "restore":
        step, nskip = int(args[0]), int(args[1])
        t = torch.zeros_like(tensor(rank, 0))
        got = store.restore({name: t})
        for s in got.skipped:
            print("rank %d: skipped step %d: %s" % (rank, s["step"], s["message"]),
                  flush=True)
        assert got == step, (int(got), step)
        assert len(got.skipped) == nskip, got.skipped
        assert torch.equal(t, tensor(rank, step)), "restored data differ"
        print("rank %d: restored step %d, %d skipped" % (rank, got, nskip), flush=True)
    elif mode == "drop":
        step, raiser = int(args[0]), int(args[1])
        big = torch.arange(1 << 20, dtype=torch.float32) + rank  # a save that takes a while
        store.save(step, {name: tensor(rank, step), "big%d" % rank: big})
        print("rank %d: dropped the save of step %d" % (rank, step), flush=True)
        if rank == raiser:
            raise RuntimeError("rank %d leaves on an exception" % rank)
        sys.exit(0)
    elif mode == "reshard":
        step, oldw = int(args[0]), int(args[1])
        mine = ["rank%d.w" % r for r in range(rank, oldw, world)]
        got, state = load_resharded(store, mine, framework="pt")
        assert got == step, (got, step)
        for r in range(rank, oldw, world):
            assert torch.equal(state["rank%d.w" % r], tensor(r, step)), r
        print("rank %d of %d: loaded %s from step %d" % (rank, world, mine, got),
              flush=True)
    store.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""libckpt.dist without a distributed runtime: ranks as threads of this
process, meeting through a Coordinator subclass built on a
threading.Barrier.  The real runtimes (OpenMPI, torch.distributed over
gloo, real processes) are tests/dist."""

import os
import threading
import warnings

import numpy as np
import pytest

import libckpt
from libckpt.dist import Coordinator, load_resharded
from conftest import open_store

WORLD = 2


class ThreadCoordinator(Coordinator):
    """Ranks are threads; `shared` is one dict for all of them."""

    def __init__(self, rank, shared, fail=None):
        self.rank, self.world_size = rank, WORLD
        self.shared, self.fail = shared, fail

    def _meet(self, timeout):
        self.shared["barrier"].wait(timeout)

    def barrier(self, timeout):
        self._meet(timeout)

    def broadcast(self, data, root, timeout):
        if self.fail == "broadcast":
            raise RuntimeError("the runtime failed")
        if self.rank == root:
            self.shared["slot"] = data
        self._meet(timeout)
        out = self.shared["slot"]
        self._meet(timeout)
        return out

    def allreduce_min(self, value, timeout):
        self.shared.setdefault("values", {})[self.rank] = value
        self._meet(timeout)
        out = min(self.shared["values"].values())
        self._meet(timeout)
        return out

    def gather(self, data, root, timeout):
        if self.fail == "gather":
            raise RuntimeError("the runtime failed")
        self.shared.setdefault("parts", {})[self.rank] = data
        self._meet(timeout)
        out = [self.shared["parts"][r] for r in range(WORLD)] \
            if self.rank == root else None
        self._meet(timeout)
        return out


def weights(rank, step):
    return np.arange(5000 + 1000 * rank, dtype=np.float32) + 1000 * rank + step


def run_ranks(body):
    """Run body(rank, coordinator) on WORLD threads; their results."""
    shared = {"barrier": threading.Barrier(WORLD)}
    results, errors = [None] * WORLD, [None] * WORLD

    def main(rank):
        try:
            results[rank] = body(rank, ThreadCoordinator(rank, shared))
        except BaseException as e:  # reported by the test thread
            errors[rank] = e
            shared["barrier"].abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for e in errors:
        if e is not None:
            raise e
    return results


def test_save_restore_agreed_and_resharded(root):
    def body(rank, coord):
        with open_store(root, keep_last=0, coordinator=coord, timeout=30) as store:
            for step in (1, 2):
                store.save(step, {"rank%d.w" % rank: weights(rank, step)}).wait()
            got = np.zeros_like(weights(rank, 0))
            step = store.restore({"rank%d.w" % rank: got})
            assert np.array_equal(got, weights(rank, 2))
            return int(step)
    assert run_ranks(body) == [2, 2]
    # One process, no coordinator, reads every rank's tensors by name.
    with open_store(root, readonly=True) as store:
        step, tensors = load_resharded(store, lambda name: True)
        assert step == 2 and sorted(tensors) == ["rank0.w", "rank1.w"]
        for r in range(WORLD):
            assert np.array_equal(tensors["rank%d.w" % r], weights(r, 2))
        assert store.verify()["status"] == "valid"


def test_a_whole_state_read_of_a_multi_rank_step_never_drops_ranks(root):
    """The structure a multi-rank step carries is rank 0's: Store.load and
    Checkpoint.state() would build rank 0's state alone, on every rank and
    in one process.  They refuse, naming the step, the ranks and what to
    call instead; those calls give every rank's tensors."""
    def body(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as store:
            store.save(1, {"rank%d" % rank: {"w": weights(rank, 1)},
                           "epoch": 3}).wait()
            with pytest.raises(libckpt.InvalidArgumentError,
                               match=r"step 1 was saved by 2 ranks .*\(1 "
                               r"of its 2 tensors\).*Store\.restore"):
                store.load()
            got = {"rank%d" % rank: {"w": np.zeros_like(weights(rank, 1))},
                   "epoch": 0}
            r = store.restore(got)
            assert np.array_equal(got["rank%d" % rank]["w"], weights(rank, 1))
            return int(r)
    assert run_ranks(body) == [1, 1]
    with open_store(root, readonly=True) as store:
        for call in (lambda: store.load(), lambda: store.load(step=1),
                     lambda: store.open(1).state()):
            with pytest.raises(libckpt.InvalidArgumentError,
                               match="load_resharded"):
                call()
        # rank 0's part of the structure is there to be read by its path
        assert np.array_equal(store.open(1).state("rank0")["w"],
                              weights(0, 1))
        every = store.open(1).get_tensors()
        assert sorted(every) == ["rank0.w", "rank1.w"]
        assert np.array_equal(every["rank1.w"], weights(1, 1))


def test_unexpected_keys_are_this_ranks_and_orphans_are_warned_of(root):
    """On a multi-rank restore the other ranks' tensors are theirs to
    restore, not unexpected; restarted with fewer ranks, the tensors of a
    rank the job no longer has are restored by none: listed on every rank
    and warned about on rank 0 (retention would delete them for good)."""
    def save(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as store:
            store.save(1, {"rank%d.w" % rank: weights(rank, 1),
                           "rank%d.extra" % rank: np.ones(2)}).wait()
    run_ranks(save)

    def restore(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as store:
            got = np.zeros_like(weights(rank, 1))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r = store.restore({"rank%d.w" % rank: got}, strict=False)
            assert np.array_equal(got, weights(rank, 1))
            return r.unexpected_keys, [str(w.message) for w in caught]
    assert run_ranks(restore) == [(["rank0.extra"], []),
                                  (["rank1.extra"], [])]
    # the same step restored by one rank of a world of one: rank 1's
    # tensors are no rank's now
    with open_store(root, rank=0, world_size=1) as store:
        got = np.zeros_like(weights(0, 1))
        with pytest.warns(UserWarning, match=r"step 1 was saved by 2 ranks "
                          r"and is restored by 1: the 2 tensors of rank 1 "
                          r"are restored by none.*load_resharded"):
            r = store.restore({"rank0.w": got}, strict=False)
        assert r.unexpected_keys == ["rank0.extra", "rank1.w", "rank1.extra"]


def test_resharded_load_falls_back_to_an_older_step_of_other_shapes(root):
    """The newest step is damaged in one rank's shard and the step before
    holds other shapes: load_resharded sizes each step it tries from that
    step's own manifest, so every rank (and one process) gets the older
    step whole instead of a MismatchError."""
    def grown(rank, step):  # step 2's tensors are twice step 1's
        w = weights(rank, step)
        return np.concatenate([w, w]) if step == 2 else w

    def save(rank, coord):
        with open_store(root, keep_last=0, coordinator=coord, timeout=30) as st:
            for step in (1, 2):
                st.save(step, {"rank%d.w" % rank: grown(rank, step)}).wait()
    run_ranks(save)
    shard = root / "step-000000000002" / "rank-00001.shard"
    data = bytearray(shard.read_bytes())
    data[80] ^= 0x40  # in rank 1's first chunk
    shard.write_bytes(bytes(data))

    def load(rank, coord):  # each rank takes the other rank's tensor
        with open_store(root, coordinator=coord, timeout=30) as st:
            name = "rank%d.w" % (1 - rank)
            step, got = load_resharded(st, [name])
            assert np.array_equal(got[name], grown(1 - rank, 1))
            return step
    assert run_ranks(load) == [1, 1]
    with open_store(root, readonly=True) as st:
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            step, got = load_resharded(st, lambda name: True)
        assert step == 1 and sorted(got) == ["rank0.w", "rank1.w"]
        for r in range(WORLD):
            assert np.array_equal(got["rank%d.w" % r], grown(r, 1))
        with pytest.raises(libckpt.NotFoundError, match="rank7.w"):
            load_resharded(st, ["rank7.w"])
        # names given by a generator, used up by the damaged step tried
        # first: the older step still gets them (it gave {} before)
        with pytest.warns(libckpt.SkippedCheckpointWarning, match="step 2"):
            step, got = load_resharded(st, (n for n in ["rank1.w"]))
        assert step == 1 and list(got) == ["rank1.w"]
        assert np.array_equal(got["rank1.w"], grown(1, 1))


def test_a_rank_that_cannot_restore_is_named_by_every_rank(root):
    """Rank 1 asks for a tensor the step does not hold (a job restarted
    with more ranks than saved): rank 1 gets NotFoundError naming it, and
    rank 0's restore fails with the same status, naming rank 1 and its
    reason instead of only 'another rank failed'."""
    def save(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as st:
            st.save(1, {"rank%d.w" % rank: weights(rank, 1)}).wait()
    run_ranks(save)

    def restore(rank, coord):
        name = "rank%d.w" % (rank if rank == 0 else 5)
        with open_store(root, coordinator=coord, timeout=30) as st:
            with pytest.raises(libckpt.NotFoundError) as err:
                st.restore({name: np.zeros_like(weights(rank, 1))})
            return str(err.value)
    msgs = run_ranks(restore)
    assert "rank5.w" in msgs[1]
    assert "rank 1's restore failed" in msgs[0] and "rank5.w" in msgs[0], msgs[0]


def test_a_rank_whose_state_the_binding_refuses_keeps_every_rank_in_step(root):
    """Rank 1's save is refused in Python before the library is reached (a
    NaN in its metadata on that rank only, a loss say), and later its
    restore (a state holding an object that is no array).  That rank used
    to raise alone: its next save met the others' collectives of the one
    before, every later save failed ("rank 1 saved step 3 while rank 0
    saved step 2") and nothing committed again; the restore left the
    others waiting for the whole timeout.  Now the others fail that call
    at once with rank 1's reason, and the next save and restore work."""
    def body(rank, coord):
        seen = []
        with open_store(root, coordinator=coord, timeout=30) as st:
            name = "rank%d.w" % rank
            bad = {"loss": float("nan")} if rank == 1 else {"loss": 0.5}
            with pytest.raises(libckpt.InvalidArgumentError) as err:
                st.save(1, {name: weights(rank, 1)}, metadata=bad).wait()
            seen.append(str(err.value))
            # a step number refused on one rank only (-1: not a step)
            with pytest.raises(libckpt.InvalidArgumentError) as err:
                st.save(-1 if rank == 1 else 2, {name: weights(rank, 2)}).wait()
            seen.append(str(err.value))
            st.save(2, {name: weights(rank, 2)}, metadata={"loss": 0.4}).wait()
            state = {name: np.zeros_like(weights(rank, 2))}
            if rank == 1:
                state["odd"] = object()
            with pytest.raises((TypeError, libckpt.Error)) as err:
                st.restore(state)
            seen.append(str(err.value))
        return seen
    seen = run_ranks(body)
    assert "NaN" in seen[1][0] or "nan" in seen[1][0], seen[1][0]
    assert "rank 1" in seen[0][0] and "metadata" in seen[0][0], seen[0][0]
    assert "rank 1" in seen[0][1] and "Store.save" in seen[0][1], seen[0][1]
    assert "rank 1" in seen[0][2] and "state['odd']" in seen[0][2], seen[0][2]

    def again(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as st:
            target = {"rank%d.w" % rank: np.zeros_like(weights(rank, 2))}
            step = st.restore(target)
            assert np.array_equal(target["rank%d.w" % rank], weights(rank, 2))
            return step, st.steps()
    for step, steps in run_ranks(again):
        assert step == 2 and [s["step"] for s in steps] == [2]


def test_a_failing_collective_is_a_peer_error(root):
    coord = ThreadCoordinator(1, {"barrier": threading.Barrier(WORLD)},
                              fail="broadcast")  # open's first collective
    with pytest.raises(libckpt.PeerError) as err:
        open_store(root, coordinator=coord, timeout=5)
    assert "failed" in str(err.value)
    # the runtime's own error is named and chained, not only on stderr
    assert "rank 1's coordinator raised RuntimeError: the runtime failed" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)
    assert "the runtime failed" in coord.last_error
    # taken once: a later PeerError names its own cause (here the barrier
    # that timed out waiting for rank 0), never the earlier one
    lonely = ThreadCoordinator(1, {"barrier": threading.Barrier(WORLD)})
    with pytest.raises(libckpt.PeerError) as again:
        open_store(root, coordinator=lonely, timeout=1)
    assert "BrokenBarrierError" in str(again.value), str(again.value)
    assert "RuntimeError" not in str(again.value), str(again.value)


def test_rank_and_world_are_checked(root):
    coord = ThreadCoordinator(0, {"barrier": threading.Barrier(WORLD)})
    with pytest.raises(libckpt.InvalidArgumentError):
        open_store(root, coordinator=coord, rank=2)


def test_resharded_load_passes_a_step_retired_under_it(root):
    """A reader's load_resharded next to a writer that keeps one step: the
    step it listed is retired by the writer's next save before it is
    opened.  It used to warn that step 1 was skipped ("not found") and
    raise NoCheckpointError although step 2 was committed; the root is
    listed again, as Store.load does, and step 2 is loaded unwarned."""
    writer = open_store(root, keep_last=1)
    writer.save(1, {"w": weights(0, 1)}).wait()
    reader = open_store(root, readonly=True)
    real, raced = reader.open, []

    def open_after_the_writer(step, *args, **kwargs):
        if not raced:  # the writer saves step 2 and retires step 1
            raced.append(step)
            writer.save(2, {"w": weights(0, 2)}).wait()
        return real(step, *args, **kwargs)
    reader.open = open_after_the_writer
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", libckpt.SkippedCheckpointWarning)
            step, got = load_resharded(reader, ["w"])
    finally:
        reader.close()
        writer.close()
    assert raced == [1]
    assert step == 2 and np.array_equal(got["w"], weights(0, 2))


def test_ranks_pass_a_step_retired_under_one_of_them(root):
    """Two ranks load_resharded next to a writer that keeps one step: the
    writer's save retires step 1 after the ranks agreed on it, before
    rank 0 opens it.  Every rank lists again and gets step 2, no step is
    reported skipped."""
    writer = open_store(root, keep_last=1)
    writer.save(1, {"w": weights(0, 1)}).wait()

    def load(rank, coord):
        with open_store(root, readonly=True, coordinator=coord, timeout=30) as st:
            if rank == 0:
                real, raced = st.open, []

                def open_after_the_writer(step, *args, **kwargs):
                    if not raced:
                        raced.append(step)
                        writer.save(2, {"w": weights(0, 2)}).wait()
                    return real(step, *args, **kwargs)
                st.open = open_after_the_writer
            with warnings.catch_warnings():
                warnings.simplefilter("error", libckpt.SkippedCheckpointWarning)
                step, got = load_resharded(st, ["w"])
            assert np.array_equal(got["w"], weights(0, step))
            return step
    try:
        assert run_ranks(load) == [2, 2]
    finally:
        writer.close()


def test_each_rank_restores_its_own_plain_values(root):
    """Every rank's state holds plain values of its own (a scheduler's
    epoch, a sampler position, optimizer settings): each rank's come back
    from its own part of the step, not rank 0's; a reader in one process
    finds each rank's under its path, and a rank whose part is lost is
    told so instead of keeping fresh values without a word."""
    torch = pytest.importorskip("torch")

    def state(rank, fresh):
        return {"rank%d" % rank: {
            "w": torch.zeros(50 + rank) if fresh
            else torch.arange(50 + rank, dtype=torch.float32) + rank,
            "sched": {"last_epoch": 0 if fresh else 3 + rank,
                      "lrs": [0.0] if fresh else [0.1 * (rank + 1)]},
            "pos": 0 if fresh else 1000 + rank},
            "epoch": 0 if fresh else 7}

    def save(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as store:
            store.save(1, state(rank, False)).wait()
    run_ranks(save)

    def restore(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as store:
            r = store.restore(state(rank, True))
            assert r.missing_keys == [] and r.unexpected_keys == []
            return r.state
    for rank, got in enumerate(run_ranks(restore)):
        want = state(rank, False)
        mine = "rank%d" % rank
        assert torch.equal(got[mine]["w"], want[mine]["w"])
        assert got[mine]["sched"] == want[mine]["sched"], rank
        assert got[mine]["pos"] == 1000 + rank and got["epoch"] == 7

    with open_store(root, readonly=True) as store:
        ck = store.open(1)
        for rank in range(WORLD):
            part = ck.state("rank%d" % rank)
            assert part["pos"] == 1000 + rank
            assert isinstance(part["w"], torch.Tensor)  # as it was saved
        every = ck.get_tensors()
        assert all(isinstance(t, torch.Tensor) for t in every.values())
        with pytest.raises(libckpt.NotFoundError, match="rank2"):
            ck.state("rank2")
        ck.close()

    os.unlink(os.path.join(root, "step-000000000001", "rank-00001.json"))

    def restore_without_part(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as store:
            fresh = state(rank, True)
            if rank == 0:  # two collective restores, as rank 1's
                store.restore(fresh)
                return store.restore(fresh, strict=False).state["rank0"]["pos"]
            with pytest.raises(libckpt.IncompleteError,
                               match=r"rank 1's metadata .*rank-00001\.json"
                               r".*plain values of this rank's state were "
                               r"not"):
                store.restore(fresh)
            with pytest.warns(UserWarning, match="plain values are not"):
                r = store.restore(fresh, strict=False)
            assert torch.equal(fresh["rank1"]["w"], state(1, False)["rank1"]["w"])
            return sorted(r.missing_keys)
    assert run_ranks(restore_without_part) == [
        1000, ["epoch", "rank1.pos", "rank1.sched.last_epoch",
               "rank1.sched.lrs.0"]]


def test_the_store_timeout_stays_within_the_coordinators(root):
    """A coordinator that bounds its own collectives (TorchCoordinator's
    gloo group) fails any that waits longer, whatever the store's timeout:
    the pacing of a slow rank (a collective every timeout / 4) must run
    within that bound, so the store's timeout defaults to it and may not
    exceed it."""
    def body(rank, coord):
        coord.timeout = 20.0
        with open_store(root, coordinator=coord) as store:
            assert store._timeout == 20.0
        with open_store(root, coordinator=coord, timeout=5) as store:
            assert store._timeout == 5.0
        with pytest.raises(libckpt.InvalidArgumentError,
                           match=r"timeout=30 s is longer than the "
                           r"coordinator's own timeout \(20 s\)"):
            open_store(root, coordinator=coord, timeout=30)
        coord.timeout = None  # no bound of its own: the store's default
        with open_store(root, coordinator=coord) as store:
            return store._timeout
    assert run_ranks(body) == [600.0, 600.0]


def test_two_stores_share_a_coordinator_one_collective_at_a_time(root):
    """A job's "last" and "best" roots on one coordinator, each saved every
    step without waiting: a save's persist thread runs collectives until it
    commits, and the other store's save met them on the shared channel in
    whatever order each rank's threads came (PeerError on both, for good).
    A store's collective call now waits for the other stores' saves in
    flight first, so every save commits."""
    other = os.path.join(os.path.dirname(root), "best")

    def body(rank, coord):
        with open_store(root, coordinator=coord, timeout=30) as last, \
                open_store(other, coordinator=coord, timeout=30) as best:
            for step in (1, 2, 3):
                state = {"rank%d.w" % rank: weights(rank, step)}
                last.save(step, state)
                best.save(step, state)
            got = {"rank%d.w" % rank: np.zeros_like(weights(rank, 3))}
            r = last.restore(got)  # collective, with best's save in flight
            assert np.array_equal(got["rank%d.w" % rank], weights(rank, 3))
            return int(r), last.steps()[-1]["step"], best.latest()
    assert run_ranks(body) == [(3, 3, 3), (3, 3, 3)]

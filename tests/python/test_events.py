"""Store.events() and Store.metrics(): the event log and the Prometheus
metrics of a root, as `ckpt log` and `ckpt metrics` show them."""

import os

import numpy as np

from conftest import open_store


def test_events_and_metrics(root):
    state = {"w": np.arange(1000, dtype=np.float32)}
    with open_store(root) as s:
        s.save(1, state).wait()
        s.save(2, state).wait()
        s.restore(state)
        events = s.events()
        names = [e["event"] for e in events]
        assert names == ["save_begun", "save_committed", "save_begun", "save_committed",
                         "restored"], names
        assert events[1]["step"] == 1 and events[1]["raw_bytes"] == 4000
        assert events[4]["step"] == 2 and events[4]["skipped"] == []
        assert [e["event"] for e in s.events(since=events[3]["time"])] == names[3:]
        text = s.metrics()
        label = '{root="%s"}' % s.path
    lines = dict(l.rsplit(" ", 1) for l in text.splitlines() if not l.startswith("#"))
    by_name = {k.split("{")[0]: float(v) for k, v in lines.items()}
    assert by_name["ckpt_latest_step"] == 2
    assert by_name["ckpt_saves_total"] == 2 and by_name["ckpt_restores_total"] == 1
    assert ("ckpt_latest_step" + label) in lines


def test_a_resume_with_load_is_logged_and_counted(root):
    """The README's resume (Store.load) is a restore in the event log and
    the metrics, with the damaged step it passed over, as restore() is;
    a load that finds nothing is a failed restore."""
    import pytest
    import libckpt
    state = {"w": np.arange(1000, dtype=np.float32)}
    with open_store(root) as s:
        s.save(1, state).wait()
        s.save(2, state).wait()
        shard = os.path.join(root, "step-000000000002", "rank-00000.shard")
        with open(shard, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.warns(libckpt.SkippedCheckpointWarning):
            step, _ = s.load()
        assert step == 1
        s.load(1)
        restored = [e for e in s.events() if e["event"].startswith("restore")]
        assert [e["event"] for e in restored] == ["restored", "restored"], restored
        assert restored[0]["step"] == 1
        assert [p["step"] for p in restored[0]["skipped"]] == [2]
        assert restored[0]["skipped"][0]["status"] == "corrupt"
        assert restored[1]["skipped"] == []
        text = s.metrics()
    by_name = {l.split("{")[0]: float(l.rsplit(" ", 1)[1])
               for l in text.splitlines() if not l.startswith("#")}
    assert by_name["ckpt_restores_total"] == 2
    assert by_name["ckpt_restore_fallbacks_total"] == 1
    empty = os.path.join(os.path.dirname(root), "empty")
    with open_store(empty) as s:
        with pytest.raises(libckpt.NoCheckpointError):
            s.load()
        failed = [e for e in s.events() if e["event"] == "restore_failed"]
        assert len(failed) == 1 and failed[0]["status"] == "no_checkpoint", failed


def test_read_only_store_reads_but_does_not_write(root):
    state = {"w": np.zeros(10, dtype=np.float32)}
    with open_store(root) as s:
        s.save(1, state).wait()
    with open_store(root, readonly=True) as r:
        r.restore(state)
        assert [e["event"] for e in r.events()] == ["save_begun", "save_committed"]


def test_metrics_path_written_after_each_commit(root, tmp_path):
    prom = tmp_path / "job.prom"
    state = {"w": np.zeros(10, dtype=np.float32)}
    with open_store(root, metrics_path=prom) as s:
        assert not prom.exists()
        s.save(7, state).wait()
        assert 'ckpt_latest_step{root="%s"} 7\n' % s.path in prom.read_text()


def test_persist_seconds_metric_is_the_whole_background_time(root, tmp_path):
    """ckpt_last_save_persist_seconds is the time from save returning to
    the commit, in `ckpt metrics` (Store.metrics) as in the file written
    after the save: the save's own figure (the event log's), not the
    manifest's, which stops before the manifest's fsync, the check after
    saving and the commit."""
    prom = tmp_path / "job.prom"
    state = {"w": np.random.default_rng(1).random(1 << 20)}
    with open_store(root, metrics_path=prom) as s:
        h = s.save(3, state)
        h.wait()
        manifest = s.steps()[-1]["persist_seconds"]
        logged = [e for e in s.events() if e["event"] == "save_committed"]
        whole = logged[-1]["persist_s"]
        # the handle's figure is taken last, after the log is written
        assert manifest < whole <= h.stats["persist_s"]

        def figure(text):
            for line in text.splitlines():
                if line.startswith("ckpt_last_save_persist_seconds{"):
                    return float(line.rsplit(" ", 1)[1])
        assert figure(s.metrics()) == whole
        assert figure(prom.read_text()) == whole


def test_metrics_file_is_written_whatever_names_others_took(root, tmp_path):
    """The temporary file beside the metrics file had a name of the pid
    alone: in a collector directory others may write, a user who made
    that name first (for every pid) blocked every metrics file, each save
    logging metrics_failed.  It is a name nobody can guess now.  (A
    directory of that name stands in for another user's file: nobody,
    root included, removes it with unlink.)"""
    prom = tmp_path / "job.prom"
    os.mkdir(str(prom) + ".tmp-%d" % os.getpid())
    with open_store(root, metrics_path=prom) as s:
        s.save(1, {"w": np.zeros(10, dtype=np.float32)}).wait()
        assert 'ckpt_latest_step{root="%s"} 1\n' % s.path in prom.read_text()
        assert not [e for e in s.events() if e["event"] == "metrics_failed"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["job.prom", "job.prom.tmp-%d" % os.getpid(), os.path.basename(root)])

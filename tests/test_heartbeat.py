"""The watchdog's heartbeats at scale (issue 38, item 5): each rank beats in node-local memory; only with
train.heartbeat_dir does a node write to a shared directory, one file per node from its lowest rank, and only then
does a watchdog see, and name, a rank on another node."""
import time

from train.runtime import watchdog


def _rank(monkeypatch, tmp_path, rank: int, node: str, beat_dir: str) -> watchdog.Watchdog:
    monkeypatch.setattr(watchdog, "node_local_root", lambda: tmp_path / f"shm-{node}")
    monkeypatch.setattr(watchdog.socket, "gethostname", lambda: node)
    w = watchdog.Watchdog(rank, 3, tmp_path / "run", "job1", limit_s=3600, shared_dir=beat_dir)
    w._stop.set()  # the test beats for it: no thread rewrites a heartbeat it made stale
    w._thread.join()
    return w


def test_a_shared_directory_gets_one_file_per_node_and_shows_other_nodes(monkeypatch, tmp_path):
    beat_dir = tmp_path / "heartbeat-dir"  # the nodes' common train.heartbeat_dir, made here
    ranks = [_rank(monkeypatch, tmp_path, r, node, str(beat_dir)) for r, node in ((0, "a"), (1, "a"), (2, "b"))]
    try:
        for w in ranks:
            w._node_beat_at = 0.0  # due now
            w._beat()
        (beats,) = beat_dir.glob("heartbeat-*")
        assert sorted(f.name for f in beats.iterdir()) == ["node-a", "node-b"]
        assert [line.split()[0] for line in (beats / "node-a").read_text().splitlines()] == ["0", "1"]
        assert not list((tmp_path / "run").glob("*heartbeat*"))  # nothing per rank in the run directory
        seen = ranks[0].seen()
        assert sorted(seen) == [0, 1, 2] and seen[2][3] == watchdog.NODE_TICK_S
        assert ranks[0].suspects().startswith("every rank is alive")
        old = time.time() - 4 * watchdog.NODE_TICK_S  # node b's writer stopped: its file goes stale
        (beats / "node-b").write_text(f"2 7 backward {old}\n")
        assert ranks[0].suspects().startswith("rank 2 is not responding (last seen in phase backward at step 8")
        before = (beats / "node-a").stat().st_mtime_ns
        ranks[0]._beat()  # within NODE_TICK_S of its last node beat: the shared file is left alone
        assert (beats / "node-a").stat().st_mtime_ns == before
    finally:
        for w in ranks:
            w.close()
    assert not list(beat_dir.iterdir()) and not list((tmp_path / "shm-a").iterdir())


def test_without_a_shared_directory_a_watchdog_says_it_sees_only_its_node(monkeypatch, tmp_path):
    ranks = [_rank(monkeypatch, tmp_path, r, node, "") for r, node in ((0, "a"), (1, "a"), (2, "b"))]
    try:
        said = ranks[0].suspects()
        assert sorted(ranks[0].seen()) == [0, 1]
        assert said.startswith("the 2 rank(s) seen are alive; ranks on other nodes are not visible") and \
            "train.heartbeat_dir" in said
        stale = time.time() - 10 * watchdog.TICK_S
        (ranks[1].dir / "rank1").write_text(f"1 3 forward {stale}\n")
        assert ranks[0].suspects().startswith("rank 1 is not responding (last seen in phase forward at step 4")
    finally:
        for w in ranks:
            w.close()

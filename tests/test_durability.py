"""kill -9 durability of the controller, and the pysyncobj problems in docs/design/index.md (Durability).

Properties checked:
- kill -9 of ALL nodes in the middle of a write stream, restart in another order:
  every acknowledged write is there, every node converges to one state digest, and no
  node's Raft term went backwards (term/vote durability, pysyncobj #84).
- the same across log compaction: a restart from snapshot (format 2, its values decoded
  on first read) + journal keeps everything, and every node lists the same topics.
- a commit-index side file pointing past the journal end (pysyncobj #197) does not
  make a node apply phantom entries: it restarts, catches up and agrees.
- a corrupt snapshot or journal record is detected by its checksum (pysyncobj swallows
  this error) and the node, instead of serving an empty state or refusing to start,
  moves them aside and re-joins from the others (P16).
"""

from __future__ import annotations

import json
import threading
import zlib

import pytest
from mqmeta.controller.journal import parse_records

from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb
from tests.support import topic_names, wait_for, wait_same_digest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

# Writes acknowledged before the nodes are killed (the writers keep going until then).
ACKED_BEFORE_CRASH_MIN = 400  # about what 1.5 s of the four writers gave on 2 cores


class Writer(threading.Thread):
    """Writes topics as fast as it can; remembers which ones were acknowledged."""

    def __init__(self, cluster, prefix: str) -> None:
        super().__init__(daemon=True)
        self.client = cluster.client(timeout_s=1.0)
        self.prefix = prefix
        self.acked: list[str] = []
        self.attempts = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set() and self.attempts < 100_000:
            name = f"{self.prefix}{self.attempts}"
            self.attempts += 1
            try:
                self.client.call("CreateTopic", pb.TopicSpec(name=name, queue_count=1))
                self.acked.append(name)
            except MqmetaError:
                pass  # unacknowledged: may or may not be there, both are fine

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
        self.client.close()


def kill_all_mid_stream(cluster, prefix: str, acked_min: int = ACKED_BEFORE_CRASH_MIN) -> list[str]:
    writers = [Writer(cluster, f"{prefix}w{i}-") for i in range(4)]
    for writer in writers:
        writer.start()
    wait_for(
        lambda: sum(len(writer.acked) for writer in writers),
        30,
        f"{acked_min} acknowledged writes before the crash",
        until=lambda acked: acked >= acked_min,
    )
    procs = [cluster.supervisor.children[n.id] for n in cluster.layout.controllers]
    for proc in procs:  # as close to simultaneous as we can: signal all, then reap
        proc.kill()
    for proc in procs:
        proc.wait()
    acked = [name for writer in writers for name in (writer.stop() or writer.acked)]
    assert len(acked) >= acked_min, "the write stream must have been running when the nodes died"
    return acked


def terms(cluster) -> dict[str, int]:
    return {n.id: cluster.metadata(n.id).term for n in cluster.layout.controllers}


def test_kill_all_nodes_mid_write_stream_loses_nothing_acknowledged(cluster):
    terms_before = terms(cluster)
    acked = kill_all_mid_stream(cluster, "crash")
    for node in reversed(cluster.layout.controllers):
        cluster.start_node(node.id)
    cluster.wait_ready()
    ids = [n.id for n in cluster.layout.controllers]
    wait_same_digest(cluster, ids)
    for node_id in ids:
        missing = set(acked) - topic_names(cluster, node_id)
        assert not missing, f"{node_id} lost {len(missing)} acknowledged writes: {sorted(missing)[:5]}"
    for node_id, term in terms(cluster).items():
        assert term >= terms_before[node_id], "a Raft term went backwards after restart"


def test_restart_from_snapshot_and_journal_keeps_everything(cluster_factory):
    cluster = cluster_factory(
        raft_settings={"compaction_min_entries": 20, "compaction_min_time_s": 1}
    ).start()
    with cluster.client() as client:
        acked = [f"snap{i}" for i in range(60)]
        for name in acked:
            client.call("CreateTopic", pb.TopicSpec(name=name, queue_count=1))
    ids = [n.id for n in cluster.layout.controllers]
    snapshots = [cluster.root / cluster.node(i).data_dir / "raft.snapshot" for i in ids]

    def snapshots_written() -> bool:
        with cluster.client() as client:  # compaction runs on the tick after enough entries
            client.call("UpdateConfig", pb.UpdateConfigRequest(values={"default_queue_count": "2"}))
        return all(p.exists() for p in snapshots)

    wait_for(snapshots_written, 20, "log compaction to write a snapshot on every node", interval_s=0.2)
    acked += kill_all_mid_stream(cluster, "aftersnap")
    assert all(p.read_bytes().startswith(b"MQMETA-SNAPSHOT-2\n") for p in snapshots), "format 2"
    cluster.start()
    wait_same_digest(cluster, ids)
    listed = {}
    for node_id in ids:  # values decoded from the snapshot's chunks on first read
        assert set(acked) <= topic_names(cluster, node_id)
        with cluster.client([node_id]) as client:
            topics = client.call("ListTopics", pb.ListTopicsRequest()).topics
        listed[node_id] = sorted((t.name, t.queue_count, t.perm) for t in topics)
        assert all(count == 1 for name, count, _ in listed[node_id] if name.startswith("snap"))
    assert len({tuple(topics) for topics in listed.values()}) == 1, "the nodes list different topics"


def test_commit_index_side_file_past_journal_end_is_harmless(cluster):
    with cluster.client() as client:
        for i in range(10):
            client.call("CreateTopic", pb.TopicSpec(name=f"side{i}", queue_count=1))
    victim = cluster.followers()[0]
    cluster.kill(victim)
    meta_path = cluster.root / cluster.node(victim).data_dir / "raft.journal.meta"
    meta = json.loads(meta_path.read_text())
    meta.pop("crc32")
    meta["commit_index"] = 10_000  # far beyond anything in the journal
    meta["crc32"] = zlib.crc32(json.dumps(meta, sort_keys=True).encode())
    meta_path.write_text(json.dumps(meta))
    cluster.start_node(victim)
    cluster.wait_ready()
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="sideAfter", queue_count=1))
    ids = [n.id for n in cluster.layout.controllers]
    wait_same_digest(cluster, ids)
    assert {f"side{i}" for i in range(10)} | {"sideAfter"} <= topic_names(cluster, victim)
    last = max(
        int(line.split('"index":')[1].split(",")[0])
        for line in cluster.applied_log(victim).read_text().splitlines()
    )
    assert last < 1000, "the node applied entries that were never in any journal"


def test_a_damaged_snapshot_or_journal_is_discarded_and_the_node_rejoins(cluster_factory):
    """P16: a follower whose snapshot, then whose journal (a record with valid ones after
    it), went bad while it was down starts anyway: it moves them aside, re-joins from the
    others (a snapshot of theirs, then the entries after it), ends at the same digest
    with every topic, and counts the repair; it never served or spread the bad bytes."""
    from tests.support.prometheus import scrape

    cluster = cluster_factory(
        raft_settings={"compaction_min_entries": 10, "compaction_min_time_s": 1}
    ).start()
    ids = [n.id for n in cluster.layout.controllers]
    victim = cluster.followers()[0]
    data_dir = cluster.root / cluster.node(victim).data_dir
    snapshot, journal = data_dir / "raft.snapshot", data_dir / "raft.journal"
    with cluster.client() as client:
        created = iter(range(100_000))

        def snapshot_written() -> bool:  # one more write per look: compaction needs entries
            client.call("CreateTopic", pb.TopicSpec(name=f"c{next(created)}", queue_count=1))
            return snapshot.exists()

        wait_for(snapshot_written, 20, f"log compaction to write {victim}'s snapshot", interval_s=0)
        topics = topic_names(cluster, ids[0])

        def repairs() -> float:
            return scrape(cluster.node(victim).metrics).get(("mqmeta_controller_raft_repairs_total", ()), 0.0)

        for damaged, position in ((snapshot, snapshot.stat().st_size // 2), (journal, None)):
            cluster.kill(victim)
            data = bytearray(damaged.read_bytes())
            if position is None:  # the first record's command: valid records follow it
                assert len(parse_records(bytes(data), str(damaged))[0]) >= 2, "records follow the first"
                position = len(b"MQMJRNL1") + 24 + 2
            data[position] ^= 0xFF
            damaged.write_bytes(bytes(data))
            cluster.start_node(victim)
            wait_for(repairs, 30, f"{victim} to repair its {damaged.name}", until=bool, retry_on=(OSError,))
            client.call("CreateTopic", pb.TopicSpec(name=f"after-{damaged.suffix[1:]}", queue_count=1))
            wait_same_digest(cluster, ids, timeout_s=30)
            assert topics | {f"after-{damaged.suffix[1:]}"} <= topic_names(cluster, victim)
            topics = topic_names(cluster, victim)
    assert len(list((data_dir / "damaged").iterdir())) == 2, "each damaged pair kept aside"
    log_text = (cluster.root / "logs" / f"{victim}.log").read_text()
    assert "is damaged" in log_text and "Traceback" not in log_text

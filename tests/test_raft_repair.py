"""A controller node that discarded a damaged Raft log, and the runtime scrub (P16).

Properties checked, on one real 3-node cluster (scrub every second):
- CatchUpFix: a node whose journal was moved aside (a flipped byte, found at start)
  neither grants a vote nor stands for election until it has applied the commit index it
  knew. The case it exists for: A and B hold writes that C lacks (C was down); B restarts
  without its log, A is down. B's empty log would grant C its vote, and C, elected, would
  drop those acknowledged writes. Instead no leader is elected while A is away (C stands
  again and again, B's term does not move), and once A is back B catches up from it,
  votes again (a leader is elected from B and C alone) and holds every write.
- The runtime scrub: a byte flipped in the journal of the running leader, then in the
  snapshot of a running follower, stops that node with EXIT_DAMAGED and the log line the
  docs name; the others keep serving writes meanwhile; its restart moves the damage
  aside, counts a repair and converges to the others' state with every write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mqmeta.cluster.harness import Cluster
from mqmeta.controller.journal import EXIT_DISK_FAILED, DurableJournal, parse_records
from mqmeta.controller.repair import EXIT_DAMAGED

from mqmeta.pb import controller_pb2 as pb
from tests.support import sample_for, topic_names, wait_for, wait_same_digest
from tests.support.prometheus import scrape

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

JOURNAL_FIRST_COMMAND_BYTE = len(b"MQMJRNL1") + 24 + 2  # inside the first record: valid ones follow
ELECTIONS_SEEN_MIN = 3  # elections C starts, and loses, while B catches up without A
REPAIRS = "mqmeta_controller_raft_repairs_total"
CATCHING_UP = "mqmeta_controller_raft_catching_up"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    settings = {"scrub_interval_s": 1, "compaction_min_entries": 10, "compaction_min_time_s": 1}
    with Cluster(tmp_path_factory.mktemp("repair"), raft_settings=settings) as c:
        yield c.start()


def data_dir(cluster: Cluster, node_id: str) -> Path:
    return cluster.root / cluster.node(node_id).data_dir


def create(cluster: Cluster, names: list[str]) -> None:
    with cluster.client() as client:
        for name in names:
            client.call("CreateTopic", pb.TopicSpec(name=name, queue_count=1))


def flip(path: Path, position: int) -> int:
    """Flips one byte of a file in place; returns the file's inode (to see it replaced)."""
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(bytes(data[position : position + 1]))
    return path.stat().st_ino


def damage(directory: Path) -> None:
    """Flips a byte of the journal's first record when valid records follow it (else a
    compaction left too few: of the snapshot's middle). Either is found at start."""
    journal, snapshot = directory / "raft.journal", directory / "raft.snapshot"
    entries = parse_records(journal.read_bytes(), str(journal))[0]
    if len(entries) >= 2:
        flip(journal, JOURNAL_FIRST_COMMAND_BYTE)
    else:
        flip(snapshot, snapshot.stat().st_size // 2)


def metric(cluster: Cluster, node_id: str, name: str) -> float:
    return scrape(cluster.node(node_id).metrics).get((name, ()), 0.0)


def test_every_controller_process_freezes_what_its_full_passes_kept(cluster):
    """controller/gc_pauses.py runs in each real controller process (set up by the CLI,
    with the default gc_thaw_interval_s): its start froze the process's objects, and the
    metrics say so."""
    for node in (n.id for n in cluster.layout.controllers):
        assert metric(cluster, node, "mqmeta_controller_gc_frozen_objects") > 10_000, node
        assert metric(cluster, node, "mqmeta_controller_gc_full_passes_total") >= 1, node


def test_a_node_that_lost_its_log_neither_votes_nor_stands_until_caught_up(cluster):
    a = cluster.leader_id()
    b, c = [n for n in (n.id for n in cluster.layout.controllers) if n != a]
    ids = [a, b, c]
    cluster.kill(c)
    late = [f"late{i}" for i in range(20)]  # held by A and B only
    create(cluster, late)
    known = cluster.metadata(a).commit_index
    meta = data_dir(cluster, b) / "raft.journal.meta"
    wait_for(
        lambda: DurableJournal.read_commit_index(meta),
        10,
        f"{b} to record commit index {known} (saved once a second)",
        until=lambda index: index >= known,
    )
    cluster.kill(b)
    damage(data_dir(cluster, b))
    cluster.kill(a)
    cluster.start_node(b)
    cluster.start_node(c)

    wait_for(
        lambda: metric(cluster, b, CATCHING_UP),
        20,
        f"{b} to discard its log",
        until=bool,
        retry_on=(OSError,),
    )
    b_term = cluster.metadata(b).term
    c_term = cluster.metadata(c).term

    def seen() -> tuple[int, int, dict[str, str]]:
        return cluster.metadata(b).term, cluster.metadata(c).term, cluster.leader_ids()

    wait_for(  # ends early on a leader or a move of B's term: the assertions below say which
        seen,
        20,
        f"{c} to stand for election {ELECTIONS_SEEN_MIN} times",
        until=lambda s: s[1] >= c_term + ELECTIONS_SEEN_MIN or s[0] != b_term or any(s[2].values()),
    )
    for _ in sample_for(1.0, 0.1):
        b_now, _, leaders = seen()
        assert leaders == {b: "", c: ""}, f"{c} was elected with the vote of {b}'s empty log"
        assert b_now == b_term, f"{b} voted or stood for election while catching up"
    assert metric(cluster, b, CATCHING_UP) == 1.0

    cluster.start_node(a)
    cluster.wait_ready()
    wait_for(
        lambda: metric(cluster, b, CATCHING_UP), 30, f"{b} to catch up from {a}", until=lambda v: v == 0.0
    )
    assert metric(cluster, b, REPAIRS) == 1.0
    wait_same_digest(cluster, ids, timeout_s=30)
    assert set(late) <= topic_names(cluster, b)

    cluster.kill(a)  # B votes again: B and C alone elect a leader
    leader = cluster.leader_id(timeout_s=30, exclude=a)
    assert leader in (b, c)
    create(cluster, ["after-catch-up"])
    assert set(late) | {"after-catch-up"} <= topic_names(cluster, c)
    cluster.start_node(a)
    cluster.wait_ready()
    wait_same_digest(cluster, ids, timeout_s=30)


def wait_for_exit(cluster: Cluster, node_id: str, damaged: Path, position: int) -> int:
    """Flips a byte of `damaged` and waits for the node's exit; flips again whenever a
    compaction replaced the file before the scrub read it."""
    inode = flip(damaged, position)

    def exited() -> int | None:
        nonlocal inode
        if damaged.stat().st_ino != inode:
            inode = flip(damaged, position)
        return cluster.supervisor.children[node_id].poll()

    return wait_for(
        exited, 20, f"the scrub to stop {node_id} ({damaged.name} damaged)", until=lambda s: s is not None
    )


def test_the_scrub_stops_a_node_whose_log_or_snapshot_went_bad_and_its_restart_repairs(cluster):
    ids = [n.id for n in cluster.layout.controllers]
    leader = cluster.leader_id(timeout_s=30)
    follower = next(n for n in ids if n != leader)
    scrub_round(cluster, "journal", leader, data_dir(cluster, leader) / "raft.journal")
    scrub_round(cluster, "snapshot", follower, data_dir(cluster, follower) / "raft.snapshot")


def scrub_round(cluster: Cluster, name: str, node_id: str, damaged: Path) -> None:
    ids = [n.id for n in cluster.layout.controllers]
    created = iter(range(10_000))
    wait_for(  # a journal with records after the flipped one, a snapshot to flip
        lambda: create(cluster, [f"{name}-{next(created)}"]) or damaged.exists(),
        20,
        f"{node_id}'s {damaged.name}",
        until=bool,
        interval_s=0,
    )
    position = JOURNAL_FIRST_COMMAND_BYTE if name == "journal" else damaged.stat().st_size // 2
    assert wait_for_exit(cluster, node_id, damaged, position) == EXIT_DAMAGED
    log_text = (cluster.root / "logs" / f"{node_id}.log").read_text()
    assert "went bad under this node" in log_text and "Traceback" not in log_text
    during = [f"during-{name}-{i}" for i in range(5)]
    create(cluster, during)  # the others serve on
    cluster.start_node(node_id)
    cluster.wait_ready()
    wait_for(
        lambda: metric(cluster, node_id, REPAIRS),
        20,
        f"{node_id} to repair at its restart",
        until=lambda count: count == 1.0,  # counted by the new process, at its start
        retry_on=(OSError,),
    )
    wait_same_digest(cluster, ids, timeout_s=30)
    assert set(during) <= topic_names(cluster, node_id)


APPLIED_LOG_EIO = Path(__file__).parent / "fixtures" / "applied_log_eio"


def test_a_failed_write_of_the_applied_log_stops_the_node_and_its_restart_fills_it(cluster):
    """EIO under applied.jsonl alone (injected in the process: tests/fixtures/applied_log_eio)
    stops the node with EXIT_DISK_FAILED and one log line, as a failed journal write does,
    instead of ending pysyncobj's tick thread and leaving the node hanging; the others serve
    on; restarted without the fault, it converges (from its journal, or the leader's
    snapshot) and its applied log stays whole: every line a record, each entry once, in
    order (the audit reads it)."""
    ids = [n.id for n in cluster.layout.controllers]
    victim = next(n for n in ids if n != cluster.leader_id(timeout_s=30))
    cluster.kill(victim)
    python_path = os.environ.get("PYTHONPATH", "")
    cluster.process_env = lambda name: (
        {"PYTHONPATH": os.pathsep.join(filter(None, [str(APPLIED_LOG_EIO), python_path])),
         "MQMETA_APPLIED_LOG_EIO_AFTER": "0"}
        if name == victim else {}
    )  # fmt: skip
    try:
        cluster.start_node(victim)
        created = iter(range(10_000))
        code = wait_for(  # entries it applies one by one once caught up (not in a snapshot)
            lambda: create(cluster, [f"eio-{next(created)}"]) or cluster.supervisor.children[victim].poll(),
            30,
            f"{victim} to stop",
            until=lambda c: c is not None,
            interval_s=0.2,
        )
    finally:
        cluster.process_env = lambda name: {}
    assert code == EXIT_DISK_FAILED
    log_text = (cluster.root / "logs" / f"{victim}.log").read_text()
    assert (
        "a write of the applied-command log applied.jsonl failed" in log_text and "Traceback" not in log_text
    )
    create(cluster, ["eio-during"])  # the others serve on
    cluster.start_node(victim)
    cluster.wait_ready()
    wait_same_digest(cluster, ids, timeout_s=30)
    applied = [json.loads(line)["index"] for line in cluster.applied_log(victim).read_text().splitlines()]
    assert applied == sorted(set(applied)), "the applied log is whole, each entry once, in order"

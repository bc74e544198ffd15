"""A controller whose disk fails a write or an fsync stops, and its restart recovers (P16).

Each controller's data dir is its own fault filesystem mount (chaos/faultfs). Properties:
- EIO on the fdatasync of a follower's Raft journal: the node exits EXIT_DISK_FAILED
  with a log line naming the failed fsync, before it acknowledges the entry; it leaves
  the marker that makes its restart discard the log (the unsynced pages may read back
  from the page cache yet never reach the disk) and re-join from the others; the others
  keep serving meanwhile, and every acknowledged write is on every node at the end.
- ENOSPC on the leader's disk: the leader exits EXIT_DISK_FAILED at its first refused
  write (no marker: a refused write leaves nothing unsynced behind it), a new leader
  takes the write, and the old one, restarted once space returns, keeps its log (no
  repair) and converges.
"""

from __future__ import annotations

import os

import pytest
from mqmeta.chaos.disks import NodeDisks
from mqmeta.cluster.harness import Cluster
from mqmeta.controller.journal import EXIT_DISK_FAILED

from mqmeta.pb import controller_pb2 as pb
from tests.support import topic_names, wait_for, wait_same_digest
from tests.support.prometheus import scrape

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]

REPAIRS = "mqmeta_controller_raft_repairs_total"


@pytest.fixture(scope="module")
def cluster_on_disks(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk-faults")
    cluster = Cluster(root / "cluster")
    disks = NodeDisks(cluster, root)
    disks.mount()
    try:
        yield cluster.start(), disks
    finally:
        cluster.stop()
        disks.unmount()


def create(cluster: Cluster, names: list[str]) -> None:
    with cluster.client(timeout_s=20.0) as client:
        for name in names:
            # with a request id: a retry after the leader stopped is answered, not AlreadyExists
            client.create_topic(pb.TopicSpec(name=name, queue_count=1))


def log_of(cluster: Cluster, node_id: str) -> str:
    return (cluster.root / "logs" / f"{node_id}.log").read_text()


def wait_exit(cluster: Cluster, node_id: str, prefix: str, created: list[str]) -> int:
    """Writes one topic per look (acknowledged ones into `created`) until the node exits."""

    def exited() -> int | None:
        name = f"{prefix}{len(created)}"
        create(cluster, [name])
        created.append(name)
        return cluster.supervisor.children[node_id].poll()

    return wait_for(exited, 30, f"{node_id} to stop on its disk's error", until=lambda s: s is not None)


def restart_and_converge(cluster: Cluster, node_id: str, created: list[str]) -> float:
    """Restarts the node; returns the repairs it counted at its start."""
    cluster.start_node(node_id)
    cluster.wait_ready()
    repairs = wait_for(
        lambda: scrape(cluster.node(node_id).metrics).get((REPAIRS, ()), None),
        20,
        f"{node_id}'s metrics",
        until=lambda value: value is not None,
        retry_on=(OSError,),
    )
    wait_same_digest(cluster, [n.id for n in cluster.layout.controllers], timeout_s=30)
    assert set(created) <= topic_names(cluster, node_id)
    return float(repairs)


def test_eio_on_a_followers_journal_fsync_stops_it_and_its_restart_rejoins(cluster_on_disks):
    cluster, disks = cluster_on_disks
    follower = cluster.followers()[0]
    created: list[str] = []
    disks.mounts[follower].fail_next_fsync(count=1, under="/raft.journal")
    assert wait_exit(cluster, follower, "eio-", created) == EXIT_DISK_FAILED
    assert disks.mounts[follower].status()["counters"]["failed_fsyncs"] == 1
    text = log_of(cluster, follower)
    assert "fdatasync of raft.journal failed" in text and "Input/output error" in text, text[-2000:]
    assert "Traceback" not in text
    marker = cluster.root / cluster.node(follower).data_dir / "raft.journal.failed"
    assert marker.exists(), "the restart must learn that the log is not trusted"
    create(cluster, ["eio-while-down"])  # the others serve on
    created.append("eio-while-down")
    assert restart_and_converge(cluster, follower, created) == 1.0, "the log was discarded and re-joined"
    assert not marker.exists()


def test_enospc_on_the_leaders_disk_stops_it_and_it_comes_back_once_space_returns(cluster_on_disks):
    cluster, disks = cluster_on_disks
    leader = cluster.leader_id(timeout_s=30)
    created: list[str] = []
    disks.mounts[leader].disk_full(True)
    try:
        assert wait_exit(cluster, leader, "full-", created) == EXIT_DISK_FAILED
    finally:
        disks.mounts[leader].disk_full(False)
    text = log_of(cluster, leader)
    assert "No space left on device" in text and "this node stops" in text, text[-2000:]
    assert "Traceback" not in text
    assert not (cluster.root / cluster.node(leader).data_dir / "raft.journal.failed").exists()
    assert cluster.leader_id(timeout_s=30, exclude=leader) != leader
    assert restart_and_converge(cluster, leader, created) == 0.0, "a refused write needs no repair"

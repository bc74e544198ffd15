"""The tiered uploader when the tiered store's disk is full or fails an fsync (P16).

The tiered store (a local directory) is a fault filesystem mount (chaos/faultfs).
Properties:
- ENOSPC: every upload fails while the disk is full; the checkpoint does not move, each
  segment it names is whole (the size it was committed with), no temp file is left, the
  failures are counted (metric, reason enospc) and retried with a growing pause; once
  space returns the uploads catch up with everything confirmed.
- EIO on an fsync of the store: that upload fails (reason eio), the next one succeeds,
  and again the checkpoint names only whole segments.
"""

from __future__ import annotations

import os
import time

import pytest
from mqmeta.broker_agent.tiered_backend import TEMP_MARK, LocalBackend
from mqmeta.chaos.faultfs import FaultFs
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.layout import tiered_dir

from mqmeta.broker_client import Producer
from mqmeta.pb import controller_pb2 as pb
from tests.support import sample_for, wait_for
from tests.support.prometheus import scrape

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]

FLAGS = ["--tiered-upload-bytes", "4096", "--tiered-upload-interval-ms", "200"]
FAILURES = "mqmeta_broker_tiered_upload_failures_total"


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiered-disk")
    cluster = Cluster(root / "cluster", broker_sets=1, replicas=1, broker_flags=FLAGS)
    (root / "backing").mkdir()
    tiered_dir(cluster.root).mkdir(parents=True)
    disk = FaultFs.mount(root / "backing", tiered_dir(cluster.root), log_path=root / "faultfs.log")
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=2))
        producer = Producer(cluster.namesrv, timeout_s=8.0)
        try:
            yield cluster, disk, producer
        finally:
            producer.close()
    finally:
        cluster.stop()
        disk.unmount()


def checkpoint(cluster: Cluster) -> pb.TieredCheckpoint:
    with cluster.client() as client:
        return client.call(
            "GetTieredCheckpoint", pb.BrokerSetRef(cluster="DefaultCluster", broker_name="broker-a")
        )


def produce(producer: Producer, count: int) -> None:
    for index in range(count):
        producer.send("Orders", [f"m{index}-{time.monotonic_ns()}".encode() * 20])


def failures(cluster: Cluster, reason: str) -> float:
    address = cluster.layout.brokers[0].metrics
    return scrape(address).get((FAILURES, (("reason", reason),)), 0.0)


def check_whole(cluster: Cluster, current: pb.TieredCheckpoint) -> None:
    """Each segment the checkpoint names is stored whole; no temp file is left anywhere."""
    backend = LocalBackend(tiered_dir(cluster.root), fsync=False)
    for segment in current.segments:
        assert backend.size(segment.key) == segment.size, segment.key
    temps = [p for p in tiered_dir(cluster.root).rglob("*") if TEMP_MARK in p.name]
    assert temps == [], temps


def wait_uploaded_to(cluster: Cluster, offset: int, timeout_s: float = 30.0) -> pb.TieredCheckpoint:
    return wait_for(
        lambda: checkpoint(cluster),
        timeout_s,
        f"the tiered checkpoint to reach {offset}",
        until=lambda current: current.uploaded_offset >= offset,
    )


def confirm_offset(cluster: Cluster) -> int:
    return int(cluster.broker_status("broker-a-1").confirm_offset)


def test_a_full_tiered_store_fails_uploads_commits_nothing_and_catches_up_after(tiered):
    cluster, disk, producer = tiered
    produce(producer, 20)
    before = wait_uploaded_to(cluster, confirm_offset(cluster))
    disk.disk_full(True)
    try:
        produce(producer, 40)
        wait_for(
            lambda: failures(cluster, "enospc"), 30, "two failed uploads (ENOSPC)", until=lambda n: n >= 2
        )
        for _ in sample_for(1.0, 0.2):
            assert checkpoint(cluster).uploaded_offset == before.uploaded_offset, "committed on a full disk"
        check_whole(cluster, checkpoint(cluster))
    finally:
        disk.disk_full(False)
    log_text = (cluster.root / "logs" / "broker-a-1.log").read_text()
    assert "No space left on device" in log_text and "nothing of it is committed" in log_text
    after = wait_uploaded_to(cluster, confirm_offset(cluster), timeout_s=60)
    assert after.uploaded_offset > before.uploaded_offset
    check_whole(cluster, after)


def test_eio_on_a_tiered_fsync_fails_that_upload_and_the_next_succeeds(tiered):
    cluster, disk, producer = tiered
    eio_before = failures(cluster, "eio")
    before = checkpoint(cluster)
    disk.fail_next_fsync(count=1)
    produce(producer, 20)
    wait_for(lambda: failures(cluster, "eio"), 30, "an upload failed by EIO", until=lambda n: n > eio_before)
    after = wait_uploaded_to(cluster, confirm_offset(cluster))
    assert after.uploaded_offset > before.uploaded_offset
    check_whole(cluster, after)

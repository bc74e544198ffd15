"""Fixtures of the audit tests: one real cluster's data dir per test session, and one
Spark session per test session (both module-level singletons, so any audit test module
can import them without touching the shared conftest.py).

The data dir comes from a real run: 3 controllers, one broker set of 3 replicas
uploading to a local tiered store, load, a kill -9 of the master in the middle (a
slave takes over; the old master restarts and rejoins as a slave), more load, then
a clean stop. Fault tests copy it and craft one fault in the copy.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import time
from pathlib import Path

from cluster.harness import Cluster
from mqmeta.broker_client import Producer
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb

FLAGS = [
    "--ha-max-time-slave-not-catchup-ms",
    "1500",
    "--send-timeout-ms",
    "3000",
    "--tiered-upload-bytes",
    "8192",
    "--tiered-upload-interval-ms",
    "200",
    "--segment-bytes",
    "65536",
]
BROKER_SET = "DefaultCluster/broker-a"
_lock = threading.Lock()
_clean_dir: Path | None = None


class _Load(threading.Thread):
    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(cluster.namesrv, timeout_s=8.0)
        self.stop_event = threading.Event()
        self.acked = 0

    def run(self) -> None:
        for i in range(100_000):
            if self.stop_event.is_set():
                break
            try:
                self.producer.send("Orders", [f"v{i}-{k}".encode() * 8 for k in range(4)])
                self.acked += 4
            except MqmetaError:
                time.sleep(0.05)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=20)
        self.producer.close()


def _uploaded(cluster: Cluster) -> int:
    with cluster.client() as client:
        checkpoint = client.call(
            "GetTieredCheckpoint", pb.BrokerSetRef(cluster="DefaultCluster", broker_name="broker-a")
        )
    return int(checkpoint.uploaded_offset)


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except MqmetaError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _in_sync(cluster: Cluster, members: int) -> str:
    found: list[str] = []

    def ready() -> bool:
        master = cluster.master_of("broker-a", timeout_s=5)
        found[:] = [master]
        return len(cluster.broker_status(master).sync_state_set) == members

    _wait(ready, 30, f"a SyncStateSet of {members}")
    return found[0]


def build_clean_data(root: Path) -> Path:
    """Runs the cluster described above under `root`; returns its data dir."""
    cluster = Cluster(root / "cluster", broker_sets=1, replicas=3, broker_flags=FLAGS)
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
        old = _in_sync(cluster, 3)
        load = _Load(cluster)
        load.start()
        try:
            _wait(lambda: _uploaded(cluster) >= 40_000, 40, "the first uploads")
            cluster.kill(old)  # kill -9 of the master, likely mid-upload
            cluster.master_of("broker-a", exclude=old, timeout_s=15)
            before = _uploaded(cluster)
            _wait(lambda: _uploaded(cluster) >= before + 40_000, 40, "uploads by the new master")
            cluster.start_broker(old)
            _in_sync(cluster, 3)
            time.sleep(0.5)
        finally:
            load.stop()
        time.sleep(1.5)  # the last uploads and acknowledgements settle
    finally:
        cluster.stop()
    return root / "cluster"


def clean_data_dir() -> Path:
    """The session's clean data dir (built on first use)."""
    global _clean_dir
    with _lock:
        if _clean_dir is None:
            root = Path(tempfile.mkdtemp(prefix="mqmeta-audit-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _clean_dir = build_clean_data(root)
        return _clean_dir


def copy_data_dir(destination: Path) -> Path:
    target = destination / "cluster"
    shutil.copytree(clean_data_dir(), target)
    return target


def spark_session():
    """The one Spark session of the test run (local[2], 4 shuffle partitions, no UI)."""
    from spark.session import get_session

    return get_session("local[2]")

"""Fixtures of the audit tests: one real cluster's data dir per test session, and one
Spark session per test session (both module-level singletons, so any audit test module
can import them without touching the shared conftest.py).

The data dir comes from a real run: 3 controllers, one broker set of 3 replicas
uploading to a local tiered store, load, a kill -9 of the master in the middle (a
slave takes over; the old master restarts and rejoins as a slave), more load, then,
once every replica holds the whole log and everything confirmed is uploaded, a clean
stop. Fault tests copy it and craft one fault in the copy.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path

import grpc
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.wait import WaitTimeout, wait_for

from mqmeta.broker_client import Producer
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb
from tests.support.broker_sets import wait_in_sync

# After the load stops, uploads catch up with the log (about 1 MB here); on a loaded 2-core
# machine a round of uploads (marker, Raft start, objects, Raft commit) can take seconds.
SETTLE_TIMEOUT_S = 60
LOG_TAIL_LINES = 25

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
SEND_RETRY_PAUSE_S = 0.05
# Sends acknowledged after the old master rejoined, before the clean stop.
ACKED_AFTER_REJOIN_MIN = 100
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
                self.producer.send(
                    "Orders",
                    [f"v{i}-{k}".encode() * 8 for k in range(4)],
                    keys=[f"key-{(i + k) % 7} v{i}-{k}" for k in range(4)],  # K1 has keys to check
                )
                self.acked += 4
            except MqmetaError:
                # Not synchronisation: a load generator's pause after a failed send (during
                # the failover), so it does not spin on a broker set without a master.
                self.stop_event.wait(SEND_RETRY_PAUSE_S)

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


def _progress(cluster: Cluster) -> dict[str, int]:
    """The broker set's progress: the writable master's log end and confirm offset (-1 with
    no writable master), the shortest replica's log end, and the uploaded offset."""
    master = cluster.writable_master("broker-a")
    status = cluster.broker_status(master) if master else None
    return {
        "max_offset": status.max_offset if status else -1,
        "confirm_offset": status.confirm_offset if status else -1,
        "shortest_replica": min(cluster.broker_status(b.name).max_offset for b in cluster.layout.brokers),
        "uploaded_offset": _uploaded(cluster),
    }


def _log_tails(cluster: Cluster) -> str:
    """The last lines of each broker's log: where an upload that stopped says why."""
    tails = []
    for broker in cluster.layout.brokers:
        path = cluster.root / "logs" / f"{broker.name}.log"
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if path.exists() else []
        tails.append(f"--- {path}\n" + "\n".join(lines))
    return "\n".join(tails)


def _settled(progress: dict[str, int]) -> bool:
    """Every replica holds the master's whole log, all of it confirmed and uploaded."""
    return (
        progress["max_offset"]
        == progress["confirm_offset"]
        == progress["shortest_replica"]
        == progress["uploaded_offset"]
        >= 0
    )


def build_clean_data(root: Path) -> Path:
    """Runs the cluster described above under `root`; returns its data dir."""
    cluster = Cluster(root / "cluster", broker_sets=1, replicas=3, broker_flags=FLAGS)
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
        old = wait_in_sync(cluster, 3, timeout_s=30)
        load = _Load(cluster)
        load.start()
        try:
            retry = (MqmetaError,)
            wait_for(lambda: _uploaded(cluster) >= 40_000, 40, "the first uploads", retry_on=retry)
            cluster.kill(old)  # kill -9 of the master, likely mid-upload
            cluster.master_of("broker-a", exclude=old, timeout_s=15)
            before = _uploaded(cluster)
            wait_for(
                lambda: _uploaded(cluster) >= before + 40_000, 40, "uploads by the new master", retry_on=retry
            )
            cluster.start_broker(old)
            wait_in_sync(cluster, 3, timeout_s=30)
            rejoined_at = load.acked
            wait_for(
                lambda: load.acked >= rejoined_at + ACKED_AFTER_REJOIN_MIN,
                20,
                f"{ACKED_AFTER_REJOIN_MIN} more acknowledged sends after the old master rejoined",
            )
        finally:
            load.stop()
        try:
            wait_for(
                lambda: _progress(cluster),
                SETTLE_TIMEOUT_S,
                "every replica to hold the whole log, confirmed and uploaded",
                until=_settled,
                retry_on=(MqmetaError, grpc.RpcError),
            )
        except WaitTimeout as stuck:
            raise WaitTimeout(f"{stuck}\n{_log_tails(cluster)}") from None
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
    from mqmeta.spark.session import get_session

    return get_session("local[2]")


def audit_in_shared_session(output_dir: Path, report_dir: Path) -> int:
    """The Spark audit over a chaos run's data dirs, in this process's one Spark session."""
    from mqmeta.spark.cli import run_checks
    from mqmeta.spark.registry import parse_ids

    return run_checks([str(output_dir)], report_dir, None, parse_ids(None))

"""Tiered storage under failover, with real controller, nameserver and broker processes.

Properties checked (docs/design/properties.md, T1-T4):
- T1: the uploaded offset never exceeds the master's confirm offset, sampled all along
  while a slave is paused (its stall holds the confirm offset, and so the upload);
- kill -9 of the master in the middle of uploading: the new master resumes from the
  controller's checkpoint; the committed segments tile [0, uploaded) with no gap or
  overlap (T3) and each equals the replicas' bytes for the same offsets (T2);
- the checkpoint never moves backwards across failovers (T4);
- the whole broker set killed and restarted: uploads continue from the checkpoint;
- an empty slave bootstrapping from the tiered store while the master is killed -9 ends
  byte-identical with the new master, and no acknowledged message is lost;
- slaves apply local retention too, never past the controller's committed checkpoint.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from mqmeta.broker_agent.confirm_log import read_confirm_log
from mqmeta.broker_agent.tiered_backend import LocalBackend

from mqmeta.broker_client import Producer
from mqmeta.errors import MqmetaError
from mqmeta.formats.tiered import SegmentMeta, find_gaps_and_overlaps
from mqmeta.pb import controller_pb2 as pb
from tests.support import consume_all, sample_for, wait_for, wait_in_sync, wait_same_end

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

FLAGS = [
    "--ha-max-time-slave-not-catchup-ms",
    "1500",
    "--send-timeout-ms",
    "3000",
    "--tiered-upload-bytes",
    "8192",
    "--tiered-upload-interval-ms",
    "200",
]
SEGMENT_BYTES = 16384
RETENTION_FLAGS = FLAGS + [
    "--segment-bytes",
    str(SEGMENT_BYTES),
    "--local-retention-bytes",
    str(SEGMENT_BYTES),
]
SAMPLE_INTERVAL_S = 0.02
T1_SAMPLES_MIN = 31
NEW_MASTER_SEGMENTS_MIN = 4
RETENTION_SAMPLE_INTERVAL_S = 0.1


def tiered_cluster(cluster_factory):
    cluster = cluster_factory(broker_sets=1, replicas=3, broker_flags=FLAGS).start()
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
    return cluster


def checkpoint(cluster) -> pb.TieredCheckpoint:
    with cluster.client() as client:
        return client.call(
            "GetTieredCheckpoint", pb.BrokerSetRef(cluster="DefaultCluster", broker_name="broker-a")
        )


class Load(threading.Thread):
    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(cluster.namesrv, timeout_s=8.0)
        self.stop_event = threading.Event()
        self.acked = 0
        self.acked_bodies: list[bytes] = []

    def run(self) -> None:
        for i in range(100_000):
            if self.stop_event.is_set():
                break
            bodies = [f"v{i}-{k}".encode() * 8 for k in range(4)]
            try:
                self.producer.send("Orders", bodies)
                self.acked += 4
                self.acked_bodies += bodies
            except MqmetaError:
                pass

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=20)
        self.producer.close()


def wait_uploaded(
    cluster, at_least: int, seen: list[tuple[int, int]] | None = None, timeout_s: float = 30.0
) -> pb.TieredCheckpoint:
    """Waits until the checkpoint covers `at_least`; appends (epoch, uploaded offset) of
    every checkpoint read to `seen`."""

    def read() -> pb.TieredCheckpoint:
        current = checkpoint(cluster)
        if seen is not None:
            seen.append((current.checkpoint_epoch, current.uploaded_offset))
        return current

    return wait_for(
        read,
        timeout_s,
        f"uploads to reach offset {at_least}",
        until=lambda current: current.uploaded_offset >= at_least,
    )


def replica_bytes(store_dir: Path, base: int, end: int) -> bytes:
    """Bytes [base, end) of a replica's commit log, read straight from its segment files."""
    out = bytearray()
    for path in sorted(store_dir.rglob("*.log")):
        start = int(path.stem)
        data = path.read_bytes()
        lo, hi = max(base, start), min(end, start + len(data))
        if lo < hi:
            out += data[lo - start : hi - start]
    return bytes(out)


class _ReadRaced(Exception):
    """A replica's read of the uploaded range came back short: retention deleted a segment
    while it was read, or a slave has not written that far yet. Read again."""


def _tiered_equals_replicas(cluster) -> tuple[int, pb.TieredCheckpoint]:
    """One look: T3 over the committed range, and T2 against every running replica that
    still holds uploaded bytes; returns how many replicas were compared, and the checkpoint."""
    current = checkpoint(cluster)
    metas = [
        SegmentMeta(
            key=s.key,
            base_offset=s.base_offset,
            end_offset=s.end_offset,
            size=s.size,
            sha256=s.sha256,
            record_count=s.record_count,
            first_epoch=s.first_epoch,
            last_epoch=s.last_epoch,
        )
        for s in current.segments
    ]
    assert metas and metas[0].base_offset == 0
    assert find_gaps_and_overlaps(metas) == [], "T3: gaps or overlaps in the tiered range"
    assert metas[-1].end_offset == current.uploaded_offset
    backend = LocalBackend(cluster.root / "tiered")
    tiered = b"".join(backend.get(m.key) for m in metas)
    compared = 0
    for broker in cluster.layout.brokers:
        if cluster.is_running(broker.name):
            store = cluster.root / broker.data_dir / "store"
            local_min = int(sorted(store.rglob("*.log"))[0].stem)  # retention may have cut it
            if local_min >= current.uploaded_offset:
                continue  # it holds no uploaded byte (retention cut at the uploaded offset)
            held = replica_bytes(store, local_min, current.uploaded_offset)
            if len(held) != current.uploaded_offset - local_min:
                raise _ReadRaced(f"{broker.name} gave {len(held)} bytes from {local_min}")
            assert held == tiered[local_min:], f"T2: the tiered bytes differ from {broker.name}'s log"
            compared += 1
    return compared, current


def check_tiered_equals_replicas(cluster, replicas_min: int = 2) -> pb.TieredCheckpoint:
    """T2/T3 over the committed range, against at least `replicas_min` replicas; returns the
    checkpoint checked. With local retention on every replica a replica may hold no uploaded
    byte at one instant (it cut its log at the uploaded offset, and the next upload has not
    committed), so this looks again until enough do."""
    return wait_for(
        lambda: _tiered_equals_replicas(cluster),
        30,
        f"T2 to be checked against at least {replicas_min} replicas holding uploaded bytes "
        "(last value: replicas compared, checkpoint)",
        until=lambda found: found[0] >= replicas_min,
        retry_on=(_ReadRaced, FileNotFoundError),
        interval_s=0.2,
    )[1]


def check_confirm_logs_cover_uploads(cluster, current: pb.TieredCheckpoint) -> None:
    """The audit's T1 evidence: each committed segment ends at or below a confirm offset that a
    master logged (confirm.log) in an epoch no later than the checkpoint's. (A segment's own
    last record epoch can be older than the epoch that uploaded it: a new master uploads the
    old master's records; the audit's T1 pairs each segment with its commit's epoch.)"""
    lines = []
    for broker in cluster.layout.brokers:
        lines += read_confirm_log(cluster.root / broker.data_dir / "confirm.log")
    masters = [r for r in lines if r["role"] == "MASTER"]
    assert masters, "masters write confirm.log lines"
    for segment in current.segments:
        covering = [r["confirm_offset"] for r in masters if r["epoch"] <= current.checkpoint_epoch]
        assert covering and max(covering) >= segment.end_offset, (
            f"no confirm.log line covers the segment ending at {segment.end_offset}"
        )


def test_upload_never_passes_the_confirm_offset(cluster_factory):
    cluster = tiered_cluster(cluster_factory)
    master = wait_in_sync(cluster, 3)
    load = Load(cluster)
    load.start()
    violations, samples = [], 0
    slave = next(b.name for b in cluster.layout.brokers if b.name != master)
    try:
        wait_uploaded(cluster, 1)
        paused = False
        # 1 s, then 3 s with a slave frozen, and at least T1_SAMPLES_MIN samples
        for elapsed_s in sample_for(4.0, SAMPLE_INTERVAL_S, T1_SAMPLES_MIN, duration_max_s=30):
            if not paused and elapsed_s >= 1.0:
                cluster.pause(slave)  # the confirm offset (and so the upload) must stall
                paused = True
            uploaded = checkpoint(cluster).uploaded_offset
            confirm = cluster.broker_status(master).confirm_offset  # read after: >= then
            samples += 1
            if uploaded > confirm:
                violations.append((uploaded, confirm))
    finally:
        cluster.resume(slave)
        load.stop()
    assert samples >= T1_SAMPLES_MIN and not violations, f"T1 violated: {violations[:5]}"


def test_kill_master_mid_upload_new_master_resumes_from_the_checkpoint(cluster_factory):
    cluster = tiered_cluster(cluster_factory)
    old = wait_in_sync(cluster, 3)
    old_id = cluster.broker_status(old).broker_id
    load = Load(cluster)
    load.start()
    seen: list[tuple[int, int]] = []  # (epoch, uploaded offset) of every checkpoint read
    try:
        before = wait_uploaded(cluster, 20_000, seen)
        cluster.kill(old)  # uploads every 200 ms: likely in the middle of one
        cluster.master_of("broker-a", exclude=old, timeout_s=15)
        after = wait_uploaded(cluster, before.uploaded_offset + 20_000, seen)
        assert after.checkpoint_epoch > before.checkpoint_epoch, "the new master uploaded"
        offsets = [uploaded for _, uploaded in seen]
        assert offsets == sorted(offsets) and seen == sorted(seen), f"T4: it moved backwards: {seen}"
        with cluster.client() as client:  # the old master's late commit
            with pytest.raises(MqmetaError) as late:
                client.call(
                    "TieredCommit",
                    pb.TieredCommitRequest(
                        cluster="DefaultCluster",
                        broker_name="broker-a",
                        master_broker_id=old_id,
                        master_epoch=before.checkpoint_epoch,
                        upload_id="late",
                        segments=[before.segments[-1]],
                    ),
                )
        assert late.value.code == "FENCED_MASTER_EPOCH"
    finally:
        load.stop()
    check_confirm_logs_cover_uploads(cluster, check_tiered_equals_replicas(cluster))


def test_whole_broker_set_restart_continues_uploads(cluster_factory):
    cluster = tiered_cluster(cluster_factory)
    wait_in_sync(cluster, 3)
    load = Load(cluster)
    load.start()
    try:
        before = wait_uploaded(cluster, 10_000)
    finally:
        load.stop()
    for broker in cluster.layout.brokers:
        cluster.kill(broker.name)
    for broker in cluster.layout.brokers:
        cluster.start_broker(broker.name)
    wait_in_sync(cluster, 3, timeout_s=30)
    load = Load(cluster)
    load.start()
    try:
        wait_uploaded(cluster, before.uploaded_offset + 10_000)  # they continue
    finally:
        load.stop()
    check_tiered_equals_replicas(cluster)


def test_empty_slave_bootstraps_from_the_tiered_store(cluster_factory):
    """The master keeps only what retention allows; an empty slave copies the rest from the
    tiered store (OFFSET_MOVED_TO_TIERED_STORAGE), then replicates, and ends byte-identical."""
    cluster = cluster_factory(broker_sets=1, replicas=3, broker_flags=RETENTION_FLAGS).start()
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
    master = wait_in_sync(cluster, 3)
    load = Load(cluster)
    load.start()
    try:
        wait_uploaded(cluster, 120_000)
        wait_for(
            lambda: cluster.broker_status(master).max_offset,
            20,
            "the master's log to pass offset 150000",
            until=lambda end: end >= 150_000,
        )
    finally:
        load.stop()
    wait_for(  # one more upload round and its retention
        lambda: _master_min_offset(cluster, master),
        10,
        "retention to delete the master's first segments",
        until=lambda master_min: master_min > 0,
        retry_on=(FileNotFoundError,),
    )
    slave = next(b.name for b in cluster.layout.brokers if b.name != master)
    cluster.kill(slave)
    shutil.rmtree(cluster.root / cluster.broker(slave).data_dir / "store")
    cluster.start_broker(slave)
    end = wait_same_end(cluster, [slave, master], timeout_s=30)
    log_text = (cluster.root / "logs" / f"{slave}.log").read_text()
    assert "bootstrapped [0," in log_text, "the slave did not use the tiered store"
    # retention may delete a segment of either replica while it is read: read again then
    _, (on_master, on_slave) = _read_same_range(cluster, [master, slave], end)
    assert on_slave == on_master
    master_min = _master_min_offset(cluster, master)  # retention may have moved it again
    check_tiered_equals_replicas(cluster, replicas_min=1)
    # A new consumer group starts at queue offset 0, which only the tiered store holds now;
    # it must read every acknowledged message.
    seen = consume_all(cluster, "fresh", load.acked_bodies)
    assert min(m.commit_offset for m in seen) < master_min, "nothing came from the tiered store"


def _master_min_offset(cluster, master: str) -> int:
    files = sorted((cluster.root / cluster.broker(master).data_dir / "store").rglob("*.log"))
    return int(files[0].stem)


def _local_min_offset(cluster, name: str) -> int:
    return _master_min_offset(cluster, name)


def _read_same_range(cluster, names: list[str], end: int) -> tuple[int, list[bytes]]:
    """Bytes [lo, end) of each named replica's log, lo being the highest local start; read
    again when retention deletes a segment in the middle of a read."""
    stores = [cluster.root / cluster.broker(n).data_dir / "store" for n in names]
    copies: list[bytes] = []

    def read() -> tuple[int, list[int]]:
        lo = max(_local_min_offset(cluster, n) for n in names)
        copies[:] = [replica_bytes(store, lo, end) for store in stores]
        return lo, [len(c) for c in copies]

    lo, _ = wait_for(
        read,
        10,
        f"a whole read of [lo, {end}) from {', '.join(names)} (last value: lo, bytes read each)",
        until=lambda found: all(length == end - found[0] for length in found[1]),
        retry_on=(FileNotFoundError,),
        interval_s=0.25,
    )
    return lo, copies


def _wait_log_line(path: Path, start: int, text: str, timeout_s: float) -> None:
    """Waits until `text` appears in the log at `path` after byte `start` (polled every 5 ms:
    the test acts on the line at once)."""

    def appeared() -> bool:
        with open(path, "rb") as f:
            f.seek(start)
            return text.encode() in f.read()

    wait_for(appeared, timeout_s, f"{text!r} in {path.name}", retry_on=(FileNotFoundError,), interval_s=0.005)


@pytest.mark.timeout(90)
def test_master_killed_while_an_empty_slave_bootstraps(cluster_factory):
    """Switching again mid-bootstrap: an empty slave is copying the tiered range (the master
    answered OFFSET_MOVED_TO_TIERED_STORAGE) when the master is killed -9. The slave is
    frozen as soon as it starts bootstrapping, the master killed, a new one elected, then
    the slave thawed: its bootstrap sees the session change, stops, and resumes against
    the new master (whose own retention cut its log too: tiered again, then replication).
    It must end byte-identical with the new master, and every acknowledged message stays."""
    cluster = cluster_factory(broker_sets=1, replicas=3, broker_flags=RETENTION_FLAGS).start()
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
    old = wait_in_sync(cluster, 3)
    load = Load(cluster)
    load.start()
    try:
        wait_uploaded(cluster, 150_000)
        empty, other = [b.name for b in cluster.layout.brokers if b.name != old]
        empty_id = cluster.broker_status(empty).broker_id
        cluster.kill(empty)
        shutil.rmtree(cluster.root / cluster.broker(empty).data_dir / "store")
        wait_for(  # out of the SyncStateSet: never elected while empty
            lambda: list(cluster.broker_status(old).sync_state_set),
            15,
            f"{empty} (id {empty_id}) to leave the SyncStateSet",
            until=lambda members: empty_id not in members,
        )
        log_path = cluster.root / "logs" / f"{empty}.log"
        start = log_path.stat().st_size if log_path.exists() else 0
        cluster.start_broker(empty)
        _wait_log_line(log_path, start, "bootstrapping [0,", 20)  # a tiered bootstrap
        cluster.pause(empty)  # freeze it mid-bootstrap
        try:
            cluster.kill(old)
            new = cluster.master_of("broker-a", exclude=old, timeout_s=15)
            assert new == other
        finally:
            cluster.resume(empty)
        grown_from = cluster.broker_status(new).max_offset
        wait_for(  # the load goes on against the new master (its retention cuts again)
            lambda: cluster.broker_status(new).max_offset,
            20,
            f"{NEW_MASTER_SEGMENTS_MIN} more segments written on the new master",
            until=lambda end: end >= grown_from + NEW_MASTER_SEGMENTS_MIN * SEGMENT_BYTES,
        )
    finally:
        load.stop()
    end = wait_same_end(cluster, [empty, other], timeout_s=30)
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    lo, copies = _read_same_range(cluster, [empty, other], end)
    assert lo < end, "retention left nothing to compare"
    assert copies[0] == copies[1], "the bootstrapped slave differs from the new master"
    # the old master restarted: all three agree, and the tiered copy equals them
    cluster.start_broker(old)
    wait_in_sync(cluster, 3, timeout_s=30)
    check_tiered_equals_replicas(cluster)
    consume_all(cluster, "after-switch", load.acked_bodies)  # every acknowledged message
    print(
        "bootstrap interrupted by the switch:",
        "bootstrap stopped at" in text,
        "| tiered bootstraps:",
        text.count("bootstrapping ["),
    )


@pytest.mark.timeout(60)
def test_slaves_apply_local_retention(cluster_factory):
    """A slave's local log is cut like the master's: only what the controller's committed
    checkpoint covers and past local retention; every replica keeps a bounded log, and the
    bytes kept still equal the tiered copy."""
    cluster = cluster_factory(broker_sets=1, replicas=3, broker_flags=RETENTION_FLAGS).start()
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
    wait_in_sync(cluster, 3)
    load = Load(cluster)
    load.start()
    violations: list[tuple[str, int, int]] = []
    try:
        wait_uploaded(cluster, 100_000)
        for _ in sample_for(4.0, RETENTION_SAMPLE_INTERVAL_S):  # while it runs: never past the checkpoint
            local_mins = {b.name: _local_min_offset(cluster, b.name) for b in cluster.layout.brokers}
            uploaded = checkpoint(cluster).uploaded_offset  # read after: it only grows
            violations += [
                (name, local_min, uploaded) for name, local_min in local_mins.items() if local_min > uploaded
            ]
    finally:
        load.stop()
    before = checkpoint(cluster).uploaded_offset
    assert not violations, f"local segments deleted past the checkpoint: {violations[:3]}"

    def retention_state() -> tuple[dict[str, tuple[int, int, int]], int]:
        """Each replica's (local start offset, bytes kept, log end), then the uploaded offset
        (read after: it only grows)."""
        state = {}
        for broker in cluster.layout.brokers:
            store = cluster.root / broker.data_dir / "store"
            kept = sum(p.stat().st_size for p in store.rglob("*.log"))
            max_offset = cluster.broker_status(broker.name).max_offset
            state[broker.name] = (_local_min_offset(cluster, broker.name), kept, max_offset)
        return state, checkpoint(cluster).uploaded_offset

    def bounded(found: tuple[dict[str, tuple[int, int, int]], int]) -> bool:
        # retention 16 KiB + at most one whole 16 KiB segment + what was not uploaded when
        # this broker last learned the checkpoint (at or after `before`; a slave asks for
        # it at most once a second)
        return all(
            local_min > 0 and kept <= max_offset - before + 3 * SEGMENT_BYTES
            for local_min, kept, max_offset in found[0].values()
        )

    state, uploaded = wait_for(
        retention_state,
        10,
        "every replica to apply retention once it knows the checkpoint "
        "(last value: local start offset, bytes kept and log end of each, uploaded offset)",
        until=bounded,
        retry_on=(FileNotFoundError,),  # retention deleted a segment while it was listed
    )
    for name, (local_min, _, _) in state.items():
        assert local_min <= uploaded, f"{name} deleted segments past the checkpoint"
    check_tiered_equals_replicas(cluster)

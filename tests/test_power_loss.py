"""A power loss of a whole cluster loses no acknowledged message.

`mqmeta local up` runs with its data dir on the fault filesystem (chaos/faultfs); a
producer sends while the cluster runs; then every process is killed -9 and the power is
lost (every write not fsynced is gone: what kill -9 alone never shows, since the page
cache survives it). The cluster must start again from what was durable, and a consumer
must receive every message the producer had acknowledged. A broker that acknowledged
before its commit log's fdatasync (or a controller before its journal's) fails this.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mqmeta.chaos.faultfs import FaultFs
from mqmeta.cluster.supervisor import runs
from mqmeta.cluster.wait import wait_for

from tests.support.local_up import start_local_up, stop_local_up

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]

MQMETA = [sys.executable, "-m", "mqmeta.cli"]
READY_TIMEOUT_S = 120.0
TOPIC = "Durable"


def _run(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MQMETA, *args], capture_output=True, text=True, timeout=timeout_s)


def _acknowledged(record: Path) -> set[str]:
    """The values of the --record file's complete lines (a kill may cut the last)."""
    values = set()
    for line in record.read_text().splitlines():
        try:
            values.add(json.loads(line)["value"])
        except (json.JSONDecodeError, KeyError):
            pass
    return values


def _kill_everything(local: subprocess.Popen[bytes], document: dict) -> None:
    """kill -9 local up (so it restarts nothing), then every process it started."""
    local.kill()
    local.wait()
    for group in ("controllers", "namesrv", "brokers"):
        for child in document.get(group, []):
            if child.get("pid"):
                try:
                    os.kill(child["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for group in ("controllers", "namesrv", "brokers"):
        for child in document.get(group, []):
            if child.get("pid"):
                wait_for(lambda pid=child["pid"]: not runs(pid), 30, f"pid {child['pid']} gone")


def _power_loss_round(
    tmp_path: Path, flags: tuple[str, ...], count: int, acked_min: int, writeback_fraction: float = 0.0
) -> None:
    (tmp_path / "backing").mkdir()
    (tmp_path / "mnt").mkdir()
    record = tmp_path / "sent.jsonl"  # off the mount: the producer's memory of its acks
    with FaultFs.mount(tmp_path / "backing", tmp_path / "mnt", log_path=tmp_path / "faultfs.log") as fs:
        data_dir = fs.mountpoint / "local"
        local, document = start_local_up(data_dir, *flags, timeout_s=READY_TIMEOUT_S)
        producer = None
        try:
            controllers = ",".join(c["grpc"] for c in document["controllers"])
            created = _run("admin", "--controllers", controllers, "topic", "create", TOPIC, "--queues", "2")
            assert created.returncode == 0, created.stderr
            namesrv = document["namesrv"][0]["grpc"]
            producer = subprocess.Popen(
                [*MQMETA, "produce", "--namesrv", namesrv, "--topic", TOPIC, "--count", str(count)]
                + ["--size", "200", "--batch", "1", "--record", str(record)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for(
                lambda: len(_acknowledged(record)) if record.exists() else 0,
                90,
                f"{acked_min} acknowledged messages",
                until=lambda n: n >= acked_min,
            )
        finally:
            _kill_everything(local, document)
            if producer is not None:
                producer.kill()
                producer.wait()
        acknowledged = _acknowledged(record)
        status = fs.lose_power(writeback_fraction, seed=1)
        assert status["counters"]["power_losses"] == 1
        local, document = start_local_up(data_dir, *flags, timeout_s=READY_TIMEOUT_S)
        try:
            namesrv = document["namesrv"][0]["grpc"]
            received_file = tmp_path / "received.jsonl"
            consumed = _run(
                "consume",
                "--namesrv",
                namesrv,
                "--topic",
                TOPIC,
                "--group",
                "after-power-loss",
                "--until-idle",
                "3",
                "--record",
                str(received_file),
            )
            assert consumed.returncode == 0, consumed.stderr
            received = _acknowledged(received_file)
        finally:
            stop_local_up(local)
    lost = acknowledged - received
    counters = status["counters"]
    print(
        f"power loss: {len(acknowledged)} acknowledged, {len(received)} received, {len(lost)} lost; "
        f"{counters['pages_lost']} dirty pages lost, {counters['pages_torn_in']} written back"
    )
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged messages lost by the power loss"


def test_power_loss_of_a_one_broker_cluster_loses_no_acknowledged_message(tmp_path: Path) -> None:
    """One controller, one broker (its own fdatasync is the only thing behind an ack)."""
    _power_loss_round(tmp_path, ("--controllers", "1", "--replicas", "1"), count=100_000, acked_min=150)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_power_loss_of_a_replicated_cluster_loses_no_acknowledged_message(tmp_path: Path) -> None:
    """Three controllers, a master and two slaves, all losing power at once; half the
    dirty pages were written back before the cut (torn tails, in any page order)."""
    _power_loss_round(tmp_path, (), count=100_000, acked_min=1000, writeback_fraction=0.5)

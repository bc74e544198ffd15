"""`mqmeta local up --clusters 2 --replicate` as a user runs it, in real processes.

Properties checked (one two-cluster `local up` serves the module; its last test stops it):
- clusters a and b and a worker with a rule a -> b for every topic; cluster.json lists
  them; produce --tag/--keys at a is consumed at b with its tag, keys and origin;
- the replicator has a metrics endpoint (cluster.json `replicators[].metrics`); killed -9,
  it is started again (cluster.json names its new pid) and goes on: what is produced
  afterwards reaches b, and `admin replicator-status` counts exactly the copies b holds;
- a data dir knows its cluster: `local up` with another --clusters, a broker started with
  another cluster's data dir, and a data dir whose broker id the controllers hold for
  another broker (same cluster name) each end at once with one sentence and exit 2;
- Ctrl-C (SIGINT to the launcher's process group): every child ends on its own within
  STOP_WITHIN_S, and cluster.json then says the cluster is stopped (no pid): a command
  given --cluster-dir DIR says so (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.supervisor import runs
from mqmeta.cluster.wait import WaitTimeout

from tests.support import wait_for
from tests.support.local_up import MQMETA, start_local_up

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

FLAGS = ["--controllers", "1", "--replicas", "2", "--clusters", "2", "--replicate"]
REPLICATE_TIMEOUT_S = 60.0
RESTART_TIMEOUT_S = 30.0
STOP_WITHIN_S = 3.0  # after Ctrl-C, each child on its own (the launcher kills only after 10 s)


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """(the launcher, its data dir); the last test stops it, else the teardown does."""
    data_dir = tmp_path_factory.mktemp("local-up") / "local"
    proc, _ = start_local_up(data_dir, *FLAGS, timeout_s=90)
    try:
        yield proc, data_dir
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def mqmeta(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*MQMETA, *args], capture_output=True, text=True, timeout=timeout_s)


def document_of(data_dir: Path) -> dict:
    return json.loads((data_dir / "cluster.json").read_text())


def create_topic(document: dict, topic: str) -> None:
    for cluster in document["clusters"]:
        controllers = cluster["controllers"][0]["grpc"]
        create = ["topic", "create", topic, "--cluster", cluster["name"], "--queues", "2"]
        created = mqmeta("admin", "--controllers", controllers, *create)
        assert created.returncode == 0, created.stderr


def produce(document: dict, topic: str, count: int, *flags: str) -> None:
    source = document["clusters"][0]["namesrv"][0]["grpc"]
    produced = mqmeta("produce", "--namesrv", source, "--topic", topic, "--count", str(count), *flags)
    assert produced.returncode == 0, produced.stderr


def received_at_b(document: dict, topic: str, record: Path, count: int) -> list[dict]:
    """What a new group reads of `topic` at b, once it has read `count` messages."""
    target = document["clusters"][1]["namesrv"][0]["grpc"]

    def read() -> int:
        consume = ["consume", "--namesrv", target, "--topic", topic, "--group", f"g-{record.stem}"]
        mqmeta(*consume, "--until-idle", "0.5", "--record", str(record))
        return len(record.read_text().splitlines()) if record.exists() else 0

    wait_for(read, REPLICATE_TIMEOUT_S, f"{count} copies of {topic} at b", until=lambda n: n >= count)
    return [json.loads(line) for line in record.read_text().splitlines()]


def assert_bad_input(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("mqmeta: error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_two_clusters_replicate_with_tags_keys_and_origin(up, tmp_path):
    _, data_dir = up
    document = document_of(data_dir)
    assert document["state"] == "running"
    assert [c["name"] for c in document["clusters"]] == ["a", "b"]
    assert document["controllers"] == document["clusters"][0]["controllers"]
    assert {b["cluster"] for b in document["clusters"][1]["brokers"]} == {"b"}
    create_topic(document, "Local")
    produce(document, "Local", 20, "--tag", "T", "--keys", "k1,k2")
    lines = received_at_b(document, "Local", tmp_path / "received.jsonl", 20)
    assert len(lines) == 20 and len({r["value"] for r in lines}) == 20
    assert all((r["tag"], r["keys"], r["origin"]["cluster"]) == ("T", ["k1", "k2"], "a") for r in lines)


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return reply.read().decode()


def replicated_by_status(document: dict) -> int:
    controllers = document["clusters"][1]["controllers"][0]["grpc"]  # the leases live at b
    shown = mqmeta("admin", "--controllers", controllers, "replicator-status", "--json")
    assert shown.returncode == 0, shown.stderr
    return sum(rule["replicated"] for rule in json.loads(shown.stdout)["rules"])


def test_the_replicator_has_metrics_and_is_restarted_after_kill_9(up, tmp_path):
    _, data_dir = up
    document = document_of(data_dir)
    (replicator,) = document["replicators"]
    assert replicator["metrics"], "the replicator has no metrics endpoint"
    wait_for(
        lambda: "mqmeta_replicator_replicated" in scrape(replicator["metrics"]),
        30,
        "the replicator's task metrics",
        retry_on=(OSError,),
    )
    create_topic(document, "Restarted")
    produce(document, "Restarted", 100, "--batch", "10")
    received_at_b(document, "Restarted", tmp_path / "before.jsonl", 100)
    os.kill(replicator["pid"], signal.SIGKILL)
    again = wait_for(
        lambda: document_of(data_dir)["replicators"][0]["pid"],
        RESTART_TIMEOUT_S,
        "cluster.json to name a restarted replicator",
        until=lambda pid: pid != replicator["pid"],
    )
    os.kill(again, 0)  # it runs
    wait_for(
        lambda: "mqmeta_replicator" in scrape(replicator["metrics"]),
        30,
        "the restarted replicator's metrics",
        retry_on=(OSError,),
    )
    produce(document, "Restarted", 100, "--batch", "10")
    lines = received_at_b(document, "Restarted", tmp_path / "after.jsonl", 200)
    assert len(lines) == 200 and len({r["value"] for r in lines}) == 200
    total = 20 + 200  # every copy b holds (Local's too)
    wait_for(
        lambda: replicated_by_status(document), 30, f"replicator-status to count {total}", until=total.__eq__
    )


def test_a_data_dir_knows_its_cluster(up, tmp_path):
    _, data_dir = up
    document = document_of(data_dir)
    other_count = mqmeta("local", "up", "--data-dir", str(data_dir), "--controllers", "1", "--replicas", "2")
    assert_bad_input(other_count, "holds 2 local clusters", "--clusters 2")
    a_controllers = document["clusters"][0]["controllers"][0]["grpc"]
    b_broker_dir = Path(document["clusters"][1]["brokers"][0]["data_dir"])
    with PortReservation.pick(1) as port:
        broker = ["broker", "--broker-name", "broker-a", "--listen", port.addresses[0]]
        broker += ["--controllers", a_controllers]
        foreign = mqmeta(*broker, "--cluster", "a", "--data-dir", str(b_broker_dir))
        assert_bad_input(foreign, "of cluster b", "not of cluster a")
        # Two clusters of the same name (two separate `local up`s): the controllers hold the
        # broker id of the copied dir for another broker.
        copied = tmp_path / "copied-broker"
        shutil.copytree(b_broker_dir, copied)
        identity = json.loads((copied / "identity.json").read_text())
        (copied / "identity.json").write_text(json.dumps(dict(identity, cluster="a")))
        started = time.monotonic()
        refused = mqmeta(*broker, "--cluster", "a", "--data-dir", str(copied))
        assert_bad_input(refused, "belongs to another broker")
        assert time.monotonic() - started < 20, "the refusal took long: was it retried?"


def test_ctrl_c_stops_every_child_within_3_s_and_marks_the_cluster_stopped(up):
    proc, data_dir = up
    document = document_of(data_dir)
    servers = [  # these dump their threads' stacks on SIGUSR1 (the replicator does not)
        p["pid"]
        for cluster in document["clusters"]
        for kind in ("controllers", "namesrv", "brokers")
        for p in cluster[kind]
    ]
    pids = servers + [r["pid"] for r in document["replicators"]]
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    started = time.monotonic()

    def running() -> list[int]:
        return [pid for pid in pids if runs(pid)]

    try:
        wait_for(running, STOP_WITHIN_S, "every child to end on its own", until=lambda left: not left)
    except WaitTimeout as error:
        left = running()
        pytest.fail(f"{error}\n{_stacks_of([pid for pid in left if pid in servers], data_dir)}")
    print(f"every child ended {time.monotonic() - started:.2f} s after Ctrl-C")
    assert proc.wait(timeout=STOP_WITHIN_S) == 0, "local up itself did not end"
    print(f"local up ended {time.monotonic() - started:.2f} s after Ctrl-C")
    stopped = document_of(data_dir)
    assert stopped["state"] == "stopped"
    assert "pid" not in json.dumps(stopped).replace('"pid": null', ""), "a pid of a gone process"
    status = mqmeta("admin", "--cluster-dir", str(data_dir), "cluster-status")  # reads cluster.json
    assert_bad_input(status, "is stopped", f"mqmeta local up --data-dir {data_dir}")


def _stacks_of(pids: list[int], data_dir: Path) -> str:
    """The threads of each server in `pids` (SIGUSR1: faulthandler writes them to its log)
    and the end of every child's log, for the failure message."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    logs = sorted(data_dir.glob("**/logs/*.log"))
    tails = [f"== {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:]) for log in logs]
    return f"still running: {pids}\n" + "\n".join(tails)

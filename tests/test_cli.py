"""The `mqmeta` command as an operator uses it, in real subprocesses.

Properties checked:
- `mqmeta local up` starts a whole cluster, writes cluster.json once it answers (every
  process with its "metrics" address, which serves Prometheus text),
  stops every child on SIGTERM, and a second run on the same DIR keeps the data;
- admin commands print the documented JSON documents;
- every kind of bad input exits 2 with one sentence on stderr and no traceback;
- `mqmeta controller ...` builds the parser of its own part only (importing every part's
  parser cost a restarting controller about 0.5 s of CPU), and it parses a command line
  as the whole parser does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from mqmeta.pb import namesrv_pb2 as ns_pb
from mqmeta.pb import namesrv_pb2_grpc as ns_grpc
from tests.support.local_up import start_local_up, stop_local_up

pytestmark = [pytest.mark.timeout(120)]
MQMETA = [sys.executable, "-m", "mqmeta.cli"]
LOCAL_UP_READY_TIMEOUT_S = 60.0


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*MQMETA, *args], capture_output=True, text=True, timeout=timeout)


def start_local(data_dir: Path) -> tuple[subprocess.Popen, dict]:
    return start_local_up(data_dir, timeout_s=LOCAL_UP_READY_TIMEOUT_S)


def stop_local(proc: subprocess.Popen, document: dict) -> None:
    stop_local_up(proc, timeout_s=30)
    for child in document["controllers"] + document["namesrv"]:
        with pytest.raises(ProcessLookupError):
            os.kill(child["pid"], 0)  # every child is gone


@pytest.mark.cluster
def test_local_up_runs_restarts_and_stops_cleanly(tmp_path):
    data_dir = tmp_path / "local"
    proc, document = start_local(data_dir)
    try:
        assert [c["id"] for c in document["controllers"]] == ["c1", "c2", "c3"]
        assert set(document) >= {"controllers", "namesrv", "brokers", "tiered_store"}
        addresses = ",".join(c["grpc"] for c in document["controllers"])
        status = run("admin", "--controllers", addresses, "cluster-status", "--json")
        assert status.returncode == 0, status.stderr
        parsed = json.loads(status.stdout)
        assert parsed["leader"] in {"c1", "c2", "c3"} and parsed["term"] >= 1
        assert {n["id"] for n in parsed["nodes"]} == {"c1", "c2", "c3"}
        assert all(n["healthy"] for n in parsed["nodes"])
        created = run(
            "admin", "--controllers", addresses, "topic", "create", "Kept", "--queues", "4", "--json"
        )
        assert created.returncode == 0, created.stderr
        assert json.loads(created.stdout)["queue_count"] == 4
        assert isinstance(json.loads(created.stdout)["version"], int), "int64 stays a number"
        with grpc.insecure_channel(document["namesrv"][0]["grpc"]) as channel:
            route = ns_grpc.NameServerStub(channel).QueryRoute(
                ns_pb.QueryRouteRequest(topic="Kept"), timeout=10
            )
        assert route.topic == "Kept"
        brokers = document["brokers"]
        assert len(brokers) == 3 and {b["broker_name"] for b in brokers} == {"broker-a"}
        assert sorted(b["broker_id"] for b in brokers) == [1, 2, 3]
        for process in document["controllers"] + document["namesrv"] + brokers:  # Prometheus text
            with urllib.request.urlopen(f"http://{process['metrics']}/metrics", timeout=10) as answer:
                assert b"mqmeta_" in answer.read()
        produce_and_consume(tmp_path, document, addresses)
    finally:
        stop_local(proc, document)
    proc, again = start_local(data_dir)  # same DIR: same cluster, same data
    try:
        assert [c["grpc"] for c in again["controllers"]] == [c["grpc"] for c in document["controllers"]]
        addresses = ",".join(c["grpc"] for c in again["controllers"])
        listed = run("admin", "--controllers", addresses, "topic", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [t["name"] for t in json.loads(listed.stdout)["topics"]] == ["Kept"]
    finally:
        stop_local(proc, again)


def produce_and_consume(tmp_path: Path, document: dict, addresses: str) -> None:
    namesrv = document["namesrv"][0]["grpc"]
    sent_file, received_file = tmp_path / "sent.jsonl", tmp_path / "received.jsonl"
    produced = run(
        "produce",
        "--namesrv",
        namesrv,
        "--topic",
        "Kept",
        "--count",
        "50",
        "--size",
        "100",
        "--batch",
        "5",
        "--record",
        str(sent_file),
        "--json",
    )
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout) | {"elapsed_s": 0} == {
        "sent": 50,
        "acked": 50,
        "failed": 0,
        "elapsed_s": 0,
    }
    consumed = run(
        "consume",
        "--namesrv",
        namesrv,
        "--topic",
        "Kept",
        "--group",
        "cli",
        "--until-idle",
        "2",
        "--record",
        str(received_file),
        "--json",
    )
    assert consumed.returncode == 0, consumed.stderr
    assert json.loads(consumed.stdout)["received"] == 50
    sent = [json.loads(line) for line in sent_file.read_text().splitlines()]
    received = [json.loads(line) for line in received_file.read_text().splitlines()]
    assert {r["value"] for r in sent} == {r["value"] for r in received}
    assert set(sent[0]) == {"msg_id", "value", "queue_id", "queue_offset"}
    labelled = [
        "--tag",
        "TagA",
        "--keys",
        "k1,k2",
        "--count",
        "5",
        "--record",
        str(tmp_path / "tagged.jsonl"),
    ]
    tagged = run("produce", "--namesrv", namesrv, "--topic", "Kept", *labelled)
    assert tagged.returncode == 0, tagged.stderr
    again = run(
        "consume", "--namesrv", namesrv, "--topic", "Kept", "--group", "cli", "--until-idle", "2",
        "--record", str(tmp_path / "tagged-received.jsonl"),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    for name in ("tagged.jsonl", "tagged-received.jsonl"):
        lines = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert len(lines) == 5 and all((r["tag"], r["keys"]) == ("TagA", ["k1", "k2"]) for r in lines), name
    status = run("admin", "--controllers", addresses, "ha-status", "--broker-name", "broker-a", "--json")
    assert status.returncode == 0, status.stderr
    roles = sorted(r["role"] for r in json.loads(status.stdout)["replicas"])
    assert roles == ["MASTER", "SLAVE", "SLAVE"]
    tiered = run("admin", "--controllers", addresses, "tiered-status", "--broker-name", "broker-a", "--json")
    assert tiered.returncode == 0, tiered.stderr
    status_doc = json.loads(tiered.stdout)
    assert {"uploaded_offset", "confirm_offset", "checkpoint_epoch", "segments", "lag_bytes"} <= set(
        status_doc
    )
    assert status_doc["uploaded_offset"] <= status_doc["confirm_offset"]
    assert status_doc["lag_bytes"] == status_doc["confirm_offset"] - status_doc["uploaded_offset"]
    missing = run("produce", "--namesrv", namesrv, "--topic", "NoSuchTopic", "--count", "1")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def assert_bad_input(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("mqmeta: error:"), result.stderr
    assert fragment in result.stderr, result.stderr


OTHER_PARTS = ("mqmeta.broker_agent", "mqmeta.chaos", "mqmeta.spark", "mqmeta.replicator", "mqmeta.cluster")


def test_a_controller_builds_only_its_own_parser():
    from mqmeta import cli

    argv = ["--log-level", "INFO", "controller", "--id", "c1", "--grpc", "127.0.0.1:1"]
    assert cli.command_in(argv) == "controller"
    assert cli.command_in(["--log-level=DEBUG", "admin", "topic", "list"]) == "admin"
    assert cli.command_in(["--help"]) is None and cli.command_in(["controllr"]) is None

    def parsed(parser) -> dict:  # the flags' values (not the parser's own bookkeeping objects)
        return {k: v for k, v in vars(parser.parse_args(argv)).items() if not k.startswith("_")}

    assert parsed(cli.build_parser("controller")) == parsed(cli.build_parser())
    probe = (
        "import sys, mqmeta.cli as c; c.build_parser(c.command_in(sys.argv[1:])); "
        f"print(sorted({{m for m in sys.modules if m.startswith({OTHER_PARTS!r})}}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60, check=True
    )
    assert found.stdout.strip() == "[]", f"a controller imported other parts: {found.stdout}"


def test_bad_input_without_a_cluster_exits_2():
    unreachable = "127.0.0.1:1"
    assert_bad_input(
        run("admin", "--controllers", unreachable, "--timeout", "1", "topic", "list"),
        "no controller answered",
    )
    assert_bad_input(run("admin", "--controllers", "nohost", "topic", "list"), "HOST:PORT")
    assert_bad_input(
        run("admin", "--controllers", unreachable, "topic", "create", "T", "--queues", "-3"),
        "must be at least 1",
    )
    assert_bad_input(run("admin", "--controllers", unreachable, "config", "set", "novalue"), "KEY=VALUE")
    assert_bad_input(run("admin", "topic", "list"), "--controllers")
    assert_bad_input(run("controller", "--id", "c1"), "needs --grpc")
    node = ["--id", "c1", "--grpc", "127.0.0.1:1", "--raft", "127.0.0.1:2", "--data-dir", "/nonexistent"]
    assert_bad_input(  # a Raft port without a secret runs pickled code it is sent
        run("controller", *node, "--peer", "c2=127.0.0.1:3/127.0.0.1:4"), "needs --secret-file"
    )
    assert_bad_input(run("local", "up", "--controllers", "2"), "must be odd")
    assert_bad_input(run("namesrv", "--listen", "127.0.0.1:1"), "--controllers")
    assert_bad_input(run("namesrv", "--listen", "nowhere"), "--listen address")
    assert_bad_input(
        run("produce", "--namesrv", unreachable, "--topic", "T", "--count", "0"),
        "--count: must be a whole number from 1",
    )
    assert_bad_input(
        run("produce", "--namesrv", unreachable, "--topic", "T", "--count", "1", "--size", "999999999"),
        "--size: must be a whole number from 1 to",
    )
    assert_bad_input(run("consume", "--namesrv", unreachable, "--topic", "T"), "--group")
    assert_bad_input(
        run("produce", "--namesrv", unreachable, "--topic", "T", "--count", "1", "--keys", "a b"), "--keys"
    )
    assert_bad_input(
        run("consume", "--namesrv", unreachable, "--topic", "T", "--group", "g", "--until-idle", "nan"),
        "--until-idle: must be a number from 0.01 to 86400",
    )
    assert_bad_input(
        run(
            "produce",
            "--namesrv",
            unreachable,
            "--topic",
            "T",
            "--count",
            "1",
            "--record",
            "/nonexistent/dir/sent.jsonl",
        ),
        "cannot write --record",
    )
    assert_bad_input(
        run(
            "broker",
            "--broker-name",
            "bad name",
            "--listen",
            "127.0.0.1:1",
            "--controllers",
            unreachable,
            "--data-dir",
            "/tmp/x",
        ),
        "malformed",
    )


@pytest.mark.cluster
def test_bad_input_against_a_cluster_exits_2(cluster):
    addresses = cluster.addresses
    assert_bad_input(run("admin", "--controllers", addresses, "topic", "create", "bad name"), "malformed")
    assert_bad_input(
        run("admin", "--controllers", addresses, "config", "set", "nope=1"), "unknown configuration key"
    )
    assert_bad_input(
        run("admin", "--controllers", addresses, "config", "set", "broker_dead_after_ms=100"),
        "broker_dead_after_ms",
    )
    assert_bad_input(
        run("admin", "--controllers", addresses, "sync-state", "--broker-name", "missing"), "not registered"
    )
    assert_bad_input(run("admin", "--controllers", addresses, "topic", "delete", "Nope"), "does not exist")
    ok = run("admin", "--controllers", addresses, "sync-state", "--broker-name", "missing", "--json")
    assert ok.stdout == "", "errors never print a partial JSON document"

"""The brokers' admin calls (broker_agent/admin.py) and their CLI (mqmeta/admin_messages.py),
on one real cluster for the module: one controller, a nameserver, a broker set of two.

Properties checked:
- message query: by key (`--json` prints {"messages": [...]}: exactly the messages sent
  with that key, with body, tags, keys, store and born time), by id, by queue and offset,
  by store-time range (only messages stored in [since, until)); an unknown id is NOT_FOUND
  and a bad time range INVALID_ARGUMENT, each with one sentence, over gRPC and in the CLI
  (exit 2, one line); a body past --body-bytes comes back cut and says so;
- trace: a confirmed message is held by the slave, the group that consumed past it is
  named, and a resend's copy shows as a retry;
- resend: a copy lands in %RETRY%{group} with the original's body and keys;
- group lag: the backlog (messages and time) of a group grows with sends and falls to
  zero once it consumes; its native member is listed, and so is a native consumer that
  only polls (it names its group in each pull) without committing; the lag is also a metric;
- reset offsets: refused (FAILED_PRECONDITION, one sentence, exit 2) while a member is
  connected; with --force, earliest moves the backlog back to everything;
- the controller's command history (`admin history`): an AlterSyncStateSet with a stale
  master epoch is listed as fenced with the sentence its caller got; pages walk back by
  Raft index; a bad limit or type is INVALID_ARGUMENT with a sentence (CLI: exit 2); a
  controller killed with -9 and restarted lists the same fenced command (from its journal);
- the key index survives kill -9 of a real broker process: the restarted replica (asked
  directly) finds every key it held, including those indexed only in memory at the kill.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta import tls
from mqmeta.broker_client import Consumer, Producer
from mqmeta.cli import main
from mqmeta.errors import MqmetaError
from mqmeta.pb import broker_pb2, broker_pb2_grpc
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for, wait_in_sync

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

MQMETA = [sys.executable, "-m", "mqmeta.cli"]
TOPIC = "Orders"
SENT = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("admin"), count=1, broker_sets=1, replicas=2)
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name=TOPIC, queue_count=2))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def sent(cluster):
    """SENT messages, key `order-{i % 4}` and `all`, tag A; and when the sends began."""
    wait_in_sync(cluster, 2)
    producer = Producer(cluster.namesrv)
    started_ms = int(time.time() * 1000)
    try:
        results = []
        for i in range(SENT):
            results += producer.send(TOPIC, [f"m{i}".encode()], tags="A", keys=[f"order-{i % 4} all"])
    finally:
        producer.close()
    return results, started_ms


def admin(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    """The CLI in this process (an interpreter start costs seconds on a loaded CI host);
    test_query_by_key_id_position_and_time runs the real command once."""
    command = ["admin", "--controllers", cluster.addresses, *args]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(command)
        except SystemExit as exit_:  # argparse's refusals
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(command, code, stdout.getvalue(), stderr.getvalue())


def admin_json(cluster: Cluster, *args: str) -> dict:
    result = admin(cluster, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_bad_input(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqmeta: error:"), result.stderr
    assert fragment in result.stderr, result.stderr


def broker_call(cluster: Cluster, name: str, method: str, request):
    with tls.channel(cluster.broker(name).grpc) as channel:
        return getattr(broker_pb2_grpc.BrokerServiceStub(channel), method)(request, timeout=10)


def refusal(cluster: Cluster, name: str, method: str, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        broker_call(cluster, name, method, request)
    return caught.value


def test_query_by_key_id_position_and_time(cluster, sent):
    results, started_ms = sent
    command = [*MQMETA, "admin", "--controllers", cluster.addresses, "message", "query"]
    result = subprocess.run(
        [*command, "--topic", TOPIC, "--key", "order-1", "--json"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    bodies = sorted(m["body"] for m in document["messages"])
    expected = sorted(f"m{i}" for i in range(SENT) if i % 4 == 1)
    assert sorted(base64.b64decode(b).decode() for b in bodies) == expected
    first = document["messages"][0]
    assert first["tags"] == "A" and "order-1" in first["keys"].split() and first["confirmed"]
    assert first["store_timestamp_ms"] >= started_ms and first["born_timestamp_ms"] > 0

    by_id = admin_json(cluster, "message", "query", "--id", results[3].msg_id)["messages"]
    assert [m["queue_offset"] for m in by_id] == [results[3].queue_offset]
    by_position = admin_json(
        cluster, "message", "query", "--topic", TOPIC, "--queue", str(results[5].queue_id),
        "--offset", str(results[5].queue_offset), "--body-bytes", "1",
    )["messages"]  # fmt: skip
    assert by_position[0]["msg_id"] == results[5].msg_id
    assert by_position[0]["body_truncated"] and by_position[0]["body_bytes"] == len(b"m5")

    master = wait_in_sync(cluster, 2)
    middle = (
        broker_call(
            cluster,
            master,
            "QueryMessages",
            broker_pb2.QueryMessagesRequest(topic=TOPIC, msg_id=results[10].msg_id),
        )
        .messages[0]
        .message.store_timestamp_ms
    )
    window = admin_json(
        cluster, "message", "query", "--topic", TOPIC, "--since", str(middle), "--until", str(middle + 1)
    )["messages"]
    assert window and all(m["store_timestamp_ms"] == middle for m in window)
    assert results[10].msg_id in {m["msg_id"] for m in window}


def test_bad_queries_are_refused_with_one_sentence(cluster, sent):
    master = wait_in_sync(cluster, 2)
    error = refusal(cluster, master, "QueryMessages", broker_pb2.QueryMessagesRequest(msg_id="f" * 32))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "no message with id" in error.details()
    error = refusal(
        cluster,
        master,
        "QueryMessages",
        broker_pb2.QueryMessagesRequest(topic=TOPIC, time_range=broker_pb2.TimeRange(since_ms=9, until_ms=5)),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "is empty" in error.details()
    assert_bad_input(admin(cluster, "message", "query", "--id", "f" * 32), "no message with id")
    assert_bad_input(
        admin(cluster, "message", "query", "--topic", TOPIC, "--since", "9", "--until", "5"), "must be after"
    )
    assert_bad_input(admin(cluster, "message", "query", "--topic", TOPIC), "exactly one of")


def _consume(cluster: Cluster, group: str, count: int) -> Consumer:
    consumer = Consumer(cluster.namesrv, TOPIC, group)
    seen: list = []
    wait_for(
        lambda: seen.extend(consumer.poll()) or len(seen), 20, f"{count} messages", until=lambda n: n >= count
    )
    consumer.commit()
    return consumer


def test_lag_trace_resend_and_reset(cluster, sent):
    results, _ = sent
    group = "g-admin"
    lag = admin_json(cluster, "group", "lag", group, "--topic", TOPIC)
    assert lag["backlog"] == SENT and lag["backlog_ms"] > 0, lag
    consumer = _consume(cluster, group, SENT)
    try:
        lag = admin_json(cluster, "group", "lag", group)
        assert lag["backlog"] == 0 and lag["backlog_ms"] == 0, lag
        assert [m["protocol"] for m in lag["members"]] == ["native"], lag

        master = wait_in_sync(cluster, 2)
        metrics = urllib.request.urlopen(f"http://{cluster.broker(master).metrics}/metrics", timeout=5).read()
        series = f'mqmeta_broker_group_backlog_messages{{group="{group}",queue_id="0",topic="{TOPIC}"}}'
        assert f"{series} 0.0".encode() in metrics

        trace = admin_json(cluster, "message", "trace", "--id", results[2].msg_id)
        assert trace["message"]["confirmed"] and all(r["holds"] for r in trace["replicas"]), trace
        assert trace["replicas"], "the master names its slave"
        assert {"group": group, "consumed": True} in [
            {"group": g["group"], "consumed": g["consumed"]} for g in trace["groups"]
        ]

        resent = admin_json(cluster, "message", "resend", "--id", results[2].msg_id, "--group", group)
        assert resent["topic"] == f"%RETRY%{group}"
        trace = admin_json(cluster, "message", "trace", "--id", results[2].msg_id)
        assert [r["topic"] for r in trace["retries"]] == [f"%RETRY%{group}"], trace

        refused = admin(cluster, "group", "reset-offsets", group, "--earliest")
        assert_bad_input(refused, "member(s) connected")
        error = refusal(
            cluster, master, "ResetOffsets", broker_pb2.ResetOffsetsRequest(group=group, earliest=True)
        )
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        reset = admin_json(
            cluster, "group", "reset-offsets", group, "--topic", TOPIC, "--earliest", "--force"
        )
        assert sum(q["backlog"] for q in reset["queues"]) == SENT, reset
    finally:
        consumer.close()


def test_a_native_consumer_that_polls_without_committing_is_a_member(cluster, sent):
    group = "g-polling"
    consumer = Consumer(cluster.namesrv, TOPIC, group)
    try:
        consumer.poll()  # pulls, names its group, commits nothing
        lag = admin_json(cluster, "group", "lag", group, "--topic", TOPIC)
        assert [m["protocol"] for m in lag["members"]] == ["native"], lag
        assert_bad_input(admin(cluster, "group", "reset-offsets", group, "--earliest"), "member(s) connected")
    finally:
        consumer.close()


def test_the_key_index_survives_kill_9(cluster, sent):
    master = wait_in_sync(cluster, 2)
    slave = next(b.name for b in cluster.layout.brokers if b.name != master)
    request = broker_pb2.QueryMessagesRequest(topic=TOPIC, key="all", max_count=64)
    before = {m.message.msg_id for m in broker_call(cluster, slave, "QueryMessages", request).messages}
    assert len(before) == SENT
    cluster.kill(slave)
    cluster.start_broker(slave)
    after = wait_for(
        lambda: {m.message.msg_id for m in broker_call(cluster, slave, "QueryMessages", request).messages},
        30,
        "the restarted slave to answer a query by key",
        retry_on=(grpc.RpcError,),
    )
    assert after == before


def test_the_history_shows_a_fenced_command_with_its_reason_and_pages(cluster, sent):
    with cluster.client() as client:
        info = client.call("ListBrokerSets", pb.ListBrokerSetsRequest()).broker_sets[0]
        stale = pb.AlterSyncStateSetRequest(
            cluster=info.cluster,
            broker_name=info.broker_name,
            master_broker_id=info.master_broker_id,
            master_epoch=info.master_epoch - 1,
            sync_state_set_epoch=info.sync_state_set_epoch,
            new_sync_state_set=[info.master_broker_id],
        )
        with pytest.raises(MqmetaError) as fenced:
            client.call("AlterSyncStateSet", stale)
        assert fenced.value.code == "FENCED_MASTER_EPOCH"
        with pytest.raises(MqmetaError) as bad:
            client.call("GetCommandHistory", pb.GetCommandHistoryRequest(limit=5000))
        assert bad.value.code == "INVALID_ARGUMENT" and "limit must be 1 to 1000" in bad.value.message
    found = admin_json(cluster, "history", "--type", "alter_sync_state_set", "--limit", "1")["commands"]
    assert (found[0]["result"], found[0]["code"]) == ("fenced", "FENCED_MASTER_EPOCH"), found
    assert found[0]["message"] == fenced.value.message
    assert found[0]["fields"]["master_epoch"] == str(info.master_epoch - 1) and found[0]["time_ms"] > 0

    newest = admin_json(cluster, "history", "--limit", "3")
    older = admin_json(cluster, "history", "--limit", "3", "--before", str(newest["next_before_index"]))
    indexes = [c["index"] for c in newest["commands"] + older["commands"]]
    assert indexes == sorted(indexes, reverse=True) and max(indexes) <= newest["last_applied_index"]
    assert min(c["index"] for c in newest["commands"]) > max(c["index"] for c in older["commands"])
    assert newest["oldest_index"] >= 1 and newest["node_id"]

    assert_bad_input(admin(cluster, "history", "--limit", "5000"), "limit must be 1 to 1000")
    assert_bad_input(admin(cluster, "history", "--limit", "0"), "0 must be at least 1")
    assert_bad_input(admin(cluster, "history", "--type", "nope"), "no command type 'nope'")

    # kill -9 of the controller: it rebuilds the history from its journal as it replays it
    node_id = cluster.layout.controllers[0].id
    cluster.restart(node_id)

    def fenced_again() -> list[dict]:
        replayed = admin(cluster, "history", "--type", "alter_sync_state_set", "--limit", "1", "--json")
        return json.loads(replayed.stdout)["commands"] if replayed.returncode == 0 else []

    # it answers while it replays: wait until it has applied the fenced command's entry again
    again = wait_for(
        fenced_again,
        30,
        "the restarted controller's history to reach the fenced command",
        until=lambda commands: bool(commands) and commands[0]["index"] >= found[0]["index"],
    )
    assert again == found, (again, found)

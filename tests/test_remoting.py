"""RocketMQ 4.x clients (the classic remoting protocol) against a real `mqmeta local up`
cluster (one controller, a standalone nameserver, one broker set; shared by this module).

Properties checked, with two real, unchanged clients (rocketmq-client-python 2.0.0 over
the C++ client's librocketmq.so, and rocketmq 0.4.4 with its bundled copy):
- cluster.json names a remoting address for the nameserver and every broker;
- a sync send with tags and keys is acknowledged; a clustering PushConsumer with a
  `tagA || tagB` filter receives exactly the matching messages, each once, with its tag,
  keys, property and the message id the send returned;
- a message the C++ client sent is read by `mqmeta consume` (same tag and keys) and a
  message `mqmeta produce` sent is received by the C++ client with the record's id;
- the nameserver answers TOPIC_NOT_EXIST for an unknown topic, and a route names the broker
  set's proxy on the nameserver, never the master's own address (every client test here
  goes through it);
- requests on one connection are served concurrently: a heartbeat is answered while a
  long-polling pull waits on the same connection;
- an orderly consumer (queue locks) receives each queue in queue-offset order, and the
  messages of one sharding key in their send order;
- queue locks are exclusive per group: another client gets a queue only once its holder
  unlocked it (or let it expire);
- two consumers of one group split the topic's queues between them (each its own);
- a batch send (rocketmq 0.4.4) writes every message; SEARCH_OFFSET_BY_TIMESTAMP answers
  the first offset stored at or after a time (the max offset after the last);
- QUERY_MESSAGE finds a topic's readable messages by key (newest first, within the time
  range and maxNum) or by message id (`_UNIQUE_KEY_QUERY`), QUERY_NOT_FOUND with a remark
  when none; VIEW_MESSAGE_BY_ID reads the message at a pulled message's commit offset,
  SYSTEM_ERROR with a remark at an offset that starts none (on the broker and through the
  proxy);
- bad input gets RocketMQ's error answers and the servers keep serving: a header that is
  not JSON (SYSTEM_ERROR, the connection goes on), an unknown code
  (REQUEST_CODE_NOT_SUPPORTED, opaque echoed), a binary header (answered, in JSON), an
  oversize frame (SYSTEM_ERROR, then the connection closes; a new one is served).
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import replace

import pytest

from mqmeta.client import ControllerClient
from mqmeta.codec import remoting as codec
from mqmeta.errors import AlreadyExists
from mqmeta.pb import controller_pb2 as cpb
from tests.support import wait_for
from tests.support.local_up import local_up
from tests.support.remoting_clients import client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SOCKET_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 150.0  # a loaded CI machine starts five processes slowly


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("remoting")
    flags = ("--controllers", "1", "--broker-sets", "1", "--replicas", "1")
    with local_up(root / "data", *flags, timeout_s=READY_TIMEOUT_S) as document:
        document["root"] = root
        yield document


@pytest.fixture(scope="module")
def namesrv(cluster) -> str:
    return cluster["namesrv"][0]["remoting"]


@pytest.fixture(scope="module")
def broker(cluster) -> str:
    return cluster["brokers"][0]["remoting"]


def _topic(cluster, queues: int = 2) -> str:
    name = "R" + uuid.uuid4().hex[:10]
    with ControllerClient(cluster["controllers"][0]["grpc"]) as admin:
        try:
            admin.call("CreateTopic", cpb.TopicSpec(name=name, queue_count=queues))
        except AlreadyExists:
            pass
    return name


@pytest.fixture(scope="module")
def cpp_client(cluster):
    return client("rocketmq-client-python", cluster["root"] / "home-cpp")


@pytest.fixture(scope="module")
def wheel_client(cluster):
    return client("rocketmq", cluster["root"] / "home-wheel")


def test_cluster_json_names_remoting_addresses(cluster):
    assert all(":" in n["remoting"] for n in cluster["namesrv"])
    assert all(":" in b["remoting"] for b in cluster["brokers"])


@pytest.mark.parametrize("name", ["cpp_client", "wheel_client"])
def test_tag_filtered_push_consumer_gets_exactly_the_matching_sends(request, cluster, namesrv, name):
    rocketmq = request.getfixturevalue(name)
    topic = _topic(cluster)
    sent = []
    for tag, count in (("tagA", 3), ("tagB", 2), ("tagC", 2)):
        results = rocketmq.produce(namesrv, topic, count, tag=tag, keys=f"key-{tag}", prefix=tag)
        assert [r["status"] for r in results] == [0] * count, results  # SEND_OK
        sent += [{**r, "tag": tag} for r in results]
    wanted = {r["value"]: r for r in sent if r["tag"] in ("tagA", "tagB")}
    got = rocketmq.consume(namesrv, topic, "cg-" + topic, len(wanted), "tagA || tagB")
    assert sorted(g["value"] for g in got) == sorted(wanted), got  # exactly, each once
    for message in got:
        expected = wanted[message["value"]]
        assert message["tag"] == expected["tag"]
        assert message["keys"] == f"key-{expected['tag']}"
        assert message["origin"] == "remoting"
        assert message["msg_id"] == expected["msg_id"]


def test_cpp_send_is_read_by_mqmeta_consume_and_back(cluster, namesrv, cpp_client, tmp_path):
    topic = _topic(cluster)
    sent = cpp_client.produce(namesrv, topic, 3, tag="cross", keys="k1 k2", prefix="cpp")
    record = tmp_path / "consumed.jsonl"
    native = cluster["namesrv"][0]["grpc"]
    mqmeta = [sys.executable, "-m", "mqmeta.cli"]
    subprocess.run(
        [*mqmeta, "consume", "--namesrv", native, "--topic", topic, "--group", "native-" + topic,
         "--record", str(record), "--until-idle", "2"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    consumed = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(c["value"] for c in consumed) == sorted(s["value"] for s in sent)
    assert all(c["tag"] == "cross" and c["keys"] == ["k1", "k2"] for c in consumed)

    produced = tmp_path / "produced.jsonl"
    subprocess.run(
        [*mqmeta, "produce", "--namesrv", native, "--topic", topic, "--count", "2", "--tag", "back",
         "--keys", "n1", "--record", str(produced)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    native_sent = {json.loads(line)["msg_id"]: json.loads(line) for line in produced.read_text().splitlines()}
    got = cpp_client.consume(namesrv, topic, "cg-back-" + topic, 2, "back")
    assert {g["msg_id"] for g in got} == set(native_sent), got  # the record's id, kept
    assert all(g["tag"] == "back" and g["keys"] == "n1" for g in got)


# Raw frames -----------------------------------------------------------------------------------
def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S)


def _read(sock: socket.socket) -> codec.Command | None:
    """The next frame, or None when the server closed the connection."""
    prefix = _exactly(sock, 4)
    if prefix is None:
        return None
    body = _exactly(sock, codec.frame_length(prefix))
    assert body is not None
    return codec.decode_frame(body)


def _exactly(sock: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _call(sock: socket.socket, command: codec.Command, notices: list | None = None) -> codec.Command:
    """The answer to `command`; requests the server sends meanwhile go to `notices`."""
    sock.sendall(codec.encode(command))
    while True:
        answer = _read(sock)
        assert answer is not None
        if answer.is_response:
            return answer
        if notices is not None:
            notices.append(answer)


def test_unknown_topic_route_is_topic_not_exist(namesrv):
    with _connect(namesrv) as sock:
        answer = _call(sock, codec.Command(codec.GET_ROUTEINFO_BY_TOPIC, 5, ext={"topic": "NoSuchTopic"}))
    assert answer.code == codec.TOPIC_NOT_EXIST and answer.opaque == 5
    assert "NoSuchTopic" in answer.remark


def test_route_names_the_broker_set_proxy(cluster, namesrv, broker):
    topic = _topic(cluster, queues=3)
    proxy = cluster["namesrv"][0]["remoting_proxies"]["broker-a"]
    with _connect(namesrv) as sock:
        answer = _call(sock, codec.Command(codec.GET_ROUTEINFO_BY_TOPIC, 6, ext={"topic": topic}))
    assert answer.code == codec.SUCCESS
    assert f'{{0:"{proxy}"}}' in answer.body.decode()  # fastjson's unquoted integer key
    assert broker not in answer.body.decode()  # never the master's own address
    route = codec.fastjson_loads(answer.body)
    assert [(q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]] == [(3, 3, 6)]


def test_heartbeat_is_answered_while_a_pull_long_polls_on_the_same_connection(cluster, broker):
    topic = _topic(cluster, queues=1)
    pull = codec.Command(
        codec.PULL_MESSAGE,
        1,
        ext={
            "consumerGroup": "cg-poll",
            "topic": topic,
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "sysFlag": 2,  # suspend
            "commitOffset": 0,
            "suspendTimeoutMillis": 3000,
            "subscription": "*",
            "subVersion": 0,
        },
    )
    heartbeat = codec.Command(
        codec.HEART_BEAT,
        2,
        body=json.dumps({"clientID": "c1", "consumerDataSet": [], "producerDataSet": []}).encode(),
    )
    with _connect(broker) as sock:
        started = time.monotonic()
        sock.sendall(codec.encode(pull) + codec.encode(heartbeat))
        first = _read(sock)
        assert first is not None and first.opaque == 2 and first.code == codec.SUCCESS
        assert time.monotonic() - started < 2.0  # not behind the pull's 3 s wait
        second = _read(sock)
    assert second is not None and second.opaque == 1 and second.code == codec.PULL_NOT_FOUND
    assert second.ext["nextBeginOffset"] == "0" and time.monotonic() - started >= 2.5


@pytest.mark.parametrize("through", ["broker", "proxy"])
def test_bad_frames_get_error_answers_and_the_server_keeps_serving(cluster, broker, namesrv, through):
    target = broker if through == "broker" else cluster["namesrv"][0]["remoting_proxies"]["broker-a"]
    with _connect(target) as sock:
        garbage = b"{not json"
        sock.sendall(struct.pack(">ii", 4 + len(garbage), len(garbage)) + garbage)
        answer = _read(sock)
        assert answer is not None and answer.code == codec.SYSTEM_ERROR and "JSON" in answer.remark
        unknown = _call(sock, codec.Command(9999, 77))  # the same connection is still served
        assert unknown.code == codec.REQUEST_CODE_NOT_SUPPORTED and unknown.opaque == 77
        assert "9999" in unknown.remark
        missing = _call(sock, codec.Command(codec.GET_MAX_OFFSET, 78, ext={"topic": "T"}))
        assert missing.code == codec.SYSTEM_ERROR and "queueId" in missing.remark
    with _connect(namesrv) as sock:
        sock.sendall(
            codec.encode_binary(codec.Command(codec.GET_ROUTEINFO_BY_TOPIC, 9, ext={"topic": "Nope"}))
        )
        answer = _read(sock)  # a binary header is read; the answer is JSON
        assert answer is not None and answer.code == codec.TOPIC_NOT_EXIST and answer.opaque == 9
        sock.sendall(struct.pack(">i", codec.FRAME_BYTES_MAX + 1))
        oversize = _read(sock)
        assert oversize is not None and oversize.code == codec.SYSTEM_ERROR and "length" in oversize.remark
        assert _read(sock) is None  # its end cannot be found: the connection is closed
    with _connect(namesrv) as sock:  # and the server still serves
        assert (
            _call(sock, codec.Command(codec.GET_ROUTEINFO_BY_TOPIC, 10, ext={"topic": "Nope"})).opaque == 10
        )


def _send_v2(
    sock: socket.socket, opaque: int, topic: str, tag: str, body: bytes, keys: str = ""
) -> codec.Command:
    properties = codec.encode_properties(
        {"TAGS": tag, "UNIQ_KEY": f"U{opaque}", **({"KEYS": keys} if keys else {})}
    )
    ext = {"a": "pg-raw", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0, "i": properties}
    return _call(sock, codec.Command(codec.SEND_MESSAGE_V2, opaque, ext=ext, body=body))


def test_pull_filters_by_tag_on_the_broker_and_offsets_are_kept(cluster, broker):
    topic = _topic(cluster, queues=1)
    group = "cg-raw-" + topic
    with _connect(broker) as sock:
        for i, tag in enumerate(["tagA", "tagB", "tagA", "tagB"]):
            sent = _send_v2(sock, 100 + i, topic, tag, f"b{i}".encode())
            assert sent.code == codec.SUCCESS and sent.ext["queueOffset"] == str(i), sent
            assert sent.ext["msgId"] == f"U{100 + i}"
        pull = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "sysFlag": 4,  # subscription given, no suspend
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "tagB",
        }
        answer = _call(sock, codec.Command(codec.PULL_MESSAGE, 200, ext=pull))
        assert answer.code == codec.SUCCESS and answer.ext["nextBeginOffset"] == "4"
        got = codec.decode_messages(answer.body)
        assert [(m.body, m.properties["TAGS"], m.queue_offset) for m in got] == [
            (b"b1", "tagB", 1),
            (b"b3", "tagB", 3),
        ]
        assert all(m.properties["UNIQ_KEY"] == f"U{100 + m.queue_offset}" for m in got)

        query = {"consumerGroup": group, "topic": topic, "queueId": 0}
        first = _call(sock, codec.Command(codec.QUERY_CONSUMER_OFFSET, 201, ext=query))
        assert first.code == codec.SUCCESS and first.ext["offset"] == "0"  # a new group starts at the oldest
        update = _call(
            sock, codec.Command(codec.UPDATE_CONSUMER_OFFSET, 202, ext={**query, "commitOffset": 4})
        )
        assert update.code == codec.SUCCESS
        assert _call(sock, codec.Command(codec.QUERY_CONSUMER_OFFSET, 203, ext=query)).ext["offset"] == "4"
        bounds = {"topic": topic, "queueId": 0}
        assert _call(sock, codec.Command(codec.GET_MAX_OFFSET, 204, ext=bounds)).ext["offset"] == "4"
        assert _call(sock, codec.Command(codec.GET_MIN_OFFSET, 205, ext=bounds)).ext["offset"] == "0"
        moved = _call(sock, codec.Command(codec.PULL_MESSAGE, 206, ext={**pull, "queueOffset": 9}))
        assert moved.code == codec.PULL_OFFSET_MOVED and moved.ext["nextBeginOffset"] == "4"


def test_consumer_list_follows_heartbeats_unregister_and_disconnect(cluster, broker):
    group = "cg-members-" + uuid.uuid4().hex[:6]

    def heartbeat(client_id: str) -> codec.Command:
        data = {
            "clientID": client_id,
            "consumerDataSet": [
                {"groupName": group, "subscriptionDataSet": [{"topic": "T", "subString": "*"}]}
            ],
            "producerDataSet": [],
        }
        return codec.Command(codec.HEART_BEAT, 1, body=json.dumps(data).encode())

    def members(sock: socket.socket) -> list[str]:
        request = codec.Command(codec.GET_CONSUMER_LIST_BY_GROUP, 2, ext={"consumerGroup": group})
        answer = _call(sock, request, notices)
        return codec.fastjson_loads(answer.body)["consumerIdList"]

    notices: list[codec.Command] = []
    with _connect(broker) as first, _connect(broker) as second:
        assert _call(first, heartbeat("c-1"), notices).code == codec.SUCCESS
        assert _call(second, heartbeat("c-2")).code == codec.SUCCESS
        assert members(first) == ["c-1", "c-2"]  # (reading on, c-1 gets its notices)
        notices += [_read(first)] if not notices else []
        # members are told when the group changes, so they rebalance at once
        assert notices and all(n.code == codec.NOTIFY_CONSUMER_IDS_CHANGED and n.is_oneway for n in notices)
        assert notices[0].ext["consumerGroup"] == group
        unregister = {"clientID": "c-2", "consumerGroup": group, "producerGroup": ""}
        assert _call(second, codec.Command(codec.UNREGISTER_CLIENT, 3, ext=unregister)).code == codec.SUCCESS
        assert members(second) == ["c-1"]
    with _connect(broker) as third:  # c-1's connection closed: it left
        wait_for(lambda: members(third) == [], 5.0, "the closed connection's consumer to leave")


def test_send_back_retries_through_the_retry_topic_then_dead_letters(cluster, broker):
    topic = _topic(cluster, queues=1)
    group = "cg-back-" + topic

    def pull(sock: socket.socket, opaque: int, name: str, wait_ms: int = 0) -> list[codec.WireMessage]:
        ext = {
            "consumerGroup": group,
            "topic": name,
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": 8,
            "sysFlag": 4 | (2 if wait_ms else 0),
            "commitOffset": 0,
            "suspendTimeoutMillis": wait_ms,
            "subscription": "*",
        }
        answer = _call(sock, codec.Command(codec.PULL_MESSAGE, opaque, ext=ext))
        # the retry and dead-letter topics exist from the first send-back on (the broker's
        # route cache learns of them within a second)
        assert answer.code in (codec.SUCCESS, codec.PULL_NOT_FOUND, codec.TOPIC_NOT_EXIST), answer
        return codec.decode_messages(answer.body)

    def send_back(
        sock: socket.socket, opaque: int, message: codec.WireMessage, times_max: int
    ) -> codec.Command:
        ext = {
            "group": group,
            "offset": message.commit_offset,
            "delayLevel": 0 if times_max else 1,
            "originTopic": message.topic,
            "originMsgId": message.properties["UNIQ_KEY"],
            "maxReconsumeTimes": times_max,
            "unitMode": "false",
        }
        return _call(sock, codec.Command(codec.CONSUMER_SEND_MSG_BACK, opaque, ext=ext))

    with _connect(broker) as sock:
        assert _send_v2(sock, 300, topic, "t", b"failing").code == codec.SUCCESS
        (original,) = pull(sock, 301, topic)
        bad = send_back(sock, 302, replace(original, commit_offset=original.commit_offset + 1), 16)
        assert bad.code == codec.SYSTEM_ERROR and "commit offset" in bad.remark
        assert send_back(sock, 303, original, 16).code == codec.SUCCESS
        retried: list[codec.WireMessage] = []
        wait_for(
            lambda: retried.extend(pull(sock, 304, "%RETRY%" + group, 1000)) or retried, 20.0, "the retry"
        )
        (copy,) = retried
        assert copy.body == b"failing" and copy.reconsume_times == 1
        assert copy.properties["RETRY_TOPIC"] == topic and copy.properties["UNIQ_KEY"] == "U300"
        assert send_back(sock, 305, copy, 1).code == codec.SUCCESS  # past its 1 reconsume time
        dead: list[codec.WireMessage] = []
        wait_for(lambda: dead.extend(pull(sock, 306, "%DLQ%" + group, 1000)) or dead, 20.0, "the dead letter")
        assert [(m.body, m.properties["UNIQ_KEY"]) for m in dead] == [(b"failing", "U300")]


# Orderly consumers, shared groups, batches, time search -----------------------------------------
def _lines(path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}")]


def _streams(processes: list, stop) -> None:
    stop.touch()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_orderly_consumer_gets_each_queue_in_order(cluster, namesrv, cpp_client, tmp_path):
    topic = _topic(cluster, queues=4)
    sent = cpp_client.run("produce-orderly", namesrv, topic, "pg-order", "40", "3")
    assert [s["status"] for s in sent] == [0] * 40
    received, stop = tmp_path / "orderly.jsonl", tmp_path / "stop"
    consumer = cpp_client.stream(
        received, "consume-stream", namesrv, topic, "cg-o-" + topic, str(stop), "60", "orderly"
    )
    try:
        wait_for(lambda: len({r["value"] for r in _lines(received)}) >= 40, 45, "every message, orderly")
    finally:
        _streams([consumer], stop)
    got = _lines(received)
    for queue_id in {g["queue_id"] for g in got}:
        offsets = [g["queue_offset"] for g in got if g["queue_id"] == queue_id]
        assert offsets == sorted(offsets), f"queue {queue_id} out of order: {offsets}"
    for key in ("k0", "k1", "k2"):  # one key, one queue: the send order
        values = [int(g["value"][2:]) for g in got if g["keys"] == key]
        assert values == sorted(values) and len(values) == len(range(int(key[1]), 40, 3)), (key, values)


def _lock(
    sock: socket.socket, opaque: int, code: int, client_id: str, group: str, topic: str
) -> codec.Command:
    body = {
        "consumerGroup": group,
        "clientId": client_id,
        "mqSet": [{"topic": topic, "brokerName": "broker-a", "queueId": 1}],
    }
    return _call(sock, codec.Command(code, opaque, body=json.dumps(body).encode()))


def test_queue_locks_are_exclusive_per_group_until_unlocked(cluster, broker):
    topic, group = _topic(cluster), "cg-lock-" + uuid.uuid4().hex[:6]
    with _connect(broker) as sock:
        first = _lock(sock, 1, codec.LOCK_BATCH_MQ, "c-1", group, topic)
        assert codec.fastjson_loads(first.body)["lockOKMQSet"] == [
            {"topic": topic, "brokerName": "broker-a", "queueId": 1}
        ]
        assert (
            codec.fastjson_loads(_lock(sock, 2, codec.LOCK_BATCH_MQ, "c-2", group, topic).body)["lockOKMQSet"]
            == []
        )
        assert codec.fastjson_loads(_lock(sock, 3, codec.LOCK_BATCH_MQ, "c-1", group, topic).body)[
            "lockOKMQSet"
        ]  # renewed
        assert (
            _lock(sock, 4, codec.UNLOCK_BATCH_MQ, "c-2", group, topic).code == codec.SUCCESS
        )  # not its lock: kept
        assert (
            codec.fastjson_loads(_lock(sock, 5, codec.LOCK_BATCH_MQ, "c-2", group, topic).body)["lockOKMQSet"]
            == []
        )
        assert _lock(sock, 6, codec.UNLOCK_BATCH_MQ, "c-1", group, topic).code == codec.SUCCESS
        assert codec.fastjson_loads(_lock(sock, 7, codec.LOCK_BATCH_MQ, "c-2", group, topic).body)[
            "lockOKMQSet"
        ]


def _members(broker: str, group: str) -> list[str]:
    with _connect(broker) as sock:
        answer = _call(sock, codec.Command(codec.GET_CONSUMER_LIST_BY_GROUP, 1, ext={"consumerGroup": group}))
    return codec.fastjson_loads(answer.body)["consumerIdList"] if answer.code == codec.SUCCESS else []


def test_two_consumers_of_a_group_share_the_queues(cluster, namesrv, broker, cpp_client, tmp_path):
    topic = _topic(cluster, queues=4)
    group, stop = "cg-share-" + topic, tmp_path / "stop"
    outputs = [tmp_path / "one.jsonl", tmp_path / "two.jsonl"]
    consumers = [
        cpp_client.stream(o, "consume-stream", namesrv, topic, group, str(stop), "90", "") for o in outputs
    ]
    try:
        wait_for(lambda: len(_members(broker, group)) == 2, 30, "both consumers in the group")
        sent = {s["value"] for s in cpp_client.produce(namesrv, topic, 40, prefix="share")}
        wait_for(lambda: sent <= {r["value"] for o in outputs for r in _lines(o)}, 45, "every message")
    finally:
        _streams(consumers, stop)
    one, two = ({r["queue_id"] for r in _lines(o)} for o in outputs)
    assert one and two and not one & two, (one, two)  # each its own queues, all of them between them
    assert one | two == {0, 1, 2, 3}


def test_batch_send_and_search_offset_by_timestamp(cluster, namesrv, broker, wheel_client):
    topic = _topic(cluster, queues=1)
    (result,) = wheel_client.run("produce-batch", namesrv, topic, "pg-batch", "5")
    assert result["status"] == 0 and result["offset"] == 0
    got = wheel_client.consume(namesrv, topic, "cg-b-" + topic, 5)
    assert sorted(g["value"] for g in got) == [f"b-{i}" for i in range(5)]
    assert all(g["keys"] == g["value"] for g in got)
    with _connect(broker) as sock:

        def search(opaque: int, timestamp: int) -> int:
            ext = {"topic": topic, "queueId": 0, "timestamp": timestamp}
            answer = _call(sock, codec.Command(codec.SEARCH_OFFSET_BY_TIMESTAMP, opaque, ext=ext))
            assert answer.code == codec.SUCCESS, answer
            return int(answer.ext["offset"])

        assert search(1, 0) == 0
        assert search(2, 2**62) == 5  # after the last: the max offset
        for _ in range(2):
            assert _send_v2(sock, 10, topic, "t", b"later").code == codec.SUCCESS
        pull = {
            "consumerGroup": "cg-ts",
            "topic": topic,
            "queueId": 0,
            "queueOffset": 5,
            "maxMsgNums": 1,
            "sysFlag": 4,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
        }
        (sixth,) = codec.decode_messages(_call(sock, codec.Command(codec.PULL_MESSAGE, 3, ext=pull)).body)
        found = search(4, sixth.store_timestamp_ms)
        assert found <= 5 and search(5, sixth.store_timestamp_ms + 1) >= found


@pytest.mark.parametrize("through", ["broker", "proxy"])
def test_query_message_by_key_and_by_id_and_view_message_by_id(cluster, broker, through):
    target = broker if through == "broker" else cluster["namesrv"][0]["remoting_proxies"]["broker-a"]
    topic = _topic(cluster, queues=1)
    unique = uuid.uuid4().hex[:8]
    with _connect(target) as sock:
        before_ms = int(time.time() * 1000) - 1000
        for i, keys in enumerate(["order-1 all", "order-2 all", "order-1 all"]):
            sent = _send_v2(sock, 300 + i, topic, "q", f"{unique}-{i}".encode(), keys)
            assert sent.code == codec.SUCCESS, sent

        def query(opaque: int, key: str, **more) -> codec.Command:
            ext = {"topic": topic, "key": key, "maxNum": 32, "beginTimestamp": before_ms, **more}
            return _call(sock, codec.Command(codec.QUERY_MESSAGE, opaque, ext={"endTimestamp": 2**62, **ext}))

        found = query(310, "order-1")
        assert found.code == codec.SUCCESS and found.opaque == 310, found
        messages = codec.decode_messages(found.body)
        assert [m.body for m in messages] == [f"{unique}-2".encode(), f"{unique}-0".encode()]  # newest first
        assert all("order-1" in m.properties["KEYS"].split(" ") for m in messages)
        assert len(codec.decode_messages(query(311, "all", maxNum=2).body)) == 2
        by_id = query(312, "U301", _UNIQUE_KEY_QUERY="true")
        assert [m.body for m in codec.decode_messages(by_id.body)] == [f"{unique}-1".encode()]
        missing = query(313, "order-9")
        assert missing.code == codec.QUERY_NOT_FOUND and "order-9" in missing.remark
        too_late = query(314, "order-1", beginTimestamp=2**61)
        assert too_late.code == codec.QUERY_NOT_FOUND and too_late.opaque == 314

        viewed = _call(
            sock, codec.Command(codec.VIEW_MESSAGE_BY_ID, 320, ext={"offset": messages[0].commit_offset})
        )
        assert viewed.code == codec.SUCCESS and viewed.opaque == 320, viewed
        (message,) = codec.decode_messages(viewed.body)
        assert (message.body, message.queue_offset, message.commit_offset) == (
            f"{unique}-2".encode(),
            messages[0].queue_offset,
            messages[0].commit_offset,
        )
        nowhere = _call(
            sock, codec.Command(codec.VIEW_MESSAGE_BY_ID, 321, ext={"offset": messages[0].commit_offset + 1})
        )
        assert nowhere.code == codec.SYSTEM_ERROR and "commit offset" in nowhere.remark

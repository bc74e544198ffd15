"""The nameserver's remoting proxies without a cluster: how they are configured and named.

Properties checked:
- `--remoting-proxy` takes BROKER_SET=HOST:PORT (repeated or comma-separated) and refuses a
  malformed item, a bad address, or a set or address named twice, with one sentence;
- the nameserver refuses a malformed `--remoting-proxy`, or one without
  `--remoting-listen`, with exit status 2 and one sentence;
- a route names a proxied broker set at its proxy (even while it has no master: the proxy
  waits for one) and any other set at its master's own remoting address (direct routes);
- a proxy holds a client's request while its set has no master and forwards it, with the
  client's last heartbeat replayed first, to the master that appears; an unanswered request
  past the wait gets SERVICE_NOT_AVAILABLE with a remark;
- a frame whose length is over the bound gets, from the proxy, the broker's own answer
  (SYSTEM_ERROR, the remark naming the bound), then the connection is closed; the proxy
  serves the next connection.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys

import pytest
from mqmeta.controller import remoting_proxy
from mqmeta.controller.namesrv_remoting import RemotingAddresses, route_body
from mqmeta.controller.remoting_proxy import RemotingProxies, parse_proxies

from mqmeta.codec import remoting as codec
from mqmeta.errors import InvalidArgument
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.remoting.server import RemotingServer
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)


def test_proxy_flags_are_parsed_and_checked():
    assert parse_proxies(["broker-a=127.0.0.1:1", "broker-b=127.0.0.1:2,broker-c=127.0.0.1:3"]) == {
        "broker-a": "127.0.0.1:1",
        "broker-b": "127.0.0.1:2",
        "broker-c": "127.0.0.1:3",
    }
    for bad in ("broker-a", "broker-a=nope", "a=127.0.0.1:1,a=127.0.0.1:2", "a=127.0.0.1:1,b=127.0.0.1:1"):
        with pytest.raises(InvalidArgument):
            parse_proxies([bad])


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (["--remoting-listen", "127.0.0.1:3", "--remoting-proxy", "broker-a"], "is not BROKER_SET=HOST:PORT"),
        (["--remoting-proxy", "broker-a=127.0.0.1:4"], "--remoting-proxy needs --remoting-listen"),
    ],
)
def test_bad_proxy_flags_are_refused_with_one_sentence(flags, sentence):
    command = [sys.executable, "-m", "mqmeta.cli", "namesrv", "--listen", "127.0.0.1:1"]
    done = subprocess.run(
        [*command, "--controllers", "127.0.0.1:2", *flags], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and sentence in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _route() -> cpb.TopicRoute:
    return cpb.TopicRoute(
        topic="T",
        queues=[
            cpb.QueueRoute(broker_name=n, read_queue_count=2, write_queue_count=2, perm="RW") for n in "ab"
        ],
        brokers=[
            cpb.BrokerRoute(broker_name="a", master_address=""),  # electing
            cpb.BrokerRoute(broker_name="b", master_address="grpc-b"),
        ],
    )


def test_routes_name_the_proxy_of_a_proxied_set_and_the_master_of_any_other():
    addresses = RemotingAddresses(ask={"grpc-b": "10.0.0.2:10911"}.__getitem__)
    proxied = codec.fastjson_loads(route_body(_route(), addresses, {"a": "10.0.0.9:9001"}))
    assert {b["brokerName"]: b["brokerAddrs"] for b in proxied["brokerDatas"]} == {
        "a": {"0": "10.0.0.9:9001"},
        "b": {"0": "10.0.0.2:10911"},
    }
    direct = codec.fastjson_loads(route_body(_route(), addresses))
    assert [b["brokerName"] for b in direct["brokerDatas"]] == ["b"]  # a has no master to name


def _call(sock: socket.socket, command: codec.Command) -> codec.Command:
    sock.sendall(codec.encode(command))
    return _answer(sock)


def _read(sock: socket.socket) -> codec.Command | None:
    """The next answer; None once the other end has closed the connection."""
    prefix = sock.recv(4, socket.MSG_WAITALL)
    if len(prefix) < 4:
        return None
    return codec.decode_frame(sock.recv(codec.frame_length(prefix), socket.MSG_WAITALL))


def _answer(sock: socket.socket) -> codec.Command:
    answer = _read(sock)
    assert answer is not None, "the connection closed without an answer"
    return answer


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_request_waits_for_a_master_and_the_heartbeat_is_replayed_first(monkeypatch):
    seen: list[int] = []

    def record(command, connection):
        seen.append(command.code)
        return command.answer(body=b"from-master")

    codes = (codec.HEART_BEAT, codec.GET_MAX_OFFSET)
    master = RemotingServer(_free_address(), dict.fromkeys(codes, record), name="fake-master")
    master.start()
    current = {"a": ""}  # no master yet
    proxies = RemotingProxies({"a": _free_address()}, lambda name: current[name]).start()
    host, _, port = proxies.proxies["a"].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            heartbeat = codec.Command(codec.HEART_BEAT, 1, body=json.dumps({"clientID": "c"}).encode())
            sock.sendall(codec.encode(heartbeat))
            current["a"] = master.address  # the master appears while the heartbeat waits
            first = _call(sock, codec.Command(codec.GET_MAX_OFFSET, 2))
            answers = {first.opaque: first, **{a.opaque: a for a in [_answer(sock)]}}
            assert sorted(answers) == [1, 2] and all(a.body == b"from-master" for a in answers.values())
            wait_for(lambda: seen == [codec.HEART_BEAT, codec.GET_MAX_OFFSET], 5, "both forwarded")
            master.stop()  # the master dies: a request now waits for the next one
            current["a"] = ""
            monkeypatch.setattr(remoting_proxy, "FAILOVER_WAIT_MS", 300)
            refused = _call(sock, codec.Command(codec.GET_MAX_OFFSET, 3))
            assert refused.code == codec.SERVICE_NOT_AVAILABLE and refused.opaque == 3
            assert "no reachable master" in refused.remark
            seen.clear()
            master = RemotingServer(_free_address(), dict.fromkeys(codes, record), name="new-master")
            master.start()
            current["a"] = master.address  # a new master: the heartbeat goes first, then the request
            assert _call(sock, codec.Command(codec.GET_MAX_OFFSET, 4)).opaque == 4
            assert seen == [codec.HEART_BEAT, codec.GET_MAX_OFFSET]
    finally:
        proxies.stop()
        master.stop()


def _oversize_answer(address: str) -> tuple[codec.Command, codec.Command | None]:
    """The answer to a frame length one byte over the bound, and what follows it."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", codec.FRAME_BYTES_MAX + 1))
        return _answer(sock), _read(sock)


def test_an_oversize_frame_is_answered_as_the_broker_does_then_the_connection_closes():
    def answer(command, connection):
        return command.answer(body=b"from-master")

    master = RemotingServer(_free_address(), {codec.GET_MAX_OFFSET: answer}, name="fake-master")
    master.start()
    proxies = RemotingProxies({"a": _free_address()}, lambda name: master.address).start()
    try:
        broker_answer, _ = _oversize_answer(master.address)
        proxy_answer, after = _oversize_answer(proxies.proxies["a"])
        assert proxy_answer.code == codec.SYSTEM_ERROR and str(codec.FRAME_BYTES_MAX) in proxy_answer.remark
        assert (proxy_answer.code, proxy_answer.opaque, proxy_answer.remark, proxy_answer.is_response) == (
            broker_answer.code,
            broker_answer.opaque,
            broker_answer.remark,
            broker_answer.is_response,
        )
        assert after is None  # where the frame ends is unknown: the connection is closed
        host, _, port = proxies.proxies["a"].rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # the next one is served
            assert _call(sock, codec.Command(codec.GET_MAX_OFFSET, 5)).body == b"from-master"
    finally:
        proxies.stop()
        master.stop()

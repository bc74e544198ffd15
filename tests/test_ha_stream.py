"""The HA stream (broker_agent/ha_stream.py): a slave's fetches over one TCP connection.

Properties checked (a real master agent, its stream server on loopback, no controller):
- a fetch over the stream is served as a HaFetch call is: a long poll answered by the
  append (before the master's fsync), its fetch offset the slave's acknowledgement, the
  master's HA status saying the slave streams;
- a refusal reaches the slave as the typed error the master raised (wrong broker set,
  an older master epoch), and the connection serves the next fetch;
- a frame that fails its CRC-32 ends that connection, and the server accepts the next;
- the stream is offered only where gRPC is plain and unauthenticated; a dial map that
  redirects the master's gRPC address must redirect the stream's too, or the slave stays
  on gRPC (a fault proxy is never bypassed); a fixed port is bound as given.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import pytest
from mqmeta.broker_agent import ha_stream
from mqmeta.broker_agent.agent import BrokerAgent, BrokerConfig
from mqmeta.broker_agent.core import HeartbeatAnswered, Registered, Synced, WriteOutcome
from mqmeta.broker_agent.ha_stream import StreamBroken, StreamClient
from mqmeta.broker_agent.seams import log_view
from mqmeta.broker_agent.status import ha_status
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.wait import wait_for

from mqmeta import dialmap, tls
from mqmeta.clock import now_ms
from mqmeta.errors import FencedEpoch, NotFound
from mqmeta.formats.records import Message
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import controller_pb2 as cpb

pytestmark = pytest.mark.timeout(60)
TIMEOUT_S = 5.0


@pytest.fixture
def master(tmp_path):
    """Broker 1, master of epoch 1 with SyncStateSet {1, 2}, its HA stream listening."""
    agent = BrokerAgent(
        BrokerConfig(
            cluster="C",
            broker_name="b",
            listen="127.0.0.1:1",
            controllers=["127.0.0.1:1"],
            data_dir=tmp_path / "b1",
            fsync=True,
        )
    )
    agent.feed(Registered(1, lease_ms=600_000))
    info = cpb.ReplicaInfo(
        master_broker_id=1,
        master_address="127.0.0.1:1",
        master_epoch=1,
        sync_state_set=[1, 2],
        sync_state_set_epoch=1,
        replicas=[cpb.Replica(broker_id=i) for i in (1, 2)],
    )
    agent.apply_replica_info(info)
    agent.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    server = ha_stream.StreamServer("127.0.0.1", agent._serve_streamed)
    server.start()
    yield agent, server
    server.stop()
    agent.stop()


def request(offset: int, wait_ms: int = 0, **fields) -> bpb.HaFetchRequest:
    defaults = {"broker_name": "b", "broker_id": 2, "master_epoch": 1, "max_bytes": 1 << 20}
    return bpb.HaFetchRequest(fetch_offset=offset, wait_ms=wait_ms, **{**defaults, **fields})


def test_a_streamed_fetch_is_woken_by_the_append_and_acknowledges_like_a_call(master):
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    answers: list[bpb.HaFetchResponse] = []
    poll = threading.Thread(target=lambda: answers.append(client.fetch(request(0, 5_000), TIMEOUT_S)))
    started = time.monotonic()
    poll.start()
    wait_for(lambda: agent._fetchers, TIMEOUT_S, "the streamed fetch waiting for data")
    _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    poll.join(TIMEOUT_S)
    assert answers and answers[0].data_offset == 0 and len(answers[0].data) == end
    assert agent.store.durable_offset == 0, "answered before the master's fsync"
    assert time.monotonic() - started < 2.5, "woken by the append, not by the end of its wait"
    client.fetch(request(end), TIMEOUT_S)  # the slave holds it all: its next fetch says so
    agent.store.sync(end)
    agent.feed(Synced(log_view(agent.store)))
    assert agent.core.write_outcome(end, 1) is WriteOutcome.ACKNOWLEDGED
    assert [(s.broker_id, s.streamed) for s in ha_status(agent).slaves] == [(2, True)]
    client.close()


def test_a_refusal_is_the_typed_error_and_the_connection_serves_on(master):
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    with pytest.raises(NotFound, match="serves b, not other"):
        client.fetch(request(0, broker_name="other"), TIMEOUT_S)
    agent.apply_replica_info(
        cpb.ReplicaInfo(
            master_broker_id=1,
            master_address="127.0.0.1:1",
            master_epoch=2,
            sync_state_set=[1, 2],
            sync_state_set_epoch=2,
            replicas=[cpb.Replica(broker_id=i) for i in (1, 2)],
        )
    )
    with pytest.raises(FencedEpoch):
        client.fetch(request(0, master_epoch=1), TIMEOUT_S)
    assert client.fetch(request(0, master_epoch=2), TIMEOUT_S).master_epoch == 2
    client.close()


def test_a_frame_that_fails_its_crc_ends_the_connection_and_the_next_is_served(master):
    _, server = master
    payload = request(0).SerializeToString()
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as raw:
        bad_crc = zlib.crc32(payload) ^ 1
        raw.sendall(struct.pack(">IBI", len(payload), ha_stream.KIND_REQUEST, bad_crc) + payload)
        assert raw.recv(1) == b"", "the master closed the connection without answering"
    client = StreamClient(f"127.0.0.1:{server.port}")
    assert client.fetch(request(0), TIMEOUT_S).master_epoch == 1
    client.close()
    with pytest.raises(StreamBroken) as refused:
        StreamClient("127.0.0.1:1")
    assert refused.value.unreachable
    with pytest.raises(StreamBroken) as malformed:  # a dial map's target port that is no number
        StreamClient("127.0.0.1:x")
    assert not malformed.value.unreachable


def test_the_stream_is_offered_only_over_plain_grpc_and_used_only_through_the_same_dial_map():
    assert ha_stream.offered() and ha_stream.usable("127.0.0.1:10911", 10913)
    tls.configure(tls.TlsConfig(cert=b"cert", key=b"key"))
    try:
        assert not ha_stream.offered(), "a TLS server offers no plaintext stream"
    finally:
        tls.configure(None)
    dialmap.install({"127.0.0.1:10911": "127.0.0.1:20911"})
    try:
        assert not ha_stream.usable("127.0.0.1:10911", 10913), "a fault proxy stands on the gRPC link"
        assert ha_stream.usable("127.0.0.1:10912", 10913)
    finally:
        dialmap.install({})
    dialmap.install({"127.0.0.1:10911": "127.0.0.1:20911", "127.0.0.1:10913": "127.0.0.1:20913"})
    try:
        assert ha_stream.usable("127.0.0.1:10911", 10913), "the stream's link has its own proxy"
        assert ha_stream.stream_address("[::1]:10911", 10913) == "[::1]:10913"
    finally:
        dialmap.install({})


def test_a_fixed_port_is_bound_as_given_even_while_a_cluster_holds_it(master):
    """--ha-stream-port: the server binds the given port, also one a local cluster's
    PortReservation holds for it (SO_REUSEADDR, as every server here)."""
    agent, _ = master
    with PortReservation.pick(1) as held:
        port = held.ports[0]
        fixed = ha_stream.StreamServer("127.0.0.1", agent._serve_streamed, port=port)
        fixed.start()
        try:
            assert fixed.port == port
            client = StreamClient(f"127.0.0.1:{port}")
            assert client.fetch(request(0), TIMEOUT_S).master_epoch == 1
            client.close()
        finally:
            fixed.stop()


def test_a_broker_whose_fixed_stream_port_is_taken_stops_with_one_sentence(tmp_path):
    """A taken --ha-stream-port is exit 2 with a sentence, not a silent fall back to gRPC
    (a firewall or a fault proxy was set up for that port)."""
    with socket.create_server(("127.0.0.1", 0)) as taken, PortReservation.pick(1) as grpc_port:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "mqmeta.cli", "broker", "--broker-name", "b"]
            + ["--listen", grpc_port.addresses[0], "--controllers", "127.0.0.1:1"]
            + ["--data-dir", str(tmp_path / "b"), "--ha-stream-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"mqmeta: error: cannot listen on 127.0.0.1:{port} for the HA stream (--ha-stream-port): "
        "Address already in use"
    )

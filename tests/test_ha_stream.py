"""The HA stream (broker_agent/ha_stream.py): a slave's fetches over one TCP connection.

Properties checked (a real master agent, its stream server on loopback, no controller):
- a fetch over the stream is served as a HaFetch call is: a long poll answered by the
  append (before the master's fsync), its fetch offset the slave's acknowledgement, the
  master's HA status saying the slave streams;
- a refusal reaches the slave as the typed error the master raised (wrong broker set,
  an older master epoch), and the connection serves the next fetch;
- a frame that fails its CRC-32 ends that connection, and the server accepts the next; a
  payload that is no protobuf is a bad frame on both sides (no error logged on the master,
  not an unreachable master on the slave), as is a connection refused at CONNECTIONS_MAX;
- stop() returns only once no connection's thread still serves a fetch; a refused fetch
  records no transport for its broker id; --ha-stream-port with --no-ha-stream is refused;
- a streamed fetch with nothing to send is parked: the append answers it from its own
  thread (before any fsync, and before the core hears of the append and the answer), the
  connection's thread when its wait ends (empty) or when a new epoch wakes it (the
  refusal, at once); an answer larger than the socket takes at
  once is finished by the connection's thread, whole; while other writers wait for their
  acknowledgements an append wakes the connection's thread instead of pushing;
- the append pushes a small answer before the core hears of the append and the answer,
  a larger one after; parked fetches share an answer only when they ask alike;
- a slave acknowledges an answer's bytes (its next fetch) only once they are durable,
  before it applies the rest of the answer; it builds and frames that fetch before its
  fdatasync, which is the last step before the fetch leaves, and a failed fdatasync
  fences it;
- a master that stops answering ends the fetch at its timeout (the sockets block with
  kernel timeouts), not as an unreachable master;
- the stream is offered only where gRPC is plain and unauthenticated; a dial map that
  redirects the master's gRPC address must redirect the stream's too, or the slave stays
  on gRPC (a fault proxy is never bypassed); a fixed port is bound as given.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import pytest
from mqmeta.broker_agent import agent as agent_module
from mqmeta.broker_agent import ha_fetch, ha_stream
from mqmeta.broker_agent.agent import BrokerAgent, BrokerConfig, _Writer
from mqmeta.broker_agent.core import HeartbeatAnswered, Registered, Stop, Synced, WriteOutcome
from mqmeta.broker_agent.ha import Role
from mqmeta.broker_agent.ha_stream import StreamBroken, StreamClient
from mqmeta.broker_agent.seams import log_view
from mqmeta.broker_agent.status import ha_status
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.wait import wait_for

from mqmeta import dialmap, frames, tls
from mqmeta.clock import now_ms
from mqmeta.errors import FailedPrecondition, FencedEpoch, InvalidArgument, NotFound, NotMaster, Unavailable
from mqmeta.formats.records import Message
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import controller_pb2 as cpb
from tests.support.trickle import trickled_connection_lifetime_s

pytestmark = pytest.mark.timeout(60)
TIMEOUT_S = 5.0


def master_info(epoch: int) -> cpb.ReplicaInfo:
    """Broker 1 the master of a set of two at `epoch`, both in the SyncStateSet."""
    return cpb.ReplicaInfo(
        master_broker_id=1,
        master_address="127.0.0.1:1",
        master_epoch=epoch,
        sync_state_set=[1, 2],
        sync_state_set_epoch=epoch,
        replicas=[cpb.Replica(broker_id=i) for i in (1, 2)],
    )


def new_agent(data_dir, broker_id: int) -> BrokerAgent:
    """Broker `broker_id` of set b, registered, fsyncing, not started (no threads)."""
    agent = BrokerAgent(
        BrokerConfig(
            cluster="C",
            broker_name="b",
            listen=f"127.0.0.1:{broker_id}",
            controllers=["127.0.0.1:1"],
            data_dir=data_dir,
            fsync=True,
        )
    )
    agent.feed(Registered(broker_id, lease_ms=600_000))
    return agent


@pytest.fixture
def master(tmp_path):
    """Broker 1, master of epoch 1 with SyncStateSet {1, 2}, its HA stream listening."""
    agent = new_agent(tmp_path / "b1", 1)
    agent.apply_replica_info(master_info(epoch=1))
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
    wait_for(lambda: agent._parked, TIMEOUT_S, "the streamed fetch parked until there is data")
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
    agent.apply_replica_info(master_info(epoch=2))
    with pytest.raises(FencedEpoch):
        client.fetch(request(0, master_epoch=1), TIMEOUT_S)
    assert client.fetch(request(0, master_epoch=2), TIMEOUT_S).master_epoch == 2
    client.close()


def test_a_fetch_while_the_broker_stops_is_refused_as_unavailable(master, caplog):
    """Between the core's stop and the stream's (BrokerAgent.stop), a fetch is refused with
    UNAVAILABLE (the slave fetches elsewhere), not a failed assertion logged with a traceback."""
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    agent.feed(Stop())
    with pytest.raises(Unavailable, match="stopping"):
        client.fetch(request(0), TIMEOUT_S)
    assert "serving an HA stream failed" not in caplog.text
    client.close()


def test_a_frame_that_fails_its_crc_ends_the_connection_and_the_next_is_served(master):
    _, server = master
    payload = request(0).SerializeToString()
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as raw:
        bad_crc = zlib.crc32(payload) ^ 1
        raw.sendall(struct.pack(">IBI", len(payload), frames.KIND_REQUEST, bad_crc) + payload)
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


def test_a_request_trickled_in_is_cut_at_its_deadline_and_an_idle_one_waits(master, monkeypatch):
    """The master's side cuts a request frame not all there FRAME_TIMEOUT_S after its
    first byte (a byte now and then, each well within the idle timeout), and puts its
    receive timeout back after a frame that came whole: the next fetch, sent after a
    pause longer than FRAME_TIMEOUT_S, is served."""
    monkeypatch.setattr(frames, "FRAME_TIMEOUT_S", 0.5)
    _, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    assert client.fetch(request(0), TIMEOUT_S).master_epoch == 1
    time.sleep(0.8)
    assert client.fetch(request(0), TIMEOUT_S).master_epoch == 1
    client.close()
    lived_s = trickled_connection_lifetime_s(server.port, 1000)
    assert lived_s is not None and lived_s < 2.0, f"the trickling connection lived {lived_s} s"


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


def test_stop_waits_for_the_connection_threads_in_a_fetch(master):
    """After stop() no connection's thread still serves (and touches the store): stop
    waits, within its bound, for the fetch under way."""
    served: list[str] = []
    entered = threading.Event()

    def serve(req: bpb.HaFetchRequest, link: ha_stream.Link) -> bpb.HaFetchResponse:
        entered.set()
        time.sleep(0.5)  # a fetch in its wait
        served.append("done")
        return bpb.HaFetchResponse()

    server = ha_stream.StreamServer("127.0.0.1", serve)
    server.start()
    client = StreamClient(f"127.0.0.1:{server.port}")
    poll = threading.Thread(target=lambda: _fetch_quietly(client), daemon=True)
    poll.start()
    assert entered.wait(TIMEOUT_S)
    server.stop()
    assert served == ["done"], "stop returned while a connection's thread was still serving"
    poll.join(TIMEOUT_S)
    client.close()


def _fetch_quietly(client: StreamClient) -> None:
    try:
        client.fetch(request(0), TIMEOUT_S)
    except StreamBroken:
        pass


def test_a_payload_that_is_no_protobuf_is_a_bad_frame_on_both_sides(master, caplog):
    """A frame whose CRC holds but whose payload does not parse: the master closes the
    connection without logging an error; the slave's fetch is StreamBroken, not unreachable."""
    _, server = master
    garbage = b"\x0a\xff"  # field 1, a length past the end
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as raw:
        raw.sendall(struct.pack(">IBI", len(garbage), frames.KIND_REQUEST, zlib.crc32(garbage)) + garbage)
        assert raw.recv(1) == b"", "the master closed the connection without answering"
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    with socket.create_server(("127.0.0.1", 0)) as fake:
        client = StreamClient(f"127.0.0.1:{fake.getsockname()[1]}")
        peer, _ = fake.accept()
        with peer:
            peer.sendall(
                struct.pack(">IBI", len(garbage), frames.KIND_RESPONSE, zlib.crc32(garbage)) + garbage
            )
            with pytest.raises(StreamBroken) as broken:
                client.fetch(request(0), TIMEOUT_S)
    assert not broken.value.unreachable


def test_a_refused_fetch_records_no_transport(master):
    """fetch_transports holds only the slaves whose fetch was served: a peer's refused
    requests do not grow it."""
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    with pytest.raises(FencedEpoch):
        client.fetch(request(0, broker_id=7, master_epoch=0), TIMEOUT_S)
    client.close()
    assert 7 not in agent.fetch_transports


def test_a_connection_past_the_limit_is_not_an_unreachable_master(master, monkeypatch):
    """At CONNECTIONS_MAX the master closes a new connection: the slave's fetch is broken
    but the master is not reported unreachable (the slave goes back to gRPC)."""
    _, server = master
    monkeypatch.setattr(server, "_connections_max", 1)
    first = StreamClient(f"127.0.0.1:{server.port}")
    assert first.fetch(request(0), TIMEOUT_S).master_epoch == 1
    second = StreamClient(f"127.0.0.1:{server.port}")
    with pytest.raises(StreamBroken) as broken:
        second.fetch(request(0), TIMEOUT_S)
    assert not broken.value.unreachable
    first.close()


def test_a_stream_port_with_the_stream_off_is_refused():
    """--ha-stream-port N with --no-ha-stream is a contradiction, not a silent no-op."""
    config = BrokerConfig(
        cluster="C",
        broker_name="b",
        listen="127.0.0.1:1",
        controllers=["127.0.0.1:1"],
        data_dir=".",
        ha_stream=False,
        ha_stream_port=4000,
    )
    with pytest.raises(InvalidArgument, match="--no-ha-stream"):
        config.validate()


def test_a_silent_master_ends_the_fetch_at_its_timeout_as_no_unreachable_master():
    """The stream's sockets block with kernel timeouts (SO_RCVTIMEO): a master that answered
    before and then says nothing ends the fetch after its timeout, as StreamBroken that
    does not report the master unreachable (its process is there)."""
    with socket.create_server(("127.0.0.1", 0)) as fake:
        client = StreamClient(f"127.0.0.1:{fake.getsockname()[1]}")
        peer, _ = fake.accept()
        with peer:
            answer = bpb.HaFetchResponse(master_epoch=1).SerializeToString()
            peer.sendall(struct.pack(">IBI", len(answer), frames.KIND_RESPONSE, zlib.crc32(answer)) + answer)
            assert client.fetch(request(0), TIMEOUT_S).master_epoch == 1
            started = time.monotonic()
            with pytest.raises(StreamBroken, match="no answer") as silent:
                client.fetch(request(0), 0.3)
            assert 0.25 < time.monotonic() - started < 2.0
    assert not silent.value.unreachable


def _park(
    agent: BrokerAgent,
    client: StreamClient,
    offset: int,
    wait_ms: int,
    max_bytes: int = 1 << 20,
    broker_id: int = 2,
):
    """A streamed fetch from `offset`, in a thread, parked on the master (one more than
    were parked before): (thread, outcomes)."""
    outcomes: list[object] = []
    parked = len(agent._parked)

    def fetch() -> None:
        try:
            asked = request(offset, wait_ms, max_bytes=max_bytes, broker_id=broker_id)
            outcomes.append(client.fetch(asked, TIMEOUT_S))
        except Exception as error:  # the test looks at it
            outcomes.append(error)

    poll = threading.Thread(target=fetch, daemon=True)
    poll.start()
    wait_for(lambda: len(agent._parked) > parked, TIMEOUT_S, "the streamed fetch parked")
    return poll, outcomes


def test_the_append_answers_a_parked_fetch_from_its_own_thread(master, monkeypatch):
    """A streamed fetch with nothing to send is parked, not waiting in a thread: the append
    sends the answer itself (no connection thread woken on a send's path), before any sync."""
    agent, server = master
    pushed_by: list[str] = []
    push = ha_stream.Link.push
    monkeypatch.setattr(
        ha_stream.Link,
        "push",
        lambda link, answer: pushed_by.append(threading.current_thread().name) or push(link, answer),
    )
    client = StreamClient(f"127.0.0.1:{server.port}")
    poll, outcomes = _park(agent, client, 0, 5_000)
    _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    poll.join(TIMEOUT_S)
    assert pushed_by == [threading.current_thread().name], "not pushed by the appending thread"
    (answer,) = outcomes
    assert isinstance(answer, bpb.HaFetchResponse) and len(answer.data) == end and not agent._parked
    assert agent.store.durable_offset == 0, "answered before the master's fsync"
    assert client.fetch(request(end), TIMEOUT_S).data == b"", "the connection serves on after a push"
    client.close()


@pytest.mark.parametrize("body_bytes", [100, agent_module.PUSH_UNDER_LOCK_BYTES + 1], ids=["small", "large"])
def test_the_append_pushes_before_its_own_bookkeeping_and_the_core_still_hears_of_the_answer(
    master, monkeypatch, body_bytes
):
    """The append pushes a parked fetch's small answer before it feeds the core its own
    bookkeeping of the append (Appended, FetchAnswered), so the slave starts on the bytes
    sooner; a larger answer (its frame's CRC and copy would hold the lock) after, once the
    lock is let go. The core hears of the answer either way: the slave's progress holds
    the log's durable end as of the answer and the time it was answered (what later says
    it was caught up)."""
    agent, server = master
    agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"a" * 10)], e, 1))
    durable = agent.store.sync()
    agent.feed(Synced(log_view(agent.store)))
    client = StreamClient(f"127.0.0.1:{server.port}")
    poll, outcomes = _park(agent, client, durable, 5_000)
    progress = agent.core._state.tracker.slaves[2]
    order: list[str] = []
    feed, push = agent.feed, ha_stream.Link.push
    monkeypatch.setattr(agent, "feed", lambda event: order.append(type(event).__name__) or feed(event))
    monkeypatch.setattr(ha_stream.Link, "push", lambda link, frame: order.append("push") or push(link, frame))
    before_ms = now_ms()
    agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * body_bytes)], e, 1))
    poll.join(TIMEOUT_S)
    if body_bytes <= agent_module.PUSH_UNDER_LOCK_BYTES:
        assert order == ["push", "Appended", "FetchAnswered"], order
    else:
        assert order == ["Appended", "FetchAnswered", "push"], order
    (answer,) = outcomes
    assert isinstance(answer, bpb.HaFetchResponse) and answer.data_offset == durable > 0
    assert progress.sent_max_offset == agent.store.durable_offset == durable and progress.sent_ms >= before_ms
    client.close()


def test_fetches_that_differ_in_their_size_limit_get_answers_of_their_own(master):
    """Parked fetches share an answer only when they ask alike: a smaller size limit gets
    the first record only (a record is never cut), the larger one both."""
    agent, server = master
    clients = [StreamClient(f"127.0.0.1:{server.port}") for _ in range(2)]
    polls = [
        _park(agent, client, 0, 5_000, max_bytes=size, broker_id=broker_id)
        for client, size, broker_id in zip(clients, (100, 1 << 20), (2, 3), strict=True)
    ]
    _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 150)] * 2, e, 1))
    for poll, _ in polls:
        poll.join(TIMEOUT_S)
    (small,), (large,) = (outcomes for _, outcomes in polls)
    assert len(large.data) == end and 0 < len(small.data) < end, (len(small.data), len(large.data), end)
    for client in clients:
        client.close()


def test_a_parked_fetch_is_answered_empty_when_its_wait_ends(master):
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    started = time.monotonic()
    poll, outcomes = _park(agent, client, 0, 300)
    poll.join(TIMEOUT_S)
    (answer,) = outcomes
    assert isinstance(answer, bpb.HaFetchResponse) and answer.data == b"" and not agent._parked
    assert 0.25 < time.monotonic() - started < 2.5
    client.close()


def test_a_new_epoch_wakes_a_parked_fetch_with_its_refusal(master):
    """A parked fetch of the old epoch is refused at once when the master's epoch moves,
    not at the end of its wait."""
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    poll, outcomes = _park(agent, client, 0, ha_fetch.FETCH_WAIT_MS_MAX)
    started = time.monotonic()
    agent.apply_replica_info(master_info(epoch=2))
    poll.join(TIMEOUT_S)
    assert outcomes and isinstance(outcomes[0], FencedEpoch) and not agent._parked
    waited_s = time.monotonic() - started
    assert waited_s < 0.7 * ha_fetch.FETCH_WAIT_MS_MAX / 1000, (
        "refused at the end of its wait, not when woken"
    )
    assert client.fetch(request(0, master_epoch=2), TIMEOUT_S).master_epoch == 2
    client.close()


def test_an_answer_larger_than_the_socket_takes_at_once_is_finished_by_the_connection(master):
    """A push sends what the socket takes without blocking; the connection's thread sends
    the rest: the slave gets every byte, whole."""
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    poll, outcomes = _park(agent, client, 0, 5_000, max_bytes=16 << 20)
    body = bytes(range(256)) * 4096  # 1 MiB
    _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, body)] * 8, e, 1))
    poll.join(TIMEOUT_S)
    (answer,) = outcomes
    assert isinstance(answer, bpb.HaFetchResponse) and len(answer.data) == end > 8 << 20
    assert answer.data == agent.store.read_bytes(0, 16 << 20)
    client.close()


def test_while_other_writers_wait_the_append_wakes_the_connection_instead(master, monkeypatch):
    """Concurrent producers: an append while other writers wait for their acknowledgements
    does not push its bytes alone; the connection's thread answers, with every append made
    by the time it runs (one replication round for several sends)."""
    agent, server = master
    pushed: list[int] = []
    push = ha_stream.Link.push
    monkeypatch.setattr(ha_stream.Link, "push", lambda link, answer: pushed.append(1) or push(link, answer))
    agent._writers[threading.Condition(agent._mutex)] = _Writer(1 << 40, 1, None)  # waiting for its acks
    client = StreamClient(f"127.0.0.1:{server.port}")
    poll, outcomes = _park(agent, client, 0, 5_000)
    _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    poll.join(TIMEOUT_S)
    (answer,) = outcomes
    assert isinstance(answer, bpb.HaFetchResponse) and len(answer.data) == end and not pushed
    agent._writers.clear()
    client.close()


def test_a_send_is_answered_by_the_thread_its_last_acknowledgement_arrives_on(master):
    """The stream thread that receives the slave's acknowledgement sends the producer's
    answer (send's on_acknowledged) and only then wakes the writer: the answer does not
    wait for a hand-off to the writer's thread."""
    agent, server = master
    client = StreamClient(f"127.0.0.1:{server.port}")
    events: list[str] = []
    told: list[tuple[str, list, int]] = []

    def on_acknowledged(results: list, epoch: int) -> None:
        told.append((threading.current_thread().name, results, epoch))
        events.append("answered")

    returned: list[tuple[list, int]] = []

    def send() -> None:
        returned.append(agent.send([Message("T", 0, b"x" * 100)], on_acknowledged))
        events.append("returned")

    poll, outcomes = _park(agent, client, 0, 5_000)
    writer = threading.Thread(target=send, daemon=True)
    writer.start()
    poll.join(TIMEOUT_S)
    (pushed,) = outcomes
    assert isinstance(pushed, bpb.HaFetchResponse) and pushed.data
    end = pushed.data_offset + len(pushed.data)
    wait_for(lambda: agent._writers, TIMEOUT_S, "the writer waits for its acknowledgement")
    client.fetch(request(end), TIMEOUT_S)  # acknowledges everything before `end`
    writer.join(TIMEOUT_S)
    assert events == ["answered", "returned"], "the writer's thread answered, or before the answer was sent"
    ((thread, results, epoch),) = told
    assert thread == "ha-stream" and (results, epoch) == returned[0]
    client.close()


def _streaming_slave(monkeypatch, tmp_path, server, steps: list[object]):
    """Broker 2, a slave of the master fixture's set that fetches only when the test says
    (no fetch loop), and its HA stream to that master; each fetch it sends is recorded in
    `steps` as ("sent", its offset, the slave's durable end then). Returns (slave, its
    fetch session, fetch settings, stream)."""
    monkeypatch.setattr(ha_fetch, "follow", lambda host, session, settings: None)
    slave = new_agent(tmp_path / "b2", 2)
    slave.apply_replica_info(master_info(epoch=1))
    stream = StreamClient(f"127.0.0.1:{server.port}")
    send = stream.send

    def sent(request, timeout_s, frame=b""):
        steps.append(("sent", request.fetch_offset, slave.store.durable_offset))
        send(request, timeout_s, frame)

    monkeypatch.setattr(stream, "send", sent)
    return slave, slave.view().fetch_session, ha_fetch.FetchSettings(1 << 20, 5_000), stream


def test_a_slave_acknowledges_bytes_once_durable_before_it_applies_the_answers_confirm_offset(
    master, tmp_path, monkeypatch
):
    """Over the stream, a slave sends its next fetch (which acknowledges what it holds) as
    soon as the answer's bytes are durable, then applies the rest of the answer (the
    master's confirm offset): never before they are durable."""
    agent, server = master
    steps: list[object] = []
    slave, session, settings, stream = _streaming_slave(monkeypatch, tmp_path, server, steps)
    feed = slave.feed
    monkeypatch.setattr(slave, "feed", lambda event: steps.append(type(event).__name__) or feed(event))
    try:
        fetching = threading.Thread(
            target=ha_fetch._stream_fetch, args=(slave, session, settings, stream), daemon=True
        )
        fetching.start()
        wait_for(lambda: agent._parked, TIMEOUT_S, "the slave's fetch parked")
        _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
        fetching.join(TIMEOUT_S)
        assert steps == [("sent", 0, 0), "MasterAnswered", ("sent", end, end), "Replicated"]
        assert stream.in_flight, "the next fetch is out, its answer for the next round to read"
    finally:
        stream.close()
        slave.stop()


def test_a_slaves_fdatasync_is_the_last_step_before_its_acknowledgement(master, tmp_path, monkeypatch):
    """The slave builds and frames the fetch that acknowledges an answer's bytes (it reads
    its role view) before it makes them durable, so only letting go of the lock and the
    socket's write come between its fdatasync's return and that fetch leaving; the fetch
    asks from the log's end, which the fdatasync made durable. A failed fdatasync fences
    the slave (the failure is injected)."""
    agent, server = master
    steps: list[object] = []
    slave, session, settings, stream = _streaming_slave(monkeypatch, tmp_path, server, steps)
    view, fdatasync, framed = slave.view, os.fdatasync, ha_stream.request_frame
    monkeypatch.setattr(slave, "view", lambda: steps.append("view") or view())
    monkeypatch.setattr(os, "fdatasync", lambda fd: steps.append("fdatasync") or fdatasync(fd))
    monkeypatch.setattr(ha_stream, "request_frame", lambda request: steps.append("framed") or framed(request))
    exits: list[int] = []
    monkeypatch.setattr(agent_module, "exit_at_once", exits.append)  # the process would end here
    try:
        stream.send(ha_fetch._request(slave, settings, False), TIMEOUT_S)
        wait_for(lambda: agent._parked, TIMEOUT_S, "the slave's fetch parked")
        steps.clear()
        _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
        ha_fetch._stream_fetch(slave, session, settings, stream)
        assert steps[-3:] == ["framed", "fdatasync", ("sent", end, end)], steps
        assert "view" in steps and steps.index("view") < steps.index("fdatasync")

        _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"y" * 100)], e, 1))
        monkeypatch.setattr(os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
        with pytest.raises(Unavailable, match="fenced"):
            ha_fetch._stream_fetch(slave, session, settings, stream)
        assert slave.view().role == Role.FENCED and slave.store.durable_offset < end
        wait_for(lambda: exits == [agent_module.EXIT_DISK_FAILED], TIMEOUT_S, "the slave to exit")
    finally:
        stream.close()
        slave.stop()


def test_one_append_reads_and_frames_once_for_slaves_that_ask_from_the_same_offset(master, monkeypatch):
    agent, server = master
    reads: list[int] = []
    framed: list[int] = []
    read_bytes, response_frame = agent.store.read_bytes, ha_stream.response_frame
    monkeypatch.setattr(
        agent.store,
        "read_bytes",
        lambda offset, size, check=True: reads.append(offset) or read_bytes(offset, size, check),
    )
    monkeypatch.setattr(
        ha_stream, "response_frame", lambda answer: framed.append(1) or response_frame(answer)
    )
    clients = [StreamClient(f"127.0.0.1:{server.port}") for _ in range(2)]
    polls = []
    for broker_id, client in zip((2, 3), clients, strict=True):
        outcomes: list[bpb.HaFetchResponse] = []
        poll = threading.Thread(
            target=lambda c=client, b=broker_id, o=outcomes: o.append(
                c.fetch(request(0, 5_000, broker_id=b), TIMEOUT_S)
            ),
            daemon=True,
        )
        poll.start()
        polls.append((poll, outcomes))
    wait_for(lambda: len(agent._parked) == 2, TIMEOUT_S, "both fetches parked")
    _, end, _ = agent.append(lambda e: agent.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    answers = []
    for poll, outcomes in polls:
        poll.join(TIMEOUT_S)
        answers.extend(outcomes)
    assert [len(a.data) for a in answers] == [end, end] and answers[0] == answers[1]
    assert reads == [0] and framed == [1], "each slave's answer read and framed on its own"
    for client in clients:
        client.close()


def test_a_write_deposed_after_its_append_is_not_written_again_alone(master, monkeypatch):
    """A combined send that fails after its append (the master deposed while it waited:
    its outcome unknown) is not retried alone, which would write it twice if this broker
    were master again."""
    agent, _ = master
    puts: list[int] = []
    put_messages = agent.store.put_messages
    monkeypatch.setattr(agent.store, "put_messages", lambda *a: puts.append(1) or put_messages(*a))

    def deposed(writer, deadline):
        raise NotMaster("deposed while waiting")

    monkeypatch.setattr(agent, "_await_acks", deposed)
    with pytest.raises(NotMaster):
        agent.send([Message("T", 0, b"x" * 100)])
    assert puts == [1], "written again alone"


def test_a_slave_never_asks_from_an_end_that_is_not_durable(master):
    """A fetch's offset acknowledges everything before it: with bytes written but not yet
    synced (a failed fdatasync leaves them so), no fetch is asked for at all."""
    agent, _ = master
    agent.store.put_messages([Message("T", 0, b"x" * 100)], 1, 1)  # group commit: not synced yet
    assert agent.store.durable_offset < agent.store.max_offset
    with pytest.raises(FailedPrecondition, match="acknowledges nothing"):
        ha_fetch._request(agent, ha_fetch.FetchSettings(1 << 20, 100), False)
    agent.store.sync()
    assert (
        ha_fetch._request(agent, ha_fetch.FetchSettings(1 << 20, 100), False).fetch_offset
        == agent.store.max_offset
    )

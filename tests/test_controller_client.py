"""ControllerClient.heartbeat against stand-in controllers (real gRPC servers in this process
whose ControllerService answers only Heartbeat): the cases a real controller cannot be made
to show on demand.

Properties checked:
- a controller without HeartbeatStream (UNIMPLEMENTED: an older version during a rolling
  upgrade) gets unary heartbeats, every one answered, and the stream is not tried again
  until STREAM_RETRY_S has passed; once the controller has it (upgraded), the heartbeats
  after that time go on the stream, with no new client;
- a stream that stops answering is given up after the attempt's bound and that heartbeat
  is answered by a unary call; the silent stream is closed, never read again.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from mqmeta import client as client_module
from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import controller_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

REPLY = pb.HeartbeatResponse(master_broker_id=1, master_epoch=3, sync_state_set_epoch=4, lease_ms=500)
REQUEST = pb.HeartbeatRequest(cluster="DefaultCluster", broker_name="b", broker_id=1, epoch=3)


class UnaryOnly(pb_grpc.ControllerServiceServicer):
    """A controller from before HeartbeatStream: the base class answers it UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.unary = 0

    def Heartbeat(self, request, context):
        self.unary += 1
        return REPLY


class Upgradable(UnaryOnly):
    """Answers HeartbeatStream UNIMPLEMENTED, as an older controller does, until `upgraded`."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_streams = 0
        self.streamed = 0
        self.upgraded = threading.Event()

    def HeartbeatStream(self, request_iterator, context):
        if not self.upgraded.is_set():
            self.refused_streams += 1
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        for _ in request_iterator:
            self.streamed += 1
            yield REPLY


class SilentStream(UnaryOnly):
    """Takes the stream's requests and never answers them (a stuck handler)."""

    def __init__(self) -> None:
        super().__init__()
        self.streamed = 0
        self.release = threading.Event()

    def HeartbeatStream(self, request_iterator, context):
        for _ in request_iterator:
            self.streamed += 1
            self.release.wait(30)
            return
        yield REPLY  # a generator: never reached


@pytest.fixture
def serve():
    servers = []

    def start(servicer) -> str:
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ControllerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")  # the server binds: no port race
        server.start()
        servers.append((server, servicer))
        return f"127.0.0.1:{port}"

    yield start
    for server, servicer in servers:
        if isinstance(servicer, SilentStream):
            servicer.release.set()
        server.stop(0)


def test_a_controller_without_the_stream_gets_unary_heartbeats(serve):
    servicer = Upgradable()
    with ControllerClient([serve(servicer)]) as client:
        assert [client.heartbeat(REQUEST) for _ in range(4)] == [REPLY] * 4
        assert servicer.unary == 4, "every heartbeat went as a unary call"
        assert servicer.refused_streams == 1, "the stream is not tried again before STREAM_RETRY_S"
        assert servicer.streamed == 0


class ShiftedClock:
    """The client's clock (its module's `time`), real time plus a shift the test advances:
    the retry time passes without the test sleeping through it."""

    def __init__(self) -> None:
        self.shift_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.shift_s

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # the client's own backoff: a pass-through, not the test waiting


def test_the_stream_is_tried_again_after_the_retry_time_and_used_once_the_controller_has_it(
    serve, monkeypatch
):
    clock = ShiftedClock()
    monkeypatch.setattr(client_module, "time", clock)
    servicer = Upgradable()
    with ControllerClient([serve(servicer)]) as client:
        assert [client.heartbeat(REQUEST) for _ in range(3)] == [REPLY] * 3
        assert (servicer.refused_streams, servicer.unary) == (1, 3)
        clock.shift_s += client_module.STREAM_RETRY_S + 0.1
        assert client.heartbeat(REQUEST) == REPLY  # still old: refused again, answered unary
        assert (servicer.refused_streams, servicer.unary) == (2, 4)
        servicer.upgraded.set()
        assert [client.heartbeat(REQUEST) for _ in range(3)] == [REPLY] * 3
        assert servicer.unary == 7 and servicer.streamed == 0, "within the retry time: unary"
        clock.shift_s += client_module.STREAM_RETRY_S + 0.1
        assert [client.heartbeat(REQUEST) for _ in range(3)] == [REPLY] * 3
        assert servicer.streamed == 3 and servicer.unary == 7, "after it: on the stream"
        assert servicer.refused_streams == 2


def test_a_silent_stream_is_given_up_and_the_heartbeat_answered_unary(serve):
    servicer = SilentStream()
    with ControllerClient([serve(servicer)], timeout_s=5.0) as client:
        started = time.monotonic()
        assert client.heartbeat(REQUEST) == REPLY
        took = time.monotonic() - started
        call = client._heartbeat_call
        assert servicer.streamed == 1 and servicer.unary == 1
        assert call is not None and call.closed, "the silent stream is closed"
        assert 1.5 <= took < 4.5, f"gave the stream its 2 s attempt, then went unary ({took:.2f} s)"
        assert client.heartbeat(REQUEST) == REPLY  # a new stream, silent again: unary again
        assert client._heartbeat_call is not call and servicer.streamed == 2


def test_a_lost_controller_connection_is_dialed_again_within_half_a_second():
    """A listener that accepts and at once closes every connection (a link that keeps
    dropping). Within 3 s the client dials it at least 5 times: its channel waits at most
    0.5 s between dials. gRPC's default (1 s, then 1.6 times longer each time) dials 2 or 3
    times, and a broker whose link to the leader dropped twice missed broker_dead_after_ms
    (2 s) though the link was back."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    dials = 0
    stop = threading.Event()

    def accept_and_close() -> None:
        nonlocal dials
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            dials += 1
            connection.close()

    acceptor = threading.Thread(target=accept_and_close, daemon=True)
    acceptor.start()
    client = ControllerClient([address], timeout_s=3.0)
    try:
        with pytest.raises(MqmetaError):
            client.heartbeat(REQUEST)  # retried until its 3 s deadline
    finally:
        stop.set()
        acceptor.join(5)
        client.close()
        listener.close()
    assert dials >= 5, f"{dials} dials in 3 s"

"""Our client's calls to a broker set's master (broker_client._call_master): which failures
it tries again. A real gRPC server in this process stands in for the master."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from mqmeta.broker_client import Channels, call_master
from mqmeta.errors import MqmetaError
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc


class FlakyMaster(bpb_grpc.BrokerServiceServicer):
    """Answers Send with `failures` aborts of the given code first, then a result."""

    def __init__(self, code: grpc.StatusCode, failures: int) -> None:
        self.code, self.failures, self.calls = code, failures, 0

    def Send(self, request, context):  # noqa: N802 - the service's name
        self.calls += 1
        if self.calls <= self.failures:
            context.abort(self.code, "the server stops")
        return bpb.SendResponse(results=[bpb.SendResult(queue_offset=7)])


class OneRoute:
    def __init__(self, address: str) -> None:
        self.address, self.refreshed = address, 0

    def master(self, topic: str, broker_name: str) -> str:
        return self.address

    def route(self, topic: str, refresh: bool = False) -> None:
        self.refreshed += refresh


@pytest.fixture
def master_of():
    servers = []

    def start(servicer) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        bpb_grpc.add_BrokerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def send(address: str) -> bpb.SendResponse:
    channels = Channels()
    try:
        request = bpb.SendRequest(messages=[bpb.Message(topic="T", body=b"x")])
        return call_master(OneRoute(address), channels, "T", "broker-a", "Send", request, 5.0)
    finally:
        channels.close()


def test_a_send_cancelled_by_a_stopping_master_is_tried_again(master_of):
    master = FlakyMaster(grpc.StatusCode.CANCELLED, failures=2)
    reply = send(master_of(master))
    assert [r.queue_offset for r in reply.results] == [7]
    assert master.calls == 3


def test_a_send_refused_for_bad_input_is_not_tried_again(master_of):
    master = FlakyMaster(grpc.StatusCode.INVALID_ARGUMENT, failures=1)
    with pytest.raises(MqmetaError):
        send(master_of(master))
    assert master.calls == 1

"""mqmeta.rpc.rpc_async_stream on a real grpc.aio server (loopback, this process): a streaming
handler's errors end the stream as `rpc_async` ends a unary call.

Properties checked:
- the answers before an error reach the client, in order; an MqmetaError then ends the stream
  with its status, domain code and leader (NOT_LEADER names where to go);
- a bug ends it INTERNAL with an id and none of the exception's text (it may carry another
  caller's data); the server log holds the handler's name, that id and the traceback; a
  unary handler (`rpc`) answers a bug alike;
- an abort the handler chose itself keeps its own status (it is not reported as a bug).
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from mqmeta.errors import NotFound, NotLeader
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import controller_pb2_grpc as pb_grpc
from mqmeta.rpc import from_rpc_error, rpc, rpc_async_stream

pytestmark = pytest.mark.timeout(60)


class Scripted(pb_grpc.ControllerServiceServicer):
    """Answers each heartbeat with its broker_id as the master id; broker_id picks a failure:
    -1 NOT_FOUND, -2 NOT_LEADER, -3 a bug, -4 the handler's own abort."""

    @rpc_async_stream
    async def HeartbeatStream(self, request_iterator, context):
        async for request in request_iterator:
            if request.broker_id == -1:
                raise NotFound("broker set DefaultCluster/b has no broker 7", code="BROKER_SET_NOT_FOUND")
            if request.broker_id == -2:
                raise NotLeader("not the leader", leader="127.0.0.1:9")
            if request.broker_id == -3:
                raise ValueError("a bug near the secret /var/keys/k1")
            if request.broker_id == -4:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "chosen by the handler")
            yield pb.HeartbeatResponse(master_broker_id=request.broker_id)

    @rpc
    def GetMetadata(self, request, context):
        raise KeyError("the secret /var/keys/k1")


async def exchange(broker_ids: list[int]) -> tuple[list[int], grpc.aio.AioRpcError | None]:
    server = grpc.aio.server()
    pb_grpc.add_ControllerServiceServicer_to_server(Scripted(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ControllerServiceStub(channel).HeartbeatStream(
                iter([pb.HeartbeatRequest(broker_id=b) for b in broker_ids]), timeout=10
            )
            answered: list[int] = []
            try:
                async for reply in call:
                    answered.append(reply.master_broker_id)
            except grpc.aio.AioRpcError as error:
                return answered, error
            return answered, None
    finally:
        await server.stop(0)


def test_answers_before_a_refusal_arrive_and_the_refusal_keeps_its_status_code_and_leader():
    answered, error = asyncio.run(exchange([1, 2, -1, 3]))
    assert answered == [1, 2] and error is not None
    refused = from_rpc_error(error)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert isinstance(refused, NotFound) and refused.code == "BROKER_SET_NOT_FOUND"
    assert "has no broker 7" in refused.message

    answered, error = asyncio.run(exchange([5, -2]))
    assert answered == [5] and error is not None
    refused = from_rpc_error(error)
    assert isinstance(refused, NotLeader) and refused.leader == "127.0.0.1:9"


def test_a_bug_ends_the_stream_internal_and_is_logged(caplog):
    with caplog.at_level(logging.ERROR, logger="mqmeta.rpc"):
        answered, error = asyncio.run(exchange([4, -3, 5]))
    assert answered == [4] and error is not None
    assert error.code() == grpc.StatusCode.INTERNAL
    assert_internal_with_an_id_only(error.details(), "HeartbeatStream", caplog)


def assert_internal_with_an_id_only(details: str, handler: str, caplog) -> None:
    found = re.fullmatch(r"internal error ([0-9a-f]{12}): see the server log", details)
    assert found, details
    logged = [r for r in caplog.records if found.group(1) in r.getMessage()]
    assert len(logged) == 1 and f"{handler} failed" in logged[0].getMessage()
    assert logged[0].exc_info is not None and "/var/keys/k1" in str(logged[0].exc_info[1])


def test_a_bug_in_a_unary_handler_answers_internal_with_an_id_only(caplog):
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ControllerServiceServicer_to_server(Scripted(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="mqmeta.rpc"):
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.RpcError) as failed:
                    pb_grpc.ControllerServiceStub(channel).GetMetadata(pb.GetMetadataRequest(), timeout=10)
        assert failed.value.code() == grpc.StatusCode.INTERNAL  # type: ignore[attr-defined]
        assert_internal_with_an_id_only(failed.value.details(), "GetMetadata", caplog)  # type: ignore[attr-defined]
    finally:
        server.stop(0)


def test_the_handlers_own_abort_keeps_its_status_and_is_not_a_bug(caplog):
    with caplog.at_level(logging.ERROR, logger="mqmeta.rpc"):
        answered, error = asyncio.run(exchange([6, -4, 7]))
    assert answered == [6] and error is not None
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == "chosen by the handler"
    assert not any("failed" in r.getMessage() for r in caplog.records)

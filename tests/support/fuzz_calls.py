"""Sending fuzzed requests to live servers by method descriptor, and what every answer
must satisfy (tests/test_fuzz_services.py, tests/test_fuzz_rmq.py).

A call's outcome is its gRPC status code (OK for a stream that we cancelled after a few
answers), the status details and the answers received. Streams: up to STREAM_ANSWERS_MAX
answers are read, then the call is cancelled; a bidirectional stream is sent a few
requests first. Imports no generated stubs (descriptors only), so the rmq module can use
it without the mqmeta.v1 ones mattering.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.pb_fuzz import message_class

CALL_TIMEOUT_S = 5.0
STREAM_ANSWERS_MAX = 3
STREAM_READ_S = 1.0  # a stream is cancelled after this (long polls and watches wait by design)
# Statuses a refusal may carry on every method (mqmeta.rpc's table, minus UNAVAILABLE and
# DEADLINE_EXCEEDED: those only where a method waits by design, see LONG_POLL_STATUSES).
REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
LONG_POLL_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

# How many requests each method was sent in this process, by "service/method".
CASES: collections.Counter[str] = collections.Counter()


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    answers: list[Any] = field(default_factory=list)


def method_path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def call(
    channel: grpc.Channel,
    method: MethodDescriptor,
    request: Any,
    metadata: Iterable[tuple[str, str]] = (),
    more_requests: Iterable[Any] = (),
    timeout_s: float = CALL_TIMEOUT_S,
) -> Outcome:
    """Sends `request` (and, to a client stream, `more_requests` after it) to `method`."""
    CASES[f"{method.containing_service.name}/{method.name}"] += 1
    output = message_class(method.output_type)
    kwargs: dict[str, Any] = {
        "request_serializer": lambda m: m.SerializeToString(),
        "response_deserializer": output.FromString,
    }
    path = method_path(method)
    meta = list(metadata)
    try:
        if not method.client_streaming and not method.server_streaming:
            answer = channel.unary_unary(path, **kwargs)(request, timeout=timeout_s, metadata=meta)
            return Outcome(grpc.StatusCode.OK, "", [answer])
        if method.client_streaming:
            stream = channel.stream_stream(path, **kwargs)(
                iter([request, *more_requests]), timeout=timeout_s, metadata=meta
            )
        else:
            stream = channel.unary_stream(path, **kwargs)(request, timeout=timeout_s, metadata=meta)
        return _read_then_cancel(stream)
    except grpc.RpcError as error:
        return Outcome(error.code(), error.details() or "")


def _read_then_cancel(stream: Any) -> Outcome:
    answers = []
    timer = threading.Timer(STREAM_READ_S, stream.cancel)
    timer.start()
    try:
        for answer in stream:
            answers.append(answer)
            if len(answers) >= STREAM_ANSWERS_MAX:
                break
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.CANCELLED:
            return Outcome(error.code(), error.details() or "", answers)
    finally:
        timer.cancel()
    stream.cancel()
    return Outcome(grpc.StatusCode.OK, "", answers)


def check_status(outcome: Outcome, where: str, long_poll: bool) -> None:
    """A documented status, with a sentence when it is a refusal."""
    allowed = REFUSALS | (LONG_POLL_STATUSES if long_poll else frozenset())
    if outcome.code == grpc.StatusCode.OK:
        return
    assert outcome.code in allowed, (
        f"{outcome.code.name} ({outcome.details[:300]!r}) is not documented: {where}"
    )
    assert outcome.details.strip(), f"{outcome.code.name} without a message: {where}"


def serving(address: str, timeout_s: float = 2.0) -> bool:
    """The process at `address` answers its gRPC health check SERVING."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    return reply.status == health_pb2.HealthCheckResponse.SERVING

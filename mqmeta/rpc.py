"""The one gRPC boundary: errors <-> status codes, the servicer decorator, servers.

Every server of every part is built here (`build_server`, or `AsyncServer` where
streams must not hold a thread each; both with health checking and reflection so that
`grpcurl` works) and every servicer method is wrapped by `rpc` (`rpc_async` for the
coroutines an AsyncServer runs on its event loop), so a
domain error reaches a client as exactly one status, with its domain code and (for
NOT_LEADER / NOT_MASTER) the address to go to in trailing metadata; clients turn a
failed call back into the same typed error with `from_rpc_error`. Dependency
exceptions never leak: anything else (a bug) is logged with its traceback under a fresh
id, and the client is told INTERNAL with that id only (`internal_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mqmeta import auth, tls
from mqmeta.errors import (
    WIRE_CODES,
    AlreadyExists,
    CorruptData,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MqmetaError,
    NotFound,
    ResourceExhausted,
    Unavailable,
    error_from_code,
    listed_class,
)
from mqmeta.memory import TRIM_INTERVAL_S, return_freed_memory

log = logging.getLogger(__name__)

ERROR_CODE_KEY = "mqmeta-error-code"
LEADER_KEY = "mqmeta-leader"
GRPC_WORKERS_MAX = 64
STOP_GRACE_S = 1.0
SIGNAL_POLL_S = 0.1
STOP_NOW_GRACE_S = 0.1  # a stop at once (SIGINT) still lets answers being written go out
SLOW_STOP_STEP_S = 0.5  # a step of a node's stop that took longer is logged, named
# A status message is sent percent-encoded in the grpc-message header (up to 12 bytes per
# character); a client drops a header over 16 KiB and sees RESOURCE_EXHAUSTED instead of
# the status. So a message is cut to this many characters.
MESSAGE_CHARS_MAX = 1024

# The status of each error class (mqmeta.errors.WIRE_CODES; a bad name fails here, at import).
STATUS_OF: dict[type[MqmetaError], grpc.StatusCode] = {
    cls: grpc.StatusCode[codes.grpc] for cls, codes in WIRE_CODES.items()
}
# A failed call without a domain code (e.g. from grpc itself) becomes this class.
_ERROR_OF_STATUS: dict[grpc.StatusCode, type[MqmetaError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.DATA_LOSS: CorruptData,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


# The gRPC metadata key of an admin write's request id (P16): one id per logical write,
# sent with each of its attempts, so the controller applies a retried write once.
REQUEST_ID_HEADER = "mqmeta-request-id"


def bounded(message: str) -> str:
    """`message` cut to MESSAGE_CHARS_MAX characters (see there)."""
    if len(message) <= MESSAGE_CHARS_MAX:
        return message
    suffix = f"... ({len(message)} characters)"
    return message[: MESSAGE_CHARS_MAX - len(suffix)] + suffix


def status_of(error: MqmetaError) -> grpc.StatusCode:
    return STATUS_OF[listed_class(error)]


def abort_with(context: grpc.ServicerContext, error: MqmetaError) -> None:
    """Ends a gRPC call with the error's status, message and domain code."""
    metadata: list[tuple[str, str]] = [(ERROR_CODE_KEY, error.code)]
    if error.leader:
        metadata.append((LEADER_KEY, error.leader))
    context.set_trailing_metadata(metadata)
    context.abort(status_of(error), bounded(error.message))


async def abort_with_async(context: grpc.aio.ServicerContext, error: MqmetaError) -> None:
    """abort_with for a coroutine handler on an AsyncServer."""
    metadata: list[tuple[str, str]] = [(ERROR_CODE_KEY, error.code)]
    if error.leader:
        metadata.append((LEADER_KEY, error.leader))
    await context.abort(status_of(error), bounded(error.message), trailing_metadata=tuple(metadata))


# A failed TLS handshake is UNAVAILABLE, or UNKNOWN when gRPC reports the TLS error itself.
_TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN)


def from_rpc_error(err: grpc.RpcError) -> MqmetaError:
    """Turns a failed call back into the typed error the server raised."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    trailing = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
    return error_from_status(
        code, details or "", str(trailing.get(ERROR_CODE_KEY, "")), str(trailing.get(LEADER_KEY, ""))
    )


def error_from_status(code: grpc.StatusCode, details: str, domain: str, leader: str) -> MqmetaError:
    """The typed error of a failed call: its status, message, domain code (ERROR_CODE_KEY)
    and leader (LEADER_KEY), as gRPC or the call stream (mqmeta/call_stream.py) carry them."""
    if domain:
        typed = error_from_code(domain, details or domain)
    else:
        hint = tls.explain_refusal(details or "") if code in _TRANSPORT_CODES else ""
        message = f"{details} ({hint})" if hint else details or str(code)
        typed = _ERROR_OF_STATUS.get(code, MqmetaError)(message)
    typed.leader = leader
    return typed


def internal_error(name: str) -> str:
    """Logs the exception being handled (a bug in handler `name`) with a fresh id and
    returns what the client is told: the id, never the exception's text (it may carry
    paths, keys or data of another caller). Call it from an `except` clause."""
    error_id = uuid.uuid4().hex[:12]
    log.exception("%s failed (internal error %s)", name, error_id)
    return f"internal error {error_id}: see the server log"


def rpc(method: Callable) -> Callable:
    """Wraps a unary servicer method: every domain error (and any bug) becomes one status
    with a clear message."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except MqmetaError as error:
            abort_with(context, error)
        except grpc.RpcError:
            raise  # context.abort's own exception, or a call this method made and let fail
        except Exception:  # a bug: report it without leaking internals
            context.abort(grpc.StatusCode.INTERNAL, internal_error(method.__name__))

    return wrapper


def rpc_async(method: Callable) -> Callable:
    """`rpc` for a unary coroutine handler (it runs on an AsyncServer's event loop)."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:
            await _abort_async_for(context, exc, method.__name__)

    return wrapper


def rpc_async_stream(method: Callable) -> Callable:
    """`rpc_async` for a streaming coroutine handler (an async generator): an error ends the
    stream with the status the unary call would answer."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for reply in method(self, request, context):
                yield reply
        except Exception as exc:
            await _abort_async_for(context, exc, method.__name__)

    return wrapper


async def _abort_async_for(context: grpc.aio.ServicerContext, exc: Exception, name: str) -> None:
    """Ends a coroutine handler's call for `exc`, raised in handler `name` (called from its
    `except` clause)."""
    if isinstance(exc, MqmetaError):
        await abort_with_async(context, exc)
    elif isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
        raise exc  # context.abort's own exception, or a failed call
    else:  # a bug: report it without leaking internals
        await context.abort(grpc.StatusCode.INTERNAL, internal_error(name))


def check_can_listen(address: str) -> None:
    """InvalidArgument (one sentence) when `address` cannot be bound: asked before gRPC
    binds, whose own failure is a C-core log line on stderr and a bare RuntimeError. A
    check, not a reservation: gRPC's bind still decides, and its failure is still told."""
    host, _, port = address.rpartition(":")
    try:
        family, kind, _, _, where = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[
            0
        ]
    except (OSError, ValueError):
        raise InvalidArgument(f"cannot listen on {address}: the host does not resolve") from None
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(where)
        except OSError as error:
            reason = {
                errno.EADDRINUSE: "the port is in use (another process listens there)",
                errno.EADDRNOTAVAIL: "the address is not one of this machine's",
                errno.EACCES: "this user may not bind that port",
            }.get(error.errno or 0, error.strerror or "bind failed")
            raise InvalidArgument(f"cannot listen on {address}: {reason}") from None


def build_server(
    address: str, workers_max: int = GRPC_WORKERS_MAX, request_bytes_max: int | None = None
) -> grpc.Server:
    """A server bound to `address` (not started); InvalidArgument when it cannot listen.
    `request_bytes_max` raises gRPC's 4 MiB limit on a request (the RocketMQ 5 service takes
    bodies of 4 MiB and answers larger ones with its own code, not gRPC's)."""
    options: list[tuple[str, int]] = [("grpc.so_reuseport", 0)]  # a taken port must fail, not be shared
    if request_bytes_max is not None:
        options.append(("grpc.max_receive_message_length", request_bytes_max))
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers_max, thread_name_prefix="rpc"),
        options=options,
        interceptors=auth.server_interceptors(),
    )
    check_can_listen(address)
    if tls.add_port(server, address) == 0:
        raise InvalidArgument(f"cannot listen on {address}: the port is taken or not local")
    return server


def add_health_and_reflection(server: grpc.Server, services: Iterable[str]) -> None:
    """grpc.health.v1 (every service SERVING) and server reflection, for grpcurl and probes."""
    names = list(services)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.add_generic_rpc_handlers((_reflection_handler([*names, health.SERVICE_NAME], asynchronous=False),))


async def add_health_and_reflection_async(server: grpc.aio.Server, services: Iterable[str]) -> None:
    """add_health_and_reflection for an AsyncServer (called on its event loop)."""
    names = list(services)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.add_generic_rpc_handlers((_reflection_handler([*names, health.SERVICE_NAME], asynchronous=True),))


REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"  # grpc_reflection's SERVICE_NAME


def _reflection_handler(names: list[str], asynchronous: bool) -> grpc.GenericRpcHandler:
    """grpc_reflection's service, its modules imported on the first reflection call: they
    import protobuf's descriptor_pb2, 0.7 MB of every server's memory that only a
    reflection client (grpcurl) uses. The servicer is grpc_reflection's own."""
    made: list[Any] = []
    lock = threading.Lock()

    def servicer() -> Any:
        with lock:
            if not made:
                from grpc_reflection.v1alpha import reflection

                assert reflection.SERVICE_NAME == REFLECTION_SERVICE, reflection.SERVICE_NAME
                kind = reflection.aio.ReflectionServicer if asynchronous else reflection.ReflectionServicer
                made.append(kind([*names, REFLECTION_SERVICE]))
            return made[0]

    def request(data: bytes) -> Any:
        from grpc_reflection.v1alpha import reflection_pb2

        return reflection_pb2.ServerReflectionRequest.FromString(data)

    async def answers_async(requests: Any, context: Any) -> AsyncIterator[Any]:
        async for answer in servicer().ServerReflectionInfo(requests, context):
            yield answer

    def answers(requests: Any, context: Any) -> Any:
        yield from servicer().ServerReflectionInfo(requests, context)

    method = grpc.stream_stream_rpc_method_handler(
        answers_async if asynchronous else answers,
        request_deserializer=request,
        response_serializer=lambda answer: answer.SerializeToString(),
    )
    return grpc.method_handlers_generic_handler(REFLECTION_SERVICE, {"ServerReflectionInfo": method})


ServerSetup = Callable[[grpc.aio.Server], Awaitable[None]]
SERVER_START_TIMEOUT_S = 30.0


# Clients that keep a watch stream alive ping every second or so (controller/route_cache.py):
# gRPC's server default (at most one ping per 5 minutes without data, then GOAWAY) would
# cut those streams. A ping costs the server one small frame.
PING_TOLERANT_OPTIONS = [
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),  # 0: never GOAWAY a client for pinging
    ("grpc.keepalive_permit_without_calls", 1),
]


class AsyncServer:
    """A grpc.aio server on an event loop of its own thread.

    Coroutine handlers (and async-generator streams) run on the loop: a server stream
    holds no thread, so a thousand watch streams cost a thousand small objects, not a
    thousand threads. Plain (sync) handlers run in a pool of `workers_max` threads, as
    on a `build_server` server. start() binds and starts (InvalidArgument when it cannot
    listen); stop(grace) returns a set threading.Event, like grpc.Server.stop."""

    def __init__(
        self,
        address: str,
        setup: ServerSetup,
        workers_max: int = GRPC_WORKERS_MAX,
        request_bytes_max: int | None = None,
    ) -> None:
        self.address = address
        self._request_bytes_max = request_bytes_max
        self._setup = setup
        self.pool = ThreadPoolExecutor(max_workers=workers_max, thread_name_prefix="rpc")
        self.loop = asyncio.new_event_loop()
        # awaited on the loop with gRPC's stop, given its grace (a call stream's stop)
        self.stop_hooks: list[Callable[[float], Awaitable[None]]] = []
        self._server: grpc.aio.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        try:
            future.result(timeout=SERVER_START_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self) -> None:
        limit = (
            []
            if self._request_bytes_max is None
            else [("grpc.max_receive_message_length", self._request_bytes_max)]
        )
        server = grpc.aio.server(
            migration_thread_pool=self.pool,
            options=[("grpc.so_reuseport", 0), *PING_TOLERANT_OPTIONS, *limit],
            interceptors=auth.aio_server_interceptors(),
        )
        check_can_listen(self.address)
        if tls.add_port(server, self.address) == 0:
            raise InvalidArgument(
                f"cannot listen on {self.address}: the port is taken or not local"
            ) from None
        await self._setup(server)
        await server.start()
        self._server = server

    def stop(self, grace: float | None = STOP_GRACE_S) -> threading.Event:
        stopped = threading.Event()
        if self._server is not None and self.loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._stop(grace), self.loop)
            future.result(timeout=(grace or 0.0) + SERVER_START_TIMEOUT_S)
        self._stop_loop()
        stopped.set()
        return stopped

    async def _stop(self, grace: float | None) -> None:
        assert self._server is not None
        # All stop accepting at once, and the calls being served get the same grace.
        await asyncio.gather(self._server.stop(grace), *(hook(grace or 0.0) for hook in self.stop_hooks))

    def _stop_loop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=SERVER_START_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


class Stoppable(Protocol):
    def stop(self, graceful: bool = True) -> None: ...


def serve_until_signal(node: Stoppable) -> None:
    """Blocks until SIGTERM or SIGINT, then stops `node`: gracefully on SIGTERM (what
    systemd, Kubernetes and `kill` send to one process: a broker hands off, a controller
    leader hands over), at once on SIGINT (Ctrl-C, which a terminal sends to every process
    of its foreground group, and `mqmeta local up` when it stops a whole cluster: there is
    no one left to hand over to). A second signal changes nothing."""
    received: list[int] = []
    stop = threading.Event()

    def _record(signum: int, frame: object) -> None:
        # No lock in here: a second signal runs this handler again inside the first one
        # (seen inside Event.set, under its lock), and a lock taken twice by one thread
        # never returns: the process then served on until its launcher killed it.
        received.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _record)
    # SIGUSR1 writes every thread's stack to stderr (the process's log under `local up`):
    # what a process that does not stop is doing, even with its main thread stuck in C.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # The freed heap is handed back on a thread of its own: the main thread does nothing but
    # wait for the signal.
    threading.Thread(target=_trim_until, args=(stop,), name="memory-trim", daemon=True).start()
    # A timed wait: the kernel may deliver the signal to any thread, and then an untimed
    # wait of the main thread is never woken to run the handler (the process would go on
    # serving until its launcher kills it).
    while not received:
        time.sleep(SIGNAL_POLL_S)
    stop.set()
    graceful = received[0] == signal.SIGTERM
    log.info("%s: stopping %s", signal.Signals(received[0]).name, "gracefully" if graceful else "at once")
    started = time.monotonic()
    node.stop(graceful=graceful)
    log.info("stopped in %.2f s", time.monotonic() - started)
    exit_at_once()


def _trim_until(stop: threading.Event) -> None:
    """What the start freed (the imports' and the set-up's garbage), then every
    TRIM_INTERVAL_S until `stop`: see mqmeta/memory.py."""
    while True:
        return_freed_memory()
        if stop.wait(TRIM_INTERVAL_S):
            return


def run_stop_steps(steps: list[Callable[[], object]]) -> None:
    """Runs a node's stop, step by step; a step that took over SLOW_STOP_STEP_S is logged by
    name (a launcher that stops a whole cluster waits for the slowest process)."""
    for step in steps:
        started = time.monotonic()
        step()
        took_s = time.monotonic() - started
        if took_s > SLOW_STOP_STEP_S:
            log.info("stop: %s took %.2f s", _step_name(step), took_s)


def _step_name(step: Callable[[], object]) -> str:
    inner = getattr(step, "func", step)
    owner = getattr(inner, "__self__", None)
    name = getattr(inner, "__qualname__", repr(inner))
    return f"{type(owner).__name__}.{inner.__name__}" if owner is not None else name


def exit_at_once(status: int = 0) -> NoReturn:
    """Ends a server process whose node has stopped (its files closed and synced): the
    logs are flushed, the interpreter's finalization is skipped. That finalization (the
    garbage collection of every module, grpc's C core) took 3 to 10 s on a loaded machine,
    long after the node had stopped, and a launcher waiting for the process saw it hang."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)

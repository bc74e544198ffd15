"""The call stream: our own clients' unary calls as frames over plain TCP connections.

The same methods, messages and handlers as the gRPC service (a servicer's methods are
called with a small context of their own, CallContext); only the transport differs
(mqmeta/frames.py). A gRPC unary call costs the server about 0.3 to 0.5 ms of CPU in
Python's gRPC and the client about 0.3 ms; a call on the stream is one socket write and
one read on each side.

A request frame's payload is REQUEST_HEAD (the method path's length, the request id's
length, the call's timeout in ms), the method path ("/mqmeta.v1.ControllerService/
CreateTopic"), the request id (mqmeta.rpc.REQUEST_ID_HEADER's value; empty when none),
then the serialized request. The answer is the serialized reply, or a refusal: the gRPC
status's name, the domain code, the leader (NOT_LEADER / NOT_MASTER) and the message,
a line each, UTF-8: the client rebuilds the error the gRPC call would have raised
(mqmeta.rpc.error_from_status). A bug is INTERNAL with the sentence gRPC gives (its id in
the server's log). A frame that fails its CRC, is too long, names a method the server
does not serve or carries a request that does not decode ends the connection.

Who serves it: a controller on its gRPC event loop (coroutine handlers are awaited there,
plain ones run in the server's thread pool), a broker with a thread per connection (as
its handlers block: a Send waits for the slaves). Each offers it only when frames.offered()
(no TLS, no auth) and not --no-call-stream, on a port the kernel picks on the gRPC host,
bound before gRPC serves. A client learns the port with the CallStream.Offer gRPC call,
once per server; an older server answers UNIMPLEMENTED, and the client stays on gRPC for
RETRY_S before it asks again. A client dials the stream through the dial map as it dials
gRPC (frames.usable: when the map redirects the server's gRPC address but not the
stream's, it stays on gRPC, so a fault proxy is never bypassed).

A client keeps a small pool of connections per server: a call takes an idle one or dials
one, waits for its answer on it (no reader thread) and gives it back. A timeout closes
the connection (a late answer is never read as another call's) and is DeadlineExceeded;
a connection that breaks before its answer sends that call over gRPC (a restarted server
is reconnected to as a gRPC channel would; a dead one then fails as UNAVAILABLE), and the
server is asked for its offer again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from mqmeta import frames
from mqmeta.dialmap import dial
from mqmeta.errors import DeadlineExceeded, MqmetaError, Unavailable
from mqmeta.pb import call_stream_pb2 as cspb
from mqmeta.pb import call_stream_pb2_grpc as cspb_grpc
from mqmeta.rpc import (
    ERROR_CODE_KEY,
    LEADER_KEY,
    REQUEST_ID_HEADER,
    bounded,
    error_from_status,
    internal_error,
    status_of,
)

log = logging.getLogger(__name__)

REQUEST_HEAD = struct.Struct(">HHI")  # method path length, request id length, timeout ms
REQUEST_BYTES_MAX = 5 << 20  # as the gRPC servers' (a 4 MiB body and the rest)
RESPONSE_BYTES_MAX = 256 << 20  # as the controller client's REPLY_BYTES_MAX
CONNECTIONS_MAX = 256  # per server; a thread (broker) or a task (controller) each
IDLE_TIMEOUT_S = 30.0  # a connection silent this long is closed by the server
IDLE_REUSE_S = 20.0  # a client does not reuse a connection idle this long (the server may close it)
IDLE_CONNECTIONS_MAX = 8  # a client keeps this many idle connections per server
CONNECT_TIMEOUT_S = 1.0
OFFER_TIMEOUT_S = 1.0
OFFER_RETRY_S = 1.0  # after the offer could not be asked (the server down or cut off)
RETRY_S = 60.0  # no offer (UNIMPLEMENTED, TLS, off): gRPC only this long, then ask again
STOP_JOIN_S = 2.0  # how long a server's stop waits for the calls being served
SERVICE = cspb.DESCRIPTOR.services_by_name["CallStream"].full_name  # its Offer call


class CallAborted(grpc.RpcError):
    """context.abort on the stream: the rpc decorators' status, message and trailing
    metadata (a grpc.RpcError so that they let it through, as gRPC's own abort)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self.status = code
        self.details = details
        self.trailing = dict(trailing)


class CallContext:
    """What the handlers ask of a grpc.ServicerContext, for a call on the stream."""

    def __init__(self, request_id: str, timeout_s: float, peer: str) -> None:
        self._metadata: tuple[tuple[str, str], ...] = ((REQUEST_ID_HEADER, request_id),) if request_id else ()
        self._deadline = time.monotonic() + timeout_s
        self._peer = peer
        self._trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = None) -> None:
        """Raises at once, so `await context.abort(...)` (grpc.aio's) works too."""
        raise CallAborted(code, details, tuple(trailing_metadata or self._trailing))


@dataclass(frozen=True)
class Handler:
    name: str
    call: Callable[[Any, Any], Any]  # the servicer's bound method (request, context)
    request_type: type[Message]
    is_coroutine: bool


Handlers = dict[str, Handler]


def handlers(servicer: object, service: ServiceDescriptor) -> Handlers:
    """The unary methods of `service` that `servicer` implements, by method path."""
    table: Handlers = {}
    for method in service.methods:
        call = getattr(servicer, method.name, None)
        if method.client_streaming or method.server_streaming or call is None:
            continue
        table[f"/{service.full_name}/{method.name}"] = Handler(
            method.name,
            call,
            message_factory.GetMessageClass(method.input_type),
            inspect.iscoroutinefunction(call),
        )
    return table


def encode_request(path: str, request_id: str, timeout_s: float, body: bytes) -> bytes:
    path_bytes, id_bytes = path.encode(), request_id.encode()
    timeout_ms = max(1, min(int(timeout_s * 1000), 0xFFFFFFFF))
    return REQUEST_HEAD.pack(len(path_bytes), len(id_bytes), timeout_ms) + path_bytes + id_bytes + body


def _prepare(table: Handlers, kind: int, payload: bytes, peer: str) -> tuple[Handler, Message, CallContext]:
    """The handler, request and context of a request frame; ValueError or DecodeError
    for a bad one (which ends the connection)."""
    if kind != frames.KIND_REQUEST:
        raise ValueError(f"a call stream frame of kind {kind} from a client")
    if len(payload) < REQUEST_HEAD.size:
        raise ValueError("a call stream request shorter than its head")
    path_size, id_size, timeout_ms = REQUEST_HEAD.unpack_from(payload)
    start = REQUEST_HEAD.size
    path = payload[start : start + path_size].decode("utf-8", "replace")
    request_id = payload[start + path_size : start + path_size + id_size].decode("utf-8", "replace")
    handler = table.get(path)
    if handler is None:
        raise ValueError(f"a call of {path!r}, which this server does not serve on the call stream")
    request = handler.request_type.FromString(payload[start + path_size + id_size :])
    return handler, request, CallContext(request_id, timeout_ms / 1000, peer)


def _answer(reply: Message) -> bytes:
    return frames.frame(frames.KIND_RESPONSE, reply.SerializeToString())


def _refusal(code: grpc.StatusCode, domain: str, leader: str, details: str) -> bytes:
    text = f"{code.name}\n{domain}\n{leader}\n{bounded(details)}"
    return frames.frame(frames.KIND_REFUSAL, text.encode())


def _refusal_of(handler: Handler, error: Exception) -> bytes:
    """The refusal for what a handler raised (called from its `except` clause)."""
    if isinstance(error, CallAborted):
        trailing = error.trailing
        return _refusal(
            error.status,
            str(trailing.get(ERROR_CODE_KEY, "")),
            str(trailing.get(LEADER_KEY, "")),
            error.details,
        )
    if isinstance(error, MqmetaError):  # a handler without an rpc decorator
        return _refusal(status_of(error), error.code, error.leader, error.message)
    return _refusal(grpc.StatusCode.INTERNAL, "", "", internal_error(handler.name))


def _peer_of(connection: socket.socket) -> str:
    host, port = connection.getpeername()[:2]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class ThreadedCallServer(frames.FrameServer):
    """A broker's side: a thread per connection, calling the servicer's (blocking) methods."""

    def __init__(self, host: str, table: Handlers, on_call: Callable[[], object] = lambda: None) -> None:
        self._table = table
        self._on_call = on_call
        super().__init__(
            "call-stream",
            host,
            self._serve_call,
            0,
            REQUEST_BYTES_MAX,
            CONNECTIONS_MAX,
            IDLE_TIMEOUT_S,
            STOP_JOIN_S,
        )

    def _serve_call(self, kind: int, payload: bytes, connection: socket.socket) -> bytes:
        handler, request, context = _prepare(self._table, kind, payload, _peer_of(connection))
        assert not handler.is_coroutine, f"{handler.name} is a coroutine: serve it with AsyncCallServer"
        self._on_call()
        try:
            return _answer(handler.call(request, context))
        except Exception as error:
            return _refusal_of(handler, error)


class AsyncCallServer:
    """A controller's side: a task per connection on the gRPC server's event loop; a
    coroutine handler is awaited there, a plain one runs in `pool`."""

    def __init__(self, table: Handlers, pool: Executor, on_call: Callable[[], object] = lambda: None) -> None:
        self._table = table
        self._pool = pool
        self._on_call = on_call
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.port = 0

    async def start(self, host: str) -> None:
        """Binds a port the kernel picks on `host` and serves it (call it on the loop)."""
        listener = frames.listen(host, 0)
        self._server = await asyncio.start_server(self._serve_connection, sock=listener)
        self.port = listener.getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task, writer in list(self._connections.items()):
            writer.close()
            task.cancel()
        if self._connections:
            _, pending = await asyncio.wait(list(self._connections), timeout=STOP_JOIN_S)
            if pending:
                log.warning(
                    "%d call stream connections still served %.1f s after stop", len(pending), STOP_JOIN_S
                )

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= CONNECTIONS_MAX:
            writer.close()
            return
        self._connections[task] = writer
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = _peer_of(sock)
        try:
            while True:
                async with asyncio.timeout(IDLE_TIMEOUT_S):  # no task per read, as wait_for's
                    header = await reader.readexactly(frames.HEADER.size)
                size, kind, crc = frames.header_of(header, REQUEST_BYTES_MAX)
                payload = frames.checked(await reader.readexactly(size) if size else b"", crc)
                writer.write(await self._serve_call(kind, payload, peer))
                await writer.drain()
        except (OSError, EOFError, TimeoutError) as error:  # gone or silent: it connects again
            log.debug("a call stream connection ended: %s", error)
        except (ValueError, DecodeError) as error:
            log.warning("a call stream connection ended on a bad frame: %s", error)
        except asyncio.CancelledError:
            pass  # stop()
        except Exception:
            log.exception("serving a call stream connection failed")
        finally:
            self._connections.pop(task, None)
            writer.close()

    async def _serve_call(self, kind: int, payload: bytes, peer: str) -> bytes:
        handler, request, context = _prepare(self._table, kind, payload, peer)
        self._on_call()
        try:
            if handler.is_coroutine:
                reply = await handler.call(request, context)
            else:
                reply = await asyncio.get_running_loop().run_in_executor(
                    self._pool, handler.call, request, context
                )
            return _answer(reply)
        except Exception as error:
            return _refusal_of(handler, error)


class OfferServicer(cspb_grpc.CallStreamServicer):
    """CallStream.Offer: this process's call stream port (0: none), what it serves, and
    the gRPC address it listens on."""

    def __init__(self, port: Callable[[], int], services: list[str], address: str) -> None:
        self._port = port
        self._services = services
        self._address = address

    def Offer(self, request: cspb.CallStreamOfferRequest, context: Any) -> cspb.CallStreamOffer:
        port = self._port()
        return cspb.CallStreamOffer(port=port, services=self._services if port else [], address=self._address)


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def dialled_directly(address: str, served: str) -> bool:
    """Whether a client that dialled `address` reached the process serving gRPC on `served`
    itself, not a proxy or a NAT address in front of it (whose stream port it cannot reach,
    or would reach around the proxy)."""
    if address == served:
        return True
    return (
        frames.host_of(served) in WILDCARD_HOSTS and address.rpartition(":")[2] == served.rpartition(":")[2]
    )


# The client's side ---------------------------------------------------------------------------


class _Broken(Exception):
    """A connection that broke before its answer: the call goes over gRPC. `fresh`: it
    could not even be opened (the offered port is not reachable from here)."""

    def __init__(self, message: str, fresh: bool = False) -> None:
        super().__init__(message)
        self.fresh = fresh


@dataclass
class _Offer:
    port: int  # 0: none (ask again at retry_at)
    services: frozenset[str]
    retry_at: float


@dataclass
class _Connection:
    sock: socket.socket
    address: str  # the server's gRPC address
    idle_since: float


class CallStreamClient:
    """A client's pool of call stream connections, per server (gRPC address). `call`
    answers a unary call over the stream, or None when the server offers none (the caller
    then makes the gRPC call); `channel_of` gives the gRPC channel to ask the offer on.
    Counts the calls each way in `calls` ({"stream": n, "grpc": n})."""

    def __init__(
        self,
        channel_of: Callable[[str], grpc.Channel],
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self._channel_of = channel_of
        self._clock = clock
        self._lock = threading.Lock()
        self._offers: dict[str, _Offer] = {}
        self._idle: dict[str, list[_Connection]] = {}
        self._reply_types: dict[str, type[Message]] = {}
        self.calls = {"stream": 0, "grpc": 0}

    def call(
        self,
        address: str,
        service: ServiceDescriptor,
        method: str,
        request: Message,
        timeout_s: float,
        request_id: str = "",
    ) -> Any | None:
        """The reply; the typed error the server refused with; DeadlineExceeded when no
        answer came in `timeout_s`; None: make this call over gRPC."""
        if not self.enabled or not frames.offered():
            return self._over_grpc()
        offer = self._offer(address, min(timeout_s, OFFER_TIMEOUT_S))
        if offer is None or not offer.port or service.full_name not in offer.services:
            return self._over_grpc()
        path = f"/{service.full_name}/{method}"
        payload = frames.frame(
            frames.KIND_REQUEST, encode_request(path, request_id, timeout_s, request.SerializeToString())
        )
        try:
            connection = self._take(address, offer.port)
            kind, answer = self._round_trip(connection, payload, timeout_s)
        except _Broken as broken:
            log.debug("the call stream of %s broke (%s): %s goes over gRPC", address, broken, method)
            self._forget(address, broken.fresh)
            return self._over_grpc()
        self._give_back(connection)
        with self._lock:
            self.calls["stream"] += 1
        if kind == frames.KIND_REFUSAL:
            status, domain, leader, details = (
                answer.decode("utf-8", "replace").split("\n", 3) + ["", "", ""]
            )[:4]
            code = (
                grpc.StatusCode[status] if status in grpc.StatusCode.__members__ else grpc.StatusCode.UNKNOWN
            )
            raise error_from_status(code, details, domain, leader)
        try:
            return self._reply_type(service, method).FromString(answer)
        except DecodeError as error:
            raise Unavailable(
                f"an answer of {address}'s call stream that is no {method} reply: {error}"
            ) from None

    def _over_grpc(self) -> Any:
        """None (the caller makes a gRPC call), counted."""
        with self._lock:
            self.calls["grpc"] += 1
        return None

    def _reply_type(self, service: ServiceDescriptor, method: str) -> type[Message]:
        reply_type = self._reply_types.get(f"{service.full_name}/{method}")
        if reply_type is None:
            reply_type = message_factory.GetMessageClass(service.methods_by_name[method].output_type)
            self._reply_types[f"{service.full_name}/{method}"] = reply_type
        return reply_type

    def _offer(self, address: str, timeout_s: float) -> _Offer | None:
        """The server's offer, asked once (again RETRY_S after it offered none, and
        OFFER_RETRY_S after the question failed: a server down or cut off is not asked
        before every call); None when it could not be asked now (the gRPC call will tell why)."""
        now = self._clock()
        offer = self._offers.get(address)
        if offer is not None and (offer.port or now < offer.retry_at):
            return offer
        try:
            answer = cspb_grpc.CallStreamStub(self._channel_of(address)).Offer(
                cspb.CallStreamOfferRequest(), timeout=timeout_s
            )
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
                with self._lock:
                    self._offers[address] = _Offer(0, frozenset(), now + OFFER_RETRY_S)
                return None
            log.info(
                "%s has no call stream (an older version): calls go over gRPC for %.0f s", address, RETRY_S
            )
            answer = cspb.CallStreamOffer()
        usable = (
            answer.port > 0
            and dialled_directly(address, answer.address)
            and frames.usable(address, answer.port)
        )
        offer = _Offer(answer.port if usable else 0, frozenset(answer.services), now + RETRY_S)
        with self._lock:
            self._offers[address] = offer
        return offer

    def _take(self, address: str, port: int) -> _Connection:
        now = self._clock()
        stale = []
        with self._lock:
            idle = self._idle.get(address, [])
            while idle:
                connection = idle.pop()
                if now - connection.idle_since < IDLE_REUSE_S:
                    break
                stale.append(connection)
            else:
                connection = None
        for old in stale:
            frames.close(old.sock)
        if connection is not None:
            return connection
        host, _, dial_port = dial(frames.stream_address(address, port)).rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(dial_port)), timeout=CONNECT_TIMEOUT_S)
        except (OSError, ValueError) as error:  # ValueError: a dial map's port that is no number
            raise _Broken(f"cannot connect: {error}", fresh=True) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(sock, address, now)

    def _round_trip(self, connection: _Connection, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
        sock = connection.sock
        try:
            sock.settimeout(timeout_s)
            sock.sendall(payload)
            return frames.read_frame(sock, RESPONSE_BYTES_MAX)
        except TimeoutError:
            frames.close(sock)
            raise DeadlineExceeded(
                f"no answer on the call stream of {connection.address} in {timeout_s:.1f} s"
            ) from None
        except OSError as error:
            frames.close(sock)
            raise _Broken(str(error)) from None
        except ValueError as error:
            frames.close(sock)
            raise Unavailable(f"the call stream of {connection.address}: {error}") from None

    def _give_back(self, connection: _Connection) -> None:
        connection.idle_since = self._clock()
        with self._lock:
            idle = self._idle.setdefault(connection.address, [])
            if len(idle) < IDLE_CONNECTIONS_MAX:
                idle.append(connection)
                return
        frames.close(connection.sock)

    def _forget(self, address: str, unreachable: bool) -> None:
        """After a broken connection: the server's other idle connections are closed and
        its offer asked again on the next call (a restarted server has another port), or
        after RETRY_S when the offered port could not be connected to."""
        with self._lock:
            if unreachable:
                self._offers[address] = _Offer(0, frozenset(), self._clock() + RETRY_S)
            else:
                self._offers.pop(address, None)
            idle = self._idle.pop(address, [])
        for connection in idle:
            frames.close(connection.sock)

    def close(self) -> None:
        with self._lock:
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
            self._offers.clear()
        for connection in idle:
            frames.close(connection.sock)

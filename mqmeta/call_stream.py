"""The call stream: our own clients' unary calls as frames over plain TCP connections.

The same methods, messages and handlers as the gRPC service (a servicer's methods are
called with a small context of their own, CallContext); only the transport differs
(mqmeta/frames.py). A gRPC unary call costs the server about 0.3 to 0.5 ms of CPU in
Python's gRPC and the client about 0.3 ms; a call on the stream is one socket write and
one read on each side.

A request frame's payload is REQUEST_HEAD (the method path's length, the request id's
length, the server address's length, the call's timeout in ms), the method path
("/mqmeta.v1.ControllerService/CreateTopic"), the request id (mqmeta.rpc.REQUEST_ID_HEADER's
value; empty when none), the gRPC address of the server the call is meant for (as its
offer named it), then the serialized request. A server answers a request naming another
address with a frame of kind frames.KIND_WRONG_SERVER (its own address): the port the
client dialled is no longer that server's (it restarted, and another server on the host
took the port), and the client sends that call over gRPC and asks for the offer again
after OFFER_RETRY_S. The answer is the serialized reply, or a refusal: the gRPC
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
a connection that breaks before its answer sends that call over gRPC, with what is left
of its timeout (a restarted server is reconnected to as a gRPC channel would; a dead one
then fails as UNAVAILABLE). The server is then asked for its offer again: on the next
call when a pooled connection broke (the server restarted, on another port); after
OFFER_RETRY_S when a new connection was refused or closed before its first answer (the
port is gone, or the server is at CONNECTIONS_MAX: not an Offer call before every call)
or the server refused the request as meant for another server; after RETRY_S when a
connect timed out (the port cannot be reached from here).

A broker's handler may have its answer sent by another thread (EarlyAnswer): a Send's
answer leaves from the HA stream's thread that receives the slaves' last acknowledgement,
without a hand-off to the handler's thread first; what the handler then returns is dropped.

A server stops accepting when its gRPC server stops; a call being served gets gRPC's
grace to write its answer (its client would send it again over gRPC: a write without a
request id applied twice), the connections waiting for a request are closed at once.
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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from mqmeta import frames
from mqmeta.dialmap import dial
from mqmeta.errors import DeadlineExceeded, FailedPrecondition, MqmetaError, Unavailable
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

REQUEST_HEAD = struct.Struct(">HHHI")  # method path, request id and server address lengths, timeout ms
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
ACCEPT_RETRY_S = 0.1  # after an accept failed (out of descriptors): the next try
STOP_JOIN_S = 2.0  # how long a server's stop waits, past its grace, for the calls being served
TIMEOUT_SLACK_S = 0.05  # a connection's send timeout is set again when a call's timeout differs by more
FRAME_TIMEOUT_S = frames.FRAME_TIMEOUT_S  # a server's wait from a request's first byte to its last
SERVICE = cspb.DESCRIPTOR.services_by_name["CallStream"].full_name  # its Offer call


class CallAborted(grpc.RpcError):
    """context.abort on the stream: the rpc decorators' status, message and trailing
    metadata (a grpc.RpcError so that they let it through, as gRPC's own abort)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self.status = code
        self.details = details
        self.trailing = dict(trailing)


class EarlyAnswer:
    """A broker's call whose answer another thread may send before the handler returns:
    a Send's, by the thread that receives the acknowledgement it waits for (the HA
    stream's), so the producer hears of it without that thread waking the handler's first.
    `send` writes the answer's frame without blocking (the client waits for this answer:
    the socket's buffer is empty); what the socket does not take at once, the connection's
    thread sends once the handler returns, and whatever the handler then answers is dropped.
    An answer not sent early (nothing taken, or the handler returned first) is the
    handler's, as for any call."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._closed = False  # answered early, or the handler returned
        self._rest: bytes | None = None  # of an answer sent early (b"": all of it)

    def send(self, reply: Message) -> None:
        frame = _answer(reply)
        with self._lock:
            if self._closed:
                return
            try:
                sent = self._connection.send(frame, socket.MSG_DONTWAIT)
            except OSError as error:  # nothing taken (BlockingIOError), or gone: the handler's fails too
                log.debug("an early call stream answer was not sent: %s", error)
                return
            self._closed = True
            self._rest = frame[sent:]

    @property
    def sent(self) -> bool:
        """Answered early: what the handler returns is dropped (it need not build it)."""
        return self._rest is not None

    def close(self) -> bytes | None:
        """The handler returned: the rest of the answer sent early, or None (none was:
        the handler's answer is to be sent)."""
        with self._lock:
            self._closed = True
            return self._rest


class CallContext:
    """What the handlers ask of a grpc.ServicerContext, for a call on the stream. `early`:
    a broker's call (ThreadedCallServer), whose answer another thread may send (see
    answer_early)."""

    def __init__(
        self,
        request_id: str,
        timeout_s: float,
        peer: str | Callable[[], str],
        early: EarlyAnswer | None = None,
    ) -> None:
        self._metadata: tuple[tuple[str, str], ...] = ((REQUEST_ID_HEADER, request_id),) if request_id else ()
        self._deadline = time.monotonic() + timeout_s
        self._peer = peer
        self._trailing: tuple[tuple[str, str], ...] = ()
        self.early = early

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        """gRPC's form of the client's address ("ipv4:127.0.0.1:5000"); a broker's
        connection thread gives a function, asked only by a handler that needs it (the
        system call it makes is a GIL hand-off that most calls need not pay)."""
        if not isinstance(self._peer, str):
            self._peer = self._peer()
        return self._peer

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = None) -> None:
        """Raises at once, so `await context.abort(...)` (grpc.aio's) works too."""
        raise CallAborted(code, details, tuple(trailing_metadata or self._trailing))


def answer_early(context: Any) -> EarlyAnswer | None:
    """How a handler has its answer sent by another thread, or None: a gRPC call, or a
    call on a controller's stream, is answered by its handler only."""
    return context.early if isinstance(context, CallContext) else None


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


def encode_request(path: str, address: str, request_id: str, timeout_s: float, body: bytes) -> bytes:
    """A request's payload, for the server whose gRPC address (as its offer named it) is `address`."""
    path_bytes, id_bytes, address_bytes = path.encode(), request_id.encode(), address.encode()
    timeout_ms = max(1, min(int(timeout_s * 1000), 0xFFFFFFFF))
    head = REQUEST_HEAD.pack(len(path_bytes), len(id_bytes), len(address_bytes), timeout_ms)
    return head + path_bytes + id_bytes + address_bytes + body


# A request frame's handler, request and context (a tuple: a frozen dataclass costs a
# microsecond a call to build)
_Request = tuple[Handler, Message, CallContext]


def _prepare(
    table: Handlers,
    address: str,
    kind: int,
    payload: bytes,
    peer: str | Callable[[], str],
    early: EarlyAnswer | None = None,
) -> _Request | bytes:
    """The handler, request and context of a request frame, or the KIND_WRONG_SERVER frame
    to answer when it names another server than `address`; ValueError or DecodeError for a
    bad one (which ends the connection)."""
    if kind != frames.KIND_REQUEST:
        raise ValueError(f"a call stream frame of kind {kind} from a client")
    if len(payload) < REQUEST_HEAD.size:
        raise ValueError("a call stream request shorter than its head")
    path_size, id_size, address_size, timeout_ms = REQUEST_HEAD.unpack_from(payload)
    start = REQUEST_HEAD.size
    path = payload[start : start + path_size].decode("utf-8", "replace")
    start += path_size
    request_id = payload[start : start + id_size].decode("utf-8", "replace")
    start += id_size
    if payload[start : start + address_size] != address.encode():
        return frames.frame(frames.KIND_WRONG_SERVER, address.encode())
    handler = table.get(path)
    if handler is None:
        raise ValueError(f"a call of {path!r}, which this server does not serve on the call stream")
    request = handler.request_type.FromString(payload[start + address_size :])
    return handler, request, CallContext(request_id, timeout_ms / 1000, peer, early)


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
    try:
        host, port = connection.getpeername()[:2]
    except OSError:  # the client went away while its call was served (gRPC's peer() never raises)
        return "unknown"
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class ThreadedCallServer(frames.FrameServer):
    """A broker's side: a thread per connection, calling the servicer's (blocking) methods.
    `address`: the gRPC address its offer names (a request naming another is refused).
    stop(grace_s): see frames.FrameServer."""

    def __init__(
        self, host: str, address: str, table: Handlers, on_call: Callable[[], object] = lambda: None
    ) -> None:
        self._table = table
        self._address = address
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
            FRAME_TIMEOUT_S,
        )

    def _serve_call(self, kind: int, payload: bytes, connection: socket.socket) -> bytes:
        early = EarlyAnswer(connection)
        prepared = _prepare(self._table, self._address, kind, payload, partial(_peer_of, connection), early)
        if isinstance(prepared, bytes):
            return prepared
        handler, request, context = prepared
        assert not handler.is_coroutine, f"{handler.name} is a coroutine: serve it with AsyncCallServer"
        self._on_call()
        reply: Message | None = None
        refusal = b""
        try:
            reply = handler.call(request, context)
        except Exception as error:
            refusal = _refusal_of(handler, error)
        finally:
            rest = early.close()  # no early answer after this, whatever the handler did
        if rest is not None:
            return rest
        return refusal or _answer(reply)


class AsyncCallServer:
    """A controller's side: a task per connection on the gRPC server's event loop; a
    coroutine handler is awaited there, a plain one runs in `pool`. `address`: the gRPC
    address its offer names (a request naming another is refused)."""

    def __init__(
        self, address: str, table: Handlers, pool: Executor, on_call: Callable[[], object] = lambda: None
    ) -> None:
        self._address = address
        self._table = table
        self._pool = pool
        self._on_call = on_call
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # one per accepted connection, until it ends
        self._unopened: dict[asyncio.Task[None], socket.socket] = {}  # sockets no transport owns yet
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._serving: set[asyncio.Task[None]] = set()  # between a request read and its answer written
        self._stopping = False
        self.port = 0

    async def start(self, host: str) -> None:
        """Binds a port the kernel picks on `host` and serves it (call it on the loop).

        The server accepts by itself, in a reader callback that hands each socket to its
        task in the same turn (`_acceptable`), not through asyncio.start_server: on Python
        3.11 a connection accepted in the loop turn that closed such a server gets a
        transport that is never closed (its server refuses to count it), a socket left to
        the garbage collector; nor with a task awaiting `sock_accept`, whose cancellation
        at stop drops a socket it had just accepted."""
        self._loop = asyncio.get_running_loop()
        self._listener = frames.listen(host, 0)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._loop.add_reader(self._listener.fileno(), self._acceptable)

    def _acceptable(self) -> None:
        assert self._listener is not None and self._loop is not None
        for _ in range(frames.LISTEN_BACKLOG):
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of descriptors, say: accepting resumes shortly
                log.warning("the call stream could not accept a connection: %s", error)
                self._loop.remove_reader(self._listener.fileno())
                self._loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)
                return
            if self._stopping or len(self._tasks) >= CONNECTIONS_MAX:
                connection.close()
                continue
            connection.setblocking(False)
            task = self._loop.create_task(self._open(connection))
            self._tasks.add(task)
            self._unopened[task] = connection
            task.add_done_callback(self._ended)

    def _resume_accepting(self) -> None:
        if not self._stopping and self._listener is not None and self._loop is not None:
            self._loop.add_reader(self._listener.fileno(), self._acceptable)

    async def _open(self, connection: socket.socket) -> None:
        """The connection's streams (their transport owns the socket from then on), then
        its calls."""
        reader, writer = await asyncio.open_connection(sock=connection)
        task = asyncio.current_task()
        self._unopened.pop(task, None)  # type: ignore[arg-type]
        await self._serve_connection(reader, writer)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A connection's task ended: a socket no transport took (the task was cancelled,
        even before it began, or its streams failed) is closed here."""
        self._tasks.discard(task)
        connection = self._unopened.pop(task, None)
        if connection is not None:
            connection.close()

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stops accepting and ends the connections waiting for a request at once; a call
        being served gets `grace_s` to write its answer (its client would otherwise send it
        again: a write applied twice), then is cancelled."""
        if self._listener is None or self._loop is None:
            return
        if not self._stopping:
            self._stopping = True
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()  # refused from now on
        for task in list(self._unopened):  # streams not made yet
            task.cancel()
        for task, writer in list(self._connections.items()):
            if task not in self._serving:
                writer.close()
                task.cancel()
        serving = list(self._serving)
        if serving:
            await asyncio.wait(serving, timeout=grace_s)
        for task, writer in list(self._connections.items()):
            writer.close()
            task.cancel()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=STOP_JOIN_S)
            if pending:
                log.warning(
                    "%d call stream connections still served %.1f s after stop", len(pending), STOP_JOIN_S
                )
        # A closed transport lets its socket go on the loop's next turns: the loop may stop
        # right after this (the server's), which left them open (ResourceWarning at GC).
        for _ in range(2):
            await asyncio.sleep(0)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._stopping:
            writer.close()
            return
        self._connections[task] = writer
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = _peer_of(sock)
        try:
            while not self._stopping:
                kind, payload = await self._read_request(reader)
                self._serving.add(task)
                writer.write(await self._serve_call(kind, payload, peer))
                await writer.drain()
                self._serving.discard(task)
        except (OSError, EOFError, TimeoutError) as error:  # gone, silent or too slow: it connects again
            log.debug("a call stream connection ended: %s", error)
        except (ValueError, DecodeError) as error:
            log.warning("a call stream connection ended on a bad frame: %s", error)
        except asyncio.CancelledError:
            pass  # stop()
        except Exception:
            log.exception("serving a call stream connection failed")
        finally:
            self._connections.pop(task, None)
            self._serving.discard(task)
            writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> tuple[int, bytes]:
        """A request frame: its first byte within IDLE_TIMEOUT_S, its last FRAME_TIMEOUT_S
        after its first (the reader stores what arrived, not what the header claims)."""
        async with asyncio.timeout(IDLE_TIMEOUT_S) as scope:  # no task per read, as wait_for's
            header = await reader.read(frames.HEADER.size)
            if not header:
                raise EOFError("the client closed the connection")
            scope.reschedule(asyncio.get_running_loop().time() + FRAME_TIMEOUT_S)
            if len(header) < frames.HEADER.size:
                header += await reader.readexactly(frames.HEADER.size - len(header))
            size, kind, crc = frames.header_of(header, REQUEST_BYTES_MAX)
            return kind, frames.checked(await reader.readexactly(size) if size else b"", crc)

    async def _serve_call(self, kind: int, payload: bytes, peer: str) -> bytes:
        prepared = _prepare(self._table, self._address, kind, payload, peer)
        if isinstance(prepared, bytes):
            return prepared
        handler, request, context = prepared
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
    """A connection that broke before its answer: the call goes over gRPC. `back_off`: the
    server is not asked for its offer again before OFFER_RETRY_S (a fresh connection refused
    or closed unanswered: the port is gone or the server is at CONNECTIONS_MAX; a request
    refused as meant for another server); else on the next call (a pooled connection that
    broke: the server restarted); `unreachable`: not before RETRY_S (the offered port cannot
    be reached from here: a connect timed out)."""

    def __init__(self, message: str, back_off: bool = False, unreachable: bool = False) -> None:
        super().__init__(message)
        self.back_off = back_off
        self.unreachable = unreachable


@dataclass
class _Offer:
    port: int  # 0: none (ask again at retry_at)
    services: frozenset[str]
    retry_at: float
    address: str = ""  # the server's gRPC address as it names it (sent with each request)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket  # blocking, with kernel timeouts (frames.blocking_with_timeouts)
    address: str  # the server's gRPC address (as dialled)
    idle_since: float
    answered: bool = False  # a fresh connection closed before its first answer is a refusal
    reader: frames.FrameReader = field(init=False)
    timeout_s: float = -1.0  # the kernel send timeout set last (set again when it changes; -1: none yet)

    def __post_init__(self) -> None:
        self.reader = frames.FrameReader(self.sock, None, "the server closed the call stream")


class CallStreamClient:
    """A client's pool of call stream connections, per server (gRPC address). `call`
    answers a unary call over the stream, or None when the server offers none (the caller
    then makes the gRPC call, with what is left of the call's timeout: grpc_timeout_s);
    `channel_of` gives the gRPC channel to ask the offer on. Counts the calls each way in
    `calls` ({"stream": n, "grpc": n}). close() ends the calls in flight on the stream."""

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
        self._busy: set[_Connection] = set()
        self._closed = False
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
        deadline: float | None = None,
    ) -> Any | None:
        """The reply; the typed error the server refused with; DeadlineExceeded when no
        answer came in `timeout_s` (or by `deadline`, time.monotonic()); None: make this
        call over gRPC, with grpc_timeout_s(deadline) (the stream's attempt took its part)."""
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        if not self.enabled or not frames.offered() or self._closed:
            return self._over_grpc()
        offer = self._offer(address, min(timeout_s, OFFER_TIMEOUT_S, _left_s(deadline)))
        if offer is None or not offer.port or service.full_name not in offer.services:
            return self._over_grpc()
        path = f"/{service.full_name}/{method}"
        body = request.SerializeToString()
        connection: _Connection | None = None
        try:
            connection = self._take(address, offer.port, deadline)
            head = encode_request(path, offer.address, request_id, _left_s(deadline), body)
            kind, answer = self._round_trip(connection, frames.frame(frames.KIND_REQUEST, head), deadline)
        except _Broken as broken:
            log.debug("the call stream of %s broke (%s): %s goes over gRPC", address, broken, method)
            self._forget(address, broken)
            return self._over_grpc()
        finally:
            if connection is not None:
                with self._lock:
                    self._busy.discard(connection)
        assert connection is not None
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
        if timeout_s <= 0:
            return None
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
        offer = _Offer(
            answer.port if usable else 0, frozenset(answer.services), now + RETRY_S, answer.address
        )
        with self._lock:
            self._offers[address] = offer
        return offer

    def _take(self, address: str, port: int, deadline: float) -> _Connection:
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
            if connection is not None:
                self._busy.add(connection)
        for old in stale:
            frames.close(old.sock)
        if connection is not None:
            return connection
        host, _, dial_port = dial(frames.stream_address(address, port)).rpartition(":")
        timeout_s = min(CONNECT_TIMEOUT_S, _left_s(deadline))
        try:
            if timeout_s <= 0:
                raise TimeoutError("no time left to connect")
            sock = socket.create_connection((host.strip("[]"), int(dial_port)), timeout=timeout_s)
        except TimeoutError as error:  # a port that drops what is sent to it (a firewall)
            full = timeout_s >= CONNECT_TIMEOUT_S
            raise _Broken(f"cannot connect: {error}", back_off=True, unreachable=full) from None
        except (OSError, ValueError) as error:  # ValueError: a dial map's port that is no number
            raise _Broken(f"cannot connect: {error}", back_off=True) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # kernel timeouts from now on, set per call (_round_trip)
        connection = _Connection(sock, address, now)
        with self._lock:
            if self._closed:
                frames.close(sock)
                raise _Broken("the client is closed")
            self._busy.add(connection)
        return connection

    def _round_trip(self, connection: _Connection, payload: bytes, deadline: float) -> tuple[int, bytes]:
        sock = connection.sock
        timeout_s = _left_s(deadline)
        try:
            if timeout_s <= 0:
                raise TimeoutError
            if abs(timeout_s - connection.timeout_s) > TIMEOUT_SLACK_S:  # the read waits by `deadline`
                frames.send_timeout(sock, timeout_s)
                connection.timeout_s = timeout_s
            sock.sendall(payload)
            kind, answer = connection.reader.read(RESPONSE_BYTES_MAX, deadline=deadline)
        except (TimeoutError, BlockingIOError):  # BlockingIOError: SO_SNDTIMEO, a server that reads nothing
            frames.close(sock)
            raise DeadlineExceeded(f"no answer on the call stream of {connection.address} in time") from None
        except OSError as error:
            frames.close(sock)
            if self._closed:
                raise FailedPrecondition("this call stream client is closed") from None
            raise _Broken(str(error), back_off=not connection.answered) from None
        except ValueError as error:
            frames.close(sock)
            raise Unavailable(f"the call stream of {connection.address}: {error}") from None
        if kind == frames.KIND_WRONG_SERVER:
            frames.close(sock)
            served = answer.decode("utf-8", "replace")
            raise _Broken(f"its port now serves {served} (restarted elsewhere)", back_off=True)
        connection.answered = True
        return kind, answer

    def _give_back(self, connection: _Connection) -> None:
        connection.idle_since = self._clock()
        with self._lock:
            idle = self._idle.setdefault(connection.address, []) if not self._closed else None
            if idle is not None and len(idle) < IDLE_CONNECTIONS_MAX:  # none after close()
                idle.append(connection)
                return
        frames.close(connection.sock)

    def _forget(self, address: str, broken: _Broken) -> None:
        """After a broken connection: the server's other idle connections are closed and
        its offer asked again on the next call (a restarted server has another port), after
        OFFER_RETRY_S (back_off) or after RETRY_S (unreachable)."""
        with self._lock:
            if broken.unreachable:
                self._offers[address] = _Offer(0, frozenset(), self._clock() + RETRY_S)
            elif broken.back_off:
                self._offers[address] = _Offer(0, frozenset(), self._clock() + OFFER_RETRY_S)
            else:
                self._offers.pop(address, None)
            idle = self._idle.pop(address, [])
        for connection in idle:
            frames.close(connection.sock)

    def close(self) -> None:
        """Closes every connection; a call in flight on one ends with FailedPrecondition, and
        later calls go over gRPC (whose closed client refuses them)."""
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            idle += list(self._busy)
            self._idle.clear()
            self._offers.clear()
        for connection in idle:
            frames.close(connection.sock)


def _left_s(deadline: float) -> float:
    return deadline - time.monotonic()


def grpc_timeout_s(deadline: float) -> float:
    """The timeout of the gRPC call made when the stream's `call` gave None: what is left
    until `deadline` (at least 1 ms: gRPC then answers DEADLINE_EXCEEDED itself)."""
    return max(0.001, deadline - time.monotonic())

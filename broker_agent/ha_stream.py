"""The HA stream: a slave's fetches and its master's answers over one TCP connection.

The same messages as the HaFetch call (HaFetchRequest, HaFetchResponse) and the same rules
(ha_fetch.serve_fetch answers each request; the slave's core applies each answer): only
the transport differs (mqmeta/frames.py: the frame, and who may open a stream). Each
round trip is on a send's path: the slave's next fetch acknowledges the bytes of the
last one. RocketMQ's HAService works the same way (a connection per slave, the master
pushing bytes, the slave answering with its offset).

One thread per connection reads the slave's requests and serves them; a fetch with
nothing to send yet is parked on the master rather than waited for in that thread: the
thread that appends sends the answer itself (Link.push), so a send's path wakes no
connection thread on the way out, only on the slave's acknowledgement coming back. The
slave sends that acknowledgement (its next fetch, StreamClient.send) as soon as the bytes
are durable, before it finishes with the answer; the connection thread that receives the
last one a send waits for sends the producer its answer itself (agent._answering_acknowledged,
call_stream.EarlyAnswer), then wakes the writer.

A request frame carries a serialized HaFetchRequest (slave to master), an answer a
HaFetchResponse (master to slave), or a refusal (the error's code, a newline, its
message, UTF-8).

Who uses it: a master offers its stream's port in every handshake answer over gRPC
(HaFetchResponse.stream_port); it opens the stream only when frames.offered(). The port
is the broker's --ha-stream-port, or one the kernel picks (0, the default). A slave that
is offered a port dials HOST:PORT (its master's host) through the dial map as it dials
gRPC (frames.usable): the chaos suite puts a fault proxy on the stream's link too. Any
failure of the stream sends the slave back to a gRPC handshake, which offers the stream
again.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from google.protobuf.message import DecodeError

from mqmeta import frames
from mqmeta.errors import MqmetaError, Unavailable, error_from_code
from mqmeta.pb import broker_pb2 as bpb

log = logging.getLogger(__name__)

REQUEST_BYTES_MAX = 1 << 20
RESPONSE_BYTES_MAX = 17 << 20  # ha_fetch.FETCH_MAX_BYTES_LIMIT of records and the rest
CONNECTIONS_MAX = 16  # slaves connected at once; one thread each
IDLE_TIMEOUT_S = 30.0  # a slave fetches at least every wait_ms; silence this long ends it
CONNECT_TIMEOUT_S = 1.0
# How long stop() waits for the connections' threads: one may be in a fetch's wait (at
# most ha_fetch.FETCH_WAIT_MS_MAX, 1 s), then answer; after stop() none touches the store.
STOP_JOIN_S = 2.0
CLOSED = "the peer closed the HA stream"  # a frame cut short, or no frame where one was due

AWAIT_ROUNDS_MAX = 10_000  # wake-ups of one parked fetch's connection (each a wake or a timeout)


class Waiting(Protocol):
    """A fetch the master parked (nothing to send yet). Another thread may answer it through
    the connection's Link (the master's appending thread); the connection's own thread
    settles it when its wait ends or it is woken."""

    deadline: float  # time.monotonic() by which it is answered, with data or without

    def settle(self) -> bpb.HaFetchResponse | None:
        """The answer for the connection's thread to send; None when another thread
        answered it; raises the refusal (an MqmetaError)."""
        ...

    def abandon(self) -> bool:
        """The connection ends: whether it was still parked."""
        ...


Serve = Callable[[bpb.HaFetchRequest, "Link"], "bpb.HaFetchResponse | Waiting"]


class StreamBroken(Unavailable):
    """The stream failed (refused, reset, closed, timed out, a bad frame). `unreachable`:
    the master's process is not there (refused, reset or closed), as a gRPC UNAVAILABLE."""

    def __init__(self, message: str, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


# Who may open, and where to dial, the stream (kept under these names for ha_fetch and the tests).
offered = frames.offered
stream_address = frames.stream_address
usable = frames.usable
host_of = frames.host_of


class Link:
    """One slave's connection as another thread sees it: `push` sends the answer to its
    parked fetch without blocking (the socket's buffer is empty: the slave waits for this
    answer); what the socket does not take at once, the connection's thread sends, woken
    through an eventfd, as it is by `wake` (a new role or epoch: it settles its fetch)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.waker = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()  # a push or a wake against close (no write to a reused fd)
        self._rest = b""  # of a pushed answer, for the connection's thread to send
        self._closed = False

    def push(self, frame: bytes) -> None:
        """Sends an answer's frame (response_frame)."""
        with self._lock:
            if self._closed:
                return
            try:
                sent = self._sock.send(frame, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError as error:  # the connection failed: its thread ends it
                log.debug("pushing an HA stream answer failed: %s", error)
                return
            if sent < len(frame):
                self._rest = frame[sent:]
                os.eventfd_write(self.waker, 1)

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                os.eventfd_write(self.waker, 1)

    def take_rest(self) -> bytes:
        with self._lock:
            rest, self._rest = self._rest, b""
        try:
            os.eventfd_read(self.waker)
        except BlockingIOError:
            pass
        return rest

    def close(self) -> None:
        with self._lock:
            self._closed = True
            frames.close(self._sock)
            os.close(self.waker)


class StreamServer(frames.FrameServer):
    """The master's side: a listening socket, a thread per connected slave (at most
    CONNECTIONS_MAX), each answering one request at a time with `serve`, or parking it."""

    def __init__(self, host: str, serve: Serve, port: int = 0) -> None:
        self._serve = serve
        super().__init__(
            "ha-stream",
            host,
            self._no_answer,
            port,
            REQUEST_BYTES_MAX,
            CONNECTIONS_MAX,
            IDLE_TIMEOUT_S,
            STOP_JOIN_S,
        )

    @staticmethod
    def _no_answer(kind: int, payload: bytes, connection: socket.socket) -> bytes:
        raise NotImplementedError("the HA stream serves its connections itself")

    def _serve_connection(self, connection: socket.socket) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frames.blocking_with_timeouts(connection, IDLE_TIMEOUT_S)
        reader = frames.FrameReader(connection, IDLE_TIMEOUT_S, CLOSED)
        link = Link(connection)
        waiting: Waiting | None = None
        try:
            while not self._stopping.is_set():
                if waiting is not None:
                    self._await(connection, reader, link, waiting)
                    waiting = None
                kind, payload = reader.read(REQUEST_BYTES_MAX, frames.FRAME_TIMEOUT_S)
                if kind != frames.KIND_REQUEST:
                    raise ValueError(f"an HA stream frame of kind {kind} from a slave")
                request = bpb.HaFetchRequest.FromString(payload)
                try:
                    outcome = self._serve(request, link)
                except MqmetaError as error:  # refused (not master, fenced, ...): the slave handshakes again
                    connection.sendall(_refusal(error))
                    continue
                if isinstance(outcome, bpb.HaFetchResponse):
                    connection.sendall(response_frame(outcome))
                else:
                    waiting = outcome
        except (OSError, ValueError, DecodeError) as error:  # gone, silent, or a bad frame: it connects again
            log.debug("an HA stream connection ended: %s", error)
        except Exception:
            log.exception("serving an HA stream failed")
        finally:
            if waiting is not None:
                waiting.abandon()
            with self._lock:
                self._connections.pop(connection, None)
            link.close()

    def _await(
        self, connection: socket.socket, reader: frames.FrameReader, link: Link, waiting: Waiting
    ) -> None:
        """Until the parked fetch is answered: by another thread's push (the slave's next
        request then arrives; the rest of a push the socket did not take is sent here), or
        by this thread once the fetch's wait ends or the master wakes it."""
        poller = select.poll()
        poller.register(connection, select.POLLIN)
        poller.register(link.waker, select.POLLIN)
        settled = False  # settle() said another thread answers it
        give_up_at = time.monotonic() + IDLE_TIMEOUT_S
        for _ in range(AWAIT_ROUNDS_MAX):
            until = give_up_at if settled else min(waiting.deadline, give_up_at)
            if reader.pending:
                ready = {connection.fileno()}
            else:
                ready = {fd for fd, _ in poller.poll(max(0.0, until - time.monotonic()) * 1000)}
            rest = link.take_rest() if link.waker in ready else b""
            if rest:
                connection.sendall(rest)
                return
            if connection.fileno() in ready:  # the slave's next request, or its end
                if waiting.abandon():
                    raise ValueError("an HA stream request came before the answer to the last")
                return
            if time.monotonic() >= give_up_at:
                raise TimeoutError(f"no request on the HA stream for {IDLE_TIMEOUT_S:.0f} s")
            if settled:
                continue  # woken after another thread answered it (a new role): the request comes
            try:
                answer = waiting.settle()
            except MqmetaError as error:
                connection.sendall(_refusal(error))
                return
            if answer is not None:
                connection.sendall(response_frame(answer))
                return
            settled = True
        raise ValueError(f"a parked HA stream fetch was woken {AWAIT_ROUNDS_MAX} times")


def response_frame(response: bpb.HaFetchResponse) -> bytes:
    return frames.frame(frames.KIND_RESPONSE, response.SerializeToString())


def request_frame(request: bpb.HaFetchRequest) -> bytes:
    return frames.frame(frames.KIND_REQUEST, request.SerializeToString())


def _refusal(error: MqmetaError) -> bytes:
    return frames.frame(frames.KIND_REFUSAL, f"{error.code}\n{error}".encode())


class StreamClient:
    """The slave's side: one connection to its master's stream at `address` (HOST:PORT, as
    dialled: a fault proxy's address in the chaos suite); `fetch` is one round trip (`send`
    then `receive`), with the timeout the gRPC call would have had. Every failure is
    StreamBroken (the connection is then closed); a refusal is the typed error the master
    raised."""

    def __init__(self, address: str) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        try:
            self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S)
        except (OSError, ValueError) as error:  # ValueError: a dial map's port that is no number
            unreachable = isinstance(error, OSError)
            raise StreamBroken(
                f"cannot connect to the HA stream at {self.address}: {error}", unreachable
            ) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timeout_s = -1.0  # set per fetch (frames.blocking_with_timeouts) when it changes; -1: not yet
        self._reader = frames.FrameReader(self._sock, None, CLOSED)
        # A master at CONNECTIONS_MAX accepts, then closes: a reset or an end before the
        # first answer is a refusal by a live process, not a master that is gone.
        self._answered = False
        self.in_flight = False  # a fetch was sent whose answer is not read yet

    def fetch(self, request: bpb.HaFetchRequest, timeout_s: float) -> bpb.HaFetchResponse:
        """One round trip: `send`, then `receive`."""
        self.send(request, timeout_s)
        return self.receive()

    def send(self, request: bpb.HaFetchRequest, timeout_s: float, frame: bytes = b"") -> None:
        """Sends a fetch whose answer `receive` reads (the slave sends its next fetch, which
        acknowledges the bytes it has just made durable, before it finishes with them).
        `frame`: the request already framed (request_frame), if it was."""
        if self.in_flight:
            raise ValueError("an HA stream fetch sent before the answer to the last was read")
        try:
            if timeout_s != self._timeout_s:
                frames.blocking_with_timeouts(self._sock, timeout_s)
                self._timeout_s = timeout_s
            self._sock.sendall(frame or request_frame(request))
        except (TimeoutError, BlockingIOError):  # SO_SNDTIMEO
            raise self._broken(f"took no fetch in {timeout_s:.1f} s", False) from None
        except OSError as error:
            raise self._broken(f"failed: {error}", self._answered) from None
        self.in_flight = True

    def receive(self) -> bpb.HaFetchResponse:
        """The answer to the fetch sent last, within that fetch's timeout."""
        if not self.in_flight:
            raise ValueError("no HA stream fetch is waiting for its answer")
        try:
            kind, payload = self._reader.read(RESPONSE_BYTES_MAX)
        except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO
            raise self._broken(f"gave no answer in {self._timeout_s:.1f} s", False) from None
        except OSError as error:
            raise self._broken(f"failed: {error}", self._answered) from None
        except ValueError as error:
            raise self._broken(str(error), False) from None
        self.in_flight = False
        self._answered = True
        if kind == frames.KIND_RESPONSE:
            try:
                return bpb.HaFetchResponse.FromString(payload)
            except DecodeError as error:
                self.close()
                raise StreamBroken(
                    f"an HA stream answer that is no HaFetchResponse: {error}", False
                ) from None
        if kind == frames.KIND_REFUSAL:
            code, _, message = payload.decode("utf-8", "replace").partition("\n")
            raise error_from_code(code, message)
        self.close()
        raise StreamBroken(f"an HA stream frame of kind {kind} from the master", False)

    def _broken(self, what: str, unreachable: bool) -> StreamBroken:
        """Closes the connection; the error to raise."""
        self.close()
        return StreamBroken(f"the HA stream at {self.address} {what}", unreachable)

    def close(self) -> None:
        frames.close(self._sock)

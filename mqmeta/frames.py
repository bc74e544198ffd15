"""Frames over one plain TCP connection: the codec, who may use it, and a server with a
thread per connection. The HA stream (broker_agent/ha_stream.py) and the call stream
(mqmeta/call_stream.py) are built on it: a gRPC unary call costs each side a few thread
hand-offs in Python's gRPC (about 0.3 ms a round trip on a quiet machine, a millisecond
or more under load); a request or an answer in a frame is one socket write and one read
(about 0.01 ms).

A frame is a 9-byte header, the payload's length (4 bytes, big-endian), its kind (1
byte) and its CRC-32 (4 bytes), then the payload. A frame that fails its CRC or is too
long ends the connection; so does one whose last byte comes FRAME_TIMEOUT_S after its
first on a server (a slow sender holds no connection), and a payload is stored as it
arrives (READ_CHUNK_BYTES, or as much as has come, at a time), not as long as its header
claims. The HA stream (both sides), the broker's call stream server and every call stream
client read with FrameReader from blocking sockets with kernel timeouts
(blocking_with_timeouts); a controller's call stream server reads with asyncio. A stream
is opened only when this process serves plain, unauthenticated gRPC (no TLS, no auth
policy): the stream has neither. Its peer dials it through the dial map as it dials gRPC;
when the dial map redirects the gRPC address but not the stream's, the peer stays on
gRPC, so that a fault proxy is never bypassed.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable

from google.protobuf.message import DecodeError

from mqmeta import auth, tls
from mqmeta.dialmap import dial

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IBI")  # payload length, kind, CRC-32 of the payload
KIND_REQUEST = 1
KIND_RESPONSE = 2
KIND_REFUSAL = 3
KIND_WRONG_SERVER = 4  # the call stream's: a request meant for another server (mqmeta/call_stream.py)
ACCEPT_POLL_S = 0.5  # how soon the accepting thread sees stop()
FRAME_TIMEOUT_S = 10.0  # a server's wait from a frame's first byte to its last
READ_CHUNK_BYTES = 64 << 10  # a payload is read (and stored) this much at a time
LISTEN_BACKLOG = 16

# What a connection's thread does with one request frame (kind, payload): the answer
# frame to send. ValueError or DecodeError: a bad frame, which ends the connection.
Answer = Callable[[int, bytes, socket.socket], bytes]


def offered() -> bool:
    """Whether this process may open a stream: plain, unauthenticated gRPC only."""
    return tls.current() is None and auth.current_policy() is None and auth.client_token() is None


def host_of(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def stream_address(grpc_address: str, port: int) -> str:
    """The address a peer dials for a stream: the gRPC address's host, the offered port."""
    host = host_of(grpc_address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def usable(grpc_address: str, port: int) -> bool:
    """Whether a peer may dial the stream `port` of the process at `grpc_address`: plain
    gRPC, and either no dial map redirects the gRPC address or one redirects the stream's
    address too (its fault proxy)."""
    if not offered():
        return False
    redirected = dial(grpc_address) != grpc_address
    address = stream_address(grpc_address, port)
    return not redirected or dial(address) != address


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind, zlib.crc32(payload)) + payload


def timeval(timeout_s: float) -> bytes:
    """SO_RCVTIMEO's and SO_SNDTIMEO's struct timeval for `timeout_s`: at least a
    microsecond (a zero timeval is no timeout at all)."""
    micros = max(1, int(timeout_s * 1_000_000))
    return struct.pack("ll", micros // 1_000_000, micros % 1_000_000)


def blocking_with_timeouts(sock: socket.socket, timeout_s: float) -> None:
    """A blocking socket whose reads and writes fail after `timeout_s` (SO_RCVTIMEO,
    SO_SNDTIMEO: a recv then fails with EAGAIN, which FrameReader raises as TimeoutError; a
    sendall with BlockingIOError). Python's own timeouts poll before every recv and send,
    and settimeout changes the descriptor's flags: each a system call that lets go of the
    GIL and takes it back, a hand-off to another thread where threads wait for it; a
    kernel timeout is set without letting go of the GIL and costs the recv or send none."""
    sock.settimeout(None)
    value = timeval(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def receive_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Changes only the receive timeout of a socket set up by blocking_with_timeouts."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(timeout_s))


def send_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Changes only the send timeout of a socket set up by blocking_with_timeouts."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(timeout_s))


class FrameReader:
    """Reads one frame at a time from a socket set up by blocking_with_timeouts: a frame's
    header and a small payload usually come in one recv (a request or an answer of one
    message is about 1.2 KB), where reading the header first took two, and bytes received
    past a frame (a peer that sends its next frame at once) are kept for the next read.

    A frame's first bytes are waited for with the socket's receive timeout, or until
    `deadline` (time.monotonic()) when one is given; the rest must come within
    `frame_timeout_s` of them and by `deadline`, else TimeoutError. While it waits with a
    deadline the socket's receive timeout is the time left; afterwards it is put back to
    `timeout_s` (None: left as it is, for a caller that sets it before every read). A
    long payload is stored as it arrives (READ_CHUNK_BYTES, or as much as has come, at a
    time), not as long as its header claims."""

    def __init__(
        self, sock: socket.socket, timeout_s: float | None, closed: str = "the peer closed the stream"
    ) -> None:
        self._sock = sock
        self._timeout_s = timeout_s
        self._closed = closed
        self._pending = b""
        self._timeout_changed = False

    @property
    def pending(self) -> bool:
        """Whether bytes of a next frame have been received already."""
        return bool(self._pending)

    def _recv(self, size: int, deadline: float | None) -> bytes:
        if deadline is not None:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise TimeoutError("a frame did not come in time")
            receive_timeout(self._sock, left_s)
            self._timeout_changed = True
        try:
            chunk = self._sock.recv(size)
        except BlockingIOError:  # SO_RCVTIMEO
            raise TimeoutError("a frame did not come in time") from None
        if not chunk:
            raise ConnectionResetError(self._closed)
        return chunk

    def read(
        self, size_max: int, frame_timeout_s: float | None = None, deadline: float | None = None
    ) -> tuple[int, bytes]:
        """One frame (kind, payload); ValueError when it is longer than `size_max` or
        fails its CRC."""
        data, self._pending = self._pending, b""
        try:
            if not data:
                data = self._recv(READ_CHUNK_BYTES, deadline)
            if frame_timeout_s is not None:
                frame_deadline = time.monotonic() + frame_timeout_s
                deadline = frame_deadline if deadline is None else min(deadline, frame_deadline)
            while len(data) < HEADER.size:
                data += self._recv(READ_CHUNK_BYTES, deadline)
            size, kind, crc = header_of(data[: HEADER.size], size_max)
            end = HEADER.size + size
            if len(data) >= end:
                payload, self._pending = data[HEADER.size : end], data[end:]
            else:  # asked for at most what came so far (or READ_CHUNK_BYTES) at a time
                buffer = bytearray(data[HEADER.size :])
                while len(buffer) < size:
                    buffer += self._recv(
                        min(size - len(buffer), max(READ_CHUNK_BYTES, len(buffer))), deadline
                    )
                payload = bytes(buffer)
        finally:
            if self._timeout_changed and self._timeout_s is not None:
                receive_timeout(self._sock, self._timeout_s)
                self._timeout_changed = False
        return kind, checked(payload, crc)


def header_of(header: bytes, size_max: int) -> tuple[int, int, int]:
    """A frame's (size, kind, CRC-32); ValueError when it is longer than `size_max`."""
    size, kind, crc = HEADER.unpack(header)
    if size > size_max:
        raise ValueError(f"a frame of {size} bytes (at most {size_max})")
    return size, kind, crc


def checked(payload: bytes, crc: int) -> bytes:
    """`payload`, or ValueError when it fails its CRC-32."""
    if zlib.crc32(payload) != crc:
        raise ValueError("a frame failed its CRC-32")
    return payload


def shutdown(sock: socket.socket) -> None:
    """Ends the connection (a thread reading it wakes) but keeps its descriptor: the thread
    that owns it closes it, so no other thread writes to a descriptor number reused meanwhile."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def close(sock: socket.socket) -> None:
    shutdown(sock)
    sock.close()


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host` (brackets stripped) and `port` (0: the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # create_server sets SO_REUSEADDR: a port held for a local cluster (cluster/ports.py) binds
    return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)


class FrameServer:
    """A listening socket and a thread per connection (at most `connections_max`), each
    reading one request frame at a time and writing `answer`'s frame (none when it returns
    b"": the answer has left already, from another thread). A connection silent
    for `idle_timeout_s`, or whose frame is not all there `frame_timeout_s` after its first
    byte, ends. `name` names the stream in logs and threads.

    stop(grace_s) stops accepting and closes the connections waiting for a request at once
    (a request that arrives then is never served: its client sends it again elsewhere); a
    call being served gets `grace_s` to write its answer (its client would otherwise send it
    again: a write applied twice), then its connection is closed too; the threads are
    joined (at most `stop_join_s` in all)."""

    def __init__(
        self,
        name: str,
        host: str,
        answer: Answer,
        port: int,
        request_bytes_max: int,
        connections_max: int,
        idle_timeout_s: float,
        stop_join_s: float,
        frame_timeout_s: float = FRAME_TIMEOUT_S,
    ) -> None:
        self.name = name
        self._answer = answer
        self._request_bytes_max = request_bytes_max
        self._connections_max = connections_max
        self._idle_timeout_s = idle_timeout_s
        self._frame_timeout_s = frame_timeout_s
        self._stop_join_s = stop_join_s
        self._listener = listen(host, port)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._serving: set[socket.socket] = set()  # between a request read and its answer written
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace_s: float = 0.0) -> None:
        self._stopping.set()
        try:  # wakes the accepting thread at once (Linux), not after its poll
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()  # refused from now on
        with self._lock:
            threads = list(self._connections.values())
            for connection in self._connections:  # wakes a thread reading; its thread closes it
                if connection not in self._serving:
                    shutdown(connection)
        grace_deadline = time.monotonic() + grace_s
        for thread in threads:
            thread.join(timeout=max(0.0, grace_deadline - time.monotonic()))
        with self._lock:
            late = list(self._serving)
        for connection in late:  # past the grace: its answer is lost
            shutdown(connection)
        if self._thread.ident is not None:  # started (a bound server may be stopped unstarted)
            self._thread.join(timeout=ACCEPT_POLL_S * 4)
        deadline = time.monotonic() + self._stop_join_s
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("a %s connection still served %.1f s after stop", self.name, self._stop_join_s)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if not self._stopping.is_set():
                    log.warning("the %s stopped accepting: %s", self.name, error)
                return
            with self._lock:
                if len(self._connections) >= self._connections_max or self._stopping.is_set():
                    close(connection)
                    continue
                thread = threading.Thread(
                    target=self._serve_connection, args=(connection,), name=self.name, daemon=True
                )
                self._connections[connection] = thread
            thread.start()

    def _serve_connection(self, connection: socket.socket) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        blocking_with_timeouts(connection, self._idle_timeout_s)
        reader = FrameReader(connection, self._idle_timeout_s)
        try:
            while True:
                kind, payload = reader.read(self._request_bytes_max, self._frame_timeout_s)
                with self._lock:
                    if self._stopping.is_set():  # stop() closed it, or is about to: not served
                        break
                    self._serving.add(connection)
                answer = self._answer(kind, payload, connection)
                if answer:  # b"": another thread sent all of it (call_stream.EarlyAnswer)
                    connection.sendall(answer)
                with self._lock:
                    self._serving.discard(connection)
                    if self._stopping.is_set():
                        break
        except OSError as error:  # gone, silent or too slow: it connects again
            log.debug("a %s connection ended: %s", self.name, error)
        except (ValueError, DecodeError) as error:  # a bad frame: a peer that is no client of ours, or a bug
            log.warning("a %s connection ended on a bad frame: %s", self.name, error)
        except Exception:
            log.exception("serving a %s connection failed", self.name)
        finally:
            with self._lock:
                self._connections.pop(connection, None)
                self._serving.discard(connection)
            close(connection)

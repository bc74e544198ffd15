"""The HA stream: a slave's fetches and its master's answers over one TCP connection.

The same messages as the HaFetch call (HaFetchRequest, HaFetchResponse) and the same rules
(ha_fetch.serve_fetch answers each request; the slave's core applies each answer): only
the transport differs (mqmeta/frames.py: the frame, and who may open a stream). Each
round trip is on a send's path: the slave's next fetch acknowledges the bytes of the
last one. RocketMQ's HAService works the same way (a connection per slave, the master
pushing bytes, the slave answering with its offset).

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

import socket
from collections.abc import Callable

from google.protobuf.message import DecodeError

from mqmeta import frames
from mqmeta.errors import MqmetaError, Unavailable, error_from_code
from mqmeta.pb import broker_pb2 as bpb

REQUEST_BYTES_MAX = 1 << 20
RESPONSE_BYTES_MAX = 17 << 20  # ha_fetch.FETCH_MAX_BYTES_LIMIT of records and the rest
CONNECTIONS_MAX = 16  # slaves connected at once; one thread each
IDLE_TIMEOUT_S = 30.0  # a slave fetches at least every wait_ms; silence this long ends it
CONNECT_TIMEOUT_S = 1.0
# How long stop() waits for the connections' threads: one may be in a fetch's wait (at
# most ha_fetch.FETCH_WAIT_MS_MAX, 1 s), then answer; after stop() none touches the store.
STOP_JOIN_S = 2.0

Serve = Callable[[bpb.HaFetchRequest], bpb.HaFetchResponse]

# Who may open, and where to dial, the stream (kept under these names for ha_fetch and the tests).
offered = frames.offered
stream_address = frames.stream_address
usable = frames.usable
host_of = frames.host_of


class StreamBroken(Unavailable):
    """The stream failed (refused, reset, closed, timed out, a bad frame). `unreachable`:
    the master's process is not there (refused, reset or closed), as a gRPC UNAVAILABLE."""

    def __init__(self, message: str, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class StreamServer(frames.FrameServer):
    """The master's side: a listening socket, a thread per connected slave (at most
    CONNECTIONS_MAX), each answering one request at a time with `serve`."""

    def __init__(self, host: str, serve: Serve, port: int = 0) -> None:
        self._serve = serve
        super().__init__(
            "ha-stream",
            host,
            self._answer_fetch,
            port,
            REQUEST_BYTES_MAX,
            CONNECTIONS_MAX,
            IDLE_TIMEOUT_S,
            STOP_JOIN_S,
        )

    def _answer_fetch(self, kind: int, payload: bytes, connection: socket.socket) -> bytes:
        if kind != frames.KIND_REQUEST:
            raise ValueError(f"an HA stream frame of kind {kind} from a slave")
        request = bpb.HaFetchRequest.FromString(payload)
        try:
            return frames.frame(frames.KIND_RESPONSE, self._serve(request).SerializeToString())
        except MqmetaError as error:  # refused (not master, fenced, ...): the slave handshakes again
            return frames.frame(frames.KIND_REFUSAL, f"{error.code}\n{error}".encode())


class StreamClient:
    """The slave's side: one connection to its master's stream at `address` (HOST:PORT, as
    dialled: a fault proxy's address in the chaos suite); `fetch` is one round trip, with the
    timeout the gRPC call would have had. Every failure is StreamBroken (the connection is
    then closed); a refusal is the typed error the master raised."""

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
        # A master at CONNECTIONS_MAX accepts, then closes: a reset or an end before the
        # first answer is a refusal by a live process, not a master that is gone.
        self._answered = False

    def fetch(self, request: bpb.HaFetchRequest, timeout_s: float) -> bpb.HaFetchResponse:
        try:
            self._sock.settimeout(timeout_s)
            self._sock.sendall(frames.frame(frames.KIND_REQUEST, request.SerializeToString()))
            kind, payload = frames.read_frame(self._sock, RESPONSE_BYTES_MAX)
        except TimeoutError:
            self.close()
            raise StreamBroken(
                f"no answer on the HA stream at {self.address} in {timeout_s:.1f} s", False
            ) from None
        except OSError as error:
            self.close()
            raise StreamBroken(f"the HA stream at {self.address} failed: {error}", self._answered) from None
        except ValueError as error:
            self.close()
            raise StreamBroken(f"the HA stream at {self.address}: {error}", False) from None
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

    def close(self) -> None:
        frames.close(self._sock)

"""A remoting protocol server on asyncio, in a thread of its own beside the gRPC server.

A client keeps one connection per server and matches answers to requests by opaque, so
requests are served concurrently: each runs its (blocking) handler on a worker thread and
its answer is written when ready, in any order. A heartbeat never waits behind a pull
that long-polls (the C++ client drops a connection whose heartbeat is unanswered for 3 s).
Long-running codes (a pull that waits for messages) get a pool of their own, so they can
never take the threads of sends and heartbeats.

Bad input gets RocketMQ's error answers and the server keeps serving: a header that
cannot be read gets SYSTEM_ERROR with a remark (and the connection keeps going: the frame's
length is known), an unknown code REQUEST_CODE_NOT_SUPPORTED, a frame over the bound
SYSTEM_ERROR and then the connection is closed (its length cannot be trusted).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mqmeta import auth, tls
from mqmeta.codec import remoting as codec
from mqmeta.codec.remoting import Command, FrameError
from mqmeta.errors import (
    WIRE_CODES,
    MqmetaError,
    listed_class,
)
from mqmeta.validate import parse_addresses

log = logging.getLogger(__name__)

WORKERS = 16
LONG_WORKERS = 64
CONNECTIONS_MAX = 4096
INFLIGHT_PER_CONNECTION_MAX = 256
IDLE_TIMEOUT_S = 120.0  # RocketMQ closes a connection idle this long; clients heartbeat every 30 s
FRAME_READ_TIMEOUT_S = 30.0  # the rest of a frame whose length arrived
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 2.0


class Refusal(MqmetaError):
    """A request answered with a RocketMQ response code and a remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.response_code = code


# The remoting column of the one error map (mqmeta.errors), resolved at import: a name
# that is not a response code of mqmeta.codec.remoting fails here.
_CODE_OF_CLASS: dict[type[MqmetaError], int] = {
    cls: getattr(codec, codes.remoting) for cls, codes in WIRE_CODES.items()
}


def response_code_of(error: MqmetaError) -> int:
    if isinstance(error, Refusal):
        return error.response_code
    return _CODE_OF_CLASS[listed_class(error)]


class Connection:
    """One client connection; `send` may be called from any thread."""

    def __init__(
        self, connection_id: int, peer: str, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.id = connection_id
        self.peer = peer  # HOST:PORT of the client
        self._writer = writer
        self._loop = loop
        self.inflight = asyncio.Semaphore(INFLIGHT_PER_CONNECTION_MAX)

    def write(self, command: Command) -> None:
        """On the loop's thread."""
        if not self._writer.is_closing():
            self._writer.write(codec.encode(command))

    def send(self, command: Command) -> None:
        self._loop.call_soon_threadsafe(self.write, command)

    def close(self) -> None:
        """On the loop's thread: its reader ends, and so does its serving task."""
        self._writer.close()


async def until(done: Callable[[], bool], timeout_s: float) -> None:
    """Waits (on the loop) until `done()` or `timeout_s` passed: a stop lets the connections'
    tasks end before the loop closes."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not done() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


Handler = Callable[[Command, Connection], "Command | None"]


class RemotingServer:
    """Serves `handlers` (request code -> blocking handler returning the answer, or None
    for none) on HOST:PORT; codes in `long_codes` run on their own pool."""

    def __init__(
        self,
        address: str,
        handlers: Mapping[int, Handler],
        long_codes: frozenset[int] = frozenset(),
        on_close: Callable[[Connection], None] = lambda connection: None,
        name: str = "remoting",
        read_codes: frozenset[int] = frozenset(),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parse_addresses(address, "--remoting-listen address")
        self.address = address
        self.handlers = dict(handlers)
        self.long_codes = long_codes
        self.read_codes = read_codes  # anonymous with --anonymous-reads; every other code is data
        self.ssl_context = ssl_context
        self.on_close = on_close
        self.name = name
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix=f"{name}-worker")
        self._long_pool = ThreadPoolExecutor(LONG_WORKERS, thread_name_prefix=f"{name}-long")
        self._ids = itertools.count(1)
        self._connections: dict[int, Connection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self) -> None:
        """Binds and serves in a thread; raises (OSError) when the address cannot be bound."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._bind())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_until_complete(self._serve_until_stopped())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not started.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the remoting server on {self.address} did not start")
        if failure:
            raise failure[0]

    async def _bind(self) -> None:
        host, _, port = self.address.rpartition(":")
        self._stopped = asyncio.Event()
        self._server = await asyncio.start_server(
            self._serve_connection, host.strip("[]"), int(port), ssl=self.ssl_context
        )

    async def _serve_until_stopped(self) -> None:
        assert self._stopped is not None and self._server is not None
        await self._stopped.wait()
        self._server.close()
        for connection in list(self._connections.values()):
            connection.close()
        await until(lambda: not self._connections, STOP_TIMEOUT_S)
        await self._server.wait_closed()

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopped.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if self._thread is not None:
            self._thread.join(timeout=3)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._long_pool.shutdown(wait=False, cancel_futures=True)

    def connections(self) -> list[Connection]:
        return list(self._connections.values())

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        peer = writer.get_extra_info("peername") or ("?", 0)
        connection = Connection(next(self._ids), f"{peer[0]}:{peer[1]}", writer, loop)
        if len(self._connections) >= CONNECTIONS_MAX:
            connection.write(Command(0, 0, codec.FLAG_RESPONSE, f"over {CONNECTIONS_MAX} connections"))
            writer.close()
            return
        self._connections[connection.id] = connection
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                prefix = await asyncio.wait_for(reader.readexactly(4), IDLE_TIMEOUT_S)
                try:
                    length = codec.frame_length(prefix)
                except FrameError as error:  # its end cannot be found: answer, then close
                    connection.write(Command(codec.SYSTEM_ERROR, 0, codec.FLAG_RESPONSE, error.message))
                    await writer.drain()
                    break
                frame = await asyncio.wait_for(reader.readexactly(length), FRAME_READ_TIMEOUT_S)
                try:
                    command = codec.decode_frame(frame)
                except FrameError as error:
                    connection.write(
                        Command(codec.SYSTEM_ERROR, error.opaque, codec.FLAG_RESPONSE, error.message)
                    )
                    continue
                if command.is_response:
                    continue  # answers to what we sent (NOTIFY_CONSUMER_IDS_CHANGED is oneway)
                if connection.inflight.locked():
                    connection.write(
                        command.answer(
                            codec.SYSTEM_BUSY, f"over {INFLIGHT_PER_CONNECTION_MAX} requests in flight"
                        )
                    )
                    continue
                await connection.inflight.acquire()
                task = loop.create_task(self._serve_request(command, connection))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if writer.transport.get_write_buffer_size() > codec.FRAME_BYTES_MAX:
                    await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
            pass
        finally:
            del self._connections[connection.id]
            for task in tasks:
                task.cancel()
            writer.close()
            try:
                await loop.run_in_executor(self._pool, self.on_close, connection)
            except Exception:
                log.exception("%s: closing connection %s failed", self.name, connection.peer)

    async def _serve_request(self, command: Command, connection: Connection) -> None:
        try:
            handler = self.handlers.get(command.code)
            if handler is None:
                answer: Command | None = command.answer(
                    codec.REQUEST_CODE_NOT_SUPPORTED,
                    f"request code {command.code} is not supported by mqmeta's {self.name} server",
                )
            else:
                pool = self._long_pool if command.code in self.long_codes else self._pool
                answer = await asyncio.get_running_loop().run_in_executor(
                    pool, _answer_of, handler, command, connection, command.code in self.read_codes
                )
            if answer is not None and not command.is_oneway:
                connection.write(answer)
        except RuntimeError:  # the pool was shut down: the server is stopping
            pass
        finally:
            connection.inflight.release()


def _answer_of(handler: Handler, command: Command, connection: Connection, read_only: bool) -> Command | None:
    """The handler's answer; a refusal or one of our errors as its response code and remark;
    NO_PERMISSION with the reason when the server's allow list refuses the request."""
    refused = auth.remoting_refusal(command.ext, command.body, read_only)
    if refused is not None:
        return command.answer(codec.NO_PERMISSION, f"request code {command.code} refused: {refused}")
    try:
        return handler(command, connection)
    except MqmetaError as error:
        return command.answer(response_code_of(error), error.message)
    except Exception as exc:  # a bug: say so, keep serving
        log.exception("remoting request %d failed", command.code)
        return command.answer(codec.SYSTEM_ERROR, f"internal error: {type(exc).__name__}: {exc}")


def ext_text(command: Command, name: str, default: str | None = None) -> str:
    value = command.ext.get(name, default)
    if value is None:
        raise Refusal(codec.SYSTEM_ERROR, f"the request header lacks {name!r}")
    return value


def ext_int(command: Command, name: str, low: int, high: int, default: int | None = None) -> int:
    text = command.ext.get(name)
    if text is None or text == "":
        if default is None:
            raise Refusal(codec.SYSTEM_ERROR, f"the request header lacks {name!r}")
        return default
    try:
        value = int(text)
    except ValueError:
        raise Refusal(
            codec.SYSTEM_ERROR, f"header field {name!r} is not a whole number: {text[:32]!r}"
        ) from None
    if not low <= value <= high:
        raise Refusal(codec.SYSTEM_ERROR, f"header field {name!r} must be {low} to {high}, not {value}")
    return value


def ext_bool(command: Command, name: str) -> bool:
    return command.ext.get(name, "").lower() in ("true", "1")


def listen_address(args: argparse.Namespace) -> str:
    """--remoting-listen checked (it serves TLS when the process does, with its certificate,
    and checks --auth-file's identities by RocketMQ's ACL signature)."""
    address = getattr(args, "remoting_listen", None) or ""
    if not address:
        return ""
    parse_addresses(address, "--remoting-listen address")
    return address


def server_ssl_context() -> ssl.SSLContext | None:
    """The process's TLS settings for a remoting listener (None: plaintext): its certificate,
    and with --tls-client-ca a client certificate of that CA required (mutual TLS)."""
    config = tls.current()
    if config is None or not config.serves_tls:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_identity(context, config)
    if config.client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=config.client_ca.decode())
    return context


def client_ssl_context() -> ssl.SSLContext | None:
    """The process's TLS settings for dialing a remoting listener (a proxy to its brokers):
    the CA it trusts (--tls-ca) and its certificate when it has one."""
    config = tls.current()
    if config is None or not config.dials_tls or config.ca is None:
        return None
    context = ssl.create_default_context(cadata=config.ca.decode())
    context.check_hostname = False  # peers are dialed by address; the CA is what is checked
    if config.cert is not None:
        _load_identity(context, config)
    return context


def _load_identity(context: ssl.SSLContext, config: tls.TlsConfig) -> None:
    """ssl loads a certificate and key from files only: a private temporary copy, removed at once."""
    assert config.cert is not None and config.key is not None
    with tempfile.TemporaryDirectory(prefix="mqmeta-tls-") as directory:
        cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        for path, data in ((cert, config.cert), (key, config.key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as sink:
                sink.write(data)
        context.load_cert_chain(cert, key)

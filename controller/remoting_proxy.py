"""Remoting proxies on the nameserver: broker addresses that stay valid across a failover.

A RocketMQ 4.x client caches a topic's route (the C++ client for 30 s) and sends every
broker-bound request to the address the route named for the broker set. A route naming
the master's own address leaves it sending to a dead master until its next refresh. So
the nameserver answers, for each broker set that has a proxy, the proxy's address, and the
proxy forwards to whichever replica is master now.

Why one listener (one port) per broker set. The requests a 4.x client sends to a broker
(SEND_MESSAGE_V2, PULL_MESSAGE, offsets, locks, send-back) name a topic and a queue id but
not the broker set, and queue ids repeat in every set: queue 0 of topic T exists on each.
RocketMQ's own answer is that the address is the broker set; the proxy keeps that: the
route names proxy port P for set S, and whatever arrives on P belongs to S. The mapping is
given explicitly (`--remoting-proxy S=HOST:PORT`), never derived from an order of names, so
a nameserver restarted with more sets cannot shift a client's cached address onto another
set's queues (that would send its pulls and offset commits to the wrong queues).

Why a connection to the master per client connection (not a shared pool). The broker ties
a consumer to its connection (a closed connection leaves the group), pushes
NOTIFY_CONSUMER_IDS_CHANGED down it, and the client's opaques are unique per connection
only: a 1:1 pairing keeps all three without rewriting a frame.

On a failover the upstream connection breaks (kill -9: reset at once). The proxy keeps
the client's connection, waits for the route copy to name another master (bounded by
FAILOVER_WAIT_MS), connects to it, replays the client's last HEART_BEAT (the new master
knows nobody: without it GET_CONSUMER_LIST_BY_GROUP would be empty until the client's next
heartbeat 30 s later), then sends again every request still unanswered, in order. A send
whose answer the dead master never wrote may so be written twice (the first copy may have
reached the set before the kill): at-least-once, as RocketMQ's own client retries are;
an acknowledged send is never lost (it was replicated to the SyncStateSet before its
answer). A request unanswered for FAILOVER_WAIT_MS gets SERVICE_NOT_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping

from mqmeta.codec import remoting as codec
from mqmeta.codec.remoting import Command, FrameError
from mqmeta.errors import InvalidArgument
from mqmeta.remoting.server import (
    CONNECTIONS_MAX,
    INFLIGHT_PER_CONNECTION_MAX,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    client_ssl_context,
    server_ssl_context,
    until,
)
from mqmeta.validate import parse_addresses, validate_name

log = logging.getLogger(__name__)

FAILOVER_WAIT_MS = 15_000  # longer than an election with the default liveness settings
RECONNECT_PAUSE_S = 0.02  # between looks at the route copy while a set has no reachable master
CONNECT_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 150.0  # the broker's 120 s, plus a margin: the broker decides
PROXY_OPAQUE_BASE = 0x7F000000  # the proxy's own requests (a replayed heartbeat): answers swallowed
ROUTES = ("proxy", "direct")


def parse_proxies(values: list[str] | None) -> dict[str, str]:
    """`--remoting-proxy NAME=HOST:PORT` (repeatable, or comma-separated) as name -> address."""
    found: dict[str, str] = {}
    for value in values or []:
        for item in filter(None, (v.strip() for v in value.split(","))):
            name, sep, address = item.partition("=")
            if not sep:
                raise InvalidArgument(f"--remoting-proxy {item!r} is not BROKER_SET=HOST:PORT")
            validate_name("broker set name", name)
            parse_addresses(address, "--remoting-proxy address")
            if name in found or address in found.values():
                raise InvalidArgument(f"--remoting-proxy names broker set {name} or address {address} twice")
            found[name] = address
    return found


class RemotingProxies:
    """One listener per broker set, all on one event loop in a thread of their own.

    `master_of(broker_name)` answers the remoting address of the set's current master ('' when
    it has none or serves no remoting listener); it blocks (a cache read, at worst a short
    call to the broker), so it runs on the loop's default executor."""

    def __init__(self, proxies: Mapping[str, str], master_of: Callable[[str], str]) -> None:
        self.proxies = dict(proxies)
        self.master_of = master_of
        # TLS as the process has it: served to clients, and used to dial the brokers
        self.server_ssl, self.client_ssl = server_ssl_context(), client_ssl_context()
        self.stats = {"connections": 0, "reconnects": 0, "resent": 0, "expired": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._links: set[_Link] = set()

    def start(self) -> RemotingProxies:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                servers = loop.run_until_complete(self._bind())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_until_complete(self._serve_until_stopped(servers))
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="remoting-proxy", daemon=True)
        self._thread.start()
        if not started.wait(START_TIMEOUT_S):
            raise RuntimeError("the remoting proxies did not start")
        if failure:
            raise failure[0]
        return self

    async def _bind(self) -> list[asyncio.AbstractServer]:
        self._stopped = asyncio.Event()
        servers: list[asyncio.AbstractServer] = []
        try:
            for name, address in self.proxies.items():
                host, _, port = address.rpartition(":")
                serve = _serving(self, name)
                servers.append(
                    await asyncio.start_server(serve, host.strip("[]"), int(port), ssl=self.server_ssl)
                )
        except BaseException:
            for server in servers:
                server.close()
            raise
        return servers

    async def _serve_until_stopped(self, servers: list[asyncio.AbstractServer]) -> None:
        assert self._stopped is not None
        await self._stopped.wait()
        for server in servers:
            server.close()
        for link in list(self._links):
            link.close()
        await until(lambda: not self._links, STOP_TIMEOUT_S)
        for server in servers:
            await server.wait_closed()

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopped.set)
            except RuntimeError:  # closed meanwhile
                pass
        if self._thread is not None:
            self._thread.join(timeout=3)


def _serving(proxies: RemotingProxies, broker_name: str):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(proxies._links) >= CONNECTIONS_MAX:
            writer.close()
            return
        link = _Link(proxies, broker_name, reader, writer)
        proxies._links.add(link)
        proxies.stats["connections"] += 1
        try:
            await link.run()
        finally:
            proxies._links.discard(link)
            link.close()

    return serve


async def _read_frame(reader: asyncio.StreamReader, timeout_s: float) -> tuple[bytes, Command | FrameError]:
    """The next whole frame (length field included) and its command, or why its header
    cannot be read; raises FrameError when its length is over the bound."""
    prefix = await asyncio.wait_for(reader.readexactly(4), timeout_s)
    length = codec.frame_length(prefix)
    rest = await asyncio.wait_for(reader.readexactly(length), timeout_s)
    try:
        return prefix + rest, codec.decode_frame(rest)
    except FrameError as error:
        return prefix + rest, error


class _Link:
    """One client connection and its connection to the set's current master."""

    def __init__(
        self,
        proxies: RemotingProxies,
        broker_name: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxies = proxies
        self.broker_name = broker_name
        self.reader, self.writer = reader, writer
        self.upstream: asyncio.StreamWriter | None = None
        self.pending: dict[int, tuple[float, bytes]] = {}  # opaque -> (when received, frame)
        self.heartbeat: Command | None = None
        self._opaques = itertools.count(PROXY_OPAQUE_BASE)
        self._own: set[int] = set()
        self._closed = False

    def close(self) -> None:
        self._closed = True
        for writer in (self.writer, self.upstream):
            if writer is not None and not writer.is_closing():
                writer.close()

    async def run(self) -> None:
        upstream = asyncio.get_running_loop().create_task(self._upstream_loop())
        try:
            await self._client_loop()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError, FrameError):
            pass
        finally:
            self._closed = True
            upstream.cancel()
            try:
                await upstream
            except (asyncio.CancelledError, Exception):
                pass

    async def _client_loop(self) -> None:
        while True:
            try:
                frame, command = await _read_frame(self.reader, IDLE_TIMEOUT_S)
            except FrameError as error:  # a length over the bound: where the frame ends is unknown
                self._answer(Command(0, 0), codec.SYSTEM_ERROR, error.message)  # as the broker does
                await self.writer.drain()
                return
            if isinstance(command, FrameError):  # answered as the broker would, at once
                self._answer(Command(0, command.opaque), codec.SYSTEM_ERROR, command.message)
                continue
            if command.is_response:  # to a request the broker sent (none waits for one)
                self._forward(frame)
                continue
            if command.code == codec.HEART_BEAT:
                self.heartbeat = command
            if not command.is_oneway:
                if len(self.pending) >= INFLIGHT_PER_CONNECTION_MAX:
                    self._answer(command, codec.SYSTEM_BUSY, "over the proxy's requests in flight")
                    continue
                self.pending[command.opaque] = (time.monotonic(), frame)
            self._forward(frame)

    def _forward(self, frame: bytes) -> None:
        """To the master now; a request that finds none waits in `pending` for the next one
        (a oneway request or a response then is dropped, as a lost packet would be)."""
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.write(frame)

    def _answer(self, command: Command, code: int, remark: str) -> None:
        if not self.writer.is_closing():
            self.writer.write(codec.encode(command.answer(code, remark)))

    async def _upstream_loop(self) -> None:
        dead = ""
        while not self._closed:
            address = await self._next_master(dead)
            if not address:
                continue
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(*_host_port(address), ssl=self.proxies.client_ssl),
                    CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError):  # ssl.SSLError is an OSError
                dead = address
                await asyncio.sleep(RECONNECT_PAUSE_S)
                continue
            self.upstream = writer
            self._resend(writer, reconnect=bool(dead))
            if dead:
                log.info(
                    "remoting proxy %s: a client moved from %s to %s; %d unanswered requests sent again",
                    self.broker_name,
                    dead,
                    address,
                    len(self.pending),
                )
            try:
                await self._relay(reader)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError, FrameError):
                pass
            finally:
                self.upstream = None
                writer.close()
            dead = address
            log.info("remoting proxy %s: the connection to %s ended", self.broker_name, address)

    async def _next_master(self, dead: str) -> str:
        """The set's master's remoting address once it is not `dead` (or `dead` again after a
        pause: a restarted process on the same address); '' after a pause without one.
        Requests waiting longer than FAILOVER_WAIT_MS are answered meanwhile."""
        self._expire()
        address = await asyncio.get_running_loop().run_in_executor(
            None, self.proxies.master_of, self.broker_name
        )
        if address and address != dead:
            return address
        await asyncio.sleep(RECONNECT_PAUSE_S)
        return address if address == dead and self._long_dead() else ""

    def _long_dead(self) -> bool:
        """The same address is tried again after half the wait (the master restarted)."""
        oldest = min((t for t, _ in self.pending.values()), default=time.monotonic())
        return time.monotonic() - oldest > FAILOVER_WAIT_MS / 2000

    def _expire(self) -> None:
        now = time.monotonic()
        for opaque, (received, _frame) in list(self.pending.items()):
            if now - received > FAILOVER_WAIT_MS / 1000:
                del self.pending[opaque]
                self.proxies.stats["expired"] += 1
                self._answer(
                    Command(0, opaque),
                    codec.SERVICE_NOT_AVAILABLE,
                    f"broker set {self.broker_name} has had no reachable master for {FAILOVER_WAIT_MS} ms",
                )

    def _resend(self, writer: asyncio.StreamWriter, reconnect: bool) -> None:
        """On a (new) master: after a failover the client's last heartbeat first, then every
        request unanswered (on the first connection: those that arrived before it)."""
        if reconnect:
            self.proxies.stats["reconnects"] += 1
        if reconnect and self.heartbeat is not None:
            opaque = next(self._opaques) & 0x7FFFFFFF
            self._own.add(opaque)
            replay = Command(codec.HEART_BEAT, opaque, 0, "", dict(self.heartbeat.ext), self.heartbeat.body)
            writer.write(codec.encode(replay))
        for _, frame in list(self.pending.values()):
            self.proxies.stats["resent"] += reconnect
            writer.write(frame)

    async def _relay(self, reader: asyncio.StreamReader) -> None:
        while not self._closed:
            frame, command = await _read_frame(reader, IDLE_TIMEOUT_S)
            if isinstance(command, Command) and command.is_response:
                if command.opaque in self._own:
                    self._own.discard(command.opaque)
                    continue
                # Forwarded even when not pending (the answer to a frame whose header was
                # unreadable, or one that came after its request expired): a client drops an
                # answer whose opaque it no longer waits for.
                self.pending.pop(command.opaque, None)
            if not self.writer.is_closing():
                self.writer.write(frame)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)

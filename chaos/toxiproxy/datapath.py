"""The TCP data path: listeners, links (one per client connection) and the toxics on the wire.

Everything here runs on one asyncio event loop. A link is two pipes, one per stream (upstream:
client → server, downstream: server → client). Each pipe has one task that takes the chunks its
source socket delivered, in order, and passes each through the stream's toxics in chain order
(the order they were added) before writing it out, as Toxiproxy's chain of toxic stubs does:

- every chunk carries the time it is due, starting at its arrival; a latency toxic moves that time
  later and waits for it, so a latency does not limit throughput: the source keeps being read while
  chunks wait, up to PIPE_BUFFER_BYTES_MAX per pipe (then reading pauses, and TCP pushes back);
- a toxic's wait ends early when that toxic is updated or removed, and the chunk moves on, as
  Toxiproxy's interrupted toxics pass on what they hold;
- toxicity is rolled once per link and toxic version (an update re-rolls it).

Toxic behaviours, as Toxiproxy's toxics/*.go and their tests define them: latency (+ jitter in
[-jitter, jitter)), bandwidth (KB/s in 100 ms steps; rate 0 lets nothing through), slow_close (the
end of the stream waits `delay`), timeout (drops data; closes the connection `timeout` after the
toxic reaches it unless 0; removing it closes every connection of the proxy), reset_peer (the first
chunk or end of stream that reaches it is dropped and the connection reset `timeout` later),
slicer (Toxiproxy's bisection into ~average_size pieces, `delay` µs after each), limit_data (passes
`bytes` bytes, then closes), noop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import ipaddress
import itertools
import logging
import math
import os
import random
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from mqmeta.chaos.toxiproxy.model import (
    AddressError,
    Stream,
    Toxic,
    ToxiproxyError,
    format_address,
    split_address,
)

# Read from a source, not yet written, per stream of a link; the memory that holds it is at most
# twice as much (a read kept in its buffer fills at least half of it: COPY_BELOW_BYTES).
PIPE_BUFFER_BYTES_MAX = 128 * 1024 * 1024
PIPE_RESUME_BYTES = PIPE_BUFFER_BYTES_MAX - 8 * 1024 * 1024  # reading resumes below this
PIPE_CHUNK_COUNT_MAX = 65536  # reads waiting per stream of a link (bounds the per-read overhead)
LINK_COUNT_MAX = 4096  # live client connections per proxy
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
BANDWIDTH_STEP_S = 0.1  # Toxiproxy releases rate * 100 bytes per 100 ms
TIMER_GRANULARITY_S = 0.001  # epoll waits whole milliseconds: shorter waits are batched up
SLICE_BYTES_MIN = 1  # Toxiproxy recurses forever below it (average_size 0); we stop there
READ_BYTES_MAX = 256 * 1024  # one read from a socket (asyncio's own read size)
COPY_BELOW_BYTES = READ_BYTES_MAX // 2  # a smaller read is copied out, its read buffer reused at once
IDLE_READ_BUFFERS_BYTES_MAX = 64 * 1024 * 1024  # read buffers kept for reuse after a burst (per server)
DEFAULT_LISTEN_HOST = "127.0.0.1"  # an empty listen host; Toxiproxy would take every interface

_log = logging.getLogger(__name__)
_toxic_counter = itertools.count(1)


def next_toxic_number() -> int:
    """A fresh toxic position or key (one sequence for the whole server)."""
    return next(_toxic_counter)


class ListenError(ToxiproxyError):
    """A proxy cannot listen; the text is Go's ("listen tcp 127.0.0.1:1: bind: address already in
    use"), which Toxiproxy answers with status 500."""


class Close(enum.Enum):
    GRACEFUL = "graceful"  # flush what is buffered, then FIN
    ABORT = "abort"  # drop buffered data (server shutdown)
    RESET = "reset"  # RST: SO_LINGER 0 (reset_peer)


class ReadBuffers:
    """Read buffers of READ_BYTES_MAX, reused across the server. A large read stays in its buffer
    until it leaves the proxy, so what a latency toxic holds back is memory used before, not fresh
    pages (page faults on fresh memory cost more than the data's trip through the proxy)."""

    def __init__(self) -> None:
        self._idle: list[bytearray] = []

    def take(self) -> bytearray:
        return self._idle.pop() if self._idle else bytearray(READ_BYTES_MAX)

    def give(self, buffer: bytearray) -> None:
        if len(self._idle) * READ_BYTES_MAX < IDLE_READ_BUFFERS_BYTES_MAX:
            self._idle.append(buffer)


@dataclasses.dataclass(frozen=True)
class Chunk:
    data: memoryview | bytes | None  # None: the end of the stream
    due_s: float  # event-loop time at which it may leave (its arrival, plus latencies)
    buffer: bytearray | None = None  # the read buffer that holds data (at least half full), owned


def _os_text(error: OSError) -> str:
    text = os.strerror(error.errno) if error.errno else str(error)
    return text[:1].lower() + text[1:]  # Go's errno texts start in lower case


async def resolve_address(address: str) -> tuple[str, int]:
    """The IP address and port a listen address stands for, as Go's net.ResolveTCPAddr finds them
    (IPv4 first); raises AddressError with Go's text."""
    if address == "":
        return DEFAULT_LISTEN_HOST, 0
    host, port = split_address(address)
    if host == "":
        return DEFAULT_LISTEN_HOST, port
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host)), port
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise AddressError(f"lookup {host}: {str(error.strerror).lower()}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0]), port


async def resolved_listen(address: str) -> str:
    """The listen address as a started proxy shows it ("localhost:80" → "127.0.0.1:80")."""
    return format_address(*await resolve_address(address))


class _Socket(asyncio.BufferedProtocol):
    """One TCP connection of a link: what it delivered (bounded) and a writer with back-pressure."""

    def __init__(self, buffers: ReadBuffers, on_connected: Callable[[_Socket], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffers = buffers
        self._reading: bytearray | None = None  # handed to the transport for the next read
        self.lost = False  # the connection is gone: nothing more can be written to it
        self._on_connected = on_connected
        self._on_lost: Callable[[_Socket], None] | None = None
        self._inbox: collections.deque[Chunk] = collections.deque()
        self._inbox_bytes = 0
        self._ended = False  # the end of the stream is in the inbox
        self._reading_paused = False
        self._readable: asyncio.Future[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    def watch(self, on_lost: Callable[[_Socket], None]) -> None:
        self._on_lost = on_lost

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self._on_connected is not None:
            self._on_connected(self)

    def get_buffer(self, sizehint: int) -> bytearray:
        if self._reading is None:
            self._reading = self.buffers.take()
        return self._reading

    def buffer_updated(self, nbytes: int) -> None:
        buffer, self._reading = self._reading, None
        assert buffer is not None
        now = asyncio.get_running_loop().time()
        if nbytes < COPY_BELOW_BYTES:
            chunk = Chunk(bytes(memoryview(buffer)[:nbytes]), now)
            self.buffers.give(buffer)
        else:
            chunk = Chunk(memoryview(buffer)[:nbytes], now, buffer)
        self._inbox.append(chunk)
        self._inbox_bytes += nbytes
        full = self._inbox_bytes >= PIPE_BUFFER_BYTES_MAX or len(self._inbox) >= PIPE_CHUNK_COUNT_MAX
        if full and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake_reader()

    def eof_received(self) -> bool:
        self._end()
        return True  # keep the connection open: the other stream may still write to it

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._writable.set()
        self._end()
        if self._on_lost is not None:
            self._on_lost(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # what pipes use
    async def get(self) -> Chunk:
        while not self._inbox:
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable
        chunk = self._inbox.popleft()
        if chunk.data is not None:
            self._inbox_bytes -= len(chunk.data)
            roomy = self._inbox_bytes <= PIPE_RESUME_BYTES and len(self._inbox) < PIPE_CHUNK_COUNT_MAX // 2
            if self._reading_paused and roomy and self.transport:
                self._reading_paused = False
                self.transport.resume_reading()
        return chunk

    async def write(self, data: memoryview | bytes) -> bool:
        """Writes, waiting while the transport's buffer is full; True when the transport kept part
        of the data (it may hold a view of it)."""
        if self.lost or self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(data)
        kept = self.transport.get_write_buffer_size() > 0
        await self._writable.wait()
        return kept

    def write_eof(self) -> None:
        transport = self.transport
        if transport is None or self.lost or transport.is_closing() or not transport.can_write_eof():
            return
        try:
            transport.write_eof()
        except OSError:  # the peer went away first (ENOTCONN): nothing is left to end
            pass

    def close(self, how: Close) -> None:
        transport = self.transport
        if transport is None:
            return
        if how is Close.GRACEFUL:
            transport.close()
            return
        if how is Close.RESET:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._inbox.append(Chunk(None, asyncio.get_running_loop().time()))
            self._wake_reader()

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class Pipe:
    """One stream of a link: its chunks, in order, through the stream's toxics, then out."""

    def __init__(self, link: Link, stream: Stream, source: _Socket, dest: _Socket) -> None:
        self.link = link
        self.stream = stream
        self.source = source
        self.dest = dest
        self.done = False  # the end of the stream was delivered
        self.task: asyncio.Task[None] | None = None
        self.state: dict[int, Any] = {}  # toxic position → what that toxic keeps per link
        self._buffer_kept = False  # a transport may hold a view of the current chunk's read buffer
        self._waiting: tuple[int, asyncio.Future[bool]] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(
            self._run(), name=f"toxiproxy {self.link.proxy.name} {self.stream.value}"
        )

    async def _run(self) -> None:
        try:
            while not self.link.closed:
                chunk = await self.source.get()
                self._buffer_kept = False
                try:
                    await self.emit_after(-1, chunk)
                finally:
                    if chunk.buffer is not None and not self._buffer_kept:
                        self.source.buffers.give(chunk.buffer)  # the chunk has left: reuse it
                if chunk.data is None:
                    break
            if not self.link.closed:
                self.dest.write_eof()
                self.done = True
                self.link.pipe_finished()
        except OSError:  # a socket failed under us: the connection ends, as when a peer resets it
            self.link.close(Close.GRACEFUL)
        except Exception:  # a bug ends this connection, never the server
            _log.exception("toxiproxy: %s pipe of proxy %s failed", self.stream.value, self.link.proxy.name)
            self.link.close(Close.ABORT)

    async def emit_after(self, position: int, chunk: Chunk) -> None:
        """Passes a chunk on to the toxics after `position` in the chain, then to the socket."""
        if self.link.closed:
            return
        toxic = self.link.next_toxic(self.stream, position)
        if toxic is not None:
            await TOXIC_STEPS[toxic.type](self, toxic, chunk)
        elif chunk.data is not None:
            if await self.dest.write(chunk.data):
                self._buffer_kept = True

    async def emit(self, toxic: Toxic, chunk: Chunk) -> None:
        await self.emit_after(toxic.position, chunk)

    def current(self, toxic: Toxic) -> Toxic | None:
        """The toxic's present version, None once it is removed or no longer applies here."""
        return self.link.toxic_at(self.stream, toxic.position)

    async def wait(self, toxic: Toxic, delay_s: float) -> bool:
        """Waits delay_s (inf: until interrupted); False when the toxic changed or went first.
        A wait shorter than the loop's timer granularity is not made: callers that wait often keep
        a schedule, so that such short waits add up to real ones."""
        if delay_s < TIMER_GRANULARITY_S:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(delay_s, _resolve, future, True) if math.isfinite(delay_s) else None
        self._waiting = (toxic.position, future)
        try:
            return await future
        finally:
            self._waiting = None
            if timer is not None:
                timer.cancel()

    def interrupt(self, positions: set[int]) -> None:
        if self._waiting is not None and self._waiting[0] in positions:
            _resolve(self._waiting[1], False)


# --- the toxics on the wire ---------------------------------------------------------------------


async def _noop(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    await pipe.emit(toxic, chunk)


async def _latency(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    if chunk.data is None:
        await pipe.emit(toxic, chunk)
        return
    jitter_ms = toxic.attributes["jitter"]
    delay_ms = toxic.attributes["latency"] + (
        pipe.link.rng.randrange(-jitter_ms, jitter_ms) if jitter_ms > 0 else 0
    )
    due_s = chunk.due_s + delay_ms / 1000
    await pipe.wait(toxic, due_s - asyncio.get_running_loop().time())
    await pipe.emit(toxic, Chunk(chunk.data, due_s))


async def _bandwidth(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    data = chunk.data
    if data is None:
        await pipe.emit(toxic, chunk)
        return
    loop = asyncio.get_running_loop()
    rate_bytes_per_ms = toxic.attributes["rate"]  # KB/s
    step_bytes = rate_bytes_per_ms * round(BANDWIDTH_STEP_S * 1000)
    while data:
        if rate_bytes_per_ms <= 0:  # nothing passes until the toxic changes
            await pipe.wait(toxic, math.inf)
            break
        piece = data[:step_bytes]
        ready_s = (
            max(loop.time(), pipe.state.get(toxic.position, 0.0)) + len(piece) / rate_bytes_per_ms / 1000
        )
        pipe.state[toxic.position] = ready_s
        if not await pipe.wait(toxic, ready_s - loop.time()):
            break
        await pipe.emit(toxic, Chunk(piece, chunk.due_s))
        data = data[len(piece) :]
    if data:  # interrupted: the rest passes at once, as Toxiproxy's does
        await pipe.emit(toxic, Chunk(data, chunk.due_s))


async def _slow_close(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    current: Toxic | None = toxic
    while chunk.data is None and current is not None:
        if await pipe.wait(current, current.attributes["delay"] / 1000):
            break
        current = pipe.current(current)  # updated: wait its new delay; removed: close now
    await pipe.emit(toxic, chunk)


async def _timeout(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    if chunk.data is None:
        await pipe.emit(toxic, chunk)
    # data is dropped; the link's timer closes the connection (see Link.refresh)


async def _reset_peer(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    await asyncio.sleep(toxic.attributes["timeout"] / 1000)  # not interrupted, as in Toxiproxy
    pipe.link.close(Close.RESET)


async def _limit_data(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    if chunk.data is None:
        await pipe.emit(toxic, chunk)
        return
    limit_bytes = toxic.attributes["bytes"]
    passed_bytes = pipe.state.get(toxic.position, 0)
    piece = chunk.data[: max(0, limit_bytes - passed_bytes)]
    if piece:
        await pipe.emit(toxic, Chunk(piece, chunk.due_s))
        pipe.state[toxic.position] = passed_bytes = passed_bytes + len(piece)
    if limit_bytes - passed_bytes <= 0:
        pipe.link.close(Close.GRACEFUL)


def slice_bounds(
    size: int, average_size: int, size_variation: int, rng: random.Random
) -> Iterator[tuple[int, int]]:
    """Toxiproxy's slicer: halves a chunk (the cut moved by up to ±size_variation) until each piece
    is at most average_size + size_variation bytes; pieces in order, never empty."""
    stack = [(0, size)]
    while stack:
        start, end = stack.pop()
        if end - start - average_size <= size_variation or end - start <= SLICE_BYTES_MIN:
            yield start, end
            continue
        middle = start + (end - start) // 2
        if size_variation > 0:
            middle += rng.randrange(-size_variation, size_variation)
        middle = min(max(middle, start + SLICE_BYTES_MIN), end - SLICE_BYTES_MIN)
        stack += [(middle, end), (start, middle)]


async def _slicer(pipe: Pipe, toxic: Toxic, chunk: Chunk) -> None:
    data = chunk.data
    if data is None:
        await pipe.emit(toxic, chunk)
        return
    attributes = toxic.attributes
    loop = asyncio.get_running_loop()
    next_s = loop.time()  # when the next piece may go: `delay` after the previous one, on average
    for start, end in slice_bounds(
        len(data), attributes["average_size"], attributes["size_variation"], pipe.link.rng
    ):
        await pipe.emit(toxic, Chunk(data[start:end], chunk.due_s))
        next_s = max(next_s, loop.time() - TIMER_GRANULARITY_S) + attributes["delay"] / 1_000_000
        if not await pipe.wait(toxic, next_s - loop.time()):
            if end < len(data):  # interrupted: the rest passes in one piece
                await pipe.emit(toxic, Chunk(data[end:], chunk.due_s))
            return


TOXIC_STEPS: dict[str, Callable[[Pipe, Toxic, Chunk], Awaitable[None]]] = {
    "noop": _noop,
    "latency": _latency,
    "bandwidth": _bandwidth,
    "slow_close": _slow_close,
    "timeout": _timeout,
    "reset_peer": _reset_peer,
    "slicer": _slicer,
    "limit_data": _limit_data,
}


# --- links and listeners ------------------------------------------------------------------------


class Link:
    """One client connection through a proxy: two pipes, the toxicity rolls and timeout timers."""

    def __init__(self, proxy: Proxy, client: _Socket) -> None:
        self.proxy = proxy
        self.rng = proxy.rng
        self.closed = False
        self._client = client
        self._upstream: _Socket | None = None
        self._pipes: dict[Stream, Pipe] = {}
        self._connecting: asyncio.Task[None] | None = None
        self._active: dict[int, bool] = {}  # toxic key → this link rolled it active
        self._timers: dict[int, asyncio.TimerHandle] = {}  # timeout toxic key → its close

    def connect(self) -> None:
        self._client.watch(self._lost)
        self._connecting = asyncio.create_task(self._connect(), name=f"toxiproxy {self.proxy.name} connect")

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            host, port = split_address(self.proxy.upstream)
            _, upstream = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Socket(self.proxy.buffers), host or DEFAULT_LISTEN_HOST, port
                ),
                UPSTREAM_CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError, AddressError, ValueError):
            self.close(Close.GRACEFUL)  # the upstream cannot be reached: drop the client, as Toxiproxy
            return
        if self.closed:
            upstream.close(Close.GRACEFUL)
            return
        self._upstream = upstream
        upstream.watch(self._lost)
        self._pipes = {
            Stream.UPSTREAM: Pipe(self, Stream.UPSTREAM, self._client, upstream),
            Stream.DOWNSTREAM: Pipe(self, Stream.DOWNSTREAM, upstream, self._client),
        }
        self.refresh(set(), close=False)
        for pipe in self._pipes.values():
            pipe.start()

    def next_toxic(self, stream: Stream, after_position: int) -> Toxic | None:
        """The first toxic of the stream's chain after that position which applies to this link."""
        for toxic in self.proxy.toxics:
            if toxic.stream is stream and toxic.position > after_position and self._applies(toxic):
                return toxic
        return None

    def toxic_at(self, stream: Stream, position: int) -> Toxic | None:
        for toxic in self.proxy.toxics:
            if toxic.stream is stream and toxic.position == position:
                return toxic if self._applies(toxic) else None
        return None

    def _applies(self, toxic: Toxic) -> bool:
        active = self._active.get(toxic.key)
        if active is None:
            active = self._active[toxic.key] = self.rng.random() < toxic.toxicity
        return active

    def refresh(self, changed_positions: set[int], close: bool) -> None:
        """Applies the proxy's toxics as they are now: ends waits on changed or removed toxics,
        re-arms timeout timers; close: a timeout toxic was removed (Toxiproxy closes the link)."""
        if self.closed or not self._pipes:
            return
        if close:
            self.close(Close.GRACEFUL)
            return
        keys = {toxic.key for toxic in self.proxy.toxics}
        self._active = {key: active for key, active in self._active.items() if key in keys}
        for key in [key for key in self._timers if key not in keys]:
            self._timers.pop(key).cancel()
        loop = asyncio.get_running_loop()
        for toxic in self.proxy.toxics:
            timeout_ms = toxic.attributes.get("timeout", 0)
            if (
                toxic.type == "timeout"
                and timeout_ms > 0
                and toxic.key not in self._timers
                and self._applies(toxic)
            ):
                self._timers[toxic.key] = loop.call_later(timeout_ms / 1000, self.close, Close.GRACEFUL)
        for pipe in self._pipes.values():
            pipe.interrupt(changed_positions)

    def pipe_finished(self) -> None:
        if all(pipe.done for pipe in self._pipes.values()):
            self.close(Close.GRACEFUL)

    def _lost(self, lost: _Socket) -> None:
        """A socket went away: nothing more can be written to it; the other stream ends normally."""
        for pipe in self._pipes.values():
            if pipe.dest is lost and not pipe.done:
                pipe.done = True
                if pipe.task is not None and pipe.task is not asyncio.current_task():
                    pipe.task.cancel()
        if not self._pipes:
            self.close(Close.GRACEFUL)
        else:
            self.pipe_finished()

    def close(self, how: Close = Close.GRACEFUL) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.links.discard(self)
        for timer in self._timers.values():
            timer.cancel()
        current = asyncio.current_task()
        tasks = [self._connecting, *(pipe.task for pipe in self._pipes.values())]
        for task in tasks:
            if task is not None and task is not current:
                task.cancel()
        for sock in (self._client, self._upstream):
            if sock is not None:
                sock.close(how)


class Proxy:
    """A listener that pipes each accepted connection to the upstream through the toxics."""

    def __init__(
        self, name: str, listen: str, upstream: str, rng: random.Random, buffers: ReadBuffers
    ) -> None:
        self.name = name
        self.buffers = buffers
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: list[Toxic] = []  # in chain order (by position)
        self.links: set[Link] = set()
        self.rng = rng
        self._server: asyncio.Server | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        }

    def toxics_json(self) -> list[dict[str, Any]]:
        """Upstream toxics first, then downstream, each stream in chain order (as Toxiproxy lists)."""
        ordered = sorted(self.toxics, key=lambda toxic: (toxic.stream is not Stream.UPSTREAM, toxic.position))
        return [toxic.to_json() for toxic in ordered]

    async def start(self) -> None:
        """Listens; raises ListenError with Go's text when it cannot."""
        try:
            host, port = await resolve_address(self.listen)
        except AddressError as error:
            raise ListenError(f"listen tcp: {error}") from None
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Socket(self.buffers, on_connected=self._accepted), host, port, reuse_address=True
            )
        except OSError as error:
            raise ListenError(f"listen tcp {format_address(host, port)}: bind: {_os_text(error)}") from None
        bound = self._server.sockets[0].getsockname()
        self.listen = format_address(bound[0], bound[1])  # port 0 becomes the real port
        self.enabled = True

    def stop(self, how: Close = Close.GRACEFUL) -> None:
        """Stops listening and closes every connection through this proxy."""
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self.links):
            link.close(how)

    def toxics_changed(self, changed_positions: set[int], close: bool = False) -> None:
        for link in list(self.links):
            link.refresh(changed_positions, close)

    def _accepted(self, client: _Socket) -> None:
        if not self.enabled or len(self.links) >= LINK_COUNT_MAX:
            client.close(Close.GRACEFUL)
            return
        link = Link(self, client)
        self.links.add(link)
        link.connect()

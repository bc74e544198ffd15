"""A Toxiproxy-compatible TCP fault proxy for the chaos suite.

No Toxiproxy binary can be installed where the chaos suite runs, so this module is a small
server that speaks the HTTP API of Toxiproxy 2.x (`toxiproxy-server`), enough for the
official `toxiproxy-python` 0.1.1 client and for raw HTTP:

- proxies: GET/POST /proxies, POST /populate (create or update), GET/POST/PATCH/DELETE
  /proxies/{name} (update: enabled, listen, upstream), POST /reset, GET /version (plain text);
- toxics: GET/POST /proxies/{name}/toxics, GET/POST/PATCH/DELETE /proxies/{name}/toxics/{toxic};
  types latency, bandwidth, slow_close, timeout, reset_peer, slicer and limit_data. Adding,
  updating or removing a toxic acts on existing connections too. Toxicity is the probability
  that a connection gets the toxic, rolled once per connection and toxic.

One asyncio event loop, in one daemon thread, serves the API and every proxied stream.
Everything listens on 127.0.0.1 unless told otherwise; proxies, toxics, connections and request
sizes are bounded.

Differences from Toxiproxy: each chunk passes all of a stream's toxics in one step (latencies of
several latency toxics add up); timeout and reset_peer timers start when the toxic reaches the
connection (when either is added, or when the connection opens), and reset_peer resets both
sockets; a busy listen address answers 500 (as Toxiproxy does); unknown fields and attributes are
refused (400) instead of ignored. Not implemented: the JSON /version and /metrics endpoints of
later releases, custom toxic types and "noop", hostnames in listen addresses, chunked request bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import enum
import functools
import http
import ipaddress
import itertools
import json
import logging
import os
import random
import signal
import socket
import struct
import sys
import threading
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

VERSION = "2.1.4"  # the 2.1.x line that toxiproxy-python 0.1.1 targets (it reads /version raw)
DEFAULT_LISTEN = "127.0.0.1:8474"

PROXY_COUNT_MAX = 1000
TOXIC_COUNT_MAX = 64  # per proxy
LINK_COUNT_MAX = 4096  # live client connections per proxy
API_CONNECTION_COUNT_MAX = 256
REQUEST_HEAD_BYTES_MAX = 16 * 1024
REQUEST_HEADER_COUNT_MAX = 100
REQUEST_BODY_BYTES_MAX = 1024 * 1024
CONFIG_BYTES_MAX = 16 * 1024 * 1024
NAME_LENGTH_MAX = 200
ATTRIBUTE_VALUE_MAX = 2**53
CHUNK_BYTES_MAX = 32 * 1024
PIPE_QUEUE_CHUNKS_MAX = 16
API_IDLE_TIMEOUT_S = 60.0
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0

_log = logging.getLogger(__name__)
_toxic_keys = itertools.count(1)  # a fresh key per created or updated toxic


class ToxiproxyError(Exception):
    """The server cannot start, or a request cannot be served."""


class ApiError(ToxiproxyError):
    """A request failed; answered as {"error": message, "status": status}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Stream(enum.Enum):
    UPSTREAM = "upstream"  # client → server
    DOWNSTREAM = "downstream"  # server → client


class _Close(enum.Enum):
    GRACEFUL = "graceful"  # flush what is buffered, then FIN
    ABORT = "abort"  # drop buffered data (server shutdown)
    RESET = "reset"  # RST: SO_LINGER 0 (reset_peer toxic)


_TOXIC_FIELDS = frozenset({"name", "type", "stream", "toxicity", "attributes"})
# A proxy's "toxics" is accepted and ignored (as by Toxiproxy), so a GET answer can be posted back.
_PROXY_FIELDS = frozenset({"name", "listen", "upstream", "enabled", "toxics"})

# The attributes of each toxic type with their defaults: integers, never negative.
_TOXIC_ATTRIBUTES: dict[str, dict[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},  # ms
    "bandwidth": {"rate": 0},  # KB/s; 0 = unlimited
    "slow_close": {"delay": 0},  # ms
    "timeout": {"timeout": 0},  # ms; 0 = hold forever
    "reset_peer": {"timeout": 0},  # ms
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},  # bytes, bytes, µs
    "limit_data": {"bytes": 0},
}


@dataclasses.dataclass(frozen=True)
class Toxic:
    name: str
    type: str
    stream: Stream
    toxicity: float
    attributes: dict[str, int]
    key: int  # changes on update, so that links re-roll toxicity and re-arm timers

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream.value,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


@dataclasses.dataclass(frozen=True)
class _ProxySpec:
    name: str | None
    listen: str | None
    upstream: str | None
    enabled: bool | None


# --- validation ---------------------------------------------------------------------------------


def _split_address(address: object, what: str) -> tuple[str, int]:
    if not isinstance(address, str) or ":" not in address:
        raise ApiError(400, f"{what} must be a 'host:port' string, got {address!r}")
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ApiError(400, f"{what} port must be a number 0..65535, got {port_text!r}")
    return host, int(port_text)


def _parse_listen(listen: object) -> tuple[str, int]:
    host, port = _split_address(listen, "listen")
    if host in ("", "localhost"):
        host = "127.0.0.1"  # never every interface unless asked by address
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ApiError(400, f"listen host must be an IP address or localhost, got {host!r}") from None
    return host, port


def _check_upstream(upstream: object) -> None:
    host, port = _split_address(upstream, "upstream")
    if not host or port == 0:
        raise ApiError(400, f"upstream must name a host and a port 1..65535, got {upstream!r}")


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_name(value: object, what: str) -> str:
    if value is None or value == "":
        raise ApiError(400, f"missing required field: {what}")
    if not isinstance(value, str) or len(value) > NAME_LENGTH_MAX or "/" in value or not value.isprintable():
        raise ApiError(
            400,
            f"{what} must be a string of 1..{NAME_LENGTH_MAX} printable characters "
            f"without '/', got {value!r}",
        )
    return value


def _check_object(body: object, allowed: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"a {what} must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"unknown {what} field {unknown[0]!r}; expected {', '.join(sorted(allowed))}")
    return body


def _check_stream(value: object) -> Stream:
    try:
        return Stream(value)
    except ValueError:
        message = f"stream was invalid, can be either upstream or downstream, got {value!r}"
        raise ApiError(400, message) from None


def _check_toxicity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ApiError(400, f"toxicity must be a number between 0 and 1, got {value!r}")
    return float(value)


def _check_attributes(toxic_type: str, given: object, base: dict[str, int]) -> dict[str, int]:
    if not isinstance(given, dict):
        raise ApiError(400, f"attributes must be a JSON object, got {given!r}")
    allowed = _TOXIC_ATTRIBUTES[toxic_type]
    merged = dict(base)
    for key, value in given.items():
        if key not in allowed:
            raise ApiError(
                400, f"unknown attribute {key!r} for a {toxic_type} toxic; expected {', '.join(allowed)}"
            )
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ATTRIBUTE_VALUE_MAX:
            raise ApiError(
                400, f"{toxic_type} attribute {key!r} must be a non-negative integer, got {value!r}"
            )
        merged[key] = value
    if toxic_type == "slicer" and not merged["size_variation"] < merged["average_size"]:
        raise ApiError(
            400,
            "slicer attribute average_size must be greater than size_variation, got "
            f"average_size={merged['average_size']}, size_variation={merged['size_variation']}",
        )
    return merged


def _field(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key)
    return default if value is None else value


def _new_toxic(body: object) -> Toxic:
    fields = _check_object(body, _TOXIC_FIELDS, "toxic")
    toxic_type = fields.get("type")
    if toxic_type not in _TOXIC_ATTRIBUTES:
        expected = ", ".join(_TOXIC_ATTRIBUTES)
        raise ApiError(400, f"invalid toxic type {toxic_type!r}; expected one of {expected}")
    stream = _check_stream(_field(fields, "stream", Stream.DOWNSTREAM.value))
    return Toxic(
        name=_check_name(fields.get("name") or f"{toxic_type}_{stream.value}", "toxic name"),
        type=toxic_type,
        stream=stream,
        toxicity=_check_toxicity(_field(fields, "toxicity", 1.0)),
        attributes=_check_attributes(
            toxic_type, _field(fields, "attributes", {}), _TOXIC_ATTRIBUTES[toxic_type]
        ),
        key=next(_toxic_keys),
    )


def _updated_toxic(toxic: Toxic, body: object) -> Toxic:
    """A toxic's toxicity and attributes can change (attributes merge); its identity cannot."""
    fields = _check_object(body, _TOXIC_FIELDS, "toxic")
    for field, current in (("name", toxic.name), ("type", toxic.type), ("stream", toxic.stream.value)):
        if fields.get(field) not in (None, current):
            raise ApiError(
                400, f"a toxic's {field} cannot change (is {current!r}); delete it and add another"
            )
    return dataclasses.replace(
        toxic,
        toxicity=_check_toxicity(_field(fields, "toxicity", toxic.toxicity)),
        attributes=_check_attributes(toxic.type, _field(fields, "attributes", {}), toxic.attributes),
        key=next(_toxic_keys),
    )


def _proxy_spec(body: object, creating: bool) -> _ProxySpec:
    fields = _check_object(body, _PROXY_FIELDS, "proxy")
    name = _check_name(fields.get("name"), "name") if creating else None
    listen, upstream, enabled = fields.get("listen"), fields.get("upstream"), fields.get("enabled")
    if listen is not None:
        _parse_listen(listen)
    if upstream is None and creating:
        raise ApiError(400, "missing required field: upstream")
    if upstream is not None:
        _check_upstream(upstream)
    if enabled is not None and not isinstance(enabled, bool):
        raise ApiError(400, f"enabled must be true or false, got {enabled!r}")
    return _ProxySpec(name=name, listen=listen, upstream=upstream, enabled=enabled)


def _refuse_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"bad request body: {error}") from None


def _os_reason(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else str(error)


# --- the data path ------------------------------------------------------------------------------


def _close_writer(writer: asyncio.StreamWriter, how: _Close) -> None:
    if how is _Close.GRACEFUL:
        writer.close()
        return
    if how is _Close.RESET:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _cut(data: bytes, average_size: int, size_variation: int, rng: random.Random) -> list[bytes]:
    pieces, start = [], 0
    while start < len(data):
        size = average_size + rng.randint(-size_variation, size_variation)  # ≥ 1: variation < average
        pieces.append(data[start : start + size])
        start += size
    return pieces


class _Pipe:
    """One direction of a link: reads chunks, passes them through the stream's toxics, writes them."""

    def __init__(
        self, link: _Link, stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.link = link
        self.stream = stream
        self.reader = reader
        self.writer = writer
        self.queue: asyncio.Queue[tuple[bytes, float] | None] = asyncio.Queue(PIPE_QUEUE_CHUNKS_MAX)
        self.tasks: list[asyncio.Task[None]] = []
        self.done = False  # end of stream delivered

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._guard(self._read_loop())),
            asyncio.create_task(self._guard(self._write_loop())),
        ]

    async def _guard(self, work: Awaitable[None]) -> None:
        try:
            await work
        except OSError:  # a peer reset or went away: the whole connection ends
            self.link.close()
        except Exception:  # a bug ends this connection, never the server
            _log.exception("toxiproxy: %s pipe of proxy %s failed", self.stream.value, self.link.proxy.name)
            self.link.close(_Close.ABORT)

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while data := await self.reader.read(CHUNK_BYTES_MAX):
            await self.queue.put((data, loop.time()))  # bounded: back-pressure on the reader
        await self.queue.put(None)

    async def _write_loop(self) -> None:
        while (item := await self.queue.get()) is not None:
            await self._deliver(*item)
            if self.link.closed:
                return
        toxics = self.link.active_toxics(self.stream)
        await asyncio.sleep(sum(t.attributes["delay"] for t in toxics if t.type == "slow_close") / 1000)
        self.done = True
        if self.writer.can_write_eof():
            self.writer.write_eof()
        self.link.pipe_finished()

    async def _deliver(self, data: bytes, arrival_s: float) -> None:
        toxics = self.link.active_toxics(self.stream)
        if any(t.type == "timeout" for t in toxics):
            return  # a timeout toxic drops data until it is removed
        rng = self.link.proxy.rng
        delay_ms = 0
        for toxic in (t for t in toxics if t.type == "latency"):
            jitter_ms = toxic.attributes["jitter"]
            delay_ms += max(0, toxic.attributes["latency"] + rng.randint(-jitter_ms, jitter_ms))
        if delay_ms:
            await asyncio.sleep(max(0.0, arrival_s + delay_ms / 1000 - asyncio.get_running_loop().time()))
        data, close_after = self.link.limit(data, toxics)
        pieces, gap_s = [data], 0.0
        for toxic in (t for t in toxics if t.type == "slicer"):
            attributes = toxic.attributes
            pieces = [
                cut
                for piece in pieces
                for cut in _cut(piece, attributes["average_size"], attributes["size_variation"], rng)
            ]
            gap_s += attributes["delay"] / 1_000_000
        rates = [t.attributes["rate"] for t in toxics if t.type == "bandwidth" and t.attributes["rate"] > 0]
        for index, piece in enumerate(pieces):
            if index and gap_s:
                await asyncio.sleep(gap_s)
            await self._write(piece, min(rates, default=0))
        if close_after:
            self.link.close()

    async def _write(self, data: bytes, rate_bytes_per_ms: int) -> None:
        """Writes data, at most rate_bytes_per_ms (= KB/s) when that is not 0, in 100 ms steps."""
        step_bytes = rate_bytes_per_ms * 100 if rate_bytes_per_ms else max(1, len(data))
        for start in range(0, len(data), step_bytes):
            piece = data[start : start + step_bytes]
            if rate_bytes_per_ms:
                await asyncio.sleep(len(piece) / rate_bytes_per_ms / 1000)
            self.writer.write(piece)
            await self.writer.drain()


class _Link:
    """One client connection through a proxy: two pipes, and the timers of its toxics."""

    def __init__(
        self,
        proxy: _Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.closed = False
        self._writers = (client[1], upstream[1])
        self._pipes = (
            _Pipe(self, Stream.UPSTREAM, client[0], upstream[1]),
            _Pipe(self, Stream.DOWNSTREAM, upstream[0], client[1]),
        )
        self._active: dict[int, bool] = {}  # toxic key → the toxic applies to this link
        self._timers: dict[int, asyncio.Task[None]] = {}  # toxic key → timeout or reset_peer timer
        self._bytes_passed: dict[str, int] = {}  # limit_data toxic name → bytes it let through

    def start(self) -> None:
        for pipe in self._pipes:
            pipe.start()
        self.refresh_toxics()

    def active_toxics(self, stream: Stream) -> list[Toxic]:
        return [t for t in self.proxy.toxics if t.stream is stream and self._is_active(t)]

    def _is_active(self, toxic: Toxic) -> bool:
        active = self._active.get(toxic.key)
        if active is None:
            active = self._active[toxic.key] = self.proxy.rng.random() < toxic.toxicity
        return active

    def refresh_toxics(self) -> None:
        """Applies the proxy's current toxics to this live connection."""
        toxics = {t.key: t for t in self.proxy.toxics}
        for key in [k for k in self._active if k not in toxics]:
            del self._active[key]
        for key in [k for k in self._timers if k not in toxics]:
            self._timers.pop(key).cancel()
        names = {t.name for t in toxics.values()}
        self._bytes_passed = {name: count for name, count in self._bytes_passed.items() if name in names}
        for toxic in toxics.values():
            if self.closed or not self._is_active(toxic):
                continue
            passed_bytes = self._bytes_passed.get(toxic.name, 0)
            if toxic.type == "limit_data" and passed_bytes >= toxic.attributes["bytes"]:
                self.close()
            elif toxic.key not in self._timers and (
                toxic.type == "reset_peer" or (toxic.type == "timeout" and toxic.attributes["timeout"] > 0)
            ):
                self._timers[toxic.key] = asyncio.create_task(self._expire(toxic))

    async def _expire(self, toxic: Toxic) -> None:
        await asyncio.sleep(toxic.attributes["timeout"] / 1000)
        self.close(_Close.RESET if toxic.type == "reset_peer" else _Close.GRACEFUL)

    def limit(self, data: bytes, toxics: list[Toxic]) -> tuple[bytes, bool]:
        """Cuts data to what the limit_data toxics still let through; True: close after it."""
        close_after = False
        for toxic in (t for t in toxics if t.type == "limit_data"):
            passed = self._bytes_passed.get(toxic.name, 0)
            data = data[: max(0, toxic.attributes["bytes"] - passed)]
            self._bytes_passed[toxic.name] = passed + len(data)
            close_after = close_after or passed + len(data) >= toxic.attributes["bytes"]
        return data, close_after

    def pipe_finished(self) -> None:
        if all(pipe.done for pipe in self._pipes):
            self.close()

    def close(self, how: _Close = _Close.GRACEFUL) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.links.discard(self)
        current = asyncio.current_task()
        for task in [*self._timers.values(), *(task for pipe in self._pipes for task in pipe.tasks)]:
            if task is not current:
                task.cancel()
        for writer in self._writers:
            _close_writer(writer, how)


class _Proxy:
    """A listener that pipes each accepted connection to the upstream through the toxics."""

    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: list[Toxic] = []
        self.links: set[_Link] = set()
        self.rng = rng
        self._server: asyncio.Server | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [toxic.to_json() for toxic in self.toxics],
        }

    async def start(self) -> None:
        if self._server is not None:
            return
        host, port = _parse_listen(self.listen)
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as error:
            reason = _os_reason(error)
            raise ApiError(500, f"proxy {self.name} cannot listen on {self.listen}: {reason}") from None
        bound = self._server.sockets[0].getsockname()
        self.listen = _format_address(bound[0], bound[1])  # port 0 becomes the real port, kept on re-enable
        self.enabled = True

    async def stop(self, how: _Close = _Close.GRACEFUL) -> None:
        """Stops listening and closes every connection through this proxy."""
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self.links):
            link.close(how)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), STOP_TIMEOUT_S)

    def toxics_changed(self) -> None:
        for link in list(self.links):
            link.refresh_toxics()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.enabled or len(self.links) >= LINK_COUNT_MAX:
            writer.close()
            return
        host, port = _split_address(self.upstream, "upstream")
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(host, port), UPSTREAM_CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            writer.close()  # the upstream refuses: drop the client, as Toxiproxy does
            return
        except asyncio.CancelledError:  # shutdown; returning (not raising) keeps 3.11's stream callback quiet
            writer.transport.abort()
            return
        if not self.enabled:  # disabled while connecting
            upstream[1].close()
            writer.close()
            return
        link = _Link(self, (reader, writer), upstream)
        self.links.add(link)
        link.start()


# --- the API ------------------------------------------------------------------------------------


class _Registry:
    """The proxies and their toxics; every operation runs on the event loop, one at a time."""

    def __init__(self, rng: random.Random) -> None:
        self.proxies: dict[str, _Proxy] = {}
        self.lock = asyncio.Lock()
        self._rng = rng

    def get(self, name: str) -> _Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def create(self, body: object) -> dict[str, Any]:
        spec = _proxy_spec(body, creating=True)
        assert spec.name is not None
        if spec.name in self.proxies:
            raise ApiError(409, "proxy already exists")
        if len(self.proxies) >= PROXY_COUNT_MAX:
            raise ApiError(400, f"too many proxies: at most {PROXY_COUNT_MAX}")
        return await self._create(spec)

    async def _create(self, spec: _ProxySpec) -> dict[str, Any]:
        assert spec.name is not None and spec.upstream is not None
        proxy = _Proxy(spec.name, spec.listen or "127.0.0.1:0", spec.upstream, self._rng)
        if spec.enabled is not False:
            await proxy.start()
        self.proxies[spec.name] = proxy
        return proxy.to_json()

    async def update(self, proxy: _Proxy, spec: _ProxySpec) -> dict[str, Any]:
        moved = spec.listen not in (None, proxy.listen) or spec.upstream not in (None, proxy.upstream)
        enabled = proxy.enabled if spec.enabled is None else spec.enabled
        if moved or not enabled:
            await proxy.stop()
        proxy.listen = spec.listen or proxy.listen
        proxy.upstream = spec.upstream or proxy.upstream
        if enabled:
            await proxy.start()
        return proxy.to_json()

    async def populate(self, body: object) -> list[dict[str, Any]]:
        if not isinstance(body, list):
            raise ApiError(400, "populate expects a JSON list of proxies")
        specs = [_proxy_spec(item, creating=True) for item in body]  # all valid before any change
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ApiError(400, "populate list names a proxy twice")
        if len(self.proxies) + len(set(names) - set(self.proxies)) > PROXY_COUNT_MAX:
            raise ApiError(400, f"too many proxies: at most {PROXY_COUNT_MAX}")
        populated = []
        for spec in specs:
            assert spec.name is not None
            existing = self.proxies.get(spec.name)
            populated.append(await (self._create(spec) if existing is None else self.update(existing, spec)))
        return populated

    async def delete(self, name: str) -> None:
        await self.get(name).stop()
        del self.proxies[name]

    async def reset(self) -> None:
        """Enables every proxy and removes every toxic."""
        failure: ApiError | None = None
        for proxy in self.proxies.values():
            proxy.toxics.clear()
            proxy.toxics_changed()
            try:
                await proxy.start()
            except ApiError as error:
                failure = failure or error
        if failure is not None:
            raise failure

    async def shutdown(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop(_Close.ABORT)

    def add_toxic(self, proxy: _Proxy, body: object) -> dict[str, Any]:
        toxic = _new_toxic(body)
        if any(t.name == toxic.name for t in proxy.toxics):
            raise ApiError(409, "toxic already exists")
        if len(proxy.toxics) >= TOXIC_COUNT_MAX:
            raise ApiError(400, f"too many toxics on proxy {proxy.name}: at most {TOXIC_COUNT_MAX}")
        proxy.toxics.append(toxic)
        proxy.toxics_changed()
        return toxic.to_json()

    @staticmethod
    def find_toxic(proxy: _Proxy, name: str) -> int:
        for index, toxic in enumerate(proxy.toxics):
            if toxic.name == name:
                return index
        raise ApiError(404, "toxic not found")

    def update_toxic(self, proxy: _Proxy, name: str, body: object) -> dict[str, Any]:
        index = self.find_toxic(proxy, name)
        proxy.toxics[index] = _updated_toxic(proxy.toxics[index], body)
        proxy.toxics_changed()
        return proxy.toxics[index].to_json()

    def delete_toxic(self, proxy: _Proxy, name: str) -> None:
        del proxy.toxics[self.find_toxic(proxy, name)]
        proxy.toxics_changed()


@dataclasses.dataclass(frozen=True)
class _Request:
    method: str
    target: str
    body: bytes
    keep_alive: bool


@dataclasses.dataclass(frozen=True)
class _Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"


def _json_response(status: int, value: Any) -> _Response:
    return _Response(status, json.dumps(value).encode())


def _error_response(error: ApiError) -> _Response:
    return _json_response(error.status, {"error": error.message, "status": error.status})


def _encode_response(response: _Response, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {response.status} {http.HTTPStatus(response.status).phrase}"]
    if response.status != 204:
        lines += [f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}"]
    lines.append(f"Connection: {'keep-alive' if keep_alive else 'close'}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Request | None:
    """The next request on a connection, None when the client closed it between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")  # the reader's limit bounds the head
    except asyncio.IncompleteReadError as error:
        if not error.partial.strip():
            return None
        raise ApiError(400, "incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise ApiError(431, f"request head larger than {REQUEST_HEAD_BYTES_MAX} bytes") from None
    lines = head.decode("latin-1").split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3 or request_line[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise ApiError(400, f"malformed request line {lines[0]!r}")
    method, target, version = request_line
    header_lines = [line for line in lines[1:] if line]
    if len(header_lines) > REQUEST_HEADER_COUNT_MAX:
        raise ApiError(431, f"more than {REQUEST_HEADER_COUNT_MAX} request headers")
    headers = {}
    for line in header_lines:
        name, separator, value = line.partition(":")
        if not separator:
            raise ApiError(400, f"malformed header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise ApiError(411, "chunked request bodies are not supported; send Content-Length")
    length_text = headers.get("content-length", "0")
    if not (length_text.isascii() and length_text.isdigit()):
        raise ApiError(400, f"bad Content-Length {length_text!r}")
    if int(length_text) > REQUEST_BODY_BYTES_MAX:
        raise ApiError(413, f"request body larger than {REQUEST_BODY_BYTES_MAX} bytes")
    if int(length_text) and headers.get("expect", "").lower() == "100-continue":  # curl, for bodies > 1 KiB
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    try:
        body = await reader.readexactly(int(length_text))
    except asyncio.IncompleteReadError:
        raise ApiError(400, "incomplete request body") from None
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return _Request(method, target, body, keep_alive)


_Handler = Callable[[bytes], Awaitable[_Response]]


class _Api:
    """Maps HTTP requests to registry operations."""

    def __init__(self, registry: _Registry) -> None:
        self.registry = registry
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or len(self._connections) >= API_CONNECTION_COUNT_MAX:
            writer.transport.abort()
            return
        self._connections[task] = writer
        try:
            await self._serve_requests(reader, writer)
        except (OSError, TimeoutError):
            pass  # the client went away or idled out
        finally:
            self._connections.pop(task, None)
            writer.close()

    async def _serve_requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        keep_alive = True
        while keep_alive:
            try:
                request = await asyncio.wait_for(_read_request(reader, writer), API_IDLE_TIMEOUT_S)
            except ApiError as error:  # the stream is out of step: answer and hang up
                request, response, keep_alive = None, _error_response(error), False
            else:
                if request is None:
                    return
                response, keep_alive = await self._respond(request), request.keep_alive
            writer.write(_encode_response(response, keep_alive))
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)

    async def close(self) -> None:
        # Aborting makes each handler read EOF and return: on Python 3.11 the stream server logs a
        # traceback for every handler task that ends cancelled.
        for writer in self._connections.values():
            writer.transport.abort()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=STOP_TIMEOUT_S)
        await self.registry.shutdown()

    async def _respond(self, request: _Request) -> _Response:
        try:
            handler = self._route(request.method, request.target)
            async with self.registry.lock:
                return await handler(request.body)
        except ApiError as error:
            return _error_response(error)
        except Exception:  # a bug answers 500 and never takes the server down
            _log.exception("toxiproxy: %s %s failed", request.method, request.target)
            return _error_response(ApiError(500, "internal error"))

    def _route(self, method: str, target: str) -> _Handler:
        path = urllib.parse.urlsplit(target).path
        segments = [urllib.parse.unquote(segment) for segment in path.strip("/").split("/")]
        routes: dict[str, Callable[..., Awaitable[_Response]]]
        names: list[str] = segments[1:2] + segments[3:4]
        match segments:
            case ["version"]:
                routes = {"GET": self._version}
            case ["reset"]:
                routes = {"POST": self._reset}
            case ["populate"]:
                routes = {"POST": self._populate}
            case ["proxies"]:
                routes = {"GET": self._list_proxies, "POST": self._create_proxy}
            case ["proxies", _]:
                routes = {
                    "GET": self._show_proxy,
                    "POST": self._update_proxy,
                    "PATCH": self._update_proxy,
                    "DELETE": self._delete_proxy,
                }
            case ["proxies", _, "toxics"]:
                routes = {"GET": self._list_toxics, "POST": self._create_toxic}
            case ["proxies", _, "toxics", _]:
                routes = {
                    "GET": self._show_toxic,
                    "POST": self._update_toxic,
                    "PATCH": self._update_toxic,
                    "DELETE": self._delete_toxic,
                }
            case _:
                raise ApiError(404, f"no such endpoint: {path}")
        if method not in routes:
            raise ApiError(405, f"method {method} not allowed on {path}; allowed: {', '.join(routes)}")
        return functools.partial(routes[method], *names)

    async def _version(self, body: bytes) -> _Response:
        return _Response(200, VERSION.encode(), "text/plain")

    async def _reset(self, body: bytes) -> _Response:
        await self.registry.reset()
        return _Response(204)

    async def _populate(self, body: bytes) -> _Response:
        return _json_response(201, {"proxies": await self.registry.populate(_parse_json(body))})

    async def _list_proxies(self, body: bytes) -> _Response:
        return _json_response(200, {name: proxy.to_json() for name, proxy in self.registry.proxies.items()})

    async def _create_proxy(self, body: bytes) -> _Response:
        return _json_response(201, await self.registry.create(_parse_json(body)))

    async def _show_proxy(self, name: str, body: bytes) -> _Response:
        return _json_response(200, self.registry.get(name).to_json())

    async def _update_proxy(self, name: str, body: bytes) -> _Response:
        proxy = self.registry.get(name)
        return _json_response(200, await self.registry.update(proxy, _proxy_spec(_parse_json(body), False)))

    async def _delete_proxy(self, name: str, body: bytes) -> _Response:
        await self.registry.delete(name)
        return _Response(204)

    async def _list_toxics(self, name: str, body: bytes) -> _Response:
        return _json_response(200, [toxic.to_json() for toxic in self.registry.get(name).toxics])

    async def _create_toxic(self, name: str, body: bytes) -> _Response:
        return _json_response(200, self.registry.add_toxic(self.registry.get(name), _parse_json(body)))

    async def _show_toxic(self, name: str, toxic: str, body: bytes) -> _Response:
        proxy = self.registry.get(name)
        return _json_response(200, proxy.toxics[self.registry.find_toxic(proxy, toxic)].to_json())

    async def _update_toxic(self, name: str, toxic: str, body: bytes) -> _Response:
        proxy = self.registry.get(name)
        return _json_response(200, self.registry.update_toxic(proxy, toxic, _parse_json(body)))

    async def _delete_toxic(self, name: str, toxic: str, body: bytes) -> _Response:
        self.registry.delete_toxic(self.registry.get(name), toxic)
        return _Response(204)


# --- the server ---------------------------------------------------------------------------------


class ToxiproxyServer:
    """A Toxiproxy-compatible server on its own event loop thread; start() returns once it listens."""

    def __init__(self, listen: str = DEFAULT_LISTEN, seed: int | None = None) -> None:
        try:
            self._host, self._port = _parse_listen(listen)
        except ApiError as error:
            raise ToxiproxyError(error.message) from None
        self._rng = random.Random(seed)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._api: _Api | None = None
        self._address: str | None = None

    @property
    def address(self) -> str:
        """host:port of the HTTP API (the real port when asked for port 0)."""
        if self._address is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return self._address

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def __enter__(self) -> ToxiproxyServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Starts listening; raises ToxiproxyError when the address cannot be bound."""
        if self._thread is not None:
            raise RuntimeError("ToxiproxyServer already started")
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="toxiproxy", daemon=True)
        self._thread.start()
        try:
            ready.result(timeout=START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Closes the API, every proxy and every connection; waits for the loop thread to end."""
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(STOP_TIMEOUT_S)
        self._thread = self._loop = self._stop_event = self._api = None

    def populate(self, proxies: object) -> list[dict[str, Any]]:
        """Creates or updates proxies, like POST /populate; raises ApiError."""
        loop, api = self._loop, self._api
        if loop is None or api is None:
            raise RuntimeError("ToxiproxyServer is not started")

        async def populate() -> list[dict[str, Any]]:
            async with api.registry.lock:
                return await api.registry.populate(proxies)

        return asyncio.run_coroutine_threadsafe(populate(), loop).result(REQUEST_TIMEOUT_S)

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as error:
            if ready.done():
                _log.exception("toxiproxy: event loop failed")
            else:
                ready.set_exception(error)

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        api = _Api(_Registry(self._rng))
        try:
            server = await asyncio.start_server(
                api.serve_connection, self._host, self._port, limit=REQUEST_HEAD_BYTES_MAX
            )
        except OSError as error:
            address = _format_address(self._host, self._port)
            ready.set_exception(ToxiproxyError(f"cannot listen on {address}: {_os_reason(error)}"))
            return
        bound = server.sockets[0].getsockname()
        self._address = _format_address(bound[0], bound[1])
        self._api = api
        ready.set_result(None)
        try:
            await self._stop_event.wait()
        finally:
            server.close()
            await api.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), STOP_TIMEOUT_S)


# --- the command line ---------------------------------------------------------------------------


def add_toxiproxy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="address of the HTTP API (default %(default)s; port 0 picks a free port)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="JSON list of proxies to create at start, like toxiproxy-server -config",
    )


def _load_config(path: str) -> list[Any]:
    try:
        with open(path, "rb") as file:
            text = file.read(CONFIG_BYTES_MAX + 1)
    except OSError as error:
        raise ToxiproxyError(f"cannot read config {path}: {_os_reason(error)}") from None
    if len(text) > CONFIG_BYTES_MAX:
        raise ToxiproxyError(f"config {path} is larger than {CONFIG_BYTES_MAX} bytes")
    try:
        proxies = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise ToxiproxyError(f"config {path} is not valid JSON ({error})") from None
    if not isinstance(proxies, list):
        raise ToxiproxyError(f"config {path} must be a JSON list of proxies")
    return proxies


def run_toxiproxy(args: argparse.Namespace) -> int:
    """Serves in the foreground until SIGINT or SIGTERM; 2 on a bad address or config."""
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server: ToxiproxyServer | None = None
    try:
        proxies = _load_config(args.config) if args.config else []
        server = ToxiproxyServer(args.listen)
        server.start()
        try:
            server.populate(proxies)
        except ApiError as error:
            raise ToxiproxyError(f"bad config {args.config}: {error.message}") from None
        print(f"toxiproxy {VERSION} API listening on {server.url}", flush=True)
        while not stopping.wait(1.0):
            pass
        return 0
    except ToxiproxyError as error:
        print(f"toxiproxy: {error}.", file=sys.stderr, flush=True)
        return 2
    finally:
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.toxiproxy", description=__doc__.splitlines()[0])
    add_toxiproxy_arguments(parser)
    return run_toxiproxy(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The server process: the HTTP API and every proxy on one asyncio event loop in one daemon thread,
and the command line (`mqmeta chaos toxiproxy`, `python -m mqmeta.chaos.toxiproxy`)."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import signal
import sys
import threading
from typing import Any

from mqmeta.chaos.toxiproxy.collection import PopulateError, ProxyCollection
from mqmeta.chaos.toxiproxy.datapath import resolve_address
from mqmeta.chaos.toxiproxy.model import (
    VERSION,
    AddressError,
    ApiError,
    ToxiproxyError,
    format_address,
    split_address,
)

from mqmeta.extras import missing_package

DEFAULT_LISTEN = "127.0.0.1:8474"
CONFIG_BYTES_MAX = 16 * 1024 * 1024
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 30.0  # a call from another thread into the loop (populate)

_log = logging.getLogger(__name__)


def _os_reason(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else str(error)


class ToxiproxyServer:
    """A Toxiproxy-compatible server on its own event loop thread; start() returns once it listens."""

    def __init__(self, listen: str = DEFAULT_LISTEN, seed: int | None = None) -> None:
        try:
            split_address(listen)
        except AddressError as error:
            raise ToxiproxyError(f"bad listen address {listen!r}: {error}") from None
        self._listen = listen
        self._rng = random.Random(seed)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._collection: ProxyCollection | None = None
        self._address: tuple[str, int] | None = None

    @property
    def address(self) -> str:
        """host:port of the HTTP API (the real port when asked for port 0)."""
        if self._address is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return format_address(*self._address)

    @property
    def host(self) -> str:
        if self._address is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return self._address[0]

    @property
    def port(self) -> int:
        if self._address is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return self._address[1]

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
        self._thread = self._loop = self._stop_event = self._collection = None

    def populate(self, proxies: object) -> list[dict[str, Any]]:
        """Creates or replaces proxies, like POST /populate; raises ToxiproxyError."""
        loop, collection = self._loop, self._collection
        if loop is None or collection is None:
            raise RuntimeError("ToxiproxyServer is not started")

        async def populate() -> list[dict[str, Any]]:
            async with collection.lock:
                return await collection.populate(proxies)

        return asyncio.run_coroutine_threadsafe(populate(), loop).result(CALL_TIMEOUT_S)

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as error:
            if ready.done():
                _log.exception("toxiproxy: the event loop failed")
            else:
                ready.set_exception(error)

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        from mqmeta.chaos.toxiproxy.api import ApiServer  # aiohttp: `mqmeta --help` runs without it

        collection = ProxyCollection(self._rng)
        api = ApiServer(collection)
        try:
            host, port = await resolve_address(self._listen)
            self._address = await api.start(host, port)
        except (OSError, AddressError) as error:
            reason = _os_reason(error) if isinstance(error, OSError) else str(error)
            ready.set_exception(ToxiproxyError(f"cannot listen on {self._listen}: {reason}"))
            await api.stop()
            return
        self._collection = collection
        ready.set_result(None)
        try:
            await self._stop_event.wait()
        finally:
            collection.shutdown()
            await api.stop()


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
        proxies = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ToxiproxyError(f"config {path} is not valid JSON ({error})") from None
    if not isinstance(proxies, list):
        raise ToxiproxyError(f"config {path} must be a JSON list of proxies")
    return proxies


def run_toxiproxy(args: argparse.Namespace) -> int:
    """Serves in the foreground until SIGINT or SIGTERM; 2 on a bad address or config.
    The first line on stdout names the API's address (the real port when asked for port 0)."""
    missing = missing_package("chaos")
    if missing is not None:
        print(f"toxiproxy: the fault proxy needs {missing}: pip install 'mqmeta[chaos]'", file=sys.stderr)
        return 2
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server: ToxiproxyServer | None = None
    try:
        proxies = _load_config(args.config) if args.config else []
        server = ToxiproxyServer(args.listen)
        server.start()
        try:
            server.populate(proxies)
        except (ApiError, PopulateError) as error:
            raise ToxiproxyError(f"bad config {args.config}: {error}") from None
        print(f"toxiproxy {VERSION} API listening on {server.url}", flush=True)
        while not stopping.wait(1.0):
            pass
        return 0
    except ToxiproxyError as error:
        print(f"toxiproxy: {str(error).rstrip('.')}.", file=sys.stderr, flush=True)
        return 2
    finally:
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqmeta.chaos.toxiproxy", description="A Toxiproxy-compatible server."
    )
    add_toxiproxy_arguments(parser)
    return run_toxiproxy(parser.parse_args(argv))

"""The console: a web dashboard served by the nameserver (`--console-listen HOST:PORT`).

It reads through the same calls as `mqmeta admin` (controller/console/data.py), serves
pages and JSON on aiohttp (controller/console/web.py) on an event loop of its own
thread, and pushes live changes to the browser as server-sent events: the controllers'
watch stream (elections, SyncStateSet changes, topics, groups) as they are applied, and
a sample every SAMPLE_INTERVAL_S for the plots (message rates, group backlog,
replication delay) and the newest index of the command history (the timeline reads the
history again when it moves: a fenced command changes nothing, so no watch event says
so). The front end is static files in static/ (uPlot for the plots, vendored with its
license); nothing is loaded from elsewhere.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from mqmeta.controller.console import data, web

from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument, MqmetaError
from mqmeta.validate import parse_addresses

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
WATCH_KEEPALIVE_MS = (2000, 2000)  # a silently cut watch stream ends within ~4 s
WATCH_RETRY_S = 0.2
__all__ = ["Console", "start_console"]


class EventSource(Protocol):
    """A follower of the controllers' watch stream that hands on each event it gets."""

    def add_listener(self, listener: Callable[[Any], None]) -> None: ...


class Console:
    """`events`: where the live events come from when the process already follows the
    controllers' watch stream (a standalone nameserver's RouteCache: `add_listener`);
    without it, the console opens a watch stream of its own."""

    def __init__(self, listen: str, controllers: list[str], events: EventSource | None = None) -> None:
        self.listen = listen
        self.client = ControllerClient(controllers)
        self._events = events
        self.watch_client = ControllerClient(controllers)
        self.brokers = data.Brokers()
        self.hub = web.Hub()
        self.sessions: collections.OrderedDict[str, web.Session] = collections.OrderedDict()
        self._pool = web.read_pool()
        self._loop = asyncio.new_event_loop()
        self._stopping = threading.Event()
        self._runner: Any = None
        self._watch_thread = threading.Thread(target=self._watch, name="console-watch", daemon=True)
        self._threads = [
            threading.Thread(target=self._loop.run_forever, name="console-loop", daemon=True),
            self._watch_thread,
            threading.Thread(target=self._sample, name="console-sample", daemon=True),
        ]

    async def run(self, call: Callable[[], Any]) -> Any:
        """A blocking read on the console's bounded pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def start(self) -> None:
        host, _, port = self.listen.rpartition(":")
        self._threads[0].start()
        future = asyncio.run_coroutine_threadsafe(self._serve(host, int(port)), self._loop)
        try:
            future.result(timeout=START_TIMEOUT_S)
        except OSError as error:
            self.stop()
            raise InvalidArgument(
                f"--console-listen {self.listen}: cannot listen ({error.strerror})"
            ) from None
        if self._events is not None:
            self._threads.remove(self._watch_thread)
            self._events.add_listener(self._on_event)
        for thread in self._threads[1:]:
            thread.start()

    async def _serve(self, host: str, port: int) -> None:
        from aiohttp import web as aioweb

        self._runner = aioweb.AppRunner(web.build_app(self), access_log=None)
        await self._runner.setup()
        site = aioweb.TCPSite(self._runner, host, port, ssl_context=web.server_ssl_context())
        await site.start()

    def url(self) -> str:
        scheme = "https" if web.server_ssl_context() is not None else "http"
        return f"{scheme}://{self.listen}/"

    def _publish(self, kind: str, document: dict[str, Any]) -> None:
        if not self._stopping.is_set():
            self._loop.call_soon_threadsafe(self.hub.publish, kind, document)

    def _on_event(self, event: Any) -> None:
        self._publish("event", _event_document(event))

    def _watch(self) -> None:
        """The controllers' decisions as they are applied, to every open page; a broken
        stream is opened again on another controller."""
        while not self._stopping.is_set():
            try:
                for event in self.watch_client.watch(keepalive_ms=WATCH_KEEPALIVE_MS):
                    if self._stopping.is_set():
                        return
                    self._publish("event", _event_document(event))
            except Exception as error:  # noqa: BLE001 - any end of the stream: open it again
                log.debug("console watch stream ended: %s", error)
            if self._stopping.wait(WATCH_RETRY_S):
                return
            try:  # moves the client to a controller that answers
                self.watch_client.get_metadata(_metadata_request(), timeout_s=2.0)
            except MqmetaError:
                pass

    def _sample(self) -> None:
        previous: dict[str, Any] | None = None
        took_s = 0.0
        while not self._stopping.is_set():
            if previous is not None:
                self.hub.joined.clear()
                self.hub.joined.wait(_sample_pause_s(bool(self.hub.subscribers), took_s))
                if self._stopping.is_set():
                    return
            started = time.monotonic()
            try:
                sample = _sample_document(self.client, self.brokers, previous)
            except MqmetaError as error:
                log.debug("console sample failed: %s", error)
                previous = previous or {}
                continue
            finally:
                took_s = time.monotonic() - started
            previous = sample
            self._publish("sample", sample)

    def stop(self) -> None:
        self._stopping.set()
        self.hub.joined.set()  # wakes the sampler
        if self._runner is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(
                timeout=START_TIMEOUT_S
            )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        self.watch_client.close()
        self.brokers.close()


def _sample_pause_s(watched: bool, took_s: float) -> float:
    """The wait before the next sample: SAMPLE_INTERVAL_S while a page is open; else
    SAMPLE_IDLE_INTERVAL_S, longer if the last sample took more than SAMPLE_IDLE_DUTY_MAX
    of the time (a page that opens ends the wait: hub.joined)."""
    if watched:
        return web.SAMPLE_INTERVAL_S
    return max(web.SAMPLE_IDLE_INTERVAL_S, took_s / web.SAMPLE_IDLE_DUTY_MAX - took_s)


def _metadata_request() -> Any:
    from mqmeta.pb import controller_pb2 as pb

    return pb.GetMetadataRequest()


def _event_document(event: Any) -> dict[str, Any]:
    info = event.replica_info
    document: dict[str, Any] = {
        "index": event.index,
        "kind": event.kind,
        "cluster": event.cluster,
        "broker_name": event.broker_name,
        "name": event.name,
        "time_ms": int(time.time() * 1000),
    }
    if event.HasField("replica_info"):
        document.update(
            master_broker_id=info.master_broker_id,
            master_address=info.master_address,
            master_epoch=info.master_epoch,
            sync_state_set=sorted(info.sync_state_set),
            sync_state_set_epoch=info.sync_state_set_epoch,
        )
    return document


def _sample_document(
    client: ControllerClient, brokers: data.Brokers, previous: dict[str, Any] | None
) -> dict[str, Any]:
    """The latest topics, groups and replicator rules, with rates against `previous`."""
    topics = data.topics(client, brokers)
    groups = data.group_lag(client, brokers)
    try:
        rules = data.replicator(client)["rules"]
    except MqmetaError:
        rules = []
    try:  # the timeline reads the history again when this moves (a fenced command changes nothing)
        history_index = data.newest_history_index(client)
    except MqmetaError:
        history_index = 0
    now_ms = topics["now_ms"]
    rates: dict[str, float] = {}
    before = {t["name"]: t["messages"] for t in (previous or {}).get("topics", {}).get("topics", [])}
    elapsed_s = (now_ms - (previous or {}).get("now_ms", now_ms)) / 1000
    for topic in topics["topics"]:
        if topic["name"] in before and elapsed_s > 0:
            rates[topic["name"]] = round(
                max(0, topic.get("messages", 0) - before[topic["name"]]) / elapsed_s, 2
            )
    return {
        "now_ms": now_ms,
        "rates": rates,
        "backlog": {g["group"]: g["backlog"] for g in groups["groups"]},
        "replication_delay_ms": {r["name"]: r["delay_ms"] for r in rules},
        "history_index": history_index,
        "topics": topics,
        "groups": groups,
    }


def start_console(listen: str, controllers: list[str], events: EventSource | None = None) -> Console:
    """The console on `listen` (HOST:PORT), reading from `controllers` (live events from
    `events` when given); stop() ends it."""
    parse_addresses(listen, "--console-listen address")
    console = Console(listen, controllers, events)
    console.start()
    return console

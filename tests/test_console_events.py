"""The console's live events and its sampler's pace (controller/console/service.py), in
this process: no cluster, no browser.

Properties checked:
- a console given an event source (a standalone nameserver's route copy) opens no watch
  stream of its own and puts each event the source hands it on its timeline;
- the sampler's pause: SAMPLE_INTERVAL_S while a page is open; while none is,
  SAMPLE_IDLE_INTERVAL_S, stretched so that sampling takes at most SAMPLE_IDLE_DUTY_MAX of
  the time.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
from mqmeta.cluster.wait import wait_for
from mqmeta.controller.console import service, web

from mqmeta.pb import controller_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class Source:
    def __init__(self) -> None:
        self.listeners: list[Callable[[Any], None]] = []

    def add_listener(self, listener: Callable[[Any], None]) -> None:
        self.listeners.append(listener)

    def emit(self, event: pb.WatchEvent) -> None:
        for listener in self.listeners:
            listener(event)


def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_console_with_an_event_source_opens_no_watch_of_its_own_and_shows_its_events():
    source = Source()
    console = service.start_console(_free_address(), [_free_address()], source)
    try:
        assert len(source.listeners) == 1
        assert not console._watch_thread.is_alive(), "a watch stream of its own"
        source.emit(pb.WatchEvent(index=7, kind="topic", name="Orders"))
        shown = wait_for(lambda: list(console.hub.events), 5.0, "the event on the timeline", until=bool)
        assert [(e["index"], e["kind"], e["name"]) for e in shown] == [(7, "topic", "Orders")]
    finally:
        console.stop()


def test_without_an_event_source_the_console_watches_by_itself():
    console = service.start_console(_free_address(), [_free_address()])
    try:
        assert console._watch_thread.is_alive()
    finally:
        console.stop()


def test_the_idle_sampler_keeps_its_share_of_the_time_and_an_open_page_its_pace():
    assert service._sample_pause_s(True, 5.0) == web.SAMPLE_INTERVAL_S
    assert service._sample_pause_s(False, 0.1) == web.SAMPLE_IDLE_INTERVAL_S
    took_s = 3.0
    pause_s = service._sample_pause_s(False, took_s)
    assert took_s / (took_s + pause_s) == pytest.approx(web.SAMPLE_IDLE_DUTY_MAX)

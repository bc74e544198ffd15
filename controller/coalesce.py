"""Concurrent calls of one kind to one place, merged into one call (the proxy's
AckMessage forwarding, controller/rmq_proxy.py).

Why: a forwarded call costs the nameserver about 1 ms of CPU in grpc.aio whatever it
carries, and an official PushConsumer acknowledges every message with its own call from
each of its consumption threads (20 by default). Calls with the same key that wait
together go upstream as one call, whose answer is split back among them.

How: each key has a lane. A call joins its lane's waiting list; when fewer than
`inflight_max` merged calls of the lane are in flight, a flush is started as a task,
which runs on a later turn of the event loop: every call that arrived in this turn joins it. A flush takes
the waiting calls (up to `weight_max`, at least one) and sends them with `send(key,
items)`, which returns one result per item, in order, or raises (every caller of that
flush gets the exception). While `inflight_max` flushes are in flight, calls wait and go
together with the next one: under load the merged calls grow instead of queueing. A
caller that went away (cancelled) is left out of its flush.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Lane:
    waiting: list[tuple[Any, int, asyncio.Future]] = field(default_factory=list)
    inflight: int = 0
    scheduled: bool = False


class Coalescer(Generic[Item, Result]):
    """See the module doc. `weight_max` bounds what one merged call carries (a call
    heavier than it goes alone); `inflight_max` the merged calls of one key at once."""

    def __init__(
        self,
        send: Callable[[Hashable, list[Item]], Awaitable[list[Result]]],
        weight_max: int,
        inflight_max: int,
    ) -> None:
        if weight_max < 1 or inflight_max < 1:
            raise ValueError("weight_max and inflight_max must be at least 1")
        self._send = send
        self.weight_max = weight_max
        self.inflight_max = inflight_max
        self._lanes: dict[Hashable, _Lane] = {}
        self._tasks: set[asyncio.Task] = set()
        self.merged_calls = 0  # calls sent upstream (for tests and the bench)

    async def call(self, key: Hashable, item: Item, weight: int = 1) -> Result:
        lane = self._lanes.setdefault(key, _Lane())
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        lane.waiting.append((item, weight, future))
        self._kick(key, lane)
        return await future

    def _kick(self, key: Hashable, lane: _Lane) -> None:
        if lane.waiting and not lane.scheduled and lane.inflight < self.inflight_max:
            lane.scheduled = True
            lane.inflight += 1
            task = asyncio.get_running_loop().create_task(self._flush(key, lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, key: Hashable, lane: _Lane) -> None:
        taken: list[tuple[Any, int, asyncio.Future]] = []
        lane.scheduled = False  # a task runs on a later turn of the loop: this turn's calls joined
        try:
            weight = 0
            while lane.waiting and (not taken or weight + lane.waiting[0][1] <= self.weight_max):
                taken.append(lane.waiting.pop(0))
                weight += taken[-1][1]
            self._kick(key, lane)  # what did not fit goes at once if a flight is free
            live = [t for t in taken if not t[2].done()]
            if live:
                self.merged_calls += 1
                results = await self._send(key, [item for item, _, _ in live])
                for (_, _, future), result in zip(live, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        except Exception as exc:
            for _, _, future in taken:
                if not future.done():
                    future.set_exception(exc)
        except BaseException:  # cancelled (the loop is closing): so are its callers
            for _, _, future in taken:
                future.cancel()
            raise
        finally:
            lane.inflight -= 1
            if lane.waiting:
                self._kick(key, lane)
            elif not lane.inflight and not lane.scheduled and self._lanes.get(key) is lane:
                del self._lanes[key]

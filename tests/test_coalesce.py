"""controller.coalesce.Coalescer: concurrent calls of one key merged into one.

Properties checked:
- calls that arrive together go as one merged call, and each caller gets its own result;
- a merged call carries at most weight_max (a heavier call goes alone), and at most
  inflight_max merged calls of a key are in flight: the calls that arrive meanwhile
  wait and go together in the next one;
- keys are never mixed;
- a failed merged call fails each of its callers, and only them;
- a caller that went away (cancelled) is left out of its merged call.
"""

from __future__ import annotations

import asyncio

import pytest
from mqmeta.controller.coalesce import Coalescer

pytestmark = pytest.mark.timeout(30)


class _Upstream:
    """A send that records what it was given; answers each item doubled, once released."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, list[int]]] = []
        self.inflight = 0
        self.inflight_seen = 0
        self.release = asyncio.Event()
        self.release.set()
        self.fail: set[int] = set()

    async def send(self, key: object, items: list[int]) -> list[int]:
        self.sent.append((key, list(items)))
        self.inflight += 1
        self.inflight_seen = max(self.inflight_seen, self.inflight)
        try:
            await self.release.wait()
            if self.fail & set(items):
                raise RuntimeError(f"refused {sorted(self.fail & set(items))}")
            return [2 * i for i in items]
        finally:
            self.inflight -= 1


def test_calls_arriving_together_go_as_one() -> None:
    async def run() -> None:
        up = _Upstream()
        coalescer = Coalescer(up.send, weight_max=100, inflight_max=2)
        results = await asyncio.gather(*(coalescer.call("k", i) for i in range(10)))
        assert results == [2 * i for i in range(10)]
        assert up.sent == [("k", list(range(10)))]

    asyncio.run(run())


def test_weight_and_inflight_bounds_and_later_calls_merge() -> None:
    async def run() -> None:
        up = _Upstream()
        up.release.clear()
        coalescer = Coalescer(up.send, weight_max=4, inflight_max=2)
        first = [asyncio.ensure_future(coalescer.call("k", i)) for i in range(6)]
        heavy = asyncio.ensure_future(coalescer.call("k", 100, weight=9))
        for _ in range(5):
            await asyncio.sleep(0)
        later = [asyncio.ensure_future(coalescer.call("k", i)) for i in range(10, 13)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert up.inflight == 2, "two merged calls in flight, the rest wait"
        up.release.set()
        results = await asyncio.gather(*first, heavy, *later)
        assert results == [2 * i for i in [*range(6), 100, 10, 11, 12]]
        assert up.inflight_seen == 2
        sizes = [items for _, items in up.sent]
        assert sizes[0] == [0, 1, 2, 3] and sizes[1] == [4, 5], sizes
        assert [100] in sizes, "a call heavier than weight_max goes alone"
        assert [10, 11, 12] in sizes, "the calls that waited go together"

    asyncio.run(run())


def test_keys_are_not_mixed() -> None:
    async def run() -> None:
        up = _Upstream()
        coalescer = Coalescer(up.send, weight_max=100, inflight_max=1)
        await asyncio.gather(*(coalescer.call(i % 2, i) for i in range(6)))
        assert sorted(up.sent) == [(0, [0, 2, 4]), (1, [1, 3, 5])]

    asyncio.run(run())


def test_a_failed_merged_call_fails_its_callers_only() -> None:
    async def run() -> None:
        up = _Upstream()
        up.fail = {1}
        coalescer = Coalescer(up.send, weight_max=2, inflight_max=2)
        results = await asyncio.gather(*(coalescer.call("k", i) for i in range(4)), return_exceptions=True)
        assert isinstance(results[0], RuntimeError) and isinstance(results[1], RuntimeError)
        assert results[2:] == [4, 6]

    asyncio.run(run())


def test_a_cancelled_caller_is_left_out() -> None:
    async def run() -> None:
        up = _Upstream()
        up.release.clear()
        coalescer = Coalescer(up.send, weight_max=100, inflight_max=1)
        busy = asyncio.ensure_future(coalescer.call("k", 0))
        await asyncio.sleep(0.01)  # in flight: the next calls wait
        gone = asyncio.ensure_future(coalescer.call("k", 1))
        kept = asyncio.ensure_future(coalescer.call("k", 2))
        await asyncio.sleep(0.01)
        gone.cancel()
        up.release.set()
        assert await busy == 0 and await kept == 4
        assert up.sent == [("k", [0]), ("k", [2])]

    asyncio.run(run())

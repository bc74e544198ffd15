"""The pop shell's reads for a receive (broker_agent.rmq_pop.PopShell._read), against a
store that counts what it decodes.

Properties checked:
- a receive of 32 over a queue with 1,000 waiting records decodes at most two chunks of
  32 records, not the whole scan window its candidates span;
- a read the store answers short (its byte limit) goes on from the last record it got:
  every offset asked for is read once, in order, none skipped;
- runs of offsets with gaps (available offsets below the frontier) are read run by run.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mqmeta.broker_agent.rmq_pop import READ_CHUNK_MIN, PopShell

pytestmark = pytest.mark.timeout(30)


class _CountingStore:
    """get_messages over queue offsets 0..size-1, answering at most `answer_max` records
    per call (as MessageStore does at its byte limit); counts the records it decoded."""

    def __init__(self, size: int, answer_max: int = 1024) -> None:
        self.size = size
        self.answer_max = answer_max
        self.decoded = 0

    def get_messages(self, topic: str, queue_id: int, offset: int, count: int, confirm: int) -> list:
        got = [SimpleNamespace(queue_offset=o) for o in range(offset, min(offset + count, self.size))]
        got = got[: self.answer_max]
        self.decoded += len(got)
        return got


def _shell(store: _CountingStore) -> PopShell:
    return PopShell(SimpleNamespace(agent=None, store=store))  # type: ignore[arg-type]


def test_a_receive_of_32_decodes_about_32_records() -> None:
    store = _CountingStore(1_000)
    reads = _shell(store)._read("T", 0, list(range(1_000)), 10**9, READ_CHUNK_MIN)
    taken = [next(reads).queue_offset for _ in range(33)]  # a batch of 32 looks at 33
    assert taken == list(range(33))
    assert store.decoded <= 2 * READ_CHUNK_MIN, f"decoded {store.decoded} records for a batch of 32"


def test_a_short_answer_goes_on_from_the_last_record() -> None:
    store = _CountingStore(100, answer_max=5)
    got = [r.queue_offset for r in _shell(store)._read("T", 0, list(range(100)), 10**9, 32)]
    assert got == list(range(100))


def test_runs_with_gaps_are_read_run_by_run() -> None:
    store = _CountingStore(200)
    offsets = [3, 4, 9, *range(50, 120)]
    got = [r.queue_offset for r in _shell(store)._read("T", 0, offsets, 10**9, 32)]
    assert got == offsets
    assert store.decoded == len(offsets)

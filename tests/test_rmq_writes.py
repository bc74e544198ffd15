"""broker_agent.rmq_writes.PlainWrites: concurrent sends on the master written together.

Properties checked:
- while a write is in flight, the sends that arrive meanwhile wait and go together as
  one write, each caller's records together and in order, and each caller gets its own
  results;
- at most in_flight_max writes at once;
- a batch holds at most records_max records and body_bytes_max body bytes (a caller
  past them goes alone);
- a failed write fails its callers only;
- a batch that waited past wait_s_max for the writes before it is refused, unwritten.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from mqmeta.broker_agent.rmq_writes import PlainWrites

from mqmeta.errors import DeadlineExceeded
from mqmeta.formats.records import Message
from tests.support import wait_for

pytestmark = pytest.mark.timeout(30)


def _records(caller: int, count: int = 1, body: bytes = b"x") -> list[Message]:
    return [Message("T", 0, body, "", "", {"caller": str(caller), "i": str(i)}, "p") for i in range(count)]


class _Log:
    """A write that records each batch and holds it until released; answers each record
    with (caller, i)."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str]]] = []
        self.in_flight = 0
        self.in_flight_seen = 0
        self.release = threading.Event()
        self.fail_caller: str | None = None
        self.told: list[bool] = []  # whether each write was given the batch's on_acknowledged
        self._lock = threading.Lock()

    def write(self, records: list[Message], on_acknowledged=None) -> list[tuple[str, str]]:
        answers = [(r.properties["caller"], r.properties["i"]) for r in records]
        self.told.append(on_acknowledged is not None)
        with self._lock:
            self.batches.append(answers)
            self.in_flight += 1
            self.in_flight_seen = max(self.in_flight_seen, self.in_flight)
        try:
            assert self.release.wait(10)
            if self.fail_caller in {caller for caller, _ in answers}:
                raise RuntimeError("refused")
            if on_acknowledged is not None:  # as the agent's write: before it returns
                on_acknowledged(answers)
            return answers
        finally:
            with self._lock:
                self.in_flight -= 1


def _writes(log: _Log, in_flight_max: int = 1, records_max: int = 100, body_bytes_max: int = 1 << 20):
    return PlainWrites(log.write, in_flight_max, records_max, body_bytes_max, wait_s_max=5.0)


def test_sends_arriving_during_a_write_go_together_and_get_their_own_results() -> None:
    log = _Log()
    writes = _writes(log)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(writes.write, _records(0))
        wait_for(lambda: len(log.batches), 5, "the first write in flight")
        later = [pool.submit(writes.write, _records(caller, count=2)) for caller in range(1, 6)]
        wait_for(
            lambda: sum(len(b.records) for b in writes._waiting),
            5,
            "10 records waiting",
            until=lambda n: n == 10,
        )
        log.release.set()
        assert first.result(5) == [("0", "0")]
        for caller, future in enumerate(later, start=1):
            assert future.result(5) == [(str(caller), "0"), (str(caller), "1")]
    assert len(log.batches) == 2 and writes.writes == 2, log.batches
    second = log.batches[1]
    assert sorted(second) == sorted((str(c), str(i)) for c in range(1, 6) for i in range(2))
    for caller in range(1, 6):  # a caller's records stay together, in order
        at = second.index((str(caller), "0"))
        assert second[at + 1] == (str(caller), "1")
    assert log.in_flight_seen == 1


def test_in_flight_max_and_batch_bounds() -> None:
    log = _Log()
    writes = _writes(log, in_flight_max=2, records_max=3, body_bytes_max=100)
    with ThreadPoolExecutor(8) as pool:
        flying = [pool.submit(writes.write, _records(c)) for c in (0, 1)]
        wait_for(lambda: log.in_flight, 5, "two writes in flight", until=lambda n: n == 2)
        waiting = [pool.submit(writes.write, _records(c)) for c in range(2, 6)]  # 4 records: 3 + 1
        wait_for(lambda: len(writes._waiting), 5, "two batches waiting", until=lambda n: n == 2)
        big = pool.submit(writes.write, _records(9, body=b"y" * 200))
        wait_for(lambda: len(writes._waiting), 5, "the big send alone", until=lambda n: n == 3)
        log.release.set()
        for future in [*flying, *waiting, big]:
            future.result(5)
    sizes = sorted(len(batch) for batch in log.batches)
    assert sizes == [1, 1, 1, 1, 3], log.batches
    assert [("9", "0")] in log.batches, "a send past body_bytes_max goes alone"
    assert log.in_flight_seen == 2


def test_a_failed_write_fails_its_callers_only() -> None:
    log = _Log()
    log.fail_caller = "1"
    writes = _writes(log, records_max=2)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(writes.write, _records(0))
        wait_for(lambda: len(log.batches), 5, "the first write in flight")
        refused = [pool.submit(writes.write, _records(c)) for c in (1, 2)]
        wait_for(lambda: len(writes._waiting), 5, "one batch waiting", until=lambda n: n == 1)
        kept = pool.submit(writes.write, _records(3))
        wait_for(lambda: len(writes._waiting), 5, "a second batch waiting", until=lambda n: n == 2)
        log.release.set()
        assert first.result(5) == [("0", "0")]
        for future in refused:
            with pytest.raises(RuntimeError, match="refused"):
                future.result(5)
        assert kept.result(5) == [("3", "0")]


def test_a_batch_that_waited_too_long_is_refused_unwritten() -> None:
    log = _Log()
    writes = PlainWrites(log.write, 1, 100, 1 << 20, wait_s_max=0.3)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(writes.write, _records(0))
        wait_for(lambda: len(log.batches), 5, "the first write in flight")
        late = pool.submit(writes.write, _records(1))
        with pytest.raises(DeadlineExceeded, match="not written"):
            late.result(5)
        log.release.set()
        assert first.result(5) == [("0", "0")]
    assert log.batches == [[("0", "0")]], "the refused batch was never written"
    assert not writes._waiting


def test_each_caller_that_gives_on_acknowledged_hears_its_own_results_before_its_write_returns() -> None:
    """A batch of several callers: the write is given the batch's hook only when a caller
    gave one, and the hook tells each such caller its own records' results, in order."""
    log = _Log()
    writes = _writes(log)
    heard: dict[int, list] = {}
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(writes.write, _records(0))
        wait_for(lambda: len(log.batches), 5, "the first write in flight")
        later = [
            pool.submit(
                writes.write,
                _records(caller, count=2),
                heard.setdefault(caller, []).extend if caller % 2 else None,
            )
            for caller in range(1, 5)
        ]
        wait_for(
            lambda: sum(len(b.records) for b in writes._waiting),
            5,
            "8 records waiting",
            until=lambda n: n == 8,
        )
        log.release.set()
        first.result(5)
        results = [future.result(5) for future in later]
    assert log.told == [False, True], "the hook goes to a write only when a caller gave one"
    assert heard == {1: results[0], 3: results[2]} and heard[1] == [("1", "0"), ("1", "1")]

"""Plain sends of concurrent SendMessage calls on the master, written together.

Why: every write of the commit log is an append (the agent's lock, the core's Appended,
waking the slaves' fetches), a group commit and a wait for the SyncStateSet's acks.
Official-client threads sending directly to the master made as many writes at once, each
appended while another's fsync and slave round were under way, so each waited for about
one and a half of them; one write carrying them all waits for one. The proxy already
merges a client's sends; this does the same for the sends that reach the master at once
from several callers (direct routes, several clients through the proxy). Measured in
docs/benchmarks.md (RocketMQ 5 clients).

How: a caller joins the newest waiting batch (a new one when there is none, or it is
full); the first caller of a batch is its leader. At most `in_flight_max` batches are
written at once; a leader whose batch may go writes it with one `write(records)` call and
hands each caller its results, in order (the records of one caller stay together, in
their order). Calls that arrive while the writes are in flight wait and go together in
the next batch. A failed write is every caller's failure.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from mqmeta.errors import DeadlineExceeded
from mqmeta.formats.records import MessageFields

__all__ = ["PlainWrites"]


class _Batch:
    def __init__(self) -> None:
        self.records: list[MessageFields] = []
        self.body_bytes = 0
        self.turn = threading.Event()  # its leader may write it
        self.done = threading.Event()
        self.results: list[Any] = []
        self.error: BaseException | None = None
        # (first record, count, on_acknowledged) of each caller that gave one (write)
        self.told: list[tuple[int, int, Callable[[list[Any]], None]]] = []

    def acknowledged(self, results: list[Any]) -> None:
        """The write's acknowledgement, before the leader returns: each caller that gave
        an on_acknowledged hears of its results (they must not block)."""
        for start, count, on_acknowledged in self.told:
            on_acknowledged(results[start : start + count])


class PlainWrites:
    """See the module doc. `records_max` and `body_bytes_max` bound one batch (a caller
    whose records alone pass them goes alone); `wait_s_max` bounds how long a caller waits
    for its batch's turn and outcome (past it: DeadlineExceeded, the outcome unknown)."""

    def __init__(
        self,
        write: Callable[..., list[Any]],  # (records) -> results; and on_acknowledged= (write)
        in_flight_max: int,
        records_max: int,
        body_bytes_max: int,
        wait_s_max: float,
        on_write: Callable[[], object] = lambda: None,
    ) -> None:
        if in_flight_max < 1 or records_max < 1 or body_bytes_max < 1 or wait_s_max <= 0:
            raise ValueError("PlainWrites' bounds must be positive")
        self._write = write
        self._on_write = on_write  # counts each write (the broker's metrics)
        self.in_flight_max = in_flight_max
        self._records_max = records_max
        self._body_bytes_max = body_bytes_max
        self._wait_s_max = wait_s_max
        self._lock = threading.Lock()
        self._waiting: deque[_Batch] = deque()
        self._in_flight = 0
        self.writes = 0  # batches written (for tests and the bench)

    def write(
        self, records: Sequence[MessageFields], on_acknowledged: Callable[[list[Any]], None] | None = None
    ) -> list[Any]:
        """Writes `records` (with whatever else waits) and returns their results in order.
        `on_acknowledged(results)`, when given, may be called first, by another thread:
        the write function is then called with the batch's own hook (`on_acknowledged=`),
        which it may call once the write is acknowledged, as BrokerAgent.send does."""
        body_bytes = sum(len(record.body) for record in records)
        with self._lock:
            batch = self._waiting[-1] if self._waiting else None
            if batch is None or not self._fits(batch, len(records), body_bytes):
                batch = _Batch()
                self._waiting.append(batch)
            start = len(batch.records)
            if on_acknowledged is not None:
                batch.told.append((start, len(records), on_acknowledged))
            batch.records.extend(records)
            batch.body_bytes += body_bytes
            if start == 0:
                self._start_next()
        if start == 0 and self._wait_for_turn(batch):
            self._fly(batch)
        if not batch.done.wait(2 * self._wait_s_max):  # its turn, then its write
            raise DeadlineExceeded(
                f"the send waited {2 * self._wait_s_max:.1f} s for its write; its outcome is unknown",
                code="FLUSH_SLAVE_TIMEOUT",
            )
        if batch.error is not None:
            raise batch.error
        return batch.results[start : start + len(records)]

    def _wait_for_turn(self, batch: _Batch) -> bool:
        """Whether the leader may write its batch; False when the writes before it took
        longer than wait_s_max (the batch is then refused, unwritten, to all its callers)."""
        if batch.turn.wait(self._wait_s_max):
            return True
        with self._lock:
            if batch not in self._waiting:
                return True  # its turn came meanwhile
            self._waiting.remove(batch)
        batch.error = DeadlineExceeded(
            f"the writes before this send took over {self._wait_s_max:.1f} s; it was not written",
            code="FLUSH_SLAVE_TIMEOUT",
        )
        batch.done.set()
        return False

    def _fits(self, batch: _Batch, records: int, body_bytes: int) -> bool:
        return (
            len(batch.records) + records <= self._records_max
            and batch.body_bytes + body_bytes <= self._body_bytes_max
        )

    def _start_next(self) -> None:
        """Lets the oldest waiting batch go when a write may start (the lock held)."""
        if self._waiting and self._in_flight < self.in_flight_max:
            self._in_flight += 1
            self._waiting.popleft().turn.set()

    def _fly(self, batch: _Batch) -> None:
        try:
            self.writes += 1
            self._on_write()
            if batch.told:
                results = self._write(batch.records, on_acknowledged=batch.acknowledged)
            else:
                results = self._write(batch.records)
            assert len(results) == len(batch.records), (len(results), len(batch.records))
            batch.results = results
        except BaseException as error:  # every caller of the batch gets it
            batch.error = error
        finally:
            batch.done.set()
            with self._lock:
                self._in_flight -= 1
                self._start_next()

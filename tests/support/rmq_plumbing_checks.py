"""Checks of the broker's and the proxy's RocketMQ 5 plumbing without gRPC, run in a
process of their own by tests/test_rmq_plumbing.py (a pytest process may hold the official
client's stubs, which clash with ours: see tests/support/rmq_client.py).

`python -m tests.support.rmq_plumbing_checks NAME...` runs the named checks and prints one
JSON object: check name -> "ok" or the traceback.
"""

from __future__ import annotations

import json
import sys
import traceback
from types import SimpleNamespace

from mqmeta.broker_agent.pop import Candidate, LeaseGrant, Verdict
from mqmeta.broker_agent.rmq_pop import READ_CHUNK_MIN, PopShell


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


def a_receive_of_32_decodes_about_32_records() -> None:
    store = _CountingStore(1_000)
    reads = _shell(store)._read("T", 0, list(range(1_000)), 10**9, READ_CHUNK_MIN)
    taken = [next(reads).queue_offset for _ in range(33)]  # a batch of 32 looks at 33
    assert taken == list(range(33))
    assert store.decoded <= 2 * READ_CHUNK_MIN, f"decoded {store.decoded} records for a batch of 32"


def a_short_answer_goes_on_from_the_last_record() -> None:
    store = _CountingStore(100, answer_max=5)
    got = [r.queue_offset for r in _shell(store)._read("T", 0, list(range(100)), 10**9, 32)]
    assert got == list(range(100))


def runs_with_gaps_are_read_run_by_run() -> None:
    store = _CountingStore(200)
    offsets = [3, 4, 9, *range(50, 120)]
    got = [r.queue_offset for r in _shell(store)._read("T", 0, offsets, 10**9, 32)]
    assert got == offsets
    assert store.decoded == len(offsets)


class _Agent:
    """append and wait_acknowledged as BrokerAgent's, counted."""

    def __init__(self) -> None:
        self.appends = 0
        self.waits: list[tuple[int, int]] = []

    def append(self, put) -> tuple[None, int, int]:
        put(7)
        self.appends += 1
        return None, self.appends * 100, 7

    def wait_acknowledged(self, end: int, epoch: int) -> None:
        self.waits.append((end, epoch))


class _ProgressStore:
    def consumer_progress(self, group: str, topic: str, queue_id: int) -> tuple[int, tuple]:
        return 0, ()

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        return 0

    def commit_consumer_progress(self, entries: list, epoch: int, now_ms: int) -> None:
        pass


def _delivered(shell: PopShell, key: tuple[str, str, int], count: int) -> list[int]:
    """Leases of offsets 0..count-1 of `key`, delivered as a receive does."""
    slot = shell.slot(key, 0)
    grant = LeaseGrant(0, 30_000, "client", False, 0)
    return [slot.cursor.apply(Candidate(o, "", ""), Verdict.DELIVER, grant).lease for o in range(count)]


def a_batch_of_acks_appends_once_per_queue_and_waits_once() -> None:
    agent = _Agent()
    shell = PopShell(
        SimpleNamespace(agent=agent, store=_ProgressStore(), master_epoch=lambda: 7)  # type: ignore[arg-type]
    )
    a, b = ("g", "T", 0), ("g", "T", 1)
    leases_a, leases_b = _delivered(shell, a, 10), _delivered(shell, b, 6)
    acks = [(a, o, lease) for o, lease in enumerate(leases_a[:9])] + [
        (b, o, lease) for o, lease in enumerate(leases_b)
    ]
    acks.append((a, 9, leases_a[9] + 999))  # a stale lease: refused on its own
    outcomes = shell.ack_many(acks)
    assert outcomes == [True] * 15 + [False]
    assert agent.appends == 2, "one progress record per queue"
    assert len(agent.waits) <= 2 and agent.waits[0] == (200, 7), "the latest record awaited first"


CHECKS = {
    name: fn
    for name, fn in list(globals().items())
    if callable(fn) and not name.startswith("_") and fn.__module__ == __name__ and name != "main"
}


def main(argv: list[str]) -> None:
    results: dict[str, str] = {}
    for name in argv:
        try:
            CHECKS[name]()
            results[name] = "ok"
        except Exception:  # reported to the test, which fails naming it
            results[name] = traceback.format_exc()[-4000:]
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])

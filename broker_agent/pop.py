"""What a consumer group has consumed of one queue, and what it holds in flight: the pure
core of the RocketMQ 5 ("pop") consumption model. No clock, no I/O: time arrives as
`now_ms`, records arrive as `Candidate`s the shell read.

A queue's state for one group, on the master:
- `consumed`: every offset below it is done (acknowledged, filtered out by the group's
  tag filter, or moved to the dead-letter queue); `done` holds the done offsets above it.
  These two are the group's progress: the shell writes them as a %CONSUMER_OFFSET% record
  (offset + acknowledged ranges) before it answers an acknowledgement, so they replicate
  and survive a failover.
- `frontier`: the first offset this master has never delivered; below it, an offset that
  is not done is either leased (in flight, invisible until its deadline) or available
  (its lease expired or it was skipped to keep a FIFO group in order).
- leases: each delivery gets a new lease number; an acknowledgement or a change of the
  invisible duration names it, so a handle from an earlier delivery is refused.

Leases, delivery attempts and the frontier live in memory only. A new master starts
with frontier = consumed, so what was in flight on the old master is delivered again at
once (a bounded redelivery: at most `WINDOW_MAX` offsets per queue), and nothing that
was acknowledged is.

FIFO (a topic of type FIFO): at most one message per message group is in flight; a
group's next message waits until the previous one is done.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

WINDOW_MAX = 2048  # offsets above `consumed` a queue may have delivered or done (bounds the progress record)
SCAN_MAX = 1024  # offsets one receive looks at


@dataclass
class Lease:
    number: int
    deadline_ms: int
    client_id: str
    auto_renew: bool
    renew_until_ms: int
    message_group: str  # "" outside FIFO topics


@dataclass(frozen=True)
class Candidate:
    """A record the shell read for a receive: its offset, tag and FIFO message group."""

    offset: int
    tag: str
    message_group: str


class Verdict(enum.Enum):
    DELIVER = "deliver"
    SKIP = "skip"  # filtered out: done without delivery
    DEAD = "dead"  # past the attempts: the shell moves it to the dead-letter queue, then marks it done
    WAIT = "wait"  # its FIFO group has a message in flight


@dataclass(frozen=True)
class Delivery:
    offset: int
    lease: int
    attempt: int  # 1 for the first delivery


class AckResult(enum.Enum):
    DONE = "done"
    ALREADY_DONE = "already_done"
    STALE = "stale"  # another delivery's lease (it expired and was delivered again)
    UNKNOWN = "unknown"  # never delivered by this master


@dataclass
class QueueCursor:
    consumed: int
    done: set[int] = field(default_factory=set)
    frontier: int = -1
    leases: dict[int, Lease] = field(default_factory=dict)
    available: set[int] = field(default_factory=set)
    attempts: dict[int, int] = field(default_factory=dict)
    last_lease: dict[int, int] = field(default_factory=dict)  # also of expired leases
    next_lease: int = 1
    dirty: bool = False  # progress changed since it was last written

    def __post_init__(self) -> None:
        if self.frontier < self.consumed:
            self.frontier = self.consumed
        self.done = {o for o in self.done if o >= self.consumed}

    @staticmethod
    def from_progress(consumed: int, acked: Iterable[tuple[int, int]]) -> QueueCursor:
        done = {o for start, end in acked for o in range(start, end)}
        return QueueCursor(consumed=consumed, done=done)

    # Progress --------------------------------------------------------------------------------
    def progress(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(consumed, done ranges above it), as the %CONSUMER_OFFSET% record holds them."""
        ranges: list[tuple[int, int]] = []
        for offset in sorted(self.done):
            if ranges and ranges[-1][1] == offset:
                ranges[-1] = (ranges[-1][0], offset + 1)
            else:
                ranges.append((offset, offset + 1))
        return self.consumed, tuple(ranges)

    def _mark_done(self, offset: int) -> None:
        self.leases.pop(offset, None)
        self.available.discard(offset)
        self.attempts.pop(offset, None)
        self.last_lease.pop(offset, None)
        if offset >= self.consumed:
            self.done.add(offset)
        while self.consumed in self.done:
            self.done.discard(self.consumed)
            self.consumed += 1
        self.dirty = True

    def skip_to(self, offset: int) -> None:
        """Retention deleted what lies below `offset`: nothing there can be delivered."""
        if offset > self.consumed:
            for o in range(self.consumed, offset):
                self._mark_done(o)

    # Receiving -------------------------------------------------------------------------------
    def expire(self, now_ms: int, alive_clients: frozenset[str], renew_ms: int) -> None:
        """Leases past their deadline become available, except auto-renewed ones whose
        client is alive (the PushConsumer's: the server renews them, up to renew_until)."""
        for offset, lease in list(self.leases.items()):
            if lease.deadline_ms > now_ms:
                continue
            if lease.auto_renew and lease.client_id in alive_clients and now_ms < lease.renew_until_ms:
                lease.deadline_ms = now_ms + renew_ms
                continue
            del self.leases[offset]
            self.available.add(offset)

    def next_deadline_ms(self) -> int | None:
        return min((lease.deadline_ms for lease in self.leases.values()), default=None)

    def candidates(self, readable_end: int) -> list[int]:
        """Offsets a receive may deliver, in order: available ones, then new ones up to the
        readable end and the window."""
        limit = min(readable_end, self.consumed + WINDOW_MAX)
        found = sorted(o for o in self.available if o < limit)[:SCAN_MAX]
        fresh = range(self.frontier, min(limit, self.frontier + SCAN_MAX - len(found)))
        return found + list(fresh)

    def has_work(self, readable_end: int) -> bool:
        return bool(self.available) or self.frontier < min(readable_end, self.consumed + WINDOW_MAX)

    def judge(
        self, candidate: Candidate, tags: frozenset[str] | None, max_attempts: int, fifo: bool
    ) -> Verdict:
        """What a receive does with one candidate (pure: nothing changes)."""
        if tags is not None and candidate.tag not in tags:
            return Verdict.SKIP
        if self.attempts.get(candidate.offset, 0) >= max_attempts:
            return Verdict.DEAD
        if fifo and candidate.message_group and self._group_in_flight(candidate.message_group):
            return Verdict.WAIT
        return Verdict.DELIVER

    def _group_in_flight(self, message_group: str) -> bool:
        return any(lease.message_group == message_group for lease in self.leases.values())

    def apply(self, candidate: Candidate, verdict: Verdict, grant: LeaseGrant | None) -> Delivery | None:
        """Carries out `verdict` (DEAD is marked done by `dead_lettered` once the copy is written)."""
        offset = candidate.offset
        if offset >= self.frontier:
            # Offsets skipped over on the way become available (FIFO waits, dead letters).
            self.available.update(range(self.frontier, offset))
            self.frontier = offset + 1
        if verdict is Verdict.SKIP:
            self._mark_done(offset)
            return None
        if verdict in (Verdict.WAIT, Verdict.DEAD):
            self.available.add(offset)
            return None
        assert grant is not None, "a delivery needs a lease grant"
        self.available.discard(offset)
        attempt = self.attempts.get(offset, 0) + 1
        self.attempts[offset] = attempt
        number = self._new_lease(offset)
        self.leases[offset] = Lease(
            number,
            grant.now_ms + grant.invisible_ms,
            grant.client_id,
            grant.auto_renew,
            grant.now_ms + grant.renew_max_ms,
            candidate.message_group,
        )
        return Delivery(offset, number, attempt)

    def _new_lease(self, offset: int) -> int:
        number = self.next_lease
        self.next_lease += 1
        self.last_lease[offset] = number
        return number

    def dead_lettered(self, offset: int) -> None:
        self._mark_done(offset)

    # Acknowledging -----------------------------------------------------------------------------
    def _check_lease(self, offset: int, lease: int) -> AckResult | None:
        if offset < self.consumed or offset in self.done:
            return AckResult.ALREADY_DONE
        held = self.leases.get(offset)
        if held is not None:
            return None if held.number == lease else AckResult.STALE
        if offset in self.last_lease:
            # Expired but not delivered again: a late acknowledgement of the last delivery counts.
            return None if self.last_lease[offset] == lease else AckResult.STALE
        return AckResult.UNKNOWN

    def ack(self, offset: int, lease: int) -> AckResult:
        refused = self._check_lease(offset, lease)
        if refused is not None:
            return refused
        self._mark_done(offset)
        return AckResult.DONE

    def change_invisible(self, offset: int, lease: int, now_ms: int, invisible_ms: int) -> int | AckResult:
        """A new lease for the same delivery (the client nacks with its retry backoff, or
        asks for more time); returns its number, or why not. The delivery attempt stays."""
        refused = self._check_lease(offset, lease)
        if refused is not None:
            return refused
        old = self.leases.get(offset)
        self.available.discard(offset)
        number = self._new_lease(offset)
        self.leases[offset] = Lease(
            number,
            now_ms + invisible_ms,
            old.client_id if old else "",
            False,  # an explicit duration ends the server's renewing
            now_ms + invisible_ms,
            old.message_group if old else "",
        )
        return number


@dataclass(frozen=True)
class LeaseGrant:
    """How a receive leases what it delivers."""

    now_ms: int
    invisible_ms: int
    client_id: str
    auto_renew: bool
    renew_max_ms: int

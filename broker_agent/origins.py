"""The origin table: what a target broker set holds of each source queue (pure).

Cross-cluster replication makes every copy carry its origin (source cluster, broker set,
topic, queue, queue offset) and the origin offset it follows in the replicator's chain
(mqmeta.formats.origin). Per origin queue the table keeps the head: the highest origin
offset stored and where its copy is. It is derived from the commit log like consumer
offsets (kept by every replica as records are appended or replicated, checkpointed with
the index, replayed from the log on truncation), so it fails over with the data. The
store judges and appends a send under its one lock: a check and its append are atomic
with respect to every other send.

The chain rule (`judge`), Kafka's idempotent-producer sequence applied to origin offsets:
- a message at or below the head is a duplicate: it is stored already, and the send is
  answered with the original's position (never stored twice);
- the first message above the head must say it follows the head exactly
  (`previous == head`, -1 when the table holds nothing of that origin); otherwise the
  batch is refused with OUT_OF_ORDER, or ORIGIN_AHEAD when its predecessor is missing
  (the broker service holds such a send briefly for the predecessor to arrive: batches in
  flight together may reach it out of order); the sender then asks for the head and
  resends from there. So a batch is never judged a duplicate unless it is stored (Pulsar
  #26113), and a reordered or broken pipeline never skips data;
- within a batch, messages of one origin go up strictly and each follows the one before.
Rule filters make origin offsets non-contiguous; that is why the chain names the previous
offset sent instead of assuming offset - 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mqmeta.errors import FailedPrecondition, InvalidArgument
from mqmeta.formats.origin import NO_PREVIOUS, Origin, OriginKey

ORIGINS_MAX = 1 << 18  # origin queues one store keeps heads for
ORIGIN_AHEAD = "ORIGIN_AHEAD"


@dataclass(frozen=True)
class OriginHead:
    offset: int  # the highest origin offset stored
    topic: str  # the target queue holding this origin's copies
    queue_id: int
    queue_offset: int  # where the copy of `offset` is
    commit_offset: int
    size: int

    @property
    def end_offset(self) -> int:
        return self.commit_offset + self.size


@dataclass(frozen=True)
class Incoming:
    """One message of a send, as the table sees it."""

    origin: Origin | None
    topic: str
    queue_id: int


def check_chain(batch: Sequence[Incoming]) -> None:
    """Within a batch, each origin's messages go up strictly and each follows the previous
    one (InvalidArgument otherwise: a sender bug, not a retryable refusal)."""
    last: dict[OriginKey, Origin] = {}
    queues: dict[OriginKey, tuple[str, int]] = {}
    for message in batch:
        origin = message.origin
        if origin is None:
            continue
        before = last.get(origin.key)
        if before is not None and (origin.offset <= before.offset or origin.previous != before.offset):
            raise InvalidArgument(
                f"origin {origin.key.label()}: offset {origin.offset} (after {origin.previous}) does not "
                f"follow {before.offset} in the same send"
            )
        if origin.previous >= origin.offset:
            raise InvalidArgument(
                f"origin {origin.key.label()}: offset {origin.offset} cannot follow {origin.previous}"
            )
        target = (message.topic, message.queue_id)
        if queues.setdefault(origin.key, target) != target:
            raise InvalidArgument(f"origin {origin.key.label()} is sent to two target queues in one send")
        last[origin.key] = origin


class OriginTable:
    def __init__(self, heads: dict[OriginKey, OriginHead] | None = None) -> None:
        self.heads: dict[OriginKey, OriginHead] = dict(heads or {})

    def held(self, key: OriginKey) -> int:
        head = self.heads.get(key)
        return NO_PREVIOUS if head is None else head.offset

    def judge(self, batch: Sequence[Incoming]) -> list[bool]:
        """Which messages of the batch are duplicates (True) and which are new (False);
        raises when the batch may not be stored at all (see the module docstring)."""
        check_chain(batch)
        verdicts: list[bool] = []
        first_new: set[OriginKey] = set()
        new_keys = 0
        for message in batch:
            origin = message.origin
            if origin is None:
                verdicts.append(False)
                continue
            head = self.heads.get(origin.key)
            if head is not None and (head.topic, head.queue_id) != (message.topic, message.queue_id):
                raise FailedPrecondition(
                    f"origin {origin.key.label()} is replicated into {head.topic}/{head.queue_id}, "
                    f"not {message.topic}/{message.queue_id}",
                    code="ORIGIN_QUEUE_CONFLICT",
                )
            held = NO_PREVIOUS if head is None else head.offset
            if origin.offset <= held:
                verdicts.append(True)
                continue
            if origin.key not in first_new:
                first_new.add(origin.key)
                new_keys += head is None
                if origin.previous != held:
                    raise FailedPrecondition(
                        f"origin {origin.key.label()}: offset {origin.offset} follows {origin.previous}, but "
                        f"this broker set holds up to {held}; resend from {held} (ask QueryOrigin)",
                        # AHEAD: its predecessor has not arrived (yet); it may still come.
                        code=ORIGIN_AHEAD if origin.previous > held else "OUT_OF_ORDER",
                    )
            verdicts.append(False)
        if len(self.heads) + new_keys > ORIGINS_MAX:
            raise FailedPrecondition(f"this store already keeps {ORIGINS_MAX} origin queues")
        return verdicts

    def copy(self) -> OriginTable:
        return OriginTable(self.heads)

    def note(self, origin: Origin, head: OriginHead) -> None:
        """A copy of `origin` is in the log at `head` (appended, replicated or scanned)."""
        current = self.heads.get(origin.key)
        if current is None or head.offset > current.offset:
            self.heads[origin.key] = head

    # Persistence with the index checkpoint -------------------------------------------------
    def to_rows(self) -> list[list[object]]:
        return [
            [*key, h.offset, h.topic, h.queue_id, h.queue_offset, h.commit_offset, h.size]
            for key, h in sorted(self.heads.items())
        ]

    @classmethod
    def from_rows(cls, rows: Iterable[object]) -> OriginTable:
        """ValueError when a row is malformed (the checkpoint is then not used)."""
        heads: dict[OriginKey, OriginHead] = {}
        for row in rows:
            if not isinstance(row, list) or len(row) != 10:
                raise ValueError(f"origin row {row!r} has not 10 fields")
            cluster, broker, topic, queue_id, offset, target_topic, target_queue, queue_offset, at, size = row
            texts = (cluster, broker, topic, target_topic)
            numbers = (queue_id, offset, target_queue, queue_offset, at, size)
            if not all(isinstance(t, str) for t in texts) or not all(type(n) is int for n in numbers):
                raise ValueError(f"origin row {row!r} has a field of the wrong type")
            key = OriginKey(str(cluster), str(broker), str(topic), int(queue_id))  # type: ignore[arg-type]
            heads[key] = OriginHead(
                int(offset),  # type: ignore[arg-type]
                str(target_topic),
                int(target_queue),  # type: ignore[arg-type]
                int(queue_offset),  # type: ignore[arg-type]
                int(at),  # type: ignore[arg-type]
                int(size),  # type: ignore[arg-type]
            )
        return cls(heads)

"""Consumer progress: each consumer group's latest position in each queue.

Progress is written as records of the system topic %CONSUMER_OFFSET% (queue 0), so it
replicates with the data and follows truncation. A record holds a group's progress in
one queue: the offset below which everything is consumed and, for consumers that
acknowledge messages one by one (the RocketMQ 5 service), the ranges above it already
acknowledged; the latest record of a (group, topic, queue) is its whole progress.

`ConsumerProgress` is what the records up to the log's end say, and what they said at
the store's last checkpoint (which holds it, so an open replays only the records after
it). The store (store.py) sequences it with the log: it `note`s each progress record it
appends, scans or replicates, and rolls it back to the checkpoint at a truncation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from mqmeta.errors import CorruptData, FailedPrecondition, InvalidArgument
from mqmeta.formats import OFFSET_MAX
from mqmeta.formats.records import QUEUE_ID_MAX, TOPIC_PATTERN, Message, StoredRecord, validate_topic

CONSUMER_OFFSET_TOPIC = "%CONSUMER_OFFSET%"
CONSUMER_OFFSET_KEYS_MAX = 1 << 20
ACKED_RANGES_MAX = 4096  # per progress record: bounds its size (about 40 KB)

ConsumerKey = tuple[str, str, int]  # group, topic, queue id
AckedRanges = tuple[tuple[int, int], ...]  # [start, end) queue offsets above the consumed offset
Progress = tuple[int, AckedRanges]  # consumed offset, acknowledged ranges above it
ProgressEntry = tuple[str, str, int, int, AckedRanges]  # group, topic, queue id, offset, acked


def check_int(kind: str, value: object, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{kind} {value!r} is not an integer in [{minimum}, {maximum}]")
    return value


def progress_body(group: str, topic: str, queue_id: int, offset: int, acked: AckedRanges = ()) -> bytes:
    """The body of a %CONSUMER_OFFSET% record."""
    body: dict[str, object] = {"group": group, "offset": offset, "queue_id": queue_id, "topic": topic}
    if acked:  # absent when empty: a plain consumer offset record keeps its old bytes
        body["acked"] = [list(r) for r in acked]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def check_acked_ranges(offset: int, acked: Any) -> AckedRanges:
    """`acked` as sorted, disjoint, non-adjacent [start, end) ranges above `offset`;
    ValueError when it is not."""
    if not isinstance(acked, list | tuple) or len(acked) > ACKED_RANGES_MAX:
        raise ValueError(f"acked must be a list of at most {ACKED_RANGES_MAX} ranges")
    ranges: list[tuple[int, int]] = []
    previous_end = offset
    for item in acked:
        if not isinstance(item, list | tuple) or len(item) != 2 or any(type(v) is not int for v in item):
            raise ValueError(f"acked range {item!r} is not [start, end)")
        start, end = item
        if not previous_end < start < end <= OFFSET_MAX:
            raise ValueError(f"acked range {item!r} is not sorted, disjoint and above {offset}")
        ranges.append((start, end))
        previous_end = end
    return tuple(ranges)


def parse_progress(record: StoredRecord) -> tuple[ConsumerKey, Progress]:
    """The key and progress a %CONSUMER_OFFSET% record holds; CorruptData when malformed."""
    try:
        body = json.loads(record.body)
        key = (body["group"], body["topic"], body["queue_id"])
        offset = body["offset"]
        if not (
            isinstance(key[0], str)
            and isinstance(key[1], str)
            and type(key[2]) is int
            and type(offset) is int
            and offset >= 0
        ):
            raise TypeError("group, topic, queue_id or offset")
        acked = check_acked_ranges(offset, body.get("acked", []))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        raise CorruptData(
            f"consumer offset record at {record.commit_offset} has a malformed body {record.body[:200]!r}"
        ) from None
    return key, (offset, acked)


def progress_records(entries: list[ProgressEntry]) -> tuple[list[Message], dict[ConsumerKey, Progress]]:
    """The %CONSUMER_OFFSET% messages recording `entries`, and the progress they set;
    InvalidArgument naming the first malformed entry."""
    messages: list[Message] = []
    progress: dict[ConsumerKey, Progress] = {}
    for group, topic, queue_id, offset, acked in entries:
        if not isinstance(group, str) or not TOPIC_PATTERN.fullmatch(group):
            raise InvalidArgument(
                f"group {group!r} is malformed: use 1-127 characters from A-Z a-z 0-9 _ - % |"
            )
        validate_topic(topic)
        check_int("queue_id", queue_id, 0, QUEUE_ID_MAX)
        check_int("offset", offset, 0, OFFSET_MAX)
        try:
            ranges = check_acked_ranges(offset, acked)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        progress[(group, topic, queue_id)] = (offset, ranges)
        messages.append(
            Message(CONSUMER_OFFSET_TOPIC, 0, progress_body(group, topic, queue_id, offset, ranges))
        )
    return messages, progress


class ConsumerProgress:
    """Every group's latest progress (`current`), and as of the last checkpoint. Not
    thread-safe: the store calls it under its lock."""

    def __init__(self) -> None:
        self.current: dict[ConsumerKey, Progress] = {}
        self.at_checkpoint: dict[ConsumerKey, Progress] = {}

    def get(self, key: ConsumerKey) -> Progress | None:
        return self.current.get(key)

    def offsets_of(self, topic: str, queue_id: int) -> list[tuple[str, int]]:
        """(group, committed offset) of every group with progress in topic/queue_id."""
        return sorted((g, p[0]) for (g, t, q), p in self.current.items() if (t, q) == (topic, queue_id))

    def note(self, record: StoredRecord) -> None:
        """A %CONSUMER_OFFSET% record read from the log."""
        key, value = parse_progress(record)
        self.current[key] = value

    def update(self, progress: dict[ConsumerKey, Progress]) -> None:
        self.current.update(progress)

    def check_room(self, progress: dict[ConsumerKey, Progress]) -> None:
        new_keys = len(progress.keys() - self.current.keys())
        if len(self.current) + new_keys > CONSUMER_OFFSET_KEYS_MAX:
            raise FailedPrecondition(f"{CONSUMER_OFFSET_KEYS_MAX} consumer offsets already kept")

    def restore(
        self, at_checkpoint: dict[ConsumerKey, Progress], current: dict[ConsumerKey, Progress]
    ) -> None:
        self.at_checkpoint, self.current = dict(at_checkpoint), dict(current)

    def checkpointed(self) -> None:
        """The checkpoint just written holds `current`."""
        self.at_checkpoint = dict(self.current)

    def roll_back(self, records: Iterable[StoredRecord], from_checkpoint: bool) -> None:
        """After a truncation: the progress as of the checkpoint (or none, when the log was
        cut below it) updated with `records`, the progress records the log still holds
        past that point."""
        self.current = self.replay(self.at_checkpoint if from_checkpoint else {}, records)

    @staticmethod
    def replay(
        start_from: dict[ConsumerKey, Progress], records: Iterable[StoredRecord]
    ) -> dict[ConsumerKey, Progress]:
        """`start_from` updated with the progress `records` hold, in order."""
        offsets = dict(start_from)
        for record in records:
            key, value = parse_progress(record)
            offsets[key] = value
        return offsets

    # The checkpoint's "consumer_offsets" -------------------------------------------------
    def rows(self) -> list[list[Any]]:
        return [
            [g, t, q, o, [list(r) for r in acked]] if acked else [g, t, q, o]
            for (g, t, q), (o, acked) in sorted(self.current.items())
        ]

    @staticmethod
    def from_rows(rows: Any) -> dict[ConsumerKey, Progress]:
        """What rows() wrote; KeyError, TypeError or ValueError when it is not that."""
        return {
            (row[0], row[1], row[2]): (row[3], check_acked_ranges(row[3], row[4] if len(row) > 4 else []))
            for row in rows
        }

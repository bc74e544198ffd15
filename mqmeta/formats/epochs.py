"""The broker's epoch file: which master epoch wrote which range of the commit log.

Entries are (epoch, start_offset): epochs strictly increase, start offsets never
decrease, and epoch E's records are [start of E, start of the next entry) (or up to
the log's end for the last entry). RocketMQ's EpochFileCache and Kafka's
LeaderEpochFileCache keep the same list; a slave compares its list with the master's
to find how much of its log it can keep (consistent_point).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from pathlib import Path

from mqmeta.errors import CorruptData, FailedPrecondition, InvalidArgument
from mqmeta.formats.atomic import write_atomically
from mqmeta.formats.checksummed import dump_checksummed, load_checksummed

EPOCH_ENTRIES_MAX = 100_000
EpochEntry = tuple[int, int]  # epoch, start offset


def _check_entries(entries: Sequence[EpochEntry], where: str) -> None:
    for (epoch, start), (next_epoch, next_start) in zip(entries, entries[1:], strict=False):
        if next_epoch <= epoch or next_start < start:
            raise CorruptData(
                f"{where}: entries ({epoch}, {start}) then ({next_epoch}, "
                f"{next_start}) break the order (epochs strictly increase, "
                "start offsets never decrease)"
            )


def _end_of(entries: Sequence[EpochEntry], epoch: int, max_offset: int) -> int | None:
    for i, (entry_epoch, _) in enumerate(entries):
        if entry_epoch == epoch:
            return entries[i + 1][1] if i + 1 < len(entries) else max_offset
    return None


def consistent_point(
    slave_entries: Sequence[EpochEntry],
    master_entries: Sequence[EpochEntry],
    master_max_offset: int,
    slave_max_offset: int,
) -> int:
    """The offset up to which the slave's log is identical to the master's.

    Walks the slave's epochs newest first (RocketMQ's EpochFileCache, Kafka's
    leader-epoch truncation): the first one the master also has, with the same start
    offset, was written by the same master, so the logs agree up to where either copy
    of that epoch ends. No common epoch: 0. Always within [0, slave_max_offset].
    """
    master_starts = dict(master_entries)
    for i in range(len(slave_entries) - 1, -1, -1):
        epoch, start = slave_entries[i]
        if master_starts.get(epoch) != start:
            continue
        slave_end = slave_entries[i + 1][1] if i + 1 < len(slave_entries) else slave_max_offset
        master_end = _end_of(master_entries, epoch, master_max_offset)
        assert master_end is not None
        return max(0, min(slave_end, master_end, slave_max_offset))
    return 0


class EpochFile:
    """The durable (epoch, start offset) list, rewritten atomically on every change."""

    def __init__(self, path: Path | str, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = self._load()

    def _load(self) -> list[EpochEntry]:
        if not self.path.exists():
            return []
        body = load_checksummed(self.path)
        raw = body.get("entries")
        if not isinstance(raw, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(type(v) is int and v >= 0 for v in e) for e in raw
        ):
            raise CorruptData(f"{self.path}: entries are not [epoch, start_offset] pairs")
        entries = [(int(e[0]), int(e[1])) for e in raw]
        _check_entries(entries, str(self.path))
        return entries

    def _save(self, entries: list[EpochEntry]) -> None:
        write_atomically(self.path, dump_checksummed({"entries": [list(e) for e in entries]}), self.fsync)
        self._entries = entries

    @property
    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def last_epoch(self) -> int:
        """0 when there is no entry."""
        with self._lock:
            return self._entries[-1][0] if self._entries else 0

    def append(self, epoch: int, start_offset: int) -> None:
        """Adds (epoch, start_offset); durable on return.

        When the last entry starts at the same offset, it wrote nothing, so the new
        entry replaces it (as Kafka does): a start offset then always names the first
        record of its epoch, except for the last entry, which may still be empty.
        """
        for kind, value in (("epoch", epoch), ("start_offset", start_offset)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"{kind} {value!r} is not a non-negative integer")
        if epoch == 0:
            raise InvalidArgument("epoch 0 means 'no epoch'; master epochs start at 1")
        with self._lock:
            entries = list(self._entries)
            if entries:
                last_epoch, last_start = entries[-1]
                if epoch <= last_epoch:
                    raise FailedPrecondition(
                        f"{self.path}: epoch {epoch} is not newer than the last epoch {last_epoch}"
                    )
                if start_offset < last_start:
                    raise FailedPrecondition(
                        f"{self.path}: epoch {epoch} would start at "
                        f"{start_offset}, before epoch {last_epoch}'s start "
                        f"{last_start}"
                    )
                if start_offset == last_start:
                    entries.pop()
            if len(entries) >= EPOCH_ENTRIES_MAX:
                raise FailedPrecondition(f"{self.path}: {EPOCH_ENTRIES_MAX} epoch entries")
            entries.append((epoch, start_offset))
            self._save(entries)

    def truncate_from(self, offset: int) -> None:
        """Drops the entries whose records all lie at or after `offset` (start >= offset);
        an entry starting before `offset` stays. Durable on return."""
        with self._lock:
            kept = [e for e in self._entries if e[1] < offset]
            if kept != self._entries:
                self._save(kept)

    def end_offset_of(self, epoch: int, max_offset: int) -> int | None:
        """Where `epoch`'s records end: the next entry's start, or `max_offset` for the
        last entry; None when the epoch is not in the file."""
        with self._lock:
            return _end_of(self._entries, epoch, max_offset)

    def epoch_at(self, offset: int) -> int:
        """The epoch of the entry covering `offset` (0 when none does)."""
        with self._lock:
            return epoch_covering(self._entries, offset)


def epoch_covering(entries: Sequence[EpochEntry], offset: int) -> int:
    """The epoch of the last entry starting at or before `offset` (0 when none does)."""
    i = bisect.bisect_right(entries, offset, key=lambda entry: entry[1])
    return entries[i - 1][0] if i else 0

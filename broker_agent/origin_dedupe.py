"""The store's origin dedupe: what it holds of each origin queue, kept from the commit log.

The rules are the origin table's (origins.py, pure); this module keeps one table beside the
queue index as the log grows, is appended to or replicated to, or is cut: it notes each
stored copy's origin, replays the log on truncation and on a reopen past a cut, and finds
a copy's record by looking back from its queue's head (bounded). The store calls it under
its one lock, so a send's judgement and its append are atomic (store.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mqmeta.broker_agent.commitlog import SCAN_READ_BYTES, CommitLog
from mqmeta.broker_agent.origins import Incoming, OriginHead, OriginTable
from mqmeta.broker_agent.queue_index import QueueFile, QueueIndex

from mqmeta.errors import InvalidArgument
from mqmeta.formats.origin import Origin, OriginKey, origin_of
from mqmeta.formats.records import RecordHead, StoredRecord, iter_records

log = logging.getLogger(__name__)

COPY_SEARCH_RECORDS_MAX = 16384  # how far back a resend's original copy is looked for


class OriginDedupe:
    """The origin table of one store, and its state as of the last checkpoint."""

    def __init__(self, log: CommitLog, index: QueueIndex, where: str) -> None:
        self._log = log
        self._index = index
        self._where = where  # the store's directory, for log lines
        self.table = OriginTable()  # per origin queue, the highest copy held
        self._checkpointed = OriginTable()

    # The table's life beside the checkpoint -------------------------------------------------
    def restore(self, table: OriginTable) -> None:
        """`table` is current and checkpointed (a checkpoint loaded, or an empty store)."""
        self.table = table
        self._checkpointed = table.copy()

    def checkpointed(self) -> None:
        self._checkpointed = self.table.copy()

    def rows(self) -> list[list[object]]:
        return self.table.to_rows()

    def replay_from(self, start: int) -> None:
        """The table rebuilt from the copies in [start, max_offset) of the log alone."""
        self.table = self._replayed(OriginTable(), start)

    def roll_back(self, start: int, from_checkpoint: bool) -> None:
        """After a truncation: the checkpoint's table (when still true) or an empty one,
        updated with the copies from `start` that the log still holds."""
        self.table = self._replayed(self._checkpointed.copy() if from_checkpoint else OriginTable(), start)

    def _replayed(self, table: OriginTable, start: int) -> OriginTable:
        offset, end = max(start, self._log.min_offset), self._log.max_offset
        while offset < end:
            data = self._log.read(offset, SCAN_READ_BYTES)
            for record in iter_records(data, offset):
                self._note(table, record)
            offset += len(data)
        return table

    # Noting copies ---------------------------------------------------------------------------
    def note(self, record: StoredRecord | RecordHead) -> None:
        """A record appended (scanned at open, or replicated from the master)."""
        self._note(self.table, record)

    def _note(self, table: OriginTable, record: StoredRecord | RecordHead) -> None:
        try:
            origin = origin_of(record.properties)
        except InvalidArgument as error:  # checked when it was sent: written by another version
            log.warning("%s: record at %d: %s", self._where, record.commit_offset, error.message)
            return
        if origin is not None:
            table.note(
                origin,
                OriginHead(
                    origin.offset,
                    record.topic,
                    record.queue_id,
                    record.queue_offset,
                    record.commit_offset,
                    record.size,
                ),
            )

    def note_stored(self, origin: Origin, head: OriginHead) -> None:
        """A copy this store's put just appended, at `head`."""
        self.table.note(origin, head)

    # Judging and finding copies ---------------------------------------------------------------
    def judge(self, incoming: Sequence[Incoming]) -> list[bool]:
        """For each message of a send, whether its copy is stored already (origins.py's rules)."""
        return self.table.judge(incoming)

    def head(self, key: OriginKey) -> OriginHead | None:
        return self.table.heads.get(key)

    def original_of(self, origin: Origin) -> StoredRecord | None:
        """The stored copy of `origin`, or None when the bounded search does not reach it
        (or its offset was filtered out at the source: never sent, so never stored)."""
        head = self.table.heads[origin.key]
        found = self._copy_at_or_below(head, origin.key, origin.offset)
        if found is not None and found[1].offset == origin.offset:
            return found[0]
        return None

    def translate(self, key: OriginKey, offset: int) -> int | None:
        """The target queue offset matching source consumer offset `offset` of origin queue
        `key` (everything below `offset` consumed): one past the copy of the highest origin
        offset below it, or the first copy held when none is below it (an earlier one was
        filtered or is too old to look up). None when this store holds no copy of `key`."""
        head = self.table.heads.get(key)
        if head is None:
            return None
        if head.offset < offset:
            return head.queue_offset + 1
        below = self._copy_at_or_below(head, key, offset - 1)
        if below is not None:
            return below[0].queue_offset + 1
        queue = self._index.queues[(head.topic, head.queue_id)]
        low, _ = self._search_range(head)
        for i in range(low, head.queue_offset - queue.base + 1):
            record = self._log.read_record_at(*queue.entry(i))
            found = origin_of(record.properties)
            if found is not None and found.key == key:
                return record.queue_offset
        return head.queue_offset

    def _search_range(self, head: OriginHead) -> tuple[int, int]:
        """The entries of `head`'s queue a search may read, as indexes [low, high] into it:
        at most COPY_SEARCH_RECORDS_MAX back from the head and never below the log's start."""
        queue = self._index.queues[(head.topic, head.queue_id)]
        high = head.queue_offset - queue.base
        first_held = queue.min_offset(self._log.min_offset) - queue.base
        return max(first_held, high - COPY_SEARCH_RECORDS_MAX), high

    def _copy_at_or_below(
        self, head: OriginHead, key: OriginKey, offset: int
    ) -> tuple[StoredRecord, Origin] | None:
        """The copy of `key` with the highest origin offset at or below `offset`, by binary
        search from the head back: a queue holds the copies of one origin queue in origin
        order, interleaved with other records. The first guess assumes no gaps (the common
        case: one read); a send of many copies stored before costs a few reads each, never a
        walk of the whole queue under the store's lock."""
        queue = self._index.queues[(head.topic, head.queue_id)]
        low, high = self._search_range(head)
        best: tuple[StoredRecord, Origin] | None = None
        guess = high - (head.offset - offset)
        while low <= high:
            probe = guess if low <= guess <= high else (low + high) // 2
            guess = -1
            found = self._copy_at_or_before(queue, key, probe, low)
            if found is None:
                low = probe + 1  # nothing of `key` in [low, probe]
                continue
            index, record, origin = found
            if origin.offset == offset:
                return record, origin
            if origin.offset < offset:
                best, low = (record, origin), probe + 1
            else:
                high = index - 1
        return best

    def _copy_at_or_before(
        self, queue: QueueFile, key: OriginKey, index: int, low: int
    ) -> tuple[int, StoredRecord, Origin] | None:
        """The last copy of `key` at an entry in [low, index], with its entry index."""
        for i in range(index, low - 1, -1):
            record = self._log.read_record_at(*queue.entry(i))
            found = origin_of(record.properties)
            if found is not None and found.key == key:
                return i, record, found
        return None

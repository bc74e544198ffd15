"""The key index: for every topic, (key hash, commit offset) of each key of its records,
in commit-log order, so a message query by key reads only the records that may carry it
(RocketMQ's IndexFile). The layout is mqmeta.formats.key_index's.

Like the queue index (queue_index.py), it is derived from the commit log and sequenced
by the store at the same five points: `add` after an append, `cut` at a truncation,
`flush` before the checkpoint, which lists `rows()` (topic, entry count, CRC-32 of the
entries); at open `load` what the checkpoint lists (the CRC must match) and re-add what
the log holds past it. A missing or doubtful file means a rebuild.

Bounded: a topic keeps at most `entries_max` entries; past it, its oldest half is
dropped and the topic's `covered_from` moves up to the first commit offset kept (a query
finds only what is covered; the audit checks only what is covered). A lookup scans the
topic's hashes in C (array.index), returns at most `found_max` offsets, newest first.
"""

from __future__ import annotations

import logging
import os
import sys
from array import array
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mqmeta.errors import CorruptData
from mqmeta.formats.atomic import fsync_dir, make_directories, write_atomically
from mqmeta.formats.key_index import (
    KEY_ENTRY,
    KEY_INDEX_HEADER,
    entries_crc,
    header,
    indexed_hashes,
    name_hash,
    parse_entries,
)
from mqmeta.formats.records import TOPIC_PATTERN

log = logging.getLogger(__name__)

# load() reads the little-endian file straight into native arrays
assert sys.byteorder == "little", "the key index loads its files as native u64 arrays"

KEY_ENTRIES_MAX_DEFAULT = 1 << 22  # per topic: 64 MiB of entries in memory and on disk
KEY_FOUND_MAX = 64  # offsets one lookup returns


class KeyFile:
    """One topic's entries: hashes and commit offsets as two C arrays (16 bytes an
    entry, no per-entry object), mirrored lazily to its file."""

    def __init__(self, topic: str, path: Path) -> None:
        self.topic, self.path = topic, path
        self.hashes = array("Q")
        self.offsets = array("Q")
        self.covered_from = 0  # commit offset from which every record with keys is indexed
        self.crc = 0  # CRC-32 of the packed entries
        self.flushed = 0  # entries durable in the file
        self.rewrite = True  # the file must be written whole (new, cut or halved)

    @property
    def count(self) -> int:
        return len(self.offsets)

    def packed(self, start: int = 0) -> bytes:
        pairs = array("Q", bytes(16 * (self.count - start)))
        pairs[0::2], pairs[1::2] = self.hashes[start:], self.offsets[start:]
        return pairs.tobytes()

    def append(self, hashes: list[int], commit_offset: int) -> None:
        for h in hashes:
            self.hashes.append(h)
            self.offsets.append(commit_offset)
        self.crc = entries_crc(b"".join(KEY_ENTRY.pack(h, commit_offset) for h in hashes), self.crc)

    def keep_from(self, i: int) -> None:
        """Drops the entries before index i (the oldest), or all of them."""
        self.hashes = self.hashes[i:]
        self.offsets = self.offsets[i:]
        self.crc = entries_crc(self.packed())
        self.rewrite = True

    def cut(self, commit_offset: int) -> None:
        keep = _first_at_or_after(self.offsets, commit_offset)
        if keep < self.count:
            del self.hashes[keep:]
            del self.offsets[keep:]
            self.crc = entries_crc(self.packed())
            self.flushed = min(self.flushed, keep)
            self.rewrite = True

    def find(self, hashed: int, found_max: int) -> list[int]:
        """Commit offsets of the entries with this hash, newest first, at most found_max
        (array.index scans in C; it has no end bound, so the matches are found forwards)."""
        matches: deque[int] = deque(maxlen=found_max)
        start = 0
        while True:
            try:
                i = self.hashes.index(hashed, start)
            except ValueError:
                break
            matches.append(self.offsets[i])
            start = i + 1
        return list(reversed(matches))

    def flush(self, fsync: bool) -> None:
        if self.rewrite:
            make_directories(self.path.parent, fsync)
            write_atomically(self.path, header() + self.packed(), fsync)
        elif self.flushed < self.count:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(
                    fd, self.packed(self.flushed), KEY_INDEX_HEADER.size + self.flushed * KEY_ENTRY.size
                )
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        self.flushed = self.count
        self.rewrite = False


def _first_at_or_after(offsets: array, commit_offset: int) -> int:
    low, high = 0, len(offsets)
    while low < high:
        middle = (low + high) // 2
        if offsets[middle] < commit_offset:
            low = middle + 1
        else:
            high = middle
    return low


class KeyIndex:
    """Every topic's key entries under `directory` (the store's keys/). Not thread-safe:
    the store calls it under its lock."""

    def __init__(self, directory: Path, entries_max: int = KEY_ENTRIES_MAX_DEFAULT) -> None:
        self.directory = directory
        self.entries_max = entries_max
        self.topics: dict[str, KeyFile] = {}
        self.start_offset = 0  # where the last rebuild began: a new topic is covered from it

    def rows(self) -> list[list[Any]]:
        return [[f.topic, f.count, f.crc, f.covered_from] for f in self.topics.values()]

    def load(self, listed: list[Any], trusted: int) -> bool:
        """Loads the files the checkpoint lists and cuts them at `trusted`; False (nothing
        loaded) when one is missing or its header, length or CRC does not match."""
        topics: dict[str, KeyFile] = {}
        try:
            for topic, count, crc, covered_from in listed:
                if not TOPIC_PATTERN.fullmatch(topic) or not all(
                    type(v) is int for v in (count, crc, covered_from)
                ):
                    raise ValueError(f"bad key index row for {topic!r}")
                path = self.directory / topic
                entries = parse_entries(path.read_bytes(), count, crc, str(path))
                key_file = KeyFile(topic, path)
                pairs = array("Q", entries)  # little-endian hosts: (hash, offset) pairs
                key_file.hashes, key_file.offsets = pairs[0::2], pairs[1::2]
                key_file.crc, key_file.covered_from, key_file.flushed = crc, covered_from, count
                key_file.rewrite = len(entries) + KEY_INDEX_HEADER.size != path.stat().st_size
                topics[topic] = key_file
        except (OSError, CorruptData, TypeError, ValueError) as exc:
            log.warning("%s: the key index will be rebuilt (%s)", self.directory, exc)
            return False
        listed_names = set(topics)
        if self.directory.is_dir():
            for path in self.directory.iterdir():
                if path.name not in listed_names:
                    path.unlink()  # written after the checkpoint: rebuilt from the log
        self.topics = topics
        self.cut(trusted)
        return True

    def reset(self, covered_from: int) -> None:
        """Empty, for a rebuild from the log at `covered_from` (its first record)."""
        self.topics = {}
        self.start_offset = covered_from
        if self.directory.is_dir():
            for path in self.directory.iterdir():
                path.unlink()

    def add(
        self, topic: str, keys: str, msg_id: str, commit_offset: int, properties: Mapping[str, str]
    ) -> None:
        """Indexes the record at `commit_offset` (nothing when it has no indexed name)."""
        hashes = indexed_hashes(keys, msg_id, commit_offset, properties)
        if not hashes:
            return
        key_file = self.topics.get(topic)
        if key_file is None:
            key_file = self.topics[topic] = KeyFile(topic, self.directory / topic)
            key_file.covered_from = self.start_offset
        if key_file.count + len(hashes) > self.entries_max:
            drop = max(key_file.count // 2, key_file.count + len(hashes) - self.entries_max)
            key_file.covered_from = key_file.offsets[drop] if drop < key_file.count else commit_offset
            key_file.keep_from(drop)
        key_file.append(hashes, commit_offset)

    def cut(self, commit_offset: int) -> None:
        for key_file in self.topics.values():
            key_file.cut(commit_offset)

    def flush(self, fsync: bool) -> None:
        make_directories(self.directory, fsync)
        for key_file in self.topics.values():
            key_file.flush(fsync)
        if fsync:
            fsync_dir(self.directory)

    def find(self, topic: str, kind: str, name: str, found_max: int = KEY_FOUND_MAX) -> list[int]:
        """Commit offsets of the records of `topic` that may carry the key or id `name`
        (kind KEY_KIND or ID_KIND), newest first."""
        key_file = self.topics.get(topic)
        return [] if key_file is None else key_file.find(name_hash(kind, name), found_max)

    def topic_names(self) -> list[str]:
        return sorted(self.topics)

    def covered_from(self, topic: str) -> int:
        key_file = self.topics.get(topic)
        return 0 if key_file is None else key_file.covered_from

"""A chunk of a snapshot's values kept encoded until a key in it is first read.

A node restarting from a snapshot of 100,000 topics spent most of its start decoding
values it did not need to serve its first read: unpickling 120,000 JSON trees and
building the maps that hold them (0.25 s of CPU on a quiet machine, seconds on a loaded
one). The snapshot (controller/snapshot.py, format 2) stores each chunk's keys apart
from its values and hashes; at load the keys are decoded (they say which keys exist
and of which kind), the values and hashes stay compressed in an `EncodedChunk` until a
key of the chunk is read or changed, and are then decoded once, a chunk at a time.

The bytes were checked before a chunk is made (the file's CRC-32); decoding checks
again that the chunk holds one value and one hash per key and that the hashes add up
to the sum the file's table recorded for it.
"""

from __future__ import annotations

import pickle
import threading
import zlib
from collections.abc import Iterator
from typing import Any

from mqmeta.errors import CorruptData

Json = dict[str, Any]


class EncodedChunk:
    """The values and hashes of `keys`, compressed, decoded on first use.

    Safe to read from several threads: one decodes, the others wait for it. The snapshot
    writer reads a chunk without keeping what it decoded (`peek`), so writing a snapshot
    does not turn a node's compact encoded values into decoded ones."""

    __slots__ = ("keys", "hash_sum", "_blob", "_decoded", "_lock")

    def __init__(self, keys: list[str], hash_sum: int, blob: bytes) -> None:
        self.keys = keys
        self.hash_sum = hash_sum
        self._blob: bytes | None = blob
        self._decoded: dict[str, tuple[Json, int]] | None = None
        self._lock = threading.Lock()

    def value_of(self, key: str) -> Json:
        return self._values()[key][0]

    def hash_of(self, key: str) -> int:
        return self._values()[key][1]

    def items(self) -> Iterator[tuple[str, Json, int]]:
        """(key, value, hash) of every key of the chunk, decoding it without keeping the
        result when it was not decoded yet."""
        decoded = self._decoded
        if decoded is None:
            with self._lock:
                decoded = self._decoded if self._decoded is not None else self._decode()
        for key, (value, entry_hash) in decoded.items():
            yield key, value, entry_hash

    @property
    def is_decoded(self) -> bool:
        return self._decoded is not None

    def _values(self) -> dict[str, tuple[Json, int]]:
        decoded = self._decoded
        if decoded is None:
            with self._lock:
                decoded = self._decoded
                if decoded is None:
                    decoded = self._decoded = self._decode()
                    self._blob = None
        return decoded

    def _decode(self) -> dict[str, tuple[Json, int]]:
        assert self._blob is not None, "a chunk is decoded once, under its lock"
        values, hashes = pickle.loads(zlib.decompress(self._blob))
        if len(values) != len(self.keys) or len(hashes) != len(self.keys) or sum(hashes) != self.hash_sum:
            raise CorruptData(
                f"a snapshot chunk of {len(self.keys)} keys decoded to {len(values)} values and "
                f"{len(hashes)} hashes that do not add up to the sum its table recorded"
            )
        return dict(zip(self.keys, zip(values, hashes, strict=True), strict=True))

    def __getstate__(self) -> tuple:
        return self.keys, self.hash_sum, self._blob, self._decoded

    def __setstate__(self, state: tuple) -> None:
        self.keys, self.hash_sum, self._blob, self._decoded = state
        self._lock = threading.Lock()

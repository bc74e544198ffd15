"""The key index's file layout, shared by the broker (broker_agent/key_index.py) and the
audit (which checks every entry against the records).

One file per topic, `keys/{topic}` under the store: a header (magic, version), then
16-byte entries (name hash u64, commit offset u64) in commit-log order, one per indexed
name of each record (indexed_names): its distinct keys, and the message ids that do not
name its own position (a RocketMQ client's id, a replicated copy's origin id). A hash is
the first 8 bytes of a BLAKE2b of the name with its kind ("k" key, "i" id) in front; a
lookup reads each record it points at and keeps those that carry the name (two names
may share a hash).

The store's index checkpoint (index/checkpoint.json, checksummed) lists each file with
its entry count and the CRC-32 of those entries: a file whose first `count` entries do
not match is rebuilt from the commit log, never trusted.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterator, Mapping

from mqmeta.errors import CorruptData
from mqmeta.formats.properties import KEY_SEPARATOR, MESSAGE_ID

KEY_INDEX_MAGIC = b"MQKX"
KEY_INDEX_VERSION = 1
KEY_INDEX_HEADER = struct.Struct("<4sI")  # magic, version
KEY_ENTRY = struct.Struct("<QQ")  # key hash, commit offset


KEY_KIND = "k"
ID_KIND = "i"


def name_hash(kind: str, name: str) -> int:
    """The 64-bit hash a key (kind "k") or a message id (kind "i") is indexed by."""
    return int.from_bytes(hashlib.blake2b((kind + name).encode(), digest_size=8).digest(), "little")


def record_keys(keys: str) -> list[str]:
    """A record's keys field as its distinct keys, in order (RocketMQ's space-separated KEYS)."""
    return list(dict.fromkeys(k for k in keys.split(KEY_SEPARATOR) if k))


def indexed_hashes(keys: str, msg_id: str, commit_offset: int, properties: Mapping[str, str]) -> list[int]:
    """The hashes a record is indexed under: each distinct key, the client's message id
    property, and its own id when that id does not end with its commit offset (a copy
    keeps its origin's id: make_msg_id ends with the commit offset)."""
    hashes = [name_hash(KEY_KIND, k) for k in record_keys(keys)] if keys else []
    ids = set()
    if properties:
        client_id = properties.get(MESSAGE_ID)
        if client_id:
            ids.add(client_id)
    if msg_id and msg_id[16:] != format(commit_offset, "016x"):
        ids.add(msg_id)
    hashes.extend(name_hash(ID_KIND, i) for i in sorted(ids))
    return hashes


def entries_crc(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """The CRC-32 of packed entries, continued from `crc` (an index grows by appends)."""
    return zlib.crc32(data, crc)


def header() -> bytes:
    return KEY_INDEX_HEADER.pack(KEY_INDEX_MAGIC, KEY_INDEX_VERSION)


def parse_entries(data: bytes, count: int, crc: int, what: str) -> bytes:
    """The first `count` packed entries of a key index file's bytes, checked against the
    header and `crc` (as the checkpoint lists them); CorruptData otherwise."""
    end = KEY_INDEX_HEADER.size + count * KEY_ENTRY.size
    if len(data) < end or data[: KEY_INDEX_HEADER.size] != header():
        raise CorruptData(f"{what}: header or length does not match the checkpoint ({count} entries)")
    entries = data[KEY_INDEX_HEADER.size : end]
    if entries_crc(entries) != crc:
        raise CorruptData(f"{what}: the entries' CRC-32 does not match the checkpoint")
    return entries


def iter_entries(entries: bytes | bytearray) -> Iterator[tuple[int, int]]:
    """(key hash, commit offset) of each packed entry."""
    return (pair for pair in KEY_ENTRY.iter_unpack(entries))

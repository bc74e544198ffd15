"""The applied-entry log: one checksummed JSON line per Raft entry a node applied.

It is the audit's view of a controller node (R1/R2 and the M1-M4 replay). Each line:
  {"index", "term", "node_id", "command_type", "command_digest", "state_digest",
   "commands", "effects", "crc32"}
where command_digest is the SHA-256 of the Raft entry's bytes (the JSON list of commands)
and crc32 covers the canonical JSON of every other field. After a crash the
torn last line (if any) is cut off, and entries the node replays from its Raft
journal are not written twice.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from typing import Any

from controller.state_machine import canonical_json
from mqmeta.errors import CorruptData

log = logging.getLogger(__name__)

TAIL_SCAN_BYTES = 1 << 20


def line_crc(record: dict[str, Any]) -> int:
    body = {k: v for k, v in record.items() if k != "crc32"}
    return zlib.crc32(canonical_json(body).encode())


def parse_line(text: str, where: str) -> dict[str, Any]:
    """Parses and verifies one line; raises CorruptData naming `where`."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptData(f"{where}: not a JSON line ({exc.msg})") from None
    if not isinstance(record, dict) or record.get("crc32") != line_crc(record):
        raise CorruptData(f"{where}: checksum mismatch")
    return record


class AppliedLog:
    def __init__(self, path: Path, node_id: str) -> None:
        self.path = path
        self.node_id = node_id
        self.last_index = self._recover()
        self._file = open(path, "ab")

    def _recover(self) -> int:
        """Returns the last index on disk, cutting off a torn final line."""
        if not self.path.exists():
            return 0
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            start = max(0, size - TAIL_SCAN_BYTES)
            f.seek(start)
            tail = f.read()
        lines = tail.split(b"\n")
        keep_end = size
        if lines and lines[-1]:  # no trailing newline: the last write was torn
            keep_end -= len(lines[-1])
            log.warning("%s: cutting off a torn last line of %d bytes", self.path, len(lines[-1]))
        complete = [ln for ln in lines[:-1] if ln]
        if start > 0 and complete:
            complete = complete[1:]  # the first line of the window may be partial
        last_index = 0
        for raw in reversed(complete):
            try:
                last_index = parse_line(raw.decode(), str(self.path))["index"]
                break
            except CorruptData as exc:
                log.error("%s (left in place for the audit to report)", exc)
        if keep_end != size:
            with open(self.path, "r+b") as f:
                f.truncate(keep_end)
        return last_index

    def append(self, record: dict[str, Any]) -> None:
        if record["index"] <= self.last_index:
            return  # replayed after a restart: already on disk
        record["node_id"] = self.node_id
        body = canonical_json(record).encode()  # serialized once: crc32 covers exactly this
        line = body[:-1] + b',"crc32":' + str(zlib.crc32(body)).encode() + b"}\n"
        self._file.write(line)
        self._file.flush()  # in the page cache: survives kill -9 of this process
        self.last_index = record["index"]

    def fsync(self) -> None:
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

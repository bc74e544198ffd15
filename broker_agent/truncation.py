"""A truncation's intent: truncate.json, present only while a truncation is in progress.

The store writes the intent (the offset) before it cuts the epoch file, the commit log and
the index, and removes it after; at open an intent found is redone before the index is
loaded (store.py: "Order of effects"). Every step of a truncation is idempotent.
"""

from __future__ import annotations

from pathlib import Path

from mqmeta.errors import CorruptData
from mqmeta.formats.atomic import fsync_dir, write_atomically
from mqmeta.formats.checksummed import dump_checksummed, load_checksummed

INTENT_FILE = "truncate.json"


class TruncationIntent:
    """The intent file of the store in `directory`."""

    def __init__(self, directory: Path, fsync: bool) -> None:
        self.directory = directory
        self.path = directory / INTENT_FILE
        self.fsync = fsync

    def read(self) -> int | None:
        """The offset of an interrupted truncation, or None when none was."""
        if not self.path.exists():
            return None
        body = load_checksummed(self.path)
        offset = body.get("offset")
        if type(offset) is not int or offset < 0:
            raise CorruptData(f"{self.path}: no valid offset")
        return offset

    def write(self, offset: int) -> None:
        write_atomically(self.path, dump_checksummed({"offset": offset}), self.fsync)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        if self.fsync:
            fsync_dir(self.directory)

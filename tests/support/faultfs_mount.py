"""A fault filesystem (chaos/faultfs) mounted for a test, and a directory fsync."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mqmeta.chaos.faultfs import FaultFs


@contextmanager
def mounted(base: Path) -> Iterator[FaultFs]:
    """A mount at base/mnt over base/backing (both made here), unmounted on exit."""
    (base / "backing").mkdir()
    (base / "mnt").mkdir()
    fs = FaultFs.mount(base / "backing", base / "mnt", log_path=base / "faultfs.log")
    try:
        yield fs
    finally:
        fs.unmount()


def sync_directory(path: Path) -> None:
    """fsync(2) of a directory: its entries (creates, renames, unlinks) become durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

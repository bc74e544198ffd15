"""Replacing a file so that a crash leaves either the old or the new one, whole."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    """Makes the directory's entries (a create, rename or unlink in it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(directory: Path, fsync: bool = True) -> None:
    """mkdir -p whose new entries survive a power loss: each directory it creates is
    made durable in its parent by a directory fsync (a fresh data dir whose parent was
    never fsynced is gone after the cut, with everything fsynced inside it)."""
    missing = []
    parent = Path(directory)
    while not parent.is_dir():
        missing.append(parent)
        parent = parent.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another process or thread
        if fsync:
            fsync_dir(path.parent)


def write_atomically(path: Path, data: bytes, fsync: bool = True) -> None:
    """temp + fsync + rename + directory fsync: the old file stays whole until the new
    one is durable. `fsync=False` keeps the atomic rename but not the durability (tests,
    throwaway files)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def write_json_atomically(path: Path, document: Any, fsync: bool = True, indent: int | None = None) -> None:
    """A JSON document (one trailing newline) written with write_atomically."""
    text = json.dumps(document, indent=indent) + "\n"
    write_atomically(path, text.encode(), fsync)

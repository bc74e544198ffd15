"""A controller node with a damaged Raft log or snapshot: found, discarded, re-joined (P16).

Every record of the journal carries a CRC-32 and the snapshot a gzip CRC and a state
digest (journal.py, snapshot.py). Found damaged, when the node opens them or by the
background scrub (one pass every `scrub_interval_s`, reading each file once), the node
does not refuse to start and does not serve from them, nor spread them:
- at start, the journal and the snapshot are moved aside (`damaged/<n>/` in the data
  dir, for a person to look at) and the node starts with an empty log; the term and the
  vote (a checksummed file of their own) are kept, so it never votes twice in a term;
- until it has applied the commit index it knew before (and what its leader commits),
  it neither votes nor stands for election (pysyncobj_compat.CatchUpFix): a node that
  lost entries it had acknowledged must not help elect a leader that lacks them; the
  leader sends it a snapshot of the others and the entries after it;
- the scrub of a running node that finds damage stops the node (exit EXIT_DAMAGED) so
  that its restart repairs it as above: a Raft log cannot be cut under pysyncobj safely;
- a log whose fsync failed (the journal stopped the node, exit EXIT_DISK_FAILED, and left
  `raft.journal.failed`: journal.fail_stop) is discarded the same way at the restart: its
  unsynced pages may read back from the page cache yet never reach the disk.

Counted (controller metrics): scrubs, damaged files found, repairs (re-joins).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mqmeta.controller.journal import DurableJournal, failed_marker, parse_records
from mqmeta.controller.snapshot import LoadedSnapshot, load_snapshot

from mqmeta.errors import CorruptData

log = logging.getLogger(__name__)

JOURNAL_NAME = "raft.journal"
SNAPSHOT_NAME = "raft.snapshot"
DAMAGED_DIR = "damaged"
SCRUB_INTERVAL_S_DEFAULT = 30
EXIT_DAMAGED = 75  # EX_TEMPFAIL: restart me (the restart repairs)


@dataclass
class RaftRepairStats:
    """What this node found and did since it started (the controller metrics export them)."""

    scrubs: int = 0
    corruptions_found: int = 0
    repairs: int = 0
    catch_up_index: int = 0  # > 0 while it may not vote: the index it must apply first


def damage_of(data_dir: Path) -> str | None:
    """Why this node's journal or snapshot cannot be trusted (None: both are sound). Reads
    each file whole: every journal record's CRC, the snapshot's gzip CRC and digest. A
    torn last journal record is not damage (a crash; the journal cuts it at open)."""
    return inspect_data_dir(data_dir)[0]


def inspect_data_dir(data_dir: Path) -> tuple[str | None, LoadedSnapshot | None]:
    """damage_of, and the snapshot as read and checked (None: damaged, or no snapshot):
    at start the node installs that read instead of reading the file again."""
    journal, snapshot = data_dir / JOURNAL_NAME, data_dir / SNAPSHOT_NAME
    marker = failed_marker(journal)
    if marker.exists():
        why = marker.read_text(errors="replace").strip()
        return f"an fsync of the Raft log failed before the last exit ({why}); it is not trusted", None
    try:
        if journal.exists():
            parse_records(journal.read_bytes(), str(journal))
        return None, load_snapshot(snapshot) if snapshot.exists() else None
    except CorruptData as error:
        return str(error), None
    except Exception as error:  # gzip, zlib and pickle each raise their own kinds
        return f"{snapshot} cannot be read ({type(error).__name__}: {error})", None


def discard_damaged(data_dir: Path, reason: str) -> int:
    """Moves the journal and the snapshot aside (kept for a person, never read again);
    returns the commit index the node knew, which it must apply again before it votes."""
    meta = data_dir / (JOURNAL_NAME + ".meta")
    commit_index = 1
    if meta.exists():
        commit_index = DurableJournal.read_commit_index(meta)
    parent = data_dir / DAMAGED_DIR
    parent.mkdir(exist_ok=True)
    target = parent / str(len(list(parent.iterdir())) + 1)
    target.mkdir()
    marker = failed_marker(data_dir / JOURNAL_NAME)
    for name in (JOURNAL_NAME, SNAPSHOT_NAME, marker.name):
        if (data_dir / name).exists():
            shutil.move(str(data_dir / name), str(target / name))
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    log.error(
        "the Raft log or snapshot is damaged (%s): moved to %s; this node re-joins from the "
        "others and does not vote before it has applied index %d again",
        reason,
        target,
        commit_index,
    )
    return commit_index


class RaftScrubber:
    """The background scrub of a running node's journal and snapshot (its own thread)."""

    def __init__(self, data_dir: Path, interval_s: int, stats: RaftRepairStats) -> None:
        self.data_dir = data_dir
        self.interval_s = interval_s
        self.stats = stats
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raft-scrub", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            started = time.monotonic()
            reason = damage_of(self.data_dir)
            self.stats.scrubs += 1
            if reason is None:
                continue
            if damage_of(self.data_dir) is None:
                continue  # a compaction replaced a file while it was read: look again next pass
            self.stats.corruptions_found += 1
            log.critical(
                "the Raft log or snapshot went bad under this node (%s, found in %.1f s); "
                "stopping it: its restart discards them and re-joins from the others",
                reason,
                time.monotonic() - started,
            )
            logging.shutdown()
            os._exit(EXIT_DAMAGED)

"""The crash-safe Raft journal (controller/journal.py), without a network.

Properties checked:
- what was added is read back after reopening, in order, with index and term;
- what a killed process wrote but did not sync is synced at open, before it is served;
- a torn last record (kill -9 or power loss mid-append) is cut off, the rest kept, also
  when the zeros written ahead of it follow it;
- records are written over zeros written ahead of them (the file grows by
  PREALLOCATE_BYTES at a time, not per record); those zeros are where the log ends,
  read back without a warning;
- a corrupt record with valid records after it is refused, never silently dropped;
- compaction (deleteEntriesTo) and truncation (deleteEntriesFrom) survive reopening;
- term and vote are durable immediately; a corrupt side file is refused; a commit
  index past the journal end is clamped (pysyncobj #197);
- a crash between writing a snapshot and compacting the journal keeps every entry
  after the snapshot (pysyncobj would clear the journal);
- a corrupt snapshot is refused;
- a disk error stops the node (journal.fail_stop): a short write is an error (ENOSPC), not
  a record counted as written; a failed fdatasync, truncation or compaction distrusts the
  log (the marker), a failed write or side-file save does not.
"""

from __future__ import annotations

import errno
import gzip

import pytest
from mqmeta.controller import journal as journal_module
from mqmeta.controller.journal import DurableJournal, reconcile_with_snapshot
from pysyncobj import pickle as syncobj_pickle

from mqmeta.errors import CorruptData


def entries(n: int, start: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(f"cmd-{i}".encode(), i, term) for i in range(start, start + n)]


def log_end(path) -> int:
    """Where the journal's last good record ends (the zeros written ahead follow it)."""
    return journal_module.parse_records(path.read_bytes(), str(path))[2]


def filled(path, items) -> DurableJournal:
    journal = DurableJournal(path)
    for item in items:
        journal.add(*item)
    return journal


def test_entries_survive_reopen(tmp_path):
    path = tmp_path / "raft.journal"
    filled(path, entries(5))._destroy()
    journal = DurableJournal(path)
    assert journal[:] == entries(5)
    assert journal[-1] == (b"cmd-5", 5, 1) and len(journal) == 5


def test_torn_last_record_is_cut_off(tmp_path):
    path = tmp_path / "raft.journal"
    filled(path, entries(5))._destroy()
    data = path.read_bytes()
    path.write_bytes(data[: log_end(path) - 3])  # the last append was torn
    journal = DurableJournal(path)
    assert journal[:] == entries(4)
    journal.add(b"next", 5, 2)
    journal._destroy()
    assert DurableJournal(path)[:] == entries(4) + [(b"next", 5, 2)]


def test_records_go_over_zeros_written_ahead_and_those_zeros_end_the_log_quietly(tmp_path, caplog):
    path = tmp_path / "raft.journal"
    journal = filled(path, entries(1))
    size = path.stat().st_size
    assert size == log_end(path) + journal_module.PREALLOCATE_BYTES
    for item in entries(50, start=2):
        journal.add(*item)
    assert path.stat().st_size == size, "an add within the zeros written ahead does not grow the file"
    assert path.read_bytes()[log_end(path) :].count(0) == size - log_end(path)
    # kill -9: nothing closed; the reopened journal ends where the records do, quietly
    caplog.clear()
    with caplog.at_level("WARNING", logger=journal_module.__name__):
        again = DurableJournal(path)
    assert again[:] == entries(51) and not caplog.records
    again.add(b"next", 52, 2)
    assert DurableJournal(path)[:] == entries(51) + [(b"next", 52, 2)]
    assert path.stat().st_size == size


def test_what_a_killed_process_left_unsynced_is_synced_at_open(tmp_path, monkeypatch):
    path = tmp_path / "raft.journal"
    journal = filled(path, entries(2))
    monkeypatch.setattr(journal, "fsync", False)  # as if the process died before its fdatasync
    journal.add(b"unsynced", 3, 1)
    synced: list[int] = []
    real = journal_module.os.fdatasync
    monkeypatch.setattr(journal_module.os, "fdatasync", lambda fd: synced.append(fd) or real(fd))
    again = DurableJournal(path)  # kill -9: the old one is not closed
    assert again[:] == entries(2) + [(b"unsynced", 3, 1)]
    assert synced == [again._fd], "the journal is synced at open, before it serves any entry"


def test_a_torn_record_before_the_zeros_written_ahead_is_cut_off(tmp_path, caplog):
    path = tmp_path / "raft.journal"
    filled(path, entries(5))._destroy()
    end = log_end(path)
    data = bytearray(path.read_bytes())
    data[end - 3 : end] = bytes(3)  # the last record's tail never reached the disk
    path.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger=journal_module.__name__):
        journal = DurableJournal(path)
    assert journal[:] == entries(4) and "torn last record" in caplog.text
    journal.add(b"next", 5, 2)
    assert DurableJournal(path)[:] == entries(4) + [(b"next", 5, 2)]


def test_corrupt_record_followed_by_valid_ones_is_refused(tmp_path):
    path = tmp_path / "raft.journal"
    filled(path, entries(5))._destroy()
    data = bytearray(path.read_bytes())
    data[log_end(path) // 3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="corrupt"):
        DurableJournal(path)


def test_compaction_and_truncation_survive_reopen(tmp_path):
    path = tmp_path / "raft.journal"
    journal = filled(path, entries(10))
    journal.deleteEntriesTo(4)  # keep entries 5..10
    journal.deleteEntriesFrom(4)  # then drop 9..10
    journal.add(b"x", 9, 3)
    journal._destroy()
    assert DurableJournal(path)[:] == entries(4, start=5) + [(b"x", 9, 3)]
    assert not (tmp_path / "raft.journal.tmp").exists()


def test_term_and_vote_are_durable_and_checked(tmp_path):
    path = tmp_path / "raft.journal"
    journal = filled(path, entries(3))
    journal.setCurrentTerm(7, "127.0.0.1:9001")
    # no _destroy(): as after kill -9
    again = DurableJournal(path)
    assert again.getCurrentTerm() == 7 and again.getVotedForNodeId() == "127.0.0.1:9001"
    meta = tmp_path / "raft.journal.meta"
    meta.write_text(meta.read_text().replace('"term": 7', '"term": 1'))
    with pytest.raises(CorruptData, match="term and vote are unknown"):
        DurableJournal(path)


def test_commit_index_past_the_end_is_clamped(tmp_path):
    path = tmp_path / "raft.journal"
    journal = filled(path, entries(3))
    journal.setRaftCommitIndex(500)
    journal._destroy()
    assert DurableJournal(path).getRaftCommitIndex() == 3


def test_a_new_journal_opens_without_a_warning(tmp_path, caplog):
    """A node's first start: commit index 1 (where pysyncobj starts) over no entries is
    no clamping to warn about; the side file of a journal opened again is not rewritten."""
    path = tmp_path / "raft.journal"
    meta = path.with_name(path.name + ".meta")
    with caplog.at_level("WARNING", logger=journal_module.__name__):
        DurableJournal(path)._destroy()
        written = meta.stat().st_mtime_ns if meta.exists() else None
        DurableJournal(path)._destroy()
    assert not caplog.records and DurableJournal(path).getRaftCommitIndex() == 1
    assert (meta.stat().st_mtime_ns if meta.exists() else None) == written


def write_snapshot(path, last, previous) -> None:
    with gzip.open(path, "wb") as f:
        syncobj_pickle.dump(({"_state": "opaque"}, last, previous, set()), f)


def test_crash_between_snapshot_and_compaction_keeps_later_entries(tmp_path):
    journal_path, snapshot_path = tmp_path / "raft.journal", tmp_path / "raft.snapshot"
    items = entries(20)
    filled(journal_path, items)._destroy()
    write_snapshot(snapshot_path, last=items[9], previous=items[8])  # snapshot at index 10
    reconcile_with_snapshot(journal_path, snapshot_path)
    journal = DurableJournal(journal_path)
    # pysyncobj keeps the journal only when it starts with exactly these two entries.
    assert journal[0] == items[8] and journal[1] == items[9]
    assert journal[:] == items[8:], "entries after the snapshot must all be kept"


def test_corrupt_snapshot_is_refused(tmp_path):
    journal_path, snapshot_path = tmp_path / "raft.journal", tmp_path / "raft.snapshot"
    items = entries(4)
    filled(journal_path, items)._destroy()
    write_snapshot(snapshot_path, last=items[3], previous=items[2])
    data = bytearray(snapshot_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snapshot_path.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="refuses to start"):
        reconcile_with_snapshot(journal_path, snapshot_path)


def test_a_flip_anywhere_in_the_snapshot_is_refused(tmp_path):
    """Reading must reach the gzip trailer: pickle alone stops early and misses the CRC."""
    journal_path, snapshot_path = tmp_path / "raft.journal", tmp_path / "raft.snapshot"
    items = entries(4)
    filled(journal_path, items)._destroy()
    write_snapshot(snapshot_path, last=items[3], previous=items[2])
    original = snapshot_path.read_bytes()
    content = gzip.decompress(original)
    refused = 0
    for position in range(10, len(original) - 8):  # past the header, before the trailer
        data = bytearray(original)
        data[position] ^= 0x01
        snapshot_path.write_bytes(bytes(data))
        try:
            reconcile_with_snapshot(journal_path, snapshot_path)
        except CorruptData:
            refused += 1
            continue
        # accepted: only allowed when the flip hit deflate padding and changed nothing
        assert gzip.decompress(bytes(data)) == content, f"flip at {position} was used"
    assert refused > (len(original) - 18) * 0.9


class Stopped(Exception):
    """Stands for the process exit of journal.fail_stop in these tests."""


@pytest.fixture
def stops(monkeypatch) -> list[tuple[str, int, bool]]:
    """What journal.fail_stop was asked: (what, errno, distrust_log) each time."""
    seen: list[tuple[str, int, bool]] = []

    def fail_stop(path, what, error, distrust_log):
        seen.append((what, error.errno, distrust_log))
        raise Stopped()

    monkeypatch.setattr(journal_module, "fail_stop", fail_stop)
    return seen


def failing(code: int):
    def call(*args, **kwargs):
        raise OSError(code, "injected")

    return call


def test_a_short_write_stops_the_node_and_is_not_counted(tmp_path, monkeypatch, stops):
    journal = filled(tmp_path / "j", entries(2))
    monkeypatch.setattr(journal_module.os, "pwrite", lambda fd, data, at: len(data) // 2)
    monkeypatch.setattr(journal_module.os, "pwritev", lambda fd, buffers, at: len(buffers[0]) // 2)
    with pytest.raises(Stopped):
        journal.add(b"half", 3, 1)
    assert stops == [("appending entry 3 to j", errno.ENOSPC, False)]
    assert journal[:] == entries(2)


@pytest.mark.parametrize(
    "call, operation, distrust",
    [
        ("fdatasync", lambda j: j.add(b"x", 3, 1), True),
        ("fsync", lambda j: j.deleteEntriesFrom(1), True),
        ("fsync", lambda j: j.deleteEntriesTo(1), True),
        ("pwrite", lambda j: j.add(b"x", 3, 1), False),
    ],
)
def test_a_failed_disk_call_stops_the_node_distrusting_the_log_after_a_failed_sync(
    tmp_path, monkeypatch, stops, call, operation, distrust
):
    journal = filled(tmp_path / "j", entries(2))
    monkeypatch.setattr(journal_module.os, call, failing(errno.EIO))
    with pytest.raises(Stopped):
        operation(journal)
    assert [(code, distrusted) for _, code, distrusted in stops] == [(errno.EIO, distrust)]


def test_a_failed_side_file_save_stops_the_node_without_distrusting_the_log(tmp_path, monkeypatch, stops):
    journal = filled(tmp_path / "j", entries(1))
    monkeypatch.setattr(journal_module, "write_atomically", failing(errno.ENOSPC))
    with pytest.raises(Stopped):
        journal.setCurrentTerm(2, "other")
    assert stops == [("saving j.meta", errno.ENOSPC, False)]


def test_without_stopping_the_error_is_raised(tmp_path, monkeypatch):
    journal = DurableJournal(tmp_path / "j", stop_on_disk_error=False)
    monkeypatch.setattr(journal_module.os, "fdatasync", failing(errno.EIO))
    with pytest.raises(OSError, match="injected"):
        journal.add(b"x", 1, 1)

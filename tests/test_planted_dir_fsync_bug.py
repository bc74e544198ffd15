"""Planted bugs: the controller's directory fsync after a rename removed (P16).

Which ones a power loss can catch, and why:
- the Raft journal's (its creation, each compaction, its term/vote/commit-index side
  file; tests/fixtures/planted_dir_fsync_bug, "journal"): after a compaction the log's
  name still points, on disk, at the old file; every entry appended to the new one is
  fdatasynced and acknowledged, and a power loss takes it all. Shown here on one mount
  (fast), and by a power-loss-all chaos run of the metadata workload (slow): the three
  controllers come back without their journal, and reads answer "absent" for keys whose
  writes were acknowledged. Without the plant the same run passes (bench/results).
- the snapshot's (pysyncobj_compat.durable_replace, "snapshot") cannot be caught: the
  only step that depends on the snapshot being durable, the journal's compaction, runs
  after it in the same directory and fsyncs that directory itself, which makes the
  snapshot's rename durable too (on ext4 as in this filesystem's model). Shown here:
  power lost after a snapshot rename without its directory fsync and a compaction keeps
  both. The snapshot's own directory fsync is kept anyway (defence in depth).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqmeta.chaos.faultfs import FaultFs
from mqmeta.chaos.runner import RunConfig, run
from mqmeta.controller import journal as journal_module
from mqmeta.controller import pysyncobj_compat
from mqmeta.controller.journal import DurableJournal

from tests.support.faultfs_mount import mounted

PLANTED = Path(__file__).parent / "fixtures" / "planted_dir_fsync_bug"

pytestmark = [
    pytest.mark.timeout(480),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[FaultFs]:
    with mounted(tmp_path) as fs:
        yield fs


def journal_of_ten(directory: Path) -> DurableJournal:
    journal = DurableJournal(directory / "raft.journal", stop_on_disk_error=False)
    for index in range(1, 11):
        journal.add(b"entry", index, 1)
    return journal


def entries_after_power_loss(disk: FaultFs) -> list:
    reopened = DurableJournal(disk.mountpoint / "raft.journal", stop_on_disk_error=False)
    try:
        return reopened[:]
    finally:
        reopened._destroy()  # an open file would hold the unmount


def write_without_directory_fsync(path: Path, data: bytes, fsync: bool = True) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def test_a_compaction_without_its_directory_fsync_loses_acknowledged_entries(disk, monkeypatch):
    journal = journal_of_ten(disk.mountpoint)  # created durably, before the plant
    monkeypatch.setattr(journal_module, "write_atomically", write_without_directory_fsync)
    journal.deleteEntriesTo(8)  # a compaction: entries 9 and 10 kept, in a new file
    journal.add(b"acknowledged", 11, 1)  # fdatasynced: a follower would acknowledge it now
    journal._destroy()
    disk.lose_power()
    monkeypatch.undo()
    entries = entries_after_power_loss(disk)
    assert (b"acknowledged", 11, 1) not in entries, "the plant should lose the entry"
    assert [index for _, index, _ in entries] == list(range(1, 11)), "the old file is back"


def test_without_the_plant_the_compacted_journal_and_its_new_entry_survive(disk):
    journal = journal_of_ten(disk.mountpoint)
    journal.deleteEntriesTo(8)
    journal.add(b"acknowledged", 11, 1)
    journal._destroy()
    disk.lose_power()
    entries = entries_after_power_loss(disk)
    assert [index for _, index, _ in entries] == [9, 10, 11]


def test_a_snapshot_rename_without_its_directory_fsync_is_made_durable_by_the_compaction(disk, monkeypatch):
    journal = journal_of_ten(disk.mountpoint)
    snapshot, tmp = disk.mountpoint / "raft.snapshot", disk.mountpoint / "raft.snapshot.tmp"
    tmp.write_bytes(b"the state at index 10")
    monkeypatch.setattr(pysyncobj_compat, "fsync_dir", lambda directory: None)
    pysyncobj_compat.durable_replace(str(tmp), str(snapshot))  # the file fsynced, the rename not
    journal.deleteEntriesTo(8)  # what pysyncobj does next, and only after the rename returned
    journal._destroy()
    disk.lose_power()
    assert snapshot.read_bytes() == b"the state at index 10"
    assert not tmp.exists()


@pytest.mark.cluster
@pytest.mark.slow
def test_power_loss_of_everything_catches_the_journals_missing_directory_fsync(tmp_path, monkeypatch):
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{PLANTED}{os.pathsep}{path}" if path else str(PLANTED))
    monkeypatch.setenv("MQMETA_PLANTED_DIR_FSYNC", "journal")
    config = RunConfig(
        fault="power-loss-all",
        workload="metadata",
        output_dir=tmp_path / "planted",
        time_limit_s=8.0,
        interval_s=4.0,
        drain_s=15.0,
        audit=False,
    )
    result = run(config).result
    assert result["faults"] and result["faults"][0]["what"].startswith("power lost on"), result["faults"]
    assert all(result["faultfs"][c]["directory_fsyncs"] == 0 for c in ("c1", "c2", "c3")), result["faultfs"]
    check = result["linearizability"]
    assert check["linearizable"] is False, check
    lost_write, absent_read = check["counterexample"][-2:]
    assert absent_read["kind"] == "read" and absent_read["value"] is None, check["counterexample"]
    assert lost_write["outcome"] == "ok" and lost_write["complete_ms"] < absent_read["invoke_ms"]
    assert not result["passed"], result["failures"]

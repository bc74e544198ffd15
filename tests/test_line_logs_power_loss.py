"""The audit's line logs (a controller's applied.jsonl, a broker's confirm.log) come back
whole after a power loss, however much was written since their last fsync.

A power loss keeps any subset of the pages written since a file's last fsync (the kernel
writes dirty pages back in any order), so never-written pages can lie far before the
tail, with surviving lines after them. Each log is fsynced once a megabyte has been
appended since, and recovery looks for unwritten pages from its sync mark on: after the
cut and a reopen, every line of the file verifies, the lines before the last fsync are
all there, and appending goes on after them. Real FUSE mount (chaos/faultfs), real
syscalls; several megabytes of lines, about 3 s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from mqmeta.broker_agent.confirm_log import ConfirmLog, read_confirm_log
from mqmeta.chaos.faultfs import FaultFs
from mqmeta.controller.applied_log import AppliedLog

from mqmeta.formats.jsonlines import SyncMark, parse_line, split_lines
from tests.support.faultfs_mount import mounted, sync_directory

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]

T = TypeVar("T")
WRITTEN_BYTES = 3 << 20  # three times the sync interval: most of it unsynced without the mark
WRITEBACK_FRACTION = 0.5  # half the dirty pages reach the disk before the cut, in no order


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultFs]:
    with mounted(tmp_path_factory.mktemp("faultfs")) as mount:
        yield mount


@pytest.fixture
def here(fs: FaultFs, request: pytest.FixtureRequest) -> Path:
    directory = fs.mountpoint / request.node.name
    directory.mkdir()
    fs.sync()  # the directory itself is durable
    return directory


def _verified_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert b"\0" not in data, f"a never-written page was left in {path.name}"
    lines, torn = split_lines(data)
    assert torn == 0
    return [parse_line(raw.decode(), f"{path.name}:{n}") for n, raw in enumerate(lines, 1)]


def _opened_on_a_full_disk(fs: FaultFs, caplog: pytest.LogCaptureFixture, open_log: Callable[[], T]) -> T:
    """The log opened while the disk is full: it opens, and warns that the lines after
    its sync mark were not written again."""
    fs.disk_full(True)
    try:
        with caplog.at_level("WARNING"):
            opened = open_log()
    finally:
        fs.disk_full(False)
    assert "not made durable again" in caplog.text
    return opened


def test_applied_log_after_a_power_loss_keeps_only_whole_lines(fs: FaultFs, here: Path) -> None:
    path = here / "applied.jsonl"
    log = AppliedLog(path, "c1")
    sync_directory(here)  # the file's entry is durable (a node's data dir is fsynced)
    padding = "x" * 2000
    index = 0
    while path.stat().st_size < WRITTEN_BYTES:
        index += 1
        log.append({"index": index, "term": 1, "command_type": "t", "commands": [padding]})
    log._file.close()  # as a kill -9 would: no fsync at close
    durable = SyncMark(path, 1).marked  # what the last fsync covered
    assert durable > 2 << 20, "the log was fsynced as it grew"
    fs.lose_power(writeback_fraction=WRITEBACK_FRACTION, seed=3)

    reopened = AppliedLog(path, "c1")
    records = _verified_lines(path)
    assert [r["index"] for r in records] == list(range(1, reopened.last_index + 1))
    assert path.stat().st_size >= durable
    reopened.append({"index": reopened.last_index + 1, "term": 2, "command_type": "t", "commands": []})
    reopened.close()
    assert _verified_lines(path)[-1]["term"] == 2


def test_applied_log_reopened_after_a_failed_fsync_makes_its_lines_durable(fs: FaultFs, here: Path) -> None:
    """The controller's applied-entry log after an fsync that failed with EIO (the node
    fail-stops: controller/journal.py's fail_stop, no close): the lines written since
    read whole but were never written. The restarted node's log writes them again at
    open, so a power loss after its next fsync keeps every line, with no zeros in the
    middle for the audit's R1 to report."""
    path = here / "applied.jsonl"
    log = AppliedLog(path, "c1", sync_every_bytes=1 << 30)  # only the explicit fsyncs
    sync_directory(here)

    def append(target: AppliedLog, index: int) -> None:
        target.append({"index": index, "term": 1, "command_type": "t", "commands": ["x" * 150]})

    append(log, 1)
    log.fsync()  # durable, the mark after it
    for index in range(2, 42):  # about 8 KB after it, unsynced: two pages and more
        append(log, index)
    fs.fail_next_fsync(1)
    with pytest.raises(OSError):
        log.fsync()
    log._file.close()  # the node exits at once (fail_stop): no fsync at close

    reopened = AppliedLog(path, "c1", sync_every_bytes=1 << 30)
    assert reopened.last_index == 41  # the pages read whole, though never written
    append(reopened, 42)
    reopened.fsync()  # the restarted node's next fsync
    reopened._file.close()
    fs.lose_power(writeback_fraction=0.0, seed=1)

    assert [r["index"] for r in _verified_lines(path)] == list(range(1, 43))


def test_applied_log_opens_on_a_full_disk_and_says_its_lines_were_not_made_durable_again(
    fs: FaultFs, here: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Writing the lines after the sync mark again is best effort, as its periodic fsync's
    mark is: a controller restarted while its disk is full still opens the log."""
    path = here / "applied.jsonl"
    log = AppliedLog(path, "c1", sync_every_bytes=1 << 30)
    sync_directory(here)
    for index in range(1, 6):
        log.append({"index": index, "term": 1, "command_type": "t", "commands": []})
    log._file.close()
    reopened = _opened_on_a_full_disk(fs, caplog, lambda: AppliedLog(path, "c1", sync_every_bytes=1 << 30))
    reopened.append({"index": 6, "term": 2, "command_type": "t", "commands": []})
    reopened.close()
    assert [r["index"] for r in _verified_lines(path)] == list(range(1, 7))


def test_confirm_log_after_a_power_loss_keeps_only_whole_lines(fs: FaultFs, here: Path) -> None:
    """A slave's lines are never forced: only the sync mark's interval makes them durable."""
    path = here / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    sync_directory(here)
    offset = 0
    now_ms = 0
    while path.stat().st_size < WRITTEN_BYTES:
        offset += 100
        now_ms += 1000  # past the slave's coalescing interval: every note is a line
        acked = {replica: offset for replica in range(1, 100)}  # long lines: fewer writes
        log.note(now_ms, 2, "SLAVE", 1, offset, offset + 50, acked)
    log.close()
    durable = SyncMark(path, 1).marked
    assert durable > 2 << 20, "the log was fsynced as it grew"
    fs.lose_power(writeback_fraction=WRITEBACK_FRACTION, seed=3)

    reopened = ConfirmLog(path, "broker-a")
    records = read_confirm_log(path)
    _verified_lines(path)
    offsets = [r["confirm_offset"] for r in records]
    assert offsets == list(range(100, 100 * (len(offsets) + 1), 100))
    assert path.stat().st_size >= durable
    reopened.note(now_ms + 1000, 2, "SLAVE", 2, 7, 7, {})
    reopened.close()
    assert read_confirm_log(path)[-1]["epoch"] == 2


def test_confirm_log_reopened_after_a_failed_fsync_makes_its_lines_durable(fs: FaultFs, here: Path) -> None:
    """An fsync that fails with EIO leaves the lines written since readable but never
    written (Linux marks their pages clean; the broker fences itself and exits). The
    restarted broker's log writes them again at open, so a power loss after its next fsync
    keeps every line: none lost, no zeros in the middle (the audit's B1 found such a hole
    after a chaos run's fsync-eio round)."""
    path = here / "confirm.log"
    log = ConfirmLog(path, "broker-a", sync_every_bytes=1 << 30)  # only forced lines fsync
    sync_directory(here)
    now_ms, offset = 0, 0

    def note(force: bool = False, role: str = "MASTER", target: ConfirmLog = log) -> None:
        nonlocal now_ms, offset
        now_ms, offset = now_ms + 100, offset + 100  # past the master's coalescing interval
        target.note(now_ms, 2, role, 2, offset, offset, {1: offset, 3: offset}, force=force)

    note(force=True)  # durable
    for _ in range(40):  # about 7 KB after it, unsynced: two pages
        note()
    fs.fail_next_fsync(1)
    with pytest.raises(OSError):
        note(force=True)  # the forced line's fdatasync fails: the broker exits
    log.close()
    written = len(read_confirm_log(path))
    assert written == 42

    reopened = ConfirmLog(path, "broker-a", sync_every_bytes=1 << 30)
    note(force=True, role="SLAVE", target=reopened)  # the restarted broker's next fsync
    reopened.close()
    fs.lose_power(writeback_fraction=0.0, seed=1)

    records = _verified_lines(path)
    assert [r["confirm_offset"] for r in records] == list(range(100, 100 * (written + 2), 100))


def test_confirm_log_opens_on_a_full_disk_and_says_its_lines_were_not_made_durable_again(
    fs: FaultFs, here: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Writing the lines after the sync mark again at open is best effort (a line of this
    audit trail never fences): a broker restarted while its disk is full still opens its
    log, with a warning, and appends once space returns."""
    path = here / "confirm.log"
    log = ConfirmLog(path, "broker-a", sync_every_bytes=1 << 30)
    sync_directory(here)
    for k in range(1, 6):
        log.note(k * 100, 2, "MASTER", 2, k * 100, k * 100, {1: k * 100})
    log.close()
    reopened = _opened_on_a_full_disk(
        fs, caplog, lambda: ConfirmLog(path, "broker-a", sync_every_bytes=1 << 30)
    )
    reopened.note(1000, 2, "SLAVE", 3, 600, 600, {})
    reopened.close()
    assert [r["confirm_offset"] for r in read_confirm_log(path)] == [100, 200, 300, 400, 500, 600]

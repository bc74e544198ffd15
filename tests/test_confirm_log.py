"""The confirm log (the audit's record of confirm offsets): lines verify, writes coalesce but a
forced line is written at once, a torn final line is skipped and a corrupt one is reported."""

from __future__ import annotations

import errno
import os

import pytest
from mqmeta.broker_agent.confirm_log import MASTER_INTERVAL_MS, ConfirmLog, read_confirm_log

from mqmeta.errors import CorruptData


def test_lines_coalesce_within_the_interval_and_forced_lines_are_written(tmp_path):
    path = tmp_path / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    log.note(1000, 1, "MASTER", 2, 100, 150, {2: 100, 3: 120})
    log.note(1010, 1, "MASTER", 2, 110, 150, {})  # within the interval: pending
    log.note(1020, 1, "MASTER", 2, 120, 150, {}, force=True)
    log.note(1030, 1, "MASTER", 2, 130, 150, {})  # pending
    log.flush_due(1030 + MASTER_INTERVAL_MS)  # due now
    log.note(2000, 1, "MASTER", 2, 130, 150, {})  # unchanged: nothing new
    log.close()
    records = read_confirm_log(path)
    assert [r["confirm_offset"] for r in records] == [100, 120, 130]
    assert records[0]["acked"] == {"2": 100, "3": 120}
    assert records[0]["broker_name"] == "broker-a" and records[0]["epoch"] == 2


def test_a_torn_final_line_is_skipped_and_a_corrupt_line_is_reported(tmp_path):
    path = tmp_path / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    for i in range(3):
        log.note(1000 * (i + 1), 1, "SLAVE", 2, 10 * i, 50, {})
    log.close()
    good = path.read_bytes()
    path.write_bytes(good + b'{"t_ms": 4000, "bro')
    assert len(read_confirm_log(path)) == 3
    lines = good.split(b"\n")
    lines[1] = lines[1].replace(b'"confirm_offset":10', b'"confirm_offset":99')
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptData, match="confirm.log:2: checksum mismatch"):
        read_confirm_log(path)


def test_notes_after_close_write_nothing(tmp_path):
    """A straggling thread's note after close must not write into a reused descriptor."""
    path = tmp_path / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    log.note(1000, 1, "MASTER", 2, 100, 150, {}, force=True)
    log.close()
    other = open(tmp_path / "other", "wb")  # likely takes the freed descriptor number
    log.note(2000, 1, "MASTER", 2, 200, 250, {}, force=True)
    other.close()
    assert [r["confirm_offset"] for r in read_confirm_log(path)] == [100]
    assert (tmp_path / "other").read_bytes() == b""


def test_reopening_after_a_torn_final_line_cuts_it_so_new_lines_stay_whole(tmp_path):
    """A power loss can tear the last line; the broker restarts and appends: the new line
    must not be glued onto the torn one (the audit would read a corrupt line)."""
    path = tmp_path / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    log.note(1000, 1, "MASTER", 2, 100, 150, {}, force=True)
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"acked":{"2":9298},"broker_id":1,"max')
    log = ConfirmLog(path, "broker-a")
    log.note(2000, 1, "SLAVE", 3, 200, 250, {}, force=True)
    log.close()
    assert path.read_bytes().startswith(whole)
    assert [r["confirm_offset"] for r in read_confirm_log(path)] == [100, 200]


def test_reopening_after_a_power_loss_hole_cuts_from_the_unwritten_page_on(tmp_path):
    """Pages written back out of order: zeros where a page never reached the disk, a whole
    line after them. Everything from the hole's line on was not durable: cut."""
    path = tmp_path / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    log.note(1000, 1, "MASTER", 2, 100, 150, {}, force=True)
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"acked":{}' + b"\0" * 64 + b'x"}\n' + whole)
    ConfirmLog(path, "broker-a").close()
    assert path.read_bytes() == whole


def test_the_applied_log_cuts_a_power_loss_hole_and_rewrites_the_replayed_entries(tmp_path):
    from mqmeta.controller.applied_log import AppliedLog

    from mqmeta.formats.jsonlines import format_line

    path = tmp_path / "applied.jsonl"
    lines = [format_line({"index": i, "term": 1}) for i in (1, 2, 3)]
    path.write_bytes(lines[0] + b"\0" * 10 + lines[1][10:] + lines[2])
    applied = AppliedLog(path, "c1")
    assert applied.last_index == 1  # 2 and 3 are replayed from the Raft journal
    applied.append({"index": 2, "term": 1})
    applied.close()
    assert b"\0" not in path.read_bytes()
    assert path.read_bytes().count(b"\n") == 2


def test_a_full_disk_keeps_the_line_pending_and_leaves_no_torn_line(tmp_path, monkeypatch):
    """ENOSPC (whole or a short write): nothing torn stays in the file, the line is written
    once space returns, and `behind` says a line waits (a forced note's caller checks it)."""
    path = tmp_path / "confirm.log"
    log = ConfirmLog(path, "broker-a")
    log.note(1000, 1, "MASTER", 1, 10, 10, {}, force=True)
    real = os.write

    def short(fd: int, data: bytes) -> int:
        return real(fd, data[:5])  # the disk filled up part-way

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    for broken in (short, full):
        monkeypatch.setattr(os, "write", broken)
        log.note(2000, 1, "MASTER", 1, 20, 20, {}, force=True)
        assert log.behind
        assert [line["confirm_offset"] for line in read_confirm_log(path)] == [10]
        assert path.read_bytes().endswith(b"\n"), "no torn line"
    monkeypatch.setattr(os, "write", real)
    log.flush_due(3000, force=True)
    assert not log.behind
    assert [line["confirm_offset"] for line in read_confirm_log(path)] == [10, 20]
    log.close()

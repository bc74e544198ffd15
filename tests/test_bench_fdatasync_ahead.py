"""bench/fdatasync_ahead.py's two variants write what they say, through the real logs: `ahead`
leaves the zeros written ahead past the records (the file is larger than its records),
`appended` extends the file by each record alone (the file ends where its records do);
both read back whole. Bad flags are refused. Not the benchmark (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mqmeta.broker_agent import commitlog
from mqmeta.controller import journal

from bench import fdatasync_ahead


class _Out(list):
    def put(self, item) -> None:
        self.append(item)


@pytest.mark.parametrize("variant", fdatasync_ahead.VARIANTS)
def test_each_variant_writes_its_kind_of_file(tmp_path: Path, monkeypatch, variant: str) -> None:
    # the variant `appended` changes these module values in its (child) process: restore them here
    monkeypatch.setattr(commitlog, "PREALLOCATE_BYTES", commitlog.PREALLOCATE_BYTES)
    monkeypatch.setattr(journal, "_ZEROS", journal._ZEROS)
    for kind in fdatasync_ahead.LOGS:
        directory = tmp_path / kind
        directory.mkdir()
        out = _Out()
        fdatasync_ahead._appender(kind, variant, str(directory), 5, 100, out)
        assert len(out) == 1 and len(out[0]) == 5
        if kind == "commitlog":
            path = next(directory.glob("*.log"))
            size = path.stat().st_size
            reopened = commitlog.CommitLog(directory, fsync=False)
            end = reopened.max_offset
            assert len(reopened.read_bulk(0, 1 << 20)) == end > 0
        else:
            path = directory / "raft.journal"
            size = path.stat().st_size
            assert len(journal.DurableJournal(path, stop_on_disk_error=False)) == 5
            end = journal.parse_records(path.read_bytes(), str(path))[2]
        assert (size > end) if variant == "ahead" else (size == end), (kind, variant, size, end)


def test_bad_flags_are_refused() -> None:
    with pytest.raises(SystemExit) as exit_info:
        fdatasync_ahead.parse_args(["--appends", "1"])
    assert exit_info.value.code == 2

"""bench/fdatasync_ahead.py's variants write what they say, through the real logs: `ahead`
(three processes) and `alone` (one) leave the zeros written ahead past the records (the file
is larger than its records), `appended` extends the file by each record alone (the file
ends where its records do); all read back whole. The summary divides `ahead` by the others.
Bad flags are refused. Not the benchmark (no timing is asserted)."""

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
        assert (size > end) if variant != "appended" else (size == end), (kind, variant, size, end)
    assert fdatasync_ahead.PROCESSES_OF[variant] == (1 if variant == "alone" else 3)


def test_the_summary_divides_ahead_by_appended_and_by_alone() -> None:
    p50s = ({"ahead": 0.3, "appended": 0.4, "alone": 0.2}, {"ahead": 0.25, "appended": 0.5, "alone": 0.1})
    rounds = [
        {
            f"{kind}_{variant}": {"p50_ms": p50}
            for kind in fdatasync_ahead.LOGS
            for variant, p50 in row.items()
        }
        for row in p50s
    ]
    done = {"rounds": rounds}
    fdatasync_ahead.summarize(done)
    for kind in fdatasync_ahead.LOGS:
        assert done["medians"][f"{kind}_ahead_p50_ms"] == 0.275
        assert done["medians"][f"{kind}_ahead_vs_appended"] == 0.611
        assert done["medians"][f"{kind}_ahead_vs_alone"] == 1.833


def test_bad_flags_are_refused() -> None:
    with pytest.raises(SystemExit) as exit_info:
        fdatasync_ahead.parse_args(["--appends", "1"])
    assert exit_info.value.code == 2

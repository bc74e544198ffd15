"""`mqmeta local up` as the tests run it: started with flags, ready once it wrote
cluster.json, stopped with SIGTERM (exit status 0). A start that fails or times out
fails the test with the command's output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from mqmeta.cluster.wait import WaitTimeout, wait_for

MQMETA = [sys.executable, "-m", "mqmeta.cli"]
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


def start_local_up(
    data_dir: Path, *flags: str, timeout_s: float = READY_TIMEOUT_S
) -> tuple[subprocess.Popen, dict]:
    """Starts `mqmeta local up --data-dir DATA_DIR FLAGS`; returns it and its cluster.json.
    Its output goes to local-up.out beside the data dir; it and its children form a
    process group of their own (a test may signal it as a terminal's Ctrl-C does)."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    (data_dir / "cluster.json").unlink(missing_ok=True)
    output = data_dir.parent / "local-up.out"
    with open(output, "ab") as sink:
        proc = subprocess.Popen(
            [*MQMETA, "local", "up", "--data-dir", str(data_dir), *flags],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a failed start kills the children too
        )

    def written() -> bool:
        if proc.poll() is not None:
            raise ChildProcessError(f"local up exited with status {proc.returncode}")
        return (data_dir / "cluster.json").exists()

    try:
        wait_for(written, timeout_s, f"local up {' '.join(flags)} to write cluster.json", interval_s=0.1)
    except (WaitTimeout, ChildProcessError) as error:
        kill_group(proc)
        pytest.fail(f"{error}: {output.read_text()}")
    return proc, json.loads((data_dir / "cluster.json").read_text())


def kill_group(proc: subprocess.Popen) -> None:
    """kill -9 of local up and every child it started (killing the launcher alone would
    leave its controllers and brokers running on after the test)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def stop_local_up(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM; local up stops every child and exits 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        status = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    assert status == 0


@contextmanager
def local_up(data_dir: Path, *flags: str, timeout_s: float = READY_TIMEOUT_S) -> Iterator[dict]:
    """start_local_up ... stop_local_up around the block; yields cluster.json."""
    proc, document = start_local_up(data_dir, *flags, timeout_s=timeout_s)
    try:
        yield document
    finally:
        stop_local_up(proc)

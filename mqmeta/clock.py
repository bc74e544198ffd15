"""The two clocks every part reads, named once.

`now_ms` is monotonic: durations, deadlines, leases (never compared across machines).
`wall_ms` is wall-clock time: what is written to disk or histories and lined up later
across processes (store timestamps, the confirm log, chaos histories).
Pure cores never call these; their shells pass the value in.
"""

from __future__ import annotations

import os
import time


def now_ms() -> int:
    """Monotonic milliseconds: for durations and deadlines only."""
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch: for timestamps that outlive the process."""
    return int(time.time() * 1000)


# A chaos run's clock-jump fault steps one process's wall clock: the process is started with
# this variable naming a file that holds the offset in ms ("30000", "-30000", "0"). Only
# time.time / time.time_ns move (what a stepped system clock moves); the monotonic clock
# does not, as on a real machine.
CLOCK_OFFSET_FILE_ENV = "MQMETA_CLOCK_OFFSET_FILE"
_OFFSET_RECHECK_S = 0.05


def _install_offset_clock(path: str) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    state = {"checked_s": float("-inf"), "offset_ms": 0}

    def offset_ms() -> int:
        now = time.monotonic()
        if now - state["checked_s"] >= _OFFSET_RECHECK_S:
            state["checked_s"] = now
            try:
                with open(path) as f:
                    state["offset_ms"] = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass  # keep the last offset read (the file is being replaced)
        return int(state["offset_ms"])

    time.time = lambda: real_time() + offset_ms() / 1000
    time.time_ns = lambda: real_time_ns() + offset_ms() * 1_000_000


if os.environ.get(CLOCK_OFFSET_FILE_ENV):
    _install_offset_clock(os.environ[CLOCK_OFFSET_FILE_ENV])

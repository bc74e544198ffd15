"""The two clocks every part reads, named once.

`now_ms` is monotonic: durations, deadlines, leases (never compared across machines).
`wall_ms` is wall-clock time: what is written to disk or histories and lined up later
across processes (store timestamps, the confirm log, chaos histories).
Pure cores never call these; their shells pass the value in.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Monotonic milliseconds: for durations and deadlines only."""
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch: for timestamps that outlive the process."""
    return int(time.time() * 1000)

"""Observing a property over a window of time (the window is what a test checks, not a wait)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator


def sample_for(
    duration_s: float, interval_s: float, samples_min: int = 1, duration_max_s: float | None = None
) -> Iterator[float]:
    """Yields the seconds elapsed since the first sample, about every `interval_s`, until
    `duration_s` has passed and `samples_min` samples were taken (on a loaded machine one
    sample can take longer than `interval_s`), but never past `duration_max_s`."""
    duration_max_s = max(duration_s, duration_max_s or duration_s)
    started = time.monotonic()
    for taken in range(math.ceil(duration_max_s / interval_s) + samples_min):
        elapsed_s = time.monotonic() - started
        if elapsed_s >= duration_max_s or (elapsed_s >= duration_s and taken >= samples_min):
            return
        yield elapsed_s
        # Not synchronisation: it paces the samples of a fixed observation window.
        time.sleep(interval_s)

"""Observing a property over a window of time (the window is what a test checks, not a wait)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator


def sample_for(duration_s: float, interval_s: float) -> Iterator[float]:
    """Yields the seconds elapsed since the first sample, about every `interval_s`, until
    `duration_s` has passed (at most duration_s / interval_s + 1 samples)."""
    started = time.monotonic()
    for _ in range(math.ceil(duration_s / interval_s) + 1):
        elapsed_s = time.monotonic() - started
        if elapsed_s >= duration_s:
            return
        yield elapsed_s
        # Not synchronisation: it paces the samples of a fixed observation window.
        time.sleep(interval_s)

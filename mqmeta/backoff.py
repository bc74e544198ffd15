"""The one retry policy: capped exponential backoff with jitter, within a deadline.

Every loop that retries a failed call (the controller client, the broker client, a slave's
fetch loop, a replicator task) pauses by a `Backoff` policy through `Attempts`: the n-th
pause in a row is drawn from [cap / 2, cap], cap = min(pause_max_s, first_pause_s * 2**n),
so that clients that failed together do not retry together (jitter), a long outage costs
a bounded rate of attempts (the cap), and a pause never runs past the caller's deadline.
A success resets the count, and so does a failure that comes more than twice the longest
pause after the previous one (the loop ran well in between: a task that fails after an
hour of copying starts again at the first pause). Pure: the clock and the random source
are parameters.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first_pause_s: float
    pause_max_s: float
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.first_pause_s <= self.pause_max_s or self.multiplier < 1:
            raise ValueError(f"a backoff needs 0 < first_pause_s <= pause_max_s and multiplier >= 1: {self}")

    def cap_s(self, failures: int) -> float:
        """The longest pause after `failures` failures in a row (1 or more)."""
        exponent = min(max(failures - 1, 0), 64)  # past 2**64 every cap is pause_max_s anyway
        return min(self.pause_max_s, self.first_pause_s * self.multiplier**exponent)

    def pause_s(self, failures: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
        """The pause after `failures` failures in a row: jittered in [cap / 2, cap] (never
        near zero: a retry loop never spins)."""
        cap = self.cap_s(failures)
        return uniform(cap / 2, cap)


class Attempts:
    """One retry loop's state: how many failures in a row, and its deadline (a
    `clock()` value; None: the loop ends some other way, e.g. a stop event)."""

    def __init__(
        self,
        policy: Backoff,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.policy = policy
        self.deadline = deadline
        self.failures = 0
        self._last_failure: float | None = None
        self._clock = clock
        self._uniform = uniform

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - self._clock())

    def expired(self) -> bool:
        remaining = self.remaining_s()
        return remaining is not None and remaining <= 0

    def failed(self) -> float:
        """Counts a failure; the pause before the next attempt (0 once the deadline passed)."""
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure > 2 * self.policy.pause_max_s:
            self.failures = 0
        self._last_failure = now
        self.failures += 1
        pause = self.policy.pause_s(self.failures, self._uniform)
        remaining = self.remaining_s()
        return pause if remaining is None else min(pause, remaining)

    def succeeded(self) -> None:
        self.failures = 0


# The policies of our loops (pauses in seconds).
CONTROLLER_CALL = Backoff(first_pause_s=0.05, pause_max_s=1.0)  # no controller to go to
BROKER_CALL = Backoff(first_pause_s=0.05, pause_max_s=1.0)  # no master of the set (yet)
REPLICA_FETCH = Backoff(first_pause_s=0.1, pause_max_s=1.0)  # a slave's fetch failed
REPLICATOR_TASK = Backoff(first_pause_s=0.5, pause_max_s=8.0)  # a task failed; it re-resolves

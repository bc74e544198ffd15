"""Waiting on a condition: the one polling loop of the launcher, the harness and the tests.

A wait polls a probe until its value satisfies a condition, and ends as soon as it does
(never a fixed sleep that hopes the condition holds by then). On timeout it raises
WaitTimeout naming what it waited for, how long it waited and the last value or error
the probe gave, so a failed wait says where the system got stuck.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from mqmeta.errors import Unavailable

POLL_INTERVAL_S = 0.05
# A last value longer than this is cut in the timeout message (protobuf replies can be long).
SHOWN_CHARS_MAX = 400

T = TypeVar("T")


class WaitTimeout(Unavailable):
    """A condition did not hold within its timeout (an Unavailable: callers that retry on
    Unavailable keep doing so)."""


def wait_for(
    probe: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    until: Callable[[T], object] = bool,
    retry_on: tuple[type[BaseException], ...] = (),
    interval_s: float = POLL_INTERVAL_S,
) -> T:
    """Calls `probe` every `interval_s` until `until(value)` is true and returns that value.

    An exception of a kind in `retry_on` counts as "not yet"; any other propagates at once
    (a probe stops the wait early by raising one). The probe runs at least once, and once
    more at the deadline; `what` completes "timed out after N s waiting for ...".
    """
    if timeout_s < 0 or interval_s < 0:
        raise ValueError(f"timeout_s ({timeout_s}) and interval_s ({interval_s}) must not be negative")
    started = time.monotonic()
    deadline = started + timeout_s
    last = "nothing: the probe never returned"
    while True:
        try:
            value = probe()
        except retry_on as error:
            last = f"error {type(error).__name__}: {_shown(str(error))}"
        else:
            if until(value):
                return value
            last = f"value {_shown(repr(value))}"
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            waited_s = time.monotonic() - started
            raise WaitTimeout(f"timed out after {waited_s:.1f}s waiting for {what}; last {last}")
        time.sleep(min(interval_s, remaining_s))


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHOWN_CHARS_MAX else text[: SHOWN_CHARS_MAX - 3] + "..."

"""Short full garbage collections on a controller whose state keeps growing.

CPython's collector examines every tracked object in a full (generation 2) pass, with
the GIL held. A controller whose state holds 100,000 topics has about 260,000 of them: a
pass takes 0.25-0.3 s on an idle 2-core machine and 0.4-0.7 s under writes. Python runs a
full pass each time the long-lived objects have grown by a quarter (in steady churn,
each time a quarter of them were replaced). On the leader such a pass stops the Raft
thread for longer than election_min_ms, and the followers elect another leader in the
middle of a write load (`python -m bench.gc_pauses`).

`FullPasses` does two things:
- It freezes what survived each full pass (gc.freeze moves it to the permanent
  generation, which no later pass examines). The next pass examines only what became
  long-lived since.
- It runs a full pass itself once MIDDLE_PASSES_PER_FULL middle-generation passes have
  run since the last one (checked every FULL_PASS_POLL_S). CPython waits for ten, and for
  a quarter more long-lived objects. A pass is then bounded by a few seconds' growth, not
  by the state's size.

Objects freed by reference counting are freed as before, frozen or not. What a freeze
keeps alive is a cycle of frozen objects that becomes garbage later. None of the
state's values are in cycles; a connection's objects can be. So a follower thaws every
`thaw_interval_s`: gc.unfreeze, then one full pass over everything, whose survivors
are frozen again. That is the one long pause. On a follower it stops no writes (the
leader commits with the other follower) and elects no one (a follower reads its input
before it judges its election deadline: pysyncobj_compat.InputFirstFix). A leader never
thaws; it does on schedule once it is a follower again. `gc_thaw_interval_s = 0` in
[raft_settings] leaves the collector as Python runs it.
"""

from __future__ import annotations

import gc
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

THAW_JITTER = 0.2  # each node's interval moves by up to this share: two followers rarely thaw together
# A middle pass runs about once a second under writes: checking twice as often runs the full
# pass within half a second of its being due, for a wake-up that costs microseconds.
FULL_PASS_POLL_S = 0.5
MIDDLE_PASSES_PER_FULL = 3  # CPython waits for 10 (gc.get_threshold()[2]) and a quarter more
STOP_JOIN_S = 5.0
# 3.14's collector is incremental, with other generations and counts: this is for 3.11-3.13.
SUPPORTED = sys.version_info < (3, 14)


class FullPasses:
    """Freezes the survivors of every full pass; on a follower, thaws every interval."""

    def __init__(self, may_pause: Callable[[], bool], thaw_interval_s: float) -> None:
        self._may_pause = may_pause  # a follower that knows its leader (not the leader, not a candidate)
        self._thaw_interval_s = thaw_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.frozen_passes = 0  # full passes whose survivors were frozen
        self.early_passes = 0  # full passes run here, before CPython would have run one
        self.thaws = 0

    def start(self) -> None:
        """Freezes what is there now (the imports and the state the node has loaded or
        replayed, in one full pass: the only one over all of it), then keeps passes short."""
        gc.callbacks.append(self._after_pass)
        gc.collect()
        self._thread = threading.Thread(target=self._run, name="gc-passes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops freezing and thaws what was frozen (the next full pass examines it)."""
        self._stop.set()
        if self._after_pass in gc.callbacks:
            gc.callbacks.remove(self._after_pass)
        if self._thread is not None:
            self._thread.join(timeout=STOP_JOIN_S)
        gc.unfreeze()

    def _after_pass(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            gc.freeze()
            self.frozen_passes += 1

    def thaw(self) -> bool:
        """As a follower that knows its leader: every frozen object examined again, in one
        full pass (whose survivors are frozen again). False, doing nothing, otherwise (the
        leader, or a candidate whose election the pause would hold up)."""
        if not self._may_pause():
            return False
        started = time.perf_counter()
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        unreachable = gc.collect()
        self.thaws += 1
        log.info(
            "thawed %d frozen objects: %d unreachable, %.3f s",
            frozen,
            unreachable,
            time.perf_counter() - started,
        )
        return True

    def pass_if_due(self) -> bool:
        """A full pass (over what is not frozen) once MIDDLE_PASSES_PER_FULL middle passes
        ran since the last full one; True if it ran."""
        if gc.get_count()[2] < MIDDLE_PASSES_PER_FULL:
            return False
        gc.collect()
        self.early_passes += 1
        return True

    def _next_thaw(self) -> float:
        return time.monotonic() + self._thaw_interval_s * random.uniform(1 - THAW_JITTER, 1 + THAW_JITTER)

    def turn(self, thaw_at: float) -> float:
        """One turn of the thread: the thaw when it is due (as the leader, not now: again
        an interval later), else the full pass when it is due; neither while the collector
        is held off (a snapshot being decoded: controller/snapshot.py). Returns when to
        thaw next."""
        if not gc.isenabled():
            return thaw_at
        if time.monotonic() < thaw_at:
            self.pass_if_due()
            return thaw_at
        self.thaw()
        return self._next_thaw()

    def _run(self) -> None:
        thaw_at = self._next_thaw()
        while not self._stop.wait(FULL_PASS_POLL_S):
            try:
                thaw_at = self.turn(thaw_at)
            except Exception:  # the node stopping under it: the next turn tries again
                log.exception("a garbage collection pass of the controller failed")

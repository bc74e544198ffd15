"""The background scrub of a broker's commit log (P16): find a corrupted replica, repair it.

Every read already checks each record's CRC (commitlog.py), but a record nobody reads
(below the consumers, before a failover) can rot unseen until the day it is needed. The
scrub walks the whole log again and again, at most `scrub_bytes_per_s` (a bounded share
of the disk), checking every record's checksum against the disk's bytes. On a bad record:
- a slave cuts its log at that record and fetches the rest from its master again
  (core.CorruptionFound: a new fetch session whose handshake starts at the cut);
- a master hands its role off to an in-sync slave (it cannot repair what it leads); as a
  slave, the next pass finds the same record and repairs it as above. With no in-sync
  slave to take over it keeps the role: its reads of that record are refused (CRC), and
  the hand-off is tried again on the next pass.
A broker whose log opened with a bad record (not a torn tail) cut it there at start
(MessageStore(cut_corruption=True)) and counts that as a corruption found and repaired;
if the controller still names it master it hands off as above.

Counted (broker metrics): bytes scrubbed, passes completed, corruptions found, repairs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from mqmeta.broker_agent.ha import Role

from mqmeta.errors import MqmetaError

log = logging.getLogger(__name__)

SCRUB_BYTES_PER_S_DEFAULT = 8 << 20
SCRUB_STEP_BYTES = 256 << 10  # one pread per step
SCRUB_PASS_PAUSE_S = 1.0  # between two passes of a log that is all checked


@dataclass
class ScrubStats:
    """What the scrub did since the broker started (the broker metrics export them)."""

    bytes_scrubbed: int = 0
    passes: int = 0
    corruptions_found: int = 0
    repairs: int = 0


class ScrubHost(Protocol):
    """What the scrub needs of the broker agent."""

    stopping: threading.Event

    @property
    def role(self) -> Role: ...

    def scrub_step(self, offset: int, bytes_max: int) -> tuple[int, int | None, int, int]: ...

    def repair_from_master(self, offset: int) -> bool: ...

    def hand_off_corrupt_master(self) -> bool: ...


class Scrubber:
    """Runs the scrub loop in a thread of its own (start/join by the agent)."""

    def __init__(self, host: ScrubHost, bytes_per_s: int, stats: ScrubStats) -> None:
        if bytes_per_s < 1:
            raise ValueError("scrub_bytes_per_s must be at least 1")
        self.host = host
        self.bytes_per_s = bytes_per_s
        self.stats = stats
        self.must_hand_off = False  # the log was cut at open: a master must not keep leading

    def run(self) -> None:
        position = 0
        while not self.host.stopping.is_set():
            if self.must_hand_off and self.host.role is Role.MASTER:
                self.must_hand_off = not self.host.hand_off_corrupt_master()
            try:
                position = self._step(position)
            except MqmetaError as error:  # the store closed (a failed fdatasync): nothing to scrub
                log.info("scrub paused: %s", error)
                self.host.stopping.wait(SCRUB_PASS_PAUSE_S)
                position = 0

    def _step(self, position: int) -> int:
        """One bounded read; returns where the next step starts."""
        next_position, bad, start, end = self.host.scrub_step(position, SCRUB_STEP_BYTES)
        if position < start or position >= end:  # a pass is done (or the log was cut or retained)
            if position >= end and position > start:
                self.stats.passes += 1
            self.host.stopping.wait(SCRUB_PASS_PAUSE_S)
            return start
        self.stats.bytes_scrubbed += next_position - position
        if bad is None and next_position == position:  # nothing readable here: start over later
            self.host.stopping.wait(SCRUB_PASS_PAUSE_S)
            return start
        if bad is not None:
            self._found(bad)
            return start
        self.host.stopping.wait((next_position - position) / self.bytes_per_s)
        return next_position

    def _found(self, offset: int) -> None:
        self.stats.corruptions_found += 1
        role = self.host.role
        log.error("scrub: a corrupt record at commit offset %d (this broker is %s)", offset, role.value)
        if role is Role.SLAVE and self.host.repair_from_master(offset):
            self.stats.repairs += 1
        elif role is Role.MASTER:
            self.host.hand_off_corrupt_master()
        else:
            self.host.stopping.wait(SCRUB_PASS_PAUSE_S)

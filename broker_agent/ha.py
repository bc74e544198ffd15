"""The pure rules of a broker's high availability: role, lease, confirm offset, SyncStateSet.

No clock, sockets or files: callers pass `now_ms` (monotonic). The role core (core.py)
holds these and decides with them; the agent (agent.py) carries out its effects.

Timing argument for the master lease (why an isolated master cannot keep writing
while a new one is elected, RocketMQ #4800/#6662):
- the master's lease runs from the moment it SENT the last heartbeat the controller
  acknowledged, for `lease_ms`;
- the controller received that heartbeat after it was sent, and declares the master
  dead only `broker_dead_after_ms` after the last heartbeat it RECEIVED;
- the controller enforces lease_ms + lease_margin_ms < broker_dead_after_ms, so the old
  master has stopped accepting writes at least `lease_margin_ms` before a successor can
  be elected (the margin absorbs clock-rate differences between the two machines).

Two elections do not wait for dead-after, and neither breaks the argument, because in
both the old master can no longer accept a write:
- a graceful handoff (core.py HandoffStart): the master itself stopped taking writes
  before it asked for its successor's election, and keeps refusing them for a grace
  longer than the controller's proposal timeout if the call fails;
- a master whose process is gone (controller/liveness.py listener_gone): a slave that
  cannot reach it reports it, and the leader elects only if the master's port refuses
  connections, i.e. nothing listens there any more (a killed process's kernel closes
  its socket at once). A stopped or partitioned master still accepts connections or
  does not answer: it is left to dead-after.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Role(enum.Enum):
    FENCED = "FENCED"  # not registered or not told its role: refuses writes
    MASTER = "MASTER"
    SLAVE = "SLAVE"


@dataclass
class Lease:
    lease_ms: int
    expires_ms: int = 0  # monotonic; 0 = never granted

    def renew(self, heartbeat_sent_ms: int, lease_ms: int | None = None) -> None:
        """A heartbeat sent at `heartbeat_sent_ms` was acknowledged by the controller leader."""
        if lease_ms is not None:
            self.lease_ms = lease_ms
        self.expires_ms = max(self.expires_ms, heartbeat_sent_ms + self.lease_ms)

    def valid(self, now_ms: int) -> bool:
        return now_ms < self.expires_ms

    def revoke(self) -> None:
        self.expires_ms = 0


def confirm_offset(master_id: int, master_max_offset: int, acked: dict[int, int], counted: set[int]) -> int:
    """What every counted replica durably holds: min over the set, master included.

    `counted` is the SyncStateSet, or the union of the old and new sets while a
    change is in flight (RocketMQ #5663). A member that has not acked in this master
    epoch is credited with nothing (0).
    """
    offsets = [master_max_offset]
    for broker_id in counted:
        if broker_id != master_id:
            offsets.append(acked.get(broker_id, 0))
    return min(offsets)


@dataclass
class SlaveProgress:
    acked_offset: int = 0
    last_fetch_ms: int = 0
    last_caught_up_ms: int = 0  # as of when the slave held everything the master had
    sent_max_offset: int = -1  # the master's log end when it last answered this slave
    sent_ms: int = 0


@dataclass
class SyncStateTracker:
    """Per-slave progress on the master, and when to expand or shrink the set."""

    max_not_catchup_ms: int
    slaves: dict[int, SlaveProgress] = field(default_factory=dict)
    leaving: set[int] = field(default_factory=set)  # slaves shutting down: out of the set

    def reset(self, now_ms: int, members: list[int]) -> None:
        """A new master epoch: slaves are credited with nothing past the epoch start."""
        self.slaves = {
            m: SlaveProgress(acked_offset=0, last_fetch_ms=now_ms, last_caught_up_ms=now_ms) for m in members
        }
        self.leaving = set()

    def on_fetch(
        self, broker_id: int, fetch_offset: int, master_max_offset: int, now_ms: int, leaving: bool = False
    ) -> None:
        """Under steady writes a fetch never equals the master's end of that instant; as
        in Kafka, reaching the end the master had when it last answered proves the slave
        was caught up as of that answer. A fetch says whether its slave is leaving (a
        restarted slave's fetches say it no longer is)."""
        if leaving:
            self.leaving.add(broker_id)
        else:
            self.leaving.discard(broker_id)
        progress = self.slaves.setdefault(broker_id, SlaveProgress(last_caught_up_ms=0))
        progress.acked_offset = fetch_offset
        progress.last_fetch_ms = now_ms
        if fetch_offset >= master_max_offset:
            progress.last_caught_up_ms = now_ms
        elif 0 <= progress.sent_max_offset <= fetch_offset:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.sent_ms)

    def on_answer(self, broker_id: int, master_max_offset: int, now_ms: int) -> None:
        """The master answered this slave's fetch while its log ended at master_max_offset."""
        progress = self.slaves.get(broker_id)
        if progress is not None:
            progress.sent_max_offset = master_max_offset
            progress.sent_ms = now_ms

    def _caught_up_recently(self, broker_id: int, now_ms: int) -> bool:
        progress = self.slaves.get(broker_id)
        return progress is not None and now_ms - progress.last_caught_up_ms <= self.max_not_catchup_ms

    def acked(self) -> dict[int, int]:
        return {i: p.acked_offset for i, p in self.slaves.items()}

    def plan(
        self,
        now_ms: int,
        master_id: int,
        current_set: list[int],
        confirm: int,
        epoch_start_offset: int,
        registered: set[int],
    ) -> list[int] | None:
        """The SyncStateSet to propose now, or None to leave it.

        Shrink: a member that has not caught up with the master for max_not_catchup_ms,
        or that is leaving (shutting down: acknowledgements must not wait for it).
        Expand: a registered non-member whose acked offset reached both the confirm
        offset and the start of the current epoch (it holds everything acknowledged),
        unless it is leaving.
        """
        members = set(current_set) | {master_id}
        removed = set(self.leaving) - {master_id}
        members -= removed
        for broker_id in sorted(members - {master_id}):
            if not self._caught_up_recently(broker_id, now_ms):
                members.discard(broker_id)
                removed.add(broker_id)
        for broker_id, progress in sorted(self.slaves.items()):
            if broker_id in members or broker_id in removed or broker_id not in registered:
                continue
            # A lagging member holds the confirm offset down to its own ack, so reaching
            # the confirm offset alone proves nothing: it must also have caught up lately.
            if self._caught_up_recently(broker_id, now_ms) and progress.acked_offset >= max(
                confirm, epoch_start_offset
            ):
                members.add(broker_id)
        new_set = sorted(members)
        return None if new_set == sorted(set(current_set) | {master_id}) else new_set
